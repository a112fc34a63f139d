//! PaiNN as schnetpack 2.x implements it (`schnetpack.representation.PaiNN` inside a
//! `NeuralNetworkPotential` with an `Atomwise` energy readout). Field names mirror the state
//! dict's key tree: `representation.filter_net`, `representation.interactions.{t}`,
//! `representation.mixing.{t}`, `output_modules.0.outnet.{l}`.

use std::f64::consts::PI;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use burn::module::{Module, Param};
use burn::nn::{Embedding, EmbeddingConfig, Linear, LinearConfig};
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{DType, ElementConversion, Int, Tensor, TensorData};
use kiln_core::{Precision, cast_module, checkpoint_dir, load_checkpoint, save_checkpoint};

use crate::ForceFieldError;
use crate::batch::Graph;
use crate::config::{PainnConfig, RadialBasisKind};
use crate::dual::Dual;
use crate::host::Host;
use crate::structure::Structure;

/// Stability constant inside the vector norm's square root (schnetpack's `epsilon`).
pub(crate) const EPSILON: f64 = 1e-8;

/// Vector features as one `[atoms, F]` tensor per Cartesian axis (schnetpack keeps
/// `[atoms, 3, F]`): every operation on them is then 2-D on contiguous operands, which burn-flex
/// vectorises, where broadcasts over the middle axis and 3-D scatters go element by element.
type Vectors<B> = [Dual<B>; 3];

/// Message passing between neighbours (`PaiNNInteraction`).
#[derive(Module, Debug)]
pub struct Interaction<B: Backend> {
    /// Dense F → F (SiLU), Dense F → 3F.
    pub interatomic_context_net: Vec<Linear<B>>,
}

/// Mixing of each atom's scalar and vector features (`PaiNNMixing`).
#[derive(Module, Debug)]
pub struct Mixing<B: Backend> {
    /// Dense 2F → F (SiLU), Dense F → 3F.
    pub intraatomic_context_net: Vec<Linear<B>>,
    /// Dense F → 2F without bias, acting on each vector component.
    pub mu_channel_mix: Linear<B>,
}

/// The radial basis's constants, as schnetpack stores them (buffers computed in f32): Gaussian
/// centres and widths, or Bessel frequencies.
#[derive(Module, Debug)]
pub struct RadialBasis<B: Backend> {
    /// Gaussian centres, `[n_rbf]`, Å.
    pub offsets: Option<Param<Tensor<B, 1>>>,
    /// Gaussian widths, `[n_rbf]`, Å.
    pub widths: Option<Param<Tensor<B, 1>>>,
    /// Bessel frequencies `k π / rc`, `[n_rbf]`, 1/Å.
    pub freqs: Option<Param<Tensor<B, 1>>>,
}

/// The cutoff function's constant, as schnetpack stores it (a buffer in f32).
#[derive(Module, Debug)]
pub struct CutoffFunction<B: Backend> {
    /// The cutoff radius `[1]`, Å (computations use config.json's f64 value, which must agree).
    pub cutoff: Param<Tensor<B, 1>>,
}

/// The representation: element embedding, filters from the radial basis, T interaction and
/// mixing blocks.
#[derive(Module, Debug)]
pub struct Representation<B: Backend> {
    /// Element embedding, `[max_z, F]`.
    pub embedding: Embedding<B>,
    /// The radial basis's constants.
    pub radial_basis: RadialBasis<B>,
    /// The cutoff function's constant.
    pub cutoff_fn: CutoffFunction<B>,
    /// Radial basis → every block's filters (3F each, or 3F shared).
    pub filter_net: Linear<B>,
    /// Interaction blocks.
    pub interactions: Vec<Interaction<B>>,
    /// Mixing blocks.
    pub mixing: Vec<Mixing<B>>,
}

/// The energy readout (`Atomwise`): an MLP per atom, summed per structure.
#[derive(Module, Debug)]
pub struct Atomwise<B: Backend> {
    /// Dense layers, SiLU between them.
    pub outnet: Vec<Linear<B>>,
}

/// A PaiNN potential: energies of structures and forces on their atoms.
#[derive(Module, Debug)]
pub struct Painn<B: Backend> {
    /// The representation.
    pub representation: Representation<B>,
    /// The energy readout (one module).
    pub output_modules: Vec<Atomwise<B>>,
    #[module(skip)]
    config: PainnConfig,
    /// Whether the warning about elements outside the training set was given (once per model).
    #[module(skip)]
    warned_unseen: Arc<AtomicBool>,
}

/// What a potential predicts for a batch.
#[derive(Debug, Clone, PartialEq)]
pub struct Predictions {
    /// One per structure, eV.
    pub energies: Vec<f64>,
    /// One per atom of every structure in input order, eV/Å.
    pub forces: Vec<[f64; 3]>,
    /// One per structure: for those periodic along all three lattice vectors, the stress
    /// `(1/V) ∂E/∂ε` in eV/Å³ (ASE's sign convention: positive under tension).
    pub stresses: Vec<Option<[[f64; 3]; 3]>>,
    /// One per structure: the shortest distance between two of its atoms (or an atom and a
    /// periodic image) within the cutoff, Å; infinite without pairs.
    pub closest: Vec<f64>,
}

/// Atoms closer than this (Å) are closer than any bond (the shortest, H₂'s, is 0.74 Å): a
/// potential trained on real structures extrapolates there.
pub const CLOSEST_PLAUSIBLE_DISTANCE: f64 = 0.6;

/// Energies beyond this many eV per atom are no chemistry's: binding energies are a few eV per
/// atom, a core electron's a few keV.
pub const IMPLAUSIBLE_EV_PER_ATOM: f64 = 1e4;

/// Why a structure's prediction should not be trusted ([`Predictions::doubt`]).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum Doubt {
    /// A NaN or infinite energy, force or stress: the structure has no result.
    #[error(
        "the model gives a non-finite energy, force or stress (energy {energy} eV): its weights \
         or the structure's geometry make it overflow"
    )]
    NonFinite {
        /// The energy given, eV.
        energy: f64,
    },
    /// A finite energy beyond [`IMPLAUSIBLE_EV_PER_ATOM`]: a result, with a warning.
    #[error(
        "energy {energy:.4e} eV ({per_atom:.3e} eV/atom) is beyond any chemistry: atoms closer \
         than the model was trained on? (check the cell and positions)"
    )]
    Implausible {
        /// The energy, eV.
        energy: f64,
        /// The energy per atom, eV.
        per_atom: f64,
    },
    /// Atoms closer than [`CLOSEST_PLAUSIBLE_DISTANCE`]: a result, with a warning.
    #[error(
        "two atoms (or an atom and a periodic image) are {distance:.3} Å apart, closer than any \
         bond (H₂'s, the shortest, is 0.74 Å): the model extrapolates (check the cell and \
         positions)"
    )]
    TooClose {
        /// The shortest distance, Å.
        distance: f64,
    },
}

impl Predictions {
    /// Why structure `s` (of `atoms` atoms, whose forces start at `first`) should not be
    /// trusted: a NaN or infinite energy, force or stress (an error), an energy beyond
    /// [`IMPLAUSIBLE_EV_PER_ATOM`] or atoms closer than [`CLOSEST_PLAUSIBLE_DISTANCE`] (warnings:
    /// the model extrapolates); `None` when nothing is wrong.
    pub fn doubt(&self, s: usize, first: usize, atoms: usize) -> Option<Doubt> {
        let energy = self.energies[s];
        let forces = &self.forces[first..first + atoms];
        let stress = self.stresses[s].iter().flatten().flatten();
        if !energy.is_finite()
            || forces
                .iter()
                .flatten()
                .chain(stress)
                .any(|v| !v.is_finite())
        {
            return Some(Doubt::NonFinite { energy });
        }
        let per_atom = energy / atoms.max(1) as f64;
        if per_atom.abs() > IMPLAUSIBLE_EV_PER_ATOM {
            return Some(Doubt::Implausible { energy, per_atom });
        }
        let distance = self.closest.get(s).copied().unwrap_or(f64::INFINITY);
        (distance < CLOSEST_PLAUSIBLE_DISTANCE).then_some(Doubt::TooClose { distance })
    }
}

impl PainnConfig {
    /// A randomly initialised potential of this shape, f32.
    pub fn init<B: Backend>(&self, device: &B::Device) -> Painn<B> {
        let f = self.n_atom_basis;
        let linear = |i: usize, o: usize| LinearConfig::new(i, o).init(device);
        let blocks = self.n_interactions;
        let filters = if self.shared_filters {
            3 * f
        } else {
            3 * f * blocks
        };
        let widths = self.readout_widths();
        let constant = |values: Vec<f32>| {
            let n = values.len();
            Param::from_tensor(Tensor::from_data(TensorData::new(values, [n]), device))
                .set_require_grad(false)
        };
        let n = self.n_rbf;
        let radial_basis = match self.radial_basis {
            RadialBasisKind::Gaussian => {
                // torch.linspace(0, rc, n) and the spacing as width, in f32 as schnetpack makes
                // them (a loaded checkpoint brings its own).
                let step = if n > 1 {
                    self.cutoff as f32 / (n - 1) as f32
                } else {
                    0.0
                };
                let offsets: Vec<f32> = (0..n).map(|k| k as f32 * step).collect();
                let width = if n > 1 {
                    (offsets[1] - offsets[0]).abs()
                } else {
                    1.0
                };
                RadialBasis {
                    offsets: Some(constant(offsets)),
                    widths: Some(constant(vec![width; n])),
                    freqs: None,
                }
            }
            RadialBasisKind::Bessel => RadialBasis {
                offsets: None,
                widths: None,
                freqs: Some(constant(
                    (1..=n)
                        .map(|k| (k as f64 * PI / self.cutoff) as f32)
                        .collect(),
                )),
            },
        };
        Painn {
            representation: Representation {
                embedding: EmbeddingConfig::new(self.max_z, f).init(device),
                radial_basis,
                cutoff_fn: CutoffFunction {
                    cutoff: constant(vec![self.cutoff as f32]),
                },
                filter_net: linear(self.n_rbf, filters),
                interactions: (0..blocks)
                    .map(|_| Interaction {
                        interatomic_context_net: vec![linear(f, f), linear(f, 3 * f)],
                    })
                    .collect(),
                mixing: (0..blocks)
                    .map(|_| Mixing {
                        intraatomic_context_net: vec![linear(2 * f, f), linear(f, 3 * f)],
                        mu_channel_mix: LinearConfig::new(f, 2 * f).with_bias(false).init(device),
                    })
                    .collect(),
            },
            output_modules: vec![Atomwise {
                outnet: widths.windows(2).map(|w| linear(w[0], w[1])).collect(),
            }],
            config: self.clone(),
            warned_unseen: Arc::default(),
        }
    }
}

impl<B: Backend> Painn<B> {
    /// Reads a model directory: `config.json` and `model.safetensors` (a schnetpack
    /// `NeuralNetworkPotential` state dict). A missing, integer or mis-shaped tensor is an error
    /// listing each ([`kiln_core::load_checkpoint`]); unused tensors are a warning.
    pub fn from_dir(dir: impl AsRef<Path>, device: &B::Device) -> Result<Self, ForceFieldError> {
        let dir = dir.as_ref();
        let config = PainnConfig::from_file(dir)?;
        let model = load_checkpoint(config.init::<B>(device), dir, &[], &[])?;
        let stored: f64 = model
            .representation
            .cutoff_fn
            .cutoff
            .val()
            .into_scalar()
            .elem();
        if (stored - config.cutoff).abs() > 1e-5 * config.cutoff {
            return Err(ForceFieldError::Config(format!(
                "{}: cutoff {} Å, but the weights were trained with {stored} Å \
                 (representation.cutoff_fn.cutoff)",
                dir.join("config.json").display(),
                config.cutoff
            )));
        }
        Ok(model)
    }

    /// Writes `config.json` and `model.safetensors` into `dir` (created if needed): kiln's own
    /// format, which is schnetpack's — the state dict holds exactly the keys, shapes and f32
    /// dtype of a `NeuralNetworkPotential`'s, so `load_state_dict` takes it as it is.
    pub fn save(&self, dir: impl AsRef<Path>) -> Result<(), ForceFieldError> {
        let dir = dir.as_ref();
        let config = serde_json::to_string_pretty(&self.config)
            .map_err(|e| ForceFieldError::Config(format!("{}: {e}", dir.display())))?;
        Ok(save_checkpoint(self, &config, dir)?)
    }

    /// [`Self::from_dir`] on what [`checkpoint_dir`] makes of `model`: a local directory, or
    /// with the `hub` feature a Hugging Face id (`org/name[@revision]`) of a model kiln saved.
    pub fn from_pretrained(model: &str, device: &B::Device) -> Result<Self, ForceFieldError> {
        Self::from_dir(checkpoint_dir(model)?, device)
    }

    /// The model's hyper-parameters.
    pub fn config(&self) -> &PainnConfig {
        &self.config
    }

    /// Warns (once per model) when `structures` hold elements the model was not trained on:
    /// its energies for them rest on untrained embeddings and no reference energy.
    pub(crate) fn warn_unseen_elements(&self, structures: &[Structure]) {
        let unseen = self.config.unseen_elements(structures);
        if !unseen.is_empty() && !self.warned_unseen.swap(true, Ordering::Relaxed) {
            log::warn!(
                "element(s) {unseen:?} are absent from this model's training set (it saw {:?}): \
                 their energies and forces are not to be trusted",
                self.config.trained_elements.as_deref().unwrap_or_default()
            );
        }
    }

    /// The same model with parameters in `precision` (f64 for reference-grade energies).
    pub fn with_precision(self, precision: Precision) -> Self {
        cast_module(self, precision)
    }

    /// The graph of `structures` for this model, floats in its parameters' dtype.
    pub fn graph(
        &self,
        structures: &[Structure],
        device: &B::Device,
    ) -> Result<Graph<B>, ForceFieldError> {
        let dtype = self.representation.filter_net.weight.val().dtype();
        Graph::new(structures, &self.config, device, dtype)
    }

    /// The energy of every structure of `graph` with its atoms at `positions` `[N, 3]` (the
    /// graph's own, or a copy that tracks gradients), `[S]`.
    pub fn energies(&self, graph: &Graph<B>, positions: Tensor<B, 2>) -> Tensor<B, 1> {
        self.strained_energies(graph, positions, None)
    }

    /// [`energies`](Self::energies) of the structures deformed by `strain` `[S, 3, 3]`: every
    /// interatomic vector `r` becomes `r (1 + ε)` with `ε` the strain's symmetric part (as
    /// schnetpack's `Strain` deforms positions and cell), so `∂E/∂ε` at zero strain is the
    /// virial.
    pub fn strained_energies(
        &self,
        graph: &Graph<B>,
        positions: Tensor<B, 2>,
        strain: Option<Tensor<B, 3>>,
    ) -> Tensor<B, 1> {
        let (atoms, _) = self.atomwise(graph, positions, strain, None);
        self.structure_energies(graph, atoms)
    }

    /// The energies of `graph`'s structures at its positions `[S]`, and the derivative of their
    /// sum along `tangent` `[1]` (forward mode, see `dual.rs`): `Σ_i t_i · ∂E/∂R_i` plus, with a
    /// strain tangent, `Σ_s Σ_ab ε̇_sab ∂E_s/∂ε_ab`.
    pub(crate) fn energies_with_tangent(
        &self,
        graph: &Graph<B>,
        tangent: &Tangent<B>,
    ) -> (Tensor<B, 1>, Tensor<B, 1>) {
        let (atoms, atom_tangents) =
            self.atomwise(graph, graph.positions.clone(), None, Some(tangent));
        let total = match atom_tangents {
            Some(t) => t.sum(),
            None => Tensor::zeros([1], (&atoms.device(), atoms.dtype())),
        };
        (self.structure_energies(graph, atoms), total)
    }

    /// Atomic energies `[N]` summed into structures, with the per-element and per-atom
    /// reference energies added, `[S]`.
    fn structure_energies(&self, graph: &Graph<B>, mut atoms: Tensor<B, 1>) -> Tensor<B, 1> {
        let structures = graph.atoms.len();
        let device = atoms.device();
        if let Some(atomref) = &self.config.atomref {
            let table = Tensor::<B, 1>::from_data(
                TensorData::new(atomref.clone(), [atomref.len()]),
                (&device, atoms.dtype()),
            );
            atoms = atoms + table.select(0, graph.numbers.clone());
        }
        let zeros = Tensor::<B, 1>::zeros([structures], (&device, atoms.dtype()));
        let sums = graph.structure.scatter_add(zeros, atoms);
        let counts: Vec<f64> = graph.atoms.iter().map(|&n| n as f64).collect();
        let offsets = Tensor::<B, 1>::from_data(
            TensorData::new(counts, [structures]),
            (&device, sums.dtype()),
        );
        sums + offsets * self.config.mean_per_atom
    }

    /// Every atom's energy contribution `[N]` (before the reference energies) and, given a
    /// tangent (with no primal strain), its directional derivative `[N]`.
    fn atomwise(
        &self,
        graph: &Graph<B>,
        positions: Tensor<B, 2>,
        strain: Option<Tensor<B, 3>>,
        tangent: Option<&Tangent<B>>,
    ) -> (Tensor<B, 1>, Option<Tensor<B, 1>>) {
        debug_assert!(strain.is_none() || tangent.is_none());
        let r = &self.representation;
        let config = &self.config;
        let f = config.n_atom_basis;
        let atoms = positions.dims()[0];
        let pair_differences =
            |x: Tensor<B, 2>| graph.idx_j.gather(x.clone()) - graph.idx_i.gather(x);
        let mut r_ij = pair_differences(positions) + graph.shifts.clone();
        let r_tangent = tangent.map(|t| {
            let moved = pair_differences(t.positions.clone());
            match &t.strain {
                Some(strain) => moved + deformation(graph, r_ij.clone(), strain.clone()),
                None => moved,
            }
        });
        if let Some(strain) = strain {
            r_ij = r_ij.clone() + deformation(graph, r_ij, strain);
        }
        let d_ij = r_ij.clone().powi_scalar(2).sum_dim(1).sqrt(); // [P, 1]
        let dir_ij = r_ij / d_ij.clone();
        // d' = dir · r', dir' = (r' − dir d') / d.
        let (d_tangent, dir_tangent) = match r_tangent {
            Some(r_tangent) => {
                let d_tangent = (dir_ij.clone() * r_tangent.clone()).sum_dim(1);
                let dir_tangent = (r_tangent - dir_ij.clone() * d_tangent.clone()) / d_ij.clone();
                (Some(d_tangent), Some(dir_tangent))
            }
            None => (None, None),
        };
        let device = dir_ij.device();
        let column = |x: &Tensor<B, 2>, axis: usize| {
            let axis =
                Tensor::<B, 1, Int>::from_data(TensorData::new(vec![axis as i64], [1]), &device);
            x.clone().select(1, axis)
        };
        let dirs: Vectors<B> = std::array::from_fn(|axis| Dual {
            value: column(&dir_ij, axis),
            tangent: dir_tangent.as_ref().map(|t| column(t, axis)),
        });
        let filters = self.filters(Dual {
            value: d_ij,
            tangent: d_tangent,
        });
        let q_dtype = dir_ij.dtype();
        let mut q = Dual::constant(
            r.embedding
                .forward(graph.numbers.clone().unsqueeze_dim(0))
                .squeeze_dim::<2>(0)
                .cast(q_dtype),
        );
        let mut mu: Vectors<B> =
            std::array::from_fn(|_| Dual::constant(Tensor::zeros([atoms, f], (&device, q_dtype))));
        for (block, (interaction, mixing)) in r.interactions.iter().zip(&r.mixing).enumerate() {
            let set = if config.shared_filters { 0 } else { block };
            let w = &filters[3 * set..3 * set + 3];
            (q, mu) = interaction.forward(q, mu, w, &dirs, graph);
            (q, mu) = mixing.forward(q, mu);
        }
        let (last, hidden) = self.output_modules[0]
            .outnet
            .split_last()
            .expect("the config has at least one readout layer");
        let mut y = q;
        for layer in hidden {
            y = y.linear(layer).silu();
        }
        single_output(last, y)
    }

    /// The filter network's outputs times the cosine cutoff for distances `[P, 1]`: 3 `[P, F]`
    /// filters per interaction block (3 in all with shared filters). `(rbf W + b) c` is formed
    /// as one product `[rbf c, c] [W; b]`, so neither the bias nor the cutoff costs a pass over
    /// the pairs.
    fn filters(&self, d: Dual<B>) -> Vec<Dual<B>> {
        let net = &self.representation.filter_net;
        let cutoff = self.cosine_cutoff(d.value.clone());
        let rbf = self.radial_basis(d.value.clone());
        let tangents = d.tangent.map(|d_tangent| {
            let cutoff_slope = self.cosine_cutoff_slope(d.value.clone());
            let basis_slope = self.radial_basis_slope(d.value.clone(), rbf.clone())
                * cutoff.clone()
                + rbf.clone() * cutoff_slope.clone();
            (basis_slope * d_tangent.clone(), cutoff_slope * d_tangent)
        });
        let basis = Dual {
            value: rbf * cutoff.clone(),
            tangent: tangents.as_ref().map(|(basis, _)| basis.clone()),
        };
        let (inputs, weight) = match &net.bias {
            Some(bias) => (
                basis.cat(Dual {
                    value: cutoff,
                    tangent: tangents.map(|(_, cutoff)| cutoff),
                }),
                Tensor::cat(vec![net.weight.val(), bias.val().unsqueeze_dim(0)], 0),
            ),
            None => (basis, net.weight.val()),
        };
        let width = self.config.n_atom_basis;
        let parts = weight.dims()[1] / width;
        (0..parts)
            .map(|k| {
                let block = weight.clone().narrow(1, k * width, width);
                Dual {
                    value: inputs.value.clone().matmul(block.clone()),
                    tangent: inputs.tangent.clone().map(|t| t.matmul(block)),
                }
            })
            .collect()
    }

    /// The radial basis's constants as `[1, n_rbf]` rows in `dtype`.
    fn basis_row(&self, p: &Option<Param<Tensor<B, 1>>>, dtype: DType) -> Tensor<B, 2> {
        p.as_ref()
            .expect("the config's radial basis has its constants")
            .val()
            .cast(dtype)
            .unsqueeze_dim::<2>(0)
    }

    /// The radial basis of distances `[P, 1]`, `[P, n_rbf]`.
    fn radial_basis(&self, d: Tensor<B, 2>) -> Tensor<B, 2> {
        let basis = &self.representation.radial_basis;
        let dtype = d.dtype();
        match self.config.radial_basis {
            RadialBasisKind::Gaussian => {
                let coeff = self.basis_row(&basis.widths, dtype).powi_scalar(2).recip() * -0.5;
                ((d - self.basis_row(&basis.offsets, dtype)).powi_scalar(2) * coeff).exp()
            }
            RadialBasisKind::Bessel => (d.clone() * self.basis_row(&basis.freqs, dtype)).sin() / d,
        }
    }

    /// `∂rbf/∂d` for distances `[P, 1]` and their basis `rbf` `[P, n_rbf]`.
    fn radial_basis_slope(&self, d: Tensor<B, 2>, rbf: Tensor<B, 2>) -> Tensor<B, 2> {
        let basis = &self.representation.radial_basis;
        let dtype = d.dtype();
        match self.config.radial_basis {
            RadialBasisKind::Gaussian => {
                // exp(c (d − o)²)' = 2 c (d − o) exp(…), c = −1 / (2 w²).
                let coeff = self.basis_row(&basis.widths, dtype).powi_scalar(2).recip() * -1.0;
                rbf * (d - self.basis_row(&basis.offsets, dtype)) * coeff
            }
            RadialBasisKind::Bessel => {
                // (sin(k d) / d)' = (k cos(k d) − sin(k d) / d) / d.
                let freqs = self.basis_row(&basis.freqs, dtype);
                ((d.clone() * freqs.clone()).cos() * freqs - rbf) / d
            }
        }
    }

    /// `½ (cos(π d / rc) + 1)` below the cutoff, 0 beyond, `[P, 1]`.
    fn cosine_cutoff(&self, d: Tensor<B, 2>) -> Tensor<B, 2> {
        let rc = self.config.cutoff;
        let inside = d.clone().lower_elem(rc).float().cast(d.dtype());
        ((d * (PI / rc)).cos() + 1.0) * 0.5 * inside
    }

    /// The cutoff's slope `−(π / 2rc) sin(π d / rc)` below the cutoff, 0 beyond, `[P, 1]`.
    fn cosine_cutoff_slope(&self, d: Tensor<B, 2>) -> Tensor<B, 2> {
        let rc = self.config.cutoff;
        let inside = d.clone().lower_elem(rc).float().cast(d.dtype());
        (d * (PI / rc)).sin() * (-0.5 * PI / rc) * inside
    }
}

/// A direction in which to differentiate energies: a displacement of every atom `[N, 3]` and,
/// optionally, a strain of every structure `[S, 3, 3]` (its symmetric part acts).
#[derive(Debug, Clone)]
pub(crate) struct Tangent<B: Backend> {
    pub positions: Tensor<B, 2>,
    pub strain: Option<Tensor<B, 3>>,
}

/// `r ε` for every pair: how the interatomic vectors `r_ij` `[P, 3]` change under their
/// structures' strains `[S, 3, 3]` (the symmetric part), `(r ε)_x = Σ_k r_k ε_kx`.
fn deformation<B: Backend>(
    graph: &Graph<B>,
    r_ij: Tensor<B, 2>,
    strain: Tensor<B, 3>,
) -> Tensor<B, 2> {
    let pairs = r_ij.dims()[0];
    let symmetric = (strain.clone() + strain.swap_dims(1, 2)) * 0.5;
    let pair_strain = graph.pair_structure.gather(symmetric);
    (r_ij.unsqueeze_dim::<3>(2) * pair_strain)
        .sum_dim(1)
        .reshape([pairs, 3])
}

/// The readout's last layer `[N, K] → [N]` as a row-wise dot product (and the same on the
/// tangent, without the bias): one output column needs no matrix product, and burn 0.21's fused
/// wgpu kernel for `[M, K] [K, 1] + bias` returns wrong rows when `K` is odd.
fn single_output<B: Backend>(
    layer: &Linear<B>,
    y: Dual<B>,
) -> (Tensor<B, 1>, Option<Tensor<B, 1>>) {
    let row = layer.weight.val().transpose(); // [1, K]
    let dot = |y: Tensor<B, 2>| (y * row.clone()).sum_dim(1).squeeze_dim::<1>(1);
    let value = match &layer.bias {
        Some(bias) => dot(y.value) + bias.val(),
        None => dot(y.value),
    };
    (value, y.tangent.map(dot))
}

impl<B: Backend> Interaction<B> {
    /// Adds every atom's messages from its neighbours (filters `w`, unit vectors `dirs` from
    /// centre to neighbour, both per pair) to its features.
    fn forward(
        &self,
        q: Dual<B>,
        mu: Vectors<B>,
        w: &[Dual<B>],
        dirs: &Vectors<B>,
        graph: &Graph<B>,
    ) -> (Dual<B>, Vectors<B>) {
        if graph.idx_i.is_empty() {
            // No atom has a neighbour: no messages (burn-flex's products of empty tensors also
            // lose their dtype).
            return (q, mu);
        }
        let net = &self.interatomic_context_net;
        let x = q.clone().linear(&net[0]).silu().linear_parts(&net[1], 3);
        let from_neighbours =
            |k: usize, atom_values: Dual<B>| w[k].clone().mul(atom_values.gather(&graph.idx_j));
        let receive =
            |features: Dual<B>, messages: Dual<B>| features.scatter_add(&graph.idx_i, messages);
        let dq = from_neighbours(0, x[0].clone());
        let dmu_r = from_neighbours(1, x[1].clone());
        // schnetpack's dmu_mu · mu_j, with the product x_mu · mu taken per atom (one pass over
        // the atoms instead of one over the pairs).
        let mu = std::array::from_fn(|axis| {
            let dmu_mu = from_neighbours(2, x[2].clone().mul(mu[axis].clone()));
            receive(
                mu[axis].clone(),
                dmu_r.clone().mul(dirs[axis].clone()).add(dmu_mu),
            )
        });
        (receive(q, dq), mu)
    }
}

impl<B: Backend> Mixing<B> {
    /// Mixes each atom's scalar features with the norms and projections of its vector ones.
    fn forward(&self, q: Dual<B>, mu: Vectors<B>) -> (Dual<B>, Vectors<B>) {
        let (mu_v, mu_w): (Vec<_>, Vec<_>) = mu
            .iter()
            .map(|axis| {
                let [v, w]: [Dual<B>; 2] = axis
                    .clone()
                    .linear_parts(&self.mu_channel_mix, 2)
                    .try_into()
                    .expect("two parts");
                (v, w)
            })
            .unzip();
        let dot = mu_v
            .iter()
            .zip(&mu_w)
            .map(|(v, w)| v.clone().mul(w.clone()))
            .reduce(Dual::add)
            .expect("three axes");
        let net = &self.intraatomic_context_net;
        let hidden = q.clone().cat(norm(&mu_v)).linear(&net[0]).silu();
        let [dq, dmu, dqmu]: [Dual<B>; 3] = hidden
            .linear_parts(&net[1], 3)
            .try_into()
            .expect("three parts");
        let mu =
            std::array::from_fn(|axis| mu[axis].clone().add(dmu.clone().mul(mu_w[axis].clone())));
        (q.add(dq).add(dqmu.mul(dot)), mu)
    }
}

/// `sqrt(Σ_axes v² + ε)` per atom and feature (schnetpack's stabilised norm), with tangent
/// `Σ v v' / norm`.
fn norm<B: Backend>(vectors: &[Dual<B>]) -> Dual<B> {
    let value = vectors
        .iter()
        .map(|v| v.value.clone().powi_scalar(2))
        .reduce(|a, b| a + b)
        .expect("three axes")
        + EPSILON;
    let value = value.sqrt();
    let tangent = vectors
        .iter()
        .filter_map(|v| Some(v.value.clone() * v.tangent.clone()?))
        .reduce(|a, b| a + b)
        .map(|t| t / value.clone());
    Dual { value, tangent }
}

impl<B: AutodiffBackend> Painn<B> {
    /// Energies of `structures`, forces on their atoms (−∂E/∂R) and, for fully periodic ones,
    /// stresses. On the CPU backends (Flex, NdArray) with f32 or f64 parameters this is a fused
    /// host kernel, structures in parallel (see `host.rs`); elsewhere it is
    /// [`predict_tensors`](Self::predict_tensors). Both compute the same function.
    pub fn predict(
        &self,
        structures: &[Structure],
        device: &B::Device,
    ) -> Result<Predictions, ForceFieldError> {
        self.predict_with(Host::for_model(self, device).as_ref(), structures, device)
    }

    /// [`predict`](Self::predict) through `host` where there is one.
    fn predict_with(
        &self,
        host: Option<&Host>,
        structures: &[Structure],
        device: &B::Device,
    ) -> Result<Predictions, ForceFieldError> {
        self.warn_unseen_elements(structures);
        match host {
            Some(host) => host.predict(&self.config, structures),
            None => self.predict_tensors(structures, device),
        }
    }

    /// [`predict`](Self::predict) through tensor operations on the device: the batch as one
    /// graph, one forward and one backward pass (autodiff) over it. Any backend, any dtype.
    pub fn predict_tensors(
        &self,
        structures: &[Structure],
        device: &B::Device,
    ) -> Result<Predictions, ForceFieldError> {
        self.warn_unseen_elements(structures);
        let graph = self.graph(structures, device)?;
        let positions = graph.positions.clone().require_grad();
        let periodic = graph.volumes.iter().any(Option::is_some);
        let strain = periodic.then(|| {
            Tensor::<B, 3>::zeros([structures.len(), 3, 3], (device, positions.dtype()))
                .require_grad()
        });
        let energies = self.strained_energies(&graph, positions.clone(), strain.clone());
        let gradients = energies.clone().sum().backward();
        let read = |data: TensorData| -> Vec<f64> {
            data.convert::<f64>().to_vec::<f64>().expect("f64 values")
        };
        // Without a single neighbour pair the energy does not depend on the positions.
        let forces = match positions.grad(&gradients) {
            Some(gradient) => read(gradient.neg().into_data()),
            None => vec![0.0; 3 * positions.dims()[0]],
        };
        let virials = strain
            .and_then(|strain| strain.grad(&gradients))
            .map(|gradient| read(gradient.into_data()));
        let stresses = graph
            .volumes
            .iter()
            .enumerate()
            .map(|(s, volume)| {
                let virial = std::array::from_fn(|a| {
                    std::array::from_fn(|b| virials.as_ref().map_or(0.0, |v| v[9 * s + 3 * a + b]))
                });
                Some(stress(&virial, (*volume)?))
            })
            .collect();
        Ok(Predictions {
            energies: read(energies.into_data()),
            forces: forces.chunks_exact(3).map(|c| [c[0], c[1], c[2]]).collect(),
            stresses,
            closest: graph.closest.clone(),
        })
    }
}

/// A model made ready for many [`predict`](Self::predict) calls (an ASE calculator's steps, a
/// service's requests): on the CPU backends its weights are read into the host kernel's layout
/// once, here, where [`Painn::predict`] reads them on every call (a few milliseconds for a
/// seed-size model, more than a small molecule's whole evaluation). It owns the model, so the
/// prepared weights cannot go stale.
///
/// ```no_run
/// use burn::backend::{Autodiff, Flex};
/// use kiln_forcefield::{Painn, Predictor, Structure};
///
/// let device = Default::default();
/// let predictor = Predictor::new(Painn::<Autodiff<Flex>>::from_dir("painn_model/", &device)?, &device);
/// let water = Structure::molecule(
///     vec![8, 1, 1],
///     vec![[0.0, 0.0, 0.12], [0.0, 0.76, -0.47], [0.0, -0.76, -0.47]],
/// );
/// for _ in 0..1000 {
///     let results = predictor.predict(std::slice::from_ref(&water))?;
///     # let _ = results;
/// }
/// # Ok::<(), kiln_forcefield::ForceFieldError>(())
/// ```
pub struct Predictor<B: AutodiffBackend> {
    model: Painn<B>,
    device: B::Device,
    host: Option<Host>,
}

impl<B: AutodiffBackend> Predictor<B> {
    /// `model` on `device`, its weights prepared for the host kernel where that runs.
    pub fn new(model: Painn<B>, device: &B::Device) -> Self {
        let host = Host::for_model(&model, device);
        Predictor {
            model,
            device: device.clone(),
            host,
        }
    }

    /// What [`Painn::predict`] gives for `structures`.
    pub fn predict(&self, structures: &[Structure]) -> Result<Predictions, ForceFieldError> {
        self.model
            .predict_with(self.host.as_ref(), structures, &self.device)
    }

    /// The model.
    pub fn model(&self) -> &Painn<B> {
        &self.model
    }

    /// The model back, for training or saving.
    pub fn into_model(self) -> Painn<B> {
        self.model
    }
}

/// The stress `sym(∂E/∂ε) / V` of a cell of volume `V` (Å³) from its virial `∂E/∂ε` (eV); the
/// strain enters through its symmetric part.
pub(crate) fn stress(virial: &[[f64; 3]; 3], volume: f64) -> [[f64; 3]; 3] {
    std::array::from_fn(|a| std::array::from_fn(|b| 0.5 * (virial[a][b] + virial[b][a]) / volume))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn non_finite_and_absurd_predictions_are_doubted() {
        let predictions = Predictions {
            energies: vec![-3.2, -1.4e22, f64::NAN, 1.0, -8076.3],
            forces: vec![[0.1, 0.0, -0.2]; 6],
            stresses: vec![None, None, None, Some([[0.0, f64::INFINITY, 0.0]; 3]), None],
            closest: vec![0.96, 0.1, 1.0, 1.0, 0.5],
        };
        // A lone H 0.5 Å from its own images (a 0.5 Å cell): a finite energy, with a warning.
        let close = predictions.doubt(4, 5, 1).unwrap();
        assert_eq!(close, Doubt::TooClose { distance: 0.5 });
        assert!(close.to_string().contains("0.500 Å apart"), "{close}");
        assert_eq!(predictions.doubt(0, 0, 2), None);
        let absurd = predictions.doubt(1, 2, 1).unwrap().to_string();
        assert!(absurd.contains("-1.4000e22 eV"), "{absurd}");
        for s in [2, 3] {
            let doubt = predictions.doubt(s, s + 1, 1).unwrap();
            assert!(matches!(doubt, Doubt::NonFinite { .. }), "{doubt}");
            assert!(doubt.to_string().contains("non-finite"));
        }
    }
}
