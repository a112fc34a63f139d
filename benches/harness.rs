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
//!
//! `harness/quantized-decode` times decoding's matrix-vector products with weights kept as a GGUF
//! file stores them (`gemm::quantized`): one activation row against 32 matrices of 2048 × 1536
//! (100 M weights, more than the caches hold), per type; its "B/s" is the weights' bytes read.
//! `harness/quantized-prompt` times a prompt's products with the same weights (`prompt_product`):
//! 53 rows against the seven matrices of each of SmolLM2-135M's 30 layers (576 wide, 1 536
//! between); its "elem/s" is multiply-adds a second.

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

/// One activation row against 100 M weights of each stored type, as decoding a token reads them.
/// The stored types the quantized benches time.
const BENCHED_TYPES: [kiln::core::gguf::GgmlType; 7] = {
    use kiln::core::gguf::GgmlType;
    [
        GgmlType::Q4_0,
        GgmlType::Q4_1,
        GgmlType::Q5_0,
        GgmlType::Q8_0,
        GgmlType::Q4_K,
        GgmlType::Q6_K,
        GgmlType::BF16,
    ]
};

fn quantized_decode(criterion: &mut Criterion) {
    use kiln::kernels::gemm::quantized::{QuantMatrix, QuantizedRows, product};
    use kiln::kernels::gemm::strided::Write;
    let (rows, columns, count) = (2048, 1536, 32);
    let mut group = criterion.benchmark_group("harness/quantized-decode");
    group.measurement_time(Duration::from_secs(3));
    for kind in BENCHED_TYPES {
        let matrices: Vec<QuantMatrix> = (0..count)
            .map(|seed| random_blocks(kind, rows, columns, seed))
            .collect();
        let bytes: usize = matrices.iter().map(QuantMatrix::stored_bytes).sum();
        let x: Vec<f32> = (0..columns).map(|i| (i as f32 * 0.37).sin()).collect();
        let mut out = vec![0f32; rows];
        group.throughput(Throughput::Bytes(bytes as u64));
        group.bench_function(kind.name(), |run| {
            run.iter(|| {
                // As a decoded token does: the activations quantized for each product.
                for matrix in &matrices {
                    let x = QuantizedRows::new(&x, columns);
                    product(&mut out, rows, &x, &[matrix], Write::Overwrite);
                }
                black_box(out[0])
            })
        });
    }
    group.finish();
}

/// `rows × columns` weights of `kind` from random bytes, each block's f16 fields (scales,
/// minimums) set to small values and, for bf16, every value small.
fn random_blocks(
    kind: kiln::core::gguf::GgmlType,
    rows: usize,
    columns: usize,
    seed: usize,
) -> kiln::kernels::gemm::quantized::QuantMatrix {
    use kiln::core::gguf::GgmlType;
    let (per_block, block_bytes) = kind.block();
    let mut state = (seed as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    let mut bytes: Vec<u8> = (0..rows * columns / per_block * block_bytes)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state as u8
        })
        .collect();
    // f16 0.0078 (0x2000), bf16 0.0078 (0x3C00).
    let fields: &[(usize, [u8; 2])] = match kind {
        GgmlType::BF16 => &[(0, [0x00, 0x3C])],
        GgmlType::Q4_1 | GgmlType::Q4_K => &[(0, [0x00, 0x20]), (2, [0x00, 0x20])],
        GgmlType::Q6_K => &[(208, [0x00, 0x20])],
        _ => &[(0, [0x00, 0x20])],
    };
    for block in bytes.chunks_exact_mut(block_bytes) {
        for &(at, value) in fields {
            block[at..at + 2].copy_from_slice(&value);
        }
    }
    kiln::kernels::gemm::quantized::QuantMatrix::new(kind, rows, columns, bytes)
        .expect("whole blocks")
}

/// A prompt's products with weights as stored: 53 rows through SmolLM2-135M's layers' matrices
/// (q, k, v, o, gate, up, down), per type.
fn quantized_prompt(criterion: &mut Criterion) {
    use kiln::kernels::gemm::quantized::{QuantMatrix, QuantizedRows, prompt_product};
    use kiln::kernels::gemm::strided::Write;
    const LAYERS: usize = 30;
    let rows = 53;
    let shapes = [
        (576, 576),
        (192, 576),
        (192, 576),
        (576, 576),
        (1536, 576),
        (1536, 576),
        (576, 1536),
    ];
    let mut group = criterion.benchmark_group("harness/quantized-prompt");
    group
        .measurement_time(Duration::from_secs(3))
        .sample_size(20);
    for kind in BENCHED_TYPES {
        // The k-quants' 256-value blocks fit the rows 1 536 wide only (as in the GGUF files).
        let shapes: Vec<(usize, usize)> = (shapes.iter().copied())
            .filter(|(_, columns)| columns % kind.block().0 == 0)
            .collect();
        // Thirty layers, as the model has: more than the caches hold.
        let shapes = shapes.repeat(LAYERS);
        let matrices: Vec<QuantMatrix> = (shapes.iter().enumerate())
            .map(|(seed, &(outputs, columns))| random_blocks(kind, outputs, columns, seed))
            .collect();
        let products: usize = shapes.iter().map(|(o, c)| rows * o * c).sum();
        let inputs: Vec<Vec<f32>> = (shapes.iter())
            .map(|&(_, columns)| {
                (0..rows * columns)
                    .map(|i| (i as f32 * 0.37).sin())
                    .collect()
            })
            .collect();
        let mut out = vec![0f32; rows * 1536];
        group.throughput(Throughput::Elements(products as u64));
        group.bench_function(kind.name(), |run| {
            run.iter(|| {
                for ((matrix, x), &(outputs, columns)) in matrices.iter().zip(&inputs).zip(&shapes)
                {
                    let x = QuantizedRows::new(x, columns);
                    prompt_product(&mut out, outputs, &x, &[matrix], Write::Overwrite);
                }
                black_box(out[0])
            })
        });
    }
    group.finish();
}

fn main() {
    let device = common::device_from_env();
    let mut criterion = Criterion::default().configure_from_args();
    host_products(&mut criterion);
    quantized_decode(&mut criterion);
    quantized_prompt(&mut criterion);
    if let Err(e) = device.run(Harness {
        criterion: &mut criterion,
        device,
    }) {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
    criterion.final_summary();
}
