//! ggml's tensor types: their block sizes and, for the types kiln reads, dequantization to f32 as
//! the `gguf` Python package does it (`gguf/quants.py`), operation for operation, so the values
//! are the same bits: each product and sum rounded to f32 in the package's order, no fused
//! multiply-adds.

use half::{bf16, f16};
use rayon::prelude::*;

/// QK_K: the elements of a k-quant super-block.
const QK_K: usize = 256;

macro_rules! ggml_types {
    ($($variant:ident = $id:literal, $name:literal, $block:expr, $bytes:expr;)*) => {
        /// A ggml tensor type, as a GGUF file's tensor infos name it (llama.cpp's `ggml_type`).
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        #[allow(non_camel_case_types, missing_docs)]
        pub enum GgmlType {
            $($variant,)*
        }

        impl GgmlType {
            /// The type of id `id`, if ggml has one.
            pub fn from_id(id: u32) -> Option<Self> {
                match id {
                    $($id => Some(GgmlType::$variant),)*
                    _ => None,
                }
            }

            /// ggml's name for it (`Q4_K`, `BF16`, …).
            pub fn name(self) -> &'static str {
                match self {
                    $(GgmlType::$variant => $name,)*
                }
            }

            /// Elements per block and bytes per block.
            pub fn block(self) -> (usize, usize) {
                match self {
                    $(GgmlType::$variant => ($block, $bytes),)*
                }
            }
        }
    };
}

ggml_types! {
    F32 = 0, "F32", 1, 4;
    F16 = 1, "F16", 1, 2;
    Q4_0 = 2, "Q4_0", 32, 18;
    Q4_1 = 3, "Q4_1", 32, 20;
    Q5_0 = 6, "Q5_0", 32, 22;
    Q5_1 = 7, "Q5_1", 32, 24;
    Q8_0 = 8, "Q8_0", 32, 34;
    Q8_1 = 9, "Q8_1", 32, 40;
    Q2_K = 10, "Q2_K", QK_K, 84;
    Q3_K = 11, "Q3_K", QK_K, 110;
    Q4_K = 12, "Q4_K", QK_K, 144;
    Q5_K = 13, "Q5_K", QK_K, 176;
    Q6_K = 14, "Q6_K", QK_K, 210;
    Q8_K = 15, "Q8_K", QK_K, 292;
    IQ2_XXS = 16, "IQ2_XXS", QK_K, 66;
    IQ2_XS = 17, "IQ2_XS", QK_K, 74;
    IQ3_XXS = 18, "IQ3_XXS", QK_K, 98;
    IQ1_S = 19, "IQ1_S", QK_K, 50;
    IQ4_NL = 20, "IQ4_NL", 32, 18;
    IQ3_S = 21, "IQ3_S", QK_K, 110;
    IQ2_S = 22, "IQ2_S", QK_K, 82;
    IQ4_XS = 23, "IQ4_XS", QK_K, 136;
    I8 = 24, "I8", 1, 1;
    I16 = 25, "I16", 1, 2;
    I32 = 26, "I32", 1, 4;
    I64 = 27, "I64", 1, 8;
    F64 = 28, "F64", 1, 8;
    IQ1_M = 29, "IQ1_M", QK_K, 56;
    BF16 = 30, "BF16", 1, 2;
    TQ1_0 = 34, "TQ1_0", QK_K, 54;
    TQ2_0 = 35, "TQ2_0", QK_K, 66;
    MXFP4 = 39, "MXFP4", 32, 17;
    NVFP4 = 40, "NVFP4", 64, 36;
    Q1_0 = 41, "Q1_0", 128, 18;
}

/// The types kiln dequantizes.
pub const DEQUANTIZED: [GgmlType; 13] = [
    GgmlType::F32,
    GgmlType::F16,
    GgmlType::BF16,
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q5_0,
    GgmlType::Q5_1,
    GgmlType::Q8_0,
    GgmlType::Q2_K,
    GgmlType::Q3_K,
    GgmlType::Q4_K,
    GgmlType::Q5_K,
    GgmlType::Q6_K,
];

/// The f32 values of `bytes`, whole blocks of `kind` (a shorter tail is left out), or `None` for
/// a type kiln does not dequantize. Blocks are dequantized in parallel.
pub fn dequantize(kind: GgmlType, bytes: &[u8]) -> Option<Vec<f32>> {
    let block: fn(&[u8], &mut [f32]) = match kind {
        GgmlType::F32 => |b, y| y[0] = f32::from_le_bytes([b[0], b[1], b[2], b[3]]),
        GgmlType::F16 => |b, y| y[0] = half(b, 0),
        GgmlType::BF16 => |b, y| y[0] = bf16::from_bits(u16::from_le_bytes([b[0], b[1]])).to_f32(),
        GgmlType::Q4_0 => q4_0,
        GgmlType::Q4_1 => q4_1,
        GgmlType::Q5_0 => q5_0,
        GgmlType::Q5_1 => q5_1,
        GgmlType::Q8_0 => q8_0,
        GgmlType::Q2_K => q2_k,
        GgmlType::Q3_K => q3_k,
        GgmlType::Q4_K => q4_k,
        GgmlType::Q5_K => q5_k,
        GgmlType::Q6_K => q6_k,
        _ => return None,
    };
    let (elements, size) = kind.block();
    let mut out = vec![0f32; bytes.len() / size * elements];
    // Chunks of many blocks: a task per 16 KiB of output, not per block.
    let per_task = (4096 / elements).max(1);
    out.par_chunks_mut(per_task * elements)
        .zip(bytes.par_chunks(per_task * size))
        .for_each(|(y, b)| {
            for (y, b) in y.chunks_exact_mut(elements).zip(b.chunks_exact(size)) {
                block(b, y);
            }
        });
    Some(out)
}

fn half(bytes: &[u8], at: usize) -> f32 {
    f16::from_bits(u16::from_le_bytes([bytes[at], bytes[at + 1]])).to_f32()
}

/// The 4-bit value `j` of 32 packed in 16 bytes: low nibbles first, then high ones.
fn nibble(qs: &[u8], j: usize) -> u8 {
    (qs[j % 16] >> (4 * (j / 16))) & 0x0F
}

/// How a legacy block's values scale: `d · (q − offset)` (Q4_0, Q5_0) or `d · q + m` (Q4_1,
/// Q5_1), each kept to its own operations (adding a zero `m` would turn −0 into +0).
enum Scale {
    Centred { d: f32, offset: i8 },
    Shifted { d: f32, m: f32 },
}

/// A 32-element block of the values `q(j)`, scaled.
fn legacy(y: &mut [f32], q: impl Fn(usize) -> u8, scale: Scale) {
    for (j, y) in y.iter_mut().enumerate() {
        *y = match scale {
            Scale::Centred { d, offset } => d * f32::from(q(j) as i8 - offset),
            Scale::Shifted { d, m } => d * f32::from(q(j)) + m,
        };
    }
}

fn q4_0(b: &[u8], y: &mut [f32]) {
    let scale = Scale::Centred {
        d: half(b, 0),
        offset: 8,
    };
    legacy(y, |j| nibble(&b[2..], j), scale);
}

fn q4_1(b: &[u8], y: &mut [f32]) {
    let scale = Scale::Shifted {
        d: half(b, 0),
        m: half(b, 2),
    };
    legacy(y, |j| nibble(&b[4..], j), scale);
}

/// The 5-bit value `j` of 32: a nibble, and bit `j` of the little-endian `qh` as the fifth.
fn five_bits(qh: &[u8], qs: &[u8], j: usize) -> u8 {
    let high = u32::from_le_bytes([qh[0], qh[1], qh[2], qh[3]]) >> j & 1;
    nibble(qs, j) | (high as u8) << 4
}

fn q5_0(b: &[u8], y: &mut [f32]) {
    let scale = Scale::Centred {
        d: half(b, 0),
        offset: 16,
    };
    legacy(y, |j| five_bits(&b[2..6], &b[6..], j), scale);
}

fn q5_1(b: &[u8], y: &mut [f32]) {
    let scale = Scale::Shifted {
        d: half(b, 0),
        m: half(b, 2),
    };
    legacy(y, |j| five_bits(&b[4..8], &b[8..], j), scale);
}

fn q8_0(b: &[u8], y: &mut [f32]) {
    let d = half(b, 0);
    for (j, y) in y.iter_mut().enumerate() {
        *y = f32::from(b[2 + j] as i8) * d;
    }
}

/// The 2-bit value `e` of 256 in 64 bytes: 128 elements per 32 bytes, four shifts of each byte.
fn two_bits(qs: &[u8], e: usize) -> u8 {
    let (half, shift, l) = (e / 128, (e % 128) / 32, e % 32);
    (qs[half * 32 + l] >> (2 * shift)) & 3
}

fn q2_k(b: &[u8], y: &mut [f32]) {
    let (scales, qs) = (&b[..16], &b[16..80]);
    let (d, dmin) = (half(b, 80), half(b, 82));
    for (e, y) in y.iter_mut().enumerate() {
        let scale = scales[e / 16];
        let dl = d * f32::from(scale & 0x0F);
        let ml = dmin * f32::from(scale >> 4);
        *y = dl * f32::from(two_bits(qs, e)) - ml;
    }
}

fn q3_k(b: &[u8], y: &mut [f32]) {
    let (hmask, qs, packed) = (&b[..32], &b[32..96], &b[96..108]);
    let d = half(b, 108);
    let scale = |i: usize| {
        let low = (packed[i % 8] >> (4 * (i / 8))) & 0x0F;
        let high = (packed[8 + i % 4] >> (2 * (i / 4))) & 0x03;
        f32::from((low | high << 4) as i8 - 32)
    };
    for (e, y) in y.iter_mut().enumerate() {
        let dl = d * scale(e / 16);
        let high = (hmask[e % 32] >> (e / 32)) & 1;
        let q = two_bits(qs, e) as i8 - (((high ^ 1) << 2) as i8);
        *y = dl * f32::from(q);
    }
}

/// The 6-bit scales and minimums of a Q4_K / Q5_K super-block's eight sub-blocks, from the
/// 12 bytes that pack them: four bytes at a time, as 32-bit words (a hot path when the CPU
/// multiplies the blocks as stored).
#[inline]
pub fn scales_and_mins(packed: &[u8]) -> ([u8; 8], [u8; 8]) {
    const LOW6: u32 = 0x3F3F_3F3F;
    const LOW4: u32 = 0x0F0F_0F0F;
    const HIGH2: u32 = 0x3030_3030;
    let word =
        |i: usize| u32::from_le_bytes([packed[i], packed[i + 1], packed[i + 2], packed[i + 3]]);
    let (d, m, md) = (word(0), word(4), word(8));
    // Sub-blocks 0–3 in the low six bits of d and m; 4–7 in md's nibbles, their top two bits
    // in d's and m's top two.
    let bytes = |low: u32, high: u32| {
        let [a, b, c, d] = low.to_le_bytes();
        let [e, f, g, h] = high.to_le_bytes();
        [a, b, c, d, e, f, g, h]
    };
    (
        bytes(d & LOW6, (md & LOW4) | ((d >> 2) & HIGH2)),
        bytes(m & LOW6, ((md >> 4) & LOW4) | ((m >> 2) & HIGH2)),
    )
}

/// The 4-bit value `e` of 256 in 128 bytes: 64 elements per 32 bytes, low nibbles first.
fn k_nibble(qs: &[u8], e: usize) -> u8 {
    let (chunk, high, l) = (e / 64, (e % 64) / 32, e % 32);
    (qs[chunk * 32 + l] >> (4 * high)) & 0x0F
}

fn q4_k(b: &[u8], y: &mut [f32]) {
    let (d, dmin) = (half(b, 0), half(b, 2));
    let (scales, mins) = scales_and_mins(&b[4..16]);
    let qs = &b[16..144];
    for (e, y) in y.iter_mut().enumerate() {
        let group = e / 32;
        let dl = d * f32::from(scales[group]);
        let ml = dmin * f32::from(mins[group]);
        *y = dl * f32::from(k_nibble(qs, e)) - ml;
    }
}

fn q5_k(b: &[u8], y: &mut [f32]) {
    let (d, dmin) = (half(b, 0), half(b, 2));
    let (scales, mins) = scales_and_mins(&b[4..16]);
    let (qh, qs) = (&b[16..48], &b[48..176]);
    for (e, y) in y.iter_mut().enumerate() {
        let group = e / 32;
        let dl = d * f32::from(scales[group]);
        let ml = dmin * f32::from(mins[group]);
        let high = (qh[e % 32] >> (e / 32)) & 1;
        *y = dl * f32::from(k_nibble(qs, e) | high << 4) - ml;
    }
}

fn q6_k(b: &[u8], y: &mut [f32]) {
    let (ql, qh, scales) = (&b[..128], &b[128..192], &b[192..208]);
    let d = half(b, 208);
    for (e, y) in y.iter_mut().enumerate() {
        let (half_block, rest) = (e / 128, e % 128);
        let low = (ql[half_block * 64 + rest % 64] >> (4 * (rest / 64))) & 0x0F;
        let high = (qh[half_block * 32 + rest % 32] >> (2 * (rest / 32))) & 0x03;
        let q = (low | high << 4) as i8 - 32;
        let dl = d * f32::from(scales[e / 16] as i8);
        *y = dl * f32::from(q);
    }
}
