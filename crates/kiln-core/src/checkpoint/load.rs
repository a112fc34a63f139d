//! Hugging Face checkpoints loaded into a model: `model.safetensors`, or the shards a
//! `model.safetensors.index.json` names, stored in f32, f16 or bf16, through burn-store
//! (PyTorch's `[out, in]` linear weights and `weight` / `bias` norm names adapted), after a
//! check of the whole checkpoint against the model.

use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::rc::Rc;

use burn::module::{Module, ParamId};
use burn::tensor::backend::Backend;
use burn::tensor::{BoolStore, DType, TensorData};
use burn_store::{KeyRemapper, ModuleSnapshot, TensorSnapshot, TensorSnapshotError};
use serde_json::Value;

use super::check::non_finite_values;
use super::{CheckpointError, Problem, TensorProblem, TorchLayout, check_snapshots};
use kiln_io::InputFile;

use crate::check_memory;
use crate::footprint::parameter_device;

#[cfg(doc)]
use super::check_checkpoint;

const SINGLE: &str = "model.safetensors";
const INDEX: &str = "model.safetensors.index.json";

/// The weight files of the checkpoint in `dir`: `model.safetensors`, or the shards its index
/// names.
pub fn weight_files(dir: &Path) -> Result<Vec<PathBuf>, CheckpointError> {
    let single = dir.join(SINGLE);
    if single.is_file() {
        return Ok(vec![single]);
    }
    let index = dir.join(INDEX);
    if !index.is_file() {
        return Err(CheckpointError::NoWeights {
            dir: dir.to_path_buf(),
        });
    }
    Ok(shards(&index)?
        .into_iter()
        .map(|file| dir.join(file))
        .collect())
}

/// What identifies the weights of the checkpoint in `dir` without reading them: the directory,
/// then the size and modification time (seconds since 1970) of `model.safetensors` (of the
/// index, for a sharded checkpoint), as `DIR (N bytes, modified T)`; `DIR ()` where there is
/// no weight file. Runs record it beside their results, so resuming with other weights is
/// noticed.
pub fn weights_identity(dir: &Path) -> String {
    let stamp = [SINGLE, INDEX]
        .iter()
        .map(|file| dir.join(file))
        .find(|path| path.exists())
        .and_then(|path| std::fs::metadata(path).ok())
        .map(|meta| {
            let modified = meta
                .modified()
                .ok()
                .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
                .map_or(0, |d| d.as_secs());
            format!("{} bytes, modified {modified}", meta.len())
        })
        .unwrap_or_default();
    format!("{} ({stamp})", dir.display())
}

/// The shard files a `model.safetensors.index.json` names, each once, sorted.
pub fn shards(index: &Path) -> Result<Vec<String>, CheckpointError> {
    let text = kiln_io::read_text(index).map_err(|e| CheckpointError::read(index, e))?;
    let json: serde_json::Value =
        serde_json::from_str(&text).map_err(|e| CheckpointError::unreadable(index, e))?;
    let files: BTreeSet<String> = json
        .get("weight_map")
        .and_then(|map| map.as_object())
        .ok_or_else(|| CheckpointError::unreadable(index, "no weight_map"))?
        .values()
        .filter_map(|file| file.as_str().map(str::to_string))
        .collect();
    Ok(files.into_iter().collect())
}

/// Loads the weights of the checkpoint directory `dir` into `model`, its keys rewritten by the
/// regular expressions of `remapping` (checkpoint name → parameter path), in the dtypes the
/// checkpoint stores.
///
/// The checkpoint is checked first: a tensor the model needs that is missing, not
/// floating-point, or of another shape is an error listing each in the checkpoint's names and
/// order, with the `config.json` settings behind the model's sizes ([`check_checkpoint`] makes
/// the same check without loading); tensors the model does not use are a warning, except those
/// under the prefixes `unused_on_purpose`. The memory the model's tensors take is checked
/// against what the device has; each tensor is then read from the file only as it is loaded
/// and checked finite: loading holds the model once, not the model and the file.
pub fn load_checkpoint<B: Backend, M: Module<B>>(
    model: M,
    dir: &Path,
    remapping: &[(&str, &str)],
    unused_on_purpose: &[&str],
) -> Result<M, CheckpointError> {
    load_checkpoint_keeping(model, dir, remapping, unused_on_purpose, &[])
}

/// [`load_checkpoint`] but for the tensors named in `kept` (their names in the checkpoint):
/// those are checked against the model's names and shapes like the others, but neither read nor
/// loaded nor counted in the memory the load needs. Their parameters are left as the model has
/// them, for the caller to replace (matrices kept rounded to bf16, read by [`read_tensor`]).
pub fn load_checkpoint_keeping<B: Backend, M: Module<B>>(
    model: M,
    dir: &Path,
    remapping: &[(&str, &str)],
    unused_on_purpose: &[&str],
    kept: &[String],
) -> Result<M, CheckpointError> {
    let files = weight_files(dir)?;
    if let Some(missing) = files.iter().find(|file| !file.is_file()) {
        return Err(CheckpointError::unreadable(
            missing,
            "a shard the index names is missing",
        ));
    }
    let config: Option<Value> = std::fs::read_to_string(dir.join("config.json"))
        .ok()
        .and_then(|text| serde_json::from_str(&text).ok());
    let remapper = KeyRemapper::from_patterns(remapping.to_vec())
        .map_err(|e| CheckpointError::Remapping(e.to_string()))?;
    let mut snapshots = Vec::new();
    for file in &files {
        let (remapped, names) = remapper.remap(safetensors_snapshots(file)?);
        let originals = names.into_iter().map(|(_, original)| original);
        snapshots.extend(originals.zip(remapped));
    }
    let source = match &files[..] {
        [file] => file.clone(),
        _ => dir.to_path_buf(),
    };
    load_checked(
        model,
        &source,
        snapshots,
        config.as_ref(),
        unused_on_purpose,
        kept,
    )
}

/// The shapes of the tensors of the safetensors file `file`, by stored name, from its header
/// alone (a checkpoint's sizes, read before a model is built to take it).
pub fn tensor_shapes(file: &Path) -> Result<BTreeMap<String, Vec<usize>>, CheckpointError> {
    let reader = InputFile::open(file).map_err(|e| CheckpointError::read(file, e))?;
    let metadata = safetensors_header(&reader)?;
    let tensors = metadata.tensors.tensors();
    Ok(tensors
        .into_iter()
        .map(|(name, info)| (name, info.shape.clone()))
        .collect())
}

/// The tensor stored as `name` in the safetensors file `file`, in its stored dtype (`None`
/// where the file holds no such tensor): a single value a model keeps beside its parameters,
/// such as a buffer's position, read without loading the rest.
pub fn read_tensor(file: &Path, name: &str) -> Result<Option<TensorData>, CheckpointError> {
    let mut found = None;
    read_tensors(
        file,
        |stored, _| stored == name,
        |_, data| {
            found = Some(data);
            Ok::<_, CheckpointError>(())
        },
    )?;
    Ok(found)
}

/// Each tensor of the safetensors file `file` that `wanted` picks (by its stored name and
/// shape), read alone in its stored dtype and handed to `each` before the next is read: the
/// header parsed once, the rest of the file not loaded.
pub fn read_tensors<E: From<CheckpointError>>(
    file: &Path,
    wanted: impl Fn(&str, &[usize]) -> bool,
    mut each: impl FnMut(String, TensorData) -> Result<(), E>,
) -> Result<(), E> {
    for snapshot in safetensors_snapshots(file)? {
        let name = snapshot.full_path();
        if !wanted(&name, &snapshot.shape) {
            continue;
        }
        let data = snapshot
            .to_data()
            .map_err(|e| CheckpointError::unreadable(file, format!("{name}: {e}")))?;
        each(name, data)?;
    }
    Ok(())
}

/// The tensors of the safetensors file `file` as snapshots under their stored names, in the
/// file's order: its header read now, each tensor's bytes read from the file by position only
/// when it is loaded (no memory map: a file cut short meanwhile is an error naming it, not a
/// `SIGBUS`; a directory or FIFO is refused before it is opened).
pub(super) fn safetensors_snapshots(file: &Path) -> Result<Vec<TensorSnapshot>, CheckpointError> {
    let reader = Rc::new(InputFile::open(file).map_err(|e| CheckpointError::read(file, e))?);
    let metadata = safetensors_header(&reader)?;
    let data_start = 8 + metadata.header;
    let mut tensors: Vec<_> = metadata.tensors.tensors().into_iter().collect();
    tensors.sort_by_key(|(_, info)| info.data_offsets.0);
    tensors
        .into_iter()
        .map(|(name, info)| {
            let dtype = burn_dtype(info.dtype).ok_or_else(|| {
                let dtype = info.dtype;
                CheckpointError::unreadable(file, format!("{name}: kiln reads no {dtype:?} values"))
            })?;
            let (first, last) = info.data_offsets;
            let range = data_start + first as u64..data_start + last as u64;
            let (reader, shape) = (reader.clone(), info.shape.clone());
            let read = Rc::new(move || {
                let bytes = reader
                    .read(range.clone())
                    .map_err(|e| TensorSnapshotError::IoError(e.to_string()))?;
                Ok(TensorData::from_bytes_vec(bytes, shape.clone(), dtype))
            });
            Ok(TensorSnapshot::from_closure(
                read,
                dtype,
                info.shape.clone().into(),
                name.split('.').map(str::to_string).collect(),
                Vec::new(),
                ParamId::new(),
            ))
        })
        .collect()
}

/// A safetensors file's header: its length and the tensors it describes.
struct SafetensorsHeader {
    header: u64,
    tensors: safetensors::tensor::Metadata,
}

/// The header of the safetensors file `reader`, checked as the `safetensors` crate checks a
/// whole file (tensors contiguous, in order, ending where the file ends) without reading the
/// tensors' bytes.
fn safetensors_header(reader: &InputFile) -> Result<SafetensorsHeader, CheckpointError> {
    /// The `safetensors` crate's own limit on a header.
    const MOST: u64 = 100_000_000;
    let file = reader.path();
    let not_safetensors = |reason: String| {
        CheckpointError::unreadable(file, format!("not a safetensors file: {reason}"))
    };
    if reader.len() < 8 {
        return Err(not_safetensors(format!(
            "{} bytes, shorter than a header",
            reader.len()
        )));
    }
    let length = reader
        .read(0..8)
        .map_err(|e| CheckpointError::read(file, e))?;
    let header = u64::from_le_bytes(length.try_into().expect("8 bytes read"));
    if header > MOST || 8 + header > reader.len() {
        return Err(not_safetensors(format!(
            "its header says it is {header} bytes long, in a file of {} bytes",
            reader.len()
        )));
    }
    let text = reader
        .read(8..8 + header)
        .map_err(|e| CheckpointError::read(file, e))?;
    let tensors: safetensors::tensor::Metadata =
        serde_json::from_slice(&text).map_err(|e| not_safetensors(e.to_string()))?;
    let data = 8 + header + tensors.data_len() as u64;
    if data != reader.len() {
        return Err(not_safetensors(format!(
            "its tensors end at byte {data}, but the file has {} bytes",
            reader.len()
        )));
    }
    Ok(SafetensorsHeader { header, tensors })
}

/// burn's dtype of a safetensors dtype, as burn-store reads it.
fn burn_dtype(dtype: safetensors::Dtype) -> Option<DType> {
    use safetensors::Dtype;
    Some(match dtype {
        Dtype::F64 => DType::F64,
        Dtype::F32 => DType::F32,
        Dtype::F16 => DType::F16,
        Dtype::BF16 => DType::BF16,
        Dtype::I64 => DType::I64,
        Dtype::I32 => DType::I32,
        Dtype::I16 => DType::I16,
        Dtype::I8 => DType::I8,
        Dtype::U64 => DType::U64,
        Dtype::U32 => DType::U32,
        Dtype::U16 => DType::U16,
        Dtype::U8 => DType::U8,
        Dtype::BOOL => DType::Bool(BoolStore::Native),
        _ => return None,
    })
}

/// Loads `snapshots` into `model`, each with its name in `source` (said in errors): tensors named
/// and shaped as a PyTorch checkpoint names and shapes them, whose values are read only as each
/// is loaded (a GGUF file's, decoded one tensor at a time), so that no second copy of the
/// weights is ever held. Their names and shapes are checked against the model first
/// ([`check_snapshots`]), each one's values are checked finite as it is read, and errors name
/// `source`. Tensors the model does not use are a warning, except those under the prefixes
/// `unused_on_purpose`.
pub fn load_snapshots<B: Backend, M: Module<B>>(
    model: M,
    source: &Path,
    snapshots: Vec<(String, TensorSnapshot)>,
    unused_on_purpose: &[&str],
) -> Result<M, CheckpointError> {
    load_checked(model, source, snapshots, None, unused_on_purpose, &[])
}

/// [`load_snapshots`] but for the snapshots named in `kept` (by their names in `source`): those
/// are checked against the model's names and shapes like the others, but neither read nor
/// loaded nor counted in the memory the load needs. Their parameters are left as the model has
/// them, for the caller to replace (a GGUF file's quantized weights, kept as stored and decoded
/// only if something asks for their values).
pub fn load_snapshots_keeping<B: Backend, M: Module<B>>(
    model: M,
    source: &Path,
    snapshots: Vec<(String, TensorSnapshot)>,
    unused_on_purpose: &[&str],
    kept: &[String],
) -> Result<M, CheckpointError> {
    load_checked(model, source, snapshots, None, unused_on_purpose, kept)
}

/// [`load_snapshots`], a mis-shaped tensor's error naming the settings of `config` (the
/// model's `config.json`) behind the model's sizes.
fn load_checked<B: Backend, M: Module<B>>(
    mut model: M,
    source: &Path,
    snapshots: Vec<(String, TensorSnapshot)>,
    config: Option<&Value>,
    unused_on_purpose: &[&str],
    kept: &[String],
) -> Result<M, CheckpointError> {
    let fit = check_snapshots(&model, &snapshots, source, config)?;
    let snapshots: Vec<_> = (snapshots.into_iter())
        .filter(|(name, _)| !kept.contains(name))
        .collect();
    if let Some(unused) = fit.unexpected(unused_on_purpose) {
        log::warn!(
            "{}: tensors the model does not use: {unused}",
            source.display()
        );
    }
    if let Some(device) = parameter_device(&model) {
        let unused: BTreeSet<&str> = fit.unused.iter().map(String::as_str).collect();
        let needed = snapshots
            .iter()
            .filter(|(name, _)| !unused.contains(name.as_str()))
            .map(|(_, snapshot)| {
                snapshot.shape.num_elements() as u64 * snapshot.dtype.size() as u64
            })
            .fold(0, u64::saturating_add);
        let what = format!("the weights of {}", source.display());
        check_memory::<B>(&device, needed, &what)?;
    }
    let problems = Rc::new(RefCell::new(Vec::new()));
    let checked = snapshots
        .into_iter()
        .map(|(name, snapshot)| checked_finite(snapshot, name, problems.clone()))
        .collect();
    let result = model.apply(checked, None, Some(Box::new(TorchLayout::Load)), false);
    let problems = problems.take();
    if !problems.is_empty() {
        return Err(CheckpointError::Tensors {
            checkpoint: source.to_path_buf(),
            problems,
        });
    }
    match result.errors.first() {
        Some(error) => Err(CheckpointError::unreadable(source, error)),
        None => Ok(model),
    }
}

/// `snapshot`, whose values, when read, are refused if one is NaN or infinite or they cannot be
/// read (the file was cut short meanwhile), the problem recorded in `problems` under `name`.
fn checked_finite(
    snapshot: TensorSnapshot,
    name: String,
    problems: Rc<RefCell<Vec<TensorProblem>>>,
) -> TensorSnapshot {
    let read = snapshot.clone_data_fn();
    let checked = Rc::new(move || {
        let data = read().inspect_err(|error| {
            let (TensorSnapshotError::IoError(reason)
            | TensorSnapshotError::DataError(reason)
            | TensorSnapshotError::PanicError(reason)) = error;
            problems.borrow_mut().push(TensorProblem {
                tensor: name.clone(),
                problem: Problem::Unreadable {
                    reason: reason.clone(),
                },
            });
        })?;
        let Some(problem) = non_finite_values(&data) else {
            return Ok(data);
        };
        problems.borrow_mut().push(TensorProblem {
            tensor: name.clone(),
            problem,
        });
        Err(TensorSnapshotError::DataError(format!(
            "{name}: non-finite values"
        )))
    });
    TensorSnapshot::from_closure(
        checked,
        snapshot.dtype,
        snapshot.shape.clone(),
        snapshot.path_stack.clone().unwrap_or_default(),
        snapshot.container_stack.clone().unwrap_or_default(),
        snapshot.tensor_id.unwrap_or_default(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A checkpoint whose tensors match a model too large for any machine is refused by its
    /// memory before a tensor is read (the reads here would fail).
    #[cfg(feature = "flex")]
    #[test]
    fn weights_that_cannot_fit_are_refused_before_any_is_read() {
        use burn::backend::Flex;
        use burn::nn::{Linear, LinearConfig};

        #[derive(Module, Debug)]
        struct Wide<B: Backend> {
            proj: Linear<B>,
        }
        let device = Default::default();
        let model: Wide<Flex> = Wide {
            proj: LinearConfig::new(1_000_000, 1_000_000).init(&device),
        };
        let snapshot = |name: &str, shape: Vec<usize>| {
            let unread = Rc::new(|| Err(TensorSnapshotError::IoError("read".into())));
            let path = name.split('.').map(str::to_string).collect();
            let snapshot = TensorSnapshot::from_closure(
                unread,
                DType::F32,
                shape.into(),
                path,
                vec![],
                ParamId::new(),
            );
            (name.to_string(), snapshot)
        };
        let snapshots = vec![
            snapshot("proj.weight", vec![1_000_000, 1_000_000]),
            snapshot("proj.bias", vec![1_000_000]),
        ];
        let err = load_snapshots(model, Path::new("wide.gguf"), snapshots, &[]).unwrap_err();
        assert!(matches!(err, CheckpointError::Memory(_)), "{err}");
        assert!(
            err.to_string()
                .starts_with("the weights of wide.gguf need at least 4.0 TB"),
            "{err}"
        );
    }

    #[test]
    fn the_weights_identity_follows_the_weight_file() {
        let dir = tempfile::tempdir().unwrap();
        let empty = weights_identity(dir.path());
        assert_eq!(empty, format!("{} ()", dir.path().display()));
        std::fs::write(dir.path().join(INDEX), "{}").unwrap();
        let sharded = weights_identity(dir.path());
        assert!(sharded.contains("(2 bytes, modified "), "{sharded}");
        std::fs::write(dir.path().join(SINGLE), "weights").unwrap();
        let single = weights_identity(dir.path());
        assert!(single.contains("(7 bytes, modified "), "{single}");
    }
}
