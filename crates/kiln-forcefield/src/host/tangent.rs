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
        let sum = |a: &mut Vec<T>, b: &Vec<T>| a.iter_mut().zip(b).for_each(|(a, &b)| *a += b);
        sum(&mut self.embedding, &other.embedding);
        sum(&mut self.filter, &other.filter);
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
        let f = self.f;
        let n = s.numbers.len();
        let rows = self.filter_rows();
        let pairs = &s.pairs;
        let count = pairs.i.len();
        let mut grads = ParameterGradients::zero(self);
        // Geometry and its tangent: d, û, û̇ and [φc, c] with its derivative along ṙ.
        let (mut psi, mut dpsi) = (Vec::new(), Vec::new());
        let mut u = Vec::with_capacity(count);
        let mut u_dot: Vec<[T; 3]> = Vec::with_capacity(count);
        for (r, rd) in pairs.r.iter().zip(&s.tangents) {
            let d = (r[0] * r[0] + r[1] * r[1] + r[2] * r[2]).sqrt();
            let unit = r.map(|v| v / d);
            let d_dot = unit[0] * rd[0] + unit[1] * rd[1] + unit[2] * rd[2];
            u.push(unit);
            u_dot.push(std::array::from_fn(|a| (rd[a] - unit[a] * d_dot) / d));
            let start = dpsi.len();
            self.radial(d, &mut psi, &mut dpsi);
            dpsi[start..].iter_mut().for_each(|v| *v = *v * d_dot);
        }
        let psi_dot = dpsi;
        let filters = self.filter.forward(&psi);
        let filters_dot = self.filter.linear(&psi_dot);
        let width = self.filter.outputs;

        // Forward, value and tangent.
        let mut q: Vec<T> = s
            .numbers
            .iter()
            .flat_map(|&z| self.embedding[z as usize * f..(z as usize + 1) * f].iter())
            .copied()
            .collect();
        let mut q_dot = vec![T::zero(); n * f];
        let mut mu = vec![T::zero(); 3 * n * f];
        let mut mu_dot = vec![T::zero(); 3 * n * f];
        let mut saved = Vec::with_capacity(self.blocks.len());
        for (t, block) in self.blocks.iter().enumerate() {
            let (q_in, q_dot_in) = (q.clone(), q_dot.clone());
            let (pre, pre_dot) = (
                block.context[0].forward(&q),
                block.context[0].linear(&q_dot),
            );
            let (h, h_dot) = silu_dual(&pre, &pre_dot);
            let (x, x_dot) = (
                block.context[1].forward(&h),
                block.context[1].linear(&h_dot),
            );
            let (mu_in, mu_dot_in) = (mu.clone(), mu_dot.clone());
            let start = self.filter_start(t);
            // Per pair: R = w_r ⊙ x_r, A = w_m ⊙ x_m and their tangents.
            let mut message = vec![T::zero(); 4 * f];
            for p in 0..count {
                let (i, j) = (pairs.i[p], pairs.j[p]);
                let (wq, wr, wm) = thirds(&filters[p * width + start..], f);
                let (wqd, wrd, wmd) = thirds(&filters_dot[p * width + start..], f);
                let (xq, xr, xm) = thirds(&x[3 * f * j..], f);
                let (xqd, xrd, xmd) = thirds(&x_dot[3 * f * j..], f);
                mul_add(&mut q[i * f..][..f], wq, xq);
                mul_add2(&mut q_dot[i * f..][..f], wqd, xq, wq, xqd);
                let (radial, rest) = message.split_at_mut(f);
                let (radial_dot, along, along_dot) = thirds_mut(rest, f);
                product_of(radial, wr, xr);
                product_of(radial_dot, wrd, xr);
                mul_add(radial_dot, wr, xrd);
                product_of(along, wm, xm);
                product_of(along_dot, wmd, xm);
                mul_add(along_dot, wm, xmd);
                for a in 0..3 {
                    let (ua, uda) = (u[p][a], u_dot[p][a]);
                    let (row_j, row_i) = ((3 * j + a) * f, (3 * i + a) * f);
                    let (m, md) = (&mu_in[row_j..][..f], &mu_dot_in[row_j..][..f]);
                    let out = &mut mu[row_i..][..f];
                    scaled_add(out, radial, ua);
                    mul_add(out, along, m);
                    let out = &mut mu_dot[row_i..][..f];
                    scaled_add(out, radial_dot, ua);
                    scaled_add(out, radial, uda);
                    mul_add2(out, along_dot, m, along, md);
                }
            }
            let (mu_mid, mu_dot_mid) = (mu.clone(), mu_dot.clone());
            // Mixing.
            let vw = block.channel_mix.forward(&mu);
            let vw_dot = block.channel_mix.linear(&mu_dot);
            let mut norm = vec![T::zero(); n * f];
            let mut norm_dot = vec![T::zero(); n * f];
            let mut inner = vec![T::zero(); n * f];
            let mut inner_dot = vec![T::zero(); n * f];
            for atom in 0..n {
                let (nv, nd) = (&mut norm[atom * f..][..f], &mut norm_dot[atom * f..][..f]);
                let (iv, id) = (&mut inner[atom * f..][..f], &mut inner_dot[atom * f..][..f]);
                for a in 0..3 {
                    let row = (3 * atom + a) * 2 * f;
                    let (v, w) = (&vw[row..][..f], &vw[row + f..][..f]);
                    let (vd, wd) = (&vw_dot[row..][..f], &vw_dot[row + f..][..f]);
                    for k in 0..f {
                        nv[k] += v[k] * v[k];
                        nd[k] += v[k] * vd[k];
                        iv[k] += v[k] * w[k];
                        id[k] += vd[k] * w[k] + v[k] * wd[k];
                    }
                }
            }
            let eps = T::from(EPSILON).unwrap();
            for (nv, nd) in norm.iter_mut().zip(norm_dot.iter_mut()) {
                *nv = (*nv + eps).sqrt();
                *nd = *nd / *nv;
            }
            let join = |a: &[T], b: &[T]| -> Vec<T> {
                (0..n)
                    .flat_map(|atom| {
                        a[atom * f..(atom + 1) * f]
                            .iter()
                            .chain(&b[atom * f..(atom + 1) * f])
                            .copied()
                    })
                    .collect()
            };
            let context = join(&q, &norm);
            let context_dot = join(&q_dot, &norm_dot);
            let pre_mix = block.mixing[0].forward(&context);
            let pre_mix_dot = block.mixing[0].linear(&context_dot);
            let (hm, hm_dot) = silu_dual(&pre_mix, &pre_mix_dot);
            let y = block.mixing[1].forward(&hm);
            let y_dot = block.mixing[1].linear(&hm_dot);
            for atom in 0..n {
                let (yq, yv, ys) = thirds(&y[3 * f * atom..], f);
                let (yqd, yvd, ysd) = thirds(&y_dot[3 * f * atom..], f);
                let (g, gd) = (&inner[atom * f..][..f], &inner_dot[atom * f..][..f]);
                let (qa, qda) = (&mut q[atom * f..][..f], &mut q_dot[atom * f..][..f]);
                for k in 0..f {
                    qa[k] += yq[k] + ys[k] * g[k];
                    qda[k] += yqd[k] + ysd[k] * g[k] + ys[k] * gd[k];
                }
                for a in 0..3 {
                    let row = (3 * atom + a) * 2 * f;
                    let (w, wd) = (&vw[row + f..][..f], &vw_dot[row + f..][..f]);
                    let m = (3 * atom + a) * f;
                    let (out, out_dot) = (&mut mu[m..][..f], &mut mu_dot[m..][..f]);
                    for k in 0..f {
                        out[k] += yv[k] * w[k];
                        out_dot[k] += yvd[k] * w[k] + yv[k] * wd[k];
                    }
                }
            }
            saved.push(Saved {
                q_in,
                q_dot_in,
                pre,
                pre_dot,
                h,
                h_dot,
                x,
                x_dot,
                mu_in,
                mu_dot_in,
                mu_mid,
                mu_dot_mid,
                vw,
                vw_dot,
                norm,
                norm_dot,
                inner,
                inner_dot,
                context,
                context_dot,
                pre_mix,
                pre_mix_dot,
                hm,
                hm_dot,
                y,
                y_dot,
            });
        }
        // Readout, value and tangent.
        let mut layers_in = Vec::with_capacity(self.readout.len());
        let (mut h, mut h_dot) = (q, q_dot);
        let mut pre_readout = Vec::new();
        for (l, layer) in self.readout.iter().enumerate() {
            let z = layer.forward(&h);
            let z_dot = layer.linear(&h_dot);
            layers_in.push((std::mem::take(&mut h), std::mem::take(&mut h_dot)));
            if l + 1 < self.readout.len() {
                (h, h_dot) = silu_dual(&z, &z_dot);
                pre_readout.push((z, z_dot));
            }
        }

        // Reverse: J = a Σ E_atom + Σ Ė_atom.
        let mut g = vec![s.energy_seed; n];
        let mut g_dot = vec![T::one(); n];
        for (l, layer) in self.readout.iter().enumerate().rev() {
            let (x, x_dot) = &layers_in[l];
            layer.add_gradient(&mut grads.readout[l], x, &g, true);
            layer.add_gradient(&mut grads.readout[l], x_dot, &g_dot, false);
            let (gx, gx_dot) = (layer.backward(&g), layer.backward(&g_dot));
            if l > 0 {
                let (z, z_dot) = &pre_readout[l - 1];
                (g, g_dot) = silu_dual_backward(z, z_dot, &gx, &gx_dot);
            } else {
                (g, g_dot) = (gx, gx_dot);
            }
        }
        let (mut gq, mut gq_dot) = (g, g_dot);
        let mut gmu = vec![T::zero(); 3 * n * f];
        let mut gmu_dot = vec![T::zero(); 3 * n * f];
        let mut gfilters = vec![T::zero(); filters.len()];
        let mut gfilters_dot = vec![T::zero(); filters.len()];
        for (t, (block, sv)) in self.blocks.iter().zip(&saved).enumerate().rev() {
            let bg = &mut grads.blocks[t];
            // Mixing: q += y_q + y_s ⊙ ⟨V, W⟩, μ_a += y_v ⊙ W_a (and their tangents).
            let mut gy = vec![T::zero(); 3 * n * f];
            let mut gy_dot = vec![T::zero(); 3 * n * f];
            let mut ginner = vec![T::zero(); n * f];
            let mut ginner_dot = vec![T::zero(); n * f];
            let mut gvw = vec![T::zero(); 6 * n * f];
            let mut gvw_dot = vec![T::zero(); 6 * n * f];
            for atom in 0..n {
                let c = atom * f;
                let (gv, gd) = (&gq[c..][..f], &gq_dot[c..][..f]);
                let (_, yv, ys) = thirds(&sv.y[3 * c..], f);
                let (_, yvd, ysd) = thirds(&sv.y_dot[3 * c..], f);
                let (inn, innd) = (&sv.inner[c..][..f], &sv.inner_dot[c..][..f]);
                let (gyq, gyv, gys) = thirds_mut(&mut gy[3 * c..], f);
                let (gyqd, gyvd, gysd) = thirds_mut(&mut gy_dot[3 * c..], f);
                let (gi, gid) = (&mut ginner[c..][..f], &mut ginner_dot[c..][..f]);
                for k in 0..f {
                    gyq[k] = gv[k];
                    gyqd[k] = gd[k];
                    gys[k] = gv[k] * inn[k] + gd[k] * innd[k];
                    gysd[k] = gd[k] * inn[k];
                    gi[k] = gv[k] * ys[k] + gd[k] * ysd[k];
                    gid[k] = gd[k] * ys[k];
                }
                for a in 0..3 {
                    let (row, m) = ((3 * atom + a) * 2 * f, (3 * atom + a) * f);
                    let (gm, gmd) = (&gmu[m..][..f], &gmu_dot[m..][..f]);
                    let (w, wd) = (&sv.vw[row + f..][..f], &sv.vw_dot[row + f..][..f]);
                    let (gw, gwd) = (&mut gvw[row + f..][..f], &mut gvw_dot[row + f..][..f]);
                    for k in 0..f {
                        gyv[k] += gm[k] * w[k] + gmd[k] * wd[k];
                        gyvd[k] += gmd[k] * w[k];
                        gw[k] = gm[k] * yv[k] + gmd[k] * yvd[k];
                        gwd[k] = gmd[k] * yv[k];
                    }
                }
            }
            let [c0, c1, m0, m1, cm] = bg;
            let layer = &block.mixing[1];
            layer.add_gradient(m1, &sv.hm, &gy, true);
            layer.add_gradient(m1, &sv.hm_dot, &gy_dot, false);
            let (ghm, ghm_dot) = (layer.backward(&gy), layer.backward(&gy_dot));
            let (gpm, gpm_dot) = silu_dual_backward(&sv.pre_mix, &sv.pre_mix_dot, &ghm, &ghm_dot);
            let layer = &block.mixing[0];
            layer.add_gradient(m0, &sv.context, &gpm, true);
            layer.add_gradient(m0, &sv.context_dot, &gpm_dot, false);
            let (gctx, gctx_dot) = (layer.backward(&gpm), layer.backward(&gpm_dot));
            for atom in 0..n {
                let c = atom * f;
                add(&mut gq[c..][..f], &gctx[2 * c..][..f]);
                add(&mut gq_dot[c..][..f], &gctx_dot[2 * c..][..f]);
                let (gn, gnd) = (&gctx[2 * c + f..][..f], &gctx_dot[2 * c + f..][..f]);
                let (nv, nd) = (&sv.norm[c..][..f], &sv.norm_dot[c..][..f]);
                let (gi, gid) = (&ginner[c..][..f], &ginner_dot[c..][..f]);
                for a in 0..3 {
                    let row = (3 * atom + a) * 2 * f;
                    let (v, vd) = (&sv.vw[row..][..f], &sv.vw_dot[row..][..f]);
                    let (w, wd) = (&sv.vw[row + f..][..f], &sv.vw_dot[row + f..][..f]);
                    let (gv, gw) = gvw[row..][..2 * f].split_at_mut(f);
                    let (gvd, gwd) = gvw_dot[row..][..2 * f].split_at_mut(f);
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
            let layer = &block.channel_mix;
            layer.add_gradient(cm, &sv.mu_mid, &gvw, true);
            layer.add_gradient(cm, &sv.mu_dot_mid, &gvw_dot, false);
            add(&mut gmu, &layer.backward(&gvw));
            add(&mut gmu_dot, &layer.backward(&gvw_dot));
            // Interaction: messages into every centre i from its neighbours j.
            let start = self.filter_start(t);
            let mut gx = vec![T::zero(); 3 * n * f];
            let mut gx_dot = vec![T::zero(); 3 * n * f];
            let (mut gmu_in, mut gmu_dot_in) = (gmu.clone(), gmu_dot.clone());
            let mut sums = vec![T::zero(); 4 * f];
            let mut message = vec![T::zero(); 2 * f];
            for p in 0..count {
                let (i, j) = (pairs.i[p], pairs.j[p]);
                let row = p * width + start;
                let (wq, wr, wm) = thirds(&filters[row..], f);
                let (wqd, wrd, wmd) = thirds(&filters_dot[row..], f);
                let (xq, xr, xm) = thirds(&sv.x[3 * f * j..], f);
                let (xqd, xrd, xmd) = thirds(&sv.x_dot[3 * f * j..], f);
                let (gq_i, gqd_i) = (&gq[i * f..][..f], &gq_dot[i * f..][..f]);
                let (gwq, gwr, gwm) = thirds_mut(&mut gfilters[row..], f);
                let (gwqd, gwrd, gwmd) = thirds_mut(&mut gfilters_dot[row..], f);
                let (gxq, gxr, gxm) = thirds_mut(&mut gx[3 * f * j..], f);
                let (gxqd, gxrd, gxmd) = thirds_mut(&mut gx_dot[3 * f * j..], f);
                mul_add2(gwq, gq_i, xq, gqd_i, xqd);
                mul_add(gwqd, gqd_i, xq);
                mul_add2(gxq, gq_i, wq, gqd_i, wqd);
                mul_add(gxqd, gqd_i, wq);
                // A = w_m ⊙ x_m and its tangent, as the forward pass formed them.
                let (along, along_dot) = message.split_at_mut(f);
                product_of(along, wm, xm);
                product_of(along_dot, wmd, xm);
                mul_add(along_dot, wm, xmd);
                // R̄ = Σ_a (μ̄_a û_a + μ̇̄_a û̇_a), Ṙ̄ = Σ_a μ̇̄_a û_a; Ā, Ǡ likewise with μ_j.
                sums.fill(T::zero());
                let (bars, dots) = sums.split_at_mut(2 * f);
                let (radial_bar, along_bar) = bars.split_at_mut(f);
                let (radial_dot_bar, along_dot_bar) = dots.split_at_mut(f);
                for a in 0..3 {
                    let (ua, uda) = (u[p][a], u_dot[p][a]);
                    let (ri, rj) = ((3 * i + a) * f, (3 * j + a) * f);
                    let (gm, gmd) = (&gmu[ri..][..f], &gmu_dot[ri..][..f]);
                    let (m, md) = (&sv.mu_in[rj..][..f], &sv.mu_dot_in[rj..][..f]);
                    scaled_add(radial_bar, gm, ua);
                    scaled_add(radial_bar, gmd, uda);
                    scaled_add(radial_dot_bar, gmd, ua);
                    mul_add2(along_bar, gm, m, gmd, md);
                    mul_add(along_dot_bar, gmd, m);
                    mul_add2(&mut gmu_in[rj..][..f], gm, along, gmd, along_dot);
                    mul_add(&mut gmu_dot_in[rj..][..f], gmd, along);
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
            (gmu, gmu_dot) = (gmu_in, gmu_dot_in);
            // Context network.
            let layer = &block.context[1];
            layer.add_gradient(c1, &sv.h, &gx, true);
            layer.add_gradient(c1, &sv.h_dot, &gx_dot, false);
            let (gh, gh_dot) = (layer.backward(&gx), layer.backward(&gx_dot));
            let (gpre, gpre_dot) = silu_dual_backward(&sv.pre, &sv.pre_dot, &gh, &gh_dot);
            let layer = &block.context[0];
            layer.add_gradient(c0, &sv.q_in, &gpre, true);
            layer.add_gradient(c0, &sv.q_dot_in, &gpre_dot, false);
            add(&mut gq, &layer.backward(&gpre));
            add(&mut gq_dot, &layer.backward(&gpre_dot));
        }
        // Embeddings (their tangent is zero) and filters `[φc, c] [W; b]`, `ψ̇ [W; b]`.
        for (atom, &z) in s.numbers.iter().enumerate() {
            let row = &mut grads.embedding[z as usize * f..(z as usize + 1) * f];
            add(row, &gq[atom * f..(atom + 1) * f]);
        }
        let mut filter = self.filter.zero_gradient();
        self.filter
            .add_gradient(&mut filter, &psi, &gfilters, false);
        self.filter
            .add_gradient(&mut filter, &psi_dot, &gfilters_dot, false);
        debug_assert_eq!(psi.len(), count * rows);
        grads.filter = filter.w;
        grads
    }
}

/// What the reverse pass needs of one block's forward pass, values and tangents.
struct Saved<T> {
    q_in: Vec<T>,
    q_dot_in: Vec<T>,
    pre: Vec<T>,
    pre_dot: Vec<T>,
    h: Vec<T>,
    h_dot: Vec<T>,
    x: Vec<T>,
    x_dot: Vec<T>,
    mu_in: Vec<T>,
    mu_dot_in: Vec<T>,
    mu_mid: Vec<T>,
    mu_dot_mid: Vec<T>,
    vw: Vec<T>,
    vw_dot: Vec<T>,
    norm: Vec<T>,
    norm_dot: Vec<T>,
    inner: Vec<T>,
    inner_dot: Vec<T>,
    context: Vec<T>,
    context_dot: Vec<T>,
    pre_mix: Vec<T>,
    pre_mix_dot: Vec<T>,
    hm: Vec<T>,
    hm_dot: Vec<T>,
    y: Vec<T>,
    y_dot: Vec<T>,
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

/// SiLU `s(z) = z σ(z)` and its tangent `s'(z) ż`.
#[inline(always)]
fn silu_dual<T: Real>(z: &[T], z_dot: &[T]) -> (Vec<T>, Vec<T>) {
    let value = silu(z);
    let tangent = z
        .iter()
        .zip(z_dot)
        .map(|(&z, &zd)| {
            let s = sigmoid(z);
            s * (T::one() + z * (T::one() - s)) * zd
        })
        .collect();
    (value, tangent)
}

/// The adjoints of `z` and `ż` from those of `s(z)` and `s'(z) ż`:
/// `z̄ = h̄ s'(z) + ḣ̄ s''(z) ż`, `ż̄ = ḣ̄ s'(z)`, with `s'' = σ(1 − σ)(2 + z(1 − 2σ))`.
#[inline(always)]
fn silu_dual_backward<T: Real>(z: &[T], z_dot: &[T], g: &[T], g_dot: &[T]) -> (Vec<T>, Vec<T>) {
    let two = T::one() + T::one();
    let mut gz = Vec::with_capacity(z.len());
    let mut gz_dot = Vec::with_capacity(z.len());
    for k in 0..z.len() {
        let (z, zd) = (z[k], z_dot[k]);
        let s = sigmoid(z);
        let first = s * (T::one() + z * (T::one() - s));
        let second = s * (T::one() - s) * (two + z * (T::one() - two * s));
        gz.push(g[k] * first + g_dot[k] * second * zd);
        gz_dot.push(g_dot[k] * first);
    }
    (gz, gz_dot)
}
