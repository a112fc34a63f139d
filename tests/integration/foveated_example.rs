//! The foveated examples from outside, as their contracts say.
//!
//! `foveated_synthetic`: its flags, its outputs (`summary.json` with every control's
//! `coarse_accuracy` and `fine_accuracy`, null where a mode does not apply; `curves.png`; one
//! kiln-train run directory per control and stage, and its saved model), and bad flags refused
//! before any work. A short run: the
//! accuracies it reaches are the documented long run's concern.
//!
//! `foveated_train`: captioned frame folders and tiny random checkpoints (kiln-foveated's DINOv2,
//! kiln-text's Llama with its tokenizer) train, stop, resume and save a model that loads back;
//! bad inputs (short clips, captions that do not match, checkpoints of the wrong family, an
//! unknown readout) are refused by name with nothing written.
//!
//! `foveated_caption` (a contract: `--checkpoint`, `--clips`, `--prompt`, `--max-new-tokens`,
//! `--out`, `--device`, `--policy`; one JSON line a clip with `clip`, `caption`, `tokens` and
//! `seconds`): fVLM's checkpoint of kiln-foveated's caption fixture with its backbones, and a
//! model foveated_train saved (its tokenizer kept beside it).

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;

use crate::common;

fn run(out: &Path, args: &[&str]) -> Output {
    common::run_example("foveated_synthetic", out, args)
}

/// Runs the example, which must succeed, and reads its summary.json.
fn summary_of(out: &Path, args: &[&str]) -> Value {
    common::succeeded(run(out, args), args);
    common::summary(out)
}

#[test]
fn a_short_run_writes_every_control_and_the_plot() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("run");
    let args = [
        "--steps",
        "4",
        "--eval-every",
        "2",
        "--eval-clips",
        "32",
        "--batch",
        "4",
        "--start-steps",
        "2",
        "--all-patches-start-steps",
        "1",
    ];
    let flags = ["--readout", "shallow", "--device", "cpu"];
    let summary = summary_of(&out, &[&args[..], &flags].concat());
    let accuracy = |control: &str, key: &str| &summary[control][key];
    for control in ["both", "random_queries"] {
        for key in ["coarse_accuracy", "fine_accuracy"] {
            let value = accuracy(control, key).as_f64().unwrap();
            assert!((0.0..=1.0).contains(&value), "{control} {key}: {value}");
        }
    }
    assert!(accuracy("static_only", "coarse_accuracy").is_f64());
    assert!(accuracy("static_only", "fine_accuracy").is_null());
    assert!(accuracy("all_patches", "coarse_accuracy").is_null());
    assert!(accuracy("all_patches", "fine_accuracy").is_f64());
    assert_eq!(summary["settings"]["readout"], "shallow");
    assert!(std::fs::metadata(out.join("curves.png")).unwrap().len() > 1000);
    // The 2×2 boards first, then the 4×4 ones, the same 6 steps for every control (all_patches
    // splits them its own way); the model trained on both is saved.
    for (control, start_steps, steps) in [
        ("both", 2, 4),
        ("static_only", 2, 4),
        ("all_patches", 1, 5),
        ("random_queries", 2, 4),
    ] {
        let lines = kiln::train::read_metrics(&out.join(control)).unwrap();
        assert_eq!(lines.len(), steps, "{control}");
        let start = kiln::train::read_metrics(&out.join(control).join("start")).unwrap();
        assert_eq!(start.len(), start_steps, "{control}");
        assert!(
            out.join(control).join("model/config.json").is_file(),
            "{control}"
        );
    }
    assert_eq!(
        (
            &summary["settings"]["grid"],
            &summary["settings"]["start_grid"]
        ),
        (&4.into(), &2.into())
    );
    // Every control's model is made for the 4×4 boards (24 px: a position of its own for each
    // of the 16 cells), which the 2×2 start reads resized.
    for control in ["both", "all_patches"] {
        let config = std::fs::read_to_string(out.join(control).join("model/config.json")).unwrap();
        let config: Value = serde_json::from_str(&config).unwrap();
        assert_eq!(config["dino"]["image_size"], 24, "{control}");
    }
    // A finished run is stable: rerunning it changes no control's figures (random queries
    // included, whose evaluation draws from the seeded generator), and they agree with the
    // evaluation its metrics logged.
    let rerun = summary_of(&out, &[&args[..], &flags].concat());
    for control in ["both", "static_only", "all_patches", "random_queries"] {
        assert_eq!(summary[control], rerun[control], "{control}");
    }
    let logged = kiln::train::read_metrics(&out.join("random_queries")).unwrap();
    assert_eq!(
        logged.last().unwrap()["eval_fine_accuracy"],
        summary["random_queries"]["fine_accuracy"]
    );
}

/// The release variant's run: fVLM's design (λ 0 unless asked), its settings in the summary,
/// the cue said after a lead token.
#[test]
fn a_short_release_run_says_which_design_it_trained() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("run");
    let args = [
        "--steps",
        "2",
        "--eval-clips",
        "16",
        "--batch",
        "4",
        "--start-steps",
        "0",
    ];
    let flags = [
        "--variant",
        "release",
        "--controls",
        "both",
        "--device",
        "cpu",
    ];
    let summary = summary_of(&out, &[&args[..], &flags].concat());
    let settings = &summary["settings"];
    assert_eq!(
        (
            &settings["variant"],
            &settings["lambda"],
            &settings["caption"]
        ),
        (&"release".into(), &0.0.into(), &"cue".into())
    );
    for key in ["coarse_accuracy", "fine_accuracy"] {
        assert!(summary["both"][key].is_f64(), "{key}");
    }
    let config = std::fs::read_to_string(out.join("both/model/config.json")).unwrap();
    let config: Value = serde_json::from_str(&config).unwrap();
    assert_eq!(config["foveated"]["variant"], "release");
}

#[test]
fn bad_flags_are_refused_before_any_work() {
    let dir = tempfile::tempdir().unwrap();
    for (flags, needle) in [
        (&["--readout", "glance"][..], "glance"),
        (&["--controls", "both,oracle"][..], "oracle"),
        (&["--grid", "1"][..], "at least 2 cells"),
        (
            &["--token-width", "3"][..],
            "--token-width 3: must be an even number",
        ),
        (&["--token-width", "0"][..], "--token-width"),
        (
            &["--start-grid", "8"][..],
            "--start-grid 8 is larger than --grid 4",
        ),
        (&["--cell", "1000"][..], "--cell 1000: at most 64 pixels"),
        (&["--batch", "0"][..], "--batch"),
        (&["--variant", "final"][..], "no variant named 'final'"),
        (&["--caption", "glyphs"][..], "glyphs"),
    ] {
        let out = dir.path().join("bad");
        let output = run(&out, flags);
        assert!(!output.status.success(), "{flags:?} succeeded");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(stderr.contains(needle), "{flags:?}: {stderr}");
        assert!(!out.join("summary.json").exists());
    }
}

/// `count` captioned clips of `frames` 20×20 frames each (frame folders): a colour per clip that
/// its caption names.
pub(crate) fn captioned_clips(dir: &Path, count: usize, frames: usize) -> (PathBuf, PathBuf) {
    let clips = dir.join("clips");
    let colours = [
        ("red", [220, 30, 30]),
        ("green", [30, 200, 40]),
        ("blue", [20, 40, 230]),
    ];
    let mut captions = String::new();
    for clip in 0..count {
        let (word, rgb) = colours[clip % colours.len()];
        let folder = clips.join(format!("clip{clip}"));
        std::fs::create_dir_all(&folder).unwrap();
        for t in 0..frames {
            let shade = |c: u8| c.saturating_sub(20 * t as u8);
            let frame = image::RgbImage::from_pixel(20, 20, image::Rgb(rgb.map(shade)));
            frame.save(folder.join(format!("{t:03}.png"))).unwrap();
        }
        captions.push_str(&format!(
            "{{\"video\": \"clip{clip}\", \"caption\": \"a {word} square\"}}\n"
        ));
    }
    let file = dir.join("captions.jsonl");
    std::fs::write(&file, captions).unwrap();
    (clips, file)
}

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// Runs foveated_train on `clips`/`captions` with the tiny checkpoints, then `extra` flags
/// (later flags of the same name are refused by clap, so `extra` only adds).
pub(crate) fn train(
    out: &Path,
    clips: &Path,
    captions: &Path,
    dino: &Path,
    extra: &[&str],
) -> Output {
    trainer(out, clips, dino)
        .arg("--captions")
        .arg(captions)
        .args(extra)
        .output()
        .expect("the foveated_train example is built with the tests")
}

/// foveated_train on `clips` with the tiny checkpoints, without its data flag.
fn trainer(out: &Path, clips: &Path, dino: &Path) -> Command {
    let mut command = Command::new(common::example("foveated_train"));
    command
        .arg("--clips")
        .arg(clips)
        .arg("--dino")
        .arg(dino)
        .arg("--lm")
        .arg(root().join("crates/kiln-text/tests/fixtures/llama"))
        .arg("--out")
        .arg(out)
        .args(["--query-dim", "12", "--batch", "3", "--device", "cpu"]);
    command
}

/// Evaluation every 10 steps, and rates a tiny model learns from in a few dozen.
const FAST: [&str; 6] = [
    "--eval-every",
    "10",
    "--connector-lr",
    "1e-2",
    "--backbone-lr",
    "1e-2",
];

/// The held-out flags for `clips` and `captions`.
fn held_out<'a>(clips: &'a Path, captions: &'a Path) -> [&'a str; 4] {
    [
        "--eval-clips",
        clips.to_str().unwrap(),
        "--eval-captions",
        captions.to_str().unwrap(),
    ]
}

pub(crate) fn tiny_dino() -> PathBuf {
    root().join("crates/kiln-foveated/tests/fixtures/dino")
}

#[test]
fn foveated_train_learns_captions_resumes_and_saves_a_model_that_loads() {
    let dir = tempfile::tempdir().unwrap();
    let (clips, captions) = captioned_clips(dir.path(), 6, 4);
    let out = dir.path().join("run");
    let flags = [
        &["--variant", "research", "--frames", "4", "--steps", "30"][..],
        &["--readout", "shallow"],
        &FAST[..],
        &held_out(&clips, &captions),
    ]
    .concat();
    let first = train(
        &out,
        &clips,
        &captions,
        &tiny_dino(),
        &[&flags[..], &["--max-steps-now", "10"]].concat(),
    );
    let first_stderr = String::from_utf8_lossy(&first.stderr);
    assert!(first.status.success(), "{first_stderr}");
    assert!(!out.join("summary.json").exists());
    // The clips are decoded once: the training split builds the cache entry, and the held-out
    // split (the same clips) and the resumed run find it.
    assert_eq!(first_stderr.matches("(Built)").count(), 1, "{first_stderr}");
    let rest = train(&out, &clips, &captions, &tiny_dino(), &flags);
    let stderr = String::from_utf8_lossy(&rest.stderr);
    assert!(rest.status.success(), "{stderr}");
    assert_eq!(
        (
            stderr.matches("(Built)").count(),
            stderr.matches("(Hit)").count()
        ),
        (0, 2),
        "{stderr}"
    );

    let lines = kiln::train::read_metrics(&out).unwrap();
    let steps: Vec<u64> = lines.iter().map(|l| l["step"].as_u64().unwrap()).collect();
    assert_eq!(steps, (1..=30).collect::<Vec<_>>());
    let eval_loss: Vec<f64> = lines
        .iter()
        .filter_map(|l| l.get("eval_loss")?.as_f64())
        .collect();
    assert_eq!(eval_loss.len(), 3, "{eval_loss:?}");
    // Three captions of four tokens, seen 15 times each: the held-out (here: the same) loss
    // falls well below the untrained model's.
    assert!(eval_loss[2] < 0.5 * eval_loss[0], "{eval_loss:?}");

    let summary = common::summary(&out);
    assert_eq!(summary["steps"], 30);
    assert_eq!(summary["train_clips"], 6);
    assert_eq!(
        summary["held_out"]["loss"].as_f64(),
        eval_loss.last().copied()
    );
    let device = Default::default();
    let model = kiln::foveated::FoveatedModel::<kiln::burn::backend::Flex>::load(
        out.join("model"),
        &device,
        &kiln::core::Policy::full(),
    )
    .unwrap();
    assert_eq!(model.config().readout, kiln::foveated::Readout::Shallow);
}

/// The default, `--variant release`: fVLM's stage-1 conversations after the visual tokens, λ = 0
/// and its recipe, on fVLM's data — clips of 1 to 3 frames taken one a second (a one-frame clip
/// and a still image replicated to 2), text-only conversations a quarter of the batches; the
/// held-out loss falls, and the saved model is the release variant.
#[test]
fn foveated_train_trains_the_release_variant() {
    let dir = tempfile::tempdir().unwrap();
    // fVLM's conversation around a caption (an empty user turn) takes up to 60 of the tiny LM's
    // 64 positions.
    let (clips, captions) = captioned_clips(dir.path(), 6, 2);
    std::fs::remove_file(clips.join("clip0/001.png")).unwrap();
    std::fs::copy(clips.join("clip1/001.png"), clips.join("clip1/002.png")).unwrap();
    std::fs::copy(clips.join("clip2/000.png"), clips.join("still.png")).unwrap();
    let mut lines = std::fs::read_to_string(&captions).unwrap();
    lines.push_str("{\"video\": \"still.png\", \"caption\": \"a blue square\"}\n");
    std::fs::write(&captions, lines).unwrap();
    let text = dir.path().join("text.jsonl");
    std::fs::write(
        &text,
        "{\"user\": \"hi\", \"assistant\": \"a square\"}\n{\"user\": \"\", \"assistant\": \"red\"}\n",
    )
    .unwrap();
    let out = dir.path().join("run");
    let release = [
        "--prompt",
        "",
        "--frames",
        "3",
        "--replicate-images",
        "2",
        "--text",
        text.to_str().unwrap(),
        "--text-ratio",
        "0.25",
        "--steps",
        "20",
    ];
    let flags = [&release[..], &FAST[..], &held_out(&clips, &captions)].concat();
    let run = train(&out, &clips, &captions, &tiny_dino(), &flags);
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(run.status.success(), "{stderr}");
    assert!(stderr.contains("group `dino`"), "{stderr}");
    assert!(
        stderr.contains("7 clips of 1 to 3 frames, one a second"),
        "{stderr}"
    );
    let lines = kiln::train::read_metrics(&out).unwrap();
    // Three batches of clips and one of text an epoch.
    let epoch = |step: usize| lines[step - 1]["epoch"].as_u64().unwrap();
    assert_eq!([epoch(1), epoch(4), epoch(5)], [0, 0, 1]);
    let eval_loss: Vec<f64> = lines
        .iter()
        .filter_map(|l| l.get("eval_loss")?.as_f64())
        .collect();
    assert!(eval_loss[1] < 0.8 * eval_loss[0], "{eval_loss:?}");
    // λ = 0: the coarse pass scores nothing, so only the fine pass's loss is logged.
    assert!(lines.iter().all(|l| l.get("coarse_loss").is_none()));
    let model = kiln::foveated::FoveatedModel::<kiln::burn::backend::Flex>::load(
        out.join("model"),
        &Default::default(),
        &kiln::core::Policy::full(),
    )
    .unwrap();
    assert_eq!(model.config().variant, kiln::foveated::Variant::Release);
    assert_eq!(model.config().lambda_coarse, 0.0);

    // The saved model carries its tokenizer: it captions alone.
    let model_dir = out.join("model");
    let lines = caption(&[
        "--checkpoint",
        model_dir.to_str().unwrap(),
        "--clips",
        clips.to_str().unwrap(),
        "--prompt",
        "",
        "--max-new-tokens",
        "3",
        "--cache",
        out.join("cache").to_str().unwrap(),
    ]);
    assert_eq!(lines.len(), 7);
    assert_eq!(lines[6]["clip"], "still.png");
}

/// fVLM's three stages, each from the last one's model (`--stage N --init-from`): stage 1 at
/// its rates with every token scored, stage 2 at its own with a line's own user turn and
/// text-only conversations, stage 3 by DPO on preference pairs against a frozen copy of stage
/// 2's model — whose first loss is therefore ln 2. Each prints the time its whole budget would
/// take here. The budgets' sizes are shrunk by flags.
#[test]
fn foveated_train_runs_fvlms_three_stages() {
    let dir = tempfile::tempdir().unwrap();
    let (clips, captions) = captioned_clips(dir.path(), 6, 1);
    let lines = std::fs::read_to_string(&captions).unwrap();
    let lines = lines.replacen("\"caption\"", "\"user\": \"hi\", \"caption\"", 1);
    std::fs::write(&captions, lines).unwrap();
    let pairs = dir.path().join("pairs.jsonl");
    let colours = ["red", "green", "blue"];
    let pair_lines: String = (0..6)
        .map(|c| {
            let (chosen, rejected) = (colours[c % 3], colours[(c + 1) % 3]);
            format!(
                "{{\"video\": \"clip{c}\", \"user\": \"colour?\", \"chosen\": \"{chosen}\", \
                 \"rejected_assistant\": \"{rejected}\"}}\n"
            )
        })
        .collect();
    std::fs::write(&pairs, pair_lines).unwrap();
    let text = dir.path().join("text.jsonl");
    std::fs::write(&text, "{\"user\": \"hi\", \"assistant\": \"a square\"}\n").unwrap();
    let small = ["--prompt", "", "--frames", "1", "--replicate-images", "1"];
    let stage = |number: &str, extra: &[&str]| {
        let out = dir.path().join(format!("stage{number}"));
        let mut flags = vec!["--stage", number, "--steps", "4", "--accumulate", "2"];
        flags.extend(small);
        flags.extend(extra);
        let run = match extra.contains(&"--pairs") {
            true => trainer(&out, &clips, &tiny_dino())
                .args(&flags)
                .output()
                .unwrap(),
            false => train(&out, &clips, &captions, &tiny_dino(), &flags),
        };
        let stderr = String::from_utf8_lossy(&run.stderr).to_string();
        assert!(run.status.success(), "stage {number}: {stderr}");
        let budget = format!("fVLM's stage {number} budget");
        assert!(stderr.contains(&budget), "{stderr}");
        (out, stderr)
    };
    let (first, stderr) = stage("1", &[]);
    assert!(stderr.contains("group `connector`: lr 1e-3"), "{stderr}");
    let summary = common::summary(&first);
    assert_eq!(summary["budget"]["samples"], 1_000_000.0);
    assert!(summary["budget"]["hours"].as_f64().unwrap() > 0.0);
    let model = first.join("model");
    let text = text.to_str().unwrap();
    let init = model.to_str().unwrap();
    let (second, stderr) = stage(
        "2",
        &["--init-from", init, "--text", text, "--text-ratio", "0.25"],
    );
    assert!(stderr.contains("group `connector`: lr 3e-5"), "{stderr}");
    let model = second.join("model");
    let pairs = pairs.to_str().unwrap();
    let init = model.to_str().unwrap();
    let (third, stderr) = stage("3", &["--init-from", init, "--pairs", pairs]);
    assert!(stderr.contains("6 preference pairs"), "{stderr}");
    // fVLM's groups, found under PreferenceTraining's `policy.`.
    assert!(stderr.contains("group `connector`: lr 1e-6"), "{stderr}");
    let metrics = kiln::train::read_metrics(&third).unwrap();
    assert_eq!(metrics.len(), 4);
    let first_loss = metrics[0]["loss"].as_f64().unwrap();
    assert!(
        (first_loss - std::f64::consts::LN_2).abs() < 1e-4,
        "{first_loss}"
    );
    assert!(metrics[0].get("reward_accuracy").is_some());
    kiln::foveated::FoveatedModel::<kiln::burn::backend::Flex>::load(
        third.join("model"),
        &Default::default(),
        &kiln::core::Policy::full(),
    )
    .unwrap();
}

/// Runs foveated_caption with `args` (which must succeed) and reads the JSON lines it prints.
fn caption(args: &[&str]) -> Vec<Value> {
    let output = Command::new(common::example("foveated_caption"))
        .args(args)
        .output()
        .expect("the foveated_caption example is built with the tests");
    let output = common::succeeded(output, args);
    String::from_utf8(output.stdout)
        .unwrap()
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect()
}

/// fVLM's checkpoint (the caption fixture: fVLM's own state dict over the tiny DINOv2 and an LM
/// with kiln-text's fixture tokenizer), given its backbones: one line a clip in `--out`, greedy
/// captions that repeat, sampled ones that follow the seed.
#[test]
fn foveated_caption_writes_a_line_a_clip() {
    let dir = tempfile::tempdir().unwrap();
    let (clips, _) = captioned_clips(dir.path(), 3, 2);
    let fixture = root().join("crates/kiln-foveated/tests/fixtures/caption");
    let out = dir.path().join("captions.jsonl");
    let cache = dir.path().join("cache");
    let (dino, lm) = (tiny_dino(), fixture.join("lm"));
    let flags = |extra: &[&str]| -> Vec<String> {
        let base = [
            "--cache",
            cache.to_str().unwrap(),
            "--checkpoint",
            fixture.to_str().unwrap(),
            "--dino",
            dino.to_str().unwrap(),
            "--lm",
            lm.to_str().unwrap(),
            "--clips",
            clips.to_str().unwrap(),
            "--max-new-tokens",
            "6",
            "--device",
            "cpu",
            "--policy",
            "full",
        ];
        base.iter().chain(extra).map(|s| s.to_string()).collect()
    };
    let args = flags(&["--out", out.to_str().unwrap()]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let output = Command::new(common::example("foveated_caption"))
        .args(&args)
        .output()
        .unwrap();
    common::succeeded(output, &args);
    let lines: Vec<Value> = std::fs::read_to_string(&out)
        .unwrap()
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect();
    let names: Vec<&str> = lines.iter().map(|l| l["clip"].as_str().unwrap()).collect();
    assert_eq!(names, ["clip0", "clip1", "clip2"]);
    for line in &lines {
        assert!(line["tokens"].as_u64().unwrap() <= 6, "{line}");
        assert!(line["caption"].is_string() && line["seconds"].as_f64().unwrap() > 0.0);
    }
    let text = |lines: &[Value]| -> Vec<String> {
        lines.iter().map(|l| l["caption"].to_string()).collect()
    };
    let again = flags(&[]);
    let again: Vec<&str> = again.iter().map(String::as_str).collect();
    assert_eq!(
        text(&caption(&again)),
        text(&lines),
        "greedy captions repeat"
    );
    let sampled = flags(&["--temperature", "1.5", "--seed", "3"]);
    let sampled: Vec<&str> = sampled.iter().map(String::as_str).collect();
    assert_eq!(text(&caption(&sampled)), text(&caption(&sampled)));

    // Without its backbones, fVLM's checkpoint is refused naming what it needs.
    let bare = [
        "--checkpoint",
        fixture.to_str().unwrap(),
        "--clips",
        clips.to_str().unwrap(),
    ];
    let output = Command::new(common::example("foveated_caption"))
        .args(bare)
        .output()
        .unwrap();
    let err = common::failed(output, &bare);
    assert!(err.contains("(--dino and --lm"), "{err}");
}

#[test]
fn foveated_train_names_bad_inputs_and_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let (clips, captions) = captioned_clips(dir.path(), 3, 4);
    let fewer = dir.path().join("fewer.jsonl");
    let all = std::fs::read_to_string(&captions).unwrap();
    std::fs::write(&fewer, all.lines().take(2).collect::<Vec<_>>().join("\n")).unwrap();
    let clip_tower = common::fixtures().join("clip_vision");
    let lm = root().join("crates/kiln-text/tests/fixtures/llama");
    let long = dir.path().join("long.jsonl");
    let words = vec!["square"; 80].join(" ");
    let long_captions: String = (0..3)
        .map(|c| format!("{{\"video\": \"clip{c}\", \"caption\": \"{words}\"}}\n"))
        .collect();
    std::fs::write(&long, long_captions).unwrap();
    let text = dir.path().join("text.jsonl");
    std::fs::write(&text, "\n{\"user\": \"hi\"}\n").unwrap();
    let text = text.to_str().unwrap();
    let init = dir.path().to_str().unwrap();
    let cases: [(&Path, &Path, &[&str], &str); 11] = [
        (
            &long,
            &tiny_dino(),
            &["--frames", "4"],
            "the language model has room for",
        ),
        (
            &captions,
            &tiny_dino(),
            &["--frames", "5", "--variant", "research"],
            "clip0: 4 frames, fewer than the 5 a clip takes",
        ),
        (
            &fewer,
            &tiny_dino(),
            &["--frames", "4"],
            "no caption for the clip 'clip2'",
        ),
        (
            &captions,
            &clip_tower,
            &["--frames", "4"],
            "a CLIP vision tower; the foveated model reads frames with DINOv2",
        ),
        (&captions, &lm, &[], "model_type `llama` is not supported"),
        (
            &captions,
            &tiny_dino(),
            &["--readout", "glance"],
            "no readout named 'glance'",
        ),
        (
            &captions,
            &tiny_dino(),
            &["--text", text],
            "text.jsonl, line 2: not a conversation",
        ),
        (
            &captions,
            &tiny_dino(),
            &["--text", text, "--text-ratio", "1"],
            "--text-ratio 1: a share of the batches, below 1",
        ),
        (
            &captions,
            &tiny_dino(),
            &["--stage", "3"],
            "--stage 3 trains on preference pairs: give --pairs FILE",
        ),
        (
            &captions,
            &tiny_dino(),
            &["--stage", "2", "--variant", "research"],
            "fVLM's stages train the release variant",
        ),
        (
            &captions,
            &tiny_dino(),
            &["--init-from", init],
            "--init-from and --pairs go with --stage",
        ),
    ];
    for (captions, dino, flags, needle) in cases {
        let out = dir.path().join("bad");
        let output = train(&out, &clips, captions, dino, flags);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(!output.status.success(), "{flags:?} succeeded");
        assert!(stderr.contains(needle), "{needle}: {stderr}");
        assert!(!out.join("summary.json").exists() && !out.join("model").exists());
    }
}

/// foveated_bench (a contract: `--checkpoint`, `--questions`, `--clips`, `--out`; accuracy
/// overall and per category in `summary.json`) on fVLM's checkpoint of the caption fixture:
/// each mode's tally, each answer the option of lowest loss, a question without options
/// skipped and counted; the same run again is accepted, another into the same `--out` refused,
/// and a question about a clip that is not there is named by its number.
#[test]
fn foveated_bench_scores_every_mode_per_category() {
    let dir = tempfile::tempdir().unwrap();
    let (clips, _) = captioned_clips(dir.path(), 3, 2);
    let questions = dir.path().join("questions.jsonl");
    std::fs::write(
        &questions,
        concat!(
            r#"{"clip": "clip0", "user": "Which colour?\nA. red\nB. green", "assistant": "A. red", "source": "colours/red"}"#,
            "\n",
            r#"{"clip": "clip1", "user": "What is it?\nA. a square\nB. a circle\nC. nothing", "assistant": "B", "source": "colours/shape"}"#,
            "\n",
            r#"{"clip": "clip2", "user": "Say anything.", "assistant": "A"}"#,
            "\n"
        ),
    )
    .unwrap();
    let fixture = root().join("crates/kiln-foveated/tests/fixtures/caption");
    let (dino, lm, cache) = (tiny_dino(), fixture.join("lm"), dir.path().join("cache"));
    let out = dir.path().join("bench");
    let run = |questions: &Path, extra: &[&str]| {
        let mut command = Command::new(common::example("foveated_bench"));
        command
            .args(["--checkpoint", fixture.to_str().unwrap()])
            .args([
                "--dino",
                dino.to_str().unwrap(),
                "--lm",
                lm.to_str().unwrap(),
            ])
            .args(["--questions", questions.to_str().unwrap()])
            .args([
                "--clips",
                clips.to_str().unwrap(),
                "--out",
                out.to_str().unwrap(),
            ])
            .args(["--cache", cache.to_str().unwrap()])
            .args(extra);
        command
            .output()
            .expect("the foveated_bench example is built with the tests")
    };
    common::succeeded(run(&questions, &[]), &["foveated_bench"]);
    let summary = common::summary(&out);
    assert_eq!(summary["questions"], 3);
    assert_eq!(summary["skipped_without_options"], 1);
    let modes = summary["modes"].as_object().unwrap();
    let names: Vec<&String> = modes.keys().collect();
    assert_eq!(names, ["autoregressive", "coarse_fine", "coarse_only"]);
    for tally in modes.values() {
        assert_eq!(tally["total"], 2);
        let correct = tally["correct"].as_f64().unwrap();
        assert_eq!(tally["accuracy"].as_f64().unwrap(), 50.0 * correct);
        let categories: Vec<&String> = tally["per_category"].as_object().unwrap().keys().collect();
        assert_eq!(categories, ["red", "shape"]);
    }
    let answers = std::fs::read_to_string(out.join("answers.jsonl")).unwrap();
    let answers: Vec<Value> = answers
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(answers.len(), 2);
    for answer in &answers {
        for (mode, losses) in answer["losses"].as_object().unwrap() {
            let losses = losses.as_object().unwrap();
            let lowest = losses
                .iter()
                .min_by(|a, b| a.1.as_f64().unwrap().total_cmp(&b.1.as_f64().unwrap()))
                .unwrap();
            assert_eq!(
                &answer["chosen"][mode],
                &Value::from(lowest.0.as_str()),
                "{answer}"
            );
        }
    }

    common::succeeded(run(&questions, &[]), &["the same run again"]);
    let err = common::failed(
        run(&questions, &["--modes", "coarse_only"]),
        &["other modes"],
    );
    assert!(err.contains("bench"), "{err}");
    let stray = dir.path().join("stray.jsonl");
    std::fs::write(
        &stray,
        r#"{"clip": "clip9", "user": "A. x", "assistant": "A"}"#,
    )
    .unwrap();
    std::fs::remove_dir_all(&out).unwrap();
    let err = common::failed(run(&stray, &[]), &["a clip that is not there"]);
    assert!(err.contains("question 1: no clip 'clip9'"), "{err}");
}
