//! kiln-realtime per-frame speed under kiln-bench: mirage-hello's benchmarked U-Net (a frame is
//! 6 denoising forwards, each reading the incoming frame, as the system's benchmark runs them)
//! and its live-stream diffusion model (a frame is one step with the memory bank and the
//! blend), 64 × 64, at b = 1 and b = 8 streams. PyTorch's figures for the same work come from `scripts/bench/realtime_torch.py`; both are in
//! docs/PERFORMANCE.md.
//!
//! ```text
//! cargo bench --bench realtime                            # Flex, f32
//! cargo bench --bench realtime -- --policy pure-f16       # the system's FP16 conversion
//! cargo bench --features cuda --bench realtime -- --device cuda --policy pure-f16
//! ```
//!
//! Items are frames (of every stream); each run ends with the frame read back to the host, as
//! a real-time loop needs it, so the figures are per frame, synchronised.

use std::process::ExitCode;

use kiln::bench::{BenchError, Benchmark, Runner, Suite, Work, cli};
use kiln::burn::tensor::backend::Backend;
use kiln::burn::tensor::{Distribution, Tensor, TensorData};
use kiln::realtime::{FrameLoop, LiveStreamDiffusion, LsdConfig, UNet, UNetConfig};

/// mimalloc, keeping the memory it frees for the next step (docs/PERFORMANCE.md).
#[path = "../examples/shared/allocator.rs"]
mod allocator;

/// The side of the frames, the system's.
const SIZE: usize = 64;
/// The U-Net's timesteps per frame (`comprehensive_day2_benchmark`).
const UNET_TIMESTEPS: [f32; 6] = [50.0, 40.0, 30.0, 20.0, 10.0, 0.0];

/// One U-Net frame: six denoising forwards, each reading the incoming frame (the system's loop;
/// the chained variant costs the same).
struct UNetFrame<B: Backend> {
    model: UNet<B>,
    streams: usize,
}

impl<B: Backend> Benchmark<B> for UNetFrame<B> {
    type Input = Tensor<B, 4>;
    type Output = TensorData;

    fn name(&self) -> String {
        format!("unet/{SIZE}px,b={}", self.streams)
    }

    fn work(&self) -> Work {
        Work::items(self.streams as u64)
    }

    fn prepare(&self, device: &B::Device, _variant: usize) -> Self::Input {
        let shape = [self.streams, 3, SIZE, SIZE];
        Tensor::random(shape, Distribution::Uniform(-1.0, 1.0), device)
    }

    fn run(&self, frames: &Self::Input) -> Self::Output {
        let frame = self
            .model
            .frame(frames.clone(), &UNET_TIMESTEPS, FrameLoop::Mirage);
        frame.expect("frames of the U-Net's shape").into_data()
    }
}

/// One live-stream frame of every stream, the bank and the previous output carried over from
/// the run before.
struct LsdFrame<B: Backend> {
    model: LiveStreamDiffusion<B>,
    streams: usize,
}

impl<B: Backend> Benchmark<B> for LsdFrame<B> {
    type Input = (Tensor<B, 4>, std::cell::RefCell<kiln::realtime::Stream<B>>);
    type Output = TensorData;

    fn name(&self) -> String {
        format!("lsd/{SIZE}px,b={}", self.streams)
    }

    fn work(&self) -> Work {
        Work::items(self.streams as u64)
    }

    fn prepare(&self, device: &B::Device, _variant: usize) -> Self::Input {
        let shape = [self.streams, 3, SIZE, SIZE];
        let frames = Tensor::random(shape, Distribution::Uniform(-1.0, 1.0), device);
        (
            frames,
            std::cell::RefCell::new(self.model.stream(self.streams)),
        )
    }

    fn run(&self, (frames, stream): &Self::Input) -> Self::Output {
        let mut stream = stream.borrow_mut();
        // One timestep (the system draws one of 0 … 19 a frame; which one changes the numbers,
        // not the cost).
        let out = self.model.next_frame(&mut stream, frames.clone(), &[10.0]);
        out.expect("frames of the model's shape").into_data()
    }
}

struct Realtime;

impl Suite for Realtime {
    fn run<B: Backend>(&self, runner: &mut Runner<'_, B>) -> Result<(), BenchError> {
        let (device, policy) = (runner.device().clone(), runner.policy());
        for streams in [1, 8] {
            let unet = UNetConfig::mirage().init(&device).with_policy(policy);
            runner.bench(&UNetFrame {
                model: unet,
                streams,
            })?;
            let lsd = LsdConfig::mirage().init(&device).with_policy(policy);
            runner.bench(&LsdFrame {
                model: lsd,
                streams,
            })?;
        }
        Ok(())
    }
}

fn main() -> ExitCode {
    allocator::keep_freed_memory();
    cli::main(Realtime)
}
