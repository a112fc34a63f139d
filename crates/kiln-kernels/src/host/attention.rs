//! Multi-head attention over rows inside buffers (forward and backward), in tiles of query
//! rows, and the same as one autodiff operation ([`AttentionOp`]) for training on Flex.

use std::sync::Arc;

use burn::tensor::TensorData;
use rayon::prelude::*;

use super::f32s;
use super::softmax::SoftmaxRows;
use crate::gemm::Products;
use crate::gemm::bf16;
use crate::gemm::heads::{Bf16Heads, serves};
use crate::gemm::strided::{Threads, View, Write, matmul};
use crate::mask::HashedMask;
use crate::{HostOp, rotary, zeros};

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
pub(super) const ATTENTION_ROWS: usize = 96;

/// Query rows per tile of [`attention`]: at most [`ATTENTION_ROWS`], fewer where the images'
/// tiles are few and would not divide evenly among the threads (one image of 256 tokens on two
/// threads: four tiles of 64 rows, not three of up to 96, one thread waiting a third of the time).
fn rows_per_tile(batch: usize, q_tokens: usize, threads: usize) -> usize {
    let mut tiles = q_tokens.div_ceil(ATTENTION_ROWS).max(1);
    if batch * tiles < 4 * threads {
        while !(batch * tiles).is_multiple_of(threads) && tiles < q_tokens {
            tiles += 1;
        }
    }
    q_tokens.div_ceil(tiles).max(1)
}

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
///
/// With `products` [`Products::Bf16`] where AMX runs, on images of 256 query and key tokens or
/// more with heads of whole 32-value steps, both products read bf16 operands with f32 sums, as
/// PyTorch's CPU autocast computes attention ([`crate::gemm`]); the scores and the softmax stay
/// f32. Elsewhere they are f32 (bf16 was slower there, measured).
#[allow(clippy::too_many_arguments)]
pub fn attention(
    query: Rows,
    key: Rows,
    value: Rows,
    batch: usize,
    shape: Heads<'_>,
    scale: f32,
    mask: Option<ProbsDropout<'_>>,
    products: Products,
) -> Vec<f32> {
    let mut out = zeros(batch * query.tokens * shape.heads * shape.head_dim);
    attention_into(
        &mut out, query, key, value, batch, shape, scale, mask, products,
    );
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
    products: Products,
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
    let bf16 = match products {
        Products::Bf16 => Bf16Heads::new(&query, &key, &value, batch, &shape),
        Products::F32 => None,
    };
    let tile_rows = rows_per_tile(batch, q_tokens, rayon::current_num_threads());
    out.par_chunks_mut((q_tokens * width).max(1))
        .enumerate()
        .for_each(|(image, out)| {
            out.par_chunks_mut(tile_rows * width)
                .enumerate()
                .for_each(|(tile, out)| {
                    let first = tile * tile_rows;
                    let rows = out.len() / width;
                    // The keys the tile's last row sees.
                    let seen =
                        causal_past.map_or(kv_tokens, |past| (past + first + rows).min(kv_tokens));
                    let real = real_keys.map(|real| &real[image * kv_tokens..][..seen]);
                    let mut scores = vec![0f32; rows * seen];
                    let queries = bf16.as_ref().map(|bf16| bf16.queries(image, [first, rows]));
                    for head in 0..heads {
                        let column = head * head_dim;
                        let kv_column = head / group * head_dim;
                        // scores = q[rows] · kᵀ
                        match (&bf16, &queries) {
                            (Some(bf16), Some(queries)) => {
                                bf16.scores(queries, image, [head, head / group], seen, &mut scores)
                            }
                            _ => matmul(
                                &mut scores,
                                View::rows(0, rows, seen, seen),
                                query.data,
                                query.view(image, first, rows, column, head_dim),
                                key.data,
                                key.view(image, 0, seen, kv_column, head_dim).transposed(),
                                Write::Overwrite,
                                Threads::One,
                            ),
                        }
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
                        match &bf16 {
                            Some(bf16) => bf16.weighted_values(
                                &scores,
                                [rows, seen],
                                (queries.as_ref().expect("bf16 queries"), image),
                                head / group,
                                out,
                                [column, width],
                            ),
                            None => matmul(
                                out,
                                View::rows(column, rows, head_dim, width),
                                &scores,
                                View::rows(0, rows, seen, seen),
                                value.data,
                                value.view(image, 0, seen, kv_column, head_dim),
                                Write::Overwrite,
                                Threads::One,
                            ),
                        }
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
    /// Query `t` sees the keys up to `past + t` (self-attention: as many queries as keys after
    /// the `past` ones).
    pub causal: bool,
    /// Keys before the queries' own, from a cache of a prefix every image shares: query `t`
    /// sits at key position `past + t`. With [`Self::rotary`] these keys come already turned
    /// (the cache holds them so) and the others are turned by their queries' angles; `kv_tokens`
    /// is then `past + q_tokens`. 0 for self-attention over the same tokens.
    pub past: usize,
    /// Each image's real keys, `[batch · kv_tokens]` (`false`: padding, which no query sees).
    pub real_keys: Option<Arc<[bool]>>,
    /// Rotary angles of each query row, `[batch · q_tokens, head_dim]` each, which also turn
    /// the keys after the `past` ones (self-attention).
    pub rotary: Option<RotaryAngles>,
    /// Dropout's multipliers of the probabilities, `[batch, heads, q_tokens, kv_tokens]` (not
    /// with causal attention).
    pub mask: Option<Arc<[f32]>>,
    /// The operands of the forward's and the backward's products: with [`Products::Bf16`],
    /// bf16 with f32 sums where [`attention`] runs them so (AMX, long images, heads of whole
    /// 32-value steps), as PyTorch's autocast runs attention in training; f32 elsewhere.
    pub products: Products,
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
            past: 0,
            real_keys: None,
            rotary: None,
            mask: None,
            products: Products::F32,
        }
    }

    fn shape(&self) -> Heads<'_> {
        Heads {
            heads: self.heads,
            kv_heads: self.kv_heads,
            head_dim: self.head_dim,
            causal_past: self.causal.then_some(self.past),
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

    /// Turns the keys (or their gradients) after the `past` ones of each image by their
    /// queries' angles (nothing without them).
    fn turn_keys(&self, keys: &mut [f32], turn: rotary::Turn) {
        if self.past == 0 {
            return self.turn(keys, self.kv_heads, turn);
        }
        let Some(RotaryAngles { cos, sin }) = &self.rotary else {
            return;
        };
        let (width, angles) = (self.kv_heads * self.head_dim, self.q_tokens * self.head_dim);
        for (image, keys) in keys.chunks_exact_mut(self.kv_tokens * width).enumerate() {
            let at = image * angles..(image + 1) * angles;
            let angles = rotary::Angles {
                cos: &cos[at.clone()],
                sin: &sin[at],
            };
            let new = &mut keys[self.past * width..];
            rotary::rotate_rows(new, width, 0, self.kv_heads, angles, turn);
        }
    }

    /// q and k turned by [`Self::rotary`]'s angles (`None` without them).
    fn rotated(&self, query: &[f32], key: &[f32]) -> Option<(Vec<f32>, Vec<f32>)> {
        self.rotary.as_ref()?;
        let mut query = query.to_vec();
        self.turn(&mut query, self.heads, rotary::Turn::Forward);
        let mut key = key.to_vec();
        self.turn_keys(&mut key, rotary::Turn::Forward);
        Some((query, key))
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
            self.products,
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
        let bf16 = self.products == Products::Bf16 && serves(q_tokens, kv_tokens, head_dim);
        let rhs = |values, view| Rhs::new(bf16, values, view);
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
                let mut kv_operands = None;
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
                    // kᵀ, k and vᵀ as right operands, once per key/value head.
                    if head % group == 0 {
                        kv_operands = Some([
                            rhs(key.data, kv_at(&key).transposed()),
                            rhs(key.data, kv_at(&key)),
                            rhs(value.data, kv_at(&value).transposed()),
                        ]);
                    }
                    let [keys_t, keys, values_t] = kv_operands.as_ref().expect("made at head 0");
                    let queries = rhs(query.data, q_at(&query));
                    let grads = rhs(grad.data, q_at(&grad));
                    // P = softmax(scale · q kᵀ) over the keys each query sees, recomputed.
                    let overwrite = Write::Overwrite;
                    keys_t.multiply((&mut probs, scores), (query.data, q_at(&query)), overwrite);
                    pulp::Arch::new().dispatch(SoftmaxRows {
                        rows: &mut probs,
                        width: kv_tokens,
                        scale: self.scale,
                        dropout: None,
                        causal: self.causal.then_some(self.past + 1),
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
                    grads.multiply((dv, kv_into), (used, scores.transposed()), kv_write);
                    // dP = dO vᵀ (through dropout's multipliers).
                    values_t.multiply((&mut dprobs, scores), (grad.data, q_at(&grad)), overwrite);
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
                    keys.multiply((dq, q_into), (&dprobs, scores), overwrite);
                    queries.multiply((dk, kv_into), (&dprobs, scores.transposed()), kv_write);
                }
            });
        // Carried back through the rotation (its transpose).
        self.turn(&mut dq, heads, rotary::Turn::Back);
        self.turn_keys(&mut dk, rotary::Turn::Back);
        [dq, dk, dv]
    }
}

/// The right operand of one of [`AttentionOp`]'s backward products: f32 values read through a
/// view by the `gemm` crate, or rounded and packed for bf16 products.
enum Rhs<'a> {
    F32(&'a [f32], View),
    Bf16(bf16::Packed),
}

impl<'a> Rhs<'a> {
    /// `values` as `view` shows them, packed when `bf16`.
    fn new(bf16: bool, values: &'a [f32], view: View) -> Self {
        match bf16 {
            true => Rhs::Bf16(bf16::Packed::of_view(values, view)),
            false => Rhs::F32(values, view),
        }
    }

    /// `c = a · self` (or `+=`, as `write` says) on the calling thread; `c`'s view is
    /// row-major, its rows whole multiples of the product's width apart.
    fn multiply(&self, (c, c_view): (&mut [f32], View), (a, a_view): (&[f32], View), write: Write) {
        match self {
            Rhs::F32(b, b_view) => matmul(c, c_view, a, a_view, b, *b_view, write, Threads::One),
            Rhs::Bf16(b) => {
                // Row r of the view is row (start + r · stride) / n of a matrix n wide.
                let (n, start, stride) = (b.columns(), c_view.index(0, 0), c_view.row_stride());
                assert!(
                    n > 0 && start.is_multiple_of(n) && stride.is_multiple_of(n),
                    "attention's gradient rows lie whole widths apart"
                );
                let rows: Vec<usize> = (0..c_view.row_count())
                    .map(|r| (start + r * stride) / n)
                    .collect();
                bf16::view_product_into_rows(c, &rows, write == Write::Add, (a, a_view), b);
            }
        }
    }
}
