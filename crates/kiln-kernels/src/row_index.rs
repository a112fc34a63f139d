//! Rows gathered and scattered by one index, prepared once: the message passing of a graph
//! network (features gathered from the senders of its edges, messages summed into their
//! receivers).
//!
//! burn's `select` differentiates through `select_assign`, and burn's GPU backends run
//! `select_assign` with one thread per column looping over every index in turn; so does the
//! sum into receivers itself. On those backends (CUDA, wgpu) a [`RowIndex`] sums each row's
//! entries in a kernel of kiln's own instead, one thread per output element, over the entries
//! grouped by row once, when the index is made. The sum is deterministic (each row's entries in
//! index order). Other backends run burn's operations.

use burn::tensor::backend::Backend;
use burn::tensor::{Int, Tensor, TensorData};

use crate::scatter_add;

/// Why an index cannot be made.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("entry {position} of the index names row {row}, but there are {rows} rows")]
pub struct RowIndexError {
    /// The entry, 1-based.
    pub position: usize,
    /// The row it names.
    pub row: i64,
    /// How many rows there are.
    pub rows: usize,
}

/// An index into the rows of `[rows, ..]` tensors: [`gather`](Self::gather) reads them,
/// [`scatter_add`](Self::scatter_add) adds into them, both differentiable on every backend.
///
/// ```
/// # use burn::backend::Flex;
/// # use burn::tensor::Tensor;
/// use kiln_kernels::RowIndex;
///
/// let device = Default::default();
/// // Three edges, into atoms 1, 0 and 1 of two.
/// let receivers = RowIndex::<Flex>::new(&[1, 0, 1], 2, &device).unwrap();
/// let messages = Tensor::<Flex, 2>::from_floats([[1.0], [2.0], [4.0]], &device);
/// let atoms = receivers.scatter_add(Tensor::zeros([2, 1], &device), messages);
/// assert_eq!(atoms.to_data().to_vec::<f32>().unwrap(), [2.0, 5.0]);
/// assert_eq!(receivers.gather(atoms).to_data().to_vec::<f32>().unwrap(), [5.0, 2.0, 5.0]);
/// ```
#[derive(Debug, Clone)]
pub struct RowIndex<B: Backend> {
    indices: Tensor<B, 1, Int>,
    rows: usize,
    grouped: Option<Grouped<B>>,
}

/// The entries of an index grouped by the row they name, for a segment sum (read by the GPU
/// backends' kernel only).
#[derive(Debug, Clone)]
#[cfg_attr(not(any(feature = "cuda", feature = "wgpu")), allow(dead_code))]
pub(crate) struct Grouped<B: Backend> {
    /// The entries sorted by row, each row's in index order `[entries]`.
    pub order: Tensor<B, 1, Int>,
    /// Where each row's entries start in `order`, then the end `[rows + 1]`.
    pub offsets: Tensor<B, 1, Int>,
}

impl<B: Backend> RowIndex<B> {
    /// The index `indices` into `rows` rows, on `device`. An entry outside `0..rows` is an error
    /// naming it.
    pub fn new(indices: &[i64], rows: usize, device: &B::Device) -> Result<Self, RowIndexError> {
        let row_of = |position: usize, &row: &i64| {
            usize::try_from(row)
                .ok()
                .filter(|&r| r < rows)
                .ok_or(RowIndexError {
                    position: position + 1,
                    row,
                    rows,
                })
        };
        let checked = indices
            .iter()
            .enumerate()
            .map(|(p, row)| row_of(p, row))
            .collect::<Result<Vec<usize>, _>>()?;
        let ints = |values: Vec<i64>| {
            let n = values.len();
            Tensor::<B, 1, Int>::from_data(TensorData::new(values, [n]), device)
        };
        let grouped = crate::segment::serves::<B>().then(|| {
            let (order, offsets) = group(&checked, rows);
            Grouped {
                order: ints(order),
                offsets: ints(offsets),
            }
        });
        Ok(RowIndex {
            indices: ints(indices.to_vec()),
            rows,
            grouped,
        })
    }

    /// The index `[entries]`.
    pub fn indices(&self) -> &Tensor<B, 1, Int> {
        &self.indices
    }

    /// How many rows it indexes into.
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// How many entries it has.
    pub fn len(&self) -> usize {
        self.indices.dims()[0]
    }

    /// Whether it has no entries.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The rows of `x` `[rows, ..]` the index names, in its order `[entries, ..]`.
    pub fn gather<const D: usize>(&self, x: Tensor<B, D>) -> Tensor<B, D> {
        if let Some(grouped) = &self.grouped {
            let dims = x.dims();
            if let Some(rows) = crate::segment::gather(flat(x.clone()), &self.indices, grouped) {
                return unflat(rows, self.len(), dims);
            }
        }
        x.select(0, self.indices.clone())
    }

    /// `dest` `[rows, ..]` with every row of `src` `[entries, ..]` added into the row the
    /// index names for it, summed in the wider of f32 and the operands' dtypes (as
    /// [`scatter_add`](crate::scatter_add)).
    pub fn scatter_add<const D: usize>(
        &self,
        dest: Tensor<B, D>,
        src: Tensor<B, D>,
    ) -> Tensor<B, D> {
        if let Some(grouped) = &self.grouped
            && dest.dtype() == src.dtype()
        {
            let dims = dest.dims();
            if let Some(sums) =
                crate::segment::sum(flat(src.clone()), &self.indices, grouped, self.rows)
            {
                return dest + unflat(sums, self.rows, dims);
            }
        }
        scatter_add(dest, 0, self.indices.clone(), src)
    }
}

/// Entries sorted by the row they name (a counting sort, stable) and each row's start.
fn group(rows_of: &[usize], rows: usize) -> (Vec<i64>, Vec<i64>) {
    let mut offsets = vec![0usize; rows + 1];
    for &row in rows_of {
        offsets[row + 1] += 1;
    }
    for row in 0..rows {
        offsets[row + 1] += offsets[row];
    }
    let mut next = offsets.clone();
    let mut order = vec![0i64; rows_of.len()];
    for (entry, &row) in rows_of.iter().enumerate() {
        order[next[row]] = entry as i64;
        next[row] += 1;
    }
    (order, offsets.into_iter().map(|o| o as i64).collect())
}

/// `x` `[n, ..]` as `[n, columns]`.
fn flat<B: Backend, const D: usize>(x: Tensor<B, D>) -> Tensor<B, 2> {
    let dims = x.dims();
    let columns = dims[1..].iter().product();
    x.reshape([dims[0], columns])
}

/// `x` `[n, columns]` back as `[n, ..]` with the trailing dimensions of `like`.
fn unflat<B: Backend, const D: usize>(x: Tensor<B, 2>, n: usize, like: [usize; D]) -> Tensor<B, D> {
    let mut dims = like;
    dims[0] = n;
    x.reshape(dims)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grouping_keeps_each_rows_entries_in_index_order() {
        let (order, offsets) = group(&[2, 0, 2, 1, 0], 4);
        assert_eq!(order, [1, 4, 3, 0, 2]);
        assert_eq!(offsets, [0, 2, 3, 5, 5]);
    }

    #[test]
    fn an_index_outside_the_rows_is_named() {
        let device = Default::default();
        let err = RowIndex::<burn::backend::Flex>::new(&[0, 3], 3, &device).unwrap_err();
        assert_eq!(
            err.to_string(),
            "entry 2 of the index names row 3, but there are 3 rows"
        );
        assert!(RowIndex::<burn::backend::Flex>::new(&[-1], 3, &device).is_err());
    }
}
