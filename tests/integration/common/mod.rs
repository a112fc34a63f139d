//! What the facade's tests share: finding the wgpu device (or saying why not), and reading
//! tensors from safetensors files.

pub mod labelled;

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use kiln::core::{DeviceError, DeviceSpec};

/// kiln-vision's committed tiny checkpoints and images.
pub fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("crates/kiln-vision/tests/fixtures")
}

/// kiln-forcefield's committed schnetpack models, structures and reference outputs.
pub fn forcefield_fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("crates/kiln-forcefield/tests/fixtures")
}

/// The example `name` run with `--out out` and `args`.
pub fn run_example(name: &str, out: &Path, args: &[&str]) -> Output {
    Command::new(example(name))
        .arg("--out")
        .arg(out)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("the {name} example is built with the tests: {e}"))
}

/// The `summary.json` an example wrote in `out`.
pub fn summary(out: &Path) -> serde_json::Value {
    serde_json::from_slice(&fs::read(out.join("summary.json")).unwrap()).unwrap()
}

/// `output` of an example run with `args`, once checked to have succeeded (its stderr says why
/// not).
pub fn succeeded(output: Output, args: &[&str]) -> Output {
    assert!(
        output.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    output
}

/// The stderr of an example run with `args`, once checked to have failed.
pub fn failed(output: Output, args: &[&str]) -> String {
    assert!(!output.status.success(), "{args:?} was accepted");
    String::from_utf8_lossy(&output.stderr).into_owned()
}

/// The example binary `name`, which `cargo test` builds beside the tests:
/// target/<profile>/examples/<name>, next to target/<profile>/deps/<this test>.
pub fn example(name: &str) -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let profile = exe.parent().and_then(Path::parent).unwrap();
    profile
        .join("examples")
        .join(format!("{name}{}", std::env::consts::EXE_SUFFIX))
}

/// `(values, shape)` of the f32 tensor `key` of the safetensors file `file`.
pub fn read_f32(file: &Path, key: &str) -> (Vec<f32>, Vec<usize>) {
    let bytes = std::fs::read(file).unwrap();
    let tensors = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let view = tensors.tensor(key).unwrap();
    let values = view
        .data()
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect();
    (values, view.shape().to_vec())
}

/// The values of the f64 tensor `key` of the safetensors file `file`.
pub fn read_f64(file: &Path, key: &str) -> Vec<f64> {
    let bytes = std::fs::read(file).unwrap();
    let tensors = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    tensors
        .tensor(key)
        .unwrap()
        .data()
        .chunks_exact(8)
        .map(|b| f64::from_le_bytes(b.try_into().unwrap()))
        .collect()
}

/// max |a − b|.
pub fn max_abs_diff(a: &[f64], b: &[f64]) -> f64 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f64::max)
}

/// max |a − b| / max |b|.
pub fn relative(a: &[f64], b: &[f64]) -> f64 {
    max_abs_diff(a, b) / b.iter().fold(0.0, |m: f64, v| m.max(v.abs()))
}

/// [`relative`] of f32 values.
pub fn relative_f32(a: &[f32], b: &[f32]) -> f64 {
    let wide = |x: &[f32]| x.iter().map(|&v| f64::from(v)).collect::<Vec<_>>();
    relative(&wide(a), &wide(b))
}

/// Writes to the terminal past libtest's output capture, so a skipped check is seen even when
/// the test passes.
pub fn say(line: &str) {
    use std::io::Write;
    let _ = writeln!(std::io::stderr(), "{line}");
}

/// The Vulkan device, or `None` (said on stderr) where there is no adapter. With
/// `KILN_REQUIRE_WGPU` set (CI), a missing adapter fails the test instead.
pub fn vulkan(test: &str) -> Option<DeviceSpec> {
    present("vulkan", test, "KILN_REQUIRE_WGPU")
}

/// The first CUDA GPU, or `None` (said on stderr) where there is none. With `KILN_REQUIRE_CUDA`
/// set (a GPU machine's test run), a missing GPU fails the test instead.
pub fn cuda(test: &str) -> Option<DeviceSpec> {
    present("cuda:0", test, "KILN_REQUIRE_CUDA")
}

/// How many times an f32 tolerance widens on `device`: 100 on CUDA, where burn 0.21's matrix
/// products of f32 tensors run on TF32 tensor cores (10-bit mantissa, cubek-matmul's
/// `adjust_dtypes`; PyTorch's `allow_tf32`), else 1. Measured on an H100 (docs/PERFORMANCE.md):
/// CLIP embeddings 8.1e-4 relative, Monte-Carlo means 7.5e-4, PaiNN energies 2.7e-3 eV.
pub fn tf32_slack(device: DeviceSpec) -> f64 {
    if matches!(device, DeviceSpec::Cuda(_)) {
        100.0
    } else {
        1.0
    }
}

/// `device` if this machine has it; else `None` and a `SKIPPED` line, or a failure where the
/// environment variable `require` is set.
fn present(device: &str, test: &str, require: &str) -> Option<DeviceSpec> {
    let device: DeviceSpec = device.parse().unwrap();
    match device.report() {
        Ok(report) => {
            say(&format!("{test} runs on: {}", report.hardware.name));
            Some(device)
        }
        Err(e @ DeviceError::Unavailable { .. }) => {
            assert!(
                std::env::var_os(require).is_none(),
                "{require} is set but {e}"
            );
            say(&format!("SKIPPED {test}: {e}"));
            None
        }
        Err(e) => panic!("{e}"),
    }
}

/// One test per backend, each `check(device)` of the invoking file: `cpu` (Flex), `ndarray`,
/// `wgpu` and `cuda` (each where compiled in; wgpu and CUDA where this machine has them, else a
/// `SKIPPED` line). `backend_tests!("vision parity test"; cpu, ndarray, wgpu, cuda)`.
macro_rules! backend_tests {
    ($what:literal; $($backend:ident),+) => { $(backend_tests!(@one $what, $backend);)+ };
    (@one $what:literal, cpu) => {
        #[test]
        fn cpu() {
            check(DeviceSpec::Flex);
        }
    };
    (@one $what:literal, ndarray) => {
        #[cfg(feature = "ndarray")]
        #[test]
        fn ndarray() {
            check(DeviceSpec::NdArray);
        }
    };
    (@one $what:literal, wgpu) => {
        #[cfg(feature = "wgpu")]
        #[test]
        fn wgpu() {
            if let Some(device) = common::vulkan(concat!("wgpu ", $what)) {
                check(device);
            }
        }
    };
    (@one $what:literal, cuda) => {
        #[cfg(feature = "cuda")]
        #[test]
        fn cuda() {
            if let Some(device) = common::cuda(concat!("cuda ", $what)) {
                check(device);
            }
        }
    };
}

/// Every file under `dir` with its bytes.
pub fn snapshot(dir: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    let mut files = Vec::new();
    for entry in fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            files.extend(snapshot(&path));
        } else {
            files.push((path.clone(), fs::read(&path).unwrap()));
        }
    }
    files.sort();
    files
}
