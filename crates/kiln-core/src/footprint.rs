//! What a model will take before it takes it: its parameters' names and shapes read without
//! initialising them (burn initialises parameters lazily, on first use, so a model built from a
//! config with a typo such as `hidden_size: 8192` costs nothing until something touches it), and
//! the memory those parameters need checked against what the machine has.

use burn::module::{Module, ModuleVisitor, Param, ParamId};
use burn::tensor::Tensor;
use burn::tensor::backend::Backend;

use crate::device::{free_memory, is_host_backend};

/// The most layers (or blocks) a config may ask for; the largest released models have about 130
/// (Llama 3.1 405B: 126). Layers are built before a checkpoint is read, so a typo such as
/// `num_hidden_layers: 1000000000` is refused by this stated limit, not by running out of memory.
pub const MAX_LAYERS: usize = 1024;

/// The largest width (hidden size, vocabulary, heads, head size, image side in pixels) a config
/// may ask for: 2²⁴, 64 times the largest released vocabulary (Gemma's 262 144). Below it, the
/// products of sizes a model computes cannot overflow.
pub const MAX_WIDTH: usize = 1 << 24;

/// A size above its stated limit (`check_limits`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{setting} = {value}: at most {most} (a stated limit; no released model comes near it)")]
pub struct LimitError {
    /// The setting's name as the config spells it.
    pub setting: String,
    /// Its value.
    pub value: usize,
    /// The limit.
    pub most: usize,
}

/// Refuses the first `(setting, value, most)` whose value exceeds its stated limit, naming it:
/// `hidden_size = 1000000000: at most 16777216`.
///
/// ```
/// use kiln_core::{MAX_LAYERS, MAX_WIDTH, check_limits};
/// assert!(check_limits(&[("hidden_size", 768, MAX_WIDTH), ("num_hidden_layers", 12, MAX_LAYERS)]).is_ok());
/// let err = check_limits(&[("num_hidden_layers", 1_000_000, MAX_LAYERS)]).unwrap_err();
/// assert_eq!((err.setting.as_str(), err.value, err.most), ("num_hidden_layers", 1_000_000, 1024));
/// assert_eq!(err.to_string(), "num_hidden_layers = 1000000: at most 1024 (a stated limit; no released model comes near it)");
/// ```
pub fn check_limits(sizes: &[(&str, usize, usize)]) -> Result<(), LimitError> {
    match sizes.iter().find(|(_, value, most)| value > most) {
        Some(&(setting, value, most)) => Err(LimitError {
            setting: setting.to_string(),
            value,
            most,
        }),
        None => Ok(()),
    }
}

/// One floating-point parameter of a module, as [`parameter_shapes`] reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParameterShape {
    /// The field names from the module down to the parameter (`layers.0.linear.weight`).
    pub path: Vec<String>,
    /// The module type of each level of `path` (burn-store's adapters read the last).
    pub containers: Vec<String>,
    /// The parameter's id.
    pub id: ParamId,
    /// Its shape, in burn's layout (a linear weight is `[in, out]`).
    pub shape: Vec<usize>,
}

impl ParameterShape {
    /// The values it holds.
    pub fn len(&self) -> u64 {
        self.shape
            .iter()
            .fold(1u64, |n, &d| n.saturating_mul(d as u64))
    }

    /// Whether it holds no values.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Every floating-point parameter of `module`, in visiting order, without initialising any:
/// nothing is allocated.
pub fn parameter_shapes<B: Backend, M: Module<B>>(module: &M) -> Vec<ParameterShape> {
    struct Shapes {
        path: Vec<String>,
        containers: Vec<String>,
        found: Vec<ParameterShape>,
    }
    impl<B: Backend> ModuleVisitor<B> for Shapes {
        fn enter_module(&mut self, name: &str, container_type: &str) {
            self.path.push(name.to_string());
            self.containers.push(container_type.to_string());
        }
        fn exit_module(&mut self, _name: &str, _container_type: &str) {
            self.path.pop();
            self.containers.pop();
        }
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
            self.found.push(ParameterShape {
                path: self.path.clone(),
                containers: self.containers.clone(),
                id: param.id,
                shape: param.lazy_shape().to_vec(),
            });
        }
    }
    let mut shapes = Shapes {
        path: Vec::new(),
        containers: Vec::new(),
        found: Vec::new(),
    };
    module.visit(&mut shapes);
    shapes.found
}

/// The device `module`'s first floating-point parameter is (or will be) on, read without
/// initialising it (burn's `Module::devices` initialises every parameter).
pub fn parameter_device<B: Backend, M: Module<B>>(module: &M) -> Option<B::Device> {
    struct First<B: Backend>(Option<B::Device>);
    impl<B: Backend> ModuleVisitor<B> for First<B> {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
            if self.0.is_none() {
                self.0 = Some(param.lazy_device());
            }
        }
    }
    let mut first = First(None);
    module.visit(&mut first);
    first.0
}

/// The values `module`'s floating-point parameters hold, without initialising them.
pub fn parameter_count<B: Backend, M: Module<B>>(module: &M) -> u64 {
    parameter_shapes(module)
        .iter()
        .map(ParameterShape::len)
        .fold(0, u64::saturating_add)
}

/// Bytes of memory this process can still take: the kernel's estimate of what can be allocated
/// without swapping (`MemAvailable`), bounded by the cgroup's limit where one is set; `None`
/// where neither can be read (not Linux).
pub fn available_memory() -> Option<u64> {
    let meminfo = std::fs::read_to_string("/proc/meminfo").ok();
    let available = meminfo.as_deref().and_then(|text| {
        text.lines().find_map(|line| {
            let kib = line
                .strip_prefix("MemAvailable:")?
                .trim()
                .strip_suffix("kB")?;
            kib.trim().parse::<u64>().ok().map(|kib| kib * 1024)
        })
    });
    let read = |name: &str| {
        std::fs::read_to_string(format!("/sys/fs/cgroup/{name}"))
            .ok()
            .and_then(|text| text.trim().parse::<u64>().ok())
    };
    let cgroup =
        read("memory.max").map(|max| max.saturating_sub(read("memory.current").unwrap_or(0)));
    match (available, cgroup) {
        (Some(a), Some(c)) => Some(a.min(c)),
        (a, c) => a.or(c),
    }
}

/// `needed` bytes said in the largest unit that keeps them above 1 (`1.5 GB`, `800 MB`).
pub fn human_bytes(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["bytes", "kB", "MB", "GB", "TB"];
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1000.0 && unit < UNITS.len() - 1 {
        value /= 1000.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{bytes} bytes")
    } else {
        format!("{value:.1} {}", UNITS[unit])
    }
}

/// Memory a run would need that the machine or device does not have (`check_memory`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "{what} need at least {}, but {} {} available: choose smaller sizes",
    human_bytes(*needed),
    if *on_device { "the device has" } else { "this machine has" },
    human_bytes(*available)
)]
pub struct MemoryError {
    /// What needs it, in the user's terms.
    pub what: String,
    /// Bytes needed.
    pub needed: u64,
    /// Bytes available.
    pub available: u64,
    /// Whether it is a GPU's memory (else the host's).
    pub on_device: bool,
}

/// Refuses `needed` bytes when `device` cannot take them ([`free_memory`]: the host's available
/// memory for CPU backends, the GPU's free memory on CUDA), before anything is allocated; `what`
/// says what needs them, in the user's terms ("the model's weights (n_atom_basis = 100000)").
/// Where the free memory cannot be read (wgpu), nothing is refused.
pub fn check_memory<B: Backend>(
    device: &B::Device,
    needed: u64,
    what: &str,
) -> Result<(), MemoryError> {
    let on_device = !is_host_backend::<B>(device);
    check_memory_against(needed, free_memory::<B>(device), on_device, what)
}

fn check_memory_against(
    needed: u64,
    available: Option<u64>,
    on_device: bool,
    what: &str,
) -> Result<(), MemoryError> {
    match available {
        Some(available) if needed > available => Err(MemoryError {
            what: what.to_string(),
            needed,
            available,
            on_device,
        }),
        _ => Ok(()),
    }
}

#[cfg(all(test, feature = "flex"))]
mod tests {
    use super::*;
    use burn::backend::Flex;
    use burn::nn::{Linear, LinearConfig};

    #[derive(Module, Debug)]
    struct Wide<B: Backend> {
        proj: Linear<B>,
    }

    /// A model far larger than any machine is read, counted and refused without being built.
    #[test]
    fn shapes_are_read_without_allocating() {
        let device = Default::default();
        // 10^12 weights: 4 TB in f32, which initialising would try to allocate.
        let model: Wide<Flex> = Wide {
            proj: LinearConfig::new(1_000_000, 1_000_000).init(&device),
        };
        let shapes = parameter_shapes(&model);
        assert_eq!(shapes.len(), 2);
        assert_eq!(shapes[0].path, ["proj", "weight"]);
        assert_eq!(shapes[0].shape, [1_000_000, 1_000_000]);
        assert_eq!(
            shapes[0].containers.last().map(String::as_str),
            Some("Struct:Linear")
        );
        assert_eq!(parameter_count(&model), 1_000_000_000_000 + 1_000_000);
        let err = check_memory::<Flex>(&device, parameter_count(&model) * 4, "the model's weights")
            .unwrap_err()
            .to_string();
        assert!(
            err.starts_with("the model's weights need at least 4.0 TB"),
            "{err}"
        );
    }

    #[test]
    fn memory_is_refused_only_beyond_what_is_available() {
        assert!(check_memory_against(10, Some(10), false, "x").is_ok());
        assert!(check_memory_against(u64::MAX, None, false, "x").is_ok());
        let err =
            check_memory_against(2_500_000_000, Some(1_000_000_000), false, "weights").unwrap_err();
        assert_eq!((err.needed, err.available), (2_500_000_000, 1_000_000_000));
        assert_eq!(
            err.to_string(),
            "weights need at least 2.5 GB, but this machine has 1.0 GB available: choose smaller sizes"
        );
        assert_eq!(human_bytes(999), "999 bytes");
        assert!(available_memory().is_none_or(|bytes| bytes > 0));
    }
}
