//! The loop kiln replaces, kept to measure against: what the Python original did for every
//! pass — open, decode and preprocess every image file again, then run the images of one pass
//! in batches. Same masks as [`crate::TrialRunner`] (each row's come from its image and pass),
//! so both give the same statistics; only the time differs.

use burn::tensor::FloatDType;
use burn::tensor::backend::Backend;
use kiln_cache::{Preprocess, SourceFile, decode, normalize_on_device, to_chw};
use kiln_core::Precision;
use kiln_vision::{Draw, Embedder};

use crate::McError;
use crate::welford::EmbeddingStats;

/// One trial the naive way: for each of `passes` passes, every file of `files` decoded and
/// preprocessed from disk, `batch` images per forward, each batch read back and folded into the
/// statistics on the host. Images are numbered in `files` order, as the cache numbers them.
#[allow(clippy::too_many_arguments)]
pub fn naive_trial<B: Backend>(
    model: &dyn Embedder<B>,
    files: &[SourceFile],
    preprocess: &Preprocess,
    passes: u32,
    seed: u64,
    batch: usize,
    device: &B::Device,
    precision: Precision,
) -> Result<EmbeddingStats, McError> {
    let mut stats: Option<EmbeddingStats> = None;
    for pass in 0..u64::from(passes) {
        for (index, chunk) in files.chunks(batch.max(1)).enumerate() {
            let first = index * batch.max(1);
            let (mut bytes, mut shape) = (Vec::new(), [chunk.len(), 3, 0, 0]);
            for file in chunk {
                // The cache decoded these files under the run's pixel budget already.
                let image = preprocess.resize_and_crop(&decode(&file.path, u64::MAX)?)?;
                shape[2] = image.height() as usize;
                shape[3] = image.width() as usize;
                bytes.extend(to_chw(&image));
            }
            let pixels = normalize_on_device::<B>(preprocess, bytes, shape, device, precision);
            let draw = Draw::pass(seed, pass, (first..first + chunk.len()).map(|i| i as u64));
            let values = model
                .embed_sampled(pixels, &draw)?
                .cast(FloatDType::F32)
                .into_data()
                .to_vec::<f32>()
                .map_err(|e| McError::Device(format!("{e:?}")))?;
            let dims = values.len() / chunk.len();
            let stats = stats.get_or_insert_with(|| EmbeddingStats::new(files.len(), dims));
            let items: Vec<usize> = (first..first + chunk.len()).collect();
            stats.add_pass(&items, &values)?;
        }
    }
    stats.ok_or_else(|| McError::Plan("a trial needs at least one pass and one image".into()))
}
