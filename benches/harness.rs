//! Criterion benchmarks of the harness's own kernels (GEMM, attention) on one device.
//!
//! ```text
//! cargo bench --bench harness -- --save-baseline main
//! cargo bench --bench harness -- --baseline main
//! KILN_DEVICE=vulkan cargo bench --features wgpu --bench harness
//! ```
//!
//! Each measurement syncs the device before reading the clock (`iter_custom`), so GPU timings
//! cover the work and not only its submission.

mod common;

use std::hint::black_box;
use std::time::{Duration, Instant};

use criterion::measurement::WallTime;
use criterion::{BenchmarkGroup, Criterion, Throughput};
use kiln::bench::{Attention, Benchmark, Gemm};
use kiln::burn::tensor::backend::Backend;
use kiln::core::{DeviceJob, DeviceSpec, Policy};

/// Distinct inputs cycled through, as in kiln-bench.
const VARIANTS: usize = 3;

fn bench<B: Backend, X: Benchmark<B>>(
    group: &mut BenchmarkGroup<'_, WallTime>,
    device: &B::Device,
    bench: &X,
) {
    let inputs: Vec<X::Input> = (0..VARIANTS).map(|v| bench.prepare(device, v)).collect();
    let sync = || B::sync(device).expect("the device failed during the benchmark");
    group.throughput(Throughput::Elements(bench.work().items));
    group.bench_function(bench.name(), |b| {
        b.iter_custom(|iters| {
            sync();
            let start = Instant::now();
            for i in 0..iters as usize {
                black_box(bench.run(&inputs[i % VARIANTS]));
            }
            sync();
            start.elapsed()
        })
    });
}

struct Harness<'a> {
    criterion: &'a mut Criterion,
    device: DeviceSpec,
}

impl DeviceJob for Harness<'_> {
    type Output = ();

    fn run<B: Backend>(self, device: &B::Device) {
        let policy = Policy::full();
        let mut group = self
            .criterion
            .benchmark_group(format!("harness/{}", self.device));
        group.measurement_time(Duration::from_secs(3));
        for n in [512, 1024, 2048] {
            bench::<B, _>(&mut group, device, &Gemm::new(n, policy));
        }
        bench::<B, _>(&mut group, device, &Attention::vit_base(8, policy));
        group.finish();
    }
}

fn main() {
    let device = common::device_from_env();
    let mut criterion = Criterion::default().configure_from_args();
    if let Err(e) = device.run(Harness {
        criterion: &mut criterion,
        device,
    }) {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
    criterion.final_summary();
}
