//! The vision towers against transformers 5.23 on the committed tiny checkpoints: every output
//! and every layer's hidden state, from f32, f16 and sharded bf16 checkpoints (full models'
//! text towers are ignored). Tolerance: max |Δ| / max |reference| ≤ 1e-4 in f32 on Flex.

use std::path::PathBuf;

use burn::backend::Flex;
use burn::tensor::{Tensor, TensorData};
use kiln_precision::Policy;
use kiln_vision::{HfModule, VisionConfig, load_hf_weights};

fn fixtures() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures")
}

/// The f32 tensors of a reference file.
struct Reference(Vec<u8>);

impl Reference {
    fn open(name: &str) -> Self {
        Reference(std::fs::read(fixtures().join(format!("{name}.safetensors"))).unwrap())
    }

    fn get(&self, key: &str) -> (Vec<f32>, Vec<usize>) {
        let tensors = safetensors::SafeTensors::deserialize(&self.0).unwrap();
        let view = tensors.tensor(key).unwrap();
        let values = view
            .data()
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect();
        (values, view.shape().to_vec())
    }

    fn input(&self, key: &str) -> Tensor<Flex, 4> {
        let (values, shape) = self.get(key);
        Tensor::from_data(TensorData::new(values, shape), &Default::default())
    }
}

/// max |ours − reference| / max |reference|.
fn relative_error<const D: usize>(ours: Tensor<Flex, D>, reference: &Reference, key: &str) -> f32 {
    let (expected, shape) = reference.get(key);
    assert_eq!(ours.dims().to_vec(), shape, "{key}");
    let ours: Vec<f32> = ours.into_data().to_vec().unwrap();
    let worst = ours
        .iter()
        .zip(&expected)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0, f32::max);
    worst / expected.iter().fold(0.0, |m: f32, v| m.max(v.abs()))
}

fn load<M: HfModule<Flex>>(model: M, name: &str) -> M {
    load_hf_weights(model, fixtures().join(name), &Policy::full()).unwrap()
}

fn config(name: &str) -> VisionConfig {
    VisionConfig::from_hf_config(fixtures().join(name)).unwrap()
}

/// Checks `outputs` (reference key without suffix, relative error) and the hidden states.
fn check(
    name: &str,
    suffix: &str,
    outputs: Vec<(&str, Tensor<Flex, 2>)>,
    last: Tensor<Flex, 3>,
    hidden: Vec<Tensor<Flex, 3>>,
) {
    let reference = Reference::open(name);
    let key = |k: &str| format!("{k}{suffix}");
    let mut errors: Vec<(String, f32)> = outputs
        .into_iter()
        .map(|(k, ours)| (k.to_string(), relative_error(ours, &reference, &key(k))))
        .collect();
    errors.push((
        "last_hidden_state".into(),
        relative_error(last, &reference, &key("last_hidden_state")),
    ));
    for (i, state) in hidden.into_iter().enumerate() {
        let k = format!("hidden_states.{i}");
        errors.push((k.clone(), relative_error(state, &reference, &key(&k))));
    }
    eprintln!("{name}: {errors:?}");
    for (k, error) in errors {
        assert!(error <= 1e-4, "{name} {k}: {error}");
    }
}

fn check_clip(name: &str, suffix: &str) {
    let VisionConfig::Clip(config) = config(name) else {
        panic!("{name} is CLIP")
    };
    let clip = load(config.init::<Flex>(&Default::default()), name);
    let out = clip.forward_all(Reference::open(name).input("pixel_values"), true);
    assert_eq!(out.hidden_states.len(), config.num_hidden_layers + 1);
    let outputs = vec![
        ("image_embeds", out.image_embeds),
        ("pooler_output", out.pooler_output),
    ];
    check(
        name,
        suffix,
        outputs,
        out.last_hidden_state,
        out.hidden_states,
    );
}

fn check_siglip(name: &str, suffix: &str) {
    let VisionConfig::Siglip(config) = config(name) else {
        panic!("{name} is SigLIP")
    };
    let siglip = load(config.init::<Flex>(&Default::default()), name);
    let out = siglip.forward_all(Reference::open(name).input("pixel_values"), true);
    assert_eq!(out.hidden_states.len(), config.num_hidden_layers + 1);
    let outputs = vec![("pooler_output", out.pooler_output.expect("a pooling head"))];
    check(
        name,
        suffix,
        outputs,
        out.last_hidden_state,
        out.hidden_states,
    );
}

#[test]
fn clip_vision_with_projection_matches_transformers() {
    check_clip("clip_vision", "");
}

#[test]
fn clip_model_stored_in_f16_matches_transformers_on_the_same_weights() {
    check_clip("clip_full", "_from_f16");
}

#[test]
fn siglip_vision_model_without_prefix_matches_transformers() {
    check_siglip("siglip_vision", "");
}

#[test]
fn sharded_bf16_siglip_model_matches_transformers_on_the_same_weights() {
    check_siglip("siglip_full", "_from_bf16");
}

/// DINOv2 on a non-square input whose patch grid (7 × 9) differs from the stored one (5 × 5),
/// and on the native size.
#[test]
fn dinov2_with_interpolated_positions_matches_transformers() {
    let VisionConfig::Dinov2(config) = config("dinov2") else {
        panic!("dinov2 is DINOv2")
    };
    let dinov2 = load(config.init::<Flex>(&Default::default()), "dinov2");
    let reference = Reference::open("dinov2");
    let positions = dinov2.embeddings().positions(7, 9);
    let error = relative_error(positions, &reference, "position_embeddings");
    assert!(error <= 1e-5, "position_embeddings: {error}");
    for (input, suffix) in [("pixel_values", ""), ("pixel_values_native", "_native")] {
        let out = dinov2.forward_all(reference.input(input), true);
        let outputs = vec![("pooler_output", out.pooler_output)];
        check(
            "dinov2",
            suffix,
            outputs,
            out.last_hidden_state,
            out.hidden_states,
        );
    }
}

#[test]
fn missing_and_mis_shaped_weights_are_named() {
    let dir = fixtures().join("clip_vision");
    let VisionConfig::Clip(mut config) = VisionConfig::from_hf_config(&dir).unwrap() else {
        panic!("clip_vision is CLIP")
    };
    config.intermediate_size += 1;
    let device = Default::default();
    let err = load_hf_weights(config.init::<Flex>(&device), &dir, &Policy::full())
        .unwrap_err()
        .to_string();
    assert!(err.contains("encoder.layers.1.mlp.fc1.weight"), "{err}");
    assert!(
        err.contains("[48, 81]") && err.contains("[48, 80]"),
        "{err}"
    );

    let dinov2 = fixtures().join("dinov2");
    let err = load_hf_weights(
        kiln_vision::ClipVisionConfig::vit_base_patch32().init::<Flex>(&device),
        &dinov2,
        &Policy::full(),
    )
    .unwrap_err()
    .to_string();
    assert!(
        err.contains("vision_model.pre_layrnorm") && err.contains("not in the checkpoint"),
        "{err}"
    );
    let err = load_hf_weights(
        kiln_vision::ClipVisionConfig::vit_base_patch32().init::<Flex>(&device),
        fixtures().join("images"),
        &Policy::full(),
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("model.safetensors.index.json"), "{err}");
}
