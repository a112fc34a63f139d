//! `curves.png`: the held-out answer NLL and first-token accuracy over training, for each
//! language model (columns) and prompt kind (the text, the latent prefix, the token budget), read
//! from a run's `metrics.jsonl` evaluations (`eval_<name>/<kind>/<metric>`).

use std::path::Path;

use kiln_train::plot::{Drawn, Figure, PlotError, draw_png};
use plotters::prelude::*;
use serde_json::Value;

/// The prompt kinds, as the evaluation names them, and their colours.
const KINDS: [(&str, RGBColor); 3] = [("text", BLUE), ("latent", RED), ("token_budget", GREEN)];

/// The metrics drawn, one row each: the key's last part, the axis's name, and whether it is a
/// share (drawn from 0 to 1).
const METRICS: [(&str, &str, bool); 2] = [
    ("nll", "answer NLL per token (nats)", false),
    ("first_token_accuracy", "first-token accuracy", true),
];

/// Draws the evaluations among `lines` (a run's `metrics.jsonl`, read) for the language models
/// `names` into `path`.
pub fn plot_curves(path: &Path, lines: &[Value], names: &[String]) -> Result<(), PlotError> {
    let series = |name: &str, kind: &str, metric: &str| -> Vec<(f64, f64)> {
        let key = format!("eval_{name}/{kind}/{metric}");
        (lines.iter())
            .filter_map(|line| {
                let step = line.get("step")?.as_f64()?;
                Some((step, line.get(&key)?.as_f64()?)).filter(|(_, v)| v.is_finite())
            })
            .collect()
    };
    let last = (lines.iter())
        .filter_map(|line| line.get("step")?.as_f64())
        .fold(1.0, f64::max);
    let columns = names.len().max(1);
    draw_png(
        path,
        (520 * columns as u32, 760),
        |figure: &Figure| -> Drawn {
            let panels = figure.split_evenly((METRICS.len(), columns));
            for (row, &(metric, axis, share)) in METRICS.iter().enumerate() {
                for (column, name) in names.iter().enumerate() {
                    let drawn: Vec<_> = (KINDS.iter())
                        .map(|(kind, colour)| (*kind, *colour, series(name, kind, metric)))
                        .collect();
                    let values = drawn.iter().flat_map(|(_, _, s)| s.iter().map(|&(_, v)| v));
                    let (lo, hi) =
                        values.fold((f64::MAX, f64::MIN), |(l, h), v| (l.min(v), h.max(v)));
                    let (lo, hi) = if lo > hi || share {
                        (0.0, 1.0)
                    } else {
                        (lo, hi)
                    };
                    let pad = 0.05 * (hi - lo).max(1e-3);
                    let mut chart = ChartBuilder::on(&panels[row * columns + column])
                        .caption(format!("{name}: {axis}"), ("sans-serif", 18))
                        .margin(12)
                        .x_label_area_size(36)
                        .y_label_area_size(56)
                        .build_cartesian_2d(0f64..last, (lo - pad).min(0.0)..hi + pad)?;
                    chart.configure_mesh().x_desc("optimizer step").draw()?;
                    for (kind, colour, points) in drawn {
                        let style = colour.stroke_width(2);
                        chart
                            .draw_series(LineSeries::new(points.clone(), style))?
                            .label(kind)
                            .legend(move |(x, y)| PathElement::new([(x, y), (x + 20, y)], colour));
                        chart.draw_series(
                            points.iter().map(|&p| Circle::new(p, 3, colour.filled())),
                        )?;
                    }
                    chart
                        .configure_series_labels()
                        .background_style(WHITE.mix(0.8))
                        .border_style(BLACK)
                        .draw()?;
                }
            }
            Ok(())
        },
    )
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    #[test]
    fn evaluations_are_drawn_to_a_png() {
        let lines: Vec<_> = (1..=3)
            .map(|step| {
                json!({"step": step, "loss": 1.0,
                       "eval_a/text/nll": 1.0, "eval_a/latent/nll": 3.0 / step as f64,
                       "eval_a/token_budget/nll": 2.5, "eval_a/latent/first_token_accuracy": 0.5})
            })
            .collect();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("curves.png");
        super::plot_curves(&path, &lines, &["a".into(), "b".into()]).unwrap();
        assert!(std::fs::read(&path).unwrap().starts_with(b"\x89PNG"));
    }
}
