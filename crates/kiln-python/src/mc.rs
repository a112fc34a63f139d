//! The main job from Python: `kiln.mc.run(...)`, K trials of T Monte-Carlo dropout passes of a
//! vision tower over a folder of images decoded once (kiln-cache), and what the trials say about
//! how many passes are enough (kiln-mc's [`NestedStats`]), as numpy arrays.

use std::path::PathBuf;
use std::time::Instant;

use burn::tensor::backend::Backend;
use kiln_cache::{ImageCache, ImageSource, Residency};
use kiln_core::{DeviceJob, PolicySpec};
use kiln_mc::{EmbeddingStats, McError, NestedStats, TrialRunner, batch_rows, trial_seed};
use kiln_vision::{DropoutSites, VisionConfig, VisionModel};
use numpy::IntoPyArray;
use numpy::ndarray::{Array1, Array2};
use pyo3::exceptions::{PyFileNotFoundError, PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::vision;

/// One experiment over one model.
struct Job {
    dir: PathBuf,
    name: String,
    images: PathBuf,
    cache: PathBuf,
    passes: Vec<u32>,
    trials: u32,
    dropout: DropoutSites,
    seed: u64,
    batch: Option<usize>,
    policy: PolicySpec,
}

/// What a run gives: per pass count the between-trial statistics, and over every trial of the
/// largest pass count each image's mean embedding and its variance.
struct Outcome {
    rows: Vec<NestedStats>,
    pooled: EmbeddingStats,
    names: Vec<String>,
    seconds: f64,
}

impl DeviceJob for Job {
    type Output = PyResult<Outcome>;

    fn run<B: Backend>(self, device: &B::Device) -> Self::Output {
        let policy = crate::resolve::<B>(&self.policy, device)?;
        let config = VisionConfig::from_hf_config(&self.dir).map_err(|e| vision::error(&e))?;
        let preprocess = vision::preprocess(&self.dir)?;
        let cached = ImageCache::new(&self.cache)
            .load(&ImageSource::Folder(self.images.clone()), &preprocess)
            .map_err(|e| PyValueError::new_err(format!("{}: {e}", self.images.display())))?;
        let model = VisionModel::<B>::from_hf_dir(&self.dir, device, &policy)
            .and_then(|m| m.with_dropout(self.dropout))
            .map_err(|e| vision::error(&e))?;
        let feed = cached.to_device::<B>(device, policy.compute, Residency::Device);
        let (width, height) = cached.size();
        let per_row =
            config.activation_bytes(height as usize, width as usize, policy.compute.size_of());
        let rows = self
            .batch
            .unwrap_or_else(|| batch_rows::<B>(device, per_row, None, 0));
        let runner = TrialRunner::new(&model, &feed).batch(rows);
        let start = Instant::now();
        let failed = |e: McError| PyRuntimeError::new_err(e.to_string());
        let mut outcome_rows = Vec::new();
        let mut pooled = None;
        for &passes in &self.passes {
            let trials = (0..self.trials)
                .map(|k| {
                    let seed = trial_seed(self.seed, &self.name, passes, k);
                    runner.run(passes, seed, &mut |_| {}).map(|t| t.stats)
                })
                .collect::<Result<Vec<_>, _>>()
                .map_err(failed)?;
            outcome_rows.push(NestedStats::new(&trials).map_err(failed)?);
            let mut all = trials[0].clone();
            for trial in &trials[1..] {
                all.merge(trial).map_err(failed)?;
            }
            pooled = Some(all);
        }
        Ok(Outcome {
            rows: outcome_rows,
            pooled: pooled.expect("at least one pass count"),
            names: cached.names().map(str::to_string).collect(),
            seconds: start.elapsed().as_secs_f64(),
        })
    }
}

/// Runs the nested Monte-Carlo experiment: for each pass count T in `passes`, `trials` trials of
/// T stochastic passes of the tower in `model_dir` (dropout at `dropout`'s sites) over the
/// images in the folder `images`; returns a dict of numpy arrays.
#[pyfunction]
#[pyo3(signature = (model_dir, images, passes, trials = 4, dropout = "0.1", seed = 0, batch = None, device = "cpu", policy = "full", cache_dir = None))]
#[allow(clippy::too_many_arguments)] // Python keyword arguments, each with its default.
pub fn run<'py>(
    py: Python<'py>,
    model_dir: PathBuf,
    images: PathBuf,
    passes: Vec<u32>,
    trials: u32,
    dropout: &str,
    seed: u64,
    batch: Option<usize>,
    device: &str,
    policy: &str,
    cache_dir: Option<PathBuf>,
) -> PyResult<Bound<'py, PyDict>> {
    for (what, path) in [("model_dir", &model_dir), ("images", &images)] {
        if !path.is_dir() {
            return Err(PyFileNotFoundError::new_err(format!(
                "{what} {}: no such directory",
                path.display()
            )));
        }
    }
    if passes.is_empty() || passes.contains(&0) {
        return Err(PyValueError::new_err(format!(
            "passes {passes:?}: give one or more pass counts, each at least 1"
        )));
    }
    if trials < 2 {
        return Err(PyValueError::new_err(format!(
            "trials {trials}: the between-trial statistics need at least 2"
        )));
    }
    if batch == Some(0) {
        return Err(PyValueError::new_err("batch must be at least 1"));
    }
    let dropout = dropout
        .parse::<DropoutSites>()
        .map_err(|e| PyValueError::new_err(format!("dropout {dropout:?}: {e}")))?;
    let name = model_dir
        .file_name()
        .map_or_else(|| "model".into(), |n| n.to_string_lossy().into_owned());
    let cache = cache_dir.unwrap_or_else(ImageCache::default_dir);
    // The cache is written; the images and the model are read: never one inside the other.
    kiln_io::RunFiles::new()
        .input("the images", &images)
        .input("the model (model_dir)", &model_dir)
        .cache_dir("cache_dir", &cache)
        .check()
        .map_err(|e| PyValueError::new_err(e.to_string()))?;
    let job = Job {
        dir: model_dir,
        name,
        images,
        cache,
        passes: passes.clone(),
        trials,
        dropout,
        seed,
        batch,
        policy: crate::policy(policy)?,
    };
    let outcome = crate::released(py, || crate::on_device(device, job))???;
    let column =
        |f: fn(&NestedStats) -> f64| Array1::from_iter(outcome.rows.iter().map(f)).into_pyarray(py);
    let pooled = &outcome.pooled;
    let (images, dims) = (pooled.images(), pooled.dims());
    let mean: Vec<f64> = (0..images).flat_map(|i| pooled.mean(i).to_vec()).collect();
    let variance: Vec<f64> = (0..images).flat_map(|i| pooled.variance(i)).collect();
    let shape = (images, dims);
    let dict = PyDict::new(py);
    dict.set_item("passes", Array1::from_vec(passes).into_pyarray(py))?;
    dict.set_item("mean_variance", column(|r| r.mean_variance))?;
    dict.set_item("uncertainty", column(|r| r.uncertainty))?;
    dict.set_item("uncertainty_spread", column(|r| r.uncertainty_spread))?;
    dict.set_item("rank_stability", column(|r| r.rank_stability))?;
    let array = |values| Array2::from_shape_vec(shape, values).expect("images × dims");
    dict.set_item("mean", array(mean).into_pyarray(py))?;
    dict.set_item("variance", array(variance).into_pyarray(py))?;
    dict.set_item("names", outcome.names)?;
    dict.set_item("seconds", outcome.seconds)?;
    Ok(dict)
}
