//! The loop around [`Optimization::step`]: resume from the newest checkpoint, then per
//! optimizer step the `metrics.jsonl` line, evaluation, checkpoint and plot as they fall due.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use burn::module::{AutodiffModule, Module};
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{DType, Tensor};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use kiln_core::Order;
use kiln_core::{check_memory, on_host_pool, parameter_count};
use serde_json::{Map, Value, json};

use crate::TrainError;
use crate::checkpoint::{CheckpointState, Checkpoints, compatible, flatten};
use crate::config::TrainConfig;
use crate::data::Loader;
use crate::metrics::MetricsLog;
use crate::optim::{GroupedAdamW, parameters};
use crate::optimization::{Averaging, Optimization, StepReport, loss_scale, loss_scale_state};
use crate::parallel::DataParallel;
use crate::plot::plot_curves;
use crate::step::{EvalStep, StepContext, TrainStep};

/// What decides where and how long this invocation runs, not what it computes.
#[derive(Debug, Clone)]
pub struct RunOptions {
    /// The run's directory: `metrics.jsonl`, the plot, `checkpoints/`.
    pub out: PathBuf,
    /// The plot's file name in `out` (`loss.png`).
    pub plot: String,
    /// Stop after this many more optimizer steps (with a checkpoint); a rerun continues.
    pub max_steps_now: Option<u64>,
    /// Draw a progress bar on a terminal.
    pub progress: bool,
    /// The model's settings, recorded in `run.json` and checkpoints beside the training
    /// settings (a resumed run with other settings is refused).
    pub model_settings: Value,
    /// What identifies the data (set sizes, checksums of label files, generated-data
    /// settings), recorded likewise: a run resumed on other data is refused, naming it.
    pub data: Value,
    /// The files the caller writes in `out` besides the trainer's own (`summary.json`, a model
    /// directory): a directory that holds any of them, or of the trainer's, without a
    /// `run.json` is refused rather than written over.
    pub outputs: Vec<String>,
    /// This participant's place in a data-parallel run (`None`: train alone). Participant 0
    /// writes the logs, plots and checkpoints.
    pub parallel: Option<DataParallel>,
}

impl RunOptions {
    /// A run in `out`, to its last step, with a progress bar.
    pub fn new(out: impl Into<PathBuf>) -> Self {
        RunOptions {
            out: out.into(),
            plot: "loss.png".into(),
            max_steps_now: None,
            progress: true,
            model_settings: Value::Null,
            data: Value::Null,
            outputs: Vec::new(),
            parallel: None,
        }
    }
}

/// How a call to [`Trainer::fit`] ended.
#[derive(Debug)]
pub struct Outcome<M> {
    /// The trained model.
    pub model: M,
    /// Optimizer steps taken in all (this call and the ones it resumed).
    pub step: u64,
    /// Whether the run is complete (all its steps, or stopped early).
    pub finished: bool,
    /// Whether early stopping ended it.
    pub stopped_early: bool,
    /// The last evaluation's metrics, if this call evaluated.
    pub eval: Vec<(String, f64)>,
    /// The best metric's value and step.
    pub best: Option<(f64, u64)>,
    /// Steps skipped for non-finite values.
    pub skipped_steps: u64,
}

impl<M> Outcome<M> {
    /// The same outcome with `f` of its model (the trained part of a wrapper, say).
    pub fn map_model<N>(self, f: impl FnOnce(M) -> N) -> Outcome<N> {
        Outcome {
            model: f(self.model),
            step: self.step,
            finished: self.finished,
            stopped_early: self.stopped_early,
            eval: self.eval,
            best: self.best,
            skipped_steps: self.skipped_steps,
        }
    }
}

/// Trains models under one [`TrainConfig`].
#[derive(Debug, Clone)]
pub struct Trainer<B: AutodiffBackend> {
    config: TrainConfig,
    options: RunOptions,
    device: B::Device,
}

impl<B: AutodiffBackend> Trainer<B> {
    /// A trainer on `device`.
    pub fn new(config: TrainConfig, options: RunOptions, device: B::Device) -> Self {
        Trainer {
            config,
            options,
            device,
        }
    }

    /// Claims the run's directory ([`crate::claim`]): creates it with its `run.json`, accepts
    /// the identical run's, refuses another run's or one holding files no run recorded. Call it
    /// before making anything in the directory; [`Trainer::fit`] calls it too. Only the main
    /// participant of a data-parallel run claims.
    pub fn claim(&self) -> Result<(), TrainError> {
        if !self.is_main() {
            return Ok(());
        }
        let mut files = vec![
            "metrics.jsonl".to_string(),
            self.options.plot.clone(),
            "checkpoints".to_string(),
        ];
        files.extend(self.options.outputs.iter().cloned());
        crate::claim(&self.options.out, &self.settings(), &files)
    }

    /// Refuses, before anything is allocated, a model whose weights, gradients and AdamW's two
    /// moments (16 bytes a parameter in f32) exceed the memory the device can still take (the
    /// host's for CPU backends, the GPU's on CUDA), naming the model's largest settings.
    fn check_memory<M: Module<B>>(&self, model: &M) -> Result<(), TrainError> {
        let values = parameter_count(model);
        let what =
            format!("the weights, gradients and AdamW moments of the model's {values} parameters");
        check_memory::<B>(&self.device, values.saturating_mul(16), &what).map_err(|problem| {
            let mut sizes = Vec::new();
            flatten("", &self.options.model_settings, &mut sizes);
            let mut sizes: Vec<(String, u64)> = sizes
                .into_iter()
                .filter_map(|(key, value)| Some((key, value.as_u64().filter(|&n| n > 1)?)))
                .collect();
            sizes.sort_by_key(|size| std::cmp::Reverse(size.1));
            let named: Vec<String> = sizes
                .iter()
                .take(3)
                .map(|(key, n)| format!("{key} = {n}"))
                .collect();
            TrainError::Config(if named.is_empty() {
                problem.to_string()
            } else {
                format!("{problem} (the largest: {})", named.join(", "))
            })
        })
    }

    /// Whether this participant writes the run's files.
    fn is_main(&self) -> bool {
        self.options
            .parallel
            .as_ref()
            .is_none_or(DataParallel::is_main)
    }

    /// What the run computes: training, model and data settings and the participants, as a
    /// checkpoint reads them back (parsed from text: serde_json's parser may round the last
    /// bit of a float differently from the value it printed).
    fn settings(&self) -> Value {
        let participants = self.options.parallel.as_ref().map_or(1, |p| p.world);
        let settings = json!({
            "train": self.config,
            "model": self.options.model_settings,
            "data": self.options.data,
            "participants": participants,
        });
        serde_json::from_str(&settings.to_string()).expect("JSON parses")
    }

    /// Trains `model` on `train`, evaluating on `eval`; resumes from the newest intact
    /// checkpoint in the run's directory if there is one.
    pub fn fit<M, L, E>(
        &self,
        model: M,
        train: &L,
        eval: Option<&E>,
    ) -> Result<Outcome<M>, TrainError>
    where
        M: TrainStep<B, Batch = L::Batch>,
        M::InnerModule: EvalStep<B::InnerBackend, Batch = E::Batch>,
        L: Loader,
        E: Loader,
    {
        let config = &self.config;
        self.prepare(&model, train)?;
        let main = self.is_main();
        let averaging = self.averaging()?;
        let progress = progress_bar(config.steps, self.options.progress && main);
        let checkpoints = Checkpoints::new(self.options.out.join("checkpoints"));
        let (mut model, mut state, mut last_checkpoint) =
            self.resume(model, &checkpoints, &progress)?;
        let resumed_from = last_checkpoint.as_deref();
        let mut optimization =
            self.optimization(&model, &state, resumed_from, averaging, &progress)?;
        let groups = config.optimizer.group_names();
        let mut log = match main {
            true => Some(MetricsLog::open(
                &self.options.out.join("metrics.jsonl"),
                state.step,
                &groups,
            )?),
            false => None,
        };
        let mut cursor = Cursor {
            loader: train,
            seed: config.seed,
            epoch: state.epoch,
            batch: state.batch,
            batches: None,
        };
        let stop_at = match self.options.max_steps_now {
            Some(more) => config.steps.min(state.step + more),
            None => config.steps,
        };
        let mut last_eval = Vec::new();
        progress.set_position(state.step);
        while state.step < stop_at && !state.stopped_early {
            let started = Instant::now();
            let (trained, step) = optimization.step(model, state.step, || cursor.next())?;
            // The epoch of the step's (last) batch: a new epoch begins when a batch is drawn.
            let epoch = cursor.epoch;
            model = trained;
            self.count_skipped(&mut state, &step, &progress);
            state.step += 1;
            (state.epoch, state.batch) = (cursor.epoch, cursor.batch);
            state.loss_scale = optimization.loss_scale_state();
            let mut line = metrics_line(&state, epoch, &step, &groups, started.elapsed());
            let evaluate_now = state.step == config.steps
                || (config.eval_every > 0 && state.step.is_multiple_of(config.eval_every));
            let mut improved = false;
            if let (true, Some(eval)) = (evaluate_now, eval) {
                last_eval = self.evaluate_at(state.step, &model, eval, &progress)?;
                for (name, value) in &last_eval {
                    line.insert(format!("eval_{name}"), json!(finite_or_null(*value)));
                }
                improved = self.track_best(&mut state, &last_eval);
            }
            if let Some(log) = &mut log {
                log.append(line, &groups)?;
            }
            if state.skipped.1 >= config.max_skipped_in_a_row {
                progress.abandon();
                return Err(TrainError::NonFinite {
                    step: state.step,
                    in_a_row: state.skipped.1,
                    checkpoint: last_checkpoint,
                });
            }
            progress.set_position(state.step);
            progress.set_message(format!(
                "epoch {} ({} batches) loss {:.4} lr {:.2e}",
                state.epoch + 1,
                train.batches_per_epoch(),
                step.loss,
                step.lrs.last().copied().unwrap_or(0.0)
            ));
            let due = state.step.is_multiple_of(config.checkpoint_every)
                || state.step == stop_at
                || state.stopped_early
                || improved;
            if due && main {
                last_checkpoint = Some(checkpoints.save(
                    &state,
                    &model,
                    optimization.optimizer(),
                    config.keep_last,
                )?);
            }
            if let (true, Some(log)) = (evaluate_now, &log) {
                self.plot(log, &groups);
            }
        }
        let finished = state.step >= config.steps || state.stopped_early;
        if finished && state.skipped.1 > 0 && state.skipped.1 as u64 == state.step {
            // Every step was skipped: the model is the one the run began with, not a result.
            progress.abandon();
            return Err(TrainError::NonFinite {
                step: state.step,
                in_a_row: state.skipped.1,
                checkpoint: last_checkpoint,
            });
        }
        if finished
            && last_eval.is_empty()
            && let Some(eval) = eval
        {
            self.seed_evaluation(state.step);
            last_eval = evaluate(&model.valid(), eval)?;
        }
        if let Some(log) = &log {
            self.plot(log, &groups);
        }
        progress.finish_and_clear();
        Ok(Outcome {
            model,
            step: state.step,
            finished,
            stopped_early: state.stopped_early,
            eval: last_eval,
            best: state.best,
            skipped_steps: state.skipped.0,
        })
    }

    /// Everything checked before a run starts: the settings, a training set with batches, the
    /// memory, this directory claimed for the run and made.
    fn prepare<M: Module<B>, L: Loader>(&self, model: &M, train: &L) -> Result<(), TrainError> {
        self.config.validate()?;
        if train.batches_per_epoch() == 0 {
            return Err(TrainError::Data("the training set has no batches".into()));
        }
        self.check_memory(model)?;
        if let Some((items, batch)) = train.sizes()
            && batch > items
            && self.is_main()
        {
            eprintln!(
                "warning: the batch size ({batch}) is larger than the training set ({items} \
                 items): every step takes all {items}"
            );
        }
        self.claim()?;
        let out = &self.options.out;
        std::fs::create_dir_all(out).map_err(|e| TrainError::io(out, e))
    }

    /// `model` and the run's state from the newest intact checkpoint in `checkpoints` (with
    /// its path), or as they start when there is none. A checkpoint of other settings or
    /// parameters is an error naming the differences.
    fn resume<M: AutodiffModule<B>>(
        &self,
        model: M,
        checkpoints: &Checkpoints,
        progress: &ProgressBar,
    ) -> Result<(M, CheckpointState, Option<PathBuf>), TrainError> {
        let settings = self.settings();
        let params = parameters(&model);
        let Some((path, saved)) = checkpoints.latest()? else {
            let state = CheckpointState {
                step: 0,
                epoch: 0,
                batch: 0,
                loss_scale: loss_scale_state(&loss_scale(self.config.loss_scaling, None)),
                best: None,
                evals_since_best: 0,
                skipped: (0, 0),
                stopped_early: false,
                settings,
                params,
                files: Default::default(),
            };
            return Ok((model, state, None));
        };
        compatible(&saved, &settings, &params).map_err(|differences| TrainError::Incompatible {
            path: path.clone(),
            differences: differences.join("\n  "),
        })?;
        let model = Checkpoints::load_model(&path, model, &self.device)?;
        say(
            progress,
            self.is_main(),
            format!(
                "resuming from {} (step {}, epoch {}, batch {})",
                path.display(),
                saved.step,
                saved.epoch,
                saved.batch
            ),
        );
        Ok((model, saved, Some(path)))
    }

    /// The optimizer (parameter groups, schedule, loss scaling, averaging across participants)
    /// for `model`'s parameters, whose ids a loaded checkpoint sets: a resumed run's from its
    /// checkpoint (`resumed_from`), with the loss scale of `state`; a new run's said.
    fn optimization<M: TrainStep<B>>(
        &self,
        model: &M,
        state: &CheckpointState,
        resumed_from: Option<&Path>,
        averaging: Option<Box<dyn Averaging<B::InnerBackend>>>,
        progress: &ProgressBar,
    ) -> Result<Optimization<B, M>, TrainError> {
        let config = &self.config;
        let params = parameters(model);
        let mut optimizer = GroupedAdamW::new(&config.optimizer, &params);
        if let Some(path) = resumed_from {
            optimizer = Checkpoints::load_optimizer(path, optimizer, &self.device)?;
        } else {
            let main = self.is_main();
            say(progress, main, format!("schedule: {}", config.schedule));
            for line in optimizer.describe(&config.optimizer, &params) {
                say(progress, main, line);
            }
        }
        let saved_scale = resumed_from.map(|_| state.loss_scale);
        let loss_scale = loss_scale(config.loss_scaling, saved_scale);
        let optimization = Optimization::new(config, optimizer, loss_scale, &self.device);
        Ok(match averaging {
            Some(averaging) => optimization.with_averaging(averaging),
            None => optimization,
        })
    }

    /// Counts a step the loss scaler skipped (overall and in a row), warning of it.
    fn count_skipped(
        &self,
        state: &mut CheckpointState,
        step: &StepReport,
        progress: &ProgressBar,
    ) {
        if step.applied {
            state.skipped.1 = 0;
            return;
        }
        state.skipped.0 += 1;
        state.skipped.1 += 1;
        say(
            progress,
            self.is_main(),
            format!(
                "warning: step {} skipped: loss {}, gradient norm {} (loss scale {})",
                state.step + 1,
                step.loss,
                step.grad_norm,
                step.loss_scale
            ),
        );
    }

    /// The evaluation after `step` steps, seeded ([`Self::seed_evaluation`]) and said.
    fn evaluate_at<M, E>(
        &self,
        step: u64,
        model: &M,
        eval: &E,
        progress: &ProgressBar,
    ) -> Result<Vec<(String, f64)>, TrainError>
    where
        M: TrainStep<B>,
        M::InnerModule: EvalStep<B::InnerBackend, Batch = E::Batch>,
        E: Loader,
    {
        self.seed_evaluation(step);
        let metrics = evaluate(&model.valid(), eval)?;
        let said: Vec<String> = metrics.iter().map(|(k, v)| format!("{k} {v:.4}")).collect();
        say(
            progress,
            self.is_main(),
            format!("step {step}: eval {}", said.join(", ")),
        );
        Ok(metrics)
    }

    /// Seeds the device's generator for the evaluation after `step` steps, so a model that
    /// draws random numbers while evaluating (random queries, Monte-Carlo dropout) gives the
    /// same figures whenever that evaluation runs: in the run, or again when a finished run is
    /// rerun. Training steps seed their own ([`StepContext::derived_seed`]).
    fn seed_evaluation(&self, step: u64) {
        let context = StepContext {
            seed: self.config.seed,
            step,
            micro_batch: usize::MAX,
        };
        <B::InnerBackend as Backend>::seed(&self.device, context.derived_seed());
    }

    /// Joins the data-parallel group the options name, if any.
    fn averaging(&self) -> Result<Option<Box<dyn Averaging<B::InnerBackend>>>, TrainError> {
        let Some(parallel) = self.options.parallel.as_ref().filter(|p| p.world > 1) else {
            return Ok(None);
        };
        #[cfg(feature = "collective")]
        {
            let collective =
                crate::parallel::Collective::<B::InnerBackend>::join(parallel, &self.device)?;
            Ok(Some(Box::new(collective)))
        }
        #[cfg(not(feature = "collective"))]
        Err(TrainError::Parallel(format!(
            "{} participants need kiln-train's `collective` feature (kiln's `collective`): rebuild with `--features collective`",
            parallel.world
        )))
    }

    /// Updates the best metric and the early-stopping count; whether this evaluation is the
    /// new best.
    fn track_best(&self, state: &mut CheckpointState, metrics: &[(String, f64)]) -> bool {
        let Some(best) = &self.config.best else {
            return false;
        };
        let Some(&(_, value)) = metrics.iter().find(|(k, _)| *k == best.name) else {
            return false;
        };
        let better = match state.best {
            None => value.is_finite(),
            Some((old, _)) if best.higher_is_better => value > old,
            Some((old, _)) => value < old,
        };
        if better {
            state.best = Some((value, state.step));
            state.evals_since_best = 0;
        } else {
            state.evals_since_best += 1;
            if let Some(patience) = self.config.patience {
                state.stopped_early = state.evals_since_best >= patience;
            }
        }
        better
    }

    /// Redraws the plot (a failure is a warning: the run goes on).
    fn plot(&self, log: &MetricsLog, groups: &[String]) {
        if let Err(e) = plot_curves(
            &self.options.out.join(&self.options.plot),
            log.points(),
            groups,
        ) {
            log::warn!("could not draw the loss plot: {e}");
        }
    }
}

/// The training data's position: epoch, next batch, and that epoch's batches.
struct Cursor<'a, L: Loader> {
    loader: &'a L,
    seed: u64,
    epoch: u64,
    batch: usize,
    batches: Option<Box<dyn Iterator<Item = L::Batch> + 'a>>,
}

impl<L: Loader> Cursor<'_, L> {
    /// The next batch, into the next epoch when this one is done.
    fn next(&mut self) -> L::Batch {
        loop {
            let order = Order::Shuffled {
                seed: self.seed,
                epoch: self.epoch,
            };
            let batches = self
                .batches
                .get_or_insert_with(|| self.loader.batches(order, self.batch));
            if let Some(batch) = batches.next() {
                self.batch += 1;
                return batch;
            }
            self.epoch += 1;
            self.batch = 0;
            self.batches = None;
        }
    }
}

/// The metrics of `model` over every batch of `eval`, as the loop reports them: each metric's
/// sum divided by the number of items or by its own count (and rooted where it is a root mean
/// square).
pub fn evaluate<IB, M, E>(model: &M, eval: &E) -> Result<Vec<(String, f64)>, TrainError>
where
    IB: Backend,
    M: EvalStep<IB, Batch = E::Batch>,
    E: Loader,
{
    let mut sums: Vec<Tensor<IB, 1>> = Vec::new();
    let mut metrics: Vec<(String, Option<usize>, bool)> = Vec::new();
    let mut items = 0usize;
    let device = model.devices().into_iter().next().unwrap_or_default();
    for batch in eval.batches(Order::Sequential, 0) {
        // The model goes to the pool's thread (modules are `Send`, not `Sync`); clones share
        // their parameters.
        let model = model.clone();
        let output =
            on_host_pool::<IB, _>(&device, move || model.eval_step(batch)).map_err(|problem| {
                TrainError::BadBatch {
                    stage: "evaluation".into(),
                    problem,
                }
            })?;
        items += output.items;
        let values = output.sums.iter().map(|m| m.sum.clone().cast(DType::F32));
        if sums.is_empty() {
            sums = values.collect();
            metrics = output
                .sums
                .iter()
                .map(|m| (m.name.clone(), m.count, m.root))
                .collect();
        } else {
            sums = sums.into_iter().zip(values).map(|(s, v)| s + v).collect();
            for (metric, batch) in metrics.iter_mut().zip(&output.sums) {
                metric.1 = metric.1.zip(batch.count).map(|(a, b)| a + b);
            }
        }
    }
    if items == 0 || sums.is_empty() {
        return Err(TrainError::Data("the evaluation set has no items".into()));
    }
    let totals: Vec<f64> = Tensor::cat(sums, 0)
        .into_data()
        .convert::<f64>()
        .to_vec()
        .expect("f64 values");
    Ok(metrics
        .into_iter()
        .zip(totals)
        .map(|((name, count, root), total)| {
            let mean = total / count.unwrap_or(items) as f64;
            (name, if root { mean.sqrt() } else { mean })
        })
        .collect())
}

/// A step's line of `metrics.jsonl`: the step and epoch, the loss and its parts, the learning
/// rates, the gradient norm, loss scale and skip, and the step's time, data wait and speed.
fn metrics_line(
    state: &CheckpointState,
    epoch: u64,
    step: &StepReport,
    groups: &[String],
    took: Duration,
) -> Map<String, Value> {
    let seconds = took.as_secs_f64();
    let mut line = Map::new();
    line.insert("step".into(), json!(state.step));
    line.insert("epoch".into(), json!(epoch));
    line.insert("loss".into(), json!(finite_or_null(step.loss)));
    for (name, value) in &step.parts {
        line.insert(name.clone(), json!(finite_or_null(*value)));
    }
    for (group, lr) in groups.iter().zip(&step.lrs) {
        line.insert(format!("lr_{group}"), json!(lr));
    }
    line.insert("lr".into(), json!(step.lrs.last()));
    line.insert("grad_norm".into(), json!(finite_or_null(step.grad_norm)));
    line.insert("loss_scale".into(), json!(step.loss_scale));
    line.insert("skipped".into(), json!(!step.applied));
    line.insert("step_time_s".into(), json!(seconds));
    line.insert("data_wait_s".into(), json!(step.data_wait.as_secs_f64()));
    line.insert("items_per_s".into(), json!(step.items as f64 / seconds));
    line
}

/// JSON has no NaN or infinity: those are logged as null.
fn finite_or_null(v: f64) -> Option<f64> {
    v.is_finite().then_some(v)
}

/// Prints `message` above the progress bar (on stderr, drawn bar or not) where this
/// participant is the `main` one.
fn say(progress: &ProgressBar, main: bool, message: impl AsRef<str>) {
    if main {
        progress.suspend(|| eprintln!("{}", message.as_ref()));
    }
}

fn progress_bar(steps: u64, show: bool) -> ProgressBar {
    let bar = ProgressBar::new(steps);
    if !show {
        bar.set_draw_target(ProgressDrawTarget::hidden());
    }
    bar.set_style(
        ProgressStyle::with_template(
            "{bar:30} {pos}/{len} steps {msg} [{elapsed} < {eta}, {per_sec}]",
        )
        .expect("a valid template"),
    );
    bar
}
