//! Row-major products `C (+)= f(A · B + bias)` whose operands are rounded to bf16 and whose
//! sums are f32, as PyTorch's CPU autocast multiplies (oneDNN's bf16 kernels): `B` is rounded
//! and packed once per weight ([`Packed`]), `A` is rounded while it is packed, and the bias,
//! the activation and a residual sum are applied in f32 as each 32 × 32 block of `C` is stored.
//!
//! Both instruction sets ([`Bf16Isa`]) read the same packing. `B`'s columns go in 16-column
//! panels of pair rows: pair row `p` of a panel holds, for each of its 16 columns `j`, the
//! values `B[2p, j]` and `B[2p + 1, j]` side by side (64 bytes: one AMX tile row, one 512-bit
//! register for `vdpbf16ps`). `A` is packed in blocks of 32 rows, each block as `depth / 32`
//! steps (the inner dimension rounded up to 32, zeros past it) of 32 rows × 32 values, so that a
//! tile of `A` is 1 kB contiguous (rows a power-of-two apart thrashed L1 at `k` = 2048). A task
//! computes the blocks of a range of rows against a range of columns whose panels stay in L2,
//! the inner dimension in passes that keep each block's sums between them. The packed `A` and the
//! sums are per-thread buffers kept between products; outputs are never zeroed first.

use std::cell::RefCell;
use std::mem::MaybeUninit;
use std::ops::Range;

use rayon::prelude::*;

use super::Bf16Isa;
use super::lines::Lines;
pub use super::padded::PaddedImage;
use crate::gemm::strided::View;
use crate::host::as_uninit;
use crate::host::conv::Windows;

/// Rows and columns of one block of `C`: 2 × 2 AMX tiles.
pub(super) const BLOCK: usize = 32;
/// Rows of an AMX tile of `A`, columns of a panel of `B` (16 f32 accumulators wide).
pub(super) const TILE: usize = 16;
/// Inner-dimension values one AMX step multiplies (one 64-byte tile row of bf16).
pub(super) const K_STEP: usize = 32;
/// Columns of a task: sixteen panels of `B`, `16 · 16 · depth` bf16 (384 kB at depth 768), in
/// L2; fewer column tasks means fewer passes of `A` through L3 (at 2 048², 128 columns a task
/// ran 0.82 TFLOP/s, 256 ran 0.92 on a Sapphire Rapids VM).
const TASK_COLUMNS: usize = 8 * BLOCK;
/// Inner-dimension steps per pass over a task's blocks: a block of `A`, 32 rows × 1 024 values
/// (64 kB), meets every column block of the task, whose `B` stays in L2 (at 2 048², passes of
/// 16 steps ran 1.33 TFLOP/s, 32 steps 1.42, on a Sapphire Rapids VM).
const STEPS_PER_PASS: usize = 32;
/// Row blocks whose sums a task keeps between passes (4 × 8 blocks of 4 kB; at 2 048², 8 ran
/// 1.42 TFLOP/s, 4 ran 1.47–1.54).
const ROW_BLOCKS_PER_PASS: usize = 4;

/// Packed values from which [`Packed`]'s panels are filled in parallel.
const PARALLEL_PACKING: usize = 1 << 16;

thread_local! {
    /// Each calling thread's packed `A`, reused by its products.
    static PACKED_A: RefCell<Lines<u16>> = const { RefCell::new(Lines::new()) };
    /// Each task thread's sums between passes, reused by its tasks.
    static SUMS: RefCell<Vec<Block>> = const { RefCell::new(Vec::new()) };
}

/// Whether bf16 products run here ([`Bf16Isa::chosen`] found an instruction set).
pub fn supported() -> bool {
    Bf16Isa::chosen().is_some()
}

/// The CPU's bf16 peak on all of rayon's threads, in FLOP/s: the chosen instruction set's
/// multiply-adds on operands held in registers (no memory traffic), timed after a warm-up run;
/// the ceiling a bf16 product's rate is read against. `None` without bf16 products.
#[allow(unsafe_code)]
pub fn peak_flop_per_s() -> Option<f64> {
    let isa = Bf16Isa::chosen()?;
    let threads = rayon::current_num_threads();
    #[cfg(target_arch = "x86_64")]
    {
        let (steps, flop_per_step) = match isa {
            Bf16Isa::Amx => (100_000, super::amx::RESIDENT_FLOP_PER_STEP),
            Bf16Isa::Avx512Bf16 => (1_000_000, super::avx512_bf16::RESIDENT_FLOP_PER_STEP),
        };
        // SAFETY: the chosen instruction set is available; AMX is configured on each thread
        // that runs it.
        let run = || {
            (0..threads).into_par_iter().for_each(|_| unsafe {
                match isa {
                    Bf16Isa::Amx => {
                        super::amx::configure();
                        super::amx::resident_products(steps);
                        super::amx::release();
                    }
                    Bf16Isa::Avx512Bf16 => {
                        std::hint::black_box(super::avx512_bf16::resident_products(steps));
                    }
                }
            })
        };
        run();
        let start = std::time::Instant::now();
        run();
        let seconds = start.elapsed().as_secs_f64();
        Some(threads as f64 * steps as f64 * flop_per_step / seconds)
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (isa, threads);
        None
    }
}

/// `x` rounded to the nearest bf16 (ties to even), as its 16 bits; NaN stays NaN.
pub fn round(x: f32) -> u16 {
    let bits = x.to_bits();
    if x.is_nan() {
        return (bits >> 16) as u16 | 0x40;
    }
    ((bits + 0x7fff + ((bits >> 16) & 1)) >> 16) as u16
}

/// The f32 value of the bf16 `bits`.
pub fn widen(bits: u16) -> f32 {
    f32::from_bits(u32::from(bits) << 16)
}

/// A product's right operand `[k, n]` rounded to bf16 and packed for [`product`]: 16-column
/// panels of pair rows (zero past `k` and `n`), made once per weight.
#[derive(Debug)]
pub struct Packed {
    k: usize,
    n: usize,
    /// `k` rounded up to [`K_STEP`].
    depth: usize,
    panels: Lines<u16>,
}

impl Packed {
    /// The row-major `[k, n]` matrix whose columns are those of `blocks` side by side, each
    /// block a row-major `[k, columns]` matrix given with its column count, rounded to bf16.
    ///
    /// Panics when a block is not `[k, columns]`.
    pub fn new(k: usize, blocks: &[(&[f32], usize)]) -> Packed {
        assert!(
            blocks.iter().all(|(b, columns)| b.len() == k * columns),
            "gemm::bf16::Packed::new: a block is not [k, columns]"
        );
        // The block and its column holding each column of the concatenation.
        let sources: Vec<(&[f32], usize, usize)> = blocks
            .iter()
            .flat_map(|&(block, columns)| (0..columns).map(move |j| (block, columns, j)))
            .collect();
        Packed::from_columns(k, sources.len(), |j| {
            let (block, columns, column) = sources[j];
            move |row| block[row * columns + column]
        })
    }

    /// The matrix `values` holds as `view` says (`[k, n]`, any strides), rounded to bf16: for
    /// a right operand that is new on every product, such as a gradient.
    ///
    /// Panics when the view reaches past `values`.
    pub fn of_view(values: &[f32], view: View) -> Packed {
        assert!(
            view.fits(values.len()),
            "gemm::bf16::Packed::of_view: the view reaches past its values"
        );
        let (k, n) = (view.row_count(), view.column_count());
        Packed::with_panels(k, n, |first, lanes, packed| {
            // Rounded a row (or a column) at a time, then interleaved into the pair rows.
            if lanes == TILE && fill_panel_fast(values, &view, first, k, packed) {
                // Whole panels of a row-major or transposed matrix, 32 values an instruction.
            } else if view.is_row_major() {
                // A panel row's values lie side by side: one cache line a row.
                let mut rounded = [0u16; TILE];
                for row in 0..k {
                    round_row(
                        &values[view.index(row, first)..][..lanes],
                        &mut rounded[..lanes],
                    );
                    let pair_row = &mut packed[(row / 2) * 2 * TILE..][..2 * TILE];
                    for (lane, &value) in rounded[..lanes].iter().enumerate() {
                        pair_row[2 * lane + row % 2] = value;
                    }
                }
            } else if view.is_column_major() {
                // A transposed matrix: each column's values lie side by side.
                let mut rounded = vec![0u16; k];
                for lane in 0..lanes {
                    round_row(&values[view.index(0, first + lane)..][..k], &mut rounded);
                    for (row, &value) in rounded.iter().enumerate() {
                        packed[(row / 2) * 2 * TILE + 2 * lane + row % 2] = value;
                    }
                }
            } else {
                for lane in 0..lanes {
                    for row in 0..k {
                        let value = values[view.index(row, first + lane)];
                        packed[(row / 2) * 2 * TILE + 2 * lane + row % 2] = round(value);
                    }
                }
            }
        })
    }

    /// The `[k, n]` matrix whose column `j` is read by `column(j)`, row by row.
    fn from_columns<C: Fn(usize) -> f32>(
        k: usize,
        n: usize,
        column: impl Fn(usize) -> C + Sync,
    ) -> Packed {
        Packed::with_panels(k, n, |first, lanes, packed| {
            let columns: Vec<C> = (first..first + lanes).map(&column).collect();
            // Row by row: a row-major matrix's panel row is one cache line.
            for row in 0..k {
                let pair_row = &mut packed[(row / 2) * 2 * TILE..][..2 * TILE];
                for (lane, value) in columns.iter().enumerate() {
                    pair_row[2 * lane + row % 2] = round(value(row));
                }
            }
        })
    }

    /// A `[k, n]` matrix whose 16-column panels `fill(first column, columns, panel)` writes
    /// (zeros past `k` and past `n` already there), in parallel.
    fn with_panels(k: usize, n: usize, fill: impl Fn(usize, usize, &mut [u16]) + Sync) -> Packed {
        let depth = k.next_multiple_of(K_STEP);
        let panel_len = depth * TILE;
        let len = n.div_ceil(BLOCK) * 2 * panel_len;
        let fill_panel = |panel: usize, packed: &mut [u16]| {
            let first = panel * TILE;
            let lanes = TILE.min(n.saturating_sub(first));
            if lanes > 0 {
                fill(first, lanes, packed);
            }
        };
        // A small operand on the calling thread: attention packs each head's keys and values,
        // the heads in parallel, and splitting a head's 16 kB across the threads cost more than
        // packing it.
        let panels = Lines::filled(len, panel_len.max(1), len >= PARALLEL_PACKING, fill_panel);
        Packed {
            k,
            n,
            depth,
            panels,
        }
    }

    /// Rows of the matrix (the product's inner dimension).
    pub fn rows(&self) -> usize {
        self.k
    }

    /// Columns of the matrix (the product's output columns).
    pub fn columns(&self) -> usize {
        self.n
    }

    /// The two panels of block column `block` (32 columns).
    fn block(&self, block: usize) -> *const u16 {
        self.panels[block * 2 * TILE * self.depth..].as_ptr()
    }
}

/// `c = f(a · b + bias)`, or `c = f(c + a · b + bias)` with `accumulate`, for row-major `a`
/// `[m, k]`, the packed `b` `[k, n]` and `c` `[m, n]`, and `bias` `[n]`, on all of rayon's
/// threads; `a` is rounded to bf16, sums are f32.
///
/// Panics when a slice is shorter than its shape or no bf16 instruction set is [`supported`].
pub fn product(
    c: &mut [f32],
    a: &[f32],
    b: &Packed,
    m: usize,
    accumulate: bool,
    bias: &[f32],
    f: impl Fn(f32) -> f32 + Sync,
) {
    let isa = Bf16Isa::chosen().expect("gemm::bf16::product: no bf16 products on this CPU");
    Product::new(
        isa,
        as_uninit(c),
        Lhs::Matrix(a),
        b,
        m,
        accumulate,
        Some(bias),
    )
    .run(&f, true);
}

/// [`new_product`] on the calling thread alone: for a caller that runs several products at
/// once, one per thread (Winograd's per-point products).
pub fn new_product_on_this_thread(
    a: &[f32],
    b: &Packed,
    m: usize,
    bias: &[f32],
    f: impl Fn(f32) -> f32 + Sync,
) -> Vec<f32> {
    let isa = Bf16Isa::chosen().expect("gemm::bf16::product: no bf16 products on this CPU");
    written(m * b.n, |c| {
        Product::new(isa, c, Lhs::Matrix(a), b, m, false, Some(bias)).run(&f, false)
    })
}

/// [`product`] into a new vector `[m, n]`.
pub fn new_product(
    a: &[f32],
    b: &Packed,
    m: usize,
    bias: &[f32],
    f: impl Fn(f32) -> f32 + Sync,
) -> Vec<f32> {
    let isa = Bf16Isa::chosen().expect("gemm::bf16::product: no bf16 products on this CPU");
    written(m * b.n, |c| {
        Product::new(isa, c, Lhs::Matrix(a), b, m, false, Some(bias)).run(&f, true)
    })
}

/// `a · b + bias` (no bias: zeros) into a new row-major `[m, n]`, never zeroed first, for `a`
/// `[m, k]` read through a strided view (a transposed operand is a view) and rounded to bf16
/// here, and `b` packed (a weight packed once, or an operand new on every call through
/// [`Packed::of_view`]), on all of rayon's threads: training's forward and gradient products.
///
/// Panics when the shapes disagree, `a`'s view reaches past its slice, `bias` is not `[n]` or
/// no bf16 instruction set is [`supported`].
pub fn view_product(a: &[f32], a_view: View, b: &Packed, bias: Option<&[f32]>) -> Vec<f32> {
    let isa = Bf16Isa::chosen().expect("gemm::bf16::view_product: no bf16 products on this CPU");
    assert!(
        a_view.fits(a.len()),
        "gemm::bf16::view_product: a's view reaches past its values"
    );
    let m = a_view.row_count();
    written(m * b.n, |c| {
        Product::new(isa, c, Lhs::View(a, a_view), b, m, false, bias).run(&|v| v, true)
    })
}

/// `a · b` written into rows `rows` of `c` (row `r` of the product into `c`'s row `rows[r]`,
/// `b`'s columns wide), overwriting them or, with `accumulate`, added to them, on the calling
/// thread alone: products too small to share, run side by side (one attention head's gradient
/// products, the images in parallel). `a` is `[m, k]` through a view, rounded here.
///
/// Panics when the shapes disagree, `a`'s view reaches past its slice, `rows` is not one row of
/// `a` each, in increasing order, inside `c`, or no bf16 instruction set is [`supported`].
pub fn view_product_into_rows(
    c: &mut [f32],
    rows: &[usize],
    accumulate: bool,
    (a, a_view): (&[f32], View),
    b: &Packed,
) {
    let isa = Bf16Isa::chosen().expect("gemm::bf16::view_product_into_rows: no bf16 products");
    assert!(
        a_view.fits(a.len())
            && rows.len() == a_view.row_count()
            && rows.windows(2).all(|pair| pair[0] < pair[1])
            && rows.last().is_none_or(|&last| (last + 1) * b.n <= c.len()),
        "gemm::bf16::view_product_into_rows: a's view past its values, or rows not one per row \
         of a, increasing, inside c"
    );
    // The rows checked above: distinct, each inside `c`.
    let c = Out(c.as_mut_ptr(), Some(rows));
    let prior = Prior::summed_in(accumulate);
    let a = Lhs::View(a, a_view);
    Product::writing(c, isa, a, b, rows.len(), prior, None).run(&|v| v, false);
}

/// A new vector of `len` values that `write` fills through a product without `accumulate`
/// (which stores every value of its `C`), never zeroed first.
#[allow(unsafe_code)]
fn written(len: usize, write: impl FnOnce(&mut [MaybeUninit<f32>])) -> Vec<f32> {
    // SAFETY: a product without `accumulate` writes each of its `m · n` values.
    unsafe { crate::host::written_once(len, write) }
}

/// A product's left operand: row-major values, or a convolution's windows over an NHWC image
/// (rounded to bf16 as they are read, the unfolded rows never written out).
#[derive(Clone, Copy)]
enum Lhs<'a> {
    /// Row-major `[m, k]`.
    Matrix(&'a [f32]),
    /// `[m, k]` as the view says.
    View(&'a [f32], View),
    /// The windows' rows, `[m, k]`.
    Windows(&'a Windows<'a>),
    /// The windows' rows read where they lie in a padded bf16 image (AMX only).
    Image(&'a PaddedImage, &'a Windows<'a>),
}

/// `f(windows · b + bias)` `[rows, n]` on all of rayon's threads, for the windows of a
/// convolution over an NHWC image and the kernel `b` packed as `[taps · channels, out]`: each
/// window row is read from the image and rounded as `A` is packed.
///
/// Panics when `windows` and `b` disagree or no bf16 instruction set is [`supported`].
pub fn conv_product(
    windows: &Windows,
    b: &Packed,
    bias: &[f32],
    f: impl Fn(f32) -> f32 + Sync,
) -> Vec<f32> {
    let isa = Bf16Isa::chosen().expect("gemm::bf16::conv_product: no bf16 products on this CPU");
    let m = windows.rows();
    written(m * b.n, |c| {
        Product::new(isa, c, Lhs::Windows(windows), b, m, false, Some(bias)).run(&f, true)
    })
}

/// [`conv_product`] with the windows' tiles read where they lie in `image` (the windows'
/// image, rounded to bf16 once with a zero border: [`PaddedImage`]) rather than packed row by
/// row; AMX tiles only. The same sums as [`conv_product`], bit for bit.
///
/// Panics unless AMX is the chosen instruction set and `image` [serves](PaddedImage::serves)
/// `windows`, or when `windows` and `b` disagree.
pub fn image_product(
    image: &PaddedImage,
    windows: &Windows,
    b: &Packed,
    bias: &[f32],
    f: impl Fn(f32) -> f32 + Sync,
) -> Vec<f32> {
    image_served(image, windows);
    let m = windows.rows();
    written(m * b.n, |c| {
        Product::new(
            Bf16Isa::Amx,
            c,
            Lhs::Image(image, windows),
            b,
            m,
            false,
            Some(bias),
        )
        .run(&f, true)
    })
}

/// Panics unless AMX is the chosen instruction set and `image` serves `windows`: what
/// [`image_product`] and [`image_product_into_rows`] read in place.
fn image_served(image: &PaddedImage, windows: &Windows) {
    assert_eq!(
        Bf16Isa::chosen(),
        Some(Bf16Isa::Amx),
        "gemm::bf16::image_product: AMX tiles only"
    );
    assert!(
        image.serves(windows),
        "gemm::bf16::image_product: the image does not serve these windows"
    );
}

/// [`image_product`] written into rows `rows` of `c` (row `r` of the product into `c`'s row
/// `rows[r]`, `b`'s columns wide), overwriting them, or with `add_onto` added to them after
/// `f` (`c = c + f(…)`: a skip connection summed as the product is stored): a transposed
/// convolution's phase put where its pixels lie in the output, not gathered and copied there.
///
/// Panics as [`image_product`] does, and unless `rows` has a row per window, in increasing
/// order, inside `c`.
#[allow(clippy::too_many_arguments)]
pub fn image_product_into_rows(
    c: &mut [f32],
    rows: &[usize],
    image: &PaddedImage,
    windows: &Windows,
    b: &Packed,
    bias: &[f32],
    add_onto: bool,
    f: impl Fn(f32) -> f32 + Sync,
) {
    image_served(image, windows);
    assert!(
        rows.len() == windows.rows()
            && rows.windows(2).all(|pair| pair[0] < pair[1])
            && rows.last().is_none_or(|&last| (last + 1) * b.n <= c.len()),
        "gemm::bf16::image_product_into_rows: rows not one per window, increasing, inside c"
    );
    // The rows checked above: distinct, each inside `c`.
    let c = Out(c.as_mut_ptr(), Some(rows));
    let a = Lhs::Image(image, windows);
    let prior = match add_onto {
        true => Prior::AddedAfter,
        false => Prior::Overwritten,
    };
    Product::writing(c, Bf16Isa::Amx, a, b, windows.rows(), prior, Some(bias)).run(&f, true);
}

/// One product's operands and where it writes.
struct Product<'a> {
    isa: Bf16Isa,
    c: Out<'a>,
    a: Lhs<'a>,
    b: &'a Packed,
    m: usize,
    prior: Prior,
    /// `[n]`, or none.
    bias: Option<&'a [f32]>,
}

/// What a product does with the values `C` held before it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Prior {
    /// Overwritten: `c = f(a · b + bias)` (`C` may start uninitialised).
    Overwritten,
    /// Summed in before the activation: `c = f(c + a · b + bias)`.
    SummedIn,
    /// Added after it: `c = c + f(a · b + bias)` (a skip connection around a layer and its
    /// activation).
    AddedAfter,
}

impl Prior {
    /// [`Prior::SummedIn`] with `accumulate`, else [`Prior::Overwritten`].
    fn summed_in(accumulate: bool) -> Prior {
        match accumulate {
            true => Prior::SummedIn,
            false => Prior::Overwritten,
        }
    }
}

/// `C`'s values, written by tasks whose blocks never overlap, and where each of its rows lies
/// (`n` values apart, or at the rows given: distinct).
#[derive(Clone, Copy)]
struct Out<'a>(*mut f32, Option<&'a [usize]>);

// SAFETY: tasks write disjoint blocks of `C` (distinct rows × columns) while the product
// borrows it mutably.
#[allow(unsafe_code)]
unsafe impl Send for Out<'_> {}
#[allow(unsafe_code)]
unsafe impl Sync for Out<'_> {}

impl<'a> Product<'a> {
    fn new(
        isa: Bf16Isa,
        c: &'a mut [MaybeUninit<f32>],
        a: Lhs<'a>,
        b: &'a Packed,
        m: usize,
        accumulate: bool,
        bias: Option<&'a [f32]>,
    ) -> Self {
        assert!(c.len() >= m * b.n, "gemm::bf16::product: c is not [m, n]");
        let c = Out(c.as_mut_ptr().cast(), None);
        Product::writing(c, isa, a, b, m, Prior::summed_in(accumulate), bias)
    }

    /// [`Self::new`] writing where `c` says (its caller checked that it holds `m` rows of `n`).
    fn writing(
        c: Out<'a>,
        isa: Bf16Isa,
        a: Lhs<'a>,
        b: &'a Packed,
        m: usize,
        prior: Prior,
        bias: Option<&'a [f32]>,
    ) -> Self {
        match a {
            Lhs::Matrix(a) => assert!(a.len() >= m * b.k, "gemm::bf16::product: a is not [m, k]"),
            Lhs::View(_, view) => assert!(
                view.row_count() == m && view.column_count() == b.k,
                "gemm::bf16::view_product: a is not [m, k]"
            ),
            Lhs::Windows(windows) | Lhs::Image(_, windows) => assert!(
                windows.rows() == m && windows.depth() == b.k,
                "gemm::bf16::conv_product: the windows are not [m, k]"
            ),
        }
        assert!(
            bias.is_none_or(|bias| bias.len() == b.n),
            "gemm::bf16::product: bias is not [n]"
        );
        Product {
            isa,
            c,
            a,
            b,
            m,
            prior,
            bias,
        }
    }

    /// `A` packed, then every task, on all threads or this one.
    fn run(&self, f: &(impl Fn(f32) -> f32 + Sync), every_thread: bool) {
        if self.m == 0 || self.b.n == 0 {
            return;
        }
        // The calling thread's buffer, kept between products (a product per call allocated and
        // zeroed megabytes: page faults were a sixth of the U-Net's frame). Taken out while in
        // use: a thread waiting on the tasks may run another product's work meanwhile.
        let mut packed_a = PACKED_A.take();
        self.run_packed(&mut packed_a, f, every_thread);
        PACKED_A.set(packed_a);
    }

    /// [`Self::run`] with `A` packed into `packed_a` (grown as needed).
    fn run_packed(
        &self,
        packed_a: &mut Lines<u16>,
        f: &(impl Fn(f32) -> f32 + Sync),
        every_thread: bool,
    ) {
        self.pack_a(packed_a, every_thread);
        let packed_a = &packed_a[..];
        let threads = if every_thread {
            rayon::current_num_threads()
        } else {
            1
        };
        let tasks = tasks(self.m.div_ceil(BLOCK), self.b.n.div_ceil(BLOCK), threads);
        let run = |task: &Task| self.run_task(task, packed_a, f);
        match every_thread {
            true => tasks.par_iter().for_each(run),
            false => tasks.iter().for_each(run),
        }
    }

    /// `A`'s rows rounded to bf16 into `packed` (its first `⌈m / 32⌉ · 32 · depth` values) in
    /// blocks of 32 rows, each block step by step (32 rows of 32 values: one AMX tile pair, 2 kB
    /// contiguous, whatever `k`), zeros past `m` and `k`.
    fn pack_a(&self, packed: &mut Lines<u16>, every_thread: bool) {
        let (k, depth) = (self.b.k, self.b.depth);
        if matches!(self.a, Lhs::Image(..)) || depth == 0 {
            return; // read in place, or nothing to read
        }
        let len = self.m.div_ceil(BLOCK) * BLOCK * depth;
        if packed.len() < len {
            packed.resize(len);
        }
        // A window row is read into the scratch row first.
        let scratch = || vec![0f32; k];
        let pack = |(block, to): (usize, &mut [u16]), read: &mut Vec<f32>| {
            // A row-major view's rows are read in place below.
            if let Lhs::View(a, view) = self.a
                && !view.is_row_major()
            {
                return self.pack_columns(a, view, block, to);
            }
            for r in 0..BLOCK {
                let row = block * BLOCK + r;
                if row >= self.m {
                    for step in 0..depth / K_STEP {
                        to[(step * BLOCK + r) * K_STEP..][..K_STEP].fill(0);
                    }
                    continue;
                }
                let values = match self.a {
                    Lhs::Matrix(a) => &a[row * k..][..k],
                    Lhs::View(a, view) => &a[view.index(row, 0)..][..k],
                    Lhs::Windows(windows) => {
                        windows.read(row, 0, read.as_mut_slice());
                        read.as_slice()
                    }
                    Lhs::Image(..) => unreachable!("an image is read in place"),
                };
                // Rounded straight into place, a step's 32 values at a time.
                for (step, values) in values.chunks(K_STEP).enumerate() {
                    let to = &mut to[(step * BLOCK + r) * K_STEP..][..K_STEP];
                    round_row(values, &mut to[..values.len()]);
                    to[values.len()..].fill(0);
                }
                for step in k.div_ceil(K_STEP)..depth / K_STEP {
                    to[(step * BLOCK + r) * K_STEP..][..K_STEP].fill(0);
                }
            }
        };
        let blocks = BLOCK * depth;
        let packed = &mut packed[..len];
        match every_thread {
            true => (packed.par_chunks_mut(blocks).enumerate())
                .for_each_init(scratch, |scratch, block| pack(block, scratch)),
            false => {
                let mut scratch = scratch();
                (packed.chunks_mut(blocks).enumerate()).for_each(|block| pack(block, &mut scratch))
            }
        }
    }

    /// Block `block` of `A`'s rows packed as [`Self::pack_a`] packs it, from a view whose rows
    /// are strided (a transposed matrix: training's `xᵀ dy`): a step's 32 × 32 values are read
    /// along the inner dimension (the block's 32 rows side by side in memory), rounded 32 at a
    /// time, and transposed in place, rather than read row by row, a cache line per value.
    fn pack_columns(&self, a: &[f32], view: View, block: usize, to: &mut [u16]) {
        let (k, depth) = (self.b.k, self.b.depth);
        let first = block * BLOCK;
        let rows = BLOCK.min(self.m - first);
        let mut read = [0f32; BLOCK];
        let mut rounded = [[0u16; BLOCK]; K_STEP];
        for step in 0..depth / K_STEP {
            for (within, rounded) in rounded.iter_mut().enumerate() {
                let l = step * K_STEP + within;
                if l >= k {
                    rounded.fill(0);
                    continue;
                }
                let values = if view.is_column_major() {
                    &a[view.index(first, l)..][..rows]
                } else {
                    for (r, value) in read[..rows].iter_mut().enumerate() {
                        *value = a[view.index(first + r, l)];
                    }
                    &read[..rows]
                };
                round_row(values, &mut rounded[..rows]);
                rounded[rows..].fill(0);
            }
            let tile = &mut to[step * BLOCK * K_STEP..][..BLOCK * K_STEP];
            for (r, row) in tile.chunks_exact_mut(K_STEP).enumerate() {
                for (value, rounded) in row.iter_mut().zip(&rounded) {
                    *value = rounded[r];
                }
            }
        }
    }

    /// One task's blocks: groups of its row blocks against its column blocks, the inner
    /// dimension in passes of [`STEPS_PER_PASS`] steps, the sums kept between passes.
    fn run_task(&self, task: &Task, packed_a: &[u16], f: &impl Fn(f32) -> f32) {
        // Each block's sums are written by its first pass before any read (`add` is false
        // there); the buffer is this thread's, kept between tasks.
        let blocks = ROW_BLOCKS_PER_PASS.min(task.row_blocks.len()) * task.column_blocks.len();
        let mut sums = SUMS.take();
        if sums.len() < blocks {
            sums.resize_with(blocks, || Block([0f32; BLOCK * BLOCK]));
        }
        self.run_task_into(task, packed_a, f, &mut sums);
        SUMS.set(sums);
    }

    /// [`Self::run_task`] with `sums` holding at least a group's blocks.
    #[allow(unsafe_code)]
    fn run_task_into(
        &self,
        task: &Task,
        packed_a: &[u16],
        f: &impl Fn(f32) -> f32,
        sums: &mut [Block],
    ) {
        let depth = self.b.depth;
        let steps = depth / K_STEP;
        let columns = task.column_blocks.len();
        #[cfg(target_arch = "x86_64")]
        if self.isa == Bf16Isa::Amx {
            // SAFETY: the ISA was chosen because AMX is available.
            unsafe { super::amx::configure() };
        }
        let rows: Vec<usize> = task.row_blocks.clone().collect();
        #[cfg(target_arch = "x86_64")]
        let tile_rows = match self.a {
            Lhs::Image(image, windows) => Some(image.tile_rows(windows)),
            _ => None,
        };
        if steps == 0 {
            // No inner dimension (a transposed convolution's phase that no tap reaches): the
            // sums are zeros, the outputs the bias.
            sums.iter_mut().for_each(|block| block.0.fill(0.0));
        }
        for group in rows.chunks(ROW_BLOCKS_PER_PASS) {
            for first_step in (0..steps).step_by(STEPS_PER_PASS) {
                let pass = first_step..(first_step + STEPS_PER_PASS).min(steps);
                for (i, &row_block) in group.iter().enumerate() {
                    let a = packed_a
                        .get(row_block * BLOCK * depth..)
                        .map(<[u16]>::as_ptr);
                    for (j, column_block) in task.column_blocks.clone().enumerate() {
                        let b = self.b.block(column_block);
                        let out = &mut sums[i * columns + j].0;
                        let add = first_step > 0;
                        // SAFETY: `a` points at a whole packed block of 32 rows (or the image
                        // holds the block's windows: `image_product` checked it serves them),
                        // `b` at two whole panels, `pass` inside the depth; the chosen ISA is
                        // available (and AMX configured above).
                        #[cfg(target_arch = "x86_64")]
                        unsafe {
                            match (self.isa, self.a) {
                                (Bf16Isa::Amx, Lhs::Image(image, windows)) => {
                                    let rows = tile_rows.as_ref().expect("an image's tile rows");
                                    // The lower tile past the last row repeats the upper one.
                                    let first = row_block * BLOCK;
                                    let second = first + TILE;
                                    let second = if second < self.m { second } else { first };
                                    let [upper, lower] = [first, second].map(|p| rows.pixel(p));
                                    let offsets = &rows.offsets;
                                    let tiles = |step: usize| {
                                        let offset = offsets[step];
                                        [upper.wrapping_add(offset), lower.wrapping_add(offset)]
                                    };
                                    let stride = image.row_stride(windows);
                                    super::amx::block_in_place(
                                        tiles,
                                        stride,
                                        b,
                                        depth,
                                        pass.clone(),
                                        (out, BLOCK),
                                        add,
                                    )
                                }
                                (Bf16Isa::Amx, _) => super::amx::block(
                                    a.expect("packed"),
                                    b,
                                    depth,
                                    pass.clone(),
                                    out,
                                    add,
                                ),
                                (Bf16Isa::Avx512Bf16, _) => super::avx512_bf16::block(
                                    a.expect("packed"),
                                    b,
                                    depth,
                                    pass.clone(),
                                    out,
                                    add,
                                ),
                            }
                        }
                    }
                }
            }
            for (i, &row_block) in group.iter().enumerate() {
                for (j, column_block) in task.column_blocks.clone().enumerate() {
                    let out = &sums[i * columns + j].0;
                    self.store(row_block * BLOCK, column_block * BLOCK, out, f);
                }
            }
        }
        #[cfg(target_arch = "x86_64")]
        if self.isa == Bf16Isa::Amx {
            // SAFETY: configured above on this thread.
            unsafe { super::amx::release() };
        }
    }

    /// `C`'s block at (`first_row`, `first_column`) from the sums `out`, inside `C`'s bounds,
    /// compiled for the CPU's widest SIMD instructions (the activation too: SiLU on 16 lanes).
    fn store(&self, first_row: usize, first_column: usize, out: &[f32], f: &impl Fn(f32) -> f32) {
        pulp::Arch::new().dispatch(Store {
            product: self,
            first_row,
            first_column,
            out,
            f,
        });
    }
}

/// One block of [`Product::store`], compiled (through pulp's dispatch, which compiles what is
/// inlined into `with_simd`) for the best SIMD instruction set the CPU has.
struct Store<'a, F> {
    product: &'a Product<'a>,
    first_row: usize,
    first_column: usize,
    out: &'a [f32],
    f: &'a F,
}

impl<F: Fn(f32) -> f32> pulp::WithSimd for Store<'_, F> {
    type Output = ();

    #[inline(always)]
    #[allow(unsafe_code)]
    fn with_simd<S: pulp::Simd>(self, _: S) {
        let Store {
            product,
            first_row,
            first_column,
            out,
            f,
        } = self;
        let n = product.b.n;
        let rows = BLOCK.min(product.m - first_row);
        let columns = BLOCK.min(n - first_column);
        let zeros = [0f32; BLOCK];
        let bias = product
            .bias
            .map_or(&zeros[..columns], |bias| &bias[first_column..][..columns]);
        for row in 0..rows {
            let sums = &out[row * BLOCK..][..columns];
            let at = (product.c.1).map_or(first_row + row, |rows| rows[first_row + row]);
            // SAFETY: this row's columns of the block belong to this task alone, inside `C`.
            let c = unsafe {
                std::slice::from_raw_parts_mut(
                    (product.c.0)
                        .add(at * n + first_column)
                        .cast::<MaybeUninit<f32>>(),
                    columns,
                )
            };
            let pairs = c.iter_mut().zip(sums).zip(bias);
            match product.prior {
                Prior::Overwritten => pairs.for_each(|((c, &sum), &bias)| {
                    c.write(f(sum + bias));
                }),
                // SAFETY: `C` came initialised where its values are kept (the callers take
                // `&mut [f32]`).
                Prior::SummedIn => pairs.for_each(|((c, &sum), &bias)| {
                    let start = unsafe { c.assume_init_read() };
                    c.write(f(start + sum + bias));
                }),
                Prior::AddedAfter => pairs.for_each(|((c, &sum), &bias)| {
                    let start = unsafe { c.assume_init_read() };
                    c.write(start + f(sum + bias));
                }),
            }
        }
    }
}

/// One block of sums, aligned for the tile stores.
#[repr(C, align(64))]
struct Block([f32; BLOCK * BLOCK]);

/// A task: row blocks against column blocks (32 each).
struct Task {
    row_blocks: Range<usize>,
    column_blocks: Range<usize>,
}

/// Tasks covering `row_blocks × column_blocks`: column ranges of [`TASK_COLUMNS`] (fewer when
/// that leaves threads idle), row ranges cut so that there are a few tasks per thread.
fn tasks(row_blocks: usize, column_blocks: usize, threads: usize) -> Vec<Task> {
    let wanted = 4 * threads;
    let mut per_task = (TASK_COLUMNS / BLOCK).min(column_blocks).max(1);
    while per_task > 1 && column_blocks.div_ceil(per_task) * row_blocks < wanted {
        per_task /= 2;
    }
    let column_tasks = column_blocks.div_ceil(per_task);
    let row_tasks = wanted.div_ceil(column_tasks).clamp(1, row_blocks);
    let rows_per_task = row_blocks.div_ceil(row_tasks);
    let mut tasks = Vec::new();
    for first_row in (0..row_blocks).step_by(rows_per_task) {
        for first_column in (0..column_blocks).step_by(per_task) {
            tasks.push(Task {
                row_blocks: first_row..(first_row + rows_per_task).min(row_blocks),
                column_blocks: first_column..(first_column + per_task).min(column_blocks),
            });
        }
    }
    tasks
}

/// A whole 16-column panel of the matrix `values` holds as `view` says (`k` rows, columns from
/// `first`), rounded and interleaved into `packed` with AVX-512 where the CPU has AVX512-BF16:
/// two rows of a row-major matrix a pair row, or 32 rows of a transposed matrix's column a
/// time. Returns whether it did (else nothing is written).
fn fill_panel_fast(
    values: &[f32],
    view: &View,
    first: usize,
    k: usize,
    packed: &mut [u16],
) -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        use super::avx512_bf16::{interleave_rows, interleaves, scatter_column};
        if view.is_row_major() && interleaves() {
            let zeros = [0f32; TILE];
            for (pair, to) in packed
                .chunks_exact_mut(2 * TILE)
                .take(k.div_ceil(2))
                .enumerate()
            {
                let even = &values[view.index(2 * pair, first)..][..TILE];
                let odd = match 2 * pair + 1 < k {
                    true => &values[view.index(2 * pair + 1, first)..][..TILE],
                    false => &zeros[..],
                };
                // SAFETY: the CPU interleaves; 16 values read from each row, 32 written.
                #[allow(unsafe_code)]
                unsafe {
                    interleave_rows(even.as_ptr(), odd.as_ptr(), to.as_mut_ptr())
                };
            }
            return true;
        }
        if view.is_column_major() && super::avx512_bf16::available() {
            let whole = k / K_STEP * K_STEP;
            for lane in 0..TILE {
                let column = &values[view.index(0, first + lane)..][..k];
                for start in (0..whole).step_by(K_STEP) {
                    let panel = &mut packed[start * TILE..][..K_STEP * TILE];
                    // SAFETY: AVX512-BF16 is here; 32 values read, 16 pair rows written.
                    #[allow(unsafe_code)]
                    unsafe {
                        scatter_column(column[start..].as_ptr(), panel.as_mut_ptr(), lane)
                    };
                }
                for (row, &value) in column.iter().enumerate().skip(whole) {
                    packed[(row / 2) * 2 * TILE + 2 * lane + row % 2] = round(value);
                }
            }
            return true;
        }
    }
    let _ = (values, view, first, k, packed);
    false
}

/// `to[i] = bf16(from[i])`: 32 at a time where the CPU has AVX512-BF16.
pub(super) fn round_row(from: &[f32], to: &mut [u16]) {
    #[cfg(target_arch = "x86_64")]
    if super::avx512_bf16::available() {
        // SAFETY: the CPU has AVX512-BF16.
        #[allow(unsafe_code)]
        unsafe {
            super::avx512_bf16::round_row(from, to)
        };
        return;
    }
    for (to, &from) in to.iter_mut().zip(from) {
        *to = round(from);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Every instruction set this CPU has; the others print `SKIPPED (no flag)`.
    fn isas_here() -> Vec<Bf16Isa> {
        [Bf16Isa::Amx, Bf16Isa::Avx512Bf16]
            .into_iter()
            .filter(|isa| {
                let here = isa.available();
                if !here {
                    println!("SKIPPED (no {})", isa.flag());
                }
                here
            })
            .collect()
    }

    /// Values spread over several binades, signs mixed, from a seed.
    fn values(len: usize, seed: u64) -> Vec<f32> {
        let mut state = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
        (0..len)
            .map(|_| {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                let unit = (state >> 40) as f32 / (1u64 << 24) as f32;
                (unit - 0.5) * 4.0 * if state & 1 == 0 { 1.0 } else { 0.125 }
            })
            .collect()
    }

    /// `f(c₀ + a · b + bias)` in f64 with the operands as given, and Σ|a b| per value.
    fn reference(
        a: &[f32],
        b: &[f32],
        [m, k, n]: [usize; 3],
        start: &[f32],
        bias: &[f32],
        f: impl Fn(f64) -> f64,
    ) -> (Vec<f64>, Vec<f64>) {
        let mut exact = vec![0.0; m * n];
        let mut magnitude = vec![0.0; m * n];
        for i in 0..m {
            for j in 0..n {
                let (mut sum, mut size) = (0f64, 0f64);
                for l in 0..k {
                    let product = f64::from(a[i * k + l]) * f64::from(b[l * n + j]);
                    sum += product;
                    size += product.abs();
                }
                exact[i * n + j] = f(f64::from(start[i * n + j]) + sum + f64::from(bias[j]));
                magnitude[i * n + j] = size;
            }
        }
        (exact, magnitude)
    }

    fn rounded(values: &[f32]) -> Vec<f32> {
        values.iter().map(|&v| widen(round(v))).collect()
    }

    /// One product on `isa` against f64: within f32 summation error (far inside the bound
    /// 2⁻⁸ Σ|ab|) of the product of the same rounded operands, and within two bf16 roundings
    /// (unit roundoff u = 2⁻⁸ each: (2u + u²) Σ|ab|) of the product of the f32 operands.
    fn check(isa: Bf16Isa, [m, k, n]: [usize; 3], split: usize, accumulate: bool, relu: bool) {
        let seed = (m * 1_000_000 + k * 1000 + n) as u64;
        let (a, b) = (values(m * k, seed), values(k * n, seed + 1));
        let bias = values(n, seed + 2);
        let start = if accumulate {
            values(m * n, seed + 3)
        } else {
            vec![0.0; m * n]
        };
        // `b`'s columns as two blocks side by side, split at `split`.
        let split = split.min(n);
        let block = |columns: Range<usize>| -> Vec<f32> {
            (0..k)
                .flat_map(|l| b[l * n..][columns.clone()].to_vec())
                .collect()
        };
        let (left, right) = (block(0..split), block(split..n));
        let packed = Packed::new(k, &[(&left, split), (&right, n - split)]);
        let mut c = start.clone();
        let f = |v: f32| if relu { v.max(0.0) } else { v };
        Product::new(
            isa,
            as_uninit(&mut c),
            Lhs::Matrix(&a),
            &packed,
            m,
            accumulate,
            Some(&bias),
        )
        .run(&f, m % 2 == 0);
        let f64_f = |v: f64| if relu { v.max(0.0) } else { v };
        let (same_operands, magnitude) =
            reference(&rounded(&a), &rounded(&b), [m, k, n], &start, &bias, f64_f);
        let (exact, _) = reference(&a, &b, [m, k, n], &start, &bias, f64_f);
        for i in 0..m * n {
            let size = magnitude[i] + f64::from(start[i].abs()) + f64::from(bias[i % n].abs());
            let got = f64::from(c[i]);
            assert!(
                (got - same_operands[i]).abs() <= 1e-5 * size + 1e-30,
                "{isa}: [{m}, {k}, {n}] value {i}: {got} against {} (same operands)",
                same_operands[i]
            );
            assert!(
                (got - exact[i]).abs() <= size * (2.0 / 256.0 + 1.0 / 65536.0) + 1e-30,
                "{isa}: [{m}, {k}, {n}] value {i}: {got} against {} (f64)",
                exact[i]
            );
        }
    }

    #[test]
    fn rounding_is_to_nearest_even() {
        assert_eq!(round(1.0), 0x3f80);
        // 1 + 2⁻⁸ lies halfway between 1 and 1 + 2⁻⁷: ties go to the even 1.
        assert_eq!(round(1.0 + 1.0 / 256.0), 0x3f80);
        assert_eq!(round(1.0 + 3.0 / 256.0), 0x3f82);
        assert_eq!(widen(round(-2.5)), -2.5);
        assert!(widen(round(f32::NAN)).is_nan());
        assert_eq!(widen(round(f32::INFINITY)), f32::INFINITY);
        assert_eq!(widen(round(f32::MAX)), f32::INFINITY);
        // Whole vectors of 32 and of 16, and the values left over.
        for len in [1000, 63, 48, 17, 16, 15] {
            let many = values(len, 7);
            let mut vector = vec![0u16; many.len()];
            round_row(&many, &mut vector);
            let scalar: Vec<u16> = many.iter().map(|&v| round(v)).collect();
            assert_eq!(vector, scalar, "{len} values");
        }
    }

    #[test]
    fn large_and_ragged_products_match_f64() {
        for isa in isas_here() {
            // Odd row counts run on this thread: [1101, ..] gives tasks of more row blocks than
            // one pass keeps; depth 768 takes two passes; no inner dimension at all, after
            // products that left sums behind.
            for shape in [
                [1, 1, 1],
                [33, 65, 47],
                [64, 768, 96],
                [100, 300, 200],
                [1101, 64, 33],
                [5, 0, 7],
            ] {
                check(isa, shape, shape[2] / 3, false, false);
                check(isa, shape, 5, true, true);
            }
        }
    }

    /// A convolution's windows read from the image give the product of the unfolded rows, bit
    /// for bit (the same rounding, the same sums), padding and stride included.
    #[test]
    fn windows_are_packed_as_their_unfolded_rows() {
        use crate::host::conv::Window;
        if !supported() {
            println!("SKIPPED (no amx_bf16 or avx512_bf16)");
            return;
        }
        let shape = [2, 9, 11, 5];
        let image = values(shape.iter().product(), 11);
        let window = Window {
            kernel: [3, 3],
            stride: [2, 1],
            padding: [1, 1],
        };
        let windows = Windows::new(&image, shape, window);
        let outputs = 19;
        let kernel = values(windows.depth() * outputs, 12);
        let bias = values(outputs, 13);
        let packed = Packed::new(windows.depth(), &[(&kernel, outputs)]);
        let relu = |v: f32| v.max(0.0);
        let from_image = conv_product(&windows, &packed, &bias, relu);
        let unfolded = new_product(&windows.unfolded(), &packed, windows.rows(), &bias, relu);
        assert_eq!(from_image, unfolded);
    }

    /// Windows read where they lie in a padded bf16 image give the products of the same windows
    /// packed row by row, bit for bit: stride 1 and 2, a transposed convolution's phases (taps
    /// reaching before and past the image), two images, a last row block of one tile; and the
    /// same written into the given rows of a larger output.
    #[test]
    fn windows_read_in_place_are_the_packed_windows() {
        use crate::host::conv::Window;
        if Bf16Isa::chosen() != Some(Bf16Isa::Amx) {
            println!("SKIPPED (no amx_bf16)");
            return;
        }
        let conv = |kernel, stride| Window {
            kernel: [kernel, kernel],
            stride: [stride, stride],
            padding: [1, 1],
        };
        // [batch, height, width, channels], each window over it and the outputs.
        for (shape, outputs) in [
            ([2, 6, 16, 64], 40),
            ([1, 8, 32, 32], 33),
            ([1, 3, 16, 32], 70),
        ] {
            let image = values(shape.iter().product(), 31);
            let mut windows = vec![
                Windows::new(&image, shape, conv(3, 1)),
                Windows::new(&image, shape, conv(3, 2)),
            ];
            for phase in [(0, 0), (0, 1), (1, 0), (1, 1)] {
                windows.push(Windows::transposed_phase(&image, shape, &conv(4, 2), phase).0);
            }
            for windows in windows.iter().filter(|w| w.out[1] % TILE == 0) {
                let padded = PaddedImage::new(&image, shape, PaddedImage::border_for(windows));
                assert!(padded.serves(windows));
                let kernel = values(windows.depth() * outputs, 32);
                let bias = values(outputs, 33);
                let packed = Packed::new(windows.depth(), &[(&kernel, outputs)]);
                let silu = crate::math::silu;
                let want = conv_product(windows, &packed, &bias, silu);
                assert_eq!(
                    image_product(&padded, windows, &packed, &bias, silu),
                    want,
                    "{shape:?} -> {:?}",
                    windows.out
                );
                // Into every other row of a larger output, the others untouched.
                let rows: Vec<usize> = (0..windows.rows()).map(|r| 2 * r + 1).collect();
                let mut out = vec![f32::NAN; 2 * windows.rows() * outputs];
                let into = |out: &mut [f32], onto| {
                    image_product_into_rows(
                        out, &rows, &padded, windows, &packed, &bias, onto, silu,
                    )
                };
                into(&mut out, false);
                for (r, row) in out.chunks_exact(outputs).enumerate() {
                    match r % 2 {
                        1 => assert_eq!(row, &want[r / 2 * outputs..][..outputs], "row {r}"),
                        _ => assert!(row.iter().all(|v| v.is_nan()), "row {r} written"),
                    }
                }
                // Added onto what the rows held, after the activation.
                let before = values(out.len(), 34);
                let mut out = before.clone();
                into(&mut out, true);
                for (r, (row, before)) in (out.chunks_exact(outputs))
                    .zip(before.chunks_exact(outputs))
                    .enumerate()
                {
                    let want = &want[r / 2 * outputs..][..outputs];
                    for (c, (&got, &before)) in row.iter().zip(before).enumerate() {
                        let want = if r % 2 == 1 { before + want[c] } else { before };
                        assert_eq!(got, want, "row {r} added onto");
                    }
                }
            }
        }
    }

    /// Operands read through transposed views give the product of the matrices they show, bit
    /// for bit (the same rounding, the same sums), with and without a bias.
    #[test]
    fn views_are_packed_as_the_matrices_they_show() {
        if !supported() {
            println!("SKIPPED (no amx_bf16 or avx512_bf16)");
            return;
        }
        let [m, k, n] = [67, 45, 70];
        let (a, b) = (values(m * k, 21), values(k * n, 22));
        let transpose = |x: &[f32], rows: usize, cols: usize| -> Vec<f32> {
            (0..cols)
                .flat_map(|j| (0..rows).map(move |i| x[i * cols + j]))
                .collect()
        };
        // aᵀ and bᵀ stored row-major, read back through transposed views.
        let (a_t, b_t) = (transpose(&a, m, k), transpose(&b, k, n));
        let a_view = View::rows(0, k, m, m).transposed();
        let b_view = View::rows(0, n, k, k).transposed();
        let packed = Packed::new(k, &[(&b, n)]);
        let want = new_product(&a, &packed, m, &vec![0.0; n], |v| v);
        let c = view_product(&a_t, a_view, &Packed::of_view(&b_t, b_view), None);
        assert_eq!(c, want);
        let bias = values(n, 23);
        let b_packed = Packed::of_view(&b, View::rows(0, k, n, n));
        let c = view_product(&a, View::rows(0, m, k, k), &b_packed, Some(&bias));
        assert_eq!(c, new_product(&a, &packed, m, &bias, |v| v));
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(48))]
        #[test]
        fn products_match_f64(
            m in 1usize..70,
            k in 1usize..140,
            n in 1usize..80,
            split in 0usize..80,
            accumulate: bool,
            relu: bool,
        ) {
            for isa in isas_here() {
                check(isa, [m, k, n], split, accumulate, relu);
            }
        }
    }
}
