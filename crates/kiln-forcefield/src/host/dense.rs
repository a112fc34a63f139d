//! Dense layers on the host: `x W + b` and the gradient `g Wᵀ`, through [`sgemm`]'s packed
//! panels where the type and CPU run it, else a register-blocked loop.

use burn::nn::Linear;
use burn::tensor::backend::Backend;
use kiln_kernels::gemm::sgemm;

use super::rows::add;
use super::{Real, values};

/// A dense layer `y = x W + b` with `W` `[inputs, outputs]` (burn's layout), and `Wᵀ` for the
/// backward pass; both packed for [`sgemm`] too where the type and CPU run it.
pub(super) struct Dense<T> {
    pub(super) outputs: usize,
    pub(super) w: Vec<T>,
    wt: Vec<T>,
    b: Option<Vec<T>>,
    packed: Option<[sgemm::Packed; 2]>,
}

impl<T: Real> Dense<T> {
    pub(super) fn read<B: Backend>(layer: &Linear<B>) -> Self {
        let [inputs, _] = layer.weight.val().dims();
        let b = layer.bias.as_ref().map(|b| values(b.val()));
        Dense::new(values(layer.weight.val()), inputs, b)
    }

    /// The layer of weight `w` `[inputs, w.len() / inputs]` and bias `b`.
    pub(super) fn new(w: Vec<T>, inputs: usize, b: Option<Vec<T>>) -> Self {
        let outputs = w.len() / inputs;
        let mut wt = vec![T::zero(); w.len()];
        for k in 0..inputs {
            for o in 0..outputs {
                wt[o * inputs + k] = w[k * outputs + o];
            }
        }
        let packed = T::packed(&w, inputs)
            .zip(T::packed(&wt, outputs))
            .map(Into::into);
        Dense {
            outputs,
            w,
            wt,
            b,
            packed,
        }
    }

    /// `x W + b`, row by row.
    #[inline(always)]
    pub(super) fn forward(&self, x: &[T]) -> Vec<T> {
        match &self.packed {
            Some([w, _]) => T::packed_product(x, w, self.b.as_deref()),
            None => product(x, &self.w, self.outputs, self.b.as_deref()),
        }
    }

    /// `x W` without the bias: the layer's derivative along a tangent `x`.
    #[inline(always)]
    pub(super) fn linear(&self, x: &[T]) -> Vec<T> {
        match &self.packed {
            Some([w, _]) => T::packed_product(x, w, None),
            None => product(x, &self.w, self.outputs, None),
        }
    }

    /// A zero gradient of this layer's parameters.
    pub(super) fn zero_gradient(&self) -> DenseGradient<T> {
        DenseGradient {
            w: vec![T::zero(); self.w.len()],
            b: self.b.as_ref().map(|b| vec![T::zero(); b.len()]),
        }
    }

    /// Adds to `gradient` the parameters' gradient for inputs `x` and output gradient `g` (rows
    /// of both): `xᵀ g` for `W`, the column sums of `g` for `b` (with `bias`).
    #[inline(always)]
    pub(super) fn add_gradient(
        &self,
        gradient: &mut DenseGradient<T>,
        x: &[T],
        g: &[T],
        bias: bool,
    ) {
        let inputs = self.w.len() / self.outputs;
        let rows = x.len() / inputs.max(1);
        if rows == 0 {
            return;
        }
        let mut xt = vec![T::zero(); x.len()];
        for r in 0..rows {
            for i in 0..inputs {
                xt[i * rows + r] = x[r * inputs + i];
            }
        }
        let w = T::product(&xt, g, self.outputs);
        gradient.w.iter_mut().zip(&w).for_each(|(a, &b)| *a += b);
        if let (true, Some(b)) = (bias, &mut gradient.b) {
            for row in g.chunks_exact(self.outputs) {
                b.iter_mut().zip(row).for_each(|(a, &g)| *a += g);
            }
        }
    }

    /// `g Wᵀ`: the gradient with respect to the input from the gradient `g` of the output.
    #[inline(always)]
    pub(super) fn backward(&self, g: &[T]) -> Vec<T> {
        match &self.packed {
            Some([_, wt]) => T::packed_product(g, wt, None),
            None => product(g, &self.wt, self.w.len() / self.outputs, None),
        }
    }
}

/// The gradient of a [`Dense`] layer's weight `[inputs, outputs]` and bias.
pub(super) struct DenseGradient<T> {
    pub(super) w: Vec<T>,
    pub(super) b: Option<Vec<T>>,
}

impl<T: Real> DenseGradient<T> {
    /// `self += other`.
    pub(super) fn add(&mut self, other: &DenseGradient<T>) {
        add(&mut self.w, &other.w);
        if let (Some(a), Some(b)) = (&mut self.b, &other.b) {
            add(a, b);
        }
    }
}

/// `x M (+ bias)` with `M` row-major of `width` columns. Blocks of 4 rows × 16 columns are
/// accumulated in registers over the whole inner dimension (each row of `M` loaded once per 4
/// rows of `x`); the rows and columns left over go row by row, each output row a sum of `M`'s
/// rows scaled by the input row.
#[inline(always)]
pub(super) fn product<T: Real>(x: &[T], m: &[T], width: usize, bias: Option<&[T]>) -> Vec<T> {
    const ROWS: usize = 4;
    const COLUMNS: usize = 16;
    let inputs = m.len() / width;
    let rows = x.len() / inputs;
    let mut y = match bias {
        Some(bias) => bias.repeat(rows),
        None => vec![T::zero(); rows * width],
    };
    let blocked_rows = rows / ROWS * ROWS;
    let blocked_columns = width / COLUMNS * COLUMNS;
    for r0 in (0..blocked_rows).step_by(ROWS) {
        // The block's input rows, sliced once (no bounds checks in the inner loop).
        let x_rows: [&[T]; ROWS] = std::array::from_fn(|r| &x[(r0 + r) * inputs..][..inputs]);
        for c0 in (0..blocked_columns).step_by(COLUMNS) {
            let mut sums = [[T::zero(); COLUMNS]; ROWS];
            for (r, sum) in sums.iter_mut().enumerate() {
                sum.copy_from_slice(&y[(r0 + r) * width + c0..][..COLUMNS]);
            }
            for k in 0..inputs {
                let m_row: &[T; COLUMNS] = m[k * width + c0..][..COLUMNS]
                    .try_into()
                    .expect("COLUMNS values");
                for (sum, x_row) in sums.iter_mut().zip(&x_rows) {
                    let a = x_row[k];
                    for (s, &b) in sum.iter_mut().zip(m_row) {
                        *s = a.mul_add(b, *s);
                    }
                }
            }
            for (r, sum) in sums.iter().enumerate() {
                y[(r0 + r) * width + c0..][..COLUMNS].copy_from_slice(sum);
            }
        }
    }
    for (r, (x, y)) in x
        .chunks_exact(inputs)
        .zip(y.chunks_exact_mut(width))
        .enumerate()
    {
        let columns = if r < blocked_rows { blocked_columns } else { 0 };
        if columns == width {
            continue;
        }
        for (&a, m) in x.iter().zip(m.chunks_exact(width)) {
            axpy(a, &m[columns..], &mut y[columns..]);
        }
    }
    y
}

/// `y += a x`.
#[inline(always)]
fn axpy<T: Real>(a: T, x: &[T], y: &mut [T]) {
    for (y, &x) in y.iter_mut().zip(x) {
        *y = a.mul_add(x, *y);
    }
}
