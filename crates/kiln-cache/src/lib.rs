//! # kiln-cache
//!
//! Decode and preprocess once, reuse across every pass and epoch. The workloads kiln starts from
//! wasted their accelerators re-reading images: 640 Monte-Carlo passes re-opened the same 500
//! PNGs through PIL with the GPU near idle. Here the first use of a dataset decodes, resizes and
//! crops every image (in parallel, as transformers' image processors do) and stores the result as
//! 8-bit `[N, 3, H, W]` shards; every later use memory-maps them, and a batch is normalised on the
//! device when it is uploaded.
//!
//! ```no_run
//! use burn::backend::Flex;
//! use kiln_cache::{ImageCache, ImageSource, Preprocess};
//! use kiln_core::Precision;
//!
//! let preprocess = Preprocess::from_hf_config("clip-vit-base-patch32/preprocessor_config.json")?;
//! let cache = ImageCache::new(ImageCache::default_dir());
//! let images = cache.load(&ImageSource::Folder("images/".into()), &preprocess)?;
//! println!("{} images ({:?})", images.len(), images.outcome());
//! let batch = images.upload::<Flex>(0..images.len().min(32), &Default::default(), Precision::F32)?;
//! # Ok::<(), kiln_cache::CacheError>(())
//! ```
//!
//! An entry is keyed by a hash of the format version, the preprocessing and every source file's
//! name and content: a changed image, config or format builds a new entry. A damaged entry
//! (truncated shard, checksum mismatch, unreadable manifest) is rebuilt with a warning, never
//! used. Processes building the same entry take turns through a lock file.

mod animation;
mod decode;
mod feed;
mod images;
mod jpeg;
#[cfg(feature = "video")]
mod mp4;
mod preprocess;
mod resample;
mod residency;
mod sources;
mod store;
mod upload;
mod video;

use std::ops::Range;
use std::path::{Path, PathBuf};

pub use decode::{DEFAULT_MAX_PIXELS, IMAGE_EXTENSIONS, decode, to_rgb8};
pub use feed::{Batch, Batches, DeviceImages};
pub use images::{CachedImages, DEFAULT_SHARD_BYTES, ImageCache, Outcome};
/// The order of items and the prefetching threads now live in kiln-core; kept here so
/// existing paths work.
pub use kiln_core::{Order, Prefetch};
pub use preprocess::{
    CLIP_MEAN, CLIP_STD, Crop, IMAGENET_MEAN, IMAGENET_STD, Normalize, Preprocess, Resample, Resize,
};
pub use residency::{DEVICE_MEMORY_SHARE, DeviceMemory, Residency, ResidencyPlan};
pub use sources::{ImageSource, SourceFile};
pub use store::{CachedSource, FORMAT_VERSION, Manifest, ShardInfo, Skipped, Stored};
pub use upload::{PreparedPixels, normalize_on_device, to_chw};
pub use video::{
    ClipSpec, MP4_EXTENSIONS, Sampling, ShortVideos, VideoSource, per_second_frames, sample_frames,
};

/// Why images could not be cached or read.
#[derive(Debug, thiserror::Error)]
pub enum CacheError {
    /// A file or directory could not be read or written (which, and what the system said).
    #[error(transparent)]
    File(#[from] kiln_io::FileError),
    /// An image or video file could not be decoded.
    #[error("{path}: {reason}")]
    BadImage {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// A processor config kiln cannot use.
    #[error("{0}")]
    Config(String),
    /// A cache's `manifest.json` that cannot be used (unreadable, another format version,
    /// impossible sizes).
    #[error("{0}")]
    Manifest(String),
    /// The preprocessing gives images of different sizes.
    #[error(
        "the preprocessing gives each image its own size (a shortest-edge resize without a crop): add a centre crop or an exact resize to cache images as one tensor"
    )]
    VariableSize,
    /// A folder without images.
    #[error("no images ({extensions}) under {}", dir.display())]
    NoImages {
        /// The folder.
        dir: PathBuf,
        /// The extensions looked for.
        extensions: String,
    },
    /// Every image was unreadable.
    #[error("none of the images could be read ({0} skipped)")]
    NoUsableImages(usize),
    /// Items asked for beyond the dataset.
    #[error("items {range:?} asked for, the dataset has {len}")]
    Range {
        /// The range asked for.
        range: Range<usize>,
        /// Images in the dataset.
        len: usize,
    },
}

impl CacheError {
    /// An I/O error on `path`.
    pub(crate) fn io(path: &Path, e: std::io::Error) -> Self {
        CacheError::File(kiln_io::FileError::io(path, e))
    }
}
