//! Pillow's `Image.resize` on 8-bit RGB, bit for bit (Pillow's `libImaging/Resample.c` and, for
//! the nearest filter, the affine scaling of `Geometry.c`).
//!
//! transformers' PIL processors resize through Pillow, so these are the pixels a Hugging Face
//! model was evaluated on. Pillow works in fixed point: filter weights are computed in f64 per
//! output pixel, normalised to sum to one, then rounded to 22 fractional bits; each pass sums
//! `pixel × weight` in i32 from a half, shifts, clamps to 0–255 and stores 8 bits, and the second
//! pass reads those rounded bytes, so the order of the passes shows in the result (Pillow's rule:
//! [`vertical_first`]). The general-purpose resizer kiln used before (fast_image_resize) differed
//! from Pillow by up to 5 levels at hard edges.

use crate::Resample;

/// Fractional bits of the fixed-point weights (`PRECISION_BITS` in Pillow).
const PRECISION_BITS: u32 = 32 - 8 - 2;
/// Every sum starts at a half, so the final shift rounds.
const HALF: i32 = 1 << (PRECISION_BITS - 1);

impl Resample {
    /// Pillow's filter function and its support at scale 1.
    fn filter(self) -> (fn(f64) -> f64, f64) {
        match self {
            Resample::Box => (box_filter, 0.5),
            Resample::Bilinear => (triangle, 1.0),
            Resample::Hamming => (hamming, 1.0),
            Resample::Bicubic => (bicubic, 2.0),
            Resample::Lanczos => (lanczos, 3.0),
            Resample::Nearest => unreachable!("nearest neighbour does not convolve"),
        }
    }
}

fn box_filter(x: f64) -> f64 {
    if x > -0.5 && x <= 0.5 { 1.0 } else { 0.0 }
}

fn triangle(x: f64) -> f64 {
    let x = x.abs();
    if x < 1.0 { 1.0 - x } else { 0.0 }
}

fn hamming(x: f64) -> f64 {
    let x = x.abs();
    if x == 0.0 {
        return 1.0;
    }
    if x >= 1.0 {
        return 0.0;
    }
    let x = x * std::f64::consts::PI;
    // Pillow writes the window's constants as C floats.
    x.sin() / x * (f64::from(0.54_f32) + f64::from(0.46_f32) * x.cos())
}

/// Keys' cubic with a = −0.5.
fn bicubic(x: f64) -> f64 {
    const A: f64 = -0.5;
    let x = x.abs();
    if x < 1.0 {
        ((A + 2.0) * x - (A + 3.0)) * x * x + 1.0
    } else if x < 2.0 {
        (((x - 5.0) * x + 8.0) * x - 4.0) * A
    } else {
        0.0
    }
}

fn sinc(x: f64) -> f64 {
    if x == 0.0 {
        return 1.0;
    }
    let x = x * std::f64::consts::PI;
    x.sin() / x
}

fn lanczos(x: f64) -> f64 {
    if (-3.0..3.0).contains(&x) {
        sinc(x) * sinc(x / 3.0)
    } else {
        0.0
    }
}

/// One pass's weights: output pixel `o` reads `count[o]` inputs from `first[o]`, with the
/// fixed-point weights `weights[o * taps..][..count[o]]`.
struct Kernel {
    first: Vec<usize>,
    count: Vec<usize>,
    weights: Vec<i32>,
    taps: usize,
}

impl Kernel {
    /// Pillow's `precompute_coeffs` and `normalize_coeffs_8bpc` for `input → output` pixels.
    fn new(input: usize, output: usize, resample: Resample) -> Self {
        let (filter, support) = resample.filter();
        let scale = input as f64 / output as f64;
        let filter_scale = scale.max(1.0);
        let support = support * filter_scale;
        // Pillow multiplies by the reciprocal (which rounds differently from dividing).
        let inverse_scale = 1.0 / filter_scale;
        let taps = support.ceil() as usize * 2 + 1;
        let mut kernel = Kernel {
            first: Vec::with_capacity(output),
            count: Vec::with_capacity(output),
            weights: vec![0; output * taps],
            taps,
        };
        let mut real = Vec::with_capacity(taps);
        for o in 0..output {
            let center = (o as f64 + 0.5) * scale;
            // C casts truncate towards zero; a negative start is then clamped to 0.
            let first = ((center - support + 0.5) as i64).max(0) as usize;
            let end = ((center + support + 0.5) as i64).min(input as i64) as usize;
            real.clear();
            real.extend((first..end).map(|i| filter((i as f64 - center + 0.5) * inverse_scale)));
            let total: f64 = real.iter().sum();
            for (fixed, &w) in kernel.weights[o * taps..].iter_mut().zip(&real) {
                let w = if total != 0.0 { w / total } else { w };
                let shifted = w * f64::from(1 << PRECISION_BITS);
                *fixed = if w < 0.0 {
                    (shifted - 0.5) as i32
                } else {
                    (shifted + 0.5) as i32
                };
            }
            kernel.first.push(first);
            kernel.count.push(end - first);
        }
        kernel
    }

    fn weights(&self, o: usize) -> &[i32] {
        &self.weights[o * self.taps..][..self.count[o]]
    }

    /// The input pixels some output pixel reads.
    fn span(&self) -> std::ops::Range<usize> {
        let last = self.first.len() - 1;
        self.first[0]..self.first[last] + self.count[last]
    }
}

/// A fixed-point sum back to 8 bits.
fn clip8(sum: i32) -> u8 {
    (sum >> PRECISION_BITS).clamp(0, 255) as u8
}

/// Resizes packed RGB `pixels` (`height × width × 3`) to `out_height × out_width` as Pillow's
/// `Image.resize((out_width, out_height), resample)` does.
pub(crate) fn resize_rgb(
    pixels: &[u8],
    (height, width): (usize, usize),
    (out_height, out_width): (usize, usize),
    resample: Resample,
) -> Vec<u8> {
    debug_assert_eq!(pixels.len(), height * width * 3);
    if resample == Resample::Nearest {
        return nearest(pixels, (height, width), (out_height, out_width));
    }
    let vertical = || Kernel::new(height, out_height, resample);
    let horizontal = || Kernel::new(width, out_width, resample);
    match (out_width != width, out_height != height) {
        (false, false) => pixels.to_vec(),
        (true, false) => horizontal_pass(pixels, width, &horizontal()),
        (false, true) => vertical_pass(pixels, width, 0, &vertical()),
        (true, true) if vertical_first((height, width), (out_height, out_width)) => {
            let columns = vertical_pass(pixels, width, 0, &vertical());
            horizontal_pass(&columns, width, &horizontal())
        }
        (true, true) => {
            // Only the input rows the vertical pass reads go through the horizontal one.
            let vertical = vertical();
            let rows = vertical.span();
            let stride = width * 3;
            let resized_rows = horizontal_pass(
                &pixels[rows.start * stride..rows.end * stride],
                width,
                &horizontal(),
            );
            vertical_pass(&resized_rows, out_width, rows.start, &vertical)
        }
    }
}

/// Pillow's choice of pass order (its `ImagingResample` in 13.0): vertical first where the
/// image loses rows, more than twice as many as it loses columns. The 8-bit rounding between the
/// passes makes the order visible.
fn vertical_first(
    (height, width): (usize, usize),
    (out_height, out_width): (usize, usize),
) -> bool {
    let rows_dropped = height as i64 - out_height as i64;
    let columns_dropped = width as i64 - out_width as i64;
    rows_dropped > 0 && rows_dropped > 2 * columns_dropped
}

/// Resamples every row of `rows` (`width × 3` bytes each) to `kernel`'s output width: the
/// vertical pass on the transposed rows. On the cache benchmark two transposes and the vectorised
/// column loop cost less than a per-pixel loop over three interleaved channels (docs/PERFORMANCE.md).
fn horizontal_pass(rows: &[u8], width: usize, kernel: &Kernel) -> Vec<u8> {
    let height = rows.len() / (width * 3);
    let columns = transpose(rows, height, width);
    let resized = vertical_pass(&columns, height, 0, kernel);
    transpose(&resized, kernel.first.len(), height)
}

/// `pixels` (`height × width` RGB) as `width × height`.
fn transpose(pixels: &[u8], height: usize, width: usize) -> Vec<u8> {
    let mut out = vec![0; pixels.len()];
    for (x, column) in out.chunks_exact_mut(height * 3).enumerate() {
        for (y, pixel) in column.chunks_exact_mut(3).enumerate() {
            pixel.copy_from_slice(&pixels[(y * width + x) * 3..][..3]);
        }
    }
    out
}

/// Resamples the columns of `rows` (`width × 3` bytes per row; row 0 is input row `row0`) to
/// `kernel`'s output height.
fn vertical_pass(rows: &[u8], width: usize, row0: usize, kernel: &Kernel) -> Vec<u8> {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU has AVX2, the one requirement of the copy compiled for it.
        #[allow(unsafe_code)]
        return unsafe { vertical_pass_avx2(rows, width, row0, kernel) };
    }
    vertical_pass_portable(rows, width, row0, kernel)
}

/// [`vertical_pass_portable`] compiled for AVX2 (8 products a cycle instead of SSE2's emulated
/// 32-bit multiplies).
///
/// # Safety
/// The CPU has AVX2.
#[allow(unsafe_code)]
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn vertical_pass_avx2(rows: &[u8], width: usize, row0: usize, kernel: &Kernel) -> Vec<u8> {
    vertical_pass_portable(rows, width, row0, kernel)
}

#[inline(always)]
fn vertical_pass_portable(rows: &[u8], width: usize, row0: usize, kernel: &Kernel) -> Vec<u8> {
    let stride = width * 3;
    let out_height = kernel.first.len();
    let mut out = vec![0; out_height * stride];
    let mut sums = vec![0i32; stride];
    for (o, out_row) in out.chunks_exact_mut(stride).enumerate() {
        sums.fill(HALF);
        let first = kernel.first[o] - row0;
        for (tap, &w) in kernel.weights(o).iter().enumerate() {
            let row = &rows[(first + tap) * stride..][..stride];
            for (sum, &p) in sums.iter_mut().zip(row) {
                *sum += i32::from(p) * w;
            }
        }
        for (byte, &sum) in out_row.iter_mut().zip(&sums) {
            *byte = clip8(sum);
        }
    }
    out
}

/// Pillow's nearest neighbour: the source coordinate advances by the scale in f64 from half a
/// step (accumulated, as Pillow does, not multiplied).
fn nearest(
    pixels: &[u8],
    (height, width): (usize, usize),
    (out_h, out_w): (usize, usize),
) -> Vec<u8> {
    let sources = |input: usize, output: usize| -> Vec<usize> {
        let step = input as f64 / output as f64;
        let mut at = step * 0.5;
        (0..output)
            .map(|_| {
                let source = (at as usize).min(input - 1);
                at += step;
                source
            })
            .collect()
    };
    let columns = sources(width, out_w);
    let mut out = Vec::with_capacity(out_h * out_w * 3);
    for y in sources(height, out_h) {
        let row = &pixels[y * width * 3..][..width * 3];
        for &x in &columns {
            out.extend_from_slice(&row[x * 3..x * 3 + 3]);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const FILTERS: [Resample; 6] = [
        Resample::Nearest,
        Resample::Lanczos,
        Resample::Bilinear,
        Resample::Bicubic,
        Resample::Box,
        Resample::Hamming,
    ];

    /// Weights are normalised before rounding, so a flat image stays flat at every size (bit
    /// exactness against Pillow itself is tests/integration/processor_parity.rs).
    #[test]
    fn flat_images_stay_flat_at_every_size() {
        for resample in FILTERS {
            for (from, to) in [
                ((1, 1), (5, 7)),
                ((7, 5), (1, 1)),
                ((9, 31), (4, 250)),
                ((3, 2), (3, 9)),
            ] {
                for value in [0, 1, 128, 254, 255] {
                    let pixels = vec![value; from.0 * from.1 * 3];
                    let out = resize_rgb(&pixels, from, to, resample);
                    assert_eq!(out.len(), to.0 * to.1 * 3);
                    assert!(
                        out.iter().all(|&v| v == value),
                        "{resample:?} {from:?}→{to:?} {value}"
                    );
                }
            }
        }
    }

    #[test]
    fn fixed_point_weights_sum_to_one() {
        for resample in &FILTERS[1..] {
            for (input, output) in [(500, 224), (17, 40), (224, 224), (1000, 3)] {
                let kernel = Kernel::new(input, output, *resample);
                for o in 0..output {
                    let sum: i32 = kernel.weights(o).iter().sum();
                    assert!(
                        (sum - (1 << PRECISION_BITS)).abs() <= kernel.taps as i32,
                        "{resample:?} {sum}"
                    );
                }
            }
        }
    }
}
