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
