//! Where a dataset lives while a job runs: the whole (8-bit where the device stores u8) tensor on
//! an accelerator when it fits next to the model, otherwise on the host, streamed to the device in
//! batches prepared by background threads while the device computes. Host backends stream: the
//! memory-mapped cache already is in their memory, and a resident copy would only hold it again
//! as floats.

use std::fmt;
use std::str::FromStr;

use burn::tensor::backend::Backend;
use kiln_core::{Precision, is_host_backend};

use crate::CacheError;
use crate::images::CachedImages;
use crate::store::Stored;
use crate::upload::normalises_on_host;

/// Share of the device's memory the dataset and the model may take together; the rest is left
/// for activations and the allocator.
pub const DEVICE_MEMORY_SHARE: f64 = 0.7;

/// Where a dataset lives while a job runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Residency {
    /// Uploaded once; batches are slices of the resident tensor.
    Device,
    /// Memory-mapped on the host; each batch is gathered (and, on host backends, normalised) by
    /// a background thread and uploaded while the previous one computes.
    Host,
}

impl fmt::Display for Residency {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Residency::Device => "device",
            Residency::Host => "host",
        })
    }
}

impl FromStr for Residency {
    type Err = CacheError;

    fn from_str(s: &str) -> Result<Self, CacheError> {
        match s.to_ascii_lowercase().as_str() {
            "device" => Ok(Residency::Device),
            "host" => Ok(Residency::Host),
            _ => Err(CacheError::Config(format!(
                "residency `{s}`: expected `device` or `host`"
            ))),
        }
    }
}

/// The memory of the device a job runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeviceMemory {
    /// A host backend (Flex, NdArray): it computes in host memory, where the cache is mapped.
    Host,
    /// An accelerator with this many bytes.
    Bytes(u64),
    /// An accelerator whose memory is not known (wgpu reports none).
    Unknown,
}

/// The planner's decision and what it was made from; `Display` prints it for the user.
///
/// ```
/// use kiln_cache::{DeviceMemory, Residency, ResidencyPlan};
///
/// const GIB: u64 = 1 << 30;
/// let h100 = DeviceMemory::Bytes(80 * GIB);
/// let fits = ResidencyPlan::decide(2 * GIB, GIB, h100, None);
/// assert_eq!(fits.residency, Residency::Device);
/// let too_big = ResidencyPlan::decide(60 * GIB, GIB, h100, None);
/// assert_eq!(too_big.residency, Residency::Host);
/// let forced = ResidencyPlan::decide(60 * GIB, GIB, h100, Some(Residency::Device));
/// assert_eq!(forced.residency, Residency::Device);
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct ResidencyPlan {
    /// The decision.
    pub residency: Residency,
    /// Bytes the dataset takes on the device when resident.
    pub dataset_bytes: u64,
    /// Bytes the model takes on the device (parameters and working memory, as the caller
    /// estimates them).
    pub model_bytes: u64,
    /// The device's memory.
    pub device_memory: DeviceMemory,
    /// Whether the user chose the residency (`--residency`).
    pub forced: bool,
}

impl ResidencyPlan {
    /// Device residency when the dataset and the model fit in [`DEVICE_MEMORY_SHARE`] of an
    /// accelerator's memory; host residency otherwise, when the memory is unknown, and on host
    /// backends; `forced` wins.
    pub fn decide(
        dataset_bytes: u64,
        model_bytes: u64,
        device_memory: DeviceMemory,
        forced: Option<Residency>,
    ) -> Self {
        let fits = match device_memory {
            DeviceMemory::Bytes(memory) => {
                (dataset_bytes + model_bytes) as f64 <= DEVICE_MEMORY_SHARE * memory as f64
            }
            DeviceMemory::Host | DeviceMemory::Unknown => false,
        };
        let residency = forced.unwrap_or(if fits {
            Residency::Device
        } else {
            Residency::Host
        });
        ResidencyPlan {
            residency,
            dataset_bytes,
            model_bytes,
            device_memory,
            forced: forced.is_some(),
        }
    }
}

impl fmt::Display for ResidencyPlan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let needs = format!(
            "dataset {} + model {}",
            gib(self.dataset_bytes),
            gib(self.model_bytes)
        );
        let room = |memory: u64| {
            format!(
                "{:.0}% of {} device memory",
                DEVICE_MEMORY_SHARE * 100.0,
                gib(memory)
            )
        };
        write!(f, "residency: {} (", self.residency)?;
        match (self.forced, self.residency, self.device_memory) {
            (true, _, _) => write!(f, "chosen with --residency; {needs}")?,
            (false, Residency::Device, DeviceMemory::Bytes(memory)) => write!(
                f,
                "{needs} fit in {}; --residency host streams it instead",
                room(memory)
            )?,
            (false, _, DeviceMemory::Bytes(memory)) => write!(
                f,
                "{needs} exceed {}: streamed in prefetched batches",
                room(memory)
            )?,
            (false, _, DeviceMemory::Host) => write!(
                f,
                "a host backend reads the memory-mapped cache directly; {needs}: batches \
                 prepared by background threads"
            )?,
            (false, _, DeviceMemory::Unknown) => write!(
                f,
                "device memory unknown, {needs}: streamed in prefetched batches; \
                 --residency device keeps it on the device"
            )?,
        }
        write!(f, ")")
    }
}

fn gib(bytes: u64) -> String {
    format!("{:.2} GiB", bytes as f64 / f64::from(1u32 << 30))
}

impl CachedImages {
    /// Bytes this dataset takes resident on `device` in `precision`: its bytes where the device
    /// stores u8 and the pixels are 8-bit, else one `precision` value per pixel.
    pub fn resident_bytes<B: Backend>(&self, device: &B::Device, precision: Precision) -> u64 {
        let values = (self.len() * self.item_bytes() / self.stored().size_of()) as u64;
        let bytes_per_value = if self.stored() == Stored::U8 && !normalises_on_host::<B>(device) {
            1
        } else {
            precision.size_of() as u64
        };
        values * bytes_per_value
    }

    /// Plans this dataset's residency on `device` next to a model of `model_bytes`, given an
    /// accelerator's memory (`kiln_core::DeviceSpec::probe` reports it; ignored on host
    /// backends) and the user's choice.
    pub fn plan_residency<B: Backend>(
        &self,
        device: &B::Device,
        precision: Precision,
        model_bytes: u64,
        device_memory: Option<u64>,
        forced: Option<Residency>,
    ) -> ResidencyPlan {
        let memory = if is_host_backend::<B>(device) {
            DeviceMemory::Host
        } else {
            device_memory.map_or(DeviceMemory::Unknown, DeviceMemory::Bytes)
        };
        ResidencyPlan::decide(
            self.resident_bytes::<B>(device, precision),
            model_bytes,
            memory,
            forced,
        )
    }
}
