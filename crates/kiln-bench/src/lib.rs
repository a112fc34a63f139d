//! # kiln-bench
//!
//! Honest measurement for kiln's workloads, the way burn-bench, `torch.utils.benchmark` and
//! MLPerf measure: inputs built outside the clock, a device sync before every clock read, a
//! time-based warm-up with the cold first run reported apart, several distinct inputs cycled so a
//! result cache cannot answer, percentiles, throughput and a roofline fraction against peaks
//! measured on the same device, saved baselines with noise-aware comparisons, and a batch-scaling
//! check.
//!
//! ```
//! use burn::backend::Flex;
//! use kiln_bench::{Config, Gemm, Runner};
//! use kiln_core::Policy;
//!
//! let device = Default::default();
//! let mut runner = Runner::<Flex>::new(&device, "cpu", Policy::full(), Config::quick());
//! runner.bench(&Gemm::new(64, Policy::full()))?;
//! let (run, failures) = runner.finish();
//! assert!(failures.is_empty());
//! println!("{}", kiln_bench::run_table(&run));
//! # Ok::<(), kiln_bench::BenchError>(())
//! ```

mod baseline;
mod bench;
mod builds;
pub mod cli;
mod lockstep;
mod memory;
mod report;
mod runner;
mod scaling;
pub mod stats;
mod suite;

pub use baseline::{
    BaselineStore, Comparison, DEFAULT_THRESHOLD, Method, Row, Verdict, format_rate,
    format_seconds, run_table,
};
pub use bench::{Alone, Benchmark, Config, Pacer, Timings, Work, measure, measure_paced};
pub use lockstep::{DEFAULT_PAIRS, Lockstep, Paced, Pairs, conduct};
pub use memory::{host_peak, reset_host_peak};
pub use report::{BURN_VERSION, BenchResult, Environment, Peaks, Setting, SuiteRun, Throughput};
pub use runner::{Runner, Suite, policy_label};
pub use scaling::{BatchScaling, batch_sizes};
pub use suite::{
    Attention, CalibrationSize, Gemm, HostGemm, HostGemmInput, MemoryCopy, PackedWeight, calibrate,
};

/// Why a benchmark run, a baseline or a check failed.
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    /// The device could not be selected.
    #[error(transparent)]
    DeviceSelect(#[from] kiln_core::DeviceError),
    /// The precision policy does not fit the device.
    #[error(transparent)]
    Precision(#[from] kiln_core::PrecisionError),
    /// The device failed while running.
    #[error("the device failed: {0}")]
    Device(String),
    /// A benchmark produced no usable sample.
    #[error("benchmark `{0}` produced no finite timing sample")]
    NoSamples(String),
    /// A baseline file or directory could not be read or written.
    #[error(transparent)]
    File(#[from] kiln_io::FileError),
    /// A file in the baselines directory that is not a kiln-bench baseline.
    #[error("{} is not a kiln-bench baseline: {reason}", path.display())]
    NotABaseline {
        /// The file.
        path: std::path::PathBuf,
        /// What its parser said.
        reason: String,
    },
    /// The code being measured failed (a model that cannot be built, a fixture that cannot be
    /// written): the workload's own error.
    #[error("the benchmarked workload failed: {0}")]
    Workload(Box<dyn std::error::Error + Send + Sync>),
    /// The baseline to compare with does not exist.
    #[error("no baseline `{name}` in {dir} (saved: {saved}); create it with `--save {name}`")]
    NoBaseline {
        /// The name asked for.
        name: String,
        /// Where baselines are kept.
        dir: String,
        /// The baselines that exist.
        saved: String,
    },
    /// A baseline name that cannot be a file name.
    #[error("bad baseline name `{0}`: use letters, digits, `-`, `_` and `.`")]
    BadName(String),
    /// The two builds taken in turns stopped following the conversation (see
    /// [`Lockstep`]): one failed, or a build saved by another kiln-bench speaks otherwise.
    #[error(
        "taking the two builds in turns failed: {0}; compare with the baseline's saved numbers \
         with `--saved-numbers`, or save the baseline again"
    )]
    Conversation(String),
    /// A build taken in turns failed.
    #[error("{build} `{}` failed ({status}){said}", path.display())]
    BuildFailed {
        /// Which build: "the baseline's saved build" or "this build".
        build: &'static str,
        /// Its executable.
        path: std::path::PathBuf,
        /// How it ended.
        status: String,
        /// The end of what it printed, after a colon and a new line, or nothing.
        said: String,
    },
    /// This build's run taken in turns failed one of its checks: the end of what it printed.
    #[error("this build failed a check{0}")]
    ChecksFailed(String),
    /// Batching made each item more expensive.
    #[error(
        "{name}: an item costs {} at batch {batch} but {} alone: batching makes it slower",
        format_seconds(*batched_item),
        format_seconds(*single_item)
    )]
    BatchSlower {
        /// What was scaled.
        name: String,
        /// The largest batch size.
        batch: usize,
        /// Median seconds per item at batch 1.
        single_item: f64,
        /// Median seconds per item at the largest batch.
        batched_item: f64,
    },
}

impl BenchError {
    /// The measured code's own error `e` ([`BenchError::Workload`]).
    pub fn workload(e: impl Into<Box<dyn std::error::Error + Send + Sync>>) -> Self {
        BenchError::Workload(e.into())
    }
}
