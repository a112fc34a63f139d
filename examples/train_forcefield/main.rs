//! Trains a PaiNN potential on reference energies and forces (force matching, e.g. distilling a
//! larger model or a quantum-chemistry method into a fast student) with MLFF-Distiller's recipe
//! as defaults: F = 128, 3 blocks, 20 Gaussians, 5 Å cutoff, readout 128→64→32→1; loss
//! 1·MSE(E) + 100·MSE(F) + 10·mean(1 − cos); AdamW (lr 1e-3, weight decay 1e-5), 1 000 warm-up
//! steps from 1e-7 then cosine to 1e-7, clipping at 1.0, batch 16, 100 epochs, early stopping
//! after 20 epochs without a better validation loss. Per-element reference energies are fitted
//! to the training set by least squares and saved in the model.
//!
//! ```text
//! cargo run --release --example train_forcefield -- --train train.extxyz --valid valid.extxyz
//!     --out DIR [--epochs N] [--max-steps-now M] [--batch B] [--lr X] [--n-atom-basis F]
//!     [--n-interactions T] [--n-rbf R] [--cutoff C] [--energy-weight A] [--force-weight W]
//!     [--device D]
//! ```
//!
//! The extxyz files hold `energy=` on each comment line and a `forces:R:3` column, as ASE
//! writes a calculator's results (`--energy-key`, `--forces-key` name others). Writes
//! DIR/model/ (config.json + model.safetensors: the best epoch's weights, in schnetpack's format),
//! DIR/metrics.jsonl (a line per optimizer step, validation metrics at every epoch's end),
//! DIR/curves.png, DIR/checkpoints/ and DIR/summary.json. Rerunning the same command resumes.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Instant;

use burn::backend::Autodiff;
use burn::module::AutodiffModule;
use burn::tensor::backend::Backend;
use clap::Parser;
use kiln::burn;
use kiln::core::{DeviceJob, DeviceSpec};
use kiln::forcefield::{
    CutoffFn, LabelKeys, LabelledStructures, LossWeights, PainnConfig, RadialBasisKind, Recipe,
    fit_atomref,
};
use kiln::train::{Checkpoints, RunOptions, Trainer, evaluate};
use serde_json::json;

/// mimalloc, keeping the memory it frees for the next step (docs/PERFORMANCE.md).
#[path = "../shared/allocator.rs"]
mod allocator;

/// Train a PaiNN potential on reference energies and forces.
#[derive(Parser)]
struct Args {
    /// Training structures with labels (extended XYZ).
    #[arg(long)]
    train: PathBuf,
    /// Validation structures with labels (extended XYZ).
    #[arg(long)]
    valid: PathBuf,
    /// The run's directory (model, metrics, curves, checkpoints, summary).
    #[arg(long)]
    out: PathBuf,
    /// Passes over the training set.
    #[arg(long, default_value_t = 100, value_parser = kiln::cli::count_u64, allow_negative_numbers = true)]
    epochs: u64,
    /// Stop after this many more optimizer steps (with a checkpoint); rerun to continue.
    #[arg(long)]
    max_steps_now: Option<u64>,
    /// Structures per batch.
    #[arg(long, default_value_t = 16, value_parser = kiln::cli::count, allow_negative_numbers = true)]
    batch: usize,
    /// Peak learning rate.
    #[arg(long, default_value_t = 1e-3, value_parser = kiln::cli::positive, allow_negative_numbers = true)]
    lr: f64,
    /// Feature width F.
    #[arg(long, default_value_t = 128, value_parser = kiln::cli::count, allow_negative_numbers = true)]
    n_atom_basis: usize,
    /// Interaction blocks.
    #[arg(long, default_value_t = 3, value_parser = kiln::cli::count, allow_negative_numbers = true)]
    n_interactions: usize,
    /// Gaussian radial basis functions.
    #[arg(long, default_value_t = 20, value_parser = kiln::cli::count, allow_negative_numbers = true)]
    n_rbf: usize,
    /// Cutoff radius, Å.
    #[arg(long, default_value_t = 5.0, value_parser = kiln::cli::positive, allow_negative_numbers = true)]
    cutoff: f64,
    /// Weight of the energy MSE (eV²).
    #[arg(long, default_value_t = 1.0, value_parser = kiln::cli::non_negative, allow_negative_numbers = true)]
    energy_weight: f64,
    /// Weight of the force MSE (eV²/Å²).
    #[arg(long, default_value_t = 100.0, value_parser = kiln::cli::non_negative, allow_negative_numbers = true)]
    force_weight: f64,
    /// Weight of the mean force cosine distance.
    #[arg(long, default_value_t = 10.0, value_parser = kiln::cli::non_negative, allow_negative_numbers = true)]
    cosine_weight: f64,
    /// Linear warm-up steps.
    #[arg(long, default_value_t = 1000)]
    warmup_steps: u64,
    /// Epochs without a better validation loss before stopping (0: never stop early).
    #[arg(long, default_value_t = 20)]
    patience: usize,
    /// Comment-line key of the reference energy.
    #[arg(long, default_value = "energy")]
    energy_key: String,
    /// Per-atom column of the reference forces.
    #[arg(long, default_value = "forces")]
    forces_key: String,
    /// Seeds the initial weights and the data order.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// cpu, ndarray, wgpu, vulkan, metal, cuda, cuda:N.
    #[arg(long, default_value = "cpu")]
    device: DeviceSpec,
}

impl Args {
    /// The training settings (checked before any work).
    fn recipe(&self) -> Recipe {
        Recipe {
            epochs: self.epochs,
            batch: self.batch,
            lr: self.lr,
            warmup_steps: self.warmup_steps,
            patience: (self.patience > 0).then_some(self.patience),
            weights: LossWeights {
                energy: self.energy_weight,
                forces: self.force_weight,
                cosine: self.cosine_weight,
                stress: 0.0,
            },
            seed: self.seed,
            ..Recipe::default()
        }
    }

    /// The student's shape (reference energies still to fit).
    fn model_config(&self) -> Result<PainnConfig, String> {
        if self.energy_weight == 0.0 && self.force_weight == 0.0 && self.cosine_weight == 0.0 {
            return Err(
                "--energy-weight, --force-weight and --cosine-weight are all 0: the loss would \
                 train nothing (give at least one a weight > 0)"
                    .into(),
            );
        }
        if self.cutoff < MIN_SENSIBLE_CUTOFF {
            eprintln!(
                "warning: --cutoff {} Å is shorter than any chemical bond (H₂'s is 0.74 Å): \
                 atoms will see few or no neighbours",
                self.cutoff
            );
        }
        let config = PainnConfig {
            representation: "painn".into(),
            n_atom_basis: self.n_atom_basis,
            n_interactions: self.n_interactions,
            n_rbf: self.n_rbf,
            cutoff: self.cutoff,
            radial_basis: RadialBasisKind::Gaussian,
            cutoff_fn: CutoffFn::Cosine,
            shared_interactions: false,
            shared_filters: false,
            max_z: 100,
            readout_n_layers: 3,
            readout_n_hidden: None,
            mean_per_atom: 0.0,
            atomref: None,
            trained_elements: None,
        };
        config.validate().map_err(|e| e.to_string())?;
        Ok(config)
    }

    /// A labelled set, checked against the model.
    fn read(
        &self,
        path: &Path,
        flag: &str,
        config: &PainnConfig,
    ) -> Result<LabelledStructures, String> {
        let keys = LabelKeys {
            energy: self.energy_key.clone(),
            forces: self.forces_key.clone(),
            stress: None,
        };
        let set =
            LabelledStructures::from_extxyz(path, &keys).map_err(|e| format!("{flag} {e}"))?;
        let unconnected = set
            .check(config.cutoff, config.max_z)
            .map_err(|e| format!("{flag} {}: {e}", path.display()))?;
        if unconnected > 0 {
            eprintln!(
                "warning: {flag} {}: {unconnected} of {} structures have no pair of atoms within \
                 the {} Å --cutoff: the model sees no interaction in them",
                path.display(),
                set.len(),
                config.cutoff
            );
        }
        Ok(set)
    }
}

/// Below this cutoff (Å) no pair of bonded atoms is in range.
const MIN_SENSIBLE_CUTOFF: f64 = 0.5;

/// What identifies a labelled set: its structure count and its file's checksum (an edited label
/// changes it).
fn fingerprint(path: &Path, structures: usize) -> Result<serde_json::Value, String> {
    let checksum = kiln::io::fingerprint(path).map_err(|e| e.to_string())?;
    Ok(json!({"structures": structures, "checksum": checksum}))
}

/// Elements of `set` (sorted).
fn elements(set: &LabelledStructures) -> Vec<u32> {
    let mut all: Vec<u32> = set
        .structures
        .iter()
        .flat_map(|s| s.numbers.clone())
        .collect();
    all.sort_unstable();
    all.dedup();
    all
}

impl DeviceJob for Args {
    type Output = Result<(), String>;

    fn run<B: Backend>(self, device: &B::Device) -> Self::Output {
        let started = Instant::now();
        kiln::io::RunFiles::new()
            .input("the training structures (--train)", &self.train)
            .input("the validation structures (--valid)", &self.valid)
            .output_dir("--out", &self.out)
            .check()
            .map_err(|e| e.to_string())?;
        let mut config = self.model_config()?;
        let recipe = self.recipe();
        let train = self.read(&self.train, "--train", &config)?;
        let valid = self.read(&self.valid, "--valid", &config)?;
        let data = json!({
            "train": fingerprint(&self.train, train.len())?,
            "valid": fingerprint(&self.valid, valid.len())?,
        });
        if data["train"]["checksum"] == data["valid"]["checksum"] {
            eprintln!(
                "warning: --train and --valid hold the same structures: the validation loss \
                 measures fit, not generalisation"
            );
        }
        let train_config = recipe
            .train_config(train.len())
            .map_err(|e| e.to_string().replace("the batch size", "--batch"))?;
        let trained = elements(&train);
        let unseen: Vec<u32> = elements(&valid)
            .into_iter()
            .filter(|z| trained.binary_search(z).is_err())
            .collect();
        if !unseen.is_empty() {
            eprintln!(
                "warning: --valid has element(s) {unseen:?} that --train lacks: the model has no \
                 reference energy or training signal for them"
            );
        }
        let energies: Vec<f64> = train.labels.iter().map(|l| l.energy).collect();
        config.trained_elements = Some(trained.clone());
        config.atomref = Some(
            fit_atomref(&train.structures, &energies, config.max_z).map_err(|e| e.to_string())?,
        );
        eprintln!(
            "structures: {} training, {} validation; elements {trained:?}; {} steps per epoch",
            train.len(),
            valid.len(),
            train.len().div_ceil(self.batch)
        );
        <Autodiff<B> as Backend>::seed(device, self.seed);
        let model = config.init::<Autodiff<B>>(device);
        let options = RunOptions {
            max_steps_now: self.max_steps_now,
            plot: "curves.png".into(),
            model_settings: json!({
                "painn": config,
                "batch": self.batch,
                "train": self.train.display().to_string(),
                "valid": self.valid.display().to_string(),
            }),
            data,
            outputs: vec!["model".into(), "summary.json".into()],
            ..RunOptions::new(&self.out)
        };
        let batches = train.loader(self.batch, recipe.weights);
        let checks = valid.loader(self.batch, recipe.weights);
        let outcome = Trainer::<Autodiff<B>>::new(train_config, options, device.clone())
            .fit(model, &batches, Some(&checks))
            .map_err(|e| e.to_string())?;
        if !outcome.finished {
            eprintln!(
                "stopped at step {}: run the same command again to continue",
                outcome.step
            );
            return Ok(());
        }
        // The best epoch's weights (by validation loss) become the model.
        let (best_loss, best_step) = outcome.best.ok_or("no validation ran")?;
        let checkpoints = Checkpoints::new(self.out.join("checkpoints"));
        let best = Checkpoints::load_model(&checkpoints.path(best_step), outcome.model, device)
            .map_err(|e| e.to_string())?;
        best.save(self.out.join("model"))
            .map_err(|e| e.to_string())?;
        let evaluation = evaluate(&best.valid(), &valid.loader(self.batch, recipe.weights))
            .map_err(|e| e.to_string())?;
        let metric = |name: &str| evaluation.iter().find(|(k, _)| k == name).map(|(_, v)| *v);
        let steps_per_epoch = train.len().div_ceil(self.batch) as u64;
        let summary = json!({
            "valid_energy_mae_per_atom": metric("energy_mae_per_atom"),
            "valid_energy_rmse_per_atom": metric("energy_rmse_per_atom"),
            "valid_force_mae": metric("force_mae"),
            "valid_force_rmse": metric("force_rmse"),
            "valid_force_cosine": metric("force_cosine"),
            "valid_loss": best_loss,
            "best_epoch": best_step / steps_per_epoch,
            "epochs": outcome.step.div_ceil(steps_per_epoch),
            "steps": outcome.step,
            "stopped_early": outcome.stopped_early,
            "skipped_steps": outcome.skipped_steps,
            "train_structures": train.len(),
            "valid_structures": valid.len(),
            "device": self.device.to_string(),
            "wall_seconds_this_run": started.elapsed().as_secs_f64(),
        });
        kiln::io::write_json(&self.out.join("summary.json"), &summary)
            .map_err(|e| e.to_string())?;
        println!(
            "validation (best epoch {}): energy MAE {:.4} eV/atom, force MAE {:.4} eV/Å, \
             force RMSE {:.4} eV/Å ({})",
            best_step / steps_per_epoch,
            metric("energy_mae_per_atom").unwrap_or(f64::NAN),
            metric("force_mae").unwrap_or(f64::NAN),
            metric("force_rmse").unwrap_or(f64::NAN),
            self.out.join("summary.json").display()
        );
        Ok(())
    }
}

fn main() -> ExitCode {
    allocator::keep_freed_memory();
    let args = Args::parse();
    kiln::run_job(args.device, args)
}
