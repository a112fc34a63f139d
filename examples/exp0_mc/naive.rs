//! `--naive`: the loop the Python original ran, on the same trials, timed next to the cached run.

use std::time::Instant;

use burn::tensor::backend::Backend;
use indicatif::{ProgressBar, ProgressStyle};
use kiln::burn;
use kiln::cache::ImageSource;
use kiln::core::Policy;
use kiln::mc::{TrialKey, TrialRecord, TrialStore, naive_trial};
use serde_json::json;

use crate::Args;
use crate::models::Loaded;
use crate::report::Clock;

/// The loop the Python original ran, on the same trials: every pass decodes and preprocesses
/// every image from disk and runs it in batches of images (one pass per batch). Returns its time
/// next to the cached run's and the largest difference between their statistics.
pub fn run_naive<B: Backend>(
    args: &Args,
    models: &[Loaded<'_, B>],
    keys: &[TrialKey],
    (store, clock, device, policy): (&TrialStore, &Clock, &B::Device, &Policy),
) -> Result<serde_json::Value, String> {
    let images_dir = args
        .images
        .clone()
        .unwrap_or_else(|| args.out.join("images"));
    let files = ImageSource::Folder(images_dir)
        .files()
        .map_err(|e| e.to_string())?;
    let bar = ProgressBar::new(keys.len() as u64).with_style(
        ProgressStyle::with_template("naive  {bar:30} {pos}/{len} trials [{elapsed_precise}]")
            .expect("a valid template"),
    );
    let (mut naive_wall, mut cached_wall, mut worst) = (0.0, clock.cache, 0.0f64);
    for key in keys {
        let Loaded {
            spec, model, rows, ..
        } = Loaded::of(models, &key.model);
        let seed = store.experiment().seed_of(key);
        let start = Instant::now();
        let stats = naive_trial(
            model,
            &files,
            &spec.preprocess,
            key.passes,
            seed,
            *rows,
            device,
            policy.compute,
        )
        .map_err(|e| format!("naive trial {key}: {e}"))?;
        naive_wall += start.elapsed().as_secs_f64();
        let record: TrialRecord = store.load(key).map_err(|e| e.to_string())?;
        cached_wall += record.timings.wall;
        worst = worst.max(relative(stats.means(), record.stats.means()));
        bar.inc(1);
    }
    bar.finish();
    let speedup = naive_wall / cached_wall;
    eprintln!(
        "naive loop: {naive_wall:.1} s, cached and batched: {cached_wall:.1} s (cache build \
         included): {speedup:.1}× faster; mean embeddings agree to {worst:.1e} (relative)"
    );
    Ok(json!({
        "naive_wall_s": naive_wall,
        "cached_wall_s": cached_wall,
        "speedup": speedup,
        "max_relative_difference_of_means": worst,
    }))
}

/// max |a − b| / max |b|.
fn relative(a: &[f64], b: &[f64]) -> f64 {
    let worst = a
        .iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f64::max);
    worst / b.iter().fold(f64::MIN_POSITIVE, |m, v| m.max(v.abs()))
}
