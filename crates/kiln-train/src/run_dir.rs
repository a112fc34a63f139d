//! `OUT/run.json`: which run a directory holds. A directory that already holds results is a
//! run, not a blank slate: the identical run resumes, a different one is refused with every
//! difference named, and files that no run recorded there are never replaced.

use std::fs;
use std::path::Path;

use serde_json::{Value, json};

use crate::TrainError;
use crate::checkpoint::differences;

/// The record's file name in the run's directory.
pub const RUN_RECORD: &str = "run.json";

/// Claims `out` for the run with `settings` that writes `files` (names in `out`): creates the
/// directory and its `run.json` for a new run; accepts the directory of the identical run;
/// refuses one recorded with other settings that holds any of `files`, and one without a
/// record that already holds any of them. A record whose run wrote none of its files yet (it
/// was refused, or failed, before its first step) is replaced.
pub fn claim(out: &Path, settings: &Value, files: &[String]) -> Result<(), TrainError> {
    let record = out.join(RUN_RECORD);
    let present: Vec<&str> = files
        .iter()
        .filter(|name| fs::symlink_metadata(out.join(name)).is_ok())
        .map(String::as_str)
        .collect();
    let write = || -> Result<(), TrainError> {
        fs::create_dir_all(out).map_err(|e| TrainError::io(out, e))?;
        let text = serde_json::to_string_pretty(&json!({
            "settings": settings,
            "files": files,
        }))
        .expect("JSON");
        kiln_io::write_atomic(&record, text.as_bytes())?;
        Ok(())
    };
    match fs::read_to_string(&record) {
        Ok(text) => {
            let saved: Value = serde_json::from_str(&text).map_err(|e| {
                TrainError::Checkpoint(format!(
                    "{}: not a kiln run record ({e}); move it aside, or choose another output directory",
                    record.display()
                ))
            })?;
            let found = differences(&saved["settings"], settings);
            if found.is_empty() {
                return Ok(());
            }
            if present.is_empty() {
                // The earlier run stopped before writing anything: nothing of it to keep.
                return write();
            }
            Err(TrainError::OtherRun {
                dir: out.to_path_buf(),
                differences: found.join("\n  "),
            })
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            if !present.is_empty() {
                return Err(TrainError::NotARun {
                    dir: out.to_path_buf(),
                    files: present.join(", "),
                });
            }
            write()
        }
        Err(e) => Err(TrainError::io(&record, e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A new directory is claimed; the identical run is accepted; other settings are refused
    /// naming the difference; a directory holding the run's files but no record is refused and
    /// left as it was.
    #[test]
    fn a_directory_holds_one_run() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("run");
        let files = vec!["metrics.jsonl".to_string(), "summary.json".to_string()];
        let settings = json!({"train": {"lr": 0.001}, "data": {"valid": {"structures": 10}}});
        claim(&out, &settings, &files).unwrap();
        claim(&out, &settings, &files).unwrap();
        let other = json!({"train": {"lr": 0.001}, "data": {"valid": {"structures": 4}}});
        // Before the first run wrote anything, another run may take the directory over.
        claim(&out, &other, &files).unwrap();
        claim(&out, &settings, &files).unwrap();
        fs::write(out.join("metrics.jsonl"), "{}").unwrap();
        let err = claim(&out, &other, &files).unwrap_err().to_string();
        assert!(
            err.contains("data.valid.structures: earlier run 10, this run 4"),
            "{err}"
        );
        let users = dir.path().join("users");
        fs::create_dir(&users).unwrap();
        fs::write(users.join("summary.json"), "mine").unwrap();
        let err = claim(&users, &settings, &files).unwrap_err().to_string();
        assert!(err.contains("summary.json"), "{err}");
        assert_eq!(fs::read(users.join("summary.json")).unwrap(), b"mine");
        assert!(!users.join(RUN_RECORD).exists());
    }
}
