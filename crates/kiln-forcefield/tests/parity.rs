//! Energies and forces against schnetpack on the committed fixtures (scripts/fixtures/painn.py):
//! two random-init PaiNN potentials with non-zero biases (Gaussian basis with separate filters;
//! Bessel basis with shared interactions and filters) over molecules, a periodic silicon cell
//! smaller than twice the cutoff, an isolated atom and two far-apart molecules.

use std::path::{Path, PathBuf};

use burn::backend::{Autodiff, Flex};
use kiln_forcefield::{Painn, Structure};
use kiln_precision::Precision;
use safetensors::SafeTensors;

type B = Autodiff<Flex>;

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures")
}

/// Every tensor of a fixture file as f64 (integers converted), with its shape.
fn read(file: &str, key: &str) -> Vec<f64> {
    let bytes = std::fs::read(fixtures().join(file)).unwrap();
    let tensors = SafeTensors::deserialize(&bytes).unwrap();
    let view = tensors.tensor(key).unwrap();
    let data = view.data();
    match view.dtype() {
        safetensors::Dtype::F64 => data
            .chunks_exact(8)
            .map(|b| f64::from_le_bytes(b.try_into().unwrap()))
            .collect(),
        safetensors::Dtype::I64 => data
            .chunks_exact(8)
            .map(|b| i64::from_le_bytes(b.try_into().unwrap()) as f64)
            .collect(),
        safetensors::Dtype::U8 => data.iter().map(|&b| f64::from(b)).collect(),
        other => panic!("{key}: {other:?}"),
    }
}

fn structures() -> Vec<Structure> {
    let (numbers, positions) = (
        read("structures.safetensors", "numbers"),
        read("structures.safetensors", "positions"),
    );
    let (cells, pbc) = (
        read("structures.safetensors", "cells"),
        read("structures.safetensors", "pbc"),
    );
    let mut first = 0;
    read("structures.safetensors", "atoms")
        .iter()
        .enumerate()
        .map(|(s, &n)| {
            let atoms = first..first + n as usize;
            first += n as usize;
            Structure::periodic(
                atoms.clone().map(|a| numbers[a] as u32).collect(),
                atoms
                    .map(|a| [positions[3 * a], positions[3 * a + 1], positions[3 * a + 2]])
                    .collect(),
                std::array::from_fn(|r| std::array::from_fn(|c| cells[9 * s + 3 * r + c])),
                std::array::from_fn(|k| pbc[3 * s + k] != 0.0),
            )
        })
        .collect()
}

fn worst(ours: &[f64], expected: &[f64]) -> f64 {
    assert_eq!(ours.len(), expected.len());
    ours.iter()
        .zip(expected)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0, f64::max)
}

fn check(name: &str, precision: Precision, tolerance: f64) {
    let device = Default::default();
    let model = Painn::<B>::from_dir(fixtures().join(name), &device)
        .unwrap()
        .with_precision(precision);
    let results = model.energy_and_forces(&structures(), &device).unwrap();
    let reference = format!("{name}.safetensors");
    let energy = worst(&results.energies, &read(&reference, "energy_f64"));
    let forces: Vec<f64> = results.forces.iter().flatten().copied().collect();
    let force = worst(&forces, &read(&reference, "forces_f64"));
    assert!(
        energy <= tolerance,
        "{name} {precision:?}: energy off by {energy:e} eV"
    );
    assert!(
        force <= tolerance,
        "{name} {precision:?}: forces off by {force:e} eV/Å"
    );
}

#[test]
fn f64_matches_schnetpack_to_1e_9() {
    check("painn_gaussian", Precision::F64, 1e-9);
    check("painn_bessel_shared", Precision::F64, 1e-9);
}

#[test]
fn f32_matches_schnetpack_to_1e_4() {
    check("painn_gaussian", Precision::F32, 1e-4);
    check("painn_bessel_shared", Precision::F32, 1e-4);
}

/// The extxyz ASE wrote holds the same structures as the arrays beside it.
#[test]
fn extxyz_written_by_ase_reads_back() {
    let text = std::fs::read_to_string(fixtures().join("structures.extxyz")).unwrap();
    let frames = kiln_forcefield::read_extxyz(&text).unwrap();
    let expected = structures();
    assert_eq!(frames.len(), expected.len());
    for (frame, structure) in frames.iter().zip(&expected) {
        assert_eq!(frame.structure.numbers, structure.numbers);
        assert_eq!(frame.structure.pbc, structure.pbc);
        let positions: Vec<f64> = frame
            .structure
            .positions
            .iter()
            .flatten()
            .copied()
            .collect();
        let reference: Vec<f64> = structure.positions.iter().flatten().copied().collect();
        // ASE writes 8 decimals.
        assert!(worst(&positions, &reference) < 1e-7);
        if structure.pbc.iter().any(|&p| p) {
            let cell: Vec<f64> = frame.structure.cell.iter().flatten().copied().collect();
            let reference: Vec<f64> = structure.cell.iter().flatten().copied().collect();
            assert!(worst(&cell, &reference) < 1e-7);
        }
    }
}

/// A batch with no neighbour pair at all (one isolated atom) still has an energy: its
/// embedding's readout.
#[test]
fn a_batch_without_pairs_is_evaluated() {
    let device = Default::default();
    let model = Painn::<B>::from_dir(fixtures().join("painn_gaussian"), &device)
        .unwrap()
        .with_precision(Precision::F64);
    let isolated = structures().swap_remove(4);
    assert_eq!(isolated.len(), 1);
    let results = model.energy_and_forces(&[isolated], &device).unwrap();
    let expected = read("painn_gaussian.safetensors", "energy_f64")[4];
    assert!((results.energies[0] - expected).abs() <= 1e-9);
    assert_eq!(results.forces, vec![[0.0; 3]]);
}
