//! The language models on every compiled backend, against transformers' logits on kiln-text's
//! committed tiny Llama (grouped-query attention, tied embeddings; Qwen2 and the other paths are
//! kiln-text's own tests): Flex and NdArray (the host kernels), wgpu (lavapipe in CI) and
//! CUDA (burn's tensor operations) run the same model code; greedy generation through the cache
//! gives transformers' tokens on each.

use std::path::PathBuf;

use burn::tensor::FloatDType;
use burn::tensor::backend::Backend;
use kiln::core::{DeviceJob, DeviceSpec, Policy};
use kiln::text::{CausalLm, GenerationConfig, TextInput, generate};

use crate::common;

const MODELS: [&str; 1] = ["llama"];

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("crates/kiln-text/tests/fixtures")
        .join(name)
}

/// The reference's second sequence (no padding): its ids and transformers' continuation.
fn reference(name: &str) -> (Vec<u32>, Vec<u32>) {
    let bytes = std::fs::read(fixture(&format!("{name}.safetensors"))).unwrap();
    let tensors = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let row = |key: &str| -> Vec<u32> {
        let view = tensors.tensor(key).unwrap();
        let width = view.shape()[1];
        view.data()
            .chunks_exact(8)
            .skip(width)
            .map(|b| i64::from_le_bytes(b.try_into().unwrap()) as u32)
            .collect()
    };
    let (ids, generated) = (row("input_ids"), row("generated"));
    let new = generated[ids.len()..].to_vec();
    (ids, new)
}

/// Each model's logits of the reference's second sequence and its greedy continuation.
struct Run;

impl DeviceJob for Run {
    type Output = Vec<(Vec<f32>, Vec<u32>)>;

    fn run<B: Backend>(self, device: &B::Device) -> Self::Output {
        MODELS
            .into_iter()
            .map(|name| {
                let model =
                    CausalLm::<B>::from_hf_dir(fixture(name), device, &Policy::full()).unwrap();
                let (ids, new) = reference(name);
                let logits = model
                    .forward(TextInput::ids(vec![ids.clone()]))
                    .unwrap()
                    .logits
                    .cast(FloatDType::F32)
                    .into_data()
                    .to_vec::<f32>()
                    .unwrap();
                let config = GenerationConfig::greedy(new.len());
                let generated = generate(&model, &[ids], &config, |_| {}).unwrap();
                (logits, generated[0].clone())
            })
            .collect()
    }
}

fn check(device: DeviceSpec) {
    for (name, (logits, generated)) in MODELS.into_iter().zip(device.run(Run).unwrap()) {
        let (expected, _) = common::read_f32(&fixture(&format!("{name}.safetensors")), "logits");
        // The reference's second row: the sequence without padding.
        let error = common::relative_f32(&logits, &expected[expected.len() / 2..]);
        let tolerance = 1e-4 * common::tf32_slack(device);
        assert!(error <= tolerance, "{device} {name}: {error}");
        assert_eq!(
            generated,
            reference(name).1,
            "{device} {name}: greedy tokens"
        );
    }
}

backend_tests!("text parity test"; cpu, ndarray, wgpu, cuda);
