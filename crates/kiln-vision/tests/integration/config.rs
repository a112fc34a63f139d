//! The committed transformers checkpoints' `config.json`s read into kiln's configs, with the
//! traps of each family, and the errors for what kiln does not read.

use std::path::PathBuf;

use kiln_vision::{Activation, ClipVisionConfig, Dinov2Config, SiglipVisionConfig, VisionConfig};

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
}

fn read(name: &str) -> VisionConfig {
    VisionConfig::from_hf_config(fixture(name)).unwrap()
}

#[test]
fn clip_vision_only_and_full_models() {
    let expected = ClipVisionConfig {
        hidden_size: 48,
        intermediate_size: 80,
        num_hidden_layers: 2,
        num_attention_heads: 4,
        num_channels: 3,
        image_size: 40,
        patch_size: 8,
        layer_norm_eps: 1e-5,
        hidden_act: Activation::QuickGelu,
        projection_dim: 24,
    };
    assert_eq!(read("clip_vision"), VisionConfig::Clip(expected));
    // A CLIPModel's projection is its top-level projection_dim (vision_config says 512).
    let VisionConfig::Clip(full) = read("clip_full") else {
        panic!("clip_full is CLIP")
    };
    assert_eq!(
        (
            full.hidden_size,
            full.num_hidden_layers,
            full.projection_dim
        ),
        (40, 3, 20)
    );
}

#[test]
fn siglip_vision_only_and_full_models() {
    let VisionConfig::Siglip(vision) = read("siglip_vision") else {
        panic!("siglip_vision is SigLIP")
    };
    assert_eq!(
        vision,
        SiglipVisionConfig {
            hidden_size: 48,
            intermediate_size: 88,
            num_hidden_layers: 2,
            num_attention_heads: 4,
            image_size: 36,
            patch_size: 6,
            ..SiglipVisionConfig::default()
        }
    );
    let VisionConfig::Siglip(full) = read("siglip_full") else {
        panic!("siglip_full is SigLIP")
    };
    assert_eq!(
        (full.hidden_size, full.patch_size, full.image_size),
        (42, 5, 30)
    );
    assert_eq!(full.hidden_act, Activation::GeluTanh);
}

#[test]
fn dinov2_with_layerscale_and_its_mlp_ratio() {
    let VisionConfig::Dinov2(dinov2) = read("dinov2") else {
        panic!("dinov2 is DINOv2")
    };
    assert_eq!(
        dinov2,
        Dinov2Config {
            hidden_size: 40,
            num_hidden_layers: 2,
            num_attention_heads: 5,
            mlp_ratio: 3,
            image_size: 20,
            patch_size: 4,
            layerscale_value: 0.5,
            ..Dinov2Config::default()
        }
    );
    assert_eq!(dinov2.intermediate_size(), 120);
}

#[test]
fn released_sizes() {
    let b32 = ClipVisionConfig::vit_base_patch32();
    assert_eq!(
        (b32.hidden_size, b32.patch_size, b32.projection_dim),
        (768, 32, 512)
    );
    let so400m = SiglipVisionConfig::so400m_patch14_384();
    assert_eq!(
        (
            so400m.hidden_size,
            so400m.intermediate_size,
            so400m.num_hidden_layers
        ),
        (1152, 4304, 27)
    );
    assert_eq!((so400m.patch_size, so400m.image_size), (14, 384));
    assert_eq!(SiglipVisionConfig::base_patch16(256).image_size, 256);
    let small = Dinov2Config::small();
    assert_eq!((small.hidden_size, small.num_attention_heads), (384, 6));
    assert_eq!(Dinov2Config::large().intermediate_size(), 4096);
}

#[test]
fn unsupported_checkpoints_are_explained() {
    let err = VisionConfig::from_hf_config(fixture("siglip2_naflex"))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("NaFlex") && err.contains("config.json"),
        "{err}"
    );
    let err = VisionConfig::from_hf_json(r#"{"model_type": "vit"}"#)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("`vit`") && err.contains("siglip_vision_model"),
        "{err}"
    );
    let err = VisionConfig::from_hf_json(r#"{"model_type": "dinov2", "use_swiglu_ffn": true}"#)
        .unwrap_err()
        .to_string();
    assert!(err.contains("SwiGLU"), "{err}");
    let err =
        VisionConfig::from_hf_json(r#"{"model_type": "clip_vision_model", "hidden_act": "relu"}"#)
            .unwrap_err()
            .to_string();
    assert!(err.contains("relu"), "{err}");
    let err = VisionConfig::from_hf_json(
        r#"{"model_type": "siglip_vision_model", "hidden_size": 100, "num_attention_heads": 12}"#,
    )
    .unwrap_err()
    .to_string();
    assert!(
        err.contains("hidden_size = 100") && err.contains("num_attention_heads = 12"),
        "{err}"
    );
    let err = VisionConfig::from_hf_config(fixture("missing"))
        .unwrap_err()
        .to_string();
    assert!(err.contains("missing"), "{err}");
}
