//! One structure's energy and its gradient with respect to every pair vector, forward and
//! backward by hand, its atoms in parts that threads run side by side.
//!
//! A part is a contiguous range of atoms and the pairs centred on them. A block's interaction
//! sends each pair's message to its centre, so a part writes only its own atoms' features; it
//! reads its neighbours' context output `x` and vector features, which every part publishes at
//! the start of the block and then waits for the others' (the one wait per block in the forward
//! pass). Going backward the pairs send gradients to their neighbours: each part publishes what
//! its pairs sent, waits, and sums what all parts sent its atoms, in part order (the one wait per
//! block). How a structure is split depends on its atom count and the machine's cores
//! ([`parts_for`]); splits differ only in the order of the sums of what parts send each other,
//! so their results agree to rounding (`host::tests::parts_give_the_whole_structures_result`).
//!
//! The first part runs on the calling thread, the others on the potential's [`Team`]; they wait
//! for each other by spinning: a block's work is a tenth of a millisecond for a small molecule,
//! and a thread put to sleep (rayon's idle workers, `std::sync::Barrier`) takes about that long
//! to wake, which made two parts no faster than one.

use std::collections::HashMap;
use std::ops::Range;
use std::sync::{Arc, OnceLock, mpsc};

use super::rows::{
    add, dot, mul_add, product_of, quotient_of, scaled_add, silu, silu_backward, thirds, thirds_mut,
};
use super::team::{SpinBarrier, Team};
use super::{Pairs, Real, Weights};
use crate::painn::EPSILON;

/// How many parts a structure of `atoms` atoms is split into when it is evaluated alone: one per
/// six atoms (the rows of the products' register tile), at most four and at most one per core
/// (parts spin while they wait for each other: on 2 cores, 4 parts of a 32-atom molecule ran at
/// 143 steps/s, 2 parts at 180).
pub(crate) fn parts_for(atoms: usize) -> usize {
    static CORES: OnceLock<usize> = OnceLock::new();
    let cores = *CORES.get_or_init(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    (atoms / 6).clamp(1, 4).min(cores)
}

/// A contiguous range of a structure's atoms and the pairs centred on them, with what the passes
/// keep of them.
struct Part<T> {
    atoms: Range<usize>,
    pairs: Range<usize>,
    /// Per pair: distance, unit vector, its row of the filters ([`filter_rows`]) and whether
    /// it is that row's first pair (which the row's gradient with respect to `d` goes to).
    d: Vec<T>,
    u: Vec<[T; 3]>,
    rows: Vec<usize>,
    owns: Vec<bool>,
    /// Per filter row: `[φ c, c]` and its derivative with respect to `d`.
    psi: Vec<T>,
    dpsi: Vec<T>,
    /// Every block's filters of the part's distinct pairs `[rows, 3F × sets]`, and their
    /// gradient.
    filters: Vec<T>,
    gfilters: Vec<T>,
    /// Scalar and vector features of the part's atoms, `[atoms, F]` and `[atoms, 3, F]`.
    q: Vec<T>,
    mu: Vec<T>,
    /// The newest context network output `[atoms, 3F]`, published to the other parts.
    x: Vec<T>,
    saved: Vec<Saved<T>>,
    /// The readout's hidden pre-activations.
    pre_readout: Vec<Vec<T>>,
    energy: T,
    /// ∂E/∂q, ∂E/∂μ of the part's atoms.
    gq: Vec<T>,
    gmu: Vec<T>,
    /// ∂E/∂x of the part's atoms, as the parts sent it.
    gx: Vec<T>,
    /// ∂E/∂û of the part's pairs.
    gu: Vec<[T; 3]>,
    /// What the part's pairs send to every atom of the structure: ∂E/∂x `[n, 3F]` and ∂E/∂μ
    /// entering the block `[n, 3, F]`.
    gx_sent: Vec<T>,
    gmu_sent: Vec<T>,
    /// ∂E/∂r of the part's pairs, the pass's result.
    gradients: Vec<[T; 3]>,
}

/// A part's energy and the gradient with respect to each of its pairs' vectors.
type Outcome<T> = (T, Vec<[T; 3]>);

/// What the backward pass needs of a block's forward pass over a part's atoms.
#[derive(Default)]
struct Saved<T> {
    /// Context network's hidden pre-activation `[atoms, F]`.
    pre: Vec<T>,
    /// Channel mix `[atoms, 3, 2F]` (μ_V, μ_W), ‖μ_V‖ and μ_V · μ_W `[atoms, F]`.
    vw: Vec<T>,
    norm: Vec<T>,
    dot_vw: Vec<T>,
    /// Mixing network's hidden pre-activation `[atoms, F]` and output `[atoms, 3F]`.
    pre_mix: Vec<T>,
    y: Vec<T>,
}

/// A block's published context output `x` `[n, 3F]` and vector features entering it `[n, 3, F]`.
struct Published<T> {
    x: Vec<T>,
    mu: Vec<T>,
}

impl<T: Real> Weights<T> {
    /// The energy of one structure and its gradient with respect to every pair vector, its atoms
    /// in `parts` parts (one when the pairs are not ordered by centre): the first on this thread,
    /// the others on `team`.
    pub(super) fn structure(
        self: &Arc<Self>,
        arch: pulp::Arch,
        numbers: &[u32],
        pairs: Pairs<T>,
        parts: usize,
        team: &Team,
    ) -> Outcome<T> {
        let mut parts = self.split(numbers.len(), &pairs, parts);
        let first = parts.remove(0);
        if parts.is_empty() {
            let exchange = Exchange::new(self.blocks.len(), 1);
            return self.run(arch, numbers, &pairs, &exchange, 0, first);
        }
        let shared = Arc::new(Shared {
            weights: Arc::clone(self),
            numbers: numbers.to_vec(),
            exchange: Exchange::new(self.blocks.len(), parts.len() + 1),
            pairs,
        });
        let (sender, results) = mpsc::channel();
        let helpers = parts.len();
        for (k, part) in (1..).zip(parts) {
            let (shared, sender) = (Arc::clone(&shared), sender.clone());
            team.run(
                k - 1,
                Box::new(move || {
                    let result = shared.weights.run(
                        arch,
                        &shared.numbers,
                        &shared.pairs,
                        &shared.exchange,
                        k,
                        part,
                    );
                    // The caller waits for every part (or panics when one did).
                    let _ = sender.send((k, result));
                }),
            );
        }
        drop(sender);
        let Shared {
            numbers,
            pairs,
            exchange,
            ..
        } = &*shared;
        let (mut energy, mut gradients) = self.run(arch, numbers, pairs, exchange, 0, first);
        let mut others: Vec<(usize, Outcome<T>)> = results.iter().take(helpers).collect();
        assert_eq!(others.len(), helpers, "a part of the structure panicked");
        others.sort_by_key(|(k, _)| *k);
        for (_, (part_energy, part_gradients)) in others {
            energy += part_energy;
            gradients.extend(part_gradients);
        }
        (energy, gradients)
    }

    /// [`Weights::part`] compiled for the CPU's widest instruction set, breaking the exchange's
    /// barrier if it panics.
    fn run(
        &self,
        arch: pulp::Arch,
        numbers: &[u32],
        pairs: &Pairs<T>,
        exchange: &Exchange<T>,
        k: usize,
        part: Part<T>,
    ) -> Outcome<T> {
        let _guard = exchange.barrier.guard();
        arch.dispatch(Worker {
            weights: self,
            numbers,
            pairs,
            exchange,
            k,
            part,
        })
    }

    /// Part `k`'s share of [`Weights::structure`]: its energy and its pairs' gradients.
    #[inline(always)]
    fn part(
        &self,
        numbers: &[u32],
        pairs: &Pairs<T>,
        exchange: &Exchange<T>,
        k: usize,
        mut part: Part<T>,
    ) -> Outcome<T> {
        let blocks = self.blocks.len();
        self.start(&mut part, numbers, pairs);
        self.context(0, &mut part);
        let mut published = Vec::with_capacity(blocks);
        for t in 0..blocks {
            let block = exchange.forward(
                t,
                k,
                Published {
                    x: std::mem::take(&mut part.x),
                    mu: part.mu.clone(),
                },
            );
            self.interaction(t, &mut part, pairs, &block);
            self.mixing(t, &mut part);
            if t + 1 < blocks {
                self.context(t + 1, &mut part);
            } else {
                self.readout(&mut part, numbers);
            }
            published.push(block);
        }
        self.readout_backward(&mut part);
        self.mixing_backward(blocks - 1, &mut part);
        self.interaction_backward(blocks - 1, &mut part, pairs, &published[blocks - 1]);
        for t in (0..blocks).rev() {
            exchange.backward(t, k, &mut part, 3 * self.f);
            self.context_backward(t, &mut part);
            if t > 0 {
                self.mixing_backward(t - 1, &mut part);
                self.interaction_backward(t - 1, &mut part, pairs, &published[t - 1]);
            }
        }
        self.pair_gradients(&mut part);
        (part.energy, part.gradients)
    }

    /// `n` atoms in `parts` contiguous ranges of about equal size, each with the pairs centred on
    /// its atoms.
    fn split(&self, n: usize, pairs: &Pairs<T>, parts: usize) -> Vec<Part<T>> {
        let by_centre = pairs.i.is_sorted();
        let parts = if by_centre {
            parts.clamp(1, n.max(1))
        } else {
            1
        };
        let first_pair = |atom: usize| {
            if atom == n {
                pairs.i.len()
            } else {
                pairs.i.partition_point(|&i| i < atom)
            }
        };
        (0..parts)
            .map(|k| {
                let atoms = k * n / parts..(k + 1) * n / parts;
                let pairs = if parts == 1 {
                    0..pairs.i.len()
                } else {
                    first_pair(atoms.start)..first_pair(atoms.end)
                };
                Part {
                    atoms,
                    pairs,
                    d: Vec::new(),
                    u: Vec::new(),
                    rows: Vec::new(),
                    owns: Vec::new(),
                    psi: Vec::new(),
                    dpsi: Vec::new(),
                    filters: Vec::new(),
                    gfilters: Vec::new(),
                    q: Vec::new(),
                    mu: Vec::new(),
                    x: Vec::new(),
                    saved: Vec::with_capacity(self.blocks.len()),
                    pre_readout: Vec::new(),
                    energy: T::zero(),
                    gq: Vec::new(),
                    gmu: Vec::new(),
                    gx: Vec::new(),
                    gu: Vec::new(),
                    gx_sent: Vec::new(),
                    gmu_sent: Vec::new(),
                    gradients: Vec::new(),
                }
            })
            .collect()
    }

    /// The part's pair geometry and filters, and its atoms' embeddings.
    #[inline(always)]
    fn start(&self, part: &mut Part<T>, numbers: &[u32], pairs: &Pairs<T>) {
        let f = self.f;
        (part.rows, part.owns) = filter_rows(pairs, part.pairs.clone()).into_iter().unzip();
        for (r, &owns) in pairs.r[part.pairs.clone()].iter().zip(&part.owns) {
            let length = (r[0] * r[0] + r[1] * r[1] + r[2] * r[2]).sqrt();
            part.d.push(length);
            part.u.push(r.map(|v| v / length));
            if owns {
                self.radial(length, &mut part.psi, &mut part.dpsi);
            }
        }
        part.filters = self.filter.forward(&part.psi);
        part.q = Vec::with_capacity(part.atoms.len() * f);
        for &z in &numbers[part.atoms.clone()] {
            part.q
                .extend_from_slice(&self.embedding[z as usize * f..][..f]);
        }
        part.mu = vec![T::zero(); 3 * part.atoms.len() * f];
    }

    /// Block `t`'s context network on the part's scalar features.
    #[inline(always)]
    fn context(&self, t: usize, part: &mut Part<T>) {
        let context = &self.blocks[t].context;
        let pre = context[0].forward(&part.q);
        part.x = context[1].forward(&silu(&pre));
        part.saved.push(Saved {
            pre,
            ..Saved::default()
        });
    }

    /// Block `t`'s interaction: messages from every neighbour to the part's atoms.
    #[inline(always)]
    fn interaction(&self, t: usize, part: &mut Part<T>, pairs: &Pairs<T>, block: &Published<T>) {
        let (f, width, start) = (self.f, self.filter.outputs, self.filter_start(t));
        // Per pair: w_r ⊙ x_r and w_m ⊙ x_m.
        let mut message = vec![T::zero(); 2 * f];
        for (local, p) in part.pairs.clone().enumerate() {
            let (i, j) = (pairs.i[p] - part.atoms.start, pairs.j[p]);
            let (wq, wr, wm) = thirds(&part.filters[part.rows[local] * width + start..], f);
            let (xq, xr, xm) = thirds(&block.x[3 * f * j..], f);
            mul_add(&mut part.q[i * f..][..f], wq, xq);
            let (radial, along) = message.split_at_mut(f);
            product_of(radial, wr, xr);
            product_of(along, wm, xm);
            for a in 0..3 {
                let out = &mut part.mu[(3 * i + a) * f..][..f];
                scaled_add(out, radial, part.u[local][a]);
                mul_add(out, along, &block.mu[(3 * j + a) * f..][..f]);
            }
        }
    }

    /// Block `t`'s mixing: each atom's scalars with its vectors' norms and projections.
    #[inline(always)]
    fn mixing(&self, t: usize, part: &mut Part<T>) {
        let (f, n) = (self.f, part.atoms.len());
        let block = &self.blocks[t];
        let vw = block.channel_mix.forward(&part.mu);
        let mut norm = vec![T::zero(); n * f];
        let mut dot_vw = vec![T::zero(); n * f];
        for ((norm, dot_vw), rows) in norm
            .chunks_exact_mut(f)
            .zip(dot_vw.chunks_exact_mut(f))
            .zip(vw.chunks_exact(6 * f))
        {
            for (v, w) in rows.chunks_exact(2 * f).map(|row| row.split_at(f)) {
                mul_add(norm, v, v);
                mul_add(dot_vw, v, w);
            }
        }
        let eps = T::from(EPSILON).unwrap();
        norm.iter_mut().for_each(|v| *v = (*v + eps).sqrt());
        let mut context = Vec::with_capacity(2 * n * f);
        for (q, norm) in part.q.chunks_exact(f).zip(norm.chunks_exact(f)) {
            context.extend_from_slice(q);
            context.extend_from_slice(norm);
        }
        let pre_mix = block.mixing[0].forward(&context);
        let y = block.mixing[1].forward(&silu(&pre_mix));
        for (atom, y) in y.chunks_exact(3 * f).enumerate() {
            let (yq, yv, ys) = thirds(y, f);
            let q = &mut part.q[atom * f..][..f];
            add(q, yq);
            mul_add(q, ys, &dot_vw[atom * f..][..f]);
            let mu = part.mu[3 * atom * f..][..3 * f].chunks_exact_mut(f);
            for (mu, row) in mu.zip(vw[6 * atom * f..][..6 * f].chunks_exact(2 * f)) {
                mul_add(mu, yv, &row[f..]);
            }
        }
        let saved = &mut part.saved[t];
        (saved.vw, saved.norm, saved.dot_vw) = (vw, norm, dot_vw);
        (saved.pre_mix, saved.y) = (pre_mix, y);
    }

    /// The readout, an MLP per atom with SiLU between layers, and the part's energy.
    #[inline(always)]
    fn readout(&self, part: &mut Part<T>, numbers: &[u32]) {
        let mut h = std::mem::take(&mut part.q);
        for (l, layer) in self.readout.iter().enumerate() {
            let z = layer.forward(&h);
            if l + 1 < self.readout.len() {
                h = silu(&z);
                part.pre_readout.push(z);
            } else {
                h = z;
            }
        }
        part.energy = h.iter().fold(T::zero(), |s, &e| s + e)
            + numbers[part.atoms.clone()]
                .iter()
                .fold(T::zero(), |s, &z| s + self.atomref[z as usize])
            + self.mean_per_atom * T::from(part.atoms.len()).unwrap();
    }

    /// ∂E/∂q of the part's atoms through the readout; ∂E/∂μ starts at zero, and so do the
    /// pairs' gradients.
    #[inline(always)]
    fn readout_backward(&self, part: &mut Part<T>) {
        let mut g = vec![T::one(); part.atoms.len()];
        for (l, layer) in self.readout.iter().enumerate().rev() {
            g = layer.backward(&g);
            if l > 0 {
                silu_backward(&mut g, &part.pre_readout[l - 1]);
            }
        }
        part.gq = g;
        part.gmu = vec![T::zero(); part.mu.len()];
        part.gfilters = vec![T::zero(); part.filters.len()];
        part.gu = vec![[T::zero(); 3]; part.pairs.len()];
    }

    /// ∂E/∂q and ∂E/∂μ before block `t`'s mixing, from those after it.
    #[inline(always)]
    fn mixing_backward(&self, t: usize, part: &mut Part<T>) {
        let (f, n) = (self.f, part.atoms.len());
        let (block, s) = (&self.blocks[t], &part.saved[t]);
        let (gq, gmu) = (&mut part.gq, &mut part.gmu);
        let mut gy = vec![T::zero(); 3 * n * f];
        let mut gdot = vec![T::zero(); n * f];
        for (atom, gy) in gy.chunks_exact_mut(3 * f).enumerate() {
            let (g, dot_vw) = (&gq[atom * f..][..f], &s.dot_vw[atom * f..][..f]);
            let (gyq, gyv, gys) = thirds_mut(gy, f);
            gyq.copy_from_slice(g);
            product_of(gys, g, dot_vw);
            product_of(
                &mut gdot[atom * f..][..f],
                g,
                &s.y[3 * f * atom + 2 * f..][..f],
            );
            let gmu = gmu[3 * atom * f..][..3 * f].chunks_exact(f);
            for (gmu, row) in gmu.zip(s.vw[6 * atom * f..][..6 * f].chunks_exact(2 * f)) {
                mul_add(gyv, gmu, &row[f..]);
            }
        }
        let mut gh = block.mixing[1].backward(&gy);
        silu_backward(&mut gh, &s.pre_mix);
        let gcontext = block.mixing[0].backward(&gh);
        let mut gvw = vec![T::zero(); 6 * n * f];
        let mut gnorm_over_norm = vec![T::zero(); f];
        for (atom, gvw) in gvw.chunks_exact_mut(6 * f).enumerate() {
            let (gq_context, gnorm) = gcontext[2 * f * atom..][..2 * f].split_at(f);
            add(&mut gq[atom * f..][..f], gq_context);
            quotient_of(&mut gnorm_over_norm, gnorm, &s.norm[atom * f..][..f]);
            let (yv, gdot) = (&s.y[3 * f * atom + f..][..f], &gdot[atom * f..][..f]);
            let rows = s.vw[6 * atom * f..][..6 * f].chunks_exact(2 * f);
            let gmu = gmu[3 * atom * f..][..3 * f].chunks_exact(f);
            for ((grow, row), gmu) in gvw.chunks_exact_mut(2 * f).zip(rows).zip(gmu) {
                let ((gv, gw), (v, w)) = (grow.split_at_mut(f), row.split_at(f));
                // ∂/∂μ_V: through μ_V · μ_W and ‖μ_V‖; ∂/∂μ_W: through μ_V · μ_W and a_vv μ_W.
                product_of(gv, gdot, w);
                mul_add(gv, &gnorm_over_norm, v);
                product_of(gw, gmu, yv);
                mul_add(gw, gdot, v);
            }
        }
        let gmu_mix = block.channel_mix.backward(&gvw);
        gmu.iter_mut().zip(&gmu_mix).for_each(|(g, &m)| *g += m);
    }

    /// Block `t`'s interaction backward over the part's pairs: their filters' and unit vectors'
    /// gradients, and what they send to their neighbours' `x` and `μ`.
    #[inline(always)]
    fn interaction_backward(
        &self,
        t: usize,
        part: &mut Part<T>,
        pairs: &Pairs<T>,
        block: &Published<T>,
    ) {
        let (f, width, start) = (self.f, self.filter.outputs, self.filter_start(t));
        part.gx_sent = vec![T::zero(); block.x.len()];
        part.gmu_sent = vec![T::zero(); block.mu.len()];
        // Per pair: w_r ⊙ x_r, w_m ⊙ x_m, and Σ over axes of ∂E/∂μ_i times û (for μ_R) and
        // times μ_j (for μ_μ).
        let mut sums = vec![T::zero(); 4 * f];
        for (local, p) in part.pairs.clone().enumerate() {
            let (i, j) = (pairs.i[p] - part.atoms.start, pairs.j[p]);
            let row = part.rows[local] * width + start;
            let (wq, wr, wm) = thirds(&part.filters[row..], f);
            let (xq, xr, xm) = thirds(&block.x[3 * f * j..], f);
            let (gxq, gxr, gxm) = thirds_mut(&mut part.gx_sent[3 * f * j..], f);
            let (gwq, gwr, gwm) = thirds_mut(&mut part.gfilters[row..], f);
            let gqi = &part.gq[i * f..][..f];
            mul_add(gwq, gqi, xq);
            mul_add(gxq, gqi, wq);
            let (products, axes) = sums.split_at_mut(2 * f);
            let (radial, along_m) = products.split_at_mut(f);
            let (along, with_mu) = axes.split_at_mut(f);
            product_of(radial, wr, xr);
            product_of(along_m, wm, xm);
            along.fill(T::zero());
            with_mu.fill(T::zero());
            for a in 0..3 {
                let gm = &part.gmu[(3 * i + a) * f..][..f];
                scaled_add(along, gm, part.u[local][a]);
                mul_add(with_mu, gm, &block.mu[(3 * j + a) * f..][..f]);
                mul_add(&mut part.gmu_sent[(3 * j + a) * f..][..f], gm, along_m);
                part.gu[local][a] += dot(gm, radial);
            }
            mul_add(gwr, along, xr);
            mul_add(gxr, along, wr);
            mul_add(gwm, with_mu, xm);
            mul_add(gxm, with_mu, wm);
        }
    }

    /// ∂E/∂q before block `t`'s context network, from ∂E/∂x the parts sent.
    #[inline(always)]
    fn context_backward(&self, t: usize, part: &mut Part<T>) {
        let context = &self.blocks[t].context;
        let mut gh = context[1].backward(&part.gx);
        silu_backward(&mut gh, &part.saved[t].pre);
        let gq = context[0].backward(&gh);
        part.gq.iter_mut().zip(&gq).for_each(|(g, &c)| *g += c);
    }

    /// ∂E/∂r of the part's pairs: ∂E/∂d û + (∂E/∂û − (∂E/∂û · û) û) / d, where ∂E/∂d of a
    /// filter row shared by a pair and its reverse goes to the first of them whole: `d` is one
    /// function of the two atoms' positions, so their forces and the virial are the same as with
    /// the halves.
    #[inline(always)]
    fn pair_gradients(&self, part: &mut Part<T>) {
        let width = self.filter_rows();
        let gpsi = self.filter.backward(&part.gfilters);
        part.gradients = (0..part.pairs.len())
            .map(|p| {
                let row = part.rows[p] * width..(part.rows[p] + 1) * width;
                let gd = if part.owns[p] {
                    dot(&gpsi[row.clone()], &part.dpsi[row])
                } else {
                    T::zero()
                };
                let (u, gu) = (part.u[p], part.gu[p]);
                let along = gu[0] * u[0] + gu[1] * u[1] + gu[2] * u[2];
                std::array::from_fn(|a| gd * u[a] + (gu[a] - along * u[a]) / part.d[p])
            })
            .collect();
    }
}

/// The filter row of each pair of `range`, numbered in order of first use, and whether the pair
/// is the row's first: a pair and its reverse (centre and neighbour swapped, the vector negated
/// bit for bit, so the same distance and the same filters) share the row of the first of the
/// two, which halves the filter products of a structure evaluated as one part.
fn filter_rows<T: Real>(pairs: &Pairs<T>, range: Range<usize>) -> Vec<(usize, bool)> {
    // `+ 0` makes −0 into 0: a component is 0 in both directions or in neither.
    let key = |i: usize, j: usize, r: [T; 3]| {
        (
            i,
            j,
            r.map(|v| {
                num_traits::ToPrimitive::to_f64(&(v + T::zero()))
                    .unwrap_or(f64::NAN)
                    .to_bits()
            }),
        )
    };
    let mut seen = HashMap::with_capacity(range.len());
    let (mut rows, mut count) = (Vec::with_capacity(range.len()), 0);
    for p in range {
        let (i, j, r) = (pairs.i[p], pairs.j[p], pairs.r[p]);
        let (row, first) = match seen.get(&key(j, i, r.map(|v| -v))) {
            Some(&row) => (row, false),
            None => {
                count += 1;
                (count - 1, true)
            }
        };
        seen.insert(key(i, j, r), row);
        rows.push((row, first));
    }
    rows
}

/// [`Weights::part`] as a `pulp` operation: inlined, with everything it calls, into a function
/// compiled for the instruction set `pulp` dispatches to, so its loops use that set's vectors
/// and fused multiply-adds.
struct Worker<'a, T> {
    weights: &'a Weights<T>,
    numbers: &'a [u32],
    pairs: &'a Pairs<T>,
    exchange: &'a Exchange<T>,
    k: usize,
    part: Part<T>,
}

impl<T: Real> pulp::WithSimd for Worker<'_, T> {
    type Output = Outcome<T>;

    #[inline(always)]
    fn with_simd<S: pulp::Simd>(self, _: S) -> Self::Output {
        let Worker {
            weights,
            numbers,
            pairs,
            exchange,
            k,
            part,
        } = self;
        weights.part(numbers, pairs, exchange, k, part)
    }
}

/// What every part of one evaluation reads, shared with the team's threads.
struct Shared<T> {
    weights: Arc<Weights<T>>,
    numbers: Vec<u32>,
    pairs: Pairs<T>,
    exchange: Exchange<T>,
}

/// What the parts of a structure hand each other: per block and part, what it published going
/// forward (its `x` and `μ`) and backward (what its pairs sent every atom's `x` and `μ`), each set
/// once and read by every part after the barrier.
struct Exchange<T> {
    barrier: SpinBarrier,
    forward: Vec<Vec<OnceLock<Published<T>>>>,
    backward: Vec<Vec<OnceLock<Published<T>>>>,
}

impl<T: Real> Exchange<T> {
    fn new(blocks: usize, parts: usize) -> Self {
        let slots = || {
            (0..blocks)
                .map(|_| (0..parts).map(|_| OnceLock::new()).collect())
                .collect()
        };
        Exchange {
            barrier: SpinBarrier::new(parts),
            forward: slots(),
            backward: slots(),
        }
    }

    /// Block `t`'s `x` and `μ` of every atom, once every part has published its own.
    fn forward(&self, t: usize, k: usize, own: Published<T>) -> Published<T> {
        let slots = &self.forward[t];
        if slots.len() == 1 {
            return own;
        }
        set(&slots[k], own);
        self.barrier.wait();
        let all = || slots.iter().map(|slot| slot.get().expect("published"));
        Published {
            x: all().flat_map(|p| p.x.iter().copied()).collect(),
            mu: all().flat_map(|p| p.mu.iter().copied()).collect(),
        }
    }

    /// Part `k`'s ∂E/∂x and its addition to ∂E/∂μ from what every part's pairs sent its atoms in
    /// block `t` (rows of `width`), summed in part order.
    fn backward(&self, t: usize, k: usize, part: &mut Part<T>, width: usize) {
        let sent = Published {
            x: std::mem::take(&mut part.gx_sent),
            mu: std::mem::take(&mut part.gmu_sent),
        };
        let rows = part.atoms.start * width..part.atoms.end * width;
        let slots = &self.backward[t];
        if slots.len() == 1 {
            part.gx = sent.x;
            part.gmu
                .iter_mut()
                .zip(&sent.mu)
                .for_each(|(g, &s)| *g += s);
            return;
        }
        set(&slots[k], sent);
        self.barrier.wait();
        part.gx = vec![T::zero(); rows.len()];
        for sent in slots.iter().map(|slot| slot.get().expect("published")) {
            part.gx
                .iter_mut()
                .zip(&sent.x[rows.clone()])
                .for_each(|(g, &s)| *g += s);
            part.gmu
                .iter_mut()
                .zip(&sent.mu[rows.clone()])
                .for_each(|(g, &s)| *g += s);
        }
    }
}

/// Sets a slot that nothing else sets.
fn set<T>(slot: &OnceLock<T>, value: T) {
    if slot.set(value).is_err() {
        unreachable!("each part publishes into its own slot once");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A pair and its reverse share a row whichever comes first, a zero component matches
    /// whatever its sign, and a pair whose reverse is elsewhere (another part) or is a different
    /// image gets a row of its own.
    #[test]
    fn a_pair_and_its_reverse_share_one_filter_row() {
        let pairs = Pairs::<f32> {
            i: vec![0, 0, 1, 2, 1, 2, 0],
            j: vec![1, 2, 0, 0, 2, 1, 0],
            r: vec![
                [1.0, -0.5, 2.0],
                [0.0, 1.5, -2.0],
                [-1.0, 0.5, -2.0],
                [0.0, -1.5, 2.0],
                [0.25, 0.0, 0.0],
                [-0.25, 0.0, 1e-7],
                [3.0, 0.0, 0.0],
            ],
        };
        let (t, f) = (true, false);
        let all = [(0, t), (1, t), (0, f), (1, f), (2, t), (3, t), (4, t)];
        assert_eq!(filter_rows(&pairs, 0..7), all);
        // Apart, a pair and its reverse each have a row.
        assert_eq!(filter_rows(&pairs, 1..3), [(0, t), (1, t)]);
        assert_eq!(filter_rows(&pairs, 2..4), [(0, t), (1, t)]);
    }
}
