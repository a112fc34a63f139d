//! What a run writes: every output frame as PNG, the first 64 as a GIF, the latency histogram
//! and the summary; with `--save-raw`, every frame in and out as f32.

use std::path::{Path, PathBuf};

use image::codecs::gif::{GifEncoder, Repeat};
use image::{Delay, Frame, RgbImage, RgbaImage};
use indicatif::{ProgressBar, ProgressStyle};
use kiln::burn::tensor::TensorData;
use kiln::core::DeviceSpec;
use kiln::train::plot::{Drawn, Figure, draw_png};
use plotters::prelude::*;
use serde_json::json;

/// Frames of stream 1 in `preview.gif`.
const PREVIEW_FRAMES: usize = 64;

/// A progress bar over `frames` frames.
pub fn progress(frames: u64) -> ProgressBar {
    let bar = ProgressBar::new(frames);
    bar.set_style(
        ProgressStyle::with_template("{bar:40} {pos}/{len} frames, {per_sec}, eta {eta}")
            .expect("a valid template"),
    );
    bar
}

/// Writes each output frame as it comes and keeps stream 1's first frames for the preview.
pub struct OutputWriter {
    dirs: Vec<PathBuf>,
    out: PathBuf,
    preview: Vec<RgbImage>,
}

impl OutputWriter {
    /// Writes into `out/frames/stream-S/` for each of `streams` streams.
    pub fn new(out: &Path, streams: usize) -> Result<Self, String> {
        let dirs: Vec<PathBuf> = (1..=streams)
            .map(|s| out.join("frames").join(format!("stream-{s}")))
            .collect();
        for dir in &dirs {
            std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        }
        Ok(OutputWriter {
            dirs,
            out: out.to_path_buf(),
            preview: Vec::new(),
        })
    }

    /// Writes frame `index` of every stream, `out` `[streams, 3, H, W]` in [-1, 1].
    pub fn push(&mut self, index: usize, out: TensorData) -> Result<(), String> {
        let [streams, _, height, width] = out.shape[..] else {
            return Err("the model returned no frames".into());
        };
        let values = out.convert::<f32>().to_vec::<f32>().map_err(|e| {
            format!(
                "frame {}: the model's output cannot be read: {e}",
                index + 1
            )
        })?;
        let plane = height * width;
        for (stream, dir) in self.dirs.iter().enumerate().take(streams) {
            let frame = &values[stream * 3 * plane..(stream + 1) * 3 * plane];
            let image = RgbImage::from_fn(width as u32, height as u32, |x, y| {
                let at = y as usize * width + x as usize;
                image::Rgb([0, 1, 2].map(|c| to_u8(frame[c * plane + at])))
            });
            let path = dir.join(format!("{:05}.png", index + 1));
            let mut png = Vec::new();
            image
                .write_to(&mut std::io::Cursor::new(&mut png), image::ImageFormat::Png)
                .map_err(|e| format!("{}: {e}", path.display()))?;
            kiln::io::write_atomic(&path, &png).map_err(|e| e.to_string())?;
            if stream == 0 && self.preview.len() < PREVIEW_FRAMES {
                self.preview.push(image);
            }
        }
        Ok(())
    }

    /// Writes `preview.gif` (25 frames a second).
    pub fn finish(self) -> Result<(), String> {
        let path = self.out.join("preview.gif");
        let mut gif = Vec::new();
        {
            let mut encoder = GifEncoder::new_with_speed(&mut gif, 10);
            encoder
                .set_repeat(Repeat::Infinite)
                .map_err(|e| e.to_string())?;
            let frames = self.preview.into_iter().map(|rgb| {
                let rgba: RgbaImage = image::DynamicImage::ImageRgb8(rgb).into_rgba8();
                Frame::from_parts(rgba, 0, 0, Delay::from_numer_denom_ms(40, 1))
            });
            encoder
                .encode_frames(frames)
                .map_err(|e| format!("{}: {e}", path.display()))?;
        }
        kiln::io::write_atomic(&path, &gif).map_err(|e| e.to_string())
    }
}

/// A value in [-1, 1] as an 8-bit channel.
fn to_u8(value: f32) -> u8 {
    ((value.clamp(-1.0, 1.0) + 1.0) * 127.5).round() as u8
}

/// Every frame in and out as f32 and each frame's timesteps, kept until the run ends
/// (`raw.safetensors`).
#[derive(Default)]
pub struct RawFrames {
    input: Vec<f32>,
    out: Vec<f32>,
    timesteps: Vec<f32>,
    /// `[streams, channels, height, width]` of a frame.
    frame: Vec<usize>,
    frames: usize,
}

impl RawFrames {
    /// The bytes `frames` frames of `pixels` pixels (all streams) take, in and out.
    pub fn bytes(frames: usize, pixels: u64) -> u64 {
        2 * frames as u64 * pixels * 3 * 4
    }

    /// The frame read next, and the timesteps of its forwards.
    pub fn push_input(&mut self, input: &TensorData, timesteps: &[f32]) -> Result<(), String> {
        self.frame = input.shape.to_vec();
        self.input.extend(f32s(input)?);
        self.timesteps.extend_from_slice(timesteps);
        self.frames += 1;
        Ok(())
    }

    /// The frame the model wrote for the last input.
    pub fn push_output(&mut self, out: &TensorData) -> Result<(), String> {
        self.out.extend(f32s(out)?);
        Ok(())
    }

    /// Writes `input` and `out` `[frames, streams, channels, height, width]` and `timesteps`
    /// `[frames, steps]` into the safetensors file `path`.
    pub fn write(self, path: &Path) -> Result<(), String> {
        let frames = [&[self.frames][..], &self.frame].concat();
        let steps = self.timesteps.len() / self.frames.max(1);
        let bytes =
            |values: &[f32]| -> Vec<u8> { values.iter().flat_map(|v| v.to_le_bytes()).collect() };
        let tensors = [
            ("input", bytes(&self.input), frames.clone()),
            ("out", bytes(&self.out), frames),
            (
                "timesteps",
                bytes(&self.timesteps),
                vec![self.frames, steps],
            ),
        ];
        let views = tensors.iter().map(|(name, data, shape)| {
            let view =
                safetensors::tensor::TensorView::new(safetensors::Dtype::F32, shape.clone(), data);
            view.map(|view| (*name, view))
        });
        let views = views
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| format!("{}: {e}", path.display()))?;
        let file =
            safetensors::serialize(views, None).map_err(|e| format!("{}: {e}", path.display()))?;
        kiln::io::write_atomic(path, &file).map_err(|e| e.to_string())
    }
}

/// `data`'s values as f32, whatever its dtype.
fn f32s(data: &TensorData) -> Result<Vec<f32>, String> {
    (data.clone().convert::<f32>().to_vec::<f32>())
        .map_err(|e| format!("a frame cannot be read as f32: {e}"))
}

/// The most device memory the backend's pools held after any frame, where the device tells
/// (cubecl's CUDA and wgpu pools: reserved bytes, an upper bound on what was allocated).
pub struct DeviceMemory {
    device: DeviceSpec,
    peak: Option<u64>,
}

impl DeviceMemory {
    /// Samples `device`'s pools from now on, if it has any.
    pub fn new(device: DeviceSpec) -> Self {
        DeviceMemory {
            peak: device.memory_reserved(),
            device,
        }
    }

    /// Reads the pools again (after a frame, outside its timing).
    pub fn sample(&mut self) {
        if let Some(peak) = &mut self.peak {
            *peak = (*peak).max(self.device.memory_reserved().unwrap_or(0));
        }
    }

    /// The peak, where the device has pools.
    pub fn peak(&self) -> Option<u64> {
        self.peak
    }
}

/// Every frame's latency in milliseconds, in order.
#[derive(Default)]
pub struct Latencies(Vec<f64>);

impl Latencies {
    pub fn push(&mut self, ms: f64) {
        self.0.push(ms);
    }
}

/// The `q` quantile of sorted `values` (nearest rank).
fn quantile(sorted: &[f64], q: f64) -> f64 {
    let rank = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1]
}

/// What the summary says about the run besides its latencies.
pub struct Summary<'a> {
    pub model: &'a str,
    pub streams: usize,
    pub forwards_per_frame: usize,
    /// What the U-Net's forwards read (`mirage`, `chain`); none for the live-stream model.
    pub frame_loop: Option<&'static str>,
    /// The live-stream model's timestep each frame (`random` or a number); none for the U-Net.
    pub timestep: Option<String>,
    pub budget_ms: f64,
    pub policy: String,
    pub device: String,
    pub size: usize,
    pub source: String,
    /// The device's peak memory ([`DeviceMemory`]); none on the CPU backends.
    pub memory: Option<u64>,
}

impl Summary<'_> {
    /// Writes `summary.json` and `latency.png` for `latencies`, the first `warmup` frames
    /// reported apart (all of them when the run is that short), and prints the figures.
    pub fn write(&self, out: &Path, latencies: &Latencies, warmup: usize) -> Result<(), String> {
        let all = &latencies.0;
        let warmup = if all.len() > warmup { warmup } else { 0 };
        let timed = &all[warmup..];
        let mut sorted = timed.to_vec();
        sorted.sort_by(f64::total_cmp);
        let mean = timed.iter().sum::<f64>() / timed.len() as f64;
        let over = timed.iter().filter(|&&ms| ms > self.budget_ms).count();
        let fps = 1e3 / mean;
        let summary = json!({
            "model": self.model,
            "fps": fps,
            "fps_all_streams": fps * self.streams as f64,
            "frame_ms": {
                "p50": quantile(&sorted, 0.5),
                "p90": quantile(&sorted, 0.9),
                "p99": quantile(&sorted, 0.99),
                "max": sorted[sorted.len() - 1],
                "mean": mean,
            },
            "forward_ms_mean": mean / self.forwards_per_frame as f64,
            "budget_ms": self.budget_ms,
            "frames_over_budget": over,
            "frames_timed": timed.len(),
            "warmup_frames": warmup,
            "warmup_ms": &all[..warmup],
            "peak_memory_bytes": self.memory.or(kiln::bench::host_peak()),
            "memory_kind": if self.memory.is_some() { "device" } else { "host" },
            "peak_host_memory_bytes": kiln::bench::host_peak(),
            "forwards_per_frame": self.forwards_per_frame,
            "frame_loop": self.frame_loop,
            "timestep": self.timestep,
            "streams": self.streams,
            "frame_size": self.size,
            "policy": self.policy,
            "device": self.device,
            "frames_from": self.source,
            "timing": "per frame: upload, every forward, the output read back (synchronised)",
        });
        kiln::io::write_json(&out.join("summary.json"), &summary).map_err(|e| e.to_string())?;
        histogram(&out.join("latency.png"), timed, self.budget_ms)?;
        println!(
            "{}: {:.1} frames/s per stream ({} streams, {:.1} in all); frame p50 {:.2} ms, p99 \
             {:.2} ms, max {:.2} ms; {over} of {} frames over the {} ms budget",
            self.model,
            fps,
            self.streams,
            fps * self.streams as f64,
            quantile(&sorted, 0.5),
            quantile(&sorted, 0.99),
            sorted[sorted.len() - 1],
            timed.len(),
            self.budget_ms
        );
        println!(
            "{} (and latency.png, preview.gif, frames/)",
            out.join("summary.json").display()
        );
        Ok(())
    }
}

/// The histogram of per-frame latencies with the budget as a red line.
fn histogram(path: &Path, latencies: &[f64], budget_ms: f64) -> Result<(), String> {
    let top = latencies.iter().copied().fold(budget_ms, f64::max) * 1.1;
    const BINS: usize = 40;
    let width = top / BINS as f64;
    let mut counts = [0u32; BINS];
    for &ms in latencies {
        counts[((ms / width) as usize).min(BINS - 1)] += 1;
    }
    let highest = counts.iter().copied().max().unwrap_or(1).max(1);
    draw_png(path, (800, 480), |figure: &Figure| -> Drawn {
        let mut chart = ChartBuilder::on(figure)
            .caption("latency per frame (synchronised)", ("sans-serif", 22))
            .margin(12)
            .x_label_area_size(40)
            .y_label_area_size(50)
            .build_cartesian_2d(0f64..top, 0u32..highest + highest / 10 + 1)?;
        chart
            .configure_mesh()
            .x_desc("ms per frame")
            .y_desc("frames")
            .draw()?;
        chart.draw_series(counts.iter().enumerate().map(|(i, &count)| {
            let x = i as f64 * width;
            Rectangle::new([(x, 0), (x + width, count)], BLUE.mix(0.6).filled())
        }))?;
        chart
            .draw_series(LineSeries::new(
                [(budget_ms, 0), (budget_ms, highest + highest / 10 + 1)],
                RED.stroke_width(2),
            ))?
            .label(format!("budget {budget_ms} ms"))
            .legend(|(x, y)| PathElement::new([(x, y), (x + 16, y)], RED));
        chart
            .configure_series_labels()
            .background_style(WHITE)
            .border_style(BLACK)
            .draw()?;
        Ok(())
    })
    .map_err(|e| e.to_string())
}
