//! Winograd's minimal filtering over NHWC images (Lavin & Gray, "Fast Algorithms for
//! Convolutional Neural Networks", 2016): a correlation's 2 × 2 output tiles as `α²` products
//! of transformed input tiles with transformed kernels, instead of one product of unfolded
//! windows.
//!
//! - [`F2X3`], F(2×2, 3×3): a stride-1 3 × 3 convolution in 16 multiplications per tile and
//!   channel pair where the unfolded product takes 36 (2.25× fewer);
//! - [`F2X2`], F(2×2, 2×2): each output phase of a stride-2 4 × 4 transposed convolution (a
//!   2 × 2 correlation) in 9 where it takes 16 (1.78× fewer).
//!
//! The caller runs the products (`V_ξ [tiles, in] · U_ξ [in, out]` for each of the `α²` points
//! ξ) with its matrix product; this module transforms the kernels ([`Minimal::kernel`]), the
//! input tiles ([`Minimal::input`]) and the products back into outputs ([`Minimal::output`]).
//! Every transform runs along a pixel's channels, contiguous in NHWC. Both algorithms use the
//! interpolation points 0, ±1 and ∞: their transforms add and subtract, so the results differ
//! from the direct sum only by f32 rounding.

use rayon::prelude::*;

use std::mem::MaybeUninit;

use super::conv::{Nhwc, Window};
use super::written_once;

/// A minimal filtering algorithm F(2×2, r×r): its `α × α` input tiles (`α = r + 1`) and its
/// transforms `Bᵀ` (`α × α`), `G` (`α × r`) and `Aᵀ` (`2 × α`), row-major.
#[derive(Debug, Clone, Copy)]
pub struct Minimal {
    /// Kernel taps per axis, `r`.
    pub taps: usize,
    /// Input tile side, `α = r + 1`.
    pub alpha: usize,
    bt: &'static [f32],
    g: &'static [f32],
    at: &'static [f32],
}

/// Outputs per tile and axis.
const TILE: usize = 2;

/// F(2×2, 3×3).
pub const F2X3: Minimal = Minimal {
    taps: 3,
    alpha: 4,
    bt: &[
        1.0, 0.0, -1.0, 0.0, //
        0.0, 1.0, 1.0, 0.0, //
        0.0, -1.0, 1.0, 0.0, //
        0.0, 1.0, 0.0, -1.0,
    ],
    g: &[
        1.0, 0.0, 0.0, //
        0.5, 0.5, 0.5, //
        0.5, -0.5, 0.5, //
        0.0, 0.0, 1.0,
    ],
    at: &[
        1.0, 1.0, 1.0, 0.0, //
        0.0, 1.0, -1.0, -1.0,
    ],
};

/// F(2×2, 2×2): `m₁ = (d₀ − d₁)g₀`, `m₂ = d₁(g₀ + g₁)`, `m₃ = (d₂ − d₁)g₁`; `y₀ = m₁ + m₂`,
/// `y₁ = m₂ + m₃`.
pub const F2X2: Minimal = Minimal {
    taps: 2,
    alpha: 3,
    bt: &[
        1.0, -1.0, 0.0, //
        0.0, 1.0, 0.0, //
        0.0, -1.0, 1.0,
    ],
    g: &[
        1.0, 0.0, //
        1.0, 1.0, //
        0.0, 1.0,
    ],
    at: &[
        1.0, 1.0, 0.0, //
        0.0, 1.0, 1.0,
    ],
};

/// A correlation over an NHWC image: output `(y, x)` reads the input pixels `(origin + y + ty,
/// origin + x + tx)` for taps `ty, tx < r`, zero outside the image; `out` outputs per axis.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Correlation {
    /// The input pixel `[y, x]` under output `(0, 0)`'s first tap (negative in the padding).
    pub origin: [isize; 2],
    /// Outputs `[height, width]`.
    pub out: [usize; 2],
}

impl Correlation {
    /// 2 × 2 tiles per axis `[rows, columns]` (the last one partial where `out` is odd).
    pub fn tiles(&self) -> [usize; 2] {
        self.out.map(|n| n.div_ceil(TILE))
    }
}

/// One output phase of a transposed convolution as a correlation: the outputs `(y, x)` of
/// [`Correlation::out`] land at `(stride · y + offset[0], stride · x + offset[1])`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Phase {
    /// The phase `(py, px)`: output position + padding ≡ phase modulo the stride.
    pub phase: [usize; 2],
    /// The correlation over the transposed convolution's input.
    pub correlation: Correlation,
    /// The output position of the correlation's output `(0, 0)`.
    pub offset: [usize; 2],
}

impl Phase {
    /// The phases (row-major over the stride) of a transposed convolution by `window` of an
    /// input `[height, width]`, where every phase is a 2 × 2 correlation ([`F2X2`]'s: a 4 × 4
    /// kernel at stride 2); `None` for other windows. A phase's output `q` reads the inputs
    /// `q − 1` and `q` through the kernel's taps `phase + stride` and `phase`.
    pub fn of_transposed(window: &Window, input: [usize; 2]) -> Option<Vec<Phase>> {
        if window.kernel != [4, 4] || window.stride != [2, 2] {
            return None;
        }
        let output = window.transposed_output(input);
        let axis = |a: usize, phase: usize| -> (isize, usize, usize) {
            let (stride, padding) = (2isize, window.padding[a] as isize);
            // The outputs `o = stride · q + phase − padding` inside `[0, output)`.
            let first = (padding - phase as isize + stride - 1).div_euclid(stride);
            let last = (output[a] as isize - 1 + padding - phase as isize).div_euclid(stride);
            let count = (last - first + 1).max(0) as usize;
            let offset = (stride * first + phase as isize - padding) as usize;
            (first - 1, count, offset)
        };
        let phases = (0..4).map(|p| {
            let phase = [p / 2, p % 2];
            let ((oy, ny, fy), (ox, nx, fx)) = (axis(0, phase[0]), axis(1, phase[1]));
            Phase {
                phase,
                correlation: Correlation {
                    origin: [oy, ox],
                    out: [ny, nx],
                },
                offset: [fy, fx],
            }
        });
        Some(phases.collect())
    }

    /// The transposed convolution's output, NHWC `[batch, height, width, channels]`, from each
    /// of its `phases`' outputs (NHWC over the phase's correlation): every output pixel is one
    /// phase's, at `offset + 2 · q`. Panics when the phases do not cover the output once each.
    pub fn interleave(
        phases: &[Phase],
        outputs: &[Vec<f32>],
        batch: usize,
        [height, width]: [usize; 2],
        channels: usize,
    ) -> Vec<f32> {
        assert_eq!(
            phases.len(),
            outputs.len(),
            "interleave: an output per phase"
        );
        let row = width * channels;
        let line = |line: usize, out: &mut [MaybeUninit<f32>]| {
            let (b, oy) = (line / height, line % height);
            let mut written = vec![false; width];
            for (phase, y) in phases.iter().zip(outputs) {
                let [rows, columns] = phase.correlation.out;
                let Some(r) = (oy.checked_sub(phase.offset[0]))
                    .filter(|d| d % TILE == 0)
                    .map(|d| d / TILE)
                    .filter(|&r| r < rows)
                else {
                    continue;
                };
                let source = &y[(b * rows + r) * columns * channels..][..columns * channels];
                for (q, pixel) in source.chunks_exact(channels.max(1)).enumerate() {
                    let ox = phase.offset[1] + TILE * q;
                    assert!(ox < width && !written[ox], "interleave: phases overlap");
                    written[ox] = true;
                    for (out, &v) in out[ox * channels..][..channels].iter_mut().zip(pixel) {
                        out.write(v);
                    }
                }
            }
            assert!(
                written.iter().all(|&w| w),
                "interleave: a pixel no phase covers"
            );
        };
        // SAFETY: each output row is written whole (its pixels checked, or a panic before the
        // vector is made).
        #[allow(unsafe_code)]
        unsafe {
            written_once(batch * height * row, |out| {
                (out.par_chunks_mut(row.max(1)).enumerate()).for_each(|(l, out)| line(l, out))
            })
        }
    }

    /// The kernel tap `[ky, kx]` of this phase's correlation tap `(ty, tx)`.
    pub fn kernel_tap(&self, ty: usize, tx: usize) -> [usize; 2] {
        [self.phase[0] + 2 * (1 - ty), self.phase[1] + 2 * (1 - tx)]
    }
}

/// One line of [`Minimal::input`]'s tiles, compiled (through pulp's dispatch, which compiles
/// what is inlined into `with_simd`) for the CPU's widest SIMD instructions.
struct InputLine<'a> {
    minimal: &'a Minimal,
    x: &'a [f32],
    shape: Nhwc,
    correlation: &'a Correlation,
    line: usize,
    out: &'a mut [MaybeUninit<f32>],
}

impl pulp::WithSimd for InputLine<'_> {
    type Output = ();

    #[inline(always)]
    fn with_simd<S: pulp::Simd>(self, _: S) {
        (self.minimal).input_line(self.x, self.shape, self.correlation, self.line, self.out);
    }
}

/// The output lines `piece` of one tile row of [`Minimal::output`] (its first tile
/// `tile_row`), compiled as [`InputLine`] is.
struct OutputLines<'a, F> {
    m: &'a [Vec<f32>],
    /// Per output of a tile, the points and coefficients it sums.
    terms: &'a [Vec<(usize, f32)>],
    bias: &'a [f32],
    f: &'a F,
    tile_row: usize,
    width: usize,
    piece: &'a mut [MaybeUninit<f32>],
}

impl<F: Fn(f32) -> f32> pulp::WithSimd for OutputLines<'_, F> {
    type Output = ();

    #[inline(always)]
    fn with_simd<S: pulp::Simd>(self, _: S) {
        let (outputs, width) = (self.bias.len(), self.width);
        let lines = self.piece.len() / (width * outputs);
        let mut y = vec![0f32; outputs];
        for (a, x) in (0..lines).flat_map(|a| (0..width).map(move |x| (a, x))) {
            let tile = self.tile_row + x / TILE;
            y.copy_from_slice(self.bias);
            for &(xi, coefficient) in &self.terms[a * TILE + x % TILE] {
                let product = &self.m[xi][tile * outputs..][..outputs];
                for (y, &p) in y.iter_mut().zip(product) {
                    *y += coefficient * p;
                }
            }
            let out = &mut self.piece[(a * width + x) * outputs..][..outputs];
            for (out, &y) in out.iter_mut().zip(&y) {
                out.write((self.f)(y));
            }
        }
    }
}

impl Minimal {
    /// The `α²` transformed kernels `U_ξ = G g Gᵀ`, each a row-major `[inputs, outputs]` matrix
    /// (ξ row-major over the tile), of the kernel whose tap `(ty, tx)` from input channel `c` to
    /// output channel `o` is `tap(ty, tx, c, o)`.
    pub fn kernel(
        &self,
        [inputs, outputs]: [usize; 2],
        tap: impl Fn(usize, usize, usize, usize) -> f32 + Sync,
    ) -> Vec<Vec<f32>> {
        let (r, alpha) = (self.taps, self.alpha);
        (0..alpha * alpha)
            .into_par_iter()
            .map(|xi| {
                let (i, j) = (xi / alpha, xi % alpha);
                let mut u = vec![0f32; inputs * outputs];
                for c in 0..inputs {
                    for o in 0..outputs {
                        let mut sum = 0f32;
                        for ty in 0..r {
                            for tx in 0..r {
                                let weight = self.g[i * r + ty] * self.g[j * r + tx];
                                if weight != 0.0 {
                                    sum += weight * tap(ty, tx, c, o);
                                }
                            }
                        }
                        u[c * outputs + o] = sum;
                    }
                }
                u
            })
            .collect()
    }

    /// The transformed input tiles `V_ξ = Bᵀ d B` of `correlation` over `x` (NHWC `shape`):
    /// `[α², tiles, channels]`, tiles row-major over `[batch, tile rows, tile columns]`.
    pub fn input(&self, x: &[f32], shape: Nhwc, correlation: &Correlation) -> Vec<f32> {
        let [batch, height, width, channels] = shape;
        assert_eq!(
            x.len(),
            batch * height * width * channels,
            "winograd: shape"
        );
        let [rows, columns] = correlation.tiles();
        let tiles = batch * rows * columns;
        let alpha = self.alpha;
        if tiles == 0 || channels == 0 {
            return Vec::new();
        }
        // SAFETY: the lines cover the vector, and each writes every value of its tiles.
        #[allow(unsafe_code)]
        unsafe {
            written_once(alpha * alpha * tiles * channels, |v| {
                (v.par_chunks_mut(columns * channels).enumerate()).for_each(|(line, out)| {
                    pulp::Arch::new().dispatch(InputLine {
                        minimal: self,
                        x,
                        shape,
                        correlation,
                        line,
                        out,
                    })
                })
            })
        }
    }

    /// Line `line` of [`Self::input`]'s tiles (point ξ, image, tile row): every tile of it
    /// summed in a buffer, then written once into `out`.
    #[inline(always)]
    fn input_line(
        &self,
        x: &[f32],
        [batch, height, width, channels]: Nhwc,
        correlation: &Correlation,
        line: usize,
        out: &mut [MaybeUninit<f32>],
    ) {
        let [rows, _] = correlation.tiles();
        let alpha = self.alpha;
        let (xi, line) = (line / (batch * rows), line % (batch * rows));
        let (i, j) = (xi / alpha, xi % alpha);
        let (b, row) = (line / rows, line % rows);
        // The input pixel under tile offset `k` along an axis, if inside the image.
        let pixel = |origin: isize, tile: usize, k: usize, size: usize| {
            let at = origin + (tile * TILE + k) as isize;
            (0..size as isize).contains(&at).then_some(at as usize)
        };
        // The `d[k][l]` whose coefficient in `V_ij` is `Bᵀ[i][k] · Bᵀ[j][l]`.
        let terms: Vec<(usize, usize, f32)> = (0..alpha)
            .flat_map(|k| (0..alpha).map(move |l| (k, l)))
            .map(|(k, l)| (k, l, self.bt[i * alpha + k] * self.bt[j * alpha + l]))
            .filter(|&(_, _, coefficient)| coefficient != 0.0)
            .collect();
        let mut sum = vec![0f32; channels];
        for (column, tile) in out.chunks_exact_mut(channels).enumerate() {
            sum.fill(0.0);
            for &(k, l, coefficient) in &terms {
                let Some(y) = pixel(correlation.origin[0], row, k, height) else {
                    continue;
                };
                let Some(x_) = pixel(correlation.origin[1], column, l, width) else {
                    continue;
                };
                let from = &x[((b * height + y) * width + x_) * channels..][..channels];
                for (v, &d) in sum.iter_mut().zip(from) {
                    *v += coefficient * d;
                }
            }
            for (v, &s) in tile.iter_mut().zip(&sum) {
                v.write(s);
            }
        }
    }

    /// The outputs `f(Aᵀ M A + bias)` of `correlation` from the products `m` (each of the `α²`
    /// points' `[tiles, outputs]`, as [`Self::input`] lays out the tiles): NHWC `[batch, out
    /// height, out width, outputs]`.
    pub fn output(
        &self,
        m: &[Vec<f32>],
        batch: usize,
        correlation: &Correlation,
        bias: &[f32],
        f: impl Fn(f32) -> f32 + Sync,
    ) -> Vec<f32> {
        let outputs = bias.len();
        let [height, width] = correlation.out;
        let [rows, columns] = correlation.tiles();
        let (alpha, tiles) = (self.alpha, batch * rows * columns);
        assert!(
            m.len() == alpha * alpha && m.iter().all(|m| m.len() == tiles * outputs),
            "winograd: products"
        );
        let len = batch * height * width * outputs;
        if len == 0 {
            return Vec::new();
        }
        // `y[a][b] = Σ Aᵀ[a][i] Aᵀ[b][j] M_ij` for each output of a tile.
        let terms: Vec<Vec<(usize, f32)>> = (0..TILE * TILE)
            .map(|ab| {
                let (a, b) = (ab / TILE, ab % TILE);
                (0..alpha * alpha)
                    .map(|xi| {
                        let (i, j) = (xi / alpha, xi % alpha);
                        (xi, self.at[a * alpha + i] * self.at[b * alpha + j])
                    })
                    .filter(|&(_, coefficient)| coefficient != 0.0)
                    .collect()
            })
            .collect();
        // SAFETY: the pieces split the vector; each writes every output of its lines (all
        // `width` columns of each).
        #[allow(unsafe_code)]
        unsafe {
            written_once(len, |out| {
                // One piece per tile row of one image: its (up to) two output rows.
                let chunks = (0..batch).flat_map(|b| {
                    (0..rows).map(move |row| (b, row, TILE.min(height - row * TILE)))
                });
                let mut pieces = Vec::with_capacity(batch * rows);
                let mut rest = out;
                for (b, row, lines) in chunks {
                    let (piece, after) = rest.split_at_mut(lines * width * outputs);
                    pieces.push((b, row, piece));
                    rest = after;
                }
                pieces.into_par_iter().for_each(|(b, row, piece)| {
                    pulp::Arch::new().dispatch(OutputLines {
                        m,
                        terms: &terms,
                        bias,
                        f: &f,
                        tile_row: (b * rows + row) * columns,
                        width,
                        piece,
                    })
                });
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::host::testing::{product, values};

    /// The correlation by its definition: `[batch, out h, out w, outputs]`.
    fn by_definition(
        x: &[f32],
        [batch, height, width, channels]: Nhwc,
        correlation: &Correlation,
        r: usize,
        outputs: usize,
        tap: impl Fn(usize, usize, usize, usize) -> f32,
    ) -> Vec<f32> {
        let [oh, ow] = correlation.out;
        let mut out = vec![0f32; batch * oh * ow * outputs];
        for (b, y, z, o) in (0..batch).flat_map(|b| {
            (0..oh).flat_map(move |y| {
                (0..ow).flat_map(move |z| (0..outputs).map(move |o| (b, y, z, o)))
            })
        }) {
            let mut sum = 0f32;
            for (ty, tx, c) in (0..r)
                .flat_map(|ty| (0..r).flat_map(move |tx| (0..channels).map(move |c| (ty, tx, c))))
            {
                let iy = correlation.origin[0] + (y + ty) as isize;
                let ix = correlation.origin[1] + (z + tx) as isize;
                if (0..height as isize).contains(&iy) && (0..width as isize).contains(&ix) {
                    let pixel = (b * height + iy as usize) * width + ix as usize;
                    sum += x[pixel * channels + c] * tap(ty, tx, c, o);
                }
            }
            out[((b * oh + y) * ow + z) * outputs + o] = sum;
        }
        out
    }

    /// Both algorithms give the correlation, for odd and even sizes (partial tiles), padding
    /// before and after, and an origin past the image.
    #[test]
    fn minimal_filtering_is_the_correlation() {
        let cases = [
            (F2X3, [-1, -1], [5, 6], [5, 6]),
            (F2X3, [0, -2], [3, 4], [4, 7]),
            (F2X2, [-1, 0], [4, 5], [4, 5]),
            (F2X2, [0, -1], [5, 3], [4, 3]),
        ];
        for (minimal, origin, [height, width], out) in cases {
            let (batch, channels, outputs, r) = (2, 3, 5, minimal.taps);
            let shape = [batch, height, width, channels];
            let x = values(batch * height * width * channels, 1);
            let k = values(r * r * channels * outputs, 2);
            let tap = |ty: usize, tx: usize, c: usize, o: usize| {
                k[((ty * r + tx) * channels + c) * outputs + o]
            };
            let correlation = Correlation { origin, out };
            let want = by_definition(&x, shape, &correlation, r, outputs, tap);
            let u = minimal.kernel([channels, outputs], tap);
            let v = minimal.input(&x, shape, &correlation);
            let [rows, columns] = correlation.tiles();
            let tiles = batch * rows * columns;
            let m: Vec<Vec<f32>> = (0..minimal.alpha * minimal.alpha)
                .map(|xi| {
                    product(
                        &v[xi * tiles * channels..][..tiles * channels],
                        &u[xi],
                        channels,
                        outputs,
                    )
                })
                .collect();
            let bias = values(outputs, 3);
            let got = minimal.output(&m, batch, &correlation, &bias, |y| 2.0 * y);
            assert_eq!(got.len(), want.len());
            for (i, (g, e)) in got.iter().zip(&want).enumerate() {
                let e = 2.0 * (e + bias[i % outputs]);
                assert!((g - e).abs() < 1e-5, "{correlation:?}: {g} against {e}");
            }
        }
    }

    /// The phases of a 4 × 4, stride-2 transposed convolution, each through F(2×2, 2×2), put
    /// together are the transposed convolution (`out[i · 2 − p + k] += x[i] w[k]`).
    #[test]
    #[should_panic(expected = "interleave: a pixel no phase covers")]
    fn phases_that_leave_a_pixel_out_are_refused() {
        let window = Window {
            kernel: [4, 4],
            stride: [2, 2],
            padding: [1, 1],
        };
        let phases = Phase::of_transposed(&window, [2, 2]).unwrap();
        // Three of the four phases: a quarter of the output is no phase's.
        let outputs: Vec<Vec<f32>> = phases[..3].iter().map(|_| vec![1.0; 2 * 2 * 3]).collect();
        Phase::interleave(&phases[..3], &outputs, 1, [4, 4], 3);
    }

    #[test]
    fn transposed_phases_are_the_transposed_convolution() {
        for (padding, [height, width]) in [([1, 1], [4, 5]), ([0, 2], [3, 3]), ([1, 0], [5, 2])] {
            let window = Window {
                kernel: [4, 4],
                stride: [2, 2],
                padding,
            };
            let (batch, channels, outputs) = (2, 3, 4);
            let x = values(batch * height * width * channels, 5);
            let w = values(channels * outputs * 16, 6); // [in, out, 4, 4]
            let [oh, ow] = window.transposed_output([height, width]);
            let mut want = vec![0f32; batch * oh * ow * outputs];
            for (b, iy, ix, ky, kx) in (0..batch).flat_map(|b| {
                (0..height).flat_map(move |iy| {
                    (0..width).flat_map(move |ix| {
                        (0..4).flat_map(move |ky| (0..4).map(move |kx| (b, iy, ix, ky, kx)))
                    })
                })
            }) {
                let oy = (iy * 2 + ky).checked_sub(padding[0]).filter(|&o| o < oh);
                let ox = (ix * 2 + kx).checked_sub(padding[1]).filter(|&o| o < ow);
                let (Some(oy), Some(ox)) = (oy, ox) else {
                    continue;
                };
                for (c, o) in (0..channels).flat_map(|c| (0..outputs).map(move |o| (c, o))) {
                    want[((b * oh + oy) * ow + ox) * outputs + o] += x
                        [((b * height + iy) * width + ix) * channels + c]
                        * w[((c * outputs + o) * 4 + ky) * 4 + kx];
                }
            }
            let shape = [batch, height, width, channels];
            let phases = Phase::of_transposed(&window, [height, width]).unwrap();
            let each: Vec<Vec<f32>> = (phases.iter())
                .map(|phase| {
                    let tap = |ty: usize, tx: usize, c: usize, o: usize| {
                        let [ky, kx] = phase.kernel_tap(ty, tx);
                        w[((c * outputs + o) * 4 + ky) * 4 + kx]
                    };
                    let correlation = phase.correlation;
                    let u = F2X2.kernel([channels, outputs], tap);
                    let v = F2X2.input(&x, shape, &correlation);
                    let [rows, columns] = correlation.tiles();
                    let tiles = batch * rows * columns;
                    let m: Vec<Vec<f32>> = (0..9)
                        .map(|xi| {
                            let v = &v[xi * tiles * channels..][..tiles * channels];
                            product(v, &u[xi], channels, outputs)
                        })
                        .collect();
                    F2X2.output(&m, batch, &correlation, &vec![0.0; outputs], |y| y)
                })
                .collect();
            let got = Phase::interleave(&phases, &each, batch, [oh, ow], outputs);
            assert_eq!(got.len(), want.len());
            for (g, e) in got.iter().zip(&want) {
                assert!((g - e).abs() < 1e-5, "{window:?}: {g} against {e}");
            }
        }
    }
}
