//! Matrix products on burn's CUDA backend through NVIDIA's cuBLASLt, the library PyTorch and
//! candle call: `op(a) · op(b)` of row-major burn tensors, with the bias, the tanh GELU and a
//! residual added inside the kernel (cuBLASLt's epilogues and its `β C`), in f32 (TF32 where
//! allowed, as PyTorch's `allow_tf32`), bf16 and f16, on the stream cubecl queues its own
//! kernels on. burn 0.21's cubek products reached 23–27 TFLOP/s on the vision towers' shapes
//! where PyTorch's cuBLAS reaches about 61 (docs/PERFORMANCE.md).
//!
//! This module's host half (compiled everywhere) describes a product as cuBLASLt sees it:
//! row-major operands become column-major ones, `aᵀ` a transpose flag, alignments and the
//! workspace come from the pointers and the chip. Its device half (feature `cuda`) runs it;
//! where the library cannot be loaded it says so once and returns `None`, and the caller takes
//! burn's product.
//!
//! ```
//! use kiln_kernels::gemm::cublaslt::{Element, Epilogue, Gemm, Operand};
//!
//! // y [8, 96] = x [8, 64] · W [64, 96] + b, as burn's `Linear` stores W.
//! let gemm = Gemm {
//!     lhs: Operand::new(8, 64),
//!     rhs: Operand::new(64, 96),
//!     element: Element::F32,
//!     epilogue: Epilogue::Bias,
//!     accumulate: false,
//! };
//! let problem = gemm.column_major().unwrap();
//! // cuBLASLt computes Dᵀ = Wᵀ xᵀ: m = 96 output columns, n = 8 rows, k = 64.
//! assert_eq!((problem.m, problem.n, problem.k), (96, 8, 64));
//! ```

use burn::tensor::DType;

/// A row-major matrix as stored (`rows × cols`, rows `cols` apart), used as itself or as its
/// transpose.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Operand {
    /// Rows as stored.
    pub rows: usize,
    /// Columns as stored (the row stride).
    pub cols: usize,
    /// Whether the product reads the transpose.
    pub transposed: bool,
}

impl Operand {
    /// A `rows × cols` matrix, read as it is.
    pub fn new(rows: usize, cols: usize) -> Operand {
        Operand {
            rows,
            cols,
            transposed: false,
        }
    }

    /// The same matrix, read as its transpose.
    pub fn t(self) -> Operand {
        Operand {
            transposed: !self.transposed,
            ..self
        }
    }

    /// `[rows, cols]` of what the product reads.
    pub fn read(&self) -> [usize; 2] {
        if self.transposed {
            [self.cols, self.rows]
        } else {
            [self.rows, self.cols]
        }
    }
}

/// The element types products run in here.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Element {
    /// f32, accumulated in f32 (on TF32 tensor cores where allowed).
    F32,
    /// bf16, accumulated in f32.
    BF16,
    /// f16, accumulated in f32.
    F16,
}

impl Element {
    /// The element of a burn dtype, where cuBLASLt multiplies it here.
    pub fn of(dtype: DType) -> Option<Element> {
        match dtype {
            DType::F32 => Some(Element::F32),
            DType::BF16 => Some(Element::BF16),
            DType::F16 => Some(Element::F16),
            _ => None,
        }
    }

    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            Element::F32 => 4,
            Element::BF16 | Element::F16 => 2,
        }
    }
}

/// What the kernel does to the product before it stores it (cuBLASLt's epilogues).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Epilogue {
    /// Nothing.
    Plain,
    /// `+ b`, one bias per output column.
    Bias,
    /// The tanh approximation of GELU (cuBLASLt's only GELU: transformers' `gelu_pytorch_tanh`).
    GeluTanh,
    /// `gelu_tanh(· + b)`.
    BiasGeluTanh,
}

impl Epilogue {
    /// The epilogue for a bias (or none), then the tanh GELU (or nothing).
    pub fn new(bias: bool, gelu_tanh: bool) -> Epilogue {
        match (bias, gelu_tanh) {
            (false, false) => Epilogue::Plain,
            (true, false) => Epilogue::Bias,
            (false, true) => Epilogue::GeluTanh,
            (true, true) => Epilogue::BiasGeluTanh,
        }
    }

    /// Whether the kernel reads a bias.
    pub fn has_bias(self) -> bool {
        matches!(self, Epilogue::Bias | Epilogue::BiasGeluTanh)
    }
}

/// `out = epilogue(op(lhs) · op(rhs)) (+ out's previous values, with `accumulate`)`, every matrix
/// row-major.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Gemm {
    /// The left operand: `[M, K]` as read.
    pub lhs: Operand,
    /// The right operand: `[K, N]` as read.
    pub rhs: Operand,
    /// The element type of all three matrices (and the bias).
    pub element: Element,
    /// What follows the product.
    pub epilogue: Epilogue,
    /// Whether a matrix `C` (`[M, N]`) is added (`β = 1`): a residual stream.
    pub accumulate: bool,
}

/// Why a product cannot run as described.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GemmError {
    /// The operands' inner dimensions differ.
    #[error("cuBLASLt product: [{0}×{1}] · [{2}×{3}]: inner dimensions differ")]
    Shapes(usize, usize, usize, usize),
    /// A dimension is zero or past cuBLASLt's 32-bit leading dimensions.
    #[error("cuBLASLt product: dimension {0} out of range")]
    Dimension(usize),
}

/// A product as cuBLASLt's column-major API takes it: `D [m × n] = op(A) [m × k] · op(B) [k × n]`,
/// each matrix given by its stored `rows × cols` (column-major) and leading dimension.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ColumnMajor {
    /// Rows of `D` (the row-major output's columns).
    pub m: u64,
    /// Columns of `D` (the row-major output's rows).
    pub n: u64,
    /// The inner dimension.
    pub k: u64,
    /// `A` as stored: column-major rows, columns, leading dimension.
    pub a: [u64; 3],
    /// Whether cuBLASLt reads `Aᵀ`.
    pub transa: bool,
    /// `B` as stored.
    pub b: [u64; 3],
    /// Whether cuBLASLt reads `Bᵀ`.
    pub transb: bool,
    /// `C` and `D`: `[m, n]`, leading dimension `m`.
    pub d: [u64; 3],
}

impl Gemm {
    /// `[M, N]`, the row-major output's shape.
    pub fn output(&self) -> [usize; 2] {
        [self.lhs.read()[0], self.rhs.read()[1]]
    }

    /// The product in cuBLASLt's terms. A row-major `r × c` matrix is the column-major `c × r`
    /// matrix with leading dimension `c`, its transpose: so `out = op(lhs) op(rhs)` is computed
    /// as `outᵀ = op(rhs)ᵀ op(lhs)ᵀ`, with `A` = `rhs` as stored, read transposed exactly when
    /// `rhs` is, and `B` = `lhs` likewise.
    pub fn column_major(&self) -> Result<ColumnMajor, GemmError> {
        let ([rows, inner], [inner_rhs, cols]) = (self.lhs.read(), self.rhs.read());
        if inner != inner_rhs {
            return Err(GemmError::Shapes(rows, inner, inner_rhs, cols));
        }
        for &dimension in &[rows, inner, cols] {
            if dimension == 0 || dimension > i32::MAX as usize {
                return Err(GemmError::Dimension(dimension));
            }
        }
        let stored = |o: Operand| [o.cols as u64, o.rows as u64, o.cols as u64];
        Ok(ColumnMajor {
            m: cols as u64,
            n: rows as u64,
            k: inner as u64,
            a: stored(self.rhs),
            transa: self.rhs.transposed,
            b: stored(self.lhs),
            transb: self.lhs.transposed,
            d: [cols as u64, rows as u64, cols as u64],
        })
    }
}

/// The largest power of two up to 256 that divides `address`: cuBLASLt's heuristic assumes
/// 256-byte aligned operands unless told less, and a kernel chosen for more alignment than a
/// pointer has reads it wrongly (PyTorch tells it each pointer's alignment the same way).
pub fn alignment(address: u64) -> u32 {
    if address == 0 {
        return 256;
    }
    1u32 << address.trailing_zeros().min(8)
}

/// Workspace bytes for cuBLASLt's kernels on a chip of compute capability `major`: 32 MiB on
/// Hopper and later (what PyTorch gives cuBLAS there), 4 MiB before.
pub fn workspace_bytes(major: i32) -> usize {
    if major >= 9 { 32 << 20 } else { 4 << 20 }
}

/// The product `out = op(lhs) op(rhs)` of row-major `f32` slices as cuBLASLt computes it from a
/// [`ColumnMajor`] description: the reference the tests hold the description to.
pub fn reference(problem: &ColumnMajor, lhs: &[f32], rhs: &[f32]) -> Vec<f32> {
    // Element (i, j) of a column-major matrix with leading dimension ld, read transposed or not.
    let at = |data: &[f32], ld: u64, transposed: bool, i: u64, j: u64| {
        let (r, c) = if transposed { (j, i) } else { (i, j) };
        data[(r + c * ld) as usize]
    };
    let (m, n, k) = (problem.m, problem.n, problem.k);
    let mut d = vec![0.0f32; (m * n) as usize];
    for j in 0..n {
        for i in 0..m {
            d[(i + j * problem.d[2]) as usize] = (0..k)
                .map(|p| {
                    at(rhs, problem.a[2], problem.transa, i, p)
                        * at(lhs, problem.b[2], problem.transb, p, j)
                })
                .sum();
        }
    }
    d
}

/// Whether kiln's CUDA products go through cuBLASLt. Off by default for now: on an H200 the
/// towers' forwards were no faster with it, and CLIP-B/32's plain forward slower
/// (docs/PERFORMANCE.md), so burn's products stay the default until the path is measured
/// ahead. `KILN_CUBLASLT=1` in the environment or [`set_cublaslt`] turns it on.
pub fn cublaslt_enabled() -> bool {
    CUBLASLT.get()
}

/// Turns kiln's cuBLASLt products on or off from now on (see [`cublaslt_enabled`]).
pub fn set_cublaslt(enabled: bool) {
    CUBLASLT.set(enabled);
}

/// Whether products of f32 tensors may round their operands to TF32 on tensor cores (PyTorch's
/// `torch.backends.cuda.matmul.allow_tf32`). On by default, as burn 0.21's own CUDA products
/// already do; `KILN_TF32=0` in the environment or [`set_tf32`] turns it off.
pub fn tf32_allowed() -> bool {
    TF32.get()
}

/// Allows or forbids TF32 for f32 products from now on (see [`tf32_allowed`]).
pub fn set_tf32(allowed: bool) {
    TF32.set(allowed);
}

static CUBLASLT: Switch = Switch::new("KILN_CUBLASLT", false);
static TF32: Switch = Switch::new("KILN_TF32", true);

/// A process-wide setting whose first reading comes from an environment variable (`0` or `1`;
/// anything else, or nothing, is the default).
struct Switch {
    /// 0: off, 1: on, 2: not yet read.
    state: std::sync::atomic::AtomicU8,
    variable: &'static str,
    default: bool,
}

impl Switch {
    const fn new(variable: &'static str, default: bool) -> Switch {
        Switch {
            state: std::sync::atomic::AtomicU8::new(2),
            variable,
            default,
        }
    }

    fn get(&self) -> bool {
        use std::sync::atomic::Ordering;
        match self.state.load(Ordering::Relaxed) {
            0 => false,
            1 => true,
            _ => {
                let on = match std::env::var(self.variable).as_deref() {
                    Ok("0") => false,
                    Ok("1") => true,
                    _ => self.default,
                };
                self.set(on);
                on
            }
        }
    }

    fn set(&self, on: bool) {
        self.state
            .store(u8::from(on), std::sync::atomic::Ordering::Relaxed);
    }
}

#[cfg(feature = "cuda")]
mod device;
#[cfg(feature = "cuda")]
pub use device::{cublaslt_launches, product};

#[cfg(test)]
mod tests {
    use super::*;

    /// `op(x)` of a row-major `rows × cols` matrix, as a row-major matrix.
    fn read(x: &[f32], o: Operand) -> Vec<f32> {
        let [r, c] = o.read();
        (0..r * c)
            .map(|e| {
                let (i, j) = (e / c, e % c);
                if o.transposed {
                    x[j * o.cols + i]
                } else {
                    x[i * o.cols + j]
                }
            })
            .collect()
    }

    #[test]
    fn every_transpose_gives_the_row_major_product() {
        let (rows, inner, cols) = (5, 7, 3);
        for (lhs_t, rhs_t) in [(false, false), (true, false), (false, true), (true, true)] {
            let lhs = if lhs_t {
                Operand::new(inner, rows).t()
            } else {
                Operand::new(rows, inner)
            };
            let rhs = if rhs_t {
                Operand::new(cols, inner).t()
            } else {
                Operand::new(inner, cols)
            };
            let a: Vec<f32> = (0..rows * inner).map(|i| (i as f32 * 0.37).sin()).collect();
            let b: Vec<f32> = (0..inner * cols).map(|i| (i as f32 * 0.11).cos()).collect();
            let gemm = Gemm {
                lhs,
                rhs,
                element: Element::F32,
                epilogue: Epilogue::Plain,
                accumulate: false,
            };
            assert_eq!(gemm.output(), [rows, cols]);
            let problem = gemm.column_major().unwrap();
            assert_eq!((problem.transa, problem.transb), (rhs_t, lhs_t));
            let got = reference(&problem, &a, &b);
            let (x, y) = (read(&a, lhs), read(&b, rhs));
            for i in 0..rows {
                for j in 0..cols {
                    let want: f32 = (0..inner).map(|p| x[i * inner + p] * y[p * cols + j]).sum();
                    // Dᵀ column-major is the row-major output.
                    assert!((got[i * cols + j] - want).abs() < 1e-5, "{lhs_t} {rhs_t}");
                }
            }
        }
    }

    #[test]
    fn mismatched_or_empty_shapes_are_refused() {
        let gemm = |lhs, rhs| Gemm {
            lhs,
            rhs,
            element: Element::BF16,
            epilogue: Epilogue::Plain,
            accumulate: false,
        };
        assert_eq!(
            gemm(Operand::new(2, 3), Operand::new(4, 5)).column_major(),
            Err(GemmError::Shapes(2, 3, 4, 5))
        );
        assert_eq!(
            gemm(Operand::new(0, 3), Operand::new(3, 5)).column_major(),
            Err(GemmError::Dimension(0))
        );
        assert!(
            gemm(Operand::new(3, 2), Operand::new(5, 3).t())
                .column_major()
                .is_err()
        );
    }

    #[test]
    fn switches_start_at_their_default_and_follow_set() {
        let switch = Switch::new("KILN_TEST_SWITCH_NEVER_SET", true);
        assert!(switch.get());
        switch.set(false);
        assert!(!switch.get());
        switch.set(true);
        assert!(switch.get());
    }

    #[test]
    fn epilogues_dtypes_alignments_and_workspaces() {
        assert_eq!(Epilogue::new(true, true), Epilogue::BiasGeluTanh);
        assert_eq!(Epilogue::new(false, true), Epilogue::GeluTanh);
        assert!(Epilogue::new(true, false).has_bias() && !Epilogue::new(false, false).has_bias());
        assert_eq!(Element::of(DType::BF16), Some(Element::BF16));
        assert_eq!(Element::of(DType::F64), None);
        assert_eq!(Element::F16.size(), 2);
        assert_eq!(alignment(0x7f00_0000_0100), 256);
        assert_eq!(alignment(0x7f00_0000_0010), 16);
        assert_eq!(alignment(0x7f00_0000_0002), 2);
        assert_eq!(workspace_bytes(9), 32 << 20);
        assert_eq!(workspace_bytes(8), 4 << 20);
    }
}
