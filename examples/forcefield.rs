//! Energies and forces (and stresses of fully periodic cells) of every structure of an extxyz
//! file with a PaiNN potential (a schnetpack state dict and its config.json), written as extxyz
//! that ASE reads.
//!
//! ```text
//! cargo run --release --example forcefield -- --model painn/ --input in.extxyz \
//!     --output out.extxyz [--batch 64] [--device cpu]
//! ```
//!
//! Structures are evaluated `--batch` at a time as one graph (one forward and one backward pass
//! per batch). A structure that cannot be evaluated (atomic number beyond the model's,
//! non-finite or overlapping positions, no atoms) is written back without results and with an
//! `error` entry naming the problem; the others keep theirs, and the run exits with an error
//! status after writing everything. A file that is not extxyz (or names an unknown element) is
//! rejected before any work, naming the line.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use burn::backend::Autodiff;
use burn::tensor::backend::Backend;
use clap::Parser;
use kiln::burn;
use kiln::core::{DeviceJob, DeviceSpec};
use kiln::forcefield::{
    Doubt, ForceFieldError, Frame, Painn, Predictions, read_extxyz, write_extxyz,
};

/// mimalloc, keeping the memory it frees for the next step (docs/PERFORMANCE.md).
#[path = "shared/allocator.rs"]
mod allocator;

/// Energies and forces of extxyz structures with a PaiNN potential.
#[derive(Parser)]
struct Args {
    /// Model directory: model.safetensors and config.json.
    #[arg(long)]
    model: PathBuf,
    /// Structures to evaluate (extended XYZ).
    #[arg(long)]
    input: PathBuf,
    /// Where to write them with `energy`, `forces` and `stress` (extended XYZ).
    #[arg(long)]
    output: PathBuf,
    /// Structures per forward pass.
    #[arg(long, default_value_t = 64, value_parser = kiln::cli::count, allow_negative_numbers = true)]
    batch: usize,
    /// cpu, ndarray, wgpu, vulkan, metal, cuda, cuda:N.
    #[arg(long, default_value = "cpu")]
    device: DeviceSpec,
}

impl DeviceJob for Args {
    type Output = Result<usize, String>;

    /// Evaluates and writes every frame; returns how many could not be evaluated.
    fn run<B: Backend>(self, device: &B::Device) -> Self::Output {
        kiln::io::RunFiles::new()
            .input("the model directory (--model)", &self.model)
            .input("the structures (--input)", &self.input)
            .output("--output", &self.output)
            .check()
            .map_err(|e| e.to_string())?;
        let text = kiln::io::read_text(&self.input).map_err(|e| e.to_string())?;
        let mut frames =
            read_extxyz(&text).map_err(|e| format!("{}: {e}", self.input.display()))?;
        let model =
            Painn::<Autodiff<B>>::from_dir(&self.model, device).map_err(|e| e.to_string())?;
        let max_z = model.config().max_z;
        // Structures that cannot be evaluated are set aside before batching.
        let mut failed = 0;
        let mut good = Vec::new();
        for (index, frame) in frames.iter_mut().enumerate() {
            frame.info.remove("energy");
            frame.info.remove("stress");
            frame.arrays.remove("forces");
            match frame.validate(index, max_z) {
                Ok(()) => good.push(index),
                Err(e) => {
                    eprintln!("{}:{}: {e}", self.input.display(), frame.line);
                    frame.info.insert("error".into(), e.to_string());
                    failed += 1;
                }
            }
        }
        let start = Instant::now();
        let mut doubts = Vec::new();
        for chunk in good.chunks(self.batch) {
            let structures: Vec<_> = chunk.iter().map(|&i| frames[i].structure.clone()).collect();
            match model.predict(&structures, device) {
                Ok(results) => doubts.extend(store(&mut frames, chunk, results)),
                // A problem found only while building neighbour lists (overlapping atoms):
                // evaluate the chunk's structures one at a time so only the bad one is lost.
                Err(_) => {
                    for &index in chunk {
                        let single = [frames[index].structure.clone()];
                        match model.predict(&single, device) {
                            Ok(results) => doubts.extend(store(&mut frames, &[index], results)),
                            Err(e) => {
                                // Alone in its batch, the structure was the batch's first.
                                let e = match e {
                                    ForceFieldError::Structure { reason, .. } => {
                                        ForceFieldError::Structure { index, reason }
                                    }
                                    other => other,
                                };
                                let line = frames[index].line;
                                eprintln!("{}:{line}: {e}", self.input.display());
                                frames[index].info.insert("error".into(), e.to_string());
                                failed += 1;
                            }
                        }
                    }
                }
            }
        }
        let seconds = start.elapsed().as_secs_f64();
        // What the model gave but should not be trusted: NaN or infinite values fail their
        // structure, implausible energies are warned of.
        for (index, doubt) in doubts {
            let frame = &mut frames[index];
            let fatal = matches!(doubt, Doubt::NonFinite { .. });
            let kind = if fatal { "error" } else { "warning" };
            eprintln!("{}:{}: {kind}: {doubt}", self.input.display(), frame.line);
            if fatal {
                frame.info.remove("energy");
                frame.info.remove("stress");
                frame.arrays.remove("forces");
                frame.info.insert("error".into(), doubt.to_string());
                failed += 1;
            }
        }
        let evaluated = frames.iter().filter(|f| f.info.contains_key("energy"));
        let (count, atoms) = evaluated.fold((0, 0), |(n, a), f| (n + 1, a + f.structure.len()));
        eprintln!(
            "{count} structures ({atoms} atoms) in {seconds:.3} s: {:.1} structures/s on {}",
            count as f64 / seconds.max(f64::MIN_POSITIVE),
            self.device
        );
        kiln::io::write_atomic(&self.output, write_extxyz(&frames).as_bytes())
            .map_err(|e| e.to_string())?;
        Ok(failed)
    }
}

/// Puts results into the frames `indices`: energy and stress (3×3, row by row, as ASE writes
/// it) in the info, forces as a per-atom array. Returns the frames whose results are in doubt.
fn store(frames: &mut [Frame], indices: &[usize], results: Predictions) -> Vec<(usize, Doubt)> {
    let mut doubts = Vec::new();
    let mut first = 0;
    for (s, &index) in indices.iter().enumerate() {
        let frame = &mut frames[index];
        let atoms = frame.structure.len();
        let energy = results.energies[s];
        if let Some(doubt) = results.doubt(s, first, atoms) {
            doubts.push((index, doubt));
        }
        frame.info.insert("energy".into(), format!("{energy:.10}"));
        if let Some(stress) = results.stresses[s] {
            let values: Vec<String> = stress
                .iter()
                .flatten()
                .map(|v| format!("{v:.10e}"))
                .collect();
            frame.info.insert("stress".into(), values.join(" "));
        }
        let values = results.forces[first..first + atoms]
            .iter()
            .flatten()
            .copied()
            .collect();
        frame.arrays.insert("forces".into(), (3, values));
        first += atoms;
    }
    doubts
}

fn main() -> ExitCode {
    allocator::keep_freed_memory();
    kiln::log_to_stderr();
    let args = Args::parse();
    let device = args.device;
    match device.run(args).map_err(|e| e.to_string()).and_then(|r| r) {
        Ok(0) => ExitCode::SUCCESS,
        Ok(failed) => {
            eprintln!("error: {failed} structure(s) could not be evaluated (written with `error`)");
            ExitCode::FAILURE
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}
