//! One error type for programs that do not care which crate failed.

/// Any kiln error, each crate's own kept whole (match on it to branch, or print it: the message
/// is the crate's).
///
/// ```
/// use std::collections::BTreeMap;
/// use std::path::Path;
///
/// fn settings(dir: &Path) -> Result<BTreeMap<String, u64>, kiln::Error> {
///     let device: kiln::core::DeviceSpec = "cpu".parse()?;
///     device.report()?;
///     let (_, config) = kiln::core::read_config(dir)?;
///     Ok(config)
/// }
/// let err = settings(Path::new("/no/such/checkpoint")).unwrap_err();
/// assert!(matches!(err, kiln::Error::Checkpoint(_)), "{err}");
/// ```
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A device that cannot be used.
    #[error(transparent)]
    Device(#[from] crate::core::DeviceError),
    /// A precision policy that cannot be parsed or used.
    #[error(transparent)]
    Precision(#[from] crate::core::PrecisionError),
    /// A checkpoint that cannot be found, read, loaded or saved.
    #[error(transparent)]
    Checkpoint(#[from] crate::core::CheckpointError),
    /// Memory the run would need that the machine or device lacks.
    #[error(transparent)]
    Memory(#[from] crate::core::MemoryError),
    /// A file that cannot be read or written safely.
    #[error(transparent)]
    File(#[from] crate::io::FileError),
    /// From kiln-cache.
    #[error(transparent)]
    Cache(#[from] crate::cache::CacheError),
    /// From kiln-vision.
    #[error(transparent)]
    Vision(#[from] crate::vision::VisionError),
    /// From kiln-text.
    #[error(transparent)]
    Text(#[from] crate::text::TextError),
    /// From kiln-foveated.
    #[error(transparent)]
    Foveated(#[from] crate::foveated::FoveatedError),
    /// From kiln-forcefield.
    #[error(transparent)]
    ForceField(#[from] crate::forcefield::ForceFieldError),
    /// From kiln-train.
    #[error(transparent)]
    Train(#[from] crate::train::TrainError),
    /// From kiln-mc.
    #[error(transparent)]
    Mc(#[from] crate::mc::McError),
    /// From kiln-bench.
    #[error(transparent)]
    Bench(#[from] crate::bench::BenchError),
}
