//! Training a PaiNN potential on labelled structures through kiln-train: the data (extxyz with
//! reference energies and forces), batches, the training step (the force-matching loss of
//! `loss.rs`), the evaluation metrics and MLFF-Distiller's recipe as defaults.

use std::path::Path;
use std::sync::Arc;

use burn::backend::Autodiff;
use burn::module::{AutodiffModule, Module};
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{Tensor, TensorData};
use kiln_train::{
    BadBatch, BestMetric, EvalOutput, EvalStep, HostData, Loader, OptimizerConfig, Schedule,
    StepContext, StepOutput, TrainConfig, TrainStep,
};

use crate::ForceFieldError;
use crate::extxyz::read_extxyz;
use crate::labels::{LabelKeys, Labels};
use crate::loss::{LossWeights, check_forces, cosine, loss_value};
use crate::neighbors::neighbor_list;
use crate::painn::{CLOSEST_PLAUSIBLE_DISTANCE, Doubt, Painn};
use crate::structure::Structure;

/// Structures with their reference labels: a training or validation set.
#[derive(Debug, Clone, Default)]
pub struct LabelledStructures {
    /// The structures.
    pub structures: Vec<Structure>,
    /// Their labels, in the same order.
    pub labels: Vec<Labels>,
}

impl LabelledStructures {
    /// Every frame of an extxyz file with the labels `keys` name. An unreadable file, a frame
    /// with an unknown element or without a label or with a non-finite one is an error naming
    /// the file, the structure (1-based) and its line.
    pub fn from_extxyz(path: &Path, keys: &LabelKeys) -> Result<Self, ForceFieldError> {
        let fail =
            |e: &dyn std::fmt::Display| ForceFieldError::Config(format!("{}: {e}", path.display()));
        let text = kiln_io::read_text(path).map_err(|e| ForceFieldError::Config(e.to_string()))?;
        let frames = read_extxyz(&text).map_err(|e| fail(&e))?;
        let labels = frames
            .iter()
            .enumerate()
            .map(|(index, frame)| {
                // An unknown symbol reads as atomic number 0: said as written, with its line.
                if let Some((atom, symbol)) = frame.unknown_species.first_key_value() {
                    return Err(ForceFieldError::Structure {
                        index,
                        reason: format!(
                            "line {}: atom {} has unknown element `{symbol}`",
                            frame.line,
                            atom + 1
                        ),
                    });
                }
                keys.read(frame, index)
            })
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| fail(&e))?;
        Ok(LabelledStructures {
            structures: frames.into_iter().map(|f| f.structure).collect(),
            labels,
        })
    }

    /// Structures in the set.
    pub fn len(&self) -> usize {
        self.structures.len()
    }

    /// Whether the set is empty.
    pub fn is_empty(&self) -> bool {
        self.structures.is_empty()
    }

    /// Checks that a model embedding elements below `max_z` with `cutoff` (Å) can evaluate every
    /// structure, with one force label per atom: an error names the first that cannot (1-based),
    /// so a run fails before it starts rather than at some batch.
    ///
    /// Returns how many structures of more than one atom have no pair of atoms within
    /// `cutoff`: the model sees no interaction in them, only per-element energies (a cutoff
    /// too short for the data, worth a warning).
    pub fn check(&self, cutoff: f64, max_z: usize) -> Result<usize, ForceFieldError> {
        if self.is_empty() {
            return Err(ForceFieldError::Config("the set has no structures".into()));
        }
        let mut unconnected = 0;
        for (index, (structure, labels)) in self.structures.iter().zip(&self.labels).enumerate() {
            structure.validate(index, max_z)?;
            let pairs = neighbor_list(structure, cutoff).map_err(|e| e.in_structure(index))?;
            if structure.len() > 1 && pairs.i.is_empty() {
                unconnected += 1;
            }
            let closest = pairs.closest(structure);
            if closest < CLOSEST_PLAUSIBLE_DISTANCE {
                // As the force-field example warns when it evaluates such a structure.
                log::warn!(
                    "structure {}: {}",
                    index + 1,
                    Doubt::TooClose { distance: closest }
                );
            }
            check_forces(index, structure, labels)?;
        }
        Ok(unconnected)
    }

    /// The set in batches of `batch` structures (at least 1) under the loss `weights`, made on
    /// background threads.
    pub fn loader(&self, batch: usize, weights: LossWeights) -> impl Loader<Batch = ForceBatch> {
        let set = Arc::new(self.clone());
        HostData::new(
            self.len(),
            batch,
            move |items: &[usize]| ForceBatch {
                structures: items.iter().map(|&i| set.structures[i].clone()).collect(),
                labels: items.iter().map(|&i| set.labels[i].clone()).collect(),
                weights,
            },
            |batch: ForceBatch| batch,
        )
    }
}

/// One batch: structures, their labels and the loss's weights.
#[derive(Debug, Clone)]
pub struct ForceBatch {
    /// The structures.
    pub structures: Vec<Structure>,
    /// Their labels.
    pub labels: Vec<Labels>,
    /// The loss's weights.
    pub weights: LossWeights,
}

/// The device a module's parameters are on.
fn device_of<B: Backend, M: Module<B>>(module: &M) -> B::Device {
    module.devices().into_iter().next().unwrap_or_default()
}

impl<B: AutodiffBackend> TrainStep<B> for Painn<B> {
    type Batch = ForceBatch;

    /// The force-matching loss; its parts are logged unweighted (`energy_mse` in eV²,
    /// `force_mse` in eV²/Å², `cosine_distance`, and `stress_mse` when stress is trained).
    ///
    /// A model with `shared_interactions` (blocks sharing one set of weights in schnetpack)
    /// holds the shared blocks as copies, which training updates separately: they untie.
    /// A batch [`LabelledStructures::check`] would refuse is a [`BadBatch`].
    fn train_step(
        &self,
        batch: ForceBatch,
        _context: &StepContext,
    ) -> Result<StepOutput<B>, BadBatch> {
        let device = device_of(self);
        let loss = self
            .force_loss(&batch.structures, &batch.labels, &batch.weights, &device)
            .map_err(|e| BadBatch(e.to_string()))?;
        let output = StepOutput::new(loss.loss, batch.structures.len())
            .with_part("energy_mse", loss.energy_mse)
            .with_part("force_mse", loss.force_mse)
            .with_part("cosine_distance", loss.cosine_distance);
        Ok(if batch.weights.stress != 0.0 {
            output.with_part("stress_mse", loss.stress_mse)
        } else {
            output
        })
    }
}

/// Sums of the errors of one batch's predictions against its labels.
#[derive(Debug, Default, Clone, Copy)]
struct Errors {
    loss: f64,
    energy_abs_per_atom: f64,
    energy_squared_per_atom: f64,
    force_abs: f64,
    force_squared: f64,
    cosine: f64,
}

impl<B: Backend> EvalStep<B> for Painn<B> {
    type Batch = ForceBatch;

    /// Over the evaluation set: `loss` (the training loss, averaged over batches by their
    /// sizes), `energy_mae_per_atom` and `energy_rmse_per_atom` (eV/atom: each structure's
    /// error divided by its atoms), `force_mae` and `force_rmse` (eV/Å, over every component)
    /// and `force_cosine` (the mean cosine between predicted and reference forces).
    fn eval_step(&self, batch: ForceBatch) -> Result<EvalOutput<B>, BadBatch> {
        let device = device_of(self);
        // Forces need a backward pass: the same weights on the autodiff backend.
        let model = Painn::<Autodiff<B>>::from_inner(self.clone());
        let bad = |e: ForceFieldError| BadBatch(e.to_string());
        let predicted = model.predict(&batch.structures, &device).map_err(bad)?;
        let loss = loss_value(&batch.structures, &batch.labels, &batch.weights, &predicted)
            .map_err(bad)?;
        let items = batch.structures.len();
        let mut errors = Errors {
            loss: loss * items as f64,
            ..Errors::default()
        };
        for (s, labels) in batch.labels.iter().enumerate() {
            let per_atom = (predicted.energies[s] - labels.energy) / labels.forces.len() as f64;
            errors.energy_abs_per_atom += per_atom.abs();
            errors.energy_squared_per_atom += per_atom * per_atom;
        }
        let targets = batch.labels.iter().flat_map(|l| &l.forces);
        for (f, t) in predicted.forces.iter().zip(targets) {
            errors.cosine += cosine(f, t).0;
            for a in 0..3 {
                errors.force_abs += (f[a] - t[a]).abs();
                errors.force_squared += (f[a] - t[a]).powi(2);
            }
        }
        let atoms = predicted.forces.len();
        let value = |v: f64| Tensor::<B, 1>::from_data(TensorData::new(vec![v], [1]), &device);
        Ok(EvalOutput::new(items)
            .with_sum("loss", value(errors.loss))
            .with_sum("energy_mae_per_atom", value(errors.energy_abs_per_atom))
            .with_root_mean(
                "energy_rmse_per_atom",
                value(errors.energy_squared_per_atom),
                items,
            )
            .with_mean("force_mae", value(errors.force_abs), 3 * atoms)
            .with_root_mean("force_rmse", value(errors.force_squared), 3 * atoms)
            .with_mean("force_cosine", value(errors.cosine), atoms))
    }
}

/// How to train a potential; the defaults are MLFF-Distiller's: AdamW (lr 1e-3, weight decay
/// 1e-5), 1 000 warm-up steps from 1e-7, cosine down to 1e-7, clipping at 1.0, batch 16, 100
/// epochs, early stopping after 20 epochs without a better validation loss, and the loss
/// `1·MSE(E) + 100·MSE(F) + 10·mean(1 − cos)`.
#[derive(Debug, Clone, PartialEq)]
pub struct Recipe {
    /// Passes over the training set.
    pub epochs: u64,
    /// Structures per batch.
    pub batch: usize,
    /// Peak learning rate.
    pub lr: f64,
    /// AdamW's decoupled weight decay.
    pub weight_decay: f64,
    /// Linear warm-up steps.
    pub warmup_steps: u64,
    /// The learning rate at the start of the warm-up and at the end of the cosine.
    pub lr_floor: f64,
    /// Largest global gradient norm.
    pub max_grad_norm: Option<f64>,
    /// Epochs without a better validation loss before stopping (`None`: never).
    pub patience: Option<usize>,
    /// The loss's weights.
    pub weights: LossWeights,
    /// Seeds the data order.
    pub seed: u64,
}

impl Default for Recipe {
    fn default() -> Self {
        Recipe {
            epochs: 100,
            batch: 16,
            lr: 1e-3,
            weight_decay: 1e-5,
            warmup_steps: 1_000,
            lr_floor: 1e-7,
            max_grad_norm: Some(1.0),
            patience: Some(20),
            weights: LossWeights::mlff_distiller(),
            seed: 0,
        }
    }
}

impl Recipe {
    /// kiln-train's settings for a training set of `structures`: one evaluation and one
    /// checkpoint per epoch, the best by validation loss.
    pub fn train_config(&self, structures: usize) -> Result<TrainConfig, ForceFieldError> {
        if self.batch == 0 {
            return Err(ForceFieldError::Config(
                "the batch size must be at least 1".into(),
            ));
        }
        if structures == 0 {
            return Err(ForceFieldError::Config("the training set is empty".into()));
        }
        if !(self.lr > 0.0 && self.lr.is_finite()) {
            return Err(ForceFieldError::Config(format!(
                "learning rate {}: must be positive",
                self.lr
            )));
        }
        let per_epoch = structures.div_ceil(self.batch) as u64;
        let steps = self.epochs.max(1) * per_epoch;
        let floor = (self.lr_floor / self.lr).min(1.0);
        let mut config = TrainConfig::new(steps, self.lr);
        config.optimizer = OptimizerConfig::adamw(self.lr).with_weight_decay(self.weight_decay);
        config.schedule =
            Schedule::warmup_cosine(self.warmup_steps.min(steps), floor, floor, steps);
        config.max_grad_norm = self.max_grad_norm;
        config.eval_every = per_epoch;
        config.checkpoint_every = per_epoch;
        config.best = Some(BestMetric {
            name: "loss".into(),
            higher_is_better: false,
        });
        config.patience = self.patience;
        config.seed = self.seed;
        config
            .validate()
            .map_err(|e| ForceFieldError::Config(e.to_string()))?;
        Ok(config)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An unknown symbol is named as written, with its structure and line (it was reported as
    /// "atomic number 0").
    #[test]
    fn an_unknown_element_is_named_with_its_line() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("train.extxyz");
        let frame = |symbol: &str| {
            format!(
                "2\nProperties=species:S:1:pos:R:3:forces:R:3 energy=-1.0 pbc=\"F F F\"\n\
                 H 0 0 0 0 0 0\n{symbol} 0 0 0.74 0 0 0\n"
            )
        };
        std::fs::write(&path, frame("H") + &frame("Xx")).unwrap();
        let err = LabelledStructures::from_extxyz(&path, &LabelKeys::default()).unwrap_err();
        assert_eq!(
            err.to_string(),
            format!(
                "{}: structure 2: line 5: atom 2 has unknown element `Xx`",
                path.display()
            )
        );
    }
}
