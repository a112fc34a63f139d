//! The exact GELU for any backend, with a faster path where training spends its time: on
//! `Autodiff<Flex>` in f32, burn-flex computes erf per element through libm in the forward pass
//! and again in the backward (2.4 ms against kiln's 0.4 ms for one MLP's activations in the
//! example's training step, `cargo bench --bench train`); there kiln's vectorised [`math::gelu`]
//! and [`math::gelu_derivative`] run instead, as one [`HostOp`].

use crate::host::zip_map;
use crate::host_op::{HostOp, host_op};
use crate::math;
use crate::values::zeros;
use burn::tensor::Tensor;
use burn::tensor::backend::Backend;

/// `½x(1 + erf(x/√2))`, differentiable.
///
/// ```
/// # use burn::backend::{Autodiff, Flex};
/// # use burn::tensor::Tensor;
/// let x = Tensor::<Autodiff<Flex>, 1>::from_floats([-1.0, 0.0, 2.0], &Default::default())
///     .require_grad();
/// let y = kiln_kernels::gelu(x.clone());
/// let slope = x.grad(&y.sum().backward()).unwrap().into_data().to_vec::<f32>().unwrap();
/// assert!((slope[2] - 1.0852).abs() < 1e-4);
/// ```
pub fn gelu<B: Backend, const D: usize>(x: Tensor<B, D>) -> Tensor<B, D> {
    host_op(Gelu, [&x], x.dims()).unwrap_or_else(|| burn::tensor::activation::gelu(x))
}

/// [`gelu`] on host values, in parallel chunks that vectorise.
#[derive(Debug, Clone)]
struct Gelu;

impl HostOp<1> for Gelu {
    fn forward(&self, [x]: [&[f32]; 1]) -> Vec<f32> {
        let mut y = zeros(x.len());
        zip_map(&mut y, x, x, |x, _| math::gelu(x));
        y
    }

    fn backward(&self, grad: &[f32], [x]: [&[f32]; 1]) -> [Vec<f32>; 1] {
        let mut dx = zeros(x.len());
        zip_map(&mut dx, grad, x, |g, x| g * math::gelu_derivative(x));
        [dx]
    }
}

#[cfg(all(test, feature = "flex"))]
mod tests {
    use burn::backend::{Autodiff, Flex};
    use burn::tensor::{Distribution, Tensor};

    /// kiln's op against burn's GELU on the same backend: values and gradients.
    #[test]
    fn the_fast_gelu_matches_burns_values_and_gradients() {
        type Ad = Autodiff<Flex>;
        let device = Default::default();
        let x = Tensor::<Ad, 2>::random([37, 53], Distribution::Normal(0.0, 3.0), &device)
            .require_grad();
        let weights = Tensor::<Ad, 2>::random([37, 53], Distribution::Default, &device);
        let ours = super::gelu(x.clone());
        let burns = burn::tensor::activation::gelu(x.clone());
        let max = |t: Tensor<Flex, 2>| t.abs().max().into_scalar();
        let diff = max((ours.clone() - burns.clone()).inner());
        assert!(diff <= 1e-6 * max(burns.clone().inner()), "values: {diff}");
        let slope = |y: Tensor<Ad, 2>| x.grad(&(y * weights.clone()).sum().backward()).unwrap();
        let (ours, burns) = (slope(ours), slope(burns));
        let diff = max(ours - burns.clone());
        assert!(diff <= 1e-6 * max(burns), "gradients: {diff}");
    }
}
