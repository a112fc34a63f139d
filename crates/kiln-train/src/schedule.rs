//! Learning-rate schedules counted in optimizer steps: a linear warm-up from a start value, then
//! constant, cosine or linear decay to a floor. A schedule is a pure function of the step, so a
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

    /// The factor for the optimizer step that has `step` steps before it (0 for the first).
    pub fn factor(&self, step: u64) -> f64 {
        if step < self.warmup_steps {
            let progress = step as f64 / self.warmup_steps as f64;
            return self.warmup_start + (1.0 - self.warmup_start) * progress;
        }
        let span = self.total_steps.saturating_sub(self.warmup_steps);
        let progress = if span == 0 {
            1.0
        } else {
            ((step - self.warmup_steps) as f64 / span as f64).min(1.0)
        };
        match self.decay {
            Decay::Constant => 1.0,
            Decay::Cosine { floor } => {
                floor + (1.0 - floor) * 0.5 * (1.0 + (std::f64::consts::PI * progress).cos())
            }
            Decay::Linear { floor } => 1.0 - (1.0 - floor) * progress,
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
        assert_eq!(s.factor(0), 0.1);
        assert!((s.factor(2) - (0.1 + 0.9 * 0.4)).abs() < 1e-15);
        assert_eq!(s.factor(5), 1.0);
        assert!((s.factor(30) - 0.05).abs() < 1e-15);
        assert!((s.factor(1000) - 0.05).abs() < 1e-15);
        let mid = s.factor(5 + 25 / 2);
        assert!(mid < 1.0 && mid > 0.05);
        for step in 5..30 {
            assert!(
                s.factor(step + 1) <= s.factor(step),
                "not falling at {step}"
            );
        }
    }

    #[test]
    fn linear_decay_and_constant() {
        let s = Schedule {
            warmup_steps: 0,
            warmup_start: 1.0,
            decay: Decay::Linear { floor: 0.0 },
            total_steps: 10,
        };
        assert_eq!(s.factor(0), 1.0);
        assert!((s.factor(5) - 0.5).abs() < 1e-15);
        assert_eq!(s.factor(10), 0.0);
        assert_eq!(Schedule::constant(10).factor(7), 1.0);
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
