//! Finished trials on disk: what makes a run resumable, shardable and mergeable.
//!
//! A results directory holds `experiment.json` (the [`Experiment`] its trials belong to) and one
//! safetensors file per finished trial under `trials/`: `count` `[N]` u64, `mean` and `variance`
//! `[N, D]` f64 (per image, over the trial's passes), optionally `pass_features` `[N, T, D]` f32,
//! and the key, seed and timings in the file's metadata. Files are written under a temporary
//! name and renamed, so a killed run leaves only whole trials; rerunning the same experiment into
//! the directory skips them.

use std::collections::{BTreeMap, HashMap};
use std::fs;
use std::path::{Path, PathBuf};

use safetensors::tensor::TensorView;
use safetensors::{Dtype, SafeTensors};

use crate::McError;
use crate::experiment::{Experiment, TrialKey};
use crate::runner::{PassFeatures, Timings};
use crate::welford::EmbeddingStats;

const EXPERIMENT_FILE: &str = "experiment.json";
const TRIALS_DIR: &str = "trials";

/// A finished trial as stored.
#[derive(Debug, Clone, PartialEq)]
pub struct TrialRecord {
    /// Which trial.
    pub key: TrialKey,
    /// Its seed.
    pub seed: u64,
    /// Per image, mean and variance over its passes.
    pub stats: EmbeddingStats,
    /// Where its time went.
    pub timings: Timings,
}

/// The finished trials of one experiment in a directory.
#[derive(Debug, Clone)]
pub struct TrialStore {
    dir: PathBuf,
    experiment: Experiment,
}

impl TrialStore {
    /// The store in `dir` for `experiment`: created (with `experiment.json`) when new, resumed
    /// when it holds the same experiment, an error naming the differences when it holds another.
    pub fn create_or_resume(
        dir: impl AsRef<Path>,
        experiment: &Experiment,
    ) -> Result<Self, McError> {
        let dir = dir.as_ref();
        if dir.join(EXPERIMENT_FILE).exists() {
            let store = Self::open(dir)?;
            let differences = store.experiment.differences(experiment);
            if !differences.is_empty() {
                return Err(McError::Store(format!(
                    "{} holds results of another experiment (it differs in {}): choose another \
                     output directory, or delete it to start over",
                    dir.display(),
                    differences.join(", ")
                )));
            }
            return Ok(store);
        }
        fs::create_dir_all(dir.join(TRIALS_DIR)).map_err(|e| io(dir, e))?;
        let json = serde_json::to_string_pretty(experiment).expect("an experiment serialises");
        write_atomically(&dir.join(EXPERIMENT_FILE), json.as_bytes())?;
        Ok(TrialStore {
            dir: dir.to_path_buf(),
            experiment: experiment.clone(),
        })
    }

    /// The store already in `dir`.
    pub fn open(dir: impl AsRef<Path>) -> Result<Self, McError> {
        let dir = dir.as_ref();
        let path = dir.join(EXPERIMENT_FILE);
        let text = fs::read_to_string(&path).map_err(|e| {
            McError::Store(format!(
                "{}: {e} (is {} a results directory of exp0?)",
                path.display(),
                dir.display()
            ))
        })?;
        let experiment = serde_json::from_str(&text)
            .map_err(|e| McError::Store(format!("{}: {e}", path.display())))?;
        Ok(TrialStore {
            dir: dir.to_path_buf(),
            experiment,
        })
    }

    /// The experiment the trials belong to.
    pub fn experiment(&self) -> &Experiment {
        &self.experiment
    }

    /// The directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Where trial `key` is (or will be) stored.
    pub fn path_of(&self, key: &TrialKey) -> PathBuf {
        self.dir.join(TRIALS_DIR).join(format!("{key}.safetensors"))
    }

    /// Whether trial `key` is finished here.
    pub fn contains(&self, key: &TrialKey) -> bool {
        self.path_of(key).is_file()
    }

    /// Those of `keys` not finished here, in order.
    pub fn pending(&self, keys: Vec<TrialKey>) -> Vec<TrialKey> {
        keys.into_iter().filter(|key| !self.contains(key)).collect()
    }

    /// Stores a finished trial (and every pass's embeddings, when given).
    pub fn save(
        &self,
        record: &TrialRecord,
        features: Option<&PassFeatures>,
    ) -> Result<(), McError> {
        let stats = &record.stats;
        let (images, dims) = (stats.images(), stats.dims());
        let bytes_of =
            |values: &[f64]| -> Vec<u8> { values.iter().flat_map(|v| v.to_le_bytes()).collect() };
        let count: Vec<u8> = stats
            .counts()
            .iter()
            .flat_map(|c| c.to_le_bytes())
            .collect();
        let mean = bytes_of(stats.means());
        let variance = bytes_of(&stats.variances());
        let features_bytes: Option<Vec<u8>> =
            features.map(|f| f.values.iter().flat_map(|v| v.to_le_bytes()).collect());
        let mut tensors = vec![
            ("count", view(Dtype::U64, vec![images], &count)?),
            ("mean", view(Dtype::F64, vec![images, dims], &mean)?),
            ("variance", view(Dtype::F64, vec![images, dims], &variance)?),
        ];
        if let (Some(f), Some(bytes)) = (features, &features_bytes) {
            tensors.push((
                "pass_features",
                view(Dtype::F32, vec![f.images, f.passes, f.dims], bytes)?,
            ));
        }
        let metadata = HashMap::from([
            ("model".to_string(), record.key.model.clone()),
            ("passes".to_string(), record.key.passes.to_string()),
            ("trial".to_string(), record.key.trial.to_string()),
            ("seed".to_string(), record.seed.to_string()),
            (
                "timings".to_string(),
                serde_json::to_string(&record.timings).expect("timings serialise"),
            ),
        ]);
        let bytes = safetensors::serialize(tensors, Some(metadata))
            .map_err(|e| McError::Store(format!("trial {}: {e}", record.key)))?;
        write_atomically(&self.path_of(&record.key), &bytes)
    }

    /// Reads finished trial `key`.
    pub fn load(&self, key: &TrialKey) -> Result<TrialRecord, McError> {
        let path = self.path_of(key);
        let fail = |what: String| McError::Store(format!("{}: {what}", path.display()));
        let bytes = fs::read(&path).map_err(|e| fail(e.to_string()))?;
        let (_, header) = SafeTensors::read_metadata(&bytes).map_err(|e| fail(e.to_string()))?;
        let metadata: BTreeMap<String, String> = header
            .metadata()
            .clone()
            .map(|m| m.into_iter().collect())
            .unwrap_or_default();
        let field = |name: &str| {
            metadata
                .get(name)
                .ok_or_else(|| fail(format!("no `{name}` in the metadata")))
        };
        let stored = TrialKey {
            model: field("model")?.clone(),
            passes: field("passes")?
                .parse()
                .map_err(|_| fail("bad `passes`".into()))?,
            trial: field("trial")?
                .parse()
                .map_err(|_| fail("bad `trial`".into()))?,
        };
        if &stored != key {
            return Err(fail(format!("holds trial {stored}, not {key}")));
        }
        let seed = field("seed")?
            .parse()
            .map_err(|_| fail("bad `seed`".into()))?;
        let timings =
            serde_json::from_str(field("timings")?).map_err(|e| fail(format!("timings: {e}")))?;
        let tensors = SafeTensors::deserialize(&bytes).map_err(|e| fail(e.to_string()))?;
        let read = |name: &str, dtype: Dtype| -> Result<(Vec<usize>, Vec<[u8; 8]>), McError> {
            let view = tensors.tensor(name).map_err(|e| fail(e.to_string()))?;
            if view.dtype() != dtype {
                return Err(fail(format!(
                    "`{name}` is {:?}, expected {dtype:?}",
                    view.dtype()
                )));
            }
            let words = view
                .data()
                .chunks_exact(8)
                .map(|b| b.try_into().expect("8 bytes"))
                .collect();
            Ok((view.shape().to_vec(), words))
        };
        let (_, count) = read("count", Dtype::U64)?;
        let (shape, mean) = read("mean", Dtype::F64)?;
        let (_, variance) = read("variance", Dtype::F64)?;
        let dims = shape.get(1).copied().unwrap_or(0);
        let count = count.into_iter().map(u64::from_le_bytes).collect();
        let mean = mean.into_iter().map(f64::from_le_bytes).collect();
        let variance: Vec<f64> = variance.into_iter().map(f64::from_le_bytes).collect();
        let stats = EmbeddingStats::from_variances(dims, count, mean, &variance)
            .map_err(|e| fail(e.to_string()))?;
        Ok(TrialRecord {
            key: key.clone(),
            seed,
            stats,
            timings,
        })
    }
}

/// Every trial of `experiment` found in `stores`, each read once (the first store holding it
/// wins), checked to belong to the experiment; with the keys of those missing.
pub fn collect_trials(
    experiment: &Experiment,
    stores: &[TrialStore],
) -> Result<(Vec<TrialRecord>, Vec<TrialKey>), McError> {
    for store in stores {
        let differences = store.experiment.differences(experiment);
        if !differences.is_empty() {
            return Err(McError::Store(format!(
                "{} holds another experiment (it differs in {})",
                store.dir.display(),
                differences.join(", ")
            )));
        }
    }
    let (mut records, mut missing) = (Vec::new(), Vec::new());
    for key in experiment.trial_keys() {
        match stores.iter().find(|s| s.contains(&key)) {
            Some(store) => records.push(store.load(&key)?),
            None => missing.push(key),
        }
    }
    Ok((records, missing))
}

fn view<'a>(dtype: Dtype, shape: Vec<usize>, bytes: &'a [u8]) -> Result<TensorView<'a>, McError> {
    TensorView::new(dtype, shape, bytes).map_err(|e| McError::Store(e.to_string()))
}

fn io(path: &Path, e: std::io::Error) -> McError {
    McError::Store(format!("{}: {e}", path.display()))
}

/// Writes `bytes` to `path` whole or not at all ([`kiln_io::write_atomic`]).
fn write_atomically(path: &Path, bytes: &[u8]) -> Result<(), McError> {
    kiln_io::write_atomic(path, bytes).map_err(|e| McError::Store(e.to_string()))
}
