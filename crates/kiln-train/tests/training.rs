//! The training loop on a fixed problem. kiln-train against `torch.optim.AdamW` + `LambdaLR` + `clip_grad_norm_` + accumulation over
//! 2 micro-batches (`scripts/fixtures/train.py`): a two-layer MLP with a LayerNorm, four PyTorch
//! parameter groups (two path groups, each split by "no decay on biases and norms"), 30 steps.
//! Every step's loss, pre-clip gradient norm and learning rates, and every parameter after every
//! step, within 1e-5 relative; and a run resumed after every single step from its checkpoint
//! ends bit for bit where the uninterrupted run ends. Loss scaling: a dynamic scale changes
//! nothing where nothing overflows, skips overflowing steps (halving the scale) without
//! touching the parameters; a run whose loss stays non-finite stops with an error naming the
//! last good checkpoint, which is intact. Data-parallel (the `collective` feature): two
//! processes on localhost, one micro-batch each per step, end where one process with two
//! micro-batches per step ends.

use std::path::Path;

use burn::backend::{Autodiff, Flex};
use burn::module::{Module, Param};
use burn::nn::loss::CrossEntropyLossConfig;
use burn::nn::{LayerNorm, LayerNormConfig, Linear, LinearConfig};
use burn::tensor::activation::gelu;
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{Int, Tensor, TensorData};
use kiln_core::Order;
use kiln_train::{
    BadBatch, EvalOutput, EvalStep, Loader, LossScaling, OptimizerConfig, Outcome, RunOptions,
    Schedule, StepContext, StepOutput, TrainConfig, TrainError, TrainStep, Trainer,
};
use safetensors::SafeTensors;

type B = Autodiff<Flex>;

const STEPS: u64 = 30;
const MICRO: usize = 2;
const ITEMS: usize = 8;

#[derive(Module, Debug)]
struct Mlp<B: Backend> {
    fc1: Linear<B>,
    norm: LayerNorm<B>,
    fc2: Linear<B>,
    /// The loss is multiplied by this (to make scaled losses overflow).
    #[module(skip)]
    loss_factor: f32,
    /// From this step on the loss is NaN.
    #[module(skip)]
    nan_from_step: Option<u64>,
    /// The forward pass panics with this message in step 3.
    #[module(skip)]
    panic_in_step_3: Option<&'static str>,
    /// The step refuses its batch in step 3 (training) or in evaluation.
    #[module(skip)]
    refuse_in_step_3: bool,
}

impl<B: Backend> Mlp<B> {
    fn forward(&self, x: Tensor<B, 2>) -> Tensor<B, 2> {
        self.fc2
            .forward(gelu(self.norm.forward(self.fc1.forward(x))))
    }
}

impl<B: AutodiffBackend> TrainStep<B> for Mlp<B> {
    type Batch = (Tensor<B, 2>, Tensor<B, 1, Int>);

    fn train_step(
        &self,
        (x, labels): Self::Batch,
        context: &StepContext,
    ) -> Result<StepOutput<B>, BadBatch> {
        if let (Some(message), 2) = (self.panic_in_step_3, context.step) {
            panic!("{message}");
        }
        if self.refuse_in_step_3 && context.step == 2 {
            return Err(BadBatch("caption 7 is 40 tokens; the LM holds 32".into()));
        }
        let logits = self.forward(x);
        let loss = CrossEntropyLossConfig::new()
            .init(&logits.device())
            .forward(logits, labels);
        let loss = match self.nan_from_step {
            Some(step) if context.step >= step => loss.mul_scalar(f32::NAN),
            _ if self.loss_factor != 1.0 => loss.mul_scalar(self.loss_factor),
            _ => loss,
        };
        Ok(StepOutput::new(loss, ITEMS))
    }
}

impl<B: Backend> EvalStep<B> for Mlp<B> {
    type Batch = (Tensor<B, 2>, Tensor<B, 1, Int>);

    fn eval_step(&self, (x, labels): Self::Batch) -> Result<EvalOutput<B>, BadBatch> {
        let logits = self.forward(x);
        let n = labels.dims()[0];
        let loss = CrossEntropyLossConfig::new()
            .init(&logits.device())
            .forward(logits, labels);
        Ok(EvalOutput::new(n).with_sum("loss", loss.mul_scalar(n as f32)))
    }
}

/// The fixture's micro-batches in the order PyTorch used them (one epoch = the whole run).
struct FixtureBatches<B: Backend> {
    x: Vec<f32>,
    labels: Vec<i64>,
    device: B::Device,
}

impl<B: Backend> Loader for FixtureBatches<B> {
    type Batch = (Tensor<B, 2>, Tensor<B, 1, Int>);

    fn batches_per_epoch(&self) -> usize {
        STEPS as usize * MICRO
    }

    fn batches(&self, _: Order, first: usize) -> Box<dyn Iterator<Item = Self::Batch> + '_> {
        Box::new((first..self.batches_per_epoch()).map(|b| {
            let x = &self.x[b * ITEMS * 4..(b + 1) * ITEMS * 4];
            let labels = &self.labels[b * ITEMS..(b + 1) * ITEMS];
            (
                Tensor::from_data(TensorData::new(x.to_vec(), [ITEMS, 4]), &self.device),
                Tensor::from_data(TensorData::new(labels.to_vec(), [ITEMS]), &self.device),
            )
        }))
    }
}

struct Fixture(Vec<u8>);

impl Fixture {
    fn load() -> Self {
        let path =
            Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/adamw_parity.safetensors");
        Fixture(std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display())))
    }

    fn f32s(&self, name: &str) -> (Vec<f32>, Vec<usize>) {
        let st = SafeTensors::deserialize(&self.0).unwrap();
        let t = st.tensor(name).unwrap_or_else(|e| panic!("{name}: {e}"));
        let values = t
            .data()
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
            .collect();
        (values, t.shape().to_vec())
    }

    fn i64s(&self, name: &str) -> Vec<i64> {
        let st = SafeTensors::deserialize(&self.0).unwrap();
        st.tensor(name)
            .unwrap()
            .data()
            .chunks_exact(8)
            .map(|b| i64::from_le_bytes(b.try_into().unwrap()))
            .collect()
    }

    /// Parameter `name` (PyTorch layout) as kiln's layout: Linear weights transposed.
    fn param(&self, key: &str, name: &str) -> Vec<f32> {
        let (values, shape) = self.f32s(key);
        if name.ends_with(".weight") && name.starts_with("fc") {
            let (rows, cols) = (shape[shape.len() - 2], shape[shape.len() - 1]);
            (0..cols)
                .flat_map(|c| (0..rows).map(move |r| (r, c)))
                .map(|(r, c)| values[r * cols + c])
                .collect()
        } else {
            values
        }
    }

    /// Parameter `name` after `step` (1-based) steps, in kiln's layout.
    fn after(&self, name: &str, step: u64) -> Vec<f32> {
        let (all, shape) = self.f32s(&format!("step.{name}"));
        let per: usize = shape[1..].iter().product();
        let start = (step as usize - 1) * per;
        let one = all[start..start + per].to_vec();
        if name.ends_with(".weight") && name.starts_with("fc") {
            let (rows, cols) = (shape[1], shape[2]);
            (0..cols)
                .flat_map(|c| (0..rows).map(move |r| (r, c)))
                .map(|(r, c)| one[r * cols + c])
                .collect()
        } else {
            one
        }
    }
}

const PARAMS: [&str; 6] = [
    "fc1.weight",
    "fc1.bias",
    "norm.weight",
    "norm.bias",
    "fc2.weight",
    "fc2.bias",
];

fn model(fixture: &Fixture, device: &burn::backend::flex::FlexDevice) -> Mlp<B> {
    let tensor1 = |name: &str| {
        let v = fixture.param(&format!("init.{name}"), name);
        let n = v.len();
        Param::from_tensor(Tensor::<B, 1>::from_data(TensorData::new(v, [n]), device))
    };
    let linear = |name: &str, inputs: usize, outputs: usize| {
        let mut layer = LinearConfig::new(inputs, outputs).init::<B>(device);
        let w = fixture.param(&format!("init.{name}.weight"), &format!("{name}.weight"));
        layer.weight = Param::from_tensor(Tensor::from_data(
            TensorData::new(w, [inputs, outputs]),
            device,
        ));
        layer.bias = Some(tensor1(&format!("{name}.bias")));
        layer
    };
    let mut norm = LayerNormConfig::new(8).init::<B>(device);
    norm.gamma = tensor1("norm.weight");
    norm.beta = Some(tensor1("norm.bias"));
    Mlp {
        fc1: linear("fc1", 4, 8),
        norm,
        fc2: linear("fc2", 8, 3),
        loss_factor: 1.0,
        nan_from_step: None,
        panic_in_step_3: None,
        refuse_in_step_3: false,
    }
}

/// kiln's values of the fixture's parameter `name`.
fn values(model: &Mlp<B>, name: &str) -> Vec<f32> {
    let t = match name {
        "fc1.weight" => model.fc1.weight.val().flatten::<1>(0, 1),
        "fc1.bias" => model.fc1.bias.as_ref().unwrap().val(),
        "norm.weight" => model.norm.gamma.val(),
        "norm.bias" => model.norm.beta.as_ref().unwrap().val(),
        "fc2.weight" => model.fc2.weight.val().flatten::<1>(0, 1),
        "fc2.bias" => model.fc2.bias.as_ref().unwrap().val(),
        _ => unreachable!(),
    };
    t.into_data().to_vec().unwrap()
}

fn config(fixture: &Fixture) -> TrainConfig {
    let mut config = TrainConfig::new(STEPS, 0.01);
    config.accumulate = MICRO;
    config.optimizer = OptimizerConfig::adamw(0.01)
        .with_weight_decay(0.1)
        .with_group("fc1", &["fc1"], 0.02, 0.05)
        .without_decay_on_biases_and_norms();
    config.schedule = Schedule::warmup_cosine(5, 0.1, 0.05, STEPS);
    config.max_grad_norm = Some(f64::from(fixture.f32s("max_norm").0[0]));
    config.checkpoint_every = 1_000;
    config
}

fn run(fixture: &Fixture, out: &Path, max_steps_now: Option<u64>, model: Mlp<B>) -> Mlp<B> {
    let options = RunOptions {
        max_steps_now,
        ..quiet(out)
    };
    run_with(config(fixture), fixture, options, model)
        .unwrap()
        .model
}

/// A run in `out` without a progress bar.
fn quiet(out: &Path) -> RunOptions {
    RunOptions {
        progress: false,
        ..RunOptions::new(out)
    }
}

fn run_with(
    config: TrainConfig,
    fixture: &Fixture,
    options: RunOptions,
    model: Mlp<B>,
) -> Result<Outcome<Mlp<B>>, TrainError> {
    let device = Default::default();
    let data = FixtureBatches::<B> {
        x: fixture.f32s("x").0,
        labels: fixture.i64s("labels"),
        device,
    };
    Trainer::<B>::new(config, options, device).fit(model, &data, None::<&FixtureBatches<Flex>>)
}

/// Every parameter of `model` within 1e-5 of PyTorch's after the last step.
fn ends_where_pytorch_ends(model: &Mlp<B>, fixture: &Fixture) {
    for name in PARAMS {
        close(&values(model, name), &fixture.after(name, STEPS), name);
    }
}

fn close(kiln: &[f32], torch: &[f32], what: &str) {
    assert_eq!(kiln.len(), torch.len(), "{what}");
    let scale = torch.iter().fold(0f32, |m, v| m.max(v.abs()));
    for (i, (a, b)) in kiln.iter().zip(torch).enumerate() {
        assert!(
            (a - b).abs() <= 1e-5 * scale.max(b.abs()),
            "{what}[{i}]: kiln {a}, PyTorch {b}"
        );
    }
}

fn metrics(out: &Path) -> Vec<serde_json::Value> {
    kiln_train::read_metrics(out).unwrap()
}

#[test]
fn training_matches_pytorch_every_step_and_resumes_bit_for_bit() {
    let fixture = Fixture::load();
    let device = Default::default();

    // Uninterrupted: every step's loss, norm and rates; the final parameters.
    let whole = tempfile::tempdir().unwrap();
    let trained = run(&fixture, whole.path(), None, model(&fixture, &device));
    let lines = metrics(whole.path());
    assert_eq!(lines.len(), STEPS as usize);
    let (losses, _) = fixture.f32s("loss");
    let (norms, _) = fixture.f32s("grad_norm");
    let (lrs, _) = fixture.f32s("lr");
    for (s, line) in lines.iter().enumerate() {
        assert_eq!(line["step"], s as u64 + 1);
        let number = |key: &str| line[key].as_f64().unwrap() as f32;
        close(
            &[number("loss")],
            &[losses[s]],
            &format!("loss at step {}", s + 1),
        );
        close(
            &[number("grad_norm")],
            &[norms[s]],
            &format!("norm at step {}", s + 1),
        );
        close(
            &[number("lr_fc1"), number("lr_default")],
            &lrs[2 * s..2 * s + 2],
            &format!("rates at step {}", s + 1),
        );
    }
    let clipped = norms
        .iter()
        .filter(|&&n| f64::from(n) > config(&fixture).max_grad_norm.unwrap())
        .count();
    assert!(
        clipped > 0 && clipped < STEPS as usize,
        "clipping is exercised"
    );
    ends_where_pytorch_ends(&trained, &fixture);

    // One step per invocation, each resumed from the checkpoint the one before wrote.
    let pieces = tempfile::tempdir().unwrap();
    let mut resumed = model(&fixture, &device);
    for step in 1..=STEPS {
        resumed = run(&fixture, pieces.path(), Some(1), model(&fixture, &device));
        for name in PARAMS {
            close(
                &values(&resumed, name),
                &fixture.after(name, step),
                &format!("{name} after step {step}"),
            );
        }
    }
    for name in PARAMS {
        assert_eq!(values(&resumed, name), values(&trained, name), "{name}");
    }
    let losses_of = |lines: &[serde_json::Value]| -> Vec<serde_json::Value> {
        lines.iter().map(|l| l["loss"].clone()).collect()
    };
    assert_eq!(losses_of(&metrics(pieces.path())), losses_of(&lines));
}

#[test]
fn a_dynamic_loss_scale_changes_nothing_where_nothing_overflows() {
    let fixture = Fixture::load();
    let device = Default::default();
    let out = tempfile::tempdir().unwrap();
    let mut scaled = config(&fixture);
    scaled.loss_scaling = LossScaling::Dynamic;
    let outcome = run_with(
        scaled,
        &fixture,
        quiet(out.path()),
        model(&fixture, &device),
    )
    .unwrap();
    assert_eq!(outcome.skipped_steps, 0);
    for line in metrics(out.path()) {
        assert_eq!(line["loss_scale"], 32768.0);
    }
    ends_where_pytorch_ends(&outcome.model, &fixture);
}

#[test]
fn overflowing_steps_are_skipped_with_the_scale_halved_and_the_parameters_untouched() {
    let fixture = Fixture::load();
    let device = Default::default();
    let out = tempfile::tempdir().unwrap();
    let mut scaled = config(&fixture);
    scaled.loss_scaling = LossScaling::Dynamic;
    // loss × 2^118 × 2^15 overflows f32 (2^128): the scale has to fall by several halvings;
    // the unscaled gradients' norm (about 2^118) is finite though its square is not.
    let huge = |steps| {
        let mut m = model(&fixture, &device);
        m.loss_factor = 2f32.powi(118);
        run_with(
            scaled.clone(),
            &fixture,
            RunOptions {
                max_steps_now: Some(steps),
                ..quiet(out.path())
            },
            m,
        )
        .unwrap()
    };
    let first = huge(1);
    assert_eq!(first.skipped_steps, 1);
    for name in PARAMS {
        let initial = fixture.param(&format!("init.{name}"), name);
        assert_eq!(
            values(&first.model, name),
            initial,
            "{name} moved on a skipped step"
        );
    }
    let outcome = huge(STEPS - 1);
    let lines = metrics(out.path());
    let skipped: Vec<bool> = lines
        .iter()
        .map(|l| l["skipped"].as_bool().unwrap())
        .collect();
    let scales: Vec<f64> = lines
        .iter()
        .map(|l| l["loss_scale"].as_f64().unwrap())
        .collect();
    let first_applied = skipped.iter().position(|s| !s).expect("the scale recovers");
    assert!(first_applied >= 3, "{scales:?}");
    assert!(skipped[first_applied..].iter().all(|s| !s), "{skipped:?}");
    for k in 1..=first_applied {
        assert_eq!(
            scales[k],
            scales[k - 1] / 2.0,
            "halved after each overflow: {scales:?}"
        );
    }
    assert_eq!(outcome.skipped_steps as usize, first_applied);
    assert!(lines.last().unwrap()["loss"].as_f64().unwrap().is_finite());
    assert!(lines.last().unwrap()["grad_norm"].as_f64().unwrap() > 2f64.powi(100));
}

#[test]
fn a_loss_that_stays_non_finite_stops_the_run_and_keeps_the_last_good_checkpoint() {
    let fixture = Fixture::load();
    let device = Default::default();
    let out = tempfile::tempdir().unwrap();
    let mut settings = config(&fixture);
    settings.checkpoint_every = 5;
    settings.max_skipped_in_a_row = 3;
    let mut m = model(&fixture, &device);
    m.nan_from_step = Some(7);
    let error = run_with(settings.clone(), &fixture, quiet(out.path()), m).unwrap_err();
    let message = error.to_string();
    assert!(
        message.contains("3 steps in a row (through step 10)"),
        "{message}"
    );
    assert!(message.contains("step-00000005"), "{message}");
    let lines = metrics(out.path());
    assert_eq!(lines.len(), 10);
    assert!(
        lines[7..]
            .iter()
            .all(|l| l["skipped"] == true && l["loss"].is_null())
    );
    // The checkpoint is whole: a rerun without the fault resumes from it and matches PyTorch.
    let resumed = run_with(
        settings,
        &fixture,
        quiet(out.path()),
        model(&fixture, &device),
    )
    .unwrap();
    ends_where_pytorch_ends(&resumed.model, &fixture);
}

/// A run too short to reach the limit of skipped steps in a row, all of whose steps were
/// skipped (a diverging learning rate), is an error: its model is the untrained one.
#[test]
fn a_run_whose_every_step_was_skipped_is_an_error_not_a_result() {
    let fixture = Fixture::load();
    let device = Default::default();
    let out = tempfile::tempdir().unwrap();
    let mut settings = config(&fixture);
    settings.max_skipped_in_a_row = 1000;
    let mut m = model(&fixture, &device);
    m.nan_from_step = Some(0);
    let error = run_with(settings, &fixture, quiet(out.path()), m).unwrap_err();
    let message = error.to_string();
    assert!(
        message.contains(&format!("{STEPS} steps in a row (through step {STEPS})")),
        "{message}"
    );
}

#[test]
fn running_out_of_device_memory_is_an_error_naming_the_batch_and_other_panics_stay_panics() {
    let fixture = Fixture::load();
    let device = Default::default();
    let out = tempfile::tempdir().unwrap();
    let mut m = model(&fixture, &device);
    m.panic_in_step_3 = Some("Out of memory: could not allocate 2.0 GiB on cuda:0");
    let error = run_with(config(&fixture), &fixture, quiet(out.path()), m).unwrap_err();
    let message = error.to_string();
    assert!(
        message.contains("out of memory in step 3") && message.contains("lower the batch size"),
        "{message}"
    );
    let mut m = model(&fixture, &device);
    m.panic_in_step_3 = Some("index 9 out of bounds");
    let out = tempfile::tempdir().unwrap();
    let panicked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        run_with(config(&fixture), &fixture, quiet(out.path()), m)
    }));
    assert!(panicked.is_err(), "a bug is not turned into an error");
}

#[test]
fn a_batch_the_step_refuses_is_an_error_naming_the_step() {
    let fixture = Fixture::load();
    let out = tempfile::tempdir().unwrap();
    let mut m = model(&fixture, &Default::default());
    m.refuse_in_step_3 = true;
    let error = run_with(config(&fixture), &fixture, quiet(out.path()), m).unwrap_err();
    assert_eq!(
        error.to_string(),
        "step 3: caption 7 is 40 tokens; the LM holds 32"
    );
}

/// One participant of a two-participant run over the fixture, one micro-batch each per step
/// (so the global step is the single run's two micro-batches): its parameters at the end.
#[cfg(feature = "collective")]
fn participant(out: &Path, parallel: kiln_train::DataParallel) -> Vec<Vec<f32>> {
    let fixture = Fixture::load();
    let mut settings = config(&fixture);
    settings.accumulate = 1;
    let options = RunOptions {
        parallel: Some(parallel),
        ..quiet(out)
    };
    let model = model(&fixture, &Default::default());
    let trained = run_with(settings, &fixture, options, model).unwrap().model;
    PARAMS.iter().map(|n| values(&trained, n)).collect()
}

/// The single-process run of the fixture (two micro-batches per step) into `out`.
#[cfg(feature = "collective")]
fn alone(out: &Path) -> Mlp<B> {
    let fixture = Fixture::load();
    run(&fixture, out, None, model(&fixture, &Default::default()))
}

/// A participant's parameters and rank 0's log against the single run's, within 1e-6.
#[cfg(feature = "collective")]
fn same_as_alone(who: &str, params: &[Vec<f32>], alone: &Mlp<B>) {
    for (name, got) in PARAMS.iter().zip(params) {
        let want = values(alone, name);
        let scale = want.iter().fold(0f32, |m, v| m.max(v.abs()));
        for (i, (a, b)) in got.iter().zip(&want).enumerate() {
            assert!(
                (a - b).abs() <= 1e-6 * scale,
                "{who} {name}[{i}]: {a}, alone {b}"
            );
        }
    }
}

/// Rank 0 alone wrote the log: every step, with the losses one process logged.
#[cfg(feature = "collective")]
fn same_log(shared: &Path, single: &Path) {
    let (two, one) = (metrics(shared), metrics(single));
    assert_eq!(two.len(), one.len());
    for (a, b) in two.iter().zip(&one) {
        let (a, b) = (a["loss"].as_f64().unwrap(), b["loss"].as_f64().unwrap());
        assert!((a - b).abs() <= 1e-6 * b.abs(), "loss {a} vs {b}");
    }
}

/// The child half of `two_processes_end_where_one_process_ends`: one rank of the two-process
/// run, started by that test with torchrun's variables (returns at once when run on its own).
#[cfg(feature = "collective")]
#[test]
fn data_parallel_worker_process() {
    let Some(out) = std::env::var_os("KILN_TEST_DATA_PARALLEL_OUT") else {
        return;
    };
    let out = std::path::PathBuf::from(out);
    let parallel = kiln_train::DataParallel::from_env().unwrap().unwrap();
    let file = out.join(format!("params-{}.json", parallel.rank));
    let params = participant(&out, parallel);
    std::fs::write(file, serde_json::to_string(&params).unwrap()).unwrap();
}

#[cfg(feature = "collective")]
#[test]
fn two_processes_end_where_one_process_ends() {
    use std::process::Command;
    use std::time::{Duration, Instant};

    let single = tempfile::tempdir().unwrap();
    let alone = alone(single.path());
    let shared = tempfile::tempdir().unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let log = |rank: usize| shared.path().join(format!("rank-{rank}.log"));
    let mut ranks: Vec<_> = (0..2)
        .map(|rank| {
            let output = std::fs::File::create(log(rank)).unwrap();
            Command::new(std::env::current_exe().unwrap())
                .args(["--exact", "data_parallel_worker_process", "--nocapture"])
                .stdout(output.try_clone().unwrap())
                .stderr(output)
                .env("RANK", rank.to_string())
                .env("WORLD_SIZE", "2")
                .env("MASTER_ADDR", "127.0.0.1")
                .env("MASTER_PORT", port.to_string())
                .env("KILN_TEST_DATA_PARALLEL_OUT", shared.path())
                .spawn()
                .unwrap()
        })
        .collect();
    let started = Instant::now();
    for (rank, child) in ranks.iter_mut().enumerate() {
        loop {
            if let Some(status) = child.try_wait().unwrap() {
                let text = std::fs::read_to_string(log(rank)).unwrap_or_default();
                assert!(status.success(), "rank {rank} failed: {status}\n{text}");
                break;
            }
            if started.elapsed() > Duration::from_secs(300) {
                let _ = child.kill();
                panic!("rank {rank} did not finish in 300 s");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    for rank in 0..2 {
        let text = std::fs::read_to_string(shared.path().join(format!("params-{rank}.json")));
        let params: Vec<Vec<f32>> = serde_json::from_str(&text.unwrap()).unwrap();
        same_as_alone(&format!("rank {rank}"), &params, &alone);
    }
    same_log(shared.path(), single.path());
}

#[cfg(feature = "collective")]
#[test]
fn two_threads_end_where_one_process_ends() {
    let single = tempfile::tempdir().unwrap();
    let alone = alone(single.path());
    let shared = tempfile::tempdir().unwrap();
    let threads: Vec<_> = (0..2)
        .map(|rank| {
            let out = shared.path().to_path_buf();
            let parallel = kiln_train::DataParallel::threads(rank, 2);
            std::thread::spawn(move || participant(&out, parallel))
        })
        .collect();
    for (rank, thread) in threads.into_iter().enumerate() {
        same_as_alone(&format!("thread {rank}"), &thread.join().unwrap(), &alone);
    }
    same_log(shared.path(), single.path());
}
