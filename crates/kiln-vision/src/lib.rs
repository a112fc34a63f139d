//! # kiln-vision
//!
//! The vision towers kiln's Monte-Carlo and foveated workloads run: CLIP (ViT-B/32, L/14),
//! SigLIP and the fixed-resolution SigLIP2 checkpoints (B/16, so400m), and DINOv2, read from
//! Hugging Face checkpoints and checked against transformers (the fixtures in `tests/fixtures`
//! and what a port must match are described in `tests/fixtures/README.md`).
//!
//! ```no_run
//! use burn::backend::Flex;
//! use kiln_precision::Policy;
//! use kiln_vision::{VisionConfig, load_hf_weights};
//!
//! let dir = "clip-vit-base-patch32";
//! let VisionConfig::Clip(config) = VisionConfig::from_hf_config(dir)? else { panic!("not CLIP") };
//! let device = Default::default();
//! let clip = load_hf_weights(config.init::<Flex>(&device), dir, &Policy::full())?;
//! # Ok::<(), kiln_vision::VisionError>(())
//! ```
//!
//! Next: Monte-Carlo dropout sites, precision policies inside the towers, other backends'
//! parity runs, and the `embed` example.

mod attention;
mod clip;
mod config;
mod dinov2;
mod encoder;
mod model;
mod patches;
mod siglip;
mod weights;

pub use attention::multi_head_attention;
pub use clip::{ClipEmbeddings, ClipOutput, ClipVisionModel, ClipVisionTransformer};
pub use config::{
    Activation, ClipVisionConfig, Dinov2Config, MODEL_TYPES, SiglipVisionConfig, VisionConfig,
};
pub use dinov2::{
    AttentionOutput, Dinov2Attention, Dinov2Embeddings, Dinov2Encoder, Dinov2Layer, Dinov2Model,
    Dinov2Output, LayerScale, PatchEmbeddings, QueryKeyValue,
};
pub use encoder::{Encoder, EncoderLayer, Mlp, SelfAttention};
pub use model::VisionModel;
pub use siglip::{
    FusedAttention, PoolingHead, SiglipEmbeddings, SiglipOutput, SiglipVisionModel,
    SiglipVisionTransformer,
};
pub use weights::{HfModule, load_hf_weights};

/// Why a checkpoint cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum VisionError {
    /// A `config.json` kiln cannot use.
    #[error("{0}")]
    Config(String),
    /// Weights that cannot be loaded.
    #[error("{0}")]
    Weights(String),
}
