//! CLIP's vision tower against transformers 5.23 on the committed tiny checkpoints: every output
//! and every layer's hidden state, from an f32 and an f16 checkpoint (the full `CLIPModel`, whose
//! text tower is ignored). Tolerance: max |Δ| / max |reference| ≤ 1e-4 in f32 on Flex.

use std::path::PathBuf;

use burn::backend::Flex;
use burn::tensor::{Tensor, TensorData};
use kiln_precision::Policy;
use kiln_vision::{VisionConfig, load_hf_weights};

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

fn check_clip(model: &str, suffix: &str) {
    let dir = fixtures().join(model);
    let VisionConfig::Clip(config) = VisionConfig::from_hf_config(&dir).unwrap() else {
        panic!("{model} is CLIP")
    };
    let device = Default::default();
    let clip = load_hf_weights(config.init::<Flex>(&device), &dir, &Policy::full()).unwrap();
    let reference = Reference::open(model);
    let out = clip.forward_all(reference.input("pixel_values"), true);
    assert_eq!(out.hidden_states.len(), config.num_hidden_layers + 1);
    let mut errors = vec![
        (
            "image_embeds",
            relative_error(
                out.image_embeds,
                &reference,
                &format!("image_embeds{suffix}"),
            ),
        ),
        (
            "pooler_output",
            relative_error(
                out.pooler_output,
                &reference,
                &format!("pooler_output{suffix}"),
            ),
        ),
        (
            "last_hidden_state",
            relative_error(
                out.last_hidden_state,
                &reference,
                &format!("last_hidden_state{suffix}"),
            ),
        ),
    ];
    for (i, hidden) in out.hidden_states.into_iter().enumerate() {
        errors.push((
            "hidden_states",
            relative_error(hidden, &reference, &format!("hidden_states.{i}{suffix}")),
        ));
    }
    eprintln!("{model}: {errors:?}");
    for (name, error) in errors {
        assert!(error <= 1e-4, "{model} {name}: {error}");
    }
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
