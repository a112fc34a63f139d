//! The quantized sums in plain Rust: every CPU, and the reference the AVX2 kernel is tested
//! against.

use std::ops::Range;

use kiln_core::gguf::GgmlType;

use super::{GROUP, QuantMatrix, QuantizedRows, SUPER_BLOCK, Scaling, half};

/// The stored integers of group `g` of `block` (for Q8_0 signed, the others from 0 up).
pub(super) fn integers(kind: GgmlType, block: &[u8], g: usize) -> [i32; GROUP] {
    let mut q = [0i32; GROUP];
    let nibble = |qs: &[u8], j: usize| i32::from((qs[j % 16] >> (4 * (j / 16))) & 0x0F);
    let high_bit = |qh: &[u8], j: usize| {
        let bits = u32::from_le_bytes([qh[0], qh[1], qh[2], qh[3]]);
        ((bits >> j & 1) << 4) as i32
    };
    for (j, q) in q.iter_mut().enumerate() {
        *q = match kind {
            GgmlType::Q8_0 => i32::from(block[2 + j] as i8),
            GgmlType::Q4_0 => nibble(&block[2..], j),
            GgmlType::Q4_1 => nibble(&block[4..], j),
            GgmlType::Q5_0 => nibble(&block[6..], j) | high_bit(&block[2..6], j),
            GgmlType::Q5_1 => nibble(&block[8..], j) | high_bit(&block[4..8], j),
            GgmlType::Q4_K | GgmlType::Q5_K => {
                let qs = if kind == GgmlType::Q4_K {
                    &block[16..144]
                } else {
                    &block[48..176]
                };
                let low = i32::from((qs[g / 2 * 32 + j] >> (4 * (g % 2))) & 0x0F);
                let high = match kind {
                    GgmlType::Q5_K => i32::from((block[16 + j] >> g) & 1) << 4,
                    _ => 0,
                };
                low | high
            }
            GgmlType::Q6_K => {
                let (half, part) = (g / 4, g % 4);
                let low = block[half * 64 + (part % 2) * 32 + j] >> (4 * (part / 2)) & 0x0F;
                let high = (block[128 + half * 32 + j] >> (2 * part)) & 0x03;
                i32::from(low | high << 4)
            }
            other => unreachable!("{} is not stored", other.name()),
        };
    }
    q
}

/// `sums[t · weights.len() + r] = x[tile[t]] · w[weights[r]]`: the 32-value types against the
/// rows quantized per block, the k-quants against the rows quantized per super-block.
pub(super) fn sums(
    w: &QuantMatrix,
    weights: Range<usize>,
    x: &QuantizedRows,
    tile: Range<usize>,
    sums: &mut [f32],
) {
    let (per_block, block_bytes) = w.kind.block();
    let blocks = w.columns / per_block;
    let super_blocks = (per_block == SUPER_BLOCK).then(|| x.super_blocks());
    let quantized = (per_block != SUPER_BLOCK).then(|| x.blocks());
    let mut scaling = [Scaling::default(); 8];
    let lines = weights.len();
    for (r, row) in weights.enumerate() {
        for (t, i) in tile.clone().enumerate() {
            let mut sum = 0f32;
            for (b, block) in w.row(row).chunks_exact(block_bytes).enumerate() {
                let groups = Scaling::of_block(w.kind, block, &mut scaling, half);
                let at = i * blocks + b;
                let (values, d) = match (super_blocks, quantized) {
                    (Some(s), _) => (&s.values[at * SUPER_BLOCK..][..SUPER_BLOCK], s.scales[at]),
                    (_, Some(b)) => (&b.values[at * GROUP..][..GROUP], b.scales[at]),
                    (None, None) => unreachable!("one of the two quantizations"),
                };
                for (g, scaling) in scaling[..groups].iter().enumerate() {
                    let q = integers(w.kind, block, g);
                    let qx = &values[g * GROUP..][..GROUP];
                    for h in 0..2 {
                        let (q, qx) = (&q[h * 16..][..16], &qx[h * 16..][..16]);
                        let dot: i32 = q.iter().zip(qx).map(|(&q, &v)| q * i32::from(v)).sum();
                        let run: i32 = qx.iter().map(|&v| i32::from(v)).sum();
                        sum += d * (scaling.scale[h] * dot as f32 + scaling.offset[h] * run as f32);
                    }
                }
            }
            sums[t * lines + r] = sum;
        }
    }
}

/// [`sums`] for a matrix of one of the [`super::HALVES`]: each weight widened to f32 and
/// multiplied with the rows as given.
pub(super) fn half_sums(
    w: &QuantMatrix,
    weights: Range<usize>,
    x: &QuantizedRows,
    tile: Range<usize>,
    sums: &mut [f32],
) {
    let columns = w.columns;
    let mut values = vec![0f32; columns];
    let lines = weights.len();
    for (r, row) in weights.enumerate() {
        w.dequantize_row_into(row, &mut values);
        for (t, i) in tile.clone().enumerate() {
            let xi = &x.floats[i * columns..][..columns];
            sums[t * lines + r] = values.iter().zip(xi).map(|(w, x)| w * x).sum();
        }
    }
}
