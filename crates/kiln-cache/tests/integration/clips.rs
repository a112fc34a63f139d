//! Video clips: frames sampled uniformly (or one a second) from frame folders and GIFs,
//! preprocessed like images, cached as `[T, 3, H, W]`, invalidated when a frame changes;
//! normalised f16 / f32 storage.

use std::path::Path;

use burn::backend::Flex;
use burn::tensor::FloatDType;
use image::codecs::gif::GifEncoder;
use image::{Delay, Frame, RgbImage, RgbaImage};
use kiln_cache::{
    CacheError, ClipSpec, ImageCache, ImageSource, Order, Outcome, Preprocess, Residency, Stored,
    VideoSource, sample_frames, to_chw,
};
use kiln_core::Precision;

/// Frame `i` of video `video`: four flat quadrants whose colours depend on both, so any
/// mix-up of frames, videos or axes shows. Few colours, so a GIF stores them exactly.
fn frame(video: u8, i: u8, width: u32, height: u32) -> RgbImage {
    RgbImage::from_fn(width, height, |x, y| {
        let quadrant = 2 * u8::from(y >= height / 2) + u8::from(x >= width / 3);
        image::Rgb([
            40 * quadrant + 7 * i,
            200 - 11 * i - 30 * video,
            20 * video + 50 * quadrant,
        ])
    })
}

const FRAMES: u8 = 11;

/// A folder of two videos: `a/` as frame PNGs and `b.gif`, both `FRAMES` frames of 30 × 20.
fn videos() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("a")).unwrap();
    for i in 0..FRAMES {
        frame(0, i, 30, 20)
            .save(dir.path().join(format!("a/{i:03}.png")))
            .unwrap();
    }
    write_gif(&dir.path().join("b.gif"), 1, 40);
    // Not a video: ignored.
    std::fs::write(dir.path().join("notes.txt"), "").unwrap();
    dir
}

/// A GIF of `FRAMES` frames of video `video`, each shown `milliseconds`.
fn write_gif(path: &Path, video: u8, milliseconds: u32) {
    let file = std::fs::File::create(path).unwrap();
    let mut encoder = GifEncoder::new_with_speed(file, 1);
    let frames = (0..FRAMES).map(|i| {
        let rgba = RgbaImage::from_fn(30, 20, |x, y| {
            let [r, g, b] = frame(video, i, 30, 20).get_pixel(x, y).0;
            image::Rgba([r, g, b, 255])
        });
        Frame::from_parts(rgba, 0, 0, Delay::from_numer_denom_ms(milliseconds, 1))
    });
    encoder.encode_frames(frames).unwrap();
}

/// The clip kiln should store for video `video`: the sampled frames through `preprocess`.
fn expected_clip(video: u8, spec: &ClipSpec) -> Vec<u8> {
    frames_through(video, sample_frames(usize::from(FRAMES), spec.frames), spec)
}

/// Frames `picked` of video `video` through `spec`'s preprocessing.
fn frames_through(video: u8, picked: Vec<usize>, spec: &ClipSpec) -> Vec<u8> {
    picked
        .into_iter()
        .flat_map(|i| {
            let frame = frame(video, i as u8, 30, 20);
            to_chw(&spec.preprocess.resize_and_crop(&frame).unwrap())
        })
        .collect()
}

#[test]
fn frame_folders_and_gifs_become_sampled_clips_that_hit_the_cache() {
    let videos = videos();
    let cache_dir = tempfile::tempdir().unwrap();
    let cache = ImageCache::new(cache_dir.path());
    let source = VideoSource::Folder(videos.path().into());
    let spec = ClipSpec::new(4, Preprocess::siglip(16));

    let clips = cache.load_clips(&source, &spec).unwrap();
    assert_eq!(clips.outcome(), &Outcome::Built);
    assert_eq!(
        (clips.len(), clips.frames(), clips.size()),
        (2, 4, (16, 16))
    );
    assert_eq!(clips.names().collect::<Vec<_>>(), ["a", "b.gif"]);
    assert_eq!(clips.item_bytes(), 4 * 3 * 16 * 16);
    assert_eq!(clips.item(0), expected_clip(0, &spec).as_slice());
    assert_eq!(clips.item(1), expected_clip(1, &spec).as_slice());

    let again = cache.load_clips(&source, &spec).unwrap();
    assert_eq!(again.outcome(), &Outcome::Hit);

    // Other sampling, another entry.
    let eight = ClipSpec::new(8, Preprocess::siglip(16));
    assert_eq!(
        cache.load_clips(&source, &eight).unwrap().outcome(),
        &Outcome::Built
    );

    // A changed frame invalidates the entry, sampled (frame 4) or not (frame 0).
    frame(0, 3, 30, 20)
        .save(videos.path().join("a/000.png"))
        .unwrap();
    let changed = cache.load_clips(&source, &spec).unwrap();
    assert_eq!(changed.outcome(), &Outcome::Built);
    assert!(changed.item(0) == clips.item(0), "frame 0 is not sampled");
    frame(0, 7, 30, 20)
        .save(videos.path().join("a/004.png"))
        .unwrap();
    let changed = cache.load_clips(&source, &spec).unwrap();
    assert_eq!(changed.outcome(), &Outcome::Built);
    assert!(changed.item(0) != clips.item(0), "frame 4 is sampled");

    // Uploads: frames for per-frame encoders, or clips.
    let device = Default::default();
    let frames = changed
        .upload::<Flex>(0..2, &device, Precision::F32)
        .unwrap();
    assert_eq!(frames.dims(), [8, 3, 16, 16]);
    let clips5 = changed
        .upload_clips::<Flex>(1..2, &device, Precision::F32)
        .unwrap();
    assert_eq!(clips5.dims(), [1, 4, 3, 16, 16]);
    let first: Vec<f32> = clips5.into_data().to_vec().unwrap();
    let expected: Vec<f32> = changed
        .item(1)
        .iter()
        .map(|&v| f32::from(v) / 127.5 - 1.0)
        .collect();
    assert!(
        first
            .iter()
            .zip(&expected)
            .all(|(a, b)| (a - b).abs() < 1e-6)
    );
}

#[test]
fn bad_videos_are_named_or_skipped() {
    let videos = videos();
    std::fs::create_dir(videos.path().join("c")).unwrap();
    std::fs::write(videos.path().join("d.gif"), b"GIF89a broken").unwrap();
    let cache_dir = tempfile::tempdir().unwrap();
    let source = VideoSource::Folder(videos.path().into());
    let spec = ClipSpec::new(2, Preprocess::siglip(8));
    let err = ImageCache::new(cache_dir.path())
        .load_clips(&source, &spec)
        .unwrap_err();
    assert!(
        matches!(&err, CacheError::BadImage { path, .. } if path.ends_with("c")),
        "{err}"
    );
    let clips = ImageCache::new(cache_dir.path())
        .skip_bad(true)
        .load_clips(&source, &spec)
        .unwrap();
    assert_eq!(clips.len(), 2);
    let skipped: Vec<&str> = clips.skipped().iter().map(|s| s.name.as_str()).collect();
    assert_eq!(skipped, ["c", "d.gif"]);

    let err = ImageCache::new(cache_dir.path())
        .load_clips(&source, &ClipSpec::new(0, Preprocess::siglip(8)))
        .unwrap_err();
    assert!(err.to_string().contains("at least one frame"), "{err}");
}

/// A video whose frames declare more pixels than the budget (a GIF's canvas, an MP4 track's size)
/// is refused before decoding, named, with the size; one pixel more of budget lets it through.
#[test]
fn videos_over_the_pixel_budget_are_refused() {
    let mut videos = vec![("b.gif", 30u32, 20u32)];
    if cfg!(feature = "video") {
        videos.push(("moving.mp4", 64, 48));
    }
    for (name, width, height) in videos {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(name);
        if name.ends_with(".gif") {
            write_gif(&path, 1, 40);
        } else {
            let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/video");
            std::fs::copy(fixtures.join(name), &path).unwrap();
        }
        let cache_dir = tempfile::tempdir().unwrap();
        let source = VideoSource::Folder(dir.path().into());
        let spec = ClipSpec::new(2, Preprocess::siglip(8));
        let pixels = u64::from(width * height);
        let err = ImageCache::new(cache_dir.path())
            .max_image_pixels(pixels - 1)
            .load_clips(&source, &spec)
            .unwrap_err();
        assert!(
            matches!(&err, CacheError::BadImage { path, .. } if path.ends_with(name)),
            "{err}"
        );
        let declares = format!("declares {width} × {height} pixels");
        assert!(err.to_string().contains(&declares), "{err}");
        let clips = ImageCache::new(cache_dir.path())
            .max_image_pixels(pixels)
            .load_clips(&source, &spec)
            .unwrap();
        assert_eq!(clips.len(), 1, "{name}");
    }
}

/// Without the `video` feature an MP4 is an error that says how to read it; with it, a file that
/// is no MP4 is a bad video, named, and skippable.
#[test]
fn mp4_files_need_the_video_feature_and_must_be_mp4() {
    let videos = videos();
    std::fs::write(videos.path().join("e.mp4"), b"not an mp4").unwrap();
    let cache_dir = tempfile::tempdir().unwrap();
    let source = VideoSource::Folder(videos.path().into());
    let spec = ClipSpec::new(2, Preprocess::siglip(8));
    let err = ImageCache::new(cache_dir.path())
        .load_clips(&source, &spec)
        .unwrap_err();
    assert!(err.to_string().contains("e.mp4"), "{err}");
    if cfg!(feature = "video") {
        assert!(matches!(err, CacheError::BadImage { .. }), "{err}");
    } else {
        assert!(err.to_string().contains("`video` feature"), "{err}");
    }
}

#[test]
fn normalised_storage_uploads_what_8_bit_storage_does() {
    let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/processors/images");
    let source = ImageSource::Folder(fixtures);
    let preprocess = Preprocess::clip(20);
    let cache_dir = tempfile::tempdir().unwrap();
    let device = Default::default();
    let upload = |stored: Stored| {
        let images = ImageCache::new(cache_dir.path())
            .stored(stored)
            .load(&source, &preprocess)
            .unwrap();
        assert_eq!(images.stored(), stored);
        assert_eq!(images.item_bytes(), 3 * 20 * 20 * stored.size_of());
        let batch = images.upload::<Flex>(0..images.len(), &device, Precision::F32);
        batch.unwrap().into_data().to_vec::<f32>().unwrap()
    };
    let bytes = upload(Stored::U8);
    let worst = |other: &[f32]| {
        bytes
            .iter()
            .zip(other)
            .map(|(a, b)| (a - b).abs())
            .fold(0.0, f32::max)
    };
    assert_eq!(worst(&upload(Stored::F32)), 0.0);
    // CLIP-normalised values lie within ±2.2: f16 keeps 11 bits, an error of at most 2^-10.
    let f16 = worst(&upload(Stored::F16));
    assert!(f16 > 0.0 && f16 <= 2f32.powi(-10), "{f16}");
    // Each storage is its own entry.
    let entries = format!("images-v{}", kiln_cache::FORMAT_VERSION);
    let dirs = std::fs::read_dir(cache_dir.path().join(entries))
        .unwrap()
        .filter(|e| e.as_ref().unwrap().path().is_dir())
        .count();
    assert_eq!(dirs, 3);
    // A bf16 batch from f16 storage: rounded twice, still within a bf16 ulp.
    let images = ImageCache::new(cache_dir.path())
        .stored(Stored::F16)
        .load(&source, &preprocess)
        .unwrap();
    let bf16 = images
        .upload::<Flex>(0..images.len(), &device, Precision::BF16)
        .unwrap()
        .cast(FloatDType::F32)
        .into_data()
        .to_vec::<f32>()
        .unwrap();
    assert!(worst(&bf16) <= 2f32.powi(-6), "{}", worst(&bf16));
}

/// The committed H.264 clip decoded by OpenH264 against FFmpeg's decode of the same file
/// (scripts/fixtures/video.py). The two convert YUV to RGB with their own rounding, so the match
/// is close rather than exact; each sampled frame must be nearest its own reference.
#[cfg(feature = "video")]
#[test]
fn mp4_clips_decode_as_ffmpeg_does() {
    use kiln_cache::{Resample, Resize};

    let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/video");
    let bytes = std::fs::read(fixtures.join("moving.safetensors")).unwrap();
    let reference = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let frames = reference.tensor("frames").unwrap();
    assert_eq!(frames.shape(), [12, 48, 64, 3]);
    let reference_frame = |i: usize| {
        let hwc = &frames.data()[i * 48 * 64 * 3..(i + 1) * 48 * 64 * 3];
        to_chw(&RgbImage::from_raw(64, 48, hwc.to_vec()).unwrap())
    };
    // The decoded size: nothing is resampled.
    let preprocess = Preprocess {
        resize: Some(Resize::Exact {
            height: 48,
            width: 64,
        }),
        resample: Resample::Bilinear,
        center_crop: None,
        rescale: Some(1.0 / 255.0),
        normalize: None,
    };
    let cache_dir = tempfile::tempdir().unwrap();
    let clips = ImageCache::new(cache_dir.path())
        .load_clips(
            &VideoSource::Videos(vec![fixtures.join("moving.mp4")]),
            &ClipSpec::new(4, preprocess.clone()),
        )
        .unwrap();
    let clip = clips.item(0);
    let frame_bytes = 3 * 48 * 64;
    let mean_difference = |ours: &[u8], theirs: &[u8]| {
        let total: u64 = ours
            .iter()
            .zip(theirs)
            .map(|(&a, &b)| u64::from(a.abs_diff(b)))
            .sum();
        total as f64 / ours.len() as f64
    };
    for (k, wanted) in sample_frames(12, 4).into_iter().enumerate() {
        let ours = &clip[k * frame_bytes..(k + 1) * frame_bytes];
        let own = mean_difference(ours, &reference_frame(wanted));
        assert!(own <= 2.0, "frame {wanted}: mean |d| = {own}");
        for other in (0..12).filter(|&o| o != wanted) {
            let theirs = mean_difference(ours, &reference_frame(other));
            assert!(
                theirs > own + 2.0,
                "frame {wanted} vs {other}: {theirs} vs {own}"
            );
        }
    }
    // One a second at the track's 25 fps: its 12 frames are under a second, the first alone.
    let per_second = ImageCache::new(cache_dir.path())
        .load_clips(
            &VideoSource::Videos(vec![fixtures.join("moving.mp4")]),
            &ClipSpec::per_second(4, preprocess),
        )
        .unwrap();
    assert_eq!(per_second.frames_of(0), 1);
    let first = mean_difference(per_second.item(0), &reference_frame(0));
    assert!(first <= 2.0, "{first}");
}

/// A clip that must not repeat frames refuses a video shorter than it, naming the video and its
/// frame count (or skips and lists it); one long enough caches the same pixels either way.
#[test]
fn short_videos_are_refused_when_asked() {
    let videos = tempfile::tempdir().unwrap();
    for (name, count) in [("long", 4), ("short", 3)] {
        let dir = videos.path().join(name);
        std::fs::create_dir(&dir).unwrap();
        for i in 0..count {
            let frame = image::RgbImage::from_pixel(8, 8, image::Rgb([40 * i as u8, 7, 200]));
            frame.save(dir.join(format!("{i:03}.png"))).unwrap();
        }
    }
    let cache_dir = tempfile::tempdir().unwrap();
    let source = VideoSource::Folder(videos.path().into());
    let repeat = ClipSpec::new(4, Preprocess::siglip(8));
    let refuse = repeat.clone().refusing_short_videos();
    let err = ImageCache::new(cache_dir.path())
        .load_clips(&source, &refuse)
        .unwrap_err();
    assert!(
        matches!(&err, CacheError::BadImage { path, .. } if path.ends_with("short")),
        "{err}"
    );
    assert!(
        err.to_string()
            .contains("3 frames, fewer than the 4 a clip takes"),
        "{err}"
    );
    let refused = ImageCache::new(cache_dir.path())
        .skip_bad(true)
        .load_clips(&source, &refuse)
        .unwrap();
    let skipped: Vec<&str> = refused.skipped().iter().map(|s| s.name.as_str()).collect();
    assert_eq!(skipped, ["short"]);
    // Repeating keeps the short video: a different entry, not the refusing one's.
    let repeated = ImageCache::new(cache_dir.path())
        .load_clips(&source, &repeat)
        .unwrap();
    assert_eq!((refused.len(), repeated.len()), (1, 2));
    assert_eq!(refused.item(0), repeated.item(0));
}

/// fVLM's sampling: one frame a second from the first, at most `frames`, so clips vary in
/// length; their frames stored one after another across shards, found again from a reopened
/// entry, and fed (resident or streamed) item by item with each one's frame count.
#[test]
fn clips_sampled_one_a_second_keep_their_own_lengths() {
    let videos = videos(); // a/: 11 frame images; b.gif: 11 frames at 25 fps
    write_gif(&videos.path().join("c.gif"), 2, 500); // 2 fps
    frame(3, 5, 30, 20)
        .save(videos.path().join("d.png"))
        .unwrap(); // a still image
    let cache_dir = tempfile::tempdir().unwrap();
    // About two clips a shard: items span shards.
    let cache = ImageCache::new(cache_dir.path()).shard_bytes(2 * 8 * 3 * 16 * 16);
    let source = VideoSource::Folder(videos.path().into());
    let spec = ClipSpec::per_second(8, Preprocess::siglip(16));
    let picked = [
        (0, (0..8).collect::<Vec<_>>()), // a folder's images are one a second: the first 8
        (1, vec![0]),                    // 11 frames at 25 fps: under a second
        (2, vec![0, 2, 4, 6, 8, 10]),    // 5.5 s at 2 fps
        (3, vec![5]),                    // one frame
    ];

    let built = cache.load_clips(&source, &spec).unwrap();
    assert_eq!(built.outcome(), &Outcome::Built);
    let clips = cache.load_clips(&source, &spec).unwrap();
    assert_eq!(clips.outcome(), &Outcome::Hit);
    assert!(clips.varies());
    assert_eq!((clips.len(), clips.frames()), (4, 8));
    for (video, frames) in &picked {
        let index = usize::from(*video);
        assert_eq!(
            clips.frames_of(index) as usize,
            frames.len(),
            "clip {index}"
        );
        let expected = frames_through(*video, frames.clone(), &spec);
        assert_eq!(clips.item(index), expected.as_slice(), "clip {index}");
    }
    // Uniform sampling of the same videos is another entry.
    let uniform = cache.load_clips(&source, &ClipSpec::new(8, Preprocess::siglip(16)));
    assert_eq!(uniform.unwrap().outcome(), &Outcome::Built);

    let device = Default::default();
    let frames = |indices: &[usize]| {
        let pixels = clips.upload_indices::<Flex>(indices, &device, Precision::F32);
        pixels.unwrap().into_data().to_vec::<f32>().unwrap()
    };
    assert!(
        clips
            .upload_clips::<Flex>(0..4, &device, Precision::F32)
            .is_err()
    );
    for residency in [Residency::Device, Residency::Host] {
        let feed = clips.to_device::<Flex>(&device, Precision::F32, residency);
        for batch in feed.batches(2, Order::Shuffled { seed: 3, epoch: 0 }) {
            let lengths: Vec<usize> = (batch.indices.iter()).map(|&i| picked[i].1.len()).collect();
            assert_eq!(batch.frames, lengths, "{residency:?}");
            assert_eq!(batch.pixels.dims()[0], lengths.iter().sum::<usize>());
            let pixels = batch.pixels.into_data().to_vec::<f32>().unwrap();
            assert_eq!(pixels, frames(&batch.indices), "{residency:?}");
        }
    }
}
