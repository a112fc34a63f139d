//! Normalisations: RMSNorm over rows for inference, LayerNorm and RMSNorm as differentiable
//! operations for training ([`RowNorm`]), GroupNorm over NHWC images.

use std::mem::MaybeUninit;

use burn::tensor::Tensor;
use burn::tensor::backend::Backend;
use rayon::prelude::*;

use super::{CHUNK, LANES, as_uninit, written_once};
use crate::host_op::{HostOp, host_op, host_ops_serve};

/// `x / √(mean(x²) + eps) · weight` for each `weight.len()`-long row of `x` (RMSNorm, the
/// statistics in f32 as transformers' `LlamaRMSNorm` computes them); rows split across rayon's
/// threads.
pub fn rms_norm(x: &[f32], weight: &[f32], eps: f32) -> Vec<f32> {
    let norm = RowNorm {
        eps,
        centred: false,
    };
    norm.forward_rows(x, weight, None)
}

/// [`rms_norm`] written over `out` (as long as `x`), for callers that reuse their buffers.
pub fn rms_norm_into(out: &mut [f32], x: &[f32], weight: &[f32], eps: f32) {
    assert_eq!(
        out.len(),
        x.len(),
        "rms_norm_into: out and x differ in length"
    );
    let norm = RowNorm {
        eps,
        centred: false,
    };
    norm.write_rows(as_uninit(out), x, weight, None);
}

/// A normalisation over rows (the last dimension) that training differentiates as one
/// operation: LayerNorm, `γ ⊙ (x − mean) / √(var + eps) (+ β)` with the biased variance, or, not
/// `centred`, RMSNorm, `γ ⊙ x / √(mean(x²) + eps)`. Its statistics are recomputed in the
/// backward pass rather than kept.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RowNorm {
    /// Added to the variance (or the mean square) under the square root.
    pub eps: f32,
    /// Whether each row's mean is taken off first (LayerNorm) or not (RMSNorm).
    pub centred: bool,
}

impl RowNorm {
    /// `x` (`[.., width]`, `width` = `gamma`'s length) normalised, scaled by `gamma` and shifted
    /// by `beta`, as one node of the autodiff graph on `Autodiff<Flex>` in f32 (burn 0.21 runs
    /// LayerNorm there as nine operations, each a pass over the activations, and RMSNorm as
    /// six); `None` on other backends and dtypes, where burn's modules serve.
    ///
    /// ```
    /// # use burn::backend::{Autodiff, Flex};
    /// # use burn::tensor::Tensor;
    /// use kiln_kernels::host::RowNorm;
    ///
    /// let device = Default::default();
    /// let x = Tensor::<Autodiff<Flex>, 2>::from_floats([[1.0, 2.0, 3.0]], &device).require_grad();
    /// let gamma = Tensor::<Autodiff<Flex>, 1>::from_floats([1.0, 1.0, 2.0], &device);
    /// let layer_norm = RowNorm { eps: 0.0, centred: true };
    /// let y = layer_norm.forward(&x, &gamma, None).expect("served on Autodiff<Flex>");
    /// let y = y.into_data().to_vec::<f32>().unwrap();
    /// assert!((y[2] - 2.0 * 1.5f32.sqrt()).abs() < 1e-5);
    /// ```
    pub fn forward<B: Backend, const D: usize>(
        self,
        x: &Tensor<B, D>,
        gamma: &Tensor<B, 1>,
        beta: Option<&Tensor<B, 1>>,
    ) -> Option<Tensor<B, D>> {
        let width = x.dims()[D - 1];
        if !host_ops_serve(x)
            || gamma.dims() != [width]
            || beta.is_some_and(|b| b.dims() != [width])
        {
            return None;
        }
        let row = |t: &Tensor<B, 1>| t.clone().unsqueeze::<D>();
        match beta {
            Some(beta) => host_op(Shifted(self), [x, &row(gamma), &row(beta)], x.dims()),
            None => host_op(self, [x, &row(gamma)], x.dims()),
        }
    }

    /// Each row's mean (0 when not centred) and `1 / √(var + eps)`.
    #[inline(always)]
    fn statistics(self, x: &[f32]) -> (f32, f32) {
        let width = x.len() as f32;
        let mean = match self.centred {
            true => lane_sum(x, x, |v, _| v) / width,
            false => 0.0,
        };
        let variance = lane_sum(x, x, |v, _| (v - mean) * (v - mean)) / width;
        (mean, 1.0 / (variance + self.eps).sqrt())
    }

    /// The rows of `x` normalised, scaled and shifted.
    #[allow(unsafe_code)]
    fn forward_rows(self, x: &[f32], gamma: &[f32], beta: Option<&[f32]>) -> Vec<f32> {
        assert!(
            whole_rows(x, gamma),
            "a row norm's input is not whole rows of its weight's width"
        );
        // SAFETY: `write_rows` writes every value.
        unsafe { written_once(x.len(), |out| self.write_rows(out, x, gamma, beta)) }
    }

    /// [`Self::forward_rows`] written over `out` (as long as `x`), blocks of rows in parallel.
    fn write_rows(
        self,
        out: &mut [MaybeUninit<f32>],
        x: &[f32],
        gamma: &[f32],
        beta: Option<&[f32]>,
    ) {
        let rows = (CHUNK / gamma.len().max(1)).max(1) * gamma.len().max(1);
        out.par_chunks_mut(rows)
            .zip(x.par_chunks(rows))
            .for_each(|(out, x)| {
                pulp::Arch::new().dispatch(NormRows {
                    norm: self,
                    out,
                    x,
                    gamma,
                    beta,
                })
            });
    }

    /// The gradients of `x`, `γ` and `β` (each empty where not `wanted`).
    #[allow(unsafe_code)]
    fn backward_rows(
        self,
        grad: &[f32],
        x: &[f32],
        gamma: &[f32],
        wanted: [bool; 3],
    ) -> [Vec<f32>; 3] {
        let width = gamma.len().max(1);
        let rows = (CHUNK / width).max(1) * width;
        let no_sums = || (vec![0f32; width], vec![0f32; width]);
        let block = |dx: &mut [MaybeUninit<f32>], x: &[f32], grad: &[f32]| {
            let mut sums = no_sums();
            pulp::Arch::new().dispatch(NormRowsBackward {
                norm: self,
                dx,
                x,
                grad,
                gamma,
                sums: (&mut sums.0, &mut sums.1),
                weights: wanted[1] || wanted[2],
            });
            sums
        };
        // Each block's sums, added in the blocks' order: the same sums whatever the threads.
        let mut blocks = Vec::new();
        let write = |dx: &mut [MaybeUninit<f32>]| {
            blocks = match wanted[0] {
                true => (dx.par_chunks_mut(rows).zip(x.par_chunks(rows)))
                    .zip(grad.par_chunks(rows))
                    .map(|((dx, x), grad)| block(dx, x, grad))
                    .collect(),
                false => (x.par_chunks(rows).zip(grad.par_chunks(rows)))
                    .map(|(x, grad)| block(&mut [], x, grad))
                    .collect(),
            }
        };
        assert!(
            whole_rows(x, gamma) && grad.len() == x.len(),
            "a row norm's input and gradient are not whole rows of its weight's width"
        );
        // SAFETY: where `x`'s gradient is wanted each block writes every value of its rows.
        let dx = unsafe { written_once(if wanted[0] { x.len() } else { 0 }, write) };
        let (mut dgamma, mut dbeta) = no_sums();
        for (g, b) in blocks {
            dgamma.iter_mut().zip(g).for_each(|(s, v)| *s += v);
            dbeta.iter_mut().zip(b).for_each(|(s, v)| *s += v);
        }
        let keep = |values: Vec<f32>, wanted: bool| if wanted { values } else { Vec::new() };
        [dx, keep(dgamma, wanted[1]), keep(dbeta, wanted[2])]
    }
}

/// Whether `x` is whole rows as wide as `gamma` (an empty `x` whatever `gamma`).
fn whole_rows(x: &[f32], gamma: &[f32]) -> bool {
    x.is_empty() || (!gamma.is_empty() && x.len().is_multiple_of(gamma.len()))
}

/// Σ f(aᵢ, bᵢ) in [`LANES`] independent sums (which vectorise), then across them.
#[inline(always)]
fn lane_sum(a: &[f32], b: &[f32], f: impl Fn(f32, f32) -> f32) -> f32 {
    let mut lanes = [0f32; LANES];
    let (a_chunks, b_chunks) = (a.chunks_exact(LANES), b.chunks_exact(LANES));
    let rest: f32 = (a_chunks.remainder().iter().zip(b_chunks.remainder()))
        .map(|(&a, &b)| f(a, b))
        .sum();
    for (a, b) in a_chunks.zip(b_chunks) {
        for ((lane, &a), &b) in lanes.iter_mut().zip(a).zip(b) {
            *lane += f(a, b);
        }
    }
    lanes.iter().sum::<f32>() + rest
}

/// [`RowNorm`]'s forward on one block of rows.
struct NormRows<'a> {
    norm: RowNorm,
    out: &'a mut [MaybeUninit<f32>],
    x: &'a [f32],
    gamma: &'a [f32],
    beta: Option<&'a [f32]>,
}

impl pulp::WithSimd for NormRows<'_> {
    type Output = ();

    #[inline(always)]
    fn with_simd<S: pulp::Simd>(self, _: S) {
        let width = self.gamma.len().max(1);
        for (out, x) in self
            .out
            .chunks_exact_mut(width)
            .zip(self.x.chunks_exact(width))
        {
            let (mean, inverse) = self.norm.statistics(x);
            let scaled = out.iter_mut().zip(x).zip(self.gamma);
            match self.beta {
                Some(beta) => scaled.zip(beta).for_each(|(((o, &v), &g), &b)| {
                    o.write(g * ((v - mean) * inverse) + b);
                }),
                None => scaled.for_each(|((o, &v), &g)| {
                    o.write(g * ((v - mean) * inverse));
                }),
            }
        }
    }
}

/// [`RowNorm`]'s backward on one block of rows: `dx = r (ĝ − mean(ĝ) − x̂ mean(ĝ x̂))` with
/// `ĝ = γ ⊙ dy`, `x̂` the normalised row and `r` its `1 / √(var + eps)` (no `mean(ĝ)` when not
/// centred); the block's `Σ dy ⊙ x̂` and `Σ dy` added to `sums`.
struct NormRowsBackward<'a> {
    norm: RowNorm,
    /// Empty when `x`'s gradient is not wanted.
    dx: &'a mut [MaybeUninit<f32>],
    x: &'a [f32],
    grad: &'a [f32],
    gamma: &'a [f32],
    sums: (&'a mut [f32], &'a mut [f32]),
    /// Whether `sums` are wanted.
    weights: bool,
}

impl pulp::WithSimd for NormRowsBackward<'_> {
    type Output = ();

    #[inline(always)]
    fn with_simd<S: pulp::Simd>(self, _: S) {
        let width = self.gamma.len().max(1);
        let (dgamma, dbeta) = self.sums;
        let rows = self
            .x
            .chunks_exact(width)
            .zip(self.grad.chunks_exact(width));
        let mut scaled = vec![0f32; width];
        for (row, (x, grad)) in rows.enumerate() {
            let (mean, inverse) = self.norm.statistics(x);
            if self.weights {
                for (((dg, db), &v), &g) in dgamma.iter_mut().zip(dbeta.iter_mut()).zip(x).zip(grad)
                {
                    *dg += g * ((v - mean) * inverse);
                    *db += g;
                }
            }
            if self.dx.is_empty() {
                continue;
            }
            scaled
                .iter_mut()
                .zip(grad)
                .zip(self.gamma)
                .for_each(|((s, &g), &w)| *s = g * w);
            let n = width as f32;
            let shift = match self.norm.centred {
                true => lane_sum(&scaled, &scaled, |s, _| s) / n,
                false => 0.0,
            };
            let along = lane_sum(&scaled, x, |s, v| s * ((v - mean) * inverse)) / n;
            let dx = &mut self.dx[row * width..][..width];
            dx.iter_mut().zip(&scaled).zip(x).for_each(|((d, &s), &v)| {
                d.write(inverse * (s - shift - (v - mean) * inverse * along));
            });
        }
    }
}

impl HostOp<2> for RowNorm {
    fn forward(&self, [x, gamma]: [&[f32]; 2]) -> Vec<f32> {
        self.forward_rows(x, gamma, None)
    }

    fn backward(&self, grad: &[f32], inputs: [&[f32]; 2]) -> [Vec<f32>; 2] {
        self.backward_wanted(grad, inputs, [true; 2])
    }

    fn backward_wanted(
        &self,
        grad: &[f32],
        [x, gamma]: [&[f32]; 2],
        wanted: [bool; 2],
    ) -> [Vec<f32>; 2] {
        let [dx, dgamma, _] = self.backward_rows(grad, x, gamma, [wanted[0], wanted[1], false]);
        [dx, dgamma]
    }
}

/// [`RowNorm`] with a shift `β` (LayerNorm's bias): inputs `x`, `γ`, `β`.
#[derive(Debug, Clone, Copy)]
struct Shifted(RowNorm);

impl HostOp<3> for Shifted {
    fn forward(&self, [x, gamma, beta]: [&[f32]; 3]) -> Vec<f32> {
        self.0.forward_rows(x, gamma, Some(beta))
    }

    fn backward(&self, grad: &[f32], inputs: [&[f32]; 3]) -> [Vec<f32>; 3] {
        self.backward_wanted(grad, inputs, [true; 3])
    }

    fn backward_wanted(
        &self,
        grad: &[f32],
        [x, gamma, _]: [&[f32]; 3],
        wanted: [bool; 3],
    ) -> [Vec<f32>; 3] {
        self.0.backward_rows(grad, x, gamma, wanted)
    }
}

/// GroupNorm of NHWC `values` (`[batch, pixels, channels]`, `channels` divisible by `groups`) in
/// place, then `f`: each group's mean and variance (biased, as PyTorch's `nn.GroupNorm`) over
/// its channels of every pixel of an image, accumulated in f64; each channel scaled by `gamma`
/// and shifted by `beta`.
#[allow(clippy::too_many_arguments)]
pub fn group_norm_nhwc(
    values: &mut [f32],
    [batch, pixels, channels]: [usize; 3],
    groups: usize,
    gamma: &[f32],
    beta: &[f32],
    eps: f64,
    f: impl Fn(f32) -> f32 + Sync,
) {
    assert_eq!(
        values.len(),
        batch * pixels * channels,
        "group_norm_nhwc: shape"
    );
    assert!(
        groups > 0 && channels % groups == 0,
        "group_norm_nhwc: groups"
    );
    if values.is_empty() {
        return;
    }
    let width = channels / groups;
    let count = (pixels * width) as f64;
    let image_len = pixels * channels;
    // Rows of pixels per parallel piece of an image: about CHUNK values.
    let piece = (CHUNK / channels.max(1)).max(1) * channels;
    // Per image and channel: (Σx, Σx²) over its pixels, in f64, an image's pieces across the
    // threads (a pixel's channels are contiguous: the sums run along them, vectorised, compiled
    // through pulp's dispatch for the CPU's widest SIMD instructions, as the scaling below).
    let sums: Vec<Vec<(f64, f64)>> = values
        .par_chunks(image_len.max(1))
        .map(|image| {
            image
                .par_chunks(piece)
                .map(|rows| {
                    let (mut sums, mut squares) = (vec![0f64; channels], vec![0f64; channels]);
                    pulp::Arch::new().dispatch(
                        #[inline(always)]
                        || {
                            for pixel in rows.chunks_exact(channels) {
                                for ((s, q), &v) in sums.iter_mut().zip(&mut squares).zip(pixel) {
                                    let v = v as f64;
                                    *s += v;
                                    *q += v * v;
                                }
                            }
                        },
                    );
                    sums.into_iter().zip(squares).collect::<Vec<_>>()
                })
                .reduce(
                    || vec![(0.0, 0.0); channels],
                    |mut a, b| {
                        a.iter_mut()
                            .zip(b)
                            .for_each(|(a, b)| *a = (a.0 + b.0, a.1 + b.1));
                        a
                    },
                )
        })
        .collect();
    // Per image and channel: x · scale + shift.
    let affine: Vec<(f32, f32)> = (0..batch * channels)
        .map(|index| {
            let (b, c) = (index / channels, index % channels);
            let group = &sums[b][c / width * width..][..width];
            let (sum, squares) = group
                .iter()
                .fold((0.0, 0.0), |(s, q), &(a, b)| (s + a, q + b));
            let mean = sum / count;
            let variance = (squares / count - mean * mean).max(0.0);
            let scale = gamma[c] as f64 / (variance + eps).sqrt();
            (scale as f32, (beta[c] as f64 - mean * scale) as f32)
        })
        .collect();
    values
        .par_chunks_mut(image_len.max(1))
        .zip(affine.par_chunks(channels))
        .for_each(|(image, affine)| {
            image.par_chunks_mut(piece).for_each(|rows| {
                pulp::Arch::new().dispatch(
                    #[inline(always)]
                    || {
                        for pixel in rows.chunks_exact_mut(channels) {
                            pixel
                                .iter_mut()
                                .zip(affine)
                                .for_each(|(v, &(scale, shift))| *v = f(*v * scale + shift));
                        }
                    },
                )
            });
        });
}

#[cfg(test)]
mod tests {
    use super::*;

    /// [`RowNorm`] against burn's `LayerNorm` (with and without its bias) and `RmsNorm` on the
    /// same backend: values and the gradients of `x`, `γ` and `β` under a weighted sum, rows of
    /// an odd width (remainders of the vector lanes) with a large mean.
    #[cfg(feature = "flex")]
    #[test]
    fn row_norms_match_burns_values_and_gradients() {
        use burn::backend::{Autodiff, Flex};
        use burn::module::Param;
        use burn::nn::{LayerNormConfig, RmsNormConfig};
        use burn::tensor::Distribution::Normal;
        type Ad = Autodiff<Flex>;
        let device = Default::default();
        let width = 53;
        let x = Tensor::<Ad, 3>::random([3, 37, width], Normal(4.0, 2.0), &device).require_grad();
        let gamma = Tensor::<Ad, 1>::random([width], Normal(1.0, 0.5), &device).require_grad();
        let beta = Tensor::<Ad, 1>::random([width], Normal(0.0, 0.5), &device).require_grad();
        let weights = Tensor::<Ad, 3>::random([3, 37, width], Normal(0.0, 1.0), &device);
        let eps = 1e-5;
        for (centred, shifted) in [(true, true), (true, false), (false, false)] {
            let norm = RowNorm { eps, centred };
            let ours = norm
                .forward(&x, &gamma, shifted.then_some(&beta))
                .expect("served");
            let burns = if centred {
                let mut layer = LayerNormConfig::new(width)
                    .with_epsilon(eps.into())
                    .with_bias(shifted)
                    .init::<Ad>(&device);
                layer.gamma = Param::from_tensor(gamma.clone());
                layer.beta = shifted.then(|| Param::from_tensor(beta.clone()));
                layer.forward(x.clone())
            } else {
                let mut rms = RmsNormConfig::new(width)
                    .with_epsilon(eps.into())
                    .init::<Ad>(&device);
                rms.gamma = Param::from_tensor(gamma.clone());
                rms.forward(x.clone())
            };
            let largest = |t: Tensor<Flex, 1>| t.abs().max().into_scalar();
            let close = |ours: Tensor<Flex, 1>, burns: Tensor<Flex, 1>, what: &str| {
                let diff = largest(ours - burns.clone());
                let bound = 2e-5 * largest(burns);
                assert!(
                    diff <= bound,
                    "{what} (centred {centred}): {diff} > {bound}"
                );
            };
            let flat = |t: Tensor<Ad, 3>| t.inner().flatten::<1>(0, 2);
            close(flat(ours.clone()), flat(burns.clone()), "values");
            let grads = |y: Tensor<Ad, 3>| (y * weights.clone()).sum().backward();
            let (ours, burns) = (grads(ours), grads(burns));
            let dx = |g| x.grad(g).expect("x's gradient").flatten::<1>(0, 2);
            close(dx(&ours), dx(&burns), "dx");
            let dgamma = |g| gamma.grad(g).expect("γ's gradient");
            close(dgamma(&ours), dgamma(&burns), "dγ");
            if shifted {
                let dbeta = |g| beta.grad(g).expect("β's gradient");
                close(dbeta(&ours), dbeta(&burns), "dβ");
            }
        }
    }

    /// The weights' gradients are sums over every row: added in the same order whatever the
    /// threads, so that a training run is reproducible (a resumed run equals the uninterrupted
    /// one): bit-identical on one thread and on three.
    #[test]
    fn row_norm_gradients_do_not_depend_on_the_threads() {
        let width = 96;
        let x: Vec<f32> = (0..700 * width)
            .map(|i| (i as f32 * 0.37).sin() * 3.0)
            .collect();
        let grad: Vec<f32> = (0..x.len()).map(|i| (i as f32 * 0.11).cos()).collect();
        let gamma: Vec<f32> = (0..width).map(|i| 1.0 + i as f32 / 100.0).collect();
        let norm = RowNorm {
            eps: 1e-5,
            centred: true,
        };
        let on = |threads| {
            let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build();
            let pool = pool.expect("a thread pool");
            pool.install(|| norm.backward_rows(&grad, &x, &gamma, [true; 3]))
        };
        let bits = |g: [Vec<f32>; 3]| g.map(|v| v.iter().map(|v| v.to_bits()).collect::<Vec<_>>());
        assert_eq!(bits(on(1)), bits(on(3)));
    }

    /// GroupNorm by its definition, two passes per image and group, over NHWC values.
    fn by_definition(
        x: &[f32],
        [b, p, c]: [usize; 3],
        groups: usize,
        gamma: &[f32],
        beta: &[f32],
    ) -> Vec<f32> {
        let width = c / groups;
        let mut out = x.to_vec();
        for n in 0..b {
            for g in 0..groups {
                let at = |i: usize, k: usize| (n * p + i) * c + g * width + k;
                let items: Vec<f64> = (0..p)
                    .flat_map(|i| (0..width).map(move |k| (i, k)))
                    .map(|(i, k)| x[at(i, k)] as f64)
                    .collect();
                let mean = items.iter().sum::<f64>() / items.len() as f64;
                let var =
                    items.iter().map(|v| (v - mean) * (v - mean)).sum::<f64>() / items.len() as f64;
                for i in 0..p {
                    for k in 0..width {
                        let ch = g * width + k;
                        let v = (x[at(i, k)] as f64 - mean) / (var + 1e-5).sqrt();
                        out[at(i, k)] = (v * gamma[ch] as f64 + beta[ch] as f64) as f32;
                    }
                }
            }
        }
        out
    }

    #[test]
    fn group_norm_over_nhwc_is_the_definition() {
        // A few pixels, and images of several pieces each (the statistics summed across them).
        for (shape, groups) in [([2, 7, 8], 4), ([3, 5000, 8], 2)] {
            let [b, p, c] = shape;
            let x: Vec<f32> = (0..b * p * c)
                .map(|i| ((i * 37 % 23) as f32 - 11.0) * 0.3 + 2.0 + (i / (p * c)) as f32)
                .collect();
            let gamma: Vec<f32> = (0..c).map(|i| 0.5 + i as f32 * 0.1).collect();
            let beta: Vec<f32> = (0..c).map(|i| i as f32 * -0.2).collect();
            let want = by_definition(&x, shape, groups, &gamma, &beta);
            let mut got = x.clone();
            group_norm_nhwc(&mut got, shape, groups, &gamma, &beta, 1e-5, |v| v);
            for (g, w) in got.iter().zip(&want) {
                assert!((g - w).abs() < 1e-5, "{g} against {w}");
            }
        }
    }
}
