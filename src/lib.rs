//! # kiln
//!
//! ML workloads at hardware speed, with the same model code on CUDA, Vulkan/Metal (wgpu) or CPU.
//!
//! This facade re-exports the member crates:
//! - [`core`](mod@core): what every crate stands on — run-time device selection
//!   ([`core::DeviceSpec`]), mixed-precision policies ([`core::PolicySpec`],
//!   [`core::LossScale`]), host threads, the GPU kernel cache and checkpoints.
//! - [`bench`](mod@bench): honest benchmarks — device syncs, warm-up, percentiles, roofline, saved
//!   baselines and comparisons (the `kiln-bench` binary runs kiln's suite).
//! - [`cache`]: decode and preprocess images and video clips once (Hugging Face processor
//!   parity), store them as memory-mapped 8-bit tensors, keep them on the device or stream
//!   prefetched batches, normalise batches on the device.
//! - [`forcefield`]: PaiNN potentials loaded from schnetpack state dicts: batched energies and
//!   forces over per-structure neighbour lists.
//! - [`kernels`]: the compute kernels the model crates share — packed f32 products with fused
//!   epilogues, host math, softmax, norms and attention with its backward, differentiable host
//!   operations, counter-based dropout masks, one-pass AdamW, row gathers and segment sums
//!   (cubecl kernels on the GPU backends).
//! - [`foveated`]: fVLM's two-pass foveated video-language model (DINOv2 frames read by
//!   learned and LM-derived queries, a Llama-family LM, coarse and fine passes).
//! - [`io`]: how kiln writes files: atomically under unique temporary names, never over an
//!   input or anything but a regular file.
//! - [`mc`]: nested Monte-Carlo over vision encoders (the main job, `examples/exp0_mc/`): trial
//!   runner, f64 statistics, resumable and shardable experiments.
//! - [`text`]: Llama-family language models (Llama, Qwen2) loaded from Hugging Face checkpoints,
//!   matching transformers, with a key/value cache for incremental decoding.
//! - [`train`]: the training loop (AdamW parameter groups, schedules in optimizer steps,
//!   global-norm clipping, accumulation, loss scaling, evaluation, bit-exact resume,
//!   data-parallel with the `collective` feature).
//! - [`transformer`]: the transformer machinery the model crates share — projections with fused
//!   epilogues, prepared weights, precision-policy passes and Monte-Carlo dropout sites.
//! - [`vision`]: CLIP, SigLIP / SigLIP2 and DINOv2 vision towers loaded from Hugging Face
//!   checkpoints, matching transformers, with precision policies and Monte-Carlo dropout.
//!
//! [`cli`] holds the domains of the examples' numeric flags, for programs of your own.
//! [`Error`] wraps every crate's error, for programs that do not care which crate failed.
//!
//! Library warnings go through the `log` crate; [`log_to_stderr`] shows them on stderr.
//!
//! Backends are cargo features: `flex` (default, CPU), `ndarray`, `wgpu`, `cuda`. One binary can
//! hold several; the device is chosen at run time:
//!
//! ```
//! use kiln::core::DeviceSpec;
//!
//! let device: DeviceSpec = "cpu".parse()?;
//! let report = device.report()?;
//! println!("{report}");
//! # Ok::<(), kiln::core::DeviceError>(())
//! ```

pub mod cli;
mod error;
mod logging;

pub use burn;
pub use error::Error;
pub use kiln_bench as bench;
pub use kiln_cache as cache;
pub use kiln_core as core;
pub use kiln_forcefield as forcefield;
pub use kiln_foveated as foveated;
pub use kiln_io as io;
pub use kiln_kernels as kernels;
pub use kiln_latentwire as latentwire;
pub use kiln_mc as mc;
pub use kiln_realtime as realtime;
pub use kiln_text as text;
pub use kiln_train as train;
pub use kiln_transformer as transformer;
pub use kiln_vision as vision;
pub use logging::{exit_status, log_to_stderr, run_job};
