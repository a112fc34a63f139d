//! Run-time device selection: a device string (`cpu`, `ndarray`, `wgpu`, `vulkan`, `metal`,
//! `cuda`, `cuda:N`) picks one of the backends compiled into the binary, and generic code
//! `fn run<B: Backend>(self, device: &B::Device)` runs on it.
//!
//! ```
//! use burn::tensor::{ElementConversion, Tensor, backend::Backend};
//! use kiln_core::{DeviceJob, DeviceSpec};
//!
//! struct SumOfSquares(Vec<f32>);
//!
//! impl DeviceJob for SumOfSquares {
//!     type Output = f32;
//!     fn run<B: Backend>(self, device: &B::Device) -> f32 {
//!         let x = Tensor::<B, 1>::from_floats(self.0.as_slice(), device);
//!         (x.clone() * x).sum().into_scalar().elem()
//!     }
//! }
//!
//! let device: DeviceSpec = "cpu".parse()?;
//! assert_eq!(device.run(SumOfSquares(vec![1.0, 2.0, 3.0]))?, 14.0);
//! # Ok::<(), kiln_core::DeviceError>(())
//! ```
//!
//! A backend that was not compiled in, or whose driver is missing, is a [`DeviceError`] whose
//! one-line message says what to do; nothing panics inside burn.

use std::fmt;
use std::str::FromStr;

use burn::tensor::backend::{Backend, DTypeUsage, DTypeUsageSet};

use crate::dtype::Precision;

/// The backends kiln can be built with, each behind the facade's cargo feature of the same name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BackendKind {
    /// burn's Flex CPU backend (`cpu`).
    Flex,
    /// burn's NdArray CPU backend.
    NdArray,
    /// burn's wgpu backend (Vulkan, Metal, DirectX 12, WebGPU).
    Wgpu,
    /// burn's CUDA backend.
    Cuda,
}

impl BackendKind {
    /// Every backend, in the order reports list them.
    pub const ALL: [BackendKind; 4] = [
        BackendKind::Flex,
        BackendKind::NdArray,
        BackendKind::Wgpu,
        BackendKind::Cuda,
    ];

    /// The cargo feature that compiles this backend in.
    pub fn feature(self) -> &'static str {
        match self {
            BackendKind::Flex => "flex",
            BackendKind::NdArray => "ndarray",
            BackendKind::Wgpu => "wgpu",
            BackendKind::Cuda => "cuda",
        }
    }

    /// Whether this binary contains the backend.
    pub fn is_compiled(self) -> bool {
        match self {
            BackendKind::Flex => cfg!(feature = "flex"),
            BackendKind::NdArray => cfg!(feature = "ndarray"),
            BackendKind::Wgpu => cfg!(feature = "wgpu"),
            BackendKind::Cuda => cfg!(feature = "cuda"),
        }
    }

    /// The default device of this backend.
    pub fn default_device(self) -> DeviceSpec {
        match self {
            BackendKind::Flex => DeviceSpec::Flex,
            BackendKind::NdArray => DeviceSpec::NdArray,
            BackendKind::Wgpu => DeviceSpec::Wgpu(GraphicsApi::Auto),
            BackendKind::Cuda => DeviceSpec::Cuda(0),
        }
    }
}

/// Which graphics API the wgpu backend runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum GraphicsApi {
    /// wgpu's choice for the platform.
    Auto,
    /// Vulkan (Linux, Windows, Android; Mesa lavapipe on machines without a GPU).
    Vulkan,
    /// Metal (macOS, iOS).
    Metal,
}

/// A device named on the command line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DeviceSpec {
    /// `cpu` or `flex`: burn's Flex backend.
    Flex,
    /// `ndarray`.
    NdArray,
    /// `wgpu`, `vulkan` or `metal`.
    Wgpu(GraphicsApi),
    /// `cuda` (device 0) or `cuda:N`.
    Cuda(usize),
}

/// The device strings [`DeviceSpec`] accepts.
pub const DEVICE_NAMES: &str = "cpu, ndarray, wgpu, vulkan, metal, cuda, cuda:N";

impl Default for DeviceSpec {
    /// The first compiled backend in the order cpu, ndarray, wgpu, cuda.
    fn default() -> Self {
        BackendKind::ALL
            .into_iter()
            .find(|kind| kind.is_compiled())
            .unwrap_or(BackendKind::Flex)
            .default_device()
    }
}

impl FromStr for DeviceSpec {
    type Err = DeviceError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let name = s.trim().to_ascii_lowercase();
        match name.as_str() {
            "cpu" | "flex" => Ok(DeviceSpec::Flex),
            "ndarray" => Ok(DeviceSpec::NdArray),
            "wgpu" | "gpu" => Ok(DeviceSpec::Wgpu(GraphicsApi::Auto)),
            "vulkan" => Ok(DeviceSpec::Wgpu(GraphicsApi::Vulkan)),
            "metal" => Ok(DeviceSpec::Wgpu(GraphicsApi::Metal)),
            "cuda" => Ok(DeviceSpec::Cuda(0)),
            _ => match name.strip_prefix("cuda:").map(str::parse) {
                Some(Ok(index)) => Ok(DeviceSpec::Cuda(index)),
                _ => Err(DeviceError::Unknown(s.trim().to_string())),
            },
        }
    }
}

impl fmt::Display for DeviceSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DeviceSpec::Flex => f.write_str("cpu"),
            DeviceSpec::NdArray => f.write_str("ndarray"),
            DeviceSpec::Wgpu(GraphicsApi::Auto) => f.write_str("wgpu"),
            DeviceSpec::Wgpu(GraphicsApi::Vulkan) => f.write_str("vulkan"),
            DeviceSpec::Wgpu(GraphicsApi::Metal) => f.write_str("metal"),
            DeviceSpec::Cuda(i) => write!(f, "cuda:{i}"),
        }
    }
}

/// Why a device cannot be used. Every message is one line that says what to do.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DeviceError {
    /// The string names no device.
    #[error("unknown device `{0}`: expected one of {DEVICE_NAMES}")]
    Unknown(String),
    /// The backend is not in this binary.
    #[error(
        "device `{spec}` needs the `{feature}` backend, which this binary was built without: rebuild with `--features {feature}` (compiled in: {compiled})"
    )]
    NotCompiled {
        /// The device asked for.
        spec: DeviceSpec,
        /// The cargo feature to enable.
        feature: &'static str,
        /// The backends this binary has.
        compiled: String,
    },
    /// The backend is compiled in but cannot run here.
    #[error("device `{spec}` is not available: {reason}; {hint}")]
    Unavailable {
        /// The device asked for.
        spec: DeviceSpec,
        /// What is missing.
        reason: String,
        /// What the user can do.
        hint: String,
    },
}

/// Generic code that runs on whichever backend a [`DeviceSpec`] picks at run time.
///
/// Jobs that need gradients wrap the backend themselves: `burn::backend::Autodiff<B>`.
pub trait DeviceJob {
    /// What the job returns.
    type Output;
    /// Runs the job on `device` of backend `B`.
    fn run<B: Backend>(self, device: &B::Device) -> Self::Output;
}

/// What a device is, as far as the host can tell before any tensor exists.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hardware {
    /// Processor or adapter name.
    pub name: String,
    /// Memory the backend can use, in bytes, where it can be told (host RAM for CPU backends).
    pub memory_bytes: Option<u64>,
    /// Worker threads of CPU backends.
    pub threads: Option<usize>,
}

impl DeviceSpec {
    /// The backend this device belongs to.
    pub fn backend(&self) -> BackendKind {
        match self {
            DeviceSpec::Flex => BackendKind::Flex,
            DeviceSpec::NdArray => BackendKind::NdArray,
            DeviceSpec::Wgpu(_) => BackendKind::Wgpu,
            DeviceSpec::Cuda(_) => BackendKind::Cuda,
        }
    }

    /// The default device of every backend compiled into this binary.
    pub fn compiled() -> Vec<DeviceSpec> {
        BackendKind::ALL
            .into_iter()
            .filter(|kind| kind.is_compiled())
            .map(BackendKind::default_device)
            .collect()
    }

    /// Checks that the backend is compiled in and its driver and device exist, and describes the
    /// hardware. Safe to call on any machine: a missing driver is an error, not a panic.
    pub fn probe(&self) -> Result<Hardware, DeviceError> {
        let kind = self.backend();
        if !kind.is_compiled() {
            return Err(DeviceError::NotCompiled {
                spec: *self,
                feature: kind.feature(),
                compiled: compiled_list(),
            });
        }
        match self {
            DeviceSpec::Flex | DeviceSpec::NdArray => Ok(host::hardware()),
            DeviceSpec::Wgpu(api) => wgpu_probe(*self, *api),
            DeviceSpec::Cuda(index) => cuda_probe(*self, *index),
        }
    }

    /// Runs `job` on this device, after [`probe`](Self::probe) has checked that it can.
    // A library may depend on kiln-core without any backend; then every device is rejected.
    #[cfg_attr(
        not(any(
            feature = "flex",
            feature = "ndarray",
            feature = "wgpu",
            feature = "cuda"
        )),
        allow(unused_variables, unreachable_code)
    )]
    pub fn run<J: DeviceJob>(&self, job: J) -> Result<J::Output, DeviceError> {
        self.probe()?;
        Ok(match self {
            #[cfg(feature = "flex")]
            DeviceSpec::Flex => job.run::<burn::backend::Flex>(&Default::default()),
            #[cfg(feature = "ndarray")]
            DeviceSpec::NdArray => job.run::<burn::backend::NdArray>(&Default::default()),
            #[cfg(feature = "wgpu")]
            DeviceSpec::Wgpu(_) => job.run::<burn::backend::Wgpu>(&Default::default()),
            #[cfg(feature = "cuda")]
            DeviceSpec::Cuda(index) => {
                job.run::<burn::backend::Cuda>(&burn::backend::cuda::CudaDevice::new(*index))
            }
            #[allow(unreachable_patterns)] // `probe` rejected every backend not compiled in.
            _ => unreachable!("probe accepted a backend that is not compiled in"),
        })
    }

    /// Bytes the backend has reserved on the device, where it can tell: the cubecl backends
    /// (wgpu, CUDA) report their memory pools; the CPU backends allocate from the host heap and
    /// say nothing. `None` also when the device is not available.
    pub fn memory_reserved(&self) -> Option<u64> {
        self.probe().ok()?;
        match self {
            #[cfg(feature = "wgpu")]
            DeviceSpec::Wgpu(_) => wgpu_backend::memory_reserved(),
            #[cfg(feature = "cuda")]
            DeviceSpec::Cuda(index) => cuda_backend::memory_reserved(*index),
            _ => None,
        }
    }

    /// The capability report of this device: backend, hardware, and what each float dtype can do.
    pub fn report(&self) -> Result<DeviceReport, DeviceError> {
        let hardware = self.probe()?;
        let (backend, dtypes) = self.run(DtypeUsages)?;
        Ok(DeviceReport {
            spec: *self,
            backend,
            hardware,
            dtypes,
        })
    }
}

/// Bytes of memory `device` can still take, where that can be told: the host's
/// [`available_memory`](crate::available_memory) for the CPU backends, the GPU's free memory on
/// CUDA; `None` on wgpu, whose adapters do not say.
pub fn free_memory<B: Backend>(device: &B::Device) -> Option<u64> {
    if is_host_backend::<B>(device) {
        return crate::available_memory();
    }
    #[cfg(feature = "cuda")]
    if B::name(device).contains("cuda") {
        use burn::tensor::backend::DeviceOps;
        return cuda_backend::free_memory(usize::from(device.id().index_id));
    }
    None
}

/// Whether backend `B` keeps its tensors in host memory: the CPU backends (Flex, NdArray), also
/// under autodiff. There an upload is a memory copy, and element-wise work that a GPU would do
/// after the upload is cheaper on the host before it.
pub fn is_host_backend<B: Backend>(device: &B::Device) -> bool {
    let name = B::name(device);
    let mut inner = name.as_str();
    while let Some(rest) = inner
        .strip_prefix("autodiff<")
        .and_then(|r| r.strip_suffix('>'))
    {
        inner = rest;
    }
    matches!(inner, "flex" | "ndarray")
}

fn compiled_list() -> String {
    let names: Vec<_> = BackendKind::ALL
        .into_iter()
        .filter(|kind| kind.is_compiled())
        .map(BackendKind::feature)
        .collect();
    if names.is_empty() {
        "none".into()
    } else {
        names.join(", ")
    }
}

/// Collects burn's backend name and the dtype usage of each float type.
struct DtypeUsages;

impl DeviceJob for DtypeUsages {
    type Output = (String, Vec<(Precision, DTypeUsageSet)>);

    fn run<B: Backend>(self, device: &B::Device) -> Self::Output {
        let usages = Precision::ALL
            .into_iter()
            .map(|p| (p, B::dtype_usage(device, p.dtype())))
            .collect();
        (B::name(device), usages)
    }
}

/// Everything `cargo run --example devices` prints about one device.
#[derive(Debug, Clone)]
pub struct DeviceReport {
    /// The device.
    pub spec: DeviceSpec,
    /// burn's name for the backend (e.g. `fusion<cubecl<wgpu<vulkan>>>`).
    pub backend: String,
    /// The hardware behind it.
    pub hardware: Hardware,
    /// What each float dtype can do there.
    pub dtypes: Vec<(Precision, DTypeUsageSet)>,
}

impl DeviceReport {
    /// Float dtypes the device can store and compute with.
    pub fn compute_dtypes(&self) -> Vec<Precision> {
        self.dtypes
            .iter()
            .filter(|(_, usage)| usage.is_superset(DTypeUsage::general()))
            .map(|(p, _)| *p)
            .collect()
    }

    /// What a `half` policy resolves to on this device.
    pub fn half(&self) -> Precision {
        crate::policy::pick_half(|p| self.compute_dtypes().contains(&p))
    }
}

impl fmt::Display for DeviceReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "{} ({})", self.spec, self.backend)?;
        writeln!(f, "  device   {}", self.hardware.name)?;
        let memory = match self.hardware.memory_bytes {
            Some(bytes) => format!("{:.1} GiB", bytes as f64 / (1u64 << 30) as f64),
            None => "unknown (the backend does not tell)".into(),
        };
        writeln!(f, "  memory   {memory}")?;
        if let Some(threads) = self.hardware.threads {
            writeln!(f, "  threads  {threads}")?;
        }
        for (precision, usage) in &self.dtypes {
            let mut what: Vec<&str> = Vec::new();
            if usage.contains(DTypeUsage::Storage) {
                what.push("store");
            }
            if usage.contains(DTypeUsage::Arithmetic) {
                what.push("compute");
            }
            if usage.contains(DTypeUsage::Accelerated) {
                what.push("accelerated");
            }
            let what = if what.is_empty() {
                "unsupported".to_string()
            } else {
                what.join(", ")
            };
            writeln!(f, "  {precision:<8} {what}")?;
        }
        writeln!(f, "  half     = {}", self.half())
    }
}

mod host {
    use super::Hardware;

    /// The CPU's model name and the machine's RAM, from /proc where it exists.
    pub fn hardware() -> Hardware {
        let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        let cpu = cpuinfo
            .lines()
            .find_map(|line| {
                line.strip_prefix("model name")?
                    .split_once(':')
                    .map(|(_, v)| v.trim().to_string())
            })
            .unwrap_or_else(|| std::env::consts::ARCH.to_string());
        let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
        let memory_bytes = meminfo.lines().find_map(|line| {
            let kib = line
                .strip_prefix("MemTotal:")?
                .trim()
                .strip_suffix("kB")?
                .trim();
            kib.parse::<u64>().ok().map(|kib| kib * 1024)
        });
        Hardware {
            name: cpu,
            memory_bytes,
            threads: Some(rayon::current_num_threads()),
        }
    }
}

#[cfg(feature = "wgpu")]
fn wgpu_probe(spec: DeviceSpec, api: GraphicsApi) -> Result<Hardware, DeviceError> {
    crate::enable_kernel_cache();
    wgpu_backend::probe(spec, api)
}

#[cfg(not(feature = "wgpu"))]
fn wgpu_probe(_: DeviceSpec, _: GraphicsApi) -> Result<Hardware, DeviceError> {
    unreachable!("checked by probe")
}

#[cfg(feature = "cuda")]
fn cuda_probe(spec: DeviceSpec, index: usize) -> Result<Hardware, DeviceError> {
    crate::enable_kernel_cache();
    cuda_backend::probe(spec, index)
}

#[cfg(not(feature = "cuda"))]
fn cuda_probe(_: DeviceSpec, _: usize) -> Result<Hardware, DeviceError> {
    unreachable!("checked by probe")
}

#[cfg(feature = "wgpu")]
mod wgpu_backend {
    use std::sync::OnceLock;

    use burn::backend::wgpu::{RuntimeOptions, WgpuDevice, WgpuRuntime, graphics, init_setup};
    use burn::cubecl::Runtime;

    use super::{DeviceError, DeviceSpec, GraphicsApi, Hardware};

    /// The graphics API wgpu was set up with in this process, and the adapter it chose.
    static SETUP: OnceLock<Result<(GraphicsApi, String), String>> = OnceLock::new();

    fn backends(api: GraphicsApi) -> wgpu::Backends {
        match api {
            GraphicsApi::Auto => wgpu::Backends::all(),
            GraphicsApi::Vulkan => wgpu::Backends::VULKAN,
            GraphicsApi::Metal => wgpu::Backends::METAL,
        }
    }

    /// Looks for adapters without letting burn panic when there are none, then sets the default
    /// wgpu device up once for the process on the requested API.
    pub fn probe(spec: DeviceSpec, api: GraphicsApi) -> Result<Hardware, DeviceError> {
        let unavailable = |reason: String| {
            DeviceError::Unavailable {
            spec,
            reason,
            hint: "install a Vulkan or Metal driver (on Linux without a GPU: `apt-get install mesa-vulkan-drivers`) or pick another device, e.g. `--device cpu`".into(),
        }
        };
        let setup = SETUP.get_or_init(|| {
            let instance = wgpu::Instance::new(wgpu::InstanceDescriptor {
                backends: backends(api),
                ..wgpu::InstanceDescriptor::new_without_display_handle()
            });
            if pollster::block_on(instance.enumerate_adapters(backends(api))).is_empty() {
                return Err(format!("wgpu finds no {api:?} adapter"));
            }
            let device = WgpuDevice::DefaultDevice;
            let options = RuntimeOptions::default();
            let setup = match api {
                GraphicsApi::Auto => init_setup::<graphics::AutoGraphicsApi>(&device, options),
                GraphicsApi::Vulkan => init_setup::<graphics::Vulkan>(&device, options),
                GraphicsApi::Metal => init_setup::<graphics::Metal>(&device, options),
            };
            let info = setup.adapter.get_info();
            Ok((
                api,
                format!(
                    "{} ({:?}, {:?}, {})",
                    info.name, info.backend, info.device_type, info.driver
                ),
            ))
        });
        match setup {
            Err(reason) => Err(unavailable(reason.clone())),
            Ok((set_api, _)) if *set_api != api => Err(DeviceError::Unavailable {
                spec,
                reason: format!("this process already set wgpu up on {set_api:?}"),
                hint: "use one wgpu device string per process".into(),
            }),
            Ok((_, name)) => Ok(Hardware {
                name: name.clone(),
                memory_bytes: None,
                threads: None,
            }),
        }
    }

    /// Bytes reserved by the memory pools of the default wgpu device, once it is set up.
    pub fn memory_reserved() -> Option<u64> {
        let client = WgpuRuntime::client(&WgpuDevice::DefaultDevice);
        client.memory_usage().ok().map(|usage| usage.bytes_reserved)
    }
}

#[cfg(feature = "cuda")]
#[allow(unsafe_code)]
mod cuda_backend {
    use burn::backend::cuda::CudaDevice;
    use burn::cubecl::Runtime;
    use burn::cubecl::cuda::CudaRuntime;
    use cudarc::driver::{result, sys};

    use super::{DeviceError, DeviceSpec, Hardware};

    /// Loads the CUDA driver and queries the device through it, so that a machine without an
    /// NVIDIA driver gets an error instead of burn's panic.
    pub fn probe(spec: DeviceSpec, index: usize) -> Result<Hardware, DeviceError> {
        let unavailable = |reason: String| {
            DeviceError::Unavailable {
            spec,
            reason,
            hint: "install the NVIDIA driver, or pick another device, e.g. `--device cpu` or `--device wgpu`".into(),
        }
        };
        // SAFETY: only tries to dlopen the driver library; nothing from it is called yet.
        if !unsafe { sys::is_culib_present() } {
            return Err(unavailable(
                "the CUDA driver library (libcuda.so) is not installed".into(),
            ));
        }
        result::init()
            .map_err(|e| unavailable(format!("the CUDA driver failed to start ({e:?})")))?;
        let count = result::device::get_count().map_err(|e| unavailable(format!("{e:?}")))?;
        let ordinal = i32::try_from(index)
            .ok()
            .filter(|&i| i < count)
            .ok_or_else(|| {
                unavailable(format!("there is no CUDA device {index} ({count} found)"))
            })?;
        let device = result::device::get(ordinal).map_err(|e| unavailable(format!("{e:?}")))?;
        let name = result::device::get_name(device).map_err(|e| unavailable(format!("{e:?}")))?;
        // SAFETY: `device` was returned by `result::device::get` above.
        let memory = unsafe { result::device::total_mem(device) }
            .ok()
            .map(|bytes| bytes as u64);
        Ok(Hardware {
            name,
            memory_bytes: memory,
            threads: None,
        })
    }

    /// Bytes free on CUDA device `index`, asked in its primary context (the one cubecl uses);
    /// the calling thread's current context is restored after.
    pub fn free_memory(index: usize) -> Option<u64> {
        result::init().ok()?;
        let device = result::device::get(i32::try_from(index).ok()?).ok()?;
        let previous = result::ctx::get_current().ok().flatten();
        // SAFETY: `device` is a valid device; the primary context retained here is released
        // below, and the previous current context (if any) is made current again.
        unsafe {
            let context = result::primary_ctx::retain(device).ok()?;
            let info = result::ctx::set_current(context)
                .ok()
                .and_then(|()| result::mem_get_info().ok());
            if let Some(previous) = previous {
                let _ = result::ctx::set_current(previous);
            }
            let _ = result::primary_ctx::release(device);
            info.map(|(free, _total)| free as u64)
        }
    }

    /// Bytes reserved by the memory pools of CUDA device `index`.
    pub fn memory_reserved(index: usize) -> Option<u64> {
        let client = CudaRuntime::client(&CudaDevice::new(index));
        client.memory_usage().ok().map(|usage| usage.bytes_reserved)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn device_strings() {
        for (text, want) in [
            ("cpu", DeviceSpec::Flex),
            ("FLEX", DeviceSpec::Flex),
            ("ndarray", DeviceSpec::NdArray),
            ("wgpu", DeviceSpec::Wgpu(GraphicsApi::Auto)),
            ("vulkan", DeviceSpec::Wgpu(GraphicsApi::Vulkan)),
            ("metal", DeviceSpec::Wgpu(GraphicsApi::Metal)),
            ("cuda", DeviceSpec::Cuda(0)),
            ("cuda:3", DeviceSpec::Cuda(3)),
        ] {
            let spec: DeviceSpec = text.parse().unwrap();
            assert_eq!(spec, want, "{text}");
            assert_eq!(spec.to_string().parse::<DeviceSpec>().unwrap(), spec);
        }
        for bad in ["tpu", "cuda:x", "cuda:", "cuda:-1", ""] {
            let err = bad.parse::<DeviceSpec>().unwrap_err().to_string();
            assert!(
                err.contains("expected one of") && err.contains("cuda:N"),
                "{err}"
            );
        }
    }

    #[cfg(feature = "flex")]
    #[test]
    fn cpu_backends_use_host_memory() {
        use burn::backend::{Autodiff, Flex};
        let device = Default::default();
        assert!(is_host_backend::<Flex>(&device));
        assert!(is_host_backend::<Autodiff<Flex>>(&device));
    }

    #[test]
    fn backends_left_out_are_explained_in_one_line() {
        for kind in BackendKind::ALL.into_iter().filter(|k| !k.is_compiled()) {
            let err = kind.default_device().probe().unwrap_err().to_string();
            assert!(!err.contains('\n'), "{err}");
            assert!(
                err.contains(&format!("--features {}", kind.feature())),
                "{err}"
            );
        }
    }
}
