//! The command line of a benchmark suite: run it on a device, save it as a baseline, compare it
//! with one.
//!
//! ```text
//! kiln-bench [--device cpu] [--policy full] [--filter gemm] --save main
//! kiln-bench --compare main [--threshold 5] [--pairs 20] [--saved-numbers]
//! ```
//!
//! `--save` keeps a copy of the running executable beside the baseline's numbers; `--compare`
//! then runs that saved build and this one side by side, taking their samples in turns, and
//! reads each change from the turns' ratios (see [`Lockstep`]), so the machine's drift cancels.

use std::ffi::OsString;
use std::path::PathBuf;
use std::process::ExitCode;

use burn::tensor::backend::Backend;
use clap::Parser;
use kiln_core::{BackendKind, DeviceJob, DeviceSpec, PolicySpec};

use crate::BenchError;
use crate::baseline::{BaselineStore, Comparison, DEFAULT_THRESHOLD, run_table};
use crate::bench::Config;
use crate::builds::in_turns;
use crate::lockstep::{DEFAULT_PAIRS, Lockstep};
use crate::report::SuiteRun;
use crate::runner::{Runner, Suite};
use crate::stats::MIN_PAIRS;
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
    /// With `--compare`: read the change against the baseline's saved numbers, in one run of
    /// this build, instead of running the baseline's saved build and this one in turns. Faster,
    /// but the machine's drift between runs counts as change.
    #[arg(long)]
    pub saved_numbers: bool,
    /// With `--compare`: turns the two builds take at each benchmark, each a block of samples
    /// of one then of the other (at least 8, for a 99% interval).
    #[arg(long, default_value_t = DEFAULT_PAIRS, value_parser = parse_pairs)]
    pub pairs: usize,
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
    /// Takes each benchmark's samples as told on standard input, answering on standard output
    /// (see [`Lockstep`]): how a build runs in turns with another.
    #[arg(long, hide = true)]
    pub lockstep: bool,
    /// Writes the run's results to FILE as JSON. Builds run in turns are given only `--device
    /// --policy --threshold --filter --quick --no-calibration --lockstep --emit-run`, so every
    /// later build must keep accepting these.
    #[arg(long, hide = true, value_name = "FILE")]
    pub emit_run: Option<PathBuf>,
}

/// Most turns `--pairs` accepts.
const MAX_PAIRS: usize = 1000;

fn parse_pairs(text: &str) -> Result<usize, String> {
    match text.parse::<usize>() {
        Ok(pairs) if (MIN_PAIRS..=MAX_PAIRS).contains(&pairs) => Ok(pairs),
        _ => Err(format!(
            "expected {MIN_PAIRS} to {MAX_PAIRS} turns: fewer cannot give a 99% interval"
        )),
    }
}

impl Args {
    /// How long and how often each benchmark is measured.
    pub fn config(&self) -> Config {
        if self.quick {
            Config::quick()
        } else {
            Config::default()
        }
    }
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
    let saved_build = match &args.compare {
        Some(name) if !args.saved_numbers => {
            let build = store.build(name);
            if build.is_none() {
                eprintln!(
                    "note: baseline `{name}` has no saved build (saved by an older kiln-bench): \
                     reading the change against its saved numbers, where the machine's drift \
                     between runs counts as change; save it again to compare in turns"
                );
            }
            build
        }
        _ => None,
    };
    let threshold = args.threshold / 100.0;
    let (run, failures, comparison) = match (&args.compare, &baseline, saved_build) {
        (Some(name), Some(saved), Some(build)) => {
            let turns = in_turns(
                &build,
                &turn_args(&args, device),
                &args.config(),
                args.pairs,
            )?;
            let comparison =
                Comparison::paired(name, saved, &turns.old, &turns.new, &turns.pairs, threshold);
            let failures = match turns.new_passed {
                Ok(()) => Vec::new(),
                Err(said) => vec![BenchError::ChecksFailed(said)],
            };
            (turns.new, failures, Some(comparison))
        }
        _ => {
            let (run, failures) = device.run(SuiteJob {
                suite,
                args: &args,
                spec: device,
            })??;
            let comparison = args
                .compare
                .as_deref()
                .zip(baseline.as_ref())
                .map(|(name, old)| Comparison::new(name, old, &run, threshold));
            (run, failures, comparison)
        }
    };

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
    if let Some(path) = &args.emit_run {
        let json = serde_json::to_string(&run)
            .map_err(|e| kiln_io::FileError::io(path, std::io::Error::other(e)))?;
        kiln_io::write_atomic(path, json.as_bytes())?;
    }
    if let Some(name) = &args.save {
        let path = store.save(name, &run)?;
        println!("saved baseline `{name}` to {}", path.display());
        match std::env::current_exe() {
            Ok(executable) => {
                store.save_build(name, &executable)?;
            }
            Err(e) => eprintln!(
                "warning: cannot find this executable ({e}): baseline `{name}` is kept without \
                 its build, so comparisons with it read its saved numbers"
            ),
        }
    }
    let mut ok = true;
    if let Some(comparison) = comparison {
        println!("\n{comparison}");
        ok &= !comparison.regressed();
    }
    for failure in &failures {
        eprintln!("error: {failure}");
    }
    Ok(ok && failures.is_empty())
}

/// The flags a build taken in turns is given, besides `--lockstep --emit-run FILE` (see
/// [`Args::emit_run`]).
fn turn_args(args: &Args, device: DeviceSpec) -> Vec<OsString> {
    let mut out: Vec<OsString> = vec![
        "--device".into(),
        device.to_string().into(),
        "--policy".into(),
        args.policy.to_string().into(),
        "--threshold".into(),
        args.threshold.to_string().into(),
    ];
    if let Some(filter) = &args.filter {
        out.extend(["--filter".into(), filter.into()]);
    }
    if args.quick {
        out.push("--quick".into());
    }
    if args.no_calibration {
        out.push("--no-calibration".into());
    }
    out
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
        let config = self.args.config();
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
        let runner = Runner::<B>::new(device, &spec.to_string(), policy, config)
            .with_filter(self.args.filter.clone())
            .with_peaks(peaks)
            .with_threshold(self.args.threshold / 100.0)
            .with_device_memory(move || spec.memory_reserved());
        let mut runner = if self.args.lockstep {
            runner.with_pacer(Lockstep::new(std::io::stdin().lock(), std::io::stdout()))
        } else {
            runner
        };
        self.suite.run(&mut runner)?;
        Ok(runner.finish())
    }
}
