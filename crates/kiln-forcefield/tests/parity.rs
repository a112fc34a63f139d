//! Energies and forces against schnetpack on the committed fixtures (scripts/fixtures/painn.py):
//! two random-init PaiNN potentials with non-zero biases (Gaussian basis with separate filters;
//! Bessel basis with shared interactions and filters) over molecules, a periodic silicon cell
//! smaller than twice the cutoff, an isolated atom and two far-apart molecules.

use kiln_forcefield::Painn;
use kiln_precision::Precision;

mod support;

use support::{B, fixtures, model, read, structures, worst};

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
    let model = model("painn_gaussian");
    let isolated = structures().swap_remove(4);
    assert_eq!(isolated.len(), 1);
    let results = model.energy_and_forces(&[isolated], &device).unwrap();
    let expected = read("painn_gaussian.safetensors", "energy_f64")[4];
    assert!((results.energies[0] - expected).abs() <= 1e-9);
    assert_eq!(results.forces, vec![[0.0; 3]]);
}
