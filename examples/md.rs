//! Constant-energy (NVE) molecular dynamics of one structure with a PaiNN potential: velocity
//! Verlet from Maxwell–Boltzmann velocities, the trajectory written as extxyz while it runs, and
//! the energy drift at the end.
//!
//! ```text
//! cargo run --release --example md -- --model painn/ --input molecule.extxyz \
//!     --trajectory md.extxyz [--frame 0] [--timestep 0.5] [--steps 1000] [--temperature 300] \
//!     [--seed 0] [--every 10] [--skin 1.0] [--device cpu]
//! ```
//!
//! Every reported frame carries `energy` (potential), `kinetic`, `total` and `temperature` in its
//! info and `forces` and `velocities` (Å/fs) as per-atom arrays.

use std::io::{BufWriter, Write};
use std::path::PathBuf;
use std::process::ExitCode;

use burn::backend::Autodiff;
use burn::tensor::backend::Backend;
use clap::Parser;
use indicatif::{ProgressBar, ProgressStyle};
use kiln::burn;
use kiln::core::{DeviceJob, DeviceSpec};
use kiln::forcefield::{
    Frame, MAX_TEMPERATURE_K, MAX_TIMESTEP_FS, MdState, NveConfig, Painn, read_extxyz, run_nve,
    write_extxyz,
};
use kiln::io::StagedFile;

/// mimalloc, keeping the memory it frees for the next step (docs/PERFORMANCE.md).
#[path = "shared/allocator.rs"]
mod allocator;

/// NVE molecular dynamics with a PaiNN potential.
#[derive(Parser)]
struct Args {
    /// Model directory: model.safetensors and config.json.
    #[arg(long)]
    model: PathBuf,
    /// Extended XYZ file holding the starting structure.
    #[arg(long)]
    input: PathBuf,
    /// Which frame of the input to start from, counted from 0 as ASE's `index` is (messages
    /// also name the structure 1-based and its line).
    #[arg(long, default_value_t = 0)]
    frame: usize,
    /// Where to write the trajectory (extended XYZ).
    #[arg(long)]
    trajectory: PathBuf,
    /// Integration step, fs (at most 100).
    #[arg(long, default_value_t = 0.5, value_parser = |t: &str| kiln::cli::at_most(kiln::cli::positive(t)?, MAX_TIMESTEP_FS, "fs"), allow_negative_numbers = true)]
    timestep: f64,
    /// Steps to integrate.
    #[arg(long, default_value_t = 1000, value_parser = kiln::cli::count, allow_negative_numbers = true)]
    steps: usize,
    /// Temperature of the initial Maxwell–Boltzmann velocities, K (at most 100000).
    #[arg(long, default_value_t = 300.0, value_parser = |t: &str| kiln::cli::at_most(kiln::cli::non_negative(t)?, MAX_TEMPERATURE_K, "K"), allow_negative_numbers = true)]
    temperature: f64,
    /// Seed of the initial velocities.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Write a frame every this many steps.
    #[arg(long, default_value_t = 10, value_parser = kiln::cli::count, allow_negative_numbers = true)]
    every: usize,
    /// Neighbour-list skin, Å: the list is rebuilt only when an atom has moved half of it
    /// (0: every step; the trajectory is the same).
    #[arg(long, default_value_t = 1.0, value_parser = kiln::cli::non_negative, allow_negative_numbers = true)]
    skin: f64,
    /// cpu, ndarray, wgpu, vulkan, metal, cuda, cuda:N.
    #[arg(long, default_value = "cpu")]
    device: DeviceSpec,
}

impl DeviceJob for Args {
    type Output = Result<(), String>;

    fn run<B: Backend>(self, device: &B::Device) -> Self::Output {
        kiln::io::RunFiles::new()
            .input("the model directory (--model)", &self.model)
            .input("the structures (--input)", &self.input)
            .output("--trajectory", &self.trajectory)
            .check()
            .map_err(|e| e.to_string())?;
        let input = self.input.display();
        let text = kiln::io::read_text(&self.input).map_err(|e| e.to_string())?;
        let frames = read_extxyz(&text).map_err(|e| format!("{input}: {e}"))?;
        let start = frames.get(self.frame).ok_or_else(|| {
            format!(
                "{input} has {} frame(s): no frame {} (--frame counts from 0)",
                frames.len(),
                self.frame
            )
        })?;
        let model =
            Painn::<Autodiff<B>>::from_dir(&self.model, device).map_err(|e| e.to_string())?;
        start
            .validate(self.frame, model.config().max_z)
            .map_err(|e| format!("{input}:{}: --frame {}: {e}", start.line, self.frame))?;
        let config = NveConfig {
            timestep_fs: self.timestep,
            steps: self.steps,
            temperature_k: self.temperature,
            seed: self.seed,
            every: self.every,
            skin: self.skin,
        };
        // Everything is checked: the trajectory is streamed into a temporary beside it (to
        // follow it) and renamed over --trajectory when the run ends well.
        let mut staged = StagedFile::new(&self.trajectory).map_err(|e| e.to_string())?;
        eprintln!(
            "writing the trajectory to {} until the run ends",
            staged.path().display()
        );
        let mut out = BufWriter::new(staged.file());
        let mut written = Ok(());
        let progress = ProgressBar::new(self.steps as u64).with_style(
            ProgressStyle::with_template("{bar:40} {pos}/{len} steps {msg} [{elapsed} < {eta}]")
                .expect("a valid template"),
        );
        let started = std::time::Instant::now();
        let conservation = run_nve(&model, &start.structure, &config, device, |state| {
            progress.set_position(state.step as u64);
            progress.set_message(format!(
                "E = {:.4} eV, T = {:.0} K",
                state.total(),
                state.temperature_k()
            ));
            if written.is_ok() {
                written = out
                    .write_all(write_extxyz(&[frame(state)]).as_bytes())
                    .and_then(|()| out.flush());
            }
        })
        .map_err(|e| format!("{input}:{}: --frame {}: {e}", start.line, self.frame))?;
        progress.finish_and_clear();
        written
            .and_then(|()| out.into_inner().map(|_| ()).map_err(|e| e.into_error()))
            .map_err(|e| format!("{}: {e}", self.trajectory.display()))?;
        staged.commit().map_err(|e| e.to_string())?;
        let seconds = started.elapsed().as_secs_f64();
        println!(
            "{} steps of {} fs ({} atoms) in {seconds:.1} s: {:.1} steps/s, {:.2} ns/day",
            self.steps,
            self.timestep,
            start.structure.len(),
            self.steps as f64 / seconds,
            self.steps as f64 * self.timestep * 1e-6 / (seconds / 86_400.0)
        );
        println!(
            "energy drift {:.4} meV/atom/ps, largest deviation {:.4} meV/atom",
            conservation.drift_mev_per_atom_ps, conservation.max_deviation_mev_per_atom
        );
        if let Some(doubt) = conservation.doubt() {
            eprintln!("warning: {doubt}");
        }
        Ok(())
    }
}

/// A trajectory frame: positions, energies, temperature, forces and velocities.
fn frame(state: &MdState) -> Frame {
    let mut frame = Frame::new(state.structure.clone());
    let flat = |v: &[[f64; 3]]| v.iter().flatten().copied().collect();
    frame
        .info
        .insert("energy".into(), format!("{:.10}", state.potential));
    frame
        .info
        .insert("kinetic".into(), format!("{:.10}", state.kinetic));
    frame
        .info
        .insert("total".into(), format!("{:.10}", state.total()));
    frame.info.insert(
        "temperature".into(),
        format!("{:.3}", state.temperature_k()),
    );
    frame
        .info
        .insert("time_fs".into(), format!("{}", state.time_fs));
    frame
        .arrays
        .insert("forces".into(), (3, flat(&state.forces)));
    frame
        .arrays
        .insert("velocities".into(), (3, flat(&state.velocities)));
    frame
}

fn main() -> ExitCode {
    allocator::keep_freed_memory();
    let args = Args::parse();
    kiln::run_job(args.device, args)
}
