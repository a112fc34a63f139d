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
//!
//! `harness/host-products` times kiln's own CPU products on their own, `n×n` by a weight packed
//! once, one row each for f32 (`sgemm`) and bf16 operands with f32 sums (`gemm::bf16`, on AMX or
//! AVX512-BF16 where the CPU has them); criterion's "elem/s" is FLOP/s (2n³ a product).

mod common;

use std::hint::black_box;
use std::time::{Duration, Instant};

use criterion::measurement::WallTime;
use criterion::{BenchmarkGroup, Criterion, Throughput};
use kiln::bench::{Attention, Benchmark, Gemm, HostGemm};
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

/// kiln's own CPU products at `n×n`, f32 and bf16, each row's throughput in FLOP.
fn host_products(criterion: &mut Criterion) {
    use kiln::burn::backend::Flex;
    use kiln::kernels::gemm::{Bf16Isa, Products, bf16};
    if let Some(peak) = bf16::peak_flop_per_s() {
        eprintln!(
            "bf16 peak, all threads: {:.2} TFLOP/s (operands in registers)",
            peak / 1e12
        );
    }
    let mut group = criterion.benchmark_group("harness/host-products");
    group.measurement_time(Duration::from_secs(3));
    for n in [512, 1024, 2048] {
        for products in [Products::F32, Products::Bf16] {
            let gemm = HostGemm { n, products };
            if !gemm.supported() {
                eprintln!(
                    "SKIPPED {} (not on this CPU)",
                    Benchmark::<Flex>::name(&gemm)
                );
                continue;
            }
            // Criterion's "elem/s" is FLOP/s.
            let flops = Benchmark::<Flex>::work(&gemm).flops.unwrap_or(0.0);
            group.throughput(Throughput::Elements(flops as u64));
            let input = Benchmark::<Flex>::prepare(&gemm, &Default::default(), 0);
            group.bench_function(Benchmark::<Flex>::name(&gemm), |run| {
                run.iter(|| black_box(Benchmark::<Flex>::run(&gemm, &input)))
            });
        }
    }
    if let Some(isa) = Bf16Isa::chosen() {
        eprintln!("bf16 products on {isa}");
    }
    group.finish();
}

fn main() {
    let device = common::device_from_env();
    let mut criterion = Criterion::default().configure_from_args();
    host_products(&mut criterion);
    if let Err(e) = device.run(Harness {
        criterion: &mut criterion,
        device,
    }) {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
    criterion.final_summary();
}
