//! Project automation: `cargo xtask <task>`.
//!
//! - `ci`: everything `.ci/run` checks — formatting, clippy, the README's test command, and a
//!   `cargo check` of each GPU backend on its own.
//! - `test`: the README's test command.
//! - `check-backends`: `cargo check` with each backend feature alone.

use std::process::{Command, ExitCode};

/// The README's test command, without the leading `cargo`.
const TEST: &[&str] = &["test", "--workspace", "--all-features"];

/// Each backend feature on its own, so a `cfg` slip in one of them cannot hide behind another.
const BACKEND_CHECKS: &[&str] = &["wgpu", "cuda", "ndarray"];

fn cargo(args: &[&str]) -> Result<(), String> {
    println!("--- cargo {}", args.join(" "));
    let status = Command::new(env!("CARGO"))
        .args(args)
        .status()
        .map_err(|e| format!("cannot run cargo: {e}"))?;
    if status.success() {
        Ok(())
    } else {
        Err(format!("`cargo {}` failed ({status})", args.join(" ")))
    }
}

fn check_backends() -> Result<(), String> {
    BACKEND_CHECKS.iter().try_for_each(|feature| {
        cargo(&[
            "check",
            "--workspace",
            "--no-default-features",
            "--features",
            feature,
        ])
    })
}

fn ci() -> Result<(), String> {
    cargo(&["fmt", "--all", "--check"])?;
    cargo(&[
        "clippy",
        "--workspace",
        "--all-targets",
        "--all-features",
        "--",
        "-D",
        "warnings",
    ])?;
    cargo(TEST)?;
    check_backends()
}

fn main() -> ExitCode {
    let task = std::env::args().nth(1).unwrap_or_default();
    let result = match task.as_str() {
        "ci" => ci(),
        "test" => cargo(TEST),
        "check-backends" => check_backends(),
        _ => Err(format!(
            "unknown task `{task}`: expected one of ci, test, check-backends"
        )),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("xtask: {e}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    /// The README promises a test command; CI runs this one. They must not drift apart.
    #[test]
    fn readme_test_command_is_the_one_ci_runs() {
        let readme = include_str!("../../README.md");
        let command = format!("cargo {}", super::TEST.join(" "));
        assert!(
            readme.contains(&command),
            "README.md does not show `{command}`"
        );
    }
}
