//! The baseline's saved build and this build, run side by side as two processes that take their
//! samples in turns (see [`conduct`]).

use std::ffi::OsString;
use std::io::BufReader;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};

use crate::BenchError;
use crate::bench::Config;
use crate::lockstep::{Paced, Pairs, conduct};
use crate::report::SuiteRun;

/// What two builds measured in turns produced.
pub struct InTurns {
    /// The baseline build's run.
    pub old: SuiteRun,
    /// This build's run.
    pub new: SuiteRun,
    /// Their turns.
    pub pairs: Pairs,
    /// Whether this build's run passed its own checks (batch scaling), and if not what it
    /// printed last.
    pub new_passed: Result<(), String>,
}

/// Lines of a failed build's output shown with its error.
const SHOWN_LINES: usize = 12;

/// One build as a child process: its conversation, where its results and messages go.
struct Build {
    label: &'static str,
    path: PathBuf,
    child: Child,
    paced: Paced<BufReader<ChildStdout>, ChildStdin>,
    results: PathBuf,
    log: PathBuf,
}

impl Build {
    /// Starts the build at `path` (called `label`, its files tagged `tag`) with `args`.
    fn start(
        label: &'static str,
        tag: &str,
        path: &Path,
        args: &[OsString],
    ) -> Result<Build, BenchError> {
        let name = |what: &str| {
            std::env::temp_dir().join(format!("kiln-bench-{}-{tag}.{what}", std::process::id()))
        };
        let (results, log) = (name("json"), name("log"));
        let failed = |status: String| BenchError::BuildFailed {
            build: label,
            path: path.to_path_buf(),
            status,
            said: String::new(),
        };
        let log_file = std::fs::File::create(&log).map_err(|e| failed(kiln_io::said(&e)))?;
        let mut child = Command::new(path)
            .args(args)
            .arg("--lockstep")
            .arg("--emit-run")
            .arg(&results)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(log_file)
            .spawn()
            .map_err(|e| failed(format!("cannot start it: {}", kiln_io::said(&e))))?;
        let (Some(stdin), Some(stdout)) = (child.stdin.take(), child.stdout.take()) else {
            return Err(failed("it has no standard input or output".into()));
        };
        Ok(Build {
            label,
            path: path.to_path_buf(),
            child,
            paced: Paced::new(label, BufReader::new(stdout), stdin),
            results,
            log,
        })
    }

    /// Waits for the build to end; its run, and whether it passed its checks (if not, the end
    /// of what it printed).
    fn finish(mut self) -> Result<(SuiteRun, Result<(), String>), BenchError> {
        drop(self.paced);
        let status = self.child.wait();
        let run = std::fs::read_to_string(&self.results)
            .ok()
            .and_then(|text| serde_json::from_str::<SuiteRun>(&text).ok());
        let said = Build::tail(&self.log);
        let _ = std::fs::remove_file(&self.results);
        let _ = std::fs::remove_file(&self.log);
        match (run, status) {
            (Some(run), Ok(status)) => Ok((run, if status.success() { Ok(()) } else { Err(said) })),
            (_, status) => Err(BenchError::BuildFailed {
                build: self.label,
                path: self.path,
                status: status.map_or_else(|e| kiln_io::said(&e), |s| s.to_string()),
                said,
            }),
        }
    }

    /// The last lines of what the build printed to `log`, after a colon and a new line.
    fn tail(log: &Path) -> String {
        let text = std::fs::read_to_string(log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        let tail = &lines[lines.len().saturating_sub(SHOWN_LINES)..];
        if tail.is_empty() {
            String::new()
        } else {
            format!(":\n{}", tail.join("\n"))
        }
    }

    /// Stops the build and removes its files; what it printed last.
    fn stop(mut self) -> String {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let said = Build::tail(&self.log);
        let _ = std::fs::remove_file(&self.results);
        let _ = std::fs::remove_file(&self.log);
        said
    }

    /// Stops the build after a failed conversation; `error` with what it printed.
    fn abandon(self, error: BenchError) -> BenchError {
        let label = self.label;
        let said = self.stop();
        match error {
            BenchError::Conversation(what) if !said.is_empty() => {
                BenchError::Conversation(format!("{what}; {label} printed{said}"))
            }
            other => other,
        }
    }
}

/// Runs the baseline's saved build `saved` and this executable with `args`, taking their
/// samples in turns: at least `pairs` turns a benchmark, each side measured as `config` asks.
/// The baseline's build starts first and this one once it is ready for its first benchmark, so
/// that their calibrations do not overlap.
pub fn in_turns(
    saved: &Path,
    args: &[OsString],
    config: &Config,
    pairs: usize,
) -> Result<InTurns, BenchError> {
    let this = std::env::current_exe().map_err(|e| BenchError::BuildFailed {
        build: "this build",
        path: PathBuf::new(),
        status: format!("cannot find its executable: {}", kiln_io::said(&e)),
        said: String::new(),
    })?;
    eprintln!("taking the baseline's saved build and this build in turns");
    let mut old = Build::start("the baseline's saved build", "baseline", saved, args)?;
    if let Err(e) = old.paced.wait_until_ready() {
        return Err(old.abandon(e));
    }
    let mut new = match Build::start("this build", "new", &this, args) {
        Ok(new) => new,
        Err(e) => {
            old.stop();
            return Err(e);
        }
    };
    match conduct(&mut old.paced, &mut new.paced, config, pairs) {
        Ok(pairs) => {
            let (old_run, _) = old.finish()?;
            let (new_run, new_passed) = new.finish()?;
            Ok(InTurns {
                old: old_run,
                new: new_run,
                pairs,
                new_passed,
            })
        }
        Err(e) => {
            let e = old.abandon(e);
            Err(new.abandon(e))
        }
    }
}
