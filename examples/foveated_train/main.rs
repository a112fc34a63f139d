//! Train the foveated model (`kiln::foveated`) on any folder of clips with captions.
//!
//! ```text
//! cargo run --release --example foveated_train -- --clips DIR --captions FILE --dino DIR \
//!     --lm DIR --out DIR [--frames T] [--steps N] [--batch B] [--accumulate K]
//!     [--variant release|research] [--readout deep|shallow] [--lambda L] [--connector-lr X]
//!     [--backbone-lr Y] [--prompt TEXT] [--policy full|mixed-bf16] [--lm-policy P] [--device D]
//!     [--replicate-images N] [--text FILE [--text-ratio R]]
//!     [--eval-clips DIR --eval-captions FILE]
//!     [--stage 1|2|3 [--init-from DIR] [--pairs FILE]]
//! ```
//!
//! `--stage` runs one of fVLM's training stages at its released budget (`configs/stage*_135M.yaml`):
//! an effective batch of 32 (`--batch 8 --accumulate 4`; stage 3: 4 × 8), 31 250 optimizer steps
//! (1M samples; stage 3: 2 593, RLAIF-V's 83k pairs once), the stage's rates and schedule, and its
//! data — stage 1 scores every token of each conversation (truncated at 512 tokens), stage 2 the
//! answer alone (1 024; still images replicated to 8 frames), stage 3 trains by DPO on the
//! preference pairs of `--pairs` (JSON Lines, `{"video": NAME, "chosen": TEXT, "rejected": TEXT}`
//! with optional `user` and `source`; one pair a clip) against a frozen copy of the model it
//! starts from. `--init-from` is that model: the previous stage's `OUT/model`, or fVLM's
//! checkpoint directory (with `--dino` and `--lm`, the backbones it was trained from); the model's
//! own design is kept (`--variant`, `--readout`, `--query-dim` and `--lambda` are not read).
//! Any flag given explicitly overrides the stage's value. Truncated conversations are counted in
//! a warning. When the run ends (or stops with `--max-steps-now`), it prints how long the stage's
//! whole budget would take on this machine from the median step time, and writes it to
//! `summary.json`.
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
//!   clips folder, with optional `"user"` (the user's turn) and `"source"` (fVLM's per-source
//!   prompts: `openvid`, `webvid`, `vript`, `sharegpt4video`, else "Describe this."); every clip
//!   needs a caption and every caption its clip. Captions are tokenised once (the LM
//!   directory's tokenizer): release, each as the assistant's turn of fVLM's conversation (its
//!   chat template closes the turn; no end-of-sequence token is added), the user's turn the
//!   line's own, else its source's prompt, else `--prompt`; research, followed by the
//!   end-of-sequence token.
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
use burn::module::AutodiffModule;
use burn::tensor::backend::Backend;
use clap::Parser;
use kiln::burn;
use kiln::cache::{ClipSpec, ImageCache};
use kiln::core::{DeviceJob, DeviceSpec, Policy, PolicySpec, Precision};
use kiln::foveated::{
    CaptionTokenizer, CaptionedClipReader, CaptionedClips, FVLM_CAPTION_PROMPT, FoveatedConfig,
    FoveatedModel, FrameFit, PreferenceBatch, PreferenceTraining, Readout, ReleaseRecipe,
    ReleaseStage, Variant, dinov2_frames, research_recipe,
};
use kiln::io::RunFiles;
use kiln::train::{HostData, LossScaling, Outcome, RunOptions, TrainConfig, Trainer};
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
    #[arg(long, required_unless_present = "pairs", conflicts_with = "pairs")]
    captions: Option<PathBuf>,
    /// fVLM's training stage at its budget: 1 (alignment), 2 (instruction tuning, answers
    /// scored), 3 (DPO on --pairs). Release variant.
    #[arg(long)]
    stage: Option<ReleaseStage>,
    /// The model the stage starts from: foveated_train's OUT/model, or fVLM's checkpoint
    /// directory over --dino and --lm.
    #[arg(long)]
    init_from: Option<PathBuf>,
    /// Stage 3: JSON Lines preference pairs, `{"video": NAME, "chosen": TEXT, "rejected":
    /// TEXT}` a clip.
    #[arg(long)]
    pairs: Option<PathBuf>,
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
    /// Copies of a one-frame clip (a still image) it becomes [default: the stage's, fVLM's 1 in
    /// stage 1 and 8 after].
    #[arg(long, value_parser = kiln::cli::count, allow_negative_numbers = true)]
    replicate_images: Option<usize>,
    /// JSON Lines of text-only conversations, `{"user": TEXT, "assistant": TEXT}` a line,
    /// trained without frames.
    #[arg(long)]
    text: Option<PathBuf>,
    /// The share of batches that are text-only (with `--text`).
    #[arg(long, default_value_t = 0.14, requires = "text", value_parser = kiln::cli::non_negative, allow_negative_numbers = true)]
    text_ratio: f64,
    /// Optimizer steps [default: the stage's budget; 1000 without --stage].
    #[arg(long, value_parser = kiln::cli::count_u64, allow_negative_numbers = true)]
    steps: Option<u64>,
    /// Clips per micro-batch [default: the stage's; 2 without --stage].
    #[arg(long, value_parser = kiln::cli::count, allow_negative_numbers = true)]
    batch: Option<usize>,
    /// Micro-batches per optimizer step [default: the stage's; 1 without --stage].
    #[arg(long, value_parser = kiln::cli::count, allow_negative_numbers = true)]
    accumulate: Option<usize>,
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
                self.steps(),
                self.connector_lr.unwrap_or(1e-3),
                self.backbone_lr.unwrap_or(1e-5),
            ),
            Variant::Release => {
                let stage = self.stage.unwrap_or_default().recipe_135m();
                let backbone = self.backbone_lr.unwrap_or(stage.lr_dino);
                let recipe = ReleaseRecipe {
                    lr_connector: self.connector_lr.unwrap_or(stage.lr_connector),
                    lr_dino: backbone,
                    lr_llm: backbone,
                    ..stage
                };
                match self.pairs {
                    Some(_) => recipe.preference_train_config(self.steps()),
                    None => recipe.train_config(self.steps()),
                }
            }
        };
        config.accumulate = self.accumulate();
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

    /// Refuses flags that do not go together, before any work.
    fn check(&self) -> Result<(), String> {
        let Some(stage) = self.stage else {
            return match (&self.init_from, &self.pairs) {
                (Some(_), _) | (_, Some(_)) => {
                    Err("--init-from and --pairs go with --stage (fVLM's stages)".into())
                }
                _ => Ok(()),
            };
        };
        if self.variant != Variant::Release {
            return Err(format!(
                "--stage {}: fVLM's stages train the release variant, not --variant research",
                stage.number()
            ));
        }
        let preference = stage == ReleaseStage::Preference;
        if preference != self.pairs.is_some() {
            return Err(match preference {
                true => "--stage 3 trains on preference pairs: give --pairs FILE".into(),
                false => format!("--pairs is stage 3's data, not {stage}'s"),
            });
        }
        if preference && (self.text.is_some() || self.eval_clips.is_some()) {
            return Err(
                "--stage 3 (fVLM's DPO) trains on --pairs alone: no --text, no \
                        held-out captions"
                    .into(),
            );
        }
        if stage != ReleaseStage::Alignment && self.init_from.is_none() {
            eprintln!(
                "warning: fVLM starts {stage} from the previous stage's model (--init-from); this \
                 run starts from the backbones and new connectors"
            );
        }
        Ok(())
    }

    /// `--steps`, else the stage's budget, else 1000.
    fn steps(&self) -> u64 {
        (self.steps).unwrap_or(self.stage.map_or(1000, ReleaseStage::steps))
    }

    /// `--batch`, else the stage's micro-batch, else 2.
    fn batch(&self) -> usize {
        (self.batch).unwrap_or(self.stage.map_or(2, ReleaseStage::micro_batch))
    }

    /// `--accumulate`, else the stage's, else 1.
    fn accumulate(&self) -> usize {
        (self.accumulate).unwrap_or(self.stage.map_or(1, ReleaseStage::accumulation))
    }

    /// `--replicate-images`, else the stage's (1 without a stage).
    fn replicate_images(&self) -> usize {
        (self.replicate_images).unwrap_or(self.stage.unwrap_or_default().replicate_images())
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
            .input("the DINOv2 directory (--dino)", &self.dino)
            .input("the language model directory (--lm)", &self.lm);
        for (what, path) in [
            ("the training captions (--captions)", &self.captions),
            ("the preference pairs (--pairs)", &self.pairs),
            ("the model to start from (--init-from)", &self.init_from),
        ] {
            if let Some(path) = path {
                files = files.input(what, path);
            }
        }
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
        let mut data = json!({"train": {"clips": print(&self.clips)?}});
        for (name, path) in [
            ("captions", &self.captions),
            ("pairs", &self.pairs),
            ("init_from", &self.init_from),
        ] {
            if let Some(path) = path {
                data["train"][name] = json!(print(path)?);
            }
        }
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
        self.check()?;
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
                "stage": self.stage.map(ReleaseStage::number),
                "frames": self.frames(),
                "frame_fit": format!("{:?}", self.frame_fit).to_lowercase(),
                "replicate_images": self.replicate_images(),
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
        let model = self
            .model::<Autodiff<B>>(device, &policy)?
            .with_lm_policy(&lm_policy);
        let image_size = model.dino.config().image_size;
        let tokens = match self.variant {
            Variant::Research => CaptionTokenizer::from_lm_dir(&self.lm, &self.prompt()),
            Variant::Release => CaptionTokenizer::chat_from_lm_dir(&self.lm, &self.prompt())
                .map(|tokens| tokens.for_stage(self.stage.unwrap_or_default())),
        }
        .map_err(|e| e.to_string())?;
        let reader = CaptionedClipReader {
            cache: ImageCache::new(self.cache_dir()),
            spec: self.clip_spec(image_size)?,
            tokens,
            batch_size: self.batch(),
            precision: policy.compute,
        };
        let frames = self.frames().max(self.replicate_images());
        let room = model.target_room(reader.tokens.prompt().len(), frames);
        let (outcome, clips) = match &self.pairs {
            Some(pairs) => self.fit_preferences(&trainer, model, &reader, pairs, room, device)?,
            None => self.fit_captions(&trainer, model, &reader, room, device)?,
        };
        let timing = self.budget_timing()?;
        if !outcome.finished {
            eprintln!(
                "stopped at step {} of {}: rerun the same command to go on",
                outcome.step,
                self.steps()
            );
            return Ok(());
        }
        let model_dir = self.out.join("model");
        outcome.model.save(&model_dir).map_err(|e| e.to_string())?;
        keep_tokenizer(&self.lm, &model_dir)?;
        let summary = json!({
            "steps": outcome.step,
            "train_clips": clips.train,
            "eval_clips": clips.eval,
            "held_out": outcome
                .eval
                .iter()
                .map(|(key, value)| (key.clone(), json!(value)))
                .collect::<serde_json::Map<_, _>>(),
            "skipped_steps": outcome.skipped_steps,
            "device": self.device.to_string(),
            "policy": policy.to_string(),
            "wall_seconds": started.elapsed().as_secs_f64(),
            "budget": timing,
        });
        let summary_path = self.out.join("summary.json");
        kiln::io::write_json(&summary_path, &summary).map_err(|e| e.to_string())?;
        println!("{} and {}", model_dir.display(), summary_path.display());
        Ok(())
    }
}

/// How training ended, and on how many clips.
type Trained<B> = (Outcome<FoveatedModel<Autodiff<B>>>, ClipCounts);

/// Clips in the training and the held-out split.
struct ClipCounts {
    train: usize,
    eval: Option<usize>,
}

impl Args {
    /// The model training starts from: `--init-from` (its own design), else DINOv2 and the LM
    /// with new connectors in the flags' design.
    fn model<B: Backend>(
        &self,
        device: &B::Device,
        policy: &Policy,
    ) -> Result<FoveatedModel<B>, String> {
        let text = |e: kiln::foveated::FoveatedError| e.to_string();
        let Some(init) = &self.init_from else {
            let foveated = FoveatedConfig {
                variant: self.variant,
                query_dim: self.query_dim,
                readout: self.readout,
                lambda_coarse: self.lambda(),
                ..FoveatedConfig::research()
            };
            return FoveatedModel::<B>::from_dirs(&self.dino, &self.lm, foveated, device, policy)
                .map_err(text);
        };
        let model = match init.join("config.json").is_file() {
            true => FoveatedModel::<B>::load(init, device, policy),
            false => {
                FoveatedModel::<B>::from_fvlm_checkpoint(init, &self.dino, &self.lm, device, policy)
            }
        }
        .map_err(|e| format!("--init-from: {e}"))?;
        if model.config().variant != Variant::Release {
            return Err(format!(
                "--init-from {}: a research-variant model; fVLM's stages train the release variant",
                init.display()
            ));
        }
        Ok(model)
    }

    /// Stages 1 and 2 (and runs without a stage): the captioned clips, with the text-only
    /// conversations mixed in.
    fn fit_captions<B: Backend>(
        &self,
        trainer: &Trainer<Autodiff<B>>,
        model: FoveatedModel<Autodiff<B>>,
        reader: &CaptionedClipReader,
        room: usize,
        device: &B::Device,
    ) -> Result<Trained<B>, String> {
        let captions = self
            .captions
            .as_ref()
            .expect("clap requires --captions without --pairs");
        let replicate = self.replicate_images();
        let train = read::<Autodiff<B>>(reader, &self.clips, captions, device)?
            .replicating_images(replicate);
        let train = match &self.text {
            Some(path) => {
                let texts = (reader.tokens.read_text_samples(path)).map_err(|e| e.to_string())?;
                train
                    .with_text_only(texts, self.text_ratio)
                    .map_err(|e| format!("{}: {e}", path.display()))?
            }
            None => train,
        };
        let eval = match (&self.eval_clips, &self.eval_captions) {
            (Some(clips), Some(captions)) => {
                Some(read::<B>(reader, clips, captions, device)?.replicating_images(replicate))
            }
            _ => None,
        };
        train
            .check_room(room)
            .map_err(|e| format!("{}: {e}", captions.display()))?;
        if let (Some(eval), Some(captions)) = (&eval, &self.eval_captions) {
            eval.check_room(room)
                .map_err(|e| format!("{}: {e}", captions.display()))?;
        }
        let outcome = trainer
            .fit(model, &train, eval.as_ref())
            .map_err(|e| e.to_string())?;
        let counts = ClipCounts {
            train: train.len(),
            eval: eval.as_ref().map(CaptionedClips::len),
        };
        Ok((outcome, counts))
    }

    /// Stage 3: DPO on the preference pairs against a frozen copy of the starting model.
    fn fit_preferences<B: Backend>(
        &self,
        trainer: &Trainer<Autodiff<B>>,
        model: FoveatedModel<Autodiff<B>>,
        reader: &CaptionedClipReader,
        pairs: &Path,
        room: usize,
        device: &B::Device,
    ) -> Result<Trained<B>, String> {
        let reference = model.valid();
        let train = reader
            .read_pairs::<Autodiff<B>>(&self.clips, pairs, reference, device)
            .map_err(|e| e.to_string())?
            .replicating_images(self.replicate_images());
        train
            .check_room(room)
            .map_err(|e| format!("{}: {e}", pairs.display()))?;
        eprintln!("{}: {} preference pairs", pairs.display(), train.len());
        let outcome = trainer
            .fit(
                PreferenceTraining { policy: model },
                &train,
                None::<&NoEval<B>>,
            )
            .map_err(|e| e.to_string())?;
        let outcome = outcome.map_model(|training| training.policy);
        let counts = ClipCounts {
            train: train.len(),
            eval: None,
        };
        Ok((outcome, counts))
    }

    /// How long the whole budget takes here, from the median step time in `metrics.jsonl`,
    /// printed and returned for the summary.
    fn budget_timing(&self) -> Result<serde_json::Value, String> {
        let lines = kiln::train::read_metrics(&self.out).map_err(|e| e.to_string())?;
        let mut times: Vec<f64> = (lines.iter().skip(1))
            .filter_map(|line| line.get("step_time_s")?.as_f64())
            .collect();
        if times.is_empty() {
            return Ok(serde_json::Value::Null);
        }
        times.sort_by(f64::total_cmp);
        let step = times[times.len() / 2];
        let samples_a_step = (self.batch() * self.accumulate()) as f64;
        let sample = step / samples_a_step;
        let (samples, whose) = match self.stage {
            Some(stage) => (
                stage.samples() as f64,
                format!(
                    "fVLM's {stage} budget ({} samples, {} steps of 32)",
                    stage.samples(),
                    stage.steps()
                ),
            ),
            None => (self.steps() as f64 * samples_a_step, "this run".into()),
        };
        let hours = sample * samples / 3600.0;
        eprintln!(
            "{sample:.3} s a sample here (a step of {} x {} took {step:.2} s, the median of {}): \
             {whose} would take {hours:.1} h on this machine",
            self.batch(),
            self.accumulate(),
            times.len()
        );
        Ok(
            json!({"step_seconds": step, "sample_seconds": sample, "samples": samples, "hours": hours}),
        )
    }
}

/// No held-out pairs: stage 3 evaluates nothing, as fVLM's.
type NoEval<B> = HostData<(), fn(()) -> PreferenceBatch<B>>;

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
