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
    kiln_io::write_atomic_at(&dir.join("model.safetensors"), |temporary| {
        let mut store = SafetensorsStore::from_file(temporary)
            .with_to_adapter(TorchLayout::Save)
            .overwrite(true);
        crate::cast_module(module.clone(), crate::Precision::F32).save_into(&mut store)
    })?;
    Ok(())
}
