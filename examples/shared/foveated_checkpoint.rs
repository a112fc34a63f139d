//! The foveated model a caption or benchmark run reads: `--checkpoint`, a model foveated_train
//! wrote or fVLM's own checkpoint over `--dino` and `--lm`; and its clips, read as fVLM's
//! evaluation reads them.

use std::path::PathBuf;

use indicatif::{ProgressBar, ProgressStyle};
use kiln::burn::tensor::Tensor;
use kiln::burn::tensor::backend::Backend;
use kiln::cache::{CachedImages, ClipSpec, ImageCache};
use kiln::core::Policy;
use kiln::foveated::{FoveatedModel, FrameFit};
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

    /// fVLM's evaluation read: one frame a second up to `--frames`, fitted as `--frame-fit`.
    pub fn per_second(&self, image_size: usize) -> ClipSpec {
        ClipSpec::per_second(self.frames(), self.frame_fit.preprocess(image_size))
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
    /// How --checkpoint is read (found from its files by default).
    #[arg(long, value_enum)]
    pub checkpoint_kind: Option<CheckpointKind>,
}

/// What a checkpoint directory holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum CheckpointKind {
    /// A model kiln saved (`FoveatedModel::save`: config.json and model.safetensors).
    Kiln,
    /// fVLM's state dict (model.safetensors in fVLM's names) over --dino and --lm.
    Fvlm,
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

    /// `--checkpoint-kind`, else kiln's when the directory has a `config.json`.
    fn kind(&self) -> CheckpointKind {
        self.checkpoint_kind
            .unwrap_or(match self.checkpoint.join("config.json").is_file() {
                true => CheckpointKind::Kiln,
                false => CheckpointKind::Fvlm,
            })
    }

    /// The model, and the directory holding its tokenizer.
    pub fn model<B: Backend>(
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
                             kept the LM's tokenizer): give --lm, the LM directory it was \
                             trained from",
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
}

/// Clip `index` as `[1, T, 3, H, W]` in the policy's compute precision; a one-frame clip (a
/// still image) repeated `still_frames` times, as fVLM's evaluation does.
pub fn clip_pixels<B: Backend>(
    clips: &CachedImages,
    index: usize,
    still_frames: usize,
    device: &B::Device,
    policy: &Policy,
) -> Result<Tensor<B, 5>, String> {
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

/// A progress bar over `count` `unit` (clips, questions), on stderr.
pub fn progress(count: u64, unit: &str) -> ProgressBar {
    let bar = ProgressBar::new(count);
    let template = format!("{{bar:40}} {{pos}}/{{len}} {unit}, {{per_sec}}, eta {{eta}}");
    bar.set_style(ProgressStyle::with_template(&template).expect("a valid template"));
    bar
}
