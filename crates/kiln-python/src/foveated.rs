//! fVLM's captions from Python: `caption(...)`, a trained foveated model (kiln's or fVLM's own
//! checkpoint) captioning a folder of clips or one clip on fVLM's inference path, what
//! `kiln.foveated.caption` calls.

use std::path::PathBuf;
use std::time::Instant;

use burn::tensor::backend::Backend;
use kiln_cache::{ImageCache, VideoSource};
use kiln_core::{DeviceJob, PolicySpec};
use kiln_foveated::{Captioner, CheckpointSource, FoveatedError, FrameFit, clip_pixels};
use kiln_text::Sampling;
use pyo3::exceptions::{PyFileNotFoundError, PyRuntimeError, PyValueError};
use pyo3::prelude::*;

/// One captioning run.
struct Job {
    source: CheckpointSource,
    clips: PathBuf,
    prompt: String,
    max_new_tokens: usize,
    frames: u32,
    frame_fit: FrameFit,
    still_frames: usize,
    sampling: Sampling,
    cache: PathBuf,
    policy: PolicySpec,
}

/// A clip's caption: its name, the text, its token count and the seconds it took.
type Captioned = (String, String, usize, f64);

impl DeviceJob for Job {
    type Output = PyResult<Vec<Captioned>>;

    fn run<B: Backend>(self, device: &B::Device) -> Self::Output {
        let policy = crate::resolve::<B>(&self.policy, device)?;
        let (model, tokenizer_dir) = self.source.load::<B>(device, &policy).map_err(error)?;
        let captioner = Captioner::new(model, &tokenizer_dir, &self.prompt).map_err(error)?;
        let spec =
            (captioner.clip_spec(self.frames, self.frame_fit, &self.source)).map_err(error)?;
        let source = match self.clips.is_dir() {
            true => VideoSource::Folder(self.clips.clone()),
            false => VideoSource::Videos(vec![self.clips.clone()]),
        };
        let clips = ImageCache::new(&self.cache)
            .load_clips(&source, &spec)
            .map_err(|e| PyValueError::new_err(format!("{}: {e}", self.clips.display())))?;
        let mut captions = Vec::with_capacity(clips.len());
        for (index, name) in clips.names().enumerate() {
            let started = Instant::now();
            let pixels = clip_pixels::<B>(&clips, index, self.still_frames, device, policy.compute)
                .map_err(error)?;
            let (caption, tokens) = captioner
                .caption(pixels, self.max_new_tokens, self.sampling)
                .map_err(|e| {
                    PyRuntimeError::new_err(format!("clip {} ({name}): {e}", index + 1))
                })?;
            let seconds = started.elapsed().as_secs_f64();
            captions.push((name.to_string(), caption, tokens, seconds));
        }
        Ok(captions)
    }
}

/// Captions every clip below the folder `clips` (or the one clip file `clips`) with the
/// foveated model in `checkpoint`; per clip `(name, caption, tokens, seconds)`.
#[pyfunction]
#[pyo3(signature = (checkpoint, clips, prompt, max_new_tokens = 200, dino = None, lm = None, frames = 64, frame_fit = "squash", still_frames = 8, temperature = 0.0, top_p = 1.0, seed = 0, device = "cpu", policy = "full", cache_dir = None))]
#[allow(clippy::too_many_arguments)] // Python keyword arguments, each with its default.
pub fn caption(
    py: Python<'_>,
    checkpoint: PathBuf,
    clips: PathBuf,
    prompt: String,
    max_new_tokens: usize,
    dino: Option<PathBuf>,
    lm: Option<PathBuf>,
    frames: u32,
    frame_fit: &str,
    still_frames: usize,
    temperature: f64,
    top_p: f64,
    seed: u64,
    device: &str,
    policy: &str,
    cache_dir: Option<PathBuf>,
) -> PyResult<Vec<Captioned>> {
    if !clips.exists() {
        return Err(PyFileNotFoundError::new_err(format!(
            "clips {}: no such file or directory",
            clips.display()
        )));
    }
    if frames == 0 || still_frames == 0 || max_new_tokens == 0 {
        return Err(PyValueError::new_err(format!(
            "frames={frames}, still_frames={still_frames}, max_new_tokens={max_new_tokens}: \
             each must be at least 1"
        )));
    }
    let frame_fit: FrameFit = frame_fit
        .parse()
        .map_err(|e| PyValueError::new_err(format!("frame_fit: {e}")))?;
    if !(temperature >= 0.0 && top_p > 0.0 && top_p <= 1.0) {
        return Err(PyValueError::new_err(format!(
            "temperature={temperature}, top_p={top_p}: a temperature of 0 (greedy) or above, \
             and top_p in (0, 1]"
        )));
    }
    let sampling = match temperature > 0.0 {
        true => Sampling::Sample {
            temperature,
            top_p,
            seed,
        },
        false => Sampling::Greedy,
    };
    let job = Job {
        source: CheckpointSource {
            dir: checkpoint,
            dino,
            lm,
            kind: None,
        },
        clips,
        prompt,
        max_new_tokens,
        frames,
        frame_fit,
        still_frames,
        sampling,
        cache: cache_dir.unwrap_or_else(ImageCache::default_dir),
        policy: crate::policy(policy)?,
    };
    crate::released(py, || crate::on_device(device, job))??
}

/// A model or clips that cannot be used: `FileNotFoundError` for a missing file, `ValueError`
/// otherwise.
fn error(e: FoveatedError) -> PyErr {
    match &e {
        FoveatedError::Checkpoint(checkpoint) => crate::checkpoint_error(checkpoint),
        _ => PyValueError::new_err(e.to_string()),
    }
}
