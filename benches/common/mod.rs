//! What the criterion benches share: the device they run on.

use kiln::core::DeviceSpec;

/// The device named by `KILN_DEVICE` (e.g. `vulkan`, `cuda:0`), else the first compiled backend.
/// A bad name ends the process with a one-line error.
pub fn device_from_env() -> DeviceSpec {
    match std::env::var("KILN_DEVICE").map(|s| s.parse::<DeviceSpec>()) {
        Ok(Ok(device)) => device,
        Ok(Err(e)) => {
            eprintln!("error: KILN_DEVICE: {e}");
            std::process::exit(2);
        }
        Err(_) => DeviceSpec::default(),
    }
}
