//! Attention's two products with bf16 operands and f32 sums on AMX, as PyTorch's CPU autocast
//! runs `scaled_dot_product_attention`: the scores `q kᵀ` and the weighted values `p v`. Each
//! image's keys and values are rounded and packed once per key/value head in the layout the
//! tiles read (16-column panels of pair rows, as [`super::bf16::Packed`], with AVX-512); a tile's
//! query rows are rounded once for all its heads; the scores and probabilities in between stay
//! f32, as the softmax wants them, and the probabilities are rounded as they go into the second
//! product. Blocks of 32 whole rows and keys are stored straight where they belong.

use std::cell::RefCell;

use rayon::prelude::*;

use super::Bf16Isa;
use super::bf16::{BLOCK, K_STEP, TILE, round_row};
use super::lines::Lines;
use crate::host::{Heads, Rows};

/// Query and key tokens per image from which attention's products run in bf16: with fewer, the
/// rounding and packing of every key and value, and the blocks of 32 rows and keys, cost more
/// than AMX saves (an attention layer of 12 heads of 64 on a Sapphire Rapids VM, f32 → bf16:
/// one image of 256 tokens 1.5–2.0 → 0.8–1.1 ms, four 4.0–4.3 → 2.3–2.7 ms; sixteen of 197
/// tokens 12.3–12.5 → 16.1–16.4 ms, their tiles of 66 rows in blocks of 32; sixty-four of 50
/// tokens 4.9–5.0 → 5.5–5.7 ms).
const MIN_TOKENS: usize = 256;

thread_local! {
    /// Each thread's probabilities of the product it is forming, rounded to bf16 in whole
    /// blocks of 32 rows.
    static ROUNDED: RefCell<Lines<u16>> = const { RefCell::new(Lines::new()) };
}

/// The queries, keys and values of one attention call, ready for bf16 products on AMX.
pub(crate) struct Bf16Heads<'a> {
    query: Rows<'a>,
    heads: usize,
    kv_tokens: usize,
    kv_heads: usize,
    head_dim: usize,
    /// Each image's keys per key/value head: `kᵀ` `[head_dim, kv_tokens]` in panels of 16 keys.
    keys: Lines<u16>,
    /// Each image's values per key/value head: `[kv_tokens, head_dim]` in panels of 16 columns,
    /// the keys rounded up to 32 (zeros past the last).
    values: Lines<u16>,
}

impl<'a> Bf16Heads<'a> {
    /// The operands of an attention call over `batch` images, or `None` where these products do
    /// not run: AMX is not the chosen instruction set (or the CPU lacks the AVX-512 that packs
    /// for it: none so far), a head is not whole 32-value steps, or the images have fewer than
    /// [`MIN_TOKENS`] queries or keys.
    pub(crate) fn new(
        query: &Rows<'a>,
        key: &Rows,
        value: &Rows,
        batch: usize,
        shape: &Heads,
    ) -> Option<Bf16Heads<'a>> {
        let head_dim = shape.head_dim;
        if shape.heads == 0 || !serves(query.tokens, key.tokens, head_dim) {
            return None;
        }
        let (kv_heads, kv_tokens) = (shape.kv_heads, key.tokens);
        let per_head = kv_tokens.next_multiple_of(BLOCK) * head_dim;
        let mut keys = Lines::zeros(batch * kv_heads * per_head);
        let mut values = Lines::zeros(batch * kv_heads * per_head);
        // Image by image, token by token: each token's row of keys (and of values) is read
        // once, in order, and spread over the heads' panels.
        (keys.par_chunks_mut((kv_heads * per_head).max(1)))
            .zip(values.par_chunks_mut((kv_heads * per_head).max(1)))
            .enumerate()
            .for_each(|(image, (keys, values))| {
                let start = |rows: &Rows<'_>, token: usize| {
                    rows.offset + image * rows.image_stride + token * rows.row_stride
                };
                let width = kv_heads * head_dim;
                let key_row = |token| &key.data[start(key, token)..][..width];
                let value_row = |token| &value.data[start(value, token)..][..width];
                pack_keys(key_row, [kv_tokens, head_dim], keys);
                pack_values(value_row, [kv_tokens, head_dim], values);
            });
        Some(Bf16Heads {
            query: *query,
            heads: shape.heads,
            kv_tokens,
            kv_heads,
            head_dim,
            keys,
            values,
        })
    }

    /// Query rows `first .. first + rows` of image `image`, every head, rounded to bf16 for
    /// [`Self::scores`] (zero rows after them up to a whole block of 32), with AMX configured on
    /// this thread for the products of these rows until the tile is dropped.
    pub(crate) fn queries(&self, image: usize, [first, rows]: [usize; 2]) -> QueryTile {
        let query = &self.query;
        let width = self.heads * self.head_dim;
        let mut rounded = Lines::zeros(rows.next_multiple_of(BLOCK) * width);
        for (r, to) in rounded.chunks_exact_mut(width).take(rows).enumerate() {
            let from = query.offset + image * query.image_stride + (first + r) * query.row_stride;
            round_row(&query.data[from..][..width], to);
        }
        QueryTile::configured(rounded, rows)
    }

    /// `scores[rows, seen] = q kᵀ` for the `rows` rows of `queries` ([`Self::queries`]) of image
    /// `image` in head `head` against the first `seen` keys of its key/value head `kv_head`.
    pub(crate) fn scores(
        &self,
        queries: &QueryTile,
        image: usize,
        [head, kv_head]: [usize; 2],
        seen: usize,
        scores: &mut [f32],
    ) {
        let head_dim = self.head_dim;
        let width = self.heads * head_dim;
        let keys = &self.keys[self.per_head() * (image * self.kv_heads + kv_head)..];
        let rows = queries.rows;
        let row_blocks = rows.div_ceil(BLOCK);
        let rounded = &queries.rounded[head * head_dim..];
        let steps = head_dim / K_STEP;
        let row_bytes = width * size_of::<u16>();
        for row_block in 0..row_blocks {
            let upper = rounded[row_block * BLOCK * width..].as_ptr();
            let tiles = |step: usize| {
                [upper, upper.wrapping_add(TILE * width)].map(|t| t.wrapping_add(step * K_STEP))
            };
            for key_block in 0..seen.div_ceil(BLOCK) {
                let b = keys[key_block * BLOCK * head_dim..].as_ptr();
                let at = row_block * BLOCK * seen + key_block * BLOCK;
                let part = [rows - row_block * BLOCK, seen - key_block * BLOCK];
                // SAFETY: AMX is configured on this thread (the query tile holds it); the query
                // tiles lie inside `queries` (whole blocks of 32 rows), the key panels inside
                // `keys` (whole blocks of 32 keys, `head_dim` deep); the block's rows and
                // columns inside `scores` are those `part` gives, `seen` apart.
                #[allow(unsafe_code)]
                unsafe {
                    store_block(
                        tiles,
                        row_bytes,
                        (b, head_dim, 0..steps),
                        (scores, at, seen),
                        part,
                    )
                };
            }
        }
    }

    /// `out[r, column ..] = probabilities[r] · v` for each of the `rows` rows of `probabilities`
    /// (`[rows, seen]`, f32: rounded to bf16 here) against the first `seen` values of image
    /// `image`'s key/value head `kv_head`; `out`'s rows are `out_stride` apart, and the head's
    /// `head_dim` columns are written from `column`. The tile of the rows' queries holds AMX
    /// configured on this thread.
    pub(crate) fn weighted_values(
        &self,
        probabilities: &[f32],
        [rows, seen]: [usize; 2],
        (_, image): (&QueryTile, usize),
        kv_head: usize,
        out: &mut [f32],
        [column, out_stride]: [usize; 2],
    ) {
        let values = &self.values[self.per_head() * (image * self.kv_heads + kv_head)..];
        let depth = seen.next_multiple_of(K_STEP);
        let packed_depth = self.kv_tokens.next_multiple_of(BLOCK);
        ROUNDED.with_borrow_mut(|rounded| {
            let row_blocks = rows.div_ceil(BLOCK);
            rounded.resize(row_blocks * BLOCK * depth);
            for (r, to) in rounded.chunks_exact_mut(depth).enumerate() {
                let (to, past) = to.split_at_mut(seen);
                match probabilities.get(r * seen..(r + 1) * seen) {
                    Some(row) => round_row(row, to),
                    None => to.fill(0),
                }
                past.fill(0); // Keys past `seen` would multiply values of keys not seen.
            }
            let row_bytes = depth * size_of::<u16>();
            for row_block in 0..row_blocks {
                let upper = rounded[row_block * BLOCK * depth..].as_ptr();
                let tiles = |step: usize| {
                    [upper, upper.wrapping_add(TILE * depth)].map(|t| t.wrapping_add(step * K_STEP))
                };
                for column_block in 0..self.head_dim / BLOCK {
                    let b = values[column_block * BLOCK * packed_depth..].as_ptr();
                    let at = row_block * BLOCK * out_stride + column + column_block * BLOCK;
                    let part = [rows - row_block * BLOCK, BLOCK];
                    let b = (b, packed_depth, 0..depth / K_STEP);
                    // SAFETY: AMX is configured on this thread (the query tile holds it); the
                    // probability tiles lie inside `rounded` (whole blocks of 32 rows, `depth`
                    // values each), the value panels inside `values` (`seen` ≤ its keys,
                    // rounded up to 32); the block's rows of 32 values lie inside `out`.
                    #[allow(unsafe_code)]
                    unsafe {
                        store_block(tiles, row_bytes, b, (out, at, out_stride), part)
                    };
                }
            }
        });
    }

    /// Packed values of one image's key/value head, keys or values.
    fn per_head(&self) -> usize {
        self.kv_tokens.next_multiple_of(BLOCK) * self.head_dim
    }
}

/// Each head's `kᵀ` `[head_dim, tokens]` rounded into its `packed` panels of 16 keys (heads
/// one after the other, `tokens` rounded up to 32 each), from each token's row of keys `key(t)`
/// (the heads side by side): a panel's `head_dim / 2` pair rows hold, for each of its keys, two
/// neighbouring values of its row — the row's values taken two at a time, transposed.
fn pack_keys<'k>(
    key: impl Fn(usize) -> &'k [f32],
    [tokens, head_dim]: [usize; 2],
    packed: &mut [u16],
) {
    let per_head = tokens.next_multiple_of(BLOCK) * head_dim;
    // A key's 32 values of a head at a time, rounded and scattered into their pair rows.
    for token in 0..tokens {
        let (panel, lane) = (token / TILE * TILE * head_dim, token % TILE);
        for (head, row) in key(token).chunks_exact(head_dim).enumerate() {
            let panel = &mut packed[head * per_head + panel..][..TILE * head_dim];
            for start in (0..head_dim).step_by(K_STEP) {
                let to = &mut panel[start * TILE..][..K_STEP * TILE];
                #[cfg(target_arch = "x86_64")]
                // SAFETY: `packs` found AVX512-BF16; 32 values read, 16 pair rows written.
                #[allow(unsafe_code)]
                unsafe {
                    super::avx512_bf16::scatter_column(row[start..].as_ptr(), to.as_mut_ptr(), lane)
                };
                #[cfg(not(target_arch = "x86_64"))]
                unreachable!("keys are packed only where AMX runs: {to:?}, {lane}");
            }
        }
    }
}

/// Each head's `v` `[tokens, head_dim]` rounded into its `packed` panels of 16 columns (heads
/// one after the other), from each token's row of values `value(t)` (the heads side by side):
/// a panel's `depth / 2` pair rows (`tokens` rounded up to 32) hold, for each of its columns,
/// the values of two neighbouring tokens.
fn pack_values<'v>(
    value: impl Fn(usize) -> &'v [f32],
    [tokens, head_dim]: [usize; 2],
    packed: &mut [u16],
) {
    let depth = tokens.next_multiple_of(BLOCK);
    // Two tokens' 16 values of a head at a time, rounded and interleaved into a pair row.
    let mut zeros = Vec::new();
    for pair in 0..tokens.div_ceil(2) {
        let even = value(2 * pair);
        zeros.resize(even.len(), 0.0);
        let odd = match 2 * pair + 1 < tokens {
            true => value(2 * pair + 1),
            false => &zeros[..],
        };
        for column in (0..even.len()).step_by(TILE) {
            let (head, within) = (column / head_dim, column % head_dim);
            let at = head * depth * head_dim + within * depth + pair * 2 * TILE;
            let to = &mut packed[at..][..2 * TILE];
            let [even, odd] = [even, odd].map(|row| row[column..][..TILE].as_ptr());
            #[cfg(target_arch = "x86_64")]
            // SAFETY: `packs` found the AVX-512 this needs; 16 values read from each row, 32
            // written.
            #[allow(unsafe_code)]
            unsafe {
                super::avx512_bf16::interleave_rows(even, odd, to.as_mut_ptr())
            };
            #[cfg(not(target_arch = "x86_64"))]
            unreachable!("values are packed only where AMX runs: {even:?} {odd:?} {to:?}");
        }
    }
}

/// A tile's query rows rounded to bf16, every head side by side, while AMX is configured on
/// the thread that rounded them (released when dropped; never sent to another thread).
pub(crate) struct QueryTile {
    rounded: Lines<u16>,
    rows: usize,
    _on_this_thread: std::marker::PhantomData<*const ()>,
}

impl QueryTile {
    fn configured(rounded: Lines<u16>, rows: usize) -> QueryTile {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `Bf16Heads::new` found AMX chosen, hence available.
        #[allow(unsafe_code)]
        unsafe {
            super::amx::configure()
        };
        QueryTile {
            rounded,
            rows,
            _on_this_thread: std::marker::PhantomData,
        }
    }
}

impl Drop for QueryTile {
    fn drop(&mut self) {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: configured when made, on this thread (the tile is not `Send`).
        #[allow(unsafe_code)]
        unsafe {
            super::amx::release()
        };
    }
}

/// Whether attention over images of `q_tokens` queries and `kv_tokens` keys, in heads of
/// `head_dim` values, multiplies bf16 operands on AMX (its forward here, its backward's products
/// through [`super::bf16::view_product_into_rows`]): AMX is the chosen instruction set (and the
/// CPU has the AVX-512 that packs for it), heads are whole 32-value steps, and there are at
/// least [`MIN_TOKENS`] queries and keys.
pub(crate) fn serves(q_tokens: usize, kv_tokens: usize, head_dim: usize) -> bool {
    let amx = Bf16Isa::chosen() == Some(Bf16Isa::Amx) && packs();
    let long = q_tokens >= MIN_TOKENS && kv_tokens >= MIN_TOKENS;
    amx && long && head_dim > 0 && head_dim.is_multiple_of(K_STEP)
}

/// Whether this CPU packs keys and values for AMX: AVX512-BF16 and AVX512-BW, which every CPU
/// with AMX has so far.
fn packs() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        super::avx512_bf16::interleaves()
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// One 32 × 32 block of `A · B` ([`super::amx::block_in_place`]: `A`'s tiles where `a_tiles`
/// says; `b` the two 16-column panels, their depth and the steps multiplied) stored into `out`
/// from `at`, rows `stride` apart, where the first `part` rows and columns (each capped at 32)
/// belong: straight there where the block is whole, else through a block of its own, its part
/// copied.
///
/// # Safety
/// As [`super::amx::block_in_place`]; `out` holds the part's rows and columns.
#[allow(unsafe_code)]
unsafe fn store_block(
    a_tiles: impl Fn(usize) -> [*const u16; 2],
    a_stride: usize,
    (b, depth, steps): (*const u16, usize, std::ops::Range<usize>),
    (out, at, stride): (&mut [f32], usize, usize),
    part: [usize; 2],
) {
    #[cfg(target_arch = "x86_64")]
    {
        let [rows, columns] = part.map(|n| n.min(BLOCK));
        if rows == BLOCK && columns == BLOCK {
            let out = (&mut out[at..], stride);
            // SAFETY: as the caller promises; a whole block's 32 rows lie inside `out`.
            unsafe { super::amx::block_in_place(a_tiles, a_stride, b, depth, steps, out, false) };
            return;
        }
        let mut own = [0f32; BLOCK * BLOCK];
        // SAFETY: as the caller promises, into a block of its own.
        unsafe {
            super::amx::block_in_place(a_tiles, a_stride, b, depth, steps, (&mut own, BLOCK), false)
        };
        for (r, sums) in own.chunks_exact(BLOCK).take(rows).enumerate() {
            out[at + r * stride..][..columns].copy_from_slice(&sums[..columns]);
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (a_tiles, a_stride, b, depth, steps, out, at, stride, part);
        unreachable!("bf16 attention products are made only where AMX runs");
    }
}
