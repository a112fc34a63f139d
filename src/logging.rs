//! Where kiln's warnings go. The libraries report through the `log` crate (a skipped image, a
//! checkpoint's unused tensors, a cache entry rebuilt) and leave the choice of logger to the
//! program; [`log_to_stderr`] is the minimal one kiln's examples use.

use log::{Level, LevelFilter, Log, Metadata, Record};

/// Sends kiln's log records to stderr, `warning: …` / `error: …` (and `info` / `debug` lines
/// when `KILN_LOG` says so: `KILN_LOG=info`). Does nothing when the program set a logger already.
///
/// ```
/// kiln::log_to_stderr();
/// log::warn!("shown on stderr");
/// ```
pub fn log_to_stderr() {
    let level = match std::env::var("KILN_LOG").as_deref() {
        Ok("debug") => LevelFilter::Debug,
        Ok("info") => LevelFilter::Info,
        Ok("error") => LevelFilter::Error,
        Ok("off") => LevelFilter::Off,
        _ => LevelFilter::Warn,
    };
    if log::set_logger(&STDERR).is_ok() {
        log::set_max_level(level);
    }
}

struct Stderr;

static STDERR: Stderr = Stderr;

impl Log for Stderr {
    fn enabled(&self, metadata: &Metadata) -> bool {
        metadata.level() <= log::max_level()
    }

    fn log(&self, record: &Record) {
        if self.enabled(record.metadata()) {
            let label = match record.level() {
                Level::Error => "error",
                Level::Warn => "warning",
                Level::Info => "info",
                Level::Debug | Level::Trace => "debug",
            };
            eprintln!("{label}: {}", record.args());
        }
    }

    fn flush(&self) {}
}

/// A command-line program's ending: `result`'s error printed as `error: …` on stderr and a
/// failure status, or success.
///
/// ```
/// let status = kiln::exit_status(Err::<(), _>("--batch must be at least 1"));
/// assert_eq!(status, std::process::ExitCode::FAILURE);
/// ```
pub fn exit_status<E: std::fmt::Display>(result: Result<(), E>) -> std::process::ExitCode {
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}

/// What an example's `main` does once its flags are parsed: logs to stderr
/// ([`log_to_stderr`]), runs `job` on `device`, and ends as [`exit_status`] says (the device's
/// error or the job's printed once).
///
/// ```no_run
/// use kiln::core::{DeviceJob, DeviceSpec};
/// use kiln::burn::tensor::backend::Backend;
///
/// struct Hello;
/// impl DeviceJob for Hello {
///     type Output = Result<(), String>;
///     fn run<B: Backend>(self, _device: &B::Device) -> Self::Output {
///         println!("hello from {}", B::name(&Default::default()));
///         Ok(())
///     }
/// }
///
/// fn main() -> std::process::ExitCode {
///     kiln::run_job(DeviceSpec::Flex, Hello)
/// }
/// ```
pub fn run_job<J, E>(device: kiln_core::DeviceSpec, job: J) -> std::process::ExitCode
where
    J: kiln_core::DeviceJob<Output = Result<(), E>>,
    E: std::fmt::Display,
{
    log_to_stderr();
    let result = match device.run(job) {
        Ok(done) => done.map_err(|e| e.to_string()),
        Err(e) => Err(e.to_string()),
    };
    exit_status(result)
}
