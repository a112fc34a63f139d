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

use std::cell::RefCell;
use std::mem::MaybeUninit;
use std::ops::Range;

use super::conv::{Nhwc, Window};
use super::{as_uninit, written_once};

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

    /// Where the phase's outputs go in the transposed convolution's output.
    pub fn placement(&self) -> Placement {
        Placement {
            offset: self.offset,
            step: 2,
        }
    }

    /// The kernel tap `[ky, kx]` of this phase's correlation tap `(ty, tx)`.
    pub fn kernel_tap(&self, ty: usize, tx: usize) -> [usize; 2] {
        [self.phase[0] + 2 * (1 - ty), self.phase[1] + 2 * (1 - tx)]
    }
}

/// Where a correlation's outputs go in the image [`Minimal::correlate`] writes: output `(y, x)`
/// at pixel `(offset[0] + step · y, offset[1] + step · x)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Placement {
    /// The pixel of output `(0, 0)`.
    pub offset: [usize; 2],
    /// Pixels between neighbouring outputs along each axis.
    pub step: usize,
}

impl Placement {
    /// Output `(y, x)` at pixel `(y, x)`: a convolution's.
    pub const SAME: Placement = Placement {
        offset: [0, 0],
        step: 1,
    };

    /// The pixel `[y, x]` of output `(y, x)`.
    fn pixel(&self, y: usize, x: usize) -> [usize; 2] {
        [
            self.offset[0] + self.step * y,
            self.offset[1] + self.step * x,
        ]
    }
}

/// Bytes of a block's transformed tiles and their products (`α² · (in + out)` values a tile) in
/// [`Minimal::correlate`]: three quarters of a core's L2 cache (Zen 3's 512 KiB), so that a
/// block's tiles are multiplied and transformed back while they are in it, not after a trip
/// through memory (the live-stream model's transposed convolution: 48 tiles, eight whole
/// register tiles of rows).
const BLOCK_BYTES: usize = 384 << 10;

/// Bytes of the transformed kernels (`α² · in · out` values) up to which [`Minimal::correlate`]
/// goes block by block, every block reading all of them; past this, each kernel is read once,
/// by one product over every tile.
const BLOCKED_KERNEL_BYTES: usize = 1 << 20;

/// How [`Minimal::correlate`] goes through the tiles.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Schedule {
    /// In blocks of tile rows, each transformed, multiplied and put back on one thread.
    Blocks,
    /// Every tile transformed, then each point's product, then every output.
    Points,
}

impl Schedule {
    /// The schedule for transformed kernels of `bytes` in all ([`BLOCKED_KERNEL_BYTES`]).
    fn for_kernels(bytes: usize) -> Schedule {
        match bytes <= BLOCKED_KERNEL_BYTES {
            true => Schedule::Blocks,
            false => Schedule::Points,
        }
    }
}

thread_local! {
    /// Each thread's transformed tiles of its current block, kept from block to block.
    static BLOCK_TILES: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

/// The image [`Minimal::correlate`] writes, shared by the blocks and tile rows that write it,
/// each its own pixels.
struct Image<'a, F> {
    values: *mut f32,
    /// `[height, width]`.
    size: [usize; 2],
    bias: &'a [f32],
    f: &'a F,
    /// Per output of a tile (row-major), the points and coefficients it sums.
    terms: Vec<Vec<(usize, f32)>>,
}

// SAFETY: the writers of an `Image` write disjoint pixels (checked by `covered_once` before any
// is made) of a vector that outlives them.
#[allow(unsafe_code)]
unsafe impl<F: Sync> Sync for Image<'_, F> {}

/// One tile row of one image of a correlation.
#[derive(Debug, Clone, Copy)]
struct TileRow {
    job: usize,
    image: usize,
    row: usize,
}

/// One [`Minimal::correlate`] call: its input image, its correlations, their point products and
/// the image they write.
struct Correlating<'a, M, F> {
    minimal: &'a Minimal,
    x: &'a [f32],
    shape: Nhwc,
    jobs: &'a [(Correlation, Placement)],
    multiply: M,
    out: Image<'a, F>,
}

/// A block of [`Minimal::correlate`]'s tiles: tile rows `rows` of one image of one correlation,
/// transformed, multiplied and put back on one thread, compiled (through pulp's dispatch, which
/// compiles what is inlined into `with_simd`) for the CPU's widest SIMD instructions.
struct Block<'a, M, F> {
    work: &'a Correlating<'a, M, F>,
    job: usize,
    image: usize,
    rows: Range<usize>,
}

impl<M, F> pulp::WithSimd for Block<'_, M, F>
where
    M: Fn(usize, usize, &[f32]) -> Vec<f32>,
    F: Fn(f32) -> f32,
{
    type Output = ();

    #[inline(always)]
    fn with_simd<S: pulp::Simd>(self, _: S) {
        let work = self.work;
        let (minimal, shape) = (work.minimal, work.shape);
        let channels = shape[3];
        let (correlation, _) = &work.jobs[self.job];
        let [rows, columns] = correlation.tiles();
        let points = minimal.alpha * minimal.alpha;
        let tiles = self.rows.len() * columns;
        // Taken out of the thread's cell, not borrowed in a closure: a closure would be compiled
        // apart, without the SIMD instructions.
        let mut buffer = BLOCK_TILES.take();
        if buffer.len() < points * tiles * channels {
            buffer.resize(points * tiles * channels, 0.0);
        }
        let v = &mut buffer[..points * tiles * channels];
        for (xi, point) in v.chunks_exact_mut(tiles * channels).enumerate() {
            for (r, line) in point.chunks_exact_mut(columns * channels).enumerate() {
                let line_index = (xi * shape[0] + self.image) * rows + self.rows.start + r;
                minimal.input_line(work.x, shape, correlation, line_index, as_uninit(line));
            }
        }
        let products: Vec<Vec<f32>> = (v.chunks_exact(tiles * channels).enumerate())
            .map(|(xi, point)| (work.multiply)(self.job, xi, point))
            .collect();
        BLOCK_TILES.set(buffer);
        let m: Vec<&[f32]> = products.iter().map(Vec::as_slice).collect();
        for (r, row) in self.rows.clone().enumerate() {
            let tile_row = TileRow {
                job: self.job,
                image: self.image,
                row,
            };
            minimal.output_row(&m, r * columns, work.jobs, tile_row, &work.out);
        }
    }
}

/// One line of [`Minimal::input`]'s tiles, compiled as [`Block`] is.
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

/// One tile row's outputs from every point's products over all of its correlation's tiles,
/// compiled as [`Block`] is.
struct OutputRow<'a, F> {
    minimal: &'a Minimal,
    m: &'a [&'a [f32]],
    jobs: &'a [(Correlation, Placement)],
    tile_row: TileRow,
    out: &'a Image<'a, F>,
}

impl<F: Fn(f32) -> f32> pulp::WithSimd for OutputRow<'_, F> {
    type Output = ();

    #[inline(always)]
    fn with_simd<S: pulp::Simd>(self, _: S) {
        let TileRow { job, image, row } = self.tile_row;
        let [rows, columns] = self.jobs[job].0.tiles();
        let first = (image * rows + row) * columns;
        (self.minimal).output_row(self.m, first, self.jobs, self.tile_row, self.out);
    }
}

/// Panics unless the outputs of `jobs` land inside an image of `[height, width]`, one on each
/// of its pixels.
fn covered_once(jobs: &[(Correlation, Placement)], [height, width]: [usize; 2]) {
    let mut covered = vec![false; height * width];
    for (correlation, placement) in jobs {
        let [rows, columns] = correlation.out;
        for (y, x) in (0..rows).flat_map(|y| (0..columns).map(move |x| (y, x))) {
            let [py, px] = placement.pixel(y, x);
            assert!(
                py < height && px < width,
                "winograd: an output outside the image"
            );
            assert!(
                !covered[py * width + px],
                "winograd: two outputs on one pixel"
            );
            covered[py * width + px] = true;
        }
    }
    assert!(
        covered.iter().all(|&c| c),
        "winograd: a pixel no correlation covers"
    );
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

    /// `f(correlation + bias)` of each of `jobs` over `x` (NHWC `shape`), each output where its
    /// placement puts it in a new NHWC image `[batch, height, width, outputs]` (`size = [height,
    /// width]`, `outputs = bias.len()`), which the jobs cover once. `multiply(job, ξ, v)` is the
    /// product `v · U_ξ` `[tiles, outputs]` of the job's transformed kernel at point ξ
    /// ([`Self::kernel`]) with the transformed tiles `v` `[tiles, channels]`.
    ///
    /// Where the transformed kernels are small (up to a megabyte), the tiles go in blocks, each
    /// transformed, multiplied and transformed back on one thread while in its cache (the
    /// live-stream model's transposed convolution at b = 8 took twice as long with its 57 MB of
    /// transformed tiles and products written out in full first); else every point's tiles at
    /// once, each product on one thread, each kernel read once.
    ///
    /// Panics where the placements put an output outside the image, leave a pixel out or put
    /// two outputs on one.
    #[allow(clippy::too_many_arguments)]
    pub fn correlate<M, F>(
        &self,
        x: &[f32],
        shape: Nhwc,
        jobs: &[(Correlation, Placement)],
        size: [usize; 2],
        bias: &[f32],
        multiply: M,
        f: F,
    ) -> Vec<f32>
    where
        M: Fn(usize, usize, &[f32]) -> Vec<f32> + Sync,
        F: Fn(f32) -> f32 + Sync,
    {
        let [batch, height, width, channels] = shape;
        assert_eq!(
            x.len(),
            batch * height * width * channels,
            "winograd: shape"
        );
        covered_once(jobs, size);
        let outputs = bias.len();
        let len = batch * size[0] * size[1] * outputs;
        if len == 0 {
            return Vec::new();
        }
        assert!(channels > 0, "winograd: an image without channels");
        let points = self.alpha * self.alpha;
        let schedule = Schedule::for_kernels(points * channels * outputs * size_of::<f32>());
        // `y[a][b] = Σ Aᵀ[a][i] Aᵀ[b][j] M_ij` for each output of a tile.
        let terms = (0..TILE * TILE)
            .map(|ab| {
                let (a, b) = (ab / TILE, ab % TILE);
                (0..points)
                    .map(|xi| {
                        let (i, j) = (xi / self.alpha, xi % self.alpha);
                        (
                            xi,
                            self.at[a * self.alpha + i] * self.at[b * self.alpha + j],
                        )
                    })
                    .filter(|&(_, coefficient)| coefficient != 0.0)
                    .collect()
            })
            .collect();
        // SAFETY: `covered_once` checked that the jobs' outputs are the image's pixels, one
        // each; every tile row of every job writes all of its outputs' values (each once).
        #[allow(unsafe_code)]
        unsafe {
            written_once(len, |values| {
                let work = Correlating {
                    minimal: self,
                    x,
                    shape,
                    jobs,
                    multiply,
                    out: Image {
                        values: values.as_mut_ptr().cast(),
                        size,
                        bias,
                        f: &f,
                        terms,
                    },
                };
                match schedule {
                    Schedule::Blocks => work.by_blocks(),
                    Schedule::Points => work.by_points(),
                }
            })
        }
    }

    /// The transformed input tiles `V_ξ = Bᵀ d B` of `correlation` over `x` (NHWC `shape`):
    /// `[α², tiles, channels]`, tiles row-major over `[batch, tile rows, tile columns]`.
    fn input(&self, x: &[f32], shape: Nhwc, correlation: &Correlation) -> Vec<f32> {
        let [batch, _, _, channels] = shape;
        let [rows, columns] = correlation.tiles();
        let tiles = batch * rows * columns;
        let alpha = self.alpha;
        if tiles == 0 {
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

    /// The outputs `f(Aᵀ M A + bias)` of one tile row, from `m` (each point's products, the
    /// row's first tile at `first`), written where the job's placement puts them.
    #[inline(always)]
    fn output_row<F: Fn(f32) -> f32>(
        &self,
        m: &[&[f32]],
        first: usize,
        jobs: &[(Correlation, Placement)],
        TileRow { job, image, row }: TileRow,
        out: &Image<'_, F>,
    ) {
        let (correlation, placement) = &jobs[job];
        let outputs = out.bias.len();
        let [height, width] = correlation.out;
        let [image_height, image_width] = out.size;
        let mut y = vec![0f32; outputs];
        for a in (0..TILE).take_while(|a| row * TILE + a < height) {
            for x in 0..width {
                let tile = first + x / TILE;
                y.copy_from_slice(out.bias);
                for &(xi, coefficient) in &out.terms[a * TILE + x % TILE] {
                    let product = &m[xi][tile * outputs..][..outputs];
                    for (y, &p) in y.iter_mut().zip(product) {
                        *y += coefficient * p;
                    }
                }
                let [py, px] = placement.pixel(row * TILE + a, x);
                let pixel = (image * image_height + py) * image_width + px;
                for (o, &y) in y.iter().enumerate() {
                    // SAFETY: the pixel lies in the image and is this output's alone
                    // (`covered_once`), so no other writer touches its values.
                    #[allow(unsafe_code)]
                    unsafe {
                        out.values.add(pixel * outputs + o).write((out.f)(y));
                    }
                }
            }
        }
    }
}

impl<M, F> Correlating<'_, M, F>
where
    M: Fn(usize, usize, &[f32]) -> Vec<f32> + Sync,
    F: Fn(f32) -> f32 + Sync,
{
    /// The correlations in blocks of tile rows, each on one thread, more than four per thread
    /// where there are enough tile rows.
    fn by_blocks(&self) {
        let (minimal, [batch, _, _, channels]) = (self.minimal, self.shape);
        let tile_bytes = minimal.alpha.pow(2) * (channels + self.out.bias.len()) * size_of::<f32>();
        let all_rows: usize = self.jobs.iter().map(|(c, _)| batch * c.tiles()[0]).sum();
        let enough = (all_rows / (4 * rayon::current_num_threads())).max(1);
        let blocks: Vec<(usize, usize, Range<usize>)> = (self.jobs.iter().enumerate())
            .flat_map(|(job, (correlation, _))| {
                let [rows, columns] = correlation.tiles();
                let fit = BLOCK_BYTES / tile_bytes / columns.max(1);
                let per_block = fit.min(enough).max(1);
                (0..batch).flat_map(move |image| {
                    (0..rows)
                        .step_by(per_block)
                        .map(move |row| (job, image, row..(row + per_block).min(rows)))
                })
            })
            .collect();
        blocks.into_par_iter().for_each(|(job, image, rows)| {
            pulp::Arch::new().dispatch(Block {
                work: self,
                job,
                image,
                rows,
            })
        });
    }

    /// The correlations point by point: every job's transformed tiles, then every point's
    /// product (each on one thread), then every tile row's outputs.
    fn by_points(&self) {
        let (minimal, batch) = (self.minimal, self.shape[0]);
        let points = minimal.alpha * minimal.alpha;
        let inputs: Vec<Vec<f32>> = (self.jobs.iter())
            .map(|(correlation, _)| minimal.input(self.x, self.shape, correlation))
            .collect();
        let work: Vec<(usize, usize, &[f32])> = (inputs.iter().enumerate())
            .flat_map(|(job, v)| {
                let len = v.len() / points;
                (0..points).map(move |xi| (job, xi, &v[xi * len..][..len]))
            })
            .collect();
        let products: Vec<Vec<f32>> = (work.into_par_iter())
            .map(|(job, xi, v)| (self.multiply)(job, xi, v))
            .collect();
        let m: Vec<&[f32]> = products.iter().map(Vec::as_slice).collect();
        let jobs = self.jobs;
        let tile_rows: Vec<TileRow> = (0..jobs.len())
            .flat_map(|job| {
                let rows = jobs[job].0.tiles()[0];
                (0..batch)
                    .flat_map(move |image| (0..rows).map(move |row| TileRow { job, image, row }))
            })
            .collect();
        tile_rows.into_par_iter().for_each(|tile_row| {
            pulp::Arch::new().dispatch(OutputRow {
                minimal,
                m: &m[tile_row.job * points..][..points],
                jobs,
                tile_row,
                out: &self.out,
            })
        });
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

    /// Both algorithms on both schedules give the correlation, for odd and even sizes (partial
    /// tiles), padding before and after, an origin past the image, and blocks of one and of
    /// several tile rows; the last case's kernels are wide enough for the point-by-point
    /// schedule.
    #[test]
    fn minimal_filtering_is_the_correlation() {
        let cases = [
            (F2X3, [-1, -1], [5, 6], [5, 6], [3, 5]),
            (F2X3, [0, -2], [3, 4], [4, 7], [3, 5]),
            (F2X3, [-1, -1], [40, 3], [40, 3], [3, 5]),
            (F2X2, [-1, 0], [4, 5], [4, 5], [3, 5]),
            (F2X2, [0, -1], [5, 3], [4, 3], [3, 5]),
            (F2X3, [-1, 0], [3, 5], [3, 4], [130, 128]),
        ];
        let mut schedules = Vec::new();
        for (minimal, origin, [height, width], out, [channels, outputs]) in cases {
            let (batch, r) = (2, minimal.taps);
            let shape = [batch, height, width, channels];
            let x = values(batch * height * width * channels, 1);
            let k = values(r * r * channels * outputs, 2);
            let tap = |ty: usize, tx: usize, c: usize, o: usize| {
                k[((ty * r + tx) * channels + c) * outputs + o]
            };
            let correlation = Correlation { origin, out };
            let want = by_definition(&x, shape, &correlation, r, outputs, tap);
            let u = minimal.kernel([channels, outputs], tap);
            let multiply = |_: usize, xi: usize, v: &[f32]| product(v, &u[xi], channels, outputs);
            let bias = values(outputs, 3);
            let jobs = [(correlation, Placement::SAME)];
            let got = minimal.correlate(&x, shape, &jobs, out, &bias, multiply, |y| 2.0 * y);
            let schedule = Schedule::for_kernels(u.iter().map(Vec::len).sum::<usize>() * 4);
            schedules.push(schedule);
            assert_eq!(got.len(), want.len());
            for (i, (g, e)) in got.iter().zip(&want).enumerate() {
                let e = 2.0 * (e + bias[i % outputs]);
                let tolerance = 1e-5 * (1.0 + e.abs());
                assert!(
                    (g - e).abs() < tolerance,
                    "{correlation:?}, {schedule:?}: {g} against {e}"
                );
            }
        }
        assert!(schedules.contains(&Schedule::Blocks) && schedules.contains(&Schedule::Points));
    }

    /// The phases of a 4 × 4, stride-2 transposed convolution put where they go must cover its
    /// output.
    #[test]
    #[should_panic(expected = "winograd: a pixel no correlation covers")]
    fn phases_that_leave_a_pixel_out_are_refused() {
        let window = Window {
            kernel: [4, 4],
            stride: [2, 2],
            padding: [1, 1],
        };
        let phases = Phase::of_transposed(&window, [2, 2]).unwrap();
        // Three of the four phases: a quarter of the output is no phase's.
        let jobs: Vec<_> = (phases[..3].iter())
            .map(|phase| (phase.correlation, phase.placement()))
            .collect();
        let x = values(2 * 2 * 3, 1);
        F2X2.correlate(
            &x,
            [1, 2, 2, 3],
            &jobs,
            [4, 4],
            &[0.0; 3],
            |_, _, v| v.to_vec(),
            |y| y,
        );
    }

    /// The phases of a 4 × 4, stride-2 transposed convolution, each through F(2×2, 2×2), put
    /// together are the transposed convolution (`out[i · 2 − p + k] += x[i] w[k]`).
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
            let kernels: Vec<Vec<Vec<f32>>> = (phases.iter())
                .map(|phase| {
                    let tap = |ty: usize, tx: usize, c: usize, o: usize| {
                        let [ky, kx] = phase.kernel_tap(ty, tx);
                        w[((c * outputs + o) * 4 + ky) * 4 + kx]
                    };
                    F2X2.kernel([channels, outputs], tap)
                })
                .collect();
            let jobs: Vec<_> = (phases.iter())
                .map(|phase| (phase.correlation, phase.placement()))
                .collect();
            let multiply =
                |job: usize, xi: usize, v: &[f32]| product(v, &kernels[job][xi], channels, outputs);
            let bias = vec![0.0; outputs];
            let got = F2X2.correlate(&x, shape, &jobs, [oh, ow], &bias, multiply, |y| y);
            assert_eq!(got.len(), want.len());
            for (g, e) in got.iter().zip(&want) {
                assert!((g - e).abs() < 1e-5, "{window:?}: {g} against {e}");
            }
        }
    }
}
