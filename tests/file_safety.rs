//! Hostile output paths against the examples (issue "hardening", lost data through output
//! paths): an output that is an input (under another spelling), lies inside the model
//! directory, or is a directory, is refused before any work and every file stays as it was;
//! files beside an output that are named like a temporary (`out.partial`, `out.extxyz.tmp`) are
//! never touched.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

mod common;

/// A scratch directory with a copy of the structures and of the PaiNN model directory.
fn scratch() -> (tempfile::TempDir, PathBuf, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let fixtures = common::forcefield_fixtures();
    let input = dir.path().join("structures.extxyz");
    fs::copy(fixtures.join("structures.extxyz"), &input).unwrap();
    let model = dir.path().join("model");
    fs::create_dir(&model).unwrap();
    for file in fs::read_dir(fixtures.join("painn_gaussian")).unwrap() {
        let file = file.unwrap().path();
        fs::copy(&file, model.join(file.file_name().unwrap())).unwrap();
    }
    (dir, input, model)
}

fn run(example: &str, args: &[&Path]) -> Output {
    let mut command = Command::new(common::example(example));
    for pair in args.chunks(2) {
        command.arg(pair[0]).arg(pair[1]);
    }
    command
        .output()
        .expect("the examples are built with the tests")
}

/// Every file under `dir` with its bytes.
fn snapshot(dir: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    let mut files = Vec::new();
    for entry in fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            files.extend(snapshot(&path));
        } else {
            files.push((path.clone(), fs::read(&path).unwrap()));
        }
    }
    files.sort();
    files
}

fn refused(output: &Output, needle: &str) {
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "accepted; stderr:\n{stderr}");
    assert!(
        stderr.contains(needle),
        "`{needle}` missing from:\n{stderr}"
    );
}

#[test]
fn forcefield_refuses_outputs_that_are_inputs_and_leaves_every_file() {
    let (dir, input, model) = scratch();
    let before = snapshot(dir.path());
    let ff = |output: &Path| {
        run(
            "forcefield",
            &[
                Path::new("--model"),
                &model,
                Path::new("--input"),
                &input,
                Path::new("--output"),
                output,
            ],
        )
    };
    let respelled = model.join("..").join("structures.extxyz");
    refused(&ff(&input), "is the structures (--input)");
    refused(&ff(&respelled), "is the structures (--input)");
    refused(
        &ff(&model.join("model.safetensors")),
        "is inside the model directory (--model)",
    );
    refused(
        &ff(&model.join("results.extxyz")),
        "is inside the model directory (--model)",
    );
    refused(&ff(&model), "is a directory");
    assert_eq!(snapshot(dir.path()), before, "a refused run changed files");

    // Files named like the old temporaries stay; the output is written whole.
    let output = dir.path().join("out.extxyz");
    let neighbours = ["out.partial", "out.extxyz.tmp", ".out.extxyz.partial"];
    for name in neighbours {
        fs::write(dir.path().join(name), name).unwrap();
    }
    let done = ff(&output);
    assert!(
        done.status.success(),
        "{}",
        String::from_utf8_lossy(&done.stderr)
    );
    for name in neighbours {
        assert_eq!(fs::read_to_string(dir.path().join(name)).unwrap(), name);
    }
    assert!(
        fs::read_to_string(&output).unwrap().contains("energy="),
        "results written"
    );
    let names: Vec<_> = fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.contains(".kiln-"))
        .collect();
    assert!(names.is_empty(), "temporaries left behind: {names:?}");
}

#[test]
fn md_refuses_a_trajectory_over_its_input() {
    let (dir, input, model) = scratch();
    let before = snapshot(dir.path());
    let md = run(
        "md",
        &[
            Path::new("--model"),
            &model,
            Path::new("--input"),
            &input,
            Path::new("--trajectory"),
            &input,
        ],
    );
    refused(&md, "--trajectory");
    refused(&md, "is the structures (--input)");
    assert_eq!(snapshot(dir.path()), before);
}

#[test]
fn embed_refuses_an_output_in_the_model_directory_or_over_its_pixels() {
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("dinov2");
    fs::create_dir(&model).unwrap();
    for file in fs::read_dir(common::fixtures().join("dinov2")).unwrap() {
        let file = file.unwrap().path();
        fs::copy(&file, model.join(file.file_name().unwrap())).unwrap();
    }
    let pixels = dir.path().join("pixels.safetensors");
    fs::write(&pixels, b"not read: refused before").unwrap();
    let before = snapshot(dir.path());
    let embed = |out: &Path| {
        run(
            "embed",
            &[
                Path::new("--model-dir"),
                &model,
                Path::new("--pixels"),
                &pixels,
                Path::new("--out"),
                out,
            ],
        )
    };
    refused(
        &embed(&model.join("model.safetensors")),
        "is inside the model directory (--model-dir)",
    );
    refused(&embed(&pixels), "is the pixels (--pixels)");
    assert_eq!(snapshot(dir.path()), before);
}
