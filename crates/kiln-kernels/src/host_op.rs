//! Differentiable f32 operations computed on the host: one burn-autodiff node with a backward
//! written by hand, where burn-autodiff would record every tensor operation of a composite and,
//! on Flex, run one pass over memory (some of them element by element, some strided copies) for
//! each, forward and backward.

use burn::tensor::Tensor;
use burn::tensor::backend::Backend;

/// An f32 operation over `N` inputs, forward and backward, on row-major host values.
pub trait HostOp<const N: usize>: Clone + Send + std::fmt::Debug + 'static {
    /// The output's values.
    fn forward(&self, inputs: [&[f32]; N]) -> Vec<f32>;

    /// Each input's gradient, given the inputs and the gradient of the output.
    fn backward(&self, output_grad: &[f32], inputs: [&[f32]; N]) -> [Vec<f32>; N];

    /// The gradients of the inputs `wanted` marks, the others' left empty (a frozen weight's,
    /// whose product would be wasted); all of them by default.
    fn backward_wanted(
        &self,
        output_grad: &[f32],
        inputs: [&[f32]; N],
        wanted: [bool; N],
    ) -> [Vec<f32>; N] {
        let _ = wanted;
        self.backward(output_grad, inputs)
    }
}

/// `op` over `inputs` as one differentiable operation giving a tensor of `shape`, when `B` is
/// `Autodiff<Flex>` and every input is f32; `None` otherwise, where the caller's tensor
/// operations serve.
///
/// ```
/// use burn::backend::{Autodiff, Flex};
/// use burn::tensor::Tensor;
/// use kiln_kernels::{HostOp, host_op};
///
/// /// `x²`, element by element.
/// #[derive(Debug, Clone)]
/// struct Square;
///
/// impl HostOp<1> for Square {
///     fn forward(&self, [x]: [&[f32]; 1]) -> Vec<f32> {
///         x.iter().map(|x| x * x).collect()
///     }
///     fn backward(&self, grad: &[f32], [x]: [&[f32]; 1]) -> [Vec<f32>; 1] {
///         [grad.iter().zip(x).map(|(g, x)| 2.0 * g * x).collect()]
///     }
/// }
///
/// let x = Tensor::<Autodiff<Flex>, 1>::from_floats([1.0, -3.0], &Default::default()).require_grad();
/// let y = host_op(Square, [&x], [2]).expect("served on Autodiff<Flex>");
/// let slope = x.grad(&y.sum().backward()).unwrap();
/// assert_eq!(slope.into_data().to_vec::<f32>().unwrap(), [2.0, -6.0]);
/// ```
pub fn host_op<B: Backend, O: HostOp<N>, const N: usize, const D: usize, const E: usize>(
    op: O,
    inputs: [&Tensor<B, D>; N],
    shape: [usize; E],
) -> Option<Tensor<B, E>> {
    if !inputs.iter().all(|x| host_ops_serve(x)) {
        return None;
    }
    #[cfg(feature = "flex")]
    {
        trained_flex::host_op(op, inputs, shape)
    }
    #[cfg(not(feature = "flex"))]
    {
        let _ = (op, shape);
        None
    }
}

/// Whether [`host_op`] computes on `x` (an f32 tensor of `Autodiff<Flex>`), for callers that
/// prepare something for the operation first.
pub fn host_ops_serve<B: Backend, const D: usize>(x: &Tensor<B, D>) -> bool {
    #[cfg(feature = "flex")]
    {
        use std::any::TypeId;
        type Trained = burn::backend::Autodiff<burn::backend::Flex>;
        TypeId::of::<B>() == TypeId::of::<Trained>() && x.dtype() == burn::tensor::DType::F32
    }
    #[cfg(not(feature = "flex"))]
    {
        let _ = x;
        false
    }
}

#[cfg(feature = "flex")]
mod trained_flex {
    use std::any::Any;
    use std::marker::PhantomData;

    use burn::backend::flex::FlexTensor;
    use burn::backend::{Autodiff, Flex};
    use burn::tensor::backend::Backend;
    use burn::tensor::ops::FloatTensor;
    use burn::tensor::{Tensor, TensorData, TensorPrimitive};
    use burn_autodiff::checkpoint::base::Checkpointer;
    use burn_autodiff::checkpoint::strategy::NoCheckpointing;
    use burn_autodiff::grads::Gradients;
    use burn_autodiff::ops::{Backward, Ops, OpsKind};

    use super::HostOp;
    use crate::HostValues;

    type Trained = Autodiff<Flex>;

    pub(super) fn host_op<
        B: Backend,
        O: HostOp<N>,
        const N: usize,
        const D: usize,
        const E: usize,
    >(
        op: O,
        inputs: [&Tensor<B, D>; N],
        shape: [usize; E],
    ) -> Option<Tensor<B, E>> {
        let mut primitives = Vec::with_capacity(N);
        for x in inputs {
            let primitive: Box<dyn Any> = Box::new(x.clone().into_primitive().tensor());
            primitives.push(*primitive.downcast::<FloatTensor<Trained>>().ok()?);
        }
        let primitives: [FloatTensor<Trained>; N] = primitives.try_into().ok()?;
        let output: Box<dyn Any> = Box::new(tracked::<O, N, D, E>(op, primitives, shape));
        let output = *output.downcast::<FloatTensor<B>>().ok()?;
        Some(Tensor::from_primitive(TensorPrimitive::Float(output)))
    }

    /// The backward step of a [`HostOp`]: its inputs are the state.
    #[derive(Debug)]
    struct HostBackward<O, const D: usize, const E: usize>(PhantomData<O>);

    impl<O: HostOp<N>, const N: usize, const D: usize, const E: usize> Backward<Flex, N>
        for HostBackward<O, D, E>
    {
        type State = (O, [FlexTensor; N]);

        fn backward(self, ops: Ops<Self::State, N>, grads: &mut Gradients, _: &mut Checkpointer) {
            let (op, inputs) = ops.state;
            let output_grad = values::<E>(grads.consume::<Flex>(&ops.node));
            let reads = inputs.clone().map(values::<D>);
            // Only inputs that need a gradient have a parent node.
            let wanted = ops.parents.each_ref().map(Option::is_some);
            let reads = reads.each_ref().map(|r| r.values());
            let input_grads = op.backward_wanted(output_grad.values(), reads, wanted);
            for ((parent, grad), input) in ops.parents.into_iter().zip(input_grads).zip(inputs) {
                if let Some(node) = parent {
                    let shape =
                        Tensor::<Flex, D>::from_primitive(TensorPrimitive::Float(input)).dims();
                    grads.register::<Flex>(node.id, flex(grad, shape));
                }
            }
        }
    }

    fn tracked<O: HostOp<N>, const N: usize, const D: usize, const E: usize>(
        op: O,
        inputs: [FloatTensor<Trained>; N],
        shape: [usize; E],
    ) -> FloatTensor<Trained> {
        let nodes = inputs.each_ref().map(|x| x.node.clone());
        let inputs = inputs.map(|x| x.primitive);
        let reads = inputs.clone().map(values::<D>);
        let output = flex(op.forward(reads.each_ref().map(|r| r.values())), shape);
        match HostBackward::<O, D, E>(PhantomData)
            .prepare::<NoCheckpointing>(nodes)
            .compute_bound()
            .stateful()
        {
            OpsKind::Tracked(prep) => prep.finish((op, inputs), output),
            OpsKind::UnTracked(prep) => prep.finish(output),
        }
    }

    /// The values of a Flex tensor of rank `D` (in place when contiguous).
    fn values<const D: usize>(x: FlexTensor) -> HostValues {
        HostValues::of(&Tensor::<Flex, D>::from_primitive(TensorPrimitive::Float(
            x,
        )))
    }

    /// A Flex tensor of `shape` holding `values`.
    fn flex<const R: usize>(values: Vec<f32>, shape: [usize; R]) -> FlexTensor {
        Tensor::<Flex, R>::from_data(TensorData::new(values, shape), &Default::default())
            .into_primitive()
            .tensor()
    }
}
