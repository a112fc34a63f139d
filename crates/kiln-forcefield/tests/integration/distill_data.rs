//! The committed GFN2-xTB set (scripts/distill/label_xtb.py through tblite; ASE wrote it, the
//! labels as a SinglePointCalculator's results) reads as training data: 3–60-atom molecules with
//! hydrogens, labels physically consistent (forces of an isolated molecule sum to zero), and the
//! least-squares reference energies take out almost all of the energy's spread.

use kiln_forcefield::{LabelKeys, LabelledStructures, fit_atomref};

use crate::support;

fn set(name: &str) -> LabelledStructures {
    let path = support::fixtures()
        .join("xtb")
        .join(format!("{name}.extxyz"));
    LabelledStructures::from_extxyz(&path, &LabelKeys::default()).unwrap()
}

#[test]
fn the_gfn2_xtb_set_is_training_data_with_hydrogens() {
    let (train, valid) = (set("train"), set("valid"));
    assert_eq!((train.len(), valid.len()), (120, 15));
    for data in [&train, &valid] {
        data.check(5.0, 100).unwrap();
        for (s, (structure, labels)) in data.structures.iter().zip(&data.labels).enumerate() {
            assert!((3..=60).contains(&structure.len()), "structure {s}");
            assert!(
                structure.numbers.contains(&1),
                "structure {s} has no hydrogen"
            );
            assert!(structure.numbers.iter().all(|z| [1, 6, 7, 8].contains(z)));
            // xTB's forces on an isolated molecule sum to zero (translation invariance).
            let net: [f64; 3] =
                std::array::from_fn(|a| labels.forces.iter().map(|f| f[a]).sum::<f64>());
            let largest = labels
                .forces
                .iter()
                .flatten()
                .fold(0.0_f64, |m, f| m.max(f.abs()));
            assert!(
                net.iter().all(|n| n.abs() < 1e-6 * largest.max(1.0)),
                "structure {s}: net force {net:?}"
            );
        }
    }
    let largest = train.structures.iter().map(|s| s.len()).max().unwrap();
    assert!(
        largest > 30,
        "the set reaches large molecules ({largest} atoms)"
    );

    // Reference energies fitted on the training set explain the validation energies to within
    // a tenth of their spread per atom (what remains is mostly the rattling's strain energy).
    let energies: Vec<f64> = train.labels.iter().map(|l| l.energy).collect();
    let atomref = fit_atomref(&train.structures, &energies, 100).unwrap();
    let per_atom = |data: &LabelledStructures, reference: bool| -> Vec<f64> {
        data.structures
            .iter()
            .zip(&data.labels)
            .map(|(s, l)| {
                let offset: f64 = if reference {
                    s.numbers.iter().map(|&z| atomref[z as usize]).sum()
                } else {
                    0.0
                };
                (l.energy - offset) / s.len() as f64
            })
            .collect()
    };
    let spread = |values: Vec<f64>| {
        let mean = values.iter().sum::<f64>() / values.len() as f64;
        (values.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / values.len() as f64).sqrt()
    };
    let (raw, residual) = (
        spread(per_atom(&valid, false)),
        spread(per_atom(&valid, true)),
    );
    assert!(
        residual < 0.1 * raw,
        "per-atom spread {raw} eV, after atomref {residual} eV"
    );
}
