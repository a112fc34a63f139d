//! Loading Hugging Face checkpoints into a tower ([`load_hf_weights`]), through kiln-core's
//! checked safetensors loader.

use std::path::Path;

use burn::tensor::backend::Backend;
use kiln_core::Policy;
use kiln_core::load_checkpoint;

use crate::VisionError;
use crate::tower::Tower;

/// Name prefixes of checkpoint tensors the towers leave alone on purpose (not warned about): the
/// other parts of a full vision-language model, and DINOv2's token for masked-image training.
const UNUSED_ON_PURPOSE: &[&str] = &[
    "text_model.",
    "text_projection.",
    "logit_scale",
    "logit_bias",
    "embeddings.mask_token",
];

/// Loads the weights of the checkpoint directory `dir` into `model`, casts them to the policy's
/// parameter dtype and sets the policy the tower runs under.
///
/// The checkpoint is checked first ([`kiln_core::check_checkpoint`]): a tensor the tower
/// needs that is missing, not floating-point, or of another shape is an error listing each in
/// the checkpoint's names and order, with the `config.json` settings behind the tower's sizes;
/// tensors the tower does not use are a warning (outside a full model's other tower).
pub fn load_hf_weights<B: Backend, M: Tower<B>>(
    model: M,
    dir: impl AsRef<Path>,
    policy: &Policy,
) -> Result<M, VisionError> {
    let model = load_checkpoint(model, dir.as_ref(), M::key_remapping(), UNUSED_ON_PURPOSE)?;
    Ok(model.with_policy(policy))
}
