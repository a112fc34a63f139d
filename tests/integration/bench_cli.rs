//! The `kiln-bench` binary end to end on Flex: save a baseline (its numbers and its build),
//! compare a repeat run with the saved build taking samples in turns (passes), compare a
//! deliberately slowed run with the saved numbers (fails with a non-zero exit).
//!
//! Separate processes on a shared 2-core CI machine drift apart, at times by 2× (a repeat run
//! once measured +109%), more than the samples of one run can show: that is what the comparison
//! in turns is for, and its statistics are tested on a synthetic workload in kiln-bench
//! (`lockstep::tests`). The comparisons here test the command, with a 1000% threshold and a
//! slowdown of 30× (+2900%): both verdicts hold with a wide margin.

use std::path::Path;
use std::process::{Command, Output};

fn kiln_bench(dir: &Path, slowdown: usize, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_kiln-bench"))
        .args([
            "--device",
            "cpu",
            "--quick",
            "--filter",
            "gemm/n=512",
            "--threshold",
            "1000",
            "--dir",
        ])
        .arg(dir)
        .args(args)
        .env("KILN_BENCH_SLOWDOWN", slowdown.to_string())
        .output()
        .expect("kiln-bench runs")
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn repeat_runs_pass_and_a_slowed_run_fails_the_comparison() {
    let dir = tempfile::tempdir().unwrap();
    let saved = kiln_bench(dir.path(), 1, &["--save", "base"]);
    let text = stdout(&saved);
    assert!(
        saved.status.success(),
        "{text}\n{}",
        String::from_utf8_lossy(&saved.stderr)
    );
    assert!(dir.path().join("base.json").exists());
    assert!(dir.path().join("base.bin").is_file(), "the build is kept");
    // The calibration peak and the GEMM's roofline fraction are printed.
    assert!(
        text.contains("calibrated peaks:") && text.contains("GFLOP/s (GEMM)"),
        "{text}"
    );
    assert!(text.contains("% of roofline"), "{text}");

    let again = kiln_bench(dir.path(), 1, &["--compare", "base", "--pairs", "8"]);
    let text = stdout(&again);
    assert!(
        again.status.success(),
        "{text}\n{}",
        String::from_utf8_lossy(&again.stderr)
    );
    assert!(
        text.contains("within noise")
            && text.contains("no regression")
            && text.contains("taking their samples in turns"),
        "{text}"
    );

    let slowed = kiln_bench(dir.path(), 30, &["--compare", "base", "--saved-numbers"]);
    let text = stdout(&slowed);
    assert_eq!(slowed.status.code(), Some(1), "{text}");
    assert!(
        text.contains("REGRESSED")
            && text.contains("1 regression(s)")
            && text.contains("read against the baseline's saved numbers"),
        "{text}"
    );
}

#[test]
fn comparing_with_a_missing_baseline_is_a_one_line_error_before_any_work() {
    let dir = tempfile::tempdir().unwrap();
    let out = kiln_bench(dir.path(), 1, &["--compare", "nope"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(
        stderr.contains("no baseline `nope`") && stderr.contains("--save nope"),
        "{stderr}"
    );
}
