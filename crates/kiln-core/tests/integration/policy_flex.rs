//! The policy on Flex, which computes in f64, f32, f16 and bf16: every half-precision result is
//! checked against the same computation done in f64 on the host.

use burn::backend::Flex;
use burn::module::{Module, Param};
use burn::nn::{Linear, LinearConfig};
use burn::tensor::activation::softmax;
use burn::tensor::{DType, FloatDType, Tensor, TensorData};
use kiln_core::{DtypeSpec, Policy, PolicySpec, Precision};

type B = Flex;

fn host(x: Tensor<B, 2>) -> Vec<f64> {
    x.cast(FloatDType::F64).into_data().to_vec::<f64>().unwrap()
}

/// Deterministic inputs in [-1, 1) that are not all exactly representable in f16.
fn inputs(n: usize, salt: u64) -> Vec<f32> {
    (0..n as u64)
        .map(|i| {
            let h = (i + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ salt;
            ((h >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect()
}

/// y = softmax(layer_norm(x Wᵀ + b)) in f64 on the host.
fn reference(x: &[f32], w: &[f32], b: &[f32], rows: usize, d_in: usize, d_out: usize) -> Vec<f64> {
    let mut out = Vec::with_capacity(rows * d_out);
    for r in 0..rows {
        let z: Vec<f64> = (0..d_out)
            .map(|o| {
                b[o] as f64
                    + (0..d_in)
                        .map(|i| x[r * d_in + i] as f64 * w[o * d_in + i] as f64)
                        .sum::<f64>()
            })
            .collect();
        let mean = z.iter().sum::<f64>() / d_out as f64;
        let var = z.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / d_out as f64;
        let n: Vec<f64> = z.iter().map(|v| (v - mean) / (var + 1e-5).sqrt()).collect();
        let max = n.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let e: Vec<f64> = n.iter().map(|v| (v - max).exp()).collect();
        let s: f64 = e.iter().sum();
        out.extend(e.iter().map(|v| v / s));
    }
    out
}

fn layer_norm(z: Tensor<B, 2>) -> Tensor<B, 2> {
    let mean = z.clone().mean_dim(1);
    let centred = z - mean;
    let var = centred.clone().powi_scalar(2).mean_dim(1);
    centred / (var + 1e-5).sqrt()
}

/// The forward pass the way model code writes it: params cast once, input cast to compute,
/// normalisation and softmax through `keep_f32`, result cast to output.
fn forward(policy: &Policy, linear: &Linear<B>, x: Tensor<B, 2>) -> Tensor<B, 2> {
    let x = policy.cast_input(x);
    let w = policy.cast_param(linear.weight.val());
    let b = policy.cast_param(linear.bias.as_ref().unwrap().val());
    let z = x.matmul(w) + b.unsqueeze();
    let y = policy.keep_f32(z, |z| softmax(layer_norm(z), 1));
    policy.cast_output(y)
}

#[test]
fn forward_matches_f64_in_every_compute_dtype() {
    let device = Default::default();
    let (rows, d_in, d_out) = (8, 64, 32);
    // Fixed inputs and weights (PyTorch's nn.Linear scale), so the half-precision errors below
    // are the same on every run.
    let scale = (d_in as f32).sqrt().recip();
    let x = inputs(rows * d_in, 1);
    let w: Vec<f32> = inputs(d_out * d_in, 2).iter().map(|v| v * scale).collect(); // [d_out, d_in]
    let b: Vec<f32> = inputs(d_out, 3).iter().map(|v| v * scale).collect();
    let w_t: Vec<f32> = (0..d_in * d_out)
        .map(|k| w[(k % d_out) * d_in + k / d_out])
        .collect(); // [d_in, d_out], burn's layout
    let linear = Linear::<B> {
        weight: Param::from_tensor(Tensor::from_data(
            TensorData::new(w_t, [d_in, d_out]),
            &device,
        )),
        bias: Some(Param::from_tensor(Tensor::from_data(
            TensorData::new(b.clone(), [d_out]),
            &device,
        ))),
    };
    let want = reference(&x, &w, &b, rows, d_in, d_out);

    for (policy, dtype, tol) in [
        ("full", DType::F32, 1e-6),
        ("mixed-f16", DType::F32, 2e-3),
        ("mixed-bf16", DType::F32, 2e-2),
        ("pure-f16", DType::F16, 3e-3),
        ("bf16", DType::BF16, 3e-2),
    ] {
        let policy = policy
            .parse::<PolicySpec>()
            .unwrap()
            .resolve::<B>(&device)
            .unwrap();
        let linear = policy.cast_params(linear.clone());
        assert_eq!(linear.weight.val().dtype(), policy.param.dtype());
        let x = Tensor::<B, 2>::from_data(TensorData::new(x.clone(), [rows, d_in]), &device);
        let y = forward(&policy, &linear, x);
        assert_eq!(y.dtype(), dtype, "{policy}");
        let got = host(y);
        let worst = got
            .iter()
            .zip(&want)
            .map(|(g, w)| (g - w).abs() / w.abs().max(1e-3))
            .fold(0.0, f64::max);
        eprintln!("{policy}: worst relative error {worst:e}");
        assert!(
            worst < tol,
            "{policy}: worst relative error {worst:e} ≥ {tol:e}"
        );
        // Half precision must actually have been used: its error is far above f32's.
        if policy.compute.is_half() {
            assert!(
                worst > 1e-5,
                "{policy}: error {worst:e} looks like f32 arithmetic"
            );
        }
    }
}

#[test]
fn keep_f32_widens_half_and_leaves_f64_alone() {
    let device = Default::default();
    for (spec, inside, out) in [
        ("mixed-f16", DType::F32, DType::F16),
        ("mixed-bf16", DType::F32, DType::BF16),
        ("full", DType::F32, DType::F32),
        ("f64", DType::F64, DType::F64),
    ] {
        let policy = spec
            .parse::<PolicySpec>()
            .unwrap()
            .resolve::<B>(&device)
            .unwrap();
        let x = policy.cast_input(Tensor::<B, 2>::ones([2, 3], &device));
        let y = policy.keep_f32(x, |x| {
            assert_eq!(x.dtype(), inside, "{spec}");
            x.sum_dim(1)
        });
        assert_eq!(y.dtype(), out, "{spec}");
    }
}

#[test]
fn cast_params_converts_once_and_keeps_ids() {
    let device = Default::default();
    let linear: Linear<B> = LinearConfig::new(4, 3).init(&device);
    let id = linear.weight.id;
    let before: Vec<f32> = linear.weight.val().into_data().to_vec().unwrap();
    let policy = "pure-f16"
        .parse::<PolicySpec>()
        .unwrap()
        .resolve::<B>(&device)
        .unwrap();
    let half = policy.cast_params(linear);
    assert_eq!(half.weight.id, id);
    assert_eq!(half.weight.val().dtype(), DType::F16);
    assert_eq!(half.bias.as_ref().unwrap().val().dtype(), DType::F16);
    let after: Vec<f32> = half
        .weight
        .val()
        .cast(FloatDType::F32)
        .into_data()
        .to_vec()
        .unwrap();
    for (a, b) in before.iter().zip(&after) {
        assert_eq!(*b, half::f16::from_f32(*a).to_f32());
    }
    assert_eq!(half.num_params(), 15);
}

#[test]
fn half_resolves_to_bf16_on_flex_and_accumulation_to_f64() {
    let device = Default::default();
    let policy = "half"
        .parse::<PolicySpec>()
        .unwrap()
        .resolve::<B>(&device)
        .unwrap();
    assert_eq!(policy.compute, Precision::BF16);
    assert_eq!(policy.accumulate, Precision::F64);
    let spec: PolicySpec = "p=f32,c=half,a=f32".parse().unwrap();
    assert_eq!(spec.compute, DtypeSpec::Half);
    let policy = spec.resolve::<B>(&device).unwrap();
    assert_eq!(
        (
            policy.param,
            policy.compute,
            policy.output,
            policy.accumulate
        ),
        (
            Precision::F32,
            Precision::BF16,
            Precision::BF16,
            Precision::F32
        )
    );
}

#[cfg(feature = "ndarray")]
#[test]
fn half_falls_back_to_f32_where_no_16_bit_type_computes() {
    use burn::backend::NdArray;
    use kiln_core::PrecisionError;
    let device = Default::default();
    let policy = "mixed-bf16".parse::<PolicySpec>().unwrap();
    let err = policy.resolve::<NdArray>(&device).unwrap_err();
    assert!(
        matches!(
            err,
            PrecisionError::UnsupportedOnDevice {
                dtype: Precision::BF16,
                ..
            }
        ),
        "{err}"
    );
    assert!(err.to_string().contains("half"), "{err}");
    let half = "p=f32,c=half"
        .parse::<PolicySpec>()
        .unwrap()
        .resolve::<NdArray>(&device)
        .unwrap();
    assert_eq!(half.compute, Precision::F32);
}
