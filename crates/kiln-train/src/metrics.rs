//! `metrics.jsonl`: one JSON object per optimizer step, appended and flushed as the step ends.
//! A resumed run first cuts the file back to the steps its checkpoint holds (a line the kill cut
//! in half goes too), so the file of a run interrupted any number of times reads like the file
//! of a run never interrupted. The steps read back feed the loss and learning-rate plot.

use std::fs::{File, OpenOptions};
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};

use serde_json::{Map, Value};

use crate::TrainError;

/// One step's values as the plot needs them.
#[derive(Debug, Clone, PartialEq)]
pub struct StepPoint {
    /// The optimizer step (1-based: the step's number after it is taken).
    pub step: u64,
    /// The training loss.
    pub loss: f64,
    /// Learning rate per group.
    pub lrs: Vec<f64>,
    /// The evaluation's metrics where the step ended with one.
    pub eval: Vec<(String, f64)>,
}

/// The metrics file of a run and the steps in it.
pub struct MetricsLog {
    path: PathBuf,
    file: File,
    points: Vec<StepPoint>,
}

impl MetricsLog {
    /// Opens `path`, keeping the lines of steps up to `through` (0: none) and dropping the
    /// rest.
    pub fn open(path: &Path, through: u64, groups: &[String]) -> Result<Self, TrainError> {
        let mut kept = String::new();
        let mut points = Vec::new();
        if let Ok(file) = File::open(path) {
            for line in BufReader::new(file).lines() {
                let line = line.map_err(|e| TrainError::io(path, e))?;
                let Ok(Value::Object(object)) = serde_json::from_str::<Value>(&line) else {
                    break;
                };
                match object.get("step").and_then(Value::as_u64) {
                    Some(step) if step <= through => {
                        points.push(point(&object, groups));
                        kept.push_str(&line);
                        kept.push('\n');
                    }
                    _ => break,
                }
            }
            kiln_io::write_atomic(path, kept.as_bytes())?;
        }
        let file = OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .map_err(|e| TrainError::io(path, e))?;
        Ok(MetricsLog {
            path: path.to_path_buf(),
            file,
            points,
        })
    }

    /// Appends one step's line.
    pub fn append(
        &mut self,
        line: Map<String, Value>,
        groups: &[String],
    ) -> Result<(), TrainError> {
        self.points.push(point(&line, groups));
        let mut text = Value::Object(line).to_string();
        text.push('\n');
        self.file
            .write_all(text.as_bytes())
            .and_then(|()| self.file.flush())
            .map_err(|e| TrainError::io(&self.path, e))
    }

    /// The steps so far.
    pub fn points(&self) -> &[StepPoint] {
        &self.points
    }
}

/// The plot's values of a line: `loss`, `lr_<group>` per group, `eval_<metric>` entries.
fn point(line: &Map<String, Value>, groups: &[String]) -> StepPoint {
    let number = |key: &str| line.get(key).and_then(Value::as_f64).unwrap_or(f64::NAN);
    StepPoint {
        step: line.get("step").and_then(Value::as_u64).unwrap_or(0),
        loss: number("loss"),
        lrs: groups.iter().map(|g| number(&format!("lr_{g}"))).collect(),
        eval: line
            .iter()
            .filter_map(|(k, v)| Some((k.strip_prefix("eval_")?.to_string(), v.as_f64()?)))
            .collect(),
    }
}

/// Every line of the `metrics.jsonl` in a run's directory `out`, in order (for plots and
/// reports of a run, finished or not).
pub fn read_metrics(out: &Path) -> Result<Vec<Value>, TrainError> {
    let path = out.join("metrics.jsonl");
    let text = std::fs::read_to_string(&path).map_err(|e| TrainError::io(&path, e))?;
    text.lines()
        .enumerate()
        .map(|(i, line)| {
            serde_json::from_str(line)
                .map_err(|e| TrainError::Data(format!("{}: line {}: {e}", path.display(), i + 1)))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use std::fs;

    fn line(step: u64, loss: f64) -> Map<String, Value> {
        match json!({"step": step, "loss": loss, "lr_default": 0.1}) {
            Value::Object(m) => m,
            _ => unreachable!(),
        }
    }

    #[test]
    fn reopening_keeps_the_checkpointed_steps_and_drops_a_cut_line() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("metrics.jsonl");
        let groups = vec!["default".to_string()];
        let mut log = MetricsLog::open(&path, 0, &groups).unwrap();
        for step in 1..=5 {
            log.append(line(step, 1.0 / step as f64), &groups).unwrap();
        }
        drop(log);
        // A kill in the middle of writing step 6.
        let mut text = fs::read_to_string(&path).unwrap();
        text.push_str("{\"step\": 6, \"lo");
        fs::write(&path, text).unwrap();
        let log = MetricsLog::open(&path, 3, &groups).unwrap();
        assert_eq!(log.points().len(), 3);
        assert_eq!(log.points()[2].lrs, [0.1]);
        let text = fs::read_to_string(&path).unwrap();
        assert_eq!(text.lines().count(), 3);
        assert!(text.lines().last().unwrap().contains("\"step\":3"));
    }
}
