//! Project automation: `cargo xtask <task>`.
//!
//! - `ci`: everything `.ci/run` checks — formatting, clippy, a `cargo check` of each GPU backend
//!   on its own, and the README's test command (check-only artifacts pruned before it, so a cold
//!   run needs the disk of one build at a time).
//! - `test`: the README's test command: the Rust tests (`cargo test --workspace
//!   --all-features`), then the Python package `crates/kiln-python` installed into a fresh
//!   virtual environment (`target/python-tests`, with `$KILN_PYTHON` or `python3`) by pip, as
//!   its README section says users install it, and its pytest tests run there.
//! - `check-backends`: `cargo check` of kiln-core and kiln-kernels (where the backend `cfg`s
//!   are) with each backend feature alone.
//! - `bench [ARGS]`: kiln's benchmark suite in release mode (`kiln-bench`), e.g.
//!   `cargo xtask bench --save main`, `cargo xtask bench --compare main --device cuda`. The backend
//!   feature the `--device` needs is enabled automatically.
//! - `fixtures [NAME]`: regenerates the committed reference fixtures (those whose script path
//!   contains NAME). The Hugging Face ones run with `$KILN_HF_PYTHON`
//!   (`scripts/fixtures/requirements-hf.txt`), the video one with `$KILN_VIDEO_PYTHON`
//!   (`scripts/fixtures/requirements-video.txt`), the schnetpack one with
//!   `$KILN_SCHNETPACK_PYTHON` (`scripts/fixtures/requirements-schnetpack.txt`, a virtual
//!   environment of its own: schnetpack pins an older torch), fVLM's with `$KILN_FVLM_PYTHON`
//!   (`scripts/fixtures/requirements-fvlm.txt`: transformers 4) and `$KILN_FVLM_DIR` (a checkout's
//!   `fVLM/` folder, imported from there), llama.cpp's with `$KILN_LLAMA_PYTHON`
//!   (`scripts/fixtures/requirements-llama.txt`, built from source for the CPU); default
//!   `python3`. Tests never run Python;
//!   they read what this wrote.

use std::process::{Command, ExitCode};

/// The README's test command.
const README_TEST: &str = "cargo xtask test";

/// The Rust half of the README's test command, without the leading `cargo`.
const RUST_TEST: &[&str] = &["test", "--workspace", "--all-features"];

/// The Python package, relative to the workspace root.
const PYTHON_PACKAGE: &str = "crates/kiln-python";

/// Each backend feature on its own, so a `cfg` slip in one of them cannot hide behind another:
/// (crate, feature). Backend `cfg`s live in kiln-core (device selection) and kiln-kernels
/// (kiln's cubecl kernels; its GPU features turn on kiln-core's); the other crates only forward
/// the features, and the all-features clippy and test runs cover their code. Checking these two
/// crates keeps a cold CI run from re-checking every other dependency three more times.
const BACKEND_CHECKS: &[(&str, &str)] = &[
    ("kiln-kernels", "wgpu"),
    ("kiln-kernels", "cuda"),
    ("kiln-core", "ndarray"),
];

fn cargo(args: &[&str]) -> Result<(), String> {
    run(std::path::Path::new(env!("CARGO")), args)
}

fn check_backends() -> Result<(), String> {
    BACKEND_CHECKS.iter().try_for_each(|(package, feature)| {
        cargo(&[
            "check",
            "-p",
            package,
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
    check_backends()?;
    prune_check_metadata()?;
    test()
}

/// The README's test command: the Rust tests, then the Python package's.
fn test() -> Result<(), String> {
    println!("--- {README_TEST}: the Rust tests, then the Python package's");
    cargo(RUST_TEST)?;
    python_tests()
}

fn workspace_root() -> Result<&'static std::path::Path, String> {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .ok_or_else(|| "xtask is not inside the workspace".into())
}

/// Runs `program args` in the workspace root, printing it and its time.
fn run(program: &std::path::Path, args: &[&str]) -> Result<(), String> {
    let shown = format!("{} {}", program.display(), args.join(" "));
    println!("--- {shown}");
    let start = std::time::Instant::now();
    let status = Command::new(program)
        .current_dir(workspace_root()?)
        .args(args)
        .status()
        .map_err(|e| format!("cannot run `{shown}`: {e}"))?;
    println!("--- {:.0} s", start.elapsed().as_secs_f64());
    if status.success() {
        Ok(())
    } else {
        Err(format!("`{shown}` failed ({status})"))
    }
}

/// Installs the Python package into a fresh virtual environment with pip (maturin builds the
/// wheel, release mode, default features) and runs its pytest tests there.
fn python_tests() -> Result<(), String> {
    let root = workspace_root()?;
    let venv = root.join("target/python-tests");
    if venv.exists() {
        std::fs::remove_dir_all(&venv).map_err(|e| format!("{}: {e}", venv.display()))?;
    }
    let python = std::env::var_os("KILN_PYTHON").unwrap_or_else(|| "python3".into());
    let venv_arg = venv.to_str().ok_or("the workspace path is not UTF-8")?;
    run(std::path::Path::new(&python), &["-m", "venv", venv_arg])?;
    let bin = venv.join("bin");
    let package = format!("./{PYTHON_PACKAGE}[test]");
    run(&bin.join("pip"), &["install", "--quiet", &package])?;
    let tests = format!("{PYTHON_PACKAGE}/tests");
    run(&bin.join("python"), &["-m", "pytest", "-q", &tests])
}

/// Deletes what only `cargo check` and `cargo clippy` use (`.rmeta` files without a compiled
/// library beside them) before the test build: a cold CI run then needs the test build's disk
/// space, not both at once. A later check rebuilds what it misses.
fn prune_check_metadata() -> Result<(), String> {
    let deps = workspace_root()?.join("target/debug/deps");
    let Ok(entries) = std::fs::read_dir(&deps) else {
        return Ok(());
    };
    let mut freed = 0u64;
    for entry in entries.flatten() {
        let path = entry.path();
        if path.extension().is_none_or(|e| e != "rmeta") {
            continue;
        }
        let compiled = ["rlib", "so", "dylib", "dll"]
            .iter()
            .any(|ext| path.with_extension(ext).exists());
        if !compiled {
            freed += entry.metadata().map_or(0, |m| m.len());
            std::fs::remove_file(&path).map_err(|e| format!("{}: {e}", path.display()))?;
        }
    }
    println!("--- pruned {:.0} MB of check metadata", freed as f64 / 1e6);
    Ok(())
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

/// A fixture script, the directory it writes (both relative to the workspace root), the
/// variable naming its Python, and that Python's pinned packages.
struct Fixture {
    script: &'static str,
    out: &'static str,
    python: &'static str,
    requirements: &'static str,
}

const FIXTURES: &[Fixture] = &[
    Fixture {
        script: "scripts/fixtures/processors.py",
        out: "crates/kiln-cache/tests/fixtures/processors",
        python: "KILN_HF_PYTHON",
        requirements: "scripts/fixtures/requirements-hf.txt",
    },
    Fixture {
        script: "scripts/fixtures/resample.py",
        out: "crates/kiln-cache/tests/fixtures/resample",
        python: "KILN_HF_PYTHON",
        requirements: "scripts/fixtures/requirements-hf.txt",
    },
    Fixture {
        script: "scripts/fixtures/jpeg.py",
        out: "crates/kiln-cache/tests/fixtures/jpeg",
        python: "KILN_HF_PYTHON",
        requirements: "scripts/fixtures/requirements-hf.txt",
    },
    Fixture {
        script: "scripts/fixtures/video.py",
        out: "crates/kiln-cache/tests/fixtures/video",
        python: "KILN_VIDEO_PYTHON",
        requirements: "scripts/fixtures/requirements-video.txt",
    },
    Fixture {
        script: "scripts/fixtures/vision.py",
        out: "crates/kiln-vision/tests/fixtures",
        python: "KILN_HF_PYTHON",
        requirements: "scripts/fixtures/requirements-hf.txt",
    },
    Fixture {
        script: "scripts/fixtures/text.py",
        out: "crates/kiln-text/tests/fixtures",
        python: "KILN_HF_PYTHON",
        requirements: "scripts/fixtures/requirements-hf.txt",
    },
    Fixture {
        script: "scripts/fixtures/gguf_quants.py",
        out: "crates/kiln-core/tests/fixtures/gguf",
        python: "KILN_HF_PYTHON",
        requirements: "scripts/fixtures/requirements-hf.txt",
    },
    // After text.py: it reads that script's tokenizer.
    Fixture {
        script: "scripts/fixtures/gguf_text.py",
        out: "crates/kiln-text/tests/fixtures/gguf",
        python: "KILN_HF_PYTHON",
        requirements: "scripts/fixtures/requirements-hf.txt",
    },
    // After gguf_text.py: it reads that script's files.
    Fixture {
        script: "scripts/fixtures/gguf_llama_cpp.py",
        out: "crates/kiln-text/tests/fixtures/gguf",
        python: "KILN_LLAMA_PYTHON",
        requirements: "scripts/fixtures/requirements-llama.txt",
    },
    Fixture {
        script: "scripts/fixtures/foveated.py",
        out: "crates/kiln-foveated/tests/fixtures",
        python: "KILN_HF_PYTHON",
        requirements: "scripts/fixtures/requirements-hf.txt",
    },
    Fixture {
        script: "scripts/fixtures/fvlm_release.py",
        out: "crates/kiln-foveated/tests/fixtures/release",
        python: "KILN_FVLM_PYTHON",
        requirements: "scripts/fixtures/requirements-fvlm.txt",
    },
    Fixture {
        script: "scripts/fixtures/latentwire_modules.py",
        out: "crates/kiln-latentwire/tests/fixtures",
        python: "KILN_HF_PYTHON",
        requirements: "scripts/fixtures/requirements-hf.txt",
    },
    Fixture {
        script: "scripts/fixtures/realtime.py",
        out: "crates/kiln-realtime/tests/fixtures",
        python: "KILN_HF_PYTHON",
        requirements: "scripts/fixtures/requirements-hf.txt",
    },
    Fixture {
        script: "scripts/fixtures/painn.py",
        out: "crates/kiln-forcefield/tests/fixtures",
        python: "KILN_SCHNETPACK_PYTHON",
        requirements: "scripts/fixtures/requirements-schnetpack.txt",
    },
    Fixture {
        script: "scripts/fixtures/painn_gradients.py",
        out: "crates/kiln-forcefield/tests/fixtures",
        python: "KILN_SCHNETPACK_PYTHON",
        requirements: "scripts/fixtures/requirements-schnetpack.txt",
    },
    Fixture {
        script: "scripts/fixtures/train.py",
        out: "crates/kiln-train/tests/fixtures",
        python: "KILN_HF_PYTHON",
        requirements: "scripts/fixtures/requirements-hf.txt",
    },
];

/// Runs the fixture scripts whose path contains `filter` (all without one), each with the Python
/// its variable names (default `python3`).
fn fixtures(filter: Option<&str>) -> Result<(), String> {
    let root = workspace_root()?;
    let chosen = FIXTURES
        .iter()
        .filter(|f| filter.is_none_or(|name| f.script.contains(name)));
    chosen.into_iter().try_for_each(|fixture| {
        let python = std::env::var(fixture.python).unwrap_or_else(|_| "python3".into());
        println!("--- {python} {} {}", fixture.script, fixture.out);
        let status = Command::new(&python)
            .current_dir(root)
            .args([fixture.script, fixture.out])
            .status()
            .map_err(|e| format!("cannot run `{python}` (set {}): {e}", fixture.python))?;
        if status.success() {
            Ok(())
        } else {
            Err(format!(
                "`{python} {}` failed ({status}); set {} to a Python with {}",
                fixture.script, fixture.python, fixture.requirements
            ))
        }
    })
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let task = args.first().map_or("", String::as_str);
    let result = match task {
        "ci" => ci(),
        "test" => test(),
        "check-backends" => check_backends(),
        "bench" => bench(&args[1..]),
        "fixtures" => fixtures(args.get(1).map(String::as_str)),
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
        assert!(
            readme.contains(&format!("```sh\n{README_TEST}\n```")),
            "README.md does not show `{README_TEST}`"
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
