//! PyTorch's tensor names and layouts, as a checkpoint stores them.

use std::rc::Rc;

use burn::tensor::{DType, Element, TensorData};
use burn_store::{BurnToPyTorchAdapter, ModuleAdapter, PyTorchToBurnAdapter, TensorSnapshot};
use half::{bf16, f16};

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
/// burn's module type of a linear layer.
const LINEAR: &str = "Struct:Linear";

impl ModuleAdapter for TorchLayout {
    fn adapt(&self, snapshot: &TensorSnapshot) -> TensorSnapshot {
        match self {
            TorchLayout::Load if is_linear_weight(snapshot) => transposed(snapshot),
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

/// Whether `snapshot` is a linear layer's weight, which PyTorch stores `[out, in]` and burn
/// `[in, out]`.
fn is_linear_weight(snapshot: &TensorSnapshot) -> bool {
    snapshot.module_type().as_deref() == Some(LINEAR)
        && snapshot.shape.len() == 2
        && snapshot
            .path_stack
            .as_ref()
            .and_then(|path| path.last())
            .is_some_and(|name| name == "weight")
}

/// A linear weight transposed as it is read: by blocks of values of its dtype (burn-store's own
/// adapter copies element by element, with a `memcpy` call each: 40% of loading a GGUF model).
fn transposed(snapshot: &TensorSnapshot) -> TensorSnapshot {
    let slow = PyTorchToBurnAdapter.adapt(snapshot);
    let read = snapshot.clone_data_fn();
    let [rows, columns] = [snapshot.shape[0], snapshot.shape[1]];
    let fast = move |data: &TensorData| match data.dtype {
        DType::F32 => swap_axes::<f32>(data, rows, columns),
        DType::F64 => swap_axes::<f64>(data, rows, columns),
        DType::F16 => swap_axes::<f16>(data, rows, columns),
        DType::BF16 => swap_axes::<bf16>(data, rows, columns),
        _ => None,
    };
    let slow_read = slow.clone_data_fn();
    TensorSnapshot::from_closure(
        Rc::new(move || {
            let data = read()?;
            match fast(&data) {
                Some(swapped) => Ok(swapped),
                None => slow_read(),
            }
        }),
        slow.dtype,
        slow.shape.clone(),
        slow.path_stack.clone().unwrap_or_default(),
        slow.container_stack.clone().unwrap_or_default(),
        slow.tensor_id.unwrap_or_default(),
    )
}

/// The `[rows, columns]` matrix `data` as `[columns, rows]`, when its values can be read as `T`
/// in place.
fn swap_axes<T: Element + Default>(
    data: &TensorData,
    rows: usize,
    columns: usize,
) -> Option<TensorData> {
    const BLOCK: usize = 32;
    let values = data.as_slice::<T>().ok()?;
    if values.len() != rows * columns {
        return None;
    }
    let mut out = vec![T::default(); values.len()];
    for first_row in (0..rows).step_by(BLOCK) {
        for first_column in (0..columns).step_by(BLOCK) {
            for row in first_row..(first_row + BLOCK).min(rows) {
                for column in first_column..(first_column + BLOCK).min(columns) {
                    out[column * rows + row] = values[row * columns + column];
                }
            }
        }
    }
    Some(TensorData::new(out, [columns, rows]))
}
