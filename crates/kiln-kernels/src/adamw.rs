//! AdamW's update in one pass over memory on the host. burn-optim's AdamW is a dozen tensor
//! operations, each a pass over the parameter's values; on burn's Flex backend this computes the
//! same arithmetic element by element in one pass, on rayon's threads, writing the parameter and
//! both moments in place where nothing else holds them (docs/PERFORMANCE.md, "One-pass AdamW").

use burn::tensor::Tensor;
use burn::tensor::backend::Backend;

/// One AdamW step's constants, as burn-optim's `AdamWConfig` and its step take them.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AdamWStep {
    /// First-moment decay.
    pub beta_1: f32,
    /// Second-moment decay.
    pub beta_2: f32,
    /// Added to the second moment's root.
    pub epsilon: f32,
    /// Decoupled weight decay (the parameter shrinks by `lr · weight_decay` a step).
    pub weight_decay: f64,
    /// The learning rate.
    pub lr: f64,
    /// This step's number, from 1 (the bias corrections' exponent).
    pub time: usize,
}

/// A parameter, its gradient and its two moments (`None` before the first step).
pub type AdamWInputs<B, const D: usize> = (Tensor<B, D>, Tensor<B, D>, Option<[Tensor<B, D>; 2]>);

/// `[parameter, first moment, second moment]` after `step` with `grad`, computed in one pass as
/// burn-optim's AdamW computes them operation by operation (`m ← β₁m + (1 − β₁)g`,
/// `v ← β₂v + (1 − β₂)g²`, `p ← p(1 − lr·λ) − lr · (m / (1 − β₁ᵗ)) / (√(v / (1 − β₂ᵗ)) + ε)`),
/// when `B` is Flex and the values are f32; the inputs back otherwise.
///
/// ```
/// use burn::backend::Flex;
/// use burn::tensor::Tensor;
/// use kiln_kernels::{AdamWStep, adamw_on_host};
///
/// let device = Default::default();
/// let param = Tensor::<Flex, 1>::from_floats([1.0, -1.0], &device);
/// let grad = Tensor::<Flex, 1>::from_floats([0.5, -0.5], &device);
/// let step = AdamWStep { beta_1: 0.9, beta_2: 0.999, epsilon: 1e-8, weight_decay: 0.0, lr: 0.1, time: 1 };
/// let [param, _, _] = adamw_on_host(&step, (param, grad, None)).expect("Flex, f32");
/// // The first step moves each value by the rate, against its gradient's sign.
/// let moved = param.into_data().to_vec::<f32>().unwrap();
/// assert!((moved[0] - 0.9).abs() < 1e-6 && (moved[1] + 0.9).abs() < 1e-6);
/// ```
pub fn adamw_on_host<B: Backend, const D: usize>(
    step: &AdamWStep,
    inputs: AdamWInputs<B, D>,
) -> Result<[Tensor<B, D>; 3], AdamWInputs<B, D>> {
    #[cfg(feature = "flex")]
    {
        flex::adamw(step, inputs)
    }
    #[cfg(not(feature = "flex"))]
    {
        let _ = step;
        Err(inputs)
    }
}

#[cfg(feature = "flex")]
mod flex {
    use std::any::{Any, TypeId};

    use burn::backend::Flex;
    use burn::backend::flex::FlexTensor;
    use burn::tensor::backend::Backend;
    use burn::tensor::{DType, Tensor, TensorPrimitive};
    use rayon::prelude::*;

    use super::{AdamWInputs, AdamWStep};
    use crate::HostValues;

    /// Values a task updates at once.
    const CHUNK: usize = 1 << 15;

    pub(super) fn adamw<B: Backend, const D: usize>(
        step: &AdamWStep,
        inputs: AdamWInputs<B, D>,
    ) -> Result<[Tensor<B, D>; 3], AdamWInputs<B, D>> {
        let (param, grad, moments) = &inputs;
        let f32s = std::iter::once(param)
            .chain([grad])
            .chain(moments.iter().flatten())
            .all(|x| x.dtype() == DType::F32);
        if TypeId::of::<B>() != TypeId::of::<Flex>() || !f32s {
            return Err(inputs);
        }
        let (param, grad, moments) = inputs;
        let shape = param.shape();
        let mut param = writable(flex(param));
        let grad = HostValues::of(&grad);
        let [mut moment_1, mut moment_2] = match moments {
            Some(moments) => moments.map(|m| writable(flex(m))),
            None => [(); 2].map(|_| FlexTensor::zeros(shape.clone(), DType::F32)),
        };
        update(
            step,
            param.storage_mut(),
            grad.values(),
            moment_1.storage_mut(),
            moment_2.storage_mut(),
        );
        Ok([param, moment_1, moment_2].map(|t| {
            let primitive: Box<dyn Any> = Box::new(t);
            let primitive = *primitive
                .downcast::<B::FloatTensorPrimitive>()
                .expect("B is Flex");
            Tensor::from_primitive(TensorPrimitive::Float(primitive))
        }))
    }

    /// The Flex tensor of `x` (`B` is Flex).
    fn flex<B: Backend, const D: usize>(x: Tensor<B, D>) -> FlexTensor {
        let primitive: Box<dyn Any> = Box::new(x.into_primitive().tensor());
        *primitive.downcast::<FlexTensor>().expect("B is Flex")
    }

    /// `x` as a tensor whose storage is exactly its values in order (a copy where it is a view).
    fn writable(x: FlexTensor) -> FlexTensor {
        let exact = x.as_slice::<f32>().map(<[f32]>::len) == Some(x.storage::<f32>().len());
        if exact {
            x
        } else {
            FlexTensor::from_data(x.into_data())
        }
    }

    /// burn-optim's arithmetic, element by element.
    fn update(step: &AdamWStep, param: &mut [f32], grad: &[f32], m: &mut [f32], v: &mut [f32]) {
        let (beta_1, beta_2, epsilon) = (step.beta_1, step.beta_2, step.epsilon);
        let (factor_1, factor_2) = (1.0 - beta_1, 1.0 - beta_2);
        let time = step.time as i32;
        let correction_1 = 1.0 - beta_1.powi(time);
        let correction_2 = 1.0 - beta_2.powi(time);
        let decay = (1.0 - step.lr * step.weight_decay) as f32;
        let lr = step.lr as f32;
        // Compiled (through `pulp`'s dispatch) for the best SIMD instruction set the CPU has:
        // 1.1–1.6× the baseline x86-64 build's speed on an AVX2 machine (docs/PERFORMANCE.md).
        let chunk = |p: &mut [f32], g: &[f32], m: &mut [f32], v: &mut [f32]| {
            pulp::Arch::new().dispatch(
                #[inline(always)]
                || {
                    for (((p, &g), m), v) in p.iter_mut().zip(g).zip(m).zip(v) {
                        *m = *m * beta_1 + g * factor_1;
                        *v = *v * beta_2 + g * g * factor_2;
                        let delta = (*m / correction_1) / ((*v / correction_2).sqrt() + epsilon);
                        *p = *p * decay - delta * lr;
                    }
                },
            )
        };
        if param.len() <= CHUNK {
            // One task's worth: handing it to the pool would cost more than it takes.
            return chunk(param, grad, m, v);
        }
        param
            .par_chunks_mut(CHUNK)
            .zip(grad.par_chunks(CHUNK))
            .zip(m.par_chunks_mut(CHUNK))
            .zip(v.par_chunks_mut(CHUNK))
            .for_each(|(((p, g), m), v)| chunk(p, g, m, v));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::backend::{Autodiff, Flex};

    /// A backend the one pass does not serve gets its tensors back untouched, for burn-optim.
    #[test]
    fn other_backends_get_their_inputs_back() {
        let device = Default::default();
        let param = Tensor::<Autodiff<Flex>, 1>::from_floats([1.0, 2.0], &device);
        let grad = Tensor::<Autodiff<Flex>, 1>::from_floats([0.5, 0.5], &device);
        let step = AdamWStep {
            beta_1: 0.9,
            beta_2: 0.999,
            epsilon: 1e-8,
            weight_decay: 0.0,
            lr: 0.1,
            time: 1,
        };
        let Err((param, grad, None)) = adamw_on_host(&step, (param, grad, None)) else {
            panic!("Autodiff<Flex> is burn-optim's to step");
        };
        assert_eq!(param.into_data().to_vec::<f32>().unwrap(), [1.0, 2.0]);
        assert_eq!(grad.into_data().to_vec::<f32>().unwrap(), [0.5, 0.5]);
    }
}
