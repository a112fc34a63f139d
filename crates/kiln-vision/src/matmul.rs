//! Strided single-threaded matrix products on host slices, through the `gemm` crate (the kernels
//! burn's Flex backend uses), for host kernels that multiply views of larger buffers in
//! parallel tasks of their own.

/// An `rows × cols` matrix inside a slice: element `(r, c)` at `offset + r·row_stride +
/// c·col_stride`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct View {
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

    /// Whether every element lies inside a slice of `len` elements.
    fn fits(&self, len: usize) -> bool {
        self.rows == 0
            || self.cols == 0
            || self.offset + (self.rows - 1) * self.row_stride + (self.cols - 1) * self.col_stride
                < len
    }
}

/// `dst[d] = lhs[l] · rhs[r]`, overwriting `dst`'s view, on the calling thread.
///
/// Panics when the shapes disagree, a view reaches past its slice, or `dst`'s view is not
/// row-major with rows that do not overlap (so that it names each element once).
#[allow(unsafe_code)]
pub(crate) fn matmul(dst: &mut [f32], d: View, lhs: &[f32], l: View, rhs: &[f32], r: View) {
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
    // SAFETY: the asserts above keep every element gemm reads (lhs, rhs) or writes (dst) inside
    // its slice, and dst's elements are distinct; `dst` is borrowed mutably, so it aliases
    // neither input. With `read_dst` false gemm never reads dst, and with alpha 0 and beta 1 it
    // writes `lhs · rhs`.
    unsafe {
        gemm::gemm(
            d.rows,
            d.cols,
            l.cols,
            dst.as_mut_ptr().add(d.offset),
            d.col_stride as isize,
            d.row_stride as isize,
            false,
            lhs.as_ptr().add(l.offset),
            l.col_stride as isize,
            l.row_stride as isize,
            rhs.as_ptr().add(r.offset),
            r.col_stride as isize,
            r.row_stride as isize,
            0.0f32,
            1.0f32,
            false,
            false,
            false,
            gemm::Parallelism::None,
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
        matmul(&mut dst, View::rows(3, 3, 5, 8), &lhs, l, &rhs, r);
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
        );
    }
}
