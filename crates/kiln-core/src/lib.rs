//! # kiln-core
//!
//! What every kiln crate stands on: devices, precision, threads and checkpoints.
//!
//! - [`DeviceSpec`]: a device string (`cpu`, `ndarray`, `wgpu`, `vulkan`, `metal`, `cuda:N`)
//!   resolved at run time to one of the compiled backends; [`DeviceJob`] runs generic code there,
//!   and [`DeviceSpec::report`] describes what the device can do.
//! - [`PolicySpec`] / [`Policy`]: jmp-style param / compute / output dtypes plus an accumulation
//!   dtype, with `half` resolved per device, one-off parameter casting and the keep-in-f32 helper
//!   [`Policy::keep_f32`].
//! - [`LossScale`]: no-op, static and dynamic loss scaling for half-precision training.
//! - [`checkpoint_dir`], [`read_config`], [`load_checkpoint`], [`save_checkpoint`]: checkpoints
//!   for every model family — a directory or a Hugging Face id (feature `hub`), its
//!   `config.json`, its safetensors weights checked against the model before loading (every
//!   problem a [`TensorProblem`] in the checkpoint's own names and dimension order), and kiln's
//!   own saved models; every failure a [`CheckpointError`].
//! - [`gguf::GgufFile`]: llama.cpp's GGUF files — metadata, tensor infos and tensors, read by
//!   position, every offset checked, dequantized to f32 as the `gguf` package does.
//! - [`parameter_shapes`] / [`check_memory`]: a model's parameters read without initialising
//!   them, and the memory they need refused before it is taken when the machine lacks it.
//! - [`on_host_pool`]: host computation driven from one of rayon's threads.
//! - [`splitmix64`] / [`SplitMix64`]: the one seed mixer and small generator every crate uses.
//! - [`Order`] / [`Prefetch`]: a dataset's items in order or shuffled per epoch, and host
//!   batches made ahead on background threads (image feeds, structures, token ids).
//! - [`enable_kernel_cache`]: GPU kernels compiled once per machine (on by default, in the
//!   user's cache directory; `KILN_KERNEL_CACHE` moves it or turns it off).
//!
//! The compute kernels (host math, differentiable host operations, AdamW, row gathers and
//! segment sums) live one crate up, in kiln-kernels.

mod checkpoint;
mod device;
mod dtype;
mod footprint;
pub mod gguf;
mod kernel_cache;
mod loss_scale;
mod order;
mod policy;
mod prefetch;
mod random;
mod threads;

#[cfg(feature = "hub")]
pub use checkpoint::Hub;
pub use checkpoint::{
    CheckpointError, CheckpointFit, Problem, SettingError, TensorProblem, TorchLayout,
    check_checkpoint, check_snapshots, checkpoint_dir, config_file, config_from_json,
    load_checkpoint, load_checkpoint_keeping, load_snapshots, load_snapshots_keeping, read_config,
    read_tensor, read_tensors, save_checkpoint, save_weights, shards, tensor_shapes, weight_files,
    weights_identity,
};
pub use device::{
    BackendKind, DEVICE_NAMES, DeviceError, DeviceJob, DeviceReport, DeviceSpec, GraphicsApi,
    Hardware, free_memory, is_host_backend,
};
pub use dtype::{DtypeSpec, Precision};
pub use footprint::{
    LimitError, MAX_LAYERS, MAX_WIDTH, MemoryError, ParameterShape, available_memory, check_limits,
    check_memory, human_bytes, parameter_count, parameter_device, parameter_shapes,
};
pub use kernel_cache::{KERNEL_CACHE_ENV, enable_kernel_cache, kernel_cache_dir};
pub use loss_scale::{DynamicLossScale, LossScale, StepDecision};
pub use order::Order;
pub use policy::{
    PRESETS, Policy, PolicySpec, cast, cast_module, computes_in, resolve_half, widen_to_f32,
};
pub use prefetch::Prefetch;
pub use random::{SplitMix64, splitmix64};
pub use threads::on_host_pool;

/// Why a precision policy cannot be parsed or used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PrecisionError {
    /// Not a dtype name.
    #[error("unknown dtype `{0}`: expected one of {names}", names = dtype::DTYPE_NAMES)]
    UnknownDtype(String),
    /// Neither a preset, a dtype, nor a `key=dtype` list.
    #[error(
        "unknown policy `{0}`: expected a preset ({presets}), a dtype ({names}) or `params=..,compute=..,output=..`",
        presets = PRESETS.map(|(name, _)| name).join(", "),
        names = dtype::DTYPE_NAMES
    )]
    UnknownPolicy(String),
    /// A list item without `=`.
    #[error("policy `{0}`: `{1}` is not of the form key=dtype")]
    MalformedPolicy(String, String),
    /// A key the grammar does not know.
    #[error("unknown policy key `{0}`: expected {1}")]
    UnknownKey(String, &'static str),
    /// The same key twice.
    #[error("policy key `{0}` is given more than once")]
    RepeatedKey(String),
    /// A list without `params`, from which the others default.
    #[error("policy `{0}` has no `params=` entry (compute defaults to params, output to compute)")]
    MissingParams(String),
    /// The device cannot compute in a dtype the policy names.
    #[error(
        "{device} cannot compute in {dtype}: choose `half` to get the best 16-bit type it has, or f32"
    )]
    UnsupportedOnDevice {
        /// The dtype.
        dtype: Precision,
        /// burn's name of the backend.
        device: String,
    },
}
