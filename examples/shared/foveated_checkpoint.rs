//! The foveated model a caption or benchmark run reads: `--checkpoint`, a model foveated_train
//! wrote or fVLM's own checkpoint over `--dino` and `--lm`; and its clips, read as fVLM's
//! evaluation reads them.

use std::path::PathBuf;

use indicatif::{ProgressBar, ProgressStyle};
use kiln::cache::ImageCache;
use kiln::foveated::{CheckpointKind, CheckpointSource, FrameFit};
use kiln::io::RunFiles;

/// The most frames a clip may have (fVLM samples 8 to 64).
pub const MAX_FRAMES: usize = 4096;

/// How clips are read.
#[derive(clap::Args)]
pub struct ClipFlags {
    /// The most frames read from a clip, one a second (research models: sampled uniformly).
    #[arg(long, default_value_t = 64, value_parser = kiln::cli::count_up_to::<MAX_FRAMES>, allow_negative_numbers = true)]
    pub frames: usize,
    /// How frames fit DINOv2's square: squash (fVLM's evaluation) or crop (its training shards).
    #[arg(long, default_value = "squash")]
    pub frame_fit: FrameFit,
    /// Copies of a still image's one frame (fVLM's evaluation: 8).
    #[arg(long, default_value_t = 8, value_parser = kiln::cli::count_up_to::<MAX_FRAMES>, allow_negative_numbers = true)]
    pub still_frames: usize,
    /// Where decoded clips are cached (default: the user's kiln cache).
    #[arg(long)]
    pub cache: Option<PathBuf>,
}

impl ClipFlags {
    /// `--frames` as kiln-cache counts frames.
    pub fn frames(&self) -> u32 {
        u32::try_from(self.frames).expect("--frames is at most MAX_FRAMES")
    }

    /// The clip cache: `--cache`, else the user's.
    pub fn cache(&self) -> ImageCache {
        ImageCache::new(self.cache.clone().unwrap_or_else(ImageCache::default_dir))
    }

    /// `files` with the cache directory when one is given.
    pub fn files(&self, files: RunFiles) -> RunFiles {
        match &self.cache {
            Some(cache) => files.output_dir("--cache", cache),
            None => files,
        }
    }
}

/// Which model, and where its backbones and tokenizer are.
#[derive(clap::Args)]
pub struct CheckpointFlags {
    /// The model: foveated_train's OUT/model, or fVLM's checkpoint directory (with --dino
    /// and --lm).
    #[arg(long)]
    pub checkpoint: PathBuf,
    /// The DINOv2 directory an fVLM checkpoint was trained from.
    #[arg(long, requires = "lm")]
    pub dino: Option<PathBuf>,
    /// The LM directory an fVLM checkpoint was trained from, or the tokenizer of a trained
    /// model saved without one.
    #[arg(long)]
    pub lm: Option<PathBuf>,
    /// How --checkpoint is read: kiln (a model foveated_train saved) or fvlm (fVLM's state
    /// dict over --dino and --lm) [default: found from its files].
    #[arg(long)]
    pub checkpoint_kind: Option<CheckpointKind>,
}

impl CheckpointFlags {
    /// The directories these flags read.
    pub fn files(&self) -> RunFiles {
        let mut files =
            RunFiles::new().input_dir("--checkpoint (a model directory)", &self.checkpoint);
        if let Some(dino) = &self.dino {
            files = files.input_dir("--dino (a Hugging Face DINOv2 directory)", dino);
        }
        if let Some(lm) = &self.lm {
            files = files.input_dir("--lm (a Hugging Face LM directory)", lm);
        }
        files
    }

    /// Where the model is.
    pub fn source(&self) -> CheckpointSource {
        CheckpointSource {
            dir: self.checkpoint.clone(),
            dino: self.dino.clone(),
            lm: self.lm.clone(),
            kind: self.checkpoint_kind,
        }
    }
}

/// A progress bar over `count` `unit` (clips, questions), on stderr.
pub fn progress(count: u64, unit: &str) -> ProgressBar {
    let bar = ProgressBar::new(count);
    let template = format!("{{bar:40}} {{pos}}/{{len}} {unit}, {{per_sec}}, eta {{eta}}");
    bar.set_style(ProgressStyle::with_template(&template).expect("a valid template"));
    bar
}
