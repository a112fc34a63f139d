//! Loading Hugging Face checkpoints: `model.safetensors`, or the shards a
//! `model.safetensors.index.json` names, stored in f32, f16 or bf16, through burn-store (PyTorch's
//! `[out, in]` linear weights and `weight` / `bias` norm names adapted), after a check of the
//! whole checkpoint against the model ([`load_checkpoint`]).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use burn::module::Module;
use burn::tensor::backend::Backend;
use burn_store::{ModuleSnapshot, SafetensorsStore};
use kiln_precision::{TorchLayout, check_checkpoint};

/// A checkpoint that cannot be loaded; the message names the files and tensors involved.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{0}")]
pub struct CheckpointError(pub String);

/// The text of `config.json` at `path` (a checkpoint directory holding one, or the file itself),
/// and the file read.
pub fn read_config(path: &Path) -> Result<(PathBuf, String), CheckpointError> {
    let file = if path.is_dir() {
        path.join("config.json")
    } else {
        path.to_path_buf()
    };
    let text = kiln_io::read_text(&file).map_err(|e| CheckpointError(e.to_string()))?;
    Ok((file, text))
}

/// The weight files of the checkpoint in `dir`.
pub fn weight_files(dir: &Path) -> Result<Vec<PathBuf>, CheckpointError> {
    let single = dir.join("model.safetensors");
    if single.is_file() {
        return Ok(vec![single]);
    }
    let index = dir.join("model.safetensors.index.json");
    if !index.is_file() {
        return Err(CheckpointError(format!(
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
pub fn shards(index: &Path) -> Result<Vec<String>, CheckpointError> {
    let text = std::fs::read_to_string(index)
        .map_err(|e| CheckpointError(format!("{}: {e}", index.display())))?;
    let json: serde_json::Value = serde_json::from_str(&text)
        .map_err(|e| CheckpointError(format!("{}: {e}", index.display())))?;
    let files: BTreeSet<String> = json
        .get("weight_map")
        .and_then(|map| map.as_object())
        .ok_or_else(|| CheckpointError(format!("{}: no weight_map", index.display())))?
        .values()
        .filter_map(|file| file.as_str().map(str::to_string))
        .collect();
    Ok(files.into_iter().collect())
}

/// Loads the weights of the checkpoint directory `dir` into `model`, its keys rewritten by the
/// regular expressions of `remapping` (checkpoint name → parameter path), in the dtypes the
/// checkpoint stores.
///
/// The checkpoint is checked first ([`kiln_precision::check_checkpoint`]): a tensor the model
/// needs that is missing, not floating-point, or of another shape is an error listing each in
/// the checkpoint's names and order, with the `config.json` settings behind the model's sizes;
/// tensors the model does not use are a warning, except those under the prefixes
/// `unused_on_purpose`.
pub fn load_checkpoint<B: Backend, M: Module<B>>(
    mut model: M,
    dir: &Path,
    remapping: &[(&str, &str)],
    unused_on_purpose: &[&str],
) -> Result<M, CheckpointError> {
    let files = weight_files(dir)?;
    if let Some(missing) = files.iter().find(|file| !file.is_file()) {
        return Err(CheckpointError(format!(
            "{}: missing shard",
            missing.display()
        )));
    }
    let config = std::fs::read_to_string(dir.join("config.json"))
        .ok()
        .and_then(|text| serde_json::from_str(&text).ok());
    let paths: Vec<&Path> = files.iter().map(PathBuf::as_path).collect();
    let fit = check_checkpoint(&model, &paths, remapping, config.as_ref()).map_err(|problems| {
        CheckpointError(format!(
            "{}: {} tensor(s) cannot be loaded:\n  {}",
            dir.display(),
            problems.lines().count(),
            problems.replace('\n', "\n  ")
        ))
    })?;
    if let Some(unused) = fit.unexpected(unused_on_purpose) {
        log::warn!(
            "{}: tensors the model does not use: {unused}",
            dir.display()
        );
    }
    for file in &files {
        let mut store = SafetensorsStore::from_file(file)
            .with_from_adapter(TorchLayout::Load)
            .allow_partial(true);
        for (from, to) in remapping {
            store = store.with_key_remapping(from, *to);
        }
        let result = model
            .load_from(&mut store)
            .map_err(|e| CheckpointError(format!("{}: {e}", file.display())))?;
        if let Some(error) = result.errors.first() {
            return Err(CheckpointError(format!("{}: {error:?}", file.display())));
        }
    }
    Ok(model)
}
