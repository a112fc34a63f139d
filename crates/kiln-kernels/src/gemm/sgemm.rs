//! Row-major f32 products `C (+)= A · B` on x86-64 CPUs with AVX2 and FMA, 512 bits wide where
//! the CPU has AVX-512F: the vision encoders' projections (large, on all threads), the force
//! field's layers (a molecule's few atoms, on the calling thread) and the frame models'
//! convolutions (windows packed straight from the image).
//!
//! On two Zen 3 cores the `gemm` crate (burn-flex's kernels) ran SigLIP-B/16's `[6272, 3072] ·
//! [3072, 768]` MLP product (b = 32) at about 110 GFLOP/s where PyTorch's `torch.mm` reached
//! 155–165, and each product was followed by a pass of its own over 16–64 MB for the bias, the
//! activation or the residual sum. This is the packed-panel scheme of Goto & van de Geijn
//! ("Anatomy of high-performance matrix multiplication", 2008): `B` is packed once per weight
//! into 16-column panels ([`Packed`], kept with the model's weights), each task packs a block of
//! 6-row panels of `A` that stays in L2, and a 6 × 16 register tile (twelve AVX accumulators)
//! runs over a 256-deep block of the inner dimension at a time; after the last block the bias and
//! the activation are applied to the tile as it is stored. With AVX-512 the tile spans up to four
//! neighbouring panels, 6 × 64 in 24 512-bit accumulators (the same packing; on a Zen 5 VM
//! it replaced the `gemm` crate's AVX-512 kernels, which these products used there before, at
//! equal or better speed). Measurements: docs/PERFORMANCE.md.

use std::cell::RefCell;
use std::mem::MaybeUninit;
use std::ops::Range;

use rayon::prelude::*;

use crate::gemm::lines::Lines;
use crate::host::conv::Windows;
use crate::host::{as_uninit, written_once};

/// Rows of the register tile: six broadcast `A` values per step.
const MR: usize = 6;
/// Columns of the register tile: two 8-lane AVX registers. A product's columns are computed in
/// blocks of this many.
pub const NR: usize = 16;
/// Longest inner-dimension block: a 6 × 256 `A` panel (6 kB) and a 256 × 16 `B` panel (16 kB)
/// stay in L1.
const KC: usize = 256;
/// Rows per task: a 144 × 256 block of packed `A` (147 kB) stays in L2.
const MC: usize = 144;

/// Kernel-row depths (`kw · channels`) at which a convolution's windows go one kernel row a
/// step, its interior tiles read in place ([`Windows::kernel_row_in_place`]) instead of packed:
/// deep enough for the steps' stores of `C` to cost little, shallow enough for a step's panel
/// of `B` to stay in L1 (the live-stream model's stride-2 convolutions: 192 and 96).
const KERNEL_ROW_IN_PLACE: std::ops::RangeInclusive<usize> = 64..=2 * KC;

/// Whether [`product`] can run here: an x86-64 CPU with AVX2 and FMA.
pub fn supported() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// A product's right operand `[k, n]` as 16-column panels, each `k` rows of 16 consecutive
/// values (zero past `n`): packed once, read by every task of every product with it.
#[derive(Debug)]
pub struct Packed {
    k: usize,
    n: usize,
    panels: Lines<f32>,
}

impl Packed {
    /// Rows of the matrix (the product's inner dimension).
    pub fn rows(&self) -> usize {
        self.k
    }

    /// Columns of the matrix (the product's output columns).
    pub fn columns(&self) -> usize {
        self.n
    }

    /// The row-major `[k, n]` matrix whose columns are those of `blocks` side by side, each
    /// block a row-major `[k, columns]` matrix given with its column count.
    pub fn new(k: usize, blocks: &[(&[f32], usize)]) -> Packed {
        let n: usize = blocks.iter().map(|(_, columns)| columns).sum();
        assert!(
            blocks.iter().all(|(b, columns)| b.len() == k * columns),
            "sgemm::Packed::new: a block is not [k, columns]"
        );
        // Each block's first column in the concatenation.
        let starts: Vec<usize> = blocks
            .iter()
            .scan(0, |next, (_, columns)| {
                let start = *next;
                *next += columns;
                Some(start)
            })
            .collect();
        let mut panels = Lines::zeros(n.div_ceil(NR) * k * NR);
        panels
            .par_chunks_mut((k * NR).max(1))
            .enumerate()
            .for_each(|(panel, packed)| {
                let (first, last) = (panel * NR, (panel * NR + NR).min(n));
                for ((block, columns), &start) in blocks.iter().zip(&starts) {
                    // This block's columns within the panel, as panel offsets and block columns.
                    let (from, to) = (first.max(start), last.min(start + columns));
                    if from >= to {
                        continue;
                    }
                    for (row, out) in packed.chunks_exact_mut(NR).enumerate() {
                        out[from - first..to - first]
                            .copy_from_slice(&block[row * columns + from - start..][..to - from]);
                    }
                }
            });
        Packed { k, n, panels }
    }
}

/// `c = f(a · b + bias)`, or `c = f(c + a · b + bias)` with `accumulate`, for row-major `a`
/// `[m, k]`, the packed `b` `[k, n]` and `c` `[m, n]`, and `bias` `[n]`, on all of rayon's
/// threads. `f` and the bias are applied to each register tile as it is written, never in a pass
/// of their own.
///
/// Panics when a slice is shorter than its shape or the CPU lacks AVX2 and FMA.
pub fn product(
    c: &mut [f32],
    a: &[f32],
    b: &Packed,
    m: usize,
    accumulate: bool,
    bias: &[f32],
    f: impl Fn(f32) -> f32 + Sync,
) {
    let c = as_uninit(c);
    let Some(product) = Product::new(c, Rows::Matrix(a), b, m, accumulate, bias, f, false) else {
        return;
    };
    product.run_on_every_thread(m);
}

/// [`product`] into a new vector `[m, n]` (no `accumulate`), which is never zeroed first: each
/// of its values is written once, by its tile. Rows that fit one block of the inner dimension
/// are read in place.
pub fn new_product(
    a: &[f32],
    b: &Packed,
    m: usize,
    bias: &[f32],
    f: impl Fn(f32) -> f32 + Sync,
) -> Vec<f32> {
    new_matrix_product(a, b, m, bias, f, true)
}

/// `c = a · b + bias` on the calling thread alone: for products of a few hundred thousand
/// multiply-adds, which handing work to other threads would slow down, or whose caller already
/// runs one per thread. Its whole register tiles read `a` in place rather than packed first (for
/// so few rows the packing was a tenth of the force field's time).
///
/// Panics as [`product`] does.
pub fn product_on_this_thread(c: &mut [f32], a: &[f32], b: &Packed, m: usize, bias: &[f32]) {
    let c = as_uninit(c);
    if let Some(product) = Product::new(c, Rows::Matrix(a), b, m, false, bias, |v| v, true) {
        product.run_on_this_thread(m);
    }
}

/// `f(a · b + bias)` `[m, n]` on the calling thread alone, into a new vector (never zeroed
/// first), `a` read in place when its rows fit one block of the inner dimension (else packed
/// as [`product`] packs it): for a caller that runs several products
/// of a few hundred rows at once, one per thread (Winograd's per-point products), where each
/// split across the threads would leave slivers.
///
/// Panics as [`product`] does.
pub fn new_product_on_this_thread(
    a: &[f32],
    b: &Packed,
    m: usize,
    bias: &[f32],
    f: impl Fn(f32) -> f32 + Sync,
) -> Vec<f32> {
    new_matrix_product(a, b, m, bias, f, false)
}

/// [`new_product`] on every thread, or [`new_product_on_this_thread`].
fn new_matrix_product(
    a: &[f32],
    b: &Packed,
    m: usize,
    bias: &[f32],
    f: impl Fn(f32) -> f32 + Sync,
    every_thread: bool,
) -> Vec<f32> {
    // One block of the inner dimension: whole tiles read `a` where it lies, each of its six
    // rows once per column panel, instead of packing it first (`pack_a` was 8% of the
    // live-stream model's b = 8 frame, most of it for Winograd's 128-deep products).
    let in_place = b.k <= KC;
    // SAFETY: a product without `accumulate` writes every value of its `C` (`m · n`).
    #[allow(unsafe_code)]
    unsafe {
        written_once(m * b.n, |c| {
            if let Some(product) = Product::new(c, Rows::Matrix(a), b, m, false, bias, f, in_place)
            {
                match every_thread {
                    true => product.run_on_every_thread(m),
                    false => product.run_on_this_thread(m),
                }
            }
        })
    }
}

/// `f(windows · b + bias)` `[rows, n]` on all of rayon's threads, into a new vector (never
/// zeroed first), for the windows of a convolution over an NHWC image ([`Windows`]: the rows
/// `host::conv::unfold` would write) and the kernel `b` packed as `[taps · channels, out]`: each
/// task packs its block of rows straight from the image, so the unfolded rows (the window's taps
/// times the image) are never written out.
///
/// Panics when `windows` and `b` disagree or the CPU lacks AVX2 and FMA.
pub fn conv_product(
    windows: &Windows,
    b: &Packed,
    bias: &[f32],
    f: impl Fn(f32) -> f32 + Sync,
) -> Vec<f32> {
    assert_eq!(
        windows.depth(),
        b.k,
        "sgemm::conv_product: the kernel's depth"
    );
    let m = windows.rows();
    // SAFETY: a product without `accumulate` writes every value of its `C` (`m · n`).
    #[allow(unsafe_code)]
    unsafe {
        written_once(m * b.n, |c| {
            if let Some(product) =
                Product::new(c, Rows::Windows(windows), b, m, false, bias, f, false)
            {
                product.run_on_every_thread(m);
            }
        })
    }
}

/// A product's left operand.
#[derive(Clone, Copy)]
enum Rows<'a> {
    /// Row-major `[m, k]`.
    Matrix(&'a [f32]),
    /// A convolution's windows, read from the image as they are packed.
    Windows(&'a Windows<'a>),
}

/// A product's operands, checked, for its tasks to share.
struct Product<'a, F> {
    out: Out,
    a: Rows<'a>,
    b: &'a Packed,
    accumulate: bool,
    bias: &'a [f32],
    f: F,
    /// Whole tiles read `a` in place; only a last partial tile is packed.
    in_place: bool,
}

impl<'a, F: Fn(f32) -> f32 + Sync> Product<'a, F> {
    /// The product's operands, or `None` when the product was finished here (no rows, columns or
    /// inner dimension).
    #[allow(clippy::too_many_arguments)]
    fn new(
        c: &'a mut [MaybeUninit<f32>],
        a: Rows<'a>,
        b: &'a Packed,
        m: usize,
        accumulate: bool,
        bias: &'a [f32],
        f: F,
        in_place: bool,
    ) -> Option<Self> {
        let (k, n) = (b.k, b.n);
        assert!(supported(), "sgemm::product needs AVX2 + FMA");
        assert!(c.len() >= m * n && bias.len() == n);
        let a = match a {
            Rows::Matrix(a) => {
                assert!(a.len() >= m * k);
                Rows::Matrix(&a[..m * k])
            }
            windows => windows,
        };
        if m == 0 || n == 0 {
            return None;
        }
        if k == 0 {
            for row in c[..m * n].chunks_exact_mut(n) {
                for (c, b) in row.iter_mut().zip(bias) {
                    // SAFETY: with `accumulate`, the caller's `C` holds initialised values.
                    #[allow(unsafe_code)]
                    let before = if accumulate {
                        unsafe { c.assume_init() }
                    } else {
                        0.0
                    };
                    c.write(f(before + b));
                }
            }
            return None;
        }
        Some(Product {
            out: Out(c.as_mut_ptr().cast()),
            a,
            b,
            accumulate,
            bias,
            f,
            in_place,
        })
    }

    /// Every task of the product's `m` rows, on all of rayon's threads.
    fn run_on_every_thread(&self, m: usize) {
        tasks(m, self.b.n.div_ceil(NR), rayon::current_num_threads())
            .into_par_iter()
            .for_each(|task| self.run(task));
    }

    /// Every task of the product's `m` rows, one after another on the calling thread.
    fn run_on_this_thread(&self, m: usize) {
        for task in tasks(m, self.b.n.div_ceil(NR), 1) {
            self.run(task);
        }
    }

    /// One task's block of `C`.
    fn run(&self, task: Task) {
        PACKED_A.with_borrow_mut(|packed_a| self.run_packing_into(task, packed_a));
    }

    /// [`Self::run`], its blocks of `A` packed into `packed_a` (grown as needed).
    #[allow(unsafe_code)]
    fn run_packing_into(&self, Task { rows, panels }: Task, packed_a: &mut Lines<f32>) {
        let (k, n) = (self.b.k, self.b.n);
        // A convolution's windows go one kernel row a step where a kernel row is deep enough:
        // then a whole tile of neighbouring output pixels reads that kernel row in place.
        let by_kernel_rows = match self.a {
            Rows::Windows(windows) => {
                (KERNEL_ROW_IN_PLACE).contains(&windows.kernel_row()) && k > windows.kernel_row()
            }
            Rows::Matrix(_) => false,
        };
        let steps = match (by_kernel_rows, self.a) {
            (true, Rows::Windows(windows)) => k / windows.kernel_row(),
            _ => k.div_ceil(KC),
        };
        let depth = k.div_ceil(steps);
        let tiles = rows.len().div_ceil(MR);
        let in_place = if self.in_place { rows.len() / MR } else { 0 };
        let packed_rows = rows.start + in_place * MR..rows.end;
        let needed = (tiles - in_place) * MR * depth;
        if packed_a.len() < needed {
            packed_a.resize(needed);
        }
        for step in 0..steps {
            let first = step * depth;
            let depth = depth.min(k - first);
            let packed_a = &mut packed_a[..(tiles - in_place) * MR * depth];
            // The whole tiles of windows that read this kernel row in place.
            let windows_in_place: Vec<Option<(&[f32], usize)>> = match self.a {
                Rows::Windows(windows) if by_kernel_rows => (0..tiles)
                    .map(|tile| {
                        let row = rows.start + tile * MR;
                        let tile_rows = row..(row + MR).min(rows.end);
                        let in_place = (tile_rows.len() == MR)
                            .then(|| windows.kernel_row_in_place(tile_rows, step));
                        in_place.flatten()
                    })
                    .collect(),
                _ => Vec::new(),
            };
            if !packed_a.is_empty() {
                match self.a {
                    Rows::Matrix(a) => {
                        let a = &a[packed_rows.start * k..packed_rows.end * k];
                        pack_a(packed_a, a, k, first);
                    }
                    Rows::Windows(windows) => {
                        let skip =
                            |tile: usize| matches!(windows_in_place.get(tile), Some(Some(_)));
                        pack_windows(packed_a, windows, packed_rows.clone(), first, skip);
                    }
                }
            }
            let write = Tile {
                add: self.accumulate || step > 0,
                last: step + 1 == steps,
            };
            let wide = wide_tiles();
            let mut panel = panels.start;
            while panel < panels.end {
                let width = match panels.end - panel {
                    left if wide && left >= 4 => 4,
                    left if wide && left >= 2 => 2,
                    _ => 1,
                };
                let panel_b = |p: usize| &self.b.panels[(p * k + first) * NR..][..depth * NR];
                let b = match width {
                    4 => Panels::Four(std::array::from_fn(|p| panel_b(panel + p))),
                    2 => Panels::Two(std::array::from_fn(|p| panel_b(panel + p))),
                    _ => Panels::One(panel_b(panel)),
                };
                let cols = (width * NR).min(n - panel * NR);
                let mut panel_bias = [0f32; WIDE * NR];
                panel_bias[..cols].copy_from_slice(&self.bias[panel * NR..][..cols]);
                for tile in 0..tiles {
                    let row = rows.start + tile * MR;
                    // SAFETY: `supported()` was asserted in `new` (`width > 1` only with AVX-512);
                    // both panels hold `depth` steps (a tile in place: its six rows of `a` hold
                    // `k ≥ first + depth` values); the tile's corner lies inside `c` (`row < m`,
                    // `panel · 16 + cols ≤ n`) and in this task's block, which no other task
                    // writes.
                    unsafe {
                        let c = self.out.at(row * n + panel * NR);
                        let corner = (MR.min(rows.end - row), cols);
                        if tile < in_place {
                            let Rows::Matrix(a) = self.a else {
                                unreachable!("only a matrix is read in place")
                            };
                            let a = &a[row * k + first..][..(MR - 1) * k + depth];
                            register_tile::<true>(
                                a,
                                k,
                                b,
                                c,
                                n,
                                corner,
                                write,
                                &panel_bias,
                                &self.f,
                            );
                        } else if let Some(Some((a, lda))) = windows_in_place.get(tile) {
                            let a = &a[..(MR - 1) * lda + depth];
                            register_tile::<true>(
                                a,
                                *lda,
                                b,
                                c,
                                n,
                                corner,
                                write,
                                &panel_bias,
                                &self.f,
                            );
                        } else {
                            let a = &packed_a[(tile - in_place) * MR * depth..][..MR * depth];
                            register_tile::<false>(
                                a,
                                MR,
                                b,
                                c,
                                n,
                                corner,
                                write,
                                &panel_bias,
                                &self.f,
                            );
                        }
                    }
                }
                panel += width;
            }
        }
    }
}

thread_local! {
    /// Each thread's packed blocks of `A`, kept from task to task (a block of 144 rows by 256
    /// is 147 kB, which each task allocated and zeroed afresh).
    static PACKED_A: RefCell<Lines<f32>> = const { RefCell::new(Lines::new()) };
}

/// The start of `C`, shared by the tasks, each of which writes only its own block.
struct Out(*mut f32);

// SAFETY: the tasks write disjoint blocks of `C`, which outlives them.
#[allow(unsafe_code)]
unsafe impl Sync for Out {}

impl Out {
    /// The element `offset` values into `C`.
    ///
    /// # Safety
    /// `offset` lies inside `C`.
    #[allow(unsafe_code)]
    unsafe fn at(&self, offset: usize) -> *mut f32 {
        // SAFETY: as the caller promises.
        unsafe { self.0.add(offset) }
    }
}

/// One task of a product: a block of rows of `C` by a range of its 16-column panels.
#[derive(Debug, Clone, PartialEq)]
struct Task {
    rows: Range<usize>,
    panels: Range<usize>,
}

/// The tasks of a product of `m` rows and `panels` column panels on `threads` threads: blocks of
/// about [`MC`] rows, a multiple of `threads` of them, in whole register tiles that differ by at
/// most one tile (CLIP-B/32's 1 600 rows at b = 32 were eleven blocks of 144 and one of 16, and a
/// thread waited on the short one); when that makes fewer than two blocks per thread, the panels
/// are split into ranges as well.
fn tasks(m: usize, panels: usize, threads: usize) -> Vec<Task> {
    let threads = threads.max(1);
    let tiles = m.div_ceil(MR);
    let row_blocks = m.div_ceil(MC).next_multiple_of(threads).min(tiles);
    let panel_ranges = (2 * threads).div_ceil(row_blocks).min(panels).max(1);
    let row = |block: usize| (block * tiles / row_blocks * MR).min(m);
    let panel = |range: usize| range * panels / panel_ranges;
    (0..row_blocks)
        .flat_map(|block| {
            (0..panel_ranges).map(move |range| Task {
                rows: row(block)..row(block + 1),
                panels: panel(range)..panel(range + 1),
            })
        })
        .collect()
}

/// Columns `first ..` of `a` (rows of `k`) as 6-row panels filling `packed`: as many steps of
/// six values as `packed` holds per panel (zero past the last row).
fn pack_a(packed: &mut [f32], a: &[f32], k: usize, first: usize) {
    let rows = a.len() / k;
    let depth = packed.len() / rows.div_ceil(MR) / MR;
    for (tile, panel) in packed.chunks_exact_mut(MR * depth).enumerate() {
        if (tile + 1) * MR <= rows {
            // A whole tile: six row streams interleaved into the panel's steps, written in order.
            let source: [&[f32]; MR] =
                std::array::from_fn(|r| &a[(tile * MR + r) * k + first..][..depth]);
            for (step, out) in panel.chunks_exact_mut(MR).enumerate() {
                for (out, row) in out.iter_mut().zip(&source) {
                    *out = row[step];
                }
            }
            continue;
        }
        for r in 0..MR {
            let row = tile * MR + r;
            let values = (row < rows).then(|| &a[row * k + first..][..depth]);
            for step in 0..depth {
                panel[step * MR + r] = values.map_or(0.0, |values| values[step]);
            }
        }
    }
}

/// Columns `first ..` of the windows `rows` as 6-row panels filling `packed`, as [`pack_a`] packs
/// a matrix's rows (zero past the last row): each row's values read from the image into a strip,
/// the six strips then interleaved into the panel's steps. Tiles `skip` says are read in place
/// are left as they are.
fn pack_windows(
    packed: &mut [f32],
    windows: &Windows,
    rows: Range<usize>,
    first: usize,
    skip: impl Fn(usize) -> bool,
) {
    let depth = packed.len() / rows.len().div_ceil(MR) / MR;
    let mut strips = vec![0f32; MR * depth];
    for (tile, panel) in packed.chunks_exact_mut(MR * depth).enumerate() {
        if skip(tile) {
            continue;
        }
        for (r, strip) in strips.chunks_exact_mut(depth).enumerate() {
            let row = rows.start + tile * MR + r;
            if row < rows.end {
                windows.read(row, first, strip);
            } else {
                strip.fill(0.0);
            }
        }
        for (step, out) in panel.chunks_exact_mut(MR).enumerate() {
            for (r, out) in out.iter_mut().enumerate() {
                *out = strips[r * depth + step];
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

/// Most neighbouring panels one register tile spans ([`tile_6x16n`]).
const WIDE: usize = 4;

/// The panels of `B` a register tile reads: one for [`tile_6x16`], two or four neighbouring
/// ones for [`tile_6x16n`].
#[derive(Clone, Copy)]
enum Panels<'a> {
    One(&'a [f32]),
    Two([&'a [f32]; 2]),
    Four([&'a [f32]; 4]),
}

/// Whether the register tiles span several panels, 512 bits wide ([`tile_6x16n`]): the CPU has
/// AVX-512F.
fn wide_tiles() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("avx512f")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// The register tile for `b`'s panels. The corner's parameters go one by one, as in the tiles:
/// bundled in a struct (by value or by reference) the tiles took three times the samples and the
/// U-Net's frame twice as long on a Zen 5 VM.
///
/// # Safety
/// That tile's.
#[allow(unsafe_code, clippy::too_many_arguments)]
#[inline(always)]
unsafe fn register_tile<const IN_PLACE: bool>(
    a: &[f32],
    lda: usize,
    b: Panels<'_>,
    c: *mut f32,
    ldc: usize,
    corner: (usize, usize),
    write: Tile,
    bias: &[f32; WIDE * NR],
    f: &impl Fn(f32) -> f32,
) {
    // SAFETY: the caller's.
    #[cfg(target_arch = "x86_64")]
    unsafe {
        match b {
            Panels::One(b) => tile_6x16::<IN_PLACE>(a, lda, b, c, ldc, corner, write, bias, f),
            Panels::Two(b) => tile_6x16n::<IN_PLACE, 2>(a, lda, b, c, ldc, corner, write, bias, f),
            Panels::Four(b) => tile_6x16n::<IN_PLACE, 4>(a, lda, b, c, ldc, corner, write, bias, f),
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (a, lda, b, c, ldc, corner, write, bias, f);
        unreachable!("sgemm::supported() is false off x86-64")
    }
}

/// One 6 × 16 register tile over `a` and the packed panel `b` (`steps × 16`), written into the
/// `rows × cols` corner that starts at `c` (rows `ldc` apart) as `write` says, `bias` its first 16
/// values. `a` is a packed panel (`steps × 6`, `lda` unused) or, `IN_PLACE`, six rows `lda` apart
/// of `steps` values each.
///
/// # Safety
/// The CPU has AVX2 and FMA; `a` holds the `steps = b.len() / 16` values of each of its six rows;
/// the corner's `rows` rows of `cols` values from `c`, `ldc` apart, are valid for reads and writes
/// that nothing else makes while this runs; `rows ≤ 6`, `cols ≤ 16`.
#[allow(unsafe_code, clippy::too_many_arguments)]
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn tile_6x16<const IN_PLACE: bool>(
    a: &[f32],
    lda: usize,
    b: &[f32],
    c: *mut f32,
    ldc: usize,
    (rows, cols): (usize, usize),
    write: Tile,
    bias: &[f32; WIDE * NR],
    f: &impl Fn(f32) -> f32,
) {
    use std::arch::x86_64::*;
    let steps = b.len() / NR;
    // Where value `step` of row `r` lies in `a`.
    let (row_stride, step_stride) = if IN_PLACE { (lda, 1) } else { (1, MR) };
    debug_assert!(steps == 0 || a.len() > (MR - 1) * row_stride + (steps - 1) * step_stride);
    debug_assert!(rows <= MR && cols <= NR);
    let (a, b) = (a.as_ptr(), b.as_ptr());
    let mut acc = [[_mm256_setzero_ps(); 2]; MR];
    for step in 0..steps {
        // SAFETY: `step < steps`, so both panels hold these values.
        unsafe {
            let b0 = _mm256_loadu_ps(b.add(step * NR));
            let b1 = _mm256_loadu_ps(b.add(step * NR + 8));
            for (r, acc) in acc.iter_mut().enumerate() {
                let a = _mm256_broadcast_ss(&*a.add(r * row_stride + step * step_stride));
                acc[0] = _mm256_fmadd_ps(a, b0, acc[0]);
                acc[1] = _mm256_fmadd_ps(a, b1, acc[1]);
            }
        }
    }
    if rows == MR && cols == NR {
        // A full tile: each row's 16 values summed, biased and mapped in registers and a
        // fixed-length array, then stored whole.
        let bias = bias.as_ptr();
        for (r, acc) in acc.iter().enumerate() {
            // SAFETY: a full tile: row `r` of the corner is 16 values from `r · ldc`; the bias
            // holds 16.
            unsafe {
                let out = c.add(r * ldc);
                let (mut lo, mut hi) = (acc[0], acc[1]);
                if write.add {
                    lo = _mm256_add_ps(lo, _mm256_loadu_ps(out));
                    hi = _mm256_add_ps(hi, _mm256_loadu_ps(out.add(8)));
                }
                if write.last {
                    let mut row = [0f32; NR];
                    _mm256_storeu_ps(row.as_mut_ptr(), _mm256_add_ps(lo, _mm256_loadu_ps(bias)));
                    let biased = _mm256_add_ps(hi, _mm256_loadu_ps(bias.add(8)));
                    _mm256_storeu_ps(row.as_mut_ptr().add(8), biased);
                    for v in &mut row {
                        *v = f(*v);
                    }
                    lo = _mm256_loadu_ps(row.as_ptr());
                    hi = _mm256_loadu_ps(row.as_ptr().add(8));
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
        // SAFETY: row `r` of the corner is `cols` values from `r · ldc`, for this call alone,
        // and holds initialised values where `write.add` reads them (an earlier block's, or
        // the caller's to accumulate onto).
        unsafe {
            let out = c.add(r * ldc);
            if write.add {
                for (j, v) in row.iter_mut().enumerate().take(cols) {
                    *v += *out.add(j);
                }
            }
            if write.last {
                row.iter_mut().zip(bias).for_each(|(v, b)| *v = f(*v + b));
            }
            std::ptr::copy_nonoverlapping(row.as_ptr(), out, cols);
        }
    }
}

/// [`tile_6x16`] `P` panels wide: a 6 × 16P register tile over `a` and the neighbouring packed
/// panels `b` (each `steps × 16`), 6P 16-lane AVX-512 accumulators (each step `P` loads of `B`
/// and six broadcasts of `A` feed 6P 512-bit FMAs: four panels, 24 accumulators, as the `gemm`
/// crate's 6 × 64 tile), `cols ≤ 16P`.
///
/// # Safety
/// As [`tile_6x16`]'s, the CPU having AVX-512F, with `cols ≤ 16P` and every panel of `steps`.
#[allow(unsafe_code, clippy::too_many_arguments)]
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn tile_6x16n<const IN_PLACE: bool, const P: usize>(
    a: &[f32],
    lda: usize,
    b: [&[f32]; P],
    c: *mut f32,
    ldc: usize,
    (rows, cols): (usize, usize),
    write: Tile,
    bias: &[f32; WIDE * NR],
    f: &impl Fn(f32) -> f32,
) {
    use std::arch::x86_64::*;
    let steps = b[0].len() / NR;
    let (row_stride, step_stride) = if IN_PLACE { (lda, 1) } else { (1, MR) };
    debug_assert!(steps == 0 || a.len() > (MR - 1) * row_stride + (steps - 1) * step_stride);
    debug_assert!(rows <= MR && cols <= P * NR && P <= WIDE);
    debug_assert!(b.iter().all(|panel| panel.len() == b[0].len()));
    let a = a.as_ptr();
    let b = b.map(<[f32]>::as_ptr);
    let mut acc = [[_mm512_setzero_ps(); P]; MR];
    for step in 0..steps {
        // SAFETY: `step < steps`, so the panels hold these values.
        unsafe {
            let panels: [__m512; P] = std::array::from_fn(|p| _mm512_loadu_ps(b[p].add(step * NR)));
            for (r, acc) in acc.iter_mut().enumerate() {
                let a = _mm512_set1_ps(*a.add(r * row_stride + step * step_stride));
                for (acc, &panel) in acc.iter_mut().zip(&panels) {
                    *acc = _mm512_fmadd_ps(a, panel, *acc);
                }
            }
        }
    }
    let full = rows == MR && cols == P * NR;
    for (r, acc) in acc.iter().enumerate().take(rows) {
        let mut row = [0f32; WIDE * NR];
        // SAFETY: a tile row holds 16P values; row `r` of the corner is `cols` values from
        // `r · ldc`, for this call alone, initialised where `write.add` reads them (an earlier
        // block's, or the caller's to accumulate onto).
        unsafe {
            let out = c.add(r * ldc);
            let mut acc = *acc;
            if full && write.add {
                for (p, acc) in acc.iter_mut().enumerate() {
                    *acc = _mm512_add_ps(*acc, _mm512_loadu_ps(out.add(p * NR)));
                }
            }
            if full && !write.last {
                for (p, acc) in acc.iter().enumerate() {
                    _mm512_storeu_ps(out.add(p * NR), *acc);
                }
                continue;
            }
            for (p, acc) in acc.iter().enumerate() {
                _mm512_storeu_ps(row.as_mut_ptr().add(p * NR), *acc);
            }
            if write.add && !full {
                for (j, v) in row.iter_mut().enumerate().take(cols) {
                    *v += *out.add(j);
                }
            }
            if write.last {
                row.iter_mut().zip(bias).for_each(|(v, b)| *v = f(*v + b));
            }
            std::ptr::copy_nonoverlapping(row.as_ptr(), out, cols);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every shape class: whole tiles, row and column tails, an inner dimension over several
    /// blocks, more rows than one task, few rows (tasks split by columns), no inner dimension;
    /// both writes, with a bias and `f`; the right operand packed from two column blocks.
    #[test]
    fn products_match_the_definition() {
        if !supported() {
            eprintln!("skipped: this CPU has no AVX2 + FMA");
            return;
        }
        let f = |v: f32| v.max(0.0) + 0.1 * v;
        for (m, k, n) in [
            (6, 16, 16),
            (7, 5, 3),
            (12, 40, 64),
            (150, 600, 37),
            (301, 257, 48),
            (40, 300, 100),
            (700, 64, 33),
            (1, 1, 1),
            (8, 0, 5),
        ] {
            let a: Vec<f32> = (0..m * k).map(|i| (i as f32 * 0.37).sin()).collect();
            let b: Vec<f32> = (0..k * n).map(|i| (i as f32 * 0.11).cos()).collect();
            let bias: Vec<f32> = (0..n).map(|i| (i as f32 * 0.7).sin()).collect();
            let start: Vec<f32> = (0..m * n).map(|i| (i as f32 * 0.05).sin()).collect();
            // The right operand in two column blocks, packed side by side.
            let split = n / 3;
            let left: Vec<f32> = (0..k * split)
                .map(|i| b[i / split * n + i % split])
                .collect();
            let right: Vec<f32> = (0..k * (n - split))
                .map(|i| b[i / (n - split) * n + split + i % (n - split)])
                .collect();
            let packed = Packed::new(k, &[(&left, split), (&right, n - split)]);
            // On all threads, writing and accumulating with `f`; on this one, writing plainly;
            // into new vectors, on all threads and on this one, with `f`.
            let ways = [
                (false, false, false),
                (true, false, false),
                (false, true, false),
            ];
            let new = [(false, false, true), (false, true, true)];
            for (accumulate, here, fresh) in ways.into_iter().chain(new) {
                let mut c = start.clone();
                let f = |v: f32| if here && !fresh { v } else { f(v) };
                match (here, fresh) {
                    (false, true) => c = new_product(&a, &packed, m, &bias, f),
                    (true, true) => c = new_product_on_this_thread(&a, &packed, m, &bias, f),
                    (true, false) => product_on_this_thread(&mut c, &a, &packed, m, &bias),
                    (false, false) => product(&mut c, &a, &packed, m, accumulate, &bias, f),
                }
                assert_eq!(c.len(), m * n);
                for (i, j) in (0..m).flat_map(|i| (0..n).map(move |j| (i, j))) {
                    let dot: f64 = (0..k)
                        .map(|p| f64::from(a[i * k + p]) * f64::from(b[p * n + j]))
                        .sum();
                    let before = if accumulate { start[i * n + j] } else { 0.0 };
                    let want = f(before + bias[j] + dot as f32);
                    let got = c[i * n + j];
                    assert!(
                        (got - want).abs() <= 1e-5 * (k as f32).sqrt() * (1.0 + want.abs()),
                        "{m}×{k}×{n} (accumulate {accumulate}, on this thread {here}, new {fresh}) at ({i}, {j}): {got} vs {want}"
                    );
                }
            }
        }
    }

    /// A convolution's windows read from the image as they are packed, or in place a kernel row
    /// a step, give the product of the unfolded rows: a depth over several blocks, a row tail,
    /// tiles at the borders (packed) and inside (read in place), strides 1 and 2.
    #[test]
    fn windows_products_are_unfolded_products() {
        use crate::host::conv::{Window, unfold};
        if !supported() {
            eprintln!("skipped: this CPU has no AVX2 + FMA");
            return;
        }
        for (stride, shape, n) in [
            (2, [2, 9, 7, 40], 19),
            (2, [2, 5, 30, 40], 21),
            (1, [1, 4, 17, 24], 16),
        ] {
            let window = Window {
                kernel: [3, 3],
                stride: [stride, stride],
                padding: [1, 1],
            };
            let len = shape.iter().product();
            let x: Vec<f32> = (0..len).map(|i| (i as f32 * 0.37).sin()).collect();
            let windows = Windows::new(&x, shape, window);
            let k = windows.depth();
            let b: Vec<f32> = (0..k * n).map(|i| (i as f32 * 0.11).cos()).collect();
            let bias: Vec<f32> = (0..n).map(|i| (i as f32 * 0.7).sin()).collect();
            let packed = Packed::new(k, &[(&b, n)]);
            let m = windows.rows();
            let mut want = vec![0f32; m * n];
            product(
                &mut want,
                &unfold(&x, shape, &window),
                &packed,
                m,
                false,
                &bias,
                f32::tanh,
            );
            let got = conv_product(&windows, &packed, &bias, f32::tanh);
            assert_eq!(got.len(), want.len());
            for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                assert!(
                    (g - w).abs() <= 1e-5,
                    "{shape:?}, stride {stride}, at {i}: {g} vs {w}"
                );
            }
        }
        // The second and third images have tiles inside, whose kernel rows read in place.
        let x = vec![0f32; 2 * 5 * 30 * 40];
        let window = Window {
            kernel: [3, 3],
            stride: [2, 2],
            padding: [1, 1],
        };
        let windows = Windows::new(&x, [2, 5, 30, 40], window);
        assert!(windows.kernel_row_in_place(1..7, 1).is_some());
        assert!(
            windows.kernel_row_in_place(0..6, 1).is_none(),
            "the first column reads padding"
        );
        assert!(
            windows.kernel_row_in_place(12..18, 1).is_none(),
            "two output rows"
        );
        assert!(
            windows.kernel_row_in_place(1..7, 0).is_none(),
            "the first row reads padding"
        );
    }

    /// The tasks cover every row and panel once, in blocks of whole tiles (but the last) within
    /// a tile of each other, at least two per thread when there are enough tiles and panels.
    #[test]
    fn tasks_cover_the_product_evenly() {
        for (m, panels, threads) in [(1600, 48, 2), (1600, 48, 16), (10400, 72, 2), (32, 4, 2)]
            .into_iter()
            .chain([(7, 1, 2), (1, 1, 8), (145, 3, 3), (300, 1, 1)])
        {
            let tasks = tasks(m, panels, threads);
            let mut covered = vec![0; m * panels];
            for task in &tasks {
                assert!(task.rows.start % MR == 0, "{task:?} starts inside a tile");
                for row in task.rows.clone() {
                    for panel in task.panels.clone() {
                        covered[row * panels + panel] += 1;
                    }
                }
            }
            assert!(covered.iter().all(|&n| n == 1), "{m} × {panels}: {tasks:?}");
            let sizes: Vec<usize> = tasks.iter().map(|t| t.rows.len().div_ceil(MR)).collect();
            let (least, most) = (sizes.iter().min().unwrap(), sizes.iter().max().unwrap());
            assert!(most - least <= 1, "{m} rows: tiles per task {sizes:?}");
            let enough = m.div_ceil(MR) * panels >= 2 * threads;
            assert!(
                !enough || tasks.len() >= 2 * threads,
                "{m} × {panels}: {tasks:?}"
            );
        }
    }
}
