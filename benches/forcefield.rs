//! kiln-forcefield throughput under kiln-bench: energies and forces of batches of 1 … 256 mixed
//! molecules (3–60 atoms) per call, for the seed's PaiNN size (F = 128, 3 blocks, 20 Gaussians,
//! 5 Å) and a tiny one (F = 16, 2 blocks, 8 Gaussians, 5 Å), and the fixed cost of one call (a
//! water molecule through the tiny model). schnetpack's figures for the same models and
//! molecules come from `scripts/bench/painn_torch.py`; both are in docs/PERFORMANCE.md.
//!
//! `painn-train/{seed,tiny}/b=16`: one optimizer step of force-matching training (MLFF-Distiller's
//! recipe: readout 128→64→32→1 for the seed size, loss 1·MSE(E) + 100·MSE(F) + 10·mean(1 − cos),
//! AdamW, clipping at 1.0) on 16 molecules of the pool against fixed labels, as the
//! `train_forcefield` example's loop runs it. schnetpack's training step on the same molecules,
//! models and labels (`create_graph=True`) comes from `scripts/bench/painn_train_torch.py`.
//!
//! ```text
//! cargo bench --bench forcefield                      # Flex
//! cargo bench --bench forcefield -- --filter tiny --save main
//! ```
//!
//! A call is what a user's loop pays: neighbour lists, upload, forward, backward, readback.
//! Every call moves the atoms (a deterministic jitter that changes with each call), so nothing
//! can be served from a cache. The models (random weights, saved in kiln's = schnetpack's format)
//! and the molecules (extxyz) are written to `target/bench/painn/` for the PyTorch script and the
//! `forcefield` example.

use std::cell::{Cell, RefCell};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use kiln::bench::{BenchError, Benchmark, Runner, Suite, Work, batch_sizes, cli};
use kiln::burn::backend::Autodiff;
use kiln::burn::tensor::backend::Backend;
use kiln::forcefield::{
    CutoffFn, ForceBatch, Frame, Labels, Painn, PainnConfig, Predictions, RadialBasisKind, Recipe,
    Structure, write_extxyz,
};
use kiln::io::FileError;
use kiln::train::Optimization;

/// mimalloc, keeping the memory it frees for the next step (docs/PERFORMANCE.md).
#[path = "../examples/shared/allocator.rs"]
mod allocator;

/// Molecules in the pool; batch b evaluates the first b.
const MOLECULES: usize = 256;

/// A PaiNN of width `f`, `blocks` interaction blocks and `n_rbf` Gaussians, 5 Å cutoff.
fn painn(f: usize, blocks: usize, n_rbf: usize) -> PainnConfig {
    PainnConfig {
        representation: "painn".into(),
        n_atom_basis: f,
        n_interactions: blocks,
        n_rbf,
        cutoff: 5.0,
        radial_basis: RadialBasisKind::Gaussian,
        cutoff_fn: CutoffFn::Cosine,
        shared_interactions: false,
        shared_filters: false,
        max_z: 100,
        readout_n_layers: 2,
        readout_n_hidden: None,
        mean_per_atom: 0.0,
        atomref: None,
        trained_elements: None,
    }
}

/// A deterministic stream of numbers in [0, 1).
fn uniform(seed: u64) -> impl FnMut() -> f64 {
    let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        (state >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// `count` molecule-like clusters of H, C, N and O: each atom 1.0–1.6 Å from an earlier one and
/// no closer than 0.95 Å to any. Sizes follow a golden-ratio sequence over 3–60, so every prefix
/// of the pool averages about 31 atoms and batch sizes compare like with like.
fn molecules(count: usize) -> Vec<Structure> {
    let mut next = uniform(2026);
    let golden = (5f64.sqrt() - 1.0) / 2.0;
    (0..count)
        .map(|k| {
            let atoms = 3 + ((0.5 + k as f64 * golden).fract() * 58.0) as usize;
            let mut positions: Vec<[f64; 3]> = vec![[0.0; 3]];
            while positions.len() < atoms {
                let anchor = positions[(next() * positions.len() as f64) as usize];
                let (cos_t, phi, d) = (
                    2.0 * next() - 1.0,
                    2.0 * std::f64::consts::PI * next(),
                    1.0 + 0.6 * next(),
                );
                let sin_t = (1.0 - cos_t * cos_t).sqrt();
                let r = [
                    anchor[0] + d * sin_t * phi.cos(),
                    anchor[1] + d * sin_t * phi.sin(),
                    anchor[2] + d * cos_t,
                ];
                let far = positions.iter().all(|q| {
                    let d2: f64 = (0..3).map(|x| (q[x] - r[x]).powi(2)).sum();
                    d2 > 0.95 * 0.95
                });
                if far {
                    positions.push(r);
                }
            }
            let numbers = (0..atoms)
                .map(|_| match next() {
                    u if u < 0.5 => 1,
                    u if u < 0.8 => 6,
                    u if u < 0.9 => 7,
                    _ => 8,
                })
                .collect();
            Structure::molecule(numbers, positions)
        })
        .collect()
}

/// `structures` with every coordinate moved by up to ±0.01 Å, differently for each `call`.
fn jitter(structures: &[Structure], call: u64) -> Vec<Structure> {
    let mut next = uniform(call + 1);
    structures
        .iter()
        .map(|s| Structure {
            positions: s
                .positions
                .iter()
                .map(|r| r.map(|x| x + 0.02 * (next() - 0.5)))
                .collect(),
            ..s.clone()
        })
        .collect()
}

/// Energies and forces of a batch of molecules, one `predict` call per run.
struct Predict<'m, B: Backend> {
    name: String,
    model: &'m Painn<Autodiff<B>>,
    structures: Vec<Structure>,
    calls: Cell<u64>,
}

impl<B: Backend> Benchmark<B> for Predict<'_, B> {
    type Input = (Vec<Structure>, B::Device);
    type Output = Predictions;

    fn name(&self) -> String {
        self.name.clone()
    }

    fn work(&self) -> Work {
        Work::items(self.structures.len() as u64)
    }

    fn prepare(&self, device: &B::Device, variant: usize) -> Self::Input {
        (
            jitter(&self.structures, 1 << 32 | variant as u64),
            device.clone(),
        )
    }

    fn run(&self, (structures, device): &Self::Input) -> Self::Output {
        let call = self.calls.get();
        self.calls.set(call + 1);
        self.model
            .predict(&jitter(structures, call), device)
            .expect("valid molecules")
    }
}

/// Structures per training batch (MLFF-Distiller's).
const TRAIN_BATCH: usize = 16;

/// A model in training and its optimizer.
type Training<B> = (
    Painn<Autodiff<B>>,
    Optimization<Autodiff<B>, Painn<Autodiff<B>>>,
);

/// One optimizer step of force-matching training on a fixed batch; the model and the optimizer
/// carry over from run to run, as in training.
struct TrainingStep<B: Backend> {
    name: String,
    state: RefCell<Option<Training<B>>>,
    batch: ForceBatch,
    step: Cell<u64>,
}

impl<B: Backend> Benchmark<B> for TrainingStep<B> {
    type Input = ();
    type Output = f64;

    fn name(&self) -> String {
        self.name.clone()
    }

    fn work(&self) -> Work {
        Work::items(self.batch.structures.len() as u64)
    }

    fn prepare(&self, _device: &B::Device, _variant: usize) -> Self::Input {}

    fn run(&self, _: &()) -> f64 {
        let (model, mut optimization) = self.state.borrow_mut().take().expect("a model");
        let step = self.step.get();
        let (model, report) = optimization
            .step(model, step, || self.batch.clone())
            .expect("a step without data-parallel peers");
        self.step.set(step + 1);
        *self.state.borrow_mut() = Some((model, optimization));
        report.loss
    }
}

/// Labels for training benchmarks: the structures' own predictions by `teacher`, offset so
/// every loss term is non-zero. Written beside the molecules for the PyTorch script.
fn labels<B: Backend>(
    teacher: &Painn<Autodiff<B>>,
    structures: &[Structure],
    device: &B::Device,
    out: &Path,
) -> Result<Vec<Labels>, BenchError> {
    let predicted = teacher
        .predict(structures, device)
        .map_err(BenchError::workload)?;
    let mut first = 0;
    let mut frames = Vec::new();
    let labels = structures
        .iter()
        .enumerate()
        .map(|(s, structure)| {
            let forces: Vec<[f64; 3]> = predicted.forces[first..first + structure.len()]
                .iter()
                .map(|f| [f[0] + 0.1, f[1] - 0.05, 0.5 * f[2]])
                .collect();
            first += structure.len();
            let energy = predicted.energies[s] + 0.3;
            let mut frame = Frame::new(structure.clone());
            frame.info.insert("energy".into(), energy.to_string());
            frame.arrays.insert(
                "forces".into(),
                (3, forces.iter().flatten().copied().collect()),
            );
            frames.push(frame);
            Labels {
                energy,
                forces,
                stress: None,
            }
        })
        .collect();
    let batch = out.join("train_batch.extxyz");
    std::fs::write(&batch, write_extxyz(&frames)).map_err(|e| FileError::io(&batch, e))?;
    Ok(labels)
}

/// Where the models and molecules go: `target/bench/painn/`.
fn output_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("target/bench/painn")
}

struct Forcefield;

impl Suite for Forcefield {
    fn run<B: Backend>(&self, runner: &mut Runner<'_, B>) -> Result<(), BenchError> {
        let device = runner.device().clone();
        let pool = molecules(MOLECULES);
        let out = output_dir();
        std::fs::create_dir_all(&out).map_err(|e| FileError::io(&out, e))?;
        let frames: Vec<Frame> = pool.iter().cloned().map(Frame::new).collect();
        let molecules = out.join("molecules.extxyz");
        std::fs::write(&molecules, write_extxyz(&frames))
            .map_err(|e| FileError::io(&molecules, e))?;
        let mean_atoms = pool.iter().map(Structure::len).sum::<usize>() as f64 / pool.len() as f64;
        eprintln!("{MOLECULES} molecules of 3–60 atoms, {mean_atoms:.1} on average");
        let train_batch = pool[..TRAIN_BATCH].to_vec();
        let mut train_labels = None;
        for (label, config) in [("seed", painn(128, 3, 20)), ("tiny", painn(16, 2, 8))] {
            Autodiff::<B>::seed(&device, 7);
            let model = config.init::<Autodiff<B>>(&device);
            model.save(out.join(label)).map_err(BenchError::workload)?;
            let make = |batch: usize| Predict {
                name: format!("painn/{label}/b={batch}"),
                model: &model,
                structures: pool[..batch].to_vec(),
                calls: Cell::new(0),
            };
            runner.batch_scaling(&format!("painn/{label}"), &batch_sizes(MOLECULES), make)?;
            let train_name = format!("painn-train/{label}/b={TRAIN_BATCH}");
            // The labels cost a call at the training batch size: only for a training run.
            if runner.selects(&train_name) {
                let labels = match train_labels.take() {
                    Some(labels) => labels,
                    None => labels(&model, &train_batch, &device, &out)?,
                };
                let student = PainnConfig {
                    readout_n_layers: 3,
                    ..config.clone()
                };
                Autodiff::<B>::seed(&device, 11);
                let student_model = student.init::<Autodiff<B>>(&device);
                student_model
                    .save(out.join(format!("{label}-train")))
                    .map_err(BenchError::workload)?;
                let recipe = Recipe::default();
                let train_config = recipe
                    .train_config(1_000_000)
                    .map_err(BenchError::workload)?;
                let optimization = Optimization::fresh(&train_config, &student_model, &device);
                runner.bench(&TrainingStep {
                    name: train_name,
                    state: RefCell::new(Some((student_model, optimization))),
                    batch: ForceBatch {
                        structures: train_batch.clone(),
                        labels: labels.clone(),
                        weights: recipe.weights,
                    },
                    step: Cell::new(0),
                })?;
                train_labels = Some(labels);
            }
            if label == "tiny" {
                let water = Structure::molecule(
                    vec![8, 1, 1],
                    vec![[0.0, 0.0, 0.12], [0.0, 0.76, -0.47], [0.0, -0.76, -0.47]],
                );
                runner.bench(&Predict {
                    name: "painn/tiny/overhead-water".into(),
                    model: &model,
                    structures: vec![water],
                    calls: Cell::new(0),
                })?;
            }
        }
        Ok(())
    }
}

fn main() -> ExitCode {
    allocator::keep_freed_memory();
    cli::main(Forcefield)
}
