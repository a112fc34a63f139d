//! Where batches come from. The loop asks a [`Loader`] for one epoch's batches in a seeded
//! order, starting at any batch (a resumed run starts mid-epoch without reading the batches
//! before). `LabelledImages` (feature `images`) serves kiln-cache's decode-once image feeds;
//! [`HostData`] serves anything else (structures, token ids), prepared ahead on background
//! threads ([`Prefetch`]).

use std::sync::Arc;

use kiln_core::{Order, Prefetch};

/// A dataset the loop reads in epochs.
pub trait Loader {
    /// One batch, ready on the device (`Send`: steps run on rayon's threads on host backends).
    type Batch: Send;

    /// Batches in one epoch.
    fn batches_per_epoch(&self) -> usize;

    /// Items in one epoch and the batch size, where the loader knows them: the loop warns of a
    /// batch larger than the whole set (every step then takes the whole set).
    fn sizes(&self) -> Option<(usize, usize)> {
        None
    }

    /// The epoch's batches in `order`, from batch `first` on.
    fn batches(&self, order: Order, first: usize) -> Box<dyn Iterator<Item = Self::Batch> + '_>;
}

/// Builds a host batch from item indices.
type MakeBatch<H> = dyn Fn(&[usize]) -> H + Send + Sync;

/// Items of any kind: `make` builds a host batch from item indices on background threads
/// (reading, parsing, tokenising once per batch, ahead of the device), `upload` puts it on the
/// device in the training thread.
///
/// ```
/// use burn::backend::Flex;
/// use burn::tensor::{Int, Tensor, TensorData};
/// use kiln_core::Order;
/// use kiln_train::{HostData, Loader};
///
/// let tokens: Vec<Vec<i64>> = vec![vec![1, 2], vec![3, 4], vec![5, 6]]; // tokenised once
/// let data = HostData::new(
///     tokens.len(),
///     2,
///     move |items: &[usize]| items.iter().flat_map(|&i| tokens[i].clone()).collect::<Vec<_>>(),
///     |ids: Vec<i64>| {
///         let rows = ids.len() / 2;
///         Tensor::<Flex, 2, Int>::from_data(TensorData::new(ids, [rows, 2]), &Default::default())
///     },
/// );
/// let shapes: Vec<[usize; 2]> = data.batches(Order::Sequential, 0).map(|t| t.dims()).collect();
/// assert_eq!(shapes, [[2, 2], [1, 2]]);
/// ```
pub struct HostData<H, U> {
    len: usize,
    batch_size: usize,
    make: Arc<MakeBatch<H>>,
    upload: U,
    workers: usize,
    prefetch: usize,
}

impl<H: Send + 'static, U> HostData<H, U> {
    /// `len` items in batches of `batch_size` (at least 1); 2 threads, 2 batches ahead each.
    pub fn new(
        len: usize,
        batch_size: usize,
        make: impl Fn(&[usize]) -> H + Send + Sync + 'static,
        upload: U,
    ) -> Self {
        HostData {
            len,
            batch_size: batch_size.max(1),
            make: Arc::new(make),
            upload,
            workers: 2,
            prefetch: 2,
        }
    }

    /// Background threads making batches (at least 1).
    pub fn workers(mut self, workers: usize) -> Self {
        self.workers = workers.max(1);
        self
    }

    /// Batches each thread may hold ready (at least 1).
    pub fn prefetch(mut self, batches: usize) -> Self {
        self.prefetch = batches.max(1);
        self
    }
}

impl<H: Send + 'static, T: Send, U: Fn(H) -> T> Loader for HostData<H, U> {
    type Batch = T;

    fn batches_per_epoch(&self) -> usize {
        self.len.div_ceil(self.batch_size)
    }

    fn sizes(&self) -> Option<(usize, usize)> {
        Some((self.len, self.batch_size))
    }

    fn batches(&self, order: Order, first: usize) -> Box<dyn Iterator<Item = T> + '_> {
        let make = Arc::clone(&self.make);
        let pass = Prefetch::start(
            Arc::new(order.indices(self.len)),
            self.batch_size,
            first,
            self.workers,
            self.prefetch,
            move |items: &[usize]| make(items),
        );
        Box::new(pass.map(&self.upload))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_data_gives_each_item_once_per_epoch_in_the_seeded_order_from_any_batch() {
        let data =
            HostData::new(10, 3, |items: &[usize]| items.to_vec(), |v: Vec<usize>| v).workers(3);
        let order = Order::Shuffled { seed: 9, epoch: 4 };
        let all: Vec<Vec<usize>> = data.batches(order, 0).collect();
        assert_eq!(all.len(), data.batches_per_epoch());
        assert_eq!(all.concat(), order.indices(10));
        for first in 0..=all.len() {
            let rest: Vec<Vec<usize>> = data.batches(order, first).collect();
            assert_eq!(rest, all[first..]);
        }
    }
}
