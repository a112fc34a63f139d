//! The `latentwire` example from outside, as issue 53's contract says: its flags (`--lm`,
//! `--out`, `--latents`, `--steps`, `--max-steps-now`, `--batch`, `--policy`, `--device`), its
//! outputs (`metrics.jsonl`, `curves.png`, `summary.json` with each language model's `text`,
//! `latent` and `token_budget` scores, `compression` and `payload_bytes`; issue 84's additions:
//! the baselines that know the question or read another item's latent, per-relation scores,
//! LatentWire's measures, `--layout latentwire`), a run stopped and
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
        for kind in KINDS {
            for key in SCORES {
                assert!(lm[kind][key].is_number(), "{name}.{kind}.{key}: {lm}");
            }
            assert!(
                lm[kind]["standard_errors"]["nll"].is_number(),
                "{name}.{kind}: {lm}"
            );
            assert_eq!(lm[kind]["items"], 4, "{name}.{kind}");
        }
        let relations = lm["by_relation"].as_object().unwrap();
        let items: u64 = relations
            .values()
            .map(|r| r["items"].as_u64().unwrap())
            .sum();
        assert_eq!(items, 4, "{lm}");
        for (relation, scores) in relations {
            assert!(scores["answer_first_tokens"].is_object(), "{relation}");
            for kind in KINDS {
                assert!(scores[kind]["f1"].is_number(), "{relation}.{kind}");
            }
        }
        assert!(lm["compression"].as_f64().unwrap() > 1.0, "{lm}");
        let prompt = lm["prompt_compression"].as_f64().unwrap();
        assert!(prompt > lm["compression"].as_f64().unwrap(), "{lm}");
        assert_eq!(lm["payload_bytes"], 4 * 256 * 4);
        assert_spread(&lm["prefix_spread"]);
    }
    assert_spread(&summary["latent_spread"]);
    assert_eq!(summary["layout"], "chat");
    for key in [
        "rescored_em",
        "rescored_f1",
        "agreement",
        "oracle_em",
        "oracle_f1",
    ] {
        assert!(summary["joint"][key].is_number(), "joint.{key}: {summary}");
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

/// A spread's parts, each at least 0, adding up in squares to the whole.
fn assert_spread(spread: &Value) {
    let part = |key: &str| {
        spread[key]
            .as_f64()
            .unwrap_or_else(|| panic!("{key}: {spread}"))
    };
    let (whole, between, within) = (
        part("between_items"),
        part("between_relations"),
        part("within_relations"),
    );
    assert!(whole > 0.0 && between >= 0.0 && within >= 0.0, "{spread}");
    assert!(
        (between.powi(2) + within.powi(2) - whole.powi(2)).abs() < 1e-9,
        "{spread}"
    );
}

/// With `--eval-every` past `--steps` the trainer scores nothing along the way: the final
/// evaluation alone writes the held-out scores.
#[test]
fn evaluating_past_the_run_scores_only_at_the_end() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("run");
    let mut args = SHORT;
    args[3] = "9";
    succeeds(&out, &args);
    let lines = kiln::train::read_metrics(&out).unwrap();
    assert_eq!(lines.len(), 4);
    let scored = |line: &Value| {
        line.as_object()
            .unwrap()
            .keys()
            .any(|k| k.starts_with("eval_"))
    };
    assert!(!lines.iter().any(scored), "{lines:?}");
    assert!(common::summary(&out)["tiny-llama"]["latent"]["nll"].is_number());
}

/// Every prompt kind of summary.json: issue 53's three, then issue 84's.
const KINDS: [&str; 6] = kiln::latentwire::PROMPT_KINDS;

#[test]
fn the_prompt_kinds_are_the_contracts() {
    let [text, latent, budget, rest @ ..] = KINDS;
    assert_eq!([text, latent, budget], ["text", "latent", "token_budget"]);
    let added = ["question_only", "token_budget_question", "shuffled_latent"];
    assert!(added.iter().all(|kind| rest.contains(kind)), "{rest:?}");
}

/// Every kind's scores.
const SCORES: [&str; 7] = [
    "nll",
    "first_token_accuracy",
    "first_content_token_accuracy",
    "em",
    "f1",
    "em_clean",
    "f1_clean",
];

/// `--layout latentwire` runs the pipeline with LatentWire's bare prefix and says so in the
/// summary; a run cannot be resumed in the other layout.
#[test]
fn latentwires_layout_runs_the_pipeline() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("bare");
    let args: Vec<&str> = SHORT
        .iter()
        .copied()
        .chain(["--layout", "latentwire", "--max-steps-now", "2"])
        .collect();
    succeeds(&out, &args);
    let other: Vec<&str> = SHORT.to_vec();
    let error = fails(&out, &other);
    assert!(error.contains("layout"), "{error}");
    let bare: Vec<&str> = SHORT
        .iter()
        .copied()
        .chain(["--layout", "latentwire"])
        .collect();
    succeeds(&out, &bare);
    let summary = common::summary(&out);
    assert_eq!(summary["layout"], "latentwire");
    assert!(
        summary["tiny-llama"]["latent"]["nll"].is_number(),
        "{summary}"
    );
    let error = fails(&dir.path().join("x"), &["--layout", "bare"]);
    assert!(error.contains("`chat` or `latentwire`"), "{error}");
    let error = fails(&dir.path().join("y"), &["--eval-items", "1"]);
    assert!(error.contains("at least 2"), "{error}");
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
