//! Real-time frame-to-frame diffusion (`kiln::realtime`): frames stream in, each goes through
//! mirage-hello's U-Net or its live-stream diffusion model within a frame budget, and every
//! frame's latency is measured with the device synchronised (the output read back), per frame,
//! not per forward.
//!
//! ```text
//! cargo run --release --example realtime -- --out DIR [--model unet|lsd] [--frames N]
//!     [--input DIR|FILE] [--steps S] [--budget-ms 40] [--streams B] [--device D] [--policy P]
//!     [--weights DIR] [--size PX] [--seed S] [--max-image-pixels N] [--chain]
//! ```
//!
//! - `--input`: a folder of frame images (in name order) or a clip (GIF; MP4 with the `video`
//!   feature), decoded once through kiln-cache, `--frames` frames sampled evenly from it; frames
//!   of another size are resized (shorter side, centre crop) with a note; frames declaring more
//!   than `--max-image-pixels` are refused before decoding. Without it, a moving
//!   pattern is generated (the system's demo's sine waves), shifted per stream.
//! - `--steps`: denoising forwards per frame: the U-Net's at timesteps 50 … 0 (the system's
//!   benchmark runs 6, the default), each reading the incoming frame as the system's benchmark
//!   does (the frame's output is the last forward's; `--chain`: each reads the previous
//!   forward's output, kiln's variant); the live-stream model's diffusion block at timesteps
//!   19 … 0 (the system runs 1, the default).
//! - `--streams B`: B independent streams through one forward (each with its own memory bank).
//! - `--weights`: a directory whose `model.safetensors` holds the system's state dict for the
//!   model; without, seeded random weights (the system's own benchmarks time random weights).
//!
//! Writes into OUT: `frames/stream-S/NNNNN.png` (every output frame), `preview.gif` (the first
//! 64 frames of stream 1), `latency.png` (the per-frame latency histogram with the budget line)
//! and `summary.json` (`fps` per stream, `frame_ms` {p50, p90, p99, max}, `budget_ms`,
//! `frames_over_budget`, `peak_memory_bytes`, `forwards_per_frame`, `streams`, and more).

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use burn::tensor::backend::Backend;
use burn::tensor::{Tensor, TensorData};
use clap::Parser;
use kiln::burn;
use kiln::core::{DeviceJob, DeviceSpec, Policy, PolicySpec};
use kiln::io::RunFiles;
use kiln::realtime::{FrameLoop, LiveStreamDiffusion, LsdConfig, Stream, UNet, UNetConfig};

mod frames;
mod report;

use frames::FrameSource;
use report::{Latencies, OutputWriter};

/// mimalloc, keeping the memory it frees for the next step (docs/PERFORMANCE.md).
#[path = "../shared/allocator.rs"]
mod allocator;

/// Stream frames through a real-time diffusion model and measure every frame.
#[derive(Parser)]
struct Args {
    /// The run's directory (frames, preview.gif, latency.png, summary.json).
    #[arg(long)]
    out: PathBuf,
    /// `unet` (the system's benchmarked U-Net) or `lsd` (its live-stream diffusion model).
    #[arg(long, default_value = "unet", value_parser = ["unet", "lsd"])]
    model: String,
    /// Frames per stream.
    #[arg(long, default_value_t = 128, value_parser = kiln::cli::count_up_to::<1_000_000>, allow_negative_numbers = true)]
    frames: usize,
    /// A folder of frame images or a clip (GIF, or MP4 with the `video` feature) [default: a
    /// generated moving pattern].
    #[arg(long)]
    input: Option<PathBuf>,
    /// Denoising forwards per frame [default: 6 for unet, 1 for lsd, as the system runs them].
    #[arg(long, value_parser = kiln::cli::count_up_to::<1000>, allow_negative_numbers = true)]
    steps: Option<usize>,
    /// The frame budget in milliseconds (40: 25 FPS; 16: 62.5 FPS).
    #[arg(long, default_value_t = 40.0, value_parser = kiln::cli::positive, allow_negative_numbers = true)]
    budget_ms: f64,
    /// Independent streams batched through one forward.
    #[arg(long, default_value_t = 1, value_parser = kiln::cli::count_up_to::<256>, allow_negative_numbers = true)]
    streams: usize,
    /// cpu, ndarray, wgpu, vulkan, metal, cuda, cuda:N.
    #[arg(long, default_value = "cpu")]
    device: DeviceSpec,
    /// Precision policy: full, or a pure half policy (p=f16,c=f16 / p=bf16,c=bf16), the
    /// parameters converted once.
    #[arg(long, default_value = "full")]
    policy: PolicySpec,
    /// A directory holding the system's state dict for the model (model.safetensors).
    #[arg(long)]
    weights: Option<PathBuf>,
    /// Frame side in pixels (the system's: 64; the U-Net needs a multiple of 4).
    #[arg(long, default_value_t = 64, value_parser = kiln::cli::count_up_to::<4096>, allow_negative_numbers = true)]
    size: usize,
    /// Seeds the random weights and the generated frames.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// The most pixels an `--input` frame may declare (Pillow's limit by default); larger ones
    /// are refused before decoding, as decompression bombs.
    #[arg(long, default_value_t = kiln::cache::DEFAULT_MAX_PIXELS)]
    max_image_pixels: u64,
    /// Each U-Net forward reads the previous forward's output (kiln's chained variant: the
    /// same cost, other frames); by default each reads the incoming frame, as mirage-hello's
    /// benchmark runs `Day2Model`.
    #[arg(long)]
    chain: bool,
}

/// What a run writes in `--out`.
const OUTPUTS: [&str; 4] = ["frames", "preview.gif", "latency.png", "summary.json"];

/// The memory a frame's pixel takes while the models run, an upper estimate: the U-Net's widest
/// full-resolution activations are 64 channels of f32, a few of them alive at once.
const ACTIVATION_BYTES_PER_PIXEL: u64 = 2048;

/// Frames of warm-up excluded from the statistics (the system's benchmark warms up 5), timed
/// and reported apart.
const WARMUP_FRAMES: usize = 5;

/// One of the two models, ready to turn a batch of frames into the next.
enum FrameModel<B: Backend> {
    UNet {
        model: Box<UNet<B>>,
        timesteps: Vec<f32>,
        frame_loop: FrameLoop,
    },
    Lsd {
        model: Box<LiveStreamDiffusion<B>>,
        stream: Stream<B>,
        timesteps: Vec<f32>,
    },
}

impl<B: Backend> FrameModel<B> {
    /// The next output of every stream for `frames` `[streams, 3, H, W]`.
    fn next(&mut self, frames: Tensor<B, 4>) -> Result<Tensor<B, 4>, String> {
        match self {
            FrameModel::UNet {
                model,
                timesteps,
                frame_loop,
            } => (model.frame(frames, timesteps, *frame_loop)).map_err(|e| e.to_string()),
            FrameModel::Lsd {
                model,
                stream,
                timesteps,
            } => model
                .next_frame(stream, frames, timesteps)
                .map_err(|e| e.to_string()),
        }
    }
}

/// `steps` timesteps from `first` down to 0, evenly spaced (`first` alone for one step).
fn timesteps(first: f32, steps: usize) -> Vec<f32> {
    if steps == 1 {
        return vec![first];
    }
    (0..steps)
        .map(|i| first * (steps - 1 - i) as f32 / (steps - 1) as f32)
        .collect()
}

impl Args {
    fn steps(&self) -> usize {
        self.steps
            .unwrap_or(if self.model == "unet" { 6 } else { 1 })
    }

    /// What each of the U-Net's forwards reads (the live-stream model has one loop).
    fn frame_loop(&self) -> FrameLoop {
        if self.chain {
            FrameLoop::Chain
        } else {
            FrameLoop::Mirage
        }
    }

    fn files(&self) -> RunFiles {
        let mut files = RunFiles::new();
        if let Some(input) = &self.input {
            files = files.input("the input frames (--input)", input);
        }
        if let Some(weights) = &self.weights {
            files = files.input_dir("--weights (a directory holding model.safetensors)", weights);
        }
        files.output_dir("--out", &self.out)
    }

    /// What makes the run's outputs what they are: the same settings rerun in the same `--out`
    /// redo the same run; other settings are refused there (`kiln::train::claim`), so a run
    /// never leaves another's frames beside its own.
    fn settings(&self) -> serde_json::Value {
        serde_json::json!({
            "model": self.model,
            "frames": self.frames,
            "input": self.input,
            "steps": self.steps(),
            "budget_ms": self.budget_ms,
            "streams": self.streams,
            "device": self.device.to_string(),
            "policy": self.policy.to_string(),
            "weights": self.weights,
            "size": self.size,
            "seed": self.seed,
            "frame_loop": self.frame_loop().name(),
        })
    }

    /// The model `--model` names, with `--weights` loaded, under `policy`.
    fn model<B: Backend>(
        &self,
        policy: Policy,
        device: &B::Device,
    ) -> Result<FrameModel<B>, String> {
        B::seed(device, self.seed);
        let weights =
            |what: &str, e: kiln::core::CheckpointError| format!("--weights for the {what}: {e}");
        if self.model != "unet" && self.chain {
            return Err(
                "--chain: the live-stream model has one loop (each step reads its previous \
                 output and its memory bank); --chain chooses the U-Net's"
                    .into(),
            );
        }
        if self.model == "unet" {
            if !self.size.is_multiple_of(4) {
                return Err(format!(
                    "--size {}: the U-Net needs a multiple of 4",
                    self.size
                ));
            }
            let mut model = UNetConfig::mirage().init::<B>(device);
            if let Some(dir) = &self.weights {
                model = model.with_weights(dir).map_err(|e| weights("U-Net", e))?;
            }
            return Ok(FrameModel::UNet {
                model: Box::new(model.with_policy(policy)),
                timesteps: timesteps(50.0, self.steps()),
                frame_loop: self.frame_loop(),
            });
        }
        let config = LsdConfig {
            height: self.size,
            width: self.size,
            ..LsdConfig::mirage()
        };
        config
            .validate()
            .map_err(|e| format!("--size {}: {e}", self.size))?;
        let mut model = config.init::<B>(device);
        if let Some(dir) = &self.weights {
            model = model
                .with_weights(dir)
                .map_err(|e| weights("live-stream model", e))?;
        }
        let model = model.with_policy(policy);
        Ok(FrameModel::Lsd {
            stream: model.stream(self.streams),
            model: Box::new(model),
            timesteps: timesteps(19.0, self.steps()),
        })
    }
}

impl DeviceJob for Args {
    type Output = Result<(), String>;

    fn run<B: Backend>(self, device: &B::Device) -> Self::Output {
        self.files().check().map_err(|e| e.to_string())?;
        let policy = self
            .policy
            .resolve::<B>(device)
            .map_err(|e| e.to_string())?;
        let pixels = (self.streams * self.size * self.size) as u64;
        let what = format!(
            "--streams {} of --size {} frames (about {ACTIVATION_BYTES_PER_PIXEL} bytes of \
             activations a pixel)",
            self.streams, self.size
        );
        kiln::core::check_memory::<B>(device, pixels * ACTIVATION_BYTES_PER_PIXEL, &what)
            .map_err(|e| e.to_string())?;
        let source = FrameSource::open(&self)?;
        let mut model = self.model::<B>(policy, device)?;
        kiln::train::claim(&self.out, &self.settings(), &OUTPUTS.map(String::from))
            .map_err(|e| e.to_string())?;
        let mut writer = OutputWriter::new(&self.out, self.streams)?;
        let mut latencies = Latencies::default();
        let progress = report::progress(self.frames as u64);
        kiln::bench::reset_host_peak();
        for index in 0..self.frames {
            let host = source.frames(index);
            let started = Instant::now();
            let frames = Tensor::<B, 4>::from_data(host, device);
            let out = model.next(frames)?.into_data();
            latencies.push(started.elapsed().as_secs_f64() * 1e3);
            writer.push(index, out).map_err(|e| e.to_string())?;
            progress.inc(1);
        }
        progress.finish_and_clear();
        writer.finish().map_err(|e| e.to_string())?;
        let summary = report::Summary {
            model: &self.model,
            streams: self.streams,
            forwards_per_frame: self.steps(),
            frame_loop: (self.model == "unet").then(|| self.frame_loop().name()),
            budget_ms: self.budget_ms,
            policy: policy.to_string(),
            device: format!("{:?}", device),
            size: self.size,
            source: source.describe(),
        };
        summary.write(&self.out, &latencies, WARMUP_FRAMES)
    }
}

fn main() -> ExitCode {
    allocator::keep_freed_memory();
    let args = Args::parse();
    kiln::run_job(args.device, args)
}

/// Frames `[streams, 3, H, W]` of f32 in [-1, 1] as the models read them.
fn frame_data(values: Vec<f32>, streams: usize, size: usize) -> TensorData {
    TensorData::new(values, [streams, 3, size, size])
}
