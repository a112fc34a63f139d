//! Checkpoints: `checkpoints/step-00000120/` holding the model (`model.bin`), AdamW's moments
//! (`optimizer.bin`, burn records at full precision, so f32 values round-trip bit for bit) and
//! `state.json` (step, data position, loss scale, best metric, the run's settings and the model's
//! parameter shapes). A checkpoint is written into a temporary directory and renamed into place,
//! so a run killed at any moment, or a full disk, leaves every earlier checkpoint whole; the
//! newest complete one is what a rerun resumes from.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};

use burn::module::AutodiffModule;
use burn::record::{BinBytesRecorder, BinFileRecorder, FullPrecisionSettings, Recorder};
use burn::tensor::backend::AutodiffBackend;
use kiln_io::StagedDir;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::TrainError;
use crate::optim::{GroupedAdamW, GroupedAdamWRecord, ParamInfo};

/// Everything but the tensors that a resumed run needs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CheckpointState {
    /// Optimizer steps taken.
    pub step: u64,
    /// The epoch the next batch comes from.
    pub epoch: u64,
    /// The next batch's index in that epoch.
    pub batch: usize,
    /// The loss scale and its finite steps since it last changed.
    pub loss_scale: (f32, u32),
    /// The best evaluation so far: the metric's value and the step.
    pub best: Option<(f64, u64)>,
    /// Evaluations since the best one.
    pub evals_since_best: usize,
    /// Steps skipped for non-finite values, in all and in a row at the end.
    pub skipped: (u64, usize),
    /// Whether early stopping ended the run.
    pub stopped_early: bool,
    /// The run's settings (training and model) the checkpoint was written with.
    pub settings: Value,
    /// The model's parameters (paths and shapes).
    pub params: Vec<ParamInfo>,
    /// The checksum ([`kiln_io::checksum`]) of every other file of the checkpoint, by name:
    /// a damaged file is found before it is read.
    #[serde(default)]
    pub files: BTreeMap<String, String>,
}

/// The checkpoint directory of a run.
#[derive(Debug, Clone)]
pub struct Checkpoints {
    dir: PathBuf,
}

const STATE: &str = "state.json";
const MODEL: &str = "model";
const OPTIMIZER: &str = "optimizer";

/// The file burn's file recorder reads for `name` (it adds the extension).
fn file_name(name: &str) -> String {
    format!("{name}.bin")
}

fn recorder() -> BinFileRecorder<FullPrecisionSettings> {
    BinFileRecorder::new()
}

impl Checkpoints {
    /// Checkpoints under `dir`.
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        Checkpoints { dir: dir.into() }
    }

    /// The directory of the checkpoint after `step` steps.
    pub fn path(&self, step: u64) -> PathBuf {
        self.dir.join(format!("step-{step:08}"))
    }

    /// The complete checkpoints, oldest first.
    pub fn list(&self) -> Vec<(u64, PathBuf)> {
        let Ok(entries) = fs::read_dir(&self.dir) else {
            return Vec::new();
        };
        let mut found: Vec<(u64, PathBuf)> = entries
            .flatten()
            .filter_map(|e| {
                let name = e.file_name().into_string().ok()?;
                let step = name.strip_prefix("step-")?.parse().ok()?;
                e.path().join(STATE).is_file().then(|| (step, e.path()))
            })
            .collect();
        found.sort();
        found
    }

    /// The newest intact checkpoint's state, if any. A damaged one (its state unreadable, a
    /// file missing or not matching its checksum) is moved aside as `damaged-step-N` with a
    /// warning, and the one before it is taken.
    pub fn latest(&self) -> Result<Option<(PathBuf, CheckpointState)>, TrainError> {
        for (step, path) in self.list().into_iter().rev() {
            match intact(&path) {
                Ok(state) => return Ok(Some((path, state))),
                Err(problem) => {
                    let aside = self.dir.join(format!("damaged-step-{step:08}"));
                    log::warn!(
                        "the checkpoint {} is damaged ({problem}): moved aside to {}; resuming from the one before it, if any",
                        path.display(),
                        aside.display()
                    );
                    fs::rename(&path, &aside).map_err(|e| TrainError::io(&path, e))?;
                }
            }
        }
        Ok(None)
    }

    /// Writes a checkpoint of `model` and `optimizer` at `state.step`, then deletes the older
    /// ones beyond the newest `keep_last` (never the best). On any error the earlier
    /// checkpoints are untouched.
    pub fn save<B: AutodiffBackend, M: AutodiffModule<B>>(
        &self,
        state: &CheckpointState,
        model: &M,
        optimizer: &GroupedAdamW<B, M>,
        keep_last: usize,
    ) -> Result<PathBuf, TrainError> {
        let target = self.path(state.step);
        fs::create_dir_all(&self.dir).map_err(|e| TrainError::io(&self.dir, e))?;
        // Written under a temporary name, renamed into place: a crash leaves no half checkpoint.
        let staged = StagedDir::new(&target)?;
        // Encoded in memory (the bytes burn's file recorder would write) and written by
        // kiln-io, so a full disk is said as such and the checksums need no second read.
        let bytes = BinBytesRecorder::<FullPrecisionSettings>::default();
        let encoded = [
            (
                MODEL,
                Recorder::<B>::record(&bytes, model.clone().into_record(), ()),
            ),
            (
                OPTIMIZER,
                Recorder::<B>::record(&bytes, optimizer.to_record(), ()),
            ),
        ];
        let mut state = state.clone();
        for (name, encoded) in encoded {
            let encoded = encoded.map_err(|e| {
                TrainError::Checkpoint(format!("encoding the checkpoint's {name}: {e:?}"))
            })?;
            let name = file_name(name);
            staged.write(&name, &encoded)?;
            state.files.insert(name, kiln_io::checksum(&encoded));
        }
        let json = serde_json::to_string_pretty(&state).expect("the state serialises");
        staged.write(STATE, json.as_bytes())?;
        staged.commit()?;
        self.prune(keep_last, state.best.map(|(_, step)| step));
        Ok(target)
    }

    /// Deletes all but the newest `keep_last` checkpoints and the one at `best_step`.
    fn prune(&self, keep_last: usize, best_step: Option<u64>) {
        let all = self.list();
        let old = all.len().saturating_sub(keep_last.max(1));
        for (step, path) in &all[..old] {
            if Some(*step) != best_step
                && let Err(e) = fs::remove_dir_all(path)
            {
                log::warn!(
                    "could not delete the old checkpoint {}: {e}",
                    path.display()
                );
            }
        }
    }

    /// Loads the model of the checkpoint at `path` into `model` (parameter ids included:
    /// build the optimizer after this).
    pub fn load_model<B: AutodiffBackend, M: AutodiffModule<B>>(
        path: &Path,
        model: M,
        device: &B::Device,
    ) -> Result<M, TrainError> {
        model
            .load_file(path.join(MODEL), &recorder(), device)
            .map_err(|e| {
                TrainError::Checkpoint(format!("reading the model of {}: {e}", path.display()))
            })
    }

    /// Loads the optimizer state of the checkpoint at `path` into `optimizer`, built for the
    /// model [`Self::load_model`] loaded.
    pub fn load_optimizer<B: AutodiffBackend, M: AutodiffModule<B>>(
        path: &Path,
        optimizer: GroupedAdamW<B, M>,
        device: &B::Device,
    ) -> Result<GroupedAdamW<B, M>, TrainError> {
        let failed = |e: &dyn std::fmt::Display| {
            TrainError::Checkpoint(format!(
                "reading the optimizer state of {}: {e}",
                path.display()
            ))
        };
        let record: GroupedAdamWRecord<B, M> =
            Recorder::<B>::load(&recorder(), path.join(OPTIMIZER), device)
                .map_err(|e| failed(&e))?;
        optimizer.load_record(record)
    }
}

/// The state of the checkpoint at `path` once every file it names matches its checksum; what
/// is wrong otherwise.
fn intact(path: &Path) -> Result<CheckpointState, String> {
    let file = path.join(STATE);
    let text = fs::read_to_string(&file).map_err(|e| format!("{STATE}: {e}"))?;
    let state: CheckpointState = serde_json::from_str(&text)
        .map_err(|e| format!("{STATE} is not a kiln checkpoint state: {e}"))?;
    if state.files.is_empty() {
        return Err("no checksums: written by an older kiln, or cut short".into());
    }
    for (name, expected) in &state.files {
        let bytes = fs::read(path.join(name)).map_err(|e| format!("{name}: {e}"))?;
        if kiln_io::checksum(&bytes) != *expected {
            return Err(format!("{name} does not match its checksum"));
        }
    }
    Ok(state)
}

/// Why a checkpoint written with `saved` settings and parameters cannot continue a run with
/// `settings` and `params`: every difference, named, one per entry (at most ten, then a count).
pub fn compatible(
    saved: &CheckpointState,
    settings: &Value,
    params: &[ParamInfo],
) -> Result<(), Vec<String>> {
    let mut differences = settings_differences(&saved.settings, settings, "checkpoint");
    for param in &saved.params {
        match params.iter().find(|p| p.path == param.path) {
            Some(p) if p.shape == param.shape => {}
            Some(p) => differences.push(format!(
                "parameter {}: checkpoint shape {:?}, this model {:?}",
                param.path, param.shape, p.shape
            )),
            None => differences.push(format!(
                "parameter {} {:?} is not in this model",
                param.path, param.shape
            )),
        }
    }
    for param in params {
        if !saved.params.iter().any(|p| p.path == param.path) {
            differences.push(format!(
                "parameter {} {:?} is not in the checkpoint",
                param.path, param.shape
            ));
        }
    }
    if differences.is_empty() {
        return Ok(());
    }
    Err(shown(&differences))
}

/// Every difference between settings recorded `before` and the ones `now`, by dotted key (at
/// most ten, then a count).
pub(crate) fn differences(before: &Value, now: &Value) -> Vec<String> {
    shown(&settings_differences(before, now, "earlier run"))
}

fn settings_differences(before: &Value, now: &Value, saved_as: &str) -> Vec<String> {
    let mut differences = Vec::new();
    let (mut old, mut new) = (Vec::new(), Vec::new());
    flatten("", before, &mut old);
    flatten("", now, &mut new);
    for (key, value) in &old {
        match new.iter().find(|(k, _)| k == key) {
            Some((_, v)) if v == value => {}
            Some((_, v)) => differences.push(format!("{key}: {saved_as} {value}, this run {v}")),
            None => differences.push(format!("{key}: {saved_as} {value}, this run has none")),
        }
    }
    for (key, value) in &new {
        if !old.iter().any(|(k, _)| k == key) {
            differences.push(format!("{key}: {saved_as} has none, this run {value}"));
        }
    }
    differences
}

/// The first ten of `differences`, and how many more there are.
fn shown(differences: &[String]) -> Vec<String> {
    let mut shown = differences[..differences.len().min(10)].to_vec();
    if differences.len() > shown.len() {
        shown.push(format!("… and {} more", differences.len() - shown.len()));
    }
    shown
}

/// `value`'s leaves as (dotted key, value).
pub(crate) fn flatten(prefix: &str, value: &Value, out: &mut Vec<(String, Value)>) {
    match value {
        Value::Object(map) => {
            for (k, v) in map {
                let key = if prefix.is_empty() {
                    k.clone()
                } else {
                    format!("{prefix}.{k}")
                };
                flatten(&key, v, out);
            }
        }
        leaf => out.push((prefix.to_string(), leaf.clone())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn state(settings: Value, params: Vec<ParamInfo>) -> CheckpointState {
        CheckpointState {
            step: 3,
            epoch: 0,
            batch: 3,
            loss_scale: (1.0, 0),
            best: None,
            evals_since_best: 0,
            skipped: (0, 0),
            stopped_early: false,
            settings,
            params,
            files: BTreeMap::new(),
        }
    }

    fn param(path: &str, shape: &[usize]) -> ParamInfo {
        ParamInfo {
            path: path.into(),
            id: None,
            shape: shape.to_vec(),
        }
    }

    #[test]
    fn every_difference_is_named() {
        let saved = state(
            json!({"lr": 0.001, "model": {"hidden": 64, "layers": 2}}),
            vec![param("fc.weight", &[4, 3]), param("fc.bias", &[3])],
        );
        assert!(compatible(&saved, &saved.settings.clone(), &saved.params.clone()).is_ok());
        let e = compatible(
            &saved,
            &json!({"lr": 0.002, "model": {"hidden": 64, "layers": 2}, "extra": true}),
            &[param("fc.weight", &[4, 5]), param("head.bias", &[5])],
        )
        .unwrap_err()
        .join("\n");
        for needle in [
            "lr: checkpoint 0.001, this run 0.002",
            "extra: checkpoint has none",
            "fc.weight: checkpoint shape [4, 3], this model [4, 5]",
            "fc.bias [3] is not in this model",
            "head.bias [5] is not in the checkpoint",
        ] {
            assert!(e.contains(needle), "`{needle}` missing from:\n{e}");
        }
    }

    #[test]
    fn only_complete_intact_checkpoints_count_and_the_newest_is_latest() {
        let dir = tempfile::tempdir().unwrap();
        let checkpoints = Checkpoints::new(dir.path());
        assert!(checkpoints.latest().unwrap().is_none());
        for step in [2u64, 10, 11] {
            let path = checkpoints.path(step);
            fs::create_dir_all(&path).unwrap();
            let mut s = state(json!({}), vec![]);
            s.step = step;
            let weights = format!("weights of step {step}");
            fs::write(path.join("model.bin"), &weights).unwrap();
            s.files
                .insert("model.bin".into(), kiln_io::checksum(weights.as_bytes()));
            fs::write(path.join(STATE), serde_json::to_string(&s).unwrap()).unwrap();
        }
        // The newest one damaged: moved aside, the one before it taken.
        fs::write(checkpoints.path(11).join("model.bin"), "weights of step 1l").unwrap();
        // A checkpoint cut off before its state was written, and a temporary directory.
        fs::create_dir_all(checkpoints.path(12)).unwrap();
        fs::create_dir_all(dir.path().join(".step-00000014.kiln-1-0.tmp")).unwrap();
        let (path, latest) = checkpoints.latest().unwrap().unwrap();
        assert_eq!(latest.step, 10);
        assert_eq!(path, checkpoints.path(10));
        assert!(dir.path().join("damaged-step-00000011/model.bin").is_file());
        checkpoints.prune(1, Some(2));
        let left: Vec<u64> = checkpoints.list().into_iter().map(|(s, _)| s).collect();
        assert_eq!(left, [2, 10], "the best (2) and the newest stay");
    }
}
