//! Where the foveated model looks matters: issue 25's proof on the "cue then read" task
//! (`kiln::foveated::synthetic`). Frame 1 of a clip lights one cell of a grid; every later frame
//! fills each cell with a random glyph; the answer for frame t is the glyph in the cued cell. A
//! query fixed in advance cannot know where to look; a query made from frame 1 can.
//!
//! ```text
//! cargo run --release --example foveated_synthetic -- --out runs/foveated [--steps N]
//!     [--device D] [--readout shallow|deep] [--variant research|release] [--lambda L]
//! ```
//!
//! Trains four controls from scratch with the same budget — `--start-steps` (750) on 2×2
//! boards, then `--steps` (4 000) on the 4×4 boards they are scored on (from scratch, no readout
//! learns to point on 4×4 boards; having learned on 2×2 ones, it keeps pointing as the board
//! grows) — each through kiln-train in OUT/<control>/start/ and OUT/<control>/ (metrics.jsonl,
//! loss.png, checkpoints: rerunning resumes), the trained model in OUT/<control>/model/:
//! - `both`: coarse and fine passes trained together (λ = 1), scored in both modes;
//! - `static_only`: the coarse pass alone (`q_static` for every frame);
//! - `all_patches`: no readout, the LM sees every patch token (the upper bound; its peak
//!   learning rate, 1e-3, and its split of the same steps, 1 000 on the starting boards, are
//!   its own: `--all-patches-lr`, `--all-patches-start-steps`);
//! - `random_queries`: the fine pass reads with random queries.
//!
//! Then writes OUT/summary.json (per control, `coarse_accuracy` and `fine_accuracy` on held-out
//! clips, null where a mode does not apply, and under `held_out` the loss, each pass's accuracy
//! frame by frame and the readouts' attention figures) and OUT/curves.png (held-out accuracy
//! per control during training).

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Instant;

use burn::backend::Autodiff;
use burn::tensor::backend::Backend;
use clap::Parser;
use kiln::burn;
use kiln::core::{DeviceJob, DeviceSpec};
use kiln::foveated::synthetic::{self, CueCaption, CueThenRead, Curriculum, Stage, SyntheticClips};
use kiln::foveated::{FoveatedConfig, FoveatedModel, Mode, Readout, Variant};
use kiln::train::plot::draw_png;
use kiln::train::{Outcome, RunOptions, TrainConfig, Trainer, read_metrics};
use serde_json::{Value, json};

/// mimalloc, keeping the memory it frees for the next step (docs/PERFORMANCE.md).
#[path = "../shared/allocator.rs"]
mod allocator;

/// Train the foveated model and its controls on cue-then-read clips.
#[derive(Parser)]
struct Args {
    /// The run's directory (one subdirectory per control, summary.json, curves.png).
    #[arg(long)]
    out: PathBuf,
    /// Optimizer steps per control on the final boards, after the `--start-steps`
    /// (`all_patches` splits the same total its own way: `--all-patches-start-steps`).
    #[arg(long, default_value_t = 4000)]
    steps: u64,
    /// cpu, ndarray, wgpu, vulkan, metal, cuda, cuda:N.
    #[arg(long, default_value = "cpu")]
    device: DeviceSpec,
    /// How queries read frames: shallow or deep (from scratch, the deep readout learns to
    /// point more slowly: docs/FOVEATED.md).
    #[arg(long, default_value = "shallow")]
    readout: Readout,
    /// The model's design: research (kiln's first reading of fVLM: the caption naming the cued
    /// cell is scored from the last visual token, both passes trained) or release (fVLM as
    /// released: the coarse pass over the visual tokens alone, λ = 0, text scored from text).
    #[arg(long, default_value = "research")]
    variant: Variant,
    /// Weight of the coarse pass's loss (`fine + λ·coarse`) [default: the variant's, 1 for
    /// research, 0 for release].
    #[arg(long, value_parser = kiln::cli::non_negative, allow_negative_numbers = true)]
    lambda: Option<f64>,
    /// What each clip's text says: cue (the cued cell; research scores it from the last visual
    /// token, release from a lead token standing for fVLM's chat template) or none (the lead
    /// token alone: only the per-frame answers are learned).
    #[arg(long, default_value = "cue", value_parser = ["cue", "none"])]
    caption: String,
    /// Cells per side of the board (the task the controls are scored on).
    #[arg(long, default_value_t = 4, value_parser = kiln::cli::count_up_to::<64>)]
    grid: usize,
    /// Cells per side of the boards each control starts on (a curriculum: from scratch, no
    /// readout learns to point on 4×4 boards; on 2×2 ones it does within a few hundred steps,
    /// and keeps pointing when the board grows: docs/FOVEATED.md).
    #[arg(long, default_value_t = 2, value_parser = kiln::cli::count_up_to::<64>)]
    start_grid: usize,
    /// Optimizer steps on the starting boards (0: start on the final boards; longer, a token
    /// learns to pack the small board, and the passes that cannot look creep up later; shorter,
    /// the pointing is not learned on some seeds: docs/FOVEATED.md).
    #[arg(long, default_value_t = 750)]
    start_steps: u64,
    /// Pixels per side of a cell (one DINOv2 patch).
    #[arg(long, default_value_t = 6, value_parser = kiln::cli::count)]
    cell: usize,
    /// Frames per clip, the cue frame included.
    #[arg(long, default_value_t = 4, value_parser = kiln::cli::count_up_to::<256>)]
    frames: usize,
    /// Glyph classes (chance is 1/classes; with more classes than cells, a board's classes are
    /// all different, so no class is likelier than another; with 16, a token that cannot look
    /// packs enough of the board to pass the ceiling on some seeds: docs/FOVEATED.md).
    #[arg(long, default_value_t = 24, value_parser = kiln::cli::count_up_to::<4096>)]
    classes: usize,
    /// Width of DINOv2, so of each visual token (the bottleneck; 2 heads).
    #[arg(long, default_value_t = 8, value_parser = kiln::cli::count_up_to::<4096>)]
    token_width: usize,
    /// Clips per batch.
    #[arg(long, default_value_t = 16, value_parser = kiln::cli::count_up_to::<4096>)]
    batch: usize,
    /// Peak learning rate of the controls with a readout.
    #[arg(long, default_value_t = 2e-3, value_parser = kiln::cli::positive, allow_negative_numbers = true)]
    lr: f64,
    /// Peak learning rate of `all_patches` (its LM attends over every patch of every frame, 17×
    /// the tokens; its lookup stalls on some cue cells at other rates, which ones moving with
    /// the build: docs/FOVEATED.md).
    #[arg(long, default_value_t = 1e-3, value_parser = kiln::cli::positive, allow_negative_numbers = true)]
    all_patches_lr: f64,
    /// Of the same `--start-steps` + `--steps` in all, how many `all_patches` spends on the
    /// starting boards (at most half; its lookup on the final boards is learned late, so from
    /// a 2 000-step start it stalls on some seeds: docs/FOVEATED.md).
    #[arg(long, default_value_t = 1000)]
    all_patches_start_steps: u64,
    /// Held-out clips.
    #[arg(long, default_value_t = 256, value_parser = kiln::cli::count_up_to::<1_000_000>)]
    eval_clips: usize,
    /// Evaluate (and checkpoint) every this many steps (and at the end).
    #[arg(long, default_value_t = 250, value_parser = kiln::cli::count_u64, allow_negative_numbers = true)]
    eval_every: u64,
    /// Seeds the glyphs, the clips and the initial weights.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Train only these controls (comma-separated; the summary and plot keep the others out).
    #[arg(long, value_delimiter = ',', default_values_t = CONTROLS.map(|(name, _)| name.to_string()))]
    controls: Vec<String>,
}

/// The controls, in the order they train.
const CONTROLS: [(&str, Mode); 4] = [
    ("both", Mode::CoarseFine),
    ("static_only", Mode::CoarseOnly),
    ("all_patches", Mode::AllPatches),
    ("random_queries", Mode::RandomQueries),
];

/// Held-out clips come from indices far past any training clip.
const EVAL_FIRST: u64 = 1 << 40;

/// The largest cell (pixels per side) --cell takes: boards are grid · cell pixels per side,
/// every frame through DINOv2 at once.
const MAX_CELL: usize = 64;

impl Args {
    /// Refuses settings the task or the model cannot be built with, naming the flag.
    fn check(&self) -> Result<(), String> {
        if self.cell > MAX_CELL {
            return Err(format!(
                "--cell {}: at most {MAX_CELL} pixels (a {}-pixel board per frame would not fit \
                 a run of this size)",
                self.cell,
                self.cell * self.grid
            ));
        }
        self.task()?;
        if self.token_width < 2 || !self.token_width.is_multiple_of(2) {
            return Err(format!(
                "--token-width {}: must be an even number ≥ 2 (DINOv2's two heads split it)",
                self.token_width
            ));
        }
        if self.eval_clips < self.batch {
            return Err(format!(
                "--eval-clips {} is below --batch {}: held-out clips are scored in whole \
                 batches; give at least {} (or a smaller --batch)",
                self.eval_clips, self.batch, self.batch
            ));
        }
        if self.start_grid > self.grid {
            return Err(format!(
                "--start-grid {} is larger than --grid {}: the curriculum starts on smaller boards",
                self.start_grid, self.grid
            ));
        }
        Ok(())
    }

    /// The task the controls are scored on.
    fn task(&self) -> Result<CueThenRead, String> {
        let caption = match (self.caption.as_str(), self.variant) {
            ("none", _) => CueCaption::Lead,
            (_, Variant::Research) => CueCaption::Cue,
            (_, Variant::Release) => CueCaption::LedCue,
        };
        CueThenRead::new(self.grid, self.cell, self.frames, self.classes, self.seed)
            .map(|task| task.with_caption(caption))
            .map_err(|e| e.to_string())
    }

    /// The control's curriculum: `--start-steps` on the starting boards, then `--steps`; for
    /// `all_patches`, the same total split at `--all-patches-start-steps`.
    fn curriculum(&self, control: &str) -> Curriculum {
        let curriculum = Curriculum {
            start_grid: self.start_grid,
            start_steps: self.start_steps,
            steps: self.steps,
        };
        if control == "all_patches" && self.start_grid != self.grid {
            curriculum.split_at(self.all_patches_start_steps)
        } else {
            curriculum
        }
    }

    /// The control's stages, each with its kiln-train run directory: OUT/<control>/start/ for
    /// the starting boards, OUT/<control>/ for the final ones.
    fn stages(&self, control: &str) -> Result<Vec<(Stage, PathBuf)>, String> {
        let dir = self.out.join(control);
        let stages = self
            .curriculum(control)
            .stages(&self.task()?)
            .map_err(|e| e.to_string())?;
        Ok(stages
            .into_iter()
            .map(|stage| {
                let dir = if stage.starting {
                    dir.join("start")
                } else {
                    dir.clone()
                };
                (stage, dir)
            })
            .collect())
    }

    /// The control's model from scratch (seeded), made for the final boards: DINOv2's position
    /// table has a row of its own for every final cell, and the starting boards read it resized
    /// down. (Made for the starting boards, the final cells' positions were a 2×2 table resized
    /// up, mixtures of four rows whose weights are monotone along every row and column of cells:
    /// the positions' part of any query's score then peaks only on a corner of the board, and on
    /// some seeds the fine pass never learned every cell: docs/FOVEATED.md.) Its LM names every
    /// cell of either board.
    fn model<B: Backend>(
        &self,
        mode: Mode,
        device: &B::Device,
    ) -> Result<FoveatedModel<B>, String> {
        B::seed(device, self.seed);
        let model = self
            .task()?
            .model(self.token_width, 0, self.connectors(), device)
            .map_err(|e| e.to_string())?;
        Ok(model.with_training_mode(mode))
    }

    /// The connectors' settings: the variant's preset with `--readout` and `--lambda`.
    fn connectors(&self) -> FoveatedConfig {
        let preset = FoveatedConfig::of(self.variant);
        FoveatedConfig {
            readout: self.readout,
            lambda_coarse: self.lambda.unwrap_or(preset.lambda_coarse),
            ..preset
        }
    }

    /// Trains `model` through one stage: fresh clips of its boards (64 batches an epoch, a new
    /// set every epoch), held-out ones far past them.
    fn train<B: Backend>(
        &self,
        control: &str,
        (stage, dir): &(Stage, PathBuf),
        model: FoveatedModel<Autodiff<B>>,
        device: &B::Device,
    ) -> Result<Outcome<FoveatedModel<Autodiff<B>>>, String> {
        let train = SyntheticClips::<Autodiff<B>>::new(
            stage.task.clone(),
            0,
            self.batch * 64,
            self.batch,
            device.clone(),
        );
        let eval = SyntheticClips::<B>::new(
            stage.task.clone(),
            EVAL_FIRST,
            self.eval_clips,
            self.batch,
            device.clone(),
        );
        let (grid, task) = (stage.task.grid, &stage.task);
        eprintln!(
            "{control}: {} steps of {} clips on {grid}×{grid} boards",
            stage.steps, self.batch
        );
        let options = RunOptions {
            model_settings: json!({
                "control": control,
                "readout": format!("{:?}", self.readout),
                "variant": format!("{:?}", self.variant).to_lowercase(),
                "lambda": self.connectors().lambda_coarse,
                "task": format!("{task:?}"),
            }),
            ..RunOptions::new(dir)
        };
        let config = self.train_config(stage.steps, self.rate(control))?;
        Trainer::<Autodiff<B>>::new(config, options, device.clone())
            .fit(model, &train, Some(&eval))
            .map_err(|e| e.to_string())
    }

    /// What makes the run's results what they are: `summary.json` reports them, and the same
    /// settings rerun in the same `--out` resume there while others are refused
    /// (`kiln::train::claim`).
    fn settings(&self) -> Value {
        json!({
            "steps": self.steps,
            "readout": format!("{:?}", self.readout).to_lowercase(),
            "variant": format!("{:?}", self.variant).to_lowercase(),
            "lambda": self.connectors().lambda_coarse,
            "caption": self.caption,
            "grid": self.grid,
            "start_grid": self.start_grid,
            "start_steps": self.start_steps,
            "cell": self.cell,
            "frames": self.frames,
            "classes": self.classes,
            "token_width": self.token_width,
            "chance": 1.0 / self.classes as f64,
            "batch": self.batch,
            "lr": self.lr,
            "all_patches_lr": self.all_patches_lr,
            "all_patches_start_steps": self.curriculum("all_patches").start_steps,
            "eval_clips": self.eval_clips,
            "eval_every": self.eval_every,
            "seed": self.seed,
            "controls": self.controls,
            "device": self.device.to_string(),
        })
    }

    /// A control's peak learning rate and the factor its cosine ends at: the readout controls
    /// end at 0 (ending at 0.1× left the fine pass swinging by up to ±5% between evaluations
    /// on some seeds), the every-patch bound at 0.1× (ending at 0 stalled its lookup on seed 0:
    /// docs/FOVEATED.md).
    fn rate(&self, control: &str) -> (f64, f64) {
        match control {
            "all_patches" => (self.all_patches_lr, 0.1),
            _ => (self.lr, 0.0),
        }
    }

    fn train_config(&self, steps: u64, (lr, end): (f64, f64)) -> Result<TrainConfig, String> {
        let mut config = synthetic::recipe(steps, lr, end);
        config.eval_every = self.eval_every;
        config.checkpoint_every = self.eval_every;
        config.seed = self.seed;
        config.validate().map_err(|e| e.to_string())?;
        Ok(config)
    }
}

impl DeviceJob for Args {
    type Output = Result<(), String>;

    fn run<B: Backend>(self, device: &B::Device) -> Self::Output {
        let started = Instant::now();
        self.check()?;
        kiln::io::RunFiles::new()
            .output_dir("--out", &self.out)
            .check()
            .map_err(|e| e.to_string())?;
        for control in ["both", "all_patches"] {
            self.train_config(self.steps, self.rate(control))?;
        }
        let outputs = ["summary.json", "curves.png"]
            .into_iter()
            .chain(CONTROLS.map(|(name, _)| name))
            .map(String::from)
            .collect::<Vec<_>>();
        kiln::train::claim(&self.out, &self.settings(), &outputs).map_err(|e| e.to_string())?;
        let mut summary = serde_json::Map::new();
        if let Some(unknown) = self
            .controls
            .iter()
            .find(|c| !CONTROLS.iter().any(|(n, _)| n == c))
        {
            return Err(format!(
                "--controls: no control named '{unknown}' (the controls: {})",
                CONTROLS.map(|(name, _)| name).join(", ")
            ));
        }
        for (name, mode) in CONTROLS
            .into_iter()
            .filter(|(n, _)| self.controls.iter().any(|c| c == n))
        {
            let stages = self.stages(name)?;
            let mut model = self.model::<Autodiff<B>>(mode, device)?;
            let mut outcome = None;
            for stage in &stages {
                let done = self.train::<B>(name, stage, model, device)?;
                model = done.model.clone();
                outcome = Some(done);
            }
            let outcome = outcome.expect("a control has a final stage");
            if let Some((_, loss)) = outcome.eval.iter().find(|(k, _)| k == "loss")
                && !loss.is_finite()
            {
                return Err(format!(
                    "{name}: the held-out loss is {loss} after training: the model diverged \
                     (lower --lr); summary.json is not written"
                ));
            }
            model
                .save(self.out.join(name).join("model"))
                .map_err(|e| e.to_string())?;
            let metric = |key: &str| outcome.eval.iter().find(|(k, _)| k == key).map(|(_, v)| *v);
            let (coarse, fine) = (metric("coarse_accuracy"), metric("fine_accuracy"));
            eprintln!(
                "{name}: held-out accuracy coarse {} fine {}",
                shown(coarse),
                shown(fine)
            );
            // Beside the contract's two accuracies, every held-out figure (loss, accuracy per
            // frame, where the readouts look: FoveatedOutput::diagnostics).
            let held_out: serde_json::Map<String, Value> = outcome
                .eval
                .iter()
                .map(|(key, value)| (key.clone(), json!(value)))
                .collect();
            summary.insert(
                name.into(),
                json!({"coarse_accuracy": coarse, "fine_accuracy": fine, "held_out": held_out}),
            );
        }
        let mut settings = self.settings();
        settings["wall_seconds"] = json!(started.elapsed().as_secs_f64());
        summary.insert("settings".into(), settings);
        kiln::io::write_json(&self.out.join("summary.json"), &summary)
            .map_err(|e| e.to_string())?;
        plot(&self.out, &self.controls, 1.0 / self.classes as f64)?;
        println!(
            "{} and {}",
            self.out.join("summary.json").display(),
            self.out.join("curves.png").display()
        );
        Ok(())
    }
}

fn shown(accuracy: Option<f64>) -> String {
    accuracy.map_or("—".into(), |a| format!("{:.1}%", 100.0 * a))
}

/// OUT/curves.png: each control's held-out accuracy (fine thick, coarse thin) against the
/// step, with chance, the ceiling of a pass that cannot look and the target of one that looks
/// marked.
fn plot(out: &Path, controls: &[String], chance: f64) -> Result<(), String> {
    use plotters::prelude::*;

    let path = out.join("curves.png");
    let mut series = Vec::new();
    let mut last_step = 1u64;
    for (control, name) in controls.iter().enumerate() {
        let lines = read_metrics(&out.join(name)).map_err(|e| e.to_string())?;
        for key in ["fine_accuracy", "coarse_accuracy"] {
            let points: Vec<(u64, f64)> = lines
                .iter()
                .filter_map(|line| {
                    let step = line.get("step")?.as_u64()?;
                    Some((step, line.get(format!("eval_{key}"))?.as_f64()?))
                })
                .collect();
            if let Some(&(step, _)) = points.last() {
                last_step = last_step.max(step);
                let label = format!("{name} ({})", &key[..key.len() - 9]);
                series.push((control, label, key, points));
            }
        }
    }
    draw_png(&path, (1000, 600), |figure| {
        let mut chart = ChartBuilder::on(figure)
            .caption("cue then read: held-out accuracy", ("sans-serif", 22))
            .margin(12)
            .x_label_area_size(40)
            .y_label_area_size(56)
            .build_cartesian_2d(0u64..last_step, 0f64..1.0)?;
        chart
            .configure_mesh()
            .x_desc("optimizer step")
            .y_desc("accuracy")
            .draw()?;
        // Issue 25's levels beneath the curves: chance, then dashed the ceiling of a pass that
        // cannot look and the floor of one that looks.
        for (level, label, colour, dash) in [
            (chance, "chance (1/K)", BLACK.mix(0.4), None),
            (
                chance + 0.1,
                "ceiling, cannot look (1/K + 0.1)",
                RED.mix(0.7),
                Some(8),
            ),
            (0.9, "target, looks (0.9)", BLACK.mix(0.4), Some(8)),
        ] {
            let style = ShapeStyle::from(colour).stroke_width(1);
            let line = [(0, level), (last_step, level)];
            let drawn = match dash {
                None => chart.draw_series(LineSeries::new(line, style)),
                Some(dash) => chart.draw_series(DashedLineSeries::new(line, dash, dash / 2, style)),
            };
            drawn?
                .label(label)
                .legend(move |(x, y)| PathElement::new([(x, y), (x + 18, y)], style));
        }
        for (control, label, key, points) in series {
            // One colour per control: fine solid and thick, coarse thin.
            let colour = Palette99::pick(control).to_rgba();
            let style =
                ShapeStyle::from(colour).stroke_width(if key == "fine_accuracy" { 3 } else { 1 });
            chart
                .draw_series(LineSeries::new(points, style))?
                .label(label)
                .legend(move |(x, y)| PathElement::new([(x, y), (x + 18, y)], style));
        }
        chart
            .configure_series_labels()
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK)
            .position(SeriesLabelPosition::MiddleRight)
            .draw()?;
        Ok(())
    })
    .map_err(|e| e.to_string())
}

fn main() -> ExitCode {
    allocator::keep_freed_memory();
    let args = Args::parse();
    kiln::run_job(args.device, args)
}
