//! Learning-rate schedules counted in optimizer steps: a linear warm-up from a start value, then
//! constant, cosine or linear decay to a floor, or every group's rate converging on one. A schedule is a pure function of the step, so a
//! resumed run needs nothing but the step to continue it (PyTorch's `LambdaLR` with the same
//! factor function gives the same rates).

use serde::{Deserialize, Serialize};

use crate::TrainError;

/// What follows the warm-up.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "kind")]
pub enum Decay {
    /// The peak rate until the end.
    Constant,
    /// Half a cosine from the peak down to `floor` × peak at the last step.
    Cosine {
        /// The final rate as a fraction of the peak.
        floor: f64,
    },
    /// A straight line from the peak down to `floor` × peak at the last step.
    Linear {
        /// The final rate as a fraction of the peak.
        floor: f64,
    },
    /// Half a cosine from each group's peak to the same `target_lr` at the last step, down from
    /// peaks above it and up from peaks below (fVLM's `get_converging_schedule`: a new
    /// connector fast, the pretrained backbones slow, all at one rate by the end).
    Converging {
        /// The rate every group ends at.
        target_lr: f64,
    },
}

/// A learning-rate schedule: the factor each parameter group's rate is multiplied by.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Schedule {
    /// Optimizer steps of linear warm-up.
    pub warmup_steps: u64,
    /// The factor at step 0, rising linearly to 1 at `warmup_steps`.
    pub warmup_start: f64,
    /// What follows the warm-up.
    pub decay: Decay,
    /// Optimizer steps in the whole run (where a decay reaches its floor).
    pub total_steps: u64,
}

impl Schedule {
    /// The peak rate throughout.
    pub fn constant(total_steps: u64) -> Self {
        Schedule {
            warmup_steps: 0,
            warmup_start: 1.0,
            decay: Decay::Constant,
            total_steps,
        }
    }

    /// Linear warm-up from `start` × peak over `warmup_steps`, then cosine to `floor` × peak.
    pub fn warmup_cosine(warmup_steps: u64, start: f64, floor: f64, total_steps: u64) -> Self {
        Schedule {
            warmup_steps,
            warmup_start: start,
            decay: Decay::Cosine { floor },
            total_steps,
        }
    }

    /// The learning rate of a group whose peak rate is `peak`, for the optimizer step that has
    /// `step` steps before it (0 for the first).
    pub fn rate(&self, step: u64, peak: f64) -> f64 {
        if step < self.warmup_steps {
            let progress = step as f64 / self.warmup_steps as f64;
            return peak * (self.warmup_start + (1.0 - self.warmup_start) * progress);
        }
        let span = self.total_steps.saturating_sub(self.warmup_steps);
        let progress = if span == 0 {
            1.0
        } else {
            ((step - self.warmup_steps) as f64 / span as f64).min(1.0)
        };
        // Half a cosine, 1 at the warm-up's end to 0 at the last step.
        let cosine = 0.5 * (1.0 + (std::f64::consts::PI * progress).cos());
        match self.decay {
            Decay::Constant => peak,
            Decay::Cosine { floor } => peak * (floor + (1.0 - floor) * cosine),
            Decay::Linear { floor } => peak * (1.0 - (1.0 - floor) * progress),
            Decay::Converging { target_lr } => target_lr + (peak - target_lr) * cosine,
        }
    }

    /// Why the schedule cannot be used, if it cannot.
    pub fn validate(&self) -> Result<(), TrainError> {
        self.check().map_err(TrainError::Config)
    }

    /// Why the schedule cannot be used, if it cannot.
    pub(crate) fn check(&self) -> Result<(), String> {
        let fraction = |name: &str, v: f64| {
            if v.is_finite() && (0.0..=1.0).contains(&v) {
                Ok(())
            } else {
                Err(format!(
                    "{name} is a fraction of the peak rate in [0, 1], not {v}"
                ))
            }
        };
        fraction("the warm-up start", self.warmup_start)?;
        match self.decay {
            Decay::Constant => Ok(()),
            Decay::Cosine { floor } | Decay::Linear { floor } => fraction("the floor", floor),
            Decay::Converging { target_lr } if target_lr.is_finite() && target_lr >= 0.0 => Ok(()),
            Decay::Converging { target_lr } => Err(format!(
                "the converging schedule's target rate is a finite rate ≥ 0, not {target_lr}"
            )),
        }
    }
}

/// A factor to 6 significant digits (1e-7 / 1e-3 shows as 0.0001, not 0.00009999999999999999).
fn short(x: f64) -> f64 {
    format!("{x:.5e}").parse().unwrap_or(x)
}

impl std::fmt::Display for Schedule {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.warmup_steps > 0 {
            write!(
                f,
                "linear warm-up from {}× over {} steps, then ",
                short(self.warmup_start),
                self.warmup_steps
            )?;
        }
        match self.decay {
            Decay::Constant => write!(f, "constant")?,
            Decay::Cosine { floor } => write!(f, "cosine to {}×", short(floor))?,
            Decay::Linear { floor } => write!(f, "linear to {}×", short(floor))?,
            Decay::Converging { target_lr } => {
                write!(f, "cosine from each group's peak to {}", short(target_lr))?
            }
        }
        write!(
            f,
            " at step {} (steps are optimizer steps)",
            self.total_steps
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn warmup_rises_linearly_then_cosine_reaches_its_floor() {
        let s = Schedule::warmup_cosine(5, 0.1, 0.05, 30);
        let factor = |step| s.rate(step, 1.0);
        assert_eq!(factor(0), 0.1);
        assert!((factor(2) - (0.1 + 0.9 * 0.4)).abs() < 1e-15);
        assert_eq!(factor(5), 1.0);
        assert!((factor(30) - 0.05).abs() < 1e-15);
        assert!((factor(1000) - 0.05).abs() < 1e-15);
        let mid = factor(5 + 25 / 2);
        assert!(mid < 1.0 && mid > 0.05);
        for step in 5..30 {
            assert!(factor(step + 1) <= factor(step), "not falling at {step}");
        }
        assert_eq!(s.rate(30, 2e-3), 1e-4);
    }

    #[test]
    fn linear_decay_and_constant() {
        let s = Schedule {
            warmup_steps: 0,
            warmup_start: 1.0,
            decay: Decay::Linear { floor: 0.0 },
            total_steps: 10,
        };
        assert_eq!(s.rate(0, 1.0), 1.0);
        assert!((s.rate(5, 1.0) - 0.5).abs() < 1e-15);
        assert_eq!(s.rate(10, 1.0), 0.0);
        assert_eq!(Schedule::constant(10).rate(7, 3.0), 3.0);
    }

    #[test]
    fn converging_rates_meet_at_the_target() {
        let s = Schedule {
            warmup_steps: 2,
            warmup_start: 0.0,
            decay: Decay::Converging { target_lr: 3e-5 },
            total_steps: 12,
        };
        let (connector, backbone) = (|step| s.rate(step, 1e-3), |step| s.rate(step, 1e-5));
        assert_eq!(connector(0), 0.0);
        assert_eq!(connector(1), 5e-4);
        assert!((connector(2) - 1e-3).abs() < 1e-18 && (backbone(2) - 1e-5).abs() < 1e-18);
        // Halfway through the decay each is halfway to the target.
        assert!((connector(7) - (1e-3 + 3e-5) / 2.0).abs() < 1e-15);
        assert!((backbone(7) - (1e-5 + 3e-5) / 2.0).abs() < 1e-15);
        for step in 2..12 {
            assert!(connector(step + 1) < connector(step) && backbone(step + 1) > backbone(step));
        }
        assert!((connector(12) - 3e-5).abs() < 1e-18 && (backbone(40) - 3e-5).abs() < 1e-18);
        let mut bad = s;
        bad.decay = Decay::Converging {
            target_lr: f64::NAN,
        };
        assert!(bad.validate().is_err());
    }

    #[test]
    fn fractions_outside_zero_one_are_refused() {
        assert!(Schedule::warmup_cosine(5, 1.5, 0.0, 10).validate().is_err());
        assert!(
            Schedule::warmup_cosine(5, 0.0, -0.1, 10)
                .validate()
                .is_err()
        );
        assert!(Schedule::warmup_cosine(5, 0.0, 0.1, 10).validate().is_ok());
    }
}
