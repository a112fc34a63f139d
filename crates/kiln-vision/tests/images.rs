//! Images in, embeddings out: decode and preprocess through kiln-cache with each checkpoint's
//! `preprocessor_config.json`, then the tower, against transformers' processor (PIL backend) and
//! model on the same files. The pixels differ where resampling rounds differently (a few levels
//! at some pixels of these tiny images); the check is that they agree on average to about one
//! level, that the tower does not amplify what differs (the embeddings' relative error stays
//! below the pixels'), and that the embeddings are within 1e-2 (max |Δ| / max |ref|) of
//! transformers'. Measured: see the test's output and docs/PERFORMANCE.md.

use burn::backend::Flex;
use kiln_cache::{ImageCache, ImageSource, Preprocess};
use kiln_precision::{Policy, Precision};
use kiln_vision::VisionModel;

mod support;

use support::{fixtures, relative};

fn reference(name: &str, key: &str) -> Vec<f32> {
    support::Reference::open(name).get(key).0
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
        assert!(error <= 1e-2, "{name}: {output} {error}");
    }
}
