//! The `realtime` example from outside, as issue 54's contract says: its flags (`--out`,
//! `--model`, `--frames`, `--input`, `--steps`, `--budget-ms`, `--streams`, `--device`,
//! `--policy`), its outputs (the frames as PNG, `preview.gif`, `latency.png`, `summary.json` with
//! `fps`, `frame_ms` {p50, p90, p99, max}, `budget_ms`, `frames_over_budget`,
//! `peak_memory_bytes`, `forwards_per_frame`, `streams`), and bad inputs refused with clear
//! errors. Small frames (16 × 16) keep the runs short.

use std::path::Path;
use std::process::Output;

use crate::common;

fn run(out: &Path, args: &[&str]) -> Output {
    common::run_example("realtime", out, &[&["--size", "16"], args].concat())
}

fn succeeds(out: &Path, args: &[&str]) -> Output {
    common::succeeded(run(out, args), args)
}

fn fails(out: &Path, args: &[&str]) -> String {
    common::failed(run(out, args), args)
}

#[test]
fn the_unet_streams_write_the_contract_files() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("run");
    let args = [
        "--model",
        "unet",
        "--frames",
        "7",
        "--steps",
        "2",
        "--streams",
        "2",
        "--budget-ms",
        "16",
        "--device",
        "cpu",
        "--policy",
        "full",
    ];
    succeeds(&out, &args);
    let summary = common::summary(&out);
    for key in [
        "fps",
        "budget_ms",
        "frames_over_budget",
        "peak_memory_bytes",
    ] {
        assert!(summary[key].is_number(), "{key}: {summary}");
    }
    for key in ["p50", "p90", "p99", "max"] {
        let ms = summary["frame_ms"][key].as_f64().unwrap();
        assert!(ms > 0.0, "{key}: {ms}");
    }
    assert!(summary["frame_ms"]["p50"].as_f64() <= summary["frame_ms"]["max"].as_f64());
    assert_eq!(summary["forwards_per_frame"], 2);
    assert_eq!(summary["frame_loop"], "mirage");
    assert_eq!(summary["streams"], 2);
    assert_eq!(summary["budget_ms"], 16.0);
    // 7 frames: 5 of warm-up, reported apart, and 2 timed.
    assert_eq!(summary["frames_timed"], 2);
    for stream in [1, 2] {
        for frame in 1..=7 {
            let png = out.join(format!("frames/stream-{stream}/{frame:05}.png"));
            assert!(
                std::fs::read(&png).unwrap().starts_with(b"\x89PNG"),
                "{png:?}"
            );
        }
    }
    assert!(
        std::fs::read(out.join("latency.png"))
            .unwrap()
            .starts_with(b"\x89PNG")
    );
    assert!(
        std::fs::read(out.join("preview.gif"))
            .unwrap()
            .starts_with(b"GIF8")
    );
}

#[test]
fn the_live_stream_model_reads_a_folder_of_frames_resized() {
    let dir = tempfile::tempdir().unwrap();
    let frames = dir.path().join("frames");
    std::fs::create_dir(&frames).unwrap();
    for i in 0..3u8 {
        let image = image::RgbImage::from_fn(24, 20, |x, y| {
            image::Rgb([x as u8 * 9, y as u8 * 11, i * 80])
        });
        image.save(frames.join(format!("{i:03}.png"))).unwrap();
    }
    let out = dir.path().join("run");
    let input = frames.to_str().unwrap();
    let output = succeeds(&out, &["--model", "lsd", "--frames", "3", "--input", input]);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("24 × 20"),
        "no note of the resizing: {stderr}"
    );
    let summary = common::summary(&out);
    assert_eq!(summary["forwards_per_frame"], 1);
    assert!(summary["frame_loop"].is_null(), "{summary}");
    assert_eq!(summary["streams"], 1);
    assert!(out.join("frames/stream-1/00003.png").is_file());
}

#[test]
fn bad_inputs_are_clear_errors() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("run");
    let error = fails(&out, &["--steps", "0"]);
    assert!(error.contains("--steps"), "{error}");
    // Sizes have stated domains (a million streams made a million directories, then aborted;
    // 4294967360 pixels wrapped to 64 through a cast) and what they describe must fit memory.
    let sized = |args: &[&str]| common::failed(common::run_example("realtime", &out, args), args);
    let error = sized(&["--streams", "1000000"]);
    assert!(
        error.contains("must be a whole number from 1 to 256"),
        "{error}"
    );
    let error = sized(&["--size", "4294967360"]);
    assert!(
        error.contains("'--size <SIZE>': must be a whole number from 1 to 4096"),
        "{error}"
    );
    let error = sized(&["--size", "4096", "--streams", "256"]);
    assert!(
        error.contains("--streams 256 of --size 4096 frames"),
        "{error}"
    );
    assert!(error.contains("need at least"), "{error}");
    let error = sized(&["--model", "lsd", "--size", "33"]);
    assert!(
        error.contains("--size 33: the live-stream model: height = 33: a positive even number"),
        "{error}"
    );
    // --weights takes a directory: a file there is named as such.
    let file = dir.path().join("model.safetensors");
    std::fs::write(&file, b"not a directory").unwrap();
    let error = sized(&["--weights", file.to_str().unwrap()]);
    assert!(
        error.contains("--weights (a directory holding model.safetensors)")
            && error.contains("is a file, where a directory is read"),
        "{error}"
    );
    let error = sized(&["--model", "lsd", "--chain"]);
    assert!(
        error.contains("--chain: the live-stream model has one loop"),
        "{error}"
    );
    assert!(!out.exists(), "a refused run left {}", out.display());
    let empty = dir.path().join("empty");
    std::fs::create_dir(&empty).unwrap();
    let error = fails(&out, &["--input", empty.to_str().unwrap(), "--frames", "2"]);
    assert!(error.contains("empty"), "{error}");
    // kiln-realtime's fixture: the live-stream model at width 32 and 32 × 32 frames.
    let fixture =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("crates/kiln-realtime/tests/fixtures/lsd");
    let weights = fixture.to_str().unwrap();
    let error = fails(
        &out,
        &["--model", "lsd", "--weights", weights, "--frames", "2"],
    );
    assert!(error.contains("frame_memory"), "{error}");
}

/// `--out` is claimed as the training examples claim theirs: a directory holding another run's
/// frames (a `--frames 3` run left 9 stale frames of a `--frames 12` one) or files no run
/// recorded (someone's `summary.json`) is refused and left as it was.
#[test]
fn another_runs_directory_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("run");
    succeeds(&out, &["--frames", "2", "--steps", "1"]);
    succeeds(&out, &["--frames", "2", "--steps", "1"]);
    let error = fails(&out, &["--frames", "3", "--steps", "1"]);
    assert!(
        error.contains("frames: earlier run 2, this run 3"),
        "{error}"
    );
    assert!(!out.join("frames/stream-1/00003.png").exists());
    let users = dir.path().join("users");
    std::fs::create_dir(&users).unwrap();
    std::fs::write(users.join("summary.json"), "mine").unwrap();
    let error = fails(&users, &["--frames", "2", "--steps", "1"]);
    assert!(error.contains("summary.json"), "{error}");
    assert_eq!(std::fs::read(users.join("summary.json")).unwrap(), b"mine");
}
