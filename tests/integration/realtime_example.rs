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
    assert_eq!(summary["streams"], 1);
    assert!(out.join("frames/stream-1/00003.png").is_file());
}

#[test]
fn bad_inputs_are_clear_errors() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("run");
    let error = fails(&out, &["--steps", "0"]);
    assert!(error.contains("--steps"), "{error}");
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
