//! kiln's own saved models: `config.json` and `model.safetensors` in PyTorch's names and layouts.

use std::path::Path;

use burn::module::Module;
use burn::tensor::backend::Backend;
use burn_store::{ModuleSnapshot, SafetensorsStore};

use super::{CheckpointError, TorchLayout};

/// Writes `config` (JSON text) as `dir/config.json` and `module`'s parameters, in f32 and
/// PyTorch's layouts, as `dir/model.safetensors`, creating `dir`: kiln's own saved models. Each
/// file is replaced whole or not at all; the error names the path.
pub fn save_checkpoint<B: Backend, M: Module<B>>(
    module: &M,
    config: &str,
    dir: &Path,
) -> Result<(), CheckpointError> {
    std::fs::create_dir_all(dir).map_err(|e| kiln_io::FileError::io(dir, e))?;
    let config = format!("{}\n", config.trim_end());
    kiln_io::write_atomic(&dir.join("config.json"), config.as_bytes())?;
    save_weights(module, &dir.join("model.safetensors"), &[])
}

/// Writes `module`'s parameters, in f32 and PyTorch's layouts, as the safetensors file `file`,
/// their paths rewritten by the regular expressions of `remapping` (parameter path → name in
/// the file, applied in order): the weights of [`save_checkpoint`], or a checkpoint in another
/// program's names. The file is replaced whole or not at all; the error names it.
pub fn save_weights<B: Backend, M: Module<B>>(
    module: &M,
    file: &Path,
    remapping: &[(&str, &str)],
) -> Result<(), CheckpointError> {
    kiln_io::write_atomic_at(file, |temporary| {
        let mut store = SafetensorsStore::from_file(temporary)
            .with_to_adapter(TorchLayout::Save)
            .overwrite(true);
        for (from, to) in remapping {
            store = store.with_key_remapping(from, *to);
        }
        crate::cast_module(module.clone(), crate::Precision::F32).save_into(&mut store)
    })?;
    Ok(())
}
