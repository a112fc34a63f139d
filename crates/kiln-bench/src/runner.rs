//! Running a suite of benchmarks on one device and collecting their results.

use burn::tensor::backend::Backend;
use kiln_core::Policy;

use crate::BenchError;
use crate::baseline::{DEFAULT_THRESHOLD, format_seconds};
use crate::bench::{Alone, Benchmark, Config, Pacer, measure_paced};
use crate::report::{BenchResult, Environment, Peaks, Setting, SuiteRun};
use crate::scaling::BatchScaling;

/// A set of benchmarks, generic over the backend it runs on.
pub trait Suite {
    /// Runs each benchmark through `runner` (which skips those the filter excludes).
    fn run<B: Backend>(&self, runner: &mut Runner<'_, B>) -> Result<(), BenchError>;
}

/// Runs benchmarks on one device with one policy and keeps their results.
pub struct Runner<'d, B: Backend> {
    device: &'d B::Device,
    policy: Policy,
    setting: Setting,
    config: Config,
    peaks: Option<Peaks>,
    filter: Option<String>,
    threshold: f64,
    device_memory: Box<dyn Fn() -> Option<u64> + 'd>,
    pacer: Box<dyn Pacer + 'd>,
    results: Vec<BenchResult>,
    scalings: Vec<BatchScaling>,
}

/// A short dtype label: `f32` when params, compute and output agree, else `f32/bf16/f32`.
pub fn policy_label(policy: &Policy) -> String {
    if policy.param == policy.compute && policy.compute == policy.output {
        policy.compute.to_string()
    } else {
        format!("{}/{}/{}", policy.param, policy.compute, policy.output)
    }
}

impl<'d, B: Backend> Runner<'d, B> {
    /// A runner for `device` (named `device_name` in results) computing under `policy`.
    pub fn new(device: &'d B::Device, device_name: &str, policy: Policy, config: Config) -> Self {
        Runner {
            device,
            policy,
            setting: Setting {
                backend: B::name(device),
                device: device_name.to_string(),
                dtype: policy_label(&policy),
            },
            config,
            peaks: None,
            filter: None,
            threshold: DEFAULT_THRESHOLD,
            device_memory: Box::new(|| None),
            pacer: Box::new(Alone),
            results: Vec::new(),
            scalings: Vec::new(),
        }
    }

    /// Only benchmarks whose name contains `filter` run.
    pub fn with_filter(mut self, filter: Option<String>) -> Self {
        self.filter = filter;
        self
    }

    /// Relative per-item slow-down at the largest batch that fails a batch-scaling check (when it
    /// also exceeds the noise); default [`DEFAULT_THRESHOLD`].
    pub fn with_threshold(mut self, threshold: f64) -> Self {
        self.threshold = threshold;
        self
    }

    /// Peaks to express results as roofline fractions of.
    pub fn with_peaks(mut self, peaks: Option<Peaks>) -> Self {
        self.peaks = peaks;
        self
    }

    /// How to read the device's reserved memory, where the backend can tell.
    pub fn with_device_memory(mut self, read: impl Fn() -> Option<u64> + 'd) -> Self {
        self.device_memory = Box::new(read);
        self
    }

    /// `pacer` decides when each benchmark's samples are taken (default [`Alone`]; a
    /// [`Lockstep`](crate::Lockstep) takes them in turns with another build's run).
    pub fn with_pacer(mut self, pacer: impl Pacer + 'd) -> Self {
        self.pacer = Box::new(pacer);
        self
    }

    /// The device benchmarks run on.
    pub fn device(&self) -> &'d B::Device {
        self.device
    }

    /// The resolved precision policy benchmarks should compute under.
    pub fn policy(&self) -> Policy {
        self.policy
    }

    /// Whether the filter lets the benchmark called `name` run (for work a suite would only do
    /// for it, such as computing its labels).
    pub fn selects(&self, name: &str) -> bool {
        self.filter
            .as_ref()
            .is_none_or(|f| name.contains(f.as_str()))
    }

    fn measure<X: Benchmark<B>>(&mut self, bench: &X) -> Result<BenchResult, BenchError> {
        let name = bench.name();
        eprint!("  {name} ... ");
        let timings = measure_paced(
            bench,
            self.device,
            &self.config,
            &*self.device_memory,
            &mut *self.pacer,
        )?;
        let result = BenchResult::new(
            name.clone(),
            &self.setting,
            bench.work(),
            timings,
            self.peaks.as_ref(),
        )
        .ok_or(BenchError::NoSamples(name))?;
        eprintln!(
            "median {} over {} runs (cold {})",
            format_seconds(result.summary.median),
            result.summary.count,
            format_seconds(result.cold_s)
        );
        Ok(result)
    }

    /// Measures `bench` unless the filter excludes it.
    pub fn bench<X: Benchmark<B>>(&mut self, bench: &X) -> Result<(), BenchError> {
        if self.selects(&bench.name()) {
            let result = self.measure(bench)?;
            self.results.push(result);
        }
        Ok(())
    }

    /// Measures the benchmark `make(batch)` at each of `batches` (see
    /// [`batch_sizes`](crate::scaling::batch_sizes)) when the filter selects `name`, prints the
    /// per-item costs and fails when batching makes items more expensive (see
    /// [`BatchScaling::check`]). A filter that selects only some sizes' benchmarks (say
    /// `painn/seed/b=64`) measures those as plain benchmarks, with no scaling check.
    pub fn batch_scaling<X: Benchmark<B>>(
        &mut self,
        name: &str,
        batches: &[usize],
        make: impl Fn(usize) -> X,
    ) -> Result<(), BenchError> {
        if !self.selects(name) {
            for &batch in batches {
                self.bench(&make(batch))?;
            }
            return Ok(());
        }
        let points = batches
            .iter()
            .map(|&batch| Ok((batch, self.measure(&make(batch))?)))
            .collect::<Result<Vec<_>, BenchError>>()?;
        let scaling = BatchScaling {
            name: name.to_string(),
            points,
        };
        eprint!("{scaling}");
        self.scalings.push(scaling);
        Ok(())
    }

    /// The suite run, and the batch-scaling checks that failed.
    pub fn finish(self) -> (SuiteRun, Vec<BenchError>) {
        let failures = self
            .scalings
            .iter()
            .filter_map(|s| s.check(self.threshold).err())
            .collect();
        let run = SuiteRun {
            environment: Environment::current(),
            peaks: self.peaks,
            results: self.results,
        };
        (run, failures)
    }
}
