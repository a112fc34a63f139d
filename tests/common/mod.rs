//! What the facade's cross-backend tests share: finding the wgpu device, or saying why not.

use kiln::precision::{DeviceError, DeviceSpec};

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
