//! Images in, embeddings out: decode and preprocess through kiln-cache with each checkpoint's
//! `preprocessor_config.json`, then the tower, against transformers' processor (PIL backend) and
//! model on the same files. kiln decodes JPEGs with Pillow's decoder (libjpeg-turbo) and resizes
//! as Pillow does, bit for bit, so every image's pixels are transformers' exactly and the
//! embeddings agree as closely as pixels-in parity (≤ 1e-4 relative, max |Δ| / max |ref|).
//! Measured: see the test's output and docs/PERFORMANCE.md.

use burn::backend::Flex;
use kiln_cache::{ImageCache, ImageSource, Preprocess};
use kiln_core::{Policy, Precision};
use kiln_vision::VisionModel;

use crate::support;

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
        let model = VisionModel::<Flex>::from_hf_dir(&dir, &device, &Policy::full()).unwrap();
        let embeddings: Vec<f32> = model.forward(pixels).into_data().to_vec().unwrap();
        let expected = reference(name, output);
        let (plane, width) = (ours.len() / images.len(), embeddings.len() / images.len());
        for (i, image) in images.names().enumerate() {
            let pixel_error = relative(&ours[i * plane..][..plane], &theirs[i * plane..][..plane]);
            let error = relative(
                &embeddings[i * width..][..width],
                &expected[i * width..][..width],
            );
            eprintln!("{name}/{image}: pixels {pixel_error:.2e}, {output} {error:.2e}");
            // Same bytes in: only the float rounding of the normalisation differs.
            assert!(
                pixel_error < 1e-6,
                "{name}/{image}: pixels differ by {pixel_error}"
            );
            assert!(error <= 1e-4, "{name}/{image}: {output} {error}");
        }
    }
}
