//! A safetensors checkpoint checked against the model it is about to be loaded into, before
//! anything is loaded: every tensor the model needs is there, floating-point, and of the model's
//! shape, all said in the checkpoint's own names and dimension order (PyTorch's: a linear weight
//! is `[out, in]`); the tensors the model does not use are listed (transformers warns about them
//! too).

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::rc::Rc;

use burn::module::Module;
use burn::tensor::backend::Backend;
use burn::tensor::{DType, TensorData};
use burn_store::{KeyRemapper, ModuleAdapter, TensorSnapshot, TensorSnapshotError};
use serde_json::Value;

use super::load::safetensors_snapshots;
use super::{CheckpointError, Problem, TensorProblem, TorchLayout};
use crate::footprint::parameter_shapes;

/// What a checkpoint holds beyond what the model needs.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CheckpointFit {
    /// The checkpoint's tensors the model does not use, in its own names, sorted.
    pub unused: Vec<String>,
}

impl CheckpointFit {
    /// The unused tensors outside `on_purpose` (name prefixes of tensors a model leaves alone
    /// by design), grouped by their first name component where several share it:
    /// `extra.* (2), encoder.norm.scale`; `None` when there are none.
    pub fn unexpected(&self, on_purpose: &[&str]) -> Option<String> {
        let mut groups: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
        for name in &self.unused {
            if !on_purpose.iter().any(|prefix| name.starts_with(prefix)) {
                let head = name.split('.').next().unwrap_or(name);
                groups.entry(head).or_default().push(name);
            }
        }
        if groups.is_empty() {
            return None;
        }
        let listed: Vec<String> = groups
            .into_iter()
            .map(|(head, names)| match names[..] {
                [one] => one.to_string(),
                _ => format!("{head}.* ({})", names.len()),
            })
            .collect();
        Some(listed.join(", "))
    }
}

/// Checks the safetensors `files` of one checkpoint (its shards) against `model`, the keys
/// renamed by `remapping` (regex, replacement) as the loader renames them. `config` (the
/// model's `config.json`), when given, names the settings a mis-shaped tensor's sizes come from.
///
/// The error, [`CheckpointError::Tensors`], lists every problem ([`Problem`]): a tensor the
/// model needs that the checkpoint lacks, stores with an integer or boolean dtype, holds with
/// another shape, or holds NaN or infinite values in. It names the file when there is one, else
/// the directory of the shards.
pub fn check_checkpoint<B: Backend, M: Module<B>>(
    model: &M,
    files: &[&Path],
    remapping: &[(&str, &str)],
    config: Option<&Value>,
) -> Result<CheckpointFit, CheckpointError> {
    // The shapes the model needs, read without initialising it: a config whose sizes are wrong
    // is refused here before its model has taken any memory.
    let needed = needed_tensors(model);
    let remapper = KeyRemapper::from_patterns(remapping.to_vec())
        .map_err(|e| CheckpointError::Remapping(e.to_string()))?;
    // Keyed by the name the model looks for (after remapping); the stored name is kept to speak
    // of the tensor in the checkpoint's own terms.
    let mut stored: BTreeMap<String, Stored> = BTreeMap::new();
    for file in files {
        let (snapshots, names) = remapper.remap(safetensors_snapshots(file)?);
        for (snapshot, (name, original)) in snapshots.into_iter().zip(names) {
            stored.insert(name, Stored { original, snapshot });
        }
    }
    let checkpoint = match files {
        [file] => file.to_path_buf(),
        _ => files
            .first()
            .and_then(|file| file.parent())
            .map(Path::to_path_buf)
            .unwrap_or_default(),
    };
    fit(&needed, stored, checkpoint, config, true)
}

/// [`check_checkpoint`] of tensors read lazily: `snapshots`, each with its name in `source`
/// (said in errors), named and shaped as a PyTorch checkpoint names and shapes them (a linear
/// weight `[out, in]`), with `config` (a `config.json`) naming the settings behind a mis-shaped
/// tensor's sizes. Names, dtypes and shapes are checked; values are not read (each would be
/// read, and a quantized one decoded, twice): loaders check them as they read them.
pub fn check_snapshots<B: Backend, M: Module<B>>(
    model: &M,
    snapshots: &[(String, TensorSnapshot)],
    source: &Path,
    config: Option<&Value>,
) -> Result<CheckpointFit, CheckpointError> {
    let stored = snapshots
        .iter()
        .map(|(original, snapshot)| {
            let stored = Stored {
                original: original.clone(),
                snapshot: snapshot.clone(),
            };
            (snapshot.full_path(), stored)
        })
        .collect();
    fit(
        &needed_tensors(model),
        stored,
        source.to_path_buf(),
        config,
        false,
    )
}

/// The tensors `model` needs, by their names in a PyTorch checkpoint.
fn needed_tensors<B: Backend, M: Module<B>>(model: &M) -> BTreeMap<String, Needed> {
    parameter_shapes(model)
        .into_iter()
        .map(|parameter| {
            let unread = Rc::new(|| {
                Err(TensorSnapshotError::DataError(
                    "a parameter's shape, not its values".into(),
                ))
            });
            let burn_path = parameter.path.join(".");
            let snapshot = TensorSnapshot::from_closure(
                unread,
                DType::F32,
                parameter.shape.into(),
                parameter.path,
                parameter.containers,
                parameter.id,
            );
            let torch = TorchLayout::Save.adapt(&snapshot);
            let needed = Needed {
                shape: torch.shape.to_vec(),
                burn_path,
            };
            (torch.full_path(), needed)
        })
        .collect()
}

/// The problems of `stored` (keyed by the names the model looks for) against `needed`, said of
/// `checkpoint`, with its values checked finite when `check_values`; or what it holds unused.
fn fit(
    needed: &BTreeMap<String, Needed>,
    stored: BTreeMap<String, Stored>,
    checkpoint: std::path::PathBuf,
    config: Option<&Value>,
    check_values: bool,
) -> Result<CheckpointFit, CheckpointError> {
    let mut problems = Vec::new();
    let mut used = BTreeSet::new();
    for (name, needed) in needed {
        // kiln saved RMSNorm scales under burn's name (`gamma`) before [`TorchLayout`].
        let found = [name, &needed.burn_path]
            .into_iter()
            .find_map(|key| Some((key, stored.get(key)?)));
        let Some((key, Stored { original, snapshot })) = found else {
            problems.push(TensorProblem {
                tensor: name.clone(),
                problem: Problem::Missing {
                    needed: needed.shape.clone(),
                },
            });
            continue;
        };
        used.insert(key.clone());
        let (dtype, have) = (snapshot.dtype, snapshot.shape.to_vec());
        let problem = if !dtype.is_float() {
            Some(Problem::Dtype {
                stored: format!("{dtype:?}"),
            })
        } else if have != needed.shape {
            Some(Problem::Shape {
                settings: settings(config, &have, &needed.shape),
                stored: have,
                needed: needed.shape.clone(),
            })
        } else if check_values {
            non_finite(snapshot)
        } else {
            None
        };
        if let Some(problem) = problem {
            problems.push(TensorProblem {
                tensor: original.clone(),
                problem,
            });
        }
    }
    if !problems.is_empty() {
        return Err(CheckpointError::Tensors {
            checkpoint,
            problems,
        });
    }
    let mut unused: Vec<String> = stored
        .into_iter()
        .filter(|(name, _)| !used.contains(name))
        .map(|(_, stored)| stored.original)
        .collect();
    unused.sort();
    Ok(CheckpointFit { unused })
}

/// A tensor the model needs: its shape in PyTorch's layout, and its path in burn's names.
struct Needed {
    shape: Vec<usize>,
    burn_path: String,
}

/// A tensor the checkpoint holds, under its own name.
struct Stored {
    original: String,
    snapshot: TensorSnapshot,
}

/// Where `snapshot` holds a NaN or an infinity (a damaged or diverged checkpoint): how many,
/// and the first one's flat index.
fn non_finite(snapshot: &TensorSnapshot) -> Option<Problem> {
    match snapshot.to_data() {
        Ok(data) => non_finite_values(&data),
        Err(e) => Some(Problem::Unreadable {
            reason: format!("{e:?}"),
        }),
    }
}

/// [`Problem::NonFinite`] when `data` holds a NaN or an infinity: how many, and the first one's
/// flat index (f32 values read in place, others as f64).
pub(super) fn non_finite_values(data: &TensorData) -> Option<Problem> {
    let (mut count, mut first) = (0, None);
    let mut note = |index: usize, finite: bool| {
        if !finite {
            count += 1;
            first.get_or_insert(index);
        }
    };
    match data.as_slice::<f32>() {
        Ok(values) if values.iter().all(|v| v.is_finite()) => {}
        Ok(values) => (values.iter().enumerate()).for_each(|(i, v)| note(i, v.is_finite())),
        Err(_) => (data.iter::<f64>().enumerate()).for_each(|(i, v)| note(i, v.is_finite())),
    }
    Some(Problem::NonFinite {
        count,
        first: first?,
    })
}

/// `["hidden_size = 64"]`: the settings of `config` whose values are the model's sizes where
/// they differ from the checkpoint's.
fn settings(config: Option<&Value>, have: &[usize], want: &[usize]) -> Vec<String> {
    let Some(config) = config else {
        return Vec::new();
    };
    let mut named = Vec::new();
    for (i, &size) in want.iter().enumerate() {
        // Sizes of 0 and 1 are every flag's and count's value too: naming those settings
        // would point at the wrong ones.
        if have.get(i) != Some(&size) && size > 1 {
            fields_equal_to(config, size as u64, "", &mut named);
        }
    }
    named.dedup();
    named
}

fn fields_equal_to(value: &Value, size: u64, prefix: &str, out: &mut Vec<String>) {
    let Value::Object(fields) = value else {
        return;
    };
    for (key, value) in fields {
        let path = format!("{prefix}{key}");
        match value {
            Value::Number(n) if n.as_u64() == Some(size) => out.push(format!("{path} = {size}")),
            Value::Object(_) => fields_equal_to(value, size, &format!("{path}."), out),
            _ => {}
        }
    }
}

#[cfg(all(test, feature = "flex"))]
mod tests {
    use super::*;
    use burn::backend::Flex;
    use burn::nn::{LayerNorm, LayerNormConfig, Linear, LinearConfig, RmsNorm, RmsNormConfig};
    use safetensors::Dtype;
    use serde_json::json;

    #[derive(Module, Debug)]
    struct Tiny<B: Backend> {
        proj: Linear<B>,
        norm: LayerNorm<B>,
    }

    fn tiny() -> Tiny<Flex> {
        let device = Default::default();
        Tiny {
            proj: LinearConfig::new(3, 5).init(&device),
            norm: LayerNormConfig::new(5).init(&device),
        }
    }

    /// A safetensors file of `tensors` (name, dtype, shape), zero-filled.
    fn file(dir: &Path, tensors: &[(&str, Dtype, Vec<usize>)]) -> std::path::PathBuf {
        let data: Vec<Vec<u8>> = tensors
            .iter()
            .map(|(_, dtype, shape)| {
                vec![0u8; dtype.bitsize() / 8 * shape.iter().product::<usize>()]
            })
            .collect();
        let views: Vec<_> = tensors
            .iter()
            .zip(&data)
            .map(|((name, dtype, shape), bytes)| {
                let view = safetensors::tensor::TensorView::new(*dtype, shape.clone(), bytes);
                (name.to_string(), view.unwrap())
            })
            .collect();
        let path = dir.join("model.safetensors");
        safetensors::serialize_to_file(views, None, &path).unwrap();
        path
    }

    fn good() -> Vec<(&'static str, Dtype, Vec<usize>)> {
        vec![
            ("proj.weight", Dtype::F32, vec![5, 3]),
            ("proj.bias", Dtype::F32, vec![5]),
            ("norm.weight", Dtype::BF16, vec![5]),
            ("norm.bias", Dtype::F32, vec![5]),
        ]
    }

    #[test]
    fn a_fitting_checkpoint_passes_and_its_extras_are_listed() {
        let dir = tempfile::tempdir().unwrap();
        let mut tensors = good();
        tensors.push(("text_model.a.weight", Dtype::F32, vec![2]));
        tensors.push(("extra.b", Dtype::I64, vec![2]));
        tensors.push(("extra.c", Dtype::F32, vec![2]));
        tensors.push(("scale.x", Dtype::F32, vec![1]));
        let path = file(dir.path(), &tensors);
        let fit = check_checkpoint(&tiny(), &[&path], &[], None).unwrap();
        assert_eq!(fit.unused.len(), 4);
        assert_eq!(
            fit.unexpected(&["text_model."]).as_deref(),
            Some("extra.* (2), scale.x")
        );
        let path = file(dir.path(), &good());
        assert_eq!(
            check_checkpoint(&tiny(), &[&path], &[], None)
                .unwrap()
                .unexpected(&[]),
            None
        );
    }

    /// Every problem on its own line, in the checkpoint's names and PyTorch's `[out, in]`
    /// order, with the config settings behind the model's sizes.
    #[test]
    fn problems_are_listed_in_the_checkpoints_terms() {
        let dir = tempfile::tempdir().unwrap();
        let path = file(
            dir.path(),
            &[
                ("proj.weight", Dtype::F32, vec![4, 3]),
                ("proj.bias", Dtype::I64, vec![5]),
                ("renamed.weight", Dtype::F32, vec![5]),
            ],
        );
        let config = json!({"hidden_size": 5, "vision": {"width": 5}, "layers": 2});
        let err = check_checkpoint(&tiny(), &[&path], &[], Some(&config)).unwrap_err();
        // Callers branch on each problem; the message lists them under one line naming the file.
        let found: Vec<(&str, &Problem)> = err
            .problems()
            .iter()
            .map(|p| (p.tensor.as_str(), &p.problem))
            .collect();
        assert_eq!(
            found,
            [
                ("norm.bias", &Problem::Missing { needed: vec![5] }),
                ("norm.weight", &Problem::Missing { needed: vec![5] }),
                (
                    "proj.bias",
                    &Problem::Dtype {
                        stored: "I64".into()
                    }
                ),
                (
                    "proj.weight",
                    &Problem::Shape {
                        stored: vec![4, 3],
                        needed: vec![5, 3],
                        settings: vec!["hidden_size = 5".into(), "vision.width = 5".into()]
                    }
                ),
            ]
        );
        let err = err.to_string();
        assert!(
            err.starts_with(&format!(
                "{}: 4 tensor(s) cannot be loaded:\n  ",
                path.display()
            )),
            "{err}"
        );
        assert!(
            err.contains("norm.bias [5]: not in the checkpoint"),
            "{err}"
        );
        assert!(
            err.contains("norm.weight [5]: not in the checkpoint"),
            "{err}"
        );
        assert!(err.contains("proj.bias: stored as I64"), "{err}");
        assert!(
            err.contains(
                "proj.weight: the checkpoint has [4, 3], the model needs [5, 3]; set by \
                 config.json's hidden_size = 5, vision.width = 5"
            ),
            "{err}"
        );
        // Renaming the keys as a loader would fixes the norm's names.
        let fit = check_checkpoint(&tiny(), &[&path], &[("^renamed\\.", "norm.")], None);
        assert!(!fit.unwrap_err().to_string().contains("norm.weight"));
    }

    #[derive(Module, Debug)]
    struct Scaled<B: Backend> {
        norm: RmsNorm<B>,
        proj: Linear<B>,
    }

    /// RMSNorm's scale is `weight` as in PyTorch (burn calls it `gamma`), and a tensor that a
    /// loader's remapping renames is named as the checkpoint stores it.
    #[test]
    fn names_are_the_checkpoints_own() {
        let device = Default::default();
        let model: Scaled<Flex> = Scaled {
            norm: RmsNormConfig::new(5).init(&device),
            proj: LinearConfig::new(3, 5).init(&device),
        };
        let dir = tempfile::tempdir().unwrap();
        let good = [
            ("norm.weight", Dtype::F32, vec![5]),
            ("proj.weight", Dtype::F32, vec![5, 3]),
            ("proj.bias", Dtype::F32, vec![5]),
        ];
        let path = file(dir.path(), &good);
        assert_eq!(
            check_checkpoint(&model, &[&path], &[], None)
                .unwrap()
                .unused,
            Vec::<String>::new()
        );
        // kiln's own files from before stored burn's name; they still fit.
        let mut legacy = good.clone();
        legacy[0].0 = "norm.gamma";
        let path = file(dir.path(), &legacy);
        assert!(check_checkpoint(&model, &[&path], &[], None).is_ok());
        // A missing scale is named as PyTorch names it; a mis-shaped tensor under its stored
        // name, before the loader's renaming.
        let path = file(
            dir.path(),
            &[
                ("model.proj.weight", Dtype::F32, vec![4, 3]),
                ("model.proj.bias", Dtype::F32, vec![5]),
            ],
        );
        let err = check_checkpoint(&model, &[&path], &[("^model\\.", "")], None)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("norm.weight [5]: not in the checkpoint"),
            "{err}"
        );
        assert!(!err.contains("gamma"), "{err}");
        assert!(
            err.contains("model.proj.weight: the checkpoint has [4, 3], the model needs [5, 3]"),
            "{err}"
        );
        // What it saves is what it checks.
        let saved = tempfile::tempdir().unwrap();
        super::super::save_checkpoint(&model, "{}", saved.path()).unwrap();
        let path = saved.path().join("model.safetensors");
        let bytes = std::fs::read(&path).unwrap();
        let names = safetensors::SafeTensors::deserialize(&bytes)
            .unwrap()
            .names()
            .len();
        assert_eq!(names, 3);
        assert!(
            check_checkpoint(&model, &[&path], &[], None)
                .unwrap()
                .unused
                .is_empty()
        );
    }

    /// A NaN or an infinity in a tensor the model needs is named with where it is.
    #[test]
    fn non_finite_values_are_named() {
        let dir = tempfile::tempdir().unwrap();
        let mut weights = [0f32; 15];
        weights[7] = f32::NAN;
        weights[9] = f32::INFINITY;
        let bytes: Vec<u8> = weights.iter().flat_map(|v| v.to_le_bytes()).collect();
        let zeros = vec![0u8; 4 * 5];
        let views = [
            ("proj.weight", vec![5, 3], &bytes),
            ("proj.bias", vec![5], &zeros),
            ("norm.weight", vec![5], &zeros),
            ("norm.bias", vec![5], &zeros),
        ]
        .map(|(name, shape, data)| {
            let view = safetensors::tensor::TensorView::new(Dtype::F32, shape, data);
            (name, view.unwrap())
        });
        let path = dir.path().join("model.safetensors");
        safetensors::serialize_to_file(views, None, &path).unwrap();
        let err = check_checkpoint(&tiny(), &[&path], &[], None).unwrap_err();
        assert_eq!(
            err.problems()[0].problem,
            Problem::NonFinite { count: 2, first: 7 }
        );
        let err = err.to_string();
        assert!(
            err.contains("proj.weight: holds 2 non-finite value(s)")
                && err.contains("flat index 7"),
            "{err}"
        );
    }
}
