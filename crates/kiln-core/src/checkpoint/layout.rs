//! PyTorch's tensor names and layouts, as a checkpoint stores them.

use burn_store::{BurnToPyTorchAdapter, ModuleAdapter, PyTorchToBurnAdapter, TensorSnapshot};

#[cfg(doc)]
use burn_store::SafetensorsStore;

/// PyTorch's names and layouts, as burn-store's adapters give them (a linear weight `[out, in]`,
/// a norm's `weight` and `bias`), RMSNorm included: burn calls its scale `gamma` and burn-store
/// renames only batch, layer and group norms, so without this a Llama's `model.norm.weight`
/// would be saved, looked for and named as `model.norm.gamma`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TorchLayout {
    /// Checkpoint → burn: [`SafetensorsStore::with_from_adapter`].
    Load,
    /// burn → checkpoint: [`SafetensorsStore::with_to_adapter`], and the names a checkpoint is
    /// checked in.
    Save,
}

/// burn's module type of an RMSNorm, as burn-store's snapshots record it.
const RMS_NORM: &str = "Struct:RmsNorm";

impl ModuleAdapter for TorchLayout {
    fn adapt(&self, snapshot: &TensorSnapshot) -> TensorSnapshot {
        match self {
            TorchLayout::Load => PyTorchToBurnAdapter.adapt(snapshot),
            TorchLayout::Save => {
                let torch = BurnToPyTorchAdapter.adapt(snapshot);
                let mut path = torch.path_stack.clone().unwrap_or_default();
                let is_rms_scale = torch.module_type().as_deref() == Some(RMS_NORM)
                    && path.last().is_some_and(|name| name == "gamma");
                if !is_rms_scale {
                    return torch;
                }
                *path.last_mut().expect("a parameter's path names it") = "weight".into();
                TensorSnapshot::from_closure(
                    torch.clone_data_fn(),
                    torch.dtype,
                    torch.shape.clone(),
                    path,
                    torch.container_stack.clone().unwrap_or_default(),
                    torch.tensor_id.unwrap_or_default(),
                )
            }
        }
    }

    fn get_alternative_param_name(&self, param_name: &str, container_type: &str) -> Option<String> {
        match self {
            TorchLayout::Load if container_type == RMS_NORM && param_name == "gamma" => {
                Some("weight".into())
            }
            TorchLayout::Load => {
                PyTorchToBurnAdapter.get_alternative_param_name(param_name, container_type)
            }
            TorchLayout::Save => None,
        }
    }

    fn clone_box(&self) -> Box<dyn ModuleAdapter> {
        Box::new(*self)
    }
}
