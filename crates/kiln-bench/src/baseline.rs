//! Saved suite runs (baselines) and comparisons of a new run against one.

use std::fmt::{self, Write as _};
use std::path::PathBuf;

use kiln_io::FileError;

use crate::BenchError;
use crate::report::{BenchResult, SuiteRun};
use crate::stats::relative_change_noise;

/// Relative change of the median beyond which a benchmark counts as changed (5%).
pub const DEFAULT_THRESHOLD: f64 = 0.05;

/// A directory of baselines, one JSON file per name.
#[derive(Debug, Clone)]
pub struct BaselineStore {
    dir: PathBuf,
}

impl BaselineStore {
    /// Baselines under `dir` (created on the first save).
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        BaselineStore { dir: dir.into() }
    }

    /// The file of baseline `name`.
    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.join(format!("{name}.json"))
    }

    /// The copy of the executable that saved baseline `name`, kept to run it in turns with a
    /// new build (see [`conduct`](crate::conduct)).
    pub fn build_path(&self, name: &str) -> PathBuf {
        self.dir.join(format!("{name}.bin"))
    }

    /// The saved build of baseline `name`, where one was kept (baselines saved before
    /// kiln-bench kept builds have none).
    pub fn build(&self, name: &str) -> Option<PathBuf> {
        Some(self.build_path(name)).filter(|path| path.is_file())
    }

    /// Keeps a copy of `executable` (the running suite) as baseline `name`'s build, whole or
    /// not at all.
    pub fn save_build(
        &self,
        name: &str,
        executable: &std::path::Path,
    ) -> Result<PathBuf, BenchError> {
        check_name(name)?;
        let path = self.build_path(name);
        let partial = self.dir.join(format!(".{name}.bin.partial"));
        std::fs::copy(executable, &partial).map_err(|e| FileError::io(executable, e))?;
        std::fs::rename(&partial, &path).map_err(|e| FileError::io(&path, e))?;
        Ok(path)
    }

    /// Names of the saved baselines, sorted.
    pub fn names(&self) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(&self.dir)
            .into_iter()
            .flatten()
            .filter_map(|entry| {
                let path = entry.ok()?.path();
                (path.extension()? == "json")
                    .then(|| path.file_stem()?.to_str().map(String::from))?
            })
            .collect();
        names.sort();
        names
    }

    /// Saves `run` as baseline `name`, whole or not at all ([`kiln_io::write_atomic`]): an
    /// interrupted save never destroys the previous baseline of that name.
    pub fn save(&self, name: &str, run: &SuiteRun) -> Result<PathBuf, BenchError> {
        check_name(name)?;
        std::fs::create_dir_all(&self.dir).map_err(|e| FileError::io(&self.dir, e))?;
        let path = self.path(name);
        let json = serde_json::to_string_pretty(run)
            .map_err(|e| FileError::io(&path, std::io::Error::other(e)))?;
        kiln_io::write_atomic(&path, json.as_bytes())?;
        Ok(path)
    }

    /// Loads baseline `name`; a missing one is an error that lists the saved names.
    pub fn load(&self, name: &str) -> Result<SuiteRun, BenchError> {
        check_name(name)?;
        let path = self.path(name);
        let text = std::fs::read_to_string(&path).map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => BenchError::NoBaseline {
                name: name.to_string(),
                dir: self.dir.display().to_string(),
                saved: match self.names() {
                    names if names.is_empty() => "none".into(),
                    names => names.join(", "),
                },
            },
            _ => FileError::io(&path, e).into(),
        })?;
        serde_json::from_str(&text).map_err(|e| BenchError::NotABaseline {
            path,
            reason: e.to_string(),
        })
    }
}

fn check_name(name: &str) -> Result<(), BenchError> {
    let ok = !name.is_empty()
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
        && !name.starts_with('.');
    if ok {
        Ok(())
    } else {
        Err(BenchError::BadName(name.to_string()))
    }
}

/// What a comparison concludes for one benchmark.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Slower beyond both the threshold and the noise.
    Regressed,
    /// Faster beyond both the threshold and the noise.
    Improved,
    /// Within the threshold or the noise.
    Unchanged,
    /// Only in the new run.
    New,
    /// Only in the baseline.
    Missing,
}

impl Verdict {
    /// The verdict on a relative `change` that exceeds the noise or not.
    pub fn of(change: f64, beyond_noise: bool, threshold: f64) -> Self {
        if !beyond_noise || change.abs() <= threshold {
            Verdict::Unchanged
        } else if change > 0.0 {
            Verdict::Regressed
        } else {
            Verdict::Improved
        }
    }
}

impl fmt::Display for Verdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(match self {
            Verdict::Regressed => "REGRESSED",
            Verdict::Improved => "improved",
            Verdict::Unchanged => "within noise",
            Verdict::New => "new",
            Verdict::Missing => "missing",
        })
    }
}

/// How a comparison read its changes.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Method {
    /// The new run against the numbers saved with the baseline: the machine's drift between
    /// the two runs counts as change.
    SavedNumbers,
    /// The baseline's saved build and the new build took their samples in turns.
    InTurns {
        /// How much slower the baseline's build ran now than when it was saved (the geometric
        /// mean over benchmarks of the ratio of medians, minus 1): the drift a comparison with
        /// its saved numbers would have read as change.
        baseline_drift: Option<f64>,
    },
}

/// One row of a comparison.
#[derive(Debug, Clone)]
pub struct Row {
    /// The new result, or the baseline's when the benchmark is missing from the new run.
    pub result: BenchResult,
    /// Relative change of the median, `new / old - 1`.
    pub change: Option<f64>,
    /// 95% noise of that change, from both runs' samples.
    pub noise: Option<f64>,
    /// The conclusion.
    pub verdict: Verdict,
}

impl Row {
    /// A row with no change to show.
    pub(crate) fn unpaired(result: BenchResult, verdict: Verdict) -> Self {
        Row {
            result,
            change: None,
            noise: None,
            verdict,
        }
    }
}

/// A new run compared with a baseline.
#[derive(Debug, Clone)]
pub struct Comparison {
    /// Name of the baseline.
    pub baseline: String,
    /// The threshold used.
    pub threshold: f64,
    /// One row per benchmark, in the new run's order, then the missing ones.
    pub rows: Vec<Row>,
    /// How the changes were read.
    pub method: Method,
}

impl Comparison {
    /// Compares `new` with `old` (named `baseline`): a benchmark regressed when its median grew
    /// by more than `threshold` and by more than the noise.
    pub fn new(baseline: &str, old: &SuiteRun, new: &SuiteRun, threshold: f64) -> Self {
        let mut rows: Vec<Row> = new
            .results
            .iter()
            .map(|result| {
                let Some(before) = old.results.iter().find(|o| o.key() == result.key()) else {
                    return Row::unpaired(result.clone(), Verdict::New);
                };
                let change = result.summary.median / before.summary.median - 1.0;
                let noise = relative_change_noise(&before.summary, &result.summary);
                let verdict = Verdict::of(change, change.abs() > noise, threshold);
                Row {
                    result: result.clone(),
                    change: Some(change),
                    noise: Some(noise),
                    verdict,
                }
            })
            .collect();
        rows.extend(
            old.results
                .iter()
                .filter(|o| !new.results.iter().any(|n| n.key() == o.key()))
                .map(|o| Row::unpaired(o.clone(), Verdict::Missing)),
        );
        Comparison {
            baseline: baseline.to_string(),
            threshold,
            rows,
            method: Method::SavedNumbers,
        }
    }

    /// Whether any benchmark regressed.
    pub fn regressed(&self) -> bool {
        self.rows.iter().any(|r| r.verdict == Verdict::Regressed)
    }
}

/// Seconds in a readable unit.
pub fn format_seconds(s: f64) -> String {
    match s {
        s if s >= 1.0 => format!("{s:.3} s"),
        s if s >= 1e-3 => format!("{:.3} ms", s * 1e3),
        s if s >= 1e-6 => format!("{:.3} µs", s * 1e6),
        s => format!("{:.1} ns", s * 1e9),
    }
}

/// A rate with an SI prefix, e.g. `12.3 G`.
pub fn format_rate(x: f64) -> String {
    let (scaled, prefix) = [(1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")]
        .into_iter()
        .find(|(scale, _)| x >= *scale)
        .map_or((x, ""), |(scale, prefix)| (x / scale, prefix));
    format!("{scaled:.3} {prefix}")
}

/// The throughput column: items/s, and FLOP/s or bytes/s when declared.
fn throughput(result: &BenchResult) -> String {
    let t = &result.throughput;
    let mut text = format!("{}item/s", format_rate(t.items_per_s));
    if let Some(flops) = t.flop_per_s {
        let _ = write!(text, ", {}FLOP/s", format_rate(flops));
    } else if let Some(bytes) = t.bytes_per_s {
        let _ = write!(text, ", {}B/s", format_rate(bytes));
    }
    if let Some(fraction) = result.roofline {
        let _ = write!(text, " ({:.0}% of roofline)", fraction * 100.0);
    }
    text
}

const HEADER: &str = "| benchmark | backend | device | dtype | median | p90 | throughput |";

fn cells(result: &BenchResult) -> String {
    format!(
        "| {} | {} | {} | {} | {} | {} | {} |",
        result.name,
        result.backend,
        result.device,
        result.dtype,
        format_seconds(result.summary.median),
        format_seconds(result.summary.p90),
        throughput(result)
    )
}

/// A markdown table of a suite run.
pub fn run_table(run: &SuiteRun) -> String {
    let mut out = format!("{HEADER}\n|---|---|---|---|---|---|---|\n");
    for result in &run.results {
        let _ = writeln!(out, "{}", cells(result));
    }
    out
}

impl fmt::Display for Comparison {
    /// The markdown table: benchmark | backend | device | dtype | median | p90 | throughput |
    /// change | verdict.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "{HEADER} change | verdict |")?;
        writeln!(f, "|---|---|---|---|---|---|---|---|---|")?;
        for row in &self.rows {
            let change = match (row.change, row.noise) {
                (Some(c), Some(n)) => format!("{:+.1}% ± {:.1}%", c * 100.0, n * 100.0),
                _ => "–".into(),
            };
            writeln!(f, "{} {change} | {} |", cells(&row.result), row.verdict)?;
        }
        write!(
            f,
            "\nagainst baseline `{}`, threshold {:.1}%: ",
            self.baseline,
            self.threshold * 100.0
        )?;
        let regressions = self
            .rows
            .iter()
            .filter(|r| r.verdict == Verdict::Regressed)
            .count();
        match regressions {
            0 => writeln!(f, "no regression")?,
            n => writeln!(f, "{n} regression(s)")?,
        }
        match self.method {
            Method::SavedNumbers => writeln!(
                f,
                "read against the baseline's saved numbers: noise is each run's own (95%), and \
                 the machine's drift between the runs counts as change"
            ),
            Method::InTurns { baseline_drift } => {
                write!(
                    f,
                    "read from the baseline's saved build and this one taking their samples in \
                     turns: change is the median of the turns' ratios, noise its 99% interval"
                )?;
                match baseline_drift {
                    Some(drift) => writeln!(
                        f,
                        "; the baseline's build ran {:+.1}% against its saved numbers, drift \
                         that this reading cancels",
                        drift * 100.0
                    ),
                    None => writeln!(f),
                }
            }
        }
    }
}
