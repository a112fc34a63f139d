//! Training throughput of the foveated model (kiln-foveated) under kiln-bench: one timed run is
//! one optimizer step of kiln-train (both passes, backward, clipping, AdamW, the loss read back),
//! as the examples' loops run it. PyTorch's figure for the same model, shapes and optimizer comes
//! from `scripts/bench/foveated_torch.py`; both are in docs/FOVEATED.md.
//!
//! - `foveated_step/synthetic,b=16`: the `foveated_synthetic` example's model (DINOv2 8 wide,
//!   an LM 64 wide with 16 tokens, shallow readout; a 16-class per-frame head, the example's 24
//!   differ by 8 outputs) on 16 cue-then-read clips of 4 frames on 3×3 boards (between its 2×2
//!   start and 4×4 boards), the shapes `scripts/bench/foveated_torch.py` times.
//! - `foveated_step/fvlm,b=2,T=8`: fVLM's shapes — DINOv2-S at 224 px, SmolLM2-135M, deep
//!   readout, 384-wide queries, 2 clips of 8 frames, a 16-token prompt and a 32-token caption —
//!   random weights, the research variant's recipe (`research_recipe`).
//! - `foveated_step/release,b=2,T=8`: the same shapes as fVLM released its model
//!   (`FoveatedConfig::release()`: the coarse LM over the 8 visual tokens alone, λ = 0; the 48
//!   tokens of text after the visual tokens, all scored) and its stage-1 recipe
//!   (`ReleaseRecipe::stage1_135m`); `scripts/bench/foveated_torch.py --workload release` runs
//!   fVLM's own `FoveatedVLM` on them.
//! - `adamw/dinov2_s+smollm2_135m`: kiln-train's AdamW alone (fVLM's parameter groups) over the
//!   same model's 156.9 M values, gradients given: what the optimizer takes of a step.
//! - `foveated_caption/release,T=16,tokens=32`: one caption on fVLM's inference path
//!   (`FoveatedModel::generate`): a 16-frame clip at 224 px read in turn (DINOv2-S once over
//!   the frames, the LM one visual token at a time with its cache), fVLM's question for a
//!   caption (the chat-templated system and user turns, as kiln-text's fixture tokenizer
//!   encodes them), then 32 greedy tokens, no stop token; random weights of DINOv2-S and
//!   SmolLM2-135M. `scripts/bench/fvlm_caption_torch.py` runs fVLM's own
//!   `generate_captions.py` on the same (its loop stopped after the same 32 LM forwards).
//! - `dinov2_frames/224px`: DINOv2-S's patch features and keys/values (`encode_patches`, what
//!   the model runs once over every frame of a batch) for 1 … 16 frames at once: the per-frame
//!   cost should fall as B·T grows.
//!
//! ```text
//! cargo bench --bench foveated -- --quick
//! cargo bench --bench foveated -- --filter synthetic --save main    # then `--compare main`
//! ```

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::process::ExitCode;

use kiln::bench::{BenchError, Benchmark, Runner, Suite, Work, batch_sizes, cli};
use kiln::burn::backend::Autodiff;
use kiln::burn::module::{Module, ModuleVisitor, Param, ParamId};
use kiln::burn::optim::GradientsParams;
use kiln::burn::tensor::backend::Backend;
use kiln::burn::tensor::{Distribution, Tensor};
use kiln::foveated::synthetic::{self, CueThenRead};
use kiln::foveated::{
    CaptionTokenizer, ClipBatch, FVLM_CAPTION_PROMPT, FoveatedConfig, FoveatedModel, Mode, Readout,
    ReleaseRecipe, research_recipe,
};
use kiln::text::{GenerationConfig, TextConfig};
use kiln::train::{GroupedAdamW, Optimization, TrainConfig, parameters};
use kiln::vision::{Dinov2Config, Dinov2Model, Tower};

/// mimalloc, keeping the memory it frees for the next step (docs/PERFORMANCE.md).
#[path = "../examples/shared/allocator.rs"]
mod allocator;

type Trained<B> = FoveatedModel<Autodiff<B>>;

/// The model in training and its optimizer.
type Training<B> = (Trained<B>, Optimization<Autodiff<B>, Trained<B>>);

/// Which batches a training step takes.
enum Workload {
    /// Cue-then-read clips as the example's: 3×3 boards, 4 frames, 16 classes.
    Synthetic(CueThenRead),
    /// Random frames and token ids of fVLM's shapes: a prompt before the visual tokens and a
    /// caption after them (the research variant).
    Fvlm,
    /// The same frames and tokens, all of the text after the visual tokens (the release
    /// variant).
    Release,
}

const SYNTHETIC_CLIPS: usize = 16;
const FVLM: (usize, usize, usize, usize) = (2, 8, 16, 32); // clips, frames, prompt, caption
const FVLM_SIZE: usize = 224;
/// The optimizer row: fVLM's model without the batch (not selected by `--filter fvlm`).
const ADAMW: &str = "adamw/dinov2_s+smollm2_135m";

/// One optimizer step of the foveated model; the model and optimizer carry over from run to
/// run, as in training.
struct TrainingStep<B: Backend> {
    name: String,
    workload: Workload,
    state: RefCell<Option<Training<B>>>,
    step: Cell<u64>,
}

impl<B: Backend> TrainingStep<B> {
    fn new(
        name: &str,
        workload: Workload,
        model: Trained<B>,
        config: &TrainConfig,
        device: &B::Device,
    ) -> Self {
        let optimization = Optimization::fresh(config, &model, device);
        TrainingStep {
            name: name.into(),
            workload,
            state: RefCell::new(Some((model, optimization))),
            step: Cell::new(0),
        }
    }

    fn clips(&self) -> usize {
        match self.workload {
            Workload::Synthetic(_) => SYNTHETIC_CLIPS,
            Workload::Fvlm | Workload::Release => FVLM.0,
        }
    }
}

impl<B: Backend> Benchmark<B> for TrainingStep<B> {
    type Input = ClipBatch<Autodiff<B>>;
    type Output = f64;

    fn name(&self) -> String {
        self.name.clone()
    }

    fn work(&self) -> Work {
        Work::items(self.clips() as u64)
    }

    fn prepare(&self, device: &B::Device, variant: usize) -> Self::Input {
        match &self.workload {
            Workload::Synthetic(task) => {
                let first = (variant * SYNTHETIC_CLIPS) as u64;
                task.batch(first..first + SYNTHETIC_CLIPS as u64, device)
            }
            Workload::Fvlm | Workload::Release => {
                let (clips, frames, prompt, caption) = FVLM;
                let shape = [clips, frames, 3, FVLM_SIZE, FVLM_SIZE];
                let ids = |count: usize, salt: usize| {
                    let vocab = TextConfig::smollm2_135m().vocab_size;
                    let id = |i: usize| ((i * 7919 + salt * 104_729 + variant) % vocab) as u32;
                    (0..clips)
                        .map(|c| (0..count).map(|i| id(c * count + i)).collect())
                        .collect()
                };
                let pixels = Tensor::random(shape, Distribution::Normal(0.0, 1.0), device);
                let batch = ClipBatch::new(pixels);
                match self.workload {
                    Workload::Release => batch.with_target(ids(prompt + caption, 3)),
                    _ => batch
                        .with_prompt(ids(prompt, 1))
                        .with_target(ids(caption, 2)),
                }
            }
        }
    }

    fn run(&self, batch: &Self::Input) -> f64 {
        let (model, mut optimization) = self.state.borrow_mut().take().expect("a model");
        let (model, report) = optimization
            .step(model, self.step.get(), || batch.clone())
            .expect("a step without data-parallel peers");
        self.step.set(self.step.get() + 1);
        *self.state.borrow_mut() = Some((model, optimization));
        report.loss
    }
}

/// One step of kiln-train's AdamW over a model's parameters, each given a gradient (flat, by
/// parameter); the model and the moments carry over from run to run.
struct OptimizerStep<B: Backend> {
    name: String,
    state: RefCell<Option<Optimizing<B>>>,
    lrs: Vec<f64>,
}

/// The model and its optimizer alone.
type Optimizing<B> = (Trained<B>, GroupedAdamW<Autodiff<B>, Trained<B>>);

/// A gradient per parameter, flattened.
type FlatGradients<B> = HashMap<ParamId, Tensor<B, 1>>;

impl<B: Backend> OptimizerStep<B> {
    fn new(name: &str, model: Trained<B>, config: &TrainConfig) -> Self {
        let optimizer = GroupedAdamW::new(&config.optimizer, &parameters(&model));
        OptimizerStep {
            name: name.into(),
            state: RefCell::new(Some((model, optimizer))),
            lrs: config.optimizer.group_lrs(),
        }
    }

    fn values(&self) -> usize {
        let state = self.state.borrow();
        let (model, _) = state.as_ref().expect("a model");
        model.num_params()
    }
}

/// Registers each parameter's flat gradient in its shape.
struct Register<'a, B: Backend> {
    flat: &'a FlatGradients<B>,
    grads: GradientsParams,
}

impl<B: Backend> ModuleVisitor<Autodiff<B>> for Register<'_, B> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<Autodiff<B>, D>>) {
        if let Some(grad) = self.flat.get(&param.id) {
            let shape: [usize; D] = param.val().dims();
            self.grads
                .register::<B, D>(param.id, grad.clone().reshape(shape));
        }
    }
}

impl<B: Backend> Benchmark<B> for OptimizerStep<B> {
    type Input = FlatGradients<B>;
    type Output = ();

    fn name(&self) -> String {
        self.name.clone()
    }

    fn work(&self) -> Work {
        Work::items(self.values() as u64)
    }

    fn prepare(&self, device: &B::Device, _variant: usize) -> Self::Input {
        let state = self.state.borrow();
        let (model, _) = state.as_ref().expect("a model");
        parameters(model)
            .into_iter()
            .filter_map(|param| {
                let values = param.shape.iter().product::<usize>();
                let normal = Distribution::Normal(0.0, 1e-3);
                Some((param.id?, Tensor::random([values], normal, device)))
            })
            .collect()
    }

    fn run(&self, flat: &Self::Input) {
        let (model, mut optimizer) = self.state.borrow_mut().take().expect("a model");
        let mut register = Register {
            flat,
            grads: GradientsParams::new(),
        };
        model.visit(&mut register);
        let model = optimizer.step(&self.lrs, model, register.grads);
        *self.state.borrow_mut() = Some((model, optimizer));
    }
}

/// Frames of the caption benchmark's clip, and the tokens it generates.
const CAPTION: (usize, usize) = (16, 32);

/// One caption of a clip of random frames (`FoveatedModel::generate`).
struct Caption<B: Backend> {
    model: FoveatedModel<B>,
    question: Vec<u32>,
}

impl<B: Backend> Benchmark<B> for Caption<B> {
    type Input = ClipBatch<B>;
    type Output = Vec<Vec<u32>>;

    fn name(&self) -> String {
        format!(
            "foveated_caption/release,T={},tokens={}",
            CAPTION.0, CAPTION.1
        )
    }

    fn work(&self) -> Work {
        Work::items(CAPTION.1 as u64)
    }

    fn prepare(&self, device: &B::Device, _variant: usize) -> Self::Input {
        let shape = [1, CAPTION.0, 3, FVLM_SIZE, FVLM_SIZE];
        let pixels = Tensor::random(shape, Distribution::Normal(0.0, 1.0), device);
        ClipBatch::new(pixels).with_target(vec![self.question.clone()])
    }

    fn run(&self, batch: &Self::Input) -> Self::Output {
        let greedy = GenerationConfig::greedy(CAPTION.1);
        self.model
            .generate(batch, &greedy, |_| {})
            .expect("a clip of the model's size")
    }
}

/// fVLM's question for a caption, as kiln-text's fixture tokenizer encodes it (the PyTorch
/// script encodes it with the same tokenizer).
fn caption_question() -> Result<Vec<u32>, BenchError> {
    let tokenizer = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/crates/kiln-text/tests/fixtures/llama"
    );
    CaptionTokenizer::chat_from_lm_dir(tokenizer, "")
        .and_then(|tokens| tokens.question(FVLM_CAPTION_PROMPT))
        .map_err(BenchError::workload)
}

/// DINOv2's pass over `frames` frames at once (`encode_patches`).
struct Frames<B: Backend> {
    dino: Dinov2Model<B>,
    frames: usize,
}

impl<B: Backend> Benchmark<B> for Frames<B> {
    type Input = Tensor<B, 4>;
    type Output = Tensor<B, 3>;

    fn name(&self) -> String {
        format!("dinov2_frames/{FVLM_SIZE}px/b·t={}", self.frames)
    }

    fn work(&self) -> Work {
        Work::items(self.frames as u64)
    }

    fn prepare(&self, device: &B::Device, _variant: usize) -> Self::Input {
        let shape = [self.frames, 3, FVLM_SIZE, FVLM_SIZE];
        Tensor::random(shape, Distribution::Normal(0.0, 1.0), device)
    }

    fn run(&self, pixels: &Self::Input) -> Self::Output {
        self.dino
            .encode_patches(pixels.clone())
            .expect("frames of the tower's size")
            .last_hidden_state
    }
}

/// DINOv2-S at 224 px (its position table made for that size).
fn dinov2_s() -> Dinov2Config {
    Dinov2Config {
        image_size: FVLM_SIZE,
        ..Dinov2Config::small()
    }
}

struct Foveated;

impl Suite for Foveated {
    fn run<B: Backend>(&self, runner: &mut Runner<'_, B>) -> Result<(), BenchError> {
        let device = runner.device().clone();
        let synthetic = format!("foveated_step/synthetic,b={SYNTHETIC_CLIPS}");
        if runner.selects(&synthetic) {
            let task = CueThenRead::new(3, 6, 4, 16, 0).map_err(BenchError::workload)?;
            <Autodiff<B> as Backend>::seed(&device, 0);
            let model = task
                .model(
                    8,
                    16,
                    FoveatedConfig {
                        readout: Readout::Shallow,
                        ..FoveatedConfig::research()
                    },
                    &device,
                )
                .map_err(BenchError::workload)?
                .with_training_mode(Mode::CoarseFine);
            let config = synthetic::recipe(4000, 2e-3, 0.0);
            let workload = Workload::Synthetic(task);
            runner.bench(&TrainingStep::new(
                &synthetic, workload, model, &config, &device,
            ))?;
        }
        // Both backbones under the run's policy (`--policy mixed-bf16`: CPU autocast, bf16
        // products in the forward and both gradients).
        let policy = runner.policy();
        let fvlm_model = |config: FoveatedConfig| {
            <Autodiff<B> as Backend>::seed(&device, 0);
            FoveatedModel::new(
                dinov2_s().init(&device).with_policy(&policy),
                TextConfig::smollm2_135m().init(&device),
                config,
                &device,
            )
            .map(|model| model.with_lm_policy(&policy))
            .map_err(BenchError::workload)
        };
        let fvlm_config = research_recipe(1000, 1e-3, 1e-5);
        let fvlm = format!("foveated_step/fvlm,b={},T={}", FVLM.0, FVLM.1);
        if runner.selects(&fvlm) {
            runner.bench(&TrainingStep::new(
                &fvlm,
                Workload::Fvlm,
                fvlm_model(FoveatedConfig::research())?,
                &fvlm_config,
                &device,
            ))?;
        }
        let release = format!("foveated_step/release,b={},T={}", FVLM.0, FVLM.1);
        if runner.selects(&release) {
            runner.bench(&TrainingStep::new(
                &release,
                Workload::Release,
                fvlm_model(FoveatedConfig::release())?,
                &ReleaseRecipe::stage1_135m().train_config(1000),
                &device,
            ))?;
        }
        let caption = format!(
            "foveated_caption/release,T={},tokens={}",
            CAPTION.0, CAPTION.1
        );
        if runner.selects(&caption) {
            B::seed(&device, 0);
            let model = FoveatedModel::<B>::new(
                dinov2_s().init(&device).with_policy(&policy),
                TextConfig::smollm2_135m().init(&device),
                FoveatedConfig::release(),
                &device,
            )
            .map_err(BenchError::workload)?
            .with_lm_policy(&policy);
            runner.bench(&Caption {
                model,
                question: caption_question()?,
            })?;
        }
        if runner.selects(ADAMW) {
            runner.bench(&OptimizerStep::new(
                ADAMW,
                fvlm_model(FoveatedConfig::research())?,
                &fvlm_config,
            ))?;
        }
        let dino = dinov2_s().init::<B>(&device);
        runner.batch_scaling(
            &format!("dinov2_frames/{FVLM_SIZE}px"),
            &batch_sizes(16),
            |frames| Frames {
                dino: dino.clone(),
                frames,
            },
        )
    }
}

fn main() -> ExitCode {
    allocator::keep_freed_memory();
    cli::main(Foveated)
}
