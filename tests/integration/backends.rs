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
