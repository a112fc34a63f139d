//! PaiNN energies, forces and stresses on the CPU: one fused pass over each structure's
//! neighbour pairs, forward and backward by hand, structures in parallel.
//!
//! The tensor path ([`Painn::predict_tensors`]) stores every pair's filters `[P, 3F]` for every
//! block and runs a few hundred autodiff operations per call; on a CPU those operations are
//! memory-bound, and a small batch pays their bookkeeping. Here a pair's filters
//! `[rbf c, c] [W; b]` are formed from its radial basis when the pair is visited (and formed
//! again in the backward pass): nothing of size `P × F` is stored, so a structure's work stays
//! in cache. Pairs never cross structures, so structures run in parallel without shared writes.
//! The arithmetic is the tensor path's, in the model's dtype (f32 or f64); tests check the two
//! against each other and against schnetpack.

mod dense;
mod passes;
mod rows;
mod tangent;
mod team;

use std::ops::{AddAssign, SubAssign};
use std::sync::Arc;

use burn::module::Param;
use burn::nn::Linear;
use burn::tensor::backend::Backend;
use burn::tensor::{DType, Element, Tensor, TensorData};
use kiln_core::is_host_backend;
use num_traits::Float;
use rayon::prelude::*;

use kiln_kernels::gemm::sgemm;

use crate::ForceFieldError;
use crate::config::{PainnConfig, RadialBasisKind};
use crate::neighbors::{NeighborList, neighbor_list};
use crate::painn::{Painn, Predictions, stress};
use crate::structure::Structure;
use dense::{Dense, DenseGradient};
pub(crate) use passes::parts_for;
use tangent::TangentInput;
use team::Team;

/// The float types the host kernel runs in.
pub(crate) trait Real: Float + Element + AddAssign + SubAssign {
    /// eˣ as the kernel's loops compute it: a form that vectorises where the type has one.
    #[inline(always)]
    fn vexp(self) -> Self {
        self.exp()
    }

    /// `self`, or 0 where it is below √(smallest normal value) (1.1e-19 in f32), where it
    /// weighs nothing beside the other terms of a sum. Every product that reads or writes a
    /// subnormal on x86 takes a microcode assist (kiln-kernels' `loss.rs` found the same in a
    /// logit gradient); the product of two values above this bound is normal. A radial basis
    /// value from a Gaussian's tail (1e-38, where e^x stops) times a weight is subnormal: a
    /// benzene's basis had dozens, the filter products' accumulators took an assist for each, and
    /// a call cost 0.85 ms instead of 0.57.
    #[inline(always)]
    fn flushed(self) -> Self {
        if self.abs() < Self::min_positive_value().sqrt() {
            Self::zero()
        } else {
            self
        }
    }

    /// A layer's weight `[inputs, outputs]` packed for [`sgemm`], where this type and CPU run it.
    fn packed(_weight: &[Self], _inputs: usize) -> Option<sgemm::Packed> {
        None
    }

    /// `x · packed (+ bias)` on this thread, for a weight [`Real::packed`] returned.
    fn packed_product(_x: &[Self], _packed: &sgemm::Packed, _bias: Option<&[Self]>) -> Vec<Self> {
        unreachable!("only types that pack weights multiply by packed weights")
    }

    /// `x · m` for `m` of `width` columns, neither known in advance (a weight's gradient
    /// `xᵀ g`), on this thread.
    #[inline(always)]
    fn product(x: &[Self], m: &[Self], width: usize) -> Vec<Self> {
        dense::product(x, m, width, None)
    }
}

impl Real for f32 {
    /// kiln-core's eˣ (a few ulps; libm's `expf` is a call per value).
    #[inline(always)]
    fn vexp(self) -> f32 {
        kiln_kernels::math::exp(self)
    }

    fn packed(weight: &[f32], inputs: usize) -> Option<sgemm::Packed> {
        sgemm::supported().then(|| sgemm::Packed::new(inputs, &[(weight, weight.len() / inputs)]))
    }

    fn packed_product(x: &[f32], packed: &sgemm::Packed, bias: Option<&[f32]>) -> Vec<f32> {
        let (inputs, outputs) = (packed.rows(), packed.columns());
        let rows = x.len() / inputs;
        let mut y = vec![0.0; rows * outputs];
        let zeros;
        let bias = match bias {
            Some(bias) => bias,
            None => {
                zeros = vec![0.0; outputs];
                &zeros
            }
        };
        sgemm::product_on_this_thread(&mut y, x, packed, rows, bias);
        y
    }

    /// Through [`sgemm`] where the CPU runs it, `m` packed first.
    #[inline(always)]
    fn product(x: &[f32], m: &[f32], width: usize) -> Vec<f32> {
        if !sgemm::supported() {
            return dense::product(x, m, width, None);
        }
        let inputs = m.len() / width;
        f32::packed_product(x, &sgemm::Packed::new(inputs, &[(m, width)]), None)
    }
}

impl Real for f64 {}

/// A model's host kernel, in its parameters' dtype: what the CPU backends run.
pub(crate) enum Host {
    F32(HostPotential<f32>),
    F64(HostPotential<f64>),
}

impl Host {
    /// `model`'s weights read into the host kernel's layout, when `device` is a CPU backend's and
    /// the parameters are f32 or f64 (`None` otherwise: the tensor path runs those).
    pub fn for_model<B: Backend>(model: &Painn<B>, device: &B::Device) -> Option<Self> {
        if !is_host_backend::<B>(device) {
            return None;
        }
        match model.representation.filter_net.weight.val().dtype() {
            DType::F32 => Some(Host::F32(HostPotential::new(model))),
            DType::F64 => Some(Host::F64(HostPotential::new(model))),
            _ => None,
        }
    }

    /// Bytes of one float of the kernel.
    fn element_bytes(&self) -> usize {
        match self {
            Host::F32(_) => 4,
            Host::F64(_) => 8,
        }
    }

    /// [`HostPotential::evaluate`] in the model's dtype.
    pub fn evaluate(&self, s: &Structure, list: &NeighborList, parts: usize) -> Evaluated {
        match self {
            Host::F32(potential) => potential.evaluate(s, list, parts),
            Host::F64(potential) => potential.evaluate(s, list, parts),
        }
    }

    /// What [`Painn::predict`] computes: structures in parallel, one at a time, or a structure
    /// alone split over [`parts_for`] threads.
    pub fn predict(
        &self,
        config: &PainnConfig,
        structures: &[Structure],
    ) -> Result<Predictions, ForceFieldError> {
        let evaluate = |index: usize, s: &Structure, parts: usize| {
            s.validate(index, config.max_z)?;
            let list = neighbor_list(s, config.cutoff).map_err(|e| e.in_structure(index))?;
            config.check_pairs(
                index,
                list.len(),
                self.element_bytes(),
                kiln_core::available_memory(),
            )?;
            Ok((self.evaluate(s, &list, parts), list.closest(s)))
        };
        let results: Vec<Result<(Evaluated, f64), ForceFieldError>> = match structures {
            [s] => vec![evaluate(0, s, parts_for(s.len()))],
            _ => structures
                .par_iter()
                .enumerate()
                .map(|(index, s)| evaluate(index, s, 1))
                .collect(),
        };
        let mut predictions = Predictions {
            energies: Vec::with_capacity(structures.len()),
            forces: Vec::new(),
            stresses: Vec::with_capacity(structures.len()),
            closest: Vec::with_capacity(structures.len()),
        };
        for (s, result) in structures.iter().zip(results) {
            let (
                Evaluated {
                    energy,
                    forces,
                    virial,
                },
                closest,
            ) = result?;
            predictions.closest.push(closest);
            predictions.energies.push(energy);
            predictions.forces.extend(forces);
            predictions
                .stresses
                .push(s.volume().map(|volume| stress(&virial, volume)));
        }
        Ok(predictions)
    }
}

/// What a batch's force-matching loss needs of the parameters' gradient, per structure: `∂ℓ/∂E`
/// (`energy_seeds`), `∂ℓ/∂F` per atom (`force_gradient`, flat) and the strain tangent
/// `sym(∂ℓ/∂σ) / V` (`strain_tangent`, 9 per structure, when any structure has a stress term).
pub(crate) struct LossSeeds<'a> {
    pub energy_seeds: &'a [f64],
    pub force_gradient: &'a [f64],
    pub strain_tangent: Option<&'a [f64]>,
}

/// `Σ_θ sum(θ ⊙ g_θ)` with `g_θ = ∂ℓ/∂θ` computed on the host in `T` and held constant: a
/// scalar whose gradient (one `backward()`) is the loss's, every parameter's exactly (see
/// `tangent.rs`). Structures in parallel, each with its own neighbour list.
pub(crate) fn loss_surrogate<T: Real, B: Backend>(
    model: &Painn<B>,
    structures: &[Structure],
    seeds: &LossSeeds,
) -> Result<Tensor<B, 1>, ForceFieldError> {
    let weights = Weights::<T>::read(model);
    let config = model.config();
    let mut first_atom = 0;
    let inputs: Vec<(usize, &Structure, usize)> = structures
        .iter()
        .enumerate()
        .map(|(index, s)| {
            first_atom += s.len();
            (index, s, first_atom - s.len())
        })
        .collect();
    let inputs = inputs
        .into_par_iter()
        .map(|(index, s, first_atom)| {
            let list = neighbor_list(s, config.cutoff).map_err(|e| e.in_structure(index))?;
            let u = |atom: usize| -> [f64; 3] {
                std::array::from_fn(|a| seeds.force_gradient[3 * (first_atom + atom) + a])
            };
            let strain = seeds.strain_tangent.map(|t| &t[9 * index..9 * (index + 1)]);
            let (mut r, mut tangents) = (Vec::new(), Vec::new());
            for p in 0..list.len() {
                let (i, j) = (list.i[p] as usize, list.j[p] as usize);
                let shift = list.shift(p, &s.cell);
                let vector: [f64; 3] =
                    std::array::from_fn(|a| s.positions[j][a] - s.positions[i][a] + shift[a]);
                // The positions move along −u, the cell along the strain tangent.
                let (ui, uj) = (u(i), u(j));
                let tangent: [f64; 3] = std::array::from_fn(|b| {
                    ui[b] - uj[b]
                        + strain.map_or(0.0, |e| (0..3).map(|a| vector[a] * e[3 * a + b]).sum())
                });
                r.push(vector.map(|v| T::from(v).unwrap()));
                tangents.push(tangent.map(|v| T::from(v).unwrap()));
            }
            Ok(TangentInput {
                numbers: s.numbers.clone(),
                pairs: Pairs {
                    i: list.i.iter().map(|&i| i as usize).collect(),
                    j: list.j.iter().map(|&j| j as usize).collect(),
                    r,
                },
                tangents,
                energy_seed: T::from(seeds.energy_seeds[index]).unwrap(),
            })
        })
        .collect::<Result<Vec<_>, ForceFieldError>>()?;
    let gradients = weights.tangent_gradients(pulp::Arch::new(), &inputs);

    let r = &model.representation;
    let mut total = Vec::new();
    let mut term = |param: Tensor<B, 2>, values: &[T]| {
        let gradient = Tensor::from_data(
            TensorData::new(values.to_vec(), param.dims()),
            (&param.device(), param.dtype()),
        );
        total.push((param * gradient).sum());
    };
    let mut layer = |linear: &Linear<B>, gradient: &DenseGradient<T>| {
        term(linear.weight.val(), &gradient.w);
        if let (Some(bias), Some(values)) = (&linear.bias, &gradient.b) {
            term(bias.val().unsqueeze(), values);
        }
    };
    for (t, block) in gradients.blocks.iter().enumerate() {
        let [c0, c1, m0, m1, cm] = block;
        let (interaction, mixing) = (&r.interactions[t], &r.mixing[t]);
        layer(&interaction.interatomic_context_net[0], c0);
        layer(&interaction.interatomic_context_net[1], c1);
        layer(&mixing.intraatomic_context_net[0], m0);
        layer(&mixing.intraatomic_context_net[1], m1);
        layer(&mixing.mu_channel_mix, cm);
    }
    for (linear, gradient) in model.output_modules[0]
        .outnet
        .iter()
        .zip(&gradients.readout)
    {
        layer(linear, gradient);
    }
    // The filter network's `[W; b]`: the bias is its last row.
    let filter_weight = r.filter_net.weight.val();
    let split = filter_weight.dims().iter().product::<usize>();
    let (w, b) = gradients.filter.split_at(split);
    let filter = DenseGradient {
        w: w.to_vec(),
        b: r.filter_net.bias.as_ref().map(|_| b.to_vec()),
    };
    layer(&r.filter_net, &filter);
    term(r.embedding.weight.val(), &gradients.embedding);
    Ok(Tensor::cat(total, 0).sum())
}

/// A model's weights read once into host memory in `T`, for repeated evaluations (molecular
/// dynamics and a [`crate::Predictor`] call it every step).
pub(crate) struct HostPotential<T> {
    weights: Arc<Weights<T>>,
    /// Threads for the parts of a structure evaluated alone.
    team: Team,
    /// The widest instruction set this CPU has (AVX2 + FMA, AVX-512), for the kernel's loops.
    arch: pulp::Arch,
}

impl<T: Real> HostPotential<T> {
    pub fn new<B: Backend>(model: &Painn<B>) -> Self {
        HostPotential {
            weights: Arc::new(Weights::read(model)),
            team: Team::default(),
            arch: pulp::Arch::new(),
        }
    }

    /// The energy, forces and virial of `s` (already validated) over the pairs of `list`, its
    /// atoms split into `parts` that threads evaluate side by side ([`parts_for`] for a structure
    /// evaluated alone; one part when the pairs are not ordered by centre).
    pub fn evaluate(&self, s: &Structure, list: &NeighborList, parts: usize) -> Evaluated {
        let vectors: Vec<[T; 3]> = (0..list.len())
            .map(|p| {
                let (i, j) = (list.i[p] as usize, list.j[p] as usize);
                let shift = list.shift(p, &s.cell);
                std::array::from_fn(|a| {
                    T::from(s.positions[j][a] - s.positions[i][a] + shift[a]).unwrap()
                })
            })
            .collect();
        let pairs = Pairs {
            i: list.i.iter().map(|&i| i as usize).collect(),
            j: list.j.iter().map(|&j| j as usize).collect(),
            r: vectors.clone(),
        };
        let (energy, gradients) = self
            .weights
            .structure(self.arch, &s.numbers, pairs, parts, &self.team);
        // ∂E/∂R from ∂E/∂r_ij (r_ij = R_j − R_i + shift), and the virial Σ r ⊗ ∂E/∂r.
        let mut forces = vec![[0.0; 3]; s.len()];
        let mut virial = [[0.0; 3]; 3];
        for (p, g) in gradients.iter().enumerate() {
            let g = g.map(|v| v.elem::<f64>());
            let r = vectors[p].map(|v| v.elem::<f64>());
            let (i, j) = (list.i[p] as usize, list.j[p] as usize);
            for a in 0..3 {
                forces[i][a] += g[a];
                forces[j][a] -= g[a];
                for b in 0..3 {
                    virial[a][b] += r[a] * g[b];
                }
            }
        }
        Evaluated {
            energy: energy.elem::<f64>(),
            forces,
            virial,
        }
    }
}

/// One structure's energy, the forces on its atoms and its virial `Σ r ⊗ ∂E/∂r` (eV).
pub(crate) struct Evaluated {
    pub energy: f64,
    pub forces: Vec<[f64; 3]>,
    pub virial: [[f64; 3]; 3],
}

/// One structure's neighbour pairs: centre, neighbour and the vector between them.
struct Pairs<T> {
    i: Vec<usize>,
    j: Vec<usize>,
    r: Vec<[T; 3]>,
}

/// A tensor's values on the host in `T`.
fn values<T: Real, B: Backend, const D: usize>(tensor: Tensor<B, D>) -> Vec<T> {
    tensor
        .into_data()
        .convert::<T>()
        .to_vec()
        .expect("float values")
}

/// The radial basis's constants in `T`.
enum Basis<T> {
    /// Centres and `−½ / width²`.
    Gaussian { offsets: Vec<T>, coeffs: Vec<T> },
    /// Frequencies.
    Bessel { freqs: Vec<T> },
}

/// The interaction and mixing blocks' layers.
struct Block<T> {
    context: [Dense<T>; 2],
    mixing: [Dense<T>; 2],
    channel_mix: Dense<T>,
}

/// A potential's parameters on the host.
struct Weights<T> {
    f: usize,
    embedding: Vec<T>,
    basis: Basis<T>,
    cutoff: f64,
    /// `[W; b]` of the filter network, `[n_rbf (+ 1), 3F × sets]`, without a bias of its own:
    /// a pair's `[φ c, c]` times it gives every block's filters of the pair.
    filter: Dense<T>,
    shared_filters: bool,
    blocks: Vec<Block<T>>,
    readout: Vec<Dense<T>>,
    /// Added to every atom's energy by atomic number (zeros without reference energies).
    atomref: Vec<T>,
    mean_per_atom: T,
}

impl<T: Real> Weights<T> {
    fn read<B: Backend>(model: &Painn<B>) -> Self {
        let config = model.config();
        let r = &model.representation;
        let constants = |p: &Option<Param<Tensor<B, 1>>>| {
            values::<T, B, 1>(p.as_ref().expect("the config's basis constants").val())
        };
        let basis = match config.radial_basis {
            RadialBasisKind::Gaussian => Basis::Gaussian {
                offsets: constants(&r.radial_basis.offsets),
                coeffs: constants(&r.radial_basis.widths)
                    .into_iter()
                    .map(|w| T::from(-0.5).unwrap() / (w * w))
                    .collect(),
            },
            RadialBasisKind::Bessel => Basis::Bessel {
                freqs: constants(&r.radial_basis.freqs),
            },
        };
        let mut filter: Vec<T> = values(r.filter_net.weight.val());
        if let Some(bias) = &r.filter_net.bias {
            filter.extend(values::<T, B, 1>(bias.val()));
        }
        let filter = Dense::new(
            filter,
            r.filter_net.weight.val().dims()[0] + usize::from(r.filter_net.bias.is_some()),
            None,
        );
        let blocks = r
            .interactions
            .iter()
            .zip(&r.mixing)
            .map(|(interaction, mixing)| {
                let dense =
                    |layers: &[Linear<B>]| [Dense::read(&layers[0]), Dense::read(&layers[1])];
                Block {
                    context: dense(&interaction.interatomic_context_net),
                    mixing: dense(&mixing.intraatomic_context_net),
                    channel_mix: Dense::read(&mixing.mu_channel_mix),
                }
            })
            .collect();
        let atomref = match &config.atomref {
            Some(values) => values.iter().map(|&v| T::from(v).unwrap()).collect(),
            None => vec![T::zero(); config.max_z],
        };
        Weights {
            f: config.n_atom_basis,
            embedding: values(r.embedding.weight.val()),
            basis,
            cutoff: config.cutoff,
            filter,
            shared_filters: config.shared_filters,
            blocks,
            readout: model.output_modules[0]
                .outnet
                .iter()
                .map(Dense::read)
                .collect(),
            atomref,
            mean_per_atom: T::from(config.mean_per_atom).unwrap(),
        }
    }

    /// Rows of `[W; b]`: `n_rbf`, and one more with a bias.
    #[inline(always)]
    fn filter_rows(&self) -> usize {
        self.filter.w.len() / self.filter.outputs
    }

    /// `[φ(d) c(d), c(d)]` of a distance (the bias's entry only with a bias) and its derivative
    /// with respect to `d`, appended to `psi` and `dpsi`.
    #[inline(always)]
    fn radial(&self, d: T, psi: &mut Vec<T>, dpsi: &mut Vec<T>) {
        let rc = self.cutoff;
        let scale = T::from(std::f64::consts::PI / rc).unwrap();
        let half = T::from(0.5).unwrap();
        let (c, dc) = if d < T::from(rc).unwrap() {
            (
                ((d * scale).cos() + T::one()) * half,
                -(d * scale).sin() * scale * half,
            )
        } else {
            (T::zero(), T::zero())
        };
        match &self.basis {
            Basis::Gaussian { offsets, coeffs } => {
                for (&o, &k) in offsets.iter().zip(coeffs) {
                    let phi = ((d - o) * (d - o) * k).exp();
                    let dphi = phi * (T::one() + T::one()) * k * (d - o);
                    psi.push((phi * c).flushed());
                    dpsi.push((dphi * c + phi * dc).flushed());
                }
            }
            Basis::Bessel { freqs } => {
                for &k in freqs {
                    let phi = (d * k).sin() / d;
                    let dphi = (k * (d * k).cos() - phi) / d;
                    psi.push((phi * c).flushed());
                    dpsi.push((dphi * c + phi * dc).flushed());
                }
            }
        }
        if self.filter_rows() > self.basis_len() {
            psi.push(c);
            dpsi.push(dc);
        }
    }

    #[inline(always)]
    fn basis_len(&self) -> usize {
        match &self.basis {
            Basis::Gaussian { offsets, .. } => offsets.len(),
            Basis::Bessel { freqs } => freqs.len(),
        }
    }

    /// The first column of block `t`'s filters in `[W; b]`.
    #[inline(always)]
    fn filter_start(&self, t: usize) -> usize {
        if self.shared_filters {
            0
        } else {
            3 * self.f * t
        }
    }
}

#[cfg(test)]
mod tests {
    use burn::backend::Flex;
    use kiln_core::Precision;
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    use super::*;
    use crate::md::VerletList;

    /// A structure split into parts that threads run side by side gives the one-part energy,
    /// forces and virial (up to the order of the sums of what parts send each other), for both
    /// fixture models (one with filters shared by its blocks), a molecule and a periodic cell;
    /// pairs not ordered by centre fall back to one part.
    #[test]
    fn parts_give_the_whole_structures_result() {
        let mut rng = ChaCha8Rng::seed_from_u64(3);
        let cluster = |n: usize, side: f64, rng: &mut ChaCha8Rng| Structure {
            numbers: (0..n).map(|k| [1, 6, 7, 8][k % 4]).collect(),
            positions: (0..n)
                .map(|_| std::array::from_fn(|_| rng.random::<f64>() * side))
                .collect(),
            cell: [[side, 0.0, 0.0], [0.0, side, 0.0], [0.0, 0.0, side]],
            pbc: [false; 3],
        };
        let molecule = cluster(23, 6.0, &mut rng);
        let periodic = Structure {
            pbc: [true; 3],
            ..cluster(17, 7.0, &mut rng)
        };
        let fixtures = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/");
        for name in ["painn_gaussian", "painn_bessel_shared"] {
            let model = Painn::<Flex>::from_dir(format!("{fixtures}{name}"), &Default::default())
                .unwrap()
                .with_precision(Precision::F64);
            let potential = HostPotential::<f64>::new(&model);
            for s in [&molecule, &periodic] {
                let list = VerletList::new(model.config().cutoff, 0.5)
                    .pairs(s)
                    .unwrap();
                assert!(list.i.is_sorted() && list.len() > 100);
                let whole = potential.evaluate(s, &list, 1);
                let mut reversed = list.clone();
                reversed.i.reverse();
                reversed.j.reverse();
                reversed.cell_shifts.reverse();
                for (parts, list) in [(2, &list), (3, &list), (4, &list), (4, &reversed)] {
                    let split = potential.evaluate(s, list, parts);
                    let close = |a: f64, b: f64| (a - b).abs() <= 1e-12 * (1.0 + b.abs());
                    assert!(close(split.energy, whole.energy), "{name}, {parts} parts");
                    let pairs = split.forces.iter().zip(&whole.forces);
                    let virial = split.virial.iter().zip(&whole.virial);
                    for (a, b) in pairs.chain(virial) {
                        assert!(
                            a.iter().zip(b).all(|(&a, &b)| close(a, b)),
                            "{name}, {parts} parts: {a:?} vs {b:?}"
                        );
                    }
                }
            }
        }
    }

    /// The radial basis has no value too small to multiply without a subnormal (each one a
    /// microcode assist in the filter products): the Gaussians far from a distance are zeros.
    #[test]
    fn the_radial_basis_holds_no_value_too_small_to_multiply() {
        // The seed's basis: 20 Gaussians over 5 Å, as narrow as their spacing.
        let fixture = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/painn_gaussian");
        let config = PainnConfig {
            n_rbf: 20,
            ..PainnConfig::from_file(fixture).unwrap()
        };
        let weights = Weights::<f32>::read(&config.init::<Flex>(&Default::default()));
        let Basis::Gaussian { offsets, coeffs } = &weights.basis else {
            panic!("the fixture has Gaussians");
        };
        let distances: Vec<f32> = (1..100)
            .map(|k| k as f32 * weights.cutoff as f32 / 100.0)
            .collect();
        // The case must reach the Gaussians' tails: exact values far below the bound.
        let tail = distances.iter().any(|&d| {
            offsets
                .iter()
                .zip(coeffs)
                .any(|(&o, &k)| f64::from((d - o) * (d - o) * k).exp() < 1e-30)
        });
        assert!(tail, "no distance reaches a Gaussian's tail");
        let bound = f32::MIN_POSITIVE.sqrt();
        for d in distances {
            let (mut psi, mut dpsi) = (Vec::new(), Vec::new());
            weights.radial(d, &mut psi, &mut dpsi);
            for v in psi.iter().chain(&dpsi) {
                assert!(*v == 0.0 || v.abs() >= bound, "{v:e} at {d} Å");
            }
        }
    }
}
