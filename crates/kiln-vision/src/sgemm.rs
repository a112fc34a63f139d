//! Large row-major f32 products `C (+)= A · B` on x86-64 CPUs with AVX2 and FMA (and no AVX-512),
//! for the encoders' projections.
//!
//! On two Zen 3 cores the `gemm` crate (burn-flex's kernels) ran SigLIP-B/16's `[6272, 3072] ·
//! [3072, 768]` MLP product (b = 32) at about 110 GFLOP/s where PyTorch's `torch.mm` reached
//! 155–165, and each product was followed by a pass of its own over 16–64 MB for the bias, the
//! activation or the residual sum. This is the packed-panel scheme of Goto & van de Geijn
//! ("Anatomy of high-performance matrix multiplication", 2008): `B` is packed once per product
//! into 16-column panels, each task packs a block of 6-row panels of `A` that stays in L2, and a
//! 6 × 16 register tile (twelve AVX accumulators) runs over a 256-deep block of the inner
//! dimension at a time; after the last block the bias and the activation are applied to the tile
//! as it is stored. Measurements: docs/PERFORMANCE.md.

use rayon::prelude::*;

/// Rows of the register tile: six broadcast `A` values per step.
const MR: usize = 6;
/// Columns of the register tile: two 8-lane AVX registers.
const NR: usize = 16;
/// Longest inner-dimension block: a 6 × 256 `A` panel (6 kB) and a 256 × 16 `B` panel (16 kB)
/// stay in L1.
const KC: usize = 256;
/// Rows per task: a 144 × 256 block of packed `A` (147 kB) stays in L2.
const MC: usize = 144;

/// Whether [`product`] runs a product of `rows` rows here: the CPU has AVX2 and FMA and no
/// AVX-512 (where the `gemm` crate's 512-bit kernels are faster than these 256-bit ones), and the
/// rows make at least two tasks per thread (tasks are blocks of rows).
pub(crate) fn suits(rows: usize) -> bool {
    available() && rows >= min_rows()
}

/// The fewest rows [`suits`] accepts: two tasks per thread.
pub(crate) fn min_rows() -> usize {
    2 * MC * rayon::current_num_threads()
}

/// Whether the CPU has AVX2 and FMA and no AVX-512.
pub(crate) fn available() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("avx2")
            && std::arch::is_x86_feature_detected!("fma")
            && !std::arch::is_x86_feature_detected!("avx512f")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// `c = f(a · b + bias)`, or `c = f(c + a · b + bias)` with `accumulate`, for row-major `a`
/// `[m, k]`, `b` `[k, n]` and `c` `[m, n]` and `bias` `[n]`, on all of rayon's threads. `f` and
/// the bias are applied to each register tile as it is written, never in a pass of their own.
///
/// Panics when a slice is shorter than its shape or the CPU lacks AVX2 and FMA.
#[allow(unsafe_code)]
pub(crate) fn product(
    c: &mut [f32],
    a: &[f32],
    b: &[f32],
    (m, k, n): (usize, usize, usize),
    accumulate: bool,
    bias: &[f32],
    f: impl Fn(f32) -> f32 + Sync,
) {
    assert!(available(), "sgemm::product needs AVX2 + FMA");
    assert!(a.len() >= m * k && b.len() >= k * n && c.len() >= m * n && bias.len() == n);
    if m == 0 || n == 0 {
        return;
    }
    if k == 0 {
        for row in c[..m * n].chunks_exact_mut(n) {
            for (c, b) in row.iter_mut().zip(bias) {
                *c = f(if accumulate { *c } else { 0.0 } + b);
            }
        }
        return;
    }
    let packed_b = pack_b(b, k, n);
    let steps = k.div_ceil(KC);
    let depth = k.div_ceil(steps);
    c[..m * n]
        .par_chunks_mut(MC * n)
        .enumerate()
        .for_each(|(block, c)| {
            let rows = c.len() / n;
            let a = &a[block * MC * k..][..rows * k];
            let mut packed_a = vec![0f32; rows.div_ceil(MR) * MR * depth];
            for step in 0..steps {
                let first = step * depth;
                let depth = depth.min(k - first);
                pack_a(&mut packed_a[..rows.div_ceil(MR) * MR * depth], a, k, first);
                let write = Tile {
                    add: accumulate || step > 0,
                    last: step + 1 == steps,
                };
                for panel in 0..n.div_ceil(NR) {
                    let b = &packed_b[(panel * k + first) * NR..][..depth * NR];
                    let cols = NR.min(n - panel * NR);
                    let mut panel_bias = [0f32; NR];
                    panel_bias[..cols].copy_from_slice(&bias[panel * NR..][..cols]);
                    for (tile, a) in packed_a.chunks_exact(MR * depth).enumerate() {
                        let tile_rows = MR.min(rows - tile * MR);
                        let c = &mut c[tile * MR * n + panel * NR..];
                        let corner = (tile_rows, cols);
                        // SAFETY: `available()` was asserted above; both panels hold `depth`
                        // steps and `c` holds `tile_rows` rows of `n` from its start.
                        unsafe { tile_6x16(a, b, c, n, corner, write, &panel_bias, &f) };
                    }
                }
            }
        });
}
/// `b` `[k, n]` as 16-column panels, each `k` rows of 16 consecutive values (zero past `n`).
fn pack_b(b: &[f32], k: usize, n: usize) -> Vec<f32> {
    let mut packed = vec![0f32; n.div_ceil(NR) * k * NR];
    packed
        .par_chunks_mut(k * NR)
        .enumerate()
        .for_each(|(panel, packed)| {
            let first = panel * NR;
            let cols = NR.min(n - first);
            for (row, out) in packed.chunks_exact_mut(NR).enumerate() {
                out[..cols].copy_from_slice(&b[row * n + first..][..cols]);
            }
        });
    packed
}

/// Columns `first ..` of `a` (rows of `k`) as 6-row panels filling `packed`: as many steps of
/// six values as `packed` holds per panel (zero past the last row).
fn pack_a(packed: &mut [f32], a: &[f32], k: usize, first: usize) {
    let rows = a.len() / k;
    let depth = packed.len() / rows.div_ceil(MR) / MR;
    for (tile, panel) in packed.chunks_exact_mut(MR * depth).enumerate() {
        for r in 0..MR {
            let row = tile * MR + r;
            let values = (row < rows).then(|| &a[row * k + first..][..depth]);
            for step in 0..depth {
                panel[step * MR + r] = values.map_or(0.0, |values| values[step]);
            }
        }
    }
}

/// How a register tile is written into `C`.
#[derive(Debug, Clone, Copy)]
struct Tile {
    /// Added to what `C` holds (a later block of the inner dimension, or `accumulate`).
    add: bool,
    /// The last block of the inner dimension: the bias and `f` follow.
    last: bool,
}

/// One 6 × 16 register tile over the packed panels `a` (`steps × 6`) and `b` (`steps × 16`),
/// written as `write` says into the `rows × cols` corner at the start of `c` (rows `ldc` apart).
///
/// # Safety
/// The CPU has AVX2 and FMA; `a.len() / 6 == b.len() / 16`; `c` holds `rows` rows of `ldc`
/// elements (the last one at least `cols`); `rows ≤ 6`, `cols ≤ 16`.
#[allow(unsafe_code, clippy::too_many_arguments)]
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn tile_6x16(
    a: &[f32],
    b: &[f32],
    c: &mut [f32],
    ldc: usize,
    (rows, cols): (usize, usize),
    write: Tile,
    bias: &[f32; NR],
    f: &impl Fn(f32) -> f32,
) {
    use std::arch::x86_64::*;
    let steps = b.len() / NR;
    debug_assert_eq!(a.len(), steps * MR);
    debug_assert!(rows <= MR && cols <= NR && c.len() >= (rows - 1) * ldc + cols);
    let (a, b) = (a.as_ptr(), b.as_ptr());
    let mut acc = [[_mm256_setzero_ps(); 2]; MR];
    for step in 0..steps {
        // SAFETY: `step < steps`, so both panels hold these values.
        unsafe {
            let b0 = _mm256_loadu_ps(b.add(step * NR));
            let b1 = _mm256_loadu_ps(b.add(step * NR + 8));
            for (r, acc) in acc.iter_mut().enumerate() {
                let a = _mm256_broadcast_ss(&*a.add(step * MR + r));
                acc[0] = _mm256_fmadd_ps(a, b0, acc[0]);
                acc[1] = _mm256_fmadd_ps(a, b1, acc[1]);
            }
        }
    }
    if !write.last && rows == MR && cols == NR {
        for (r, acc) in acc.iter().enumerate() {
            // SAFETY: a full tile: row `r` holds 16 values from `r · ldc`.
            unsafe {
                let out = c.as_mut_ptr().add(r * ldc);
                let (mut lo, mut hi) = (acc[0], acc[1]);
                if write.add {
                    lo = _mm256_add_ps(lo, _mm256_loadu_ps(out));
                    hi = _mm256_add_ps(hi, _mm256_loadu_ps(out.add(8)));
                }
                _mm256_storeu_ps(out, lo);
                _mm256_storeu_ps(out.add(8), hi);
            }
        }
        return;
    }
    let mut tile = [[0f32; NR]; MR];
    for (row, acc) in tile.iter_mut().zip(&acc) {
        // SAFETY: a tile row holds 16 values.
        unsafe {
            _mm256_storeu_ps(row.as_mut_ptr(), acc[0]);
            _mm256_storeu_ps(row.as_mut_ptr().add(8), acc[1]);
        }
    }
    for (r, row) in tile.iter_mut().enumerate().take(rows) {
        let out = &mut c[r * ldc..][..cols];
        if write.add {
            row.iter_mut().zip(out.iter()).for_each(|(v, c)| *v += c);
        }
        if write.last {
            row.iter_mut().zip(bias).for_each(|(v, b)| *v = f(*v + b));
        }
        out.copy_from_slice(&row[..cols]);
    }
}

#[allow(unsafe_code, clippy::too_many_arguments)]
#[cfg(not(target_arch = "x86_64"))]
unsafe fn tile_6x16(
    _: &[f32],
    _: &[f32],
    _: &mut [f32],
    _: usize,
    _: (usize, usize),
    _: Tile,
    _: &[f32; NR],
    _: &impl Fn(f32) -> f32,
) {
    unreachable!("sgemm::available() is false off x86-64")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every shape class: whole tiles, row and column tails, an inner dimension over several
    /// blocks, more rows than one task, no inner dimension; both writes, with a bias and `f`.
    #[test]
    fn products_match_the_definition() {
        if !available() {
            eprintln!("skipped: this CPU has no AVX2 + FMA, or has AVX-512");
            return;
        }
        let f = |v: f32| v.max(0.0) + 0.1 * v;
        for (m, k, n) in [
            (6, 16, 16),
            (7, 5, 3),
            (150, 600, 37),
            (301, 257, 48),
            (1, 1, 1),
            (8, 0, 5),
        ] {
            let a: Vec<f32> = (0..m * k).map(|i| (i as f32 * 0.37).sin()).collect();
            let b: Vec<f32> = (0..k * n).map(|i| (i as f32 * 0.11).cos()).collect();
            let bias: Vec<f32> = (0..n).map(|i| (i as f32 * 0.7).sin()).collect();
            let start: Vec<f32> = (0..m * n).map(|i| (i as f32 * 0.05).sin()).collect();
            for accumulate in [false, true] {
                let mut c = start.clone();
                product(&mut c, &a, &b, (m, k, n), accumulate, &bias, f);
                for (i, j) in (0..m).flat_map(|i| (0..n).map(move |j| (i, j))) {
                    let dot: f64 = (0..k)
                        .map(|p| f64::from(a[i * k + p]) * f64::from(b[p * n + j]))
                        .sum();
                    let before = if accumulate { start[i * n + j] } else { 0.0 };
                    let want = f(before + bias[j] + dot as f32);
                    let got = c[i * n + j];
                    assert!(
                        (got - want).abs() <= 1e-5 * (k as f32).sqrt() * (1.0 + want.abs()),
                        "{m}×{k}×{n} (accumulate {accumulate}) at ({i}, {j}): {got} vs {want}"
                    );
                }
            }
        }
    }
}
