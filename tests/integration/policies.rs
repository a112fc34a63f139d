//! Every documented `--policy` value in every example that takes one, on the tiny fixtures, on
//! the CPU (host kernels: f32, and bf16 products where the CPU has AMX or AVX512-BF16): each run
//! succeeds and writes its results. The examples' own tests check what the results hold; the
//! frame models' policies are `realtime_example`'s, `train_classifier`'s `train_example`'s.

use std::path::Path;
use std::process::{Command, Output};

use crate::common::{self, fixtures};
use crate::foveated_example::{captioned_clips, tiny_dino, train};
use crate::latentwire_example::{SHORT, text_fixture};

/// The presets the examples' `--policy` help lists for inference.
const PRESETS: [&str; 4] = ["full", "mixed-f16", "mixed-bf16", "pure-f16"];

/// `example args --policy policy`, with its image cache in `cache`, checked to have succeeded.
fn runs(example: &str, args: &[&str], policy: &str, cache: &Path) -> Output {
    let output = Command::new(common::example(example))
        .args(args)
        .args(["--policy", policy])
        .env("KILN_CACHE_DIR", cache)
        .output()
        .unwrap_or_else(|e| panic!("the {example} example is built with the tests: {e}"));
    let args = [args, &["--policy", policy]].concat();
    common::succeeded(output, &args)
}

#[test]
fn devices_resolves_every_preset() {
    let cache = tempfile::tempdir().unwrap();
    for policy in PRESETS {
        let output = runs("devices", &["--device", "cpu"], policy, cache.path());
        assert!(!output.stdout.is_empty(), "{policy}: no report");
    }
}

#[test]
fn embed_and_exp0_mc_run_under_every_preset() {
    let (cache, out) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let images = fixtures().join("images");
    let images = images.to_str().unwrap();
    for policy in PRESETS {
        let file = out.path().join(format!("{policy}.safetensors"));
        let model = fixtures().join("dinov2");
        let args = ["--model-dir", model.to_str().unwrap(), "--images", images];
        let file_args = ["--out", file.to_str().unwrap(), "--batch", "2"];
        runs(
            "embed",
            &[&args[..], &file_args].concat(),
            policy,
            cache.path(),
        );
        assert!(
            file.is_file(),
            "embed --policy {policy} wrote no embeddings"
        );

        let results = out.path().join(policy);
        let model = fixtures().join("clip_vision");
        let args = ["--model-dir", model.to_str().unwrap(), "--images", images];
        let run = [
            "--passes",
            "2",
            "--trials",
            "2",
            "--out",
            results.to_str().unwrap(),
        ];
        runs("exp0_mc", &[&args[..], &run].concat(), policy, cache.path());
        assert!(
            results.join("summary.json").is_file(),
            "exp0_mc --policy {policy}"
        );
    }
}

#[test]
fn generate_runs_under_every_preset() {
    let cache = tempfile::tempdir().unwrap();
    let model = text_fixture("llama");
    for policy in PRESETS {
        let args = [
            "--model-dir",
            model.to_str().unwrap(),
            "--prompt",
            "A language model predicts",
            "--max-new-tokens",
            "2",
        ];
        let output = runs("generate", &args, policy, cache.path());
        assert!(!output.stdout.is_empty(), "generate --policy {policy}");
    }
}

/// The training examples' presets: `full`, `mixed-bf16` (CPU autocast), `mixed-f16` (dynamic
/// loss scaling), and fVLM's own LM precision.
#[test]
fn the_training_examples_run_under_every_preset() {
    let (cache, dir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (clips, captions) = captioned_clips(dir.path(), 3, 4);
    let short = [
        "--variant",
        "research",
        "--frames",
        "4",
        "--steps",
        "2",
        "--eval-every",
        "2",
    ];
    for policy in ["full", "mixed-bf16", "mixed-f16"] {
        let out = dir.path().join(format!("foveated-{policy}"));
        let flags = [&short[..], &["--policy", policy]].concat();
        let output = train(&out, &clips, &captions, &tiny_dino(), &flags);
        common::succeeded(output, &flags);
        assert!(
            out.join("summary.json").is_file(),
            "foveated_train --policy {policy}"
        );
    }
    let out = dir.path().join("foveated-fvlm-lm");
    let fvlm_lm = [
        "--policy",
        "mixed-bf16",
        "--lm-policy",
        "p=bf16,c=bf16,o=f32",
    ];
    let flags = [&short[..], &fvlm_lm].concat();
    common::succeeded(train(&out, &clips, &captions, &tiny_dino(), &flags), &flags);
    for policy in ["full", "mixed-bf16"] {
        let out = dir.path().join(format!("latentwire-{policy}"));
        // Its built-in tiny language models (the fixture Llama reads too few positions).
        let args = [&["--out", out.to_str().unwrap()][..], &SHORT].concat();
        runs("latentwire", &args, policy, cache.path());
        assert!(
            out.join("summary.json").is_file(),
            "latentwire --policy {policy}"
        );
    }
}
