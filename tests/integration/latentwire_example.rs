//! The `latentwire` example from outside, as issue 53's contract says: its flags (`--lm`,
//! `--out`, `--latents`, `--steps`, `--max-steps-now`, `--batch`, `--policy`, `--device`), its
//! outputs (`metrics.jsonl`, `curves.png`, `summary.json` with each language model's `text`,
//! `latent` and `token_budget` scores, `compression` and `payload_bytes`), a run stopped and
//! rerun ending as the uninterrupted one, and bad inputs refused with clear errors. Runs on the
//! two tiny built-in models and kiln-text's committed tiny checkpoint.

use std::path::{Path, PathBuf};
use std::process::Output;

use serde_json::Value;

use crate::common;

/// A short run: 4 steps of 4 items, evaluated every 2, a one-layer encoder.
pub(crate) const SHORT: [&str; 14] = [
    "--steps",
    "4",
    "--eval-every",
    "2",
    "--batch",
    "4",
    "--latents",
    "4",
    "--train-items",
    "24",
    "--eval-items",
    "4",
    "--encoder-layers",
    "1",
];

fn run(out: &Path, args: &[&str]) -> Output {
    common::run_example("latentwire", out, args)
}

fn succeeds(out: &Path, args: &[&str]) -> Output {
    common::succeeded(run(out, args), args)
}

fn fails(out: &Path, args: &[&str]) -> String {
    common::failed(run(out, args), args)
}

/// The summary without its wall time.
fn results(out: &Path) -> Value {
    let mut summary = common::summary(out);
    summary.as_object_mut().unwrap().remove("wall_seconds");
    summary
}

fn losses(out: &Path) -> Vec<String> {
    let lines = kiln::train::read_metrics(out).unwrap();
    lines.iter().map(|l| l["loss"].to_string()).collect()
}

#[test]
fn the_builtin_models_run_the_pipeline_and_write_the_contracts_files() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("run");
    let output = succeeds(&out, &SHORT);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("built-in"), "{stderr}");
    let summary = common::summary(&out);
    for name in ["tiny-llama", "tiny-qwen2"] {
        let lm = &summary[name];
        for kind in ["text", "latent", "token_budget"] {
            for key in ["nll", "first_token_accuracy", "em", "f1"] {
                assert!(lm[kind][key].is_number(), "{name}.{kind}.{key}: {lm}");
            }
        }
        assert!(lm["compression"].as_f64().unwrap() > 1.0, "{lm}");
        assert_eq!(lm["payload_bytes"], 4 * 256 * 4);
    }
    assert!(
        std::fs::read(out.join("curves.png"))
            .unwrap()
            .starts_with(b"\x89PNG")
    );
    let lines = kiln::train::read_metrics(&out).unwrap();
    assert_eq!(lines.len(), 4);
    assert!(
        lines[1]["eval_tiny-qwen2/latent/nll"].is_number(),
        "{}",
        lines[1]
    );
}

/// `--encoder states`: the interlingua pools the first model's hidden states, and the run
/// writes the same files.
#[test]
fn the_state_encoder_runs_the_pipeline() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("states");
    let args: Vec<&str> = SHORT
        .iter()
        .copied()
        .chain(["--encoder", "states"])
        .collect();
    succeeds(&out, &args);
    let summary = common::summary(&out);
    assert!(
        summary["tiny-qwen2"]["latent"]["nll"].is_number(),
        "{summary}"
    );
}

/// `--max-steps-now 1`, then the same command twice more, ends with the uninterrupted run's
/// losses and scores.
#[test]
fn a_stopped_run_rerun_ends_as_the_uninterrupted_one() {
    let dir = tempfile::tempdir().unwrap();
    let (whole, stopped) = (dir.path().join("whole"), dir.path().join("stopped"));
    succeeds(&whole, &SHORT);
    let once: Vec<&str> = SHORT
        .iter()
        .copied()
        .chain(["--max-steps-now", "1"])
        .collect();
    succeeds(&stopped, &once);
    assert!(!stopped.join("summary.json").exists());
    let twice: Vec<&str> = SHORT
        .iter()
        .copied()
        .chain(["--max-steps-now", "2"])
        .collect();
    succeeds(&stopped, &twice);
    succeeds(&stopped, &SHORT);
    assert_eq!(losses(&stopped), losses(&whole));
    assert_eq!(results(&stopped), results(&whole));
}

pub(crate) fn text_fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("crates/kiln-text/tests/fixtures")
        .join(name)
}

#[test]
fn bad_inputs_are_refused_with_clear_errors() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("run");
    let missing = dir.path().join("no-such-model");
    let error = fails(&out, &["--lm", missing.to_str().unwrap()]);
    assert!(error.contains("no-such-model"), "{error}");
    let error = fails(&out, &["--latents", "0"]);
    assert!(error.contains("--latents"), "{error}");
    let error = fails(&out, &["--encoder", "words"]);
    assert!(error.contains("`bytes` or `states`"), "{error}");
    let error = fails(&out, &["--train-items", "0"]);
    assert!(error.contains("--train-items"), "{error}");
    // Policies LatentWire cannot run (pure half, f64) are refused before any work; they
    // panicked on a dtype mismatch.
    for policy in ["pure-f16", "bf16", "p=f64,c=f64"] {
        let error = fails(&out, &["--policy", policy]);
        assert!(
            error.contains("use full, mixed-bf16 or mixed-f16"),
            "{error}"
        );
    }
    // OUT is claimed before the tokenized splits are written: a directory holding tokens/ that
    // no run recorded is refused and left as it was.
    let users = dir.path().join("users");
    std::fs::create_dir_all(users.join("tokens")).unwrap();
    std::fs::write(users.join("tokens/train.json"), "mine").unwrap();
    let error = fails(&users, &SHORT);
    assert!(error.contains("tokens"), "{error}");
    assert_eq!(
        std::fs::read(users.join("tokens/train.json")).unwrap(),
        b"mine"
    );
    // kiln-text's tiny checkpoint has 64 positions: not even the chat template fits.
    let lm = text_fixture("llama");
    let error = fails(&out, &["--lm", lm.to_str().unwrap(), "--train-items", "4"]);
    assert!(
        error.contains("chat template") && error.contains("64 positions"),
        "{error}"
    );
}
