//! Labelled images for classification (feature `images`): kiln-cache's decode-once image feeds,
//! resident on the device or streamed by background threads that prepare the next batches
//! while the device computes.

use burn::tensor::backend::Backend;
use burn::tensor::{Int, Tensor, TensorData};
use kiln_cache::DeviceImages;
use kiln_core::Order;

use crate::TrainError;
use crate::data::Loader;

/// Images with a class label each: a batch is `pixels` `[n, 3, H, W]` (normalised) and `labels`
/// `[n]`.
#[derive(Debug, Clone)]
pub struct ImageBatch<B: Backend> {
    /// Normalised pixels.
    pub pixels: Tensor<B, 4>,
    /// Class indices.
    pub labels: Tensor<B, 1, Int>,
}

/// A kiln-cache feed with a label per image, in batches of a fixed size.
#[derive(Debug)]
pub struct LabelledImages<B: Backend> {
    feed: DeviceImages<B>,
    labels: Vec<i64>,
    batch_size: usize,
}

impl<B: Backend> LabelledImages<B> {
    /// `labels[i]` is the class of the feed's image `i`.
    pub fn new(
        feed: DeviceImages<B>,
        labels: Vec<i64>,
        batch_size: usize,
    ) -> Result<Self, TrainError> {
        if labels.len() != feed.images().len() {
            return Err(TrainError::Data(format!(
                "{} labels for {} images",
                labels.len(),
                feed.images().len()
            )));
        }
        if batch_size == 0 {
            return Err(TrainError::Config(
                "the batch size must be at least 1".into(),
            ));
        }
        Ok(LabelledImages {
            feed,
            labels,
            batch_size,
        })
    }

    /// Images in the dataset.
    pub fn len(&self) -> usize {
        self.labels.len()
    }

    /// Whether the dataset is empty.
    pub fn is_empty(&self) -> bool {
        self.labels.is_empty()
    }
}

impl<B: Backend> Loader for LabelledImages<B> {
    type Batch = ImageBatch<B>;

    fn batches_per_epoch(&self) -> usize {
        self.labels.len().div_ceil(self.batch_size)
    }

    fn sizes(&self) -> Option<(usize, usize)> {
        Some((self.labels.len(), self.batch_size))
    }

    fn batches(&self, order: Order, first: usize) -> Box<dyn Iterator<Item = ImageBatch<B>> + '_> {
        Box::new(
            self.feed
                .batches_from(self.batch_size, order, first)
                .map(|batch| {
                    let labels: Vec<i64> = batch.indices.iter().map(|&i| self.labels[i]).collect();
                    ImageBatch {
                        pixels: batch.pixels,
                        labels: Tensor::from_data(
                            TensorData::new(labels, [batch.indices.len()]),
                            self.feed.device(),
                        ),
                    }
                }),
        )
    }
}
