//! # kiln-vision
//!
//! The vision towers kiln's Monte-Carlo and foveated workloads run: CLIP (ViT-B/32, L/14),
//! SigLIP and the fixed-resolution SigLIP2 checkpoints (B/16, so400m), and DINOv2, read from
//! Hugging Face checkpoints and checked against transformers (the fixtures in `tests/fixtures`
//! and what a port must match are described in `tests/fixtures/README.md`).
//!
//! ```no_run
//! use burn::backend::Flex;
//! use burn::tensor::Tensor;
//! use kiln_core::Policy;
//! use kiln_vision::{DropoutSites, Draw, VisionModel};
//!
//! let device = Default::default();
//! // Any supported checkpoint directory: its config.json picks the tower.
//! let model = VisionModel::<Flex>::from_hf_dir("clip-vit-base-patch32", &device, &Policy::full())?
//!     .with_dropout("attention_probs=0.1,mlp_hidden=0.1".parse::<DropoutSites>()?)?;
//! let pixels = Tensor::<Flex, 4>::zeros([2, 3, 224, 224], &device); // normalised images
//! let embeddings = model.forward(pixels.clone()); // deterministic, [2, 512]
//! // Monte-Carlo pass 3 of images 17 and 18: each row's masks come from (seed, image id, pass).
//! let draw = Draw::pass(0, 3, [17, 18]);
//! let sample = model.forward_sampled(pixels, &draw)?;
//! # Ok::<(), kiln_vision::VisionError>(())
//! ```
//!
//! Each tower runs under its [`TowerSettings`]: the precision policy it was loaded with
//! (parameters cast once at load; a mixed policy computes with a compute-dtype copy per forward;
//! norms and softmax in f32) and its Monte-Carlo [`DropoutSites`], drawn by kiln on the host so a
//! [`Draw`] gives the same masks on every backend and in every batch.

mod clip;
mod config;
mod dinov2;
mod encoder;
mod model;
mod patches;
mod presets;
mod siglip;
mod tower;
mod weights;

pub use clip::{
    ClipEmbeddings, ClipOutput, ClipVisionConfig, ClipVisionModel, ClipVisionTransformer,
};
pub use config::{MODEL_TYPES, TowerConfig, TowerShape, VisionConfig};
pub use dinov2::{
    AttentionOutput, Dinov2Attention, Dinov2Config, Dinov2Embeddings, Dinov2Encoder, Dinov2Layer,
    Dinov2Model, Dinov2Output, Dinov2Patches, LayerScale, PatchEmbeddings, QueryKeyValue, Reading,
};
pub use encoder::{Encoder, EncoderLayer, Mlp, SelfAttention};
use kiln_core::CheckpointError;
pub use kiln_transformer::{
    Activation, Draw, DropoutError, DropoutSites, Sample, Settings as TowerSettings,
};
pub use model::VisionModel;
pub use presets::{PRESETS, Preset, Processor};
pub use siglip::{
    FusedAttention, PoolingHead, SiglipEmbeddings, SiglipOutput, SiglipVisionConfig,
    SiglipVisionModel, SiglipVisionTransformer,
};
pub use tower::{Embedder, Tower};
pub use weights::load_hf_weights;

/// Why a checkpoint cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum VisionError {
    /// A `config.json` kiln cannot use.
    #[error("{0}")]
    Config(String),
    /// A checkpoint that cannot be found, read or loaded (which tensors, which file).
    #[error(transparent)]
    Checkpoint(#[from] CheckpointError),
    /// Dropout rates or a draw that cannot be used.
    #[error(transparent)]
    Dropout(#[from] DropoutError),
    /// Pixels the model cannot take (count, channels or size).
    #[error("{0}")]
    Pixels(String),
    /// Queries that do not fit the patches they read (`Dinov2Model::read`).
    #[error("{0}")]
    Queries(String),
    /// A preset name that is not one of [`PRESETS`].
    #[error("unknown model `{name}`: expected {}", PRESETS.join(", "))]
    UnknownPreset {
        /// The name asked for.
        name: String,
    },
}
