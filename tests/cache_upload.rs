//! Cached images uploaded to every compiled backend: the host lookup-table path (Flex, NdArray)
//! and the u8-upload-and-normalise-on-device path (wgpu) give the processor's values.

use burn::tensor::backend::Backend;
use burn::tensor::{FloatDType, TensorData};
use kiln::cache::{Preprocess, normalize_on_device};
use kiln::precision::{DeviceJob, DeviceSpec, Precision, resolve_half};

mod common;

const SHAPE: [usize; 4] = [2, 3, 5, 7];

fn pixels() -> Vec<u8> {
    (0..SHAPE.iter().product::<usize>())
        .map(|i| ((i * 37) % 256) as u8)
        .collect()
}

/// Uploads in f32, or in the device's half type (`half`: bf16, f16 or f32), and reads back.
struct Upload {
    half: bool,
}

impl DeviceJob for Upload {
    type Output = (Precision, Vec<f32>);

    fn run<B: Backend>(self, device: &B::Device) -> Self::Output {
        let precision = if self.half {
            resolve_half::<B>(device)
        } else {
            Precision::F32
        };
        let batch =
            normalize_on_device::<B>(&Preprocess::clip(5), pixels(), SHAPE, device, precision);
        let data: TensorData = batch.cast(FloatDType::F32).into_data();
        (precision, data.to_vec().unwrap())
    }
}

/// CLIP's normalisation in f64, straight from the processor's mean and std.
fn expected() -> Vec<f64> {
    let normalize = Preprocess::clip(5).normalize.unwrap();
    let plane = SHAPE[2] * SHAPE[3];
    pixels()
        .iter()
        .enumerate()
        .map(|(i, &v)| {
            let c = (i / plane) % 3;
            (v as f64 / 255.0 - normalize.mean[c] as f64) / normalize.std[c] as f64
        })
        .collect()
}

fn check(device: DeviceSpec) {
    let expected = expected();
    let largest = expected.iter().fold(0.0, |m: f64, e| m.max(e.abs()));
    for half in [false, true] {
        let (precision, got) = device.run(Upload { half }).unwrap();
        // Normalised in f32, rounded once to `precision`: half an ulp of the largest value.
        let unit_roundoff = match precision {
            Precision::BF16 => 2f64.powi(-8),
            Precision::F16 => 2f64.powi(-11),
            _ => 1e-6,
        };
        let worst = got
            .iter()
            .zip(&expected)
            .map(|(&g, e)| (g as f64 - e).abs())
            .fold(0.0, f64::max);
        assert!(
            worst <= unit_roundoff * largest,
            "{device} {precision:?}: {worst}"
        );
    }
}

#[test]
fn cpu() {
    check(DeviceSpec::Flex);
}

#[cfg(feature = "ndarray")]
#[test]
fn ndarray() {
    check(DeviceSpec::NdArray);
}

#[cfg(feature = "wgpu")]
#[test]
fn wgpu() {
    if let Some(device) = common::vulkan("wgpu upload test") {
        check(device);
    }
}
