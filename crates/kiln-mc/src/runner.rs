//! One trial: T stochastic passes of a vision tower over every image of a cached dataset.
//!
//! Passes are batched by replicating images along the batch axis: a batch of `rows` rows holds
//! `m` images × `r` passes each, image-major, so one upload of `m` images serves `m · r`
//! forward rows and the device computes full batches even when the dataset is small. The tower
//! embeds each image once and repeats it before its first dropout site. Each row's
//! dropout masks come from `(trial seed, image id, pass)` (kiln-vision's [`Draw`]), so the
//! numbers do not depend on how rows were grouped into batches.

use std::time::Instant;

use burn::tensor::backend::Backend;
use burn::tensor::{DType, FloatDType, Tensor};
use kiln_cache::{DeviceImages, Order};
use kiln_core::{Precision, computes_in, is_host_backend, on_host_pool};
use kiln_vision::{Draw, Embedder, Sample};
use serde::{Deserialize, Serialize};

use crate::McError;
use crate::experiment::TrialKey;
use crate::store::{TrialRecord, TrialStore};
use crate::welford::EmbeddingStats;

/// Where the per-image statistics are accumulated.
///
/// | backend | accumulation |
/// | --- | --- |
/// | Flex, NdArray (CPU) | `Device`: f64 tensors next to the model's |
/// | wgpu, CUDA | `Host`: each batch read back (`[rows, D]` f32), Welford in f64 on the host |
///
/// burn 0.21's fused GPU backends reject f64 inside fused kernels (CUDA computes in f64, but
/// its fusion does not), so GPUs read back; a batch's embeddings are a few hundred KB against
/// the forward pass's GFLOPs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Accumulation {
    /// Running mean and `M2` as f64 tensors on the device, merged batch by batch (Chan's update);
    /// read back once per trial.
    Device,
    /// Every batch's embeddings read back as f32 and folded in on the host (Welford, f64).
    Host,
}

impl Accumulation {
    /// `Device` on host backends that compute in f64, else `Host`.
    pub fn for_device<B: Backend>(device: &B::Device) -> Self {
        if device_accumulates::<B>(device) {
            Accumulation::Device
        } else {
            Accumulation::Host
        }
    }
}

/// Whether `device` can hold the running statistics in f64.
fn device_accumulates<B: Backend>(device: &B::Device) -> bool {
    is_host_backend::<B>(device) && computes_in::<B>(device, Precision::F64)
}

/// Seconds a trial spent in each stage, each measured between device syncs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Timings {
    /// Waiting for the next batch of images (prefetched while the previous batch computed) and
    /// naming its samples.
    pub upload: f64,
    /// Forward passes, dropout masks included.
    pub forward: f64,
    /// Folding embeddings into the statistics.
    pub accumulate: f64,
    /// Copying results to the host.
    pub readback: f64,
    /// The whole trial, start to end.
    pub wall: f64,
}

impl Timings {
    /// The share of wall time spent in forward passes.
    pub fn forward_fraction(&self) -> f64 {
        self.forward / self.wall
    }
}

impl std::ops::AddAssign for Timings {
    fn add_assign(&mut self, other: Timings) {
        self.upload += other.upload;
        self.forward += other.forward;
        self.accumulate += other.accumulate;
        self.readback += other.readback;
        self.wall += other.wall;
    }
}

/// Every pass's embedding of every image, `[images, passes, dims]` row-major (f32, as the model
/// gave them).
#[derive(Debug, Clone, PartialEq)]
pub struct PassFeatures {
    /// Images.
    pub images: usize,
    /// Passes per image.
    pub passes: usize,
    /// Embedding dimensions.
    pub dims: usize,
    /// The values.
    pub values: Vec<f32>,
}

/// What one trial produced.
#[derive(Debug, Clone)]
pub struct Trial {
    /// Per image, mean and variance of the embedding over the trial's passes.
    pub stats: EmbeddingStats,
    /// Every pass's embeddings, when asked for ([`TrialRunner::collect_pass_features`]).
    pub features: Option<PassFeatures>,
    /// Where the time went.
    pub timings: Timings,
}

/// Runs trials of a model (any [`Embedder`]: a [`kiln_vision::VisionModel`], holding any tower)
/// over a dataset bound to its device.
///
/// ```no_run
/// use burn::backend::Flex;
/// use kiln_cache::{ImageCache, ImageSource, Preprocess, Residency};
/// use kiln_mc::{TrialRunner, trial_seed};
/// use kiln_core::{Policy, Precision};
/// use kiln_vision::{DropoutSites, VisionModel};
///
/// let device = Default::default();
/// let model = VisionModel::<Flex>::from_hf_dir("clip-vit-base-patch32", &device, &Policy::full())?
///     .with_dropout(DropoutSites::all(0.1))?;
/// let images = ImageCache::new(ImageCache::default_dir())
///     .load(&ImageSource::Folder("images/".into()), &Preprocess::clip(224))?;
/// let feed = images.to_device::<Flex>(&device, Precision::F32, Residency::Host);
/// let runner = TrialRunner::new(&model, &feed).batch(64);
/// let trial = runner.run(16, trial_seed(0, "clip_b32", 16, 0), &mut |_rows| {})?;
/// println!("uncertainty of image 0: {}", trial.stats.uncertainty()[0]);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct TrialRunner<'a, B: Backend> {
    model: &'a dyn Embedder<B>,
    feed: &'a DeviceImages<B>,
    device: B::Device,
    rows: usize,
    accumulation: Accumulation,
    collect: bool,
}

impl<'a, B: Backend> TrialRunner<'a, B> {
    /// A runner of `model` (with its Monte-Carlo dropout sites set) over `feed`: 32 rows a batch,
    /// accumulation as [`Accumulation::for_device`] picks.
    pub fn new(model: &'a dyn Embedder<B>, feed: &'a DeviceImages<B>) -> Self {
        let device = feed.device().clone();
        TrialRunner {
            model,
            feed,
            accumulation: Accumulation::for_device::<B>(&device),
            device,
            rows: 32,
            collect: false,
        }
    }

    /// Rows (image passes) per forward batch (at least 1).
    pub fn batch(mut self, rows: usize) -> Self {
        self.rows = rows.max(1);
        self
    }

    /// Where to accumulate; `Device` needs a host backend that computes in f64.
    pub fn accumulation(mut self, accumulation: Accumulation) -> Self {
        self.accumulation = accumulation;
        self
    }

    /// Also keep every pass's embeddings (read back batch by batch).
    pub fn collect_pass_features(mut self, collect: bool) -> Self {
        self.collect = collect;
        self
    }

    /// Runs trial `key` of the store's experiment (seeded as the experiment says) and stores it
    /// there, with every pass's embeddings when they are collected.
    pub fn run_into(
        &self,
        store: &TrialStore,
        key: &TrialKey,
        progress: &mut dyn FnMut(u64),
    ) -> Result<TrialRecord, McError> {
        let experiment = store.experiment();
        if experiment.images != self.feed.images().len() {
            return Err(McError::Plan(format!(
                "the experiment is over {} images, the dataset has {}",
                experiment.images,
                self.feed.images().len()
            )));
        }
        let seed = experiment.seed_of(key);
        let trial = self.run(key.passes, seed, progress)?;
        let record = TrialRecord {
            key: key.clone(),
            seed,
            stats: trial.stats,
            timings: trial.timings,
        };
        store.save(&record, trial.features.as_ref())?;
        Ok(record)
    }

    /// One trial of `passes` stochastic passes over every image, masks drawn from `seed`;
    /// `progress` hears the number of rows (image passes) each batch completed.
    pub fn run(
        &self,
        passes: u32,
        seed: u64,
        progress: &mut dyn FnMut(u64),
    ) -> Result<Trial, McError> {
        let images = self.feed.images();
        if passes == 0 {
            return Err(McError::Plan("a trial needs at least one pass".into()));
        }
        if images.frames() != 1 {
            return Err(McError::Plan(format!(
                "the dataset holds clips of {} frames; Monte-Carlo trials run over images",
                images.frames()
            )));
        }
        if self.accumulation == Accumulation::Device && !device_accumulates::<B>(&self.device) {
            return Err(McError::Plan(format!(
                "{} cannot accumulate in f64 on the device (see `Accumulation`): accumulate on \
                 the host",
                B::name(&self.device)
            )));
        }
        let start = Instant::now();
        let plan = BlockPlan::new(passes, self.rows);
        let mut timings = Timings::default();
        let mut accumulator: Option<Accumulator<B>> = None;
        let mut features: Option<PassFeatures> = None;
        let mut clock = Clock::<B>::new(&self.device)?;
        for batch in self.feed.batches(plan.images_per_batch, Order::Sequential) {
            let first = batch.indices[0];
            let count = batch.indices.len();
            timings.upload += clock.lap()?;
            for chunk in &plan.pass_chunks {
                let r = chunk.len();
                let draw = Draw {
                    seed,
                    rows: batch
                        .indices
                        .iter()
                        .flat_map(|&item| {
                            chunk.clone().map(move |pass| Sample {
                                item: item as u64,
                                pass: u64::from(pass),
                            })
                        })
                        .collect(),
                };
                timings.upload += clock.lap()?;
                // On host backends, driven from one of rayon's threads, which then shares each
                // operation's work instead of waiting beside the pool (see `on_host_pool`).
                let pixels = batch.pixels.clone();
                let embeddings =
                    on_host_pool::<B, _>(&self.device, || self.model.embed_sampled(pixels, &draw))?;
                timings.forward += clock.lap()?;
                let dims = embeddings.dims()[1];
                let accumulator = accumulator.get_or_insert_with(|| {
                    Accumulator::new(self.accumulation, images.len(), dims, &self.device)
                });
                let host_rows = if self.collect || self.accumulation == Accumulation::Host {
                    let values = embeddings
                        .clone()
                        .cast(FloatDType::F32)
                        .into_data()
                        .to_vec::<f32>()
                        .map_err(|e| McError::Device(format!("{e:?}")))?;
                    timings.readback += clock.lap()?;
                    Some(values)
                } else {
                    None
                };
                if let Some(values) = &host_rows
                    && self.collect
                {
                    let features = features.get_or_insert_with(|| PassFeatures {
                        images: images.len(),
                        passes: passes as usize,
                        dims,
                        values: vec![0.0; images.len() * passes as usize * dims],
                    });
                    store_features(features, first, chunk.start as usize, r, values);
                }
                accumulator.add(first, count, r, embeddings, host_rows.as_deref())?;
                timings.accumulate += clock.lap()?;
                progress((count * r) as u64);
            }
        }
        let accumulator = accumulator.expect("a dataset has at least one image");
        let stats = accumulator.finish()?;
        timings.readback += clock.lap()?;
        timings.wall = start.elapsed().as_secs_f64();
        Ok(Trial {
            stats,
            features,
            timings,
        })
    }
}

/// Rows (image passes) per forward batch for a tower on `device`: 64 on host backends (larger
/// batches gain nothing there); on an accelerator with `memory` bytes, as many rows of `per_row`
/// bytes of activations (kiln-vision's `VisionConfig::activation_bytes`) as fit in half of what
/// `reserved` bytes (the model, a resident dataset) leave, a multiple of 8 from 8 to 1024; 128
/// when the memory is unknown.
///
/// ```
/// use burn::backend::Flex;
/// assert_eq!(kiln_mc::batch_rows::<Flex>(&Default::default(), 3 << 20, None, 0), 64);
/// ```
pub fn batch_rows<B: Backend>(
    device: &B::Device,
    per_row: u64,
    memory: Option<u64>,
    reserved: u64,
) -> usize {
    if is_host_backend::<B>(device) {
        return 64;
    }
    let Some(memory) = memory else {
        return 128;
    };
    let free = (memory / 2).saturating_sub(reserved);
    ((free / per_row.max(1)) as usize).clamp(8, 1024) / 8 * 8
}

/// How a trial's rows are grouped: `images_per_batch` images × each of `pass_chunks`.
#[derive(Debug, PartialEq)]
struct BlockPlan {
    images_per_batch: usize,
    pass_chunks: Vec<std::ops::Range<u32>>,
}

impl BlockPlan {
    /// Every pass of several images per batch when `passes ≤ rows`; else one image per batch,
    /// its passes split into near-equal chunks of at most `rows`.
    fn new(passes: u32, rows: usize) -> Self {
        let passes_usize = passes as usize;
        if passes_usize <= rows {
            return BlockPlan {
                images_per_batch: rows / passes_usize,
                pass_chunks: std::iter::once(0..passes).collect(),
            };
        }
        let chunks = passes_usize.div_ceil(rows);
        let size = passes_usize.div_ceil(chunks) as u32;
        BlockPlan {
            images_per_batch: 1,
            pass_chunks: (0..passes)
                .step_by(size as usize)
                .map(|start| start..(start + size).min(passes))
                .collect(),
        }
    }
}

/// Copies a block's rows (`count` images from `first` × passes `pass0 .. pass0 + r`, image-major)
/// into their places.
fn store_features(features: &mut PassFeatures, first: usize, pass0: usize, r: usize, rows: &[f32]) {
    let dims = features.dims;
    for (row, values) in rows.chunks_exact(dims).enumerate() {
        let (image, pass) = (first + row / r, pass0 + row % r);
        let at = (image * features.passes + pass) * dims;
        features.values[at..at + dims].copy_from_slice(values);
    }
}

/// Measures the time between device syncs.
struct Clock<'d, B: Backend> {
    device: &'d B::Device,
    last: Instant,
}

impl<'d, B: Backend> Clock<'d, B> {
    fn new(device: &'d B::Device) -> Result<Self, McError> {
        sync::<B>(device)?;
        Ok(Clock {
            device,
            last: Instant::now(),
        })
    }

    /// Seconds since the last lap, once the device has finished what was queued.
    fn lap(&mut self) -> Result<f64, McError> {
        sync::<B>(self.device)?;
        let now = Instant::now();
        let seconds = (now - self.last).as_secs_f64();
        self.last = now;
        Ok(seconds)
    }
}

fn sync<B: Backend>(device: &B::Device) -> Result<(), McError> {
    B::sync(device).map_err(|e| McError::Device(format!("{e:?}")))
}

/// The per-image statistics while a trial runs.
enum Accumulator<B: Backend> {
    Host(EmbeddingStats),
    Device(DeviceStats<B>),
}

impl<B: Backend> Accumulator<B> {
    fn new(accumulation: Accumulation, images: usize, dims: usize, device: &B::Device) -> Self {
        match accumulation {
            Accumulation::Host => Accumulator::Host(EmbeddingStats::new(images, dims)),
            Accumulation::Device => Accumulator::Device(DeviceStats::new(images, dims, device)),
        }
    }

    /// Folds in a block: `count` images from `first`, `r` passes each, image-major rows
    /// `embeddings` (with their host copy where one was read back).
    fn add(
        &mut self,
        first: usize,
        count: usize,
        r: usize,
        embeddings: Tensor<B, 2>,
        host_rows: Option<&[f32]>,
    ) -> Result<(), McError> {
        match self {
            Accumulator::Host(stats) => {
                let items: Vec<usize> = (first..first + count)
                    .flat_map(|image| std::iter::repeat_n(image, r))
                    .collect();
                stats.add_pass(
                    &items,
                    host_rows.expect("host accumulation reads rows back"),
                )
            }
            Accumulator::Device(stats) => {
                stats.add(first, count, r, embeddings);
                Ok(())
            }
        }
    }

    fn finish(self) -> Result<EmbeddingStats, McError> {
        match self {
            Accumulator::Host(stats) => Ok(stats),
            Accumulator::Device(stats) => stats.read(),
        }
    }
}

/// Running per-image mean and `M2` as f64 tensors on the device; the pass counts on the host (all
/// images of a block have seen the same passes).
struct DeviceStats<B: Backend> {
    count: Vec<u64>,
    mean: Tensor<B, 2>,
    m2: Tensor<B, 2>,
}

impl<B: Backend> DeviceStats<B> {
    fn new(images: usize, dims: usize, device: &B::Device) -> Self {
        let zeros = || Tensor::zeros([images, dims], (device, DType::F64));
        DeviceStats {
            count: vec![0; images],
            mean: zeros(),
            m2: zeros(),
        }
    }

    /// Chan's update of images `first .. first + count` with a block of `r` passes each.
    fn add(&mut self, first: usize, count: usize, r: usize, embeddings: Tensor<B, 2>) {
        let dims = embeddings.dims()[1];
        let x = embeddings.cast(FloatDType::F64).reshape([count, r, dims]);
        let block_mean = x.clone().mean_dim(1);
        let block_m2 = (x - block_mean.clone())
            .powi_scalar(2)
            .sum_dim(1)
            .reshape([count, dims]);
        let block_mean = block_mean.reshape([count, dims]);
        let span = first..first + count;
        let seen = self.count[first];
        debug_assert!(self.count[span.clone()].iter().all(|&c| c == seen));
        let (a, b) = (seen as f64, r as f64);
        let (mean, m2) = if seen == 0 {
            (block_mean, block_m2)
        } else {
            let old_mean = self.mean.clone().slice([span.clone()]);
            let old_m2 = self.m2.clone().slice([span.clone()]);
            let delta = block_mean - old_mean.clone();
            let n = a + b;
            (
                old_mean + delta.clone() * (b / n),
                old_m2 + block_m2 + delta.powi_scalar(2) * (a * b / n),
            )
        };
        self.mean = self.mean.clone().slice_assign([span.clone()], mean);
        self.m2 = self.m2.clone().slice_assign([span.clone()], m2);
        for c in &mut self.count[span] {
            *c += r as u64;
        }
    }

    fn read(self) -> Result<EmbeddingStats, McError> {
        let read = |x: Tensor<B, 2>| {
            x.into_data()
                .to_vec::<f64>()
                .map_err(|e| McError::Device(format!("{e:?}")))
        };
        let dims = self.mean.dims()[1];
        EmbeddingStats::from_moments(dims, self.count, read(self.mean)?, read(self.m2)?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_fill_batches_and_split_long_trials_evenly() {
        assert_eq!(
            BlockPlan::new(16, 64),
            BlockPlan {
                images_per_batch: 4,
                pass_chunks: std::iter::once(0..16).collect()
            }
        );
        assert_eq!(BlockPlan::new(5, 32).images_per_batch, 6);
        let long = BlockPlan::new(100, 32);
        assert_eq!(long.images_per_batch, 1);
        assert_eq!(long.pass_chunks, vec![0..25, 25..50, 50..75, 75..100]);
        assert_eq!(BlockPlan::new(33, 32).pass_chunks, vec![0..17, 17..33]);
        assert_eq!(BlockPlan::new(7, 1).pass_chunks.len(), 7);
    }
}
