//! # kiln-python
//!
//! kiln from Python: the native module `kiln._kiln` behind the `kiln` package
//! (`python/kiln/`). Each submodule holds a loaded model on one device and computes with the
//! interpreter's lock released; inputs come as numpy arrays (read in place) or paths, results go
//! back as numpy arrays.
//!
//! - [`forcefield`]: a PaiNN potential's energies, forces and stresses for a batch of structures
//!   (what `kiln.forcefield.Calculator`, an ASE calculator, calls).
//! - [`vision`]: embeddings of images (paths or `uint8` arrays) preprocessed as the checkpoint's
//!   Hugging Face processor does.
//! - [`mc`]: the main job's nested Monte-Carlo statistics.
//! - [`text`]: generation with a Llama or Qwen2 checkpoint.
//! - [`foveated`]: captions of clips with a trained foveated model (fVLM's inference path).
//!
//! Errors reach Python as exceptions carrying kiln's messages: `FileNotFoundError` for missing
//! files, `ValueError` for inputs kiln refuses, `RuntimeError` for what fails while computing,
//! a panic inside kiln included (never pyo3's `PanicException`, which `except Exception` misses).
//! kiln's warnings (`log` records) reach Python's `logging` through `pyo3-log`.

use burn::tensor::backend::Backend;
use kiln_core::{CheckpointError, DeviceJob, DeviceSpec, Policy, PolicySpec};
use pyo3::exceptions::{PyFileNotFoundError, PyRuntimeError, PyValueError};
use pyo3::prelude::*;

/// mimalloc for the module's own allocations (Python's objects keep the interpreter's). The
/// kernels allocate their working buffers afresh on every call: glibc's allocator maps the larger
/// ones from the kernel and unmaps them when freed, so every call page-faults them in again, and
/// while another of the module's threads runs each fault also flushes that core's TLB. One call
/// on two benzenes cost 6.6 ms that way and 1.9 ms with the memory kept (docs/PERFORMANCE.md,
/// "kiln from Python").
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

pub mod forcefield;
pub mod foveated;
pub mod mc;
pub mod text;
pub mod vision;

/// Runs `job` on the backend that `device` names (`cpu`, `wgpu`, `cuda:1`, ...).
fn on_device<J: DeviceJob>(device: &str, job: J) -> PyResult<J::Output> {
    let spec: DeviceSpec = device
        .parse()
        .map_err(|e| PyValueError::new_err(format!("device {device:?}: {e}")))?;
    spec.run(job)
        .map_err(|e| PyRuntimeError::new_err(format!("device {device:?}: {e}")))
}

/// A precision policy as its name or `key=dtype` list says (`full`, `mixed-bf16`, ...).
fn policy(text: &str) -> PyResult<PolicySpec> {
    text.parse()
        .map_err(|e| PyValueError::new_err(format!("policy {text:?}: {e}")))
}

/// `policy` with its `half` dtypes made the device's.
fn resolve<B: Backend>(policy: &PolicySpec, device: &B::Device) -> PyResult<Policy> {
    policy
        .resolve::<B>(device)
        .map_err(|e| PyValueError::new_err(e.to_string()))
}

/// A checkpoint that cannot be used: `FileNotFoundError` when a file or directory is missing,
/// `ValueError` otherwise.
fn checkpoint_error(error: &CheckpointError) -> PyErr {
    let missing = match error {
        CheckpointError::Unreadable { file, .. } => !file.exists(),
        CheckpointError::NoWeights { .. } | CheckpointError::NotFound { .. } => true,
        _ => false,
    };
    if missing {
        PyFileNotFoundError::new_err(error.to_string())
    } else {
        PyValueError::new_err(error.to_string())
    }
}

/// Runs `work` with the interpreter's lock released. A panic inside it (a bug in kiln) comes
/// back as a `RuntimeError` carrying its message, which `except Exception` catches, rather than
/// as pyo3's `PanicException`, which it does not; a model whose lock the panic held is refused
/// after ([`poisoned`]).
fn released<T: Send>(py: Python<'_>, work: impl FnOnce() -> T + Send) -> PyResult<T> {
    py.detach(|| std::panic::catch_unwind(std::panic::AssertUnwindSafe(work)))
        .map_err(|payload| panicked(payload.as_ref()))
}

/// The `RuntimeError` a panic with `payload` becomes.
fn panicked(payload: &(dyn std::any::Any + Send)) -> PyErr {
    let message = payload
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "(no message)".into());
    PyRuntimeError::new_err(format!(
        "kiln failed inside (a bug: please report it with this message): {message}"
    ))
}

/// A model that an earlier call panicked inside: its state cannot be trusted.
fn poisoned() -> PyErr {
    PyRuntimeError::new_err("an earlier call panicked inside the model: load it again")
}

/// The native module: classes and functions the `kiln` package wraps.
#[pymodule]
fn _kiln(module: &Bound<'_, PyModule>) -> PyResult<()> {
    // kiln's `log` records go to Python's `logging`, under the Rust module's path with `.` for
    // `::` (`kiln_forcefield.painn`), so warnings reach the user as other libraries' do. It fails
    // only when this module already installed the bridge (a second initialisation): the first
    // one stays.
    let _ = pyo3_log::try_init();
    module.add_class::<forcefield::Potential>()?;
    module.add_class::<vision::Encoder>()?;
    module.add_class::<text::LanguageModel>()?;
    module.add_function(wrap_pyfunction!(mc::run, module)?)?;
    module.add_function(wrap_pyfunction!(foveated::caption, module)?)?;
    module.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
