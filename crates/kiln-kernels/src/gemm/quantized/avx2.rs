//! The quantized sums on AVX2: a weight group's integers unpacked into one 256-bit register
//! (32 bytes), multiplied with an activation block's by `vpmaddubsw` (unsigned × signed bytes,
//! pairs summed to 16 bits) and `vpmaddwd` (to 32 bits), each half-block scaled in f32.
#![allow(unsafe_code)]

use std::arch::x86_64::*;
use std::ops::Range;

use kiln_core::gguf::{GgmlType, scales_and_mins};

use super::{Blocks, GROUP, QuantMatrix, QuantizedRows, SUPER_BLOCK, Scaling};

/// Whether the CPU has AVX2, FMA and F16C.
pub(super) fn supported() -> bool {
    is_x86_feature_detected!("avx2")
        && is_x86_feature_detected!("fma")
        && is_x86_feature_detected!("f16c")
}

/// `sums[t · weights.len() + r] = x[tile[t]] · w[weights[r]]`, `tile` at most four rows.
///
/// # Safety
/// The CPU must have AVX2, FMA and F16C ([`supported`]).
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn sums(
    w: &QuantMatrix,
    weights: Range<usize>,
    x: &QuantizedRows,
    tile: Range<usize>,
    sums: &mut [f32],
) {
    macro_rules! by_rows {
        ($kernel:ident $(, $kind:expr)?) => {
            match tile.len() {
                1 => $kernel::<1 $(, { $kind })?>(w, weights, x, tile.start, sums),
                2 => $kernel::<2 $(, { $kind })?>(w, weights, x, tile.start, sums),
                3 => $kernel::<3 $(, { $kind })?>(w, weights, x, tile.start, sums),
                4 => $kernel::<4 $(, { $kind })?>(w, weights, x, tile.start, sums),
                rows => unreachable!("a tile of {rows} rows"),
            }
        };
    }
    match w.kind {
        GgmlType::Q4_0 => by_rows!(legacy_sums, Q4_0),
        GgmlType::Q4_1 => by_rows!(legacy_sums, Q4_1),
        GgmlType::Q5_0 => by_rows!(legacy_sums, Q5_0),
        GgmlType::Q5_1 => by_rows!(legacy_sums, Q5_1),
        GgmlType::Q8_0 => by_rows!(legacy_sums, Q8_0),
        GgmlType::BF16 => by_rows!(widened_sums, true),
        GgmlType::F16 => by_rows!(widened_sums, false),
        _ => by_rows!(super_sums),
    }
}

/// [`sums`] for bf16 weights (`BF16`) or f16 ones: 16 weights a step widened to f32 (bf16
/// by a shift, f16 by F16C) and multiplied into two accumulators a row; the last `columns % 16`
/// one at a time.
#[target_feature(enable = "avx2,fma,f16c")]
fn widened_sums<const ROWS: usize, const BF16: bool>(
    w: &QuantMatrix,
    weights: Range<usize>,
    x: &QuantizedRows,
    first: usize,
    sums: &mut [f32],
) {
    let columns = w.columns;
    assert!(
        x.floats.len() >= (first + ROWS) * columns,
        "x holds the tile's rows"
    );
    let (steps, lines) = (columns / 16 * 16, weights.len());
    let x_rows: [&[f32]; ROWS] = std::array::from_fn(|t| &x.floats[(first + t) * columns..]);
    for (r, row) in weights.enumerate() {
        let bytes = w.row(row);
        let mut acc = [[_mm256_setzero_ps(); 2]; ROWS];
        for k in (0..steps).step_by(16) {
            // SAFETY: the row holds `columns` 2-byte values and each `x` row `columns` f32s
            // (asserted), `k + 16 <= columns`.
            unsafe {
                let low = widen::<BF16>(bytes.as_ptr().add(2 * k));
                let high = widen::<BF16>(bytes.as_ptr().add(2 * k + 16));
                for (acc, xi) in acc.iter_mut().zip(x_rows) {
                    let xi = xi.as_ptr().add(k);
                    acc[0] = _mm256_fmadd_ps(low, _mm256_loadu_ps(xi), acc[0]);
                    acc[1] = _mm256_fmadd_ps(high, _mm256_loadu_ps(xi.add(8)), acc[1]);
                }
            }
        }
        for (t, (acc, xi)) in acc.iter().zip(x_rows).enumerate() {
            let tail = (steps..columns).map(|k| {
                let bits = u16::from_le_bytes([bytes[2 * k], bytes[2 * k + 1]]);
                half_value(bits, BF16) * xi[k]
            });
            sums[t * lines + r] = horizontal_sum(_mm256_add_ps(acc[0], acc[1])) + tail.sum::<f32>();
        }
    }
}

/// The bf16 (`bf16`) or f16 value of `bits` as f32.
fn half_value(bits: u16, bf16: bool) -> f32 {
    match bf16 {
        true => f32::from_bits(u32::from(bits) << 16),
        false => half::f16::from_bits(bits).to_f32(),
    }
}

/// The 8 bf16 (`BF16`) or f16 values at `at` as f32.
///
/// # Safety
/// `at` must hold 16 bytes.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn widen<const BF16: bool>(at: *const u8) -> __m256 {
    // SAFETY: as the doc says.
    let bits = unsafe { _mm_loadu_si128(at.cast()) };
    match BF16 {
        true => _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(bits), 16)),
        false => _mm256_cvtph_ps(bits),
    }
}

/// The 32-value block types, as const parameters.
pub(super) const Q4_0: u8 = 0;
pub(super) const Q4_1: u8 = 1;
pub(super) const Q5_0: u8 = 2;
pub(super) const Q5_1: u8 = 3;
pub(super) const Q8_0: u8 = 4;

/// [`sums`] for a 32-value block type `KIND` (one scale and offset a block), specialised for
/// decoding's bandwidth: one row of `x` against eight weight rows at a time ([`eight_rows`]);
/// otherwise a row at a time, the block's f16 scale and minimum converted together and kept in
/// vector registers, blocks read by pointer (the row and `x`'s rows hold `groups` blocks each),
/// two accumulators a row (even and odd blocks) to hide the multiply-add's latency.
#[target_feature(enable = "avx2,fma,f16c")]
fn legacy_sums<const ROWS: usize, const KIND: u8>(
    w: &QuantMatrix,
    weights: Range<usize>,
    x: &QuantizedRows,
    first: usize,
    sums: &mut [f32],
) {
    let block_bytes = w.kind.block().1;
    let x = x.blocks();
    let groups = x.groups;
    assert!(
        x.scales.len() >= (first + ROWS) * groups,
        "x holds the tile's rows"
    );
    let lines = weights.len();
    let x_rows: [usize; ROWS] = std::array::from_fn(|t| (first + t) * groups);
    // Decoding (one row of x): eight weight rows at a time, one lane each.
    let mut done = 0;
    if ROWS == 1 {
        while done + 8 <= lines {
            let rows = std::array::from_fn(|i| w.row(weights.start + done + i).as_ptr());
            // SAFETY: each row holds `groups` blocks, as x's row `first` does (checked above).
            let eight = unsafe { eight_rows::<KIND>(rows, block_bytes, x, x_rows[0]) };
            // SAFETY: `sums` holds a sum for each of the `lines` rows, `done + 8 <= lines`.
            unsafe { _mm256_storeu_ps(sums[done..done + 8].as_mut_ptr(), eight) };
            done += 8;
        }
    }
    for (r, row) in weights.enumerate().skip(done) {
        let row = w.row(row).as_ptr();
        // Even and odd blocks' sums and offsets apart: two chains of multiply-adds, not one.
        let mut even = ([_mm256_setzero_ps(); ROWS], [0f32; ROWS]);
        let mut odd = even;
        let mut b = 0;
        // SAFETY: blocks `b < groups` lie in the row (`groups` blocks of `block_bytes`) and in
        // each of the tile's rows of `x` (checked above).
        unsafe {
            while b + 2 <= groups {
                let block = row.add(b * block_bytes);
                legacy_block::<ROWS, KIND>(block, x, x_rows, b, &mut even);
                let next = row.add((b + 1) * block_bytes);
                legacy_block::<ROWS, KIND>(next, x, x_rows, b + 1, &mut odd);
                b += 2;
            }
            if b < groups {
                let block = row.add(b * block_bytes);
                legacy_block::<ROWS, KIND>(block, x, x_rows, b, &mut even);
            }
        }
        for t in 0..ROWS {
            let sum = horizontal_sum(_mm256_add_ps(even.0[t], odd.0[t]));
            sums[t * lines + r] = sum + (even.1[t] + odd.1[t]);
        }
    }
}

/// The dots of eight weight rows of a 32-value type `KIND` (`rows`, `groups` blocks each) with
/// the row of `x` starting at block `x_row`, lane `i` for row `i`: each block's activations read
/// once for the eight, the eight integer sums gathered into one vector by horizontal adds, and
/// scaled in f32 together — fewer instructions a block than a row at a time takes. The eight
/// rows are eight streams through memory, which the CPU's prefetcher follows poorly (this ran
/// 10–30% slower than a row at a time): the next eight rows, which follow in memory, are fetched
/// a few cache lines a block ahead (5–15% faster than a row at a time, docs/PERFORMANCE.md).
///
/// # Safety
/// Each of `rows` points at `x.groups` whole blocks of `block_bytes`, and `x` holds blocks
/// `x_row..x_row + x.groups`.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn eight_rows<const KIND: u8>(
    rows: [*const u8; 8],
    block_bytes: usize,
    x: &Blocks,
    x_row: usize,
) -> __m256 {
    let groups = x.groups;
    let ones = _mm256_set1_epi16(1);
    let mut acc = _mm256_setzero_ps();
    let mut offsets = _mm256_setzero_ps();
    // The next eight rows (the matrix's rows lie one after another), fetched meanwhile: a few
    // cache lines a block.
    let next = rows[7].wrapping_add(groups * block_bytes);
    let lines = (8 * groups * block_bytes).div_ceil(64);
    let per_block = lines.div_ceil(groups);
    for b in 0..groups {
        for line in b * per_block..((b + 1) * per_block).min(lines) {
            _mm_prefetch::<_MM_HINT_T0>(next.wrapping_add(64 * line).cast());
        }
        let at = x_row + b;
        // SAFETY (every read): as the caller promises.
        unsafe {
            let qx = _mm256_loadu_si256(x.values.as_ptr().add(at * GROUP).cast());
            let dot = |i: usize| {
                let Decoded { q, magnitude, .. } =
                    legacy_decode::<KIND>(rows[i].add(b * block_bytes));
                let qx = if KIND == Q8_0 {
                    _mm256_sign_epi8(qx, q)
                } else {
                    qx
                };
                _mm256_madd_epi16(_mm256_maddubs_epi16(magnitude, qx), ones)
            };
            let pairs = |i: usize| _mm256_hadd_epi32(dot(i), dot(i + 1));
            let (low, high) = (
                _mm256_hadd_epi32(pairs(0), pairs(2)),
                _mm256_hadd_epi32(pairs(4), pairs(6)),
            );
            let dots = _mm256_add_epi32(
                _mm256_permute2x128_si256(low, high, 0x20),
                _mm256_permute2x128_si256(low, high, 0x31),
            );
            // The rows' f16 scales (and minimums) at bytes 0 (and 2) of each block.
            let field = |at: usize| {
                let bits =
                    rows.map(|row| row.add(b * block_bytes + at).cast::<i16>().read_unaligned());
                _mm256_cvtph_ps(_mm_setr_epi16(
                    bits[0], bits[1], bits[2], bits[3], bits[4], bits[5], bits[6], bits[7],
                ))
            };
            let d = field(0);
            let dx = _mm256_broadcast_ss(&*x.scales.as_ptr().add(at));
            acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dots), _mm256_mul_ps(d, dx), acc);
            let block_sum = _mm256_broadcast_ss(&*x.block_sums.as_ptr().add(at));
            let offset = match KIND {
                Q4_0 => _mm256_mul_ps(d, _mm256_set1_ps(-8.0)),
                Q5_0 => _mm256_mul_ps(d, _mm256_set1_ps(-16.0)),
                Q4_1 | Q5_1 => field(2),
                _ => continue,
            };
            offsets = _mm256_fmadd_ps(offset, block_sum, offsets);
        }
    }
    _mm256_add_ps(acc, offsets)
}

/// A 32-value block's integers and scaling, as the byte products read them.
pub(super) struct Decoded {
    /// `[d, m, …]`: the scale and (Q4_1, Q5_1) the minimum, as f32.
    pub(super) fields: __m128,
    /// The integers, value `j` in byte `j` (signed for Q8_0).
    pub(super) q: __m256i,
    /// What `vpmaddubsw` multiplies: the integers, or for Q8_0 their magnitudes.
    pub(super) magnitude: __m256i,
    /// The offset `b` of each value.
    pub(super) offset: f32,
}

/// The block of type `KIND` at `block`.
///
/// # Safety
/// `block` points at a whole block.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(super) unsafe fn legacy_decode<const KIND: u8>(block: *const u8) -> Decoded {
    let low4 = _mm256_set1_epi8(0x0F);
    // SAFETY (every read): the block holds the bytes its type reads at these offsets.
    unsafe {
        let fields = _mm_cvtph_ps(_mm_loadu_si32(block.cast()));
        let nibbles = |at: usize| {
            let packed = _mm_loadu_si128(block.add(at).cast());
            let both = _mm256_set_m128i(_mm_srli_epi16(packed, 4), packed);
            _mm256_and_si256(both, low4)
        };
        let fifth = |at: usize| fifth_bits(std::slice::from_raw_parts(block.add(at), 4));
        let (q, offset) = match KIND {
            Q4_0 => (nibbles(2), -8.0 * _mm_cvtss_f32(fields)),
            Q4_1 => (nibbles(4), _mm_cvtss_f32(_mm_movehdup_ps(fields))),
            Q5_0 => (
                _mm256_or_si256(nibbles(6), fifth(2)),
                -16.0 * _mm_cvtss_f32(fields),
            ),
            Q5_1 => (
                _mm256_or_si256(nibbles(8), fifth(4)),
                _mm_cvtss_f32(_mm_movehdup_ps(fields)),
            ),
            _ => (_mm256_loadu_si256(block.add(2).cast()), 0.0),
        };
        let magnitude = if KIND == Q8_0 {
            _mm256_sign_epi8(q, q)
        } else {
            q
        };
        Decoded {
            fields,
            q,
            magnitude,
            offset,
        }
    }
}

/// One block of a 32-value type `KIND` at `block` against block `b` of each of the tile's rows
/// of `x` (which start at blocks `x_rows`), into the accumulators.
///
/// # Safety
/// `block` points at a whole block; block `b` of each row lies inside `x`.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn legacy_block<const ROWS: usize, const KIND: u8>(
    block: *const u8,
    x: &Blocks,
    x_rows: [usize; ROWS],
    b: usize,
    (acc, offsets): &mut ([__m256; ROWS], [f32; ROWS]),
) {
    let ones = _mm256_set1_epi16(1);
    // SAFETY (every read): the block is whole, and `x` holds the blocks named (the caller's
    // promise).
    unsafe {
        let Decoded {
            fields,
            q,
            magnitude,
            offset,
        } = legacy_decode::<KIND>(block);
        for t in 0..ROWS {
            let at = x_rows[t] + b;
            let qx = _mm256_loadu_si256(x.values.as_ptr().add(at * GROUP).cast());
            let qx = if KIND == Q8_0 {
                _mm256_sign_epi8(qx, q)
            } else {
                qx
            };
            let dots = _mm256_madd_epi16(_mm256_maddubs_epi16(magnitude, qx), ones);
            let scale = _mm_mul_ss(fields, _mm_load_ss(x.scales.as_ptr().add(at)));
            acc[t] = _mm256_fmadd_ps(
                _mm256_cvtepi32_ps(dots),
                _mm256_broadcastss_ps(scale),
                acc[t],
            );
            if KIND != Q8_0 {
                offsets[t] = offset.mul_add(*x.block_sums.get_unchecked(at), offsets[t]);
            }
        }
    }
}

/// [`sums`] for the k-quants (Q4_K, Q5_K, Q6_K: 256-value super-blocks) against the rows
/// quantized per super-block: each group's bytes multiplied by `vpmaddubsw` and weighted by its
/// integer scale (6 bits for Q4_K and Q5_K, 8 per 16 values for Q6_K) by `vpmaddwd`, the
/// minimums (or Q6_K's offset of 32) against the activations' 16-value sums the same way, and
/// one conversion to f32 a super-block. Every integer sum fits: products of at most 63 × 128 a
/// value, scales of at most 128.
#[target_feature(enable = "avx2,fma,f16c")]
fn super_sums<const ROWS: usize>(
    w: &QuantMatrix,
    weights: Range<usize>,
    x: &QuantizedRows,
    first: usize,
    sums: &mut [f32],
) {
    let blocks = w.columns / SUPER_BLOCK;
    let block_bytes = w.kind.block().1;
    let x = x.super_blocks();
    assert!(
        x.scales.len() >= (first + ROWS) * blocks,
        "x holds the tile's rows"
    );
    let lines = weights.len();
    let mut integers = [_mm256_setzero_si256(); 8];
    for (r, row) in weights.enumerate() {
        let mut acc = [_mm256_setzero_ps(); ROWS];
        for (b, block) in w.row(row).chunks_exact(block_bytes).enumerate() {
            unpack(w.kind, block, &mut integers);
            let scaling = IntegerScaling::of_block(w.kind, block);
            for (t, acc) in acc.iter_mut().enumerate() {
                let at = (first + t) * blocks + b;
                let mut products = _mm256_setzero_si256();
                // SAFETY: super-block `at` lies inside `x` (checked above): 256 values, 16 sums.
                let (values, runs) = unsafe {
                    (
                        x.values.as_ptr().add(at * SUPER_BLOCK),
                        _mm256_loadu_si256(x.sums.as_ptr().add(at).cast()),
                    )
                };
                for (g, (&q, &scale)) in integers.iter().zip(&scaling.scales).enumerate() {
                    // SAFETY: as above.
                    let qx = unsafe { _mm256_loadu_si256(values.add(g * GROUP).cast()) };
                    let pairs = _mm256_maddubs_epi16(q, qx);
                    products = _mm256_add_epi32(products, _mm256_madd_epi16(pairs, scale));
                }
                let offsets = _mm256_madd_epi16(scaling.offsets, runs);
                let dx = x.scales[at];
                let products = _mm256_cvtepi32_ps(products);
                *acc = _mm256_fmadd_ps(products, _mm256_set1_ps(scaling.scale * dx), *acc);
                let offsets = _mm256_cvtepi32_ps(offsets);
                *acc = _mm256_fmadd_ps(offsets, _mm256_set1_ps(scaling.offset * dx), *acc);
            }
        }
        for (t, acc) in acc.iter().enumerate() {
            sums[t * lines + r] = horizontal_sum(*acc);
        }
    }
}

/// A k-quant super-block's scaling in integers: value `j` of group `g` is
/// `scale · scales[g][j / 2] · q_j`, plus `offset · offsets[j / 16]`.
struct IntegerScaling {
    /// Each group's integer scale, in the sixteen 16-bit lanes that `vpmaddubsw`'s pair sums of
    /// the group fill (lanes 0–7 its first 16 values, 8–15 its next).
    scales: [__m256i; 8],
    /// Each 16-value run's integer offset.
    offsets: __m256i,
    /// The f32 factor of the scales.
    scale: f32,
    /// The f32 factor of the offsets.
    offset: f32,
}

impl IntegerScaling {
    /// The scaling of `block`, a super-block of `kind`.
    #[target_feature(enable = "avx2,fma,f16c")]
    #[inline]
    fn of_block(kind: GgmlType, block: &[u8]) -> Self {
        match kind {
            GgmlType::Q6_K => {
                // SAFETY: a Q6_K block holds 16 signed 8-bit scales at 192.
                let scales16 = unsafe {
                    _mm256_cvtepi8_epi16(_mm_loadu_si128(block[192..208].as_ptr().cast()))
                };
                let mut scales = [_mm256_setzero_si256(); 8];
                let mut run = [0i16; 16];
                // SAFETY: `run` holds the 32 bytes stored.
                unsafe { _mm256_storeu_si256(run.as_mut_ptr().cast(), scales16) };
                for (g, scale) in scales.iter_mut().enumerate() {
                    *scale = _mm256_set_m128i(
                        _mm_set1_epi16(run[2 * g + 1]),
                        _mm_set1_epi16(run[2 * g]),
                    );
                }
                let d = half(block, 208);
                IntegerScaling {
                    scales,
                    offsets: scales16,
                    scale: d,
                    offset: -32.0 * d,
                }
            }
            _ => {
                let (scales6, mins) = scales_and_mins(&block[4..16]);
                let scales = scales6.map(|s| _mm256_set1_epi16(i16::from(s)));
                // Each minimum twice (its group's two 16-value runs), widened to 16 bits.
                let mins = _mm_cvtsi64_si128(i64::from_le_bytes(mins));
                let offsets = _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(mins, mins));
                IntegerScaling {
                    scales,
                    offsets,
                    scale: half(block, 0),
                    offset: -half(block, 2),
                }
            }
        }
    }
}

/// [`super::quantize_block`] on AVX2: the largest magnitude over the block, then 32 values a
/// step multiplied by `1 / d`, converted to integers (to the nearest, halves to even: the
/// default rounding) and packed to bytes.
///
/// # Safety
/// The CPU must have AVX2, FMA and F16C ([`supported`]).
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn quantize_block(block: &[f32], q: &mut [i8]) -> f32 {
    assert!(
        block.len().is_multiple_of(GROUP) && q.len() == block.len(),
        "whole runs of 32 values"
    );
    let magnitude = _mm256_set1_ps(-0.0);
    let mut largest = _mm256_setzero_ps();
    for eight in block.chunks_exact(8) {
        // SAFETY: `eight` holds the 8 floats loaded.
        let v = unsafe { _mm256_loadu_ps(eight.as_ptr()) };
        largest = _mm256_max_ps(largest, _mm256_andnot_ps(magnitude, v));
    }
    let half = _mm_max_ps(
        _mm256_castps256_ps128(largest),
        _mm256_extractf128_ps(largest, 1),
    );
    let half = _mm_max_ps(half, _mm_movehl_ps(half, half));
    let largest = _mm_cvtss_f32(_mm_max_ss(half, _mm_shuffle_ps(half, half, 1)));
    let d = largest / 127.0;
    let inverse = _mm256_set1_ps(if d == 0.0 { 0.0 } else { 1.0 / d });
    let order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    for (values, q) in block.chunks_exact(GROUP).zip(q.chunks_exact_mut(GROUP)) {
        // SAFETY: `values` holds the 32 floats loaded, `q` the 32 bytes stored.
        unsafe {
            let integers: [__m256i; 4] = std::array::from_fn(|k| {
                let v = _mm256_loadu_ps(values.as_ptr().add(8 * k));
                _mm256_cvtps_epi32(_mm256_mul_ps(v, inverse))
            });
            // Packing works within 128-bit halves: the 4-byte runs come out as 0 2 4 6 1 3 5 7.
            let low = _mm256_packs_epi32(integers[0], integers[1]);
            let high = _mm256_packs_epi32(integers[2], integers[3]);
            let bytes = _mm256_permutevar8x32_epi32(_mm256_packs_epi16(low, high), order);
            _mm256_storeu_si256(q.as_mut_ptr().cast(), bytes);
        }
    }
    d
}

/// The f16 at `bytes[at..at + 2]`, converted by F16C.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn half(bytes: &[u8], at: usize) -> f32 {
    let bits = u16::from_le_bytes([bytes[at], bytes[at + 1]]);
    _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(i32::from(bits))))
}

/// The values of `row` (whole blocks of `kind`) as f32 into `out`: `a · q + b` per group, each
/// multiply-add rounded once (within an ulp of the `gguf` package's values).
///
/// # Safety
/// The CPU must have AVX2, FMA and F16C ([`supported`]).
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn dequantize_row(kind: GgmlType, row: &[u8], out: &mut [f32]) {
    if let GgmlType::F16 | GgmlType::BF16 = kind {
        assert_eq!(row.len(), 2 * out.len(), "2 bytes a value");
        let steps = out.len() / 8 * 8;
        for (k, value) in out[steps..].iter_mut().enumerate() {
            let at = 2 * (steps + k);
            let bits = u16::from_le_bytes([row[at], row[at + 1]]);
            *value = half_value(bits, kind == GgmlType::BF16);
        }
        for (k, out) in out[..steps].chunks_exact_mut(8).enumerate() {
            // SAFETY: the row holds 2 bytes a value of `out` (asserted).
            let values = unsafe {
                match kind {
                    GgmlType::BF16 => widen::<true>(row.as_ptr().add(16 * k)),
                    _ => widen::<false>(row.as_ptr().add(16 * k)),
                }
            };
            // SAFETY: `out` holds the 8 values stored.
            unsafe { _mm256_storeu_ps(out.as_mut_ptr(), values) };
        }
        return;
    }
    let (per_block, block_bytes) = kind.block();
    let mut scaling = [Scaling::default(); 8];
    let mut integers = [_mm256_setzero_si256(); 8];
    for (block, out) in row
        .chunks_exact(block_bytes)
        .zip(out.chunks_exact_mut(per_block))
    {
        let groups = Scaling::of_block(kind, block, &mut scaling, |b, at| half(b, at));
        unpack(kind, block, &mut integers);
        for g in 0..groups {
            let [low, high] = [
                _mm256_castsi256_si128(integers[g]),
                _mm256_extracti128_si256(integers[g], 1),
            ];
            for (h, bytes) in [low, high].into_iter().enumerate() {
                let (a, b) = (
                    _mm256_set1_ps(scaling[g].scale[h]),
                    _mm256_set1_ps(scaling[g].offset[h]),
                );
                for (e, bytes) in [bytes, _mm_srli_si128(bytes, 8)].into_iter().enumerate() {
                    let wide = match kind {
                        GgmlType::Q8_0 => _mm256_cvtepi8_epi32(bytes),
                        _ => _mm256_cvtepu8_epi32(bytes),
                    };
                    let values = _mm256_fmadd_ps(_mm256_cvtepi32_ps(wide), a, b);
                    let at = &mut out[g * GROUP + h * 16 + e * 8..][..8];
                    // SAFETY: `at` holds the 8 values stored.
                    unsafe { _mm256_storeu_ps(at.as_mut_ptr(), values) };
                }
            }
        }
    }
}

/// Each group's integers of `block` into `out` (one register a group: 32 bytes, value `j` in
/// byte `j`), unsigned but for Q8_0's.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(super) fn unpack(kind: GgmlType, block: &[u8], out: &mut [__m256i; 8]) {
    let low4 = _mm256_set1_epi8(0x0F);
    // SAFETY (every load): the block holds the bytes each format reads at these offsets.
    let load16 = |at: usize| unsafe { _mm_loadu_si128(block[at..at + 16].as_ptr().cast()) };
    let load32 = |at: usize| unsafe { _mm256_loadu_si256(block[at..at + 32].as_ptr().cast()) };
    // 16 bytes of two nibbles: values 0..16 from the low nibbles, 16..32 from the high ones.
    let nibbles = |at: usize| {
        let packed = load16(at);
        let both = _mm256_set_m128i(_mm_srli_epi16(packed, 4), packed);
        _mm256_and_si256(both, low4)
    };
    match kind {
        GgmlType::Q8_0 => out[0] = load32(2),
        GgmlType::Q4_0 => out[0] = nibbles(2),
        GgmlType::Q4_1 => out[0] = nibbles(4),
        GgmlType::Q5_0 => out[0] = _mm256_or_si256(nibbles(6), fifth_bits(&block[2..6])),
        GgmlType::Q5_1 => out[0] = _mm256_or_si256(nibbles(8), fifth_bits(&block[4..8])),
        GgmlType::Q4_K | GgmlType::Q5_K => {
            let qs = if kind == GgmlType::Q4_K { 16 } else { 48 };
            let high = (kind == GgmlType::Q5_K).then(|| load32(16));
            for chunk in 0..4 {
                let packed = load32(qs + chunk * 32);
                let halves = [
                    _mm256_and_si256(packed, low4),
                    _mm256_and_si256(_mm256_srli_epi16(packed, 4), low4),
                ];
                for (h, low) in halves.into_iter().enumerate() {
                    let g = chunk * 2 + h;
                    out[g] = match high {
                        None => low,
                        Some(qh) => {
                            let bit = _mm256_set1_epi8(1 << g);
                            let set = _mm256_cmpeq_epi8(_mm256_and_si256(qh, bit), bit);
                            _mm256_or_si256(low, _mm256_and_si256(set, _mm256_set1_epi8(0x10)))
                        }
                    };
                }
            }
        }
        GgmlType::Q6_K => {
            let low2 = _mm256_set1_epi8(0x03);
            for half in 0..2 {
                let ql = [load32(half * 64), load32(half * 64 + 32)];
                let qh = load32(128 + half * 32);
                for part in 0..4 {
                    let low = match part / 2 {
                        0 => _mm256_and_si256(ql[part % 2], low4),
                        _ => _mm256_and_si256(_mm256_srli_epi16(ql[part % 2], 4), low4),
                    };
                    let high = _mm256_and_si256(shift_right(qh, 2 * part), low2);
                    out[half * 4 + part] = _mm256_or_si256(low, _mm256_slli_epi16(high, 4));
                }
            }
        }
        other => unreachable!("{} is not stored", other.name()),
    }
}

/// `x` shifted right by `bits` (0, 2, 4 or 6) in 16-bit lanes (callers mask each byte).
#[target_feature(enable = "avx2")]
fn shift_right(x: __m256i, bits: usize) -> __m256i {
    match bits {
        0 => x,
        2 => _mm256_srli_epi16(x, 2),
        4 => _mm256_srli_epi16(x, 4),
        _ => _mm256_srli_epi16(x, 6),
    }
}

/// The 32 bits of `qh` (little-endian) as bytes: `0x10` where bit `j` is set, else 0.
#[target_feature(enable = "avx2")]
fn fifth_bits(qh: &[u8]) -> __m256i {
    let bits = u32::from_le_bytes([qh[0], qh[1], qh[2], qh[3]]);
    let spread = _mm256_shuffle_epi8(
        _mm256_set1_epi32(bits as i32),
        _mm256_setr_epi8(
            0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, //
            2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3,
        ),
    );
    let mask = _mm256_set1_epi64x(0x8040_2010_0804_0201_u64 as i64);
    let set = _mm256_cmpeq_epi8(_mm256_and_si256(spread, mask), mask);
    _mm256_and_si256(set, _mm256_set1_epi8(0x10))
}

/// The sum of the eight lanes of `v`.
#[target_feature(enable = "avx2")]
fn horizontal_sum(v: __m256) -> f32 {
    let pair = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    let pair = _mm_add_ps(pair, _mm_movehl_ps(pair, pair));
    _mm_cvtss_f32(_mm_add_ss(pair, _mm_shuffle_ps(pair, pair, 1)))
}
