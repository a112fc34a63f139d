//! The `exp0_mc` example end to end on the committed tiny checkpoints: a run stopped part-way
//! and started again, and shards merged afterwards, summarise exactly as one uninterrupted run;
//! the outputs are all written; bad input fails before any long work with a clear error. Runs the
//! example binary that `cargo test` builds beside the tests.

use std::path::Path;
use std::process::{Command, Output};

use serde_json::Value;

use crate::common;

use common::fixtures;

fn command(args: &[&str], cache: &Path) -> Command {
    let mut command = Command::new(common::example("exp0_mc"));
    command.args(args).env("KILN_CACHE_DIR", cache);
    command
}

fn run(command: &mut Command) -> Output {
    command
        .output()
        .expect("the exp0_mc example is built with the tests")
}

fn exp0(args: &[&str], cache: &Path) -> Output {
    run(&mut command(args, cache))
}

fn assert_success(output: &Output) {
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
}

fn succeeds(args: &[&str], cache: &Path) {
    assert_success(&exp0(args, cache));
}

fn fails(args: &[&str], cache: &Path) -> String {
    let output = exp0(args, cache);
    assert!(!output.status.success(), "{args:?} succeeded");
    String::from_utf8_lossy(&output.stderr).into_owned()
}

/// The statistics of every row of `out`'s summary (its timings differ from run to run).
fn statistics(out: &Path) -> Vec<Value> {
    let text = std::fs::read_to_string(out.join("summary.json")).unwrap();
    let summary: Value = serde_json::from_str(&text).unwrap();
    summary["rows"]
        .as_array()
        .unwrap()
        .iter()
        .map(|row| {
            let keys = [
                "model",
                "passes",
                "trials",
                "mean_variance",
                "uncertainty",
                "uncertainty_spread",
                "rank_stability",
            ];
            Value::Array(keys.iter().map(|k| row[*k].clone()).collect())
        })
        .collect()
}

/// The README's first command, `cargo run --release --example exp0_mc`, on a fresh clone: no
/// `results/` directory yet (fewer images, passes and trials here, to stay quick).
#[test]
fn the_main_job_runs_with_its_defaults_in_a_fresh_directory() {
    let cache = tempfile::tempdir().unwrap();
    let fresh = tempfile::tempdir().unwrap();
    let args = ["--generate", "3", "--passes", "2", "--trials", "2"];
    assert_success(&run(command(&args, cache.path()).current_dir(fresh.path())));
    assert!(fresh.path().join("results/exp0/summary.json").is_file());
}

#[test]
fn resumed_runs_and_merged_shards_summarise_as_one_run() {
    let (cache, out) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let models = format!(
        "{},{}",
        fixtures().join("clip_vision").display(),
        fixtures().join("dinov2").display()
    );
    let images = fixtures().join("images");
    let dir = |name: &str| out.path().join(name).display().to_string();
    let run = |out: &str, extra: &[&str]| {
        let mut args = vec![
            "--model-dir",
            &models,
            "--images",
            images.to_str().unwrap(),
            "--passes",
            "2,3",
            "--trials",
            "2",
            "--out",
            out,
        ];
        args.extend_from_slice(extra);
        succeeds(&args, cache.path());
    };

    run(&dir("single"), &[]);
    let single = statistics(&out.path().join("single"));
    assert_eq!(single.len(), 4, "2 models × 2 pass counts");
    for file in ["summary.csv", "convergence.png", "experiment.json"] {
        assert!(out.path().join("single").join(file).is_file(), "{file}");
    }
    let trials = std::fs::read_dir(out.path().join("single/trials")).unwrap();
    assert_eq!(trials.count(), 8, "2 models × 2 pass counts × 2 trials");

    // Stopped after 3 of 8 trials: no summary yet; started again, it finishes the other 5.
    run(&dir("resumed"), &["--max-trials", "3"]);
    assert!(!out.path().join("resumed/summary.json").exists());
    run(&dir("resumed"), &[]);
    assert_eq!(statistics(&out.path().join("resumed")), single);

    run(&dir("part1"), &["--shard", "1/2"]);
    run(&dir("part2"), &["--shard", "2/2"]);
    let merged = dir("merged");
    succeeds(
        &["--merge", &dir("part1"), &dir("part2"), "--out", &merged],
        cache.path(),
    );
    assert_eq!(statistics(Path::new(&merged)), single);
    let err = fails(
        &["--merge", &dir("part1"), "--out", &dir("half")],
        cache.path(),
    );
    assert!(err.contains("in none of the directories"), "{err}");

    // Another seed cannot continue into a directory of this experiment.
    let mut args = vec!["--model-dir", &models, "--images", images.to_str().unwrap()];
    let single_dir = dir("single");
    args.extend_from_slice(&["--passes", "2,3", "--trials", "2", "--seed", "1"]);
    args.extend_from_slice(&["--out", &single_dir]);
    let err = fails(&args, cache.path());
    assert!(err.contains("differs in seed"), "{err}");
}

#[test]
fn bad_input_is_a_clear_error_before_any_work() {
    let (cache, out) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let empty = out.path().join("empty");
    std::fs::create_dir(&empty).unwrap();
    let model = fixtures().join("clip_vision").display().to_string();
    let images = fixtures().join("images").display().to_string();
    let results = out.path().join("results").display().to_string();
    let with = |extra: &[&str]| -> String {
        let mut args = vec![
            "--model-dir",
            &model,
            "--images",
            &images,
            "--out",
            &results,
        ];
        args.extend_from_slice(extra);
        fails(&args, cache.path())
    };
    let err = with(&["--passes", "4,1"]);
    assert!(err.contains("each at least 2"), "{err}");
    let err = with(&["--passes", "4,8,4"]);
    assert!(err.contains("4 is given twice"), "{err}");
    let err = with(&["--trials", "1"]);
    assert!(err.contains("at least 2"), "{err}");
    let err = with(&["--dropout", "1.5"]);
    assert!(err.contains("below 1"), "{err}");
    let err = fails(
        &[
            "--model-dir",
            &model,
            "--images",
            empty.to_str().unwrap(),
            "--out",
            &results,
        ],
        cache.path(),
    );
    assert!(err.contains("no images"), "{err}");
    let missing = out.path().join("no-such-model").display().to_string();
    let err = fails(
        &[
            "--model-dir",
            &missing,
            "--images",
            &images,
            "--out",
            &results,
        ],
        cache.path(),
    );
    assert!(err.contains("no-such-model"), "{err}");
    let err = fails(&["--model", "resnet50", "--out", &results], cache.path());
    assert!(err.contains("unknown model `resnet50`"), "{err}");
    assert!(
        !Path::new(&results).join("trials").exists(),
        "nothing ran, nothing written"
    );
}

/// A refused rerun (another seed) leaves the results directory byte for byte as it was; a trial
/// file damaged on disk makes the next run of the same command move it aside and run that trial
/// again, with the same statistics as before.
#[test]
fn refused_reruns_change_nothing_and_damaged_trials_run_again() {
    let (cache, out) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let model = fixtures().join("clip_vision").display().to_string();
    let images = fixtures().join("images").display().to_string();
    let results = out.path().join("results");
    let args = |seed: &'static str| {
        let mut args = vec!["--model-dir", &model, "--images", &images];
        args.extend_from_slice(&["--passes", "2", "--trials", "2", "--seed", seed]);
        args.extend_from_slice(&["--out", results.to_str().unwrap()]);
        args
    };
    succeeds(&args("0"), cache.path());
    let before = common::snapshot(&results);
    let err = fails(&args("1"), cache.path());
    assert!(err.contains("differs in seed"), "{err}");
    assert!(
        common::snapshot(&results) == before,
        "a refused run changed files"
    );

    let expected = statistics(&results);
    let trial = results.join("trials/clip_vision_T2_k1.safetensors");
    let mut bytes = std::fs::read(&trial).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 0x10;
    std::fs::write(&trial, &bytes).unwrap();
    let rerun = exp0(&args("0"), cache.path());
    let stderr = String::from_utf8_lossy(&rerun.stderr);
    assert!(rerun.status.success(), "{stderr}");
    assert!(
        stderr.contains("damaged") && stderr.contains("runs again"),
        "{stderr}"
    );
    assert!(results.join("trials/damaged").is_dir());
    assert_eq!(statistics(&results), expected);
}
