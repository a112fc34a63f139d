//! The `train_forcefield` example from outside, as its contract says: a small student distils a
//! small teacher (kiln-forcefield's committed schnetpack fixture model) from labels on rattled
//! water, methane and ethanol, to well below its starting force error; it writes `model/` (which
//! the `forcefield` example and kiln load), `metrics.jsonl`, `curves.png` and `summary.json`;
//! `--max-steps-now` then a rerun ends with exactly the losses of a run never interrupted; bad
//! input is refused with what is wrong.

use std::path::Path;
use std::process::{Command, Output};

use common::labelled::data;
use kiln::burn::backend::{Autodiff, Flex};
use kiln::forcefield::{Painn, Structure, read_extxyz, write_extxyz};
use serde_json::Value;

use crate::common;

/// A tiny student, a few epochs: seconds per run.
const SMALL: [&str; 16] = [
    "--n-atom-basis",
    "16",
    "--n-interactions",
    "2",
    "--n-rbf",
    "8",
    "--batch",
    "8",
    "--lr",
    "5e-3",
    "--warmup-steps",
    "10",
    "--epochs",
    "30",
    "--patience",
    "0",
];

fn train_forcefield(train: &Path, valid: &Path, out: &Path, args: &[&str]) -> Output {
    Command::new(common::example("train_forcefield"))
        .arg("--train")
        .arg(train)
        .arg("--valid")
        .arg(valid)
        .arg("--out")
        .arg(out)
        .args(args)
        .output()
        .expect("the train_forcefield example is built with the tests")
}

fn succeeds(train: &Path, valid: &Path, out: &Path, args: &[&str]) -> String {
    let output = train_forcefield(train, valid, out, args);
    assert!(
        output.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

fn metrics(out: &Path) -> Vec<serde_json::Value> {
    kiln::train::read_metrics(out).unwrap()
}

#[test]
fn a_small_student_fits_a_small_teachers_forces_and_every_output_is_written() {
    let data = data();
    let out = tempfile::tempdir().unwrap();
    let run = out.path().join("run");
    let stdout = succeeds(&data.train, &data.valid, &run, &SMALL);
    assert!(stdout.contains("force MAE"), "{stdout}");
    let summary: Value =
        serde_json::from_str(&std::fs::read_to_string(run.join("summary.json")).unwrap()).unwrap();
    for key in [
        "valid_energy_mae_per_atom",
        "valid_force_mae",
        "valid_force_rmse",
        "epochs",
    ] {
        assert!(summary[key].is_number(), "{key} in {summary}");
    }
    assert_eq!(summary["epochs"], 30);
    let mae = summary["valid_force_mae"].as_f64().unwrap();
    assert!(
        mae < 0.15 * data.valid_force_scale,
        "force MAE {mae} eV/Å against {} for zero forces",
        data.valid_force_scale
    );
    // Validation at every epoch's end; the force error falls.
    let evaluated: Vec<f64> = metrics(&run)
        .iter()
        .filter_map(|l| l["eval_force_mae"].as_f64())
        .collect();
    assert_eq!(evaluated.len(), 30);
    assert!(evaluated[29] < 0.5 * evaluated[0], "{evaluated:?}");
    assert!(run.join("curves.png").is_file());
    // The saved model is kiln's (schnetpack's) format and reproduces the summary's error.
    let device = Default::default();
    let model = Painn::<Autodiff<Flex>>::from_dir(run.join("model"), &device).unwrap();
    assert!(model.config().atomref.is_some());
    assert_eq!(model.config().trained_elements, Some(vec![1, 6, 8]));
    let frames = read_extxyz(&std::fs::read_to_string(&data.valid).unwrap()).unwrap();
    let structures: Vec<Structure> = frames.iter().map(|f| f.structure.clone()).collect();
    let predicted = model.predict(&structures, &device).unwrap();
    let reference: Vec<f64> = frames
        .iter()
        .flat_map(|f| f.arrays["forces"].1.clone())
        .collect();
    let ours: Vec<f64> = predicted.forces.iter().flatten().copied().collect();
    let reloaded_mae = ours
        .iter()
        .zip(&reference)
        .map(|(a, b)| (a - b).abs())
        .sum::<f64>()
        / reference.len() as f64;
    assert!(
        (reloaded_mae - mae).abs() < 1e-4 * mae.max(1e-3),
        "{reloaded_mae} vs {mae}"
    );
}

#[test]
fn stopping_then_rerunning_gives_the_uninterrupted_losses() {
    let data = data();
    let out = tempfile::tempdir().unwrap();
    let mut short = SMALL.to_vec();
    short[13] = "6"; // --epochs 6: 36 steps
    let whole = out.path().join("whole");
    succeeds(&data.train, &data.valid, &whole, &short);
    let losses = |dir: &Path| -> Vec<String> {
        metrics(dir).iter().map(|l| l["loss"].to_string()).collect()
    };
    let pieces = out.path().join("pieces");
    let mut now = short.clone();
    now.extend(["--max-steps-now", "14"]);
    let stopped = train_forcefield(&data.train, &data.valid, &pieces, &now);
    assert!(stopped.status.success());
    assert!(String::from_utf8_lossy(&stopped.stderr).contains("run the same command again"));
    assert!(!pieces.join("summary.json").exists());
    succeeds(&data.train, &data.valid, &pieces, &short);
    assert_eq!(losses(&pieces), losses(&whole));
    let summary = |dir: &Path| std::fs::read_to_string(dir.join("summary.json")).unwrap();
    let field =
        |text: String| serde_json::from_str::<Value>(&text).unwrap()["valid_force_mae"].clone();
    assert_eq!(field(summary(&pieces)), field(summary(&whole)));
}

#[test]
fn bad_input_is_refused_naming_what_is_wrong() {
    let data = data();
    let dir = tempfile::tempdir().unwrap();
    let text = std::fs::read_to_string(&data.train).unwrap();
    let write = |name: &str, text: &str| {
        let path = dir.path().join(name);
        std::fs::write(&path, text).unwrap();
        path
    };
    let no_energy = write("no_energy.extxyz", &text.replacen("energy=", "enrgy=", 2));
    let nan_energy = {
        let mut frames = read_extxyz(&text).unwrap();
        frames[2].info.insert("energy".into(), "nan".into());
        write("nan.extxyz", &write_extxyz(&frames))
    };
    let short_forces = {
        let mut frames = read_extxyz(&text).unwrap();
        let atoms = frames[1].structure.len();
        frames[1]
            .arrays
            .insert("forces".into(), (2, vec![0.0; 2 * atoms]));
        write("short.extxyz", &write_extxyz(&frames))
    };
    let empty = write("empty.extxyz", "");
    let cases: [(&Path, &[&str], &str); 6] = [
        (&no_energy, &[], "structure 1"),
        (&nan_energy, &[], "structure 3"),
        (&short_forces, &[], "structure 2"),
        (&empty, &[], "no structures"),
        (&data.train, &["--batch", "0"], "--batch"),
        (&data.train, &["--epochs", "0"], "--epochs"),
    ];
    for (train, flags, needle) in cases {
        let out = dir.path().join("out");
        let output = train_forcefield(train, &data.valid, &out, flags);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(!output.status.success(), "{train:?} {flags:?} succeeded");
        assert!(stderr.contains(needle), "{train:?} {flags:?}: {stderr}");
        assert!(!stderr.contains("panicked"), "{stderr}");
        assert!(
            !out.join("metrics.jsonl").exists(),
            "{flags:?}: work started"
        );
    }
}
