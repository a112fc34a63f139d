//! Finished trials on disk: what makes a run resumable, shardable and mergeable.
//!
//! A results directory holds `experiment.json` (the [`Experiment`] its trials belong to) and one
//! safetensors file per finished trial under `trials/`: `count` `[N]` u64, `mean` and `variance`
//! `[N, D]` f64 (per image, over the trial's passes), optionally `pass_features` `[N, T, D]` f32,
//! and the key, seed, timings and a checksum of all of it in the file's metadata. Files are
//! written whole or not at all (kiln-io), so a killed run leaves only whole trials; rerunning the
//! same experiment into the directory skips them, and runs again any whose file does not read
//! back whole (moved into `trials/damaged/` first).

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
/// Where damaged trial files are moved (inside `trials/`) before their trials run again.
const DAMAGED_DIR: &str = "damaged";
/// The metadata field holding a trial file's checksum.
const CHECKSUM: &str = "checksum";

/// [`kiln_io::checksum`] of a trial file's tensor bytes `data` and its other metadata fields.
fn sealed_checksum<'a>(
    data: &[u8],
    metadata: impl IntoIterator<Item = (&'a String, &'a String)>,
) -> String {
    let mut fields: Vec<_> = metadata
        .into_iter()
        .filter(|(k, _)| *k != CHECKSUM)
        .collect();
    fields.sort();
    let mut sealed = data.to_vec();
    for (key, value) in fields {
        sealed.extend_from_slice(key.as_bytes());
        sealed.push(0);
        sealed.extend_from_slice(value.as_bytes());
        sealed.push(0);
    }
    kiln_io::checksum(&sealed)
}

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

    /// Those of `keys` not finished here, in order. A trial file that cannot be read back whole
    /// (cut short, damaged, of another trial) is moved into `trials/damaged/`, said in a
    /// warning, and its trial counts as not finished: it runs again.
    pub fn pending(&self, keys: Vec<TrialKey>) -> Result<Vec<TrialKey>, McError> {
        let mut pending = Vec::new();
        for key in keys {
            if !self.contains(&key) {
                pending.push(key);
            } else if let Err(e) = self.load(&key) {
                let aside = self.move_aside(&key)?;
                log::warn!("{e}; moved to {}: the trial runs again", aside.display());
                pending.push(key);
            }
        }
        Ok(pending)
    }

    /// Moves trial `key`'s file into `trials/damaged/` under a name not taken there.
    fn move_aside(&self, key: &TrialKey) -> Result<PathBuf, McError> {
        let dir = self.dir.join(TRIALS_DIR).join(DAMAGED_DIR);
        fs::create_dir_all(&dir).map_err(|e| io(&dir, e))?;
        let aside = (0..)
            .map(|n| dir.join(format!("{key}.{n}.safetensors")))
            .find(|path| !path.exists())
            .expect("a free name");
        fs::rename(self.path_of(key), &aside).map_err(|e| io(&aside, e))?;
        Ok(aside)
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
        let fail =
            |e: safetensors::SafeTensorError| McError::Store(format!("trial {}: {e}", record.key));
        // The checksum covers the tensors' bytes and the other metadata: serialised once
        // without it to find the bytes, then with it.
        let unsealed =
            safetensors::serialize(tensors.clone(), Some(metadata.clone())).map_err(fail)?;
        let (header, _) = SafeTensors::read_metadata(&unsealed).map_err(fail)?;
        let mut metadata = metadata;
        metadata.insert(
            CHECKSUM.to_string(),
            sealed_checksum(&unsealed[8 + header..], &metadata),
        );
        let bytes = safetensors::serialize(tensors, Some(metadata)).map_err(fail)?;
        write_atomically(&self.path_of(&record.key), &bytes)
    }

    /// Reads finished trial `key`.
    pub fn load(&self, key: &TrialKey) -> Result<TrialRecord, McError> {
        let path = self.path_of(key);
        let fail = |what: String| McError::Store(format!("{}: {what}", path.display()));
        let bytes = fs::read(&path).map_err(|e| fail(e.to_string()))?;
        let (size, header) = SafeTensors::read_metadata(&bytes).map_err(|e| fail(e.to_string()))?;
        let mut metadata: BTreeMap<String, String> = header
            .metadata()
            .clone()
            .map(|m| m.into_iter().collect())
            .unwrap_or_default();
        let stored = metadata
            .remove(CHECKSUM)
            .ok_or_else(|| fail("no checksum (not written by this version of kiln)".into()))?;
        let data = bytes.get(8 + size..).unwrap_or_default();
        if sealed_checksum(data, &metadata) != stored {
            return Err(fail(
                "damaged: its checksum does not match its contents".into(),
            ));
        }
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
            Some(store) => records.push(store.load(&key).map_err(|e| {
                McError::Store(format!(
                    "{e}\nrun the same command that wrote {} again: it moves the file aside \
                     and runs that trial again",
                    store.dir.display()
                ))
            })?),
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

#[cfg(test)]
mod tests {
    use super::*;

    fn experiment() -> Experiment {
        Experiment {
            models: vec!["m".into()],
            passes: vec![2],
            trials: 2,
            seed: 3,
            dropout: "0.1".into(),
            dataset: "d".into(),
            images: 2,
            weights: vec!["w".into()],
            precision: "full".into(),
        }
    }

    fn record(key: &TrialKey) -> TrialRecord {
        let variance = [0.5, 0.25, 1.0, 2.0];
        let stats =
            EmbeddingStats::from_variances(2, vec![2, 2], vec![1.0, -2.0, 3.0, 0.5], &variance)
                .unwrap();
        TrialRecord {
            key: key.clone(),
            seed: 11,
            stats,
            timings: Timings::default(),
        }
    }

    /// A trial file read back whole gives what was saved; one flipped byte anywhere (tensors or
    /// metadata) or a cut makes it unreadable, and a rerun moves it aside and runs the trial
    /// again instead of failing every time.
    #[test]
    fn damaged_trial_files_are_caught_and_run_again() {
        let dir = tempfile::tempdir().unwrap();
        let store = TrialStore::create_or_resume(dir.path(), &experiment()).unwrap();
        let keys = experiment().trial_keys();
        for key in &keys {
            store.save(&record(key), None).unwrap();
        }
        assert_eq!(store.load(&keys[0]).unwrap(), record(&keys[0]));
        assert!(store.pending(keys.clone()).unwrap().is_empty());
        let path = store.path_of(&keys[0]);
        let good = fs::read(&path).unwrap();
        let header = u64::from_le_bytes(good[..8].try_into().unwrap()) as usize;
        let seed_digit = good[8..8 + header]
            .windows(8)
            .position(|w| w == b"\"seed\":\"")
            .map(|at| 8 + at + 8)
            .unwrap();
        for at in [good.len() - 3, 8 + header + 1, seed_digit] {
            let mut bad = good.clone();
            bad[at] ^= 0x04;
            fs::write(&path, &bad).unwrap();
            let err = store.load(&keys[0]).unwrap_err().to_string();
            assert!(err.contains("damaged"), "byte {at}: {err}");
        }
        fs::write(&path, &good[..good.len() / 2]).unwrap();
        assert!(store.load(&keys[0]).is_err());
        let err = collect_trials(&experiment(), std::slice::from_ref(&store))
            .unwrap_err()
            .to_string();
        assert!(err.contains("run the same command"), "{err}");
        assert_eq!(store.pending(keys.clone()).unwrap(), [keys[0].clone()]);
        assert!(!path.exists());
        let aside = dir.path().join("trials/damaged/m_T2_k0.0.safetensors");
        assert_eq!(fs::read(aside).unwrap(), &good[..good.len() / 2]);
        assert_eq!(store.pending(keys.clone()).unwrap(), [keys[0].clone()]);
    }
}
