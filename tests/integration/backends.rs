//! Every compiled backend through the run-time dispatch, checked against a host computation.
//!
//! The wgpu test needs a Vulkan (or Metal) adapter; on a machine without a GPU, Mesa's lavapipe
//! provides one (`apt-get install mesa-vulkan-drivers`). Where none exists the test says so on
//! stderr and passes, unless `KILN_REQUIRE_WGPU=1` (set by CI) makes a missing adapter a failure.

use burn::tensor::activation::softmax;
use burn::tensor::backend::Backend;
use burn::tensor::{FloatDType, Int, Tensor, TensorData};
use common::say;
use kiln::core::{DeviceJob, DeviceSpec, PolicySpec, is_host_backend};
use kiln::kernels::scatter_add;

use crate::common;

/// softmax(A·B) and a mixed-dtype scatter-add, read back as f64, and whether the backend keeps
/// tensors in host memory.
struct Probe;

const N: usize = 16;

fn matrix(salt: usize) -> Vec<f32> {
    (0..N * N)
        .map(|i| (((i * 37 + salt * 11) % 17) as f32 - 8.0) / 8.0)
        .collect()
}

fn host_softmax_matmul() -> Vec<f64> {
    let (a, b) = (matrix(1), matrix(2));
    let mut out = Vec::new();
    for r in 0..N {
        let z: Vec<f64> = (0..N)
            .map(|c| {
                (0..N)
                    .map(|k| a[r * N + k] as f64 * b[k * N + c] as f64)
                    .sum()
            })
            .collect();
        let max = z.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let s: f64 = z.iter().map(|v| (v - max).exp()).sum();
        out.extend(z.iter().map(|v| (v - max).exp() / s));
    }
    out
}

impl DeviceJob for Probe {
    type Output = (Vec<f64>, Vec<f32>, bool);

    fn run<B: Backend>(self, device: &B::Device) -> Self::Output {
        let policy = PolicySpec::default().resolve::<B>(device).unwrap();
        let a = Tensor::<B, 2>::from_data(TensorData::new(matrix(1), [N, N]), device);
        let b = Tensor::<B, 2>::from_data(TensorData::new(matrix(2), [N, N]), device);
        let y = policy.keep_f32(a.matmul(b), |z| softmax(z, 1));
        let y: Vec<f32> = y.into_data().to_vec().unwrap();

        let values = Tensor::<B, 1>::from_floats([1.0, 2.0, 3.0, 4.0], device);
        let index = Tensor::<B, 1, Int>::from_ints([1, 0, 1, 1], device);
        let sums = scatter_add(Tensor::zeros([2], device), 0, index, values);
        B::sync(device).unwrap();
        (
            y.into_iter().map(f64::from).collect(),
            sums.cast(FloatDType::F32).into_data().to_vec().unwrap(),
            is_host_backend::<B>(device),
        )
    }
}

fn check(device: DeviceSpec) {
    let (y, sums, on_host) = device.run(Probe).unwrap();
    for (got, want) in y.iter().zip(host_softmax_matmul()) {
        assert!((got - want).abs() < 1e-5, "{device}: {got} vs {want}");
    }
    assert_eq!(sums, vec![2.0, 8.0], "{device}");
    let cpu = matches!(device, DeviceSpec::Flex | DeviceSpec::NdArray);
    assert_eq!(on_host, cpu, "{device}");
}

backend_tests!("test"; cpu, ndarray, wgpu, cuda);

#[test]
fn cuda_without_a_driver_is_a_one_line_error() {
    let err = match DeviceSpec::Cuda(0).probe() {
        Ok(hardware) => {
            say(&format!(
                "CUDA device present ({}): nothing to check",
                hardware.name
            ));
            return;
        }
        Err(e) => e.to_string(),
    };
    assert!(!err.contains('\n') && !err.contains("panicked"), "{err}");
    if cfg!(feature = "cuda") {
        assert!(err.contains("NVIDIA driver"), "{err}");
    } else {
        assert!(err.contains("--features cuda"), "{err}");
    }
}

#[test]
fn report_lists_dtypes_of_the_cpu() {
    let report = DeviceSpec::Flex.report().unwrap();
    assert_eq!(report.compute_dtypes().len(), 4, "{report}");
    assert!(report.hardware.threads.unwrap() >= 1);
    let text = report.to_string();
    for needle in ["cpu (flex)", "bf16", "half     = bf16", "memory"] {
        assert!(text.contains(needle), "{needle} missing from\n{text}");
    }
}

/// Products through NVIDIA's cuBLASLt on burn's CUDA backend (kiln-kernels' `cublaslt`): each
/// epilogue, transposes, a residual and an operand that starts mid-buffer, in f32 (TF32), bf16
/// and f16, against the host's f64 product of the same (rounded) operands; and that each ran in
/// cuBLASLt rather than falling back to burn's product.
#[cfg(feature = "cuda")]
mod cublaslt {
    use burn::tensor::backend::Backend;
    use burn::tensor::{Tensor, TensorData};
    use kiln::core::{DeviceJob, Precision};
    use kiln::kernels::gemm::cublaslt::{cublaslt_launches, product, set_cublaslt};

    use crate::common;

    /// `[rows, inner, cols]`, lhs and rhs read transposed, bias, tanh GELU, residual, and rows
    /// skipped at the start of lhs's buffer.
    #[derive(Debug, Clone, Copy)]
    struct Case {
        shape: [usize; 3],
        lhs_t: bool,
        rhs_t: bool,
        bias: bool,
        gelu: bool,
        residual: bool,
        skip: usize,
    }

    /// The last case repeats the first with other values: where its operands' alignments are
    /// the first's, it runs on the first's kept plan (descriptors and kernel) with its own bias.
    const CASES: [Case; 7] = [
        Case::plain([37, 50, 29]).bias(),
        Case::plain([64, 96, 128]).bias().gelu(),
        Case::plain([33, 64, 48]).bias().residual(),
        Case::plain([17, 40, 23]).rhs_t(),
        Case::plain([16, 40, 24]).lhs_t().bias(),
        Case::plain([21, 50, 30]).skip(3),
        Case::plain([37, 50, 29]).bias(),
    ];

    impl Case {
        const fn plain(shape: [usize; 3]) -> Case {
            Case {
                shape,
                lhs_t: false,
                rhs_t: false,
                bias: false,
                gelu: false,
                residual: false,
                skip: 0,
            }
        }
        const fn bias(self) -> Case {
            Case { bias: true, ..self }
        }
        const fn gelu(self) -> Case {
            Case { gelu: true, ..self }
        }
        const fn residual(self) -> Case {
            Case {
                residual: true,
                ..self
            }
        }
        const fn rhs_t(self) -> Case {
            Case {
                rhs_t: true,
                ..self
            }
        }
        const fn lhs_t(self) -> Case {
            Case {
                lhs_t: true,
                ..self
            }
        }
        const fn skip(self, rows: usize) -> Case {
            Case { skip: rows, ..self }
        }
    }

    /// Each case's product from cuBLASLt, the operands as the device rounded them, and the
    /// products handed to cuBLASLt and fallen back to burn's while it ran.
    struct Products(Precision);

    /// Values in [-1, 1], different per salt.
    fn values(len: usize, salt: usize) -> Vec<f32> {
        (0..len)
            .map(|i| ((i * 7919 + salt * 104_729) % 2001) as f32 / 1000.0 - 1.0)
            .collect()
    }

    type Read = [Vec<f32>; 5];

    impl DeviceJob for Products {
        type Output = Vec<(Case, Read, [u64; 2])>;

        fn run<B: Backend>(self, device: &B::Device) -> Self::Output {
            let dtype = self.0.float_dtype();
            let tensor = |data: Vec<f32>, shape: [usize; 2]| {
                Tensor::<B, 2>::from_data(TensorData::new(data, shape), device).cast(dtype)
            };
            let read = |t: Tensor<B, 2>| -> Vec<f32> {
                t.cast(burn::tensor::FloatDType::F32)
                    .into_data()
                    .to_vec()
                    .unwrap()
            };
            CASES
                .iter()
                .enumerate()
                .map(|(salt, &case)| {
                    let [rows, inner, cols] = case.shape;
                    let lhs_shape = if case.lhs_t {
                        [inner, rows]
                    } else {
                        [rows, inner]
                    };
                    let rhs_shape = if case.rhs_t {
                        [cols, inner]
                    } else {
                        [inner, cols]
                    };
                    let stored = [lhs_shape[0] + case.skip, lhs_shape[1]];
                    let lhs = tensor(values(stored[0] * stored[1], salt), stored)
                        .slice([case.skip..stored[0], 0..stored[1]]);
                    let rhs = tensor(values(inner * cols, salt + 10), rhs_shape);
                    let bias = tensor(values(cols, salt + 20), [1, cols]);
                    let residual = tensor(values(rows * cols, salt + 30), [rows, cols]);
                    let (launched, fell_back) = cublaslt_launches();
                    let bias_row = bias.clone().reshape([cols]);
                    let out = product(
                        &lhs,
                        case.lhs_t,
                        &rhs,
                        case.rhs_t,
                        case.bias.then_some(&bias_row),
                        case.gelu,
                        case.residual.then_some(&residual),
                    )
                    .expect("cuBLASLt served the product");
                    // Read first: the product runs when the fusion stream reaches it.
                    let read_all = [read(out), read(lhs), read(rhs), read(bias), read(residual)];
                    let (launches, fallbacks) = cublaslt_launches();
                    (case, read_all, [launches - launched, fallbacks - fell_back])
                })
                .collect()
        }
    }

    /// The case's product in f64 from the operands as the device held them, and for each
    /// element the sum of the products' magnitudes (the scale of its rounding).
    fn host(case: Case, [_, lhs, rhs, bias, residual]: &Read) -> Vec<(f64, f64)> {
        let [rows, inner, cols] = case.shape;
        let at_lhs = |i: usize, p: usize| {
            f64::from(if case.lhs_t {
                lhs[p * rows + i]
            } else {
                lhs[i * inner + p]
            })
        };
        let at_rhs = |p: usize, j: usize| {
            f64::from(if case.rhs_t {
                rhs[j * inner + p]
            } else {
                rhs[p * cols + j]
            })
        };
        let gelu = |x: f64| {
            0.5 * x
                * (1.0 + ((2.0 / std::f64::consts::PI).sqrt() * (x + 0.044715 * x.powi(3))).tanh())
        };
        (0..rows * cols)
            .map(|e| {
                let (i, j) = (e / cols, e % cols);
                let mut y: f64 = (0..inner).map(|p| at_lhs(i, p) * at_rhs(p, j)).sum();
                let scale: f64 = (0..inner)
                    .map(|p| (at_lhs(i, p) * at_rhs(p, j)).abs())
                    .sum();
                if case.bias {
                    y += f64::from(bias[j]);
                }
                if case.gelu {
                    y = gelu(y);
                }
                if case.residual {
                    y += f64::from(residual[e]);
                }
                (y, scale + 1.0)
            })
            .collect()
    }

    #[test]
    fn cuda() {
        let Some(device) = common::cuda("cuda cuBLASLt products") else {
            return;
        };
        // Off by default (docs/PERFORMANCE.md): on for this process's products.
        set_cublaslt(true);
        for precision in [Precision::F32, Precision::BF16, Precision::F16] {
            // TF32 keeps 10 mantissa bits of each operand; bf16 and f16 outputs round to 8 and
            // 11 bits, the product accumulating in f32.
            let tolerance = match precision {
                Precision::BF16 => 2f64.powi(-7),
                Precision::F16 => 2f64.powi(-9),
                _ => 2f64.powi(-9),
            };
            for (case, read, launches) in device.run(Products(precision)).unwrap() {
                assert_eq!(
                    launches,
                    [1, 0],
                    "{precision:?} {case:?}: not through cuBLASLt"
                );
                let worst = host(case, &read)
                    .iter()
                    .zip(&read[0])
                    .map(|(&(want, scale), &got)| (f64::from(got) - want).abs() / scale)
                    .fold(0.0, f64::max);
                common::say(&format!(
                    "{precision:?} {case:?}: worst |Δ|/Σ|ab| {worst:.1e}"
                ));
                assert!(worst <= tolerance, "{precision:?} {case:?}: {worst:e}");
            }
        }
    }
}
