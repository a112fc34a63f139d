//! Hostile inputs against the examples, one section per kind of defect:
//! - output paths: an output that is an input (under another spelling), lies inside the model
//!   directory, or is a directory, is refused before any work and every file stays as it was;
//!   files beside an output named like a temporary (`out.partial`, `out.extxyz.tmp`) are never
//!   touched;
//! - checkpoints: a tensor stored with an integer dtype, or of another shape, is a prompt error
//!   naming it (in the checkpoint's terms), never a panic or a hang, and nothing is written;
//! - input data: a decompression bomb (PNG or JPEG), a truncated JPEG, pixels the model cannot
//!   take, a periodic cell far smaller than the cutoff are errors naming the file, structure
//!   (1-based) and setting; the rest of the run's results are kept;
//! - every example's inputs and outputs checked together: an output directory that lies inside
//!   an input, an input that lies inside the output directory (training examples, exp0_mc);
//! - a refused run truncates nothing (md's streamed trajectory);
//! - a directory holding results is a run: files no run recorded are never replaced, another
//!   run's settings or data are refused by name, a damaged newest checkpoint falls back to the
//!   one before;
//! - numeric flags outside their domain are refused naming the flag as typed;
//! - a killed run's temporaries are removed by the next run.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant, SystemTime};

use crate::common;

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

/// The embed example with the model in `model`, `input_flag` (`--images` or `--pixels`)
/// `input`, writing `out`.
fn embed(model: &Path, input_flag: &str, input: &Path, out: &Path) -> Output {
    run(
        "embed",
        &[
            Path::new("--model-dir"),
            model,
            Path::new(input_flag),
            input,
            Path::new("--out"),
            out,
        ],
    )
}

/// Embeds a folder holding only the image `name` with the tiny CLIP; checks the run is refused
/// naming the file and saying each of `needles`, and that nothing is written.
fn refuses_image(name: &str, bytes: &[u8], needles: &[&str]) {
    let dir = tempfile::tempdir().unwrap();
    let images = dir.path().join("images");
    fs::create_dir(&images).unwrap();
    fs::write(images.join(name), bytes).unwrap();
    let out = dir.path().join("embeddings.safetensors");
    let clip = common::fixtures().join("clip_vision");
    let output = embed(&clip, "--images", &images, &out);
    refused(&output, name);
    for needle in needles {
        refused(&output, needle);
    }
    assert!(!out.exists());
}

/// Runs `example` with flag / value pairs `args`; fails the test if it has not exited within a
/// minute (a hang).
fn run(example: &str, args: &[&Path]) -> Output {
    run_within(None, example, args)
}

/// [`run`], in an address space of `gib` GiB where given: a program that tried to allocate
/// more dies instead of swapping, and fails the test.
fn run_within(gib: Option<u64>, example: &str, args: &[&Path]) -> Output {
    let mut command = match gib {
        Some(gib) => {
            let mut shell = Command::new("sh");
            shell
                .arg("-c")
                .arg(format!("ulimit -v {} && exec \"$0\" \"$@\"", gib << 20))
                .arg(common::example(example));
            shell
        }
        None => Command::new(common::example(example)),
    };
    command.args(args);
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
    let output = child.wait_with_output().unwrap();
    assert!(
        !String::from_utf8_lossy(&output.stderr).contains("memory allocation"),
        "{example} ran out of its {gib:?} GiB"
    );
    output
}

use common::snapshot;

fn refused(output: &Output, needle: &str) {
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "accepted; stderr:\n{stderr}");
    assert!(
        !stderr.contains("panicked"),
        "a panic, not an error:\n{stderr}"
    );
    assert!(
        stderr.contains(needle),
        "`{needle}` missing from:\n{stderr}"
    );
}

#[test]
fn forcefield_refuses_outputs_that_are_inputs_and_leaves_every_file() {
    let (dir, input, model) = scratch();
    let a_directory = dir.path().join("a-directory");
    fs::create_dir(&a_directory).unwrap();
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
    // The model directory as the output is named as the input it is, before its kind.
    refused(&ff(&model), "is the model directory (--model)");
    refused(&ff(&a_directory), "is a directory");
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
    let embed = |out: &Path| embed(&model, "--pixels", &pixels, out);
    refused(
        &embed(&model.join("model.safetensors")),
        "is inside the model directory (--model-dir)",
    );
    refused(&embed(&pixels), "is the pixels (--pixels)");
    assert_eq!(snapshot(dir.path()), before);
}

/// What [`rewrite`] does to a tensor.
enum Change {
    /// Stored as i64 of the same shape.
    Integer,
    /// Stored as f32 zeros of this shape.
    Shape(Vec<usize>),
    /// Left out.
    Drop,
}

/// A copy of the safetensors file `from` at `to` with tensor `name` changed.
fn rewrite(from: &Path, to: &Path, name: &str, change: Change) {
    let bytes = fs::read(from).unwrap();
    let file = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let mut tensors: Vec<(String, safetensors::Dtype, Vec<usize>, Vec<u8>)> = file
        .tensors()
        .into_iter()
        .map(|(n, view)| (n, view.dtype(), view.shape().to_vec(), view.data().to_vec()))
        .collect();
    let index = tensors
        .iter()
        .position(|t| t.0 == name)
        .expect("the tensor");
    let tensor = &mut tensors[index];
    match change {
        Change::Shape(shape) => {
            tensor.3 = vec![0; 4 * shape.iter().product::<usize>()];
            (tensor.1, tensor.2) = (safetensors::Dtype::F32, shape);
        }
        Change::Integer => {
            tensor.3 = vec![0; 8 * tensor.2.iter().product::<usize>()];
            tensor.1 = safetensors::Dtype::I64;
        }
        Change::Drop => {
            tensors.remove(index);
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
    rewrite(&original, &weights, name, Change::Integer);
    refused(&ff(), &format!("{name}: stored as I64"));
    assert!(!output.exists());
    let stored = safetensors::SafeTensors::deserialize(&fs::read(&original).unwrap())
        .unwrap()
        .tensor(name)
        .unwrap()
        .shape()
        .to_vec();
    let wider = vec![stored[0] + 3, stored[1]];
    rewrite(&original, &weights, name, Change::Shape(wider.clone()));
    refused(
        &ff(),
        &format!("{name}: the checkpoint has {wider:?}, the model needs {stored:?}"),
    );
    assert!(!output.exists());
}

/// A config whose sizes disagree with its checkpoint is refused from the shapes alone, before
/// the model takes any memory (a typo that asks for 14 GB of MLP weights, in 4 GiB of address
/// space), every tensor named as the checkpoint names it: a Llama's `model.norm.weight`, not
/// burn's `gamma`.
#[test]
fn sizes_are_checked_against_the_checkpoint_before_anything_is_allocated() {
    let dir = tempfile::tempdir().unwrap();
    let text = Path::new(env!("CARGO_MANIFEST_DIR")).join("crates/kiln-text/tests/fixtures");
    let model = copy_dir(&text.join("llama"), &dir.path().join("llama"));
    let config = fs::read_to_string(model.join("config.json")).unwrap();
    let typo = config.replace(
        "\"intermediate_size\": 80,",
        "\"intermediate_size\": 8000000,",
    );
    assert_ne!(typo, config);
    fs::write(model.join("config.json"), typo).unwrap();
    let weights = model.join("model.safetensors");
    rewrite(
        &text.join("llama/model.safetensors"),
        &weights,
        "model.norm.weight",
        Change::Drop,
    );
    let args = [
        Path::new("--model-dir"),
        &model,
        Path::new("--prompt"),
        Path::new("hi"),
    ];
    let generate = run_within(Some(4), "generate", &args);
    refused(
        &generate,
        "model.layers.0.mlp.gate_proj.weight: the checkpoint has [80, 48], the model needs \
         [8000000, 48]; set by config.json's intermediate_size = 8000000",
    );
    refused(&generate, "model.norm.weight [48]: not in the checkpoint");
    assert!(!String::from_utf8_lossy(&generate.stderr).contains("gamma"));
}

/// A model too large for the machine is refused before training allocates it, naming the
/// setting that made it so.
#[test]
fn a_model_larger_than_memory_is_refused_naming_its_size() {
    let data = common::labelled::data();
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("run");
    let flags = [
        "--n-atom-basis",
        "100000",
        "--n-interactions",
        "1",
        "--n-rbf",
        "4",
    ];
    let mut args: Vec<&Path> = vec![
        Path::new("--train"),
        &data.train,
        Path::new("--valid"),
        &data.valid,
        Path::new("--out"),
        &out,
    ];
    args.extend(flags.iter().map(Path::new));
    let train = run("train_forcefield", &args);
    refused(&train, "need at least");
    refused(&train, "painn.n_atom_basis = 100000");
    assert!(!out.exists(), "nothing is written for a refused run");
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
    rewrite(&original, &weights, name, Change::Integer);
    let out = dir.path().join("embeddings.safetensors");
    let embed = embed(&model, "--images", &common::fixtures().join("images"), &out);
    refused(&embed, &format!("{name}: stored as I64"));
    assert!(!out.exists());
}

/// A PNG chunk: length, type, data, CRC-32 (the PNG polynomial, bit by bit).
fn png_chunk(kind: &[u8; 4], data: &[u8]) -> Vec<u8> {
    let mut crc = !0u32;
    for &byte in kind.iter().chain(data) {
        crc ^= u32::from(byte);
        for _ in 0..8 {
            crc = if crc & 1 == 1 {
                (crc >> 1) ^ 0xEDB8_8320
            } else {
                crc >> 1
            };
        }
    }
    let mut chunk = (data.len() as u32).to_be_bytes().to_vec();
    chunk.extend_from_slice(kind);
    chunk.extend_from_slice(data);
    chunk.extend_from_slice(&(!crc).to_be_bytes());
    chunk
}

/// A PNG of a few dozen bytes declaring 30 000 × 30 000 RGB pixels (2.7 GB decoded) is refused
/// before decoding, naming the file and the flag that raises the limit.
#[test]
fn a_decompression_bomb_is_refused_before_decoding() {
    let mut header = 30_000u32.to_be_bytes().to_vec();
    header.extend_from_slice(&30_000u32.to_be_bytes());
    header.extend_from_slice(&[8, 2, 0, 0, 0]);
    let mut png = b"\x89PNG\r\n\x1a\n".to_vec();
    png.extend(png_chunk(b"IHDR", &header));
    // The start of a zlib stream: decoders read the header up to here.
    png.extend(png_chunk(b"IDAT", &[0x78, 0x9c, 0x63, 0x00]));
    png.extend(png_chunk(b"IEND", &[]));
    refuses_image(
        "bomb.png",
        &png,
        &["declares 30000 × 30000 pixels", "--max-image-pixels"],
    );
}

/// A JPEG cut short (Pillow refuses it; libjpeg alone would fill the missing rows with grey) and
/// one whose header declares 65 000 × 65 000 pixels are errors naming the file.
#[test]
fn a_truncated_or_enormous_jpeg_is_refused_naming_it() {
    let jpeg = fs::read(
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("crates/kiln-cache/tests/fixtures/jpeg/q90-444.jpg"),
    )
    .unwrap();
    let mut enormous = jpeg.clone();
    let sof = enormous.windows(2).position(|w| w == [0xFF, 0xC0]).unwrap();
    enormous[sof + 5..sof + 9].copy_from_slice(&[0xFD, 0xE8, 0xFD, 0xE8]);
    refuses_image(
        "cut.jpg",
        &jpeg[..jpeg.len() / 2],
        &["image file is truncated"],
    );
    refuses_image("bomb.jpg", &enormous, &["declares 65000 × 65000 pixels"]);
}

/// Pixels the model cannot take (no images, one channel, 4 × 4) are an error naming the file,
/// the shape and the config setting, never a panic, and nothing is written.
#[test]
fn pixels_the_model_cannot_take_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("embeddings.safetensors");
    for (shape, needle) in [
        ([0, 3, 32, 32], "no images"),
        (
            [2, 1, 32, 32],
            "1 channel(s); the model takes 3 (config.json num_channels)",
        ),
        ([2, 3, 4, 4], "smaller than one"),
        ([1, 3, 64, 48], "the model takes"),
    ] {
        let pixels = dir.path().join("pixels.safetensors");
        let data = vec![0u8; 4 * shape.iter().product::<usize>()];
        let view =
            safetensors::tensor::TensorView::new(safetensors::Dtype::F32, shape.to_vec(), &data)
                .unwrap();
        safetensors::serialize_to_file([("pixel_values", view)], None, &pixels).unwrap();
        let clip = common::fixtures().join("clip_vision");
        let embed = embed(&clip, "--pixels", &pixels, &out);
        refused(&embed, needle);
        refused(&embed, "pixels.safetensors");
        assert!(!out.exists());
    }
}

/// A periodic cell far smaller than the cutoff (0.01 Å: a billion lattice shifts) fails its own
/// structure with a clear message, promptly; every other structure's results are written.
#[test]
fn a_tiny_periodic_cell_fails_only_its_structure() {
    let (dir, input, model) = scratch();
    let mut text = fs::read_to_string(&input).unwrap();
    let structures = kiln::forcefield::read_extxyz(&text).unwrap().len();
    text.push_str(
        "1\nLattice=\"0.01 0 0 0 0.01 0 0 0 0.01\" pbc=\"T T T\" \
         Properties=species:S:1:pos:R:3\nH 0 0 0\n",
    );
    fs::write(&input, text).unwrap();
    let output = dir.path().join("out.extxyz");
    let done = forcefield(&model, &input, &output);
    refused(
        &done,
        &format!(
            "structure {}: the periodic cell is far smaller",
            structures + 1
        ),
    );
    let written = fs::read_to_string(&output).unwrap();
    assert_eq!(written.matches("energy=").count(), structures);
}

/// The training-force-field example on `train` and `valid` into `out`, a tiny student.
fn train_forcefield(train: &Path, valid: &Path, out: &Path, flags: &[&str]) -> Output {
    let mut args: Vec<&Path> = vec![
        Path::new("--train"),
        train,
        Path::new("--valid"),
        valid,
        Path::new("--out"),
        out,
    ];
    let small = [
        "--n-atom-basis",
        "8",
        "--n-interactions",
        "1",
        "--n-rbf",
        "4",
        "--batch",
        "8",
        "--epochs",
        "2",
    ];
    args.extend(small.iter().chain(flags).map(Path::new));
    run("train_forcefield", &args)
}

fn succeeded(output: &Output) -> String {
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    assert!(output.status.success(), "{stderr}");
    stderr
}

/// Outputs are checked against every input in both directions, before any work: a training
/// set inside the run's directory (where the model and metrics go), a run's directory or cache
/// inside the clips or images it reads. Every file stays as it was.
#[test]
fn inputs_and_outputs_are_checked_together_in_every_example() {
    let data = common::labelled::data();
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("run");
    fs::create_dir_all(out.join("model")).unwrap();
    let inside = [
        out.join("model/model.safetensors"),
        out.join("metrics.jsonl"),
    ];
    for train in &inside {
        fs::copy(&data.train, train).unwrap();
    }
    let clips = dir.path().join("clips");
    fs::create_dir_all(clips.join("a")).unwrap();
    let captions = out.join("summary.json");
    fs::write(&captions, "{\"video\": \"a\", \"caption\": \"x\"}\n").unwrap();
    let before = snapshot(dir.path());
    for train in &inside {
        let refusal = train_forcefield(train, &data.valid, &out, &[]);
        refused(&refusal, "lies inside --out");
        refused(&refusal, "the training structures (--train)");
    }
    let foveated = |clips: &Path, captions: &Path, out: &Path, cache: &Path| {
        let flags = [
            "--clips",
            "--captions",
            "--dino",
            "--lm",
            "--out",
            "--cache",
        ];
        let values = [
            clips,
            captions,
            Path::new("dino"),
            Path::new("lm"),
            out,
            cache,
        ];
        let args: Vec<&Path> = flags
            .iter()
            .zip(values)
            .flat_map(|(flag, value)| [Path::new(flag), value])
            .collect();
        run("foveated_train", &args)
    };
    let elsewhere = dir.path().join("elsewhere");
    refused(
        &foveated(&clips, &captions, &out, &elsewhere),
        "the training captions (--captions)",
    );
    refused(
        &foveated(&clips, &data.valid, &clips.join("run"), &elsewhere),
        "is inside the training clips (--clips)",
    );
    refused(
        &foveated(&clips, &data.valid, &elsewhere, &clips.join("cache")),
        "--cache",
    );
    let exp0 = run(
        "exp0_mc",
        &[
            Path::new("--images"),
            &clips,
            Path::new("--out"),
            &clips.join("results"),
        ],
    );
    refused(&exp0, "is inside the images (--images)");
    assert_eq!(snapshot(dir.path()), before, "a refused run changed files");
}

/// md checks everything before it writes: a refused run leaves an earlier trajectory whole,
/// and a finished one replaces it whole.
#[test]
fn md_truncates_nothing_it_refuses() {
    let (dir, input, model) = scratch();
    let trajectory = dir.path().join("md.extxyz");
    fs::write(&trajectory, "an earlier run's trajectory").unwrap();
    let md = |flags: &[&str]| {
        let mut args = vec![
            Path::new("--model"),
            &model,
            Path::new("--input"),
            &input,
            Path::new("--trajectory"),
            &trajectory,
            Path::new("--steps"),
            Path::new("4"),
        ];
        args.extend(flags.iter().map(Path::new));
        run("md", &args)
    };
    let before = snapshot(dir.path());
    refused(&md(&["--frame", "99"]), "no frame 99");
    refused(&md(&["--timestep", "-1"]), "--timestep");
    refused(&md(&["--temperature", "nan"]), "--temperature");
    refused(&md(&["--temperature", "-5"]), "must be a finite number ≥ 0");
    refused(&md(&["--every", "0"]), "--every");
    assert_eq!(snapshot(dir.path()), before, "a refused run changed files");
    // Atoms on top of each other stop the run naming the file, its line and the frame.
    let overlapping = dir.path().join("overlapping.extxyz");
    fs::write(
        &overlapping,
        "2\nProperties=species:S:1:pos:R:3 pbc=\"F F F\"\nH 0 0 0\nH 0 0 0.00001\n",
    )
    .unwrap();
    let output = run(
        "md",
        &[
            Path::new("--model"),
            &model,
            Path::new("--input"),
            &overlapping,
            Path::new("--trajectory"),
            &trajectory,
        ],
    );
    refused(
        &output,
        &format!("{}:1: --frame 0: ", overlapping.display()),
    );
    refused(&output, "atoms 1 and 2 overlap");
    assert_eq!(
        fs::read_to_string(&trajectory).unwrap(),
        "an earlier run's trajectory"
    );
    succeeded(&md(&[]));
    assert!(fs::read_to_string(&trajectory).unwrap().contains("energy="));
}

/// Flags outside their domain are refused naming the flag, before any work.
#[test]
fn impossible_settings_are_refused_by_flag() {
    let (dir, input, model) = scratch();
    let output = dir.path().join("out.extxyz");
    let before = snapshot(dir.path());
    let ff = run(
        "forcefield",
        &[
            Path::new("--model"),
            &model,
            Path::new("--input"),
            &input,
            Path::new("--output"),
            &output,
            Path::new("--batch"),
            Path::new("0"),
        ],
    );
    refused(&ff, "--batch");
    let data = common::labelled::data();
    let out = dir.path().join("run");
    let zero = [
        "--energy-weight",
        "0",
        "--force-weight",
        "0",
        "--cosine-weight",
        "0",
    ];
    refused(
        &train_forcefield(&data.train, &data.valid, &out, &zero),
        "would train nothing",
    );
    for flag in ["--cutoff", "--lr"] {
        refused(
            &train_forcefield(&data.train, &data.valid, &out, &[flag, "-1"]),
            flag,
        );
    }
    for (flag, value) in [
        ("--temperature", "-1"),
        ("--temperature", "nan"),
        ("--top-p", "1.5"),
    ] {
        let generate = run(
            "generate",
            &[
                Path::new("--model-dir"),
                &model,
                Path::new("--prompt"),
                Path::new("hello"),
                Path::new(flag),
                Path::new(value),
            ],
        );
        refused(&generate, &format!("invalid value '{value}' for '{flag}"));
    }
    assert_eq!(snapshot(dir.path()), before);
}

/// A directory that already holds results is a run: files no run recorded are never replaced;
/// the identical run resumes; other settings or other data are refused, naming them; a damaged
/// newest checkpoint (model or optimizer bytes flipped) is moved aside with a warning and the
/// one before it resumed.
#[test]
fn a_run_directory_resumes_only_its_own_run() {
    let data = common::labelled::data();
    let dir = tempfile::tempdir().unwrap();

    let users = dir.path().join("users");
    fs::create_dir_all(users.join("model")).unwrap();
    fs::write(users.join("summary.json"), "the user's").unwrap();
    let before = snapshot(&users);
    refused(
        &train_forcefield(&data.train, &data.valid, &users, &[]),
        "no run.json",
    );
    refused(
        &run("train_classifier", &[Path::new("--out"), &users]),
        "summary.json, which no kiln run recorded",
    );
    assert_eq!(snapshot(&users), before, "a refused run changed files");

    let out = dir.path().join("run");
    let step = ["--max-steps-now", "1"];
    succeeded(&train_forcefield(&data.train, &data.valid, &out, &step));
    succeeded(&train_forcefield(&data.train, &data.valid, &out, &step));
    let ours = snapshot(&out);

    // Other data: the validation set cut, the training forces edited.
    let valid = dir.path().join("valid.extxyz");
    let frames = kiln::forcefield::read_extxyz(&fs::read_to_string(&data.valid).unwrap()).unwrap();
    fs::write(&valid, kiln::forcefield::write_extxyz(&frames[..4])).unwrap();
    refused(
        &train_forcefield(&data.train, &valid, &out, &step),
        "data.valid.structures: earlier run 12, this run 4",
    );
    let train = dir.path().join("train.extxyz");
    let mut frames =
        kiln::forcefield::read_extxyz(&fs::read_to_string(&data.train).unwrap()).unwrap();
    frames[0].arrays.get_mut("forces").unwrap().1[0] += 0.1;
    fs::write(&train, kiln::forcefield::write_extxyz(&frames)).unwrap();
    refused(
        &train_forcefield(&train, &data.valid, &out, &step),
        "data.train.checksum",
    );
    refused(
        &train_forcefield(&data.train, &data.valid, &out, &["--seed", "1"]),
        "holds a run with other settings",
    );
    assert_eq!(snapshot(&out), ours, "a refused run changed files");

    // Damaged checkpoints: flipped bytes in the newest one's model, then its optimizer state.
    for file in ["model.bin", "optimizer.bin"] {
        let newest = out.join("checkpoints/step-00000002").join(file);
        let mut bytes = fs::read(&newest).unwrap();
        let middle = bytes.len() / 2;
        bytes[middle] ^= 0x5A;
        fs::write(&newest, bytes).unwrap();
        let stderr = succeeded(&train_forcefield(&data.train, &data.valid, &out, &step));
        assert!(
            stderr.contains("is damaged") && stderr.contains(file),
            "{stderr}"
        );
        assert!(
            stderr.contains("resuming from") && stderr.contains("step-00000001"),
            "{stderr}"
        );
        fs::remove_dir_all(out.join("checkpoints/damaged-step-00000002")).unwrap();
    }
}

/// A small tmpfs mounted at a new directory in `dir`, unmounted when dropped; `None` where this
/// process may not mount (not root, or not Linux).
struct SmallDisk(PathBuf);

impl SmallDisk {
    fn mount(dir: &Path, size: &str) -> Option<Self> {
        let at = dir.join(format!("disk-{size}"));
        fs::create_dir_all(&at).unwrap();
        let options = format!("size={size}");
        let mounted = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &options, "tmpfs"])
            .arg(&at)
            .output()
            .is_ok_and(|output| output.status.success());
        mounted.then_some(SmallDisk(at))
    }

    fn grow(&self) {
        let grown = Command::new("mount")
            .args(["-o", "remount,size=16m"])
            .arg(&self.0)
            .status()
            .unwrap();
        assert!(grown.success());
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
    }
}

/// A disk that fills up while a run writes (its metrics, a checkpoint's model, optimizer state
/// or state) stops the run with "no space left on the device while writing" and the file, never
/// a Debug dump; once space is freed, the same command resumes and finishes the run.
#[test]
fn a_full_disk_is_said_as_such_and_the_rerun_finishes() {
    let data = common::labelled::data();
    let dir = tempfile::tempdir().unwrap();
    for size in ["8k", "20k", "28k", "40k"] {
        let Some(disk) = SmallDisk::mount(dir.path(), size) else {
            eprintln!("skipped: this process cannot mount a small tmpfs (needs root on Linux)");
            return;
        };
        let out = disk.0.join("run");
        let full = train_forcefield(&data.train, &data.valid, &out, &[]);
        refused(&full, "no space left on the device while writing");
        let stderr = String::from_utf8_lossy(&full.stderr);
        assert!(
            !stderr.contains("Io {") && !stderr.contains("Os {"),
            "a Debug dump:\n{stderr}"
        );
        disk.grow();
        succeeded(&train_forcefield(&data.train, &data.valid, &out, &[]));
        assert!(out.join("model/model.safetensors").is_file());
    }
}

/// What a run killed while generating its images left (a staging directory of a process that
/// is gone) is removed by the next run.
#[test]
fn a_killed_runs_temporaries_are_removed_by_the_next_run() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("run");
    // No process has this id (above the kernel's limit): its writer is gone.
    let stale = out.join("images/.train.kiln-4194305-0.tmp");
    fs::create_dir_all(&stale).unwrap();
    fs::write(stale.join("c0_00000.png"), "half an image").unwrap();
    let long_ago = SystemTime::now() - Duration::from_secs(3600);
    fs::File::open(&stale)
        .unwrap()
        .set_modified(long_ago)
        .unwrap();
    let flags = [
        "--steps",
        "1",
        "--train-images",
        "8",
        "--eval-images",
        "4",
        "--batch",
        "4",
    ];
    let mut args = vec![Path::new("--out"), out.as_path()];
    args.extend(flags.iter().map(Path::new));
    succeeded(&run("train_classifier", &args));
    assert!(!stale.exists(), "the stale temporary is still there");
    assert!(out.join("images/train/generated.json").is_file());
}

/// An example's numeric flag: (example, flag, whether a value is in its domain).
type NumericFlag = (&'static str, &'static str, fn(&str) -> bool);

/// Every numeric flag of every example.
const NUMERIC_FLAGS: &[NumericFlag] = &[
    ("forcefield", "--batch", |v| kiln::cli::count(v).is_ok()),
    ("embed", "--batch", |v| kiln::cli::count(v).is_ok()),
    ("foveated_synthetic", "--eval-every", |v| {
        kiln::cli::count_u64(v).is_ok()
    }),
    ("md", "--steps", |v| kiln::cli::count(v).is_ok()),
    ("md", "--every", |v| kiln::cli::count(v).is_ok()),
    ("md", "--timestep", |v| {
        kiln::cli::positive(v).is_ok_and(|t| t <= kiln::forcefield::MAX_TIMESTEP_FS)
    }),
    ("md", "--temperature", |v| {
        kiln::cli::non_negative(v).is_ok_and(|t| t <= kiln::forcefield::MAX_TEMPERATURE_K)
    }),
    ("md", "--skin", |v| kiln::cli::non_negative(v).is_ok()),
    ("generate", "--temperature", |v| {
        kiln::cli::non_negative(v).is_ok()
    }),
    ("generate", "--top-p", |v| kiln::cli::probability(v).is_ok()),
    ("train_forcefield", "--batch", |v| {
        kiln::cli::count(v).is_ok()
    }),
    ("train_forcefield", "--epochs", |v| {
        kiln::cli::count(v).is_ok()
    }),
    ("train_forcefield", "--n-atom-basis", |v| {
        kiln::cli::count(v).is_ok()
    }),
    ("train_forcefield", "--cutoff", |v| {
        kiln::cli::positive(v).is_ok()
    }),
    ("train_forcefield", "--lr", |v| {
        kiln::cli::positive(v).is_ok()
    }),
    ("train_forcefield", "--force-weight", |v| {
        kiln::cli::non_negative(v).is_ok()
    }),
    ("train_classifier", "--batch", |v| {
        kiln::cli::count(v).is_ok()
    }),
    ("train_classifier", "--steps", |v| {
        kiln::cli::count(v).is_ok()
    }),
    ("train_classifier", "--lr", |v| {
        kiln::cli::positive(v).is_ok()
    }),
    ("foveated_train", "--frames", |v| {
        kiln::cli::count_up_to::<4096>(v).is_ok()
    }),
    ("foveated_train", "--eval-every", |v| {
        kiln::cli::count(v).is_ok()
    }),
    ("foveated_train", "--lambda", |v| {
        kiln::cli::non_negative(v).is_ok()
    }),
    ("foveated_train", "--connector-lr", |v| {
        kiln::cli::positive(v).is_ok()
    }),
    ("foveated_synthetic", "--cell", |v| {
        kiln::cli::count(v).is_ok()
    }),
    ("foveated_synthetic", "--token-width", |v| {
        kiln::cli::count(v).is_ok()
    }),
    ("foveated_synthetic", "--lr", |v| {
        kiln::cli::positive(v).is_ok()
    }),
    ("foveated_synthetic", "--all-patches-lr", |v| {
        kiln::cli::positive(v).is_ok()
    }),
    ("realtime", "--streams", |v| {
        kiln::cli::count_up_to::<256>(v).is_ok()
    }),
    ("realtime", "--size", |v| {
        kiln::cli::count_up_to::<4096>(v).is_ok()
    }),
    ("latentwire", "--encoder-layers", |v| {
        kiln::cli::count_up_to::<64>(v).is_ok()
    }),
];

/// Numbers a hand or a script might pass: zero, negatives, NaN, infinities, overflows, words,
/// nothing, and arbitrary floats and integers.
fn hostile_number() -> impl proptest::strategy::Strategy<Value = String> {
    use proptest::prelude::*;
    prop_oneof![
        prop::sample::select(vec![
            "0",
            "-0",
            "-1",
            "nan",
            "NaN",
            "inf",
            "-inf",
            "1e400",
            "-1e-400",
            "",
            "ten",
            "0x10",
            "18446744073709551616",
            "1.5",
            " 3",
            "1_000",
        ])
        .prop_map(str::to_string),
        any::<f64>().prop_map(|v| v.to_string()),
        any::<i64>().prop_map(|v| v.to_string()),
    ]
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(48))]

    /// A value outside a numeric flag's domain is refused before any work, naming the flag,
    /// never a panic: checked on the example binaries themselves.
    #[test]
    fn numeric_flags_outside_their_domain_are_refused_by_name(
        pick in proptest::prelude::any::<proptest::sample::Index>(),
        value in hostile_number(),
    ) {
        let (example, flag, accepts) = NUMERIC_FLAGS[pick.index(NUMERIC_FLAGS.len())];
        proptest::prop_assume!(!accepts(&value));
        let output = Command::new(common::example(example))
            .arg(format!("{flag}={value}"))
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        proptest::prop_assert!(!output.status.success(), "{example} {flag}={value} accepted");
        proptest::prop_assert!(!stderr.contains("panicked"), "{stderr}");
        proptest::prop_assert!(stderr.contains(&format!("'{flag}")), "{stderr}");
    }
}

/// One H atom in a 0.5 Å cell sits 0.5 Å from its own images, closer than any bond: the force
/// field gives a number (−8 076 eV with the fixture) and now says it extrapolates, as
/// train_forcefield says of such a training structure.
#[test]
fn atoms_closer_than_any_bond_are_warned_of() {
    let (dir, _, model) = scratch();
    let lone = dir.path().join("lone.extxyz");
    fs::write(
        &lone,
        "1\nLattice=\"0.5 0 0 0 0.5 0 0 0 0.5\" Properties=species:S:1:pos:R:3 pbc=\"T T T\"\n\
         H 0.1 0.1 0.1\n",
    )
    .unwrap();
    let output = dir.path().join("out.extxyz");
    let stderr = succeeded(&forcefield(&model, &lone, &output));
    assert!(
        stderr.contains("lone.extxyz:")
            && stderr
                .contains("warning: two atoms (or an atom and a periodic image) are 0.500 Å apart"),
        "{stderr}"
    );
    assert!(output.exists());
}
