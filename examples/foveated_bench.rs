//! Score a foveated model on multiple-choice questions about clips, as fVLM's `benchmark.py`
//! scores them.
//!
//! ```text
//! cargo run --release --example foveated_bench -- --checkpoint DIR --questions FILE.jsonl
//!     --clips DIR --out DIR [--modes coarse_only,coarse_fine,autoregressive] [--frames N]
//!     [--frame-fit squash|crop] [--still-frames N] [--dino DIR] [--lm DIR] [--cache DIR]
//!     [--device D] [--policy P]
//! ```
//!
//! - `--checkpoint` (and `--dino`, `--lm`): as foveated_caption takes them — a model
//!   foveated_train wrote, or fVLM's own checkpoint over the backbones it was trained from.
//! - `--questions`: JSON Lines, one question a line in fVLM's shard fields and the clip's name
//!   below `--clips`: `{"clip": NAME, "user": "What…?\nA. …\nB. …", "assistant": "B. …",
//!   "source": "mvbench/action"}`. The options are those fVLM's `parse_mcq_options` finds in
//!   `user`, the answer `extract_answer_letter`'s of `assistant`, the category the source's last
//!   part; a question without options is skipped (and counted), as fVLM skips it.
//! - `--clips`: the clips folder (frame folders, GIFs, MP4 with the `video` feature, still
//!   images), read as fVLM's evaluation reads them: one frame a second up to `--frames` (64),
//!   squashed to DINOv2's size, a still image replicated to `--still-frames` (8).
//!
//! Each option is scored in each of `--modes` as `score_options_batched` scores it: the
//! question and the option as the assistant's turn, every option of a question in one batch,
//! the mean cross-entropy of the option's tokens (`FoveatedModel::option_losses`); the lowest
//! is the answer. Writes `OUT/summary.json` (per mode: accuracy in percent, correct, total, and
//! the same per category) and `OUT/answers.jsonl` (per question: the answer, each mode's choice
//! and option losses).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use burn::tensor::backend::Backend;
use clap::Parser;
use kiln::burn;
use kiln::cache::{CachedImages, ClipSpec, VideoSource};
use kiln::core::{DeviceJob, DeviceSpec, Policy, PolicySpec};
use kiln::foveated::{
    CaptionTokenizer, FoveatedModel, Mode, Question, Variant, clip_pixels, read_questions,
};
use kiln::io::RunFiles;
use serde_json::{Value, json};

/// mimalloc, keeping the memory it frees for the next step (docs/PERFORMANCE.md).
#[path = "shared/allocator.rs"]
mod allocator;
#[path = "shared/foveated_checkpoint.rs"]
mod foveated_checkpoint;

use foveated_checkpoint::{CheckpointFlags, ClipFlags, progress};

/// What the run writes into `--out`.
const OUTPUTS: [&str; 2] = ["summary.json", "answers.jsonl"];

/// Score a foveated video-language model on multiple-choice questions.
#[derive(Parser)]
struct Args {
    #[command(flatten)]
    checkpoint: CheckpointFlags,
    /// JSON Lines questions: {"clip", "user", "assistant", "source"} a line.
    #[arg(long)]
    questions: PathBuf,
    /// The folder of the clips the questions name.
    #[arg(long)]
    clips: PathBuf,
    /// The run's directory (summary.json, answers.jsonl).
    #[arg(long)]
    out: PathBuf,
    /// The modes each option is scored in (fVLM's three by default).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "coarse_only,coarse_fine,autoregressive"
    )]
    modes: Vec<ScoredMode>,
    #[command(flatten)]
    clips_read: ClipFlags,
    /// cpu, ndarray, wgpu, vulkan, metal, cuda, cuda:N.
    #[arg(long, default_value = "cpu")]
    device: DeviceSpec,
    /// Precision policy: full, mixed-f16, mixed-bf16, pure-f16, a dtype, or p=..,c=..,o=...
    #[arg(long, default_value = "full")]
    policy: PolicySpec,
}

/// One of fVLM's forward modes, by its name in `benchmark.py`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
#[value(rename_all = "snake_case")]
enum ScoredMode {
    /// The coarse pass alone: every frame read by `q_static`.
    CoarseOnly,
    /// Both passes, the fine queries from the coarse pass (fVLM's training forward).
    CoarseFine,
    /// The fine pass alone, frame by frame (fVLM's inference).
    Autoregressive,
}

impl ScoredMode {
    fn mode(self) -> Mode {
        match self {
            ScoredMode::CoarseOnly => Mode::CoarseOnly,
            ScoredMode::CoarseFine => Mode::CoarseFine,
            ScoredMode::Autoregressive => Mode::Autoregressive,
        }
    }

    /// The name fVLM's results use.
    fn name(self) -> String {
        let name = match self {
            ScoredMode::CoarseOnly => "coarse_only",
            ScoredMode::CoarseFine => "coarse_fine",
            ScoredMode::Autoregressive => "autoregressive",
        };
        name.into()
    }
}

impl Args {
    fn files(&self) -> RunFiles {
        let files = self
            .checkpoint
            .files()
            .input_file("--questions (a JSON Lines file)", &self.questions)
            .input_dir("--clips (a folder of clips)", &self.clips)
            .output_dir("--out", &self.out);
        self.clips_read.files(files)
    }

    /// What identifies the run in `OUT/run.json`.
    fn settings(&self) -> Value {
        json!({
            "checkpoint": self.checkpoint.checkpoint,
            "questions": self.questions,
            "clips": self.clips,
            "modes": self.modes.iter().map(|m| m.name()).collect::<Vec<_>>(),
            "frames": self.clips_read.frames,
            "frame_fit": format!("{:?}", self.clips_read.frame_fit).to_lowercase(),
            "still_frames": self.clips_read.still_frames,
            "policy": self.policy.to_string(),
        })
    }
}

/// Right answers out of those asked, overall and per category, for one mode.
#[derive(Default)]
struct Tally {
    correct: usize,
    total: usize,
    per_category: BTreeMap<String, (usize, usize)>,
}

impl Tally {
    fn add(&mut self, category: &str, right: bool) {
        self.total += 1;
        self.correct += usize::from(right);
        let entry = self.per_category.entry(category.to_string()).or_default();
        entry.0 += usize::from(right);
        entry.1 += 1;
    }

    /// As fVLM's results: accuracy in percent, correct and total, and the same per category.
    fn to_json(&self) -> Value {
        let accuracy = |correct: usize, total: usize| 100.0 * correct as f64 / total.max(1) as f64;
        json!({
            "accuracy": accuracy(self.correct, self.total),
            "correct": self.correct,
            "total": self.total,
            "per_category": self.per_category.iter().map(|(name, &(correct, total))| {
                (name.clone(), json!({
                    "accuracy": accuracy(correct, total), "correct": correct, "total": total,
                }))
            }).collect::<serde_json::Map<_, _>>(),
        })
    }
}

impl DeviceJob for Args {
    type Output = Result<(), String>;

    fn run<B: Backend>(self, device: &B::Device) -> Self::Output {
        let started = Instant::now();
        let questions = read_questions(&self.questions).map_err(|e| e.to_string())?;
        let policy: Policy = self
            .policy
            .resolve::<B>(device)
            .map_err(|e| e.to_string())?;
        let (model, tokenizer_dir) = (self.checkpoint.source())
            .load::<B>(device, &policy)
            .map_err(|e| e.to_string())?;
        if model.config().variant != Variant::Release {
            return Err(format!(
                "{}: a research-variant model; fVLM's benchmark scores the release variant",
                self.checkpoint.checkpoint.display()
            ));
        }
        let tokens =
            CaptionTokenizer::chat_from_lm_dir(&tokenizer_dir, "").map_err(|e| e.to_string())?;
        let fit = self
            .clips_read
            .frame_fit
            .preprocess(model.dino.config().image_size);
        let spec = ClipSpec::per_second(self.clips_read.frames(), fit);
        let clips = (self.clips_read.cache())
            .load_clips(&VideoSource::Folder(self.clips.clone()), &spec)
            .map_err(|e| e.to_string())?;
        let index: BTreeMap<&str, usize> = clips.names().enumerate().map(|(i, n)| (n, i)).collect();
        if let Some((line, question)) =
            (questions.iter().enumerate()).find(|(_, q)| !index.contains_key(q.clip.as_str()))
        {
            return Err(format!(
                "{}, question {}: no clip '{}' in {}",
                self.questions.display(),
                line + 1,
                question.clip,
                self.clips.display()
            ));
        }
        kiln::train::claim(&self.out, &self.settings(), &OUTPUTS.map(String::from))
            .map_err(|e| e.to_string())?;

        let scorer = Scorer {
            model: &model,
            tokens: &tokens,
            clips: &clips,
            index: &index,
            modes: &self.modes,
            still_frames: self.clips_read.still_frames,
            device,
            policy: &policy,
        };
        let mut tallies: BTreeMap<String, Tally> = BTreeMap::new();
        let (mut answers, mut skipped) = (String::new(), 0);
        let bar = progress(questions.len() as u64, "questions");
        for (number, question) in questions.iter().enumerate() {
            bar.inc(1);
            let Some(scored) = scorer
                .score(question)
                .map_err(|e| format!("question {}: {e}", number + 1))?
            else {
                skipped += 1;
                continue;
            };
            let (answer, category) = (question.answer(), question.category());
            for (mode, scored) in &scored {
                let tally = tallies.entry(mode.clone()).or_default();
                tally.add(&category, scored.letter == answer);
            }
            let line = json!({
                "clip": question.clip, "category": category, "answer": answer,
                "chosen": scored.iter().map(|(mode, s)| (mode.clone(), json!(s.letter)))
                    .collect::<serde_json::Map<_, _>>(),
                "losses": scored.iter().map(|(mode, s)| (mode.clone(), json!(s.losses)))
                    .collect::<serde_json::Map<_, _>>(),
            });
            answers.push_str(&format!("{line}\n"));
        }
        bar.finish_and_clear();
        let summary = json!({
            "modes": tallies.iter().map(|(mode, tally)| (mode.clone(), tally.to_json()))
                .collect::<serde_json::Map<_, _>>(),
            "questions": questions.len(),
            "skipped_without_options": skipped,
            "device": self.device.to_string(),
            "policy": policy.to_string(),
            "wall_seconds": started.elapsed().as_secs_f64(),
        });
        kiln::io::write_atomic(&self.out.join("answers.jsonl"), answers.as_bytes())
            .map_err(|e| e.to_string())?;
        let summary_path = self.out.join("summary.json");
        kiln::io::write_json(&summary_path, &summary).map_err(|e| e.to_string())?;
        for (mode, tally) in &tallies {
            eprintln!(
                "{mode}: {:.1}% ({}/{})",
                100.0 * tally.correct as f64 / tally.total.max(1) as f64,
                tally.correct,
                tally.total
            );
        }
        println!("{}", summary_path.display());
        Ok(())
    }
}

/// A mode's answer to a question: the option of lowest loss, and every option's loss.
struct Scored {
    letter: String,
    losses: BTreeMap<String, f64>,
}

/// Everything a question is scored with.
struct Scorer<'a, B: Backend> {
    model: &'a FoveatedModel<B>,
    tokens: &'a CaptionTokenizer,
    clips: &'a CachedImages,
    index: &'a BTreeMap<&'a str, usize>,
    modes: &'a [ScoredMode],
    still_frames: usize,
    device: &'a B::Device,
    policy: &'a Policy,
}

impl<B: Backend> Scorer<'_, B> {
    /// Each mode's answer to `question`, by the mode's name; `None` when it lists no options.
    fn score(&self, question: &Question) -> Result<Option<BTreeMap<String, Scored>>, String> {
        let options = question.options();
        if options.is_empty() {
            return Ok(None);
        }
        let texts: Vec<&str> = options.values().map(String::as_str).collect();
        let (start, ids) = self
            .tokens
            .options(&question.user, &texts)
            .map_err(|e| e.to_string())?;
        let clip = self.index[question.clip.as_str()];
        let pixels = clip_pixels::<B>(
            self.clips,
            clip,
            self.still_frames,
            self.device,
            self.policy.compute,
        )
        .map_err(|e| e.to_string())?;
        let mut scored = BTreeMap::new();
        for mode in self.modes {
            let losses = self
                .model
                .option_losses(pixels.clone(), &ids, start, self.tokens.pad(), mode.mode())
                .map_err(|e| e.to_string())?;
            let losses: BTreeMap<String, f64> =
                (options.keys().map(char::to_string)).zip(losses).collect();
            // The lowest loss, the first letter among equals (fVLM's `min` over sorted letters).
            let letter = losses
                .iter()
                .fold(
                    None,
                    |best: Option<(&String, f64)>, (letter, &loss)| match best {
                        Some((_, lowest)) if lowest <= loss => best,
                        _ => Some((letter, loss)),
                    },
                )
                .map(|(letter, _)| letter.clone())
                .expect("a question with options");
            scored.insert(mode.name(), Scored { letter, losses });
        }
        Ok(Some(scored))
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
