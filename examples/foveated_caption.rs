//! Caption clips with a foveated model on fVLM's inference path (`generate_captions.py`).
//!
//! ```text
//! cargo run --release --example foveated_caption -- --checkpoint DIR --clips DIR|FILE
//!     [--prompt TEXT] [--max-new-tokens N] [--out FILE.jsonl] [--device D] [--policy P]
//!     [--temperature T] [--top-p P] [--seed S] [--frames N] [--frame-fit squash|crop]
//!     [--still-frames N]
//!     [--dino DIR] [--lm DIR] [--cache DIR]
//! ```
//!
//! - `--checkpoint`: a model foveated_train wrote (`OUT/model`: `config.json`,
//!   `model.safetensors` and the LM's tokenizer; an older one without the tokenizer takes
//!   `--lm`), or fVLM's own checkpoint directory (`model.safetensors` in fVLM's names:
//!   `scripts/fvlm_checkpoint.py` converts its `.pt`) with `--dino` and `--lm`, the Hugging
//!   Face backbones it was trained from.
//! - `--clips`: a clip file (a GIF, an MP4 with the `video` feature, a still image) or a folder
//!   of clips, as foveated_train reads one (frame folders, GIFs, MP4, still images directly
//!   below it; one frame folder is captioned as a folder holding it). Each is read as fVLM's inference reads it: one frame a second, at most
//!   `--frames` (64), squashed to DINOv2's size without a crop (`--frame-fit squash`, as
//!   `generate_captions.py` and `benchmark.py` read frames; `crop` reads them as fVLM's
//!   training shards were made); a still image
//!   becomes `--still-frames` (8) copies of itself, as fVLM's script does. A research-variant
//!   model reads `--frames` frames sampled uniformly, as it was trained.
//! - The question: fVLM's system prompt and `--prompt` (fVLM's caption prompt by default) as the
//!   user's turn, through the LM's chat template with the assistant's turn opened; the
//!   research variant's `--prompt` goes before the visual tokens, as it was trained.
//!
//! Decoding is greedy unless `--temperature` is above 0, up to `--max-new-tokens` or the
//! tokenizer's end token. Frames are read once: frame t + 1's query comes from the LM's state
//! after frame t, the LM keeps its keys and values, and each new token costs one LM step
//! (`FoveatedModel::generate`). Writes one JSON line a clip, `{"clip": NAME, "caption": TEXT,
//! "tokens": N, "seconds": S}`, to `--out` (replaced whole when done) or to stdout.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Instant;

use burn::tensor::backend::Backend;
use clap::{Parser, ValueEnum};
use indicatif::{ProgressBar, ProgressStyle};
use kiln::burn;
use kiln::cache::{CachedImages, ClipSpec, ImageCache, VideoSource};
use kiln::core::{DeviceJob, DeviceSpec, Policy, PolicySpec};
use kiln::foveated::{
    CaptionTokenizer, ClipBatch, FVLM_CAPTION_PROMPT, FoveatedModel, FrameFit, Variant,
    dinov2_frames,
};
use kiln::io::RunFiles;
use kiln::text::GenerationConfig;
use serde_json::json;

/// mimalloc, keeping the memory it frees for the next step (docs/PERFORMANCE.md).
#[path = "shared/allocator.rs"]
mod allocator;
#[path = "shared/sampling.rs"]
mod sampling;

use sampling::SamplingFlags;

/// The most frames a clip may have (fVLM samples 8 to 64).
const MAX_FRAMES: usize = 4096;

/// Caption clips with a trained foveated video-language model.
#[derive(Parser)]
struct Args {
    /// The model: foveated_train's OUT/model, or fVLM's checkpoint directory (with --dino
    /// and --lm).
    #[arg(long)]
    checkpoint: PathBuf,
    /// A clip file (GIF, MP4 with the `video` feature, still image) or a folder of clips.
    #[arg(long)]
    clips: PathBuf,
    /// The user's turn (release) or the text before the frames (research).
    #[arg(long, default_value = FVLM_CAPTION_PROMPT)]
    prompt: String,
    /// The most tokens a caption gets.
    #[arg(long, default_value_t = 200, value_parser = kiln::cli::count_up_to::<100_000>, allow_negative_numbers = true)]
    max_new_tokens: usize,
    /// JSON Lines output, one caption a clip (default: stdout).
    #[arg(long)]
    out: Option<PathBuf>,
    #[command(flatten)]
    sampling: SamplingFlags,
    /// The most frames read from a clip, one a second (research: sampled uniformly).
    #[arg(long, default_value_t = 64, value_parser = kiln::cli::count_up_to::<MAX_FRAMES>, allow_negative_numbers = true)]
    frames: usize,
    /// How release-variant frames fit DINOv2's square: squash (fVLM's evaluation) or crop (its
    /// training shards).
    #[arg(long, default_value = "squash")]
    frame_fit: FrameFit,
    /// Copies of a still image's one frame (fVLM's script: 8).
    #[arg(long, default_value_t = 8, value_parser = kiln::cli::count_up_to::<MAX_FRAMES>, allow_negative_numbers = true)]
    still_frames: usize,
    /// The DINOv2 directory an fVLM checkpoint was trained from.
    #[arg(long, requires = "lm")]
    dino: Option<PathBuf>,
    /// The LM directory an fVLM checkpoint was trained from, or the tokenizer of a trained
    /// model saved without one.
    #[arg(long)]
    lm: Option<PathBuf>,
    /// Where decoded clips are cached (default: the user's kiln cache).
    #[arg(long)]
    cache: Option<PathBuf>,
    /// cpu, ndarray, wgpu, vulkan, metal, cuda, cuda:N.
    #[arg(long, default_value = "cpu")]
    device: DeviceSpec,
    /// Precision policy: full, mixed-f16, mixed-bf16, pure-f16, a dtype, or p=..,c=..,o=...
    #[arg(long, default_value = "full")]
    policy: PolicySpec,
    /// How --checkpoint is read (found from its files by default).
    #[arg(long, value_enum)]
    checkpoint_kind: Option<CheckpointKind>,
}

/// What a checkpoint directory holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum CheckpointKind {
    /// A model kiln saved (`FoveatedModel::save`: config.json and model.safetensors).
    Kiln,
    /// fVLM's state dict (model.safetensors in fVLM's names) over --dino and --lm.
    Fvlm,
}

impl Args {
    /// Every file and directory the run reads and writes.
    fn files(&self) -> RunFiles {
        let mut files = RunFiles::new()
            .input_dir("--checkpoint (a model directory)", &self.checkpoint)
            .input("the clips (--clips)", &self.clips);
        if let Some(dino) = &self.dino {
            files = files.input_dir("--dino (a Hugging Face DINOv2 directory)", dino);
        }
        if let Some(lm) = &self.lm {
            files = files.input_dir("--lm (a Hugging Face LM directory)", lm);
        }
        if let Some(out) = &self.out {
            files = files.output("--out", out);
        }
        if let Some(cache) = &self.cache {
            files = files.output_dir("--cache", cache);
        }
        files
    }

    /// `--checkpoint-kind`, else kiln's when the directory has a `config.json`.
    fn kind(&self) -> CheckpointKind {
        self.checkpoint_kind
            .unwrap_or(match self.checkpoint.join("config.json").is_file() {
                true => CheckpointKind::Kiln,
                false => CheckpointKind::Fvlm,
            })
    }

    /// The model, and the directory holding its tokenizer.
    fn model<B: Backend>(
        &self,
        device: &B::Device,
        policy: &Policy,
    ) -> Result<(FoveatedModel<B>, PathBuf), String> {
        let text = |e: kiln::foveated::FoveatedError| e.to_string();
        match self.kind() {
            CheckpointKind::Kiln => {
                let model =
                    FoveatedModel::<B>::load(&self.checkpoint, device, policy).map_err(text)?;
                let has_tokenizer = self.checkpoint.join("tokenizer.json").is_file();
                let tokenizer = match (&self.lm, has_tokenizer) {
                    (Some(lm), _) => lm.clone(),
                    (None, true) => self.checkpoint.clone(),
                    (None, false) => {
                        return Err(format!(
                            "{}: no tokenizer.json beside the model (saved before foveated_train \
                             kept the LM's tokenizer): give --lm, the LM directory it was trained \
                             from",
                            self.checkpoint.display()
                        ));
                    }
                };
                Ok((model, tokenizer))
            }
            CheckpointKind::Fvlm => {
                let (Some(dino), Some(lm)) = (&self.dino, &self.lm) else {
                    return Err(format!(
                        "{}: fVLM's checkpoint (no config.json) holds no backbone shapes: give \
                         --dino and --lm, the Hugging Face directories it was trained from",
                        self.checkpoint.display()
                    ));
                };
                let model = FoveatedModel::<B>::from_fvlm_checkpoint(
                    &self.checkpoint,
                    dino,
                    lm,
                    device,
                    policy,
                )
                .map_err(text)?;
                Ok((model, lm.clone()))
            }
        }
    }

    /// How clips are read: as the model's variant was trained to see them.
    fn clip_spec(
        &self,
        variant: Variant,
        image_size: usize,
        dino: &Path,
    ) -> Result<ClipSpec, String> {
        let frames = u32::try_from(self.frames).expect("--frames is at most MAX_FRAMES");
        Ok(match variant {
            Variant::Release => ClipSpec::per_second(frames, self.frame_fit.preprocess(image_size)),
            Variant::Research => {
                let preprocess = dinov2_frames(dino, image_size).map_err(|e| e.to_string())?;
                ClipSpec::new(frames, preprocess)
            }
        })
    }

    /// The clips to caption: every clip below a folder, or the one a file holds.
    fn source(&self) -> VideoSource {
        match self.clips.is_dir() {
            true => VideoSource::Folder(self.clips.clone()),
            false => VideoSource::Videos(vec![self.clips.clone()]),
        }
    }

    fn generation(&self, stop: u32) -> GenerationConfig {
        GenerationConfig {
            sampling: self.sampling.sampling(),
            stop_tokens: vec![stop],
            pad_token: stop,
            ..GenerationConfig::greedy(self.max_new_tokens)
        }
    }
}

impl DeviceJob for Args {
    type Output = Result<(), String>;

    fn run<B: Backend>(self, device: &B::Device) -> Self::Output {
        let policy = self
            .policy
            .resolve::<B>(device)
            .map_err(|e| e.to_string())?;
        let (model, tokenizer_dir) = self.model::<B>(device, &policy)?;
        let variant = model.config().variant;
        let tokens = match variant {
            Variant::Release => CaptionTokenizer::chat_from_lm_dir(&tokenizer_dir, &self.prompt),
            Variant::Research => CaptionTokenizer::from_lm_dir(&tokenizer_dir, &self.prompt),
        }
        .map_err(|e| e.to_string())?;
        let (question, prompt) = match variant {
            Variant::Release => (
                tokens.question(&self.prompt).map_err(|e| e.to_string())?,
                vec![],
            ),
            Variant::Research => (vec![], tokens.prompt().to_vec()),
        };
        let image_size = model.dino.config().image_size;
        let dino_dir = self.dino.clone().unwrap_or_else(|| self.checkpoint.clone());
        let spec = self.clip_spec(variant, image_size, &dino_dir)?;
        let cache = ImageCache::new(self.cache.clone().unwrap_or_else(ImageCache::default_dir));
        let clips = cache
            .load_clips(&self.source(), &spec)
            .map_err(|e| e.to_string())?;
        let generation = self.generation(tokens.end());
        let bar = progress(clips.len() as u64);
        let mut lines = String::new();
        for (index, name) in clips.names().enumerate() {
            let started = Instant::now();
            let pixels = clip_pixels::<B>(&clips, index, self.still_frames, device, &policy)?;
            let mut batch = ClipBatch::new(pixels).with_target(vec![question.clone()]);
            if !prompt.is_empty() {
                batch = batch.with_prompt(vec![prompt.clone()]);
            }
            let mut ids = model
                .generate(&batch, &generation, |_| {})
                .map_err(|e| format!("clip {} ({name}): {e}", index + 1))?
                .remove(0);
            if ids.last() == Some(&tokens.end()) {
                ids.pop();
            }
            let caption = tokens.decode(&ids).map_err(|e| e.to_string())?;
            let line = json!({
                "clip": name,
                "caption": caption,
                "tokens": ids.len(),
                "seconds": started.elapsed().as_secs_f64(),
            });
            if self.out.is_none() {
                bar.suspend(|| println!("{line}"));
            }
            lines.push_str(&format!("{line}\n"));
            bar.inc(1);
        }
        bar.finish_and_clear();
        if let Some(out) = &self.out {
            kiln::io::write_atomic(out, lines.as_bytes()).map_err(|e| e.to_string())?;
            eprintln!("{} captions in {}", clips.len(), out.display());
        }
        Ok(())
    }
}

/// Clip `index` as `[1, T, 3, H, W]` in the policy's compute precision; a one-frame clip (a
/// still image) repeated `still_frames` times.
fn clip_pixels<B: Backend>(
    clips: &CachedImages,
    index: usize,
    still_frames: usize,
    device: &B::Device,
    policy: &Policy,
) -> Result<burn::tensor::Tensor<B, 5>, String> {
    let frames = clips
        .upload::<B>(index..index + 1, device, policy.compute)
        .map_err(|e| e.to_string())?;
    let [count, channels, height, width] = frames.dims();
    let clip = frames.reshape([1, count, channels, height, width]);
    Ok(match count {
        1 => clip.repeat_dim(1, still_frames),
        _ => clip,
    })
}

/// A progress bar over `clips` clips, on stderr.
fn progress(clips: u64) -> ProgressBar {
    let bar = ProgressBar::new(clips);
    bar.set_style(
        ProgressStyle::with_template("{bar:40} {pos}/{len} clips, {per_sec}, eta {eta}")
            .expect("a valid template"),
    );
    bar
}

fn main() -> ExitCode {
    allocator::keep_freed_memory();
    kiln::log_to_stderr();
    let args = Args::parse();
    let device = args.device;
    let result = args
        .files()
        .check()
        .map_err(|e| e.to_string())
        .and_then(|()| device.run(args).map_err(|e| e.to_string()))
        .and_then(|r| r);
    kiln::exit_status(result)
}
