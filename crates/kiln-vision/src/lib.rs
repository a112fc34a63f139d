//! # kiln-vision
//!
//! The vision towers kiln's Monte-Carlo and foveated workloads run: CLIP (ViT-B/32, L/14),
//! SigLIP and the fixed-resolution SigLIP2 checkpoints (B/16, so400m), and DINOv2, read from
//! Hugging Face checkpoints and checked against transformers (the fixtures in `tests/fixtures`
//! and what a port must match are described in `tests/fixtures/README.md`).
//!
//! This first part reads the checkpoints' configurations; the towers follow.

mod config;

pub use config::{
    Activation, ClipVisionConfig, Dinov2Config, MODEL_TYPES, SiglipVisionConfig, VisionConfig,
};

/// Why a checkpoint cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum VisionError {
    /// A `config.json` kiln cannot use.
    #[error("{0}")]
    Config(String),
}
