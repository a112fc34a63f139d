//! The `generate` example end to end on kiln-text's committed tiny checkpoints (a contract:
//! `--model-dir`, `--model`, `--prompt`, `--max-new-tokens`, `--logits` and the output names are
//! checked here): `--logits` writes transformers' logits for the prompt (from a directory and from
//! a GGUF file), and greedy generation streams transformers' continuation. Runs the example binary that `cargo test` builds beside the tests.

use std::path::PathBuf;
use std::process::{Command, Output};

use kiln::text::TextTokenizer;

use crate::common;

fn text_fixtures() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("crates/kiln-text/tests/fixtures")
}

fn generate(args: &[&str]) -> Output {
    let output = Command::new(common::example("generate"))
        .args(args)
        .output()
        .expect("the generate example is built with the tests");
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    output
}

/// The reference's i64 table `key` `[rows, columns]`.
fn table(file: &std::path::Path, key: &str) -> Vec<Vec<i64>> {
    let bytes = std::fs::read(file).unwrap();
    let tensors = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let view = tensors.tensor(key).unwrap();
    let values: Vec<i64> = view
        .data()
        .chunks_exact(8)
        .map(|b| i64::from_le_bytes(b.try_into().unwrap()))
        .collect();
    values
        .chunks(view.shape()[1])
        .map(<[i64]>::to_vec)
        .collect()
}

/// From a directory: f32 within 1e-4; with the matrices rounded to bf16 (`--weights bf16`),
/// within their rounding (kiln-text's parity test: 1.4% of the largest logit on this model).
#[test]
fn logits_of_the_prompt_are_transformers() {
    let model = text_fixtures().join("qwen2");
    let model = model.to_str().unwrap();
    check_logits(&["--model-dir", model], "qwen2.safetensors", 1e-4);
    let bf16 = ["--model-dir", model, "--weights", "bf16"];
    check_logits(&bf16, "qwen2.safetensors", 5e-2);
}

/// `--model FILE.gguf`: transformers' logits from its own reading of the same file, with every
/// tensor decoded (`--weights f32`) within 1e-4; with the quantized matrices multiplied as
/// stored (the default), within the activations' 8-bit rounding (kiln-text's parity test:
/// a few percent of the largest logit on this random model).
#[test]
fn logits_from_a_gguf_file_are_transformers() {
    let model = text_fixtures().join("gguf/llama.gguf");
    let model = model.to_str().unwrap();
    let reference = "gguf/llama.safetensors";
    check_logits(&["--model", model, "--weights", "f32"], reference, 1e-4);
    check_logits(&["--model", model], reference, 5e-2);
}

/// `--logits` of the reference batch's second prompt (unpadded) from the model `model_args`
/// names, against the reference file `reference`'s, within `tolerance` of its largest.
fn check_logits(model_args: &[&str], reference: &str, tolerance: f64) {
    let out = tempfile::tempdir().unwrap();
    let file = out.path().join("logits.safetensors");
    let prompt = ["--prompt", "A language model predicts", "--logits"];
    let output = generate(&[model_args, &prompt[..], &[file.to_str().unwrap()]].concat());
    // The run says how it holds the weights.
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("weights: "), "{stderr}");
    let reference = text_fixtures().join(reference);
    let ids = table(&reference, "input_ids")[1].clone();
    let bytes = std::fs::read(&file).unwrap();
    let written = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let input_ids = written.tensor("input_ids").unwrap();
    assert_eq!(input_ids.dtype(), safetensors::Dtype::I64);
    let written_ids: Vec<i64> = input_ids
        .data()
        .chunks_exact(8)
        .map(|b| i64::from_le_bytes(b.try_into().unwrap()))
        .collect();
    assert_eq!(written_ids, ids);
    let (logits, shape) = common::read_f32(&file, "logits");
    let (expected, expected_shape) = common::read_f32(&reference, "logits");
    assert_eq!(shape, expected_shape[1..]);
    let error = common::relative_f32(&logits, &expected[expected.len() / 2..]);
    assert!(error <= tolerance, "{error} (tolerance {tolerance})");
}

#[test]
fn greedy_generation_streams_transformers_continuation() {
    let model = text_fixtures().join("llama");
    let output = generate(&[
        "--model-dir",
        model.to_str().unwrap(),
        "--prompt",
        "A language model predicts",
        "--max-new-tokens",
        "6",
    ]);
    let generated = table(&text_fixtures().join("llama.safetensors"), "generated");
    let prompt = table(&text_fixtures().join("llama.safetensors"), "input_ids")[1].len();
    let new: Vec<u32> = generated[1][prompt..].iter().map(|&id| id as u32).collect();
    let tokenizer = TextTokenizer::from_hf_dir(&model).unwrap();
    let want = format!(
        "A language model predicts{}\n",
        tokenizer.decode(&new, true).unwrap()
    );
    assert_eq!(String::from_utf8_lossy(&output.stdout), want);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("prefill:") && stderr.contains("decode:"),
        "{stderr}"
    );
    assert!(stderr.contains("tokens/s"), "{stderr}");
}

#[test]
fn bad_input_is_refused_clearly() {
    let run = |args: &[&str]| {
        let output = Command::new(common::example("generate"))
            .args(args)
            .output()
            .unwrap();
        assert!(!output.status.success());
        String::from_utf8_lossy(&output.stderr).to_string()
    };
    let model = text_fixtures().join("llama");
    let model = model.to_str().unwrap();
    let empty = run(&["--model-dir", model, "--prompt", ""]);
    assert!(empty.contains("empty"), "{empty}");
    let long = "fox ".repeat(100);
    let long = run(&["--model-dir", model, "--prompt", &long]);
    assert!(long.contains("max_position_embeddings"), "{long}");
    let fixtures = text_fixtures();
    let nothing = run(&["--model-dir", fixtures.to_str().unwrap(), "--prompt", "x"]);
    assert!(nothing.contains("no tokenizer.json"), "{nothing}");
    let missing = run(&["--model", "missing.gguf", "--prompt", "x"]);
    assert!(missing.contains("missing.gguf"), "{missing}");
    let both = run(&["--model", "a.gguf", "--model-dir", model, "--prompt", "x"]);
    assert!(both.contains("cannot be used with"), "{both}");
    // A directory given to --model and a GGUF file to --model-dir: the mix-up is named.
    let dir_as_file = run(&["--model", model, "--prompt", "x"]);
    assert!(
        dir_as_file.contains("is a directory, where a file is read")
            && dir_as_file.contains("goes to --model-dir"),
        "{dir_as_file}"
    );
    let gguf = fixtures.join("gguf/llama.gguf");
    let file_as_dir = run(&["--model-dir", gguf.to_str().unwrap(), "--prompt", "x"]);
    assert!(
        file_as_dir.contains("is a file, where a directory is read")
            && file_as_dir.contains("goes to --model"),
        "{file_as_dir}"
    );
}

/// Logits the model cannot give (a final norm so large that f32 overflows: the loader already
/// refuses NaN weights) are refused as generation refuses them, and no file is written: a file
/// of NaN logits passed for a result.
#[test]
fn non_finite_logits_are_refused_and_not_written() {
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("qwen2");
    std::fs::create_dir(&model).unwrap();
    for entry in std::fs::read_dir(text_fixtures().join("qwen2")).unwrap() {
        let path = entry.unwrap().path();
        std::fs::copy(&path, model.join(path.file_name().unwrap())).unwrap();
    }
    let bytes = std::fs::read(model.join("model.safetensors")).unwrap();
    let tensors = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let huge = (f32::MAX / 2.0).to_le_bytes().repeat(64);
    let views: Vec<(String, safetensors::tensor::TensorView)> = tensors
        .tensors()
        .into_iter()
        .map(|(name, view)| {
            if name != "model.norm.weight" {
                return (name, view);
            }
            assert_eq!(view.dtype(), safetensors::Dtype::F32);
            let data = &huge[..view.data().len()];
            let shape = view.shape().to_vec();
            (
                name,
                safetensors::tensor::TensorView::new(view.dtype(), shape, data).unwrap(),
            )
        })
        .collect();
    std::fs::write(
        model.join("model.safetensors"),
        safetensors::serialize(views, None).unwrap(),
    )
    .unwrap();
    let out = dir.path().join("logits.safetensors");
    let output = Command::new(common::example("generate"))
        .args(["--model-dir", model.to_str().unwrap(), "--prompt", "a fox"])
        .arg("--logits")
        .arg(&out)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "{stderr}");
    assert!(
        stderr.contains("NaN or infinite") && stderr.contains("was not written"),
        "{stderr}"
    );
    assert!(!out.exists());
}
