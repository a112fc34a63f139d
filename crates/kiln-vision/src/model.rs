//! Any supported tower behind one type, chosen by the checkpoint's `config.json`: what examples
//! and the Monte-Carlo runner hold when the model is a command-line argument.

use std::path::Path;

use burn::module::Module;
use burn::tensor::Tensor;
use burn::tensor::backend::Backend;
use kiln_core::Policy;

use crate::VisionError;
use crate::clip::ClipVisionModel;
use crate::config::VisionConfig;
use crate::dinov2::Dinov2Model;
use crate::siglip::SiglipVisionModel;
use crate::tower::Tower;
use crate::weights::load_hf_weights;
use kiln_core::checkpoint_dir;
use kiln_transformer::{Draw, DropoutSites};

/// A loaded vision tower (boxed: the towers' module trees differ in size).
#[derive(Debug, Clone)]
pub enum VisionModel<B: Backend> {
    /// CLIP: embeddings are `image_embeds`.
    Clip(Box<ClipVisionModel<B>>),
    /// SigLIP / SigLIP2: embeddings are `pooler_output`.
    Siglip(Box<SiglipVisionModel<B>>),
    /// DINOv2: embeddings are `pooler_output` (the CLS token).
    Dinov2(Box<Dinov2Model<B>>),
}

impl<B: Backend> VisionModel<B> {
    /// Reads the checkpoint directory `dir` (config.json and weights) onto `device`, parameters
    /// in the policy's dtype.
    pub fn from_hf_dir(
        dir: impl AsRef<Path>,
        device: &B::Device,
        policy: &Policy,
    ) -> Result<Self, VisionError> {
        let dir = dir.as_ref();
        Ok(match VisionConfig::from_hf_config(dir)? {
            VisionConfig::Clip(c) => {
                VisionModel::Clip(Box::new(load_hf_weights(c.init(device), dir, policy)?))
            }
            VisionConfig::Siglip(c) => {
                VisionModel::Siglip(Box::new(load_hf_weights(c.init(device), dir, policy)?))
            }
            VisionConfig::Dinov2(c) => {
                VisionModel::Dinov2(Box::new(load_hf_weights(c.init(device), dir, policy)?))
            }
        })
    }

    /// A tower of `config` with burn's initialisation (random weights) on `device`, in f32.
    pub fn from_config(config: &VisionConfig, device: &B::Device) -> Self {
        match config {
            VisionConfig::Clip(c) => VisionModel::Clip(Box::new(c.init(device))),
            VisionConfig::Siglip(c) => VisionModel::Siglip(Box::new(c.init(device))),
            VisionConfig::Dinov2(c) => VisionModel::Dinov2(Box::new(c.init(device))),
        }
    }

    /// Parameters (weights and biases) in the tower.
    pub fn num_params(&self) -> usize {
        match self {
            VisionModel::Clip(m) => m.num_params(),
            VisionModel::Siglip(m) => m.num_params(),
            VisionModel::Dinov2(m) => m.num_params(),
        }
    }

    /// The model under `policy` (see [`Tower::with_policy`]).
    pub fn with_policy(self, policy: &Policy) -> Self {
        match self {
            VisionModel::Clip(m) => VisionModel::Clip(Box::new(m.with_policy(policy))),
            VisionModel::Siglip(m) => VisionModel::Siglip(Box::new(m.with_policy(policy))),
            VisionModel::Dinov2(m) => VisionModel::Dinov2(Box::new(m.with_policy(policy))),
        }
    }

    /// The tower's family as its paper names it: `CLIP`, `SigLIP` or `DINOv2`.
    pub fn family(&self) -> &'static str {
        match self {
            VisionModel::Clip(_) => "CLIP",
            VisionModel::Siglip(_) => "SigLIP",
            VisionModel::Dinov2(_) => "DINOv2",
        }
    }

    /// [`Self::from_hf_dir`] on what [`checkpoint_dir`] makes of `model`: a local directory, or
    /// with the `hub` feature a Hugging Face id (`org/name[@revision]`), fetched into the
    /// Hugging Face cache unless it is there already.
    pub fn from_pretrained(
        model: &str,
        device: &B::Device,
        policy: &Policy,
    ) -> Result<Self, VisionError> {
        Self::from_hf_dir(checkpoint_dir(model)?, device, policy)
    }

    /// The embeddings of normalised `pixels` `[batch, 3, H, W]`, `[batch, D]`, deterministic.
    pub fn forward(&self, pixels: Tensor<B, 4>) -> Tensor<B, 2> {
        match self {
            VisionModel::Clip(m) => m.forward(pixels),
            VisionModel::Siglip(m) => m.forward(pixels),
            VisionModel::Dinov2(m) => m.forward(pixels),
        }
    }

    /// Refuses pixels `[batch, channels, H, W]` the model cannot take ([`Tower::check_pixels`]).
    pub fn check_pixels(&self, dims: [usize; 4]) -> Result<(), VisionError> {
        match self {
            VisionModel::Clip(m) => m.check_pixels(dims),
            VisionModel::Siglip(m) => m.check_pixels(dims),
            VisionModel::Dinov2(m) => m.check_pixels(dims),
        }
    }

    /// The embeddings with Monte-Carlo dropout at the sites set by [`Self::with_dropout`], masks
    /// from `draw` (one or the same number of samples per image; see [`Tower::forward_sampled`]).
    pub fn forward_sampled(
        &self,
        pixels: Tensor<B, 4>,
        draw: &Draw,
    ) -> Result<Tensor<B, 2>, VisionError> {
        match self {
            VisionModel::Clip(m) => m.forward_sampled(pixels, draw),
            VisionModel::Siglip(m) => m.forward_sampled(pixels, draw),
            VisionModel::Dinov2(m) => m.forward_sampled(pixels, draw),
        }
    }

    /// The model with Monte-Carlo dropout at `sites` for [`Self::forward_sampled`].
    pub fn with_dropout(self, sites: DropoutSites) -> Result<Self, VisionError> {
        Ok(match self {
            VisionModel::Clip(m) => VisionModel::Clip(Box::new(m.with_dropout(sites)?)),
            VisionModel::Siglip(m) => VisionModel::Siglip(Box::new(m.with_dropout(sites)?)),
            VisionModel::Dinov2(m) => VisionModel::Dinov2(Box::new(m.with_dropout(sites)?)),
        })
    }
}
