//! kiln-vision forward throughput, batch 32, under kiln-bench: images/s and the fraction of the
//! device's measured GEMM peak (roofline), for the towers the Monte-Carlo job runs. PyTorch's
//! figures for the same work come from `scripts/bench/vision_torch.py`; both are in
//! docs/PERFORMANCE.md.
//!
//! ```text
//! cargo bench --bench vision                          # Flex, f32
//! cargo bench --bench vision -- --save main           # then `-- --compare main`
//! cargo bench --bench vision -- --filter clip --policy mixed-bf16
//! cargo bench --features cuda --bench vision -- --device cuda --filter projection  # burn's products
//! KILN_CUBLASLT=1 cargo bench --features cuda --bench vision -- --device cuda --filter projection
//! cargo bench --features wgpu --bench vision -- --device vulkan
//! ```
//!
//! The towers are randomly initialised at the released sizes: throughput does not depend on the
//! weights. `*/mc` runs the same forward with Monte-Carlo dropout 0.1 at every site, which adds
//! the masks' cost and the unfused attention.

use std::process::ExitCode;

use kiln::bench::{BenchError, Benchmark, Runner, Suite, Work, cli};
use kiln::burn::nn::{Linear, LinearConfig};
use kiln::burn::tensor::backend::Backend;
use kiln::burn::tensor::{Distribution, FloatDType, Tensor};
use kiln::core::cast_module;
use kiln::transformer::projection::{Then, project};
use kiln::transformer::{Activation, Pass, PreparedWeights, Settings};
use kiln::vision::{Draw, DropoutSites, Preset, VisionModel};

/// mimalloc, keeping the memory it frees for the next step (docs/PERFORMANCE.md).
#[path = "../examples/shared/allocator.rs"]
mod allocator;

const BATCH: usize = 32;

/// One forward pass of a batch of `BATCH` random images.
struct Forward<B: Backend> {
    name: String,
    model: VisionModel<B>,
    size: usize,
    flops_per_image: f64,
    sampled: bool,
}

impl<B: Backend> Benchmark<B> for Forward<B> {
    type Input = Tensor<B, 4>;
    type Output = Tensor<B, 2>;

    fn name(&self) -> String {
        self.name.clone()
    }

    fn work(&self) -> Work {
        Work::items(BATCH as u64).with_flops(self.flops_per_image * BATCH as f64)
    }

    fn prepare(&self, device: &B::Device, _variant: usize) -> Self::Input {
        let shape = [BATCH, 3, self.size, self.size];
        Tensor::random(shape, Distribution::Normal(0.0, 1.0), device)
    }

    fn run(&self, pixels: &Self::Input) -> Self::Output {
        if self.sampled {
            let draw = Draw::pass(0, 0, 0..BATCH as u64);
            self.model
                .forward_sampled(pixels.clone(), &draw)
                .expect("one item per row")
        } else {
            self.model.forward(pixels.clone())
        }
    }
}

/// One projection of a tower's MLP alone, as the forward runs it (kiln-transformer's `project`):
/// `act(x W + b)` or `residual + (x W + b)` over the batch's tokens. On CUDA it times burn's
/// product or cuBLASLt's (`KILN_CUBLASLT=1`) without the rest of the forward.
struct Projection<B: Backend> {
    name: String,
    linear: Linear<B>,
    rows: usize,
    then: Option<Activation>,
    dtype: FloatDType,
}

impl<B: Backend> Benchmark<B> for Projection<B> {
    type Input = (Tensor<B, 3>, Tensor<B, 3>);
    type Output = Tensor<B, 3>;

    fn name(&self) -> String {
        self.name.clone()
    }

    fn work(&self) -> Work {
        let [inputs, outputs] = self.linear.weight.dims();
        Work::items(BATCH as u64).with_flops(2.0 * (self.rows * inputs * outputs) as f64)
    }

    fn prepare(&self, device: &B::Device, _variant: usize) -> Self::Input {
        let [inputs, outputs] = self.linear.weight.dims();
        let tokens = self.rows / BATCH;
        let random = |width: usize| {
            let x: Tensor<B, 3> = Tensor::random(
                [BATCH, tokens, width],
                Distribution::Normal(0.0, 1.0),
                device,
            );
            x.cast(self.dtype)
        };
        (random(inputs), random(outputs))
    }

    fn run(&self, (x, residual): &Self::Input) -> Self::Output {
        let pass = Pass::new(&Settings::default(), &PreparedWeights::default(), None);
        let then = match self.then {
            Some(activation) => Then::Activate(activation),
            None => Then::AddTo {
                residual: residual.clone(),
                scale: None,
            },
        };
        project(&self.linear, x.clone(), then, &pass)
    }
}

/// The towers' MLP projections at batch 32: (name, tokens per image, inputs, outputs, the
/// activation after the first; the second adds onto the residual stream).
const PROJECTIONS: [(&str, usize, usize, usize, Activation); 2] = [
    ("clip-b32", 50, 768, 3072, Activation::QuickGelu),
    ("dinov2-s", 325, 384, 1536, Activation::Gelu),
];

/// The towers of the Monte-Carlo job (kiln-vision's presets) at their benchmark resolutions,
/// under the names the saved baselines use.
const TOWERS: [(&str, &str, usize); 3] = [
    ("clip_b32", "clip-b32", 224),
    ("siglip2_b16", "siglip2-b16", 224),
    ("dinov2_s", "dinov2-s", 256),
];

struct Vision;

impl Suite for Vision {
    fn run<B: Backend>(&self, runner: &mut Runner<'_, B>) -> Result<(), BenchError> {
        let (device, policy) = (runner.device(), runner.policy());
        for (name, preset, size) in TOWERS {
            let plain = format!("{name}/{size}px,b={BATCH}");
            let sampled = format!("{plain}/mc");
            if !runner.selects(&plain) && !runner.selects(&sampled) {
                continue; // not even initialised: on a GPU that compiles kernels
            }
            let config = Preset::named(preset).expect("a preset").config;
            let model = config.init(device).with_policy(&policy);
            let flops_per_image = config.forward_flops(size, size);
            runner.bench(&Forward {
                name: plain,
                model: model.clone(),
                size,
                flops_per_image,
                sampled: false,
            })?;
            runner.bench(&Forward {
                name: sampled,
                model: model
                    .with_dropout(DropoutSites::all(0.1))
                    .expect("0.1 is a rate"),
                size,
                flops_per_image,
                sampled: true,
            })?;
        }
        for (tower, tokens, inputs, outputs, activation) in PROJECTIONS {
            let shapes = [
                (
                    format!("fc1,{inputs}x{outputs}"),
                    inputs,
                    outputs,
                    Some(activation),
                ),
                (
                    format!("fc2,{outputs}x{inputs}+residual"),
                    outputs,
                    inputs,
                    None,
                ),
            ];
            for (what, inputs, outputs, then) in shapes {
                let name = format!("projection/{tower}/{what},b={BATCH}");
                if !runner.selects(&name) {
                    continue;
                }
                let compute = policy.compute;
                let linear = cast_module(LinearConfig::new(inputs, outputs).init(device), compute);
                runner.bench(&Projection {
                    name,
                    linear,
                    rows: BATCH * tokens,
                    then,
                    dtype: compute.float_dtype(),
                })?;
            }
        }
        Ok(())
    }
}

fn main() -> ExitCode {
    allocator::keep_freed_memory();
    // kiln's warnings (a library that falls back, say) on stderr; `KILN_LOG=info` for more.
    kiln::log_to_stderr();
    cli::main(Vision)
}
