//! Loading Hugging Face checkpoints: `model.safetensors`, or the shards a
//! `model.safetensors.index.json` names, stored in f32, f16 or bf16, through burn-store (PyTorch's
//! `[out, in]` linear weights and `weight` / `bias` norm names adapted). Keys a tower does not
//! have (a full model's text tower) are ignored; keys it needs and the file lacks, or of another
//! shape, are an error naming each one.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use burn::tensor::backend::Backend;
use burn_store::{ApplyError, ModuleSnapshot, PyTorchToBurnAdapter, SafetensorsStore};
use kiln_precision::Policy;

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

/// Loads the weights of the checkpoint directory `dir` into `model`, casts them to the policy's
/// parameter dtype and sets the policy the tower runs under.
pub fn load_hf_weights<B: Backend, M: Tower<B>>(
    mut model: M,
    dir: impl AsRef<Path>,
    policy: &Policy,
) -> Result<M, VisionError> {
    let dir = dir.as_ref();
    let expected: Vec<(String, Vec<usize>)> = model
        .collect(None, None, false)
        .iter()
        .map(|snapshot| (snapshot.full_path(), snapshot.shape.to_vec()))
        .collect();
    let mut applied = BTreeSet::new();
    let mut problems = Vec::new();
    for file in weight_files(dir)? {
        if !file.is_file() {
            return Err(VisionError::Weights(format!(
                "{}: missing shard",
                file.display()
            )));
        }
        let mut store = SafetensorsStore::from_file(&file)
            .with_from_adapter(PyTorchToBurnAdapter)
            .allow_partial(true);
        for (from, to) in M::key_remapping() {
            store = store.with_key_remapping(from, *to);
        }
        let result = model
            .load_from(&mut store)
            .map_err(|e| VisionError::Weights(format!("{}: {e}", file.display())))?;
        applied.extend(result.applied);
        problems.extend(result.errors.into_iter().map(|error| match error {
            ApplyError::ShapeMismatch {
                path,
                expected,
                found,
            } => format!("{path}: the model needs {expected:?}, the checkpoint has {found:?}"),
            other => format!("{other:?}"),
        }));
    }
    problems.extend(
        expected
            .iter()
            .filter(|(path, _)| !applied.contains(path))
            .map(|(path, shape)| format!("{path} {shape:?}: not in the checkpoint")),
    );
    if !problems.is_empty() {
        return Err(VisionError::Weights(format!(
            "{}: {} tensor(s) cannot be loaded:\n  {}",
            dir.display(),
            problems.len(),
            problems.join("\n  ")
        )));
    }
    Ok(model.with_policy(policy))
}
