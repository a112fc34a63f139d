//! f32 kernels for the host backends (Flex, NdArray): bias + activation, softmax and attention.
//!
//! burn 0.21's host backends evaluate `exp`, `tanh`, `erf` and `sigmoid` one element at a time
//! on one thread through the C library: on a ViT-B/16 batch the MLP activation took longer than
//! the matrix product before it. Here each element goes through a branch-free polynomial that
//! the compiler vectorises for the widest instruction set the CPU has (chosen at run time through
//! `pulp`: AVX-512 or AVX2 + FMA on x86-64, NEON on ARM), in place on the product it follows, and
//! the work is split across rayon's threads. Accuracy: `exp` within 2 × 10⁻⁷ relative, `erf`
//! within 1.5 × 10⁻⁷ absolute (Abramowitz & Stegun 7.1.26), both below f32's own rounding of the
//! activations they feed.

use std::sync::Arc;

use burn::tensor::backend::Backend;
use burn::tensor::{DType, Tensor, TensorData};
use kiln_precision::{HostOp, is_host_backend, zeros};
use rayon::prelude::*;

use crate::matmul::{Threads, View, Write, matmul};
use crate::pass::{HashedMask, RowMask};
use crate::rotary;

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

/// Elements per parallel task: large enough to amortise scheduling, small enough to balance.
const CHUNK: usize = 1 << 14;

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

/// `softmax(scale · row)` of each `width`-long row of `rows`, in place, vectorised as
/// [`BiasMap`], over the keys each row sees (the others come out 0).
struct SoftmaxRows<'a> {
    rows: &'a mut [f32],
    width: usize,
    scale: f32,
    /// Dropout's multipliers of the rows' elements, in order, formed as they are normalised.
    dropout: Option<RowMask>,
    /// Causal rows: row `r` sees its first `causal + r` elements.
    causal: Option<usize>,
    /// The keys any row may see (`false`: padding).
    real: Option<&'a [bool]>,
}

impl pulp::WithSimd for SoftmaxRows<'_> {
    type Output = ();

    #[inline(always)]
    fn with_simd<S: pulp::Simd>(self, _: S) {
        if self.causal.is_none() && self.real.is_none() {
            // Every key seen (the vision towers): the loop without the masking steps.
            for (r, row) in self.rows.chunks_exact_mut(self.width).enumerate() {
                let max = row_max(row);
                row.iter_mut()
                    .for_each(|v| *v = exp(self.scale * (*v - max)));
                normalise(row, r * self.width, self.dropout);
            }
            return;
        }
        for (r, row) in self.rows.chunks_exact_mut(self.width).enumerate() {
            let seen = self.causal.map_or(self.width, |c| (c + r).min(self.width));
            let (row, unseen) = row.split_at_mut(seen);
            unseen.fill(0.0);
            if let Some(real) = self.real {
                row.iter_mut()
                    .zip(real)
                    .for_each(|(v, &real)| *v = if real { *v } else { f32::NEG_INFINITY });
            }
            let max = row_max(row);
            if max == f32::NEG_INFINITY {
                // Nothing to attend to (a padding query): zeros, never NaN.
                row.fill(0.0);
                continue;
            }
            let sum = match self.real {
                Some(real) => {
                    row.iter_mut().zip(real).for_each(|(v, &real)| {
                        *v = if real {
                            exp(self.scale * (*v - max))
                        } else {
                            0.0
                        }
                    });
                    row_sum(row)
                }
                None => exp_and_sum(row, self.scale, max),
            };
            normalise_by(row, sum, r * self.width, self.dropout);
        }
    }
}

/// `exp(scale · (v − max))` of each element of `row` in place; returns their sum (one pass).
#[inline(always)]
fn exp_and_sum(row: &mut [f32], scale: f32, max: f32) -> f32 {
    let mut lanes = [0.0f32; LANES];
    let mut chunks = row.chunks_exact_mut(LANES);
    for chunk in &mut chunks {
        for (lane, v) in lanes.iter_mut().zip(chunk.iter_mut()) {
            *v = exp(scale * (*v - max));
            *lane += *v;
        }
    }
    let mut rest = 0.0;
    for v in chunks.into_remainder() {
        *v = exp(scale * (*v - max));
        rest += *v;
    }
    lanes.iter().sum::<f32>() + rest
}

/// Divides the exponentials of `row` by their sum, times dropout's multipliers of the row's
/// elements (from element `first` of the mask) when there are any.
#[inline(always)]
fn normalise(row: &mut [f32], first: usize, dropout: Option<RowMask>) {
    normalise_by(row, row_sum(row), first, dropout);
}

/// [`normalise`] with the exponentials' sum known.
#[inline(always)]
fn normalise_by(row: &mut [f32], sum: f32, first: usize, dropout: Option<RowMask>) {
    let norm = 1.0 / sum;
    match dropout {
        None => row.iter_mut().for_each(|v| *v *= norm),
        Some(mask) => row
            .iter_mut()
            .enumerate()
            .for_each(|(k, v)| *v = *v * norm * mask.factor(first + k)),
    }
}

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
                .for_each(|(o, (&g, &u))| *o = g / (1.0 + exp(-g)) * u);
        }
    }
}

/// Lanes of the partial reductions: enough independent accumulators for the compiler to keep
/// them in one vector register (eight f32 lanes of AVX2).
const LANES: usize = 8;

/// The largest element of `row` (vectorisable: per-lane maxima, then across lanes).
#[inline(always)]
fn row_max(row: &[f32]) -> f32 {
    let mut lanes = [f32::NEG_INFINITY; LANES];
    let chunks = row.chunks_exact(LANES);
    let rest = chunks.remainder();
    for chunk in chunks {
        for (lane, &v) in lanes.iter_mut().zip(chunk) {
            *lane = if v > *lane { v } else { *lane };
        }
    }
    rest.iter()
        .chain(&lanes)
        .fold(f32::NEG_INFINITY, |m, &v| if v > m { v } else { m })
}

/// The sum of `row` (vectorisable: per-lane sums, then across lanes).
#[inline(always)]
fn row_sum(row: &[f32]) -> f32 {
    let mut lanes = [0.0f32; LANES];
    let chunks = row.chunks_exact(LANES);
    let rest = chunks.remainder();
    for chunk in chunks {
        for (lane, &v) in lanes.iter_mut().zip(chunk) {
            *lane += v;
        }
    }
    lanes.iter().sum::<f32>() + rest.iter().sum::<f32>()
}

/// One input of [`attention`] inside a buffer: token `t` of image `b` is the `heads · head_dim`
/// values from `offset + b · image_stride + t · row_stride`. The q, k and v of one product, side
/// by side in its rows, are the same buffer at three offsets; a key/value cache with room for
/// more tokens than it holds has an image stride of its capacity.
#[derive(Debug, Clone, Copy)]
pub struct Rows<'a> {
    /// The buffer.
    pub data: &'a [f32],
    /// Where the first token's values start.
    pub offset: usize,
    /// Elements from one token's values to the next's.
    pub row_stride: usize,
    /// Tokens per image.
    pub tokens: usize,
    /// Elements from one image's first token to the next's.
    pub image_stride: usize,
}

impl<'a> Rows<'a> {
    /// Images of `tokens` rows each, `row_stride` apart, from the start of `data`.
    pub fn new(data: &'a [f32], row_stride: usize, tokens: usize) -> Self {
        Rows {
            data,
            offset: 0,
            row_stride,
            tokens,
            image_stride: tokens * row_stride,
        }
    }

    /// Every row of the f32 data of a `[batch, tokens, width]` tensor.
    pub fn of(data: &'a TensorData) -> Self {
        let [_, tokens, width] = data.shape[..] else {
            panic!("attention inputs are [batch, tokens, width]");
        };
        Rows::new(f32s(data), width, tokens)
    }

    /// `rows` tokens from `first` of image `image`, columns `column .. column + cols`.
    fn view(&self, image: usize, first: usize, rows: usize, column: usize, cols: usize) -> View {
        let start = self.offset + image * self.image_stride + first * self.row_stride + column;
        View::rows(start, rows, cols, self.row_stride)
    }
}

/// Query rows per attention task: a `ROWS × kv_tokens` score tile stays in the L2 cache between
/// its two products (96 × 325 f32 for DINOv2 at 256 px: 125 kB).
const ATTENTION_ROWS: usize = 96;

/// Dropout on the attention probabilities.
#[derive(Clone, Copy)]
pub enum ProbsDropout<'a> {
    /// Multipliers `[batch, heads, q_tokens, kv_tokens]`, row-major.
    Multipliers(&'a [f32]),
    /// Each batch row's hash words: the multipliers are formed where they are used.
    Hashed(&'a HashedMask),
}

/// The heads of [`attention`] and which keys each query sees.
#[derive(Debug, Clone, Copy)]
pub struct Heads<'a> {
    /// Query heads.
    pub heads: usize,
    /// Key and value heads: `heads`, or a divisor of it (grouped-query attention: query head
    /// `h` reads key/value head `h / (heads / kv_heads)`).
    pub kv_heads: usize,
    /// Columns per head.
    pub head_dim: usize,
    /// Causal attention: query `t` sits at key position `past + t` and sees the keys up to it
    /// (`Some(past)`); every query sees every key with `None`.
    pub causal_past: Option<usize>,
    /// Each image's real keys, `[batch · kv_tokens]`: `false` marks padding, which no query
    /// sees. A query that sees no key gets zeros.
    pub real_keys: Option<&'a [bool]>,
}

impl Heads<'_> {
    /// `heads` heads of `head_dim` columns, every query seeing every key.
    pub fn all(heads: usize, head_dim: usize) -> Self {
        Heads {
            heads,
            kv_heads: heads,
            head_dim,
            causal_past: None,
            real_keys: None,
        }
    }
}

/// Multi-head attention of f32 rows: `softmax(scale · q kᵀ) v` per head for `batch` images;
/// returns `[batch, query.tokens, heads · head_dim]`, the heads already merged, row-major. Keys
/// and values have `kv_heads · head_dim` columns; `shape` also says which keys each query sees.
///
/// `mask`, when given, multiplies the probabilities after the softmax (Monte-Carlo dropout):
/// multipliers `[batch, heads, q_tokens, kv_tokens]` (row-major), or each batch row's hash words,
/// from which the softmax forms them (no mask in memory). Not with causal attention.
///
/// Tiles of query rows of one image run in parallel; each forms its scores for one head at a
/// time (causal tiles only against the keys their last row sees), normalises them while they
/// are in cache and multiplies them into `v` straight into the output rows. The head split and
/// merge are strides of the products, never copies. burn 0.21's batched products ran these
/// shapes at about a quarter of PyTorch's fused attention.
pub fn attention(
    query: Rows,
    key: Rows,
    value: Rows,
    batch: usize,
    shape: Heads<'_>,
    scale: f32,
    mask: Option<ProbsDropout<'_>>,
) -> Vec<f32> {
    let mut out = zeros(batch * query.tokens * shape.heads * shape.head_dim);
    attention_into(&mut out, query, key, value, batch, shape, scale, mask);
    out
}

/// [`attention`] written over `out` (`[batch, query.tokens, heads · head_dim]`; every element
/// is overwritten), for callers that reuse their buffers.
#[allow(clippy::too_many_arguments)]
pub fn attention_into(
    out: &mut [f32],
    query: Rows,
    key: Rows,
    value: Rows,
    batch: usize,
    shape: Heads<'_>,
    scale: f32,
    mask: Option<ProbsDropout<'_>>,
) {
    let (q_tokens, kv_tokens) = (query.tokens, key.tokens);
    let Heads {
        heads,
        kv_heads,
        head_dim,
        causal_past,
        real_keys,
    } = shape;
    assert!(
        kv_heads > 0 && heads % kv_heads == 0,
        "{heads} query heads over {kv_heads} key/value heads"
    );
    assert!(
        mask.is_none() || causal_past.is_none(),
        "dropout masks are laid out for non-causal attention"
    );
    if let Some(real) = real_keys {
        assert_eq!(
            real.len(),
            batch * kv_tokens,
            "real keys: [batch · kv_tokens]"
        );
    }
    let group = heads / kv_heads;
    let width = heads * head_dim;
    if let Some(ProbsDropout::Multipliers(mask)) = mask {
        assert_eq!(
            mask.len(),
            batch * heads * q_tokens * kv_tokens,
            "mask shape"
        );
    }
    assert_eq!(
        out.len(),
        batch * q_tokens * width,
        "attention_into: out's shape"
    );
    if kv_tokens == 0 {
        out.fill(0.0);
        return;
    }
    out.par_chunks_mut((q_tokens * width).max(1))
        .enumerate()
        .for_each(|(image, out)| {
            out.par_chunks_mut(ATTENTION_ROWS * width)
                .enumerate()
                .for_each(|(tile, out)| {
                    let first = tile * ATTENTION_ROWS;
                    let rows = out.len() / width;
                    // The keys the tile's last row sees.
                    let seen =
                        causal_past.map_or(kv_tokens, |past| (past + first + rows).min(kv_tokens));
                    let real = real_keys.map(|real| &real[image * kv_tokens..][..seen]);
                    let mut scores = vec![0f32; rows * seen];
                    for head in 0..heads {
                        let column = head * head_dim;
                        let kv_column = head / group * head_dim;
                        // scores = q[rows] · kᵀ
                        matmul(
                            &mut scores,
                            View::rows(0, rows, seen, seen),
                            query.data,
                            query.view(image, first, rows, column, head_dim),
                            key.data,
                            key.view(image, 0, seen, kv_column, head_dim).transposed(),
                            Write::Overwrite,
                            Threads::One,
                        );
                        // This tile's first element in the image's `[heads, q, kv]` mask.
                        let start = (head * q_tokens + first) * kv_tokens;
                        let hashed = match mask {
                            Some(ProbsDropout::Hashed(mask)) => {
                                Some(mask.row(image, start..start + rows * kv_tokens))
                            }
                            _ => None,
                        };
                        pulp::Arch::new().dispatch(SoftmaxRows {
                            rows: &mut scores,
                            width: seen,
                            scale,
                            dropout: hashed,
                            causal: causal_past.map(|past| past + first + 1),
                            real,
                        });
                        if let Some(ProbsDropout::Multipliers(mask)) = mask {
                            let start = image * heads * q_tokens * kv_tokens + start;
                            scores
                                .iter_mut()
                                .zip(&mask[start..start + rows * kv_tokens])
                                .for_each(|(p, m)| *p *= m);
                        }
                        // out[rows, head] = probabilities · v
                        matmul(
                            out,
                            View::rows(column, rows, head_dim, width),
                            &scores,
                            View::rows(0, rows, seen, seen),
                            value.data,
                            value.view(image, 0, seen, kv_column, head_dim),
                            Write::Overwrite,
                            Threads::One,
                        );
                    }
                });
        });
}

/// [`attention`] and its backward as one differentiable operation over q `[batch, q_tokens,
/// heads · head_dim]` and k, v `[batch, kv_tokens, kv_heads · head_dim]` (row-major, the heads
/// side by side in each row): training on Flex runs these kernels in place of burn's head split,
/// batched products, softmax and merge, each with a backward of its own and the split and merge
/// as strided copies. Grouped-query, causal and padded attention as [`Heads`] describes them;
/// with [`Self::rotary`], q and k are turned by their rows' rotary angles first (a language
/// model's self-attention: the rotation's backward is in the operation too).
#[derive(Debug, Clone)]
pub struct AttentionOp {
    /// Images.
    pub batch: usize,
    /// Query heads.
    pub heads: usize,
    /// Key and value heads, a divisor of `heads`.
    pub kv_heads: usize,
    /// Columns per head.
    pub head_dim: usize,
    /// Query tokens per image.
    pub q_tokens: usize,
    /// Key and value tokens per image.
    pub kv_tokens: usize,
    /// The scores' factor, usually `1 / √head_dim`.
    pub scale: f32,
    /// Query `t` sees the keys up to `t` (self-attention: as many queries as keys).
    pub causal: bool,
    /// Each image's real keys, `[batch · kv_tokens]` (`false`: padding, which no query sees).
    pub real_keys: Option<Arc<[bool]>>,
    /// Rotary angles of each query and key row, `[batch · tokens, head_dim]` each
    /// (self-attention).
    pub rotary: Option<RotaryAngles>,
    /// Dropout's multipliers of the probabilities, `[batch, heads, q_tokens, kv_tokens]` (not
    /// with causal attention).
    pub mask: Option<Arc<[f32]>>,
}

/// The cosines and sines of [`AttentionOp::rotary`]'s angles ([`rotary::Angles`], kept).
#[derive(Debug, Clone)]
pub struct RotaryAngles {
    /// `cos`, `[rows, head_dim]`.
    pub cos: Arc<[f32]>,
    /// `sin`, `[rows, head_dim]`.
    pub sin: Arc<[f32]>,
}

impl AttentionOp {
    /// `heads` heads of `head_dim` columns, every query seeing every key, scaled by
    /// `1 / √head_dim`; no rotation, no dropout.
    pub fn new(
        batch: usize,
        heads: usize,
        head_dim: usize,
        q_tokens: usize,
        kv_tokens: usize,
    ) -> Self {
        AttentionOp {
            batch,
            heads,
            kv_heads: heads,
            head_dim,
            q_tokens,
            kv_tokens,
            scale: (head_dim as f32).powf(-0.5),
            causal: false,
            real_keys: None,
            rotary: None,
            mask: None,
        }
    }

    fn shape(&self) -> Heads<'_> {
        Heads {
            heads: self.heads,
            kv_heads: self.kv_heads,
            head_dim: self.head_dim,
            causal_past: self.causal.then_some(0),
            real_keys: self.real_keys.as_deref(),
        }
    }

    /// Turns `values`, rows of `heads` heads, by [`Self::rotary`]'s angles (nothing without
    /// them).
    fn turn(&self, values: &mut [f32], heads: usize, turn: rotary::Turn) {
        if let Some(RotaryAngles { cos, sin }) = &self.rotary {
            let angles = rotary::Angles { cos, sin };
            rotary::rotate_rows(values, heads * self.head_dim, 0, heads, angles, turn);
        }
    }

    /// q and k turned by [`Self::rotary`]'s angles (`None` without them).
    fn rotated(&self, query: &[f32], key: &[f32]) -> Option<(Vec<f32>, Vec<f32>)> {
        self.rotary.as_ref()?;
        let turned = |x: &[f32], heads: usize| {
            let mut x = x.to_vec();
            self.turn(&mut x, heads, rotary::Turn::Forward);
            x
        };
        Some((turned(query, self.heads), turned(key, self.kv_heads)))
    }
}

impl HostOp<3> for AttentionOp {
    fn forward(&self, [query, key, value]: [&[f32]; 3]) -> Vec<f32> {
        let rotated = self.rotated(query, key);
        let (query, key) = match &rotated {
            Some((query, key)) => (query.as_slice(), key.as_slice()),
            None => (query, key),
        };
        let (q_width, kv_width) = (self.heads * self.head_dim, self.kv_heads * self.head_dim);
        attention(
            Rows::new(query, q_width, self.q_tokens),
            Rows::new(key, kv_width, self.kv_tokens),
            Rows::new(value, kv_width, self.kv_tokens),
            self.batch,
            self.shape(),
            self.scale,
            self.mask.as_deref().map(ProbsDropout::Multipliers),
        )
    }

    /// Per image (in parallel) and head: the probabilities recomputed, then `dV = Pᵀ dO`,
    /// `dP = dO Vᵀ`, the softmax's backward `dS = scale · P ⊙ (dP − Σⱼ dP ⊙ P)`, `dQ = dS K`
    /// and `dK = dSᵀ Q`; a key/value head sums the gradients of the query heads it serves.
    /// Keys a query does not see have probability 0, so they receive nothing from it.
    fn backward(&self, grad: &[f32], [query, key, value]: [&[f32]; 3]) -> [Vec<f32>; 3] {
        let rotated = self.rotated(query, key);
        let (query, key) = match &rotated {
            Some((query, key)) => (query.as_slice(), key.as_slice()),
            None => (query, key),
        };
        let (q_tokens, kv_tokens) = (self.q_tokens, self.kv_tokens);
        let (heads, head_dim) = (self.heads, self.head_dim);
        let (q_width, kv_width) = (heads * head_dim, self.kv_heads * head_dim);
        let group = heads / self.kv_heads;
        let (grad, query) = (
            Rows::new(grad, q_width, q_tokens),
            Rows::new(query, q_width, q_tokens),
        );
        let (key, value) = (
            Rows::new(key, kv_width, kv_tokens),
            Rows::new(value, kv_width, kv_tokens),
        );
        let mut dq = zeros(self.batch * q_tokens * q_width);
        let mut dk = zeros(self.batch * kv_tokens * kv_width);
        let mut dv = zeros(self.batch * kv_tokens * kv_width);
        let scores = View::rows(0, q_tokens, kv_tokens, kv_tokens);
        dq.par_chunks_mut((q_tokens * q_width).max(1))
            .zip(dk.par_chunks_mut((kv_tokens * kv_width).max(1)))
            .zip(dv.par_chunks_mut((kv_tokens * kv_width).max(1)))
            .enumerate()
            .for_each(|(image, ((dq, dk), dv))| {
                let real =
                    (self.real_keys.as_deref()).map(|real| &real[image * kv_tokens..][..kv_tokens]);
                let mut probs = vec![0f32; q_tokens * kv_tokens];
                let mut dprobs = vec![0f32; q_tokens * kv_tokens];
                let mut kept = vec![0f32; if self.mask.is_some() { probs.len() } else { 0 }];
                for head in 0..heads {
                    let (column, kv_column) = (head * head_dim, head / group * head_dim);
                    // The first query head of a group writes its key/value head's gradients,
                    // the others add theirs.
                    let kv_write = if head % group == 0 {
                        Write::Overwrite
                    } else {
                        Write::Add
                    };
                    let q_at = |rows: &Rows| rows.view(image, 0, q_tokens, column, head_dim);
                    let kv_at = |rows: &Rows| rows.view(image, 0, kv_tokens, kv_column, head_dim);
                    let q_into = View::rows(column, q_tokens, head_dim, q_width);
                    let kv_into = View::rows(kv_column, kv_tokens, head_dim, kv_width);
                    // P = softmax(scale · q kᵀ) over the keys each query sees, recomputed.
                    matmul(
                        &mut probs,
                        scores,
                        query.data,
                        q_at(&query),
                        key.data,
                        kv_at(&key).transposed(),
                        Write::Overwrite,
                        Threads::One,
                    );
                    pulp::Arch::new().dispatch(SoftmaxRows {
                        rows: &mut probs,
                        width: kv_tokens,
                        scale: self.scale,
                        dropout: None,
                        causal: self.causal.then_some(1),
                        real,
                    });
                    let mask = self.mask.as_deref().map(|mask| {
                        let start = (image * heads + head) * q_tokens * kv_tokens;
                        &mask[start..start + q_tokens * kv_tokens]
                    });
                    let used = match mask {
                        Some(mask) => {
                            kept.iter_mut()
                                .zip(probs.iter().zip(mask))
                                .for_each(|(k, (p, m))| *k = p * m);
                            &kept
                        }
                        None => &probs,
                    };
                    // dV = Pᵀ dO (P as dropout left it).
                    matmul(
                        dv,
                        kv_into,
                        used,
                        scores.transposed(),
                        grad.data,
                        q_at(&grad),
                        kv_write,
                        Threads::One,
                    );
                    // dP = dO vᵀ (through dropout's multipliers).
                    matmul(
                        &mut dprobs,
                        scores,
                        grad.data,
                        q_at(&grad),
                        value.data,
                        kv_at(&value).transposed(),
                        Write::Overwrite,
                        Threads::One,
                    );
                    if let Some(mask) = mask {
                        dprobs.iter_mut().zip(mask).for_each(|(d, m)| *d *= m);
                    }
                    // dS = scale · P ⊙ (dP − Σⱼ dP ⊙ P), the softmax's backward.
                    for (dp, p) in dprobs
                        .chunks_exact_mut(kv_tokens)
                        .zip(probs.chunks_exact(kv_tokens))
                    {
                        let dot: f32 = dp.iter().zip(p).map(|(d, p)| d * p).sum();
                        dp.iter_mut()
                            .zip(p)
                            .for_each(|(d, p)| *d = self.scale * p * (*d - dot));
                    }
                    // dQ = dS k, dK = dSᵀ q.
                    matmul(
                        dq,
                        q_into,
                        &dprobs,
                        scores,
                        key.data,
                        kv_at(&key),
                        Write::Overwrite,
                        Threads::One,
                    );
                    matmul(
                        dk,
                        kv_into,
                        &dprobs,
                        scores.transposed(),
                        query.data,
                        q_at(&query),
                        kv_write,
                        Threads::One,
                    );
                }
            });
        // Carried back through the rotation (its transpose).
        self.turn(&mut dq, heads, rotary::Turn::Back);
        self.turn(&mut dk, self.kv_heads, rotary::Turn::Back);
        [dq, dk, dv]
    }
}

pub use kiln_precision::math::{exp, gelu, gelu_tanh, quick_gelu};

#[cfg(test)]
mod tests {
    use super::*;

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
            let ours =
                kiln_precision::host_op(op, [&query, &key, &value], [batch, q_tokens, width])
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
            kv_heads,
            scale,
            causal: true,
            real_keys: Some(real.clone().into()),
            rotary: Some(RotaryAngles {
                cos: cos.clone().into(),
                sin: sin.clone().into(),
            }),
            ..AttentionOp::new(batch, heads, head_dim, tokens, tokens)
        };
        let ours = kiln_precision::host_op(op, [&query, &key, &value], [batch, tokens, width])
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

    #[test]
    fn attention_matches_the_definition() {
        // Two tiles of query rows (the second partial), keys of another length, a mask; k and v
        // side by side in the rows of one buffer, as one product leaves them.
        let (batch, heads, head_dim, q_tokens, kv_tokens) = (2, 3, 4, ATTENTION_ROWS + 5, 37);
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
        let scale = 0.5f32;
        let side_by_side = |offset| Rows {
            offset,
            ..Rows::new(&kv, 2 * width, kv_tokens)
        };
        let query = Rows::new(&q, width, q_tokens);
        let got = attention(
            query,
            side_by_side(0),
            side_by_side(width),
            batch,
            Heads::all(heads, head_dim),
            scale,
            Some(ProbsDropout::Multipliers(&mask)),
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
                let want: f64 = (0..kv_tokens)
                    .map(|j| {
                        let m = mask[((b * heads + h) * q_tokens + t) * kv_tokens + j] as f64;
                        (scores[j] - max).exp() / total * m * at(&v, kv_tokens, j, c)
                    })
                    .sum();
                let got = got[(b * q_tokens + t) * width + h * head_dim + c] as f64;
                assert!(
                    (got - want).abs() < 1e-5 * want.abs().max(1.0),
                    "{got} {want}"
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
        causal_grouped_attention(true);
        causal_grouped_attention(false);
    }

    fn causal_grouped_attention(padded: bool) {
        let (batch, heads, kv_heads, head_dim) = (2, 6, 2, 4);
        let (past, q_tokens) = (3, ATTENTION_ROWS + 7);
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
        let scale = 0.4f32;
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
            let max = seen
                .iter()
                .map(|&j| score(j))
                .fold(f64::NEG_INFINITY, f64::max);
            let total: f64 = seen.iter().map(|&j| (score(j) - max).exp()).sum();
            for c in 0..head_dim {
                let want: f64 = seen
                    .iter()
                    .map(|&j| {
                        (score(j) - max).exp() / total
                            * v[(b * kv_tokens + j) * kv_width + g * head_dim + c] as f64
                    })
                    .sum();
                let got = got[(b * q_tokens + t) * width + h * head_dim + c] as f64;
                assert!(
                    (got - want).abs() < 1e-5 * want.abs().max(1.0),
                    "image {b} head {h} query {t}: {got} vs {want}"
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
            kiln_precision::math::gelu_derivative,
            |x| 0.5 * (1.0 + erf64(x / 2f64.sqrt())) + x * pdf(x),
            false,
        );
        // f32 itself rounds to 6e-8 relative.
        assert!(
            quick < 1e-6 && tanh < 1e-6 && exact < 1e-6 && slope < 1e-6,
            "{quick} {tanh} {exact} {slope}"
        );
    }
}
