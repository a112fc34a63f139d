//! The timing loop on Flex: inputs prepared outside the clock, variants cycled, cold run kept
//! apart, warm-up and sample counts respected.

use std::cell::RefCell;
use std::time::Duration;

use burn::backend::Flex;
use burn::tensor::Tensor;
use burn::tensor::backend::Backend;
use kiln_bench::{Benchmark, Config, Gemm, Runner, Work, measure};
use kiln_core::Policy;

/// Sums its input and records which variant each run saw.
#[derive(Default)]
struct Recorder {
    prepared: RefCell<Vec<usize>>,
    seen: RefCell<Vec<usize>>,
}

impl<B: Backend> Benchmark<B> for Recorder {
    type Input = (usize, Tensor<B, 1>);
    type Output = Tensor<B, 1>;

    fn name(&self) -> String {
        "recorder".into()
    }

    fn work(&self) -> Work {
        Work::items(4)
    }

    fn prepare(&self, device: &B::Device, variant: usize) -> Self::Input {
        self.prepared.borrow_mut().push(variant);
        (
            variant,
            Tensor::from_floats([variant as f32; 1000].as_slice(), device),
        )
    }

    fn run(&self, (variant, x): &Self::Input) -> Self::Output {
        self.seen.borrow_mut().push(*variant);
        x.clone().sum()
    }
}

#[test]
fn inputs_are_prepared_once_and_cycled() {
    let config = Config {
        warmup: Duration::from_millis(5),
        min_time: Duration::ZERO,
        min_samples: 7,
        variants: 3,
    };
    let bench = Recorder::default();
    let timings = measure::<Flex, _>(&bench, &Default::default(), &config, &|| None).unwrap();
    assert_eq!(*bench.prepared.borrow(), [0, 1, 2]);
    let seen = bench.seen.borrow();
    // Cold run, at least one warm-up run, then the samples.
    assert!(seen.len() >= 1 + 1 + 7, "{seen:?}");
    assert_eq!(timings.samples.len(), 7);
    assert!(
        seen.iter().enumerate().all(|(i, &v)| v == i % 3),
        "{seen:?}"
    );
    assert!(timings.cold > 0.0 && timings.samples.iter().all(|&s| s > 0.0));
}

#[test]
fn sampling_runs_for_the_minimum_time() {
    let config = Config {
        warmup: Duration::ZERO,
        min_time: Duration::from_millis(150),
        min_samples: 1,
        variants: 2,
    };
    let gemm = Gemm::new(128, Policy::full());
    let timings = measure::<Flex, _>(&gemm, &Default::default(), &config, &|| None).unwrap();
    let total: f64 = timings.samples.iter().sum();
    assert!(total >= 0.150, "{total}");
    assert!(timings.samples.len() > 1);
}

#[test]
fn results_carry_throughput_statistics_and_setting() {
    let device = Default::default();
    let mut runner = Runner::<Flex>::new(&device, "cpu", Policy::full(), Config::quick())
        .with_filter(Some("n=64".into()));
    runner.bench(&Gemm::new(64, Policy::full())).unwrap();
    runner.bench(&Gemm::new(32, Policy::full())).unwrap(); // filtered out
    let (run, failures) = runner.finish();
    assert!(failures.is_empty());
    let [result] = run.results.as_slice() else {
        panic!("{:?}", run.results)
    };
    assert_eq!(
        (
            result.name.as_str(),
            result.device.as_str(),
            result.dtype.as_str()
        ),
        ("gemm/n=64", "cpu", "f32")
    );
    assert_eq!(result.backend, Flex::name(&device));
    let flops = 2.0 * 64f64.powi(3);
    let rate = result.throughput.flop_per_s.unwrap();
    assert!((rate - flops / result.summary.median).abs() <= 1e-9 * rate);
    assert!((result.throughput.items_per_s - 1.0 / result.summary.median).abs() < 1e-6 * rate);
    assert!(result.summary.count >= 10 && result.samples_s.len() == result.summary.count);
    assert_eq!(run.environment.burn_version, "0.21.0");
}

#[test]
fn a_filter_naming_one_batch_size_measures_that_size_alone() {
    let device = Default::default();
    let sizes = [16, 32, 64];
    let scaled = |filter: &str| {
        let mut runner = Runner::<Flex>::new(&device, "cpu", Policy::full(), Config::quick())
            .with_filter(Some(filter.into()));
        runner
            .batch_scaling("gemm", &sizes, |n| Gemm::new(n, Policy::full()))
            .unwrap();
        let (run, failures) = runner.finish();
        assert!(failures.is_empty(), "{failures:?}");
        run.results.into_iter().map(|r| r.name).collect::<Vec<_>>()
    };
    assert_eq!(scaled("gemm/n=32"), ["gemm/n=32"]);
    assert!(scaled("conv").is_empty());
}
