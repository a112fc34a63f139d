//! Reading a model from a Hugging Face checkpoint directory.

use std::path::Path;

use burn::tensor::backend::Backend;
use kiln_core::{Policy, checkpoint_dir, load_checkpoint};

use crate::TextError;
use crate::config::TextConfig;
use crate::llama::CausalLm;

impl<B: Backend> CausalLm<B> {
    /// Reads the checkpoint directory `dir` (config.json and the weights, single or sharded,
    /// f32/f16/bf16) onto `device`, parameters in the policy's dtype. Every tensor the model
    /// needs that is missing or of another shape is named in the error.
    pub fn from_hf_dir(
        dir: impl AsRef<Path>,
        device: &B::Device,
        policy: &Policy,
    ) -> Result<Self, TextError> {
        let dir = dir.as_ref();
        let config = TextConfig::from_hf_config(dir)?;
        // A tied checkpoint may still store `lm_head.weight` (a copy of the embeddings); older
        // ones store RoPE's frequencies, which kiln computes.
        let unused: &[&str] = if config.tie_word_embeddings {
            &["lm_head.", "model.rotary_emb."]
        } else {
            &["model.rotary_emb."]
        };
        let model = load_checkpoint(config.init::<B>(device), dir, &[], unused)?;
        Ok(model.with_norm_weights_folded().with_policy(policy))
    }

    /// [`Self::from_hf_dir`] on what [`checkpoint_dir`] makes of `model`: a local directory, or
    /// with the `hub` feature a Hugging Face id (`org/name[@revision]`), fetched into the
    /// Hugging Face cache unless it is there already.
    pub fn from_pretrained(
        model: &str,
        device: &B::Device,
        policy: &Policy,
    ) -> Result<Self, TextError> {
        Self::from_hf_dir(checkpoint_dir(model)?, device, policy)
    }
}
