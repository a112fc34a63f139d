//! `x W + b` in training on Flex as one autodiff operation: the products on kiln's gemm calls,
//! each thread multiplying its own block of rows (so each packs its own panels), or, for a few
//! rows, its own block of columns (so each packs only its share of the weight), the outputs
//! written where they are kept. Under host autocast (`Products::Bf16`) the forward product and
//! both gradient products read their operands rounded to bf16, with f32 sums, as PyTorch's CPU
//! autocast trains ([`bf16::view_product`]).

use burn::module::Param;
use burn::nn::Linear;
use burn::tensor::Tensor;
use burn::tensor::backend::Backend;
use kiln_kernels::{HostOp, host_op, host_ops_serve, zeros};
use rayon::prelude::*;

use std::sync::Arc;

use kiln_kernels::gemm::strided::{Threads, View, Write, matmul};
use kiln_kernels::gemm::{Products, bf16};

use crate::prepared::{PreparedWeights, TrainedWeight};

/// `x W + b` of `x` `[rows, in]` as one autodiff operation multiplying as `prepared` says (bf16
/// products read the weight packed there), when `B` is `Autodiff<Flex>` and `x` is f32; `None`
/// otherwise.
pub(crate) fn trained_linear<B: Backend>(
    linear: &Linear<B>,
    x: &Tensor<B, 2>,
    prepared: &PreparedWeights,
) -> Option<Tensor<B, 2>> {
    if !host_ops_serve(x) {
        return None;
    }
    let [rows, inputs] = x.dims();
    let weight = linear.weight.val();
    let outputs = weight.dims()[1];
    let layout = Layout::InputsByOutputs;
    let product = Product {
        rows,
        inputs,
        outputs,
        layout,
        bf16: packed(prepared, &linear.weight, layout.reads(inputs, outputs)),
    };
    match &linear.bias {
        Some(bias) => {
            let bias = bias.val().reshape([1, product.outputs]);
            host_op(
                Biased(product.clone()),
                [x, &weight, &bias],
                [rows, product.outputs],
            )
        }
        None => host_op(product.clone(), [x, &weight], [rows, product.outputs]),
    }
}

/// `x Eᵀ` of `x` `[rows, in]` and a table `E` `[out, in]` as one autodiff operation multiplying
/// as `prepared` says, when `B` is `Autodiff<Flex>` and both are f32; `None` otherwise.
pub(crate) fn trained_product_by_table<B: Backend>(
    x: &Tensor<B, 2>,
    table: &Param<Tensor<B, 2>>,
    prepared: &PreparedWeights,
) -> Option<Tensor<B, 2>> {
    if !host_ops_serve(x) {
        return None;
    }
    let (values, layout) = (table.val(), Layout::OutputsByInputs);
    let ([rows, inputs], [outputs, _]) = (x.dims(), values.dims());
    let product = Product {
        rows,
        inputs,
        outputs,
        layout,
        bf16: packed(prepared, table, layout.reads(inputs, outputs)),
    };
    host_op(product, [x, &values], [rows, outputs])
}

/// The weight packed for bf16 products where `prepared` multiplies bf16 operands.
fn packed<B: Backend>(
    prepared: &PreparedWeights,
    weight: &Param<Tensor<B, 2>>,
    reads: View,
) -> Option<Arc<TrainedWeight>> {
    (prepared.products() == Products::Bf16).then(|| prepared.trained(weight, reads))
}

/// How a weight holds its values.
#[derive(Debug, Clone, Copy)]
enum Layout {
    /// `[inputs, outputs]`, as burn's `Linear`.
    InputsByOutputs,
    /// `[outputs, inputs]`, as an embedding table read as a language model's head.
    OutputsByInputs,
}

impl Layout {
    /// The weight's values seen as `[inputs, outputs]`.
    fn reads(self, inputs: usize, outputs: usize) -> View {
        match self {
            Layout::InputsByOutputs => View::rows(0, inputs, outputs, outputs),
            Layout::OutputsByInputs => View::rows(0, outputs, inputs, inputs).transposed(),
        }
    }
}

/// `[x, W]` (`[rows, inputs]` and the weight) → `x W`.
#[derive(Debug, Clone)]
struct Product {
    rows: usize,
    inputs: usize,
    outputs: usize,
    layout: Layout,
    /// The weight packed for bf16 products (forward and `dx`), under host autocast.
    bf16: Option<Arc<TrainedWeight>>,
}

/// `[x, W, b]` (`b` `[1, outputs]`) → `x W + b`.
#[derive(Debug, Clone)]
struct Biased(Product);

/// A `[rows, width]` matrix made by `product(first, block, len)` per block of rows, one block per
/// thread; `block` holds rows `first..first + len`.
fn per_thread_blocks(
    rows: usize,
    width: usize,
    product: impl Fn(usize, &mut [f32], usize) + Sync,
) -> Vec<f32> {
    let mut out = zeros(rows * width);
    let per = rows.div_ceil(rayon::current_num_threads().max(1)).max(1);
    let width = width.max(1);
    out.par_chunks_mut(per * width)
        .enumerate()
        .for_each(|(index, block)| product(index * per, block, block.len() / width));
    out
}

/// Rows per thread below which a product splits its columns instead of its rows: a language
/// model's tokens (16–112 rows on fVLM's shapes) against its weights, where packing the whole
/// weight on each thread costs as much as multiplying it. Columns were as fast as rows or faster
/// up to 384 rows and level at 512 (docs/PERFORMANCE.md).
const FEW_ROWS: usize = 256;

/// A `[rows, width]` product made by `product(first, block, len, threads)`: one block of rows
/// `first..first + len` per thread, multiplied on it, or with few rows the whole product as one
/// block whose columns the threads share.
fn split_product(
    rows: usize,
    width: usize,
    product: impl Fn(usize, &mut [f32], usize, Threads) + Sync,
) -> Vec<f32> {
    if rows < FEW_ROWS * rayon::current_num_threads() {
        let mut out = zeros(rows * width);
        product(0, &mut out, rows, Threads::Columns);
        return out;
    }
    per_thread_blocks(rows, width, |first, block, len| {
        product(first, block, len, Threads::One)
    })
}

impl Product {
    /// The weight seen as `[inputs, outputs]`.
    fn weight(&self) -> View {
        self.layout.reads(self.inputs, self.outputs)
    }

    /// `x W (+ b)`: each row starts as `b` (or 0) and gets its product added.
    fn forward_with(&self, x: &[f32], weight: &[f32], bias: Option<&[f32]>) -> Vec<f32> {
        let (inputs, outputs) = (self.inputs, self.outputs);
        if let Some(packed) = &self.bf16 {
            let x_rows = View::rows(0, self.rows, inputs, inputs);
            return bf16::view_product(x, x_rows, &packed.forward, bias);
        }
        split_product(self.rows, outputs, |first, y, rows, threads| {
            if let Some(bias) = bias {
                for row in y.chunks_exact_mut(outputs) {
                    row.copy_from_slice(bias);
                }
            }
            let x_rows = View::rows(first * inputs, rows, inputs, inputs);
            let y_rows = View::rows(0, rows, outputs, outputs);
            matmul(
                y,
                y_rows,
                x,
                x_rows,
                weight,
                self.weight(),
                Write::Add,
                threads,
            );
        })
    }

    /// `dx = dy Wᵀ` per block of rows, and `dW` per block of the weight's rows, each only where
    /// `wanted` (`[dx, dW]`; empty otherwise: a frozen weight costs no `dW`).
    fn input_and_weight_grads(
        &self,
        dy: &[f32],
        x: &[f32],
        weight: &[f32],
        [want_dx, want_dw]: [bool; 2],
    ) -> [Vec<f32>; 2] {
        let (rows, inputs, outputs) = (self.rows, self.inputs, self.outputs);
        if let Some(packed) = &self.bf16 {
            return self.bf16_grads(dy, x, packed, [want_dx, want_dw]);
        }
        let dx = want_dx.then(|| {
            split_product(rows, inputs, |first, dx, n, threads| {
                let dy_rows = View::rows(first * outputs, n, outputs, outputs);
                let dx_rows = View::rows(0, n, inputs, inputs);
                let w_t = self.weight().transposed();
                matmul(
                    dx,
                    dx_rows,
                    dy,
                    dy_rows,
                    weight,
                    w_t,
                    Write::Overwrite,
                    threads,
                );
            })
        });
        let (a, a_width, b, b_width) = self.weight_grad_operands(x, dy);
        let dw = want_dw.then(|| {
            split_product(a_width, b_width, |first, dw, n, threads| {
                let a_t = View::rows(first, rows, n, a_width).transposed();
                let b_all = View::rows(0, rows, b_width, b_width);
                let dw_rows = View::rows(0, n, b_width, b_width);
                matmul(dw, dw_rows, a, a_t, b, b_all, Write::Overwrite, threads);
            })
        });
        [dx.unwrap_or_default(), dw.unwrap_or_default()]
    }

    /// `dW`'s operands `(a, a width, b, b width)`, `dW = aᵀ b` over all the rows, its rows
    /// following the weight's first axis: `xᵀ dy` (`[inputs, outputs]`), or `dyᵀ x` for a table.
    fn weight_grad_operands<'a>(
        &self,
        x: &'a [f32],
        dy: &'a [f32],
    ) -> (&'a [f32], usize, &'a [f32], usize) {
        match self.layout {
            Layout::InputsByOutputs => (x, self.inputs, dy, self.outputs),
            Layout::OutputsByInputs => (dy, self.outputs, x, self.inputs),
        }
    }

    /// [`Self::input_and_weight_grads`] with bf16 operands: `dx = dy Wᵀ` (`Wᵀ` packed once with
    /// `W`) and `dW` each one product on all threads, transposes read as views, the outputs
    /// written once (never zeroed first).
    fn bf16_grads(
        &self,
        dy: &[f32],
        x: &[f32],
        weight: &TrainedWeight,
        [want_dx, want_dw]: [bool; 2],
    ) -> [Vec<f32>; 2] {
        let (rows, outputs) = (self.rows, self.outputs);
        let all_rows = |width| View::rows(0, rows, width, width);
        let dx =
            want_dx.then(|| bf16::view_product(dy, all_rows(outputs), &weight.transposed, None));
        let dw = want_dw.then(|| {
            let (a, a_width, b, b_width) = self.weight_grad_operands(x, dy);
            let b = bf16::Packed::of_view(b, all_rows(b_width));
            bf16::view_product(a, all_rows(a_width).transposed(), &b, None)
        });
        [dx.unwrap_or_default(), dw.unwrap_or_default()]
    }
}

impl HostOp<2> for Product {
    fn forward(&self, [x, weight]: [&[f32]; 2]) -> Vec<f32> {
        self.forward_with(x, weight, None)
    }

    fn backward(&self, dy: &[f32], inputs: [&[f32]; 2]) -> [Vec<f32>; 2] {
        self.backward_wanted(dy, inputs, [true; 2])
    }

    fn backward_wanted(&self, dy: &[f32], [x, w]: [&[f32]; 2], wanted: [bool; 2]) -> [Vec<f32>; 2] {
        self.input_and_weight_grads(dy, x, w, wanted)
    }
}

impl HostOp<3> for Biased {
    fn forward(&self, [x, weight, bias]: [&[f32]; 3]) -> Vec<f32> {
        self.0.forward_with(x, weight, Some(bias))
    }

    fn backward(&self, dy: &[f32], inputs: [&[f32]; 3]) -> [Vec<f32>; 3] {
        self.backward_wanted(dy, inputs, [true; 3])
    }

    /// [`Product`]'s gradients, and `db` the column sums of `dy`, each thread summing its own
    /// block of columns over the rows in order; each only where `wanted`.
    fn backward_wanted(
        &self,
        dy: &[f32],
        [x, weight, _]: [&[f32]; 3],
        [want_dx, want_dw, want_db]: [bool; 3],
    ) -> [Vec<f32>; 3] {
        let [dx, dw] = self
            .0
            .input_and_weight_grads(dy, x, weight, [want_dx, want_dw]);
        let outputs = self.0.outputs;
        let db = want_db.then(|| {
            per_thread_blocks(outputs, 1, |first, db, n| {
                for row in dy.chunks_exact(outputs) {
                    (db.iter_mut().zip(&row[first..first + n])).for_each(|(s, v)| *s += v);
                }
            })
        });
        [dx, dw, db.unwrap_or_default()]
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
    /// `Linear` differentiated by burn-autodiff, on two threads: few rows and inputs (each
    /// product split by columns) and many (by rows), odd widths, with and without a bias.
    #[test]
    fn the_projection_differentiates_as_burns_does() {
        let device = Default::default();
        let normal = Distribution::Normal(0.0, 1.0);
        let two_threads = rayon::ThreadPoolBuilder::new().num_threads(2).build();
        let many = 2 * FEW_ROWS + 3;
        for (rows, inputs) in [(101, 37), (many, many + 2)] {
            let x = Tensor::<Trained, 2>::random([rows, inputs], normal, &device);
            let weights = Tensor::<Trained, 2>::random([rows, 53], normal, &device);
            assert!(host_ops_serve(&x));
            for bias in [true, false] {
                let linear = LinearConfig::new(inputs, 53)
                    .with_bias(bias)
                    .init::<Trained>(&device);
                let run = |ours: bool| {
                    let x = x.clone().detach().require_grad();
                    let y = if ours {
                        two_threads.as_ref().expect("a pool").install(|| {
                            trained_linear(&linear, &x, &PreparedWeights::default())
                                .expect("served on Autodiff<Flex>")
                        })
                    } else {
                        linear.forward(x.clone())
                    };
                    let grads = two_threads
                        .as_ref()
                        .expect("a pool")
                        .install(|| (y.clone() * weights.clone()).sum().backward());
                    let dw = linear.weight.val().grad(&grads).unwrap();
                    let db = (linear.bias.as_ref()).map(|b| b.val().grad(&grads).unwrap());
                    (y.inner(), x.grad(&grads).unwrap(), dw, db)
                };
                let (y, dx, dw, db) = run(true);
                let (want_y, want_dx, want_dw, want_db) = run(false);
                assert!(gap(y, want_y) < 1e-4, "{rows} rows");
                assert!(gap(dx, want_dx) < 1e-4, "{rows} rows");
                assert!(gap(dw, want_dw) < 1e-3, "{rows} rows");
                if let (Some(db), Some(want_db)) = (db, want_db) {
                    assert!(
                        gap(db.unsqueeze(), want_db.unsqueeze()) < 1e-3,
                        "{rows} rows"
                    );
                }
            }
        }
    }

    /// A frozen projection (a frozen language model's, which a soft prompt is trained through):
    /// the input's gradient as burn's, none for the weight and bias, whose products are skipped.
    #[test]
    fn a_frozen_projection_passes_the_gradient_to_its_input_only() {
        use burn::module::Module;

        let device = Default::default();
        let normal = Distribution::Normal(0.0, 1.0);
        let x = Tensor::<Trained, 2>::random([19, 37], normal, &device).require_grad();
        let weights = Tensor::<Trained, 2>::random([19, 53], normal, &device);
        let linear = LinearConfig::new(37, 53).init::<Trained>(&device).no_grad();
        let ours = trained_linear(&linear, &x, &PreparedWeights::default())
            .expect("served on Autodiff<Flex>");
        let grads = (ours * weights.clone()).sum().backward();
        assert!(linear.weight.val().grad(&grads).is_none());
        assert!(linear.bias.as_ref().unwrap().val().grad(&grads).is_none());
        let dx = x.grad(&grads).unwrap();
        let x = x.detach().require_grad();
        let want = x.grad(&(linear.forward(x.clone()) * weights).sum().backward());
        assert!(gap(dx, want.unwrap()) < 1e-4);
    }

    /// `x Eᵀ` by the table's rows against burn's product with the table transposed: values and
    /// both gradients.
    #[test]
    fn the_product_by_a_table_differentiates_as_burns_does() {
        let device = Default::default();
        let normal = Distribution::Normal(0.0, 1.0);
        let x = Tensor::<Trained, 2>::random([13, 37], normal, &device);
        let table = Tensor::<Trained, 2>::random([211, 37], normal, &device);
        let weights = Tensor::<Trained, 2>::random([13, 211], normal, &device);
        let run = |ours: bool| {
            let (x, table) = (x.clone().require_grad(), Param::from_tensor(table.clone()));
            let y = if ours {
                trained_product_by_table(&x, &table, &PreparedWeights::default())
                    .expect("served on Autodiff<Flex>")
            } else {
                x.clone().matmul(table.val().transpose())
            };
            let grads = (y.clone() * weights.clone()).sum().backward();
            (
                y.inner(),
                x.grad(&grads).unwrap(),
                table.val().grad(&grads).unwrap(),
            )
        };
        let (y, dx, dtable) = run(true);
        let (want_y, want_dx, want_dtable) = run(false);
        assert!(gap(y, want_y) < 1e-4);
        assert!(gap(dx, want_dx) < 1e-4);
        assert!(gap(dtable, want_dtable) < 1e-4);
    }

    /// Each element of `ours` within two bf16 roundings (2 · 2⁻⁸ relative, with f32 sums) of
    /// `Σ|a b|` (`magnitude`) from burn's f32 `want`, and `ours` not f32's (bf16 really ran).
    fn within_bf16(ours: Tensor<Flex, 2>, want: Tensor<Flex, 2>, magnitude: Tensor<Flex, 2>) {
        let [ours, want, magnitude] =
            [ours, want, magnitude].map(|t| t.into_data().to_vec::<f32>().unwrap());
        let mut differs = false;
        for ((o, w), m) in ours.iter().zip(&want).zip(&magnitude) {
            assert!(
                (o - w).abs() <= (2.0 / 256.0 + 1e-4) * m + 1e-6,
                "{o} against {w}"
            );
            differs |= o != w;
        }
        assert!(differs, "bf16 products gave f32's values");
    }

    /// Under host autocast the projection's value and its three gradients (`dx = dy Wᵀ`,
    /// `dW = xᵀ dy`, `db`), and the product by a table's value and both gradients, are burn's f32
    /// ones within bf16 rounding of each value's Σ|ab|, on every row count and layout.
    #[test]
    fn bf16_products_differentiate_as_burns_within_rounding() {
        if !bf16::supported() {
            println!("SKIPPED (no amx_bf16 or avx512_bf16)");
            return;
        }
        let device = Default::default();
        let normal = Distribution::Normal(0.0, 1.0);
        let abs = |t: &Tensor<Trained, 2>| t.clone().inner().abs();
        for (rows, inputs, outputs) in [(13, 37, 53), (2 * FEW_ROWS + 3, 70, 45)] {
            let x = Tensor::<Trained, 2>::random([rows, inputs], normal, &device);
            let dy = Tensor::<Trained, 2>::random([rows, outputs], normal, &device);
            let linear = LinearConfig::new(inputs, outputs).init::<Trained>(&device);
            let run = |prepared: Option<&PreparedWeights>| {
                let x = x.clone().detach().require_grad();
                let y = match prepared {
                    Some(prepared) => trained_linear(&linear, &x, prepared).expect("served"),
                    None => linear.forward(x.clone()),
                };
                let grads = (y.clone() * dy.clone()).sum().backward();
                let db = linear.bias.as_ref().unwrap().val().grad(&grads).unwrap();
                let dw = linear.weight.val().grad(&grads).unwrap();
                (y.inner(), x.grad(&grads).unwrap(), dw, db)
            };
            let bf16 = PreparedWeights::default().for_products(Products::Bf16);
            let (y, dx, dw, db) = run(Some(&bf16));
            let (want_y, want_dx, want_dw, want_db) = run(None);
            let w = linear.weight.val();
            within_bf16(y, want_y, abs(&x).matmul(abs(&w)));
            within_bf16(dx, want_dx, abs(&dy).matmul(abs(&w).transpose()));
            within_bf16(dw, want_dw, abs(&x).transpose().matmul(abs(&dy)));
            // The bias's gradient is a sum of dy, no product: f32's.
            assert!(gap(db.unsqueeze(), want_db.unsqueeze()) < 1e-3);

            let table = Tensor::<Trained, 2>::random([outputs, inputs], normal, &device);
            let by_table = |prepared: Option<&PreparedWeights>| {
                let (x, table) = (x.clone().require_grad(), Param::from_tensor(table.clone()));
                let y = match prepared {
                    Some(prepared) => trained_product_by_table(&x, &table, prepared).unwrap(),
                    None => x.clone().matmul(table.val().transpose()),
                };
                let grads = (y.clone() * dy.clone()).sum().backward();
                let (dx, dt) = (x.grad(&grads).unwrap(), table.val().grad(&grads).unwrap());
                (y.inner(), dx, dt)
            };
            let (y, dx, dtable) = by_table(Some(&bf16));
            let (want_y, want_dx, want_dtable) = by_table(None);
            within_bf16(y, want_y, abs(&x).matmul(abs(&table).transpose()));
            within_bf16(dx, want_dx, abs(&dy).matmul(abs(&table)));
            within_bf16(dtable, want_dtable, abs(&dy).transpose().matmul(abs(&x)));
        }
    }
}
