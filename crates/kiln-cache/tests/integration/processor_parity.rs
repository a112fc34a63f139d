//! Parity with transformers' image processors (CLIP, SigLIP, BiT/DINOv2) on committed fixtures
//! made by `scripts/fixtures/processors.py`: non-square, grayscale, JPEG, RGBA, upscaled, EXIF-
//! rotated and 16-bit images. References: the PIL backend (`NAME.pil`, and `NAME.pil_u8` with
//! rescale and normalisation off) and the default torchvision backend (`NAME.torchvision`).

use std::path::{Path, PathBuf};

use burn::backend::Flex;
use kiln_cache::{DEFAULT_MAX_PIXELS, Preprocess, decode, normalize_on_device, to_chw};
use kiln_core::Precision;
use safetensors::SafeTensors;
use safetensors::tensor::TensorView;

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/processors")
}

const IMAGES: [&str; 7] = [
    "wide.png",
    "gray.png",
    "photo.jpg",
    "alpha.png",
    "small.png",
    "rotated.jpg",
    "deep.png",
];

/// The image through kiln: decoded, resized and cropped (u8, CHW), then normalised on Flex.
fn kiln(preprocess: &Preprocess, image: &str) -> (Vec<u8>, Vec<f32>, [usize; 3]) {
    let decoded = decode(&fixtures().join("images").join(image), DEFAULT_MAX_PIXELS).unwrap();
    let resized = preprocess.resize_and_crop(&decoded).unwrap();
    let (h, w) = (resized.height() as usize, resized.width() as usize);
    let chw = to_chw(&resized);
    let device = Default::default();
    let tensor = normalize_on_device::<Flex>(
        preprocess,
        chw.clone(),
        [1, 3, h, w],
        &device,
        Precision::F32,
    );
    let values = tensor.into_data().to_vec::<f32>().unwrap();
    (chw, values, [3, h, w])
}

fn reference<'a>(tensors: &'a SafeTensors<'a>, name: &str) -> (Vec<u8>, Vec<usize>) {
    let view = tensors.tensor(name).unwrap();
    (view.data().to_vec(), view.shape().to_vec())
}

fn f32s(bytes: &[u8]) -> Vec<f32> {
    bytes
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect()
}

/// Mean and max |a - b| in 0..1 pixel units: normalised differences times the channel's std.
fn pixel_error(a: &[f32], b: &[f32], std: [f32; 3]) -> (f64, f64) {
    let plane = a.len() / 3;
    let errors: Vec<f64> = a
        .iter()
        .zip(b)
        .enumerate()
        .map(|(i, (x, y))| ((x - y).abs() * std[i / plane]) as f64)
        .collect();
    let mean = errors.iter().sum::<f64>() / errors.len() as f64;
    (mean, errors.iter().cloned().fold(0.0, f64::max))
}

/// Checks every image of one processor config against both references, printing the errors.
fn check(config: &str) {
    let dir = fixtures();
    let preprocess =
        Preprocess::from_hf_config(dir.join(config).join("preprocessor_config.json")).unwrap();
    let std = preprocess.normalize.unwrap().std;
    let bytes = std::fs::read(dir.join(format!("{config}.safetensors"))).unwrap();
    let tensors = SafeTensors::deserialize(&bytes).unwrap();
    for image in IMAGES {
        let stem = image.split('.').next().unwrap();
        let (u8s, normalised, shape) = kiln(&preprocess, image);

        let (want_u8, want_shape) = reference(&tensors, &format!("{stem}.pil_u8"));
        assert_eq!(shape.as_slice(), want_shape.as_slice(), "{config}/{image}");
        let max_u8 = u8s
            .iter()
            .zip(&want_u8)
            .map(|(a, b)| a.abs_diff(*b))
            .max()
            .unwrap();
        assert_eq!(max_u8, 0, "{config}/{image}: 8-bit pixels differ");

        for backend in ["pil", "torchvision"] {
            // Where the image is smaller than the crop, transformers' backends disagree: numpy's
            // centre crop pads ceil((crop - size) / 2) before the image, torchvision's floor.
            // kiln follows the PIL backend (checked exactly above).
            if backend == "torchvision" && config == "crop" && image == "small.png" {
                continue;
            }
            let (want, _) = reference(&tensors, &format!("{stem}.{backend}"));
            let (mean, max) = pixel_error(&normalised, &f32s(&want), std);
            eprintln!(
                "{config}/{image} vs {backend}: mean {mean:.2e}, max {max:.2e}, max u8 diff {max_u8}"
            );
            assert!(
                mean <= 1.0 / 255.0,
                "{config}/{image} vs {backend}: mean |Δ| {mean} > 1/255"
            );
            if backend == "pil" {
                // Same bytes in: only the float rounding of the normalisation differs.
                assert!(max < 1e-6, "{config}/{image}: max |Δ| {max}");
            }
        }
    }
}

#[test]
fn crop_only() {
    check("crop");
}

#[test]
fn clip_processor() {
    check("clip");
}

#[test]
fn siglip_processor() {
    check("siglip");
}

#[test]
fn dinov2_bit_processor() {
    check("dinov2");
}

/// Every Pillow filter, bit for bit, on sizes that shrink, enlarge, mix the two and keep one axis
/// (`scripts/fixtures/resample.py`): full-contrast edges and noisy gradients, where fixed-point
/// rounding shows.
/// Asserts that `ours` is Pillow's image `theirs` ([H, W, 3] u8), byte for byte.
fn assert_pillows(ours: &image::RgbImage, theirs: &TensorView, what: &str) {
    let shape = [ours.height() as usize, ours.width() as usize, 3];
    assert_eq!(shape, theirs.shape(), "{what}: shape");
    let differing = ours
        .as_raw()
        .iter()
        .zip(theirs.data())
        .filter(|(a, b)| a != b)
        .count();
    assert_eq!(differing, 0, "{what}: {differing} bytes differ from Pillow");
}

#[test]
fn resize_is_pillow_bit_for_bit() {
    let bytes = std::fs::read(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/resample/pillow.safetensors"),
    )
    .unwrap();
    let tensors = SafeTensors::deserialize(&bytes).unwrap();
    let (source, shape) = reference(&tensors, "source");
    let source = image::RgbImage::from_raw(shape[1] as u32, shape[0] as u32, source).unwrap();
    let mut checked = 0;
    for (name, view) in tensors.tensors() {
        let Some((filter, size)) = name.split_once('.') else {
            continue;
        };
        let resample: kiln_cache::Resample =
            serde_json::from_value(serde_json::Value::String(filter.into())).unwrap();
        let (height, width) = (view.shape()[0] as u32, view.shape()[1] as u32);
        let preprocess = Preprocess {
            resize: Some(kiln_cache::Resize::Exact { height, width }),
            resample,
            center_crop: None,
            rescale: None,
            normalize: None,
        };
        let ours = preprocess.resize_and_crop(&source).unwrap();
        assert_pillows(&ours, &view, &format!("{filter} to {size}"));
        checked += 1;
    }
    assert_eq!(checked, 48);
}

/// JPEGs saved by Pillow in every way that changes the decoder's path (subsampling, progressive,
/// restart markers, grayscale, CMYK, quality 20 to 100; `scripts/fixtures/jpeg.py`) decode to
/// Pillow's pixels exactly.
#[test]
fn jpeg_decodes_as_pillow_bit_for_bit() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/jpeg");
    let bytes = std::fs::read(dir.join("pillow.safetensors")).unwrap();
    let tensors = SafeTensors::deserialize(&bytes).unwrap();
    for (name, view) in tensors.tensors() {
        let ours = decode(&dir.join(format!("{name}.jpg")), DEFAULT_MAX_PIXELS).unwrap();
        assert_pillows(&ours, &view, &format!("{name}.jpg"));
    }
    assert_eq!(tensors.len(), 11);
}
