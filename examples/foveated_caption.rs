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

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use burn::tensor::backend::Backend;
use clap::Parser;
use kiln::burn;
use kiln::cache::VideoSource;
use kiln::core::{DeviceJob, DeviceSpec, PolicySpec};
use kiln::foveated::{Captioner, FVLM_CAPTION_PROMPT, clip_pixels};
use kiln::io::RunFiles;
use serde_json::json;

/// mimalloc, keeping the memory it frees for the next step (docs/PERFORMANCE.md).
#[path = "shared/allocator.rs"]
mod allocator;
#[path = "shared/foveated_checkpoint.rs"]
mod foveated_checkpoint;
#[path = "shared/sampling.rs"]
mod sampling;

use foveated_checkpoint::{CheckpointFlags, ClipFlags, progress};
use sampling::SamplingFlags;

/// Caption clips with a trained foveated video-language model.
#[derive(Parser)]
struct Args {
    #[command(flatten)]
    checkpoint: CheckpointFlags,
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
    #[command(flatten)]
    clips_read: ClipFlags,
    /// cpu, ndarray, wgpu, vulkan, metal, cuda, cuda:N.
    #[arg(long, default_value = "cpu")]
    device: DeviceSpec,
    /// Precision policy: full, mixed-f16, mixed-bf16, pure-f16, a dtype, or p=..,c=..,o=...
    #[arg(long, default_value = "full")]
    policy: PolicySpec,
}

impl Args {
    /// Every file and directory the run reads and writes.
    fn files(&self) -> RunFiles {
        let mut files = (self.checkpoint.files()).input("the clips (--clips)", &self.clips);
        if let Some(out) = &self.out {
            files = files.output("--out", out);
        }
        self.clips_read.files(files)
    }

    /// The clips to caption: every clip below a folder, or the one a file holds.
    fn source(&self) -> VideoSource {
        match self.clips.is_dir() {
            true => VideoSource::Folder(self.clips.clone()),
            false => VideoSource::Videos(vec![self.clips.clone()]),
        }
    }
}

impl DeviceJob for Args {
    type Output = Result<(), String>;

    fn run<B: Backend>(self, device: &B::Device) -> Self::Output {
        let text = |e: kiln::foveated::FoveatedError| e.to_string();
        let policy = self
            .policy
            .resolve::<B>(device)
            .map_err(|e| e.to_string())?;
        let source = self.checkpoint.source();
        let (model, tokenizer_dir) = source.load::<B>(device, &policy).map_err(text)?;
        let captioner = Captioner::new(model, &tokenizer_dir, &self.prompt).map_err(text)?;
        let spec = captioner
            .clip_spec(self.clips_read.frames(), self.clips_read.frame_fit, &source)
            .map_err(text)?;
        let cache = self.clips_read.cache();
        let clips = cache
            .load_clips(&self.source(), &spec)
            .map_err(|e| e.to_string())?;
        let bar = progress(clips.len() as u64, "clips");
        let mut lines = String::new();
        for (index, name) in clips.names().enumerate() {
            let started = Instant::now();
            let still = self.clips_read.still_frames;
            let pixels =
                clip_pixels::<B>(&clips, index, still, device, policy.compute).map_err(text)?;
            let (caption, tokens) = captioner
                .caption(pixels, self.max_new_tokens, self.sampling.sampling())
                .map_err(|e| format!("clip {} ({name}): {e}", index + 1))?;
            let line = json!({
                "clip": name,
                "caption": caption,
                "tokens": tokens,
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
