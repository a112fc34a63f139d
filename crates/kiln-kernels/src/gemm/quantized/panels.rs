//! Many activation rows (a prompt) against weights as stored, in integers on AVX2: each task
//! unpacks a share of a matrix's rows into a panel, eight rows interleaved by 4-byte quads, and
//! multiplies every row of `x` (quantized per 32 values, llama.cpp's `q8_0`) with it.
//!
//! In the panel, a 32-value block of eight weight rows is eight registers: register `q` holds
//! values `4q..4q + 4` of each of the eight rows, one row a 32-bit lane. One activation quad
//! broadcast to the eight lanes and multiplied by `vpmaddubsw` gives each row's two pair sums
//! in its own lane, so a block's eight dot products land in one register without horizontal
//! adds, and the panel's registers serve three activation rows while they are loaded. The pair
//! sums of a block stay in 16 bits as long as they cannot overflow (all eight quads for 4-bit
//! weights, four for 5- and 6-bit ones, one for 8-bit ones), then one `vpmaddwd` widens them,
//! weighted by ones or, for Q6_K, by each 16 values' integer scale.
#![allow(unsafe_code)]

use std::arch::x86_64::*;

use kiln_core::gguf::GgmlType;

use super::avx2::{Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, half, legacy_decode, unpack};
use super::{Blocks, GROUP, QuantMatrix, Scaling};

/// Weight rows interleaved in a panel.
pub(super) const LANES: usize = 8;

/// Activation rows multiplied with a panel's registers while they are loaded.
pub(super) const TILE: usize = 3;

/// [`LANES`] weight rows unpacked for the byte products, with their scales: small enough to
/// stay in the first-level cache while every row of `x` passes.
#[derive(Default)]
pub(super) struct Panel {
    /// The type unpacked.
    kind: Option<GgmlType>,
    /// 32-value blocks a row.
    blocks: usize,
    /// Eight registers a block, as the module's doc lays them out: unsigned integers, or signed
    /// ones for Q8_0 and Q6_K (its offset of 32 taken off).
    values: Vec<__m256i>,
    /// Each block's eight rows' scales (Q6_K: each row's super-block scale).
    scales: Vec<__m256>,
    /// Each block's eight rows' offsets (none for Q8_0 and Q6_K).
    offsets: Vec<__m256>,
    /// Q6_K: each block's integer scales of its two 16-value halves, row `j`'s in the 16-bit
    /// lanes `2j` and `2j + 1` (where `vpmaddubsw` leaves row `j`'s pair sums).
    subscales: Vec<__m256i>,
}

/// How a type's integers are summed: pair sums added in 16 bits over `run` quads, signed
/// integers (their magnitudes multiplied, the activations given their signs), integer scales
/// per 16 values.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Form {
    run: usize,
    signed: bool,
    subscaled: bool,
}

fn form(kind: GgmlType) -> Form {
    let (run, signed, subscaled) = match kind {
        GgmlType::Q4_0 | GgmlType::Q4_1 | GgmlType::Q4_K => (8, false, false),
        GgmlType::Q5_0 | GgmlType::Q5_1 | GgmlType::Q5_K => (4, false, false),
        GgmlType::Q6_K => (4, true, true),
        GgmlType::Q8_0 => (1, true, false),
        other => unreachable!("{} has no panel form", other.name()),
    };
    Form {
        run,
        signed,
        subscaled,
    }
}

impl Panel {
    /// Rows `rows` of `w` (one of the [`super::STORED`] types, at most [`LANES`] rows; fewer
    /// fill the rest of the lanes with the last) unpacked, replacing what it held.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) fn fill(&mut self, w: &QuantMatrix, rows: std::ops::Range<usize>) {
        assert!(
            !rows.is_empty() && rows.len() <= LANES && rows.end <= w.rows,
            "one to eight of the matrix's rows"
        );
        let rows: [&[u8]; LANES] =
            std::array::from_fn(|j| w.row(rows.start + j.min(rows.len() - 1)));
        self.kind = Some(w.kind);
        self.blocks = w.columns / GROUP;
        self.values.clear();
        self.scales.clear();
        self.offsets.clear();
        self.subscales.clear();
        self.values.reserve(8 * self.blocks);
        self.scales.reserve(self.blocks);
        self.offsets.reserve(self.blocks);
        match w.kind {
            GgmlType::Q4_0 => self.fill_blocks::<Q4_0>(rows),
            GgmlType::Q4_1 => self.fill_blocks::<Q4_1>(rows),
            GgmlType::Q5_0 => self.fill_blocks::<Q5_0>(rows),
            GgmlType::Q5_1 => self.fill_blocks::<Q5_1>(rows),
            GgmlType::Q8_0 => self.fill_blocks::<Q8_0>(rows),
            kind => self.fill_super_blocks(kind, rows),
        }
        debug_assert_eq!(self.scales.len(), self.blocks);
    }

    /// [`Self::fill`] for a 32-value type `KIND`: each block's f16 scales (and minimums) of the
    /// eight rows converted together.
    #[target_feature(enable = "avx2,fma,f16c")]
    fn fill_blocks<const KIND: u8>(&mut self, rows: [&[u8]; LANES]) {
        let block_bytes = self.kind.expect("filling").block().1;
        for b in 0..self.blocks {
            // SAFETY (every read): each row holds `blocks` whole blocks.
            unsafe {
                let blocks = rows.map(|row| row.as_ptr().add(b * block_bytes));
                let integers = blocks.map(|block| legacy_decode::<KIND>(block).q);
                self.values.extend(transpose(integers));
                // The rows' f16 scales (and minimums) at bytes 0 (and 2) of each block.
                let field = |at: usize| {
                    let bits = blocks.map(|block| block.add(at).cast::<i16>().read_unaligned());
                    _mm256_cvtph_ps(_mm_setr_epi16(
                        bits[0], bits[1], bits[2], bits[3], bits[4], bits[5], bits[6], bits[7],
                    ))
                };
                let d = field(0);
                self.scales.push(d);
                match KIND {
                    Q4_0 => self.offsets.push(_mm256_mul_ps(d, _mm256_set1_ps(-8.0))),
                    Q5_0 => self.offsets.push(_mm256_mul_ps(d, _mm256_set1_ps(-16.0))),
                    Q4_1 | Q5_1 => self.offsets.push(field(2)),
                    _ => {}
                }
            }
        }
    }

    /// [`Self::fill`] for the k-quants: each super-block's eight groups.
    #[target_feature(enable = "avx2,fma,f16c")]
    fn fill_super_blocks(&mut self, kind: GgmlType, rows: [&[u8]; LANES]) {
        let block_bytes = kind.block().1;
        let mut integers = [[_mm256_setzero_si256(); 8]; LANES];
        let mut scaling = [[Scaling::default(); 8]; LANES];
        let thirty_two = _mm256_set1_epi8(32);
        let lanes = |values: [f32; LANES]| {
            // SAFETY: `values` holds the 8 floats loaded.
            unsafe { _mm256_loadu_ps(values.as_ptr()) }
        };
        for stored in 0..self.blocks / 8 {
            let blocks = rows.map(|row| &row[stored * block_bytes..][..block_bytes]);
            for j in 0..LANES {
                unpack(kind, blocks[j], &mut integers[j]);
                Scaling::of_block(kind, blocks[j], &mut scaling[j], |b, at| half(b, at));
            }
            for g in 0..8 {
                let mut group: [__m256i; LANES] = std::array::from_fn(|j| integers[j][g]);
                if kind == GgmlType::Q6_K {
                    group = group.map(|r| _mm256_sub_epi8(r, thirty_two));
                }
                self.values.extend(transpose(group));
                if kind == GgmlType::Q6_K {
                    self.scales
                        .push(lanes(blocks.map(|block| half(block, 208))));
                    for h in 0..2 {
                        let scales: [i16; 16] = std::array::from_fn(|lane| {
                            i16::from(blocks[lane / 2][192 + 2 * g + h] as i8)
                        });
                        // SAFETY: `scales` holds the 32 bytes loaded.
                        let v = unsafe { _mm256_loadu_si256(scales.as_ptr().cast()) };
                        self.subscales.push(v);
                    }
                } else {
                    self.scales
                        .push(lanes(std::array::from_fn(|j| scaling[j][g].scale[0])));
                    self.offsets
                        .push(lanes(std::array::from_fn(|j| scaling[j][g].offset[0])));
                }
            }
        }
    }

    /// The sums of the panel's rows with rows `first..first + R` of `x` into `sums[..R]`
    /// (`sums[i][j]`: row `first + i` of `x` with the panel's row `j`).
    ///
    /// # Panics
    /// When the panel was never filled, or `x` does not hold the rows, of the panel's columns.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) fn sums<const R: usize>(
        &self,
        x: &Blocks,
        first: usize,
        sums: &mut [[f32; LANES]; TILE],
    ) {
        let kind = self.kind.expect("a filled panel");
        assert!(
            R <= TILE && x.groups == self.blocks && x.scales.len() >= (first + R) * self.blocks,
            "x holds the rows, of the panel's columns"
        );
        // SAFETY: the panel holds its blocks' registers, `x` the rows (asserted).
        unsafe {
            match form(kind) {
                Form { run: 8, .. } => self.tile::<R, 8, false, false>(x, first, sums),
                Form {
                    run: 4,
                    signed: false,
                    ..
                } => self.tile::<R, 4, false, false>(x, first, sums),
                Form { run: 4, .. } => self.tile::<R, 4, true, true>(x, first, sums),
                _ => self.tile::<R, 1, true, false>(x, first, sums),
            }
        }
    }

    /// [`Self::sums`] for one form: per block, each quad register loaded once for the `R` rows,
    /// pair sums added in 16 bits over `RUN` quads, widened (weighted by the integer scales
    /// where `SUBSCALED`), converted once, scaled by the rows' and the activations' scales, and
    /// the offsets against the activation blocks' sums.
    ///
    /// # Safety
    /// As [`Self::sums`].
    #[target_feature(enable = "avx2,fma,f16c")]
    #[inline]
    unsafe fn tile<const R: usize, const RUN: usize, const SIGNED: bool, const SUBSCALED: bool>(
        &self,
        x: &Blocks,
        first: usize,
        sums: &mut [[f32; LANES]; TILE],
    ) {
        let blocks = self.blocks;
        let ones = _mm256_set1_epi16(1);
        let mut acc = [_mm256_setzero_ps(); R];
        // SAFETY (every read): the panel holds its blocks; x's rows hold `blocks` blocks each.
        unsafe {
            let quads = self.values.as_ptr();
            let xs: [*const i8; R] =
                std::array::from_fn(|i| x.values.as_ptr().add((first + i) * blocks * GROUP));
            for b in 0..blocks {
                let mut dots = [_mm256_setzero_si256(); R];
                for run in 0..8 / RUN {
                    let mut pairs = [_mm256_setzero_si256(); R];
                    for q in run * RUN..(run + 1) * RUN {
                        let w = _mm256_load_si256(quads.add(b * 8 + q));
                        let magnitude = if SIGNED { _mm256_sign_epi8(w, w) } else { w };
                        for i in 0..R {
                            let at = xs[i].add(b * GROUP + 4 * q);
                            let xq = _mm256_set1_epi32(at.cast::<i32>().read_unaligned());
                            let xq = if SIGNED { _mm256_sign_epi8(xq, w) } else { xq };
                            let p = _mm256_maddubs_epi16(magnitude, xq);
                            pairs[i] = _mm256_add_epi16(pairs[i], p);
                        }
                    }
                    let weights = match SUBSCALED {
                        true => *self.subscales.get_unchecked(b * 2 + run),
                        false => ones,
                    };
                    for i in 0..R {
                        dots[i] = _mm256_add_epi32(dots[i], _mm256_madd_epi16(pairs[i], weights));
                    }
                }
                let scale = *self.scales.get_unchecked(b);
                for i in 0..R {
                    let at = (first + i) * blocks + b;
                    let dx = _mm256_set1_ps(*x.scales.get_unchecked(at));
                    let dots = _mm256_cvtepi32_ps(dots[i]);
                    acc[i] = _mm256_fmadd_ps(dots, _mm256_mul_ps(scale, dx), acc[i]);
                    if !SIGNED {
                        let offset = *self.offsets.get_unchecked(b);
                        let sum = _mm256_set1_ps(*x.block_sums.get_unchecked(at));
                        acc[i] = _mm256_fmadd_ps(offset, sum, acc[i]);
                    }
                }
            }
            for (acc, out) in acc.iter().zip(sums.iter_mut()) {
                _mm256_storeu_ps(out.as_mut_ptr(), *acc);
            }
        }
    }
}

/// Share `share` of `shares` of the cache lines of `bytes` fetched into the first-level cache.
pub(super) fn prefetch(bytes: &[u8], share: usize, shares: usize) {
    let lines = bytes.len().div_ceil(64);
    let per_share = lines.div_ceil(shares.max(1));
    for line in (share * per_share..(share + 1) * per_share).take_while(|&l| l < lines) {
        // SAFETY: a prefetch reads nothing and cannot fault; the address lies inside `bytes`.
        unsafe { _mm_prefetch::<_MM_HINT_T0>(bytes.as_ptr().add(64 * line).cast()) };
    }
}

/// Eight rows' registers (row `j`'s 32 bytes in register `j`) as eight quad registers
/// (register `q` holds bytes `4q..4q + 4` of each row, row `j` in lane `j`): an 8 × 8 transpose
/// of 32-bit lanes.
#[target_feature(enable = "avx2")]
fn transpose(r: [__m256i; LANES]) -> [__m256i; LANES] {
    let t = [
        _mm256_unpacklo_epi32(r[0], r[1]),
        _mm256_unpackhi_epi32(r[0], r[1]),
        _mm256_unpacklo_epi32(r[2], r[3]),
        _mm256_unpackhi_epi32(r[2], r[3]),
        _mm256_unpacklo_epi32(r[4], r[5]),
        _mm256_unpackhi_epi32(r[4], r[5]),
        _mm256_unpacklo_epi32(r[6], r[7]),
        _mm256_unpackhi_epi32(r[6], r[7]),
    ];
    // Rows 0–3 (then 4–7) of quads q and q + 4 in each register's halves.
    let u = [
        _mm256_unpacklo_epi64(t[0], t[2]),
        _mm256_unpackhi_epi64(t[0], t[2]),
        _mm256_unpacklo_epi64(t[1], t[3]),
        _mm256_unpackhi_epi64(t[1], t[3]),
        _mm256_unpacklo_epi64(t[4], t[6]),
        _mm256_unpackhi_epi64(t[4], t[6]),
        _mm256_unpacklo_epi64(t[5], t[7]),
        _mm256_unpackhi_epi64(t[5], t[7]),
    ];
    [
        _mm256_permute2x128_si256(u[0], u[4], 0x20),
        _mm256_permute2x128_si256(u[1], u[5], 0x20),
        _mm256_permute2x128_si256(u[2], u[6], 0x20),
        _mm256_permute2x128_si256(u[3], u[7], 0x20),
        _mm256_permute2x128_si256(u[0], u[4], 0x31),
        _mm256_permute2x128_si256(u[1], u[5], 0x31),
        _mm256_permute2x128_si256(u[2], u[6], 0x31),
        _mm256_permute2x128_si256(u[3], u[7], 0x31),
    ]
}
