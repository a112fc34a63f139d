//! Project automation: `cargo xtask <task>`.
//!
//! - `ci`: everything `.ci/run` checks — formatting, clippy, the README's test command, and a
//!   `cargo check` of each GPU backend on its own.
//! - `test`: the README's test command.
//! - `check-backends`: `cargo check` with each backend feature alone.
//! - `bench [ARGS]`: kiln's benchmark suite in release mode (`kiln-bench`), e.g.
//!   `cargo xtask bench --save main`, `cargo xtask bench --compare main --device cuda`. The backend
//!   feature the `--device` needs is enabled automatically.
//! - `fixtures`: regenerates the committed reference fixtures with the Python of
//!   `$KILN_HF_PYTHON` (default `python3`), which needs `scripts/fixtures/requirements-hf.txt`.
//!   Tests never run Python; they read what this wrote.

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

/// The cargo feature that compiles in the backend of a device string.
fn backend_feature(device: &str) -> Option<&'static str> {
    match device.to_ascii_lowercase().as_str() {
        "wgpu" | "gpu" | "vulkan" | "metal" => Some("wgpu"),
        "ndarray" => Some("ndarray"),
        d if d == "cuda" || d.starts_with("cuda:") => Some("cuda"),
        _ => None,
    }
}

/// Runs the `kiln-bench` binary in release mode with `args`, with the backend `--device` needs.
fn bench(args: &[String]) -> Result<(), String> {
    let device = args
        .iter()
        .enumerate()
        .find_map(|(i, arg)| match arg.strip_prefix("--device") {
            Some("") => args.get(i + 1).map(String::as_str),
            Some(rest) => rest.strip_prefix('='),
            None => None,
        });
    let mut cargo_args = vec!["run", "--release", "--bin", "kiln-bench"];
    if let Some(feature) = device.and_then(backend_feature) {
        cargo_args.extend(["--features", feature]);
    }
    cargo_args.push("--");
    cargo_args.extend(args.iter().map(String::as_str));
    cargo(&cargo_args)
}

/// The fixture scripts and the directories they write, relative to the workspace root.
const FIXTURES: &[(&str, &str)] = &[(
    "scripts/fixtures/processors.py",
    "crates/kiln-cache/tests/fixtures/processors",
)];

/// Runs every fixture script with the Hugging Face reference environment.
fn fixtures() -> Result<(), String> {
    let python = std::env::var("KILN_HF_PYTHON").unwrap_or_else(|_| "python3".into());
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .ok_or("xtask is not inside the workspace")?;
    FIXTURES.iter().try_for_each(|(script, out)| {
        println!("--- {python} {script} {out}");
        let status = Command::new(&python)
            .current_dir(root)
            .args([script, out])
            .status()
            .map_err(|e| format!("cannot run `{python}` (set KILN_HF_PYTHON): {e}"))?;
        if status.success() {
            Ok(())
        } else {
            Err(format!(
                "`{python} {script}` failed ({status}); its packages: scripts/fixtures/requirements-hf.txt"
            ))
        }
    })
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let task = args.first().map_or("", String::as_str);
    let result = match task {
        "ci" => ci(),
        "test" => cargo(TEST),
        "check-backends" => check_backends(),
        "bench" => bench(&args[1..]),
        "fixtures" => fixtures(),
        _ => Err(format!(
            "unknown task `{task}`: expected one of ci, test, check-backends, bench, fixtures"
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
    use super::*;

    /// The README promises a test command; CI runs this one. They must not drift apart.
    #[test]
    fn readme_test_command_is_the_one_ci_runs() {
        let readme = include_str!("../../README.md");
        let command = format!("cargo {}", TEST.join(" "));
        assert!(
            readme.contains(&command),
            "README.md does not show `{command}`"
        );
    }

    #[test]
    fn devices_pick_their_backend_feature() {
        assert_eq!(backend_feature("cpu"), None);
        assert_eq!(backend_feature("Vulkan"), Some("wgpu"));
        assert_eq!(backend_feature("cuda:1"), Some("cuda"));
        assert_eq!(backend_feature("ndarray"), Some("ndarray"));
    }
}
