//! PaiNN as schnetpack 2.x implements it (`schnetpack.representation.PaiNN` inside a
//! `NeuralNetworkPotential` with an `Atomwise` energy readout). Field names mirror the state
//! dict's key tree: `representation.filter_net`, `representation.interactions.{t}`,
//! `representation.mixing.{t}`, `output_modules.0.outnet.{l}`.

use std::f64::consts::PI;
use std::path::Path;

use burn::module::{Module, Param};
use burn::nn::{Embedding, EmbeddingConfig, Linear, LinearConfig};
use burn::tensor::activation::silu;
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{DType, ElementConversion, Int, Tensor, TensorData};
use burn_store::{BurnToPyTorchAdapter, ModuleSnapshot, PyTorchToBurnAdapter, SafetensorsStore};
use kiln_precision::{Precision, cast_module, check_checkpoint, is_host_backend, scatter_add};

use crate::ForceFieldError;
use crate::batch::Graph;
use crate::config::{PainnConfig, RadialBasisKind};
use crate::host;
use crate::structure::Structure;

/// Stability constant inside the vector norm's square root (schnetpack's `epsilon`).
pub(crate) const EPSILON: f64 = 1e-8;

/// `layer(x)` as `parts` equal column blocks of its output, each its own contiguous tensor: a
/// product with a column block of the weight rather than a `narrow` of one output. burn-flex
/// runs arithmetic on `narrow`ed (strided) operands, and its autodiff backward, one element at a
/// time.
fn linear_parts<B: Backend>(layer: &Linear<B>, x: Tensor<B, 2>, parts: usize) -> Vec<Tensor<B, 2>> {
    let weight = layer.weight.val();
    let width = weight.dims()[1] / parts;
    (0..parts)
        .map(|k| {
            let y = x.clone().matmul(weight.clone().narrow(1, k * width, width));
            match &layer.bias {
                Some(bias) => y + bias.val().narrow(0, k * width, width).unsqueeze_dim(0),
                None => y,
            }
        })
        .collect()
}

/// Vector features as one `[atoms, F]` tensor per Cartesian axis (schnetpack keeps
/// `[atoms, 3, F]`): every operation on them is then 2-D on contiguous operands, which burn-flex
/// vectorises, where broadcasts over the middle axis and 3-D scatters go element by element.
type Vectors<B> = [Tensor<B, 2>; 3];

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
        }
    }
}

impl<B: Backend> Painn<B> {
    /// Reads a model directory: `config.json` and `model.safetensors` (a schnetpack
    /// `NeuralNetworkPotential` state dict). A missing, integer or mis-shaped tensor is an error
    /// listing each ([`kiln_precision::check_checkpoint`]); unused tensors are a warning.
    pub fn from_dir(dir: impl AsRef<Path>, device: &B::Device) -> Result<Self, ForceFieldError> {
        let dir = dir.as_ref();
        let config = PainnConfig::from_file(dir)?;
        let mut model = config.init::<B>(device);
        let file = dir.join("model.safetensors");
        let fail = |e: &dyn std::fmt::Display| {
            ForceFieldError::Weights(format!("{}: {e}", file.display()))
        };
        if !file.is_file() {
            return Err(fail(&"no such file"));
        }
        let raw_config = std::fs::read_to_string(dir.join("config.json"))
            .ok()
            .and_then(|text| serde_json::from_str(&text).ok());
        let fit =
            check_checkpoint(&model, &[&file], &[], raw_config.as_ref()).map_err(|problems| {
                fail(&format!(
                    "{} tensor(s) cannot be loaded:\n  {}",
                    problems.lines().count(),
                    problems.replace('\n', "\n  ")
                ))
            })?;
        if let Some(unused) = fit.unexpected(&[]) {
            log::warn!(
                "{}: tensors the model does not use: {unused}",
                file.display()
            );
        }
        let mut store = SafetensorsStore::from_file(&file)
            .with_from_adapter(PyTorchToBurnAdapter)
            .allow_partial(true);
        let result = model.load_from(&mut store).map_err(|e| fail(&e))?;
        if let Some(error) = result.errors.first() {
            return Err(fail(&format!("{error:?}")));
        }
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
        let fail =
            |e: &dyn std::fmt::Display| ForceFieldError::Weights(format!("{}: {e}", dir.display()));
        std::fs::create_dir_all(dir).map_err(|e| fail(&e))?;
        let config = serde_json::to_string_pretty(&self.config).map_err(|e| fail(&e))?;
        let written = |e: kiln_io::FileError| ForceFieldError::Weights(e.to_string());
        kiln_io::write_atomic(&dir.join("config.json"), (config + "\n").as_bytes())
            .map_err(written)?;
        kiln_io::write_atomic_at(&dir.join("model.safetensors"), |temporary| {
            let mut store = SafetensorsStore::from_file(temporary)
                .with_to_adapter(BurnToPyTorchAdapter)
                .overwrite(true);
            cast_module(self.clone(), Precision::F32).save_into(&mut store)
        })
        .map_err(written)
    }

    /// The model's hyper-parameters.
    pub fn config(&self) -> &PainnConfig {
        &self.config
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
        Graph::new(
            structures,
            self.config.cutoff,
            self.config.max_z,
            device,
            dtype,
        )
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
        let mut atoms = self.atomwise(graph, positions, strain);
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
        let sums = scatter_add(zeros, 0, graph.structure.clone(), atoms);
        let counts: Vec<f64> = graph.atoms.iter().map(|&n| n as f64).collect();
        let offsets = Tensor::<B, 1>::from_data(
            TensorData::new(counts, [structures]),
            (&device, sums.dtype()),
        );
        sums + offsets * self.config.mean_per_atom
    }

    /// Every atom's energy contribution `[N]` (before the per-atom mean).
    fn atomwise(
        &self,
        graph: &Graph<B>,
        positions: Tensor<B, 2>,
        strain: Option<Tensor<B, 3>>,
    ) -> Tensor<B, 1> {
        let r = &self.representation;
        let config = &self.config;
        let f = config.n_atom_basis;
        let atoms = positions.dims()[0];
        let mut r_ij = positions.clone().select(0, graph.idx_j.clone())
            - positions.select(0, graph.idx_i.clone())
            + graph.shifts.clone();
        if let Some(strain) = strain {
            let pairs = r_ij.dims()[0];
            let symmetric = (strain.clone() + strain.swap_dims(1, 2)) * 0.5;
            let pair_strain =
                symmetric.select(0, graph.structure.clone().select(0, graph.idx_i.clone()));
            // (r ε)_x = Σ_k r_k ε_kx, per pair.
            let deformation = (r_ij.clone().unsqueeze_dim::<3>(2) * pair_strain)
                .sum_dim(1)
                .reshape([pairs, 3]);
            r_ij = r_ij + deformation;
        }
        let d_ij = r_ij.clone().powi_scalar(2).sum_dim(1).sqrt(); // [P, 1]
        let dir_ij = r_ij / d_ij.clone();
        let device = dir_ij.device();
        let dirs: Vectors<B> = std::array::from_fn(|axis| {
            let axis =
                Tensor::<B, 1, Int>::from_data(TensorData::new(vec![axis as i64], [1]), &device);
            dir_ij.clone().select(1, axis)
        });
        let filters = self.filters(d_ij);
        let mut q = r
            .embedding
            .forward(graph.numbers.clone().unsqueeze_dim(0))
            .squeeze_dim::<2>(0);
        let q_dtype = dir_ij.dtype();
        q = q.cast(q_dtype);
        let mut mu: Vectors<B> =
            std::array::from_fn(|_| Tensor::zeros([atoms, f], (&device, q_dtype)));
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
            y = silu(layer.forward(y));
        }
        single_output(last, y)
    }

    /// The filter network's outputs times the cosine cutoff for distances `[P, 1]`: 3 `[P, F]`
    /// filters per interaction block (3 in all with shared filters). `(rbf W + b) c` is formed
    /// as one product `[rbf c, c] [W; b]`, so neither the bias nor the cutoff costs a pass over
    /// the pairs.
    fn filters(&self, d: Tensor<B, 2>) -> Vec<Tensor<B, 2>> {
        let net = &self.representation.filter_net;
        let cutoff = self.cosine_cutoff(d.clone());
        let basis = self.radial_basis(d) * cutoff.clone();
        let (basis, weight) = match &net.bias {
            Some(bias) => (
                Tensor::cat(vec![basis, cutoff], 1),
                Tensor::cat(vec![net.weight.val(), bias.val().unsqueeze_dim(0)], 0),
            ),
            None => (basis, net.weight.val()),
        };
        let width = self.config.n_atom_basis;
        let parts = weight.dims()[1] / width;
        (0..parts)
            .map(|k| {
                basis
                    .clone()
                    .matmul(weight.clone().narrow(1, k * width, width))
            })
            .collect()
    }

    /// The radial basis of distances `[P, 1]`, `[P, n_rbf]`.
    fn radial_basis(&self, d: Tensor<B, 2>) -> Tensor<B, 2> {
        let basis = &self.representation.radial_basis;
        let dtype = d.dtype();
        let row = |p: &Option<Param<Tensor<B, 1>>>| {
            p.as_ref()
                .expect("the config's radial basis has its constants")
                .val()
                .cast(dtype)
                .unsqueeze_dim::<2>(0)
        };
        match self.config.radial_basis {
            RadialBasisKind::Gaussian => {
                let coeff = row(&basis.widths).powi_scalar(2).recip() * -0.5;
                ((d - row(&basis.offsets)).powi_scalar(2) * coeff).exp()
            }
            RadialBasisKind::Bessel => (d.clone() * row(&basis.freqs)).sin() / d,
        }
    }

    /// `½ (cos(π d / rc) + 1)` below the cutoff, 0 beyond, `[P, 1]`.
    fn cosine_cutoff(&self, d: Tensor<B, 2>) -> Tensor<B, 2> {
        let rc = self.config.cutoff;
        let inside = d.clone().lower_elem(rc).float().cast(d.dtype());
        ((d * (PI / rc)).cos() + 1.0) * 0.5 * inside
    }
}

/// The readout's last layer `[N, K] → [N]` as a row-wise dot product: one output column needs no
/// matrix product, and burn 0.21's fused wgpu kernel for `[M, K] [K, 1] + bias` returns wrong
/// rows when `K` is odd.
fn single_output<B: Backend>(layer: &Linear<B>, y: Tensor<B, 2>) -> Tensor<B, 1> {
    let row = layer.weight.val().transpose(); // [1, K]
    let dot = (y * row).sum_dim(1).squeeze_dim::<1>(1);
    match &layer.bias {
        Some(bias) => dot + bias.val(),
        None => dot,
    }
}

impl<B: Backend> Interaction<B> {
    /// Adds every atom's messages from its neighbours (filters `w`, unit vectors `dirs` from
    /// centre to neighbour, both per pair) to its features.
    fn forward(
        &self,
        q: Tensor<B, 2>,
        mu: Vectors<B>,
        w: &[Tensor<B, 2>],
        dirs: &Vectors<B>,
        graph: &Graph<B>,
    ) -> (Tensor<B, 2>, Vectors<B>) {
        if graph.idx_i.dims()[0] == 0 {
            // No atom has a neighbour: no messages (burn-flex's products of empty tensors also
            // lose their dtype).
            return (q, mu);
        }
        let net = &self.interatomic_context_net;
        let x = linear_parts(&net[1], silu(net[0].forward(q.clone())), 3);
        let from_neighbours = |k: usize, atom_values: Tensor<B, 2>| {
            w[k].clone() * atom_values.select(0, graph.idx_j.clone())
        };
        let receive = |features: Tensor<B, 2>, messages: Tensor<B, 2>| {
            scatter_add(features, 0, graph.idx_i.clone(), messages)
        };
        let dq = from_neighbours(0, x[0].clone());
        let dmu_r = from_neighbours(1, x[1].clone());
        // schnetpack's dmu_mu · mu_j, with the product x_mu · mu taken per atom (one pass over
        // the atoms instead of one over the pairs).
        let mu = std::array::from_fn(|axis| {
            let dmu_mu = from_neighbours(2, x[2].clone() * mu[axis].clone());
            receive(
                mu[axis].clone(),
                dmu_r.clone() * dirs[axis].clone() + dmu_mu,
            )
        });
        (receive(q, dq), mu)
    }
}

impl<B: Backend> Mixing<B> {
    /// Mixes each atom's scalar features with the norms and projections of its vector ones.
    fn forward(&self, q: Tensor<B, 2>, mu: Vectors<B>) -> (Tensor<B, 2>, Vectors<B>) {
        let (mu_v, mu_w): (Vec<_>, Vec<_>) = mu
            .iter()
            .map(|axis| {
                let [v, w]: [Tensor<B, 2>; 2] = linear_parts(&self.mu_channel_mix, axis.clone(), 2)
                    .try_into()
                    .expect("two parts");
                (v, w)
            })
            .unzip();
        let sum_over_axes =
            |terms: Vec<Tensor<B, 2>>| terms.into_iter().reduce(|a, b| a + b).expect("three axes");
        let mu_v_norm = (sum_over_axes(mu_v.iter().map(|v| v.clone().powi_scalar(2)).collect())
            + EPSILON)
            .sqrt();
        let dot = sum_over_axes(
            mu_v.into_iter()
                .zip(&mu_w)
                .map(|(v, w)| v * w.clone())
                .collect(),
        );
        let net = &self.intraatomic_context_net;
        let hidden = silu(net[0].forward(Tensor::cat(vec![q.clone(), mu_v_norm], 1)));
        let [dq, dmu, dqmu]: [Tensor<B, 2>; 3] = linear_parts(&net[1], hidden, 3)
            .try_into()
            .expect("three parts");
        let mu = std::array::from_fn(|axis| mu[axis].clone() + dmu.clone() * mu_w[axis].clone());
        (q + dq + dqmu * dot, mu)
    }
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
        if is_host_backend::<B>(device) {
            match self.representation.filter_net.weight.val().dtype() {
                DType::F32 => return host::predict::<f32, B>(self, structures),
                DType::F64 => return host::predict::<f64, B>(self, structures),
                _ => {}
            }
        }
        self.predict_tensors(structures, device)
    }

    /// [`predict`](Self::predict) through tensor operations on the device: the batch as one
    /// graph, one forward and one backward pass (autodiff) over it. Any backend, any dtype.
    pub fn predict_tensors(
        &self,
        structures: &[Structure],
        device: &B::Device,
    ) -> Result<Predictions, ForceFieldError> {
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
        })
    }
}

/// The stress `sym(∂E/∂ε) / V` of a cell of volume `V` (Å³) from its virial `∂E/∂ε` (eV); the
/// strain enters through its symmetric part.
pub(crate) fn stress(virial: &[[f64; 3]; 3], volume: f64) -> [[f64; 3]; 3] {
    std::array::from_fn(|a| std::array::from_fn(|b| 0.5 * (virial[a][b] + virial[b][a]) / volume))
}
