//! What a run shows and writes: progress bars, the timing breakdown, summary.json / .csv and
//! convergence.png.

use std::path::Path;

use indicatif::{MultiProgress, ProgressBar, ProgressStyle};
use kiln::mc::{Experiment, SummaryRow, Timings, TrialKey, to_csv};
use kiln::train::plot::draw_png;
use serde_json::json;

/// Seconds per stage of this run.
#[derive(Default)]
pub struct Clock {
    pub cache: f64,
    pub load: f64,
    pub trials: Timings,
}

/// The progress bars: trials, and the passes of the trial running.
pub struct Bars {
    _multi: MultiProgress,
    pub trials: ProgressBar,
    pub passes: ProgressBar,
    images: u64,
}

impl Bars {
    pub fn new(todo: &[TrialKey], experiment: &Experiment, images: u64) -> Self {
        let multi = MultiProgress::new();
        let style = |template| ProgressStyle::with_template(template).expect("a valid template");
        let trials = multi.add(ProgressBar::new(todo.len() as u64).with_style(style(
            "trials {bar:30} {pos}/{len} {msg} [{elapsed_precise} < {eta_precise}]",
        )));
        let passes = multi.add(
            ProgressBar::new(0)
                .with_style(style("passes {bar:30} {pos}/{len} image passes {per_sec}")),
        );
        trials.set_message(format!("({} models)", experiment.models.len()));
        Bars {
            _multi: multi,
            trials,
            passes,
            images,
        }
    }

    pub fn start(&self, key: &TrialKey, experiment: &Experiment) {
        self.trials.set_message(format!(
            "{}  T = {}  trial {}/{}",
            key.model,
            key.passes,
            key.trial + 1,
            experiment.trials
        ));
        self.passes.reset();
        self.passes.set_length(self.images * u64::from(key.passes));
    }

    pub fn finish(&self) {
        self.passes.finish_and_clear();
        self.trials.finish();
    }
}

/// Prints where this run's time went.
pub fn report_timings(clock: &Clock, wall: f64, trials: usize) {
    let t = &clock.trials;
    let other = wall - clock.cache - clock.load - t.upload - t.forward - t.accumulate - t.readback;
    eprintln!(
        "time: {trials} trial(s) in {wall:.1} s: cache {:.2} s, model load {:.2} s, upload {:.2} \
         s, forward {:.2} s, accumulate {:.2} s, readback {:.2} s, other {:.2} s",
        clock.cache, clock.load, t.upload, t.forward, t.accumulate, t.readback, other
    );
    eprintln!(
        "forward passes: {:.1}% of wall time",
        100.0 * t.forward / wall
    );
}

/// summary.json, summary.csv and convergence.png in `out`.
pub fn write_results(
    out: &Path,
    experiment: &Experiment,
    rows: &[SummaryRow],
    run: serde_json::Value,
    naive: Option<serde_json::Value>,
) -> Result<(), String> {
    let summary = json!({
        "experiment": experiment,
        "run": run,
        "naive": naive,
        "rows": rows,
    });
    kiln::io::write_json(&out.join("summary.json"), &summary).map_err(|e| e.to_string())?;
    kiln::io::write_atomic(&out.join("summary.csv"), to_csv(rows).as_bytes())
        .map_err(|e| e.to_string())?;
    plot(&out.join("convergence.png"), experiment, rows)?;
    print_table(rows);
    eprintln!(
        "results: {}/summary.json, summary.csv, convergence.png, trials/",
        out.display()
    );
    Ok(())
}

fn print_table(rows: &[SummaryRow]) {
    println!(
        "{:<16} {:>5} {:>15} {:>13} {:>10} {:>10} {:>9}",
        "model", "T", "mean variance", "uncertainty", "spread", "rank stab.", "forward"
    );
    for r in rows {
        println!(
            "{:<16} {:>5} {:>15.4e} {:>13.4e} {:>10.2e} {:>10.3} {:>8.1}%",
            r.model,
            r.passes,
            r.mean_variance,
            r.uncertainty,
            r.uncertainty_spread,
            r.rank_stability,
            100.0 * r.forward_fraction
        );
    }
}

/// A figure of a summary row.
type Metric = fn(&SummaryRow) -> f64;

/// Between-trial variance of the mean and rank stability against T, one line per model, log
/// axes ticked at the pass counts measured.
fn plot(path: &Path, experiment: &Experiment, rows: &[SummaryRow]) -> Result<(), String> {
    use plotters::prelude::*;

    let passes: Vec<f64> = experiment.passes.iter().map(|&t| f64::from(t)).collect();
    let t_min = passes.iter().copied().fold(f64::MAX, f64::min) / 1.25;
    let t_max = passes.iter().copied().fold(f64::MIN, f64::max) * 1.25;
    let series = |model: &str, value: Metric| -> Vec<(f64, f64)> {
        rows.iter()
            .filter(|r| r.model == model)
            .map(|r| (f64::from(r.passes), value(r)))
            .filter(|(_, v)| v.is_finite())
            .collect()
    };
    let panels_spec: [(&str, Metric, bool); 2] = [
        (
            "between-trial variance of the mean",
            |r| r.mean_variance,
            true,
        ),
        ("rank stability (Spearman)", |r| r.rank_stability, false),
    ];
    draw_png(path, (1200, 500), |figure| {
        let panels = figure.split_evenly((1, 2));
        for (panel, (title, value, log_y)) in panels.iter().zip(panels_spec) {
            let values: Vec<f64> = rows.iter().map(value).filter(|v| v.is_finite()).collect();
            let (lo, hi) = values
                .iter()
                .fold((f64::MAX, f64::MIN), |(l, h), &v| (l.min(v), h.max(v)));
            let (lo, hi) = match (values.is_empty(), log_y) {
                (true, true) => (1e-12, 1.0),
                (true, false) => (-1.0, 1.0),
                (false, true) if lo <= 0.0 => (1e-12, 1.0),
                (false, true) => (lo / 2.0, hi * 2.0),
                (false, false) => (lo.min(0.0) - 0.05, 1.05f64.max(hi)),
            };
            let x = (t_min..t_max).log_scale().with_key_points(passes.clone());
            let mut chart = ChartBuilder::on(panel);
            chart
                .caption(title, ("sans-serif", 22))
                .margin(16)
                .x_label_area_size(40)
                .y_label_area_size(70);
            let colours = [BLUE, RED, GREEN, MAGENTA, CYAN, BLACK];
            if log_y {
                let mut c = chart.build_cartesian_2d(x, (lo..hi).log_scale())?;
                c.configure_mesh()
                    .x_desc("passes T")
                    .x_label_formatter(&|t| format!("{t:.0}"))
                    .y_label_formatter(&|v| format!("{v:.0e}"))
                    .draw()?;
                for (model, colour) in experiment.models.iter().zip(colours.iter().cycle()) {
                    let points = series(model, value);
                    c.draw_series(LineSeries::new(points.clone(), colour.stroke_width(2)))?
                        .label(model)
                        .legend(move |(x, y)| PathElement::new([(x, y), (x + 20, y)], colour));
                    c.draw_series(points.iter().map(|&p| Circle::new(p, 4, colour.filled())))?;
                }
                c.configure_series_labels()
                    .background_style(WHITE.mix(0.8))
                    .border_style(BLACK)
                    .draw()?;
            } else {
                let mut c = chart.build_cartesian_2d(x, lo..hi)?;
                c.configure_mesh()
                    .x_desc("passes T")
                    .x_label_formatter(&|t| format!("{t:.0}"))
                    // A tick a rounding error below 0 reads 0.0, not -0.0.
                    .y_label_formatter(&|v| format!("{:.1}", if v.abs() < 1e-9 { 0.0 } else { *v }))
                    .draw()?;
                for (model, colour) in experiment.models.iter().zip(colours.iter().cycle()) {
                    let points = series(model, value);
                    c.draw_series(LineSeries::new(points.clone(), colour.stroke_width(2)))?;
                    c.draw_series(points.iter().map(|&p| Circle::new(p, 4, colour.filled())))?;
                }
            }
        }
        Ok(())
    })
    .map_err(|e| e.to_string())
}
