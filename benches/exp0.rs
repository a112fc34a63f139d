//! The main job's efficiency on Flex: the share of a warm-cache exp0 run's wall time spent in
//! forward passes (target ≥ 95%), and how much faster it is than the loop it replaces (decode
//! and preprocess every image on every pass, one pass per batch), on the same trials.
//!
//! ```text
//! cargo bench --bench exp0
//! ```
//!
//! CLIP ViT-B/32 (random weights, dropout 0.1 at every site) over 16 generated 256 × 256 PNGs,
//! T = 4 and 8, 2 trials each, 64 rows a batch; about two minutes on 2 cores.

use std::time::Instant;

use burn::backend::Flex;
use kiln::burn;
use kiln::cache::{ImageCache, ImageSource, Preprocess, Residency};
use kiln::core::Precision;
use kiln::mc::{Experiment, Timings, TrialRunner, demo_images, naive_trial};
use kiln::vision::{DropoutSites, Preset, VisionModel};

const IMAGES: usize = 16;
const ROWS: usize = 64;

fn main() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let images = dir.path().join("images");
    demo_images(&images, IMAGES).expect("images written");
    let source = ImageSource::Folder(images);
    let preprocess = Preprocess::clip(224);
    let cache = ImageCache::new(dir.path().join("cache"));
    cache.load(&source, &preprocess).expect("cache built"); // cold: not timed

    let device = Default::default();
    let preset = Preset::named("clip-b32").expect("a preset");
    let model = VisionModel::<Flex>::from_config(&preset.config, &device)
        .with_dropout(DropoutSites::all(0.1))
        .expect("a valid rate");
    let experiment = Experiment {
        models: vec!["clip-b32".into()],
        passes: vec![4, 8],
        trials: 2,
        seed: 0,
        dropout: "0.1".into(),
        dataset: "demo".into(),
        images: IMAGES,
        weights: vec!["random".into()],
        precision: "full".into(),
    };

    // Warm cache: open the stored entry, keep it normalised in memory, run every trial.
    let start = Instant::now();
    let cached = cache.load(&source, &preprocess).expect("cache hit");
    let feed = cached.to_device::<Flex>(&device, Precision::F32, Residency::Device);
    let runner = TrialRunner::new(&model, &feed).batch(ROWS);
    let mut timings = Timings::default();
    for key in experiment.trial_keys() {
        let trial = runner
            .run(key.passes, experiment.seed_of(&key), &mut |_| {})
            .expect("a trial");
        timings += trial.timings;
    }
    let cached_wall = start.elapsed().as_secs_f64();

    let files = source.files().expect("the images");
    let start = Instant::now();
    for key in experiment.trial_keys() {
        let seed = experiment.seed_of(&key);
        naive_trial(
            &model,
            &files,
            &preprocess,
            key.passes,
            seed,
            ROWS,
            &device,
            Precision::F32,
        )
        .expect("a naive trial");
    }
    let naive_wall = start.elapsed().as_secs_f64();

    let rows = experiment
        .trial_keys()
        .iter()
        .map(|k| k.passes as usize * IMAGES)
        .sum::<usize>();
    println!("exp0 on Flex: clip-b32, {IMAGES} images, T = 4, 8, K = 2 ({rows} image passes)");
    println!(
        "  cached: {cached_wall:.2} s wall (forward {:.2}, upload {:.3}, accumulate {:.3}, \
         readback {:.3}): forward fraction {:.1}%",
        timings.forward,
        timings.upload,
        timings.accumulate,
        timings.readback,
        100.0 * timings.forward / cached_wall
    );
    println!(
        "  naive:  {naive_wall:.2} s wall: cached is {:.2}× faster",
        naive_wall / cached_wall
    );
}
