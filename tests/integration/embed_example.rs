//! The `embed` example end to end on the committed tiny checkpoints: `--images` goes through
//! kiln-cache and `--save-pixels` writes exactly what the cache uploads; `--pixels` gives
//! transformers' embeddings. Runs the example binary that `cargo test` builds beside the tests.

use std::path::Path;
use std::process::Command;

use burn::backend::Flex;
use kiln::cache::{ImageCache, ImageSource, Preprocess};
use kiln::core::{Policy, Precision};
use kiln::vision::VisionModel;

use crate::common;

use common::fixtures;

fn worst(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

fn embed(args: &[&str], cache: &Path) {
    let output = Command::new(common::example("embed"))
        .args(args)
        .env("KILN_CACHE_DIR", cache)
        .output()
        .expect("the embed example is built with the tests");
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
}

#[test]
fn images_go_through_the_cache_and_saved_pixels_are_what_it_uploads() {
    let (cache, out) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let model = fixtures().join("dinov2");
    let file = out.path().join("embeddings.safetensors");
    let images = fixtures().join("images");
    embed(
        &[
            "--model-dir",
            model.to_str().unwrap(),
            "--images",
            images.to_str().unwrap(),
            "--out",
            file.to_str().unwrap(),
            "--batch",
            "2",
            "--save-pixels",
        ],
        cache.path(),
    );
    // The same cache entry, read here: a hit, and the very pixels the example saved.
    let preprocess = Preprocess::from_hf_config(model.join("preprocessor_config.json")).unwrap();
    let cached = ImageCache::new(cache.path())
        .load(&ImageSource::Folder(images), &preprocess)
        .unwrap();
    assert_eq!(cached.outcome(), &kiln::cache::Outcome::Hit);
    let device = Default::default();
    let uploaded = cached
        .upload::<Flex>(0..cached.len(), &device, Precision::F32)
        .unwrap();
    let (saved, shape) = common::read_f32(&file, "pixel_values");
    assert_eq!(shape, uploaded.dims().to_vec());
    assert_eq!(saved, uploaded.clone().into_data().to_vec::<f32>().unwrap());
    let dinov2 = VisionModel::<Flex>::from_hf_dir(&model, &device, &Policy::full()).unwrap();
    let expected: Vec<f32> = dinov2.forward(uploaded).into_data().to_vec().unwrap();
    let (embeddings, shape) = common::read_f32(&file, "embeddings");
    assert_eq!(shape, [3, 40]);
    assert!(worst(&embeddings, &expected) <= 1e-5);
}

#[test]
fn pixels_give_transformers_embeddings_normalised_on_request() {
    let (cache, out) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let file = out.path().join("embeddings.safetensors");
    let reference = fixtures().join("siglip_vision.safetensors");
    embed(
        &[
            "--model-dir",
            fixtures().join("siglip_vision").to_str().unwrap(),
            "--pixels",
            reference.to_str().unwrap(),
            "--out",
            file.to_str().unwrap(),
            "--normalize",
        ],
        cache.path(),
    );
    let (pooled, _) = common::read_f32(&reference, "pooler_output");
    let normalised: Vec<f32> = pooled
        .chunks(48)
        .flat_map(|row| {
            let norm = row.iter().map(|v| v * v).sum::<f32>().sqrt();
            row.iter().map(move |v| v / norm)
        })
        .collect();
    let (embeddings, _) = common::read_f32(&file, "embeddings");
    assert!(worst(&embeddings, &normalised) <= 1e-5);
}

#[test]
fn bad_input_is_a_one_line_error_and_writes_nothing() {
    let out = tempfile::tempdir().unwrap();
    let file = out.path().join("embeddings.safetensors");
    let output = Command::new(common::example("embed"))
        .args([
            "--model-dir",
            fixtures().join("siglip2_naflex").to_str().unwrap(),
        ])
        .args(["--pixels", "/nonexistent.safetensors"])
        .args(["--out", file.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("NaFlex"), "{stderr}");
    assert!(!file.exists());
}
