//! Strided f32 matrix products on host slices through the `gemm` crate (the kernels burn's Flex
//! backend uses), written into or added to their destination: views of larger buffers multiplied
//! on the calling thread inside parallel tasks of their own, or whole products on every thread.

/// An `rows × cols` matrix inside a slice: element `(r, c)` at `offset + r·row_stride +
/// c·col_stride`.
#[derive(Debug, Clone, Copy)]
pub struct View {
    offset: usize,
    rows: usize,
    cols: usize,
    row_stride: usize,
    col_stride: usize,
}

impl View {
    /// A row-major view: `rows` rows of `cols` consecutive elements, `row_stride` apart.
    pub fn rows(offset: usize, rows: usize, cols: usize, row_stride: usize) -> View {
        View {
            offset,
            rows,
            cols,
            row_stride,
            col_stride: 1,
        }
    }

    /// The same elements seen as the transposed matrix.
    pub fn transposed(self) -> View {
        View {
            rows: self.cols,
            cols: self.rows,
            row_stride: self.col_stride,
            col_stride: self.row_stride,
            ..self
        }
    }

    /// Rows of the matrix seen.
    pub fn row_count(&self) -> usize {
        self.rows
    }

    /// Columns of the matrix seen.
    pub fn column_count(&self) -> usize {
        self.cols
    }

    /// Elements from one row's start to the next's.
    pub(crate) fn row_stride(&self) -> usize {
        self.row_stride
    }

    /// Whether each row's elements are consecutive.
    pub(crate) fn is_row_major(&self) -> bool {
        self.col_stride == 1
    }

    /// Whether each column's elements are consecutive (a row-major matrix transposed).
    pub(crate) fn is_column_major(&self) -> bool {
        self.row_stride == 1
    }

    /// Where element (`row`, `col`) lies in the slice.
    pub(crate) fn index(&self, row: usize, col: usize) -> usize {
        self.offset + row * self.row_stride + col * self.col_stride
    }

    /// Whether every element lies inside a slice of `len` elements.
    pub(crate) fn fits(&self, len: usize) -> bool {
        self.rows == 0
            || self.cols == 0
            || self.offset + (self.rows - 1) * self.row_stride + (self.cols - 1) * self.col_stride
                < len
    }
}

/// The threads a product runs on.
#[derive(Debug, Clone, Copy)]
pub enum Threads {
    /// The calling thread (for tasks that are already parallel).
    One,
    /// All of rayon's, as the `gemm` crate splits the product.
    All,
    /// All of rayon's, each computing its own block of the destination's columns: each thread
    /// then packs only its share of `rhs`, which is the better split when the destination has
    /// few rows (a language model's tokens against its weights: 10–66% faster at 16–112 rows,
    /// docs/PERFORMANCE.md).
    Columns,
}

/// Whether a product overwrites its destination or is added to it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Write {
    /// `dst = lhs · rhs`.
    Overwrite,
    /// `dst += lhs · rhs`.
    Add,
}

/// `dst[d] = lhs[l] · rhs[r]` (or `+=`, as `write` says) on `threads`.
///
/// Panics when the shapes disagree, a view reaches past its slice, or `dst`'s view is not
/// row-major with rows that do not overlap (so that it names each element once).
#[allow(unsafe_code, clippy::too_many_arguments)]
pub fn matmul(
    dst: &mut [f32],
    d: View,
    lhs: &[f32],
    l: View,
    rhs: &[f32],
    r: View,
    write: Write,
    threads: Threads,
) {
    let accumulate = write == Write::Add;
    assert!(
        l.rows == d.rows && r.cols == d.cols && l.cols == r.rows,
        "matmul: [{}×{}] · [{}×{}] into [{}×{}]",
        l.rows,
        l.cols,
        r.rows,
        r.cols,
        d.rows,
        d.cols
    );
    assert!(d.col_stride == 1 && (d.rows <= 1 || d.row_stride >= d.cols));
    assert!(d.fits(dst.len()) && l.fits(lhs.len()) && r.fits(rhs.len()));
    if d.rows == 0 || d.cols == 0 {
        return;
    }
    let workers = rayon::current_num_threads().max(1);
    if matches!(threads, Threads::Columns) && workers > 1 && d.cols > 1 {
        use rayon::prelude::*;
        let width = d.cols.div_ceil(workers);
        let out = Out(dst.as_mut_ptr());
        (0..d.cols.div_ceil(width))
            .into_par_iter()
            .for_each(|block| {
                let first = block * width;
                let cols = width.min(d.cols - first);
                let (d, r) = (
                    View {
                        offset: d.offset + first,
                        cols,
                        ..d
                    },
                    View {
                        offset: r.offset + first * r.col_stride,
                        cols,
                        ..r
                    },
                );
                // SAFETY: the views are sub-views of checked ones, and the blocks' columns of `dst`
                // are disjoint.
                unsafe {
                    gemm_views(
                        out.start(),
                        d,
                        lhs,
                        l,
                        rhs,
                        r,
                        accumulate,
                        gemm::Parallelism::None,
                    )
                };
            });
        return;
    }
    let parallelism = match threads {
        Threads::All => gemm::Parallelism::Rayon(0),
        Threads::One | Threads::Columns => gemm::Parallelism::None,
    };
    // SAFETY: the asserts above keep every element inside its slice, and `dst` is borrowed
    // mutably, so it aliases neither input.
    unsafe { gemm_views(dst.as_mut_ptr(), d, lhs, l, rhs, r, accumulate, parallelism) };
}

/// The start of a destination shared by tasks that each write their own columns of it.
struct Out(*mut f32);

// SAFETY: the tasks write disjoint elements of the destination, which outlives them.
#[allow(unsafe_code)]
unsafe impl Sync for Out {}

impl Out {
    /// The destination's first element (a method, so that closures capture the `Sync` whole).
    fn start(&self) -> *mut f32 {
        self.0
    }
}

/// `gemm` on views: `dst[d] = lhs[l] · rhs[r]`, or `+=` with `accumulate`.
///
/// # Safety
/// Every element of the views lies inside its buffer, `d` names each element once, no other
/// thread reads or writes `d`'s elements meanwhile, and `dst` aliases neither input.
#[allow(unsafe_code, clippy::too_many_arguments)]
unsafe fn gemm_views(
    dst: *mut f32,
    d: View,
    lhs: &[f32],
    l: View,
    rhs: &[f32],
    r: View,
    accumulate: bool,
    parallelism: gemm::Parallelism,
) {
    // SAFETY: as the caller promises. gemm computes `alpha · dst + beta · lhs · rhs`, reading
    // dst only with `read_dst`: alpha 0 (or dst unread) and beta 1 writes the product, alpha 1
    // adds it.
    unsafe {
        gemm::gemm(
            d.rows,
            d.cols,
            l.cols,
            dst.add(d.offset),
            d.col_stride as isize,
            d.row_stride as isize,
            accumulate,
            lhs.as_ptr().add(l.offset),
            l.col_stride as isize,
            l.row_stride as isize,
            rhs.as_ptr().add(r.offset),
            r.col_stride as isize,
            r.row_stride as isize,
            if accumulate { 1.0f32 } else { 0.0 },
            1.0f32,
            false,
            false,
            false,
            parallelism,
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strided_views_multiply_like_the_definition() {
        // lhs: 3×4 inside rows of 6 starting at 2; rhs: the transpose of a 5×4 block.
        let lhs: Vec<f32> = (0..20).map(|i| (i as f32 * 0.37).sin()).collect();
        let rhs: Vec<f32> = (0..40).map(|i| (i as f32 * 0.11).cos()).collect();
        let (l, r) = (View::rows(2, 3, 4, 6), View::rows(1, 5, 4, 7).transposed());
        let mut dst = vec![-1.0f32; 3 * 8];
        matmul(
            &mut dst,
            View::rows(3, 3, 5, 8),
            &lhs,
            l,
            &rhs,
            r,
            Write::Overwrite,
            Threads::One,
        );
        for i in 0..3 {
            for j in 0..5 {
                let want: f32 = (0..4)
                    .map(|k| lhs[2 + i * 6 + k] * rhs[1 + j * 7 + k])
                    .sum();
                assert!((dst[3 + i * 8 + j] - want).abs() < 1e-5);
            }
            // Elements outside the view are untouched.
            assert!(dst[i * 8..i * 8 + 3].iter().all(|&x| x == -1.0));
        }
    }

    #[test]
    fn a_product_adds_to_its_destination_on_every_thread() {
        let (m, k, n) = (70, 33, 45);
        let lhs: Vec<f32> = (0..m * k).map(|i| (i as f32 * 0.23).sin()).collect();
        let rhs: Vec<f32> = (0..k * n).map(|i| (i as f32 * 0.07).cos()).collect();
        let start: Vec<f32> = (0..m * n).map(|i| i as f32 * 0.01).collect();
        let (l, r, d) = (
            View::rows(0, m, k, k),
            View::rows(0, k, n, n),
            View::rows(0, m, n, n),
        );
        for threads in [Threads::All, Threads::Columns] {
            let mut dst = start.clone();
            matmul(&mut dst, d, &lhs, l, &rhs, r, Write::Add, threads);
            for (i, j) in (0..m).flat_map(|i| (0..n).map(move |j| (i, j))) {
                let want =
                    start[i * n + j] + (0..k).map(|c| lhs[i * k + c] * rhs[c * n + j]).sum::<f32>();
                assert!((dst[i * n + j] - want).abs() < 1e-4, "{threads:?} {i} {j}");
            }
        }
    }

    #[test]
    #[should_panic]
    fn a_view_past_its_slice_is_refused() {
        let mut dst = vec![0.0f32; 4];
        matmul(
            &mut dst,
            View::rows(0, 2, 2, 2),
            &[0.0; 4],
            View::rows(0, 2, 2, 2),
            &[0.0; 3],
            View::rows(0, 2, 2, 2),
            Write::Overwrite,
            Threads::One,
        );
    }
}
