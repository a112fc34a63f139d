//! The whole model in one directory, kiln's own format: `config.json` (the foveated settings and
//! both backbones' shapes) and `model.safetensors` (every parameter in f32, PyTorch's layouts,
//! the backbones' tensors under `dino.` and `lm.` in their Hugging Face names, the connectors
//! under `connectors.` in fVLM's).

use std::path::Path;

use burn::tensor::backend::Backend;
use kiln_core::{Policy, checkpoint_dir, load_checkpoint, read_config, save_checkpoint};
use kiln_text::TextConfig;
use kiln_vision::{Dinov2Config, Tower};
use serde::{Deserialize, Serialize};

use crate::{FoveatedConfig, FoveatedError, FoveatedModel};

/// `config.json` of a saved model.
#[derive(Debug, Serialize, Deserialize)]
struct Saved {
    foveated: FoveatedConfig,
    dino: Dinov2Config,
    lm: TextConfig,
}

impl<B: Backend> FoveatedModel<B> {
    /// Writes `config.json` and `model.safetensors` into `dir` (created if needed), each
    /// replaced whole or not at all; [`FoveatedModel::load`] reads them back.
    pub fn save(&self, dir: impl AsRef<Path>) -> Result<(), FoveatedError> {
        let dir = dir.as_ref();
        let saved = Saved {
            foveated: self.config().clone(),
            dino: self.dino.config().clone(),
            lm: self.lm.config().clone(),
        };
        let config = serde_json::to_string_pretty(&saved)
            .map_err(|e| FoveatedError::Config(format!("{}: {e}", dir.display())))?;
        Ok(save_checkpoint(self, &config, dir)?)
    }

    /// The model [`FoveatedModel::save`] wrote into `dir`, its backbones running under `policy`.
    pub fn load(
        dir: impl AsRef<Path>,
        device: &B::Device,
        policy: &Policy,
    ) -> Result<Self, FoveatedError> {
        let dir = dir.as_ref();
        let (file, json) = read_config::<serde_json::Value>(dir)?;
        let saved: Saved = serde_json::from_value(json).map_err(|e| {
            FoveatedError::Config(format!(
                "{}: not a saved foveated model ({e}); Hugging Face backbone directories load \
                 with FoveatedModel::from_dirs",
                file.display()
            ))
        })?;
        let model = Self::new(
            saved.dino.init(device),
            saved.lm.init(device),
            saved.foveated,
            device,
        )?;
        let mut model = load_checkpoint(model, dir, &[], &[])?;
        model.dino = model.dino.with_policy(policy);
        model.lm = model.lm.with_policy(policy);
        Ok(model)
    }

    /// [`Self::load`] on what [`checkpoint_dir`] makes of `model`: a local directory, or with
    /// the `hub` feature a Hugging Face id (`org/name[@revision]`) of a model kiln saved.
    pub fn from_pretrained(
        model: &str,
        device: &B::Device,
        policy: &Policy,
    ) -> Result<Self, FoveatedError> {
        Self::load(checkpoint_dir(model)?, device, policy)
    }
}
