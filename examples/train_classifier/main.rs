//! Trains a small vision transformer (kiln-vision's DINOv2 architecture at a tiny size, random
//! initialisation, a linear head on the CLS token) to tell the orientation of stripes in
//! generated images, through kiln-train: AdamW (no decay on biases and norms), warm-up + cosine
//! schedule, clipping at global norm 1, evaluation on a held-out split, checkpoints that resume
//! bit for bit.
//!
//! ```text
//! cargo run --release --example train_classifier -- --out runs/stripes [--steps N]
//!     [--max-steps-now M] [--batch B] [--accumulate K] [--lr X] [--device D] [--policy P]
//! ```
//!
//! Writes OUT/images (generated on the first run, decoded once through kiln-cache into
//! OUT/cache), OUT/metrics.jsonl (a line per optimizer step), OUT/checkpoints/, OUT/loss.png and
//! OUT/summary.json. Rerunning the same command resumes from the newest checkpoint, also after a
//! kill; `--max-steps-now M` stops after M more steps.
//!
//! Data-parallel (built with `--features collective`): start one process per device with
//! torchrun's variables (`RANK`, `WORLD_SIZE`, `MASTER_ADDR`, `MASTER_PORT`) or under Slurm;
//! each takes `--batch` images per micro-batch, rank 0 writes the outputs (docs/TRAINING.md).

mod model;
mod shapes;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use burn::backend::Autodiff;
use burn::tensor::backend::Backend;
use clap::Parser;
use kiln::burn;
use kiln::cache::{CachedImages, ImageCache, ImageSource, Preprocess, Residency};
use kiln::core::{DeviceJob, DeviceSpec, Policy, PolicySpec};
use kiln::train::{
    BestMetric, DataParallel, LabelledImages, RunOptions, TrainConfig, TrainError, Trainer,
};
use model::{Classifier, backbone_config, recipe};
use serde_json::json;

/// mimalloc, keeping the memory it frees for the next step (docs/PERFORMANCE.md).
#[path = "../shared/allocator.rs"]
mod allocator;

/// Train a tiny ViT on generated stripe orientations.
#[derive(Parser)]
struct Args {
    /// The run's directory (images, cache, metrics, checkpoints, plot, summary).
    #[arg(long)]
    out: PathBuf,
    /// Optimizer steps in the whole run.
    #[arg(long, default_value_t = 200, value_parser = kiln::cli::count_u64, allow_negative_numbers = true)]
    steps: u64,
    /// Stop after this many more optimizer steps (with a checkpoint); rerun to continue.
    #[arg(long)]
    max_steps_now: Option<u64>,
    /// Images per micro-batch.
    #[arg(long, default_value_t = 32, value_parser = kiln::cli::count, allow_negative_numbers = true)]
    batch: usize,
    /// Micro-batches per optimizer step.
    #[arg(long, default_value_t = 1, value_parser = kiln::cli::count, allow_negative_numbers = true)]
    accumulate: usize,
    /// Peak learning rate.
    #[arg(long, default_value_t = 2e-3, value_parser = kiln::cli::positive, allow_negative_numbers = true)]
    lr: f64,
    /// cpu, ndarray, wgpu, vulkan, metal, cuda, cuda:N.
    #[arg(long, default_value = "cpu")]
    device: DeviceSpec,
    /// Precision policy: full, mixed-bf16, mixed-f16 (dynamic loss scaling), or p=..,c=...
    #[arg(long, default_value = "full")]
    policy: PolicySpec,
    /// Seeds the images, the initial weights and the data order.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Training images to generate.
    #[arg(long, default_value_t = 2000, value_parser = kiln::cli::count, allow_negative_numbers = true)]
    train_images: usize,
    /// Held-out images to generate.
    #[arg(long, default_value_t = 400, value_parser = kiln::cli::count, allow_negative_numbers = true)]
    eval_images: usize,
    /// Evaluate every this many steps (and at the end).
    #[arg(long, default_value_t = 50)]
    eval_every: u64,
}

impl Args {
    /// Training settings (checked before any work).
    fn train_config(&self, policy: &Policy) -> Result<TrainConfig, String> {
        let mut config = recipe(self.steps, self.lr, self.accumulate, policy);
        config.eval_every = self.eval_every;
        config.checkpoint_every = 50;
        config.best = Some(BestMetric {
            name: "accuracy".into(),
            higher_is_better: true,
        });
        config.seed = self.seed;
        config.validate().map_err(|e| e.to_string())?;
        Ok(config)
    }

    /// The images of one split, generated on the first run and cached once.
    fn split(&self, name: &str, count: usize, seed: u64) -> Result<CachedImages, String> {
        let dir = self.out.join("images").join(name);
        shapes::generate(&dir, count, seed)?;
        ImageCache::new(self.out.join("cache"))
            .load(
                &ImageSource::Folder(dir),
                &Preprocess::dinov2(shapes::SIDE, shapes::SIDE),
            )
            .map_err(|e| e.to_string())
    }
}

/// The class of every cached image, from its file name.
fn labels(images: &CachedImages) -> Result<Vec<i64>, String> {
    images.names().map(shapes::label).collect()
}

impl DeviceJob for Args {
    type Output = Result<(), String>;

    fn run<B: Backend>(self, device: &B::Device) -> Self::Output {
        let started = Instant::now();
        let policy = self
            .policy
            .resolve::<B>(device)
            .map_err(|e| e.to_string())?;
        let config = self.train_config(&policy)?;
        kiln::io::RunFiles::new()
            .output_dir("--out", &self.out)
            .check()
            .map_err(|e| e.to_string())?;
        let parallel = DataParallel::from_env().map_err(|e| e.to_string())?;
        let main = parallel.as_ref().is_none_or(DataParallel::is_main);
        let options = RunOptions {
            parallel,
            max_steps_now: self.max_steps_now,
            model_settings: json!({
                "backbone": format!("{:?}", backbone_config()),
                "classes": shapes::CLASSES,
                "policy": policy.to_string(),
                "batch": self.batch,
                "train_images": self.train_images,
                "eval_images": self.eval_images,
            }),
            outputs: vec!["summary.json".into()],
            ..RunOptions::new(&self.out)
        };
        let trainer = Trainer::<Autodiff<B>>::new(config, options, device.clone());
        trainer.claim().map_err(|e| e.to_string())?;
        let train = self.split("train", self.train_images, self.seed)?;
        let eval = self.split("eval", self.eval_images, self.seed ^ 0xE7A1)?;
        eprintln!(
            "images: {} training, {} held out ({}×{}, {} classes) in {}",
            train.len(),
            eval.len(),
            shapes::SIDE,
            shapes::SIDE,
            shapes::CLASSES,
            self.out.join("images").display()
        );
        let train = LabelledImages::new(
            train.to_device::<Autodiff<B>>(device, policy.compute, Residency::Device),
            labels(&train)?,
            self.batch,
        )
        .map_err(|e| e.to_string())?;
        let eval = LabelledImages::new(
            eval.to_device::<B>(device, policy.compute, Residency::Device),
            labels(&eval)?,
            self.batch,
        )
        .map_err(|e| e.to_string())?;
        <Autodiff<B> as Backend>::seed(device, self.seed);
        let model = Classifier::<Autodiff<B>>::new(shapes::CLASSES, &policy, device);
        let outcome = trainer
            .fit(model, &train, Some(&eval))
            .map_err(|e| match e {
                TrainError::OutOfMemory { .. } => format!("{e} (this run: --batch {})", self.batch),
                e => e.to_string(),
            })?;
        if !main {
            return Ok(());
        }
        if !outcome.finished {
            eprintln!(
                "stopped at step {} of {}: run the same command again to continue",
                outcome.step, self.steps
            );
            return Ok(());
        }
        let metric = |name: &str| {
            outcome
                .eval
                .iter()
                .find(|(k, _)| k == name)
                .map(|(_, v)| *v)
        };
        let accuracy = metric("accuracy").unwrap_or(f64::NAN);
        kiln::io::write_json(
            &self.out.join("summary.json"),
            &json!({
                "steps": outcome.step,
                "final_eval_accuracy": accuracy,
                "final_eval_loss": metric("loss"),
                "best_eval_accuracy": outcome.best.map(|(v, _)| v),
                "best_step": outcome.best.map(|(_, s)| s),
                "skipped_steps": outcome.skipped_steps,
                "device": self.device.to_string(),
                "policy": policy.to_string(),
                "wall_seconds_this_run": started.elapsed().as_secs_f64(),
            }),
        )
        .map_err(|e| e.to_string())?;
        println!(
            "final held-out accuracy: {:.2}% after {} steps ({})",
            100.0 * accuracy,
            outcome.step,
            self.out.join("summary.json").display()
        );
        Ok(())
    }
}

fn main() -> ExitCode {
    allocator::keep_freed_memory();
    let args = Args::parse();
    kiln::run_job(args.device, args)
}
