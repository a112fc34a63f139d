//! Train the foveated model (`kiln::foveated`) on any folder of clips with captions.
//!
//! ```text
//! cargo run --release --example foveated_train -- --clips DIR --captions FILE --dino DIR \
//!     --lm DIR --out DIR [--frames T] [--steps N] [--batch B] [--accumulate K]
//!     [--variant release|research] [--readout deep|shallow] [--lambda L] [--connector-lr X]
//!     [--backbone-lr Y] [--prompt TEXT] [--policy full|mixed-bf16] [--lm-policy P] [--device D]
//!     [--replicate-images N] [--text FILE [--text-ratio R]]
//!     [--eval-clips DIR --eval-captions FILE]
//! ```
//!
//! `--variant` picks kiln-foveated's design (docs/FOVEATED.md). `release` (the default) is fVLM
//! as released: each caption becomes fVLM's stage-1 conversation after the visual tokens
//! (system prompt, `--prompt` as the user's turn, the caption as the answer, every token
//! scored), λ = 0, fVLM's stage-1 recipe (`ReleaseRecipe::stage1_135m`: three groups, decay on
//! every parameter, 3% warm-up, rates converging on 3e-5) and fVLM's data: one frame a second,
//! at most `--frames` (64), fitted to DINOv2's size as `--frame-fit` says (`crop`, the default:
//! the shorter edge scaled, then the centre square, as fVLM's training shards were made;
//! `squash`: as its evaluation reads frames), clips of
//! different lengths padded in a batch with their frame lengths; `--text` mixes in fVLM's
//! text-only batches. `--lm-policy params=bf16,compute=bf16,output=f32` with `--policy
//! mixed-bf16` is fVLM's precision. `research` is the design docs/FOVEATED.md's first proof was
//! made with: `--prompt` before the visual tokens and the caption after them, both passes
//! trained (λ = 1), two parameter groups, T frames sampled uniformly from each video.
//!
//! - `--clips`: videos directly below a folder — frame folders (their images taken as one a
//!   second), GIFs, MP4 (H.264, with the `video` feature), still images (one frame; with
//!   `--replicate-images N`, N copies of it as fVLM's stage 2 does with 8). Each is decoded
//!   once into kiln-cache (`OUT/cache`, or `--cache DIR`). research: T frames sampled
//!   uniformly, preprocessed as the DINOv2 directory's processor says; a video with fewer than
//!   T frames is refused by name.
//! - `--text`: JSON Lines, `{"user": TEXT, "assistant": TEXT}` per line: conversations trained
//!   without frames (every token scored), `--text-ratio` of the batches (fVLM's 0.14).
//! - `--captions`: JSON Lines, `{"video": NAME, "caption": TEXT}` per clip, NAME as below the
//!   clips folder; every clip needs a caption and every caption its clip. Captions are
//!   tokenised once (the LM directory's tokenizer): release, each as the assistant's turn of
//!   fVLM's conversation (its chat template closes the turn; no end-of-sequence token is
//!   added); research, followed by the end-of-sequence token.
//! - `--dino`, `--lm`: Hugging Face directories (a DINOv2 `Dinov2Model`; a Llama-family causal
//!   LM with its tokenizer). The connectors start newly initialised.
//!
//! Trains through kiln-train — AdamW over parameter groups (connectors at `--connector-lr`,
//! both backbones at `--backbone-lr`), warm-up and decay, clipping at 1.0, accumulation — into
//! OUT: `metrics.jsonl`, `loss.png`, `checkpoints/` (rerunning the same
//! command resumes), `model/` (the trained model: `FoveatedModel::load`, with the LM's tokenizer
//! files, so that `foveated_caption --checkpoint OUT/model` captions with it) and
//! `summary.json`.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Instant;

use burn::backend::Autodiff;
use burn::tensor::backend::Backend;
use clap::Parser;
use kiln::burn;
use kiln::cache::{ClipSpec, ImageCache};
use kiln::core::{DeviceJob, DeviceSpec, Policy, PolicySpec, Precision};
use kiln::foveated::{
    CaptionTokenizer, CaptionedClipReader, CaptionedClips, FVLM_CAPTION_PROMPT, FoveatedConfig,
    FoveatedModel, FrameFit, Readout, ReleaseRecipe, Variant, dinov2_frames, read_text_samples,
    research_recipe,
};
use kiln::io::RunFiles;
use kiln::train::{LossScaling, RunOptions, TrainConfig, Trainer};
use serde_json::json;

/// mimalloc, keeping the memory it frees for the next step (docs/PERFORMANCE.md).
#[path = "../shared/allocator.rs"]
mod allocator;

/// The most frames a clip may have (fVLM samples 8 to 64).
const MAX_FRAMES: usize = 4096;

/// Train the foveated video-language model on captioned clips.
#[derive(Parser)]
struct Args {
    /// Folder of training videos (frame folders, GIFs, MP4 with the `video` feature).
    #[arg(long)]
    clips: PathBuf,
    /// JSON Lines captions of the training videos.
    #[arg(long)]
    captions: PathBuf,
    /// Hugging Face DINOv2 directory.
    #[arg(long)]
    dino: PathBuf,
    /// Hugging Face causal-LM directory, with its tokenizer.
    #[arg(long)]
    lm: PathBuf,
    /// The run's directory (metrics, plot, checkpoints, model, summary).
    #[arg(long)]
    out: PathBuf,
    /// Held-out videos, evaluated every `--eval-every` steps (with `--eval-captions`).
    #[arg(long, requires = "eval_captions")]
    eval_clips: Option<PathBuf>,
    /// JSON Lines captions of the held-out videos.
    #[arg(long, requires = "eval_clips")]
    eval_captions: Option<PathBuf>,
    /// Where decoded clips are cached (default OUT/cache).
    #[arg(long)]
    cache: Option<PathBuf>,
    /// Frames per clip: release, the most a clip takes one a second [default: 64, fVLM's];
    /// research, T sampled uniformly [default: 8].
    #[arg(long, value_parser = kiln::cli::count_up_to::<MAX_FRAMES>, allow_negative_numbers = true)]
    frames: Option<usize>,
    /// How release-variant frames fit DINOv2's square: crop (fVLM's training shards) or squash
    /// (its evaluation).
    #[arg(long, default_value = "crop")]
    frame_fit: FrameFit,
    /// Copies of a one-frame clip (a still image) it becomes (fVLM: 1 in stage 1, 8 after).
    #[arg(long, default_value_t = 1, value_parser = kiln::cli::count, allow_negative_numbers = true)]
    replicate_images: usize,
    /// JSON Lines of text-only conversations, `{"user": TEXT, "assistant": TEXT}` a line,
    /// trained without frames.
    #[arg(long)]
    text: Option<PathBuf>,
    /// The share of batches that are text-only (with `--text`).
    #[arg(long, default_value_t = 0.14, requires = "text", value_parser = kiln::cli::non_negative, allow_negative_numbers = true)]
    text_ratio: f64,
    /// Optimizer steps.
    #[arg(long, default_value_t = 1000, value_parser = kiln::cli::count_u64, allow_negative_numbers = true)]
    steps: u64,
    /// Clips per micro-batch.
    #[arg(long, default_value_t = 2, value_parser = kiln::cli::count, allow_negative_numbers = true)]
    batch: usize,
    /// Micro-batches per optimizer step.
    #[arg(long, default_value_t = 1, value_parser = kiln::cli::count, allow_negative_numbers = true)]
    accumulate: usize,
    /// The model's design: release (fVLM as released, its stage-1 recipe and data) or research
    /// (kiln's first reading of fVLM).
    #[arg(long, default_value = "release")]
    variant: Variant,
    /// How queries read frames: deep (fVLM's released model) or shallow.
    #[arg(long, default_value = "deep")]
    readout: Readout,
    /// Width of the queries (fVLM's: 384).
    #[arg(long, default_value_t = 384, value_parser = kiln::cli::count, allow_negative_numbers = true)]
    query_dim: usize,
    /// Weight of the coarse pass's loss (`fine + λ·coarse`) [default: 1 for research, 0 for
    /// release].
    #[arg(long, value_parser = kiln::cli::non_negative, allow_negative_numbers = true)]
    lambda: Option<f64>,
    /// Peak learning rate of the connectors [default: 1e-3, fVLM's stage 1].
    #[arg(long, value_parser = kiln::cli::positive, allow_negative_numbers = true)]
    connector_lr: Option<f64>,
    /// Peak learning rate of DINOv2 and the LM [default: 1e-5, fVLM's stage 1].
    #[arg(long, value_parser = kiln::cli::positive, allow_negative_numbers = true)]
    backbone_lr: Option<f64>,
    /// research: the text before every clip's visual tokens [default: "Describe the video."];
    /// release: the user's turn of every conversation [default: fVLM's "Write a brief caption
    /// for this video."].
    #[arg(long)]
    prompt: Option<String>,
    /// cpu, ndarray, wgpu, vulkan, metal, cuda, cuda:N.
    #[arg(long, default_value = "cpu")]
    device: DeviceSpec,
    /// Precision policy: full, mixed-bf16, mixed-f16 (dynamic loss scaling), or p=..,c=...
    #[arg(long, default_value = "full")]
    policy: PolicySpec,
    /// Precision policy of the LM alone [default: --policy's]; fVLM keeps its LM in bf16:
    /// params=bf16,compute=bf16,output=f32.
    #[arg(long)]
    lm_policy: Option<PolicySpec>,
    /// Evaluate (and checkpoint) every this many steps.
    #[arg(long, default_value_t = 100, value_parser = kiln::cli::count_u64, allow_negative_numbers = true)]
    eval_every: u64,
    /// Seeds the connectors' initial weights and the order of the clips.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Stop this process after this many optimizer steps (rerun to go on).
    #[arg(long)]
    max_steps_now: Option<u64>,
}

impl Args {
    /// The variant's recipe ([`research_recipe`], or fVLM's stage 1: [`ReleaseRecipe`]) with
    /// this run's steps, rates and accumulation.
    fn train_config(&self, policy: &Policy) -> Result<TrainConfig, String> {
        let mut config = match self.variant {
            Variant::Research => research_recipe(
                self.steps,
                self.connector_lr.unwrap_or(1e-3),
                self.backbone_lr.unwrap_or(1e-5),
            ),
            Variant::Release => {
                let stage1 = ReleaseRecipe::stage1_135m();
                let backbone = self.backbone_lr.unwrap_or(stage1.lr_dino);
                ReleaseRecipe {
                    lr_connector: self.connector_lr.unwrap_or(stage1.lr_connector),
                    lr_dino: backbone,
                    lr_llm: backbone,
                    ..stage1
                }
                .train_config(self.steps)
            }
        };
        config.accumulate = self.accumulate;
        config.loss_scaling = match policy.compute {
            Precision::F16 => LossScaling::Dynamic,
            _ => LossScaling::Off,
        };
        config.eval_every = self.eval_every;
        config.checkpoint_every = self.eval_every;
        config.seed = self.seed;
        config.validate().map_err(|e| e.to_string())?;
        if self.text_ratio >= 1.0 {
            return Err(format!(
                "--text-ratio {}: a share of the batches, below 1 (fVLM's is 0.14)",
                self.text_ratio
            ));
        }
        Ok(config)
    }

    /// `--frames`, else the variant's: fVLM's 64 at most, or 8.
    fn frames(&self) -> usize {
        self.frames.unwrap_or(match self.variant {
            Variant::Release => 64,
            Variant::Research => 8,
        })
    }

    /// How clips are made: one frame a second up to `--frames`, squashed (release), or
    /// `--frames` sampled uniformly as the DINOv2 directory's processor says (research).
    fn clip_spec(&self, image_size: usize) -> Result<ClipSpec, String> {
        let frames = self.frames() as u32;
        Ok(match self.variant {
            Variant::Release => ClipSpec::per_second(frames, self.frame_fit.preprocess(image_size)),
            Variant::Research => {
                let preprocess =
                    dinov2_frames(&self.dino, image_size).map_err(|e| e.to_string())?;
                ClipSpec::new(frames, preprocess).refusing_short_videos()
            }
        })
    }

    /// The coarse pass's weight: `--lambda`, else the variant's.
    fn lambda(&self) -> f64 {
        (self.lambda).unwrap_or(FoveatedConfig::of(self.variant).lambda_coarse)
    }

    /// `--prompt`, else the variant's.
    fn prompt(&self) -> String {
        let default = match self.variant {
            Variant::Research => "Describe the video.",
            Variant::Release => FVLM_CAPTION_PROMPT,
        };
        self.prompt.clone().unwrap_or_else(|| default.into())
    }

    /// Every file and directory the run reads and writes.
    fn files(&self) -> RunFiles {
        let mut files = RunFiles::new()
            .input("the training clips (--clips)", &self.clips)
            .input("the training captions (--captions)", &self.captions)
            .input("the DINOv2 directory (--dino)", &self.dino)
            .input("the language model directory (--lm)", &self.lm);
        if let Some(text) = &self.text {
            files = files.input("the text-only conversations (--text)", text);
        }
        if let (Some(clips), Some(captions)) = (&self.eval_clips, &self.eval_captions) {
            files = files
                .input("the held-out clips (--eval-clips)", clips)
                .input("the held-out captions (--eval-captions)", captions);
        }
        files
            .output_dir("--out", &self.out)
            .output_dir("--cache", self.cache_dir())
    }

    /// Where decoded clips are cached.
    fn cache_dir(&self) -> PathBuf {
        self.cache.clone().unwrap_or(self.out.join("cache"))
    }

    /// What identifies the data: each split's clips and captions.
    fn data(&self) -> Result<serde_json::Value, String> {
        let print = |path: &Path| kiln::io::fingerprint(path).map_err(|e| e.to_string());
        let mut data = json!({
            "train": {"clips": print(&self.clips)?, "captions": print(&self.captions)?},
        });
        if let (Some(clips), Some(captions)) = (&self.eval_clips, &self.eval_captions) {
            data["eval"] = json!({"clips": print(clips)?, "captions": print(captions)?});
        }
        if let Some(text) = &self.text {
            data["text"] = json!({"conversations": print(text)?, "ratio": self.text_ratio});
        }
        Ok(data)
    }
}

impl DeviceJob for Args {
    type Output = Result<(), String>;

    fn run<B: Backend>(self, device: &B::Device) -> Self::Output {
        let started = Instant::now();
        self.files().check().map_err(|e| e.to_string())?;
        let policy = self
            .policy
            .resolve::<B>(device)
            .map_err(|e| e.to_string())?;
        let lm_policy = match &self.lm_policy {
            Some(spec) => spec.resolve::<B>(device).map_err(|e| e.to_string())?,
            None => policy,
        };
        let config = self.train_config(&policy)?;
        let options = RunOptions {
            max_steps_now: self.max_steps_now,
            model_settings: json!({
                "dino": self.dino,
                "lm": self.lm,
                "variant": format!("{:?}", self.variant).to_lowercase(),
                "readout": format!("{:?}", self.readout).to_lowercase(),
                "frames": self.frames(),
                "frame_fit": format!("{:?}", self.frame_fit).to_lowercase(),
                "replicate_images": self.replicate_images,
                "lambda": self.lambda(),
                "prompt": self.prompt(),
                "policy": policy.to_string(),
                "lm_policy": lm_policy.to_string(),
            }),
            data: self.data()?,
            outputs: vec!["model".into(), "summary.json".into()],
            ..RunOptions::new(&self.out)
        };
        // The run's directory is claimed by `fit`, once everything is checked (the clip cache
        // written before it is keyed by content, whoever reads it).
        let trainer = Trainer::<Autodiff<B>>::new(config, options, device.clone());
        <Autodiff<B> as Backend>::seed(device, self.seed);
        let foveated = FoveatedConfig {
            variant: self.variant,
            query_dim: self.query_dim,
            readout: self.readout,
            lambda_coarse: self.lambda(),
            ..FoveatedConfig::research()
        };
        let model = FoveatedModel::<Autodiff<B>>::from_dirs(
            &self.dino, &self.lm, foveated, device, &policy,
        )
        .map_err(|e| e.to_string())?
        .with_lm_policy(&lm_policy);
        let image_size = model.dino.config().image_size;
        let reader = CaptionedClipReader {
            cache: ImageCache::new(self.cache_dir()),
            spec: self.clip_spec(image_size)?,
            tokens: match self.variant {
                Variant::Research => CaptionTokenizer::from_lm_dir(&self.lm, &self.prompt()),
                Variant::Release => CaptionTokenizer::chat_from_lm_dir(&self.lm, &self.prompt()),
            }
            .map_err(|e| e.to_string())?,
            batch_size: self.batch,
            precision: policy.compute,
        };
        let frames = self.frames().max(self.replicate_images);
        let room = model.target_room(reader.tokens.prompt().len(), frames);
        let train = read::<Autodiff<B>>(&reader, &self.clips, &self.captions, device)?
            .replicating_images(self.replicate_images);
        let train = match &self.text {
            Some(path) => {
                let texts = read_text_samples(path)
                    .and_then(|samples| {
                        (samples.iter())
                            .map(|s| Ok(reader.tokens.conversation(&s.user, &s.assistant)?.ids))
                            .collect::<Result<Vec<_>, _>>()
                    })
                    .map_err(|e| e.to_string())?;
                train
                    .with_text_only(texts, self.text_ratio)
                    .map_err(|e| format!("{}: {e}", path.display()))?
            }
            None => train,
        };
        let eval = match (&self.eval_clips, &self.eval_captions) {
            (Some(clips), Some(captions)) => Some(
                read::<B>(&reader, clips, captions, device)?
                    .replicating_images(self.replicate_images),
            ),
            _ => None,
        };
        train
            .check_room(room)
            .map_err(|e| format!("{}: {e}", self.captions.display()))?;
        if let (Some(eval), Some(captions)) = (&eval, &self.eval_captions) {
            eval.check_room(room)
                .map_err(|e| format!("{}: {e}", captions.display()))?;
        }
        let outcome = trainer
            .fit(model, &train, eval.as_ref())
            .map_err(|e| e.to_string())?;
        if !outcome.finished {
            eprintln!(
                "stopped at step {} of {}: rerun the same command to go on",
                outcome.step, self.steps
            );
            return Ok(());
        }
        let model_dir = self.out.join("model");
        outcome.model.save(&model_dir).map_err(|e| e.to_string())?;
        keep_tokenizer(&self.lm, &model_dir)?;
        let summary = json!({
            "steps": outcome.step,
            "train_clips": train.len(),
            "eval_clips": eval.as_ref().map(CaptionedClips::len),
            "held_out": outcome
                .eval
                .iter()
                .map(|(key, value)| (key.clone(), json!(value)))
                .collect::<serde_json::Map<_, _>>(),
            "skipped_steps": outcome.skipped_steps,
            "device": self.device.to_string(),
            "policy": policy.to_string(),
            "wall_seconds": started.elapsed().as_secs_f64(),
        });
        let summary_path = self.out.join("summary.json");
        kiln::io::write_json(&summary_path, &summary).map_err(|e| e.to_string())?;
        println!("{} and {}", model_dir.display(), summary_path.display());
        Ok(())
    }
}

/// Copies the LM's tokenizer files beside the trained model, so that the model directory is
/// all foveated_caption needs.
fn keep_tokenizer(lm: &Path, model_dir: &Path) -> Result<(), String> {
    const FILES: &[&str] = &[
        "tokenizer.json",
        "tokenizer_config.json",
        "chat_template.jinja",
    ];
    for name in FILES {
        let from = lm.join(name);
        if from.is_file() {
            let file = kiln::io::InputFile::open(&from).map_err(|e| e.to_string())?;
            let bytes = file.read(0..file.len()).map_err(|e| e.to_string())?;
            kiln::io::write_atomic(&model_dir.join(name), &bytes).map_err(|e| e.to_string())?;
        }
    }
    Ok(())
}

/// The captioned clips of `clips` on `device`, saying how many and how the cache served them.
fn read<B: Backend>(
    reader: &CaptionedClipReader,
    clips: &Path,
    captions: &Path,
    device: &B::Device,
) -> Result<CaptionedClips<B>, String> {
    let split = reader
        .read(clips, captions, device)
        .map_err(|e| e.to_string())?;
    let images = split.images();
    let frames = match images.varies() {
        true => format!("1 to {} frames, one a second", images.frames()),
        false => format!("{} frames", images.frames()),
    };
    eprintln!(
        "{}: {} clips of {frames} ({:?})",
        clips.display(),
        split.len(),
        images.outcome()
    );
    Ok(split)
}

fn main() -> ExitCode {
    allocator::keep_freed_memory();
    let args = Args::parse();
    kiln::run_job(args.device, args)
}
