//! Training throughput of the `train_classifier` example's model (tiny DINOv2 + linear head,
//! 32 × 32 images, batch 32) under kiln-bench: one timed run is one optimizer step of
//! kiln-train (forward, backward, global-norm clipping, AdamW with two decay groups, the loss
//! and norm read back), as the example's loop runs it; `classifier_forward_backward` is that
//! step without clipping and the update, and `piece/*` the parts of a layer, forward and backward
//! (burn's GELU beside kiln's; burn's attention, which kiln's replaces on Flex). PyTorch's
//! figure for the same model, data and optimizer comes from `scripts/bench/train_torch.py`; both
//! are in docs/PERFORMANCE.md.
//!
//! ```text
//! cargo bench --bench train
//! cargo bench --bench train -- --save main           # then `-- --compare main`
//! cargo bench --features cuda --bench train -- --device cuda
//! ```

#[path = "../examples/train_classifier/model.rs"]
mod model;

use std::cell::RefCell;
use std::process::ExitCode;

use kiln::bench::{BenchError, Benchmark, Runner, Suite, Work, cli};
use kiln::burn::backend::Autodiff;
use kiln::burn::nn::{LayerNormConfig, LinearConfig};
use kiln::burn::tensor::backend::Backend;
use kiln::burn::tensor::module::attention;
use kiln::burn::tensor::{Distribution, Int, Tensor, activation};
use kiln::train::Optimization;
use kiln::vision::VisionConfig;
use model::{Classifier, IMAGE_SIZE, backbone_config, recipe};

/// mimalloc, keeping the memory it frees for the next step (docs/PERFORMANCE.md).
#[path = "../examples/shared/allocator.rs"]
mod allocator;

const BATCH: usize = 32;
const CLASSES: usize = 4;

type Trained<B> = Classifier<Autodiff<B>>;

/// The model in training and its optimizer.
type Training<B> = (Trained<B>, Optimization<Autodiff<B>, Trained<B>>);

/// One optimizer step of the classifier on a batch of `BATCH` images; the model and optimizer
/// carry over from run to run, as in training.
struct TrainingStep<B: Backend> {
    state: RefCell<Option<Training<B>>>,
    step: RefCell<u64>,
}

impl<B: Backend> Benchmark<B> for TrainingStep<B> {
    type Input = (Tensor<B, 4>, Tensor<B, 1, Int>);
    type Output = f64;

    fn name(&self) -> String {
        format!("classifier_step/{IMAGE_SIZE}px,b={BATCH}")
    }

    fn work(&self) -> Work {
        // A backward pass costs about twice the forward.
        let forward = VisionConfig::Dinov2(backbone_config()).forward_flops(IMAGE_SIZE, IMAGE_SIZE);
        Work::items(BATCH as u64).with_flops(3.0 * forward * BATCH as f64)
    }

    fn prepare(&self, device: &B::Device, _variant: usize) -> Self::Input {
        let shape = [BATCH, 3, IMAGE_SIZE, IMAGE_SIZE];
        let classes = Distribution::Uniform(0.0, CLASSES as f64);
        (
            Tensor::random(shape, Distribution::Normal(0.0, 1.0), device),
            Tensor::random([BATCH], classes, device),
        )
    }

    fn run(&self, (pixels, labels): &Self::Input) -> f64 {
        let (model, mut optimization) = self.state.borrow_mut().take().expect("a model");
        let batch = || kiln::train::ImageBatch {
            pixels: Tensor::from_inner(pixels.clone()),
            labels: Tensor::from_inner(labels.clone()),
        };
        let mut step = self.step.borrow_mut();
        let (model, report) = optimization
            .step(model, *step, batch)
            .expect("a step without data-parallel peers");
        *step += 1;
        *self.state.borrow_mut() = Some((model, optimization));
        report.loss
    }
}

/// The same model's forward and backward passes alone (what the step costs before clipping and
/// the update).
struct ForwardBackward<B: Backend> {
    model: Trained<B>,
}

impl<B: Backend> Benchmark<B> for ForwardBackward<B> {
    type Input = Tensor<B, 4>;
    type Output = usize;

    fn name(&self) -> String {
        format!("classifier_forward_backward/{IMAGE_SIZE}px,b={BATCH}")
    }

    fn work(&self) -> Work {
        let forward = VisionConfig::Dinov2(backbone_config()).forward_flops(IMAGE_SIZE, IMAGE_SIZE);
        Work::items(BATCH as u64).with_flops(3.0 * forward * BATCH as f64)
    }

    fn prepare(&self, device: &B::Device, _variant: usize) -> Self::Input {
        let shape = [BATCH, 3, IMAGE_SIZE, IMAGE_SIZE];
        Tensor::random(shape, Distribution::Normal(0.0, 1.0), device)
    }

    fn run(&self, pixels: &Self::Input) -> usize {
        // On rayon's thread, as kiln-train runs a step.
        let model = self.model.clone();
        kiln::core::on_host_pool::<Autodiff<B>, _>(&pixels.device(), move || {
            let logits = model.logits(Tensor::from_inner(pixels.clone()));
            let grads = logits.sum().backward();
            // Reading one gradient waits for the backward pass.
            let grad = model.head.weight.grad(&grads).expect("a gradient");
            grad.into_data().num_elements()
        })
    }
}

/// One piece of a layer at the example's size, forward and backward under autodiff: `[rows,
/// width]` activations in, their gradient out (where the step's time goes).
struct Piece<B: Backend> {
    name: &'static str,
    shape: [usize; 2],
    forward: Box<PieceForward<B>>,
}

/// A piece's forward pass.
type PieceForward<B> = dyn Fn(Tensor<Autodiff<B>, 2>) -> Tensor<Autodiff<B>, 2>;

impl<B: Backend> Benchmark<B> for Piece<B> {
    type Input = Tensor<B, 2>;
    type Output = usize;

    fn name(&self) -> String {
        let [rows, width] = self.shape;
        format!("piece/{}/[{rows},{width}]", self.name)
    }

    fn work(&self) -> Work {
        Work::items(self.shape[0] as u64)
    }

    fn prepare(&self, device: &B::Device, _variant: usize) -> Self::Input {
        Tensor::random(self.shape, Distribution::Normal(0.0, 1.0), device)
    }

    fn run(&self, x: &Self::Input) -> usize {
        let x = Tensor::<Autodiff<B>, 2>::from_inner(x.clone()).require_grad();
        let grads = (self.forward)(x.clone()).sum().backward();
        x.grad(&grads)
            .expect("a gradient")
            .into_data()
            .num_elements()
    }
}

/// The pieces of the example's layers: GELU (burn's and kiln's), LayerNorm, burn's attention
/// (on Flex the model runs kiln's, a part of `classifier_step`), the MLP.
fn pieces<B: Backend>(device: &B::Device) -> Vec<Piece<B>> {
    let config = backbone_config();
    let (width, hidden, heads) = (
        config.hidden_size,
        config.intermediate_size(),
        config.num_attention_heads,
    );
    let tokens = (IMAGE_SIZE / config.patch_size).pow(2) + 1;
    let rows = BATCH * tokens;
    let norm = LayerNormConfig::new(width).init::<Autodiff<B>>(device);
    let up = LinearConfig::new(width, hidden).init::<Autodiff<B>>(device);
    let down = LinearConfig::new(hidden, width).init::<Autodiff<B>>(device);
    let split = move |x: Tensor<Autodiff<B>, 2>| {
        x.reshape([BATCH, tokens, heads, width / heads])
            .swap_dims(1, 2)
    };
    vec![
        Piece {
            name: "gelu_burn",
            shape: [rows, hidden],
            forward: Box::new(activation::gelu),
        },
        Piece {
            name: "gelu_kiln",
            shape: [rows, hidden],
            forward: Box::new(kiln::kernels::gelu),
        },
        Piece {
            name: "layer_norm",
            shape: [rows, width],
            forward: Box::new(move |x| norm.forward(x)),
        },
        Piece {
            name: "attention_burn",
            shape: [rows, width],
            forward: Box::new(move |x| {
                let q = split(x);
                let attended = attention(q.clone(), q.clone(), q, None, None, Default::default());
                attended.swap_dims(1, 2).reshape([rows, width])
            }),
        },
        Piece {
            name: "mlp",
            shape: [rows, width],
            forward: Box::new(move |x| down.forward(kiln::kernels::gelu(up.forward(x)))),
        },
    ]
}

struct Train;

impl Suite for Train {
    fn run<B: Backend>(&self, runner: &mut Runner<'_, B>) -> Result<(), BenchError> {
        let (device, policy) = (runner.device(), runner.policy());
        let model = Classifier::<Autodiff<B>>::new(CLASSES, &policy, device);
        let config = recipe(200, 2e-3, 1, &policy);
        let optimization = Optimization::fresh(&config, &model, device);
        runner.bench(&ForwardBackward::<B> {
            model: model.clone(),
        })?;
        runner.bench(&TrainingStep::<B> {
            state: RefCell::new(Some((model, optimization))),
            step: RefCell::new(0),
        })?;
        for piece in pieces::<B>(device) {
            runner.bench(&piece)?;
        }
        Ok(())
    }
}

fn main() -> ExitCode {
    allocator::keep_freed_memory();
    cli::main(Train)
}
