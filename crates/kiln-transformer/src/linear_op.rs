//! `x W + b` in training on Flex as one autodiff operation: the products on kiln's gemm calls,
//! each thread multiplying its own block of rows (so each packs its own panels), the outputs
//! written where they are kept.

use burn::nn::Linear;
use burn::tensor::Tensor;
use burn::tensor::backend::Backend;
use kiln_precision::{HostOp, host_op, host_ops_serve};
use rayon::prelude::*;

use crate::matmul::{Threads, View, Write, matmul};

/// `x W + b` of `x` `[rows, in]` as one autodiff operation, when `B` is `Autodiff<Flex>` and `x`
/// is f32; `None` otherwise.
pub(crate) fn trained_linear<B: Backend>(
    linear: &Linear<B>,
    x: &Tensor<B, 2>,
) -> Option<Tensor<B, 2>> {
    if !host_ops_serve(x) {
        return None;
    }
    let [rows, inputs] = x.dims();
    let weight = linear.weight.val();
    let outputs = weight.dims()[1];
    let bias = match &linear.bias {
        Some(bias) => bias.val().reshape([1, outputs]),
        None => Tensor::zeros([1, outputs], &x.device()),
    };
    let op = LinearOp {
        rows,
        inputs,
        outputs,
    };
    host_op(op, [x, &weight, &bias], [rows, outputs])
}

/// `[x, W, b]` (`[rows, inputs]`, `[inputs, outputs]`, `[1, outputs]`) → `x W + b`.
#[derive(Debug, Clone)]
struct LinearOp {
    rows: usize,
    inputs: usize,
    outputs: usize,
}

/// A `[rows, width]` matrix made by `product(first, block, len)` per block of rows, one block per
/// thread; `block` holds rows `first..first + len`.
fn per_thread_blocks(
    rows: usize,
    width: usize,
    product: impl Fn(usize, &mut [f32], usize) + Sync,
) -> Vec<f32> {
    let mut out = vec![0f32; rows * width];
    let per = rows.div_ceil(rayon::current_num_threads().max(1)).max(1);
    let width = width.max(1);
    out.par_chunks_mut(per * width)
        .enumerate()
        .for_each(|(index, block)| product(index * per, block, block.len() / width));
    out
}

impl HostOp<3> for LinearOp {
    fn forward(&self, [x, weight, bias]: [&[f32]; 3]) -> Vec<f32> {
        let (inputs, outputs) = (self.inputs, self.outputs);
        per_thread_blocks(self.rows, outputs, |first, y, rows| {
            for row in y.chunks_exact_mut(outputs) {
                row.copy_from_slice(bias);
            }
            let (x_rows, w) = (
                View::rows(first * inputs, rows, inputs, inputs),
                View::rows(0, inputs, outputs, outputs),
            );
            let y_rows = View::rows(0, rows, outputs, outputs);
            matmul(y, y_rows, x, x_rows, weight, w, Write::Add, Threads::One);
        })
    }

    /// `dx = dy Wᵀ` per block of rows, `dW = xᵀ dy` per block of input features, `db` the
    /// column sums of `dy`.
    fn backward(&self, dy: &[f32], [x, weight, _]: [&[f32]; 3]) -> [Vec<f32>; 3] {
        let (rows, inputs, outputs) = (self.rows, self.inputs, self.outputs);
        let dx = per_thread_blocks(rows, inputs, |first, dx, n| {
            let (dy_rows, w_t) = (
                View::rows(first * outputs, n, outputs, outputs),
                View::rows(0, inputs, outputs, outputs).transposed(),
            );
            let dx_rows = View::rows(0, n, inputs, inputs);
            matmul(
                dx,
                dx_rows,
                dy,
                dy_rows,
                weight,
                w_t,
                Write::Overwrite,
                Threads::One,
            );
        });
        let dw = per_thread_blocks(inputs, outputs, |first, dw, n| {
            let (x_t, dy_all) = (
                View::rows(first, rows, n, inputs).transposed(),
                View::rows(0, rows, outputs, outputs),
            );
            let dw_rows = View::rows(0, n, outputs, outputs);
            matmul(
                dw,
                dw_rows,
                x,
                x_t,
                dy,
                dy_all,
                Write::Overwrite,
                Threads::One,
            );
        });
        let mut db = vec![0f32; outputs];
        for row in dy.chunks_exact(outputs) {
            db.iter_mut().zip(row).for_each(|(s, v)| *s += v);
        }
        [dx, dw, db]
    }
}

#[cfg(test)]
mod tests {
    use burn::backend::{Autodiff, Flex};
    use burn::nn::LinearConfig;
    use burn::tensor::Distribution;

    use super::*;

    type Trained = Autodiff<Flex>;

    fn gap(a: Tensor<Flex, 2>, b: Tensor<Flex, 2>) -> f32 {
        let (a, b) = (a.into_data().to_vec::<f32>(), b.into_data().to_vec::<f32>());
        (a.unwrap().iter().zip(b.unwrap()))
            .map(|(x, y)| (x - y).abs())
            .fold(0.0, f32::max)
    }

    /// The one-operation projection's values and its x, weight and bias gradients against burn's
    /// `Linear` differentiated by burn-autodiff, on more rows than threads and an odd width.
    #[test]
    fn the_projection_differentiates_as_burns_does() {
        let device = Default::default();
        let normal = Distribution::Normal(0.0, 1.0);
        let linear = LinearConfig::new(37, 53).init::<Trained>(&device);
        let x = Tensor::<Trained, 2>::random([101, 37], normal, &device);
        let weights = Tensor::<Trained, 2>::random([101, 53], normal, &device);
        assert!(host_ops_serve(&x));
        let run = |ours: bool| {
            let x = x.clone().detach().require_grad();
            let y = if ours {
                trained_linear(&linear, &x).expect("served on Autodiff<Flex>")
            } else {
                linear.forward(x.clone())
            };
            let grads = (y.clone() * weights.clone()).sum().backward();
            let dw = linear.weight.val().grad(&grads).unwrap();
            let db = linear.bias.as_ref().unwrap().val().grad(&grads).unwrap();
            (y.inner(), x.grad(&grads).unwrap(), dw, db.unsqueeze::<2>())
        };
        let (y, dx, dw, db) = run(true);
        let (want_y, want_dx, want_dw, want_db) = run(false);
        assert!(gap(y, want_y) < 1e-4);
        assert!(gap(dx, want_dx) < 1e-4);
        assert!(gap(dw, want_dw) < 1e-3);
        assert!(gap(db, want_db) < 1e-3);
    }
}
