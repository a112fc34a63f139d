//! The `forcefield` example end to end on kiln-forcefield's committed fixtures: energies and
//! forces (and stresses of periodic cells) match schnetpack's, in input order, in extxyz that reads back; a bad structure in the
//! middle is reported and written with its error while every other keeps its results.

use std::path::Path;
use std::process::{Command, Output};

use kiln::forcefield::{Frame, read_extxyz};

use crate::common;

use common::{forcefield_fixtures as fixtures, max_abs_diff};

fn forcefield(input: &Path, output: &Path, batch: &str) -> Output {
    Command::new(common::example("forcefield"))
        .arg("--model")
        .arg(fixtures().join("painn_gaussian"))
        .arg("--input")
        .arg(input)
        .arg("--output")
        .arg(output)
        .args(["--batch", batch])
        .output()
        .expect("the forcefield example is built with the tests")
}

fn frames(path: &Path) -> Vec<Frame> {
    read_extxyz(&std::fs::read_to_string(path).unwrap()).unwrap()
}

/// f64 values of `key` in the schnetpack reference file.
fn reference(key: &str) -> Vec<f64> {
    common::read_f64(&fixtures().join("painn_gaussian.safetensors"), key)
}

fn energy(frame: &Frame) -> f64 {
    frame.info["energy"].parse().unwrap()
}

#[test]
fn writes_schnetpack_energies_and_forces_in_input_order() {
    let out = tempfile::tempdir().unwrap();
    let output = out.path().join("out.extxyz");
    let run = forcefield(&fixtures().join("structures.extxyz"), &output, "4");
    assert!(
        run.status.success(),
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );
    let written = frames(&output);
    let energies: Vec<f64> = written.iter().map(energy).collect();
    let forces: Vec<f64> = written
        .iter()
        .flat_map(|f| f.arrays["forces"].1.clone())
        .collect();
    assert!(max_abs_diff(&energies, &reference("energy_f64")) < 1e-4);
    assert!(max_abs_diff(&forces, &reference("forces_f64")) < 1e-4);
    // Stresses of the fully periodic cells only, 3×3 row by row.
    let stresses: Vec<f64> = written
        .iter()
        .filter_map(|f| f.info.get("stress"))
        .flat_map(|s| s.split_whitespace().map(|v| v.parse::<f64>().unwrap()))
        .collect();
    assert!(max_abs_diff(&stresses, &reference("stress_f64")) < 1e-6);
    assert_eq!(stresses.len(), reference("stress_f64").len());
}

#[test]
fn a_bad_structure_loses_nothing_else() {
    let out = tempfile::tempdir().unwrap();
    let good = std::fs::read_to_string(fixtures().join("structures.extxyz")).unwrap();
    // A structure with a non-finite coordinate, second in the file, and one with an unknown
    // element, fourth.
    let mut frames_text: Vec<String> = Vec::new();
    let mut lines = good.lines().peekable();
    while let Some(count) = lines.next() {
        let n: usize = count.trim().parse().unwrap();
        let frame: Vec<&str> = std::iter::once(count)
            .chain(lines.by_ref().take(n + 1))
            .collect();
        frames_text.push(frame.join("\n"));
    }
    let bad = "2\nProperties=species:S:1:pos:R:3\nO 0 0 0\nH nan 0 0.9";
    frames_text.insert(1, bad.to_string());
    frames_text.insert(3, "1\nProperties=species:S:1:pos:R:3\nQq 0 0 0".to_string());
    let input = out.path().join("in.extxyz");
    std::fs::write(&input, frames_text.join("\n") + "\n").unwrap();
    let output = out.path().join("out.extxyz");
    let run = forcefield(&input, &output, "64");
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(!run.status.success());
    // Each error names the file, the frame's first line, the structure and the atom (1-based).
    let line_of = |frame: usize| {
        1 + frames_text[..frame]
            .iter()
            .map(|f| f.lines().count())
            .sum::<usize>()
    };
    let expected = [
        (1, "structure 2: atom 2 has a non-finite position"),
        (3, "structure 4: atom 1 has unknown element `Qq`"),
    ];
    for (frame, message) in expected {
        let want = format!("in.extxyz:{}: {message}", line_of(frame));
        assert!(stderr.contains(&want), "`{want}` missing from:\n{stderr}");
    }
    let written = frames(&output);
    let expected = reference("energy_f64");
    assert_eq!(written.len(), expected.len() + 2);
    assert!(written[1].info["error"].contains("non-finite"));
    assert!(written[3].info["error"].contains("Qq"));
    assert_eq!(written[3].unknown_species[&0], "Qq");
    assert!(!written[1].info.contains_key("energy") && !written[3].info.contains_key("energy"));
    let energies: Vec<f64> = written
        .iter()
        .enumerate()
        .filter(|&(i, _)| i != 1 && i != 3)
        .map(|(_, f)| energy(f))
        .collect();
    assert_eq!(energies.len(), expected.len());
    assert!(
        energies
            .iter()
            .zip(&expected)
            .all(|(a, b)| (a - b).abs() < 1e-4)
    );
}

fn md(args: &[&str], trajectory: &Path) -> Output {
    Command::new(common::example("md"))
        .arg("--model")
        .arg(fixtures().join("painn_gaussian"))
        .arg("--input")
        .arg(fixtures().join("structures.extxyz"))
        .arg("--trajectory")
        .arg(trajectory)
        .args(args)
        .output()
        .expect("the md example is built with the tests")
}

/// The md example integrates ethanol (frame 2), writing every reported frame with its energies,
/// and reports the drift; a frame that is not there is an error before any work.
#[test]
fn md_writes_a_trajectory_that_conserves_energy() {
    let out = tempfile::tempdir().unwrap();
    let trajectory = out.path().join("md.extxyz");
    let args = [
        "--frame",
        "2",
        "--steps",
        "40",
        "--every",
        "10",
        "--timestep",
        "0.25",
    ];
    let run = md(&args, &trajectory);
    let stdout = String::from_utf8_lossy(&run.stdout);
    assert!(
        run.status.success(),
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );
    assert!(stdout.contains("meV/atom/ps"), "{stdout}");
    let written = frames(&trajectory);
    assert_eq!(written.len(), 5, "steps 0, 10, 20, 30, 40");
    let totals: Vec<f64> = written
        .iter()
        .map(|f| f.info["total"].parse().unwrap())
        .collect();
    let atoms = written[0].structure.len() as f64;
    assert!(
        totals.iter().all(|t| (t - totals[0]).abs() / atoms < 1e-4),
        "{totals:?}"
    );
    assert!(written[4].structure.positions != written[0].structure.positions);
    assert_eq!(written[4].arrays["velocities"].1.len(), 3 * atoms as usize);

    let run = md(&["--frame", "99"], &trajectory);
    assert!(!run.status.success());
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(
        stderr.contains("no frame 99 (--frame counts from 0)"),
        "{stderr}"
    );
}
