//! Prints the capability report of every compiled backend, or of the one asked for, and what a
//! precision policy resolves to there.
//!
//! ```text
//! cargo run --release --example devices
//! cargo run --release --features wgpu --example devices -- --device vulkan --policy mixed-bf16
//! ```

use std::process::ExitCode;

use burn::tensor::backend::Backend;
use clap::Parser;
use kiln::burn;
use kiln::core::{DeviceJob, DeviceSpec, Policy, PolicySpec, PrecisionError};

/// Show what each device can do: backend, hardware, memory, float dtypes.
#[derive(Parser)]
struct Args {
    /// Report only this device (cpu, ndarray, wgpu, vulkan, metal, cuda, cuda:N).
    #[arg(long)]
    device: Option<DeviceSpec>,
    /// Precision policy to resolve on each device: a preset (full, mixed-f16, mixed-bf16,
    /// pure-f16), a dtype, or `params=..,compute=..,output=..`.
    #[arg(long, default_value = "half")]
    policy: PolicySpec,
}

/// Resolves a policy on the device it runs on.
struct Resolve(PolicySpec);

impl DeviceJob for Resolve {
    type Output = Result<Policy, PrecisionError>;
    fn run<B: Backend>(self, device: &B::Device) -> Self::Output {
        self.0.resolve::<B>(device)
    }
}

/// Prints one device's report and the policy resolved on it.
fn show(device: DeviceSpec, policy: PolicySpec) -> Result<(), String> {
    let report = device.report().map_err(|e| e.to_string())?;
    print!("{report}");
    match device.run(Resolve(policy)).map_err(|e| e.to_string())? {
        Ok(resolved) => println!("  policy   {policy} = {resolved}"),
        Err(e) => println!("  policy   {policy}: {e}"),
    }
    Ok(())
}

fn main() -> ExitCode {
    let args = Args::parse();
    match args.device {
        Some(device) => match show(device, args.policy) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("error: {e}");
                ExitCode::FAILURE
            }
        },
        None => {
            for device in DeviceSpec::compiled() {
                if let Err(e) = show(device, args.policy) {
                    println!("{device}: {e}");
                }
                println!();
            }
            ExitCode::SUCCESS
        }
    }
}
