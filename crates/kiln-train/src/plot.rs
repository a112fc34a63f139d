//! Figures: [`draw_png`], the one way kiln draws a plot and writes it (the bundled font, one PNG
//! encoder, written whole or not at all), and `loss.png` ([`plot_curves`]): training loss per
//! step with the evaluation loss beside it, and each group's learning rate, drawn at every
//! evaluation and at the end.

use std::path::{Path, PathBuf};

use image::ImageEncoder;
use plotters::coord::Shift;
use plotters::prelude::*;

use crate::metrics::StepPoint;

/// A figure being drawn: the whole canvas, white, text in DejaVu Sans as `"sans-serif"`.
pub type Figure<'a> = DrawingArea<BitMapBackend<'a>, Shift>;

/// What drawing on a [`Figure`] gives: plotters' errors pass through `?`.
pub type Drawn = Result<(), Box<dyn std::error::Error>>;

/// Why a figure could not be drawn or written.
#[derive(Debug, thiserror::Error)]
pub enum PlotError {
    /// The drawing failed (plotters' error, or the bundled font).
    #[error("{}: {reason}", path.display())]
    Draw {
        /// The figure's file.
        path: PathBuf,
        /// plotters' words.
        reason: String,
    },
    /// The PNG could not be written (the disk is full, the directory is not writable).
    #[error(transparent)]
    Write(#[from] kiln_io::FileError),
}

/// Draws a `width` × `height` figure with `draw` and writes it to `path` as a PNG, whole or
/// not at all (a reader never sees half a plot).
///
/// ```
/// use kiln_train::plot::{Drawn, Figure, draw_png};
/// use plotters::prelude::*;
///
/// let dir = tempfile::tempdir().unwrap();
/// let path = dir.path().join("line.png");
/// draw_png(&path, (320, 200), |figure: &Figure| -> Drawn {
///     let mut chart = ChartBuilder::on(figure).build_cartesian_2d(0f64..1.0, 0f64..1.0)?;
///     chart.draw_series(LineSeries::new([(0.0, 0.0), (1.0, 1.0)], BLUE))?;
///     Ok(())
/// })
/// .unwrap();
/// assert!(std::fs::read(&path).unwrap().starts_with(b"\x89PNG"));
/// ```
pub fn draw_png(
    path: &Path,
    (width, height): (u32, u32),
    draw: impl FnOnce(&Figure) -> Drawn,
) -> Result<(), PlotError> {
    let fail = |e: &dyn std::fmt::Display| PlotError::Draw {
        path: path.to_path_buf(),
        reason: e.to_string(),
    };
    plotters::style::register_font("sans-serif", FontStyle::Normal, dejavu::sans::regular())
        .map_err(|_| fail(&"the bundled font"))?;
    let mut buffer = vec![0u8; (width * height * 3) as usize];
    {
        let figure = BitMapBackend::with_buffer(&mut buffer, (width, height)).into_drawing_area();
        figure.fill(&WHITE).map_err(|e| fail(&e))?;
        draw(&figure).map_err(|e| fail(&e))?;
        figure.present().map_err(|e| fail(&e))?;
    }
    let mut png = Vec::new();
    image::codecs::png::PngEncoder::new(&mut png)
        .write_image(&buffer, width, height, image::ExtendedColorType::Rgb8)
        .map_err(|e| fail(&e))?;
    Ok(kiln_io::write_atomic(path, &png)?)
}

/// Draws `points` into `path`.
pub fn plot_curves(path: &Path, points: &[StepPoint], groups: &[String]) -> Result<(), PlotError> {
    let last = points.last().map_or(1, |p| p.step).max(1) as f64;
    let train: Vec<(f64, f64)> = points
        .iter()
        .map(|p| (p.step as f64, p.loss))
        .filter(|(_, l)| l.is_finite())
        .collect();
    let eval: Vec<(f64, f64)> = points
        .iter()
        .filter_map(|p| {
            let (_, v) = p.eval.iter().find(|(k, _)| k == "loss")?;
            v.is_finite().then_some((p.step as f64, *v))
        })
        .collect();
    // Positive losses spanning more than two decades (a force field's start against its end)
    // are drawn on a log scale: their log10 on a linear axis, labelled with the values.
    let (lowest, highest) = train
        .iter()
        .chain(&eval)
        .fold((f64::MAX, f64::MIN), |(l, h), &(_, v)| (l.min(v), h.max(v)));
    let log = lowest > 0.0 && highest / lowest > 100.0;
    let scale = |series: Vec<(f64, f64)>| -> Vec<(f64, f64)> {
        if log {
            series.into_iter().map(|(x, v)| (x, v.log10())).collect()
        } else {
            series
        }
    };
    let (train, eval) = (scale(train), scale(eval));
    draw_png(path, (1200, 500), |figure| {
        let panels = figure.split_evenly((1, 2));
        let values = train.iter().chain(&eval).map(|&(_, v)| v);
        let (lo, hi) = values.fold((f64::MAX, f64::MIN), |(l, h), v| (l.min(v), h.max(v)));
        let (lo, hi) = if lo > hi { (0.1, 1.0) } else { (lo, hi) };
        let colours = [BLUE, RED, GREEN, MAGENTA, CYAN, BLACK];
        {
            let pad = 0.05 * (hi - lo).abs().max(1e-3);
            let mut c = ChartBuilder::on(&panels[0])
                .caption(
                    if log { "loss (log scale)" } else { "loss" },
                    ("sans-serif", 22),
                )
                .margin(16)
                .x_label_area_size(40)
                .y_label_area_size(70)
                .build_cartesian_2d(
                    0f64..last,
                    if log {
                        lo - pad..hi + pad
                    } else {
                        (lo - pad).min(0.0)..(hi + pad)
                    },
                )?;
            c.configure_mesh()
                .x_desc("optimizer step")
                .y_label_formatter(&|v| {
                    if log {
                        format!("{:.2e}", 10f64.powf(*v))
                    } else {
                        format!("{v:.3}")
                    }
                })
                .draw()?;
            c.draw_series(LineSeries::new(train.clone(), BLUE.stroke_width(1)))?
                .label("train")
                .legend(|(x, y)| PathElement::new([(x, y), (x + 20, y)], BLUE));
            if !eval.is_empty() {
                c.draw_series(LineSeries::new(eval.clone(), RED.stroke_width(2)))?
                    .label("eval")
                    .legend(|(x, y)| PathElement::new([(x, y), (x + 20, y)], RED));
                c.draw_series(eval.iter().map(|&p| Circle::new(p, 4, RED.filled())))?;
            }
            c.configure_series_labels()
                .background_style(WHITE.mix(0.8))
                .border_style(BLACK)
                .draw()?;
        }
        let lr_max = points
            .iter()
            .flat_map(|p| p.lrs.iter().copied())
            .filter(|v| v.is_finite())
            .fold(0.0f64, f64::max);
        let mut c = ChartBuilder::on(&panels[1])
            .caption("learning rate", ("sans-serif", 22))
            .margin(16)
            .x_label_area_size(40)
            .y_label_area_size(80)
            .build_cartesian_2d(0f64..last, 0f64..(lr_max * 1.05).max(1e-12))?;
        c.configure_mesh()
            .x_desc("optimizer step")
            .y_label_formatter(&|v| format!("{v:.1e}"))
            .draw()?;
        for (g, (name, colour)) in groups.iter().zip(colours.iter().cycle()).enumerate() {
            let series: Vec<(f64, f64)> = points
                .iter()
                .map(|p| (p.step as f64, p.lrs.get(g).copied().unwrap_or(f64::NAN)))
                .filter(|(_, v)| v.is_finite())
                .collect();
            c.draw_series(LineSeries::new(series, colour.stroke_width(2)))?
                .label(name.as_str())
                .legend(move |(x, y)| PathElement::new([(x, y), (x + 20, y)], colour));
        }
        c.configure_series_labels()
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK)
            .draw()?;
        Ok(())
    })
}
