//! # kiln-mc
//!
//! The statistics of kiln's nested Monte-Carlo experiment (`examples/exp0_mc.rs`): for each
//! model, pass count T and trial k, T stochastic passes of an image encoder over the same images.
//!
//! - [`EmbeddingStats`]: per image and dimension, the running mean and variance of the embedding
//!   over passes in f64 (Welford's update; Chan's merge for shards and batches).
//! - [`trial_seed`]: every (model, T, trial) gets its own seed from one master seed.
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

mod nested;
mod seeds;
mod welford;

pub use nested::{NestedStats, spearman};
pub use seeds::trial_seed;
pub use welford::EmbeddingStats;

/// Why statistics cannot be formed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum McError {
    /// Inputs whose sizes do not fit together.
    #[error("{0}")]
    Shape(String),
}
