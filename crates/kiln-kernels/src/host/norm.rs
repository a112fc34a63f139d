//! RMSNorm over rows.

use rayon::prelude::*;

use super::{CHUNK, LANES};

/// `x / √(mean(x²) + eps) · weight` for each `weight.len()`-long row of `x` (RMSNorm, the
/// statistics in f32 as transformers' `LlamaRMSNorm` computes them); rows split across rayon's
/// threads.
pub fn rms_norm(x: &[f32], weight: &[f32], eps: f32) -> Vec<f32> {
    let mut out = vec![0f32; x.len()];
    rms_norm_into(&mut out, x, weight, eps);
    out
}

/// [`rms_norm`] written over `out` (as long as `x`), for callers that reuse their buffers.
pub fn rms_norm_into(out: &mut [f32], x: &[f32], weight: &[f32], eps: f32) {
    assert_eq!(
        out.len(),
        x.len(),
        "rms_norm_into: out and x differ in length"
    );
    let width = weight.len().max(1);
    out.par_chunks_mut((CHUNK / width).max(1) * width)
        .zip(x.par_chunks((CHUNK / width).max(1) * width))
        .for_each(|(out, x)| {
            pulp::Arch::new().dispatch(RmsNormRows {
                out,
                x,
                weight,
                eps,
            });
        });
}

/// [`rms_norm`] on one block of rows.
struct RmsNormRows<'a> {
    out: &'a mut [f32],
    x: &'a [f32],
    weight: &'a [f32],
    eps: f32,
}

impl pulp::WithSimd for RmsNormRows<'_> {
    type Output = ();

    #[inline(always)]
    fn with_simd<S: pulp::Simd>(self, _: S) {
        let width = self.weight.len().max(1);
        for (out, x) in self
            .out
            .chunks_exact_mut(width)
            .zip(self.x.chunks_exact(width))
        {
            let mut lanes = [0.0f32; LANES];
            let chunks = x.chunks_exact(LANES);
            let rest: f32 = chunks.remainder().iter().map(|v| v * v).sum();
            for chunk in chunks {
                for (lane, &v) in lanes.iter_mut().zip(chunk) {
                    *lane += v * v;
                }
            }
            let mean = (lanes.iter().sum::<f32>() + rest) / width as f32;
            let inverse = 1.0 / (mean + self.eps).sqrt();
            out.iter_mut()
                .zip(x)
                .zip(self.weight)
                .for_each(|((o, &v), &w)| *o = w * (v * inverse));
        }
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
