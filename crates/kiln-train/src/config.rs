//! A training run's settings. Everything here shapes the numbers a run produces, so a checkpoint
//! records it and a resumed run with other settings is refused; what only decides where or how
//! long this invocation runs lives in [`crate::RunOptions`].

use serde::{Deserialize, Serialize};

use crate::TrainError;
use crate::optim::OptimizerConfig;
use crate::schedule::Schedule;

/// Loss scaling for half-precision compute.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LossScaling {
    /// None (f32 or bf16 compute).
    Off,
    /// A fixed scale.
    Static(f32),
    /// GradScaler's dynamic scale (2^15, halved on overflow, doubled after 2000 finite steps).
    Dynamic,
}

/// The metric that picks the best checkpoint and drives early stopping.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BestMetric {
    /// An evaluation metric's name (`accuracy`, `loss`).
    pub name: String,
    /// Whether larger is better.
    pub higher_is_better: bool,
}

/// A training run's settings.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TrainConfig {
    /// Optimizer steps in the run ("step" means optimizer step everywhere).
    pub steps: u64,
    /// Micro-batches per optimizer step; each micro-batch's loss is scaled by 1/k.
    pub accumulate: usize,
    /// AdamW and its parameter groups.
    pub optimizer: OptimizerConfig,
    /// The learning-rate factor per step.
    pub schedule: Schedule,
    /// Largest global gradient norm (`clip_grad_norm_`); `None` never clips.
    pub max_grad_norm: Option<f64>,
    /// Loss scaling.
    pub loss_scaling: LossScaling,
    /// Evaluate every this many steps (and at the end); 0 only at the end.
    pub eval_every: u64,
    /// Checkpoint every this many steps (and at the end).
    pub checkpoint_every: u64,
    /// Checkpoints kept besides the best.
    pub keep_last: usize,
    /// What the best checkpoint is best at; `None` keeps no best.
    pub best: Option<BestMetric>,
    /// Stop after this many evaluations without improving the best metric.
    pub patience: Option<usize>,
    /// Stop with an error after this many skipped (non-finite) steps in a row.
    pub max_skipped_in_a_row: usize,
    /// Seeds the data order and the per-step seeds.
    pub seed: u64,
}

impl TrainConfig {
    /// `steps` optimizer steps of AdamW at `lr` under a constant schedule; no accumulation,
    /// clipping, loss scaling or evaluation before the end; a checkpoint every 500 steps, the
    /// last 2 kept.
    pub fn new(steps: u64, lr: f64) -> Self {
        TrainConfig {
            steps,
            accumulate: 1,
            optimizer: OptimizerConfig::adamw(lr),
            schedule: Schedule::constant(steps),
            max_grad_norm: None,
            loss_scaling: LossScaling::Off,
            eval_every: 0,
            checkpoint_every: 500,
            keep_last: 2,
            best: None,
            patience: None,
            max_skipped_in_a_row: 25,
            seed: 0,
        }
    }

    /// Why the run cannot start, said before any work.
    pub fn validate(&self) -> Result<(), TrainError> {
        self.check().map_err(TrainError::Config)
    }

    /// Why the run cannot start, said before any work.
    pub(crate) fn check(&self) -> Result<(), String> {
        if self.steps == 0 {
            return Err("the number of optimizer steps (steps) must be at least 1".into());
        }
        if self.accumulate == 0 {
            return Err(
                "the micro-batches per optimizer step (accumulate) must be at least 1".into(),
            );
        }
        self.optimizer.check()?;
        self.schedule.check()?;
        if self.schedule.total_steps != self.steps {
            return Err(format!(
                "the schedule ends at step {} but the run has {} steps",
                self.schedule.total_steps, self.steps
            ));
        }
        if let Some(max) = self.max_grad_norm
            && !(max.is_finite() && max > 0.0)
        {
            return Err(format!("the clipping norm must be positive, not {max}"));
        }
        if let LossScaling::Static(s) = self.loss_scaling
            && !(s.is_finite() && s > 0.0)
        {
            return Err(format!("a static loss scale must be positive, not {s}"));
        }
        if self.checkpoint_every == 0 {
            return Err("checkpoint_every must be at least 1".into());
        }
        if self.max_skipped_in_a_row == 0 {
            return Err("max_skipped_in_a_row must be at least 1".into());
        }
        if self.patience.is_some() && self.best.is_none() {
            return Err("early stopping (patience) needs a best metric to watch".into());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_settings_are_refused_before_any_work() {
        assert!(TrainConfig::new(10, 1e-3).validate().is_ok());
        let e = TrainConfig::new(0, 1e-3)
            .validate()
            .unwrap_err()
            .to_string();
        assert!(e.contains("(steps)") && !e.contains("--"), "{e}");
        let e = TrainConfig {
            accumulate: 0,
            ..TrainConfig::new(10, 1e-3)
        }
        .validate()
        .unwrap_err()
        .to_string();
        assert!(e.contains("(accumulate)") && !e.contains("--"), "{e}");
        let e = TrainConfig::new(10, -1.0)
            .validate()
            .unwrap_err()
            .to_string();
        assert!(e.contains("learning rate"), "{e}");
        let e = TrainConfig {
            patience: Some(3),
            ..TrainConfig::new(10, 1e-3)
        }
        .validate()
        .unwrap_err()
        .to_string();
        assert!(e.contains("best metric"), "{e}");
    }
}
