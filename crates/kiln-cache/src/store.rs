//! The on-disk format of a cache entry: a directory named by the cache key holding
//! `manifest.json` and safetensors shards of `pixels` (`[n, 3, H, W]` images, `[n, T, 3, H, W]`
//! clips, or the frames of clips of varying length one after another, `[frames, 3, H, W]`; u8,
//! or normalised f16 / f32), each with its checksum in the manifest. Entries are built in a temporary directory and renamed into place, so a reader
//! sees a whole entry or none; shards are memory-mapped.

use std::fs::File;
use std::path::Path;

use memmap2::Mmap;
use safetensors::{Dtype, SafeTensors, tensor::TensorView};
use serde::{Deserialize, Serialize};

use crate::CacheError;
use crate::preprocess::Preprocess;

/// Version of the entry format; entries of another version are rebuilt. 3: JPEGs decoded as
/// libjpeg does (their pixels changed by a level or two). 4: resized as Pillow does, bit for bit.
/// 5: JPEGs decoded by libjpeg-turbo, as in Pillow, bit for bit.
pub const FORMAT_VERSION: u32 = 5;

/// Name of the tensor each shard holds.
const PIXELS: &str = "pixels";

/// How pixels are stored.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Stored {
    /// 8-bit values after resize and crop (the default: 4× smaller than f32); rescale and
    /// normalisation happen on the device at upload.
    #[default]
    U8,
    /// Rescaled and normalised, as f16 (2 bytes a value).
    F16,
    /// Rescaled and normalised, as f32 (4 bytes a value).
    F32,
}

impl Stored {
    /// Bytes of one stored value.
    pub fn size_of(self) -> usize {
        match self {
            Stored::U8 => 1,
            Stored::F16 => 2,
            Stored::F32 => 4,
        }
    }

    fn dtype(self) -> Dtype {
        match self {
            Stored::U8 => Dtype::U8,
            Stored::F16 => Dtype::F16,
            Stored::F32 => Dtype::F32,
        }
    }
}

/// One cached item's source: an image file, or a video (a file, or a folder of frames).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CachedSource {
    /// Name (path relative to the source folder, or as given).
    pub name: String,
    /// xxh3-128 of the file's bytes (of a frame folder: of its frames' names and hashes), hex.
    pub hash: String,
    /// The clip's frames, where clips vary in length (at most the manifest's `frames`); `None`
    /// where every item has the manifest's `frames`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub frames: Option<u32>,
}

/// An image left out of the cache because it could not be read (`skip_bad`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Skipped {
    /// Name of the file.
    pub name: String,
    /// Why it could not be used.
    pub reason: String,
}

/// One shard file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShardInfo {
    /// File name inside the entry.
    pub file: String,
    /// Items (images or clips) it holds.
    pub items: usize,
    /// xxh3-128 of its pixel bytes, hex.
    pub checksum: String,
}

/// What an entry holds, written last.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Manifest {
    /// [`FORMAT_VERSION`] of the writer.
    pub format: u32,
    /// The cache key the entry is stored under.
    pub key: String,
    /// The preprocessing that produced the pixels.
    pub preprocess: Preprocess,
    /// Frames per item: 1 for images, T for clips (stored `[T, 3, H, W]`); where clips vary in
    /// length (each source names its own), the most a clip has.
    pub frames: u32,
    /// Height of every frame.
    pub height: u32,
    /// Width of every frame.
    pub width: u32,
    /// How the values are stored.
    pub stored: Stored,
    /// The items, in order.
    pub sources: Vec<CachedSource>,
    /// Sources that could not be read, when building with `skip_bad`.
    pub skipped: Vec<Skipped>,
    /// The shards, in order.
    pub shards: Vec<ShardInfo>,
}

impl Manifest {
    /// Parses and checks a `manifest.json` on its own: the format version, frame and item sizes
    /// that fit in memory arithmetic, shard files named inside the entry, and as many stored items
    /// as sources. Whatever the text, an error, never a panic.
    pub fn from_json(text: &str) -> Result<Self, CacheError> {
        Self::parse(text).map_err(CacheError::Manifest)
    }

    fn parse(text: &str) -> Result<Self, String> {
        let manifest: Manifest =
            serde_json::from_str(text).map_err(|e| format!("unreadable manifest ({e})"))?;
        if manifest.format != FORMAT_VERSION {
            return Err(format!(
                "format version {} (this kiln writes {FORMAT_VERSION})",
                manifest.format
            ));
        }
        let item_bytes = manifest
            .item_shape()
            .iter()
            .try_fold(manifest.stored.size_of(), |bytes, &d| bytes.checked_mul(d))
            .filter(|&bytes| bytes > 0)
            .ok_or_else(|| format!("impossible item shape {:?}", manifest.item_shape()))?;
        if let Some(bad) = (manifest.sources.iter())
            .find(|s| s.frames.is_some_and(|n| n == 0 || n > manifest.frames))
        {
            return Err(format!(
                "`{}` claims {} frames, the entry's clips at most {}",
                bad.name,
                bad.frames.unwrap_or(0),
                manifest.frames
            ));
        }
        let mut stored = 0usize;
        for shard in &manifest.shards {
            let plain = Path::new(&shard.file)
                .file_name()
                .is_some_and(|name| name == shard.file.as_str());
            if !plain {
                return Err(format!(
                    "shard `{}` is not a file name inside the entry",
                    shard.file
                ));
            }
            shard
                .items
                .checked_mul(item_bytes)
                .and_then(|_| stored.checked_add(shard.items))
                .map(|sum| stored = sum)
                .ok_or_else(|| format!("shard `{}` claims {} items", shard.file, shard.items))?;
        }
        if stored != manifest.sources.len() {
            return Err(format!(
                "{stored} items in shards, {} in the manifest",
                manifest.sources.len()
            ));
        }
        Ok(manifest)
    }

    /// Bytes of one stored item (of the longest, where clips vary in length).
    pub fn item_bytes(&self) -> usize {
        self.item_shape().iter().product::<usize>() * self.stored.size_of()
    }

    /// Bytes of one stored frame.
    pub fn frame_bytes(&self) -> usize {
        3 * self.height as usize * self.width as usize * self.stored.size_of()
    }

    /// Frames of item `index`.
    pub fn frames_of(&self, index: usize) -> u32 {
        self.sources[index].frames.unwrap_or(self.frames)
    }

    /// Whether clips vary in length (each source names its frames).
    pub fn varies(&self) -> bool {
        self.sources.iter().any(|s| s.frames.is_some())
    }

    /// Per shard, the frames its items hold (their sum, where clips vary in length).
    fn shard_frames(&self) -> Vec<usize> {
        let mut first = 0;
        (self.shards.iter())
            .map(|shard| {
                let items = first..first + shard.items;
                first = items.end;
                items.map(|i| self.frames_of(i) as usize).sum()
            })
            .collect()
    }

    /// Shape of one item: `[3, H, W]` for images, `[T, 3, H, W]` for clips.
    pub fn item_shape(&self) -> Vec<usize> {
        let frame = [3, self.height as usize, self.width as usize];
        if self.frames == 1 {
            frame.to_vec()
        } else {
            [&[self.frames as usize][..], &frame].concat()
        }
    }
}

/// A memory-mapped shard.
#[derive(Debug)]
pub struct Shard {
    map: Mmap,
    /// Byte range of the pixels inside the file.
    start: usize,
    end: usize,
}

impl Shard {
    /// The stored bytes, `[n, …item shape]` row-major.
    pub fn pixels(&self) -> &[u8] {
        &self.map[self.start..self.end]
    }
}

/// Why an existing entry cannot be used.
#[derive(Debug)]
pub enum Invalid {
    /// There is no entry under that key.
    Missing,
    /// The entry exists but is damaged or stale; it is rebuilt.
    Stale(String),
}

/// Opens the entry in `dir`, checking its format, key, shapes and checksums.
pub fn open_entry(dir: &Path, key: &str) -> Result<(Manifest, Vec<Shard>), Invalid> {
    let manifest_path = dir.join("manifest.json");
    let text = match std::fs::read_to_string(&manifest_path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Err(Invalid::Missing),
        Err(e) => return Err(Invalid::Stale(format!("{}: {e}", manifest_path.display()))),
    };
    let manifest = Manifest::parse(&text).map_err(Invalid::Stale)?;
    if manifest.key != key {
        return Err(Invalid::Stale(format!(
            "manifest names key {}",
            manifest.key
        )));
    }
    let frame_bytes = manifest.frame_bytes();
    let shards = (manifest.shards.iter())
        .zip(manifest.shard_frames())
        .map(|(info, frames)| {
            let shard = map_shard(&dir.join(&info.file), manifest.stored)?;
            let pixels = shard.pixels();
            if pixels.len() != frames * frame_bytes {
                return Err(format!(
                    "{} holds {} bytes, expected {} items, {frames} frames of {frame_bytes}",
                    info.file,
                    pixels.len(),
                    info.items
                ));
            }
            if kiln_io::checksum(pixels) != info.checksum {
                return Err(format!("{} does not match its checksum", info.file));
            }
            Ok(shard)
        })
        .collect::<Result<Vec<_>, String>>()
        .map_err(Invalid::Stale)?;
    Ok((manifest, shards))
}

fn map_shard(path: &Path, stored: Stored) -> Result<Shard, String> {
    let file = File::open(path).map_err(|e| format!("{}: {e}", path.display()))?;
    // SAFETY: shard files are written once under a temporary name and renamed into place; kiln
    // never modifies one afterwards, and a damaged one is detected by its checksum.
    #[allow(unsafe_code)]
    let map = unsafe { Mmap::map(&file) }.map_err(|e| format!("{}: {e}", path.display()))?;
    let (start, end) = {
        let tensors = SafeTensors::deserialize(&map)
            .map_err(|e| format!("{}: not a safetensors file ({e})", path.display()))?;
        let view = tensors
            .tensor(PIXELS)
            .map_err(|e| format!("{}: {e}", path.display()))?;
        if view.dtype() != stored.dtype() {
            return Err(format!(
                "{}: pixels are {:?}, the manifest says {stored:?}",
                path.display(),
                view.dtype()
            ));
        }
        let start = view.data().as_ptr() as usize - map.as_ptr() as usize;
        (start, start + view.data().len())
    };
    Ok(Shard { map, start, end })
}

/// Writes shard `index` of `pixels` (`items` items of the manifest's item shape and storage, or
/// where clips vary in length their frames one after another) into `dir`, synced to disk, and
/// returns its manifest line.
pub fn write_shard(
    dir: &Path,
    index: usize,
    pixels: &[u8],
    items: usize,
    manifest: &Manifest,
) -> Result<ShardInfo, CacheError> {
    let file = format!("shard-{index:05}.safetensors");
    let path = dir.join(&file);
    let shape = match manifest.varies() {
        true => vec![
            pixels.len() / manifest.frame_bytes(),
            3,
            manifest.height as usize,
            manifest.width as usize,
        ],
        false => [&[items][..], &manifest.item_shape()].concat(),
    };
    let view = TensorView::new(manifest.stored.dtype(), shape, pixels)
        .map_err(|e| CacheError::io(&path, std::io::Error::other(e)))?;
    safetensors::serialize_to_file([(PIXELS, view)], None, &path)
        .map_err(|e| CacheError::io(&path, std::io::Error::other(e)))?;
    File::open(&path)
        .and_then(|f| f.sync_all())
        .map_err(|e| CacheError::io(&path, e))?;
    Ok(ShardInfo {
        file,
        items,
        checksum: kiln_io::checksum(pixels),
    })
}

/// Writes the manifest into the staged entry, then moves the entry into place, replacing a
/// stale one there. Callers hold the entry's [`BuildLock`], so no other process is writing it;
/// one still reading a replaced entry keeps its mapping.
pub fn commit_entry(staged: kiln_io::StagedDir, manifest: &Manifest) -> Result<(), CacheError> {
    let json = serde_json::to_string_pretty(manifest)
        .map_err(|e| CacheError::Manifest(format!("the manifest cannot be written: {e}")))?;
    staged.write("manifest.json", json.as_bytes())?;
    staged.commit()?;
    Ok(())
}

/// An exclusive lock on building entry `key`, held until dropped.
pub struct BuildLock {
    file: File,
}

impl BuildLock {
    /// Waits for the lock of `key` under `root`; says so on stderr when another process holds
    /// it.
    pub fn acquire(root: &Path, key: &str) -> Result<Self, CacheError> {
        let path = root.join(format!("{key}.lock"));
        let file = File::options()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .map_err(|e| CacheError::io(&path, e))?;
        match file.try_lock() {
            Ok(()) => {}
            Err(std::fs::TryLockError::WouldBlock) => {
                log::info!("waiting for another process building {}", path.display());
                file.lock().map_err(|e| CacheError::io(&path, e))?;
            }
            Err(std::fs::TryLockError::Error(e)) => return Err(CacheError::io(&path, e)),
        }
        Ok(BuildLock { file })
    }
}

impl Drop for BuildLock {
    fn drop(&mut self) {
        let _ = self.file.unlock();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn manifest() -> serde_json::Value {
        let manifest = Manifest {
            format: FORMAT_VERSION,
            key: "k".into(),
            preprocess: Preprocess::siglip(8),
            frames: 1,
            height: 8,
            width: 8,
            stored: Stored::U8,
            sources: vec![CachedSource {
                name: "a.png".into(),
                hash: "h".into(),
                frames: None,
            }],
            skipped: vec![],
            shards: vec![ShardInfo {
                file: "shard-00000.safetensors".into(),
                items: 1,
                checksum: "c".into(),
            }],
        };
        serde_json::to_value(manifest).unwrap()
    }

    #[test]
    fn manifests_claiming_the_impossible_are_refused() {
        let parse = |value: &serde_json::Value| {
            Manifest::from_json(&value.to_string()).map_err(|e| e.to_string())
        };
        assert!(parse(&manifest()).is_ok());
        for (field, value, want) in [
            ("format", serde_json::json!(3), "format version 3"),
            ("height", serde_json::json!(0), "impossible item shape"),
        ] {
            let mut bad = manifest();
            bad[field] = value;
            let err = parse(&bad).unwrap_err();
            assert!(err.contains(want), "{field}: {err}");
        }
        let mut longer = manifest();
        longer["sources"][0]["frames"] = 2.into();
        let err = parse(&longer).unwrap_err();
        assert!(
            err.contains("`a.png` claims 2 frames, the entry's clips at most 1"),
            "{err}"
        );
        // 4e9 frames of 4e9 × 4e9 pixels: more bytes than a usize counts.
        let mut huge = manifest();
        for field in ["frames", "height", "width"] {
            huge[field] = 4_000_000_000u32.into();
        }
        assert!(parse(&huge).unwrap_err().contains("impossible item shape"));
        for (file, items, want) in [
            ("../../etc/passwd", 1u64, "not a file name inside the entry"),
            ("/etc/passwd", 1, "not a file name inside the entry"),
            ("shard", u64::MAX, "claims 18446744073709551615 items"),
            ("shard", 2, "2 items in shards, 1 in the manifest"),
        ] {
            let mut bad = manifest();
            bad["shards"][0]["file"] = file.into();
            bad["shards"][0]["items"] = items.into();
            let err = parse(&bad).unwrap_err();
            assert!(err.contains(want), "{file} {items}: {err}");
        }
    }
}
