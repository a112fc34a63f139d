//! The vision towers on every compiled backend, against transformers' outputs on the committed
//! tiny checkpoints: Flex, NdArray and wgpu (lavapipe in CI) run the same model code, and
//! Monte-Carlo dropout draws the same masks on each.

use burn::tensor::backend::Backend;
use burn::tensor::{Tensor, TensorData};
use kiln::core::{DeviceJob, DeviceSpec, Policy};
use kiln::vision::{Draw, DropoutSites, VisionModel};

use crate::common;

use common::fixtures;

const MODELS: [&str; 3] = ["clip_vision", "siglip_vision", "dinov2"];

/// `(values, shape)` of an f32 tensor of a reference file.
fn reference(file: &str, key: &str) -> (Vec<f32>, Vec<usize>) {
    common::read_f32(&fixtures().join(file), key)
}

/// Each tower's embeddings of its reference input (CLIP's image_embeds, SigLIP's and DINOv2's
/// pooler_output; DINOv2's input is non-square): deterministic, and sampled with dropout 0.1 at
/// every site.
struct Embeddings;

struct Embedded {
    name: &'static str,
    deterministic: Vec<f32>,
    sampled: Vec<f32>,
}

impl DeviceJob for Embeddings {
    type Output = Vec<Embedded>;

    fn run<B: Backend>(self, device: &B::Device) -> Self::Output {
        let read = |t: Tensor<B, 2>| t.into_data().to_vec::<f32>().unwrap();
        MODELS
            .into_iter()
            .map(|name| {
                let (values, shape) = reference(&format!("{name}.safetensors"), "pixel_values");
                let pixels = Tensor::<B, 4>::from_data(TensorData::new(values, shape), device);
                let model =
                    VisionModel::<B>::from_hf_dir(fixtures().join(name), device, &Policy::full())
                        .unwrap()
                        .with_dropout(DropoutSites::all(0.1))
                        .unwrap();
                let draw = Draw::pass(5, 2, 0..pixels.dims()[0] as u64);
                Embedded {
                    name,
                    deterministic: read(model.forward(pixels.clone())),
                    sampled: read(model.forward_sampled(pixels, &draw).unwrap()),
                }
            })
            .collect()
    }
}

/// max |ours − expected| / max |expected|.
fn relative_error(ours: &[f32], expected: &[f32]) -> f32 {
    assert_eq!(ours.len(), expected.len());
    let worst = ours
        .iter()
        .zip(expected)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0, f32::max);
    worst / expected.iter().fold(0.0, |m: f32, v| m.max(v.abs()))
}

fn check(device: DeviceSpec) {
    let on_flex = DeviceSpec::Flex.run(Embeddings).unwrap();
    for (ours, flex) in device.run(Embeddings).unwrap().iter().zip(&on_flex) {
        let name = ours.name;
        let key = if name == "clip_vision" {
            "image_embeds"
        } else {
            "pooler_output"
        };
        let (expected, _) = reference(&format!("{name}.safetensors"), key);
        let tolerance = 1e-4 * common::tf32_slack(device) as f32;
        let error = relative_error(&ours.deterministic, &expected);
        assert!(error <= tolerance, "{device} {name}: {error}");
        let error = relative_error(&ours.sampled, &flex.sampled);
        assert!(
            error <= tolerance,
            "{device} {name} sampled, against Flex: {error}"
        );
        assert!(relative_error(&ours.sampled, &ours.deterministic) > 1e-3);
    }
}

backend_tests!("vision parity test"; cpu, ndarray, wgpu, cuda);
