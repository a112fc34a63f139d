//! Elementwise kernels over a product's rows: bias + activation, and SwiGLU's gate.

use rayon::prelude::*;

use super::CHUNK;
use crate::math::silu;

/// `f(v + bias[c])` for every element `v` in column `c` of `values`, a row-major matrix of
/// `bias.len()` columns, in place; rows split across rayon's threads.
pub fn add_bias_map(values: &mut [f32], bias: &[f32], f: impl Fn(f32) -> f32 + Sync) {
    let width = bias.len().max(1);
    values
        .par_chunks_mut((CHUNK / width).max(1) * width)
        .for_each(|values| {
            pulp::Arch::new().dispatch(BiasMap {
                values,
                bias,
                f: &f,
            });
        });
}

/// [`add_bias_map`] on one block of rows, compiled (through `pulp`'s dispatch, which needs the
/// work inlined into it) for the best SIMD instruction set the CPU has.
struct BiasMap<'a, F> {
    values: &'a mut [f32],
    bias: &'a [f32],
    f: &'a F,
}

impl<F: Fn(f32) -> f32> pulp::WithSimd for BiasMap<'_, F> {
    type Output = ();

    #[inline(always)]
    fn with_simd<S: pulp::Simd>(self, _: S) {
        for row in self.values.chunks_exact_mut(self.bias.len().max(1)) {
            row.iter_mut()
                .zip(self.bias)
                .for_each(|(v, b)| *v = (self.f)(*v + b));
        }
    }
}

/// `out[i] = f(a[i], b[i])`, in chunks across rayon's threads, each compiled as [`BiasMap`] is.
pub(crate) fn zip_map(out: &mut [f32], a: &[f32], b: &[f32], f: impl Fn(f32, f32) -> f32 + Sync) {
    assert!(
        a.len() == out.len() && b.len() == out.len(),
        "zip_map: lengths differ"
    );
    (out.par_chunks_mut(CHUNK).zip(a.par_chunks(CHUNK)))
        .zip(b.par_chunks(CHUNK))
        .for_each(|((out, a), b)| pulp::Arch::new().dispatch(ZipMap { out, a, b, f: &f }));
}

/// [`zip_map`] on one chunk.
struct ZipMap<'a, F> {
    out: &'a mut [f32],
    a: &'a [f32],
    b: &'a [f32],
    f: &'a F,
}

impl<F: Fn(f32, f32) -> f32> pulp::WithSimd for ZipMap<'_, F> {
    type Output = ();

    #[inline(always)]
    fn with_simd<S: pulp::Simd>(self, _: S) {
        (self.out.iter_mut().zip(self.a).zip(self.b))
            .for_each(|((out, &a), &b)| *out = (self.f)(a, b));
    }
}

/// SwiGLU's `silu(gate) ⊙ up` of rows holding `[gate | up]` side by side (`2 · width` columns,
/// as one product of the two projections leaves them): `[rows, width]`, split across rayon's
/// threads.
pub fn swiglu(gate_up: &[f32], width: usize) -> Vec<f32> {
    let mut out = vec![0f32; gate_up.len() / 2];
    swiglu_into(&mut out, gate_up, width);
    out
}

/// [`swiglu`] written over `out` (half as long as `gate_up`), for callers that reuse their
/// buffers.
pub fn swiglu_into(out: &mut [f32], gate_up: &[f32], width: usize) {
    assert_eq!(
        2 * out.len(),
        gate_up.len(),
        "swiglu_into: out is not half of gate_up"
    );
    let width = width.max(1);
    let rows_per_task = (CHUNK / width).max(1);
    out.par_chunks_mut(rows_per_task * width)
        .zip(gate_up.par_chunks(rows_per_task * 2 * width))
        .for_each(|(out, gate_up)| {
            pulp::Arch::new().dispatch(SwigluRows {
                out,
                gate_up,
                width,
            });
        });
}

/// [`swiglu`] on one block of rows.
struct SwigluRows<'a> {
    out: &'a mut [f32],
    gate_up: &'a [f32],
    width: usize,
}

impl pulp::WithSimd for SwigluRows<'_> {
    type Output = ();

    #[inline(always)]
    fn with_simd<S: pulp::Simd>(self, _: S) {
        for (out, row) in self
            .out
            .chunks_exact_mut(self.width)
            .zip(self.gate_up.chunks_exact(2 * self.width))
        {
            let (gate, up) = row.split_at(self.width);
            out.iter_mut()
                .zip(gate.iter().zip(up))
                .for_each(|(o, (&g, &u))| *o = silu(g) * u);
        }
    }
}
