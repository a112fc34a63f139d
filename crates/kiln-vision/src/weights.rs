//! Loading Hugging Face checkpoints: `model.safetensors`, or the shards a
//! `model.safetensors.index.json` names, stored in f32, f16 or bf16, through burn-store (PyTorch's
//! `[out, in]` linear weights and `weight` / `bias` norm names adapted), after a check of the
//! whole checkpoint against the tower ([`load_hf_weights`]).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use burn::tensor::backend::Backend;
use burn_store::{ModuleSnapshot, PyTorchToBurnAdapter, SafetensorsStore};
use kiln_precision::{Policy, check_checkpoint};

use crate::VisionError;
use crate::tower::Tower;

/// The weight files of the checkpoint in `dir`.
fn weight_files(dir: &Path) -> Result<Vec<PathBuf>, VisionError> {
    let single = dir.join("model.safetensors");
    if single.is_file() {
        return Ok(vec![single]);
    }
    let index = dir.join("model.safetensors.index.json");
    if !index.is_file() {
        return Err(VisionError::Weights(format!(
            "{}: neither model.safetensors nor model.safetensors.index.json",
            dir.display()
        )));
    }
    Ok(shards(&index)?
        .into_iter()
        .map(|file| dir.join(file))
        .collect())
}

/// The shard files a `model.safetensors.index.json` names, each once, sorted.
pub(crate) fn shards(index: &Path) -> Result<Vec<String>, VisionError> {
    let text = std::fs::read_to_string(index)
        .map_err(|e| VisionError::Weights(format!("{}: {e}", index.display())))?;
    let json: serde_json::Value = serde_json::from_str(&text)
        .map_err(|e| VisionError::Weights(format!("{}: {e}", index.display())))?;
    let files: BTreeSet<String> = json
        .get("weight_map")
        .and_then(|map| map.as_object())
        .ok_or_else(|| VisionError::Weights(format!("{}: no weight_map", index.display())))?
        .values()
        .filter_map(|file| file.as_str().map(str::to_string))
        .collect();
    Ok(files.into_iter().collect())
}

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
/// The checkpoint is checked first ([`kiln_precision::check_checkpoint`]): a tensor the tower
/// needs that is missing, not floating-point, or of another shape is an error listing each in
/// the checkpoint's names and order, with the `config.json` settings behind the tower's sizes;
/// tensors the tower does not use are a warning (outside a full model's other tower).
pub fn load_hf_weights<B: Backend, M: Tower<B>>(
    mut model: M,
    dir: impl AsRef<Path>,
    policy: &Policy,
) -> Result<M, VisionError> {
    let dir = dir.as_ref();
    let files = weight_files(dir)?;
    if let Some(missing) = files.iter().find(|file| !file.is_file()) {
        return Err(VisionError::Weights(format!(
            "{}: missing shard",
            missing.display()
        )));
    }
    let config = std::fs::read_to_string(dir.join("config.json"))
        .ok()
        .and_then(|text| serde_json::from_str(&text).ok());
    let paths: Vec<&Path> = files.iter().map(PathBuf::as_path).collect();
    let fit = check_checkpoint(&model, &paths, M::key_remapping(), config.as_ref()).map_err(
        |problems| {
            VisionError::Weights(format!(
                "{}: {} tensor(s) cannot be loaded:\n  {}",
                dir.display(),
                problems.lines().count(),
                problems.replace('\n', "\n  ")
            ))
        },
    )?;
    if let Some(unused) = fit.unexpected(UNUSED_ON_PURPOSE) {
        log::warn!(
            "{}: tensors the model does not use: {unused}",
            dir.display()
        );
    }
    for file in &files {
        let mut store = SafetensorsStore::from_file(file)
            .with_from_adapter(PyTorchToBurnAdapter)
            .allow_partial(true);
        for (from, to) in M::key_remapping() {
            store = store.with_key_remapping(from, *to);
        }
        let result = model
            .load_from(&mut store)
            .map_err(|e| VisionError::Weights(format!("{}: {e}", file.display())))?;
        if let Some(error) = result.errors.first() {
            return Err(VisionError::Weights(format!(
                "{}: {error:?}",
                file.display()
            )));
        }
    }
    Ok(model.with_policy(policy))
}
