//! The harness's own benchmarks — GEMM, kiln's host products, attention and a memory copy — and
//! the calibration of a device's peak FLOP/s and bandwidth from the first and the last (and, on a
//! CPU with bf16 units, of their peak).

use std::cell::RefCell;

use burn::tensor::backend::Backend;
use burn::tensor::module::attention;
use burn::tensor::{Distribution, Tensor};
use kiln_core::Policy;
use kiln_kernels::gemm::sgemm;
use kiln_kernels::gemm::{Products, bf16};

use crate::BenchError;
use crate::bench::{Benchmark, Config, Work, measure};
use crate::report::Peaks;

/// `n×n` times `n×n` in the policy's compute dtype: 2n³ FLOPs, 3n² elements moved.
#[derive(Debug, Clone, Copy)]
pub struct Gemm {
    /// Matrix size.
    pub n: usize,
    /// Dtypes to compute in.
    pub policy: Policy,
    /// Multiplications per run, declared as one. Only for tests of regression detection: more
    /// than 1 makes the benchmark slower than the work it reports.
    pub repeat: usize,
}

impl Gemm {
    /// One `n×n` GEMM per run.
    pub fn new(n: usize, policy: Policy) -> Self {
        Gemm {
            n,
            policy,
            repeat: 1,
        }
    }
}

impl<B: Backend> Benchmark<B> for Gemm {
    type Input = (Tensor<B, 2>, Tensor<B, 2>);
    type Output = Tensor<B, 2>;

    fn name(&self) -> String {
        format!("gemm/n={}", self.n)
    }

    fn work(&self) -> Work {
        let n = self.n as f64;
        Work::items(1)
            .with_flops(2.0 * n * n * n)
            .with_bytes(3.0 * n * n * self.policy.compute.size_of() as f64)
    }

    fn prepare(&self, device: &B::Device, _variant: usize) -> Self::Input {
        let random = || {
            let x =
                Tensor::<B, 2>::random([self.n, self.n], Distribution::Normal(0.0, 1.0), device);
            self.policy.cast_input(x)
        };
        (random(), random())
    }

    fn run(&self, (a, b): &Self::Input) -> Self::Output {
        let product = || a.clone().matmul(b.clone());
        (1..self.repeat).fold(product(), |sum, _| sum + product())
    }
}

/// kiln's own CPU product, `n×n` times an `n×n` weight packed once (as a model's weights are),
/// with the operands `products` asks for: f32 (`sgemm`) or bf16 with f32 sums (`gemm::bf16`, on
/// AMX or AVX512-BF16; read against the bf16 peak). 2n³ FLOPs; the operands and the f32 output
/// are the bytes moved. It runs on the host whatever the device.
#[derive(Debug, Clone, Copy)]
pub struct HostGemm {
    /// Matrix size.
    pub n: usize,
    /// The operands multiplied.
    pub products: Products,
}

impl HostGemm {
    /// Whether this CPU runs the product: f32 products need AVX2 and FMA, bf16 ones AMX or
    /// AVX512-BF16.
    pub fn supported(&self) -> bool {
        match self.products {
            Products::F32 => sgemm::supported(),
            Products::Bf16 => bf16::supported(),
        }
    }
}

/// A [`HostGemm`]'s weight, packed for its kernel.
#[derive(Debug)]
pub enum PackedWeight {
    /// For `sgemm`.
    F32(sgemm::Packed),
    /// For `gemm::bf16`.
    Bf16(bf16::Packed),
}

/// A [`HostGemm`]'s operands, and the output it overwrites on every run (the kernel's rate,
/// not the allocator's: a fresh 16 MiB output faults its pages in).
#[derive(Debug)]
pub struct HostGemmInput {
    a: Vec<f32>,
    weight: PackedWeight,
    bias: Vec<f32>,
    c: RefCell<Vec<f32>>,
}

impl<B: Backend> Benchmark<B> for HostGemm {
    type Input = HostGemmInput;
    /// The output's first value.
    type Output = f32;

    fn name(&self) -> String {
        let operands = match self.products {
            Products::F32 => "f32",
            Products::Bf16 => "bf16",
        };
        format!("host-gemm/{operands}/n={}", self.n)
    }

    fn work(&self) -> Work {
        let n = self.n as f64;
        let work = Work::items(1).with_flops(2.0 * n * n * n);
        match self.products {
            Products::F32 => work.with_bytes(3.0 * n * n * 4.0),
            Products::Bf16 => work
                .with_bytes(n * n * (2.0 + 2.0 + 4.0))
                .in_bf16_products(),
        }
    }

    fn prepare(&self, _device: &B::Device, variant: usize) -> Self::Input {
        let n = self.n;
        let values = |seed: usize| -> Vec<f32> {
            (0..n * n)
                .map(|i| ((i * 7 + seed * 13 + variant) % 101) as f32 / 50.0 - 1.0)
                .collect()
        };
        let b = values(2);
        let weight = match self.products {
            Products::F32 => PackedWeight::F32(sgemm::Packed::new(n, &[(&b, n)])),
            Products::Bf16 => PackedWeight::Bf16(bf16::Packed::new(n, &[(&b, n)])),
        };
        HostGemmInput {
            a: values(1),
            weight,
            bias: vec![0.0; n],
            c: RefCell::new(vec![0.0; n * n]),
        }
    }

    fn run(&self, input: &Self::Input) -> Self::Output {
        let mut c = input.c.borrow_mut();
        let (a, bias, m) = (&input.a, &input.bias, self.n);
        match &input.weight {
            PackedWeight::F32(b) => sgemm::product(&mut c, a, b, m, false, bias, |v| v),
            PackedWeight::Bf16(b) => bf16::product(&mut c, a, b, m, false, bias, |v| v),
        }
        c[0]
    }
}

/// Scaled dot-product attention, `softmax(QKᵀ/√d)·V`, on `[batch, heads, seq, head_dim]`, through
/// burn's fused `attention` (the backend's own kernel: tiled per batch and head on Flex, flash
/// attention on the GPU backends). 4·b·h·s²·d FLOPs in the two products.
#[derive(Debug, Clone, Copy)]
pub struct Attention {
    /// Sequences per run (the item count).
    pub batch: usize,
    /// Attention heads.
    pub heads: usize,
    /// Tokens per sequence.
    pub seq: usize,
    /// Channels per head.
    pub head_dim: usize,
    /// Dtypes to compute in.
    pub policy: Policy,
}

impl Attention {
    /// ViT-B/16 at 224 px: 12 heads of 64 channels over 197 tokens.
    pub fn vit_base(batch: usize, policy: Policy) -> Self {
        Attention {
            batch,
            heads: 12,
            seq: 197,
            head_dim: 64,
            policy,
        }
    }
}

impl<B: Backend> Benchmark<B> for Attention {
    type Input = [Tensor<B, 4>; 3];
    type Output = Tensor<B, 4>;

    fn name(&self) -> String {
        format!(
            "attention/b={},h={},s={},d={}",
            self.batch, self.heads, self.seq, self.head_dim
        )
    }

    fn work(&self) -> Work {
        let (b, h, s, d) = (self.batch, self.heads, self.seq, self.head_dim);
        Work::items(b as u64).with_flops(4.0 * (b * h * s * s * d) as f64)
    }

    fn prepare(&self, device: &B::Device, _variant: usize) -> Self::Input {
        let shape = [self.batch, self.heads, self.seq, self.head_dim];
        std::array::from_fn(|_| {
            let x = Tensor::<B, 4>::random(shape, Distribution::Normal(0.0, 1.0), device);
            self.policy.cast_input(x)
        })
    }

    fn run(&self, [q, k, v]: &Self::Input) -> Self::Output {
        attention(
            q.clone(),
            k.clone(),
            v.clone(),
            None,
            None,
            Default::default(),
        )
    }
}

/// Reads `elements` values and writes as many (`x + 1`): the memory-bound end of the roofline.
#[derive(Debug, Clone, Copy)]
pub struct MemoryCopy {
    /// Elements per run.
    pub elements: usize,
    /// Dtypes to compute in.
    pub policy: Policy,
}

impl<B: Backend> Benchmark<B> for MemoryCopy {
    type Input = Tensor<B, 1>;
    type Output = Tensor<B, 1>;

    fn name(&self) -> String {
        format!("copy/n={}", self.elements)
    }

    fn work(&self) -> Work {
        Work::items(1).with_bytes(2.0 * (self.elements * self.policy.compute.size_of()) as f64)
    }

    fn prepare(&self, device: &B::Device, _variant: usize) -> Self::Input {
        let x = Tensor::<B, 1>::random([self.elements], Distribution::Uniform(0.0, 1.0), device);
        self.policy.cast_input(x)
    }

    fn run(&self, x: &Self::Input) -> Self::Output {
        x.clone().add_scalar(1.0)
    }
}

/// Sizes of the calibration kernels.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CalibrationSize {
    /// GEMM matrix sizes; the peak is the best rate of any of them.
    pub gemm_sizes: &'static [usize],
    /// Elements of the memory copy.
    pub copy_elements: usize,
    /// Whether to calibrate the host's bf16 product peak too (where the CPU has bf16 units).
    pub host_bf16: bool,
}

impl CalibrationSize {
    /// For CPUs: GEMMs of 256² to 1024² and a 24 MiB (f32) copy — twice larger than most
    /// last-level cache shares, small enough for the allocator to reuse the buffer instead of
    /// faulting in pages.
    pub const CPU: CalibrationSize = CalibrationSize {
        gemm_sizes: &[256, 512, 1024],
        copy_elements: 6 << 20,
        host_bf16: true,
    };
    /// For GPUs: GEMMs of 2048² to 8192² and a 256 MiB (f32) copy.
    pub const GPU: CalibrationSize = CalibrationSize {
        gemm_sizes: &[2048, 4096, 8192],
        copy_elements: 64 << 20,
        host_bf16: false,
    };
}

/// The best rate of any sample: `work` per run over the fastest run.
fn best_rate(work: Option<f64>, samples: &[f64]) -> f64 {
    let fastest = samples.iter().copied().fold(f64::INFINITY, f64::min);
    work.unwrap_or(0.0) / fastest
}

/// Measures the device's peaks: the best sample of a sweep of GEMMs and of a memory copy, in the
/// policy's compute dtype, and with `size.host_bf16` the CPU's bf16 product peak
/// ([`bf16::peak_flop_per_s`]: the better of two timings of multiply-adds on operands held in
/// registers).
pub fn calibrate<B: Backend>(
    device: &B::Device,
    policy: Policy,
    size: CalibrationSize,
    config: &Config,
) -> Result<Peaks, BenchError> {
    // The copy runs first: freeing its large buffers raises glibc's adaptive mmap threshold, the
    // steady state a long-running job reaches, so the GEMMs after it are not charged page faults
    // on every fresh output.
    // burn's host backends widen half precision element by element: with the host's bf16 units
    // in play, the memory's bandwidth is the f32 copy's.
    let copy = MemoryCopy {
        elements: size.copy_elements,
        policy: if size.host_bf16 {
            Policy::full()
        } else {
            policy
        },
    };
    let copy_timings = measure::<B, _>(&copy, device, config, &|| None)?;
    let mut flop_per_s = 0.0_f64;
    for &n in size.gemm_sizes {
        let gemm = Gemm::new(n, policy);
        let timings = measure::<B, _>(&gemm, device, config, &|| None)?;
        flop_per_s = flop_per_s.max(best_rate(
            Benchmark::<B>::work(&gemm).flops,
            &timings.samples,
        ));
    }
    let bf16_flop_per_s = if size.host_bf16 {
        (0..2)
            .filter_map(|_| bf16::peak_flop_per_s())
            .reduce(f64::max)
    } else {
        None
    };
    Ok(Peaks {
        flop_per_s,
        bytes_per_s: best_rate(Benchmark::<B>::work(&copy).bytes, &copy_timings.samples),
        bf16_flop_per_s,
    })
}
