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
    let width = channels / groups;
    let count = (pixels * width) as f64;
    // Per image and group: (Σx, Σx²).
    let sums: Vec<(f64, f64)> = (0..batch * groups)
        .into_par_iter()
        .map(|index| {
            let (b, g) = (index / groups, index % groups);
            let image = &values[b * pixels * channels..][..pixels * channels];
            image
                .chunks_exact(channels)
                .flat_map(|pixel| &pixel[g * width..][..width])
                .fold((0.0, 0.0), |(s, q), &v| {
                    (s + v as f64, q + (v as f64) * (v as f64))
                })
        })
        .collect();
    // Per image and channel: x · scale + shift.
    let affine: Vec<(f32, f32)> = (0..batch * channels)
        .map(|index| {
            let (b, c) = (index / channels, index % channels);
            let (sum, squares) = sums[b * groups + c / width];
            let mean = sum / count;
            let variance = (squares / count - mean * mean).max(0.0);
            let scale = gamma[c] as f64 / (variance + eps).sqrt();
            (scale as f32, (beta[c] as f64 - mean * scale) as f32)
        })
        .collect();
    values
        .par_chunks_mut(pixels * channels)
        .zip(affine.par_chunks(channels))
        .for_each(|(image, affine)| {
            for pixel in image.chunks_exact_mut(channels) {
                pixel
                    .iter_mut()
                    .zip(affine)
                    .for_each(|(v, &(scale, shift))| *v = f(*v * scale + shift));
            }
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
        let (shape, groups) = ([2, 7, 8], 4);
        let x: Vec<f32> = (0..2 * 7 * 8)
            .map(|i| ((i * 37 % 23) as f32 - 11.0) * 0.3 + 2.0)
            .collect();
        let gamma: Vec<f32> = (0..8).map(|i| 0.5 + i as f32 * 0.1).collect();
        let beta: Vec<f32> = (0..8).map(|i| i as f32 * -0.2).collect();
        let want = by_definition(&x, shape, groups, &gamma, &beta);
        let mut got = x.clone();
        group_norm_nhwc(&mut got, shape, groups, &gamma, &beta, 1e-5, |v| v);
        for (g, w) in got.iter().zip(&want) {
            assert!((g - w).abs() < 1e-5, "{g} against {w}");
        }
    }
}
