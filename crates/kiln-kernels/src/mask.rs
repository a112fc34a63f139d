//! Counter-based dropout masks: an element's keep/drop bit is a function of `(seed, item id,
//! pass, site, element index)` alone ([`row_key`], then `mask_bits`), so an image gets the
//! same masks whatever batch it is in and on every backend, and any element can be computed on
//! its own (no stream to consume in order). The device kernels (`device_mask`,
//! `device_attention`) compute the same bits.

use std::ops::Range;

use burn::tensor::TensorData;
use kiln_core::splitmix64;
use rayon::prelude::*;

/// The key of one batch row's masks: `(seed, item, pass)` mixed into 64 bits.
pub fn row_key(seed: u64, item: u64, pass: u64) -> u64 {
    splitmix64(splitmix64(splitmix64(seed) ^ item) ^ pass)
}

/// The 32-bit hash "lowbias32" (C. Wellons, hash-prospector): two multiplies, three xor-shifts;
/// only the integer operations every burn backend has on 32-bit integers.
#[inline(always)]
fn lowbias32(mut x: u32) -> u32 {
    x ^= x >> 16;
    x = x.wrapping_mul(0x7feb_352d);
    x ^= x >> 15;
    x = x.wrapping_mul(0x846c_a68b);
    x ^ (x >> 16)
}

/// The two 32-bit words of the mask of the `site`-th dropout site (in forward order) of a row
/// with key `row_key`: an odd multiplier and an offset.
fn site_words(row_key: u64, site: u32) -> (u32, u32) {
    let key = splitmix64(row_key ^ u64::from(site).wrapping_mul(0xd1b5_4a32_d192_ed03));
    ((key as u32) | 1, (key >> 32) as u32)
}

/// The 32 random bits of element `index` of a row's mask at a site with `words`
/// ([`site_words`]): `lowbias32(index · multiplier ⊕ offset)`. Rows' multipliers differ, so two
/// rows' masks are not shifted copies of each other. An element is kept where the bits are at or
/// above `p · 2³²`.
#[inline(always)]
fn mask_bits((multiplier, offset): (u32, u32), index: u32) -> u32 {
    lowbias32(index.wrapping_mul(multiplier) ^ offset)
}

/// One dropout site's mask for every batch row, as hash words rather than values: kernels that
/// consume a mask compute each element's multiplier where they need it.
pub struct HashedMask {
    /// Each batch row's [`site_words`].
    words: Vec<(u32, u32)>,
    /// Kept where the bits are at or above it: `p · 2³²`.
    threshold: u32,
    /// `1 / (1 − p)`.
    kept: f32,
}

impl HashedMask {
    /// The mask of the `site`-th dropout site (in forward order) for rows with keys `keys`
    /// ([`row_key`]), dropping with probability `p` (below 1).
    pub fn new(keys: &[u64], site: u32, p: f64) -> Self {
        HashedMask {
            words: keys.iter().map(|&key| site_words(key, site)).collect(),
            // p < 1, so the threshold fits.
            threshold: (p * 4_294_967_296.0).round() as u32,
            kept: (1.0 / (1.0 - p)) as f32,
        }
    }

    /// Each batch row's multiplier and offset.
    // These three are read by the device mask kernel (features `cuda`, `wgpu`).
    #[cfg_attr(not(any(feature = "cuda", feature = "wgpu")), allow(dead_code))]
    pub(crate) fn words(&self) -> &[(u32, u32)] {
        &self.words
    }

    /// Elements whose bits are at or above it are kept.
    #[cfg_attr(not(any(feature = "cuda", feature = "wgpu")), allow(dead_code))]
    pub(crate) fn threshold(&self) -> u32 {
        self.threshold
    }

    /// The multiplier of a kept element: `1 / (1 − p)`.
    #[cfg_attr(not(any(feature = "cuda", feature = "wgpu")), allow(dead_code))]
    pub(crate) fn kept(&self) -> f32 {
        self.kept
    }

    /// Batch row `row`'s mask over its elements `elements`. Element indices are 32-bit: a
    /// stretch reaching element 2³² is refused (a row of 16 GB of f32).
    pub fn row(&self, row: usize, elements: Range<usize>) -> RowMask {
        assert!(
            u32::try_from(elements.end).is_ok(),
            "a dropout mask row of {} elements: element indices are 32-bit",
            elements.end
        );
        RowMask {
            words: self.words[row],
            threshold: self.threshold,
            kept: self.kept,
            first: elements.start as u32,
        }
    }
}

/// A stretch of one row's mask, from element `first`.
#[derive(Debug, Clone, Copy)]
pub struct RowMask {
    words: (u32, u32),
    threshold: u32,
    kept: f32,
    first: u32,
}

impl RowMask {
    /// The multiplier of the stretch's element `offset`: 0 or `1 / (1 − p)`.
    #[inline(always)]
    pub fn factor(&self, offset: usize) -> f32 {
        let index = self.first.wrapping_add(offset as u32);
        if mask_bits(self.words, index) >= self.threshold {
            self.kept
        } else {
            0.0
        }
    }
}

/// The values of a dropout mask over a `[batch, ..]` tensor: 0 where dropped, `1 / (1 − p)`
/// where kept.
pub fn dropout_mask<const D: usize>(mask: &HashedMask, dims: [usize; D]) -> TensorData {
    let per_row: usize = dims[1..].iter().product();
    let mut values = vec![0f32; per_row * dims[0]];
    for_each_factor(&mut values, per_row, mask, |value, factor| *value = factor);
    TensorData::new(values, dims)
}

/// `apply(value, factor)` for each of `values` (`[batch, per_row]`, row-major) with its
/// element's mask factor, rows and long rows' chunks in parallel.
pub fn for_each_factor(
    values: &mut [f32],
    per_row: usize,
    mask: &HashedMask,
    apply: impl Fn(&mut f32, f32) + Sync,
) {
    const CHUNK: usize = 1 << 14;
    values
        .par_chunks_mut(per_row.max(1))
        .enumerate()
        .for_each(|(row, values)| {
            values
                .par_chunks_mut(CHUNK)
                .enumerate()
                .for_each(|(chunk, values)| {
                    let first = chunk * CHUNK;
                    let stretch = mask.row(row, first..first + values.len());
                    for (offset, value) in values.iter_mut().enumerate() {
                        apply(value, stretch.factor(offset));
                    }
                });
        });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn masks_keep_the_expected_share_and_scale() {
        let keys = [row_key(7, 10, 3), row_key(7, 11, 3)];
        let p = 0.25;
        let mask = dropout_mask(&HashedMask::new(&keys, 0, p), [2, 100_000])
            .to_vec::<f32>()
            .unwrap();
        let kept = mask.iter().filter(|&&m| m != 0.0).count() as f64 / mask.len() as f64;
        // Binomial standard deviation √(p(1−p)/n) ≈ 0.001: 5σ.
        assert!((kept - (1.0 - p)).abs() < 0.005, "kept {kept}");
        assert!(mask.iter().all(|&m| m == 0.0 || m == (1.0 / 0.75) as f32));
        // Mean 1: dropout keeps the expectation.
        let mean = mask.iter().map(|&m| m as f64).sum::<f64>() / mask.len() as f64;
        assert!((mean - 1.0).abs() < 0.01, "mean {mean}");
    }

    /// The bits are pinned, so that other implementations (GPU kernels) can be checked against
    /// them. An independent Python reference gives the same values:
    ///
    /// ```text
    /// M64, M32 = 2**64 - 1, 2**32 - 1
    /// def sm(x):
    ///     z = (x + 0x9E3779B97F4A7C15) & M64
    ///     z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
    ///     z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
    ///     return z ^ (z >> 31)
    /// def lowbias32(x):
    ///     x ^= x >> 16; x = (x * 0x7FEB352D) & M32; x ^= x >> 15
    ///     x = (x * 0x846CA68B) & M32; return x ^ (x >> 16)
    /// row = sm(sm(sm(1) ^ 2) ^ 3)                         # seed 1, item 2, pass 3
    /// key = sm(row ^ ((4 * 0xD1B54A32D192ED03) & M64))    # the 5th site
    /// [lowbias32(((i * ((key & M32) | 1)) & M32) ^ (key >> 32)) for i in range(6)]
    /// ```
    #[test]
    fn mask_bits_match_the_reference() {
        let key = row_key(1, 2, 3);
        let words = site_words(key, 4);
        let bits: Vec<u32> = (0..6).map(|i| mask_bits(words, i)).collect();
        assert_eq!(
            bits,
            [
                77509994, 3576557152, 3875835900, 3198732046, 3767183465, 3428014018
            ]
        );
        // The mask keeps exactly the elements whose bits clear the threshold.
        let p = 0.5;
        let mask = dropout_mask(&HashedMask::new(&[key], 4, p), [1, 6])
            .to_vec::<f32>()
            .unwrap();
        let expected: Vec<f32> = bits
            .iter()
            .map(|&b| if b >= 1 << 31 { 2.0 } else { 0.0 })
            .collect();
        assert_eq!(mask, expected);
    }
}
