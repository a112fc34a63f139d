//! Results of benchmarks and of whole suite runs, as saved in baseline files.

use serde::{Deserialize, Serialize};

use crate::bench::{Timings, Work};
use crate::stats::Summary;

/// burn version kiln is built against (pinned in the workspace `Cargo.toml`).
pub const BURN_VERSION: &str = "0.21.0";

/// Where and with what a suite ran.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Environment {
    /// `git describe --always --dirty` of the working directory, where git can tell.
    pub git_commit: Option<String>,
    /// kiln's version.
    pub kiln_version: String,
    /// burn's version.
    pub burn_version: String,
    /// Seconds since the Unix epoch when the run started.
    pub started_unix: u64,
}

impl Environment {
    /// The environment of this process.
    pub fn current() -> Self {
        let git_commit = std::process::Command::new("git")
            .args(["describe", "--always", "--dirty"])
            .output()
            .ok()
            .filter(|out| out.status.success())
            .and_then(|out| String::from_utf8(out.stdout).ok())
            .map(|s| s.trim().to_string())
            .filter(|s| !s.is_empty());
        Environment {
            git_commit,
            kiln_version: env!("CARGO_PKG_VERSION").to_string(),
            burn_version: BURN_VERSION.to_string(),
            started_unix: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs()),
        }
    }
}

/// Peak rates measured on the device itself, the roof of the roofline model.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Peaks {
    /// Best floating-point rate of the calibration GEMM, FLOP/s.
    pub flop_per_s: f64,
    /// Best rate of the calibration memory copy, bytes read and written per second.
    pub bytes_per_s: f64,
    /// The host's bf16 product peak (AMX or AVX512-BF16 multiply-adds on operands in
    /// registers), FLOP/s, where the CPU has one: the roof of work declared
    /// [`in_bf16_products`](Work::in_bf16_products).
    #[serde(default)]
    pub bf16_flop_per_s: Option<f64>,
}

impl Peaks {
    /// The best rate the roofline model allows for `work` (FLOP/s when it declares FLOPs, else
    /// bytes/s), and the rate achieved in `seconds` per run, as a fraction of it.
    /// Work in bf16 products has no roof without a calibrated bf16 peak.
    pub fn roofline_fraction(&self, work: &Work, seconds: f64) -> Option<f64> {
        let flop_per_s = if work.bf16_products {
            self.bf16_flop_per_s?
        } else {
            self.flop_per_s
        };
        match (work.flops, work.bytes) {
            (Some(flops), Some(bytes)) if bytes > 0.0 => {
                let attainable = flop_per_s.min(self.bytes_per_s * flops / bytes);
                Some(flops / seconds / attainable)
            }
            (Some(flops), _) => Some(flops / seconds / flop_per_s),
            (None, Some(bytes)) => Some(bytes / seconds / self.bytes_per_s),
            (None, None) => None,
        }
    }
}

/// Rates derived from the median run time.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Throughput {
    /// Items per second.
    pub items_per_s: f64,
    /// FLOP/s, when the benchmark declares its FLOPs.
    pub flop_per_s: Option<f64>,
    /// Bytes/s, when the benchmark declares its bytes.
    pub bytes_per_s: Option<f64>,
}

/// One benchmark's measurement.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BenchResult {
    /// Benchmark name.
    pub name: String,
    /// burn's backend name.
    pub backend: String,
    /// Device string, e.g. `cpu` or `cuda:0`.
    pub device: String,
    /// The resolved precision policy.
    pub dtype: String,
    /// Work of one run.
    pub work: Work,
    /// Seconds of the first (cold) run, not part of `samples`.
    pub cold_s: f64,
    /// Seconds of each warm run.
    pub samples_s: Vec<f64>,
    /// Statistics of `samples_s`.
    pub summary: Summary,
    /// Rates at the median.
    pub throughput: Throughput,
    /// Median rate as a fraction of the roofline of the calibrated peaks.
    pub roofline: Option<f64>,
    /// Peak resident host memory during the benchmark, bytes.
    pub peak_host_bytes: Option<u64>,
    /// Largest device memory reservation seen, bytes.
    pub device_bytes: Option<u64>,
}

/// Where a result was measured: backend, device and dtype policy.
#[derive(Debug, Clone, PartialEq)]
pub struct Setting {
    /// burn's backend name.
    pub backend: String,
    /// Device string.
    pub device: String,
    /// Resolved precision policy.
    pub dtype: String,
}

impl BenchResult {
    /// Builds a result from raw timings; `None` when no valid sample was taken.
    pub fn new(
        name: String,
        setting: &Setting,
        work: Work,
        timings: Timings,
        peaks: Option<&Peaks>,
    ) -> Option<Self> {
        let summary = Summary::of(&timings.samples)?;
        let median = summary.median;
        Some(BenchResult {
            name,
            backend: setting.backend.clone(),
            device: setting.device.clone(),
            dtype: setting.dtype.clone(),
            work,
            cold_s: timings.cold,
            throughput: Throughput {
                items_per_s: work.items as f64 / median,
                flop_per_s: work.flops.map(|f| f / median),
                bytes_per_s: work.bytes.map(|b| b / median),
            },
            roofline: peaks.and_then(|p| p.roofline_fraction(&work, median)),
            samples_s: timings.samples,
            summary,
            peak_host_bytes: timings.peak_host_bytes,
            device_bytes: timings.device_bytes,
        })
    }

    /// Benchmark, backend, device and dtype: what must match for two results to be compared.
    pub fn key(&self) -> (&str, &str, &str, &str) {
        (&self.name, &self.backend, &self.device, &self.dtype)
    }
}

/// A whole suite run; what a baseline file holds.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SuiteRun {
    /// Where and with what it ran.
    pub environment: Environment,
    /// The calibrated peaks of the device, when measured.
    pub peaks: Option<Peaks>,
    /// Every benchmark's result.
    pub results: Vec<BenchResult>,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every baseline records [`BURN_VERSION`]; it must be the version the workspace pins.
    #[test]
    fn burn_version_is_the_pinned_one() {
        let manifest = include_str!("../../../Cargo.toml");
        let pin = format!("burn = {{ version = \"={BURN_VERSION}\" }}");
        assert!(
            manifest.contains(&pin),
            "the workspace no longer pins `{pin}`"
        );
    }

    #[test]
    fn roofline_takes_the_lower_roof() {
        let peaks = Peaks {
            flop_per_s: 100e9,
            bytes_per_s: 10e9,
            bf16_flop_per_s: None,
        };
        // Intensity 1 FLOP/byte: memory bound at 10 GFLOP/s; 5 GFLOP/s achieved is half of it.
        let memory_bound = Work::items(1).with_flops(5e9).with_bytes(5e9);
        assert!((peaks.roofline_fraction(&memory_bound, 1.0).unwrap() - 0.5).abs() < 1e-12);
        // Intensity 100 FLOP/byte: compute bound at 100 GFLOP/s.
        let compute_bound = Work::items(1).with_flops(50e9).with_bytes(0.5e9);
        assert!((peaks.roofline_fraction(&compute_bound, 1.0).unwrap() - 0.5).abs() < 1e-12);
        let copy = Work::items(1).with_bytes(2e9);
        assert!((peaks.roofline_fraction(&copy, 1.0).unwrap() - 0.2).abs() < 1e-12);
        assert_eq!(peaks.roofline_fraction(&Work::items(3), 1.0), None);
    }

    #[test]
    fn bf16_products_are_read_against_the_bf16_peak() {
        let f32_only = Peaks {
            flop_per_s: 100e9,
            bytes_per_s: 1e12,
            bf16_flop_per_s: None,
        };
        let work = Work::items(1).with_flops(100e9).with_bytes(1e6);
        assert!((f32_only.roofline_fraction(&work, 2.0).unwrap() - 0.5).abs() < 1e-12);
        let bf16 = work.in_bf16_products();
        assert_eq!(f32_only.roofline_fraction(&bf16, 2.0), None);
        let with_bf16 = Peaks {
            bf16_flop_per_s: Some(400e9),
            ..f32_only
        };
        assert!((with_bf16.roofline_fraction(&bf16, 2.0).unwrap() - 0.125).abs() < 1e-12);
        // f32 work keeps the f32 roof.
        assert!((with_bf16.roofline_fraction(&work, 2.0).unwrap() - 0.5).abs() < 1e-12);
    }
}
