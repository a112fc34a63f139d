//! Decode-once image datasets: the first use decodes, preprocesses and stores every image; every
//! later use (another pass, another epoch, another process) memory-maps the stored pixels.

use std::ops::Range;
use std::path::{Path, PathBuf};

use burn::tensor::Tensor;
use burn::tensor::backend::Backend;
use indicatif::{ProgressBar, ProgressStyle};
use kiln_precision::Precision;
use rayon::prelude::*;
use serde::Serialize;

use crate::CacheError;
use crate::decode::decode;
use crate::preprocess::Preprocess;
use crate::sources::{ImageSource, SourceFile};
use crate::store::{
    self, BuildLock, CachedSource, FORMAT_VERSION, Invalid, Manifest, Partial, Shard, Skipped,
    hash_hex,
};
use crate::upload::{normalize_on_device, to_chw};

/// Default bytes of pixels per shard file (512 MiB).
pub const DEFAULT_SHARD_BYTES: usize = 512 << 20;

/// A directory of cached datasets.
#[derive(Debug, Clone)]
pub struct ImageCache {
    root: PathBuf,
    skip_bad: bool,
    shard_bytes: usize,
}

/// How a dataset was obtained.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// The stored entry was valid and used as it is.
    Hit,
    /// No entry existed; it was built.
    Built,
    /// An entry existed but was damaged or stale (the reason); it was rebuilt.
    Rebuilt(String),
}

impl ImageCache {
    /// The user's cache directory: `$KILN_CACHE_DIR`, else `kiln` in the platform's cache
    /// directory (`~/.cache/kiln` on Linux), else `.kiln-cache`.
    pub fn default_dir() -> PathBuf {
        std::env::var_os("KILN_CACHE_DIR")
            .map(PathBuf::from)
            .or_else(|| dirs::cache_dir().map(|d| d.join("kiln")))
            .unwrap_or_else(|| PathBuf::from(".kiln-cache"))
    }

    /// A cache under `dir` (created when the first entry is built).
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        ImageCache {
            root: dir.into(),
            skip_bad: false,
            shard_bytes: DEFAULT_SHARD_BYTES,
        }
    }

    /// With `true`, an unreadable image is left out and listed in the manifest
    /// ([`CachedImages::skipped`]) instead of failing the build.
    pub fn skip_bad(mut self, skip: bool) -> Self {
        self.skip_bad = skip;
        self
    }

    /// Bytes of pixels per shard file (at least one image per shard).
    pub fn shard_bytes(mut self, bytes: usize) -> Self {
        self.shard_bytes = bytes;
        self
    }

    /// Where entries of format [`FORMAT_VERSION`] live.
    fn entries(&self) -> PathBuf {
        self.root.join(format!("images-v{FORMAT_VERSION}"))
    }

    /// The images of `source` after `preprocess`: from the cache when a valid entry exists for
    /// exactly these file contents and this preprocessing, otherwise decoded, preprocessed and
    /// stored first. A damaged entry is rebuilt with a warning, never used.
    pub fn load(
        &self,
        source: &ImageSource,
        preprocess: &Preprocess,
    ) -> Result<CachedImages, CacheError> {
        let (height, width) = preprocess.fixed_size().ok_or(CacheError::VariableSize)?;
        let files = source.files()?;
        let hashes = files
            .par_iter()
            .map(|file| {
                std::fs::read(&file.path)
                    .map(|bytes| hash_hex(&bytes))
                    .map_err(|e| CacheError::io(&file.path, e))
            })
            .collect::<Result<Vec<_>, _>>()?;
        let key = cache_key(preprocess, &files, &hashes);
        let root = self.entries();
        let dir = root.join(&key);

        let stale = match store::open_entry(&dir, &key) {
            Ok((manifest, shards)) => return self.loaded(manifest, shards, dir, Outcome::Hit),
            Err(Invalid::Missing) => None,
            Err(Invalid::Stale(reason)) => Some(reason),
        };
        std::fs::create_dir_all(&root).map_err(|e| CacheError::io(&root, e))?;
        let _lock = BuildLock::acquire(&root, &key)?;
        // Another process may have built the entry while this one waited for the lock.
        let stale = match store::open_entry(&dir, &key) {
            Ok((manifest, shards)) => return self.loaded(manifest, shards, dir, Outcome::Hit),
            Err(Invalid::Missing) => stale,
            Err(Invalid::Stale(reason)) => Some(reason),
        };
        if let Some(reason) = &stale {
            log::warn!("rebuilding cache entry {}: {reason}", dir.display());
        }
        let manifest = self.build(
            &root,
            &dir,
            &key,
            preprocess,
            &files,
            hashes,
            (height, width),
        )?;
        let (manifest, shards) = store::open_entry(&dir, &manifest.key).map_err(|e| {
            CacheError::Io(format!(
                "{}: the entry just written cannot be read: {e:?}",
                dir.display()
            ))
        })?;
        let outcome = stale.map_or(Outcome::Built, Outcome::Rebuilt);
        self.loaded(manifest, shards, dir, outcome)
    }

    /// Checks a loaded entry against `skip_bad` and wraps it.
    fn loaded(
        &self,
        manifest: Manifest,
        shards: Vec<Shard>,
        dir: PathBuf,
        outcome: Outcome,
    ) -> Result<CachedImages, CacheError> {
        if let (false, Some(bad)) = (self.skip_bad, manifest.skipped.first()) {
            return Err(CacheError::BadImage {
                path: bad.name.clone().into(),
                reason: format!(
                    "{} (recorded in the cache entry built with skip_bad)",
                    bad.reason
                ),
            });
        }
        Ok(CachedImages {
            manifest,
            shards,
            dir,
            outcome,
        })
    }

    /// Decodes and preprocesses every file in parallel, shard by shard, into a temporary entry,
    /// then moves it into place.
    #[allow(clippy::too_many_arguments)]
    fn build(
        &self,
        root: &Path,
        dir: &Path,
        key: &str,
        preprocess: &Preprocess,
        files: &[SourceFile],
        hashes: Vec<String>,
        (height, width): (u32, u32),
    ) -> Result<Manifest, CacheError> {
        let partial = Partial::new(root, key)?;
        let image_bytes = 3 * height as usize * width as usize;
        let per_shard = (self.shard_bytes / image_bytes).max(1);
        let progress = progress_bar(files.len());
        let mut manifest = Manifest {
            format: FORMAT_VERSION,
            key: key.to_string(),
            preprocess: preprocess.clone(),
            height,
            width,
            sources: Vec::new(),
            skipped: Vec::new(),
            shards: Vec::new(),
        };
        for (chunk, chunk_hashes) in files.chunks(per_shard).zip(hashes.chunks(per_shard)) {
            let decoded: Vec<Result<Vec<u8>, CacheError>> = chunk
                .par_iter()
                .map(|file| {
                    let pixels = decode(&file.path)
                        .and_then(|image| preprocess.resize_and_crop(&image))
                        .map(|image| to_chw(&image));
                    progress.inc(1);
                    pixels
                })
                .collect();
            let mut pixels = Vec::with_capacity(chunk.len() * image_bytes);
            let mut images = 0;
            for ((file, hash), result) in chunk.iter().zip(chunk_hashes).zip(decoded) {
                match result {
                    Ok(chw) => {
                        pixels.extend_from_slice(&chw);
                        images += 1;
                        manifest.sources.push(CachedSource {
                            name: file.name.clone(),
                            hash: hash.clone(),
                        });
                    }
                    Err(e @ CacheError::BadImage { .. }) if self.skip_bad => {
                        log::warn!("skipping {e}");
                        manifest.skipped.push(Skipped {
                            name: file.name.clone(),
                            reason: e.to_string(),
                        });
                    }
                    Err(e) => return Err(e),
                }
            }
            if images > 0 {
                let index = manifest.shards.len();
                let shard =
                    store::write_shard(&partial.path, index, &pixels, images, height, width)?;
                manifest.shards.push(shard);
            }
        }
        progress.finish_and_clear();
        if manifest.sources.is_empty() {
            return Err(CacheError::NoUsableImages(manifest.skipped.len()));
        }
        store::commit_entry(&partial.path, dir, &manifest)?;
        Ok(manifest)
    }
}

/// A progress bar on stderr for builds of more than a handful of images (hidden when stderr is
/// not a terminal).
fn progress_bar(len: usize) -> ProgressBar {
    if len < 64 {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::new(len as u64);
    bar.set_style(
        ProgressStyle::with_template("caching images {bar:40} {pos}/{len} [{elapsed} < {eta}]")
            .expect("a valid template"),
    );
    bar
}

/// The cache key: a hash of the format version, the preprocessing, and every file's name and
/// content hash in order.
fn cache_key(preprocess: &Preprocess, files: &[SourceFile], hashes: &[String]) -> String {
    #[derive(Serialize)]
    struct Key<'a> {
        format: u32,
        preprocess: &'a Preprocess,
        files: Vec<(&'a str, &'a str)>,
    }
    let key = Key {
        format: FORMAT_VERSION,
        preprocess,
        files: files
            .iter()
            .zip(hashes)
            .map(|(f, h)| (f.name.as_str(), h.as_str()))
            .collect(),
    };
    hash_hex(&serde_json::to_vec(&key).expect("keys serialise"))
}

/// A cached dataset: `len()` images of `3 × height × width` 8-bit RGB, memory-mapped.
#[derive(Debug)]
pub struct CachedImages {
    manifest: Manifest,
    shards: Vec<Shard>,
    dir: PathBuf,
    outcome: Outcome,
}

impl CachedImages {
    /// Number of images.
    pub fn len(&self) -> usize {
        self.manifest.sources.len()
    }

    /// Whether there are no images (never true: a build without images is an error).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// `(height, width)` of every image.
    pub fn size(&self) -> (u32, u32) {
        (self.manifest.height, self.manifest.width)
    }

    /// Whether this load hit the cache, built it, or rebuilt a damaged entry.
    pub fn outcome(&self) -> &Outcome {
        &self.outcome
    }

    /// The entry's directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The preprocessing the pixels went through.
    pub fn preprocess(&self) -> &Preprocess {
        &self.manifest.preprocess
    }

    /// Names of the cached images, in order.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.manifest.sources.iter().map(|s| s.name.as_str())
    }

    /// Files left out because they could not be read (only with `skip_bad`).
    pub fn skipped(&self) -> &[Skipped] {
        &self.manifest.skipped
    }

    fn image_bytes(&self) -> usize {
        3 * self.manifest.height as usize * self.manifest.width as usize
    }

    /// Image `index` as `3 × H × W` bytes.
    ///
    /// # Panics
    /// If `index >= len()`.
    pub fn image(&self, index: usize) -> &[u8] {
        let bytes = self.image_bytes();
        let mut first = 0;
        for (shard, info) in self.shards.iter().zip(&self.manifest.shards) {
            if index < first + info.images {
                let offset = (index - first) * bytes;
                return &shard.pixels()[offset..offset + bytes];
            }
            first += info.images;
        }
        panic!("image {index} of {}", self.len());
    }

    /// The bytes of images `range`, `[n, 3, H, W]`, contiguous across shards.
    fn gather(&self, range: Range<usize>) -> Vec<u8> {
        let mut out = Vec::with_capacity(range.len() * self.image_bytes());
        for index in range {
            out.extend_from_slice(self.image(index));
        }
        out
    }

    /// Uploads images `range` to `device` as a `[n, 3, H, W]` tensor in `precision`, rescaled and
    /// normalised on the device (see [`normalize_on_device`]).
    pub fn upload<B: Backend>(
        &self,
        range: Range<usize>,
        device: &B::Device,
        precision: Precision,
    ) -> Result<Tensor<B, 4>, CacheError> {
        if range.end > self.len() || range.is_empty() {
            return Err(CacheError::Range {
                range,
                len: self.len(),
            });
        }
        let (height, width) = self.size();
        let shape = [range.len(), 3, height as usize, width as usize];
        Ok(normalize_on_device(
            self.preprocess(),
            self.gather(range),
            shape,
            device,
            precision,
        ))
    }
}
