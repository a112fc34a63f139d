//! The vision towers against transformers 5.23 on the committed tiny checkpoints: every output
//! and every layer's hidden state, from f32, f16 and sharded bf16 checkpoints (full models'
//! text towers are ignored). Tolerance: max |Δ| / max |reference| ≤ 1e-4 in f32 on Flex.

use burn::backend::Flex;
use burn::tensor::Tensor;
use kiln_core::Policy;
use kiln_vision::{Tower, VisionConfig, load_hf_weights};

use crate::support;

use support::{Reference, fixtures, relative_error};

fn load<M: Tower<Flex>>(model: M, name: &str) -> M {
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
    let untrained = config.init::<Flex>(&Default::default());
    // A resized table computed before loading must not outlive the weights it came from.
    let _ = untrained.embeddings().positions(7, 9);
    let dinov2 = load(untrained, "dinov2");
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
