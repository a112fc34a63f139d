//! Defining and timing one benchmark: untimed inputs, a device sync around every clock read,
//! time-based warm-up, and the cold first run kept apart from the warm samples.

use std::hint::black_box;
use std::time::{Duration, Instant};

use burn::tensor::backend::Backend;
use serde::{Deserialize, Serialize};

use crate::BenchError;
use crate::memory;

/// What one run of a benchmark does, for throughput and roofline numbers.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Work {
    /// Items one run processes (images, structures, matrices); at least 1.
    pub items: u64,
    /// Floating-point operations of one run, where known.
    pub flops: Option<f64>,
    /// Bytes one run must move to and from memory at the least, where known.
    pub bytes: Option<f64>,
    /// Whether the FLOPs are bf16 products on the CPU's bf16 units (AMX or AVX512-BF16), whose
    /// peak is their roof.
    #[serde(default)]
    pub bf16_products: bool,
}

impl Work {
    /// `items` items and nothing else declared.
    pub fn items(items: u64) -> Self {
        Work {
            items: items.max(1),
            ..Work::default()
        }
    }

    /// Declares the floating-point operations of one run.
    pub fn with_flops(self, flops: f64) -> Self {
        Work {
            flops: Some(flops),
            ..self
        }
    }

    /// Declares the bytes one run moves.
    pub fn with_bytes(self, bytes: f64) -> Self {
        Work {
            bytes: Some(bytes),
            ..self
        }
    }

    /// Declares that the FLOPs run on the CPU's bf16 units: read against their peak.
    pub fn in_bf16_products(self) -> Self {
        Work {
            bf16_products: true,
            ..self
        }
    }
}

/// A benchmark: how to build its inputs (not timed) and the work to time.
///
/// `run` returns its output so the work cannot be optimised away; the harness keeps the output
/// alive until the device has finished and the clock has been read.
pub trait Benchmark<B: Backend> {
    /// Inputs of one run.
    type Input;
    /// What one run produces.
    type Output;

    /// Name, unique within a suite, e.g. `gemm/n=1024`.
    fn name(&self) -> String;

    /// The work of one run.
    fn work(&self) -> Work;

    /// Builds input number `variant`. Different variants must hold different data, so that runs
    /// cycling through them cannot be served by a cache.
    fn prepare(&self, device: &B::Device, variant: usize) -> Self::Input;

    /// The timed work.
    fn run(&self, input: &Self::Input) -> Self::Output;
}

/// How long and how often to measure.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Config {
    /// Warm-up time before samples are taken (at least one warm-up run happens).
    pub warmup: Duration,
    /// Sampling goes on until this much time was spent in timed runs...
    pub min_time: Duration,
    /// ...and at least this many samples were taken.
    pub min_samples: usize,
    /// Number of distinct inputs cycled through.
    pub variants: usize,
}

impl Default for Config {
    /// 200 ms warm-up, then at least 1 s and 10 samples over 3 distinct inputs.
    fn default() -> Self {
        Config {
            warmup: Duration::from_millis(200),
            min_time: Duration::from_secs(1),
            min_samples: 10,
            variants: 3,
        }
    }
}

impl Config {
    /// A short measurement for tests and smoke runs: 50 ms warm-up, 300 ms and 10 samples.
    pub fn quick() -> Self {
        Config {
            warmup: Duration::from_millis(50),
            min_time: Duration::from_millis(300),
            ..Config::default()
        }
    }
}

/// Raw timings of one benchmark.
#[derive(Debug, Clone, PartialEq)]
pub struct Timings {
    /// Seconds of the first run, which pays for allocation, compilation and autotuning.
    pub cold: f64,
    /// Seconds of each warm, timed run.
    pub samples: Vec<f64>,
    /// Peak resident host memory while the benchmark ran, in bytes (Linux only).
    pub peak_host_bytes: Option<u64>,
    /// Largest device memory reservation seen after a run, in bytes, where the backend says.
    pub device_bytes: Option<u64>,
}

/// Decides when a benchmark's warm samples are taken, once its inputs are built and it is warm.
pub trait Pacer {
    /// Takes the samples of benchmark `name` by calling `sample` (one timed run, its seconds).
    fn samples(
        &mut self,
        name: &str,
        config: &Config,
        sample: &mut dyn FnMut() -> Result<f64, BenchError>,
    ) -> Result<Vec<f64>, BenchError>;
}

/// Samples straight on, until [`Config::min_time`] was spent and [`Config::min_samples`]
/// taken: a benchmark measured on its own.
#[derive(Debug, Clone, Copy, Default)]
pub struct Alone;

impl Pacer for Alone {
    fn samples(
        &mut self,
        _name: &str,
        config: &Config,
        sample: &mut dyn FnMut() -> Result<f64, BenchError>,
    ) -> Result<Vec<f64>, BenchError> {
        let mut samples = Vec::new();
        let mut spent = 0.0;
        while samples.len() < config.min_samples.max(1) || spent < config.min_time.as_secs_f64() {
            let seconds = sample()?;
            spent += seconds;
            samples.push(seconds);
        }
        Ok(samples)
    }
}

/// Times `bench` on `device`. `device_memory` reports the device's reserved bytes where the
/// backend can tell (see `kiln_core::DeviceSpec::memory_reserved`).
pub fn measure<B: Backend, X: Benchmark<B>>(
    bench: &X,
    device: &B::Device,
    config: &Config,
    device_memory: &dyn Fn() -> Option<u64>,
) -> Result<Timings, BenchError> {
    measure_paced(bench, device, config, device_memory, &mut Alone)
}

/// [`measure`], with `pacer` deciding when the warm samples are taken.
pub fn measure_paced<B: Backend, X: Benchmark<B>>(
    bench: &X,
    device: &B::Device,
    config: &Config,
    device_memory: &dyn Fn() -> Option<u64>,
    pacer: &mut dyn Pacer,
) -> Result<Timings, BenchError> {
    let variants = config.variants.max(1);
    let inputs: Vec<X::Input> = (0..variants).map(|v| bench.prepare(device, v)).collect();
    let sync = || B::sync(device).map_err(|e| BenchError::Device(format!("{e:?}")));
    sync()?;
    memory::reset_host_peak();

    let mut device_bytes: Option<u64> = None;
    let mut timed = |input: &X::Input| -> Result<f64, BenchError> {
        sync()?;
        let start = Instant::now();
        let output = black_box(bench.run(black_box(input)));
        sync()?;
        let seconds = start.elapsed().as_secs_f64();
        if let Some(bytes) = device_memory() {
            device_bytes = Some(device_bytes.map_or(bytes, |b| b.max(bytes)));
        }
        drop(output);
        Ok(seconds)
    };

    let cold = timed(&inputs[0])?;
    let warmup_start = Instant::now();
    let mut runs = 1;
    loop {
        timed(&inputs[runs % variants])?;
        runs += 1;
        if warmup_start.elapsed() >= config.warmup {
            break;
        }
    }
    let samples = pacer.samples(&bench.name(), config, &mut || {
        let seconds = timed(&inputs[runs % variants])?;
        runs += 1;
        Ok(seconds)
    })?;
    Ok(Timings {
        cold,
        samples,
        peak_host_bytes: memory::host_peak(),
        device_bytes,
    })
}
