//! Feeding cached datasets to a device: resident and streamed batches agree, shuffled orders are
//! seeded permutations independent of the number of workers, and the planner's decisions.

use burn::backend::Flex;
use kiln_cache::{
    CachedImages, ClipSpec, DeviceMemory, ImageCache, ImageSource, Order, Preprocess, Residency,
    ResidencyPlan, VideoSource,
};
use kiln_core::Precision;

fn images(cache_dir: &std::path::Path) -> CachedImages {
    let fixtures =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/processors/images");
    ImageCache::new(cache_dir)
        .load(&ImageSource::Folder(fixtures), &Preprocess::dinov2(20, 16))
        .unwrap()
}

/// Every batch of one pass: its indices and values.
fn pass(
    images: &CachedImages,
    residency: Residency,
    workers: usize,
    batch: usize,
    order: Order,
) -> Vec<(Vec<usize>, Vec<f32>)> {
    let device = Default::default();
    let feed = images
        .to_device::<Flex>(&device, Precision::F32, residency)
        .workers(workers);
    assert_eq!(feed.residency(), residency);
    feed.batches(batch, order)
        .map(|b| (b.indices, b.pixels.into_data().to_vec::<f32>().unwrap()))
        .collect()
}

#[test]
fn resident_and_streamed_batches_are_the_uploads_of_their_items() {
    let cache_dir = tempfile::tempdir().unwrap();
    let images = images(cache_dir.path());
    let n = images.len();
    assert_eq!(n, 7);
    let device = Default::default();
    for order in [Order::Sequential, Order::Shuffled { seed: 3, epoch: 1 }] {
        let streamed = pass(&images, Residency::Host, 2, 3, order);
        assert_eq!(streamed.len(), 3, "7 items in batches of 3");
        assert_eq!(streamed[2].0.len(), 1);
        for (indices, values) in &streamed {
            let direct = images
                .upload_indices::<Flex>(indices, &device, Precision::F32)
                .unwrap()
                .into_data()
                .to_vec::<f32>()
                .unwrap();
            assert_eq!(values, &direct);
        }
        assert_eq!(pass(&images, Residency::Device, 1, 3, order), streamed);
        assert_eq!(pass(&images, Residency::Host, 5, 3, order), streamed);
    }
}

#[test]
fn a_pass_resumed_at_a_batch_gives_the_rest_of_the_full_pass() {
    let cache_dir = tempfile::tempdir().unwrap();
    let images = images(cache_dir.path());
    let device = Default::default();
    let order = Order::Shuffled { seed: 5, epoch: 2 };
    for (residency, workers) in [
        (Residency::Host, 2),
        (Residency::Host, 3),
        (Residency::Device, 1),
    ] {
        let full = pass(&images, residency, workers, 2, order);
        let feed = images
            .to_device::<Flex>(&device, Precision::F32, residency)
            .workers(workers);
        for first in 0..=full.len() {
            let rest: Vec<_> = feed
                .batches_from(2, order, first)
                .map(|b| (b.indices, b.pixels.into_data().to_vec::<f32>().unwrap()))
                .collect();
            assert_eq!(
                rest,
                full[first..],
                "{residency:?}, {workers} workers, from {first}"
            );
        }
    }
}

#[test]
fn shuffled_orders_are_seeded_permutations_per_epoch() {
    let order = |seed, epoch| Order::Shuffled { seed, epoch }.indices(50);
    let first = order(7, 0);
    assert_eq!(first, order(7, 0));
    let mut sorted = first.clone();
    sorted.sort_unstable();
    assert_eq!(sorted, (0..50).collect::<Vec<_>>());
    assert_ne!(first, sorted);
    assert_ne!(first, order(7, 1));
    assert_ne!(first, order(8, 0));
    assert_eq!(Order::Sequential.indices(4), [0, 1, 2, 3]);
}

#[test]
fn clips_feed_their_frames_and_an_abandoned_pass_stops_its_threads() {
    let dir = tempfile::tempdir().unwrap();
    for video in 0..5u8 {
        let folder = dir.path().join(format!("v{video}"));
        std::fs::create_dir(&folder).unwrap();
        for i in 0..3u8 {
            image::RgbImage::from_pixel(12, 10, image::Rgb([40 * video, 60 * i, 9]))
                .save(folder.join(format!("{i}.png")))
                .unwrap();
        }
    }
    let cache_dir = tempfile::tempdir().unwrap();
    let clips = ImageCache::new(cache_dir.path())
        .load_clips(
            &VideoSource::Folder(dir.path().into()),
            &ClipSpec::new(2, Preprocess::siglip(8)),
        )
        .unwrap();
    let order = Order::Shuffled { seed: 1, epoch: 0 };
    let streamed = pass(&clips, Residency::Host, 2, 2, order);
    assert_eq!(pass(&clips, Residency::Device, 1, 2, order), streamed);
    // Two clips of two frames of 3 × 8 × 8 per batch.
    assert_eq!(streamed[0].1.len(), 2 * 2 * 3 * 64);
    // Frame 0 of clip v3 (sampled frame 0 of 3), red channel: 120 / 127.5 - 1.
    let clip = 2 * 3 * 64;
    let red = streamed
        .iter()
        .find_map(|(indices, values)| {
            let k = indices.iter().position(|&i| i == 3)?;
            Some(values[k * clip])
        })
        .expect("clip 3 is in a batch");
    assert!((red - (120.0 / 127.5 - 1.0)).abs() < 1e-6, "{red}");

    // Taking one batch of a streamed pass and dropping it must not hang.
    let device = Default::default();
    let feed = clips
        .to_device::<Flex>(&device, Precision::F32, Residency::Host)
        .prefetch(1);
    let first = feed.batches(1, Order::Sequential).next().unwrap();
    assert_eq!(first.indices, [0]);
}

#[test]
fn the_planner_keeps_what_fits_on_the_device_and_says_why() {
    const GIB: u64 = 1 << 30;
    let eight = DeviceMemory::Bytes(8 * GIB);
    let fits = ResidencyPlan::decide(GIB, 2 * GIB, eight, None);
    assert_eq!(fits.residency, Residency::Device);
    assert!(
        fits.to_string().contains("fit in 70% of 8.00 GiB"),
        "{fits}"
    );
    // 5 + 1 GiB > 70% of 8 GiB.
    let streamed = ResidencyPlan::decide(5 * GIB, GIB, eight, None);
    assert_eq!(streamed.residency, Residency::Host);
    assert!(streamed.to_string().contains("streamed"), "{streamed}");
    let unknown = ResidencyPlan::decide(GIB, GIB, DeviceMemory::Unknown, None);
    assert_eq!(unknown.residency, Residency::Host);
    assert!(
        unknown.to_string().contains("--residency device"),
        "{unknown}"
    );
    let host = ResidencyPlan::decide(GIB, GIB, DeviceMemory::Host, None);
    assert_eq!(host.residency, Residency::Host);
    assert!(host.to_string().contains("host backend"), "{host}");
    let forced = ResidencyPlan::decide(GIB, GIB, DeviceMemory::Unknown, Some(Residency::Device));
    assert_eq!(forced.residency, Residency::Device);
    assert!(forced.to_string().contains("chosen with --residency"));
    assert_eq!("HOST".parse::<Residency>().unwrap(), Residency::Host);
    assert!("gpu".parse::<Residency>().is_err());

    // On Flex the resident dataset is normalised f32: 4 bytes a value.
    let cache_dir = tempfile::tempdir().unwrap();
    let images = images(cache_dir.path());
    let device = Default::default();
    let bytes = images.resident_bytes::<Flex>(&device, Precision::F32);
    assert_eq!(bytes, 7 * 3 * 16 * 16 * 4);
    let plan = images.plan_residency::<Flex>(&device, Precision::BF16, 0, Some(GIB), None);
    assert_eq!(
        (plan.residency, plan.device_memory, plan.dataset_bytes),
        (Residency::Host, DeviceMemory::Host, bytes / 2)
    );
}
