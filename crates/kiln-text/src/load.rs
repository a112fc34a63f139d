//! Reading a model from a Hugging Face checkpoint directory.

use std::path::Path;

use burn::tensor::backend::Backend;
use kiln_core::{Policy, checkpoint_dir, load_checkpoint, load_checkpoint_keeping};

use crate::config::TextConfig;
use crate::llama::CausalLm;
use crate::stored::{StoredMatrices, check_kept_matrices_serve};
use crate::{TextError, Weights};

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
        let unused = config.unused_tensors();
        let model = load_checkpoint(config.init::<B>(device), dir, &[], unused)?;
        Ok(model.with_norm_weights_folded().with_policy(policy))
    }

    /// [`Self::from_hf_dir`] with the weights held as `weights` says: [`Weights::F32`] as
    /// `from_hf_dir` reads them; [`Weights::Bf16`] with the projections', output head's and
    /// token embeddings' matrices rounded to bf16 as each is read (a bf16 checkpoint's taken as
    /// they are), never held in f32, for the CPU's products: half the bytes a decoded token
    /// reads. A directory holds nothing to keep as stored: [`Weights::AsStored`] is refused.
    ///
    /// ```no_run
    /// use burn::backend::Flex;
    /// use kiln_core::Policy;
    /// use kiln_text::{CausalLm, Weights};
    ///
    /// let device = Default::default();
    /// let dir = "SmolLM2-135M-Instruct";
    /// let model = CausalLm::<Flex>::from_hf_dir_with(dir, &device, &Policy::full(), Weights::Bf16)?;
    /// println!("{} MB of bf16 matrices", model.stored_weights().stored_bytes() / 1_000_000);
    /// # Ok::<(), kiln_text::TextError>(())
    /// ```
    pub fn from_hf_dir_with(
        dir: impl AsRef<Path>,
        device: &B::Device,
        policy: &Policy,
        weights: Weights,
    ) -> Result<Self, TextError> {
        let dir = dir.as_ref();
        match weights {
            Weights::F32 => return Self::from_hf_dir(dir, device, policy),
            Weights::AsStored => {
                return Err(TextError::Config(format!(
                    "{}: a Hugging Face directory's weights are read as f32 (weights f32) or \
                     rounded to bf16 (weights bf16); as-stored is for GGUF files",
                    dir.display()
                )));
            }
            Weights::Bf16 => {}
        }
        check_kept_matrices_serve::<B>(&dir.display().to_string(), device, policy)?;
        let config = TextConfig::from_hf_config(dir)?;
        let unused = config.unused_tensors();
        let stored = StoredMatrices::read_bf16(dir, &config)?;
        let model = config.init::<B>(device);
        let model = load_checkpoint_keeping(model, dir, &[], unused, &stored.names())?;
        Ok(stored
            .put_into(model.with_norm_weights_folded())
            .with_policy(policy))
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

impl TextConfig {
    /// The tensors a checkpoint may hold that the model does not read: a tied checkpoint may
    /// still store `lm_head.weight` (a copy of the embeddings); older ones store RoPE's
    /// frequencies, which kiln computes.
    fn unused_tensors(&self) -> &'static [&'static str] {
        if self.tie_word_embeddings {
            &["lm_head.", "model.rotary_emb."]
        } else {
            &["model.rotary_emb."]
        }
    }
}
