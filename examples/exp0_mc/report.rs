//! What a run shows and writes: progress bars, the timing breakdown, summary.json / .csv and
//! convergence.png.

use std::path::Path;

use indicatif::{MultiProgress, ProgressBar, ProgressStyle};
use kiln::mc::{Experiment, SummaryRow, Timings, TrialKey, to_csv};
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
    let write = |name: &str, bytes: &[u8]| {
        kiln::io::write_atomic(&out.join(name), bytes).map_err(|e| e.to_string())
    };
    write(
        "summary.json",
        serde_json::to_string_pretty(&summary)
            .expect("a summary serialises")
            .as_bytes(),
    )?;
    write("summary.csv", to_csv(rows).as_bytes())?;
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
/// axes.
fn plot(path: &Path, experiment: &Experiment, rows: &[SummaryRow]) -> Result<(), String> {
    use plotters::prelude::*;

    let (width, height) = (1200u32, 500u32);
    let mut buffer = vec![0u8; (width * height * 3) as usize];
    let fail = |e: &dyn std::fmt::Display| format!("{}: {e}", path.display());
    plotters::style::register_font("sans-serif", FontStyle::Normal, dejavu::sans::regular())
        .map_err(|_| fail(&"the bundled font"))?;
    {
        let root = BitMapBackend::with_buffer(&mut buffer, (width, height)).into_drawing_area();
        root.fill(&WHITE).map_err(|e| fail(&e))?;
        let panels = root.split_evenly((1, 2));
        let t_min = f64::from(*experiment.passes.iter().min().expect("pass counts")) / 1.25;
        let t_max = f64::from(*experiment.passes.iter().max().expect("pass counts")) * 1.25;
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
        for (panel, (title, value, log_y)) in panels.iter().zip(panels_spec) {
            let values: Vec<f64> = rows.iter().map(value).filter(|v| v.is_finite()).collect();
            let (lo, hi) = values
                .iter()
                .fold((f64::MAX, f64::MIN), |(l, h), &v| (l.min(v), h.max(v)));
            let mut chart = ChartBuilder::on(panel);
            chart
                .caption(title, ("sans-serif", 22))
                .margin(16)
                .x_label_area_size(40)
                .y_label_area_size(70);
            let colours = [BLUE, RED, GREEN, MAGENTA, CYAN, BLACK];
            if log_y {
                let (lo, hi) = if values.is_empty() || lo <= 0.0 {
                    (1e-12, 1.0)
                } else {
                    (lo / 2.0, hi * 2.0)
                };
                let mut c = chart
                    .build_cartesian_2d((t_min..t_max).log_scale(), (lo..hi).log_scale())
                    .map_err(|e| fail(&e))?;
                c.configure_mesh()
                    .x_desc("passes T")
                    .y_label_formatter(&|v| format!("{v:.0e}"))
                    .draw()
                    .map_err(|e| fail(&e))?;
                for (model, colour) in experiment.models.iter().zip(colours.iter().cycle()) {
                    let points = series(model, value);
                    c.draw_series(LineSeries::new(points.clone(), colour.stroke_width(2)))
                        .map_err(|e| fail(&e))?
                        .label(model)
                        .legend(move |(x, y)| PathElement::new([(x, y), (x + 20, y)], colour));
                    c.draw_series(points.iter().map(|&p| Circle::new(p, 4, colour.filled())))
                        .map_err(|e| fail(&e))?;
                }
                c.configure_series_labels()
                    .background_style(WHITE.mix(0.8))
                    .border_style(BLACK)
                    .draw()
                    .map_err(|e| fail(&e))?;
            } else {
                let (lo, hi) = if values.is_empty() {
                    (-1.0, 1.0)
                } else {
                    (lo.min(0.0) - 0.05, 1.05f64.max(hi))
                };
                let mut c = chart
                    .build_cartesian_2d((t_min..t_max).log_scale(), lo..hi)
                    .map_err(|e| fail(&e))?;
                c.configure_mesh()
                    .x_desc("passes T")
                    .draw()
                    .map_err(|e| fail(&e))?;
                for (model, colour) in experiment.models.iter().zip(colours.iter().cycle()) {
                    let points = series(model, value);
                    c.draw_series(LineSeries::new(points.clone(), colour.stroke_width(2)))
                        .map_err(|e| fail(&e))?;
                    c.draw_series(points.iter().map(|&p| Circle::new(p, 4, colour.filled())))
                        .map_err(|e| fail(&e))?;
                }
            }
        }
        root.present().map_err(|e| fail(&e))?;
    }
    let mut png = Vec::new();
    image::RgbImage::from_raw(width, height, buffer)
        .expect("the buffer holds the image")
        .write_to(&mut std::io::Cursor::new(&mut png), image::ImageFormat::Png)
        .map_err(|e| fail(&e))?;
    kiln::io::write_atomic(path, &png).map_err(|e| e.to_string())
}
