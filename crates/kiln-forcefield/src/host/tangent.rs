//! The gradient of the force-matching loss with respect to every parameter on the host: one
//! structure at a time (structures in parallel), a forward pass carrying a tangent and its reverse
//! pass, both by hand — the work `dual.rs` and burn's autodiff do on other backends.
//!
//! For a structure with energy seed `a = ∂ℓ/∂E` and pair-vector tangent `ṙ` (from `u = ∂ℓ/∂F`
//! and the strain tangent, `loss.rs`), the loss's gradient is that of `J = a E + Ė`, where `Ė` is
//! the energy's derivative along `ṙ`. The forward pass carries every value `v` with its
//! derivative `v̇`; the reverse pass carries adjoints of both (`v̄ = ∂J/∂v`, `v̇̄ = ∂J/∂v̇`) back
//! to the weights: a layer `y = x W + b`, `ẏ = ẋ W` adds `xᵀ ȳ + ẋᵀ ẏ̄` to `W̄`. Geometry carries
//! no parameters, so adjoints stop at the filters.

use rayon::prelude::*;

use super::dense::{Dense, DenseGradient};
use super::rows::{
    add, mul_add, mul_add2, product_of, scaled_add, sigmoid, silu, thirds, thirds_mut,
};
use super::{Pairs, Real, Weights};
use crate::painn::EPSILON;

/// The gradient of every parameter the host kernel reads, in [`Weights`]'s layout.
pub(crate) struct ParameterGradients<T> {
    pub embedding: Vec<T>,
    /// `[W; b]` of the filter network (the bias as its last row, when it has one).
    pub filter: Vec<T>,
    /// Per block: context network's two layers, mixing network's two layers, channel mix.
    pub blocks: Vec<[DenseGradient<T>; 5]>,
    pub readout: Vec<DenseGradient<T>>,
}

impl<T: Real> ParameterGradients<T> {
    fn zero(weights: &Weights<T>) -> Self {
        ParameterGradients {
            embedding: vec![T::zero(); weights.embedding.len()],
            filter: vec![T::zero(); weights.filter.w.len()],
            blocks: weights
                .blocks
                .iter()
                .map(|b| {
                    [
                        b.context[0].zero_gradient(),
                        b.context[1].zero_gradient(),
                        b.mixing[0].zero_gradient(),
                        b.mixing[1].zero_gradient(),
                        b.channel_mix.zero_gradient(),
                    ]
                })
                .collect(),
            readout: weights.readout.iter().map(Dense::zero_gradient).collect(),
        }
    }

    fn add(mut self, other: Self) -> Self {
        add(&mut self.embedding, &other.embedding);
        add(&mut self.filter, &other.filter);
        for (a, b) in self.blocks.iter_mut().zip(&other.blocks) {
            a.iter_mut().zip(b).for_each(|(a, b)| a.add(b));
        }
        for (a, b) in self.readout.iter_mut().zip(&other.readout) {
            a.add(b);
        }
        self
    }
}

/// One structure's part of the loss: its atoms' numbers, its pairs with their tangents `ṙ`, and
/// `∂ℓ/∂E`.
pub(crate) struct TangentInput<T> {
    pub numbers: Vec<u32>,
    pub pairs: Pairs<T>,
    pub tangents: Vec<[T; 3]>,
    pub energy_seed: T,
}

impl<T: Real> Weights<T> {
    /// `∂/∂θ Σ_s (a_s E_s + Ė_s)` over `structures`, structures in parallel.
    pub(crate) fn tangent_gradients(
        &self,
        arch: pulp::Arch,
        structures: &[TangentInput<T>],
    ) -> ParameterGradients<T> {
        structures
            .par_iter()
            .map(|s| arch.dispatch(TangentOp { weights: self, s }))
            .reduce_with(ParameterGradients::add)
            .unwrap_or_else(|| ParameterGradients::zero(self))
    }

    /// One structure's gradient (see the module's doc).
    #[inline(always)]
    fn structure_tangent(&self, s: &TangentInput<T>) -> ParameterGradients<T> {
        let (f, n) = (self.f, s.numbers.len());
        let mut grads = ParameterGradients::zero(self);
        let geometry = self.geometry(s);
        let filters = dense_dual(&self.filter, &geometry.psi);
        let q = s
            .numbers
            .iter()
            .flat_map(|&z| self.embedding[z as usize * f..(z as usize + 1) * f].iter())
            .copied()
            .collect();
        let mut q = Dual::new(q, vec![T::zero(); n * f]);
        let mut mu = Dual::zeros(3 * n * f);
        let mut saved = Vec::with_capacity(self.blocks.len());
        for t in 0..self.blocks.len() {
            saved.push(self.block_forward(t, s, &geometry, &filters, &mut q, &mut mu));
        }
        let (readout_in, pre_readout) = self.readout_forward(q);

        // Reverse: J = a Σ E_atom + Σ Ė_atom.
        let mut g = Dual::new(vec![s.energy_seed; n], vec![T::one(); n]);
        for (l, layer) in self.readout.iter().enumerate().rev() {
            let gx = dense_reverse(layer, &mut grads.readout[l], &readout_in[l], &g);
            g = match l {
                0 => gx,
                _ => silu_dual_backward(&pre_readout[l - 1], &gx),
            };
        }
        let mut gq = g;
        let mut gmu = Dual::zeros(3 * n * f);
        let mut gfilters = Dual::zeros(filters.v.len());
        for (t, sv) in saved.iter().enumerate().rev() {
            let [c0, c1, m0, m1, cm] = &mut grads.blocks[t];
            self.mixing_reverse(t, sv, [m0, m1, cm], &mut gq, &mut gmu);
            let gx = self.interaction_reverse(
                t,
                s,
                &geometry,
                &filters,
                sv,
                &gq,
                &mut gmu,
                &mut gfilters,
            );
            // Context network.
            let context = &self.blocks[t].context;
            let gh = dense_reverse(&context[1], c1, &sv.h, &gx);
            let gpre = silu_dual_backward(&sv.pre, &gh);
            gq.add(&dense_reverse(&context[0], c0, &sv.q_in, &gpre));
        }
        // Embeddings (their tangent is zero) and filters `[φc, c] [W; b]`, `ψ̇ [W; b]`.
        for (atom, &z) in s.numbers.iter().enumerate() {
            let row = &mut grads.embedding[z as usize * f..(z as usize + 1) * f];
            add(row, &gq.v[atom * f..(atom + 1) * f]);
        }
        let mut filter = self.filter.zero_gradient();
        self.filter
            .add_gradient(&mut filter, &geometry.psi.v, &gfilters.v, false);
        self.filter
            .add_gradient(&mut filter, &geometry.psi.d, &gfilters.d, false);
        grads.filter = filter.w;
        grads
    }

    /// Per pair: the unit vector and its tangent, `[φc, c]` and its derivative along `ṙ`.
    #[inline(always)]
    fn geometry(&self, s: &TangentInput<T>) -> Geometry<T> {
        let count = s.pairs.i.len();
        let (mut psi, mut dpsi) = (Vec::new(), Vec::new());
        let mut u = Vec::with_capacity(count);
        let mut u_dot: Vec<[T; 3]> = Vec::with_capacity(count);
        for (r, rd) in s.pairs.r.iter().zip(&s.tangents) {
            let d = (r[0] * r[0] + r[1] * r[1] + r[2] * r[2]).sqrt();
            let unit = r.map(|v| v / d);
            let d_dot = unit[0] * rd[0] + unit[1] * rd[1] + unit[2] * rd[2];
            u.push(unit);
            u_dot.push(std::array::from_fn(|a| (rd[a] - unit[a] * d_dot) / d));
            let start = dpsi.len();
            self.radial(d, &mut psi, &mut dpsi);
            dpsi[start..].iter_mut().for_each(|v| *v = *v * d_dot);
        }
        Geometry {
            u,
            u_dot,
            psi: Dual::new(psi, dpsi),
        }
    }

    /// Block `t` on `q` and `μ` in place, values and tangents; what the reverse pass needs.
    #[inline(always)]
    fn block_forward(
        &self,
        t: usize,
        s: &TangentInput<T>,
        geometry: &Geometry<T>,
        filters: &Dual<T>,
        q: &mut Dual<T>,
        mu: &mut Dual<T>,
    ) -> Saved<T> {
        let (f, n) = (self.f, s.numbers.len());
        let block = &self.blocks[t];
        let q_in = q.clone();
        let pre = dense_dual(&block.context[0], q);
        let h = silu_dual(&pre);
        let x = dense_dual(&block.context[1], &h);
        let mu_in = mu.clone();
        self.interaction_forward(t, s, geometry, filters, &x, &mu_in, q, mu);
        let mu_mid = mu.clone();
        // Mixing: ‖V‖ and ⟨V, W⟩ per atom and channel, then q += y_q + y_s ⟨V, W⟩,
        // μ_a += y_v W_a (and the tangents).
        let vw = dense_dual(&block.channel_mix, mu);
        let mut norm = Dual::zeros(n * f);
        let mut inner = Dual::zeros(n * f);
        for atom in 0..n {
            let c = atom * f;
            let (nv, nd) = (&mut norm.v[c..][..f], &mut norm.d[c..][..f]);
            let (iv, id) = (&mut inner.v[c..][..f], &mut inner.d[c..][..f]);
            for a in 0..3 {
                let row = (3 * atom + a) * 2 * f;
                let (v, w) = (&vw.v[row..][..f], &vw.v[row + f..][..f]);
                let (vd, wd) = (&vw.d[row..][..f], &vw.d[row + f..][..f]);
                mul_add(nv, v, v);
                mul_add(nd, v, vd);
                mul_add(iv, v, w);
                mul_add2(id, vd, w, v, wd);
            }
        }
        let eps = T::from(EPSILON).unwrap();
        for (nv, nd) in norm.v.iter_mut().zip(norm.d.iter_mut()) {
            *nv = (*nv + eps).sqrt();
            *nd = *nd / *nv;
        }
        let join = |a: &[T], b: &[T]| -> Vec<T> {
            (0..n)
                .flat_map(|atom| a[atom * f..][..f].iter().chain(&b[atom * f..][..f]))
                .copied()
                .collect()
        };
        let context = Dual::new(join(&q.v, &norm.v), join(&q.d, &norm.d));
        let pre_mix = dense_dual(&block.mixing[0], &context);
        let hm = silu_dual(&pre_mix);
        let y = dense_dual(&block.mixing[1], &hm);
        for atom in 0..n {
            let c = atom * f;
            let (yq, yv, ys) = thirds(&y.v[3 * c..], f);
            let (yqd, yvd, ysd) = thirds(&y.d[3 * c..], f);
            let (g, gd) = (&inner.v[c..][..f], &inner.d[c..][..f]);
            add(&mut q.v[c..][..f], yq);
            mul_add(&mut q.v[c..][..f], ys, g);
            add(&mut q.d[c..][..f], yqd);
            mul_add2(&mut q.d[c..][..f], ysd, g, ys, gd);
            for a in 0..3 {
                let (row, m) = ((3 * atom + a) * 2 * f, (3 * atom + a) * f);
                let (w, wd) = (&vw.v[row + f..][..f], &vw.d[row + f..][..f]);
                mul_add(&mut mu.v[m..][..f], yv, w);
                mul_add2(&mut mu.d[m..][..f], yvd, w, yv, wd);
            }
        }
        Saved {
            q_in,
            pre,
            h,
            x,
            mu_in,
            mu_mid,
            vw,
            norm,
            inner,
            context,
            pre_mix,
            hm,
            y,
        }
    }

    /// Block `t`'s interaction: messages from every neighbour `j` into `q_i` and `μ_i`.
    #[allow(clippy::too_many_arguments)]
    #[inline(always)]
    fn interaction_forward(
        &self,
        t: usize,
        s: &TangentInput<T>,
        geometry: &Geometry<T>,
        filters: &Dual<T>,
        x: &Dual<T>,
        mu_in: &Dual<T>,
        q: &mut Dual<T>,
        mu: &mut Dual<T>,
    ) {
        let (f, width, start) = (self.f, self.filter.outputs, self.filter_start(t));
        // Per pair: R = w_r ⊙ x_r, A = w_m ⊙ x_m and their tangents.
        let mut message = vec![T::zero(); 4 * f];
        for p in 0..s.pairs.i.len() {
            let (i, j) = (s.pairs.i[p], s.pairs.j[p]);
            let (wq, wr, wm) = thirds(&filters.v[p * width + start..], f);
            let (wqd, wrd, wmd) = thirds(&filters.d[p * width + start..], f);
            let (xq, xr, xm) = thirds(&x.v[3 * f * j..], f);
            let (xqd, xrd, xmd) = thirds(&x.d[3 * f * j..], f);
            mul_add(&mut q.v[i * f..][..f], wq, xq);
            mul_add2(&mut q.d[i * f..][..f], wqd, xq, wq, xqd);
            let (radial, rest) = message.split_at_mut(f);
            let (radial_dot, along, along_dot) = thirds_mut(rest, f);
            product_of(radial, wr, xr);
            product_of(radial_dot, wrd, xr);
            mul_add(radial_dot, wr, xrd);
            product_of(along, wm, xm);
            product_of(along_dot, wmd, xm);
            mul_add(along_dot, wm, xmd);
            for a in 0..3 {
                let (ua, uda) = (geometry.u[p][a], geometry.u_dot[p][a]);
                let (row_j, row_i) = ((3 * j + a) * f, (3 * i + a) * f);
                let (m, md) = (&mu_in.v[row_j..][..f], &mu_in.d[row_j..][..f]);
                let out = &mut mu.v[row_i..][..f];
                scaled_add(out, radial, ua);
                mul_add(out, along, m);
                let out = &mut mu.d[row_i..][..f];
                scaled_add(out, radial_dot, ua);
                scaled_add(out, radial, uda);
                mul_add2(out, along_dot, m, along, md);
            }
        }
    }

    /// The readout's MLP on `q`, values and tangents: each layer's input and the hidden
    /// pre-activations.
    #[inline(always)]
    fn readout_forward(&self, q: Dual<T>) -> (Vec<Dual<T>>, Vec<Dual<T>>) {
        let mut inputs = Vec::with_capacity(self.readout.len());
        let mut pre_activations = Vec::new();
        let mut h = q;
        for (l, layer) in self.readout.iter().enumerate() {
            let z = dense_dual(layer, &h);
            inputs.push(h);
            if l + 1 == self.readout.len() {
                break;
            }
            h = silu_dual(&z);
            pre_activations.push(z);
        }
        (inputs, pre_activations)
    }

    /// Block `t`'s mixing backward: the adjoints of `q` and `μ` before it from those after it,
    /// and its layers' gradients (`[mixing 0, mixing 1, channel mix]`).
    #[inline(always)]
    fn mixing_reverse(
        &self,
        t: usize,
        sv: &Saved<T>,
        [m0, m1, cm]: [&mut DenseGradient<T>; 3],
        gq: &mut Dual<T>,
        gmu: &mut Dual<T>,
    ) {
        let (f, n) = (self.f, sv.norm.v.len() / self.f);
        let block = &self.blocks[t];
        // q += y_q + y_s ⊙ ⟨V, W⟩, μ_a += y_v ⊙ W_a (and their tangents).
        let mut gy = Dual::zeros(3 * n * f);
        let mut ginner = Dual::zeros(n * f);
        let mut gvw = Dual::zeros(6 * n * f);
        for atom in 0..n {
            let c = atom * f;
            let (gv, gd) = (&gq.v[c..][..f], &gq.d[c..][..f]);
            let (_, yv, ys) = thirds(&sv.y.v[3 * c..], f);
            let (_, yvd, ysd) = thirds(&sv.y.d[3 * c..], f);
            let (inn, innd) = (&sv.inner.v[c..][..f], &sv.inner.d[c..][..f]);
            let (gyq, gyv, gys) = thirds_mut(&mut gy.v[3 * c..], f);
            let (gyqd, gyvd, gysd) = thirds_mut(&mut gy.d[3 * c..], f);
            gyq.copy_from_slice(gv);
            gyqd.copy_from_slice(gd);
            mul_add2(gys, gv, inn, gd, innd);
            mul_add(gysd, gd, inn);
            mul_add2(&mut ginner.v[c..][..f], gv, ys, gd, ysd);
            mul_add(&mut ginner.d[c..][..f], gd, ys);
            for a in 0..3 {
                let (row, m) = ((3 * atom + a) * 2 * f, (3 * atom + a) * f);
                let (gm, gmd) = (&gmu.v[m..][..f], &gmu.d[m..][..f]);
                let (w, wd) = (&sv.vw.v[row + f..][..f], &sv.vw.d[row + f..][..f]);
                mul_add2(gyv, gm, w, gmd, wd);
                mul_add(gyvd, gmd, w);
                mul_add2(&mut gvw.v[row + f..][..f], gm, yv, gmd, yvd);
                mul_add(&mut gvw.d[row + f..][..f], gmd, yv);
            }
        }
        let ghm = dense_reverse(&block.mixing[1], m1, &sv.hm, &gy);
        let gpm = silu_dual_backward(&sv.pre_mix, &ghm);
        let gctx = dense_reverse(&block.mixing[0], m0, &sv.context, &gpm);
        for atom in 0..n {
            let c = atom * f;
            add(&mut gq.v[c..][..f], &gctx.v[2 * c..][..f]);
            add(&mut gq.d[c..][..f], &gctx.d[2 * c..][..f]);
            let (gn, gnd) = (&gctx.v[2 * c + f..][..f], &gctx.d[2 * c + f..][..f]);
            let (nv, nd) = (&sv.norm.v[c..][..f], &sv.norm.d[c..][..f]);
            let (gi, gid) = (&ginner.v[c..][..f], &ginner.d[c..][..f]);
            for a in 0..3 {
                let row = (3 * atom + a) * 2 * f;
                let (v, vd) = (&sv.vw.v[row..][..f], &sv.vw.d[row..][..f]);
                let (w, wd) = (&sv.vw.v[row + f..][..f], &sv.vw.d[row + f..][..f]);
                let (gv, gw) = gvw.v[row..][..2 * f].split_at_mut(f);
                let (gvd, gwd) = gvw.d[row..][..2 * f].split_at_mut(f);
                for k in 0..f {
                    // norm = √(Σ V² + ε), ṅorm = Σ V V̇ / norm; ⟨V, W⟩ and its tangent.
                    let (v, vd, n, nd) = (v[k], vd[k], nv[k], nd[k]);
                    gv[k] = gn[k] * v / n
                        + gnd[k] * (vd - nd * v / n) / n
                        + gi[k] * w[k]
                        + gid[k] * wd[k];
                    gvd[k] = gnd[k] * v / n + gid[k] * w[k];
                    gw[k] += gi[k] * v + gid[k] * vd;
                    gwd[k] += gid[k] * v;
                }
            }
        }
        gmu.add(&dense_reverse(&block.channel_mix, cm, &sv.mu_mid, &gvw));
    }

    /// Block `t`'s interaction backward: the adjoints of the filters (into `gfilters`), of the
    /// context output `x` (returned) and of `μ` entering the block (`gmu`, in place).
    #[allow(clippy::too_many_arguments)]
    #[inline(always)]
    fn interaction_reverse(
        &self,
        t: usize,
        s: &TangentInput<T>,
        geometry: &Geometry<T>,
        filters: &Dual<T>,
        sv: &Saved<T>,
        gq: &Dual<T>,
        gmu: &mut Dual<T>,
        gfilters: &mut Dual<T>,
    ) -> Dual<T> {
        let (f, width, start) = (self.f, self.filter.outputs, self.filter_start(t));
        let mut gx = Dual::zeros(sv.x.v.len());
        let mut gmu_in = gmu.clone();
        let mut sums = vec![T::zero(); 4 * f];
        let mut message = vec![T::zero(); 2 * f];
        for p in 0..s.pairs.i.len() {
            let (i, j) = (s.pairs.i[p], s.pairs.j[p]);
            let row = p * width + start;
            let (wq, wr, wm) = thirds(&filters.v[row..], f);
            let (wqd, wrd, wmd) = thirds(&filters.d[row..], f);
            let (xq, xr, xm) = thirds(&sv.x.v[3 * f * j..], f);
            let (xqd, xrd, xmd) = thirds(&sv.x.d[3 * f * j..], f);
            let (gq_i, gqd_i) = (&gq.v[i * f..][..f], &gq.d[i * f..][..f]);
            let (gwq, gwr, gwm) = thirds_mut(&mut gfilters.v[row..], f);
            let (gwqd, gwrd, gwmd) = thirds_mut(&mut gfilters.d[row..], f);
            let (gxq, gxr, gxm) = thirds_mut(&mut gx.v[3 * f * j..], f);
            let (gxqd, gxrd, gxmd) = thirds_mut(&mut gx.d[3 * f * j..], f);
            mul_add2(gwq, gq_i, xq, gqd_i, xqd);
            mul_add(gwqd, gqd_i, xq);
            mul_add2(gxq, gq_i, wq, gqd_i, wqd);
            mul_add(gxqd, gqd_i, wq);
            // A = w_m ⊙ x_m and its tangent, as the forward pass formed them.
            let (along, along_dot) = message.split_at_mut(f);
            product_of(along, wm, xm);
            product_of(along_dot, wmd, xm);
            mul_add(along_dot, wm, xmd);
            // R̄ = Σ_a (μ̄_a û_a + μ̇̄_a û̇_a), Ṙ̄ = Σ_a μ̇̄_a û_a; Ā, Ǡ likewise with μ_j.
            sums.fill(T::zero());
            let (bars, dots) = sums.split_at_mut(2 * f);
            let (radial_bar, along_bar) = bars.split_at_mut(f);
            let (radial_dot_bar, along_dot_bar) = dots.split_at_mut(f);
            for a in 0..3 {
                let (ua, uda) = (geometry.u[p][a], geometry.u_dot[p][a]);
                let (ri, rj) = ((3 * i + a) * f, (3 * j + a) * f);
                let (gm, gmd) = (&gmu.v[ri..][..f], &gmu.d[ri..][..f]);
                let (m, md) = (&sv.mu_in.v[rj..][..f], &sv.mu_in.d[rj..][..f]);
                scaled_add(radial_bar, gm, ua);
                scaled_add(radial_bar, gmd, uda);
                scaled_add(radial_dot_bar, gmd, ua);
                mul_add2(along_bar, gm, m, gmd, md);
                mul_add(along_dot_bar, gmd, m);
                mul_add2(&mut gmu_in.v[rj..][..f], gm, along, gmd, along_dot);
                mul_add(&mut gmu_in.d[rj..][..f], gmd, along);
            }
            // R = w_r x_r, Ṙ = ẇ_r x_r + w_r ẋ_r (and A, Ȧ) back to w, ẇ, x, ẋ.
            mul_add2(gwr, radial_bar, xr, radial_dot_bar, xrd);
            mul_add(gwrd, radial_dot_bar, xr);
            mul_add2(gxr, radial_bar, wr, radial_dot_bar, wrd);
            mul_add(gxrd, radial_dot_bar, wr);
            mul_add2(gwm, along_bar, xm, along_dot_bar, xmd);
            mul_add(gwmd, along_dot_bar, xm);
            mul_add2(gxm, along_bar, wm, along_dot_bar, wmd);
            mul_add(gxmd, along_dot_bar, wm);
        }
        *gmu = gmu_in;
        gx
    }
}

/// Values and their tangents (or adjoints of both), of the same shape.
#[derive(Clone)]
struct Dual<T> {
    v: Vec<T>,
    d: Vec<T>,
}

impl<T: Real> Dual<T> {
    fn new(v: Vec<T>, d: Vec<T>) -> Self {
        debug_assert_eq!(v.len(), d.len());
        Dual { v, d }
    }

    fn zeros(len: usize) -> Self {
        Dual::new(vec![T::zero(); len], vec![T::zero(); len])
    }

    /// `self += other`, both parts.
    #[inline(always)]
    fn add(&mut self, other: &Dual<T>) {
        add(&mut self.v, &other.v);
        add(&mut self.d, &other.d);
    }
}

/// A structure's pair geometry: unit vectors, their tangents, and `[φc, c]` with its tangent.
struct Geometry<T> {
    u: Vec<[T; 3]>,
    u_dot: Vec<[T; 3]>,
    psi: Dual<T>,
}

/// What the reverse pass needs of one block's forward pass, values with their tangents.
struct Saved<T> {
    /// Scalar features entering the block, the context network's pre-activation, hidden layer
    /// and output `x`.
    q_in: Dual<T>,
    pre: Dual<T>,
    h: Dual<T>,
    x: Dual<T>,
    /// Vector features entering the block and after its interaction.
    mu_in: Dual<T>,
    mu_mid: Dual<T>,
    /// Channel mix `[atoms, 3, 2F]`, ‖V‖ and ⟨V, W⟩ `[atoms, F]`.
    vw: Dual<T>,
    norm: Dual<T>,
    inner: Dual<T>,
    /// The mixing network's input `[q, ‖V‖]`, pre-activation, hidden layer and output.
    context: Dual<T>,
    pre_mix: Dual<T>,
    hm: Dual<T>,
    y: Dual<T>,
}

/// [`Weights::structure_tangent`] as a `pulp` operation (compiled for the CPU's widest
/// instruction set, everything it calls inlined).
struct TangentOp<'a, T> {
    weights: &'a Weights<T>,
    s: &'a TangentInput<T>,
}

impl<T: Real> pulp::WithSimd for TangentOp<'_, T> {
    type Output = ParameterGradients<T>;

    #[inline(always)]
    fn with_simd<S: pulp::Simd>(self, _: S) -> Self::Output {
        self.weights.structure_tangent(self.s)
    }
}

/// A layer on a value and its tangent: `x W + b` and `ẋ W`.
#[inline(always)]
fn dense_dual<T: Real>(layer: &Dense<T>, x: &Dual<T>) -> Dual<T> {
    Dual::new(layer.forward(&x.v), layer.linear(&x.d))
}

/// A layer backward: adds `xᵀ ȳ + ẋᵀ ẏ̄` to `W̄` (and `Σ ȳ` to `b̄`) in `gradient`; returns the
/// adjoints of `x` and `ẋ`, `ȳ Wᵀ` and `ẏ̄ Wᵀ`.
#[inline(always)]
fn dense_reverse<T: Real>(
    layer: &Dense<T>,
    gradient: &mut DenseGradient<T>,
    x: &Dual<T>,
    g: &Dual<T>,
) -> Dual<T> {
    layer.add_gradient(gradient, &x.v, &g.v, true);
    layer.add_gradient(gradient, &x.d, &g.d, false);
    Dual::new(layer.backward(&g.v), layer.backward(&g.d))
}

/// SiLU `s(z) = z σ(z)` and its tangent `s'(z) ż`.
#[inline(always)]
fn silu_dual<T: Real>(z: &Dual<T>) -> Dual<T> {
    let tangent =
        z.v.iter()
            .zip(&z.d)
            .map(|(&z, &zd)| {
                let s = sigmoid(z);
                s * (T::one() + z * (T::one() - s)) * zd
            })
            .collect();
    Dual::new(silu(&z.v), tangent)
}

/// The adjoints of `z` and `ż` from those of `s(z)` and `s'(z) ż` (`g`):
/// `z̄ = h̄ s'(z) + ḣ̄ s''(z) ż`, `ż̄ = ḣ̄ s'(z)`, with `s'' = σ(1 − σ)(2 + z(1 − 2σ))`.
#[inline(always)]
fn silu_dual_backward<T: Real>(z: &Dual<T>, g: &Dual<T>) -> Dual<T> {
    let two = T::one() + T::one();
    let mut gz = Dual::zeros(z.v.len());
    for k in 0..z.v.len() {
        let (zv, zd) = (z.v[k], z.d[k]);
        let s = sigmoid(zv);
        let first = s * (T::one() + zv * (T::one() - s));
        let second = s * (T::one() - s) * (two + zv * (T::one() - two * s));
        gz.v[k] = g.v[k] * first + g.d[k] * second * zd;
        gz.d[k] = g.d[k] * first;
    }
    gz
}
