//! Images in, embeddings out: decode and preprocess through kiln-cache with each checkpoint's
//! `preprocessor_config.json`, then the tower, against transformers' processor (PIL backend) and
//! model on the same files. The pixels differ where resampling rounds differently (a few levels
//! at some pixels of these tiny images); the check is that they agree on average to about one
//! level and that the tower does not amplify what differs: the embeddings' relative error stays
//! below the pixels'. Measured: see the test's output and docs/PERFORMANCE.md.

use std::path::PathBuf;

use burn::backend::Flex;
use kiln_cache::{ImageCache, ImageSource, Preprocess};
use kiln_precision::{Policy, Precision};
use kiln_vision::VisionModel;

fn fixtures() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures")
}

fn reference(name: &str, key: &str) -> Vec<f32> {
    let bytes = std::fs::read(fixtures().join(format!("{name}.safetensors"))).unwrap();
    let tensors = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let view = tensors.tensor(key).unwrap();
    view.data()
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect()
}

fn relative(ours: &[f32], expected: &[f32]) -> f32 {
    assert_eq!(ours.len(), expected.len());
    let worst = ours
        .iter()
        .zip(expected)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0, f32::max);
    worst / expected.iter().fold(0.0, |m: f32, v| m.max(v.abs()))
}

#[test]
fn cached_images_through_each_tower_match_transformers() {
    let cache_dir = tempfile::tempdir().unwrap();
    let device = Default::default();
    for (name, output) in [
        ("clip_vision", "images.image_embeds"),
        ("siglip_vision", "images.pooler_output"),
        ("dinov2", "images.pooler_output"),
    ] {
        let dir = fixtures().join(name);
        let preprocess = Preprocess::from_hf_config(dir.join("preprocessor_config.json")).unwrap();
        let images = ImageCache::new(cache_dir.path())
            .load(&ImageSource::Folder(fixtures().join("images")), &preprocess)
            .unwrap();
        assert_eq!(
            images.names().collect::<Vec<_>>(),
            ["gray.png", "photo.jpg", "wide.png"]
        );
        let pixels = images
            .upload::<Flex>(0..images.len(), &device, Precision::F32)
            .unwrap();
        let ours: Vec<f32> = pixels.clone().into_data().to_vec().unwrap();
        let theirs = reference(name, "images.pixel_values");
        let pixel_error = relative(&ours, &theirs);
        let mean = ours
            .iter()
            .zip(&theirs)
            .map(|(a, b)| (a - b).abs())
            .sum::<f32>()
            / ours.len() as f32;
        let model = VisionModel::<Flex>::from_hf_dir(&dir, &device, &Policy::full()).unwrap();
        let embeddings: Vec<f32> = model.forward(pixels).into_data().to_vec().unwrap();
        let error = relative(&embeddings, &reference(name, output));
        eprintln!("{name}: pixels max {pixel_error:.2e} mean |Δ| {mean:.2e}, {output} {error:.2e}");
        // One 8-bit level is 1/255 ≈ 0.004 in 0..1, 0.008 to 0.017 after normalisation.
        assert!(mean <= 0.01, "{name}: pixels differ by {mean} on average");
        assert!(error <= pixel_error, "{name}: {error} > {pixel_error}");
    }
}
