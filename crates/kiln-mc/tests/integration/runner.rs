//! Trials of a real (tiny, random-weight) CLIP tower over a kiln-cache dataset: deterministic
//! without dropout, accumulation on the device equal to the host's and to a two-pass computation
//! over every pass's embeddings, batching and reruns that change nothing, and experiments that
//! resume and shard into the same summary as one uninterrupted run.

use std::path::Path;
use std::sync::Mutex;

use burn::backend::Flex;
use burn::tensor::backend::Backend;
use kiln_cache::{CachedImages, DeviceImages, ImageCache, ImageSource, Preprocess, Residency};
use kiln_core::Precision;
use kiln_mc::{
    Accumulation, EmbeddingStats, Experiment, Shard, SummaryRow, TrialRunner, TrialStore,
    collect_trials, summarize,
};
use kiln_vision::{ClipVisionConfig, DropoutSites, VisionModel};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

const IMAGES: usize = 5;

/// `count` noisy 40 × 48 PNGs (different noise levels, so their uncertainties differ), cached for
/// a 32-pixel CLIP processor.
fn dataset(dir: &Path, count: usize) -> CachedImages {
    let images = dir.join("images");
    std::fs::create_dir_all(&images).unwrap();
    let mut rng = ChaCha8Rng::seed_from_u64(11);
    for i in 0..count {
        let noise = 10.0 + 40.0 * i as f64;
        let picture = image::RgbImage::from_fn(48, 40, |x, y| {
            let base = [(x * 5) as f64, (y * 6) as f64, ((x + y) * 3) as f64];
            image::Rgb(base.map(|b| (b + rng.random_range(-noise..noise)).clamp(0.0, 255.0) as u8))
        });
        picture.save(images.join(format!("{i:02}.png"))).unwrap();
    }
    ImageCache::new(dir.join("cache"))
        .load(&ImageSource::Folder(images), &Preprocess::clip(32))
        .unwrap()
}

/// A CLIP tower of the released architecture at toy size, random weights drawn from a fixed seed
/// (one test at a time seeds burn's generator and draws from it).
fn model(dropout: f64) -> VisionModel<Flex> {
    static DRAWING: Mutex<()> = Mutex::new(());
    let _one_at_a_time = DRAWING
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    let device = Default::default();
    Flex::seed(&device, 2026);
    let config = ClipVisionConfig {
        hidden_size: 24,
        intermediate_size: 40,
        num_hidden_layers: 2,
        num_attention_heads: 2,
        image_size: 32,
        patch_size: 8,
        projection_dim: 16,
        ..ClipVisionConfig::vit_base_patch32()
    };
    VisionModel::new(config.init(&device))
        .with_dropout(DropoutSites::all(dropout))
        .unwrap()
}

fn feed(images: &CachedImages) -> DeviceImages<Flex> {
    images.to_device::<Flex>(&Default::default(), Precision::F32, Residency::Host)
}

/// Largest |a − b| relative to max |b|.
fn relative(a: &[f64], b: &[f64]) -> f64 {
    assert_eq!(a.len(), b.len());
    let worst = a
        .iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f64::max);
    worst / b.iter().fold(0.0, |m: f64, v| m.max(v.abs()))
}

#[test]
fn without_dropout_every_pass_is_identical_and_every_variance_zero() {
    let dir = tempfile::tempdir().unwrap();
    let images = dataset(dir.path(), IMAGES);
    let (model, feed) = (model(0.0), feed(&images));
    let trial = TrialRunner::new(&model, &feed)
        .batch(8)
        .collect_pass_features(true)
        .run(6, 1, &mut |_| {})
        .unwrap();
    let features = trial.features.unwrap();
    let dims = features.dims;
    for image in 0..IMAGES {
        let passes = &features.values[image * 6 * dims..(image + 1) * 6 * dims];
        assert!(
            passes.chunks(dims).all(|p| p == &passes[..dims]),
            "image {image}"
        );
    }
    assert!(trial.stats.variances().iter().all(|&v| v == 0.0));
    assert!(trial.stats.counts().iter().all(|&c| c == 6));
}

#[test]
fn device_and_host_accumulation_equal_a_two_pass_computation() {
    let dir = tempfile::tempdir().unwrap();
    let images = dataset(dir.path(), IMAGES);
    let (model, feed) = (model(0.2), feed(&images));
    // 7 rows a batch: 2 images of 3 passes each, so images meet several batches' statistics.
    let run = |accumulation| {
        TrialRunner::new(&model, &feed)
            .batch(7)
            .accumulation(accumulation)
            .collect_pass_features(true)
            .run(3, 42, &mut |_| {})
            .unwrap()
    };
    let (device, host) = (run(Accumulation::Device), run(Accumulation::Host));
    let features = device.features.unwrap();
    assert_eq!(
        Some(&features),
        host.features.as_ref(),
        "same seed, same passes"
    );
    // Two-pass f64 reference from every pass's embeddings.
    let (passes, dims) = (features.passes, features.dims);
    let (mut mean, mut variance) = (Vec::new(), Vec::new());
    for image in 0..IMAGES {
        for d in 0..dims {
            let xs: Vec<f64> = (0..passes)
                .map(|p| f64::from(features.values[(image * passes + p) * dims + d]))
                .collect();
            let m = xs.iter().sum::<f64>() / passes as f64;
            mean.push(m);
            variance.push(xs.iter().map(|x| (x - m).powi(2)).sum::<f64>() / (passes - 1) as f64);
        }
    }
    for stats in [&device.stats, &host.stats] {
        assert!(relative(stats.means(), &mean) < 1e-12);
        assert!(relative(&stats.variances(), &variance) < 1e-12);
    }
    assert!(
        variance.iter().all(|&v| v > 0.0),
        "dropout 0.2 varies every dimension"
    );
}

#[test]
fn batching_does_not_change_a_trial_and_seeds_do() {
    let dir = tempfile::tempdir().unwrap();
    let images = dataset(dir.path(), IMAGES);
    let (model, feed) = (model(0.1), feed(&images));
    let run = |rows, passes, seed| -> EmbeddingStats {
        TrialRunner::new(&model, &feed)
            .batch(rows)
            .run(passes, seed, &mut |_| {})
            .unwrap()
            .stats
    };
    // One image's passes split over several batches, or several images' passes in one.
    let (split, whole) = (run(3, 8, 5), run(40, 8, 5));
    assert!(relative(split.means(), whole.means()) < 1e-5);
    assert!(relative(&split.variances(), &whole.variances()) < 1e-4);
    assert_eq!(run(40, 8, 5), whole, "a rerun reproduces the trial");
    assert!(relative(run(40, 8, 6).means(), whole.means()) > 1e-4);
}

fn experiment(images: &CachedImages) -> Experiment {
    Experiment {
        models: vec!["tiny_clip".into()],
        passes: vec![2, 16],
        trials: 3,
        seed: 9,
        dropout: DropoutSites::all(0.1).to_string(),
        dataset: images.dir().display().to_string(),
        images: images.len(),
        weights: vec!["random init in this test".into()],
        precision: "full".into(),
    }
}

/// The statistics of `rows` (timings differ between runs).
fn statistics(rows: &[SummaryRow]) -> Vec<(String, u32, [f64; 4])> {
    rows.iter()
        .map(|r| {
            let stats = [
                r.mean_variance,
                r.uncertainty,
                r.uncertainty_spread,
                r.rank_stability,
            ];
            (r.model.clone(), r.passes, stats)
        })
        .collect()
}

#[test]
fn a_resumed_run_and_merged_shards_summarise_as_one_run() {
    let dir = tempfile::tempdir().unwrap();
    let images = dataset(dir.path(), IMAGES);
    let (model, feed) = (model(0.1), feed(&images));
    let runner = TrialRunner::new(&model, &feed).batch(6);
    let experiment = experiment(&images);
    let run_all = |out: &Path, shard: Shard, limit: usize| {
        let store = TrialStore::create_or_resume(out, &experiment).unwrap();
        for key in store
            .pending(shard.select(experiment.trial_keys()))
            .unwrap()
            .iter()
            .take(limit)
        {
            runner.run_into(&store, key, &mut |_| {}).unwrap();
        }
        store
    };
    let summary = |stores: &[TrialStore]| {
        let (records, missing) = collect_trials(&experiment, stores).unwrap();
        assert!(missing.is_empty(), "{missing:?}");
        statistics(&summarize(&experiment, &records).unwrap())
    };
    let single = summary(&[run_all(&dir.path().join("single"), Shard::ALL, usize::MAX)]);

    // Stopped after 2 of 6 trials, then started again.
    let resumed_dir = dir.path().join("resumed");
    let partial = run_all(&resumed_dir, Shard::ALL, 2);
    let (_, missing) = collect_trials(&experiment, &[partial]).unwrap();
    assert_eq!(missing.len(), 4);
    let resumed = run_all(&resumed_dir, Shard::ALL, usize::MAX);
    assert_eq!(summary(&[resumed]), single);

    let halves: Vec<TrialStore> = (1..=2)
        .map(|i| {
            run_all(
                &dir.path().join(format!("shard{i}")),
                Shard { index: i, count: 2 },
                usize::MAX,
            )
        })
        .collect();
    assert_eq!(summary(&halves), single);

    // Another experiment cannot resume into the directory.
    let other = Experiment {
        seed: 10,
        ..experiment.clone()
    };
    let err = TrialStore::create_or_resume(&resumed_dir, &other)
        .unwrap_err()
        .to_string();
    assert!(err.contains("differs in seed"), "{err}");
    let rows = summarize(
        &experiment,
        &collect_trials(&experiment, &[TrialStore::open(&resumed_dir).unwrap()])
            .unwrap()
            .0,
    )
    .unwrap();
    // More passes, a steadier mean: the between-trial variance falls with T (as 1/T, 8× from
    // T = 2 to 16; 3 trials estimate it loosely, so only the direction is asserted).
    assert!(rows[1].mean_variance < rows[0].mean_variance, "{rows:?}");
}
