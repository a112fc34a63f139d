//! Decode-once datasets of images or video clips: the first use decodes, preprocesses and stores
//! every item; every later use (another pass, another epoch, another process) memory-maps the
//! stored pixels.

use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use burn::tensor::Tensor;
use burn::tensor::backend::Backend;
use indicatif::{ProgressBar, ProgressStyle};
use kiln_core::Precision;
use rayon::prelude::*;
use serde::Serialize;

use crate::CacheError;
use crate::decode::{DEFAULT_MAX_PIXELS, decode};
use crate::preprocess::Preprocess;
use crate::sources::ImageSource;
use crate::store::{
    self, BuildLock, CachedSource, FORMAT_VERSION, Invalid, Manifest, Shard, Skipped, Stored,
};
use crate::upload::{HostBatch, normalise_bytes, normalises_on_host, to_chw};
use crate::video::{ClipSpec, Sampling, ShortVideos, VideoSource};

/// Default bytes of pixels per shard file (512 MiB).
pub const DEFAULT_SHARD_BYTES: usize = 512 << 20;

/// A directory of cached datasets: images ([`ImageCache::load`]) and video clips
/// ([`ImageCache::load_clips`]).
#[derive(Debug, Clone)]
pub struct ImageCache {
    root: PathBuf,
    skip_bad: bool,
    shard_bytes: usize,
    stored: Stored,
    max_pixels: u64,
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
            stored: Stored::U8,
            max_pixels: DEFAULT_MAX_PIXELS,
        }
    }

    /// How pixels are stored: 8-bit (the default), or already normalised as f16 or f32 (2× or
    /// 4× the disk and memory, no per-batch normalisation).
    pub fn stored(mut self, stored: Stored) -> Self {
        self.stored = stored;
        self
    }

    /// With `true`, an unreadable image or video is left out and listed in the manifest
    /// ([`CachedImages::skipped`]) instead of failing the build.
    pub fn skip_bad(mut self, skip: bool) -> Self {
        self.skip_bad = skip;
        self
    }

    /// Bytes of pixels per shard file (at least one item per shard).
    pub fn shard_bytes(mut self, bytes: usize) -> Self {
        self.shard_bytes = bytes;
        self
    }

    /// The most pixels an image (or video frame) may declare before it is decoded (default
    /// [`DEFAULT_MAX_PIXELS`], Pillow's): larger ones are bad images, said before any
    /// gigabytes are allocated.
    pub fn max_image_pixels(mut self, pixels: u64) -> Self {
        self.max_pixels = pixels;
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
        let size = preprocess.fixed_size().ok_or(CacheError::VariableSize)?;
        let files = source.files()?;
        let hashes = files
            .par_iter()
            .map(|file| {
                std::fs::read(&file.path)
                    .map(|bytes| kiln_io::checksum(&bytes))
                    .map_err(|e| CacheError::io(&file.path, e))
            })
            .collect::<Result<Vec<_>, _>>()?;
        let sources = names_and_hashes(files.iter().map(|f| f.name.clone()), hashes);
        let one_frame = ClipSpec::new(1, preprocess.clone());
        self.load_entry("images", &one_frame, size, sources, |i| {
            let image = decode(&files[i].path, self.max_pixels)?;
            Ok(to_chw(&preprocess.resize_and_crop(&image)?))
        })
    }

    /// The clips of `source`'s videos: the frames `spec` samples from each video (`spec.frames`
    /// uniformly, or one a second up to `spec.frames`: [`Sampling`]), preprocessed, stored as
    /// `[T, 3, H, W]` per video. Cached, validated and rebuilt as [`ImageCache::load`] does; a
    /// video's content is its file's bytes, or every frame file's name and bytes.
    pub fn load_clips(
        &self,
        source: &VideoSource,
        spec: &ClipSpec,
    ) -> Result<CachedImages, CacheError> {
        if spec.frames == 0 {
            return Err(CacheError::Config(
                "a clip needs at least one frame (ClipSpec::frames is 0)".into(),
            ));
        }
        let size = spec
            .preprocess
            .fixed_size()
            .ok_or(CacheError::VariableSize)?;
        let videos = source.videos()?;
        let hashes = videos
            .par_iter()
            .map(|video| video.hash())
            .collect::<Result<Vec<_>, _>>()?;
        let sources = names_and_hashes(videos.iter().map(|v| v.source.name.clone()), hashes);
        self.load_entry("clips", spec, size, sources, |i| {
            videos[i].clip(spec, self.max_pixels)
        })
    }

    /// The entry of `sources` (in order) as `spec` makes items of them (frames of `height ×
    /// width`): opened when valid, else built with `produce(i)`, the 8-bit `[T, 3, H, W]` pixels
    /// of item `i` (T = `spec.frames`, or at most that where clips vary in length).
    fn load_entry(
        &self,
        what: &str,
        spec: &ClipSpec,
        (height, width): (u32, u32),
        sources: Vec<CachedSource>,
        produce: impl Fn(usize) -> Result<Vec<u8>, CacheError> + Sync,
    ) -> Result<CachedImages, CacheError> {
        let key = cache_key(spec, self.stored, &sources);
        let preprocess = &spec.preprocess;
        let frames = spec.frames;
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
        let manifest = Manifest {
            format: FORMAT_VERSION,
            key,
            preprocess: preprocess.clone(),
            frames,
            height,
            width,
            stored: self.stored,
            sources,
            skipped: Vec::new(),
            shards: Vec::new(),
        };
        let manifest = self.build(what, &dir, manifest, spec.sampling, produce)?;
        let (manifest, shards) = store::open_entry(&dir, &manifest.key).map_err(|e| {
            CacheError::Manifest(format!(
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
            entry: Arc::new(Entry {
                spans: spans(&manifest),
                manifest,
                shards,
                dir,
            }),
            outcome,
        })
    }

    /// Produces every item of `pending` (its `sources`, no shards yet) in parallel, shard by
    /// shard, into a temporary entry, then moves it into place. Clips sampled one a second
    /// record their frame counts.
    fn build(
        &self,
        what: &str,
        dir: &Path,
        pending: Manifest,
        sampling: Sampling,
        produce: impl Fn(usize) -> Result<Vec<u8>, CacheError> + Sync,
    ) -> Result<Manifest, CacheError> {
        let staged = kiln_io::StagedDir::new(dir)?;
        let item_bytes = pending.item_bytes();
        let per_shard = (self.shard_bytes / item_bytes).max(1);
        let frame_bytes = 3 * pending.height as usize * pending.width as usize;
        let frame_shape = |bytes: usize| {
            let [height, width] = [pending.height as usize, pending.width as usize];
            [bytes / frame_bytes, 3, height, width]
        };
        let affine = pending.preprocess.affine();
        let stored = pending.stored;
        let progress = progress_bar(what, pending.sources.len());
        let mut manifest = Manifest {
            sources: Vec::new(),
            ..pending.clone()
        };
        let indices: Vec<usize> = (0..pending.sources.len()).collect();
        for chunk in indices.chunks(per_shard) {
            let produced: Vec<Result<(usize, Vec<u8>), CacheError>> = chunk
                .par_iter()
                .map(|&i| {
                    let pixels = produce(i).map(|bytes| {
                        let frames = bytes.len() / frame_bytes;
                        (
                            frames,
                            encode(stored, affine, frame_shape(bytes.len()), bytes),
                        )
                    });
                    progress.inc(1);
                    pixels
                })
                .collect();
            let mut pixels = Vec::with_capacity(chunk.len() * item_bytes);
            let mut items = 0;
            for (&i, result) in chunk.iter().zip(produced) {
                let source = &pending.sources[i];
                match result {
                    Ok((frames, bytes)) => {
                        pixels.extend_from_slice(&bytes);
                        items += 1;
                        manifest.sources.push(CachedSource {
                            frames: (sampling == Sampling::PerSecond).then_some(frames as u32),
                            ..source.clone()
                        });
                    }
                    Err(e @ CacheError::BadImage { .. }) if self.skip_bad => {
                        log::warn!("skipping {e}");
                        manifest.skipped.push(Skipped {
                            name: source.name.clone(),
                            reason: e.to_string(),
                        });
                    }
                    Err(e) => return Err(e),
                }
            }
            if items > 0 {
                let index = manifest.shards.len();
                let shard = store::write_shard(staged.path(), index, &pixels, items, &manifest)?;
                manifest.shards.push(shard);
            }
        }
        progress.finish_and_clear();
        if manifest.sources.is_empty() {
            return Err(CacheError::NoUsableImages(manifest.skipped.len()));
        }
        store::commit_entry(staged, &manifest)?;
        Ok(manifest)
    }
}

/// An item's 8-bit pixels in the stored form: as they are, or normalised to f16 / f32 bytes.
fn encode(
    stored: Stored,
    affine: ([f32; 3], [f32; 3]),
    shape: [usize; 4],
    bytes: Vec<u8>,
) -> Vec<u8> {
    match stored {
        Stored::U8 => bytes,
        Stored::F16 => normalise_bytes(affine, &bytes, shape)
            .into_iter()
            .flat_map(|v| half::f16::from_f32(v).to_le_bytes())
            .collect(),
        Stored::F32 => normalise_bytes(affine, &bytes, shape)
            .into_iter()
            .flat_map(f32::to_le_bytes)
            .collect(),
    }
}

fn names_and_hashes(names: impl Iterator<Item = String>, hashes: Vec<String>) -> Vec<CachedSource> {
    names
        .zip(hashes)
        .map(|(name, hash)| CachedSource {
            name,
            hash,
            frames: None,
        })
        .collect()
}

/// A progress bar on stderr for builds of more than a handful of images (hidden when stderr is
/// not a terminal).
fn progress_bar(what: &str, len: usize) -> ProgressBar {
    if len < 64 {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::new(len as u64);
    bar.set_style(
        ProgressStyle::with_template(&format!(
            "caching {what} {{bar:40}} {{pos}}/{{len}} [{{elapsed}} < {{eta}}]"
        ))
        .expect("a valid template"),
    );
    bar
}

/// The cache key: a hash of the format version, the preprocessing, the frames per item and how
/// they are sampled, the storage, and every source's name and content hash in order.
fn cache_key(spec: &ClipSpec, stored: Stored, sources: &[CachedSource]) -> String {
    #[derive(Serialize)]
    struct Key<'a> {
        format: u32,
        preprocess: &'a Preprocess,
        frames: u32,
        // Refusing short videos skips some that repeating keeps; left out when repeating, so
        // the entries built before the setting existed keep their keys.
        #[serde(skip_serializing_if = "repeats")]
        short_videos: ShortVideos,
        // Left out when uniform, for the same reason.
        #[serde(skip_serializing_if = "uniform")]
        sampling: Sampling,
        stored: Stored,
        sources: &'a [CachedSource],
    }
    fn repeats(short_videos: &ShortVideos) -> bool {
        *short_videos == ShortVideos::Repeat
    }
    fn uniform(sampling: &Sampling) -> bool {
        *sampling == Sampling::Uniform
    }
    let key = Key {
        format: FORMAT_VERSION,
        preprocess: &spec.preprocess,
        frames: spec.frames,
        short_videos: spec.short_videos,
        sampling: spec.sampling,
        stored,
        sources,
    };
    kiln_io::checksum(&serde_json::to_vec(&key).expect("keys serialise"))
}

/// A cached dataset, memory-mapped: `len()` items, each an image (`[3, H, W]`) or a clip of
/// `frames()` frames (`[T, 3, H, W]`; where clips vary in length, `frames_of(i)`). Cloning is
/// cheap (the mapping is shared), so background threads can read it.
#[derive(Debug, Clone)]
pub struct CachedImages {
    entry: Arc<Entry>,
    outcome: Outcome,
}

#[derive(Debug)]
struct Entry {
    manifest: Manifest,
    shards: Vec<Shard>,
    /// Where each item's bytes are.
    spans: Vec<Span>,
    dir: PathBuf,
}

/// Where an item's bytes are: which shard, from which byte, how many; and its first frame's row
/// among all the dataset's frames.
#[derive(Debug, Clone, Copy)]
struct Span {
    shard: usize,
    start: usize,
    bytes: usize,
    frame: usize,
}

/// The span of every item of a valid entry (its shards' sizes checked against the manifest).
fn spans(manifest: &Manifest) -> Vec<Span> {
    let frame_bytes = manifest.frame_bytes();
    let mut spans = Vec::with_capacity(manifest.sources.len());
    let mut frame = 0;
    for (shard, info) in manifest.shards.iter().enumerate() {
        let mut start = 0;
        for _ in 0..info.items {
            let frames = manifest.frames_of(spans.len()) as usize;
            let bytes = frames * frame_bytes;
            spans.push(Span {
                shard,
                start,
                bytes,
                frame,
            });
            start += bytes;
            frame += frames;
        }
    }
    spans
}

impl CachedImages {
    fn manifest(&self) -> &Manifest {
        &self.entry.manifest
    }

    /// Number of items (images, or clips).
    pub fn len(&self) -> usize {
        self.manifest().sources.len()
    }

    /// Whether there are no items (never true: a build without items is an error).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// `(height, width)` of every frame.
    pub fn size(&self) -> (u32, u32) {
        (self.manifest().height, self.manifest().width)
    }

    /// Frames per item: 1 for images, T for clips; where clips vary in length, the most a clip
    /// may have ([`CachedImages::frames_of`] says each one's).
    pub fn frames(&self) -> u32 {
        self.manifest().frames
    }

    /// Frames of item `index`.
    ///
    /// # Panics
    /// If `index >= len()`.
    pub fn frames_of(&self, index: usize) -> u32 {
        self.manifest().frames_of(index)
    }

    /// Whether clips vary in length (sampled one a second: [`crate::Sampling::PerSecond`]).
    pub fn varies(&self) -> bool {
        self.manifest().varies()
    }

    /// How the pixels are stored.
    pub fn stored(&self) -> Stored {
        self.manifest().stored
    }

    /// Whether this load hit the cache, built it, or rebuilt a damaged entry.
    pub fn outcome(&self) -> &Outcome {
        &self.outcome
    }

    /// The entry's directory.
    pub fn dir(&self) -> &Path {
        &self.entry.dir
    }

    /// The preprocessing the pixels went through.
    pub fn preprocess(&self) -> &Preprocess {
        &self.manifest().preprocess
    }

    /// Names of the cached items (image files, or videos), in order.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.manifest().sources.iter().map(|s| s.name.as_str())
    }

    /// Sources left out because they could not be read (only with `skip_bad`).
    pub fn skipped(&self) -> &[Skipped] {
        &self.manifest().skipped
    }

    /// Bytes of one stored item (of the longest possible clip, where clips vary in length).
    pub fn item_bytes(&self) -> usize {
        self.manifest().item_bytes()
    }

    /// The stored bytes of item `index`: `[3, H, W]` (an image) or `[T, 3, H, W]` (a clip) of
    /// u8, or of little-endian f16 / f32 when stored normalised.
    ///
    /// # Panics
    /// If `index >= len()`.
    pub fn item(&self, index: usize) -> &[u8] {
        let span = self.entry.spans[index];
        &self.entry.shards[span.shard].pixels()[span.start..span.start + span.bytes]
    }

    /// The rows of items `indices`' frames in `[Σ frames, 3, H, W]` of the whole dataset.
    pub(crate) fn frame_rows(&self, indices: &[usize]) -> Vec<i64> {
        (indices.iter())
            .flat_map(|&i| {
                let first = self.entry.spans[i].frame;
                (first..first + self.frames_of(i) as usize).map(|row| row as i64)
            })
            .collect()
    }

    /// Checks that every index is an item.
    fn check(&self, indices: &[usize]) -> Result<(), CacheError> {
        match indices.iter().find(|&&i| i >= self.len()) {
            Some(&i) => Err(CacheError::Range {
                range: i..i + 1,
                len: self.len(),
            }),
            None if indices.is_empty() => Err(CacheError::Range {
                range: 0..0,
                len: self.len(),
            }),
            None => Ok(()),
        }
    }

    /// The frames of `indices` (checked) ready on the host for a device that normalises on the
    /// host (`on_host`) or not, as `[Σ frames, 3, H, W]` (`[n·T, 3, H, W]` for clips of T).
    pub(crate) fn host_batch(&self, indices: &[usize], on_host: bool) -> HostBatch {
        let mut bytes = Vec::with_capacity(indices.len() * self.item_bytes());
        for &index in indices {
            bytes.extend_from_slice(self.item(index));
        }
        let (height, width) = self.size();
        let frames: usize = indices.iter().map(|&i| self.frames_of(i) as usize).sum();
        let shape = [frames, 3, height as usize, width as usize];
        HostBatch::prepare(
            self.preprocess().affine(),
            self.stored(),
            bytes,
            shape,
            on_host,
        )
    }

    /// The frames of items `indices`, in that order, on `device` as a `[Σ frames, 3, H, W]`
    /// tensor (`[n·T, 3, H, W]` for clips of T) in
    /// `precision`, rescaled and normalised (on the device where it stores u8; see
    /// [`crate::normalize_on_device`]).
    pub fn upload_indices<B: Backend>(
        &self,
        indices: &[usize],
        device: &B::Device,
        precision: Precision,
    ) -> Result<Tensor<B, 4>, CacheError> {
        self.check(indices)?;
        let batch = self.host_batch(indices, normalises_on_host::<B>(device));
        Ok(batch.upload(self.preprocess().affine(), device, precision))
    }

    /// Items `range` on `device`: images as `[n, 3, H, W]`, clips as their frames
    /// `[n·T, 3, H, W]` (what a per-frame encoder takes), in `precision`, normalised.
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
        self.upload_indices(&range.collect::<Vec<_>>(), device, precision)
    }

    /// Clips `range` on `device` as `[n, T, 3, H, W]`, in `precision`, normalised. Clips of
    /// varying length have no such shape: [`CachedImages::upload`] gives their frames.
    pub fn upload_clips<B: Backend>(
        &self,
        range: Range<usize>,
        device: &B::Device,
        precision: Precision,
    ) -> Result<Tensor<B, 5>, CacheError> {
        if self.varies() {
            return Err(CacheError::Config(
                "these clips vary in length (sampled one a second): upload their frames \
                 (CachedImages::upload) and frames_of(i) says which are whose"
                    .into(),
            ));
        }
        let clips = range.len();
        let frames = self.upload(range, device, precision)?;
        let [_, channels, height, width] = frames.dims();
        Ok(frames.reshape([clips, self.frames() as usize, channels, height, width]))
    }
}
