//! Products with weights kept as a GGUF file stores them: llama.cpp's blocks of 4-, 5-, 6- or
//! 8-bit integers with their f16 scales, read as they are, never decoded to f32 first.
//!
//! Decoding a language model's token is bound by the bytes its weights take: a Q4_1 weight is
//! 5 bits a value where f32 is 32. So the product `x Wᵀ` quantizes the activations `x` too, per
//! block of 32 values to 8 bits with an f32 scale (llama.cpp's `q8_0`, [`QuantizedRows`]; per
//! 256 values for the k-quants, llama.cpp's `q8_K`), and multiplies integers: each 32-value
//! group of a weight row is `a · q + b` (`q` its stored integers, `a` and `b` from the block's
//! scales, per 16 values for Q6_K), so its dot with an activation block `dₓ · qₓ` is
//! `dₓ (a Σ q qₓ + b Σ qₓ)`, the integer sum on AVX2's `vpmaddubsw` (32 products a step) where
//! the CPU has it and in plain Rust elsewhere. A k-quant super-block's `a` are integers times
//! one f32 scale, so its eight groups sum in integers before one conversion to f32.
//!
//! The types read as stored ([`STORED`]): Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K. The
//! 16-bit float types ([`HALVES`]: a file's F16 and BF16 tensors, and any matrix rounded to
//! bf16 by [`QuantMatrix::bf16`]) are kept too and multiplied with the activations as they are,
//! in f32, each weight widened as it is read.
//! The kernels serve one row (decoding, bandwidth-bound) and a few (each weight group unpacked
//! once for up to four rows). Many rows (a prompt: kiln-transformer's projections switch at 16)
//! go through [`prompt_product`]: on AVX2 each task unpacks eight weight rows at a time into a
//! panel the first-level cache holds, interleaved so that one `vpmaddubsw` serves the eight
//! rows, and passes every activation row over it (about twice the f32 product on decoded
//! panels it replaced, docs/PERFORMANCE.md).
//!
//! ```
//! use kiln_core::gguf::GgmlType;
//! use kiln_kernels::gemm::quantized::{QuantMatrix, QuantizedRows, product};
//! use kiln_kernels::gemm::strided::Write;
//!
//! // One Q8_0 row of 32 weights: scale 0.5 (f16 0x3800), integers 0, 1, …, 31.
//! let mut block = vec![0x00, 0x38];
//! block.extend(0..32u8);
//! let w = QuantMatrix::new(GgmlType::Q8_0, 1, 32, block)?;
//! let x = QuantizedRows::new(&[1.0; 32], 32);
//! let mut y = [0.0];
//! product(&mut y, 1, &x, &[&w], Write::Overwrite);
//! assert!((y[0] - 0.5 * (0..32).sum::<i32>() as f32).abs() < 1e-3);
//! # Ok::<(), String>(())
//! ```

#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
mod panels;
mod scalar;

use std::fmt;
use std::sync::OnceLock;

use half::{bf16, f16};
use kiln_core::gguf::{GgmlType, dequantize_blocks, scales_and_mins};
use rayon::prelude::*;

use super::strided::{Threads, View, Write, matmul};

/// The block types whose products read the blocks as stored.
pub const STORED: [GgmlType; 8] = [
    GgmlType::Q8_0,
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q5_0,
    GgmlType::Q5_1,
    GgmlType::Q4_K,
    GgmlType::Q5_K,
    GgmlType::Q6_K,
];

/// The 16-bit float types kept as they are and multiplied with f32 activations.
pub const HALVES: [GgmlType; 2] = [GgmlType::F16, GgmlType::BF16];

/// Values per activation block (and per weight group).
pub const GROUP: usize = 32;

/// A weight matrix `[rows, columns]` (outputs × inputs, as GGUF stores a projection) in one of
/// the [`STORED`] block types, each row its own run of blocks, or in one of the [`HALVES`].
#[derive(Clone, PartialEq, Eq)]
pub struct QuantMatrix {
    kind: GgmlType,
    rows: usize,
    columns: usize,
    row_bytes: usize,
    bytes: Vec<u8>,
}

impl fmt::Debug for QuantMatrix {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "QuantMatrix({} [{}, {}], {} bytes)",
            self.kind.name(),
            self.rows,
            self.columns,
            self.bytes.len()
        )
    }
}

impl QuantMatrix {
    /// The matrix whose `rows` rows of `columns` values are the blocks `bytes`, row after row.
    ///
    /// # Errors
    /// A type in neither [`STORED`] nor [`HALVES`], rows that are not whole blocks, or bytes of
    /// another length.
    pub fn new(
        kind: GgmlType,
        rows: usize,
        columns: usize,
        bytes: Vec<u8>,
    ) -> Result<Self, String> {
        if !STORED.contains(&kind) && !HALVES.contains(&kind) {
            let stored: Vec<&str> = STORED.iter().chain(&HALVES).map(|t| t.name()).collect();
            return Err(format!(
                "{} weights are not multiplied as stored (kiln does so for {})",
                kind.name(),
                stored.join(", ")
            ));
        }
        let (block, block_bytes) = kind.block();
        if !columns.is_multiple_of(block) {
            return Err(format!(
                "rows of {columns} values are not whole {} blocks of {block}",
                kind.name()
            ));
        }
        let row_bytes = columns / block * block_bytes;
        if bytes.len() != rows * row_bytes {
            return Err(format!(
                "{} bytes for {rows} rows of {columns} {} values ({} bytes)",
                bytes.len(),
                kind.name(),
                rows * row_bytes
            ));
        }
        Ok(QuantMatrix {
            kind,
            rows,
            columns,
            row_bytes,
            bytes,
        })
    }

    /// `values` (row-major `[rows, columns]`) rounded to bf16, to the nearest (ties to even).
    ///
    /// # Panics
    /// When `values` is not `rows · columns` long.
    pub fn bf16(rows: usize, columns: usize, values: &[f32]) -> Self {
        assert_eq!(values.len(), rows * columns, "bf16: the values' count");
        let mut bytes = vec![0u8; 2 * values.len()];
        (bytes.par_chunks_mut(2 * 4096).zip(values.par_chunks(4096))).for_each(|(out, values)| {
            for (out, &v) in out.chunks_exact_mut(2).zip(values) {
                out.copy_from_slice(&bf16::from_f32(v).to_bits().to_le_bytes());
            }
        });
        QuantMatrix {
            kind: GgmlType::BF16,
            rows,
            columns,
            row_bytes: 2 * columns,
            bytes,
        }
    }

    /// The block type.
    pub fn kind(&self) -> GgmlType {
        self.kind
    }

    /// The rows (outputs).
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// The columns (inputs).
    pub fn columns(&self) -> usize {
        self.columns
    }

    /// The bytes it holds.
    pub fn stored_bytes(&self) -> usize {
        self.bytes.len()
    }

    /// The blocks of row `row`.
    fn row(&self, row: usize) -> &[u8] {
        &self.bytes[row * self.row_bytes..][..self.row_bytes]
    }

    /// The blocks of rows `rows`, one after another.
    fn bytes_of(&self, rows: std::ops::Range<usize>) -> &[u8] {
        &self.bytes[rows.start * self.row_bytes..rows.end * self.row_bytes]
    }

    /// The same matrix with its rows reordered: row `i` is this one's row `order[i]`.
    ///
    /// # Panics
    /// When `order` is not as long as the rows, or names a row it does not have.
    pub fn with_rows_from(&self, order: &[usize]) -> Self {
        assert_eq!(order.len(), self.rows, "one source row per row");
        let mut bytes = Vec::with_capacity(self.bytes.len());
        for &row in order {
            bytes.extend_from_slice(self.row(row));
        }
        QuantMatrix { bytes, ..*self }
    }

    /// Every value as f32, row-major `[rows, columns]`, as the `gguf` package dequantizes them.
    pub fn dequantize(&self) -> Vec<f32> {
        dequantize_blocks(self.kind, &self.bytes).expect("the stored types dequantize")
    }

    /// Rows `rows` as f32 into `out` (`columns` values each), on the calling thread: on AVX2 each
    /// value `a · q + b` with one rounding (within an ulp of [`Self::dequantize`]'s), else as the
    /// `gguf` package computes it.
    pub fn dequantize_rows_into(&self, rows: std::ops::Range<usize>, out: &mut [f32]) {
        for (row, out) in rows.zip(out.chunks_exact_mut(self.columns)) {
            #[cfg(target_arch = "x86_64")]
            if Kernel::chosen() == Kernel::Avx2 {
                // SAFETY: chosen only where the CPU has AVX2, FMA and F16C.
                #[allow(unsafe_code)]
                unsafe {
                    avx2::dequantize_row(self.kind, self.row(row), out)
                };
                continue;
            }
            self.dequantize_row_into(row, out);
        }
    }

    /// Row `row` as f32 into `out` (`columns` values).
    pub fn dequantize_row_into(&self, row: usize, out: &mut [f32]) {
        let values = dequantize_blocks(self.kind, self.row(row)).expect("stored types dequantize");
        out.copy_from_slice(&values);
    }
}

/// Rows of activations as the products read them: quantized per block of [`GROUP`] values to
/// 8 bits, as llama.cpp's `quantize_row_q8_0` does ([`Blocks`]), for the 32-value types; per
/// 256-value super-block (llama.cpp's `q8_K`, [`SuperBlocks`]) for the k-quants; as given, in
/// f32, for the [`HALVES`] (whose rows may be of any length). Each quantization is made when a
/// product first asks for it.
#[derive(Debug, Clone)]
pub struct QuantizedRows {
    rows: usize,
    columns: usize,
    /// The rows as given, row after row.
    floats: Vec<f32>,
    /// The rows quantized per block.
    blocks: OnceLock<Blocks>,
    /// The rows quantized per super-block.
    super_blocks: OnceLock<SuperBlocks>,
}

/// Rows quantized per block of [`GROUP`] values: `d = max |x| / 127`, `q = round(x / d)`, with
/// `d` kept in f32 and each block's `d Σ q` beside it (what the weights' offsets multiply).
#[derive(Debug, Clone)]
struct Blocks {
    /// Blocks a row.
    groups: usize,
    /// Each block's scale `d`, row after row.
    scales: Vec<f32>,
    /// Each block's `d Σ q`.
    block_sums: Vec<f32>,
    /// The 8-bit values, row after row.
    values: Vec<i8>,
}

impl Blocks {
    /// `x` (rows of `columns` values, whole blocks) quantized per block.
    fn new(x: &[f32], columns: usize) -> Self {
        assert!(columns.is_multiple_of(GROUP), "rows of whole blocks");
        let blocks = x.len() / GROUP;
        let mut scales = Vec::with_capacity(blocks);
        let mut block_sums = Vec::with_capacity(blocks);
        let mut values = vec![0i8; x.len()];
        for (block, q) in x.chunks_exact(GROUP).zip(values.chunks_exact_mut(GROUP)) {
            let d = quantize_block(block, q);
            block_sums.push(q.iter().map(|&q| i32::from(q)).sum::<i32>() as f32 * d);
            scales.push(d);
        }
        Blocks {
            groups: columns / GROUP,
            scales,
            block_sums,
            values,
        }
    }
}

/// Rows quantized per 256-value super-block to 8 bits (llama.cpp's `q8_K`), for the k-quants'
/// kernels: one scale a super-block, so that its eight groups' products sum in integers with
/// the weights' own integer scales before one conversion to f32.
#[derive(Debug, Clone)]
struct SuperBlocks {
    /// Each super-block's scale `d`, row after row.
    scales: Vec<f32>,
    /// Each super-block's sums of `q` over its 16 runs of 16 values.
    sums: Vec<[i16; 16]>,
    /// The 8-bit values, row after row.
    values: Vec<i8>,
}

/// Values a k-quant super-block holds.
const SUPER_BLOCK: usize = 256;

/// `block` (whole runs of 32 values) quantized to 8 bits into `q`: `d = max |x| / 127`,
/// `q = x · (1 / d)` rounded to the nearest (halves to even); returns `d`. The same bits on
/// AVX2 as in plain Rust.
fn quantize_block(block: &[f32], q: &mut [i8]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if Kernel::chosen() == Kernel::Avx2 {
        // SAFETY: chosen only where the CPU has AVX2, FMA and F16C.
        #[allow(unsafe_code)]
        return unsafe { avx2::quantize_block(block, q) };
    }
    quantize_block_portably(block, q)
}

/// [`quantize_block`] in plain Rust.
fn quantize_block_portably(block: &[f32], q: &mut [i8]) -> f32 {
    let largest = block.iter().fold(0f32, |m, v| m.max(v.abs()));
    let d = largest / 127.0;
    let inverse = if d == 0.0 { 0.0 } else { 1.0 / d };
    for (q, &v) in q.iter_mut().zip(block) {
        *q = (v * inverse).round_ties_even() as i8;
    }
    d
}

impl SuperBlocks {
    /// `x` (rows of whole super-blocks) quantized per super-block.
    fn new(x: &[f32]) -> Self {
        let blocks = x.len() / SUPER_BLOCK;
        let mut values = vec![0i8; x.len()];
        let mut scales = Vec::with_capacity(blocks);
        let mut sums = Vec::with_capacity(blocks);
        for (block, q) in x
            .chunks_exact(SUPER_BLOCK)
            .zip(values.chunks_exact_mut(SUPER_BLOCK))
        {
            scales.push(quantize_block(block, q));
            let run = |r: usize| q[16 * r..][..16].iter().map(|&q| i16::from(q)).sum();
            sums.push(std::array::from_fn(run));
        }
        SuperBlocks {
            scales,
            sums,
            values,
        }
    }
}

impl QuantizedRows {
    /// The rows of `x`, `columns` values each.
    ///
    /// # Panics
    /// When `x` is not whole rows.
    pub fn new(x: &[f32], columns: usize) -> Self {
        assert!(
            columns > 0 && x.len().is_multiple_of(columns),
            "rows of {columns} values"
        );
        QuantizedRows {
            rows: x.len() / columns,
            columns,
            floats: x.to_vec(),
            blocks: OnceLock::new(),
            super_blocks: OnceLock::new(),
        }
    }

    /// The rows quantized per block (rows of whole blocks).
    fn blocks(&self) -> &Blocks {
        self.blocks
            .get_or_init(|| Blocks::new(&self.floats, self.columns))
    }

    /// The rows quantized per super-block (rows of whole super-blocks).
    fn super_blocks(&self) -> &SuperBlocks {
        assert!(
            self.columns.is_multiple_of(SUPER_BLOCK),
            "rows of whole super-blocks"
        );
        self.super_blocks
            .get_or_init(|| SuperBlocks::new(&self.floats))
    }

    /// The rows.
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// The columns.
    pub fn columns(&self) -> usize {
        self.columns
    }

    /// The values the quantized rows stand for, `d · q`, row-major.
    pub fn dequantize(&self) -> Vec<f32> {
        let blocks = self.blocks();
        (blocks.values.chunks_exact(GROUP).zip(&blocks.scales))
            .flat_map(|(q, &d)| q.iter().map(move |&q| f32::from(q) * d))
            .collect()
    }
}

/// `out[i, c] = Σ_k x[i, k] · w[r, k]` (or `+=`, as `write` says) for every row `i` of `x` and
/// every row `r` of the matrices `side_by_side`, whose outputs are `out`'s columns in order
/// (`out` row-major with `out_columns` columns, at least their rows). On rayon's threads in one
/// parallel region, each task a share of one matrix's rows.
///
/// # Panics
/// When `x` and a matrix have different columns or `out` cannot hold the result.
pub fn product(
    out: &mut [f32],
    out_columns: usize,
    x: &QuantizedRows,
    side_by_side: &[&QuantMatrix],
    write: Write,
) {
    let rows = x.rows();
    let outputs: usize = side_by_side.iter().map(|w| w.rows).sum();
    assert!(
        outputs <= out_columns && out.len() >= rows * out_columns,
        "product: out's shape"
    );
    let threads = rayon::current_num_threads();
    // Tasks of 64 KB of weights or more (decoding: a thread's share stays in cache across the
    // rows), several per thread.
    let tasks = tasks(side_by_side, x.columns(), |w| {
        (outputs / (threads * 8))
            .max(64 * 1024 / w.row_bytes.max(1))
            .max(1)
    });
    if rows == 0 || tasks.is_empty() {
        return;
    }
    let out = SharedOut(out.as_mut_ptr());
    let kernel = Kernel::chosen();
    tasks.into_par_iter().for_each(|(m, weights, column)| {
        let w = side_by_side[m];
        let mut sums = vec![0f32; 4 * weights.len()];
        for start in (0..rows).step_by(4) {
            let tile = start..(start + 4).min(rows);
            kernel.run(w, weights.clone(), x, tile.clone(), &mut sums);
            for (t, i) in tile.enumerate() {
                let line = &sums[t * weights.len()..][..weights.len()];
                out.write(i * out_columns + column, line, write);
            }
        }
    });
}

/// [`product`] for many rows `x` (`columns` f32 values each, not quantized): each matrix decoded
/// a panel of its rows at a time to f32 on a worker ([`QuantMatrix::dequantize_rows_into`]) and
/// multiplied there by the f32 product while the panel is in cache, rather than decoded whole to
/// memory first: [`prompt_product`] where the byte panels do not serve.
fn decoded_product(
    out: &mut [f32],
    out_columns: usize,
    x: &[f32],
    side_by_side: &[&QuantMatrix],
    write: Write,
) {
    let Some(columns) = side_by_side.first().map(|w| w.columns) else {
        return;
    };
    let rows = x.len() / columns.max(1);
    let outputs: usize = side_by_side.iter().map(|w| w.rows).sum();
    assert!(
        x.len() == rows * columns && outputs <= out_columns && out.len() >= rows * out_columns,
        "decoded_product: the shapes"
    );
    let threads = rayon::current_num_threads();
    // Panels of about 256 KB of f32 (within a core's L2), several a thread.
    let per_task = (256 * 1024 / (4 * columns.max(1)))
        .min(outputs.div_ceil(4 * threads))
        .next_multiple_of(16)
        .clamp(16, 256);
    let tasks = tasks(side_by_side, columns, |_| per_task);
    if rows == 0 {
        return;
    }
    let out = SharedOut(out.as_mut_ptr());
    let x_view = View::rows(0, rows, columns, columns);
    tasks.into_par_iter().for_each_init(
        || (Vec::new(), Vec::new()),
        |(panel, sums), (m, weights, column)| {
            let lines = weights.len();
            panel.resize(lines * columns, 0.0);
            sums.resize(rows * lines, 0.0);
            side_by_side[m].dequantize_rows_into(weights, panel);
            let panel_view = View::rows(0, lines, columns, columns).transposed();
            let sums_view = View::rows(0, rows, lines, lines);
            matmul(
                sums,
                sums_view,
                x,
                x_view,
                panel,
                panel_view,
                Write::Overwrite,
                Threads::One,
            );
            for (i, line) in sums.chunks_exact(lines).enumerate() {
                out.write(i * out_columns + column, line, write);
            }
        },
    );
}

/// [`product`] for many rows (a prompt): on AVX2, each task unpacks eight weight rows at a time
/// into a panel that the first-level cache holds (interleaved so that one byte product serves
/// the eight rows) and multiplies every row of `x` with it, in integers, against `x` quantized
/// per 32 values (llama.cpp's `q8_0`, for the k-quants too); elsewhere, and for the
/// [`HALVES`], the f32 product on decoded panels ([`decoded_product`]).
///
/// # Panics
/// When `x` and a matrix have different columns or `out` cannot hold the result.
pub fn prompt_product(
    out: &mut [f32],
    out_columns: usize,
    x: &QuantizedRows,
    side_by_side: &[&QuantMatrix],
    write: Write,
) {
    #[cfg(target_arch = "x86_64")]
    if Kernel::chosen() == Kernel::Avx2 && side_by_side.iter().all(|w| STORED.contains(&w.kind)) {
        return panel_product(out, out_columns, x, side_by_side, write);
    }
    decoded_product(out, out_columns, &x.floats, side_by_side, write);
}

/// [`prompt_product`] on AVX2 panels.
#[cfg(target_arch = "x86_64")]
#[allow(unsafe_code)]
fn panel_product(
    out: &mut [f32],
    out_columns: usize,
    x: &QuantizedRows,
    side_by_side: &[&QuantMatrix],
    write: Write,
) {
    use panels::{LANES, Panel, TILE};
    let rows = x.rows();
    let outputs: usize = side_by_side.iter().map(|w| w.rows).sum();
    assert!(
        outputs <= out_columns && out.len() >= rows * out_columns,
        "prompt_product: out's shape"
    );
    // Whole panels of eight rows, about four tasks a thread.
    let threads = rayon::current_num_threads();
    let per_task = outputs.div_ceil(4 * threads).next_multiple_of(LANES);
    let tasks = tasks(side_by_side, x.columns(), |_| per_task);
    if rows == 0 {
        return;
    }
    let blocks = x.blocks();
    let out = SharedOut(out.as_mut_ptr());
    tasks
        .into_par_iter()
        .for_each_init(Panel::default, |panel, (m, weights, column)| {
            let w = side_by_side[m];
            let mut sums = [[0f32; LANES]; TILE];
            for start in weights.clone().step_by(LANES) {
                let lanes = start..(start + LANES).min(weights.end);
                // SAFETY: chosen only where the CPU has AVX2, FMA and F16C.
                unsafe { panel.fill(w, lanes.clone()) };
                let at = column + start - weights.start;
                // The next panel's blocks (eight streams, which the CPU's prefetcher follows
                // poorly) fetched while this one is multiplied, a share each tile.
                let next = w.bytes_of(lanes.end..(lanes.end + LANES).min(weights.end));
                let tiles = rows.div_ceil(TILE);
                for tile in (0..rows).step_by(TILE) {
                    panels::prefetch(next, tile / TILE, tiles);
                    let count = (rows - tile).min(TILE);
                    // SAFETY: as above.
                    unsafe {
                        match count {
                            1 => panel.sums::<1>(blocks, tile, &mut sums),
                            2 => panel.sums::<2>(blocks, tile, &mut sums),
                            _ => panel.sums::<TILE>(blocks, tile, &mut sums),
                        }
                    }
                    for (i, line) in sums[..count].iter().enumerate() {
                        out.write((tile + i) * out_columns + at, &line[..lanes.len()], write);
                    }
                }
            }
        });
}

/// The products' tasks: `(matrix, its rows, the output column of the first)`, each matrix's
/// rows in shares of `per_task(matrix)`, the matrices' outputs one after another.
///
/// # Panics
/// When a matrix's columns are not `columns`.
fn tasks(
    side_by_side: &[&QuantMatrix],
    columns: usize,
    per_task: impl Fn(&QuantMatrix) -> usize,
) -> Vec<(usize, std::ops::Range<usize>, usize)> {
    let mut tasks = Vec::new();
    let mut first = 0;
    for (m, w) in side_by_side.iter().enumerate() {
        assert_eq!(w.columns, columns, "the inputs' and the weights' columns");
        let per_task = per_task(w);
        for start in (0..w.rows).step_by(per_task) {
            tasks.push((m, start..(start + per_task).min(w.rows), first + start));
        }
        first += w.rows;
    }
    tasks
}

/// `out`'s values, written by the tasks at columns each owns alone.
struct SharedOut(*mut f32);

// SAFETY: the tasks write disjoint cells (see `product`) while it borrows `out` mutably.
#[allow(unsafe_code)]
unsafe impl Sync for SharedOut {}

impl SharedOut {
    /// `values` written over (or added onto) the cells from `at` on: cells of `out` (checked by
    /// `product`) that no other task writes.
    #[allow(unsafe_code)]
    fn write(&self, at: usize, values: &[f32], write: Write) {
        // SAFETY: as the doc says.
        let cells = unsafe { std::slice::from_raw_parts_mut(self.0.add(at), values.len()) };
        match write {
            Write::Overwrite => cells.copy_from_slice(values),
            Write::Add => cells.iter_mut().zip(values).for_each(|(c, v)| *c += v),
        }
    }
}

/// Which implementation runs the sums: AVX2 (with FMA and F16C) where the CPU has it, else
/// plain Rust.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kernel {
    #[cfg(target_arch = "x86_64")]
    Avx2,
    Scalar,
}

impl Kernel {
    fn chosen() -> Self {
        #[cfg(target_arch = "x86_64")]
        if avx2::supported() {
            return Kernel::Avx2;
        }
        Kernel::Scalar
    }

    /// `sums[t · weights.len() + r] = x[tile[t]] · w[weights[r]]`, `tile` at most four rows.
    fn run(
        self,
        w: &QuantMatrix,
        weights: std::ops::Range<usize>,
        x: &QuantizedRows,
        tile: std::ops::Range<usize>,
        sums: &mut [f32],
    ) {
        match self {
            // SAFETY: chosen only where the CPU has AVX2, FMA and F16C.
            #[cfg(target_arch = "x86_64")]
            #[allow(unsafe_code)]
            Kernel::Avx2 => unsafe { avx2::sums(w, weights, x, tile, sums) },
            Kernel::Scalar if HALVES.contains(&w.kind) => {
                scalar::half_sums(w, weights, x, tile, sums)
            }
            Kernel::Scalar => scalar::sums(w, weights, x, tile, sums),
        }
    }
}

/// The f16 at `bytes[at..at + 2]`.
#[inline]
fn half(bytes: &[u8], at: usize) -> f32 {
    f16::from_bits(u16::from_le_bytes([bytes[at], bytes[at + 1]])).to_f32()
}

/// A weight group's scaling: value `j` is `scale[h] · q_j + offset[h]`, `h` its half (0 for the
/// first 16 values, 1 for the next).
#[derive(Clone, Copy, Debug, Default)]
struct Scaling {
    scale: [f32; 2],
    offset: [f32; 2],
}

impl Scaling {
    fn whole(scale: f32, offset: f32) -> Self {
        Scaling {
            scale: [scale; 2],
            offset: [offset; 2],
        }
    }

    /// Each group's scaling in the block `block` of `kind` (one for 32-value blocks, eight for
    /// the 256-value k-quants), its f16 fields read by `half`.
    #[inline(always)]
    fn of_block(
        kind: GgmlType,
        block: &[u8],
        groups: &mut [Scaling; 8],
        half: impl Fn(&[u8], usize) -> f32,
    ) -> usize {
        match kind {
            GgmlType::Q8_0 => groups[0] = Scaling::whole(half(block, 0), 0.0),
            GgmlType::Q4_0 => {
                let d = half(block, 0);
                groups[0] = Scaling::whole(d, -8.0 * d);
            }
            GgmlType::Q5_0 => {
                let d = half(block, 0);
                groups[0] = Scaling::whole(d, -16.0 * d);
            }
            GgmlType::Q4_1 | GgmlType::Q5_1 => {
                groups[0] = Scaling::whole(half(block, 0), half(block, 2));
            }
            GgmlType::Q4_K | GgmlType::Q5_K => {
                let (d, dmin) = (half(block, 0), half(block, 2));
                let (scales, mins) = scales_and_mins(&block[4..16]);
                for (g, group) in groups.iter_mut().enumerate() {
                    let offset = -dmin * f32::from(mins[g]);
                    *group = Scaling::whole(d * f32::from(scales[g]), offset);
                }
                return 8;
            }
            GgmlType::Q6_K => {
                let d = half(block, 208);
                for (g, group) in groups.iter_mut().enumerate() {
                    let scale = [2 * g, 2 * g + 1].map(|s| d * f32::from(block[192 + s] as i8));
                    *group = Scaling {
                        scale,
                        offset: scale.map(|s| -32.0 * s),
                    };
                }
                return 8;
            }
            other => unreachable!("{} is not stored", other.name()),
        }
        1
    }
}

#[cfg(test)]
mod tests;
