//! # kiln-mc
//!
//! kiln's nested Monte-Carlo experiment (the main job, `examples/exp0_mc/`): for each model, pass
//! count T and trial k, T stochastic passes of an image encoder over the same images, and what
//! the K trials of each (model, T) say about how many passes are enough.
//!
//! - [`EmbeddingStats`]: per image and dimension, the running mean and variance of the embedding
//!   over passes in f64 (Welford's update; Chan's merge for shards and batches).
//! - [`trial_seed`]: every (model, T, trial) gets its own seed from one master seed.
//! - [`TrialRunner`]: one trial, T passes of a kiln-vision model with Monte-Carlo dropout over a
//!   kiln-cache dataset, passes batched by replicating images along the batch axis.
//! - [`Experiment`], [`TrialStore`], [`Shard`]: which trials an experiment runs, finished trials
//!   on disk (resume after a kill, shards on several machines, merged afterwards).
//! - [`naive_trial`]: the loop kiln replaces (decode and preprocess every pass), to measure
//!   against.
//! - [`summarize`]: one [`SummaryRow`] per (model, T).
//! - [`NestedStats`]: across the K trials of one (model, T), how much the T-pass mean embedding
//!   and the per-image uncertainty still move between trials, and how stable the uncertainty
//!   ranking is (mean pairwise Spearman correlation): "how many passes are enough".
//!
//! ```
//! use kiln_mc::EmbeddingStats;
//! // Two images, 3-dimensional embeddings, two passes.
//! let mut stats = EmbeddingStats::new(2, 3);
//! stats.add_pass(&[0, 1], &[1.0, 2.0, 3.0, 0.0, 0.0, 0.0])?;
//! stats.add_pass(&[0, 1], &[3.0, 2.0, 1.0, 0.0, 0.0, 0.0])?;
//! assert_eq!(stats.mean(0), &[2.0, 2.0, 2.0]);
//! assert_eq!(stats.variance(0), vec![2.0, 0.0, 2.0]); // sample variance (n − 1)
//! # Ok::<(), kiln_mc::McError>(())
//! ```

mod demo;
mod experiment;
mod naive;
mod nested;
mod presets;
mod runner;
mod seeds;
mod store;
mod summary;
mod welford;

pub use demo::demo_images;
pub use experiment::{Experiment, Shard, TrialKey};
pub use naive::naive_trial;
pub use nested::{NestedStats, spearman};
pub use presets::preprocess;
pub use runner::{Accumulation, PassFeatures, Timings, Trial, TrialRunner, batch_rows};
pub use seeds::trial_seed;
pub use store::{TrialRecord, TrialStore, collect_trials};
pub use summary::{SummaryRow, summarize, to_csv};
pub use welford::EmbeddingStats;

/// Why an experiment cannot run or its statistics cannot be formed.
#[derive(Debug, thiserror::Error)]
pub enum McError {
    /// Inputs whose sizes do not fit together.
    #[error("{0}")]
    Shape(String),
    /// An experiment or trial that cannot run as asked.
    #[error("{0}")]
    Plan(String),
    /// The model failed.
    #[error(transparent)]
    Vision(#[from] kiln_vision::VisionError),
    /// Images could not be read.
    #[error(transparent)]
    Cache(#[from] kiln_cache::CacheError),
    /// The device failed.
    #[error("device: {0}")]
    Device(String),
    /// Results could not be written or read.
    #[error("{0}")]
    Store(String),
}
