//! The command line of a benchmark suite: run it on a device, save it as a baseline, compare it
//! with one.
//!
//! ```text
//! kiln-bench [--device cpu] [--policy full] [--filter gemm] --save main
//! kiln-bench --compare main [--threshold 5]
//! ```

use std::path::PathBuf;
use std::process::ExitCode;

use burn::tensor::backend::Backend;
use clap::Parser;
use kiln_core::{BackendKind, DeviceJob, DeviceSpec, PolicySpec};

use crate::BenchError;
use crate::baseline::{BaselineStore, Comparison, DEFAULT_THRESHOLD, run_table};
use crate::bench::Config;
use crate::report::SuiteRun;
use crate::runner::{Runner, Suite};
use crate::suite::{CalibrationSize, calibrate};

/// Options of a suite run.
#[derive(Debug, Clone, Parser)]
#[command(about = "Runs kiln's benchmark suite; saves it as a baseline or compares it with one")]
pub struct Args {
    /// Device to run on: cpu, ndarray, wgpu, vulkan, metal, cuda, cuda:N (default: the first
    /// compiled backend).
    #[arg(long)]
    pub device: Option<DeviceSpec>,
    /// Precision policy: full, mixed-f16, mixed-bf16, pure-f16, a dtype, or
    /// `params=..,compute=..,output=..`.
    #[arg(long, default_value = "full")]
    pub policy: PolicySpec,
    /// Run only the benchmarks whose name contains this.
    #[arg(long)]
    pub filter: Option<String>,
    /// Save the run as baseline NAME.
    #[arg(long, value_name = "NAME")]
    pub save: Option<String>,
    /// Compare the run with baseline NAME; exits with status 1 on a regression.
    #[arg(long, value_name = "NAME")]
    pub compare: Option<String>,
    /// Relative slow-down of a median, in percent, that counts as a regression (when it also
    /// exceeds the noise); the batch-scaling check uses it too.
    #[arg(long, default_value_t = DEFAULT_THRESHOLD * 100.0)]
    pub threshold: f64,
    /// Directory of baselines.
    #[arg(long, default_value = "target/kiln-bench")]
    pub dir: PathBuf,
    /// Shorter measurements (50 ms warm-up, 300 ms per benchmark): for smoke tests.
    #[arg(long)]
    pub quick: bool,
    /// Skip measuring the device's peak FLOP/s and bandwidth (no roofline fractions).
    #[arg(long)]
    pub no_calibration: bool,
    /// Passed by `cargo bench` to every bench target; suites run as bench targets accept it.
    #[arg(long, hide = true)]
    pub bench: bool,
}

/// Runs `suite` as the command line asks, prints the results, and returns the exit status: 1 on
/// a regression, a failed batch-scaling check or any error.
pub fn main<S: Suite>(suite: S) -> ExitCode {
    match run(suite, Args::parse()) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Runs `suite` with `args`; `Ok(false)` when a check failed.
pub fn run<S: Suite>(suite: S, args: Args) -> Result<bool, BenchError> {
    let store = BaselineStore::new(&args.dir);
    // Read the baseline before spending minutes on the suite.
    let baseline = args
        .compare
        .as_deref()
        .map(|name| store.load(name))
        .transpose()?;
    let device = args.device.unwrap_or_default();
    let (run, failures) = device.run(SuiteJob {
        suite,
        args: &args,
        spec: device,
    })??;

    println!("{}", run_table(&run));
    if let Some(peaks) = &run.peaks {
        print!(
            "calibrated peaks: {:.1} GFLOP/s (GEMM), {:.1} GB/s (copy)",
            peaks.flop_per_s / 1e9,
            peaks.bytes_per_s / 1e9
        );
        match peaks.bf16_flop_per_s {
            Some(bf16) => println!(", {:.1} GFLOP/s (host bf16 products)", bf16 / 1e9),
            None => println!(),
        }
    }
    if let Some(name) = &args.save {
        let path = store.save(name, &run)?;
        println!("saved baseline `{name}` to {}", path.display());
    }
    let mut ok = true;
    if let (Some(name), Some(old)) = (&args.compare, &baseline) {
        let comparison = Comparison::new(name, old, &run, args.threshold / 100.0);
        println!("\n{comparison}");
        ok &= !comparison.regressed();
    }
    for failure in &failures {
        eprintln!("error: {failure}");
    }
    Ok(ok && failures.is_empty())
}

struct SuiteJob<'a, S> {
    suite: S,
    args: &'a Args,
    spec: DeviceSpec,
}

impl<S: Suite> DeviceJob for SuiteJob<'_, S> {
    type Output = Result<(SuiteRun, Vec<BenchError>), BenchError>;

    fn run<B: Backend>(self, device: &B::Device) -> Self::Output {
        let policy = self.args.policy.resolve::<B>(device)?;
        let config = if self.args.quick {
            Config::quick()
        } else {
            Config::default()
        };
        let peaks = if self.args.no_calibration {
            None
        } else {
            let size = match self.spec.backend() {
                BackendKind::Flex | BackendKind::NdArray => CalibrationSize::CPU,
                BackendKind::Wgpu | BackendKind::Cuda => CalibrationSize::GPU,
            };
            eprintln!("calibrating {} ...", self.spec);
            Some(calibrate::<B>(device, policy, size, &config)?)
        };
        eprintln!(
            "running on {} ({}) with policy {policy}",
            self.spec,
            B::name(device)
        );
        let spec = self.spec;
        let mut runner = Runner::<B>::new(device, &spec.to_string(), policy, config)
            .with_filter(self.args.filter.clone())
            .with_peaks(peaks)
            .with_threshold(self.args.threshold / 100.0)
            .with_device_memory(move || spec.memory_reserved());
        self.suite.run(&mut runner)?;
        Ok(runner.finish())
    }
}
