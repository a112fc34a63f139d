//! Video clips, decoded once: T frames sampled uniformly from each video (or one a second, up to
//! T, as fVLM samples them), each preprocessed like an image, stored as 8-bit `[T, 3, H, W]` (the
//! reference run's `[8, 3, 256, 256]` is 1.5 MB a video). Decoding H.264 every batch kept that run's GPU 2% busy; pre-decoded frames made it
//! 3.5× faster.
//!
//! A video is a folder of frame images (sorted by name), a GIF, or, with the `video` feature, an
//! MP4 holding H.264 (decoded by OpenH264, built from source: no system FFmpeg). A still image
//! (PNG, JPEG, WebP, BMP) is a video of one frame, as fVLM's image samples are.

use std::path::{Path, PathBuf};

use image::RgbImage;
use serde::{Deserialize, Serialize};

use crate::CacheError;
use crate::decode::{IMAGE_EXTENSIONS, decode};
use crate::preprocess::Preprocess;
use crate::sources::{SourceFile, walk};
use crate::upload::to_chw;

/// File extensions of MP4 containers (read with the `video` feature).
pub const MP4_EXTENSIONS: [&str; 3] = ["mp4", "m4v", "mov"];

/// How clips are made from videos: `frames` sampled uniformly (or one a second, at most
/// `frames`), each preprocessed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ClipSpec {
    /// Frames per clip (T); sampled one a second, the most a clip takes.
    pub frames: u32,
    /// What happens to each frame; it must give every frame one size (an exact resize or a
    /// crop).
    pub preprocess: Preprocess,
    /// What a video with fewer than `frames` frames gives.
    #[serde(default)]
    pub short_videos: ShortVideos,
    /// Which frames a clip takes.
    #[serde(default)]
    pub sampling: Sampling,
}

/// Which frames of a video a clip takes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum Sampling {
    /// `frames` frames, the centre of each of `frames` equal segments ([`sample_frames`]): every
    /// clip has T frames.
    #[default]
    Uniform,
    /// One frame a second from the first, at most `frames` ([`per_second_frames`]): fVLM's
    /// sampling (`data.py`), so a clip has as many frames as its video has seconds, up to T.
    /// A folder of frame images has no frame rate: its images are taken as one a second
    /// already, as fVLM's shards store them.
    PerSecond,
}

/// What a video with fewer frames than a clip takes gives.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum ShortVideos {
    /// A clip that repeats some of its frames ([`sample_frames`]).
    #[default]
    Repeat,
    /// No clip: the video is refused as bad, naming its frame count (skipped, and listed, with
    /// [`ImageCache::skip_bad`](crate::ImageCache::skip_bad)).
    Refuse,
}

impl ClipSpec {
    /// `frames` frames per clip, each through `preprocess`; short videos repeat frames.
    pub fn new(frames: u32, preprocess: Preprocess) -> Self {
        ClipSpec {
            frames,
            preprocess,
            short_videos: ShortVideos::Repeat,
            sampling: Sampling::Uniform,
        }
    }

    /// One frame a second, at most `max_frames` per clip, each through `preprocess`: fVLM's
    /// clips (`max_frames` 64 there). A video of any length gives a clip.
    pub fn per_second(max_frames: u32, preprocess: Preprocess) -> Self {
        ClipSpec {
            sampling: Sampling::PerSecond,
            ..ClipSpec::new(max_frames, preprocess)
        }
    }

    /// The same clips, but a video shorter than a clip is refused instead of repeating frames
    /// (for models that need T distinct frames).
    pub fn refusing_short_videos(mut self) -> Self {
        self.short_videos = ShortVideos::Refuse;
        self
    }

    /// Which frames of a video of `count` frames (`fps` a second, where it says) the clip takes,
    /// or why it takes none.
    pub(crate) fn sampled(&self, count: usize, fps: Option<f64>) -> Result<Vec<usize>, String> {
        if self.sampling == Sampling::PerSecond {
            return Ok(per_second_frames(count, fps, self.frames));
        }
        if self.short_videos == ShortVideos::Refuse && count < self.frames as usize {
            return Err(format!(
                "{count} frames, fewer than the {} a clip takes",
                self.frames
            ));
        }
        Ok(sample_frames(count, self.frames))
    }
}

/// Which frames of `count` a clip of `frames` takes: the centre of each of `frames` equal
/// segments (TSN's uniform sampling), so one frame is the middle one and a short video repeats
/// frames rather than failing.
///
/// ```
/// assert_eq!(kiln_cache::sample_frames(100, 4), [12, 37, 62, 87]);
/// assert_eq!(kiln_cache::sample_frames(3, 5), [0, 0, 1, 2, 2]);
/// ```
pub fn sample_frames(count: usize, frames: u32) -> Vec<usize> {
    let frames = frames as usize;
    (0..frames)
        .map(|i| (2 * i + 1) * count / (2 * frames))
        .collect()
}

/// Which frames of `count` (`fps` a second; `None` for frames already one a second) a clip
/// sampled one a second takes: every ⌊fps⌋-th from the first, at most `max_frames`, as fVLM's
/// decord loader does (`range(0, total, max(1, int(fps)))[:64]`).
///
/// ```
/// use kiln_cache::per_second_frames;
/// assert_eq!(per_second_frames(100, Some(24.0), 64), [0, 24, 48, 72, 96]);
/// assert_eq!(per_second_frames(10, Some(29.97), 64), [0]);
/// assert_eq!(per_second_frames(5, None, 3), [0, 1, 2]);
/// ```
pub fn per_second_frames(count: usize, fps: Option<f64>, max_frames: u32) -> Vec<usize> {
    // `as` saturates: a NaN or negative rate steps by one frame, as int() ≤ 0 does there.
    let step = fps.map_or(1, |fps| (fps as usize).max(1));
    (0..count).step_by(step).take(max_frames as usize).collect()
}

/// The videos of a dataset, in the order they are cached.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum VideoSource {
    /// Every video directly below a folder, sorted by name: sub-folders of frame images, GIFs,
    /// (with the `video` feature) MP4 files, and still images (one frame each).
    Folder(PathBuf),
    /// These videos (frame folders or files), in this order.
    Videos(Vec<PathBuf>),
}

/// How one video is stored.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Container {
    /// A folder of frame images, in name order.
    Frames(Vec<PathBuf>),
    /// A still image: one frame.
    Still,
    /// An animated GIF.
    Gif,
    /// An MP4 with an H.264 track.
    #[cfg(feature = "video")]
    Mp4,
}

/// One video and its name in the cache.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Video {
    pub source: SourceFile,
    container: Container,
}

impl VideoSource {
    /// The videos, in cache order.
    pub(crate) fn videos(&self) -> Result<Vec<Video>, CacheError> {
        match self {
            VideoSource::Videos(paths) => paths
                .iter()
                .map(|path| video(path, path.to_string_lossy().into_owned()))
                .collect(),
            VideoSource::Folder(root) => {
                let entries = std::fs::read_dir(root).map_err(|e| CacheError::io(root, e))?;
                let mut paths = entries
                    .map(|entry| entry.map(|e| e.path()))
                    .collect::<Result<Vec<_>, _>>()
                    .map_err(|e| CacheError::io(root, e))?;
                paths.sort();
                let videos: Vec<Video> = paths
                    .iter()
                    .filter(|path| path.is_dir() || video_extension(path).is_some())
                    .map(|path| {
                        let name = path.strip_prefix(root).unwrap_or(path);
                        video(path, name.to_string_lossy().into_owned())
                    })
                    .collect::<Result<_, _>>()?;
                if videos.is_empty() {
                    return Err(CacheError::NoImages {
                        dir: root.clone(),
                        extensions: format!(
                            "frame folders, gif, {}, still images",
                            MP4_EXTENSIONS.join(", ")
                        ),
                    });
                }
                Ok(videos)
            }
        }
    }
}

/// The lower-case extension of a video file kiln reads (a still image's too).
fn video_extension(path: &Path) -> Option<String> {
    let extension = path.extension()?.to_str()?.to_ascii_lowercase();
    let known = IMAGE_EXTENSIONS.contains(&extension.as_str())
        || MP4_EXTENSIONS.contains(&extension.as_str());
    known.then_some(extension)
}

fn video(path: &Path, name: String) -> Result<Video, CacheError> {
    let container = if path.is_dir() {
        let mut frames = Vec::new();
        walk(path, &mut frames)?;
        frames.sort();
        Container::Frames(frames)
    } else {
        match video_extension(path).as_deref() {
            Some("gif") => Container::Gif,
            Some(still) if IMAGE_EXTENSIONS.contains(&still) => Container::Still,
            #[cfg(feature = "video")]
            Some(_) => Container::Mp4,
            #[cfg(not(feature = "video"))]
            Some(_) => {
                return Err(CacheError::Config(format!(
                    "{}: MP4 video needs kiln-cache's `video` feature (kiln's `video` feature); \
                     or extract its frames into a folder",
                    path.display()
                )));
            }
            None => {
                return Err(CacheError::Config(format!(
                    "{}: not a video kiln reads (a folder of frames, a GIF, an MP4 or an image)",
                    path.display()
                )));
            }
        }
    };
    Ok(Video {
        source: SourceFile {
            path: path.to_path_buf(),
            name,
        },
        container,
    })
}

impl Video {
    /// xxh3-128 of the video's content: the file's bytes, or every frame's name and bytes.
    pub(crate) fn hash(&self) -> Result<String, CacheError> {
        match &self.container {
            Container::Frames(frames) => {
                let mut listing = Vec::new();
                for frame in frames {
                    let bytes = std::fs::read(frame).map_err(|e| CacheError::io(frame, e))?;
                    let name = frame.file_name().unwrap_or_default().to_string_lossy();
                    listing.push((name.into_owned(), kiln_io::checksum(&bytes)));
                }
                Ok(kiln_io::checksum(
                    &serde_json::to_vec(&listing).expect("names and hashes serialise"),
                ))
            }
            _ => {
                let path = &self.source.path;
                std::fs::read(path)
                    .map(|bytes| kiln_io::checksum(&bytes))
                    .map_err(|e| CacheError::io(path, e))
            }
        }
    }

    /// The clip: `spec.frames` sampled frames, preprocessed, as `[T, 3, H, W]` bytes; frames of
    /// more than `max_pixels` pixels (frame images, a GIF's canvas, an MP4 track's size) are
    /// refused before decoding.
    pub(crate) fn clip(&self, spec: &ClipSpec, max_pixels: u64) -> Result<Vec<u8>, CacheError> {
        let frames = match &self.container {
            Container::Frames(paths) => {
                if paths.is_empty() {
                    return Err(self.bad("a folder without frame images"));
                }
                spec.sampled(paths.len(), None)
                    .map_err(|e| self.bad(e))?
                    .into_iter()
                    .map(|i| decode(&paths[i], max_pixels))
                    .collect::<Result<Vec<_>, _>>()?
            }
            Container::Still => {
                let image = decode(&self.source.path, max_pixels)?;
                let picked = spec.sampled(1, None).map_err(|e| self.bad(e))?;
                vec![image; picked.len()]
            }
            Container::Gif => self.gif_frames(spec, max_pixels)?,
            #[cfg(feature = "video")]
            Container::Mp4 => crate::mp4::sampled_frames(&self.source.path, spec, max_pixels)
                .map_err(|e| self.bad(e))?,
        };
        let mut clip = Vec::new();
        for frame in &frames {
            clip.extend(to_chw(&spec.preprocess.resize_and_crop(frame)?));
        }
        Ok(clip)
    }

    fn bad(&self, reason: impl std::fmt::Display) -> CacheError {
        CacheError::BadImage {
            path: self.source.path.clone(),
            reason: reason.to_string(),
        }
    }

    /// The sampled frames of a GIF, composited as browsers show them (see [`crate::animation`]): one
    /// canvas in memory, and only the frames up to the last sampled one decoded.
    fn gif_frames(&self, spec: &ClipSpec, max_pixels: u64) -> Result<Vec<RgbImage>, CacheError> {
        let path = &self.source.path;
        let scan = crate::animation::scan(path, max_pixels).map_err(|e| self.bad(e))?;
        let count = scan.delays_ms.len();
        let milliseconds: f64 = scan.delays_ms.iter().sum();
        // A GIF without delays has no frame rate (browsers show it at their own).
        let fps = (milliseconds > 0.0).then(|| count as f64 * 1000.0 / milliseconds);
        let wanted = spec.sampled(count, fps).map_err(|e| self.bad(e))?;
        crate::animation::frames(path, &scan, &wanted, max_pixels).map_err(|e| self.bad(e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn samples_are_segment_centres_in_range() {
        for count in 1..40 {
            for frames in 1..12 {
                let picked = sample_frames(count, frames);
                assert_eq!(picked.len(), frames as usize);
                assert!(picked.windows(2).all(|w| w[0] <= w[1]));
                assert!(picked.iter().all(|&i| i < count));
            }
        }
        assert_eq!(sample_frames(9, 1), [4]);
        assert_eq!(sample_frames(8, 8), [0, 1, 2, 3, 4, 5, 6, 7]);
    }
}
