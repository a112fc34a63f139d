//! AVX512-BF16: a 32 × 32 block of `C` as four 8 × 32 register tiles (sixteen 512-bit f32
//! accumulators), `vdpbf16ps` multiplying a broadcast pair of `A` values by 16 column pairs
//! of `B`; and the rounding of f32 rows to bf16 (`vcvtne2ps2bf16`) that packing uses, with the
//! interleaving of a packed panel's pair rows.
#![allow(unsafe_code)]

use std::arch::x86_64::*;

use std::ops::Range;

use super::bf16::{BLOCK, K_STEP, TILE};

/// Rows of one register tile.
const ROWS: usize = 8;

/// 32 bf16 values given as integer lanes.
#[inline(always)]
fn as_pairs(v: __m512i) -> __m512bh {
    // SAFETY: both are 64 bytes of plain bits.
    unsafe { std::mem::transmute::<__m512i, __m512bh>(v) }
}

/// Whether the CPU has AVX512-BF16 (with AVX512-F).
pub(super) fn available() -> bool {
    is_x86_feature_detected!("avx512f") && is_x86_feature_detected!("avx512bf16")
}

/// `out (+)= A · B` for one 32 × 32 block over the inner-dimension steps `steps`, `a`, `b`
/// and `out` as [`super::amx::block`] reads and writes them.
///
/// # Safety
/// [`available`] returned true; `steps` lies within `depth / K_STEP`; `a` holds
/// `BLOCK · depth` values and `b` `2 · TILE · depth`.
#[target_feature(enable = "avx512f,avx512bf16")]
pub(super) unsafe fn block(
    a: *const u16,
    b: *const u16,
    depth: usize,
    steps: Range<usize>,
    out: &mut [f32],
    add: bool,
) {
    assert!(out.len() >= BLOCK * BLOCK);
    let right_b = b.wrapping_add(TILE * depth);
    let pairs = steps.start * K_STEP / 2..steps.end * K_STEP / 2;
    for first in (0..BLOCK).step_by(ROWS) {
        let mut acc = [[_mm512_setzero_ps(); 2]; ROWS];
        if add {
            for (row, acc) in acc.iter_mut().enumerate() {
                let out = &out[(first + row) * BLOCK..][..BLOCK];
                // SAFETY: each load reads 16 of the row's 32 values.
                unsafe {
                    acc[0] = _mm512_loadu_ps(out.as_ptr());
                    acc[1] = _mm512_loadu_ps(out.as_ptr().add(TILE));
                }
            }
        }
        for pair in pairs.clone() {
            // SAFETY: pair rows below depth / 2 lie inside both panels; the broadcast pairs
            // inside the block's rows.
            unsafe {
                let left = _mm512_loadu_si512(b.add(pair * 2 * TILE).cast());
                let right = _mm512_loadu_si512(right_b.add(pair * 2 * TILE).cast());
                let (left, right) = (as_pairs(left), as_pairs(right));
                for (row, acc) in acc.iter_mut().enumerate() {
                    let (step, within) = (pair * 2 / K_STEP, pair * 2 % K_STEP);
                    let values = a.add((step * BLOCK + first + row) * K_STEP + within);
                    let values = values.cast::<i32>();
                    let pairs = as_pairs(_mm512_set1_epi32(values.read_unaligned()));
                    acc[0] = _mm512_dpbf16_ps(acc[0], pairs, left);
                    acc[1] = _mm512_dpbf16_ps(acc[1], pairs, right);
                }
            }
        }
        for (row, acc) in acc.iter().enumerate() {
            let out = &mut out[(first + row) * BLOCK..][..BLOCK];
            // SAFETY: each store writes 16 of the row's 32 values.
            unsafe {
                _mm512_storeu_ps(out.as_mut_ptr(), acc[0]);
                _mm512_storeu_ps(out.as_mut_ptr().add(TILE), acc[1]);
            }
        }
    }
}

/// Whether the CPU also has AVX512-BW, which [`interleave_rows`] needs (every CPU with
/// AVX512-BF16 so far has it).
pub(super) fn interleaves() -> bool {
    available() && is_x86_feature_detected!("avx512bw")
}

/// One pair row of a packed 16-column panel from two rows of a row-major matrix: `to[2j]` =
/// bf16(`even[j]`) and `to[2j + 1]` = bf16(`odd[j]`) for the 16 columns `j`.
///
/// # Safety
/// [`interleaves`] returned true; `even` and `odd` hold 16 readable values, `to` 32 writable.
#[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
pub(super) unsafe fn interleave_rows(even: *const f32, odd: *const f32, to: *mut u16) {
    // Lane 2j takes the even row's value j (low half), lane 2j + 1 the odd row's (high half).
    const ORDER: [i16; 32] = {
        let mut order = [0i16; 32];
        let mut lane = 0;
        while lane < 32 {
            order[lane] = (lane / 2 + (lane % 2) * 16) as i16;
            lane += 1;
        }
        order
    };
    // SAFETY: 16 values read from each row, 32 written, as the caller promises.
    unsafe {
        let rounded = _mm512_cvtne2ps_pbh(_mm512_loadu_ps(odd), _mm512_loadu_ps(even));
        let rounded = std::mem::transmute::<__m512bh, __m512i>(rounded);
        let order = _mm512_loadu_si512(ORDER.as_ptr().cast());
        _mm512_storeu_si512(to.cast(), _mm512_permutexvar_epi16(order, rounded));
    }
}

/// One column's 32 values (`column`, contiguous: a transposed matrix's) rounded to bf16 into
/// lane `lane` of 16 pair rows of a packed panel (`panel` its first pair row): pair row `p`
/// takes values `2p` and `2p + 1`.
///
/// # Safety
/// [`available`] returned true; `column` holds 32 readable values, `panel` 16 pair rows of 32
/// writable values; `lane` < 16.
#[target_feature(enable = "avx512f,avx512bf16")]
pub(super) unsafe fn scatter_column(column: *const f32, panel: *mut u16, lane: usize) {
    // SAFETY: 32 values read; each of the 16 pairs written at its pair row's lane.
    unsafe {
        let low = _mm512_loadu_ps(column);
        let high = _mm512_loadu_ps(column.add(TILE));
        let pairs = std::mem::transmute::<__m512bh, __m512i>(_mm512_cvtne2ps_pbh(high, low));
        // Pair row p's lane, in 32-bit words from the panel's start: 16 p + lane.
        let rows = _mm512_mullo_epi32(
            _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
            _mm512_set1_epi32(TILE as i32),
        );
        let at = _mm512_add_epi32(rows, _mm512_set1_epi32(lane as i32));
        _mm512_i32scatter_epi32::<4>(panel.cast(), at, pairs);
    }
}

/// `to[i] = bf16(from[i])`, rounded to nearest even (`to` as long as `from`).
///
/// # Safety
/// [`available`] returned true.
#[target_feature(enable = "avx512f,avx512bf16")]
pub(super) unsafe fn round_row(from: &[f32], to: &mut [u16]) {
    assert_eq!(from.len(), to.len());
    let mut from_chunks = from.chunks_exact(2 * TILE);
    let mut to_chunks = to.chunks_exact_mut(2 * TILE);
    for (from, to) in (&mut from_chunks).zip(&mut to_chunks) {
        // SAFETY: 32 values read, 32 written.
        unsafe {
            let low = _mm512_loadu_ps(from.as_ptr());
            let high = _mm512_loadu_ps(from.as_ptr().add(TILE));
            let rounded = _mm512_cvtne2ps_pbh(high, low);
            _mm512_storeu_si512(
                to.as_mut_ptr().cast(),
                std::mem::transmute::<__m512bh, __m512i>(rounded),
            );
        }
    }
    let (mut from, mut to) = (from_chunks.remainder(), to_chunks.into_remainder());
    if from.len() >= TILE {
        // SAFETY: 16 values read, 16 written.
        unsafe {
            let rounded = _mm512_cvtneps_pbh(_mm512_loadu_ps(from.as_ptr()));
            _mm256_storeu_si256(
                to.as_mut_ptr().cast(),
                std::mem::transmute::<__m256bh, __m256i>(rounded),
            );
        }
        (from, to) = (&from[TILE..], &mut to[TILE..]);
    }
    for (from, to) in from.iter().zip(to) {
        *to = super::bf16::round(*from);
    }
}

/// Accumulators [`resident_products`] keeps busy: enough to cover `vdpbf16ps`'s latency.
const RESIDENT_ACCUMULATORS: usize = 16;

/// FLOP of one step of [`resident_products`]: each accumulator's 16 lanes, 2 pairs each.
pub(super) const RESIDENT_FLOP_PER_STEP: f64 = RESIDENT_ACCUMULATORS as f64 * 16.0 * 2.0 * 2.0;

/// `steps` times one `vdpbf16ps` into each of 16 accumulators, operands in registers: the
/// instruction's own rate. Returns a sum of the accumulators so the work is kept.
///
/// # Safety
/// [`available`] returned true.
#[target_feature(enable = "avx512f,avx512bf16")]
pub(super) unsafe fn resident_products(steps: usize) -> f32 {
    let pairs = as_pairs(_mm512_set1_epi32(std::hint::black_box(0x3f80_3f80)));
    let mut acc = [_mm512_setzero_ps(); RESIDENT_ACCUMULATORS];
    for _ in 0..steps {
        for acc in &mut acc {
            *acc = _mm512_dpbf16_ps(*acc, pairs, pairs);
        }
    }
    acc.iter().map(|&a| _mm512_reduce_add_ps(a)).sum()
}
