//! Exp 0, kiln's main job: nested Monte-Carlo over vision encoders. For each model, each pass
//! count T and each trial k = 1..K, T stochastic passes (Monte-Carlo dropout) of the image
//! encoder over the same images, per-image embedding statistics in f64, and across the K trials
//! of each (model, T): how much the T-pass mean and the uncertainty ranking still move, i.e. how
//! many passes are enough.
//!
//! ```text
//! # The built-in default: generated images, two small random-weight models of real
//! # architectures, T = 4, 8, 16, K = 4 (under 3 minutes on 2 CPU cores).
//! cargo run --release --example exp0_mc
//! # Real use.
//! cargo run --release --features cuda --example exp0_mc -- --images photos/ \
//!     --model-dir clip-vit-base-patch32,siglip2-base-patch16-224 --passes 16,32,64 --trials 10 \
//!     --dropout 0.1 --device cuda --policy mixed-bf16 --out results/exp0
//! # Split over machines, then merge.
//! cargo run --release --example exp0_mc -- ... --shard 1/2 --out part1   # and 2/2 into part2
//! cargo run --release --example exp0_mc -- --merge part1 part2 --out results/exp0
//! ```
//!
//! Images are decoded and preprocessed once into kiln-cache; every pass reads the cached 8-bit
//! tensors (memory-mapped, or resident on the device), and passes are batched by replicating
//! images along the batch axis. `--naive` also runs the loop the Python original ran (decode and
//! preprocess from disk every pass, one pass per batch) on the same trials, and reports the
//! speed-up. Finished trials are kept in `--out`: a killed run started again continues where it
//! stopped.
//!
//! Writes to `--out` (default `results/exp0`): `summary.json`, `summary.csv` (one row per model ×
//! T), `trials/*.safetensors` (per trial: `count`, `mean`, `variance`) and `convergence.png`.

mod models;
mod naive;
mod report;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use burn::tensor::backend::Backend;
use clap::Parser;
use kiln::burn;
use kiln::cache::Residency;
use kiln::core::{DeviceJob, DeviceSpec, PolicySpec};
use kiln::mc::{
    Experiment, Shard, TrialKey, TrialRunner, TrialStore, collect_trials, demo_images, summarize,
};
use kiln::vision::DropoutSites;
use serde_json::json;

use models::{Loaded, load_models, model_specs, weights_seed};
use report::{Bars, Clock, report_timings, write_results};

/// mimalloc, keeping the memory it frees for the next step (docs/PERFORMANCE.md).
#[path = "../shared/allocator.rs"]
mod allocator;

/// Nested Monte-Carlo over vision encoders (Exp 0).
#[derive(Parser, Clone)]
struct Args {
    /// A folder of images (read recursively, in path order). Default: images generated into
    /// OUT/images.
    #[arg(long)]
    images: Option<PathBuf>,
    /// Images to generate when --images is not given.
    #[arg(long, default_value_t = 24)]
    generate: usize,
    /// Hugging Face model directories, comma-separated (ids too with the `hub` feature).
    #[arg(long, value_delimiter = ',', conflicts_with = "model")]
    model_dir: Vec<String>,
    /// Random-weight models of released architectures when no --model-dir is given,
    /// comma-separated: clip-mini, dinov2-mini, clip-b32, clip-l14, siglip2-b16,
    /// siglip2-so400m, dinov2-s, dinov2-b.
    #[arg(long, value_delimiter = ',', default_value = "clip-mini,dinov2-mini")]
    model: Vec<String>,
    /// Pass counts T, comma-separated (each at least 2, each once).
    #[arg(long, value_delimiter = ',', default_value = "4,8,16")]
    passes: Vec<u32>,
    /// Trials K per model and pass count (at least 2).
    #[arg(long, default_value_t = 4)]
    trials: u32,
    /// Monte-Carlo dropout: one rate for every site, or e.g. "probs=0.1,mlp=0.05".
    #[arg(long, default_value = "0.1")]
    dropout: String,
    /// Master seed (every trial's seed derives from it; random weights too).
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// cpu, ndarray, wgpu, vulkan, metal, cuda, cuda:N.
    #[arg(long, default_value = "cpu")]
    device: DeviceSpec,
    /// Precision policy: full, mixed-f16, mixed-bf16, pure-f16, a dtype, or p=..,c=..,o=...
    #[arg(long, default_value = "full")]
    policy: PolicySpec,
    /// Rows (image passes) per forward batch. Default: from the device's memory.
    #[arg(long)]
    batch: Option<usize>,
    /// Keep the cached images on the device or stream them (default: planned from the sizes).
    #[arg(long)]
    residency: Option<Residency>,
    /// Results directory.
    #[arg(long, default_value = "results/exp0")]
    out: PathBuf,
    /// Run only shard i of n of the trials (e.g. 1/4); merge the shards' directories with
    /// --merge.
    #[arg(long, default_value = "1/1")]
    shard: Shard,
    /// Run at most this many trials now (a later run continues).
    #[arg(long)]
    max_trials: Option<usize>,
    /// Summarise the results directories of shards into --out instead of running.
    #[arg(long, num_args = 1..)]
    merge: Vec<PathBuf>,
    /// Also run the original loop (decode + preprocess every pass, no batching across passes)
    /// on the same trials and report the speed-up.
    #[arg(long)]
    naive: bool,
    /// Also store every pass's embeddings in the trial files.
    #[arg(long)]
    keep_pass_features: bool,
    /// The most pixels an image may declare (Pillow's limit by default); larger ones are
    /// refused before decoding, as decompression bombs.
    #[arg(long, default_value_t = kiln::cache::DEFAULT_MAX_PIXELS)]
    max_image_pixels: u64,
}

impl Args {
    /// Every file and directory the run reads and writes.
    fn files(&self) -> kiln::io::RunFiles {
        let mut files = kiln::io::RunFiles::new();
        if let Some(images) = &self.images {
            files = files.input("the images (--images)", images);
        }
        for dir in &self.model_dir {
            files = files.input("a model directory (--model-dir)", dir.trim());
        }
        for dir in &self.merge {
            files = files.input("a shard's results (--merge)", dir);
        }
        files = files.output_dir("--out", &self.out);
        if self.merge.is_empty() {
            let cache = kiln::cache::ImageCache::default_dir();
            files = files.output_dir("the image cache ($KILN_CACHE_DIR)", cache);
        }
        files
    }

    /// The images: the folder given, or the demo images generated into OUT/images.
    fn images_dir(&self) -> Result<PathBuf, String> {
        if let Some(dir) = &self.images {
            return Ok(dir.clone());
        }
        let dir = self.out.join("images");
        demo_images(&dir, self.generate).map_err(|e| format!("--generate: {e}"))?;
        eprintln!("images: {} generated in {}", self.generate, dir.display());
        Ok(dir)
    }
}

impl DeviceJob for Args {
    type Output = Result<(), String>;

    fn run<B: Backend>(self, device: &B::Device) -> Self::Output {
        let start = Instant::now();
        let mut clock = Clock::default();
        let dropout: DropoutSites = self
            .dropout
            .parse()
            .map_err(|e| format!("--dropout: {e}"))?;
        let policy = self
            .policy
            .resolve::<B>(device)
            .map_err(|e| e.to_string())?;
        let specs = model_specs(&self)?;
        let mut experiment = Experiment {
            models: specs.iter().map(|s| s.name.clone()).collect(),
            passes: self.passes.clone(),
            trials: self.trials,
            seed: self.seed,
            dropout: dropout.to_string(),
            dataset: String::new(),
            images: 1,
            weights: specs
                .iter()
                .enumerate()
                .map(|(i, s)| s.weights_id(weights_seed(self.seed, i)))
                .collect(),
            precision: policy.to_string(),
        };
        // Pass counts, trials and names are checked before any images are read.
        experiment.validate().map_err(|e| e.to_string())?;
        let images = self.images_dir()?;
        let models =
            load_models::<B>(&self, &specs, &images, device, &policy, dropout, &mut clock)?;
        identify_dataset(&mut experiment, &models)?;
        let store =
            TrialStore::create_or_resume(&self.out, &experiment).map_err(|e| e.to_string())?;
        let shard_keys = self.shard.select(experiment.trial_keys());
        let pending = store
            .pending(shard_keys.clone())
            .map_err(|e| e.to_string())?;
        let resumed = shard_keys.len() - pending.len();
        if resumed > 0 {
            eprintln!(
                "{resumed} trial(s) already in {}: continuing",
                self.out.display()
            );
        }
        let todo: Vec<TrialKey> = pending
            .into_iter()
            .take(self.max_trials.unwrap_or(usize::MAX))
            .collect();

        let bars = Bars::new(&todo, &experiment, experiment.images as u64);
        for key in &todo {
            let loaded = Loaded::of(&models, &key.model);
            bars.start(key, &experiment);
            let record = TrialRunner::new(&loaded.model, &loaded.feed)
                .batch(loaded.rows)
                .collect_pass_features(self.keep_pass_features)
                .run_into(&store, key, &mut |done| bars.passes.inc(done))
                .map_err(|e| format!("trial {key}: {e}"))?;
            clock.trials += record.timings;
            bars.trials.inc(1);
        }
        bars.finish();
        let wall = start.elapsed().as_secs_f64();
        report_timings(&clock, wall, todo.len());

        let naive = if self.naive {
            let context = (&store, &clock, device, &policy);
            Some(naive::run_naive::<B>(&self, &models, &shard_keys, context)?)
        } else {
            None
        };
        let (records, missing) =
            collect_trials(&experiment, &[store]).map_err(|e| e.to_string())?;
        if !missing.is_empty() {
            let merge_hint = if self.shard == Shard::ALL {
                String::new()
            } else {
                format!(
                    "; this was shard {}, merge the shards with --merge",
                    self.shard
                )
            };
            eprintln!(
                "{} of {} trials done; {} to go (run the same command again{merge_hint})",
                records.len(),
                experiment.trial_keys().len(),
                missing.len(),
            );
            return Ok(());
        }
        let rows = summarize(&experiment, &records).map_err(|e| e.to_string())?;
        let run = json!({
            "device": self.device.to_string(),
            "backend": B::name(device),
            "policy": policy.to_string(),
            "wall_s": wall,
            "cache_s": clock.cache,
            "load_s": clock.load,
            "trials_run": todo.len(),
            "trials_resumed": resumed,
            "timings_s": clock.trials,
            "forward_fraction": clock.trials.forward / wall,
        });
        write_results(&self.out, &experiment, &rows, run, naive)
    }
}

/// Records what identifies the images (each model's cache entry) and how many there are; every
/// model must see the same images.
fn identify_dataset<B: Backend>(
    experiment: &mut Experiment,
    models: &[Loaded<'_, B>],
) -> Result<(), String> {
    let count = models[0].feed.images().len();
    if let Some(other) = models.iter().find(|m| m.feed.images().len() != count) {
        return Err(format!(
            "{} sees {} images, {} sees {count}: unreadable images?",
            other.spec.name,
            other.feed.images().len(),
            models[0].spec.name,
        ));
    }
    experiment.images = count;
    experiment.dataset = models
        .iter()
        .map(|m| {
            let dir = m.feed.images().dir();
            dir.file_name()
                .unwrap_or_default()
                .to_string_lossy()
                .into_owned()
        })
        .collect::<Vec<_>>()
        .join("+");
    experiment.validate().map_err(|e| e.to_string())
}

/// `--merge`: the shards' directories summarised into `--out`.
fn merge(args: &Args) -> Result<(), String> {
    let stores: Vec<TrialStore> = args
        .merge
        .iter()
        .map(TrialStore::open)
        .collect::<Result<_, _>>()
        .map_err(|e| e.to_string())?;
    let experiment = stores[0].experiment().clone();
    let (records, missing) = collect_trials(&experiment, &stores).map_err(|e| e.to_string())?;
    if !missing.is_empty() {
        let names: Vec<String> = missing.iter().take(5).map(ToString::to_string).collect();
        return Err(format!(
            "{} trial(s) are in none of the directories ({}{}): run the missing shards first",
            missing.len(),
            names.join(", "),
            if missing.len() > 5 { ", …" } else { "" }
        ));
    }
    let out = TrialStore::create_or_resume(&args.out, &experiment).map_err(|e| e.to_string())?;
    for record in &records {
        if !out.contains(&record.key) {
            out.save(record, None).map_err(|e| e.to_string())?;
        }
    }
    let rows = summarize(&experiment, &records).map_err(|e| e.to_string())?;
    let sources: BTreeMap<String, usize> = stores
        .iter()
        .map(|s| {
            let count = experiment
                .trial_keys()
                .iter()
                .filter(|k| s.contains(k))
                .count();
            (s.dir().display().to_string(), count)
        })
        .collect();
    write_results(
        &args.out,
        &experiment,
        &rows,
        json!({ "merged_from": sources }),
        None,
    )
}

fn main() -> ExitCode {
    allocator::keep_freed_memory();
    kiln::log_to_stderr();
    let args = Args::parse();
    let result = if let Err(e) = args.files().check() {
        Err(e.to_string())
    } else if args.merge.is_empty() {
        let device = args.device;
        device.run(args).map_err(|e| e.to_string()).and_then(|r| r)
    } else {
        merge(&args)
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}
