//! What the facade's tests share: finding the wgpu device (or saying why not), and reading f32
//! tensors from safetensors files.

#![allow(dead_code)] // each test binary uses its own subset

use std::path::{Path, PathBuf};

use kiln::precision::{DeviceError, DeviceSpec};

/// kiln-vision's committed tiny checkpoints and images.
pub fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("crates/kiln-vision/tests/fixtures")
}

/// kiln-forcefield's committed schnetpack models, structures and reference outputs.
pub fn forcefield_fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("crates/kiln-forcefield/tests/fixtures")
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

/// max |a − b| / max |b|.
pub fn relative(a: &[f64], b: &[f64]) -> f64 {
    assert_eq!(a.len(), b.len());
    let worst = a
        .iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f64::max);
    worst / b.iter().fold(0.0, |m: f64, v| m.max(v.abs()))
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
    let device: DeviceSpec = "vulkan".parse().unwrap();
    match device.report() {
        Ok(report) => {
            say(&format!("{test} runs on: {}", report.hardware.name));
            Some(device)
        }
        Err(e @ DeviceError::Unavailable { .. }) => {
            assert!(
                std::env::var_os("KILN_REQUIRE_WGPU").is_none(),
                "KILN_REQUIRE_WGPU is set but {e}"
            );
            say(&format!(
                "SKIPPED {test}: no Vulkan adapter on this machine ({e})"
            ));
            None
        }
        Err(e) => panic!("{e}"),
    }
}
