//! The cache's life cycle: a hit after the first build, invalidation by a changed source, config
//! or format version, corruption detected and rebuilt, concurrent fills, bad images.

use std::path::{Path, PathBuf};

use burn::backend::Flex;
use kiln_cache::{
    CacheError, DEFAULT_MAX_PIXELS, ImageCache, ImageSource, Outcome, Preprocess, decode, to_chw,
};
use kiln_core::Precision;

/// A folder with copies of the committed PNG fixtures (JPEG decoding is covered by the parity
/// tests).
fn image_folder() -> tempfile::TempDir {
    let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/processors/images");
    let dir = tempfile::tempdir().unwrap();
    for name in ["wide.png", "gray.png", "alpha.png", "small.png", "deep.png"] {
        std::fs::copy(fixtures.join(name), dir.path().join(name)).unwrap();
    }
    dir
}

fn shard(entry: &Path) -> PathBuf {
    entry.join("shard-00000.safetensors")
}

#[test]
fn a_second_load_hits_and_returns_the_same_pixels() {
    let images = image_folder();
    let cache_dir = tempfile::tempdir().unwrap();
    let cache = ImageCache::new(cache_dir.path());
    let source = ImageSource::Folder(images.path().into());
    let preprocess = Preprocess::clip(24);

    let first = cache.load(&source, &preprocess).unwrap();
    assert_eq!(first.outcome(), &Outcome::Built);
    assert_eq!((first.len(), first.size()), (5, (24, 24)));
    let names: Vec<&str> = first.names().collect();
    assert_eq!(
        names,
        ["alpha.png", "deep.png", "gray.png", "small.png", "wide.png"]
    );

    let second = cache.load(&source, &preprocess).unwrap();
    assert_eq!(second.outcome(), &Outcome::Hit);
    for i in 0..5 {
        assert_eq!(first.item(i), second.item(i));
    }
    // What is stored is what decode + preprocess produce.
    let direct = preprocess
        .resize_and_crop(&decode(&images.path().join("gray.png"), DEFAULT_MAX_PIXELS).unwrap())
        .unwrap();
    assert_eq!(second.item(2), to_chw(&direct).as_slice());
}

#[test]
fn a_changed_source_or_config_builds_a_new_entry() {
    let images = image_folder();
    let cache_dir = tempfile::tempdir().unwrap();
    let cache = ImageCache::new(cache_dir.path());
    let source = ImageSource::Folder(images.path().into());
    let before = cache.load(&source, &Preprocess::clip(24)).unwrap();

    // Same name, other content.
    std::fs::copy(
        images.path().join("wide.png"),
        images.path().join("gray.png"),
    )
    .unwrap();
    let changed = cache.load(&source, &Preprocess::clip(24)).unwrap();
    assert_eq!(changed.outcome(), &Outcome::Built);
    assert_ne!(changed.dir(), before.dir());
    assert_eq!(
        changed.item(2),
        changed.item(4),
        "gray.png is now a copy of wide.png"
    );

    let other_config = cache.load(&source, &Preprocess::siglip(24)).unwrap();
    assert_eq!(other_config.outcome(), &Outcome::Built);
    let mut bicubic = Preprocess::siglip(24);
    bicubic.resample = kiln_cache::Resample::Bicubic;
    assert_eq!(
        cache.load(&source, &bicubic).unwrap().outcome(),
        &Outcome::Built
    );
    assert_eq!(
        cache
            .load(&source, &Preprocess::siglip(24))
            .unwrap()
            .outcome(),
        &Outcome::Hit
    );
}

/// Rewrites a field of an entry's manifest.
fn edit_manifest(entry: &Path, edit: impl Fn(&mut serde_json::Value)) {
    let path = entry.join("manifest.json");
    let mut manifest: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    edit(&mut manifest);
    std::fs::write(path, manifest.to_string()).unwrap();
}

#[test]
fn stale_and_damaged_entries_are_rebuilt_never_used() {
    let images = image_folder();
    let cache_dir = tempfile::tempdir().unwrap();
    let cache = ImageCache::new(cache_dir.path());
    let source = ImageSource::Folder(images.path().into());
    let preprocess = Preprocess::dinov2(28, 24);
    let good = cache.load(&source, &preprocess).unwrap();
    let entry = good.dir().to_path_buf();
    let pixels: Vec<u8> = good.item(0).to_vec();
    drop(good);

    let rebuilt = |why: &str| {
        let again = cache.load(&source, &preprocess).unwrap();
        match again.outcome() {
            Outcome::Rebuilt(reason) => assert!(reason.contains(why), "{reason}"),
            other => panic!("expected a rebuild ({why}), got {other:?}"),
        }
        assert_eq!(again.item(0), pixels.as_slice());
    };

    // An entry written by another format version.
    edit_manifest(&entry, |m| m["format"] = 0.into());
    rebuilt("format version 0");

    // One flipped pixel byte.
    let mut bytes = std::fs::read(shard(&entry)).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 0xff;
    std::fs::write(shard(&entry), &bytes).unwrap();
    rebuilt("checksum");

    // A truncated shard.
    let bytes = std::fs::read(shard(&entry)).unwrap();
    std::fs::write(shard(&entry), &bytes[..bytes.len() / 2]).unwrap();
    rebuilt("not a safetensors file");

    // An unreadable manifest.
    std::fs::write(entry.join("manifest.json"), "{").unwrap();
    rebuilt("unreadable manifest");

    assert_eq!(
        cache.load(&source, &preprocess).unwrap().outcome(),
        &Outcome::Hit
    );
}

#[test]
fn concurrent_fills_build_once_and_agree() {
    let images = image_folder();
    let cache_dir = tempfile::tempdir().unwrap();
    let source = ImageSource::Folder(images.path().into());
    let preprocess = Preprocess::clip(24);
    let loads: Vec<_> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..4)
            .map(|_| {
                scope.spawn(|| {
                    let images = ImageCache::new(cache_dir.path())
                        .load(&source, &preprocess)
                        .unwrap();
                    (images.outcome().clone(), images.item(3).to_vec())
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let built = loads.iter().filter(|(o, _)| *o == Outcome::Built).count();
    assert_eq!(built, 1, "{loads:?}");
    assert!(loads.iter().all(|(_, pixels)| *pixels == loads[0].1));
    // One entry, no temporary directories left behind.
    let root = cache_dir
        .path()
        .join(format!("images-v{}", kiln_cache::FORMAT_VERSION));
    let dirs: Vec<_> = std::fs::read_dir(root)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| !n.ends_with(".lock"))
        .collect();
    assert_eq!(dirs.len(), 1, "{dirs:?}");
}

#[test]
fn bad_images_are_named_or_skipped_and_nothing_cached_is_lost() {
    let images = image_folder();
    let cache_dir = tempfile::tempdir().unwrap();
    let cache = ImageCache::new(cache_dir.path());
    let source = ImageSource::Folder(images.path().into());
    let preprocess = Preprocess::clip(24);
    let good = cache.load(&source, &preprocess).unwrap();
    let good_dir = good.dir().to_path_buf();

    std::fs::write(
        images.path().join("broken.png"),
        b"\x89PNG\r\n\x1a\nnot really",
    )
    .unwrap();
    let err = cache.load(&source, &preprocess).unwrap_err();
    assert!(
        matches!(&err, CacheError::BadImage { path, .. } if path.ends_with("broken.png")),
        "{err}"
    );
    // The earlier entry is intact.
    assert!(good_dir.join("manifest.json").exists());

    let skipping = ImageCache::new(cache_dir.path()).skip_bad(true);
    let loaded = skipping.load(&source, &preprocess).unwrap();
    assert_eq!(loaded.len(), 5);
    assert_eq!(loaded.skipped().len(), 1);
    assert_eq!(loaded.skipped()[0].name, "broken.png");
    // The same entry without skip_bad reports the bad file instead of hiding it.
    let err = cache.load(&source, &preprocess).unwrap_err().to_string();
    assert!(err.contains("broken.png"), "{err}");
}

/// An image declaring more pixels than the budget is a bad image named before decoding (a
/// decompression bomb allocates nothing); a larger budget lets it through.
#[test]
fn images_over_the_pixel_budget_are_refused_before_decoding() {
    let images = image_folder();
    let cache_dir = tempfile::tempdir().unwrap();
    let source = ImageSource::Folder(images.path().into());
    let (width, height) = image::image_dimensions(images.path().join("wide.png")).unwrap();
    let budget = u64::from(width) * u64::from(height) - 1;
    let tight = ImageCache::new(cache_dir.path()).max_image_pixels(budget);
    let err = tight.load(&source, &Preprocess::clip(24)).unwrap_err();
    let message = err.to_string();
    assert!(
        matches!(&err, CacheError::BadImage { path, .. } if path.ends_with("wide.png")),
        "{message}"
    );
    assert!(
        message.contains(&format!("declares {width} × {height} pixels")),
        "{message}"
    );
    let roomy = ImageCache::new(cache_dir.path()).max_image_pixels(budget + 1);
    assert_eq!(roomy.load(&source, &Preprocess::clip(24)).unwrap().len(), 5);
}

#[test]
fn variable_sizes_and_empty_folders_are_explained() {
    let cache_dir = tempfile::tempdir().unwrap();
    let cache = ImageCache::new(cache_dir.path());
    let empty = tempfile::tempdir().unwrap();
    let err = cache
        .load(
            &ImageSource::Folder(empty.path().into()),
            &Preprocess::clip(24),
        )
        .unwrap_err();
    assert!(matches!(err, CacheError::NoImages { .. }), "{err}");
    let mut no_crop = Preprocess::clip(24);
    no_crop.center_crop = None;
    let err = cache
        .load(&ImageSource::Folder(empty.path().into()), &no_crop)
        .unwrap_err();
    assert!(matches!(err, CacheError::VariableSize), "{err}");
}

#[test]
fn shards_split_large_sets_and_uploads_normalise_on_the_device() {
    let images = image_folder();
    let cache_dir = tempfile::tempdir().unwrap();
    let preprocess = Preprocess::siglip(16);
    // Two images per shard: shards of 2, 2 and 1.
    let cache = ImageCache::new(cache_dir.path()).shard_bytes(2 * 3 * 16 * 16);
    let loaded = cache
        .load(&ImageSource::Folder(images.path().into()), &preprocess)
        .unwrap();
    assert!(loaded.dir().join("shard-00002.safetensors").exists());
    let device = Default::default();
    let batch = loaded
        .upload::<Flex>(1..4, &device, Precision::F32)
        .unwrap();
    assert_eq!(batch.dims(), [3, 3, 16, 16]);
    let values = batch.into_data().to_vec::<f32>().unwrap();
    // SigLIP: x / 127.5 - 1.
    let expected: Vec<f32> = (1..4)
        .flat_map(|i| loaded.item(i).iter().map(|&v| v as f32 / 127.5 - 1.0))
        .collect();
    let worst = values
        .iter()
        .zip(&expected)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0, f32::max);
    assert!(worst < 1e-6, "{worst}");
    // bf16: normalised in f32, rounded once: within half a bf16 ulp on [-1, 1].
    let half = loaded
        .upload::<Flex>(1..4, &device, Precision::BF16)
        .unwrap();
    let half = half
        .cast(burn::tensor::FloatDType::F32)
        .into_data()
        .to_vec::<f32>()
        .unwrap();
    let worst = half
        .iter()
        .zip(&expected)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0, f32::max);
    assert!(worst <= 2f32.powi(-9), "{worst}");
    let err = loaded
        .upload::<Flex>(4..6, &device, Precision::F32)
        .unwrap_err();
    assert!(err.to_string().contains("the dataset has 5"), "{err}");
}
