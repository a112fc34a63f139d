//! Real-time frame-to-frame diffusion (`kiln::realtime`): frames stream in, each goes through
//! mirage-hello's U-Net or its live-stream diffusion model within a frame budget, and every
//! frame's latency is measured with the device synchronised (the output read back), per frame,
//! not per forward.
//!
//! ```text
//! cargo run --release --example realtime -- --out DIR [--model unet|lsd] [--frames N]
//!     [--input DIR|FILE] [--steps S] [--budget-ms 40] [--streams B] [--device D] [--policy P]
//!     [--weights DIR] [--size PX] [--seed S] [--max-image-pixels N] [--chain]
//!     [--timestep N|random] [--save-raw]
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
//!   forward's output, kiln's variant); the live-stream model's diffusion block from the
//!   frame's timestep down to 0 (the system runs 1, the default).
//! - `--timestep`: the live-stream model's timestep each frame: `random` (the default, as the
//!   system's demo runs it: each frame draws one of 0 … 19, seeded by `--seed`, one draw for
//!   every stream), or a number.
//! - `--streams B`: B independent streams through one forward (each with its own memory bank).
//! - `--weights`: a directory whose `model.safetensors` holds the system's state dict for the
//!   model, its sizes read from the tensors (the U-Net's width; the live-stream model's width,
//!   bank and frame size, which `--size` then defaults to); without, seeded random weights at
//!   the system's sizes (its own benchmarks time random weights).
//! - `--save-raw`: also writes `raw.safetensors`, the frames as the model read them (`input`)
//!   and as it wrote them (`out`), `[frames, streams, 3, H, W]` f32 before any rounding to
//!   8 bits, and each frame's timesteps (`timesteps` `[frames, steps]`), to compare with
//!   another implementation.
//!
//! Writes into OUT: `frames/stream-S/NNNNN.png` (every output frame), `preview.gif` (the first
//! 64 frames of stream 1), `latency.png` (the per-frame latency histogram with the budget line)
//! and `summary.json` (`fps` per stream, `frame_ms` {p50, p90, p99, max}, `budget_ms`,
//! `frames_over_budget`, `peak_memory_bytes` with its `memory_kind` (the device's pools on
//! CUDA and wgpu, the process on the CPU), `peak_host_memory_bytes`, `forwards_per_frame`,
//! `streams`, and more).

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use burn::tensor::backend::Backend;
use burn::tensor::{Tensor, TensorData};
use clap::Parser;
use kiln::burn;
use kiln::core::{DeviceJob, DeviceSpec, Policy, PolicySpec, SplitMix64};
use kiln::io::RunFiles;
use kiln::realtime::{FrameLoop, LiveStreamDiffusion, LsdConfig, Stream, UNet, UNetConfig};

mod frames;
mod report;

use frames::FrameSource;
use report::{DeviceMemory, Latencies, OutputWriter, RawFrames};

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
    /// Frame side in pixels (the U-Net needs a multiple of 4) [default: 64, the system's; the
    /// live-stream model's --weights: the frame size they hold].
    #[arg(long, value_parser = kiln::cli::count_up_to::<4096>, allow_negative_numbers = true)]
    size: Option<usize>,
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
    /// The live-stream model's timestep each frame: `random` (one of 0 … 19 drawn per frame,
    /// seeded by --seed, as the system's demo draws it) or a number (0 … 19 are the system's).
    #[arg(long, value_parser = parse_timestep, allow_negative_numbers = true)]
    timestep: Option<Timestep>,
    /// Also write raw.safetensors: every input and output frame as f32, before the PNGs'
    /// rounding to 8 bits, and each frame's timesteps (held in memory until the run ends).
    #[arg(long)]
    save_raw: bool,
}

/// The live-stream model's timestep each frame.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Timestep {
    /// Drawn per frame from the system's 0 … 19.
    Random,
    /// This one, every frame.
    Fixed(f32),
}

impl std::fmt::Display for Timestep {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Timestep::Random => f.write_str("random"),
            Timestep::Fixed(t) => write!(f, "{t}"),
        }
    }
}

fn parse_timestep(text: &str) -> Result<Timestep, String> {
    if text == "random" {
        return Ok(Timestep::Random);
    }
    match text.parse::<f32>() {
        Ok(t) if t.is_finite() && t >= 0.0 => Ok(Timestep::Fixed(t)),
        _ => Err("must be `random` or a number from 0 (the system's are 0 … 19)".into()),
    }
}

/// The live-stream block's timesteps (`num_timesteps`): a random draw is one of 0 … 19.
const LSD_TIMESTEPS: u64 = 20;

/// The frame side without `--size` (the system's).
const DEFAULT_SIZE: usize = 64;

/// The U-Net's first timestep (the system's benchmark runs 50, 40, … 0).
const UNET_FIRST_TIMESTEP: f32 = 50.0;

/// What a run writes in `--out`.
const OUTPUTS: [&str; 5] = [
    "frames",
    "preview.gif",
    "latency.png",
    "summary.json",
    "raw.safetensors",
];

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
        timestep: Timestep,
        steps: usize,
        draws: SplitMix64,
    },
}

impl<B: Backend> FrameModel<B> {
    /// The timesteps of the next frame's forwards, in order.
    fn next_timesteps(&mut self) -> Vec<f32> {
        match self {
            FrameModel::UNet { timesteps, .. } => timesteps.clone(),
            FrameModel::Lsd {
                timestep,
                steps,
                draws,
                ..
            } => {
                let first = match timestep {
                    Timestep::Fixed(t) => *t,
                    Timestep::Random => (draws.next_u64() % LSD_TIMESTEPS) as f32,
                };
                timesteps(first, *steps)
            }
        }
    }

    /// The next output of every stream for `frames` `[streams, 3, H, W]`, its forwards at
    /// `timesteps`.
    fn next(&mut self, frames: Tensor<B, 4>, timesteps: &[f32]) -> Result<Tensor<B, 4>, String> {
        match self {
            FrameModel::UNet {
                model, frame_loop, ..
            } => (model.frame(frames, timesteps, *frame_loop)).map_err(|e| e.to_string()),
            FrameModel::Lsd { model, stream, .. } => model
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

    /// The live-stream model's timestep each frame: random unless given.
    fn timestep(&self) -> Timestep {
        self.timestep.unwrap_or(Timestep::Random)
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
    fn settings(&self, size: usize) -> serde_json::Value {
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
            "size": size,
            "seed": self.seed,
            "frame_loop": self.frame_loop().name(),
            "timestep": (self.model != "unet").then(|| self.timestep().to_string()),
            "save_raw": self.save_raw,
        })
    }

    /// The live-stream model's sizes: those `--weights` hold (where `--size`, if given, must
    /// agree), else the system's at `--size`.
    fn lsd_config(&self) -> Result<LsdConfig, String> {
        let Some(dir) = &self.weights else {
            let size = self.size.unwrap_or(DEFAULT_SIZE);
            let config = LsdConfig {
                height: size,
                width: size,
                ..LsdConfig::mirage()
            };
            config
                .validate()
                .map_err(|e| format!("--size {size}: {e}"))?;
            return Ok(config);
        };
        let config = LsdConfig::from_checkpoint(dir).map_err(|e| lsd_weights(&e))?;
        let held = [config.height, config.width];
        if held[0] != held[1] {
            return Err(format!(
                "--weights: the live-stream model reads frames of {} × {}; this example \
                 streams square frames",
                held[0], held[1]
            ));
        }
        if let Some(size) = self.size.filter(|&size| size != held[0]) {
            return Err(format!(
                "--size {size}: the live-stream model of --weights reads frames of {} × {} (its \
                 memory bank's)",
                held[0], held[1]
            ));
        }
        config.validate().map_err(|e| format!("--weights: {e}"))?;
        Ok(config)
    }

    /// The side of the frames the model reads, refused where the model cannot read it.
    fn frame_size(&self) -> Result<usize, String> {
        if self.model != "unet" {
            return Ok(self.lsd_config()?.height);
        }
        let size = self.size.unwrap_or(DEFAULT_SIZE);
        if !size.is_multiple_of(4) {
            return Err(format!("--size {size}: the U-Net needs a multiple of 4"));
        }
        Ok(size)
    }

    /// The model `--model` names, with `--weights` loaded (its sizes theirs), under `policy`.
    fn model<B: Backend>(
        &self,
        policy: Policy,
        device: &B::Device,
    ) -> Result<FrameModel<B>, String> {
        B::seed(device, self.seed);
        if self.model != "unet" {
            let mut model = self.lsd_config()?.init::<B>(device);
            if let Some(dir) = &self.weights {
                model = model.with_weights(dir).map_err(|e| lsd_weights(&e))?;
            }
            let model = model.with_policy(policy);
            return Ok(FrameModel::Lsd {
                stream: model.stream(self.streams),
                model: Box::new(model),
                timestep: self.timestep(),
                steps: self.steps(),
                draws: SplitMix64::new(self.seed),
            });
        }
        let model = match &self.weights {
            Some(dir) => UNetConfig::from_checkpoint(dir)
                .and_then(|config| config.init::<B>(device).with_weights(dir))
                .map_err(|e| format!("--weights for the U-Net: {e}"))?,
            None => UNetConfig::mirage().init::<B>(device),
        };
        Ok(FrameModel::UNet {
            model: Box::new(model.with_policy(policy)),
            timesteps: timesteps(UNET_FIRST_TIMESTEP, self.steps()),
            frame_loop: self.frame_loop(),
        })
    }

    /// Flags that do not apply to `--model`, refused before anything runs.
    fn check_model_flags(&self) -> Result<(), String> {
        if self.model == "unet" && self.timestep.is_some() {
            return Err(format!(
                "--timestep: the U-Net's forwards run at {UNET_FIRST_TIMESTEP} … 0 (the \
                 system's benchmark; --steps sets how many); --timestep sets the live-stream \
                 model's"
            ));
        }
        if self.model != "unet" && self.chain {
            return Err(
                "--chain: the live-stream model has one loop (each step reads its previous \
                 output and its memory bank); --chain chooses the U-Net's"
                    .into(),
            );
        }
        Ok(())
    }
}

/// A `--weights` error of the live-stream model.
fn lsd_weights(error: &kiln::core::CheckpointError) -> String {
    format!("--weights for the live-stream model: {error}")
}

impl DeviceJob for Args {
    type Output = Result<(), String>;

    fn run<B: Backend>(self, device: &B::Device) -> Self::Output {
        self.files().check().map_err(|e| e.to_string())?;
        self.check_model_flags()?;
        let policy = self
            .policy
            .resolve::<B>(device)
            .map_err(|e| e.to_string())?;
        let size = self.frame_size()?;
        let pixels = (self.streams * size * size) as u64;
        let mut what = format!(
            "--streams {} of --size {size} frames (about {ACTIVATION_BYTES_PER_PIXEL} bytes of \
             activations a pixel)",
            self.streams
        );
        let mut needed = pixels * ACTIVATION_BYTES_PER_PIXEL;
        if self.save_raw {
            needed += RawFrames::bytes(self.frames, pixels);
            what += &format!(", and --save-raw's {} frames in and out", self.frames);
        }
        kiln::core::check_memory::<B>(device, needed, &what).map_err(|e| e.to_string())?;
        let source = FrameSource::open(&self, size)?;
        let mut model = self.model::<B>(policy, device)?;
        kiln::train::claim(&self.out, &self.settings(size), &OUTPUTS.map(String::from))
            .map_err(|e| e.to_string())?;
        let mut writer = OutputWriter::new(&self.out, self.streams)?;
        let mut raw = self.save_raw.then(RawFrames::default);
        let mut latencies = Latencies::default();
        let mut memory = DeviceMemory::new(self.device);
        let progress = report::progress(self.frames as u64);
        kiln::bench::reset_host_peak();
        for index in 0..self.frames {
            let host = source.frames(index);
            let timesteps = model.next_timesteps();
            if let Some(raw) = &mut raw {
                raw.push_input(&host, &timesteps)?;
            }
            let started = Instant::now();
            let frames = Tensor::<B, 4>::from_data(host, device);
            let out = model.next(frames, &timesteps)?.into_data();
            latencies.push(started.elapsed().as_secs_f64() * 1e3);
            memory.sample();
            if let Some(raw) = &mut raw {
                raw.push_output(&out)?;
            }
            writer.push(index, out).map_err(|e| e.to_string())?;
            progress.inc(1);
        }
        progress.finish_and_clear();
        writer.finish().map_err(|e| e.to_string())?;
        if let Some(raw) = raw {
            raw.write(&self.out.join("raw.safetensors"))?;
        }
        let summary = report::Summary {
            model: &self.model,
            streams: self.streams,
            forwards_per_frame: self.steps(),
            frame_loop: (self.model == "unet").then(|| self.frame_loop().name()),
            timestep: (self.model != "unet").then(|| self.timestep().to_string()),
            budget_ms: self.budget_ms,
            policy: policy.to_string(),
            device: format!("{:?}", device),
            size,
            source: source.describe(),
            memory: memory.peak(),
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
