//! The vision towers on every compiled backend, against transformers' outputs on the committed
//! tiny checkpoints: Flex, NdArray and wgpu (lavapipe in CI) run the same model code.

use std::path::{Path, PathBuf};

use burn::tensor::backend::Backend;
use burn::tensor::{Tensor, TensorData};
use kiln::precision::{DeviceJob, DeviceSpec, Policy};
use kiln::vision::{VisionConfig, load_hf_weights};

mod common;

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("crates/kiln-vision/tests/fixtures")
}

/// `(values, shape)` of an f32 tensor of a reference file.
fn reference(file: &str, key: &str) -> (Vec<f32>, Vec<usize>) {
    let bytes = std::fs::read(fixtures().join(file)).unwrap();
    let tensors = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let view = tensors.tensor(key).unwrap();
    let values = view
        .data()
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect();
    (values, view.shape().to_vec())
}

/// Each tower's pooled output on its reference input: CLIP's image_embeds, SigLIP's and
/// DINOv2's (non-square input) pooler_output.
struct Pooled;

impl DeviceJob for Pooled {
    type Output = Vec<(&'static str, Vec<f32>)>;

    fn run<B: Backend>(self, device: &B::Device) -> Self::Output {
        let input = |name: &str, key: &str| {
            let (values, shape) = reference(&format!("{name}.safetensors"), key);
            Tensor::<B, 4>::from_data(TensorData::new(values, shape), device)
        };
        let dir = |name: &str| fixtures().join(name);
        let policy = Policy::full();
        let read = |t: Tensor<B, 2>| t.into_data().to_vec::<f32>().unwrap();
        let mut out = Vec::new();
        for name in ["clip_vision", "siglip_vision", "dinov2"] {
            let pooled = match VisionConfig::from_hf_config(dir(name)).unwrap() {
                VisionConfig::Clip(c) => load_hf_weights(c.init::<B>(device), dir(name), &policy)
                    .unwrap()
                    .forward(input(name, "pixel_values")),
                VisionConfig::Siglip(c) => load_hf_weights(c.init::<B>(device), dir(name), &policy)
                    .unwrap()
                    .forward(input(name, "pixel_values")),
                VisionConfig::Dinov2(c) => load_hf_weights(c.init::<B>(device), dir(name), &policy)
                    .unwrap()
                    .forward(input(name, "pixel_values")),
            };
            out.push((name, read(pooled)));
        }
        out
    }
}

fn check(device: DeviceSpec) {
    for (name, ours) in device.run(Pooled).unwrap() {
        let key = if name == "clip_vision" {
            "image_embeds"
        } else {
            "pooler_output"
        };
        let (expected, _) = reference(&format!("{name}.safetensors"), key);
        let worst = ours
            .iter()
            .zip(&expected)
            .map(|(a, b)| (a - b).abs())
            .fold(0.0, f32::max);
        let largest = expected.iter().fold(0.0, |m: f32, v| m.max(v.abs()));
        assert_eq!(ours.len(), expected.len(), "{device} {name}");
        assert!(
            worst / largest <= 1e-4,
            "{device} {name}: {}",
            worst / largest
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
    if let Some(device) = common::vulkan("wgpu vision parity test") {
        check(device);
    }
}
