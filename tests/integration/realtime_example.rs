//! The `realtime` example from outside, as issue 54's contract says: its flags (`--out`,
//! `--model`, `--frames`, `--input`, `--steps`, `--budget-ms`, `--streams`, `--device`,
//! `--policy`), its outputs (the frames as PNG, `preview.gif`, `latency.png`, `summary.json` with
//! `fps`, `frame_ms` {p50, p90, p99, max}, `budget_ms`, `frames_over_budget`,
//! `peak_memory_bytes`, `forwards_per_frame`, `streams`), and bad inputs refused with clear
//! errors. Small frames (16 × 16) keep the runs short.

use std::path::{Path, PathBuf};
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

/// kiln-realtime's committed fixtures: mirage-hello's own code run on them
/// (scripts/fixtures/realtime.py).
fn mirage_fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("crates/kiln-realtime/tests/fixtures")
}

/// The frames the example wrote with `--save-raw` in `out` against mirage's outputs `key` on the
/// same weights and input frames, before any rounding to 8 bits: within `tolerance` (of 1, or of
/// the frame's largest value where that is larger).
fn assert_mirages_frames(out: &Path, key: &str, frames: usize, size: usize, tolerance: f64) {
    let (ours, shape) = common::read_f32(&out.join("raw.safetensors"), "out");
    let references = mirage_fixtures().join("example/references.safetensors");
    let (theirs, their_shape) = common::read_f32(&references, key);
    assert_eq!(shape, [frames, 1, 3, size, size]);
    assert_eq!(shape, their_shape);
    let plane = 3 * size * size;
    let wide = |x: &[f32]| x.iter().map(|&v| f64::from(v)).collect::<Vec<_>>();
    for (frame, (ours, theirs)) in ours.chunks(plane).zip(theirs.chunks(plane)).enumerate() {
        let (ours, theirs) = (wide(ours), wide(theirs));
        let scale = theirs.iter().fold(1f64, |m, v| m.max(v.abs()));
        let error = common::max_abs_diff(&ours, &theirs);
        assert!(
            error <= tolerance * scale,
            "{out:?}, frame {}: max |kiln − mirage| = {error} (largest value {scale})",
            frame + 1
        );
    }
}

/// The U-Net's arguments for the fixture's weights and frames.
fn unet_fixture_args() -> Vec<String> {
    let fixtures = mirage_fixtures();
    let weights = fixtures.join("unet");
    let input = fixtures.join("example/unet_frames");
    [
        "--model",
        "unet",
        "--weights",
        weights.to_str().unwrap(),
        "--input",
        input.to_str().unwrap(),
        "--frames",
        "3",
        "--size",
        "16",
        "--save-raw",
    ]
    .map(String::from)
    .to_vec()
}

/// The live-stream model's arguments for the fixture saved after mirage's demo warm-up (slot 0
/// holds the warm-up frame, `memory_ptr` is 1) and its ten frames, at timestep 7; the frame
/// size (32) comes from the checkpoint.
fn lsd_fixture_args() -> Vec<String> {
    let fixtures = mirage_fixtures().join("example");
    let weights = fixtures.join("lsd_warm");
    let input = fixtures.join("lsd_frames");
    [
        "--model",
        "lsd",
        "--weights",
        weights.to_str().unwrap(),
        "--input",
        input.to_str().unwrap(),
        "--frames",
        "10",
        "--timestep",
        "7",
        "--save-raw",
    ]
    .map(String::from)
    .to_vec()
}

/// The example run in `out` with `args` and then `more`.
fn run_fixture(out: &Path, args: &[String], more: &[&str]) -> Output {
    let args: Vec<&str> = args
        .iter()
        .map(String::as_str)
        .chain(more.iter().copied())
        .collect();
    common::run_example("realtime", out, &args)
}

#[test]
fn the_unet_writes_mirages_frames() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("run");
    let args = unet_fixture_args();
    common::succeeded(run_fixture(&out, &args, &[]), &[]);
    assert_mirages_frames(&out, "unet_out", 3, 16, 1e-5);
    let (timesteps, shape) = common::read_f32(&out.join("raw.safetensors"), "timesteps");
    assert_eq!(shape, [3, 6]);
    assert_eq!(timesteps[..6], [50.0, 40.0, 30.0, 20.0, 10.0, 0.0]);
}

#[test]
fn the_live_stream_model_writes_mirages_frames_from_its_warmed_up_bank() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("run");
    common::succeeded(run_fixture(&out, &lsd_fixture_args(), &[]), &[]);
    assert_mirages_frames(&out, "lsd_out", 10, 32, 1e-5);
    let summary = common::summary(&out);
    assert_eq!(summary["timestep"], "7");
    assert_eq!(summary["frame_size"], 32);
    assert_eq!(summary["memory_kind"], "host");
    assert!(summary["peak_host_memory_bytes"].as_u64() > Some(0));
}

/// Every policy the example documents, on both models, from outside: on the CPU (host
/// kernels, bf16 products where the CPU has them) and on Vulkan (burn's operations on a GPU
/// backend; lavapipe in CI), every frame within the policy's rounding of mirage's outputs on
/// the same weights and frames. A policy a device does not offer is refused with an error,
/// never a panic; on Vulkan the summary's peak memory is the device's. On Vulkan the U-Net runs
/// in f16 only: each run spends 20–35 s compiling lavapipe's shaders, and kiln-realtime's own
/// tests run every policy through the same burn operations on Flex.
#[test]
fn every_policy_writes_mirages_frames_on_every_device() {
    let dir = tempfile::tempdir().unwrap();
    let devices: Vec<&str> = ["cpu"]
        .into_iter()
        .chain(common::vulkan("realtime policies").map(|_| "vulkan"))
        .collect();
    for device in devices {
        for policy in ["full", "mixed-bf16", "mixed-f16", "bf16", "f16"] {
            let tolerance = if policy == "full" { 1e-5 } else { 3e-2 };
            let models = [
                ("unet", unet_fixture_args(), "unet_out", 3, 16),
                ("lsd", lsd_fixture_args(), "lsd_out", 10, 32),
            ];
            for (model, args, key, frames, size) in models {
                if device != "cpu" && model == "unet" && policy != "f16" {
                    continue;
                }
                let out = dir.path().join(format!("{device}-{policy}-{model}"));
                let more = ["--device", device, "--policy", policy];
                let run = run_fixture(&out, &args, &more);
                let stderr = String::from_utf8_lossy(&run.stderr);
                assert!(!stderr.contains("panicked"), "{model} {more:?}: {stderr}");
                if !run.status.success() && device != "cpu" {
                    assert!(
                        stderr.contains(policy.trim_start_matches("mixed-")),
                        "{stderr}"
                    );
                    common::say(&format!(
                        "realtime on {device}: --policy {policy}: {stderr}"
                    ));
                    continue;
                }
                common::succeeded(run, &more);
                assert_mirages_frames(&out, key, frames, size, tolerance);
                let summary = common::summary(&out);
                let kind = if device == "cpu" { "host" } else { "device" };
                assert_eq!(summary["memory_kind"], kind, "{model} {more:?}");
                assert!(summary["peak_memory_bytes"].as_u64() > Some(0));
            }
        }
    }
}

#[test]
fn the_live_stream_timestep_is_drawn_per_frame_seeded() {
    let dir = tempfile::tempdir().unwrap();
    let drawn = |name: &str, seed: &str| {
        let out = dir.path().join(name);
        let args = [
            "--model",
            "lsd",
            "--frames",
            "6",
            "--seed",
            seed,
            "--save-raw",
        ];
        common::succeeded(run(&out, &args), &args);
        assert_eq!(common::summary(&out)["timestep"], "random");
        common::read_f32(&out.join("raw.safetensors"), "timesteps").0
    };
    let first = drawn("a", "3");
    assert_eq!(
        first,
        drawn("b", "3"),
        "the same seed draws the same timesteps"
    );
    assert!(
        first
            .iter()
            .all(|&t| t.fract() == 0.0 && (0.0..20.0).contains(&t)),
        "{first:?}"
    );
    assert!(
        first.windows(2).any(|w| w[0] != w[1]),
        "one draw for every frame: {first:?}"
    );
    assert_ne!(first, drawn("c", "4"));
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
    assert!(
        error.contains("--size 16: the live-stream model of --weights reads frames of 32 × 32"),
        "{error}"
    );
    let error = fails(&out, &["--weights", weights]);
    assert!(
        error.contains("not SimpleOptimizedUNet's state dict: `conv_in.weight` is missing"),
        "{error}"
    );
    let error = fails(&out, &["--timestep", "3"]);
    assert!(
        error.contains("--timestep: the U-Net's forwards run at 50 … 0"),
        "{error}"
    );
    let error = fails(&out, &["--model", "lsd", "--timestep", "-1"]);
    assert!(error.contains("must be `random` or a number"), "{error}");
    assert!(!out.exists(), "a refused run left {}", out.display());
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
