//! The quantized sums on AVX2: a weight group's integers unpacked into one 256-bit register
//! (32 bytes), multiplied with an activation block's by `vpmaddubsw` (unsigned × signed bytes,
//! pairs summed to 16 bits) and `vpmaddwd` (to 32 bits), each half-block scaled in f32.
#![allow(unsafe_code)]

use std::arch::x86_64::*;
use std::ops::Range;

use kiln_core::gguf::GgmlType;

use super::{GROUP, QuantMatrix, QuantizedRows, Scaling};

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
        _ => by_rows!(tile_sums),
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
                let weight = match BF16 {
                    true => f32::from_bits(u32::from(bits) << 16),
                    false => half::f16::from_bits(bits).to_f32(),
                };
                weight * xi[k]
            });
            sums[t * lines + r] = horizontal_sum(_mm256_add_ps(acc[0], acc[1])) + tail.sum::<f32>();
        }
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
const Q4_0: u8 = 0;
const Q4_1: u8 = 1;
const Q5_0: u8 = 2;
const Q5_1: u8 = 3;
const Q8_0: u8 = 4;

/// [`sums`] for a 32-value block type `KIND` (one scale and offset a block), specialised for
/// decoding's bandwidth: the block's f16 scale and minimum converted together and kept in vector
/// registers, blocks read by pointer (the row and `x`'s rows hold `groups` blocks each), two
/// accumulators a row (even and odd blocks) to hide the multiply-add's latency.
#[target_feature(enable = "avx2,fma,f16c")]
fn legacy_sums<const ROWS: usize, const KIND: u8>(
    w: &QuantMatrix,
    weights: Range<usize>,
    x: &QuantizedRows,
    first: usize,
    sums: &mut [f32],
) {
    let block_bytes = w.kind.block().1;
    let groups = x.groups;
    assert!(
        x.scales.len() >= (first + ROWS) * groups,
        "x holds the tile's rows"
    );
    let lines = weights.len();
    let x_rows: [usize; ROWS] = std::array::from_fn(|t| (first + t) * groups);
    for (r, row) in weights.enumerate() {
        let row = w.row(row).as_ptr();
        // Even and odd blocks' sums and offsets apart: two chains of multiply-adds, not one.
        let mut even = ([_mm256_setzero_ps(); ROWS], [_mm_setzero_ps(); ROWS]);
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
            let offset = _mm_cvtss_f32(_mm_add_ss(even.1[t], odd.1[t]));
            sums[t * lines + r] = sum + offset;
        }
    }
}

/// A 32-value block's integers and scaling, as the byte products read them.
struct Decoded {
    /// `[d, m, …]`: the scale and (Q4_1, Q5_1) the minimum, as f32.
    fields: __m128,
    /// The integers, value `j` in byte `j` (signed for Q8_0).
    q: __m256i,
    /// What `vpmaddubsw` multiplies: the integers, or for Q8_0 their magnitudes.
    magnitude: __m256i,
    /// The offset `b` of each value, in the lowest lane.
    offset: __m128,
}

/// The block of type `KIND` at `block`.
///
/// # Safety
/// `block` points at a whole block.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn legacy_decode<const KIND: u8>(block: *const u8) -> Decoded {
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
            Q4_0 => (nibbles(2), _mm_mul_ss(fields, _mm_set_ss(-8.0))),
            Q4_1 => (nibbles(4), _mm_movehdup_ps(fields)),
            Q5_0 => (
                _mm256_or_si256(nibbles(6), fifth(2)),
                _mm_mul_ss(fields, _mm_set_ss(-16.0)),
            ),
            Q5_1 => (
                _mm256_or_si256(nibbles(8), fifth(4)),
                _mm_movehdup_ps(fields),
            ),
            _ => (_mm256_loadu_si256(block.add(2).cast()), _mm_setzero_ps()),
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
    x: &QuantizedRows,
    x_rows: [usize; ROWS],
    b: usize,
    (acc, offsets): &mut ([__m256; ROWS], [__m128; ROWS]),
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
                let block_sum = _mm_load_ss(x.block_sums.as_ptr().add(at));
                offsets[t] = _mm_fmadd_ss(offset, block_sum, offsets[t]);
            }
        }
    }
}

/// [`sums`] of the `ROWS` rows of `x` from `first`: each weight group unpacked once for all.
#[target_feature(enable = "avx2,fma,f16c")]
fn tile_sums<const ROWS: usize>(
    w: &QuantMatrix,
    weights: Range<usize>,
    x: &QuantizedRows,
    first: usize,
    sums: &mut [f32],
) {
    let (per_block, block_bytes) = w.kind.block();
    let groups_per_block = per_block / GROUP;
    let signed = w.kind == GgmlType::Q8_0;
    let ones = _mm256_set1_epi16(1);
    // Lanes 0–3 take a pair's first value, 4–7 its second.
    let halves = _mm256_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1);
    let lines = weights.len();
    let mut scaling = [Scaling::default(); 8];
    let mut integers = [_mm256_setzero_si256(); 8];
    let rows: [usize; ROWS] = std::array::from_fn(|t| (first + t) * x.groups);
    assert!(
        x.scales.len() >= (first + ROWS) * x.groups,
        "x holds the tile's rows"
    );
    // Two value pairs `[v0, v1]` as one vector.
    let pair = |v: &[f32; 2]| -> __m128 {
        // SAFETY: `v` holds the 8 bytes read.
        unsafe { _mm_castpd_ps(_mm_load_sd(v.as_ptr().cast())) }
    };
    for (r, row) in weights.enumerate() {
        // Even and odd groups apart: two chains of multiply-adds, not one.
        let mut acc = [[_mm256_setzero_ps(); 2]; ROWS];
        let mut offsets = [[_mm_setzero_ps(); 2]; ROWS];
        for (b, block) in w.row(row).chunks_exact(block_bytes).enumerate() {
            Scaling::of_block(w.kind, block, &mut scaling, |b, at| half(b, at));
            unpack(w.kind, block, &mut integers);
            for g in 0..groups_per_block {
                let parity = g % 2;
                let q = integers[g];
                let s = &scaling[g];
                let scale =
                    _mm256_permutevar8x32_ps(_mm256_castps128_ps256(pair(&s.scale)), halves);
                let offset = pair(&s.offset);
                let magnitude = if signed { _mm256_sign_epi8(q, q) } else { q };
                for t in 0..ROWS {
                    let at = rows[t] + b * groups_per_block + g;
                    // SAFETY: block `at` lies inside `x` (checked above).
                    let (qx, dx) = unsafe {
                        (
                            _mm256_loadu_si256(x.values.as_ptr().add(at * GROUP).cast()),
                            _mm256_broadcast_ss(&*x.scales.as_ptr().add(at)),
                        )
                    };
                    let qx = if signed { _mm256_sign_epi8(qx, q) } else { qx };
                    let pairs = _mm256_maddubs_epi16(magnitude, qx);
                    let dots = _mm256_cvtepi32_ps(_mm256_madd_epi16(pairs, ones));
                    let lane = &mut acc[t][parity];
                    *lane = _mm256_fmadd_ps(dots, _mm256_mul_ps(scale, dx), *lane);
                    let lane = &mut offsets[t][parity];
                    *lane = _mm_fmadd_ps(offset, pair(&x.half_sums[at]), *lane);
                }
            }
        }
        for t in 0..ROWS {
            let [even, odd] = acc[t];
            let offsets = _mm_add_ps(offsets[t][0], offsets[t][1]);
            let offset = _mm_cvtss_f32(_mm_add_ss(offsets, _mm_movehdup_ps(offsets)));
            sums[t * lines + r] = horizontal_sum(_mm256_add_ps(even, odd)) + offset;
        }
    }
}

/// The f16 at `bytes[at..at + 2]`, converted by F16C.
#[target_feature(enable = "avx2,fma,f16c")]
fn half(bytes: &[u8], at: usize) -> f32 {
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
        assert!(row.len() == 2 * out.len() && out.len().is_multiple_of(8));
        for (k, out) in out.chunks_exact_mut(8).enumerate() {
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
fn unpack(kind: GgmlType, block: &[u8], out: &mut [__m256i; 8]) {
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
