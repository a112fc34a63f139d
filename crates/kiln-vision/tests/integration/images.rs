//! Images in, embeddings out: decode and preprocess through kiln-cache with each checkpoint's
//! `preprocessor_config.json`, then the tower, against transformers' processor (PIL backend) and
//! model on the same files. kiln decodes JPEGs with Pillow's decoder (libjpeg-turbo) and resizes
//! as Pillow does, bit for bit, so every image's pixels are transformers' exactly and the
//! embeddings agree as closely as pixels-in parity (≤ 1e-4 relative, max |Δ| / max |ref|).
//! Measured: see the test's output and docs/PERFORMANCE.md.

use burn::backend::Flex;
use kiln_cache::{CachedImages, ImageCache, ImageSource, Preprocess};
use kiln_core::{Policy, Precision};
use kiln_vision::VisionModel;

use crate::support;

use support::{fixtures, relative};

/// Each tower fixture with the output transformers' reference holds for the images.
const TOWERS: [(&str, &str); 3] = [
    ("clip_vision", "images.image_embeds"),
    ("siglip_vision", "images.pooler_output"),
    ("dinov2", "images.pooler_output"),
];

/// The fixture images, preprocessed as the checkpoint `dir` says, through a cache in `cache`.
fn cached_images(cache: &std::path::Path, dir: &std::path::Path) -> CachedImages {
    let preprocess = Preprocess::from_hf_config(dir.join("preprocessor_config.json")).unwrap();
    ImageCache::new(cache)
        .load(&ImageSource::Folder(fixtures().join("images")), &preprocess)
        .unwrap()
}

fn reference(name: &str, key: &str) -> Vec<f32> {
    support::Reference::open(name).get(key).0
}

#[test]
fn cached_images_through_each_tower_match_transformers() {
    let cache_dir = tempfile::tempdir().unwrap();
    let device = Default::default();
    for (name, output) in TOWERS {
        let dir = fixtures().join(name);
        let images = cached_images(cache_dir.path(), &dir);
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
        // The width the model declares (for an empty batch) is transformers' output width.
        assert_eq!(
            model.embedding_width(),
            expected.len() / images.len(),
            "{name}"
        );
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

/// Under `mixed-bf16` (on a CPU with AMX or AVX512-BF16: every product's operands rounded to
/// bf16, f32 sums, the rest f32, as PyTorch's CPU autocast) each tower's embedding of each image
/// keeps its direction: cosine ≥ 0.999 to kiln's f32 embedding, to transformers' f32 one and to
/// transformers' under PyTorch's autocast (`torch.autocast("cpu", dtype=torch.bfloat16)`).
#[test]
fn mixed_bf16_embeddings_keep_their_direction() {
    use kiln_core::PolicySpec;
    use kiln_kernels::gemm::Bf16Isa;
    match Bf16Isa::chosen() {
        Some(isa) => eprintln!("bf16 products on {isa}"),
        None => eprintln!("SKIPPED (no amx_bf16 or avx512_bf16): mixed-bf16 computes in f32 here"),
    }
    let cache_dir = tempfile::tempdir().unwrap();
    let device = Default::default();
    let mixed = "mixed-bf16".parse::<PolicySpec>().unwrap();
    let mixed = mixed.resolve::<Flex>(&device).unwrap();
    let cosine = |a: &[f32], b: &[f32]| {
        let dot = |x: &[f32], y: &[f32]| -> f64 {
            x.iter()
                .zip(y)
                .map(|(&p, &q)| f64::from(p) * f64::from(q))
                .sum()
        };
        dot(a, b) / (dot(a, a) * dot(b, b)).sqrt()
    };
    for (name, output) in TOWERS {
        let dir = fixtures().join(name);
        let images = cached_images(cache_dir.path(), &dir);
        let embed = |policy: &Policy| -> Vec<f32> {
            let pixels = images
                .upload::<Flex>(0..images.len(), &device, Precision::F32)
                .unwrap();
            let model = VisionModel::<Flex>::from_hf_dir(&dir, &device, policy).unwrap();
            let embeddings = model.forward(pixels).into_data();
            embeddings.convert::<f32>().to_vec().unwrap()
        };
        let (full, half) = (embed(&Policy::full()), embed(&mixed));
        // The products really ran in bf16 where the CPU has them (not f32 under another name).
        assert_eq!(
            half != full,
            Bf16Isa::chosen().is_some(),
            "{name}: mixed-bf16 against f32"
        );
        let theirs = reference(name, output);
        let autocast = reference(name, &format!("{output}_autocast_bf16"));
        let width = full.len() / images.len();
        for (i, image) in images.names().enumerate() {
            let row = |values: &[f32]| values[i * width..][..width].to_vec();
            let to_kiln = cosine(&row(&half), &row(&full));
            let to_transformers = cosine(&row(&half), &row(&theirs));
            let to_autocast = cosine(&row(&half), &row(&autocast));
            eprintln!(
                "{name}/{image}: cosine {to_kiln:.6} to f32, {to_transformers:.6} to transformers, \
                 {to_autocast:.6} to transformers under autocast"
            );
            assert!(
                to_autocast >= 0.999,
                "{name}/{image}: cosine {to_autocast} to transformers under PyTorch's autocast"
            );
            assert!(
                to_kiln >= 0.999,
                "{name}/{image}: cosine {to_kiln} to kiln's f32"
            );
            assert!(
                to_transformers >= 0.999,
                "{name}/{image}: cosine {to_transformers} to transformers' f32"
            );
        }
    }
}
