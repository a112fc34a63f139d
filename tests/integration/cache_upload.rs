//! Cached images uploaded to every compiled backend: the host lookup-table path (Flex, NdArray,
//! and wgpu, which has no u8 storage) gives the processor's values, and so do whole passes fed
//! from a device-resident dataset or streamed from the host.

use burn::tensor::backend::Backend;
use burn::tensor::{FloatDType, TensorData};
use kiln::cache::{
    CachedImages, ImageCache, ImageSource, Order, Preprocess, Residency, normalize_on_device,
};
use kiln::core::{DeviceJob, DeviceSpec, Precision, resolve_half};

use crate::common;

const SHAPE: [usize; 4] = [2, 3, 5, 7];

fn pixels() -> Vec<u8> {
    (0..SHAPE.iter().product::<usize>())
        .map(|i| ((i * 37) % 256) as u8)
        .collect()
}

/// Uploads in f32, or in the device's half type (`half`: bf16, f16 or f32), and reads back.
struct Upload {
    half: bool,
}

impl DeviceJob for Upload {
    type Output = (Precision, Vec<f32>);

    fn run<B: Backend>(self, device: &B::Device) -> Self::Output {
        let precision = if self.half {
            resolve_half::<B>(device)
        } else {
            Precision::F32
        };
        let batch =
            normalize_on_device::<B>(&Preprocess::clip(5), pixels(), SHAPE, device, precision);
        let data: TensorData = batch.cast(FloatDType::F32).into_data();
        (precision, data.to_vec().unwrap())
    }
}

/// CLIP's normalisation in f64, straight from the processor's mean and std.
fn expected() -> Vec<f64> {
    let normalize = Preprocess::clip(5).normalize.unwrap();
    let plane = SHAPE[2] * SHAPE[3];
    pixels()
        .iter()
        .enumerate()
        .map(|(i, &v)| {
            let c = (i / plane) % 3;
            (v as f64 / 255.0 - normalize.mean[c] as f64) / normalize.std[c] as f64
        })
        .collect()
}

/// A shuffled pass in batches of 2 from each residency: `(residency, indices, values)` per batch.
struct Feed(CachedImages);

impl DeviceJob for Feed {
    type Output = Vec<(Residency, Vec<usize>, Vec<f32>)>;

    fn run<B: Backend>(self, device: &B::Device) -> Self::Output {
        let mut batches = Vec::new();
        for residency in [Residency::Device, Residency::Host] {
            let feed = self.0.to_device::<B>(device, Precision::F32, residency);
            for batch in feed.batches(2, Order::Shuffled { seed: 5, epoch: 2 }) {
                let values = batch.pixels.into_data().to_vec().unwrap();
                batches.push((residency, batch.indices, values));
            }
        }
        batches
    }
}

/// Five cached 6×4 images.
fn cached(cache_dir: &std::path::Path, images_dir: &std::path::Path) -> CachedImages {
    for i in 0..5u32 {
        image::RgbImage::from_fn(6, 4, |x, y| {
            image::Rgb([(40 * i + x) as u8, (9 * y) as u8, 200])
        })
        .save(images_dir.join(format!("{i}.png")))
        .unwrap();
    }
    let mut preprocess = Preprocess::clip(4);
    preprocess.resize = None;
    preprocess.center_crop = Some(kiln::cache::Crop {
        height: 4,
        width: 6,
    });
    ImageCache::new(cache_dir)
        .load(&ImageSource::Folder(images_dir.into()), &preprocess)
        .unwrap()
}

fn check_feed(device: DeviceSpec) {
    let (cache_dir, images_dir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let images = cached(cache_dir.path(), images_dir.path());
    let normalize = images.preprocess().normalize.unwrap();
    let batches = device.run(Feed(images.clone())).unwrap();
    for residency in [Residency::Device, Residency::Host] {
        let mut seen: Vec<usize> = Vec::new();
        for (_, indices, values) in batches.iter().filter(|b| b.0 == residency) {
            let expected = indices.iter().flat_map(|&i| {
                images.item(i).iter().enumerate().map(move |(k, &v)| {
                    let c = k / 24;
                    (v as f64 / 255.0 - normalize.mean[c] as f64) / normalize.std[c] as f64
                })
            });
            let worst = values
                .iter()
                .zip(expected)
                .map(|(&g, e)| (g as f64 - e).abs())
                .fold(0.0, f64::max);
            assert!(worst <= 1e-5, "{device} {residency}: {worst}");
            seen.extend(indices);
        }
        seen.sort_unstable();
        assert_eq!(seen, [0, 1, 2, 3, 4], "{device} {residency}");
    }
}

fn check(device: DeviceSpec) {
    check_feed(device);
    let expected = expected();
    let largest = expected.iter().fold(0.0, |m: f64, e| m.max(e.abs()));
    for half in [false, true] {
        let (precision, got) = device.run(Upload { half }).unwrap();
        // Normalised in f32, rounded once to `precision`: half an ulp of the largest value.
        let unit_roundoff = match precision {
            Precision::BF16 => 2f64.powi(-8),
            Precision::F16 => 2f64.powi(-11),
            _ => 1e-6,
        };
        let worst = got
            .iter()
            .zip(&expected)
            .map(|(&g, e)| (g as f64 - e).abs())
            .fold(0.0, f64::max);
        assert!(
            worst <= unit_roundoff * largest,
            "{device} {precision:?}: {worst}"
        );
    }
}

#[test]
fn cpu() {
    check(DeviceSpec::Flex);
}

#[cfg(feature = "ndarray")]
#[test]
fn ndarray() {
    check(DeviceSpec::NdArray);
}

#[cfg(feature = "wgpu")]
#[test]
fn wgpu() {
    if let Some(device) = common::vulkan("wgpu upload test") {
        check(device);
    }
}
