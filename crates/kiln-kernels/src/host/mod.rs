//! f32 kernels for the host backends (Flex, NdArray): bias + activation and SwiGLU
//! (`elementwise`), RMSNorm (`norm`), the rows' softmax (`softmax`) and attention with its
//! backward (`attention`), convolutions over NHWC images as products (`conv`) and through
//! Winograd's minimal filtering (`winograd`).
//!
//! burn 0.21's host backends evaluate `exp`, `tanh`, `erf` and `sigmoid` one element at a time
//! on one thread through the C library: on a ViT-B/16 batch the MLP activation took longer than
//! the matrix product before it. Here each element goes through a branch-free polynomial that
//! the compiler vectorises for the widest instruction set the CPU has (chosen at run time through
//! `pulp`: AVX-512 or AVX2 + FMA on x86-64, NEON on ARM), in place on the product it follows, and
//! the work is split across rayon's threads. Accuracy: `exp` within 2 × 10⁻⁷ relative, `erf`
//! within 1.5 × 10⁻⁷ absolute (Abramowitz & Stegun 7.1.26), both below f32's own rounding of the
//! activations they feed.

mod attention;
pub mod conv;
mod elementwise;
mod norm;
mod softmax;
pub mod winograd;

use burn::tensor::backend::Backend;
use burn::tensor::{DType, Tensor, TensorData};
use kiln_core::is_host_backend;

pub use attention::{
    AttentionOp, Heads, ProbsDropout, RotaryAngles, Rows, attention, attention_into,
};
pub(crate) use elementwise::zip_map;
pub use elementwise::{add_bias_map, swiglu, swiglu_into};
pub use norm::{RowNorm, group_norm_nhwc, rms_norm, rms_norm_into};

pub use crate::math::{exp, gelu, gelu_tanh, quick_gelu, silu, tanh};

/// Whether `x` is an f32 tensor of a host backend without autodiff, which these kernels serve
/// (they read and write the values directly, which would cut a gradient's path).
pub fn serves<B: Backend, const D: usize>(x: &Tensor<B, D>) -> bool {
    let device = x.device();
    x.dtype() == DType::F32 && is_host_backend::<B>(&device) && !B::ad_enabled(&device)
}

/// The values of an f32 tensor's data.
pub fn f32s(data: &TensorData) -> &[f32] {
    data.as_slice::<f32>()
        .expect("host kernels are only used on f32 tensors")
}

/// The `cols × rows` transpose of a row-major `rows × cols` matrix, in 32 × 32 blocks (one
/// cache line of each of 32 rows at a time).
pub fn transposed(values: &[f32], rows: usize, cols: usize) -> Vec<f32> {
    const BLOCK: usize = 32;
    assert_eq!(values.len(), rows * cols, "transposed: shape");
    let mut out = vec![0f32; rows * cols];
    for r0 in (0..rows).step_by(BLOCK) {
        for c0 in (0..cols).step_by(BLOCK) {
            for r in r0..(r0 + BLOCK).min(rows) {
                for c in c0..(c0 + BLOCK).min(cols) {
                    out[c * rows + r] = values[r * cols + c];
                }
            }
        }
    }
    out
}

/// A new vector of `len` values, `write` given its uninitialised memory: for outputs that a
/// kernel writes in full (a product's tiles, a transform's tiles), which so need no zeroing
/// first (a pass of its own over megabytes, on memory the kernel may have to fault in).
///
/// # Safety
/// `write` initialises every one of the `len` values.
#[allow(unsafe_code)]
pub(crate) unsafe fn written_once(
    len: usize,
    write: impl FnOnce(&mut [std::mem::MaybeUninit<f32>]),
) -> Vec<f32> {
    let mut values = Vec::with_capacity(len);
    write(&mut values.spare_capacity_mut()[..len]);
    // SAFETY: `write` initialised the first `len` values, as the caller promises.
    unsafe { values.set_len(len) };
    values
}

/// `c` viewed as values that may be uninitialised, for a kernel that writes only initialised
/// values into it (a product's tiles, a transform's tiles) and so keeps it initialised.
#[allow(unsafe_code)]
pub(crate) fn as_uninit(c: &mut [f32]) -> &mut [std::mem::MaybeUninit<f32>] {
    // SAFETY: `MaybeUninit<f32>` has `f32`'s layout; the kernels given the view store only
    // initialised values through it, so `c` stays initialised.
    unsafe { &mut *(std::ptr::from_mut(c) as *mut [std::mem::MaybeUninit<f32>]) }
}

/// Elements per parallel task: large enough to amortise scheduling, small enough to balance.
const CHUNK: usize = 1 << 14;

/// Lanes of the partial reductions: enough independent accumulators for the compiler to keep
/// them in one vector register (eight f32 lanes of AVX2).
const LANES: usize = 8;

/// The largest element of `row` (vectorisable: per-lane maxima, then across lanes).
#[inline(always)]
fn row_max(row: &[f32]) -> f32 {
    reduce(row, f32::NEG_INFINITY, |m, v| if v > m { v } else { m })
}

/// The sum of `row` (vectorisable: per-lane sums, then across lanes).
#[inline(always)]
fn row_sum(row: &[f32]) -> f32 {
    reduce(row, 0.0, |sum, v| sum + v)
}

/// `row` folded by `step` from `start`, vectorisable: first in four vectors of [`LANES`]
/// accumulators (two AVX-512 registers, four AVX2 ones), so that neighbouring chunks' steps do
/// not wait on each other (one vector of eight made a softmax row's max and sum wait on the add
/// latency: 40 µs for 256 rows of 256 on a Sapphire Rapids core), then in one vector, then one
/// value at a time.
#[inline(always)]
fn reduce(row: &[f32], start: f32, step: impl Fn(f32, f32) -> f32) -> f32 {
    let mut wide = [start; 4 * LANES];
    let mut chunks = row.chunks_exact(4 * LANES);
    for chunk in &mut chunks {
        for (lane, &v) in wide.iter_mut().zip(chunk) {
            *lane = step(*lane, v);
        }
    }
    let mut lanes = [start; LANES];
    for vector in wide.chunks_exact(LANES) {
        for (lane, &v) in lanes.iter_mut().zip(vector) {
            *lane = step(*lane, v);
        }
    }
    let mut rest = chunks.remainder().chunks_exact(LANES);
    for chunk in &mut rest {
        for (lane, &v) in lanes.iter_mut().zip(chunk) {
            *lane = step(*lane, v);
        }
    }
    (rest.remainder().iter().chain(&lanes)).fold(start, |folded, &v| step(folded, v))
}

#[cfg(test)]
mod tests {
    use super::attention::ATTENTION_ROWS;
    use super::*;
    use crate::gemm::Products;

    /// The largest error of `ours` against `reference` (computed in f64) on a dense grid over
    /// |x| ≤ 20, relative to max(1, |reference|) (`relative`: to |reference|).
    fn worst(ours: impl Fn(f32) -> f32, reference: impl Fn(f64) -> f64, relative: bool) -> f64 {
        (-200_000..=200_000)
            .map(|i| i as f32 * 1e-4)
            .map(|x| {
                let (got, want) = (ours(x) as f64, reference(x as f64));
                let scale = if relative {
                    want.abs()
                } else {
                    want.abs().max(1.0)
                };
                (got - want).abs() / scale
            })
            .fold(0.0, f64::max)
    }

    /// erf in f64: its Maclaurin series below 3, the asymptotic series of erfc above.
    fn erf64(x: f64) -> f64 {
        let z = x.abs();
        if z >= 3.0 {
            let z2 = z * z;
            let series =
                1.0 - 1.0 / (2.0 * z2) + 3.0 / (4.0 * z2 * z2) - 15.0 / (8.0 * z2 * z2 * z2);
            let erfc = (-z2).exp() / (z * std::f64::consts::PI.sqrt()) * series;
            return x.signum() * (1.0 - erfc);
        }
        let (mut term, mut sum, mut k) = (x, x, 0.0);
        while term.abs() > 1e-17 {
            k += 1.0;
            term *= -x * x / k;
            sum += term / (2.0 * k + 1.0);
        }
        sum * 2.0 / std::f64::consts::PI.sqrt()
    }

    /// The attention operation's values and its q, k and v gradients against burn's autodiff
    /// through the same attention written as tensor operations, with and without a dropout
    /// mask on the probabilities; keys of another length than queries.
    #[test]
    fn the_attention_operation_differentiates_as_burn_does() {
        use burn::backend::{Autodiff, Flex};
        use burn::tensor::Distribution;
        use burn::tensor::activation::softmax;
        type Ad = Autodiff<Flex>;

        let device = Default::default();
        let (batch, heads, head_dim, q_tokens, kv_tokens) = (3, 2, 5, 7, 9);
        let width = heads * head_dim;
        let scale = 0.37;
        let normal = |shape: [usize; 3]| {
            Tensor::<Ad, 3>::random(shape, Distribution::Normal(0.0, 1.0), &device).require_grad()
        };
        let query = normal([batch, q_tokens, width]);
        let (key, value) = (
            normal([batch, kv_tokens, width]),
            normal([batch, kv_tokens, width]),
        );
        let weights =
            Tensor::<Ad, 3>::random([batch, q_tokens, width], Distribution::Default, &device);
        let drops: Vec<f32> = (0..batch * heads * q_tokens * kv_tokens)
            .map(|i| if i % 3 == 1 { 0.0 } else { 1.5 })
            .collect();
        for mask in [None, Some(drops)] {
            let op = AttentionOp {
                scale,
                mask: mask.clone().map(Into::into),
                ..AttentionOp::new(batch, heads, head_dim, q_tokens, kv_tokens)
            };
            let ours = crate::host_op(op, [&query, &key, &value], [batch, q_tokens, width])
                .expect("served on Autodiff<Flex>");
            let split = |x: Tensor<Ad, 3>| {
                let tokens = x.dims()[1];
                x.reshape([batch, tokens, heads, head_dim]).swap_dims(1, 2)
            };
            let mut probs = softmax(
                split(query.clone()).matmul(split(key.clone()).swap_dims(2, 3)) * scale,
                3,
            );
            if let Some(mask) = &mask {
                let data = TensorData::new(mask.clone(), [batch, heads, q_tokens, kv_tokens]);
                probs = probs * Tensor::from_data(data, &device);
            }
            let burns = probs
                .matmul(split(value.clone()))
                .swap_dims(1, 2)
                .reshape([batch, q_tokens, width]);
            let rows = Tensor::ones([batch, q_tokens, 1], &device);
            same_values_and_gradients([ours, burns], &weights, &rows, [&query, &key, &value]);
        }
    }

    /// The operation with grouped-query heads, causal masking, left padding and rotary angles
    /// against burn's autodiff through the same attention written as tensor operations (the
    /// rotation by `rotate_half`, the key/value heads repeated, an additive mask): values on
    /// the rows that see a key, and the q, k and v gradients of a loss on those rows.
    #[test]
    fn causal_grouped_rotary_attention_differentiates_as_burn_does() {
        use burn::backend::{Autodiff, Flex};
        use burn::tensor::Distribution;
        use burn::tensor::activation::softmax;
        type Ad = Autodiff<Flex>;

        let device = Default::default();
        let (batch, heads, kv_heads, head_dim, tokens) = (2, 6, 2, 4, 11);
        let (width, half, padding) = (heads * head_dim, head_dim / 2, 3);
        let scale = 0.45;
        let normal = |heads: usize| {
            let shape = [batch, tokens, heads * head_dim];
            Tensor::<Ad, 3>::random(shape, Distribution::Normal(0.0, 1.0), &device).require_grad()
        };
        let (query, key, value) = (normal(heads), normal(kv_heads), normal(kv_heads));
        // Image 0's first `padding` tokens are padding; its first queries see no key.
        let real: Vec<bool> = (0..batch * tokens).map(|i| i >= padding).collect();
        let angles: Vec<f32> = (0..batch * tokens * half)
            .map(|i| (i as f32 * 0.9).sin() * 2.0)
            .collect();
        let table = |f: fn(f32) -> f32| -> Vec<f32> {
            (angles.chunks(half))
                .flat_map(|row| row.iter().chain(row).map(|&a| f(a)))
                .collect()
        };
        let (cos, sin) = (table(f32::cos), table(f32::sin));
        let op = AttentionOp {
            scale,
            ..AttentionOp::new(batch, heads, head_dim, tokens, tokens)
        };
        let op = self_attention(op, kv_heads, &real, (&cos, &sin));
        let ours = crate::host_op(op, [&query, &key, &value], [batch, tokens, width])
            .expect("served on Autodiff<Flex>");

        let tensor = |values: Vec<f32>, shape: [usize; 4]| {
            Tensor::<Ad, 4>::from_data(TensorData::new(values, shape), &device)
        };
        let (cos, sin) = (
            tensor(cos, [batch, tokens, 1, head_dim]),
            tensor(sin, [batch, tokens, 1, head_dim]),
        );
        // [batch, tokens, heads · head_dim] → [batch, heads, tokens, head_dim], rotated or not.
        let split = |x: Tensor<Ad, 3>, heads: usize, rotate: bool| {
            let x = x.reshape([batch, tokens, heads, head_dim]);
            let x = if rotate {
                let first = x.clone().slice([0..batch, 0..tokens, 0..heads, 0..half]);
                let second = x
                    .clone()
                    .slice([0..batch, 0..tokens, 0..heads, half..head_dim]);
                let turned = Tensor::cat(vec![second.neg(), first], 3);
                x * cos.clone() + turned * sin.clone()
            } else {
                x
            };
            x.swap_dims(1, 2)
        };
        let repeat = |x: Tensor<Ad, 4>| {
            x.unsqueeze_dim::<5>(2)
                .repeat_dim(2, heads / kv_heads)
                .reshape([batch, heads, tokens, head_dim])
        };
        let mut bias = Vec::new();
        for image in 0..batch {
            for query in 0..tokens {
                bias.extend((0..tokens).map(|key| {
                    let seen = real[image * tokens + key] && key <= query;
                    if seen { 0.0 } else { f32::MIN }
                }));
            }
        }
        let bias = tensor(bias, [batch, 1, tokens, tokens]);
        let scores = split(query.clone(), heads, true)
            .matmul(repeat(split(key.clone(), kv_heads, true)).swap_dims(2, 3));
        let burns = softmax(scores * scale + bias, 3)
            .matmul(repeat(split(value.clone(), kv_heads, false)))
            .swap_dims(1, 2)
            .reshape([batch, tokens, width]);

        // The rows that see a key: all but image 0's padding queries.
        let seeing: Vec<f32> = (0..batch * tokens)
            .map(|i| if real[i] { 1.0 } else { 0.0 })
            .collect();
        let seeing =
            Tensor::<Ad, 3>::from_data(TensorData::new(seeing, [batch, tokens, 1]), &device);
        let weights =
            Tensor::<Ad, 3>::random([batch, tokens, width], Distribution::Default, &device);
        let padded_rows = ours.clone().inner().slice([0..1, 0..padding, 0..width]);
        assert_eq!(padded_rows.abs().max().into_scalar(), 0.0);
        same_values_and_gradients([ours, burns], &weights, &seeing, [&query, &key, &value]);
    }

    /// `op` as a language model's self-attention: grouped over `kv_heads`, causal, over `real`
    /// keys, turned by the angles `cos` and `sin`.
    fn self_attention(
        op: AttentionOp,
        kv_heads: usize,
        real: &[bool],
        (cos, sin): (&[f32], &[f32]),
    ) -> AttentionOp {
        AttentionOp {
            kv_heads,
            causal: true,
            real_keys: Some(real.into()),
            rotary: Some(RotaryAngles {
                cos: cos.into(),
                sin: sin.into(),
            }),
            ..op
        }
    }

    /// The operation after `past` cached keys (given already turned, as a cache holds them)
    /// computes, for the new queries, what it computes over the whole sequence: the same
    /// outputs, and the same q, k and v gradients of a loss on the new rows (the cached keys'
    /// k gradient is taken after their rotation, so only the new keys' is compared).
    #[test]
    fn attention_after_a_cached_prefix_is_attention_over_the_whole_sequence() {
        use crate::HostOp;
        use crate::rotary::{self, Angles, Turn};
        let (batch, heads, kv_heads, head_dim, past, new) = (2, 4, 2, 4, 5, 6);
        let tokens = past + new;
        let (width, kv_width) = (heads * head_dim, kv_heads * head_dim);
        let values = |n: usize, seed: usize| -> Vec<f32> {
            (0..n)
                .map(|i| ((((i + seed) * 7919) % 23) as f32 * 0.37 - 4.0) * 0.3)
                .collect()
        };
        let (q, k, v) = (
            values(batch * tokens * width, 1),
            values(batch * tokens * kv_width, 2),
            values(batch * tokens * kv_width, 3),
        );
        let angles: Vec<f32> = (0..batch * tokens * head_dim)
            .map(|i| ((i / head_dim) % tokens) as f32 * 0.3 + (i % head_dim) as f32 * 0.1)
            .collect();
        let (cos, sin): (Vec<f32>, Vec<f32>) = angles.iter().map(|a| (a.cos(), a.sin())).unzip();
        // Image 1's second token is padding.
        let real: Vec<bool> = (0..batch * tokens).map(|i| i != tokens + 1).collect();
        let whole = AttentionOp::new(batch, heads, head_dim, tokens, tokens);
        let whole = self_attention(whole, kv_heads, &real, (&cos, &sin));
        // The new rows of each image, and the cached keys turned as a cache holds them.
        let rows_from = |x: &[f32], width: usize, first: usize| -> Vec<f32> {
            (x.chunks_exact(tokens * width))
                .flat_map(|image| image[first * width..].to_vec())
                .collect()
        };
        let mut cached_k = k.clone();
        let all = Angles {
            cos: &cos,
            sin: &sin,
        };
        rotary::rotate_rows(&mut cached_k, kv_width, 0, kv_heads, all, Turn::Forward);
        let k_after: Vec<f32> = (cached_k.chunks_exact(tokens * kv_width))
            .zip(k.chunks_exact(tokens * kv_width))
            .flat_map(|(turned, raw)| {
                [&turned[..past * kv_width], &raw[past * kv_width..]].concat()
            })
            .collect();
        let after = AttentionOp {
            past,
            ..AttentionOp::new(batch, heads, head_dim, new, tokens)
        };
        let new_angles = (
            rows_from(&cos, head_dim, past),
            rows_from(&sin, head_dim, past),
        );
        let after = self_attention(after, kv_heads, &real, (&new_angles.0, &new_angles.1));
        let q_new = rows_from(&q, width, past);
        let close = |ours: &[f32], want: &[f32], what: &str| {
            assert_eq!(ours.len(), want.len(), "{what}");
            let scale = want.iter().fold(1f32, |m, x| m.max(x.abs()));
            let diff = ours
                .iter()
                .zip(want)
                .fold(0f32, |m, (a, b)| m.max((a - b).abs()));
            assert!(diff <= 1e-5 * scale, "{what}: {diff}");
        };
        let got = after.forward([&q_new, &k_after, &v]);
        let want = whole.forward([&q, &k, &v]);
        close(&got, &rows_from(&want, width, past), "values");
        // A loss on the new rows only.
        let grad_new = values(batch * new * width, 4);
        let grad_whole: Vec<f32> = (grad_new.chunks_exact(new * width))
            .flat_map(|image| [vec![0.0; past * width], image.to_vec()].concat())
            .collect();
        let [dq, dk, dv] = after.backward(&grad_new, [&q_new, &k_after, &v]);
        let [dq_whole, dk_whole, dv_whole] = whole.backward(&grad_whole, [&q, &k, &v]);
        close(&dq, &rows_from(&dq_whole, width, past), "q");
        let new_keys = |dk: &[f32]| rows_from(dk, kv_width, past);
        close(&new_keys(&dk), &new_keys(&dk_whole), "k");
        close(&dv, &dv_whole, "v");
    }

    type Trained = burn::backend::Autodiff<burn::backend::Flex>;

    /// `ours` and `burns` agree on the rows `rows` marks (`[batch, tokens, 1]`, 0 or 1), within
    /// 1e-5 of the largest value, and so do the q, k and v gradients of `Σ rows ⊙ weights ⊙ y`.
    fn same_values_and_gradients(
        [ours, burns]: [Tensor<Trained, 3>; 2],
        weights: &Tensor<Trained, 3>,
        rows: &Tensor<Trained, 3>,
        inputs: [&Tensor<Trained, 3>; 3],
    ) {
        use burn::backend::Flex;
        let max = |t: Tensor<Flex, 3>| t.abs().max().into_scalar();
        let close = |ours: Tensor<Flex, 3>, burns: Tensor<Flex, 3>, what: &str| {
            let diff = max(ours - burns.clone());
            assert!(diff <= 1e-5 * max(burns), "{what}: {diff}");
        };
        let on_rows = |x: &Tensor<Trained, 3>| (x.clone() * rows.clone()).inner();
        close(on_rows(&ours), on_rows(&burns), "values");
        let grads = |y: Tensor<Trained, 3>| {
            let grads = (y * weights.clone() * rows.clone()).sum().backward();
            inputs.map(|x| x.grad(&grads).expect("a gradient"))
        };
        for ((ours, burns), name) in grads(ours)
            .into_iter()
            .zip(grads(burns))
            .zip(["q", "k", "v"])
        {
            close(ours, burns, name);
        }
    }

    /// The operation with bf16 products against the same operation in f32, on images long
    /// enough for them (260 queries against 290 keys, partial blocks of 32): the values and the
    /// q, k and v gradients within bf16's rounding of the f32 ones (‖Δ‖ ≤ 2⁻⁶ ‖f32‖, each value
    /// within 2⁻⁵ of the largest), and not the f32 ones (bf16 ran); with dropout's
    /// multipliers, and causal grouped-query attention over padded keys with rotary angles.
    #[test]
    fn bf16_attention_differentiates_as_f32_within_rounding() {
        for_bf16_attention(|| {
            use burn::tensor::Distribution;
            let device = Default::default();
            let (batch, head_dim, q_tokens, kv_tokens) = (2, 32, 260, 290);
            let normal = |tokens: usize, heads: usize| {
                let shape = [batch, tokens, heads * head_dim];
                Tensor::<Trained, 3>::random(shape, Distribution::Normal(0.0, 1.0), &device)
                    .require_grad()
            };
            let drops: Vec<f32> = (0..batch * 2 * q_tokens * kv_tokens)
                .map(|i| if i % 7 == 3 { 0.0 } else { 1.1 })
                .collect();
            let dropped = AttentionOp {
                mask: Some(drops.into()),
                ..AttentionOp::new(batch, 2, head_dim, q_tokens, kv_tokens)
            };
            let inputs = [
                normal(q_tokens, 2),
                normal(kv_tokens, 2),
                normal(kv_tokens, 2),
            ];
            bf16_close_to_f32(dropped, &inputs);

            let real: Vec<bool> = (0..batch * q_tokens).map(|i| i % q_tokens >= 5).collect();
            let angles: Vec<f32> = (0..batch * q_tokens * head_dim)
                .map(|i| (i as f32 * 0.37).sin())
                .collect();
            let (cos, sin): (Vec<f32>, Vec<f32>) =
                angles.iter().map(|a| (a.cos(), a.sin())).unzip();
            let plain = AttentionOp::new(batch, 4, head_dim, q_tokens, q_tokens);
            let causal = self_attention(plain, 2, &real, (&cos, &sin));
            let inputs = [
                normal(q_tokens, 4),
                normal(q_tokens, 2),
                normal(q_tokens, 2),
            ];
            bf16_close_to_f32(causal, &inputs);
        });
    }

    /// `op`'s values and gradients with bf16 products against its own with f32 ones.
    fn bf16_close_to_f32(op: AttentionOp, inputs: &[Tensor<Trained, 3>; 3]) {
        use burn::backend::Flex;
        use burn::tensor::Distribution;
        let [batch, tokens, _] = inputs[0].dims();
        let shape = [batch, tokens, op.heads * op.head_dim];
        let weights =
            Tensor::<Trained, 3>::random(shape, Distribution::Default, &inputs[0].device());
        let run = |products| {
            let op = AttentionOp {
                products,
                ..op.clone()
            };
            let y = crate::host_op(op, [&inputs[0], &inputs[1], &inputs[2]], shape)
                .expect("served on Autodiff<Flex>");
            let grads = (y.clone() * weights.clone()).sum().backward();
            let [q, k, v] = [0, 1, 2].map(|i| inputs[i].grad(&grads).expect("a gradient"));
            [y.inner(), q, k, v]
        };
        let values = |t: Tensor<Flex, 3>| t.into_data().to_vec::<f32>().expect("f32");
        for ((bf16, f32), what) in run(Products::Bf16)
            .into_iter()
            .zip(run(Products::F32))
            .zip(["values", "q", "k", "v"])
        {
            let (bf16, f32) = (values(bf16), values(f32));
            let norm = |x: &mut dyn Iterator<Item = f32>| x.map(|v| v * v).sum::<f32>().sqrt();
            let largest = f32.iter().fold(0f32, |m, v| m.max(v.abs()));
            let diff = norm(&mut bf16.iter().zip(&f32).map(|(a, b)| a - b));
            let worst = bf16
                .iter()
                .zip(&f32)
                .fold(0f32, |m, (a, b)| m.max((a - b).abs()));
            assert!(
                diff <= norm(&mut f32.iter().copied()) / 64.0,
                "{what}: ‖Δ‖ {diff}"
            );
            assert!(worst <= largest / 32.0, "{what}: {worst} of {largest}");
            assert!(diff > 0.0, "{what}: bf16 products ran");
        }
    }

    #[test]
    fn attention_matches_the_definition() {
        attention_definition(4, Products::F32);
        for_bf16_attention(|| attention_definition(64, Products::Bf16));
    }

    /// Runs `check` where bf16 attention products run (AMX), else says it skipped.
    fn for_bf16_attention(check: impl Fn()) {
        if crate::gemm::Bf16Isa::chosen() == Some(crate::gemm::Bf16Isa::Amx) {
            check();
        } else {
            println!("SKIPPED (no amx_bf16)");
        }
    }

    /// An operand as `products` reads it: itself, or rounded to bf16.
    fn as_read(x: &[f32], products: Products) -> Vec<f32> {
        match products {
            Products::F32 => x.to_vec(),
            Products::Bf16 => (x.iter())
                .map(|&v| crate::gemm::bf16::widen(crate::gemm::bf16::round(v)))
                .collect(),
        }
    }

    /// Whether `got` is `want`, the definition in f64 of the operands as read, within f32's
    /// rounding, or for bf16 products within the probabilities' rounding to bf16 (2⁻⁸ of
    /// `Σ p |v|`, `spread`) besides.
    fn attention_close(got: f64, want: f64, spread: f64, products: Products) -> bool {
        let rounding = match products {
            Products::F32 => 0.0,
            Products::Bf16 => spread / 256.0,
        };
        (got - want).abs() < 1e-5 * want.abs().max(1.0) + rounding
    }

    /// Two tiles of query rows (the second partial), keys of another length, a mask; k and v
    /// side by side in the rows of one buffer, as one product leaves them.
    fn attention_definition(head_dim: usize, products: Products) {
        // bf16 products run on images of 256 tokens or more.
        let (batch, heads, [q_tokens, kv_tokens]) = match products {
            Products::F32 => (2, 3, [ATTENTION_ROWS + 5, 37]),
            Products::Bf16 => (2, 3, [261, 293]),
        };
        let width = heads * head_dim;
        let values = |n: usize, seed: usize| -> Vec<f32> {
            (0..n)
                .map(|i| (((i + seed) * 7919) % 23) as f32 * 0.37 - 4.0)
                .collect()
        };
        let (q, kv) = (
            values(batch * q_tokens * width, 1),
            values(batch * kv_tokens * 2 * width, 2),
        );
        let half = |second: usize| -> Vec<f32> {
            kv.chunks_exact(2 * width)
                .flat_map(|row| &row[second * width..(second + 1) * width])
                .copied()
                .collect()
        };
        let (k, v) = (half(0), half(1));
        let mask: Vec<f32> = (0..batch * heads * q_tokens * kv_tokens)
            .map(|i| if i % 3 == 0 { 0.0 } else { 1.5 })
            .collect();
        let scale = 2.0 / head_dim as f32;
        let side_by_side = |offset| Rows {
            offset,
            ..Rows::new(&kv, 2 * width, kv_tokens)
        };
        let query = Rows::new(&q, width, q_tokens);
        let attend = |products| {
            attention(
                query,
                side_by_side(0),
                side_by_side(width),
                batch,
                Heads::all(heads, head_dim),
                scale,
                Some(ProbsDropout::Multipliers(&mask)),
                products,
            )
        };
        let got = attend(products);
        if products == Products::Bf16 {
            assert_ne!(got, attend(Products::F32), "bf16 products ran");
        }
        let (q, k, v) = (
            as_read(&q, products),
            as_read(&k, products),
            as_read(&v, products),
        );
        for (b, h, t) in (0..batch)
            .flat_map(|b| (0..heads).map(move |h| (b, h)))
            .flat_map(|(b, h)| (0..q_tokens).map(move |t| (b, h, t)))
        {
            let at = |x: &[f32], tokens: usize, j: usize, c: usize| {
                x[(b * tokens + j) * width + h * head_dim + c] as f64
            };
            let scores: Vec<f64> = (0..kv_tokens)
                .map(|j| {
                    (0..head_dim)
                        .map(|c| at(&q, q_tokens, t, c) * at(&k, kv_tokens, j, c))
                        .sum::<f64>()
                        * scale as f64
                })
                .collect();
            let max = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let total: f64 = scores.iter().map(|s| (s - max).exp()).sum();
            for c in 0..head_dim {
                let terms = (0..kv_tokens).map(|j| {
                    let m = mask[((b * heads + h) * q_tokens + t) * kv_tokens + j] as f64;
                    (scores[j] - max).exp() / total * m * at(&v, kv_tokens, j, c)
                });
                let want: f64 = terms.clone().sum();
                let spread: f64 = terms.map(f64::abs).sum();
                let got = got[(b * q_tokens + t) * width + h * head_dim + c] as f64;
                assert!(
                    attention_close(got, want, spread, products),
                    "{products:?}: {got} {want}"
                );
            }
        }
    }

    /// Causal grouped-query attention over left-padded keys, after a cache of `past` keys,
    /// against the definition in f64: each query sees the real keys up to its position, a
    /// padding query that sees none gets zeros. Again without padding, the keys and values in a
    /// cache with room for more tokens than it holds (an image stride of its capacity).
    #[test]
    fn causal_grouped_attention_matches_the_definition() {
        for padded in [true, false] {
            causal_grouped_attention(padded, 4, Products::F32);
            for_bf16_attention(|| causal_grouped_attention(padded, 64, Products::Bf16));
        }
    }

    fn causal_grouped_attention(padded: bool, head_dim: usize, products: Products) {
        let (batch, heads, kv_heads) = (2, 6, 2);
        // bf16 products run on images of 256 tokens or more.
        let (past, q_tokens) = match products {
            Products::F32 => (3, ATTENTION_ROWS + 7),
            Products::Bf16 => (3, 263),
        };
        let kv_tokens = past + q_tokens;
        let (width, kv_width) = (heads * head_dim, kv_heads * head_dim);
        let values = |n: usize, seed: usize| -> Vec<f32> {
            (0..n)
                .map(|i| (((i + seed) * 7919) % 23) as f32 * 0.37 - 4.0)
                .collect()
        };
        let q = values(batch * q_tokens * width, 1);
        let (k, v) = (
            values(batch * kv_tokens * kv_width, 2),
            values(batch * kv_tokens * kv_width, 3),
        );
        // Padded: image 0 is padded on the left up to key 5 (so its first queries see nothing);
        // image 1 has no padding.
        let real: Vec<bool> = (0..batch * kv_tokens)
            .map(|i| !padded || i >= kv_tokens || i >= 5)
            .collect();
        let shape = Heads {
            heads,
            kv_heads,
            head_dim,
            causal_past: Some(past),
            real_keys: padded.then_some(&real),
        };
        let scale = 1.6 / head_dim as f32;
        // Unpadded: each image's keys and values at the start of room for 5 more tokens.
        let capacity = if padded { kv_tokens } else { kv_tokens + 5 };
        let in_cache = |values: &[f32]| -> Vec<f32> {
            let mut cache = vec![f32::NAN; batch * capacity * kv_width];
            for (image, held) in values.chunks_exact(kv_tokens * kv_width).enumerate() {
                cache[image * capacity * kv_width..][..held.len()].copy_from_slice(held);
            }
            cache
        };
        let (k_cache, v_cache) = (in_cache(&k), in_cache(&v));
        let cached = |data| Rows {
            image_stride: capacity * kv_width,
            ..Rows::new(data, kv_width, kv_tokens)
        };
        let got = attention(
            Rows::new(&q, width, q_tokens),
            cached(&k_cache),
            cached(&v_cache),
            batch,
            shape,
            scale,
            None,
            products,
        );
        let (q, k, v) = (
            as_read(&q, products),
            as_read(&k, products),
            as_read(&v, products),
        );
        for (b, h, t) in (0..batch)
            .flat_map(|b| (0..heads).map(move |h| (b, h)))
            .flat_map(|(b, h)| (0..q_tokens).map(move |t| (b, h, t)))
        {
            let g = h / (heads / kv_heads);
            let seen: Vec<usize> = (0..=past + t)
                .filter(|&j| real[b * kv_tokens + j])
                .collect();
            let score = |j: usize| {
                (0..head_dim)
                    .map(|c| {
                        q[(b * q_tokens + t) * width + h * head_dim + c] as f64
                            * k[(b * kv_tokens + j) * kv_width + g * head_dim + c] as f64
                    })
                    .sum::<f64>()
                    * scale as f64
            };
            let scores: Vec<f64> = seen.iter().map(|&j| score(j)).collect();
            let max = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            let total: f64 = scores.iter().map(|s| (s - max).exp()).sum();
            for c in 0..head_dim {
                let terms = seen.iter().zip(&scores).map(|(&j, s)| {
                    (s - max).exp() / total
                        * v[(b * kv_tokens + j) * kv_width + g * head_dim + c] as f64
                });
                let want: f64 = terms.clone().sum();
                let spread: f64 = terms.map(f64::abs).sum();
                let got = got[(b * q_tokens + t) * width + h * head_dim + c] as f64;
                assert!(
                    attention_close(got, want, spread, products),
                    "{products:?}: image {b} head {h} query {t}: {got} vs {want}"
                );
            }
        }
    }

    #[test]
    fn rms_norm_and_swiglu_match_their_definitions() {
        let (rows, width) = (37, 45);
        let x: Vec<f32> = (0..rows * width)
            .map(|i| ((i * 31 % 17) as f32 - 8.0) * 0.3)
            .collect();
        let weight: Vec<f32> = (0..width).map(|i| 0.5 + i as f32 * 0.02).collect();
        let normed = rms_norm(&x, &weight, 1e-5);
        for (row, out) in x.chunks(width).zip(normed.chunks(width)) {
            let mean = row.iter().map(|&v| v as f64 * v as f64).sum::<f64>() / width as f64;
            for ((v, o), w) in row.iter().zip(out).zip(&weight) {
                let want = *v as f64 / (mean + 1e-5).sqrt() * *w as f64;
                assert!((*o as f64 - want).abs() < 1e-5 * want.abs().max(1.0));
            }
        }
        let gate_up: Vec<f32> = x[..rows * 2 * 20].to_vec();
        let out = swiglu(&gate_up, 20);
        for (row, out) in gate_up.chunks(40).zip(out.chunks(20)) {
            for i in 0..20 {
                let (g, u) = (row[i] as f64, row[20 + i] as f64);
                let want = g / (1.0 + (-g).exp()) * u;
                assert!((out[i] as f64 - want).abs() < 1e-5 * want.abs().max(1.0));
            }
        }
    }

    #[test]
    fn exp_is_accurate_across_the_range() {
        assert!(worst(exp, f64::exp, true) < 3e-7);
        assert_eq!(exp(-200.0), exp(-87.0));
        assert!(exp(-87.0) > 0.0 && exp(88.0).is_finite());
    }

    #[test]
    fn activations_match_their_definitions() {
        let sigmoid = |z: f64| 1.0 / (1.0 + (-z).exp());
        let quick = worst(quick_gelu, |x| x * sigmoid(1.702 * x), false);
        let tanh = worst(
            gelu_tanh,
            |x| {
                0.5 * x
                    * (1.0
                        + ((2.0 / std::f64::consts::PI).sqrt() * (x + 0.044715 * x * x * x)).tanh())
            },
            false,
        );
        let exact = worst(gelu, |x| 0.5 * x * (1.0 + erf64(x / 2f64.sqrt())), false);
        let pdf = |x: f64| (-0.5 * x * x).exp() / (2.0 * std::f64::consts::PI).sqrt();
        let slope = worst(
            crate::math::gelu_derivative,
            |x| 0.5 * (1.0 + erf64(x / 2f64.sqrt())) + x * pdf(x),
            false,
        );
        let hyperbolic = worst(crate::math::tanh, f64::tanh, false);
        // f32 itself rounds to 6e-8 relative.
        assert!(
            quick < 1e-6 && tanh < 1e-6 && exact < 1e-6 && slope < 1e-6 && hyperbolic < 1e-6,
            "{quick} {tanh} {exact} {slope} {hyperbolic}"
        );
    }
}

/// What the convolution kernels' tests share: deterministic values and a product by definition.
#[cfg(test)]
mod testing {
    /// `n` values in `[-0.5, 0.5)`, a hash of their index and `seed`.
    pub fn values(n: usize, seed: u32) -> Vec<f32> {
        (0..n)
            .map(|i| {
                ((i as u32).wrapping_mul(2654435761).wrapping_add(seed) >> 8) as f32 / 16777216.0
                    - 0.5
            })
            .collect()
    }

    /// `rows [m, k] · weight [k, n]`, row-major.
    pub fn product(rows: &[f32], weight: &[f32], k: usize, n: usize) -> Vec<f32> {
        let m = rows.len() / k;
        let mut out = vec![0f32; m * n];
        for i in 0..m {
            for j in 0..n {
                out[i * n + j] = (0..k).map(|l| rows[i * k + l] * weight[l * n + j]).sum();
            }
        }
        out
    }
}
