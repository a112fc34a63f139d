//! kiln-cache: images/s of a cold build (decode + resize + crop + store) against a warm hit
//! (hash the sources, verify and map the stored pixels), the upload of a normalised batch, and a
//! whole pass of batches fed from a device-resident dataset or streamed from the host.
//!
//! ```text
//! cargo bench --bench cache
//! KILN_DEVICE=vulkan cargo bench --features wgpu --bench cache
//! ```
//!
//! The images are generated once per run: 64 PNGs of 500×375 (the size of a typical photo
//! dataset), preprocessed as CLIP does at 224 px.

mod common;

use std::hint::black_box;
use std::path::Path;
use std::time::{Duration, Instant};

use criterion::{BatchSize, Criterion, Throughput};
use kiln::burn::tensor::backend::Backend;
use kiln::cache::{CachedImages, ImageCache, ImageSource, Order, Preprocess, Residency};
use kiln::core::{DeviceJob, Precision};

const IMAGES: usize = 64;
const BATCH: usize = 32;

/// Writes `IMAGES` smooth-plus-noise 500×375 PNGs into `dir`.
fn write_images(dir: &Path) {
    let mut state = 0x9e37_79b9_u32;
    for i in 0..IMAGES {
        let image = image::RgbImage::from_fn(500, 375, |x, y| {
            state ^= state << 13;
            state ^= state >> 17;
            state ^= state << 5;
            let noise = (state % 32) as u8;
            let base = |k: u32| ((x * k + y * (k + 1) + i as u32 * 7) % 200) as u8;
            image::Rgb([base(1) + noise, base(2) + noise, base(3) + noise])
        });
        image.save(dir.join(format!("{i:03}.png"))).unwrap();
    }
}

struct Upload<'a> {
    criterion: &'a mut Criterion,
    images: &'a CachedImages,
    device: String,
}

impl DeviceJob for Upload<'_> {
    type Output = ();

    fn run<B: Backend>(self, device: &B::Device) {
        let mut group = self
            .criterion
            .benchmark_group(format!("cache/{}", self.device));
        group.throughput(Throughput::Elements(BATCH as u64));
        group.bench_function(format!("upload/b={BATCH},224px,f32"), |b| {
            b.iter_custom(|iters| {
                B::sync(device).unwrap();
                let start = Instant::now();
                for i in 0..iters as usize {
                    // Alternate halves so no upload repeats the previous one.
                    let first = (i % 2) * BATCH;
                    let batch = self
                        .images
                        .upload::<B>(first..first + BATCH, device, Precision::F32)
                        .unwrap();
                    black_box(batch);
                }
                B::sync(device).unwrap();
                start.elapsed()
            })
        });
        group.throughput(Throughput::Elements(IMAGES as u64));
        for residency in [Residency::Device, Residency::Host] {
            let feed = self
                .images
                .to_device::<B>(device, Precision::F32, residency);
            for shuffled in [false, true] {
                let name = if shuffled { "shuffled" } else { "in order" };
                group.bench_function(
                    format!("feed/{residency},{name},b={BATCH},224px,f32"),
                    |b| {
                        b.iter_custom(|iters| {
                            B::sync(device).unwrap();
                            let start = Instant::now();
                            for epoch in 0..iters {
                                let order = if shuffled {
                                    Order::Shuffled { seed: 0, epoch }
                                } else {
                                    Order::Sequential
                                };
                                for batch in feed.batches(BATCH, order) {
                                    black_box(batch.pixels);
                                }
                            }
                            B::sync(device).unwrap();
                            start.elapsed()
                        })
                    },
                );
            }
        }
        group.finish();
    }
}

fn main() {
    let device = common::device_from_env();
    let mut criterion = Criterion::default().configure_from_args();
    let images = tempfile::tempdir().unwrap();
    write_images(images.path());
    let source = ImageSource::Folder(images.path().into());
    let preprocess = Preprocess::clip(224);

    let mut group = criterion.benchmark_group("cache");
    group
        .throughput(Throughput::Elements(IMAGES as u64))
        .sample_size(10)
        .measurement_time(Duration::from_secs(10));
    group.bench_function("cold/64x500x375-png->224", |b| {
        b.iter_batched(
            || tempfile::tempdir().unwrap(),
            // The directory is returned so that deleting it falls outside the timing.
            |cache_dir| {
                let loaded = ImageCache::new(cache_dir.path()).load(&source, &preprocess);
                (black_box(loaded.unwrap()), cache_dir)
            },
            BatchSize::PerIteration,
        )
    });
    let warm_dir = tempfile::tempdir().unwrap();
    let warm = ImageCache::new(warm_dir.path());
    warm.load(&source, &preprocess).unwrap();
    group.bench_function("warm/64x500x375-png->224", |b| {
        b.iter(|| black_box(warm.load(&source, &preprocess).unwrap()))
    });
    group.finish();

    let cached = warm.load(&source, &preprocess).unwrap();
    if let Err(e) = device.run(Upload {
        criterion: &mut criterion,
        images: &cached,
        device: device.to_string(),
    }) {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
    criterion.final_summary();
}
