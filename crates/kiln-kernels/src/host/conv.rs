//! Convolutions over NHWC images as products: each output pixel's receptive field unfolded into
//! one row (tap by tap, each tap's channels contiguous, zeros outside the image), multiplied by
//! the kernel laid out as `[taps · channels, out]`. A transposed convolution is one such product
//! per output phase (the sub-pixel decomposition): the output pixels whose position modulo the
//! stride is the same read the same taps, so no zero is ever inserted or multiplied.
//!
//! The kernels' layouts ([`conv_kernel`], [`transposed_conv_kernels`]) and the windows
//! ([`unfold`], [`Windows`]) agree on the order of a row: taps in row-major order of the
//! kernel window (a transposed phase's in the order of the input pixels they read), then
//! channels.

use std::ops::Range;

use rayon::prelude::*;

/// The shape of an NHWC batch: `[batch, height, width, channels]`.
pub type Nhwc = [usize; 4];

/// A convolution's window: kernel size, stride and zero padding, per axis (height, width).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Window {
    /// Kernel `[height, width]`.
    pub kernel: [usize; 2],
    /// Stride `[height, width]`.
    pub stride: [usize; 2],
    /// Zero padding before and after, `[height, width]`.
    pub padding: [usize; 2],
}

impl Window {
    /// The output `[height, width]` of a convolution of an input `[height, width]`.
    pub fn conv_output(&self, input: [usize; 2]) -> [usize; 2] {
        [0, 1].map(|a| (input[a] + 2 * self.padding[a] - self.kernel[a]) / self.stride[a] + 1)
    }

    /// The output `[height, width]` of a transposed convolution of an input `[height, width]`.
    pub fn transposed_output(&self, input: [usize; 2]) -> [usize; 2] {
        [0, 1].map(|a| (input[a] - 1) * self.stride[a] + self.kernel[a] - 2 * self.padding[a])
    }
}

/// The kernel `[out, in, kh, kw]` (PyTorch's and burn's layout) as the row-major weight
/// `[kh · kw · in, out]` of a product with [`unfold`]'s rows.
pub fn conv_kernel(weight: &[f32], [outputs, inputs, kh, kw]: [usize; 4]) -> Vec<f32> {
    assert_eq!(
        weight.len(),
        outputs * inputs * kh * kw,
        "conv_kernel: shape"
    );
    let mut out = vec![0f32; weight.len()];
    for o in 0..outputs {
        for c in 0..inputs {
            for y in 0..kh {
                for x in 0..kw {
                    let row = (y * kw + x) * inputs + c;
                    out[row * outputs + o] = weight[((o * inputs + c) * kh + y) * kw + x];
                }
            }
        }
    }
    out
}

/// The kernel `[out, in, kh, kw]` as the row-major weight `[in, kh · kw · out]` of a product
/// with the image's pixels as they are: column `tap · out + o` holds tap `tap`'s weights (taps
/// row-major over the window) for output `o`. [`sum_taps`] adds each output pixel's taps of that
/// product.
pub fn tap_kernel(weight: &[f32], [outputs, inputs, kh, kw]: [usize; 4]) -> Vec<f32> {
    assert_eq!(
        weight.len(),
        outputs * inputs * kh * kw,
        "tap_kernel: shape"
    );
    let taps = kh * kw;
    let columns = taps * outputs;
    let mut out = vec![0f32; inputs * columns];
    for (o, c, tap) in
        (0..outputs).flat_map(|o| (0..inputs).flat_map(move |c| (0..taps).map(move |t| (o, c, t))))
    {
        out[c * columns + tap * outputs + o] = weight[(o * inputs + c) * taps + tap];
    }
    out
}

/// `f(bias + Σ taps)` for each output pixel of a convolution by `window` over an NHWC image of
/// `shape` (NHWC `[batch, oh, ow, outputs]`), from the products of the image's pixels with
/// [`tap_kernel`] (`[batch · h · w, taps · outputs]`): each output pixel adds, for every tap whose
/// input pixel lies inside the image, that pixel's block of the tap's outputs. For convolutions
/// to a few outputs, whose product of unfolded windows would fill a 16-column register tile with
/// a handful of columns: the taps fill them instead.
pub fn sum_taps(
    products: &[f32],
    shape: Nhwc,
    window: &Window,
    bias: &[f32],
    f: impl Fn(f32) -> f32 + Sync,
) -> Vec<f32> {
    let [batch, height, width, _] = shape;
    let outputs = bias.len();
    let [kh, kw] = window.kernel;
    let taps = kh * kw;
    assert_eq!(
        products.len(),
        batch * height * width * taps * outputs,
        "sum_taps: products"
    );
    let [oh, ow] = window.conv_output([height, width]);
    let ([sy, sx], [py, px]) = (window.stride, window.padding);
    let mut out = vec![0f32; batch * oh * ow * outputs];
    // The outputs `o` whose tap `k` reads inside the image along an axis: `o · s + k − p` in
    // `[0, size)`.
    let outputs_inside = |k: usize, stride: usize, padding: usize, size: usize, count: usize| {
        let first = padding.saturating_sub(k).div_ceil(stride);
        let end = (size + padding)
            .saturating_sub(k)
            .div_ceil(stride)
            .min(count);
        first..end.max(first)
    };
    let pixel_row = taps * outputs;
    (out.par_chunks_mut((ow * outputs).max(1)).enumerate()).for_each(|(line, out)| {
        let (b, oy) = (line / oh, line % oh);
        for y in out.chunks_exact_mut(outputs.max(1)) {
            y.copy_from_slice(bias);
        }
        // Tap by tap along the line: no bounds to test per pixel.
        for ky in 0..kh {
            let Some(iy) = (oy * sy + ky).checked_sub(py).filter(|&iy| iy < height) else {
                continue;
            };
            let input_row = &products[(b * height + iy) * width * pixel_row..][..width * pixel_row];
            for kx in 0..kw {
                let tap = (ky * kw + kx) * outputs;
                for ox in outputs_inside(kx, sx, px, width, ow) {
                    let ix = ox * sx + kx - px;
                    let from = &input_row[ix * pixel_row + tap..][..outputs];
                    let y = &mut out[ox * outputs..][..outputs];
                    y.iter_mut().zip(from).for_each(|(y, p)| *y += p);
                }
            }
        }
        out.iter_mut().for_each(|v| *v = f(*v));
    });
    out
}

/// Row-major `[batch · oh · ow, kh · kw · c]`: each output pixel's window over `x` (NHWC of shape
/// `shape`), zeros where it leaves the image.
pub fn unfold(x: &[f32], shape: Nhwc, window: &Window) -> Vec<f32> {
    Windows::new(x, shape, *window).unfolded()
}

/// Each output pixel's window over an NHWC image as the rows of a product, read where they lie:
/// row `(b, oy, ox)` is what [`unfold`] writes for that pixel (taps in row-major order, each
/// tap's channels, zeros outside the image), without writing it out.
#[derive(Debug, Clone, Copy)]
pub struct Windows<'a> {
    pub(crate) x: &'a [f32],
    pub(crate) shape: Nhwc,
    pub(crate) kernel: [usize; 2],
    pub(crate) stride: [usize; 2],
    /// The input position (may be outside the image) of output `(0, 0)`'s first tap.
    pub(crate) origin: [isize; 2],
    /// Output `[height, width]`.
    pub(crate) out: [usize; 2],
}

impl<'a> Windows<'a> {
    /// The windows of a convolution by `window` over `x` (NHWC `shape`).
    pub fn new(x: &'a [f32], shape: Nhwc, window: Window) -> Self {
        let [batch, height, width, channels] = shape;
        assert_eq!(x.len(), batch * height * width * channels, "Windows: shape");
        Windows {
            x,
            shape,
            kernel: window.kernel,
            stride: window.stride,
            origin: window.padding.map(|p| -(p as isize)),
            out: window.conv_output([height, width]),
        }
    }

    /// The windows of output phase `(py, px)` of a transposed convolution by `window` over `x`
    /// (NHWC `shape`), and each row's output pixel (its offset in the NHWC output, in pixels).
    /// The outputs `o` with `(o + padding) % stride == phase` (the sub-pixel decomposition) read
    /// one tap in every `stride` of the kernel, input pixels side by side: a stride-1
    /// convolution, its taps in the order [`transposed_conv_kernels`] lays the phase's kernel
    /// out (the kernel's taps from last to first).
    pub fn transposed_phase(
        x: &'a [f32],
        shape: Nhwc,
        window: &Window,
        (py, px): (usize, usize),
    ) -> (Self, Vec<usize>) {
        let [batch, height, width, channels] = shape;
        assert_eq!(x.len(), batch * height * width * channels, "Windows: shape");
        let [oh, ow] = window.transposed_output([height, width]);
        // Per axis: the phase's first output, its outputs, its taps and the input pixel its
        // first output's first (last in the kernel) tap reads.
        let axis = |size: usize, a: usize, phase: usize| {
            let (kernel, stride, padding) = (window.kernel[a], window.stride[a], window.padding[a]);
            let first = (phase + stride - padding % stride) % stride;
            let outputs = size.saturating_sub(first).div_ceil(stride);
            let taps = phase_taps(kernel, stride, phase).len();
            // Output `first` reads input `(first + padding − phase) / stride − j` with tap `j`.
            let origin = ((first + padding - phase) / stride) as isize - taps as isize + 1;
            (first, outputs, taps, origin)
        };
        let (first_y, rows, taps_y, origin_y) = axis(oh, 0, py);
        let (first_x, columns, taps_x, origin_x) = axis(ow, 1, px);
        let pixels = (0..batch)
            .flat_map(|b| (0..rows).map(move |m| (b, first_y + m * window.stride[0])))
            .flat_map(|(b, oy)| {
                (0..columns).map(move |n| (b * oh + oy) * ow + first_x + n * window.stride[1])
            })
            .collect();
        let windows = Windows {
            x,
            shape,
            kernel: [taps_y, taps_x],
            stride: [1, 1],
            origin: [origin_y, origin_x],
            out: [rows, columns],
        };
        (windows, pixels)
    }

    /// Rows: the output pixels, `batch · oh · ow`.
    pub fn rows(&self) -> usize {
        self.shape[0] * self.out[0] * self.out[1]
    }

    /// Values per row: `kh · kw · channels`.
    pub fn depth(&self) -> usize {
        self.kernel[0] * self.kernel[1] * self.shape[3]
    }

    /// Every row written out, row-major `[rows, depth]` ([`unfold`]).
    pub fn unfolded(&self) -> Vec<f32> {
        let depth = self.depth();
        let mut rows = vec![0f32; self.rows() * depth];
        (rows.par_chunks_mut(depth.max(1)).enumerate())
            .for_each(|(row, strip)| self.read(row, 0, strip));
        rows
    }

    /// Values of one kernel row of a window, `kw · channels`: in the image, its taps' pixels
    /// lie side by side.
    pub fn kernel_row(&self) -> usize {
        self.kernel[1] * self.shape[3]
    }

    /// The input position of output `o`'s tap `k` along axis `a`, if inside the image.
    fn input(&self, a: usize, o: usize, k: usize) -> Option<usize> {
        let at = self.origin[a] + (o * self.stride[a] + k) as isize;
        let size = self.shape[1 + a];
        usize::try_from(at).ok().filter(|&at| at < size)
    }

    /// Where rows `rows` lie in the image over the columns of kernel row `ky` (`ky ·
    /// kernel_row() ..`), as a matrix read in place: the image from the returned offset, one
    /// row every returned stride of values. `None` unless the rows are neighbours along one
    /// output row and every tap of that kernel row of theirs lies inside the image.
    pub fn kernel_row_in_place(&self, rows: Range<usize>, ky: usize) -> Option<(&[f32], usize)> {
        let [_, height, width, channels] = self.shape;
        let [oh, ow] = self.out;
        let (b, oy, ox) = (
            rows.start / (oh * ow),
            rows.start / ow % oh,
            rows.start % ow,
        );
        let last_ox = ox + rows.len().checked_sub(1)?;
        if last_ox >= ow {
            return None;
        }
        let iy = self.input(0, oy, ky)?;
        let ix = self.input(1, ox, 0)?;
        self.input(1, last_ox, self.kernel[1] - 1)?;
        let sx = self.stride[1];
        let from = ((b * height + iy) * width + ix) * channels;
        Some((&self.x[from..], sx * channels))
    }

    /// Fills `segment` with row `row`'s values from column `first` on.
    pub fn read(&self, row: usize, first: usize, segment: &mut [f32]) {
        let [_, height, width, channels] = self.shape;
        let [oh, ow] = self.out;
        let (b, oy, ox) = (row / (oh * ow), row / ow % oh, row % ow);
        let (mut column, mut filled) = (first, 0);
        let kw = self.kernel[1];
        while filled < segment.len() {
            let (tap, channel) = (column / channels, column % channels);
            let (ky, kx) = (tap / kw, tap % kw);
            let (iy, ix) = (self.input(0, oy, ky), self.input(1, ox, kx));
            let left = segment.len() - filled;
            let run = match (iy, ix) {
                (Some(iy), Some(ix)) => {
                    // The taps `kx..` of this kernel row read neighbouring pixels, contiguous
                    // in NHWC: one run across all of them that lie inside the image.
                    let inside = (kw - kx).min(width - ix);
                    let run = (inside * channels - channel).min(left);
                    let from = ((b * height + iy) * width + ix) * channels + channel;
                    segment[filled..filled + run].copy_from_slice(&self.x[from..from + run]);
                    run
                }
                _ => {
                    let run = (channels - channel).min(left);
                    segment[filled..filled + run].fill(0.0);
                    run
                }
            };
            column += run;
            filled += run;
        }
    }
}

/// The taps of one axis that reach outputs of phase `phase` (output position + padding ≡ phase
/// modulo the stride) in a transposed convolution, with the input offset each reads:
/// `input = (output + padding − tap) / stride`, i.e. `(output + padding − phase) / stride −
/// offset` for the tap `phase + offset · stride`.
fn phase_taps(kernel: usize, stride: usize, phase: usize) -> Vec<usize> {
    (phase..kernel).step_by(stride).collect()
}

/// A transposed convolution's kernel `[in, out, kh, kw]` (PyTorch's and burn's layout) as one
/// row-major weight per output phase `(py, px)` (row-major over the stride), `[taps · in, out]`,
/// for the rows of [`Windows::transposed_phase`].
pub fn transposed_conv_kernels(
    weight: &[f32],
    [inputs, outputs, kh, kw]: [usize; 4],
    stride: [usize; 2],
) -> Vec<Vec<f32>> {
    assert_eq!(
        weight.len(),
        inputs * outputs * kh * kw,
        "transposed kernel: shape"
    );
    let mut phases = Vec::new();
    for py in 0..stride[0] {
        for px in 0..stride[1] {
            // From last to first: the order of the input pixels they read.
            let reversed = |taps: Vec<usize>| -> Vec<usize> { taps.into_iter().rev().collect() };
            let ty = reversed(phase_taps(kh, stride[0], py));
            let tx = reversed(phase_taps(kw, stride[1], px));
            let mut out = vec![0f32; ty.len() * tx.len() * inputs * outputs];
            for (jy, &y) in ty.iter().enumerate() {
                for (jx, &x) in tx.iter().enumerate() {
                    for c in 0..inputs {
                        let row = (jy * tx.len() + jx) * inputs + c;
                        for o in 0..outputs {
                            out[row * outputs + o] = weight[((c * outputs + o) * kh + y) * kw + x];
                        }
                    }
                }
            }
            phases.push(out);
        }
    }
    phases
}

/// NCHW `[b, c, h, w]` values as NHWC.
pub fn nchw_to_nhwc(x: &[f32], [_, c, h, w]: [usize; 4]) -> Vec<f32> {
    transposed_images(x, c, h * w)
}

/// NHWC `[b, h, w, c]` values as NCHW.
pub fn nhwc_to_nchw(x: &[f32], [_, h, w, c]: Nhwc) -> Vec<f32> {
    transposed_images(x, h * w, c)
}

/// Each image of `x`, a row-major `rows × cols` matrix, transposed.
fn transposed_images(x: &[f32], rows: usize, cols: usize) -> Vec<f32> {
    let mut out = vec![0f32; x.len()];
    out.par_chunks_mut((rows * cols).max(1))
        .zip(x.par_chunks((rows * cols).max(1)))
        .for_each(|(out, image)| out.copy_from_slice(&super::transposed(image, rows, cols)));
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::host::testing::{product, values};

    /// Every `(input pixel, output pixel, tap)` a convolution by `window` of an input `[h, w]`
    /// joins: `input = output · stride + tap − padding`, inside the input. A transposed
    /// convolution joins the same triples with input and output swapped (it is the adjoint).
    fn joins(window: &Window, [h, w]: [usize; 2]) -> Vec<([usize; 2], [usize; 2], [usize; 2])> {
        let [oh, ow] = window.conv_output([h, w]);
        let mut joins = Vec::new();
        for (y, z) in (0..oh).flat_map(|y| (0..ow).map(move |z| (y, z))) {
            for (ky, kx) in
                (0..window.kernel[0]).flat_map(|a| (0..window.kernel[1]).map(move |b| (a, b)))
            {
                let iy = (y * window.stride[0] + ky).checked_sub(window.padding[0]);
                let ix = (z * window.stride[1] + kx).checked_sub(window.padding[1]);
                if let (Some(iy), Some(ix)) = (iy, ix)
                    && iy < h
                    && ix < w
                {
                    joins.push(([iy, ix], [y, z], [ky, kx]));
                }
            }
        }
        joins
    }

    /// A convolution of NCHW `x` by `[out, in, kh, kw]`, or with `transposed` a transposed one
    /// by `[in, out, kh, kw]` (`out[i·s − p + t] += x[i] w[t]`), from the definition: the sum
    /// over the joins of the convolution whose input is the larger side.
    fn by_definition(
        x: &[f32],
        [b, c, h, w]: [usize; 4],
        k: &[f32],
        o: usize,
        window: &Window,
        transposed: bool,
    ) -> Vec<f32> {
        let [oh, ow] = match transposed {
            true => window.transposed_output([h, w]),
            false => window.conv_output([h, w]),
        };
        let [kh, kw] = window.kernel;
        let mut out = vec![0f32; b * o * oh * ow];
        let larger = if transposed { [oh, ow] } else { [h, w] };
        for (large, small, [ky, kx]) in joins(window, larger) {
            let ([iy, ix], [y, z]) = if transposed {
                (small, large)
            } else {
                (large, small)
            };
            for (n, f, ch) in
                (0..b).flat_map(|n| (0..o).flat_map(move |f| (0..c).map(move |ch| (n, f, ch))))
            {
                let weight = match transposed {
                    true => k[((ch * o + f) * kh + ky) * kw + kx],
                    false => k[((f * c + ch) * kh + ky) * kw + kx],
                };
                out[((n * o + f) * oh + y) * ow + z] +=
                    x[((n * c + ch) * h + iy) * w + ix] * weight;
            }
        }
        out
    }

    #[test]
    fn unfolded_products_are_convolutions() {
        for (window, [h, w]) in [
            (
                Window {
                    kernel: [3, 3],
                    stride: [1, 1],
                    padding: [1, 1],
                },
                [5, 6],
            ),
            (
                Window {
                    kernel: [3, 3],
                    stride: [2, 2],
                    padding: [1, 1],
                },
                [6, 7],
            ),
            (
                Window {
                    kernel: [1, 1],
                    stride: [1, 1],
                    padding: [0, 0],
                },
                [4, 4],
            ),
        ] {
            let (b, c, o) = (2, 3, 4);
            let x = values(b * c * h * w, 1);
            let k = values(o * c * window.kernel[0] * window.kernel[1], 2);
            let want = by_definition(&x, [b, c, h, w], &k, o, &window, false);
            let nhwc = nchw_to_nhwc(&x, [b, c, h, w]);
            let rows = unfold(&nhwc, [b, h, w, c], &window);
            let kernel = conv_kernel(&k, [o, c, window.kernel[0], window.kernel[1]]);
            let got = product(&rows, &kernel, window.kernel[0] * window.kernel[1] * c, o);
            let [oh, ow] = window.conv_output([h, w]);
            let got = nhwc_to_nchw(&got, [b, oh, ow, o]);
            for (g, e) in got.iter().zip(&want) {
                assert!((g - e).abs() < 1e-5, "{window:?}: {g} against {e}");
            }
            // The pixels' products with every tap, summed per output pixel.
            let taps = window.kernel[0] * window.kernel[1];
            let kernel = tap_kernel(&k, [o, c, window.kernel[0], window.kernel[1]]);
            let bias = values(o, 3);
            let by_taps = sum_taps(
                &product(&nhwc, &kernel, c, taps * o),
                [b, h, w, c],
                &window,
                &bias,
                |v| 2.0 * v,
            );
            let by_taps = nhwc_to_nchw(&by_taps, [b, oh, ow, o]);
            for (i, (g, e)) in by_taps.iter().zip(&want).enumerate() {
                let e = 2.0 * (e + bias[i / (oh * ow) % o]);
                assert!((g - e).abs() < 1e-5, "{window:?} by taps: {g} against {e}");
            }
        }
    }

    /// The windows read where they lie are the unfolded rows, from any column on.
    #[test]
    fn windows_read_in_place_are_the_unfolded_rows() {
        let window = Window {
            kernel: [3, 3],
            stride: [2, 2],
            padding: [1, 1],
        };
        let shape = [2, 5, 4, 3];
        let x = values(2 * 5 * 4 * 3, 7);
        let rows = unfold(&x, shape, &window);
        let windows = Windows::new(&x, shape, window);
        let depth = windows.depth();
        assert_eq!(rows.len(), windows.rows() * depth);
        for row in 0..windows.rows() {
            for (first, len) in [(0, depth), (4, 11), (depth - 5, 5)] {
                let mut segment = vec![f32::NAN; len];
                windows.read(row, first, &mut segment);
                assert_eq!(
                    segment,
                    rows[row * depth + first..][..len],
                    "row {row} from {first}"
                );
            }
        }
    }

    #[test]
    fn phase_products_are_transposed_convolutions() {
        for window in [
            Window {
                kernel: [4, 4],
                stride: [2, 2],
                padding: [1, 1],
            },
            Window {
                kernel: [3, 3],
                stride: [2, 2],
                padding: [0, 0],
            },
        ] {
            let ([b, c, o], [h, w]) = ([2, 3, 4], [4, 5]);
            let x = values(b * c * h * w, 3);
            let k = values(c * o * window.kernel[0] * window.kernel[1], 4);
            let want = by_definition(&x, [b, c, h, w], &k, o, &window, true);
            let nhwc = nchw_to_nhwc(&x, [b, c, h, w]);
            let kernels = transposed_conv_kernels(
                &k,
                [c, o, window.kernel[0], window.kernel[1]],
                window.stride,
            );
            let [oh, ow] = window.transposed_output([h, w]);
            let mut got = vec![0f32; b * oh * ow * o];
            for (phase, kernel) in kernels.iter().enumerate() {
                let (py, px) = (phase / window.stride[1], phase % window.stride[1]);
                let (windows, pixels) =
                    Windows::transposed_phase(&nhwc, [b, h, w, c], &window, (py, px));
                let rows = windows.unfolded();
                let depth = kernel.len() / o;
                assert_eq!(depth, windows.depth());
                let out = product(&rows, kernel, depth, o);
                for (i, &pixel) in pixels.iter().enumerate() {
                    got[pixel * o..][..o].copy_from_slice(&out[i * o..][..o]);
                }
            }
            let got = nhwc_to_nchw(&got, [b, oh, ow, o]);
            for (g, e) in got.iter().zip(&want) {
                assert!((g - e).abs() < 1e-5, "{window:?}: {g} against {e}");
            }
        }
    }
}
