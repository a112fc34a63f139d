//! Hostile inputs against the examples, one section per kind of defect:
//! - output paths: an output that is an input (under another spelling), lies inside the model
//!   directory, or is a directory, is refused before any work and every file stays as it was;
//!   files beside an output named like a temporary (`out.partial`, `out.extxyz.tmp`) are never
//!   touched;
//! - checkpoints: a tensor stored with an integer dtype, or of another shape, is a prompt error
//!   naming it (in the checkpoint's terms), never a panic or a hang, and nothing is written.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

mod common;

/// A scratch directory with a copy of the structures and of the PaiNN model directory.
fn scratch() -> (tempfile::TempDir, PathBuf, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let fixtures = common::forcefield_fixtures();
    let input = dir.path().join("structures.extxyz");
    fs::copy(fixtures.join("structures.extxyz"), &input).unwrap();
    let model = copy_dir(&fixtures.join("painn_gaussian"), &dir.path().join("model"));
    (dir, input, model)
}

/// A copy of the flat directory `from` at `to`.
fn copy_dir(from: &Path, to: &Path) -> PathBuf {
    fs::create_dir(to).unwrap();
    for file in fs::read_dir(from).unwrap() {
        let file = file.unwrap().path();
        fs::copy(&file, to.join(file.file_name().unwrap())).unwrap();
    }
    to.to_path_buf()
}

/// The forcefield example on `input` with the model in `model`, writing `output`.
fn forcefield(model: &Path, input: &Path, output: &Path) -> Output {
    run(
        "forcefield",
        &[
            Path::new("--model"),
            model,
            Path::new("--input"),
            input,
            Path::new("--output"),
            output,
        ],
    )
}

/// Runs `example` with flag / value pairs `args`; fails the test if it has not exited within a
/// minute (a hang).
fn run(example: &str, args: &[&Path]) -> Output {
    let mut command = Command::new(common::example(example));
    for pair in args.chunks(2) {
        command.arg(pair[0]).arg(pair[1]);
    }
    let mut child = command
        .env(
            "KILN_CACHE_DIR",
            std::env::temp_dir().join("kiln-hostile-tests"),
        )
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the examples are built with the tests");
    let deadline = Instant::now() + Duration::from_secs(60);
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            child.kill().unwrap();
            panic!("`{example}` did not exit within a minute");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.wait_with_output().unwrap()
}

use common::snapshot;

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
    let ff = |output: &Path| forcefield(&model, &input, output);
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
    let model = copy_dir(
        &common::fixtures().join("dinov2"),
        &dir.path().join("dinov2"),
    );
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

/// A copy of the safetensors file `from` at `to` with tensor `name` replaced: stored as i64 of
/// the same shape, or as f32 of `shape`.
fn rewrite(from: &Path, to: &Path, name: &str, shape: Option<Vec<usize>>) {
    let bytes = fs::read(from).unwrap();
    let file = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let mut tensors: Vec<(String, safetensors::Dtype, Vec<usize>, Vec<u8>)> = file
        .tensors()
        .into_iter()
        .map(|(n, view)| (n, view.dtype(), view.shape().to_vec(), view.data().to_vec()))
        .collect();
    let tensor = tensors
        .iter_mut()
        .find(|t| t.0 == name)
        .expect("the tensor");
    match shape {
        Some(shape) => {
            tensor.3 = vec![0; 4 * shape.iter().product::<usize>()];
            (tensor.1, tensor.2) = (safetensors::Dtype::F32, shape);
        }
        None => {
            tensor.3 = vec![0; 8 * tensor.2.iter().product::<usize>()];
            tensor.1 = safetensors::Dtype::I64;
        }
    }
    let views: Vec<_> = tensors
        .iter()
        .map(|(n, dtype, shape, data)| {
            let view = safetensors::tensor::TensorView::new(*dtype, shape.clone(), data);
            (n.clone(), view.unwrap())
        })
        .collect();
    safetensors::serialize_to_file(views, None, to).unwrap();
}

#[test]
fn checkpoint_tensors_of_an_integer_dtype_or_another_shape_are_named() {
    let (dir, input, model) = scratch();
    let weights = model.join("model.safetensors");
    let original = dir.path().join("original.safetensors");
    fs::copy(&weights, &original).unwrap();
    let output = dir.path().join("out.extxyz");
    let ff = || forcefield(&model, &input, &output);
    let name = "representation.filter_net.weight";
    rewrite(&original, &weights, name, None);
    refused(&ff(), &format!("{name}: stored as I64"));
    assert!(!output.exists());
    let stored = safetensors::SafeTensors::deserialize(&fs::read(&original).unwrap())
        .unwrap()
        .tensor(name)
        .unwrap()
        .shape()
        .to_vec();
    let wider = vec![stored[0] + 3, stored[1]];
    rewrite(&original, &weights, name, Some(wider.clone()));
    refused(
        &ff(),
        &format!("{name}: the checkpoint has {wider:?}, the model needs {stored:?}"),
    );
    assert!(!output.exists());
}

#[test]
fn a_vision_checkpoint_with_an_integer_tensor_is_refused_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let model = copy_dir(
        &common::fixtures().join("clip_vision"),
        &dir.path().join("clip_vision"),
    );
    let name = "vision_model.embeddings.patch_embedding.weight";
    let weights = model.join("model.safetensors");
    let original = dir.path().join("original.safetensors");
    fs::copy(&weights, &original).unwrap();
    rewrite(&original, &weights, name, None);
    let out = dir.path().join("embeddings.safetensors");
    let embed = run(
        "embed",
        &[
            Path::new("--model-dir"),
            &model,
            Path::new("--images"),
            &common::fixtures().join("images"),
            Path::new("--out"),
            &out,
        ],
    );
    refused(&embed, &format!("{name}: stored as I64"));
    assert!(!out.exists());
}
