//! Feeding a cached dataset to a device, batch after batch, pass after pass: from a tensor
//! resident on the device, or streamed from the host with background threads preparing the next
//! batches while the device computes. The same batches serve inference (in order) and training
//! (shuffled, from a seed: the same seed and epoch give the same order on every run and with any
//! number of workers).
//!
//! ```no_run
//! use burn::backend::Flex;
//! use kiln_cache::{ImageCache, ImageSource, Order, Preprocess, Residency};
//! use kiln_core::Precision;
//!
//! let images = ImageCache::new(ImageCache::default_dir())
//!     .load(&ImageSource::Folder("images/".into()), &Preprocess::clip(224))?;
//! let device = Default::default();
//! // Flex is a host backend: the plan streams (and says why).
//! let plan = images.plan_residency::<Flex>(&device, Precision::F32, 600 << 20, None, None);
//! eprintln!("{plan}");
//! let feed = images.to_device::<Flex>(&device, Precision::F32, plan.residency);
//! for epoch in 0..3 {
//!     for batch in feed.batches(32, Order::Shuffled { seed: 7, epoch }) {
//!         let (indices, pixels) = (batch.indices, batch.pixels); // [32, 3, 224, 224]
//!     }
//! }
//! # Ok::<(), kiln_cache::CacheError>(())
//! ```

use std::sync::Arc;

use burn::tensor::backend::Backend;
use burn::tensor::{Int, Tensor, TensorData};
use kiln_core::{Order, Precision, Prefetch};

use crate::images::CachedImages;
use crate::residency::Residency;
use crate::upload::{HostBatch, normalise_on_device, normalises_on_host};

/// One batch: which items, and their frames on the device (`[n·T, 3, H, W]`, or where clips
/// vary in length `[Σ frames, 3, H, W]`; normalised, in the feed's precision).
#[derive(Debug, Clone)]
pub struct Batch<B: Backend> {
    /// The items in the batch, in order.
    pub indices: Vec<usize>,
    /// Each item's frames (1 for images).
    pub frames: Vec<usize>,
    /// Their pixels, item after item.
    pub pixels: Tensor<B, 4>,
}

/// A cached dataset bound to a device and a precision, resident there or streamed from the host.
#[derive(Debug)]
pub struct DeviceImages<B: Backend> {
    images: CachedImages,
    device: B::Device,
    precision: Precision,
    resident: Option<Resident<B>>,
    workers: usize,
    prefetch: usize,
}

/// The dataset on the device, every frame of every item one after another, `[frames, 3, H, W]`.
#[derive(Debug)]
enum Resident<B: Backend> {
    /// Normalised, in the feed's precision.
    Normalised(Tensor<B, 4>),
    /// 8-bit, normalised batch by batch on the device.
    Bytes(Tensor<B, 4, Int>),
}

impl CachedImages {
    /// Binds the dataset to `device` in `precision`. With [`Residency::Device`] every frame is
    /// uploaded now, once (as u8 where the device stores u8 and the pixels are 8-bit, else
    /// normalised in `precision`); with [`Residency::Host`] batches are streamed.
    pub fn to_device<B: Backend>(
        &self,
        device: &B::Device,
        precision: Precision,
        residency: Residency,
    ) -> DeviceImages<B> {
        let resident = (residency == Residency::Device).then(|| {
            let all: Vec<usize> = (0..self.len()).collect();
            match self.host_batch(&all, normalises_on_host::<B>(device)) {
                HostBatch::Bytes(bytes, shape) => Resident::Bytes(Tensor::from_data(
                    TensorData::new(bytes, shape),
                    (device, burn::tensor::DType::U8),
                )),
                values => Resident::Normalised(values.upload(
                    self.preprocess().affine(),
                    device,
                    precision,
                )),
            }
        });
        DeviceImages {
            images: self.clone(),
            device: device.clone(),
            precision,
            resident,
            workers: 2,
            prefetch: 2,
        }
    }
}

impl<B: Backend> DeviceImages<B> {
    /// Background threads preparing streamed batches (default 2; at least 1).
    pub fn workers(mut self, workers: usize) -> Self {
        self.workers = workers.max(1);
        self
    }

    /// Batches each streaming thread may hold ready (default 2; at least 1).
    pub fn prefetch(mut self, batches: usize) -> Self {
        self.prefetch = batches.max(1);
        self
    }

    /// Where the dataset lives.
    pub fn residency(&self) -> Residency {
        match self.resident {
            Some(_) => Residency::Device,
            None => Residency::Host,
        }
    }

    /// The precision the batches come in.
    pub fn precision(&self) -> Precision {
        self.precision
    }

    /// The device the batches go to.
    pub fn device(&self) -> &B::Device {
        &self.device
    }

    /// The dataset.
    pub fn images(&self) -> &CachedImages {
        &self.images
    }

    /// One pass over the dataset in `order`, `batch_size` items a batch (the last one may be
    /// smaller; a batch size of 0 is taken as 1).
    pub fn batches(&self, batch_size: usize, order: Order) -> Batches<'_, B> {
        self.batches_from(batch_size, order, 0)
    }

    /// The same pass from batch `first` on (a resumed training epoch): the batches before it
    /// are neither read nor uploaded.
    pub fn batches_from(&self, batch_size: usize, order: Order, first: usize) -> Batches<'_, B> {
        let batch_size = batch_size.max(1);
        let order = Arc::new(order.indices(self.images.len()));
        let count = order.len().div_ceil(batch_size);
        let first = first.min(count);
        let streamed = self.resident.is_none().then(|| {
            let images = self.images.clone();
            let on_host = normalises_on_host::<B>(&self.device);
            Prefetch::start(
                Arc::clone(&order),
                batch_size,
                first,
                self.workers,
                self.prefetch,
                move |chunk: &[usize]| images.host_batch(chunk, on_host),
            )
        });
        Batches {
            feed: self,
            order,
            batch_size,
            next: first,
            count,
            streamed,
        }
    }

    /// Items `indices` from the resident tensor, normalised, in the feed's precision.
    fn resident_batch(&self, resident: &Resident<B>, indices: &[usize]) -> Tensor<B, 4> {
        let rows = self.images.frame_rows(indices);
        let first = rows[0];
        let contiguous = rows
            .iter()
            .enumerate()
            .all(|(k, &row)| row == first + k as i64);
        let span = first as usize..first as usize + rows.len();
        let index =
            || Tensor::<B, 1, Int>::from_data(TensorData::from(rows.as_slice()), &self.device);
        match resident {
            Resident::Normalised(all) if contiguous => all.clone().slice([span]),
            Resident::Normalised(all) => all.clone().select(0, index()),
            Resident::Bytes(all) => {
                let bytes = if contiguous {
                    all.clone().slice([span])
                } else {
                    all.clone().select(0, index())
                };
                normalise_on_device(bytes, self.images.preprocess().affine())
                    .cast(self.precision.float_dtype())
            }
        }
    }
}

/// One pass of batches; streaming threads stop when it is dropped.
pub struct Batches<'a, B: Backend> {
    feed: &'a DeviceImages<B>,
    order: Arc<Vec<usize>>,
    batch_size: usize,
    next: usize,
    count: usize,
    streamed: Option<Prefetch<HostBatch>>,
}

impl<B: Backend> Iterator for Batches<'_, B> {
    type Item = Batch<B>;

    fn next(&mut self) -> Option<Batch<B>> {
        if self.next == self.count {
            return None;
        }
        let batch = self.next;
        self.next += 1;
        let start = batch * self.batch_size;
        let indices = self.order[start..(start + self.batch_size).min(self.order.len())].to_vec();
        let images = &self.feed.images;
        let frames = indices
            .iter()
            .map(|&i| images.frames_of(i) as usize)
            .collect();
        let pixels = match (&self.feed.resident, &mut self.streamed) {
            (Some(resident), _) => self.feed.resident_batch(resident, &indices),
            (None, Some(streamed)) => streamed.next().expect("a batch per chunk").upload(
                self.feed.images.preprocess().affine(),
                &self.feed.device,
                self.feed.precision,
            ),
            (None, None) => unreachable!("a streamed feed prefetches"),
        };
        Some(Batch {
            indices,
            frames,
            pixels,
        })
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let left = self.count - self.next;
        (left, Some(left))
    }
}

impl<B: Backend> ExactSizeIterator for Batches<'_, B> {}
