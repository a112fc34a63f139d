//! Loss scaling for half-precision training, with the semantics of jmp's `DynamicLossScale` and
//! PyTorch's `GradScaler`: scale the loss before the backward pass, unscale the gradients after it,
//! and, for the dynamic scaler, halve the scale and skip the optimizer step when a gradient is not
//! finite, doubling it again after a run of finite steps.

use burn::module::{AutodiffModule, ModuleVisitor, Param};
use burn::optim::GradientsParams;
use burn::tensor::backend::AutodiffBackend;
use burn::tensor::{ElementConversion, Int, Tensor};

/// What the training loop should do with the gradients of this step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StepDecision {
    /// The gradients are finite: apply the optimizer step.
    Apply,
    /// A gradient overflowed: skip the optimizer step (the scale has been lowered).
    Skip,
}

/// A loss scaler.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum LossScale {
    /// No scaling (f32 or bf16 training).
    NoOp,
    /// A fixed scale `S`; non-finite gradients still skip the step.
    Static(f32),
    /// A scale that adapts to overflow.
    Dynamic(DynamicLossScale),
}

/// The dynamic scaler's state and settings.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DynamicLossScale {
    /// The current scale.
    pub scale: f32,
    /// Consecutive finite steps since the scale last changed.
    pub good_steps: u32,
    /// Finite steps after which the scale grows (2000).
    pub period: u32,
    /// Growth and back-off factor (2).
    pub factor: f32,
    /// The scale never goes below this (1).
    pub min_scale: f32,
}

impl Default for DynamicLossScale {
    /// jmp's and GradScaler's defaults: initial 2^15, ×2 every 2000 finite steps, ÷2 on overflow,
    /// never below 1.
    fn default() -> Self {
        DynamicLossScale {
            scale: 32768.0,
            good_steps: 0,
            period: 2000,
            factor: 2.0,
            min_scale: 1.0,
        }
    }
}

impl DynamicLossScale {
    fn adjust(&mut self, grads_finite: bool) -> StepDecision {
        if !grads_finite {
            self.scale = (self.scale / self.factor).max(self.min_scale);
            self.good_steps = 0;
            return StepDecision::Skip;
        }
        self.good_steps += 1;
        if self.good_steps >= self.period {
            let grown = self.scale * self.factor;
            if grown.is_finite() {
                self.scale = grown;
            }
            self.good_steps = 0;
        }
        StepDecision::Apply
    }
}

impl LossScale {
    /// The dynamic scaler with its default settings.
    pub fn dynamic() -> Self {
        LossScale::Dynamic(DynamicLossScale::default())
    }

    /// The factor the loss is multiplied by.
    pub fn scale(&self) -> f32 {
        match self {
            LossScale::NoOp => 1.0,
            LossScale::Static(s) => *s,
            LossScale::Dynamic(d) => d.scale,
        }
    }

    /// Multiplies the loss by the current scale, before the backward pass.
    pub fn scale_loss<B: AutodiffBackend, const D: usize>(
        &self,
        loss: Tensor<B, D>,
    ) -> Tensor<B, D> {
        match self {
            LossScale::NoOp => loss,
            _ => loss.mul_scalar(self.scale()),
        }
    }

    /// Divides every gradient of `module` by the scale and tells whether all are finite. One
    /// device read for the whole model.
    pub fn unscale<B: AutodiffBackend, M: AutodiffModule<B>>(
        &self,
        module: &M,
        grads: &mut GradientsParams,
    ) -> bool {
        let mut visitor = Unscale::<B> {
            inv_scale: 1.0 / self.scale(),
            grads,
            non_finite: None,
        };
        module.visit(&mut visitor);
        match visitor.non_finite {
            None => true,
            Some(count) => count.into_scalar().elem::<i64>() == 0,
        }
    }

    /// Updates the scale after a step whose gradients were (or were not) all finite, and says
    /// whether to apply the optimizer step.
    pub fn adjust(&mut self, grads_finite: bool) -> StepDecision {
        match self {
            LossScale::Dynamic(d) => d.adjust(grads_finite),
            _ if grads_finite => StepDecision::Apply,
            _ => StepDecision::Skip,
        }
    }
}

struct Unscale<'a, B: AutodiffBackend> {
    inv_scale: f32,
    grads: &'a mut GradientsParams,
    non_finite: Option<Tensor<B::InnerBackend, 1, Int>>,
}

impl<B: AutodiffBackend> ModuleVisitor<B> for Unscale<'_, B> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        let Some(grad) = self.grads.remove::<B::InnerBackend, D>(param.id) else {
            return;
        };
        let grad = if self.inv_scale == 1.0 {
            grad
        } else {
            grad.mul_scalar(self.inv_scale)
        };
        let bad = grad.clone().is_finite().bool_not().int().sum();
        self.non_finite = Some(match self.non_finite.take() {
            Some(total) => total + bad,
            None => bad,
        });
        self.grads.register::<B::InnerBackend, D>(param.id, grad);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dynamic_backs_off_on_overflow_and_never_below_one() {
        let mut ls = LossScale::dynamic();
        assert_eq!(ls.scale(), 32768.0);
        assert_eq!(ls.adjust(false), StepDecision::Skip);
        assert_eq!(ls.scale(), 16384.0);
        for _ in 0..20 {
            assert_eq!(ls.adjust(false), StepDecision::Skip);
        }
        assert_eq!(ls.scale(), 1.0);
    }

    #[test]
    fn dynamic_grows_after_2000_finite_steps_and_overflow_resets_the_count() {
        let mut ls = LossScale::dynamic();
        for step in 1..2000 {
            assert_eq!(ls.adjust(true), StepDecision::Apply);
            assert_eq!(ls.scale(), 32768.0, "grew early at step {step}");
        }
        assert_eq!(ls.adjust(true), StepDecision::Apply);
        assert_eq!(ls.scale(), 65536.0);
        // 1999 good steps, an overflow, then 1999 more: no growth, because the count restarted.
        for _ in 0..1999 {
            ls.adjust(true);
        }
        ls.adjust(false);
        assert_eq!(ls.scale(), 32768.0);
        for _ in 0..1999 {
            ls.adjust(true);
        }
        assert_eq!(ls.scale(), 32768.0);
        ls.adjust(true);
        assert_eq!(ls.scale(), 65536.0);
    }

    #[test]
    fn dynamic_does_not_grow_into_infinity() {
        let mut ls = LossScale::Dynamic(DynamicLossScale {
            scale: f32::MAX,
            period: 1,
            ..Default::default()
        });
        assert_eq!(ls.adjust(true), StepDecision::Apply);
        assert_eq!(ls.scale(), f32::MAX);
    }

    #[test]
    fn static_and_noop_keep_their_scale_but_skip_non_finite_steps() {
        for mut ls in [LossScale::NoOp, LossScale::Static(1024.0)] {
            let before = ls.scale();
            assert_eq!(ls.adjust(true), StepDecision::Apply);
            assert_eq!(ls.adjust(false), StepDecision::Skip);
            assert_eq!(ls.scale(), before);
        }
    }
}
