//! Dense layers on the host: `x W + b` and the gradient `g Wᵀ`, through [`sgemm`]'s packed
//! panels where the type and CPU run it, else a register-blocked loop.

use burn::nn::Linear;
use burn::tensor::backend::Backend;
use kiln_kernels::sgemm;

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

    /// `g Wᵀ`: the gradient with respect to the input from the gradient `g` of the output.
    #[inline(always)]
    pub(super) fn backward(&self, g: &[T]) -> Vec<T> {
        match &self.packed {
            Some([_, wt]) => T::packed_product(g, wt, None),
            None => product(g, &self.wt, self.w.len() / self.outputs, None),
        }
    }
}

/// `x M (+ bias)` with `M` row-major of `width` columns. Blocks of 4 rows × 16 columns are
/// accumulated in registers over the whole inner dimension (each row of `M` loaded once per 4
/// rows of `x`); the rows and columns left over go row by row, each output row a sum of `M`'s
/// rows scaled by the input row.
#[inline(always)]
fn product<T: Real>(x: &[T], m: &[T], width: usize, bias: Option<&[T]>) -> Vec<T> {
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
