//! LatentWire (`kiln::latentwire`): texts compressed into `M` latent vectors that frozen language
//! models read as a soft prompt, trained on a seeded extractive QA set and evaluated on held-out
//! people, places and phrasings.
//!
//! ```text
//! cargo run --release --example latentwire -- --lm DIR[,DIR] --out DIR [--latents M]
//!     [--steps N] [--max-steps-now N] [--batch B] [--policy P] [--device D]
//!     [--lr X] [--train-items N] [--eval-items N] [--eval-every N] [--encoder bytes|states]
//!     [--encoder-layers N] [--seed S] [--layout chat|latentwire]
//! ```
//!
//! - `--lm`: Hugging Face directories of Llama-family chat models (config.json, weights,
//!   tokenizer.json, tokenizer_config.json with a chat template), comma-separated; without,
//!   two tiny built-in random models run the pipeline (and measure nothing).
//! - `--layout latentwire`: LatentWire's own prompt, the latent prefix alone at position 0 (no
//!   template, no anchor) and answers tokenized alone; the default `chat` puts every prompt in
//!   the chat template's user turn with the `Answer:` anchor after it (docs/LATENTWIRE.md).
//! - Trains the interlingua encoder and one adapter per model through kiln-train under
//!   LatentWire's objective (AdamW at `--lr`, weight decay 0.01, clipping at 1, cosine decay to
//!   0.02 × lr counted in optimizer steps), the models frozen.
//!
//! Writes into OUT: `metrics.jsonl` (one line per step, the held-out scores every
//! `--eval-every`), `curves.png` (held-out NLL and first-token accuracy per prompt kind, per
//! model), `summary.json` (per model: `text`, `latent` and `token_budget`, each with `nll`,
//! `first_token_accuracy`, `em`, `f1`, and `compression`, `payload_bytes`; added: the
//! baselines `question_only`, `token_budget_question` and `shuffled_latent`, each kind's
//! `first_content_token_accuracy`, LatentWire's `em_clean` and `f1_clean`, standard errors,
//! `by_relation`, `prompt_compression`, `prefix_spread`; at the top `layout`, `latent_spread`
//! and, with two models, LatentWire's `joint` scores), `tokens/` (the splits tokenized once)
//! and `checkpoints/`: rerunning the same command resumes exactly.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use burn::backend::Autodiff;
use burn::module::AutodiffModule;
use burn::tensor::backend::Backend;
use clap::Parser;
use indicatif::{ProgressBar, ProgressStyle};
use kiln::burn;
use kiln::core::{DeviceJob, DeviceSpec, PolicySpec};
use kiln::io::RunFiles;
use kiln::latentwire::{
    EncoderConfig, EncoderKind, Evaluation, FrozenReaders, LatentWire, LatentWireTraining, Layout,
    Objective, QaItem, Reader, Report, Split, TokenizedSplit, generate, tiny_readers,
};
use kiln::train::{HostData, OptimizerConfig, RunOptions, Schedule, TrainConfig, Trainer};
use serde_json::json;

/// mimalloc, keeping the memory it frees for the next step (docs/PERFORMANCE.md).
#[path = "../shared/allocator.rs"]
mod allocator;

/// Train LatentWire's interlingua and adapters for frozen language models.
#[derive(Parser)]
struct Args {
    /// Hugging Face chat-model directories, comma-separated [default: two tiny built-in random
    /// models, to show the pipeline].
    #[arg(long, value_delimiter = ',')]
    lm: Vec<PathBuf>,
    /// The run's directory (metrics, curves, summary, tokens, checkpoints).
    #[arg(long)]
    out: PathBuf,
    /// Latent vectors per text, M.
    #[arg(long, default_value_t = 16, value_parser = kiln::cli::count_up_to::<4096>, allow_negative_numbers = true)]
    latents: usize,
    /// Optimizer steps.
    #[arg(long, default_value_t = 1000, value_parser = kiln::cli::count_u64, allow_negative_numbers = true)]
    steps: u64,
    /// Stop this process after this many optimizer steps (rerun to go on).
    #[arg(long, value_parser = kiln::cli::count_u64, allow_negative_numbers = true)]
    max_steps_now: Option<u64>,
    /// Items per step.
    #[arg(long, default_value_t = 8, value_parser = kiln::cli::count_up_to::<4096>, allow_negative_numbers = true)]
    batch: usize,
    /// Precision policy of the frozen language models' forwards: full, mixed-bf16, or
    /// p=..,c=... (the encoder and adapters train in f32).
    #[arg(long, default_value = "full")]
    policy: PolicySpec,
    /// cpu, ndarray, wgpu, vulkan, metal, cuda, cuda:N.
    #[arg(long, default_value = "cpu")]
    device: DeviceSpec,
    /// Peak learning rate (LatentWire's: 1e-4).
    #[arg(long, default_value_t = 1e-4, value_parser = kiln::cli::positive, allow_negative_numbers = true)]
    lr: f64,
    /// Training items generated.
    #[arg(long, default_value_t = 4000, value_parser = kiln::cli::count_up_to::<10_000_000>, allow_negative_numbers = true)]
    train_items: usize,
    /// Held-out items generated (the test split's people, places and phrasings; at least 2: the
    /// shuffled-latent baseline reads each with another's latent).
    #[arg(long, default_value_t = 100, value_parser = at_least_two_items, allow_negative_numbers = true)]
    eval_items: usize,
    /// Evaluate (and checkpoint) every this many steps; above `--steps`, the curves are not
    /// scored during training and only the final evaluation runs.
    #[arg(long, default_value_t = 100, value_parser = kiln::cli::count_u64, allow_negative_numbers = true)]
    eval_every: u64,
    /// What the interlingua reads: `bytes` (LatentWire's byte encoder) or `states` (the first
    /// language model's hidden states of the text, pooled by the same learned queries).
    #[arg(long, default_value = "bytes", value_parser = parse_encoder)]
    encoder: EncoderKind,
    /// Transformer layers of the byte encoder (LatentWire's: 6).
    #[arg(long, default_value_t = 6, value_parser = kiln::cli::count_up_to::<64>, allow_negative_numbers = true)]
    encoder_layers: usize,
    /// Seeds the data, the initial weights and the order of the items.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// How the language models read the prompts: `chat` (kiln's: the chat template's user turn,
    /// then the `Answer:` anchor) or `latentwire` (LatentWire's: the latent prefix alone at
    /// position 0, answers tokenized alone).
    #[arg(long, default_value = "chat", value_parser = Layout::parse)]
    layout: Layout,
}

/// A count of held-out items, at least 2.
fn at_least_two_items(text: &str) -> Result<usize, String> {
    let count = kiln::cli::count_up_to::<1_000_000>(text).map_err(|e| e.to_string())?;
    if count < 2 {
        return Err(format!(
            "{count}: evaluation needs at least 2 items (the shuffled-latent baseline reads each \
             item with another's latent)"
        ));
    }
    Ok(count)
}

/// `bytes` or `states`.
fn parse_encoder(text: &str) -> Result<EncoderKind, String> {
    match text {
        "bytes" => Ok(EncoderKind::Bytes),
        "states" => Ok(EncoderKind::States),
        _ => Err(format!("{text:?}: the encoder reads `bytes` or `states`")),
    }
}

impl Args {
    /// LatentWire's recipe at this run's length: AdamW on every parameter (decay 0.01),
    /// clipping at 1, cosine from `--lr` to 0.02 × `--lr` without warm-up, in optimizer steps.
    fn train_config(&self) -> Result<TrainConfig, String> {
        let mut config = TrainConfig::new(self.steps, self.lr);
        config.optimizer = OptimizerConfig::adamw(self.lr).with_weight_decay(0.01);
        config.schedule = Schedule::warmup_cosine(0, 1.0, 0.02, self.steps);
        config.max_grad_norm = Some(1.0);
        config.eval_every = self.eval_every;
        config.checkpoint_every = self.eval_every;
        config.seed = self.seed;
        config.validate().map_err(|e| e.to_string())?;
        Ok(config)
    }

    fn files(&self) -> RunFiles {
        let files = (self.lm.iter()).fold(RunFiles::new(), |files, lm| {
            files.input_dir(
                "--lm (Hugging Face chat-model directories; GGUF files are not read here)",
                lm,
            )
        });
        files.output_dir("--out", &self.out)
    }

    /// The readers: `--lm`'s directories, else the built-in tiny models (said).
    fn readers<B: Backend>(&self, device: &B::Device) -> Result<Vec<Reader<B>>, String> {
        if self.lm.is_empty() {
            eprintln!(
                "no --lm: two tiny built-in random language models run the pipeline; they know \
                 nothing, so their scores measure nothing"
            );
            return tiny_readers(device).map_err(|e| e.to_string());
        }
        let mut readers: Vec<Reader<B>> = Vec::new();
        for dir in &self.lm {
            let reader = Reader::from_hf_dir(dir, device).map_err(|e| e.to_string())?;
            if readers.iter().any(|r| r.name() == reader.name()) {
                return Err(format!(
                    "--lm {}: two language models named {:?} (their results are kept by name)",
                    dir.display(),
                    reader.name()
                ));
            }
            readers.push(reader);
        }
        Ok(readers)
    }
}

impl Args {
    /// The training and held-out splits, tokenized for `readers` (read back from OUT/tokens
    /// when made alike before), and the held-out items.
    fn splits<B: Backend>(
        &self,
        readers: &[Reader<B>],
    ) -> Result<(TokenizedSplit, TokenizedSplit, Vec<QaItem>), String> {
        let tokenizers: Vec<_> = (readers.iter())
            .map(|r| {
                let template = r.template();
                let vocab = r.tokenizer().vocab_size();
                json!([r.name(), template.before, template.after, vocab])
            })
            .collect();
        let split = |split: Split, count: usize, file: &str| {
            let items = generate(split, count, self.seed);
            let key = json!({"split": file, "items": count, "seed": self.seed,
                             "readers": tokenizers, "layout": self.layout});
            let path = self.out.join("tokens").join(format!("{file}.json"));
            let tokenized = TokenizedSplit::cached(&path, &items, readers, &key.to_string())
                .map_err(|e| format!("the {file} split: {e}"))?;
            Ok::<_, String>((tokenized, items))
        };
        let (train, _) = split(Split::Train, self.train_items, "train")?;
        let (held_out, items) = split(Split::Test, self.eval_items, "test")?;
        Ok((train, held_out, items))
    }

    /// `summary.json` of the held-out `report`, and a line per model on stdout.
    fn write_summary(&self, report: &Report, steps: u64, started: Instant) -> Result<(), String> {
        let reports = &report.readers;
        let mut summary = serde_json::Map::new();
        for report in reports {
            summary.insert(report.name.clone(), json!(report));
        }
        summary.insert("steps".into(), json!(steps));
        summary.insert("latents".into(), json!(self.latents));
        summary.insert("layout".into(), json!(self.layout));
        summary.insert("latent_spread".into(), json!(report.latent_spread));
        if let Some(joint) = &report.joint {
            summary.insert("joint".into(), json!(joint));
        }
        let seconds = started.elapsed().as_secs_f64();
        summary.insert("wall_seconds".into(), json!(seconds));
        let path = self.out.join("summary.json");
        kiln::io::write_json(&path, &summary).map_err(|e| e.to_string())?;
        for r in reports {
            println!(
                "{}: answer NLL text {:.3}, latent {:.3}, token budget {:.3}; first-token \
                 accuracy {:.3} / {:.3} / {:.3}; {:.1} text tokens per latent",
                r.name,
                r.text.nll,
                r.latent.nll,
                r.token_budget.nll,
                r.text.first_token_accuracy,
                r.latent.first_token_accuracy,
                r.token_budget.first_token_accuracy,
                r.compression,
            );
            println!(
                "{}: first content-token accuracy text {:.3}, latent {:.3}, question only {:.3}, \
                 question-first budget {:.3}, another item's latent {:.3}",
                r.name,
                r.text.first_content_token_accuracy,
                r.latent.first_content_token_accuracy,
                r.question_only.first_content_token_accuracy,
                r.token_budget_question.first_content_token_accuracy,
                r.shuffled_latent.first_content_token_accuracy,
            );
        }
        println!("{} and curves.png, metrics.jsonl beside it", path.display());
        Ok(())
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
        let config = self.train_config()?;
        <Autodiff<B> as Backend>::seed(device, self.seed);
        let readers: Vec<Reader<B>> = (self.readers::<B>(device)?.into_iter())
            .map(|reader| reader.with_layout(self.layout)?.with_policy(&policy))
            .collect::<Result<_, _>>()
            .map_err(|e| format!("--policy {}: {e}", self.policy))?;
        let names: Vec<String> = readers.iter().map(|r| r.name().to_string()).collect();
        let encoder = EncoderConfig::new(self.latents).with_layers(self.encoder_layers);
        let options = RunOptions {
            max_steps_now: self.max_steps_now,
            model_settings: json!({
                "lm": self.lm,
                // What the frozen models are, not only where: weights replaced at the same
                // path are another run's models, refused at resume.
                "lm_fingerprints": (self.lm.iter())
                    .map(|dir| kiln::io::fingerprint(dir).map_err(|e| e.to_string()))
                    .collect::<Result<Vec<_>, _>>()?,
                "readers": names,
                "latents": self.latents,
                "encoder": {"reads": format!("{:?}", self.encoder), "width": encoder.width,
                            "layers": encoder.layers, "heads": encoder.heads},
                "objective": Objective::new(),
                "policy": policy.to_string(),
                "layout": self.layout,
            }),
            data: json!({"train_items": self.train_items, "eval_items": self.eval_items, "seed": self.seed}),
            // The tokenized splits are this run's too: the directory is claimed before they
            // are written, and they are keyed by what made them, whoever reads them back.
            outputs: ["summary.json", "curves.png", "tokens"]
                .map(String::from)
                .into(),
            ..RunOptions::new(&self.out)
        };
        let trainer = Trainer::<Autodiff<B>>::new(config, options, device.clone());
        trainer.claim().map_err(|e| e.to_string())?;
        let (train, held_out, eval_items) = self.splits(&readers)?;
        let widths: Vec<usize> = readers.iter().map(Reader::model_width).collect();
        let model = LatentWire::<Autodiff<B>>::init(&encoder, self.encoder, &widths, device);
        let max_bytes = encoder.max_bytes;
        let frozen = FrozenReaders::new(readers);
        let training = LatentWireTraining::new(model, frozen.clone(), Objective::new());
        let loader = |split: TokenizedSplit, batch: usize| {
            HostData::new(
                split.len(),
                batch,
                move |items: &[usize]| split.batch(items, max_bytes),
                |b| b,
            )
        };
        // The curves' points come from the trainer's own evaluations; when `--eval-every`
        // falls outside the run there are none to plot but the last, which the full
        // evaluation below repeats with every prompt kind, so the trainer is given none.
        let curve_points = self.eval_every <= self.steps;
        let held_out = curve_points.then(|| loader(held_out, self.batch));
        let outcome = trainer
            .fit(training, &loader(train, self.batch), held_out.as_ref())
            .map_err(|e| e.to_string())?;
        let lines = kiln::train::read_metrics(&self.out).map_err(|e| e.to_string())?;
        let curves = self.out.join("curves.png");
        kiln::latentwire::curves::plot_curves(&curves, &lines, &names)
            .map_err(|e| e.to_string())?;
        if !outcome.finished {
            eprintln!(
                "stopped at step {} of {}: rerun the same command to go on",
                outcome.step, self.steps
            );
            return Ok(());
        }
        let readers = frozen.on::<B>().expect("the readers were loaded on B");
        let model = outcome.model.valid().model;
        let bar = ProgressBar::new(eval_items.len() as u64).with_style(
            ProgressStyle::with_template(
                "{bar:40} {pos}/{len} held-out items scored (every prompt kind and model), eta {eta}",
            )
            .expect("a valid template"),
        );
        let report = Evaluation::default()
            .run_with_progress(&model, readers, &eval_items, &mut |n| bar.inc(n as u64))
            .map_err(|e| e.to_string())?;
        bar.finish_and_clear();
        self.write_summary(&report, outcome.step, started)
    }
}

fn main() -> ExitCode {
    allocator::keep_freed_memory();
    let args = Args::parse();
    kiln::run_job(args.device, args)
}
