//! The exact GELU for any backend, with a faster path where training spends its time: on
//! `Autodiff<Flex>` in f32, burn-flex computes erf per element through libm in the forward pass
//! and again in the backward (2.4 ms against kiln's 0.4 ms for one MLP's activations in the
//! example's training step, `cargo bench --bench train`); there kiln's vectorised [`math::gelu`] and [`math::gelu_derivative`]
//! run instead, as a burn-autodiff operation with its own backward.

use burn::tensor::Tensor;
use burn::tensor::backend::Backend;

#[cfg(feature = "flex")]
use crate::math;

/// `½x(1 + erf(x/√2))`, differentiable.
///
/// ```
/// # use burn::backend::{Autodiff, Flex};
/// # use burn::tensor::Tensor;
/// let x = Tensor::<Autodiff<Flex>, 1>::from_floats([-1.0, 0.0, 2.0], &Default::default())
///     .require_grad();
/// let y = kiln_precision::gelu(x.clone());
/// let slope = x.grad(&y.sum().backward()).unwrap().into_data().to_vec::<f32>().unwrap();
/// assert!((slope[2] - 1.0852).abs() < 1e-4);
/// ```
pub fn gelu<B: Backend, const D: usize>(x: Tensor<B, D>) -> Tensor<B, D> {
    #[cfg(feature = "flex")]
    if let Some(y) = trained_flex::gelu(x.clone()) {
        return y;
    }
    burn::tensor::activation::gelu(x)
}

#[cfg(feature = "flex")]
mod trained_flex {
    use std::any::{Any, TypeId};

    use burn::backend::{Autodiff, Flex};
    use burn::tensor::backend::Backend;
    use burn::tensor::ops::FloatTensor;
    use burn::tensor::{DType, Tensor, TensorData, TensorPrimitive};
    use burn_autodiff::checkpoint::base::Checkpointer;
    use burn_autodiff::checkpoint::strategy::NoCheckpointing;
    use burn_autodiff::grads::Gradients;
    use burn_autodiff::ops::{Backward, Ops, OpsKind, unary};
    use rayon::prelude::*;

    use super::math;

    type Trained = Autodiff<Flex>;
    type FlexPrimitive = FloatTensor<Flex>;
    type TrainedPrimitive = FloatTensor<Trained>;

    /// `Some(gelu(x))` when `B` is `Autodiff<Flex>` and `x` is f32.
    pub(super) fn gelu<B: Backend, const D: usize>(x: Tensor<B, D>) -> Option<Tensor<B, D>> {
        if TypeId::of::<B>() != TypeId::of::<Trained>() || x.dtype() != DType::F32 {
            return None;
        }
        let primitive: Box<dyn Any> = Box::new(x.into_primitive().tensor());
        let primitive = *primitive.downcast::<TrainedPrimitive>().ok()?;
        let output: Box<dyn Any> = Box::new(tracked::<D>(primitive));
        let output = *output.downcast::<FloatTensor<B>>().ok()?;
        Some(Tensor::from_primitive(TensorPrimitive::Float(output)))
    }

    /// The backward step: the incoming gradient times the GELU's slope at the saved input.
    #[derive(Debug)]
    struct GeluBackward<const D: usize>;

    impl<const D: usize> Backward<Flex, 1> for GeluBackward<D> {
        type State = FlexPrimitive;

        fn backward(self, ops: Ops<FlexPrimitive, 1>, grads: &mut Gradients, _: &mut Checkpointer) {
            let x = ops.state;
            unary::<Flex, _>(ops.parents, ops.node, grads, |grad| {
                elementwise::<D>(grad, Some(x), |g, x| g * math::gelu_derivative(x))
            });
        }
    }

    fn tracked<const D: usize>(x: TrainedPrimitive) -> TrainedPrimitive {
        let forward = |x| elementwise::<D>(x, None, |x, _| math::gelu(x));
        match GeluBackward::<D>
            .prepare::<NoCheckpointing>([x.node.clone()])
            .compute_bound()
            .stateful()
        {
            OpsKind::Tracked(prep) => {
                let y = forward(x.primitive.clone());
                prep.finish(x.primitive, y)
            }
            OpsKind::UnTracked(prep) => prep.finish(forward(x.primitive)),
        }
    }

    /// `f(a, b)` element by element over f32 tensors of one shape (`b`: `a` itself when absent),
    /// in parallel chunks that vectorise.
    fn elementwise<const D: usize>(
        a: FlexPrimitive,
        b: Option<FlexPrimitive>,
        f: impl Fn(f32, f32) -> f32 + Sync,
    ) -> FlexPrimitive {
        let a = Tensor::<Flex, D>::from_primitive(TensorPrimitive::Float(a));
        let (device, shape) = (a.device(), a.shape());
        let mut values: Vec<f32> = a.into_data().into_vec().expect("f32 values");
        let other: Option<Vec<f32>> = b.map(|b| {
            let b = Tensor::<Flex, D>::from_primitive(TensorPrimitive::Float(b));
            b.into_data().into_vec().expect("f32 values")
        });
        const CHUNK: usize = 1 << 14;
        match &other {
            Some(other) => values
                .par_chunks_mut(CHUNK)
                .zip(other.par_chunks(CHUNK))
                .for_each(|(a, b)| a.iter_mut().zip(b).for_each(|(a, &b)| *a = f(*a, b))),
            None => values
                .par_chunks_mut(CHUNK)
                .for_each(|a| a.iter_mut().for_each(|a| *a = f(*a, 0.0))),
        }
        let data = TensorData::new(values, shape);
        Tensor::<Flex, D>::from_data(data, &device)
            .into_primitive()
            .tensor()
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
