//! kiln-vision forward throughput, batch 32, under kiln-bench: images/s and the fraction of the
//! device's measured GEMM peak (roofline), for the towers the Monte-Carlo job runs. PyTorch's
//! figures for the same work come from `scripts/bench/vision_torch.py`; both are in
//! docs/PERFORMANCE.md.
//!
//! ```text
//! cargo bench --bench vision                          # Flex, f32
//! cargo bench --bench vision -- --save main           # then `-- --compare main`
//! cargo bench --bench vision -- --filter clip --policy mixed-bf16
//! cargo bench --features wgpu --bench vision -- --device vulkan
//! ```
//!
//! The towers are randomly initialised at the released sizes: throughput does not depend on the
//! weights. `*/mc` runs the same forward with Monte-Carlo dropout 0.1 at every site, which adds
//! the masks' cost and the unfused attention.

use std::process::ExitCode;

use kiln::bench::{BenchError, Benchmark, Runner, Suite, Work, cli};
use kiln::burn::tensor::backend::Backend;
use kiln::burn::tensor::{Distribution, Tensor};
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
        Ok(())
    }
}

fn main() -> ExitCode {
    allocator::keep_freed_memory();
    cli::main(Vision)
}
