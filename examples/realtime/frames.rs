//! Where the frames come from: a generated moving pattern, or a folder of images or a clip
//! decoded once through kiln-cache.

use std::f32::consts::PI;
use std::path::Path;

use kiln::burn::tensor::TensorData;
use kiln::cache::{ClipSpec, IMAGE_EXTENSIONS, ImageCache, Preprocess, VideoSource};

use crate::{Args, frame_data};

/// The frames every stream reads, frame by frame.
pub enum FrameSource {
    /// The system's demo pattern (`simplified_lsd.py`): sine waves moving by frame, each
    /// stream 7 frames ahead of the one before.
    Generated { streams: usize, size: usize },
    /// A clip's frames `[T][3 · H · W]` in [-1, 1]; stream `s` starts `s · T / streams` frames
    /// in and loops.
    Clip {
        frames: Vec<Vec<f32>>,
        streams: usize,
        size: usize,
        name: String,
    },
}

impl FrameSource {
    /// The source `args` names, its frames `size` × `size`.
    pub fn open(args: &Args, size: usize) -> Result<Self, String> {
        let Some(input) = &args.input else {
            return Ok(FrameSource::Generated {
                streams: args.streams,
                size,
            });
        };
        let side = size as u32;
        let note = resizing_note(input, side);
        let cache =
            ImageCache::new(ImageCache::default_dir()).max_image_pixels(args.max_image_pixels);
        let spec = ClipSpec::new(args.frames as u32, Preprocess::clip(side));
        let clip = cache
            .load_clips(&VideoSource::Videos(vec![input.clone()]), &spec)
            .map_err(|e| format!("--input {}: {e}", input.display()))?;
        if let Some(note) = note {
            eprintln!("note: {note}");
        }
        let pixels = clip.item(0);
        let per_frame = 3 * size * size;
        let frames = pixels
            .chunks_exact(per_frame)
            .map(|frame| frame.iter().map(|&v| v as f32 / 127.5 - 1.0).collect())
            .collect();
        Ok(FrameSource::Clip {
            frames,
            streams: args.streams,
            size,
            name: input.display().to_string(),
        })
    }

    /// Frame `index` of every stream, `[streams, 3, H, W]`.
    pub fn frames(&self, index: usize) -> TensorData {
        match self {
            FrameSource::Generated { streams, size } => {
                let values = (0..*streams)
                    .flat_map(|stream| pattern(index + 7 * stream, *size))
                    .collect();
                frame_data(values, *streams, *size)
            }
            FrameSource::Clip {
                frames,
                streams,
                size,
                ..
            } => {
                let count = frames.len();
                let values = (0..*streams)
                    .flat_map(|stream| frames[(index + stream * count / streams) % count].clone())
                    .collect();
                frame_data(values, *streams, *size)
            }
        }
    }

    /// What the frames are, for the summary.
    pub fn describe(&self) -> String {
        match self {
            FrameSource::Generated { .. } => "generated moving pattern".into(),
            FrameSource::Clip { name, frames, .. } => format!("{name} ({} frames)", frames.len()),
        }
    }
}

/// What to say when `input`'s frames are not `size × size` and are resized: the first image of
/// a folder is measured; a clip file's frames are said to be resized as needed.
fn resizing_note(input: &Path, size: u32) -> Option<String> {
    let first = if input.is_dir() {
        let mut images: Vec<_> = std::fs::read_dir(input)
            .into_iter()
            .flatten()
            .flatten()
            .map(|entry| entry.path())
            .filter(|path| {
                let extension = path.extension().and_then(|e| e.to_str()).unwrap_or("");
                IMAGE_EXTENSIONS.contains(&extension.to_ascii_lowercase().as_str())
            })
            .collect();
        images.sort();
        images.into_iter().next()
    } else {
        None
    };
    match first.map(|path| image::image_dimensions(&path)) {
        Some(Ok((w, h))) if (w, h) == (size, size) => None,
        Some(Ok((w, h))) => Some(format!(
            "the frames are {w} × {h}; each is resized to {size} × {size} (shorter side, then a \
             centre crop), the model's frame size"
        )),
        _ => Some(format!(
            "frames not {size} × {size} are resized to it (shorter side, then a centre crop)"
        )),
    }
}

/// The system's demo frame at time `t`: `p = sin(x + t/2) · cos(y + 0.3 t)` over [0, 4π]²;
/// red `p / 2`, green `p / 2` rolled down by `2t` rows, blue rolled right by `3t` columns.
fn pattern(t: usize, size: usize) -> Vec<f32> {
    let axis: Vec<f32> = (0..size)
        .map(|i| 4.0 * PI * i as f32 / (size - 1).max(1) as f32)
        .collect();
    let time = t as f32;
    let p = |row: usize, column: usize| {
        (axis[column] + 0.5 * time).sin() * (axis[row] + 0.3 * time).cos() * 0.5
    };
    let mut values = Vec::with_capacity(3 * size * size);
    for channel in 0..3 {
        for row in 0..size {
            for column in 0..size {
                values.push(match channel {
                    0 => p(row, column),
                    1 => p((row + size - (2 * t) % size) % size, column),
                    _ => p(row, (column + size - (3 * t) % size) % size),
                });
            }
        }
    }
    values
}
