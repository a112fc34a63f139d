//! The encoders' projections `x W + b` and what follows them: an activation, or LayerScale and
//! the residual stream. On host backends in f32 that step runs inside the product as each tile
//! is stored ([`sgemm`], on AVX2 CPUs for products of enough rows) or in one pass over the
//! product's rows, and self-attention's q, k and v come from one product that the attention
//! kernel reads in place; on the other backends these are burn operations.

use burn::module::Param;
use burn::nn::Linear;
use burn::tensor::activation::{gelu, gelu_approximate, sigmoid};
use burn::tensor::backend::Backend;
use burn::tensor::{Tensor, TensorData};

use crate::config::Activation;
use crate::host;
use crate::matmul::{Threads, View, Write, matmul};
use crate::pass::{Pass, Site};
use crate::sgemm;

/// What follows a projection `x W + b`.
pub(crate) enum Then<B: Backend, const D: usize> {
    /// Nothing.
    Nothing,
    /// `act(x W + b)`.
    Activate(Activation),
    /// `residual + scale ⊙ (x W + b)`, with no scale when `None` (LayerScale's when given).
    AddTo {
        residual: Tensor<B, D>,
        scale: Option<Tensor<B, 1>>,
    },
}

/// `then(x W + b)` with every leading dimension of `x` flattened into the rows of one product
/// (burn 0.21 multiplies a `[batch, tokens, in]` input by the weight image by image).
pub(crate) fn project<B: Backend, const D: usize>(
    linear: &Linear<B>,
    x: Tensor<B, D>,
    then: Then<B, D>,
) -> Tensor<B, D> {
    let residual_served = match &then {
        Then::AddTo { residual, .. } => host::serves(residual),
        _ => true,
    };
    if host::serves(&x) && residual_served {
        return project_on_host(linear, x, then);
    }
    let mut dims = x.dims();
    let rows = dims[..D - 1].iter().product();
    let y = linear.forward(x.reshape([rows, dims[D - 1]]));
    dims[D - 1] = y.dims()[1];
    finish(y.reshape(dims), then)
}

/// `then(drop(site, x W + b))`: when the pass drops activations at `site`, the dropout comes
/// between the product and what follows it, which then runs as burn operations.
pub(crate) fn project_dropped<B: Backend, const D: usize>(
    linear: &Linear<B>,
    x: Tensor<B, D>,
    site: Site,
    then: Then<B, D>,
    pass: &Pass,
) -> Tensor<B, D> {
    if !pass.drops(site) {
        return project(linear, x, then);
    }
    finish(pass.drop(site, project(linear, x, Then::Nothing)), then)
}

/// `then(y)` through burn's operations.
fn finish<B: Backend, const D: usize>(y: Tensor<B, D>, then: Then<B, D>) -> Tensor<B, D> {
    match then {
        Then::Nothing => y,
        Then::Activate(activation) => activate(y, activation),
        Then::AddTo { residual, scale } => match scale {
            Some(scale) => residual + y * last_axis(scale),
            None => residual + y,
        },
    }
}

/// Self-attention of `x` `[batch, tokens, width]` through the `q`, `k` and `v` projections;
/// returns the heads merged, before the output projection. On host backends the three weights
/// are one `[in, 3 · width]` product.
pub(crate) fn self_attention<B: Backend>(
    q: &Linear<B>,
    k: &Linear<B>,
    v: &Linear<B>,
    x: Tensor<B, 3>,
    heads: usize,
    pass: &Pass,
) -> Tensor<B, 3> {
    if !host::serves(&x) {
        let [query, key] = [q, k].map(|linear| project(linear, x.clone(), Then::Nothing));
        return pass.attention(query, key, project(v, x, Then::Nothing), heads);
    }
    let [batch, tokens, _] = x.dims();
    let device = x.device();
    let weight = Tensor::cat(vec![q.weight.val(), k.weight.val(), v.weight.val()], 1);
    let bias: Vec<f32> = [q, k, v]
        .into_iter()
        .flat_map(|linear| bias_values(linear.bias.as_ref(), linear.weight.dims()[1]))
        .collect();
    let columns = bias.len();
    let qkv = product_then(x.into_data(), &host_values(weight), &bias, |v| v);
    pass.attention_side_by_side(
        TensorData::new(qkv, [batch, tokens, columns]),
        heads,
        &device,
    )
}

/// [`project`] for f32 tensors of a host backend.
fn project_on_host<B: Backend, const D: usize>(
    linear: &Linear<B>,
    x: Tensor<B, D>,
    then: Then<B, D>,
) -> Tensor<B, D> {
    let device = x.device();
    let mut dims = x.dims();
    let x = x.into_data();
    let mut weight = host_values(linear.weight.val());
    let mut bias = bias_values(linear.bias.as_ref(), linear.weight.dims()[1]);
    dims[D - 1] = bias.len();
    let values = match then {
        Then::Nothing => product_then(x, &weight, &bias, |v| v),
        Then::Activate(Activation::QuickGelu) => product_then(x, &weight, &bias, host::quick_gelu),
        Then::Activate(Activation::GeluTanh) => product_then(x, &weight, &bias, host::gelu_tanh),
        Then::Activate(Activation::Gelu) => product_then(x, &weight, &bias, host::gelu),
        Then::AddTo { residual, scale } => {
            // residual + s ⊙ (x W + b) = (residual + s ⊙ b) + x (W diag s): the scale goes into
            // the weight's columns and the product is added onto the residual stream in place.
            if let Some(scale) = scale {
                let scale = host_values(scale);
                for row in weight.chunks_exact_mut(scale.len()) {
                    row.iter_mut().zip(&scale).for_each(|(w, s)| *w *= s);
                }
                bias.iter_mut().zip(&scale).for_each(|(b, s)| *b *= s);
            }
            let mut out = residual.into_data();
            let values = out.as_mut_slice::<f32>().expect("host projections are f32");
            add_product(values, &x, &weight, &bias);
            return Tensor::from_data(out, &device);
        }
    };
    Tensor::from_data(TensorData::new(values, dims), &device)
}

/// `f(x W + b)`, row-major `[rows, out]`, for the data `x` with its leading dimensions flattened
/// into rows and the row-major weight `[in, out]`.
pub(crate) fn product_then(
    x: TensorData,
    weight: &[f32],
    bias: &[f32],
    f: impl Fn(f32) -> f32 + Sync,
) -> Vec<f32> {
    let (rows, inputs, outputs) = shape(&x, bias.len());
    let mut out = vec![0f32; rows * outputs];
    if sgemm::suits(rows) {
        let shape = (rows, inputs, outputs);
        sgemm::product(&mut out, host::f32s(&x), weight, shape, false, bias, f);
        return out;
    }
    matmul(
        &mut out,
        View::rows(0, rows, outputs, outputs),
        host::f32s(&x),
        View::rows(0, rows, inputs, inputs),
        weight,
        View::rows(0, inputs, outputs, outputs),
        Write::Overwrite,
        Threads::All,
    );
    host::add_bias_map(&mut out, bias, f);
    out
}

/// `residual += x W + b` in place, `residual` row-major `[rows, out]`.
fn add_product(residual: &mut [f32], x: &TensorData, weight: &[f32], bias: &[f32]) {
    let (rows, inputs, outputs) = shape(x, bias.len());
    if sgemm::suits(rows) {
        let shape = (rows, inputs, outputs);
        sgemm::product(residual, host::f32s(x), weight, shape, true, bias, |v| v);
        return;
    }
    host::add_bias_map(residual, bias, |v| v);
    matmul(
        residual,
        View::rows(0, rows, outputs, outputs),
        host::f32s(x),
        View::rows(0, rows, inputs, inputs),
        weight,
        View::rows(0, inputs, outputs, outputs),
        Write::Add,
        Threads::All,
    );
}

/// `(rows, inputs, outputs)` of a product of the data `x` (leading dimensions flattened) with a
/// weight of `outputs` columns.
fn shape(x: &TensorData, outputs: usize) -> (usize, usize, usize) {
    let inputs = *x
        .shape
        .last()
        .expect("a projection's input has a last axis");
    (x.num_elements() / inputs.max(1), inputs, outputs)
}

/// A layer's bias of `width` values, zeros without one.
pub(crate) fn bias_values<B: Backend>(
    bias: Option<&Param<Tensor<B, 1>>>,
    width: usize,
) -> Vec<f32> {
    match bias {
        Some(bias) => host_values(bias.val()),
        None => vec![0.0; width],
    }
}

/// The values of a host tensor (a weight, bias or scale) as f32.
pub(crate) fn host_values<B: Backend, const D: usize>(x: Tensor<B, D>) -> Vec<f32> {
    x.into_data()
        .convert::<f32>()
        .into_vec::<f32>()
        .expect("converted to f32")
}

/// A `[features]` tensor shaped to broadcast along the last axis of a rank-`D` tensor.
fn last_axis<B: Backend, const D: usize>(x: Tensor<B, 1>) -> Tensor<B, D> {
    let mut shape = [1; D];
    shape[D - 1] = x.dims()[0];
    x.reshape(shape)
}

/// `activation(x)` through burn's operations.
fn activate<B: Backend, const D: usize>(x: Tensor<B, D>, activation: Activation) -> Tensor<B, D> {
    match activation {
        // x · σ(1.702 x)
        Activation::QuickGelu => x.clone() * sigmoid(x * 1.702),
        Activation::GeluTanh => gelu_approximate(x),
        Activation::Gelu => gelu(x),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::backend::Flex;
    use burn::nn::LinearConfig;
    use burn::tensor::Distribution;

    /// The host path of every projection form against burn's operations, with few rows (the
    /// `gemm` crate, then a pass for bias and activation) and with enough rows for the AVX2
    /// kernel (bias and activation inside the product) where the CPU has one.
    #[test]
    fn host_projections_match_burn_operations() {
        let device = Default::default();
        let normal = Distribution::Normal(0.0, 1.0);
        let linear = LinearConfig::new(40, 56).init::<Flex>(&device);
        let many = sgemm::min_rows() + 7;
        assert_eq!(sgemm::suits(many), sgemm::available());
        for rows in [13, many] {
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
                let got = project(&linear, x.clone(), ours);
                let want = finish(linear.forward(x.clone()), then);
                let diff = (got - want.clone()).abs().max().into_scalar();
                let size = want.abs().max().into_scalar();
                assert!(diff <= 1e-5 * size, "{rows} rows: max |Δ| {diff} of {size}");
            }
        }
    }
}
