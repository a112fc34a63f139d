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

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Instant;

use burn::module::Module;
use burn::tensor::backend::Backend;
use clap::Parser;
use indicatif::{MultiProgress, ProgressBar, ProgressStyle};
use kiln::burn;
use kiln::cache::{CachedImages, DeviceImages, ImageCache, ImageSource, Preprocess, Residency};
use kiln::mc::{
    Experiment, Shard, SummaryRow, Timings, TrialKey, TrialRecord, TrialRunner, TrialStore,
    collect_trials, demo_images, naive_trial, summarize, to_csv,
};
use kiln::precision::{DeviceJob, DeviceSpec, Policy, PolicySpec, is_host_backend};
use kiln::vision::{
    ClipVisionConfig, Dinov2Config, DropoutSites, SiglipVisionConfig, VisionConfig, VisionModel,
    checkpoint_dir,
};
use serde_json::json;

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
    /// Pass counts T, comma-separated.
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
}

/// A model to run: its name (which enters the trial seeds), how its images are preprocessed,
/// its architecture and where its weights come from.
struct ModelSpec {
    name: String,
    config: VisionConfig,
    preprocess: Preprocess,
    /// A checkpoint directory, or `None` for random weights.
    dir: Option<PathBuf>,
}

impl ModelSpec {
    /// A released architecture with random weights.
    fn preset(name: &str) -> Result<Self, String> {
        let mini = |layers, heads| (192, 768, layers, heads);
        let (config, preprocess) = match name {
            "clip-mini" => {
                let (hidden_size, intermediate_size, num_hidden_layers, num_attention_heads) =
                    mini(4, 3);
                let config = ClipVisionConfig {
                    hidden_size,
                    intermediate_size,
                    num_hidden_layers,
                    num_attention_heads,
                    projection_dim: 128,
                    ..ClipVisionConfig::vit_base_patch32()
                };
                (VisionConfig::Clip(config), Preprocess::clip(224))
            }
            "dinov2-mini" => {
                let (hidden_size, _, num_hidden_layers, num_attention_heads) = mini(4, 3);
                let config = Dinov2Config {
                    hidden_size,
                    num_hidden_layers,
                    num_attention_heads,
                    patch_size: 28,
                    image_size: 224,
                    ..Dinov2Config::small()
                };
                (VisionConfig::Dinov2(config), Preprocess::dinov2(256, 224))
            }
            "clip-b32" => (
                VisionConfig::Clip(ClipVisionConfig::vit_base_patch32()),
                Preprocess::clip(224),
            ),
            "clip-l14" => (
                VisionConfig::Clip(ClipVisionConfig::vit_large_patch14()),
                Preprocess::clip(224),
            ),
            "siglip2-b16" => (
                VisionConfig::Siglip(SiglipVisionConfig::base_patch16(224)),
                Preprocess::siglip(224),
            ),
            "siglip2-so400m" => (
                VisionConfig::Siglip(SiglipVisionConfig::so400m_patch14_384()),
                Preprocess::siglip(384),
            ),
            "dinov2-s" => (
                VisionConfig::Dinov2(Dinov2Config::small()),
                Preprocess::dinov2(256, 224),
            ),
            "dinov2-b" => (
                VisionConfig::Dinov2(Dinov2Config::base()),
                Preprocess::dinov2(256, 224),
            ),
            other => {
                return Err(format!(
                    "unknown model `{other}`: expected clip-mini, dinov2-mini, clip-b32, \
                     clip-l14, siglip2-b16, siglip2-so400m, dinov2-s or dinov2-b (or give \
                     --model-dir)"
                ));
            }
        };
        Ok(ModelSpec {
            name: name.to_string(),
            config,
            preprocess,
            dir: None,
        })
    }

    /// A checkpoint directory (or hub id): its config and processor are read now, so a
    /// directory that cannot load fails before any long work.
    fn checkpoint(model: &str) -> Result<Self, String> {
        let dir = checkpoint_dir(model).map_err(|e| e.to_string())?;
        let config = VisionConfig::from_hf_config(&dir).map_err(|e| e.to_string())?;
        let preprocess = Preprocess::from_hf_config(dir.join("preprocessor_config.json"))
            .map_err(|e| format!("{model}: {e}"))?;
        let base = Path::new(model.trim_end_matches('/'))
            .file_name()
            .map_or_else(|| model.to_string(), |n| n.to_string_lossy().into_owned());
        let name = base
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.') {
                    c
                } else {
                    '-'
                }
            })
            .collect();
        Ok(ModelSpec {
            name,
            config,
            preprocess,
            dir: Some(dir),
        })
    }

    /// What identifies the weights: the checkpoint's path, size and modification time, or the
    /// random initialisation's seed.
    fn weights_id(&self, seed: u64) -> String {
        match &self.dir {
            None => format!("random init, seed {seed}"),
            Some(dir) => {
                let file = ["model.safetensors", "model.safetensors.index.json"]
                    .iter()
                    .map(|f| dir.join(f))
                    .find(|p| p.exists());
                let stamp = file
                    .as_ref()
                    .and_then(|f| std::fs::metadata(f).ok())
                    .map(|m| {
                        let modified = m
                            .modified()
                            .ok()
                            .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
                            .map_or(0, |d| d.as_secs());
                        format!("{} bytes, modified {modified}", m.len())
                    })
                    .unwrap_or_default();
                format!("{} ({stamp})", dir.display())
            }
        }
    }

    /// The model on `device` under `policy`, with the dropout sites.
    fn load<B: Backend>(
        &self,
        device: &B::Device,
        policy: &Policy,
        dropout: DropoutSites,
        seed: u64,
    ) -> Result<VisionModel<B>, String> {
        let model = match &self.dir {
            Some(dir) => {
                VisionModel::from_hf_dir(dir, device, policy).map_err(|e| e.to_string())?
            }
            None => {
                B::seed(device, seed);
                VisionModel::from_config(&self.config, device).with_policy(policy)
            }
        };
        model.with_dropout(dropout).map_err(|e| e.to_string())
    }
}

/// The seed of model `index`'s random weights.
fn weights_seed(master: u64, index: usize) -> u64 {
    master ^ (0x5eed_0000 + index as u64)
}

/// Seconds per stage of this run.
#[derive(Default)]
struct Clock {
    cache: f64,
    load: f64,
    trials: Timings,
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
        };
        // Pass counts, trials and names are checked before any images are read.
        experiment.validate().map_err(|e| e.to_string())?;
        let images_dir = match &self.images {
            Some(dir) => dir.clone(),
            None => {
                let dir = self.out.join("images");
                demo_images(&dir, self.generate).map_err(|e| e.to_string())?;
                eprintln!("images: {} generated in {}", self.generate, dir.display());
                dir
            }
        };
        let memory = self.device.probe().ok().and_then(|h| h.memory_bytes);

        // Every model and its cached dataset, before any long work.
        let mut models = Vec::new();
        for (index, spec) in specs.iter().enumerate() {
            let t = Instant::now();
            let cached = ImageCache::new(ImageCache::default_dir())
                .load(&ImageSource::Folder(images_dir.clone()), &spec.preprocess)
                .map_err(|e| format!("{}: {e}", images_dir.display()))?;
            clock.cache += t.elapsed().as_secs_f64();
            eprintln!(
                "{}: {} images ({:?}, {})",
                spec.name,
                cached.len(),
                cached.outcome(),
                cached.dir().display()
            );
            let t = Instant::now();
            let model = spec
                .load::<B>(device, &policy, dropout, weights_seed(self.seed, index))
                .map_err(|e| format!("{}: {e}", spec.name))?;
            clock.load += t.elapsed().as_secs_f64();
            let model_bytes = (parameters(&model) * policy.param.size_of()) as u64;
            let mut plan = cached.plan_residency::<B>(
                device,
                policy.compute,
                model_bytes,
                memory,
                self.residency,
            );
            let mut reason = plan.to_string();
            // Every pass reads the same images: on the host too, normalise them once and keep
            // them when they take at most an eighth of the memory.
            if self.residency.is_none()
                && is_host_backend::<B>(device)
                && memory.is_some_and(|m| plan.dataset_bytes * 8 <= m)
            {
                plan.residency = Residency::Device;
                reason = format!(
                    "residency: normalised once and kept in host memory ({:.2} GiB; --residency \
                     host streams instead)",
                    plan.dataset_bytes as f64 / f64::from(1u32 << 30)
                );
            }
            let rows = self.batch.unwrap_or_else(|| {
                auto_batch::<B>(device, spec, &cached, &policy, memory, model_bytes, &plan)
            });
            eprintln!("{}: {reason}; {rows} rows per batch", spec.name);
            let feed = cached.to_device::<B>(device, policy.compute, plan.residency);
            models.push(Loaded {
                spec,
                feed,
                model,
                rows,
            });
        }
        let first_len = models[0].feed.images().len();
        if let Some(other) = models.iter().find(|m| m.feed.images().len() != first_len) {
            return Err(format!(
                "{} sees {} images, the first model {first_len}: unreadable images?",
                other.spec.name,
                other.feed.images().len()
            ));
        }
        experiment.images = first_len;
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
        experiment.validate().map_err(|e| e.to_string())?;
        let store =
            TrialStore::create_or_resume(&self.out, &experiment).map_err(|e| e.to_string())?;
        let shard_keys = self.shard.select(experiment.trial_keys());
        let pending = store.pending(shard_keys.clone());
        let resumed = shard_keys.len() - pending.len();
        let todo: Vec<TrialKey> = pending
            .into_iter()
            .take(self.max_trials.unwrap_or(usize::MAX))
            .collect();
        if resumed > 0 {
            eprintln!(
                "{resumed} trial(s) already in {}: continuing",
                self.out.display()
            );
        }

        // The trials.
        let bars = Bars::new(&todo, &experiment, first_len as u64);
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
            Some(run_naive::<B>(
                &self,
                &models,
                &store,
                &shard_keys,
                &clock,
                device,
                &policy,
            )?)
        } else {
            None
        };
        let (records, missing) =
            collect_trials(&experiment, &[store]).map_err(|e| e.to_string())?;
        if !missing.is_empty() {
            eprintln!(
                "{} of {} trials done; {} to go (run the same command again{})",
                records.len(),
                experiment.trial_keys().len(),
                missing.len(),
                if self.shard == Shard::ALL {
                    String::new()
                } else {
                    format!(
                        "; this was shard {}, merge the shards with --merge",
                        self.shard
                    )
                }
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

/// A model ready to run: loaded, its dataset cached and bound to the device.
struct Loaded<'a, B: Backend> {
    spec: &'a ModelSpec,
    feed: DeviceImages<B>,
    model: VisionModel<B>,
    rows: usize,
}

impl<'a, B: Backend> Loaded<'a, B> {
    fn of<'m>(models: &'m [Loaded<'a, B>], name: &str) -> &'m Loaded<'a, B> {
        models
            .iter()
            .find(|m| m.spec.name == name)
            .expect("a model of the experiment")
    }
}

fn parameters<B: Backend>(model: &VisionModel<B>) -> usize {
    match model {
        VisionModel::Clip(m) => m.num_params(),
        VisionModel::Siglip(m) => m.num_params(),
        VisionModel::Dinov2(m) => m.num_params(),
    }
}

/// Rows per batch: 64 on host backends (larger batches gain nothing there); on accelerators as
/// many as half the memory left beside the model and a resident dataset holds, by the config's
/// activation estimate, between 8 and 1024, a multiple of 8.
fn auto_batch<B: Backend>(
    device: &B::Device,
    spec: &ModelSpec,
    cached: &CachedImages,
    policy: &Policy,
    memory: Option<u64>,
    model_bytes: u64,
    plan: &kiln::cache::ResidencyPlan,
) -> usize {
    if is_host_backend::<B>(device) {
        return 64;
    }
    let Some(memory) = memory else {
        return 128;
    };
    let (width, height) = cached.size();
    let per_row = spec
        .config
        .activation_bytes(height as usize, width as usize, policy.compute.size_of())
        .max(1);
    let dataset = if plan.residency == Residency::Device {
        plan.dataset_bytes
    } else {
        0
    };
    let free = (memory / 2).saturating_sub(model_bytes + dataset);
    ((free / per_row) as usize).clamp(8, 1024) / 8 * 8
}

/// The models asked for: checkpoint directories, else presets.
fn model_specs(args: &Args) -> Result<Vec<ModelSpec>, String> {
    let specs: Vec<ModelSpec> = if args.model_dir.is_empty() {
        args.model
            .iter()
            .map(|m| ModelSpec::preset(m.trim()))
            .collect::<Result<_, _>>()?
    } else {
        let specs: Vec<ModelSpec> = args
            .model_dir
            .iter()
            .map(|m| ModelSpec::checkpoint(m.trim()))
            .collect::<Result<_, _>>()?;
        eprintln!("weights: from the checkpoint directories");
        specs
    };
    if args.model_dir.is_empty() {
        eprintln!(
            "weights: RANDOM (no --model-dir): the numbers show the method and its speed, not a \
             trained model's uncertainty"
        );
    }
    let mut names: Vec<&str> = specs.iter().map(|s| s.name.as_str()).collect();
    names.sort_unstable();
    if let Some(pair) = names.windows(2).find(|w| w[0] == w[1]) {
        return Err(format!("two models are named `{}`", pair[0]));
    }
    Ok(specs)
}

/// The progress bars: trials, and the passes of the trial running.
struct Bars {
    _multi: MultiProgress,
    trials: ProgressBar,
    passes: ProgressBar,
    images: u64,
}

impl Bars {
    fn new(todo: &[TrialKey], experiment: &Experiment, images: u64) -> Self {
        let multi = MultiProgress::new();
        let style = |template| ProgressStyle::with_template(template).expect("a valid template");
        let trials = multi.add(ProgressBar::new(todo.len() as u64).with_style(style(
            "trials {bar:30} {pos}/{len} {msg} [{elapsed_precise} < {eta_precise}]",
        )));
        let passes = multi.add(
            ProgressBar::new(0)
                .with_style(style("passes {bar:30} {pos}/{len} image passes {per_sec}")),
        );
        trials.set_message(format!("({} models)", experiment.models.len()));
        Bars {
            _multi: multi,
            trials,
            passes,
            images,
        }
    }

    fn start(&self, key: &TrialKey, experiment: &Experiment) {
        self.trials.set_message(format!(
            "{}  T = {}  trial {}/{}",
            key.model,
            key.passes,
            key.trial + 1,
            experiment.trials
        ));
        self.passes.reset();
        self.passes.set_length(self.images * u64::from(key.passes));
    }

    fn finish(&self) {
        self.passes.finish_and_clear();
        self.trials.finish();
    }
}

/// Prints where this run's time went.
fn report_timings(clock: &Clock, wall: f64, trials: usize) {
    let t = &clock.trials;
    let other = wall - clock.cache - clock.load - t.upload - t.forward - t.accumulate - t.readback;
    eprintln!(
        "time: {trials} trial(s) in {wall:.1} s: cache {:.2} s, model load {:.2} s, upload {:.2} \
         s, forward {:.2} s, accumulate {:.2} s, readback {:.2} s, other {:.2} s",
        clock.cache, clock.load, t.upload, t.forward, t.accumulate, t.readback, other
    );
    eprintln!(
        "forward passes: {:.1}% of wall time",
        100.0 * t.forward / wall
    );
}

/// The loop the Python original ran, on the same trials: every pass decodes and preprocesses
/// every image from disk and runs it in batches of images (one pass per batch). Returns its time
/// next to the cached run's and the largest difference between their statistics.
fn run_naive<B: Backend>(
    args: &Args,
    models: &[Loaded<'_, B>],
    store: &TrialStore,
    keys: &[TrialKey],
    clock: &Clock,
    device: &B::Device,
    policy: &Policy,
) -> Result<serde_json::Value, String> {
    let images_dir = args
        .images
        .clone()
        .unwrap_or_else(|| args.out.join("images"));
    let files = ImageSource::Folder(images_dir)
        .files()
        .map_err(|e| e.to_string())?;
    let bar = ProgressBar::new(keys.len() as u64).with_style(
        ProgressStyle::with_template("naive  {bar:30} {pos}/{len} trials [{elapsed_precise}]")
            .expect("a valid template"),
    );
    let (mut naive_wall, mut cached_wall, mut worst) = (0.0, clock.cache, 0.0f64);
    for key in keys {
        let Loaded {
            spec, model, rows, ..
        } = Loaded::of(models, &key.model);
        let seed = store.experiment().seed_of(key);
        let start = Instant::now();
        let stats = naive_trial(
            model,
            &files,
            &spec.preprocess,
            key.passes,
            seed,
            *rows,
            device,
            policy.compute,
        )
        .map_err(|e| format!("naive trial {key}: {e}"))?;
        naive_wall += start.elapsed().as_secs_f64();
        let record: TrialRecord = store.load(key).map_err(|e| e.to_string())?;
        cached_wall += record.timings.wall;
        worst = worst.max(relative(stats.means(), record.stats.means()));
        bar.inc(1);
    }
    bar.finish();
    let speedup = naive_wall / cached_wall;
    eprintln!(
        "naive loop: {naive_wall:.1} s, cached and batched: {cached_wall:.1} s (cache build \
         included): {speedup:.1}× faster; mean embeddings agree to {worst:.1e} (relative)"
    );
    Ok(json!({
        "naive_wall_s": naive_wall,
        "cached_wall_s": cached_wall,
        "speedup": speedup,
        "max_relative_difference_of_means": worst,
    }))
}

/// max |a − b| / max |b|.
fn relative(a: &[f64], b: &[f64]) -> f64 {
    let worst = a
        .iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f64::max);
    worst / b.iter().fold(f64::MIN_POSITIVE, |m, v| m.max(v.abs()))
}

/// summary.json, summary.csv and convergence.png in `out`.
fn write_results(
    out: &Path,
    experiment: &Experiment,
    rows: &[SummaryRow],
    run: serde_json::Value,
    naive: Option<serde_json::Value>,
) -> Result<(), String> {
    let summary = json!({
        "experiment": experiment,
        "run": run,
        "naive": naive,
        "rows": rows,
    });
    let write = |name: &str, bytes: &[u8]| {
        let path = out.join(name);
        let partial = path.with_extension("partial");
        std::fs::write(&partial, bytes)
            .and_then(|()| std::fs::rename(&partial, &path))
            .map_err(|e| format!("{}: {e}", path.display()))
    };
    write(
        "summary.json",
        serde_json::to_string_pretty(&summary)
            .expect("a summary serialises")
            .as_bytes(),
    )?;
    write("summary.csv", to_csv(rows).as_bytes())?;
    plot(&out.join("convergence.png"), experiment, rows)?;
    print_table(rows);
    eprintln!(
        "results: {}/summary.json, summary.csv, convergence.png, trials/",
        out.display()
    );
    Ok(())
}

fn print_table(rows: &[SummaryRow]) {
    println!(
        "{:<16} {:>5} {:>15} {:>13} {:>10} {:>10} {:>9}",
        "model", "T", "mean variance", "uncertainty", "spread", "rank stab.", "forward"
    );
    for r in rows {
        println!(
            "{:<16} {:>5} {:>15.4e} {:>13.4e} {:>10.2e} {:>10.3} {:>8.1}%",
            r.model,
            r.passes,
            r.mean_variance,
            r.uncertainty,
            r.uncertainty_spread,
            r.rank_stability,
            100.0 * r.forward_fraction
        );
    }
}

/// A figure of a summary row.
type Metric = fn(&SummaryRow) -> f64;

/// Between-trial variance of the mean and rank stability against T, one line per model, log
/// axes.
fn plot(path: &Path, experiment: &Experiment, rows: &[SummaryRow]) -> Result<(), String> {
    use plotters::prelude::*;

    let (width, height) = (1200u32, 500u32);
    let mut buffer = vec![0u8; (width * height * 3) as usize];
    let fail = |e: &dyn std::fmt::Display| format!("{}: {e}", path.display());
    plotters::style::register_font("sans-serif", FontStyle::Normal, dejavu::sans::regular())
        .map_err(|_| fail(&"the bundled font"))?;
    {
        let root = BitMapBackend::with_buffer(&mut buffer, (width, height)).into_drawing_area();
        root.fill(&WHITE).map_err(|e| fail(&e))?;
        let panels = root.split_evenly((1, 2));
        let t_min = f64::from(*experiment.passes.iter().min().expect("pass counts")) / 1.25;
        let t_max = f64::from(*experiment.passes.iter().max().expect("pass counts")) * 1.25;
        let series = |model: &str, value: Metric| -> Vec<(f64, f64)> {
            rows.iter()
                .filter(|r| r.model == model)
                .map(|r| (f64::from(r.passes), value(r)))
                .filter(|(_, v)| v.is_finite())
                .collect()
        };
        let panels_spec: [(&str, Metric, bool); 2] = [
            (
                "between-trial variance of the mean",
                |r| r.mean_variance,
                true,
            ),
            ("rank stability (Spearman)", |r| r.rank_stability, false),
        ];
        for (panel, (title, value, log_y)) in panels.iter().zip(panels_spec) {
            let values: Vec<f64> = rows.iter().map(value).filter(|v| v.is_finite()).collect();
            let (lo, hi) = values
                .iter()
                .fold((f64::MAX, f64::MIN), |(l, h), &v| (l.min(v), h.max(v)));
            let mut chart = ChartBuilder::on(panel);
            chart
                .caption(title, ("sans-serif", 22))
                .margin(16)
                .x_label_area_size(40)
                .y_label_area_size(70);
            let colours = [BLUE, RED, GREEN, MAGENTA, CYAN, BLACK];
            if log_y {
                let (lo, hi) = if values.is_empty() || lo <= 0.0 {
                    (1e-12, 1.0)
                } else {
                    (lo / 2.0, hi * 2.0)
                };
                let mut c = chart
                    .build_cartesian_2d((t_min..t_max).log_scale(), (lo..hi).log_scale())
                    .map_err(|e| fail(&e))?;
                c.configure_mesh()
                    .x_desc("passes T")
                    .y_label_formatter(&|v| format!("{v:.0e}"))
                    .draw()
                    .map_err(|e| fail(&e))?;
                for (model, colour) in experiment.models.iter().zip(colours.iter().cycle()) {
                    let points = series(model, value);
                    c.draw_series(LineSeries::new(points.clone(), colour.stroke_width(2)))
                        .map_err(|e| fail(&e))?
                        .label(model)
                        .legend(move |(x, y)| PathElement::new([(x, y), (x + 20, y)], colour));
                    c.draw_series(points.iter().map(|&p| Circle::new(p, 4, colour.filled())))
                        .map_err(|e| fail(&e))?;
                }
                c.configure_series_labels()
                    .background_style(WHITE.mix(0.8))
                    .border_style(BLACK)
                    .draw()
                    .map_err(|e| fail(&e))?;
            } else {
                let (lo, hi) = if values.is_empty() {
                    (-1.0, 1.0)
                } else {
                    (lo.min(0.0) - 0.05, 1.05f64.max(hi))
                };
                let mut c = chart
                    .build_cartesian_2d((t_min..t_max).log_scale(), lo..hi)
                    .map_err(|e| fail(&e))?;
                c.configure_mesh()
                    .x_desc("passes T")
                    .draw()
                    .map_err(|e| fail(&e))?;
                for (model, colour) in experiment.models.iter().zip(colours.iter().cycle()) {
                    let points = series(model, value);
                    c.draw_series(LineSeries::new(points.clone(), colour.stroke_width(2)))
                        .map_err(|e| fail(&e))?;
                    c.draw_series(points.iter().map(|&p| Circle::new(p, 4, colour.filled())))
                        .map_err(|e| fail(&e))?;
                }
            }
        }
        root.present().map_err(|e| fail(&e))?;
    }
    image::RgbImage::from_raw(width, height, buffer)
        .expect("the buffer holds the image")
        .save(path)
        .map_err(|e| fail(&e))
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
    let args = Args::parse();
    let result = if args.merge.is_empty() {
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
