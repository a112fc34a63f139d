//! Whole-model gradient operations: the global L2 norm (`torch.nn.utils.clip_grad_norm_`'s, over
//! every parameter at once — burn-optim's clipping treats each tensor alone) and scaling every
//! gradient by one factor (unscaling a scaled loss and clipping in the same pass).

use burn::module::{AutodiffModule, ModuleVisitor, Param};
use burn::optim::GradientsParams;
use burn::tensor::backend::AutodiffBackend;
use burn::tensor::{DType, ElementConversion, Tensor};
use kiln_core::is_host_backend;
use kiln_kernels::{HostValues, sum_of_squares};

/// Σ g² over every gradient of `module`, on the device as f32 (`None` without gradients); each
/// tensor's sum on every thread in f64 on host backends.
pub fn squared_norm<B: AutodiffBackend, M: AutodiffModule<B>>(
    module: &M,
    grads: &GradientsParams,
) -> Option<Tensor<B::InnerBackend, 1>> {
    struct Sum<'a, B: AutodiffBackend> {
        grads: &'a GradientsParams,
        total: Option<Tensor<B::InnerBackend, 1>>,
    }
    impl<B: AutodiffBackend> ModuleVisitor<B> for Sum<'_, B> {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
            if let Some(grad) = self.grads.get::<B::InnerBackend, D>(param.id) {
                let device = grad.device();
                let squares =
                    if grad.dtype() == DType::F32 && is_host_backend::<B::InnerBackend>(&device) {
                        let squares = sum_of_squares(HostValues::of(&grad).values()) as f32;
                        Tensor::from_floats([squares], &device)
                    } else {
                        grad.cast(DType::F32).square().sum()
                    };
                self.total = Some(match self.total.take() {
                    Some(total) => total + squares,
                    None => squares,
                });
            }
        }
    }
    let mut sum = Sum::<B> { grads, total: None };
    module.visit(&mut sum);
    sum.total
}

/// The global L2 norm of gradients whose squares overflow f32 (Σ g² = ∞ with every g finite):
/// `m · √Σ (g / m)²` with `m = max |g|`. Two device reads; NaN or ∞ where a gradient is.
pub fn large_norm<B: AutodiffBackend, M: AutodiffModule<B>>(
    module: &M,
    grads: &GradientsParams,
) -> f64 {
    struct Reduce<'a, B: AutodiffBackend> {
        grads: &'a GradientsParams,
        divisor: Option<f32>,
        total: Option<Tensor<B::InnerBackend, 1>>,
    }
    impl<B: AutodiffBackend> ModuleVisitor<B> for Reduce<'_, B> {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
            let Some(grad) = self.grads.get::<B::InnerBackend, D>(param.id) else {
                return;
            };
            let grad = grad.cast(DType::F32);
            let value = match self.divisor {
                None => grad.abs().max().reshape([1]),
                Some(m) => grad.div_scalar(m).square().sum(),
            };
            self.total = Some(match (self.total.take(), self.divisor) {
                (None, _) => value,
                (Some(total), None) => total.max_pair(value),
                (Some(total), Some(_)) => total + value,
            });
        }
    }
    let pass = |divisor| -> f64 {
        let mut reduce = Reduce::<B> {
            grads,
            divisor,
            total: None,
        };
        module.visit(&mut reduce);
        reduce.total.map_or(0.0, |t| t.into_scalar().elem::<f64>())
    };
    let largest = pass(None);
    if !largest.is_finite() || largest == 0.0 {
        return largest;
    }
    largest * pass(Some(largest as f32)).sqrt()
}

/// Multiplies every gradient of `module` by `factor`.
pub fn scale<B: AutodiffBackend, M: AutodiffModule<B>>(
    module: &M,
    grads: &mut GradientsParams,
    factor: f32,
) {
    struct Scale<'a> {
        grads: &'a mut GradientsParams,
        factor: f32,
    }
    impl<B: AutodiffBackend> ModuleVisitor<B> for Scale<'_> {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
            if let Some(grad) = self.grads.remove::<B::InnerBackend, D>(param.id) {
                self.grads
                    .register::<B::InnerBackend, D>(param.id, grad.mul_scalar(self.factor));
            }
        }
    }
    module.visit(&mut Scale { grads, factor });
}

/// `clip_grad_norm_`'s factor for a gradient of global norm `norm`: `max / (norm + 1e-6)` when
/// that is below 1, else 1.
pub fn clip_factor(norm: f64, max_norm: Option<f64>) -> f64 {
    match max_norm {
        Some(max) => (max / (norm + 1e-6)).min(1.0),
        None => 1.0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::backend::{Autodiff, Flex};
    use burn::module::Module;
    use burn::nn::{Linear, LinearConfig};

    type B = Autodiff<Flex>;

    #[derive(Module, Debug)]
    struct Two<B: burn::tensor::backend::Backend> {
        a: Linear<B>,
        b: Linear<B>,
    }

    #[test]
    fn the_norm_covers_every_parameter_and_scaling_scales_it() {
        let device = Default::default();
        let model = Two::<B> {
            a: LinearConfig::new(3, 2).init(&device),
            b: LinearConfig::new(2, 1).init(&device),
        };
        let x = Tensor::<B, 2>::from_floats([[1.0, -2.0, 0.5], [0.3, 0.1, -1.0]], &device);
        let loss = model.b.forward(model.a.forward(x)).square().sum();
        let mut grads = GradientsParams::from_grads(loss.backward(), &model);
        // Independent sum: each parameter's gradient read on the host.
        let mut expected = 0.0f64;
        for id in [model.a.weight.id, model.b.weight.id] {
            let g: Vec<f32> = grads
                .get::<Flex, 2>(id)
                .unwrap()
                .into_data()
                .to_vec()
                .unwrap();
            expected += g.iter().map(|v| f64::from(*v).powi(2)).sum::<f64>();
        }
        for bias in [&model.a.bias, &model.b.bias] {
            let id = bias.as_ref().unwrap().id;
            let g: Vec<f32> = grads
                .get::<Flex, 1>(id)
                .unwrap()
                .into_data()
                .to_vec()
                .unwrap();
            expected += g.iter().map(|v| f64::from(*v).powi(2)).sum::<f64>();
        }
        let sq = |grads: &GradientsParams| -> f64 {
            squared_norm::<B, _>(&model, grads)
                .unwrap()
                .into_scalar()
                .elem::<f64>()
        };
        assert!((sq(&grads) - expected).abs() <= 1e-5 * expected);
        let large = large_norm::<B, _>(&model, &grads);
        assert!((large - expected.sqrt()).abs() <= 1e-5 * expected.sqrt());
        scale::<B, _>(&model, &mut grads, 0.5);
        assert!((sq(&grads) - 0.25 * expected).abs() <= 1e-5 * expected);
        // Gradients whose squares overflow f32 still have their norm.
        scale::<B, _>(&model, &mut grads, 2f32.powi(100));
        assert!(sq(&grads).is_infinite());
        let large = large_norm::<B, _>(&model, &grads);
        let want = 0.5 * 2f64.powi(100) * expected.sqrt();
        assert!((large - want).abs() <= 1e-5 * want, "{large} vs {want}");
    }

    #[test]
    fn clipping_only_shrinks() {
        assert_eq!(clip_factor(0.5, Some(1.0)), 1.0);
        assert!((clip_factor(4.0, Some(1.0)) - 1.0 / (4.0 + 1e-6)).abs() < 1e-15);
        assert_eq!(clip_factor(1e9, None), 1.0);
    }
}
