//! The `foveated_synthetic` example from outside, as its contract says: its flags, its outputs
//! (`summary.json` with every control's `coarse_accuracy` and `fine_accuracy`, null where a mode
//! does not apply; `curves.png`; one kiln-train run directory per control), and bad flags refused
//! before any work. A short run: the accuracies it reaches are the documented long run's concern.

use std::path::Path;
use std::process::{Command, Output};

use serde_json::Value;

mod common;

fn run(out: &Path, args: &[&str]) -> Output {
    Command::new(common::example("foveated_synthetic"))
        .arg("--out")
        .arg(out)
        .args(args)
        .output()
        .expect("the foveated_synthetic example is built with the tests")
}

#[test]
fn a_short_run_writes_every_control_and_the_plot() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("run");
    let args = [
        "--steps",
        "4",
        "--eval-every",
        "2",
        "--eval-clips",
        "32",
        "--batch",
        "4",
    ];
    let output = run(
        &out,
        &[&args[..], &["--readout", "shallow", "--device", "cpu"]].concat(),
    );
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let summary: Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("summary.json")).unwrap()).unwrap();
    let accuracy = |control: &str, key: &str| &summary[control][key];
    for control in ["both", "random_queries"] {
        for key in ["coarse_accuracy", "fine_accuracy"] {
            let value = accuracy(control, key).as_f64().unwrap();
            assert!((0.0..=1.0).contains(&value), "{control} {key}: {value}");
        }
    }
    assert!(accuracy("static_only", "coarse_accuracy").is_f64());
    assert!(accuracy("static_only", "fine_accuracy").is_null());
    assert!(accuracy("all_patches", "coarse_accuracy").is_null());
    assert!(accuracy("all_patches", "fine_accuracy").is_f64());
    assert_eq!(summary["settings"]["readout"], "shallow");
    assert!(std::fs::metadata(out.join("curves.png")).unwrap().len() > 1000);
    for control in ["both", "static_only", "all_patches", "random_queries"] {
        let lines = kiln::train::read_metrics(&out.join(control)).unwrap();
        assert_eq!(lines.len(), 4, "{control}");
    }
}

#[test]
fn bad_flags_are_refused_before_any_work() {
    let dir = tempfile::tempdir().unwrap();
    for (flags, needle) in [
        (&["--readout", "glance"][..], "glance"),
        (&["--controls", "both,oracle"][..], "oracle"),
        (&["--grid", "1"][..], "at least 2 cells"),
    ] {
        let out = dir.path().join("bad");
        let output = run(&out, flags);
        assert!(!output.status.success(), "{flags:?} succeeded");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(stderr.contains(needle), "{flags:?}: {stderr}");
        assert!(!out.join("summary.json").exists());
    }
}
