//! # kiln-train
//!
//! The training loop the seed projects each wrote by hand, written once: AdamW over parameter
//! groups (numerically `torch.optim.AdamW`), learning-rate schedules counted in optimizer steps,
//! clipping by the global gradient norm, gradient accumulation, loss scaling for f16, evaluation
//! with best-checkpoint tracking and early stopping, checkpoints that resume bit for bit, one
//! `metrics.jsonl` line per optimizer step, a progress bar and a loss/learning-rate plot.
//!
//! A model plugs in through [`TrainStep`] (a micro-batch in, a loss out) and, for evaluation,
//! [`EvalStep`] on its inner module; data through a [`Loader`] (`LabelledImages`, with the
//! `images` feature, serves kiln-cache's decode-once image feeds; [`HostData`] anything else,
//! prepared ahead on background threads).
//!
//! ```no_run
//! use burn::backend::{Autodiff, Flex};
//! use kiln_train::{OptimizerConfig, RunOptions, Schedule, TrainConfig, Trainer};
//! # fn run<M, L, E>(model: M, train: L, eval: E) -> Result<(), kiln_train::TrainError>
//! # where M: kiln_train::TrainStep<Autodiff<Flex>, Batch = L::Batch>,
//! #       M::InnerModule: kiln_train::EvalStep<Flex, Batch = E::Batch>,
//! #       L: kiln_train::Loader, E: kiln_train::Loader {
//! let mut config = TrainConfig::new(50_000, 1e-4);
//! config.accumulate = 2; // one optimizer step per 2 micro-batches
//! config.optimizer = OptimizerConfig::adamw(1e-4)
//!     .with_weight_decay(0.01)
//!     .with_group("connector", &["connector"], 1e-3, 0.0)
//!     .without_decay_on_biases_and_norms();
//! config.schedule = Schedule::warmup_cosine(500, 0.0, 0.1, 50_000);
//! config.max_grad_norm = Some(1.0);
//! config.eval_every = 1_000;
//! let trainer = Trainer::<Autodiff<Flex>>::new(config, RunOptions::new("runs/fvlm"), Default::default());
//! // Rerunning the same command resumes from the newest checkpoint in runs/fvlm/checkpoints.
//! let outcome = trainer.fit(model, &train, Some(&eval))?;
//! println!("{:?}", outcome.eval);
//! # Ok(()) }
//! ```

mod checkpoint;
mod config;
mod data;
mod grads;
#[cfg(feature = "images")]
mod images;
mod metrics;
mod optim;
mod optimization;
mod parallel;
pub mod plot;
mod run_dir;
mod schedule;
mod step;
mod trainer;

use std::path::{Path, PathBuf};

pub use checkpoint::{CheckpointState, Checkpoints, compatible};
pub use config::{BestMetric, LossScaling, TrainConfig};
pub use data::{HostData, Loader};
pub use grads::{clip_factor, large_norm, scale, squared_norm};
#[cfg(feature = "images")]
pub use images::{ImageBatch, LabelledImages};
pub use metrics::{MetricsLog, StepPoint, read_metrics};
pub use optim::{
    DEFAULT_GROUP, GroupConfig, GroupedAdamW, GroupedAdamWRecord, OptimizerConfig, ParamInfo,
    parameters,
};
pub use optimization::{Averaging, Optimization, StepReport};
pub use parallel::{DataParallel, Network};
pub use plot::{PlotError, plot_curves};
pub use run_dir::{RUN_RECORD, claim};
pub use schedule::{Decay, Schedule};
pub use step::{BadBatch, EvalOutput, EvalStep, EvalSum, StepContext, StepOutput, TrainStep};
pub use trainer::{Outcome, RunOptions, Trainer, evaluate};

/// Why a run could not start or go on.
#[derive(Debug, thiserror::Error)]
pub enum TrainError {
    /// Settings that cannot be used (said before any work).
    #[error("{0}")]
    Config(String),
    /// A file or directory could not be read or written safely (kiln-io's refusals included).
    #[error(transparent)]
    File(#[from] kiln_io::FileError),
    /// A checkpoint could not be written or read.
    #[error("{0}")]
    Checkpoint(String),
    /// The newest checkpoint belongs to another run.
    #[error(
        "the checkpoint {} was written by a different run: rerun with its settings to resume it, or choose another output directory. Differences:\n  {differences}",
        path.display()
    )]
    Incompatible {
        /// The checkpoint.
        path: PathBuf,
        /// Every difference, one per line.
        differences: String,
    },
    /// The output directory holds a run with other settings.
    #[error(
        "{} holds a run with other settings (its run.json): rerun with them to resume it, or choose another output directory. Differences:\n  {differences}",
        dir.display()
    )]
    OtherRun {
        /// The run's directory.
        dir: std::path::PathBuf,
        /// Every difference, one per line.
        differences: String,
    },
    /// The output directory holds files a run would write, but no run recorded them.
    #[error(
        "{} already holds {files}, which no kiln run recorded there (no run.json): refusing to replace them; choose another output directory",
        dir.display()
    )]
    NotARun {
        /// The directory.
        dir: std::path::PathBuf,
        /// The files found, comma-separated.
        files: String,
    },
    /// Too many steps in a row had a non-finite loss or gradient.
    #[error(
        "{in_a_row} steps in a row (through step {step}) had a non-finite loss or gradient; the run stopped. {}",
        match checkpoint {
            Some(p) => format!("The last good checkpoint is {}.", p.display()),
            None => "No checkpoint was written yet.".to_string(),
        }
    )]
    NonFinite {
        /// The last step.
        step: u64,
        /// Skipped steps in a row.
        in_a_row: usize,
        /// The newest checkpoint, untouched.
        checkpoint: Option<PathBuf>,
    },
    /// The data cannot be trained on.
    #[error("{0}")]
    Data(String),
    /// A batch the model's step refused.
    #[error("{stage}: {problem}")]
    BadBatch {
        /// Where: `step 12` or `evaluation`.
        stage: String,
        /// The step's reason.
        problem: BadBatch,
    },
    /// The device ran out of memory in a forward or backward pass.
    #[error(
        "the device ran out of memory in step {step} ({detail}): lower the batch size (images or items per micro-batch) and raise the accumulation to keep the batch per optimizer step"
    )]
    OutOfMemory {
        /// The step.
        step: u64,
        /// The runtime's message.
        detail: String,
    },
    /// Data-parallel training could not start or go on.
    #[error("data-parallel training: {0}")]
    Parallel(String),
}

impl TrainError {
    pub(crate) fn io(path: &Path, e: std::io::Error) -> Self {
        TrainError::File(kiln_io::FileError::io(path, e))
    }
}
