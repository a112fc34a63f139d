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

use std::ops::{AddAssign, SubAssign};

use burn::module::Param;
use burn::nn::Linear;
use burn::tensor::backend::Backend;
use burn::tensor::{Element, Tensor};
use num_traits::Float;
use rayon::prelude::*;

use crate::ForceFieldError;
use crate::config::RadialBasisKind;
use crate::neighbors::{NeighborList, neighbor_list};
use crate::painn::{EPSILON, Painn, Predictions, stress};
use crate::structure::Structure;

/// The float types the host kernel runs in.
pub(crate) trait Real: Float + Element + AddAssign + SubAssign {}

impl Real for f32 {}
impl Real for f64 {}

/// What [`Painn::predict`] computes, on the host in `T`.
pub(crate) fn predict<T: Real, B: Backend>(
    model: &Painn<B>,
    structures: &[Structure],
) -> Result<Predictions, ForceFieldError> {
    let potential = HostPotential::<T>::new(model);
    let config = model.config();
    let results: Vec<Result<Evaluated, ForceFieldError>> = structures
        .par_iter()
        .enumerate()
        .map(|(index, s)| {
            s.validate(index, config.max_z)?;
            let list = neighbor_list(s, config.cutoff)
                .map_err(|reason| ForceFieldError::Structure { index, reason })?;
            Ok(potential.evaluate(s, &list))
        })
        .collect();
    let mut predictions = Predictions {
        energies: Vec::with_capacity(structures.len()),
        forces: Vec::new(),
        stresses: Vec::with_capacity(structures.len()),
    };
    for (s, result) in structures.iter().zip(results) {
        let Evaluated {
            energy,
            forces,
            virial,
        } = result?;
        predictions.energies.push(energy);
        predictions.forces.extend(forces);
        predictions
            .stresses
            .push(s.volume().map(|volume| stress(&virial, volume)));
    }
    Ok(predictions)
}

/// A model's weights read once into host memory in `T`, for repeated evaluations (molecular
/// dynamics calls it every step).
pub(crate) struct HostPotential<T> {
    weights: Weights<T>,
    /// The widest instruction set this CPU has (AVX2 + FMA, AVX-512), for the kernel's loops.
    arch: pulp::Arch,
}

impl<T: Real> HostPotential<T> {
    pub fn new<B: Backend>(model: &Painn<B>) -> Self {
        HostPotential {
            weights: Weights::read(model),
            arch: pulp::Arch::new(),
        }
    }

    /// The energy, forces and virial of `s` (already validated) over the pairs of `list`.
    pub fn evaluate(&self, s: &Structure, list: &NeighborList) -> Evaluated {
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
            r: vectors,
        };
        let (energy, gradients) = self.arch.dispatch(StructureOp {
            weights: &self.weights,
            numbers: &s.numbers,
            pairs: &pairs,
        });
        // ∂E/∂R from ∂E/∂r_ij (r_ij = R_j − R_i + shift), and the virial Σ r ⊗ ∂E/∂r.
        let mut forces = vec![[0.0; 3]; s.len()];
        let mut virial = [[0.0; 3]; 3];
        for (p, g) in gradients.iter().enumerate() {
            let g = g.map(|v| v.elem::<f64>());
            let r = pairs.r[p].map(|v| v.elem::<f64>());
            for a in 0..3 {
                forces[pairs.i[p]][a] += g[a];
                forces[pairs.j[p]][a] -= g[a];
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

/// [`Weights::structure`] as a `pulp` operation: inlined, with everything it calls, into a
/// function compiled for the instruction set `pulp` dispatches to, so its loops use that
/// set's vectors and fused multiply-adds.
struct StructureOp<'a, T> {
    weights: &'a Weights<T>,
    numbers: &'a [u32],
    pairs: &'a Pairs<T>,
}

impl<T: Real> pulp::WithSimd for StructureOp<'_, T> {
    type Output = (T, Vec<[T; 3]>);

    #[inline(always)]
    fn with_simd<S: pulp::Simd>(self, _: S) -> Self::Output {
        self.weights.structure(self.numbers, self.pairs)
    }
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

/// A dense layer `y = x W + b` with `W` `[inputs, outputs]` (burn's layout), and `Wᵀ` for the
/// backward pass.
struct Dense<T> {
    outputs: usize,
    w: Vec<T>,
    wt: Vec<T>,
    b: Option<Vec<T>>,
}

impl<T: Real> Dense<T> {
    fn read<B: Backend>(layer: &Linear<B>) -> Self {
        let [inputs, outputs] = layer.weight.val().dims();
        let w: Vec<T> = values(layer.weight.val());
        let mut wt = vec![T::zero(); w.len()];
        for k in 0..inputs {
            for o in 0..outputs {
                wt[o * inputs + k] = w[k * outputs + o];
            }
        }
        let b = layer.bias.as_ref().map(|b| values(b.val()));
        Dense { outputs, w, wt, b }
    }

    /// `x W + b`, row by row.
    #[inline(always)]
    fn forward(&self, x: &[T]) -> Vec<T> {
        product(x, &self.w, self.outputs, self.b.as_deref())
    }

    /// `g Wᵀ`: the gradient with respect to the input from the gradient `g` of the output.
    #[inline(always)]
    fn backward(&self, g: &[T]) -> Vec<T> {
        product(g, &self.wt, self.w.len() / self.outputs, None)
    }
}

/// `x M (+ bias)` with `M` row-major of `width` columns. Blocks of 4 rows × 16 columns are
/// accumulated in registers over the whole inner dimension (each row of `M` loaded once per 4
/// rows of `x`); the rows and columns left over go row by row, each output row a sum of `M`'s
/// rows scaled by the input row.
#[inline(always)]
fn product<T: Real>(x: &[T], m: &[T], width: usize, bias: Option<&[T]>) -> Vec<T> {
    const ROWS: usize = 4;
    const COLUMNS: usize = 16;
    let inputs = m.len() / width;
    let rows = x.len() / inputs;
    let mut y = match bias {
        Some(bias) => bias.repeat(rows),
        None => vec![T::zero(); rows * width],
    };
    let blocked_rows = rows / ROWS * ROWS;
    let blocked_columns = width / COLUMNS * COLUMNS;
    for r0 in (0..blocked_rows).step_by(ROWS) {
        // The block's input rows, sliced once (no bounds checks in the inner loop).
        let x_rows: [&[T]; ROWS] = std::array::from_fn(|r| &x[(r0 + r) * inputs..][..inputs]);
        for c0 in (0..blocked_columns).step_by(COLUMNS) {
            let mut sums = [[T::zero(); COLUMNS]; ROWS];
            for (r, sum) in sums.iter_mut().enumerate() {
                sum.copy_from_slice(&y[(r0 + r) * width + c0..][..COLUMNS]);
            }
            for k in 0..inputs {
                let m_row: &[T; COLUMNS] = m[k * width + c0..][..COLUMNS]
                    .try_into()
                    .expect("COLUMNS values");
                for (sum, x_row) in sums.iter_mut().zip(&x_rows) {
                    let a = x_row[k];
                    for (s, &b) in sum.iter_mut().zip(m_row) {
                        *s = a.mul_add(b, *s);
                    }
                }
            }
            for (r, sum) in sums.iter().enumerate() {
                y[(r0 + r) * width + c0..][..COLUMNS].copy_from_slice(sum);
            }
        }
    }
    for (r, (x, y)) in x
        .chunks_exact(inputs)
        .zip(y.chunks_exact_mut(width))
        .enumerate()
    {
        let columns = if r < blocked_rows { blocked_columns } else { 0 };
        if columns == width {
            continue;
        }
        for (&a, m) in x.iter().zip(m.chunks_exact(width)) {
            axpy(a, &m[columns..], &mut y[columns..]);
        }
    }
    y
}

/// The three `[f]` parts of a `[3f]` row (q, μ_R, μ_μ: schnetpack's split order), each of
/// length exactly `f` (which lets the loops over them drop bounds checks and vectorise).
#[inline(always)]
fn thirds<T>(row: &[T], f: usize) -> (&[T], &[T], &[T]) {
    (&row[..f], &row[f..2 * f], &row[2 * f..3 * f])
}

/// [`thirds`] of a mutable row.
#[inline(always)]
fn thirds_mut<T>(row: &mut [T], f: usize) -> (&mut [T], &mut [T], &mut [T]) {
    let (first, rest) = row[..3 * f].split_at_mut(f);
    let (second, third) = rest.split_at_mut(f);
    (first, second, third)
}

/// `y += a x`.
#[inline(always)]
fn axpy<T: Real>(a: T, x: &[T], y: &mut [T]) {
    for (y, &x) in y.iter_mut().zip(x) {
        *y = a.mul_add(x, *y);
    }
}

/// `Σ a b`, in eight independent partial sums (which the compiler keeps in one vector register).
#[inline(always)]
fn dot<T: Real>(a: &[T], b: &[T]) -> T {
    let (a8, a_rest) = a.as_chunks::<8>();
    let (b8, b_rest) = b.as_chunks::<8>();
    let mut sums = [T::zero(); 8];
    for (a, b) in a8.iter().zip(b8) {
        for k in 0..8 {
            sums[k] = a[k].mul_add(b[k], sums[k]);
        }
    }
    let rest = a_rest
        .iter()
        .zip(b_rest)
        .fold(T::zero(), |s, (&a, &b)| s + a * b);
    sums.iter().fold(rest, |s, &v| s + v)
}

#[inline(always)]
fn sigmoid<T: Real>(z: T) -> T {
    T::one() / (T::one() + (-z).exp())
}

#[inline(always)]
fn silu<T: Real>(z: &[T]) -> Vec<T> {
    z.iter().map(|&z| z * sigmoid(z)).collect()
}

/// `g ⊙ silu'(z)`, in place on `g`.
#[inline(always)]
fn silu_backward<T: Real>(g: &mut [T], z: &[T]) {
    for (g, &z) in g.iter_mut().zip(z) {
        let s = sigmoid(z);
        *g = *g * s * (T::one() + z * (T::one() - s));
    }
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
    /// `[W; b]` of the filter network, `[n_rbf (+ 1), 3F × sets]`.
    filter: Vec<T>,
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
        let width = 3
            * self.f
            * if self.shared_filters {
                1
            } else {
                self.blocks.len()
            };
        self.filter.len() / width
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
                    psi.push(phi * c);
                    dpsi.push(dphi * c + phi * dc);
                }
            }
            Basis::Bessel { freqs } => {
                for &k in freqs {
                    let phi = (d * k).sin() / d;
                    let dphi = (k * (d * k).cos() - phi) / d;
                    psi.push(phi * c);
                    dpsi.push(dphi * c + phi * dc);
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

    /// Block `t`'s filters of a pair, `[3F]`, from its `psi`.
    #[inline(always)]
    fn pair_filters(&self, t: usize, psi: &[T], out: &mut [T]) {
        let (width, start) = (self.filter.len() / psi.len(), self.filter_start(t));
        out.fill(T::zero());
        for (&a, row) in psi.iter().zip(self.filter.chunks_exact(width)) {
            axpy(a, &row[start..start + out.len()], out);
        }
    }

    /// `psi`'s gradient from block `t`'s filters' gradient `g` `[3F]`, added to `gpsi`.
    #[inline(always)]
    fn pair_filters_backward(&self, t: usize, g: &[T], gpsi: &mut [T]) {
        let (width, start) = (self.filter.len() / gpsi.len(), self.filter_start(t));
        for (gp, row) in gpsi.iter_mut().zip(self.filter.chunks_exact(width)) {
            *gp += dot(g, &row[start..start + g.len()]);
        }
    }

    /// The energy of one structure and its gradient with respect to every pair vector.
    #[inline(always)]
    fn structure(&self, numbers: &[u32], pairs: &Pairs<T>) -> (T, Vec<[T; 3]>) {
        let f = self.f;
        let n = numbers.len();
        let rows = self.filter_rows();
        // Geometry: distance, unit vector, [φ c, c] and its derivative, per pair.
        let mut d = Vec::with_capacity(pairs.r.len());
        let mut u = Vec::with_capacity(pairs.r.len());
        let (mut psi, mut dpsi) = (Vec::new(), Vec::new());
        for r in &pairs.r {
            let length = (r[0] * r[0] + r[1] * r[1] + r[2] * r[2]).sqrt();
            d.push(length);
            u.push(r.map(|v| v / length));
            self.radial(length, &mut psi, &mut dpsi);
        }
        let mut q: Vec<T> = numbers
            .iter()
            .flat_map(|&z| {
                self.embedding[z as usize * f..(z as usize + 1) * f]
                    .iter()
                    .copied()
            })
            .collect();
        // Vector features `[atom][axis][F]`.
        let mut mu = vec![T::zero(); 3 * n * f];
        let mut w = vec![T::zero(); 3 * f];
        let mut saved = Vec::with_capacity(self.blocks.len());
        for (t, block) in self.blocks.iter().enumerate() {
            // Interaction: messages from every neighbour j to its centre i.
            let pre = block.context[0].forward(&q);
            let x = block.context[1].forward(&silu(&pre));
            let mu_in = mu.clone();
            for p in 0..pairs.i.len() {
                let (i, j) = (pairs.i[p], pairs.j[p]);
                self.pair_filters(t, &psi[p * rows..(p + 1) * rows], &mut w);
                let (wq, wr, wm) = thirds(&w, f);
                let (xq, xr, xm) = thirds(&x[3 * f * j..], f);
                for ((q, &w), &x) in q[i * f..(i + 1) * f].iter_mut().zip(wq).zip(xq) {
                    *q += w * x;
                }
                for a in 0..3 {
                    let ua = u[p][a];
                    let from = &mu_in[(3 * j + a) * f..(3 * j + a + 1) * f];
                    let out = &mut mu[(3 * i + a) * f..(3 * i + a + 1) * f];
                    for k in 0..f {
                        out[k] += wr[k] * xr[k] * ua + wm[k] * xm[k] * from[k];
                    }
                }
            }
            // Mixing: each atom's scalars with its vectors' norms and projections.
            let vw = block.channel_mix.forward(&mu);
            let mut norm = vec![T::zero(); n * f];
            let mut dot_vw = vec![T::zero(); n * f];
            for atom in 0..n {
                for a in 0..3 {
                    let row = &vw[(3 * atom + a) * 2 * f..(3 * atom + a + 1) * 2 * f];
                    for k in 0..f {
                        norm[atom * f + k] += row[k] * row[k];
                        dot_vw[atom * f + k] += row[k] * row[f + k];
                    }
                }
            }
            let eps = T::from(EPSILON).unwrap();
            norm.iter_mut().for_each(|v| *v = (*v + eps).sqrt());
            let context: Vec<T> = (0..n)
                .flat_map(|atom| {
                    q[atom * f..(atom + 1) * f]
                        .iter()
                        .chain(&norm[atom * f..(atom + 1) * f])
                        .copied()
                })
                .collect();
            let pre_mix = block.mixing[0].forward(&context);
            let y = block.mixing[1].forward(&silu(&pre_mix));
            for atom in 0..n {
                let y = &y[3 * f * atom..3 * f * (atom + 1)];
                for k in 0..f {
                    q[atom * f + k] += y[k] + y[2 * f + k] * dot_vw[atom * f + k];
                }
                for a in 0..3 {
                    let row = (3 * atom + a) * 2 * f;
                    for k in 0..f {
                        mu[(3 * atom + a) * f + k] += y[f + k] * vw[row + f + k];
                    }
                }
            }
            saved.push(Saved {
                pre,
                x,
                mu_in,
                vw,
                norm,
                dot_vw,
                pre_mix,
                y,
            });
        }
        // Readout: an MLP per atom, SiLU between layers.
        let mut h = q;
        let mut pre_readout = Vec::new();
        for (l, layer) in self.readout.iter().enumerate() {
            let z = layer.forward(&h);
            if l + 1 < self.readout.len() {
                h = silu(&z);
                pre_readout.push(z);
            } else {
                h = z;
            }
        }
        let energy = h.iter().copied().fold(T::zero(), |s, e| s + e)
            + numbers
                .iter()
                .fold(T::zero(), |s, &z| s + self.atomref[z as usize])
            + self.mean_per_atom * T::from(n).unwrap();

        // Backward: ∂E/∂q, ∂E/∂μ through the blocks in reverse, ∂E/∂[φc, c] and ∂E/∂û per pair.
        let mut g = vec![T::one(); n];
        for (l, layer) in self.readout.iter().enumerate().rev() {
            g = layer.backward(&g);
            if l > 0 {
                silu_backward(&mut g, &pre_readout[l - 1]);
            }
        }
        let mut gq = g;
        let mut gmu = vec![T::zero(); 3 * n * f];
        let mut gpsi = vec![T::zero(); psi.len()];
        let mut gu = vec![[T::zero(); 3]; pairs.i.len()];
        let mut gw = vec![T::zero(); 3 * f];
        for (t, (block, s)) in self.blocks.iter().zip(&saved).enumerate().rev() {
            // Mixing.
            let mut gy = vec![T::zero(); 3 * n * f];
            let mut gdot = vec![T::zero(); n * f];
            for atom in 0..n {
                let y = &s.y[3 * f * atom..3 * f * (atom + 1)];
                let gy = &mut gy[3 * f * atom..3 * f * (atom + 1)];
                for k in 0..f {
                    let g = gq[atom * f + k];
                    gy[k] = g;
                    gy[2 * f + k] = g * s.dot_vw[atom * f + k];
                    gdot[atom * f + k] = g * y[2 * f + k];
                }
                for a in 0..3 {
                    let row = (3 * atom + a) * 2 * f;
                    for k in 0..f {
                        gy[f + k] += gmu[(3 * atom + a) * f + k] * s.vw[row + f + k];
                    }
                }
            }
            let mut gh = block.mixing[1].backward(&gy);
            silu_backward(&mut gh, &s.pre_mix);
            let gcontext = block.mixing[0].backward(&gh);
            let mut gvw = vec![T::zero(); 6 * n * f];
            for atom in 0..n {
                let y = &s.y[3 * f * atom..3 * f * (atom + 1)];
                for k in 0..f {
                    gq[atom * f + k] += gcontext[2 * f * atom + k];
                }
                for a in 0..3 {
                    let row = (3 * atom + a) * 2 * f;
                    for k in 0..f {
                        let gdot = gdot[atom * f + k];
                        let gnorm = gcontext[2 * f * atom + f + k];
                        let (v, wv) = (s.vw[row + k], s.vw[row + f + k]);
                        gvw[row + k] = gdot * wv + gnorm * v / s.norm[atom * f + k];
                        gvw[row + f + k] = gmu[(3 * atom + a) * f + k] * y[f + k] + gdot * v;
                    }
                }
            }
            let gmu_mix = block.channel_mix.backward(&gvw);
            gmu.iter_mut().zip(&gmu_mix).for_each(|(g, &m)| *g += m);
            // Interaction.
            let mut gx = vec![T::zero(); 3 * n * f];
            let mut gmu_in = gmu.clone();
            let (mut along, mut with_mu, mut radial) =
                (vec![T::zero(); f], vec![T::zero(); f], vec![T::zero(); f]);
            for p in 0..pairs.i.len() {
                let (i, j) = (pairs.i[p], pairs.j[p]);
                self.pair_filters(t, &psi[p * rows..(p + 1) * rows], &mut w);
                let (wq, wr, wm) = thirds(&w, f);
                let (xq, xr, xm) = thirds(&s.x[3 * f * j..], f);
                let (gxq, gxr, gxm) = thirds_mut(&mut gx[3 * f * j..], f);
                let (gwq, gwr, gwm) = thirds_mut(&mut gw, f);
                let gqi = &gq[i * f..(i + 1) * f];
                let (radial, along, with_mu) =
                    (&mut radial[..f], &mut along[..f], &mut with_mu[..f]);
                for k in 0..f {
                    gwq[k] = gqi[k] * xq[k];
                    gxq[k] += gqi[k] * wq[k];
                    radial[k] = wr[k] * xr[k];
                }
                // Σ over axes of ∂E/∂μ_i times û (for μ_R) and times μ_j (for μ_μ).
                along.fill(T::zero());
                with_mu.fill(T::zero());
                for a in 0..3 {
                    let ua = u[p][a];
                    let gm = &gmu[(3 * i + a) * f..(3 * i + a + 1) * f];
                    let mu_j = &s.mu_in[(3 * j + a) * f..(3 * j + a + 1) * f];
                    let gmu_j = &mut gmu_in[(3 * j + a) * f..(3 * j + a + 1) * f];
                    for k in 0..f {
                        along[k] += gm[k] * ua;
                        with_mu[k] += gm[k] * mu_j[k];
                        gmu_j[k] += gm[k] * wm[k] * xm[k];
                    }
                    gu[p][a] += dot(gm, radial);
                }
                for k in 0..f {
                    gwr[k] = along[k] * xr[k];
                    gxr[k] += along[k] * wr[k];
                    gwm[k] = with_mu[k] * xm[k];
                    gxm[k] += with_mu[k] * wm[k];
                }
                self.pair_filters_backward(t, &gw, &mut gpsi[p * rows..(p + 1) * rows]);
            }
            let mut gh = block.context[1].backward(&gx);
            silu_backward(&mut gh, &s.pre);
            let gq_context = block.context[0].backward(&gh);
            gq.iter_mut().zip(&gq_context).for_each(|(g, &c)| *g += c);
            gmu = gmu_in;
        }
        // ∂E/∂r = ∂E/∂d û + (∂E/∂û − (∂E/∂û · û) û) / d.
        let gradients = (0..pairs.i.len())
            .map(|p| {
                let gd = dot(
                    &gpsi[p * rows..(p + 1) * rows],
                    &dpsi[p * rows..(p + 1) * rows],
                );
                let along = gu[p][0] * u[p][0] + gu[p][1] * u[p][1] + gu[p][2] * u[p][2];
                std::array::from_fn(|a| gd * u[p][a] + (gu[p][a] - along * u[p][a]) / d[p])
            })
            .collect();
        (energy, gradients)
    }
}

/// What the backward pass needs of a block's forward pass.
struct Saved<T> {
    /// Context network's hidden pre-activation `[n, F]` and output `[n, 3F]`.
    pre: Vec<T>,
    x: Vec<T>,
    /// Vector features entering the block `[n, 3, F]`.
    mu_in: Vec<T>,
    /// Channel mix `[n, 3, 2F]` (μ_V, μ_W), ‖μ_V‖ and μ_V · μ_W `[n, F]`.
    vw: Vec<T>,
    norm: Vec<T>,
    dot_vw: Vec<T>,
    /// Mixing network's hidden pre-activation `[n, F]` and output `[n, 3F]`.
    pre_mix: Vec<T>,
    y: Vec<T>,
}
