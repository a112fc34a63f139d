//! The encoders' projections `x W + b` and what follows them: an activation, or LayerScale and
//! the residual stream. On host backends in f32 that step runs inside the product as each tile
//! is stored ([`sgemm`], on AVX2 CPUs) or in one pass over the product's rows, the weights are
//! prepared once per weight ([`crate::prepared`]), and self-attention's q, k and v come from one
//! product that the attention kernel reads in place; on the other backends these are burn
//! operations.

use burn::module::Param;
use burn::nn::Linear;
use burn::tensor::backend::Backend;
use burn::tensor::{Tensor, TensorData};

use crate::Activation;
use crate::linear_op::{trained_linear, trained_product_by_table};
use crate::prepared::{HostWeight, Operand};
use crate::{Pass, Site};
use kiln_kernels::gemm::bf16::{self, PaddedImage};
use kiln_kernels::gemm::quantized::{self, QuantMatrix, QuantizedRows};
use kiln_kernels::gemm::sgemm;
use kiln_kernels::gemm::strided::{Threads, View, Write, matmul};
use kiln_kernels::host;
use kiln_kernels::host::conv::Windows;

/// What follows a projection `x W + b`.
pub enum Then<B: Backend, const D: usize> {
    /// Nothing.
    Nothing,
    /// `act(x W + b)`.
    Activate(Activation),
    /// `residual + scale ⊙ (x W + b)`, with no scale when `None` (LayerScale's when given).
    AddTo {
        /// The residual stream the result is added onto.
        residual: Tensor<B, D>,
        /// LayerScale's per-feature factors.
        scale: Option<Tensor<B, 1>>,
    },
}

/// `then(x W + b)` with every leading dimension of `x` flattened into the rows of one product
/// (burn 0.21 multiplies a `[batch, tokens, in]` input by the weight image by image). On host
/// backends the product runs on kiln's kernels with `then` fused in; in training on Flex the
/// product is one autodiff operation of kiln's (`then` through burn's operations).
pub fn project<B: Backend, const D: usize>(
    linear: &Linear<B>,
    x: Tensor<B, D>,
    then: Then<B, D>,
    pass: &Pass,
) -> Tensor<B, D> {
    let residual_served = match &then {
        Then::AddTo { residual, .. } => host::serves(residual),
        _ => true,
    };
    if host::serves(&x) && residual_served {
        return project_on_host(linear, x, then, pass);
    }
    #[cfg(feature = "cuda")]
    let (x, then) = match cublaslt::project(linear, x, then) {
        Ok(y) => return y,
        Err(unserved) => unserved,
    };
    let mut dims = x.dims();
    let rows = dims[..D - 1].iter().product();
    let x = x.reshape([rows, dims[D - 1]]);
    let y = trained_linear(linear, &x, pass.prepared()).unwrap_or_else(|| linear.forward(x));
    dims[D - 1] = y.dims()[1];
    finish(y.reshape(dims), then)
}

/// `x Eᵀ` of `x` `[batch, tokens, in]` and a table `E` `[out, in]` (a language model's head
/// tied to its token embeddings), never copying the transposed table per forward: on host
/// backends in f32 a product with the table transposed once ([`PreparedWeights::transposed`]);
/// in training on Flex one autodiff operation of kiln's (as [`project`]; burn's backward of the
/// strided view copied the 113 MB table of SmolLM2-135M each pass); elsewhere burn's product
/// reading `E` by strides.
///
/// [`PreparedWeights::transposed`]: crate::PreparedWeights::transposed
pub fn project_by_table<B: Backend>(
    x: Tensor<B, 3>,
    table: &Param<Tensor<B, 2>>,
    pass: &Pass,
) -> Tensor<B, 3> {
    let [batch, tokens, inputs] = x.dims();
    if host::serves(&x) {
        let device = x.device();
        let weight = pass.prepared().transposed(table);
        let y = product_then(x.into_data(), &weight, |v| v);
        let shape = [batch, tokens, weight.columns()];
        return Tensor::from_data(TensorData::new(y, shape), &device);
    }
    let rows = x.clone().reshape([batch * tokens, inputs]);
    if let Some(y) = trained_product_by_table(&rows, table, pass.prepared()) {
        return y.reshape([batch, tokens, table.dims()[0]]);
    }
    let table = table.val();
    #[cfg(feature = "cuda")]
    if let Some(y) =
        kiln_kernels::gemm::cublaslt::product(&rows, false, &table, true, None, false, None)
    {
        return y.reshape([batch, tokens, table.dims()[0]]);
    }
    // Unsqueezed before the transpose: the other order makes burn copy the whole transposed
    // table (docs/FOVEATED.md).
    x.matmul(table.unsqueeze::<3>().transpose())
}

/// `then(drop(site, x W + b))`: when the pass drops activations at `site`, the dropout comes
/// between the product and what follows it, which then runs as burn operations.
pub fn project_dropped<B: Backend, const D: usize>(
    linear: &Linear<B>,
    x: Tensor<B, D>,
    site: Site,
    then: Then<B, D>,
    pass: &Pass,
) -> Tensor<B, D> {
    if !pass.drops(site) {
        return project(linear, x, then, pass);
    }
    finish(
        pass.drop(site, project(linear, x, Then::Nothing, pass)),
        then,
    )
}

/// Projections on burn's CUDA backend through NVIDIA's cuBLASLt (kiln-kernels' `cublaslt`).
#[cfg(feature = "cuda")]
mod cublaslt {
    use super::*;
    use kiln_kernels::gemm::cublaslt::product;

    /// `then(x W + b)` with the bias, the tanh GELU and a residual without LayerScale inside
    /// cuBLASLt's kernel (`β = 1` adds the residual), any other activation or a scale after it
    /// through burn's operations; `Err` gives `x` and `then` back where cuBLASLt does not serve
    /// them (another backend, training, a dtype it does not take, the library missing).
    #[allow(clippy::type_complexity)]
    pub(super) fn project<B: Backend, const D: usize>(
        linear: &Linear<B>,
        x: Tensor<B, D>,
        then: Then<B, D>,
    ) -> Result<Tensor<B, D>, (Tensor<B, D>, Then<B, D>)> {
        let mut dims = x.dims();
        let rows = dims[..D - 1].iter().product();
        let weight = linear.weight.val();
        let outputs = weight.dims()[1];
        let bias = linear.bias.as_ref().map(|b| b.val());
        let flat = x.clone().reshape([rows, dims[D - 1]]);
        let (gelu_tanh, residual) = match &then {
            Then::Activate(Activation::GeluTanh) => (true, None),
            Then::AddTo {
                residual,
                scale: None,
            } => (false, Some(residual.clone().reshape([rows, outputs]))),
            _ => (false, None),
        };
        let Some(y) = product(
            &flat,
            false,
            &weight,
            false,
            bias.as_ref(),
            gelu_tanh,
            residual.as_ref(),
        ) else {
            return Err((x, then));
        };
        dims[D - 1] = outputs;
        let y = y.reshape(dims);
        Ok(if gelu_tanh || residual.is_some() {
            y
        } else {
            finish(y, then)
        })
    }
}

/// `then(y)` through burn's operations.
fn finish<B: Backend, const D: usize>(y: Tensor<B, D>, then: Then<B, D>) -> Tensor<B, D> {
    match then {
        Then::Nothing => y,
        Then::Activate(activation) => activation.forward(y),
        Then::AddTo { residual, scale } => match scale {
            Some(scale) => residual + y * last_axis(scale),
            None => residual + y,
        },
    }
}

/// Self-attention of `x` `[batch, tokens, width]` through the `q`, `k` and `v` projections;
/// returns the heads merged, before the output projection. On host backends the three weights
/// are one `[in, 3 · width]` product.
pub fn self_attention<B: Backend>(
    q: &Linear<B>,
    k: &Linear<B>,
    v: &Linear<B>,
    x: Tensor<B, 3>,
    heads: usize,
    pass: &Pass,
) -> Tensor<B, 3> {
    if !host::serves(&x) {
        let [query, key] = [q, k].map(|linear| project(linear, x.clone(), Then::Nothing, pass));
        return pass.attention(query, key, project(v, x, Then::Nothing, pass), heads);
    }
    let [batch, tokens, _] = x.dims();
    let device = x.device();
    let weight = pass.prepared().side_by_side(&[q, k, v]);
    let qkv = product_then(x.into_data(), &weight, |v| v);
    pass.attention_side_by_side(
        TensorData::new(qkv, [batch, tokens, weight.columns()]),
        heads,
        &device,
    )
}

/// [`project`] for f32 tensors of a host backend.
fn project_on_host<B: Backend, const D: usize>(
    linear: &Linear<B>,
    x: Tensor<B, D>,
    then: Then<B, D>,
    pass: &Pass,
) -> Tensor<B, D> {
    let device = x.device();
    let mut dims = x.dims();
    let x = x.into_data();
    let values = match then {
        Then::AddTo { residual, scale } => {
            // residual + s ⊙ (x W + b) = (residual + s ⊙ b) + x (W diag s): the scale is in the
            // prepared weight's columns and the product is added onto the residual stream in place.
            let weight = pass.prepared().linear(linear, scale.as_ref());
            let mut out = residual.into_data();
            let values = out.as_mut_slice::<f32>().expect("host projections are f32");
            add_product(values, host::f32s(&x), last_dim(&x), &weight);
            return Tensor::from_data(out, &device);
        }
        Then::Nothing => product_then(x, &pass.prepared().linear(linear, None), |v| v),
        Then::Activate(activation) => {
            let weight = pass.prepared().linear(linear, None);
            match activation {
                Activation::QuickGelu => product_then(x, &weight, host::quick_gelu),
                Activation::GeluTanh => product_then(x, &weight, host::gelu_tanh),
                Activation::Gelu => product_then(x, &weight, host::gelu),
            }
        }
    };
    // The weight's shape without its values (a weight kept as stored is never decoded).
    dims[D - 1] = linear.weight.lazy_shape().to_vec()[1];
    Tensor::from_data(TensorData::new(values, dims), &device)
}

/// `f(x W + b)`, row-major `[rows, out]`, for the data `x` with its leading dimensions flattened
/// into rows.
pub fn product_then(x: TensorData, weight: &HostWeight, f: impl Fn(f32) -> f32 + Sync) -> Vec<f32> {
    let inputs = last_dim(&x);
    product_rows(host::f32s(&x), inputs, weight, f)
}

/// `f(x W + b)`, row-major `[rows, out]`, for the row-major rows `x` of `inputs` values.
pub fn product_rows(
    x: &[f32],
    inputs: usize,
    weight: &HostWeight,
    f: impl Fn(f32) -> f32 + Sync,
) -> Vec<f32> {
    let rows = x.len() / inputs.max(1);
    match &weight.operand {
        Operand::Packed(packed) => return sgemm::new_product(x, packed, rows, &weight.bias, f),
        Operand::Bf16(packed) => return bf16::new_product(x, packed, rows, &weight.bias, f),
        _ => {}
    }
    let mut out = vec![0f32; rows * weight.columns()];
    product_rows_into(&mut out, x, inputs, weight, f);
    out
}

/// [`product_rows`] written over `out` (`[rows, out]`), for callers that reuse their buffers.
pub fn product_rows_into(
    out: &mut [f32],
    x: &[f32],
    inputs: usize,
    weight: &HostWeight,
    f: impl Fn(f32) -> f32 + Sync,
) {
    let (rows, outputs) = (x.len() / inputs.max(1), weight.columns());
    assert_eq!(out.len(), rows * outputs, "product: out's shape");
    match &weight.operand {
        Operand::Packed(packed) => sgemm::product(out, x, packed, rows, false, &weight.bias, f),
        Operand::Bf16(packed) => bf16::product(out, x, packed, rows, false, &weight.bias, f),
        operand => {
            gemm_product(
                out,
                x,
                inputs,
                outputs,
                operand,
                Write::Overwrite,
                Threads::All,
            );
            host::add_bias_map(out, &weight.bias, f);
        }
    }
}

/// `f(windows W + b)` for a convolution's windows over an NHWC image (`[rows, out]`): on
/// sgemm or in bf16, packed straight from the image (the unfolded rows never written out), or
/// read in place from `padded` ([`PaddedImage::for_windows`]) where it serves them; else through the
/// unfolded rows.
pub fn product_windows(
    windows: &Windows,
    weight: &HostWeight,
    padded: Option<&PaddedImage>,
    f: impl Fn(f32) -> f32 + Sync,
) -> Vec<f32> {
    match (&weight.operand, padded) {
        (Operand::Packed(packed), _) => sgemm::conv_product(windows, packed, &weight.bias, f),
        (Operand::Bf16(packed), Some(image)) if image.serves(windows) => {
            bf16::image_product(image, windows, packed, &weight.bias, f)
        }
        (Operand::Bf16(packed), _) => bf16::conv_product(windows, packed, &weight.bias, f),
        _ => product_rows(&windows.unfolded(), windows.depth(), weight, f),
    }
}

/// [`product_windows`] written into rows `rows` of `out` (`weight`'s columns wide): row `r` of
/// the product into row `rows[r]`, in increasing order (a transposed convolution's phase put
/// where its pixels lie): in place from `padded` where it serves, else gathered and copied.
/// With `add_onto` the rows' values are added to, after `f` (a skip connection), not replaced.
pub fn product_windows_into_rows(
    out: &mut [f32],
    rows: &[usize],
    windows: &Windows,
    weight: &HostWeight,
    (padded, add_onto): (Option<&PaddedImage>, bool),
    f: impl Fn(f32) -> f32 + Sync,
) {
    if let (Operand::Bf16(packed), Some(image)) = (&weight.operand, padded)
        && image.serves(windows)
    {
        let bias = &weight.bias;
        return bf16::image_product_into_rows(out, rows, image, windows, packed, bias, add_onto, f);
    }
    let outputs = weight.columns();
    let product = product_windows(windows, weight, padded, f);
    for (values, &row) in product.chunks_exact(outputs).zip(rows) {
        let out = &mut out[row * outputs..][..outputs];
        match add_onto {
            true => out.iter_mut().zip(values).for_each(|(o, v)| *o += v),
            false => out.copy_from_slice(values),
        }
    }
}

/// `x W + bias` for the rows `x` (of `inputs` values each) on the calling thread, into a new
/// vector: for a caller that runs several products at once, one per thread (Winograd's per-point
/// products), where splitting each across the threads would leave slivers.
pub fn product_on_this_thread(x: &[f32], inputs: usize, weight: &HostWeight) -> Vec<f32> {
    let rows = x.len() / inputs.max(1);
    match &weight.operand {
        Operand::Packed(packed) => {
            return sgemm::new_product_on_this_thread(x, packed, rows, &weight.bias, |v| v);
        }
        Operand::Bf16(packed) => {
            return bf16::new_product_on_this_thread(x, packed, rows, &weight.bias, |v| v);
        }
        _ => {}
    }
    let (operand, outputs) = (&weight.operand, weight.columns());
    let mut out = vec![0f32; rows * outputs];
    gemm_product(
        &mut out,
        x,
        inputs,
        outputs,
        operand,
        Write::Overwrite,
        Threads::One,
    );
    host::add_bias_map(&mut out, &weight.bias, |v| v);
    out
}

/// Rows from which a product with stored weights unpacks them a panel at a time for the many
/// rows (`prompt_product`) rather than reading each row's blocks for a few rows at a time.
const PROMPT_ROWS: usize = 16;

/// `out (+)= x W` (as `write` says) through the `gemm` crate on `threads`, for a weight it
/// reads: row-major, in place, or in place transposed; or with quantized weights, multiplied as
/// stored a few rows at a time, or a panel at a time for many.
fn gemm_product(
    out: &mut [f32],
    x: &[f32],
    inputs: usize,
    outputs: usize,
    operand: &Operand,
    write: Write,
    threads: Threads,
) {
    let rows = x.len() / inputs.max(1);
    let x_rows = View::rows(0, rows, inputs, inputs);
    let mut product = |first: usize, columns: usize, weight: &[f32], view: View| {
        let out_view = View::rows(first, rows, columns, outputs);
        matmul(out, out_view, x, x_rows, weight, view, write, threads);
    };
    match operand {
        Operand::RowMajor(values) => {
            product(0, outputs, values, View::rows(0, inputs, outputs, outputs));
        }
        Operand::InPlace(blocks) => {
            let mut first = 0;
            for (values, columns) in blocks {
                let view = View::rows(0, inputs, *columns, *columns);
                product(first, *columns, values.values(), view);
                first += columns;
            }
        }
        Operand::InPlaceTransposed(matrix) => {
            let view = View::rows(0, outputs, inputs, inputs).transposed();
            product(0, outputs, matrix.values(), view);
        }
        Operand::Quantized(matrices) if rows >= PROMPT_ROWS => {
            // Many rows (a prompt): each matrix unpacked a panel at a time (docs/PERFORMANCE.md).
            let x = QuantizedRows::new(x, inputs);
            let matrices: Vec<&QuantMatrix> = matrices.iter().map(|m| &**m).collect();
            quantized::prompt_product(out, outputs, &x, &matrices, write);
        }
        Operand::Quantized(matrices) => {
            // The activations quantized once; every matrix in one parallel region.
            let x = QuantizedRows::new(x, inputs);
            let matrices: Vec<&QuantMatrix> = matrices.iter().map(|m| &**m).collect();
            quantized::product(out, outputs, &x, &matrices, write);
        }
        Operand::Packed(_) | Operand::Bf16(_) => {
            unreachable!("packed weights run on their own kernels")
        }
    }
}

/// `residual += x W + b` in place, for the row-major rows `x` of `inputs` values and
/// `residual` `[rows, out]`.
pub fn add_product(residual: &mut [f32], x: &[f32], inputs: usize, weight: &HostWeight) {
    let (rows, outputs) = (x.len() / inputs.max(1), weight.columns());
    match &weight.operand {
        Operand::Packed(packed) => {
            sgemm::product(residual, x, packed, rows, true, &weight.bias, |v| v);
        }
        Operand::Bf16(packed) => {
            bf16::product(residual, x, packed, rows, true, &weight.bias, |v| v);
        }
        operand => {
            host::add_bias_map(residual, &weight.bias, |v| v);
            gemm_product(
                residual,
                x,
                inputs,
                outputs,
                operand,
                Write::Add,
                Threads::All,
            );
        }
    }
}

/// The last dimension of the data `x` (a projection's inputs).
fn last_dim(x: &TensorData) -> usize {
    *x.shape
        .last()
        .expect("a projection's input has a last axis")
}

/// A `[features]` tensor shaped to broadcast along the last axis of a rank-`D` tensor.
fn last_axis<B: Backend, const D: usize>(x: Tensor<B, 1>) -> Tensor<B, D> {
    let mut shape = [1; D];
    shape[D - 1] = x.dims()[0];
    x.reshape(shape)
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::backend::Flex;
    use burn::nn::LinearConfig;
    use burn::tensor::Distribution;

    use crate::pass::Settings;
    use crate::prepared::PreparedWeights;
    use kiln_kernels::HostValues;

    /// The host path of every projection form against burn's operations, with fewer rows than
    /// one register tile per thread and with many.
    #[test]
    fn host_projections_match_burn_operations() {
        let device = Default::default();
        let normal = Distribution::Normal(0.0, 1.0);
        let linear = LinearConfig::new(40, 56).init::<Flex>(&device);
        let pass = Pass::new(&Settings::default(), &PreparedWeights::default(), None);
        for rows in [7, 700] {
            let x = Tensor::<Flex, 3>::random([1, rows, 40], normal, &device);
            let residual = Tensor::<Flex, 3>::random([1, rows, 56], normal, &device);
            let scale = Tensor::<Flex, 1>::random([56], normal, &device);
            let forms = || {
                [
                    Then::Nothing,
                    Then::Activate(Activation::QuickGelu),
                    Then::Activate(Activation::GeluTanh),
                    Then::Activate(Activation::Gelu),
                    Then::AddTo {
                        residual: residual.clone(),
                        scale: None,
                    },
                    Then::AddTo {
                        residual: residual.clone(),
                        scale: Some(scale.clone()),
                    },
                ]
            };
            for (ours, then) in forms().into_iter().zip(forms()) {
                let got = project(&linear, x.clone(), ours, &pass);
                let want = finish(linear.forward(x.clone()), then);
                let diff = (got - want.clone()).abs().max().into_scalar();
                let size = want.abs().max().into_scalar();
                assert!(diff <= 1e-5 * size, "{rows} rows: max |Δ| {diff} of {size}");
            }
        }
    }

    /// On an autodiff backend the projections are burn operations, so gradients reach the
    /// weights (the host kernels would cut their path).
    #[test]
    fn gradients_reach_the_weights_under_autodiff() {
        type Ad = burn::backend::Autodiff<Flex>;
        let device = Default::default();
        let normal = Distribution::Normal(0.0, 1.0);
        let linear = LinearConfig::new(6, 4).init::<Ad>(&device);
        let x = Tensor::<Ad, 2>::random([5, 6], normal, &device);
        let pass = Pass::new(&Settings::default(), &PreparedWeights::default(), None);
        let then = || Then::Activate(Activation::Gelu);
        let ours = project(&linear, x.clone(), then(), &pass).sum().backward();
        let burns = finish(linear.forward(x), then()).sum().backward();
        let [ours, burns] = [ours, burns].map(|g| linear.weight.grad(&g).expect("a gradient"));
        let diff = (ours - burns.clone()).abs().max().into_scalar();
        assert!(
            diff <= 1e-6 * burns.abs().max().into_scalar(),
            "max |Δ| {diff}"
        );
    }

    /// Every form of a prepared weight (sgemm's panels where the CPU runs it, row-major for the
    /// `gemm` crate, the parameters' storage in place as column blocks or transposed) gives
    /// `f(x W + b)` and `r + x W + b`.
    #[test]
    fn every_operand_gives_the_product() {
        let (rows, inputs, outputs) = (50, 33, 20);
        let x: Vec<f32> = (0..rows * inputs).map(|i| (i as f32 * 0.3).sin()).collect();
        let w: Vec<f32> = (0..inputs * outputs)
            .map(|i| (i as f32 * 0.7).cos())
            .collect();
        let bias: Vec<f32> = (0..outputs).map(|i| i as f32 * 0.1).collect();
        let residual: Vec<f32> = (0..rows * outputs).map(|i| (i as f32).sqrt()).collect();
        let f = |v: f32| v.max(0.0);
        let dot = |r: usize, c: usize| -> f32 {
            (0..inputs)
                .map(|p| x[r * inputs + p] * w[p * outputs + c])
                .sum::<f32>()
                + bias[c]
        };
        let device = Default::default();
        let matrix = |values: Vec<f32>, shape: [usize; 2]| {
            HostValues::of(&Tensor::<Flex, 2>::from_data(
                TensorData::new(values, shape),
                &device,
            ))
        };
        let split = 7;
        let columns = |range: std::ops::Range<usize>| -> Vec<f32> {
            (0..inputs)
                .flat_map(|p| range.clone().map(move |c| (p, c)))
                .map(|(p, c)| w[p * outputs + c])
                .collect()
        };
        let transposed: Vec<f32> = (0..outputs * inputs)
            .map(|i| w[i % inputs * outputs + i / inputs])
            .collect();
        let mut operands = vec![
            Operand::RowMajor(w.clone()),
            Operand::InPlace(vec![
                (matrix(columns(0..split), [inputs, split]), split),
                (
                    matrix(columns(split..outputs), [inputs, outputs - split]),
                    outputs - split,
                ),
            ]),
            Operand::InPlaceTransposed(matrix(transposed, [outputs, inputs])),
        ];
        if sgemm::supported() {
            operands.push(Operand::Packed(sgemm::Packed::new(
                inputs,
                &[(&w, outputs)],
            )));
        }
        if bf16::supported() {
            operands.push(Operand::Bf16(bf16::Packed::new(inputs, &[(&w, outputs)])));
        }
        for operand in operands {
            // bf16 operands: within bf16 rounding of the sum's magnitude (|x|, |w| ≤ 1).
            let tolerance = match operand {
                Operand::Bf16(_) => inputs as f32 / 256.0,
                _ => 1e-4,
            };
            let name = match operand {
                Operand::Packed(_) => "packed",
                Operand::Bf16(_) => "bf16",
                Operand::RowMajor(_) => "row-major",
                Operand::InPlace(_) => "in place",
                Operand::InPlaceTransposed(_) => "in place, transposed",
                // Checked by kiln-kernels' `gemm::quantized` tests and kiln-text's GGUF parity.
                Operand::Quantized(_) => "quantized",
            };
            let weight = HostWeight {
                operand,
                bias: bias.clone(),
            };
            let data = TensorData::new(x.clone(), [rows, inputs]);
            let product = product_then(data, &weight, f);
            let mut added = residual.clone();
            add_product(&mut added, &x, inputs, &weight);
            for (r, c) in (0..rows).flat_map(|r| (0..outputs).map(move |c| (r, c))) {
                let i = r * outputs + c;
                let want = dot(r, c);
                assert!(
                    (product[i] - f(want)).abs() < tolerance,
                    "{name} f(xW+b) at {r},{c}"
                );
                assert!(
                    (added[i] - residual[i] - want).abs() < tolerance,
                    "{name} r+xW+b at {r},{c}"
                );
            }
        }
    }

    /// Weights kept as stored (two Q8_0 matrices side by side) give `x W + b` on both paths (a
    /// few rows; many, a panel at a time), within the activations' 8-bit rounding (half a step
    /// of each 32-value block, `max |x| / 254`, times `Σ |w|`); added onto a residual alike.
    #[test]
    fn stored_weights_give_the_product_on_both_paths() {
        use half::f16;
        use kiln_core::gguf::GgmlType;
        use std::sync::Arc;
        let (inputs, outputs) = (64, [5, 3]);
        let mut blocks = Vec::new();
        let mut weights = Vec::new(); // [out, in], every matrix's rows in turn
        for (m, &rows) in outputs.iter().enumerate() {
            let mut bytes = Vec::new();
            for block in 0..rows * inputs / 32 {
                let d = f16::from_f32(0.01 * (1 + (block + m) % 3) as f32);
                bytes.extend(d.to_bits().to_le_bytes());
                for j in 0..32 {
                    let q = ((block * 37 + j * 11 + m) % 255) as i32 - 127;
                    bytes.push(q as i8 as u8);
                    weights.push(d.to_f32() * q as f32);
                }
            }
            let matrix = quantized::QuantMatrix::new(GgmlType::Q8_0, rows, inputs, bytes);
            blocks.push(Arc::new(matrix.expect("whole blocks")));
        }
        let columns: usize = outputs.iter().sum();
        let bias: Vec<f32> = (0..columns).map(|c| c as f32 * 0.25).collect();
        let weight = HostWeight {
            operand: Operand::Quantized(blocks),
            bias: bias.clone(),
        };
        for rows in [1, 3, PROMPT_ROWS + 4] {
            let x: Vec<f32> = (0..rows * inputs)
                .map(|i| (i as f32 * 0.37).sin())
                .collect();
            let product = product_rows(&x, inputs, &weight, |v| v);
            let mut added = vec![1.0; rows * columns];
            add_product(&mut added, &x, inputs, &weight);
            for (r, c) in (0..rows).flat_map(|r| (0..columns).map(move |c| (r, c))) {
                let (x, w) = (&x[r * inputs..][..inputs], &weights[c * inputs..][..inputs]);
                let want: f64 = x
                    .iter()
                    .zip(w)
                    .map(|(&a, &b)| f64::from(a * b))
                    .sum::<f64>()
                    + f64::from(bias[c]);
                let step = x.iter().fold(0f32, |m, v| m.max(v.abs())) / 254.0;
                let tolerance = f64::from(step * w.iter().map(|w| w.abs()).sum::<f32>()) + 1e-4;
                let got = f64::from(product[r * columns + c]);
                assert!(
                    (got - want).abs() <= tolerance,
                    "{rows} rows, [{r}, {c}]: {got} vs {want}"
                );
                let got = f64::from(added[r * columns + c]) - 1.0;
                assert!(
                    (got - want).abs() <= tolerance,
                    "{rows} rows, added [{r}, {c}]"
                );
            }
        }
    }
}
