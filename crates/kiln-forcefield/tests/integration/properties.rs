//! Physics the potential must respect whatever its weights, checked in f64 on the fixture
//! models: energies invariant and forces equivariant under rotation, translation, permutation
//! and lattice shifts; forces equal to finite differences of the energy; smooth at the cutoff;
//! far-apart molecules add up; a batch equals its structures one by one, and no structure's
//! energy depends on another's atoms; stresses equal finite differences of the energy under
//! strain; NVE dynamics conserve energy with errors falling as the timestep squared.

use burn::tensor::Tensor;
use kiln_forcefield::{
    BOLTZMANN, NveConfig, Predictions, Structure, kinetic_energy, maxwell_boltzmann, run_nve,
};

use crate::support;

use support::{B, model, structures, worst};

const MODELS: [&str; 2] = ["painn_gaussian", "painn_bessel_shared"];

fn evaluate(name: &str, batch: &[Structure]) -> Predictions {
    model(name).predict(batch, &Default::default()).unwrap()
}

fn flat(forces: &[[f64; 3]]) -> Vec<f64> {
    forces.iter().flatten().copied().collect()
}

/// A rotation by `angle` about the (normalised) `axis` (Rodrigues).
fn rotation(axis: [f64; 3], angle: f64) -> [[f64; 3]; 3] {
    let n = (axis[0] * axis[0] + axis[1] * axis[1] + axis[2] * axis[2]).sqrt();
    let [x, y, z] = axis.map(|a| a / n);
    let (s, c) = angle.sin_cos();
    let t = 1.0 - c;
    [
        [t * x * x + c, t * x * y - s * z, t * x * z + s * y],
        [t * x * y + s * z, t * y * y + c, t * y * z - s * x],
        [t * x * z - s * y, t * y * z + s * x, t * z * z + c],
    ]
}

fn apply(m: [[f64; 3]; 3], v: [f64; 3]) -> [f64; 3] {
    std::array::from_fn(|r| m[r][0] * v[0] + m[r][1] * v[1] + m[r][2] * v[2])
}

#[test]
fn energies_are_invariant_and_forces_equivariant_under_rotation_and_translation() {
    let all = structures();
    // Ethanol, and the periodic silicon cell (rotated together with its lattice).
    for structure in [&all[2], &all[3]] {
        let rotate = rotation([0.3, -0.5, 0.8], 1.1);
        let moved = Structure {
            positions: structure
                .positions
                .iter()
                .map(|&r| {
                    let r = apply(rotate, r);
                    [r[0] + 3.0, r[1] - 1.5, r[2] + 0.25]
                })
                .collect(),
            cell: structure.cell.map(|v| apply(rotate, v)),
            ..structure.clone()
        };
        for name in MODELS {
            let before = evaluate(name, std::slice::from_ref(structure));
            let after = evaluate(name, std::slice::from_ref(&moved));
            assert!(
                (before.energies[0] - after.energies[0]).abs() < 1e-10,
                "{name}"
            );
            let rotated: Vec<[f64; 3]> = before.forces.iter().map(|&f| apply(rotate, f)).collect();
            assert!(
                worst(&flat(&after.forces), &flat(&rotated)) < 1e-9,
                "{name}"
            );
        }
    }
}

#[test]
fn energies_are_invariant_under_permutation_and_lattice_shifts() {
    let all = structures();
    let ethanol = &all[2];
    let order: Vec<usize> = (0..ethanol.len()).rev().collect();
    let permuted = Structure {
        numbers: order.iter().map(|&a| ethanol.numbers[a]).collect(),
        positions: order.iter().map(|&a| ethanol.positions[a]).collect(),
        ..ethanol.clone()
    };
    let silicon = &all[3];
    let mut shifted = silicon.clone();
    let a = silicon.cell[0];
    let b = silicon.cell[2];
    shifted.positions[1] = std::array::from_fn(|k| shifted.positions[1][k] + a[k] - 2.0 * b[k]);
    for name in MODELS {
        let results = evaluate(name, &[ethanol.clone(), permuted.clone()]);
        assert!((results.energies[0] - results.energies[1]).abs() < 1e-10);
        let n = ethanol.len();
        let expected: Vec<[f64; 3]> = order.iter().map(|&a| results.forces[a]).collect();
        assert!(worst(&flat(&results.forces[n..]), &flat(&expected)) < 1e-10);

        let results = evaluate(name, &[silicon.clone(), shifted.clone()]);
        assert!((results.energies[0] - results.energies[1]).abs() < 1e-10);
        let n = silicon.len();
        assert!(worst(&flat(&results.forces[..n]), &flat(&results.forces[n..])) < 1e-9);
    }
}

#[test]
fn forces_are_minus_the_energy_gradient() {
    let all = structures();
    let h = 1e-5;
    for structure in [&all[2], &all[3]] {
        for name in MODELS {
            let forces = evaluate(name, std::slice::from_ref(structure)).forces;
            // Central differences of every coordinate, all displaced copies in one batch.
            let mut batch = Vec::new();
            for atom in 0..structure.len() {
                for k in 0..3 {
                    for sign in [1.0, -1.0] {
                        let mut displaced = structure.clone();
                        displaced.positions[atom][k] += sign * h;
                        batch.push(displaced);
                    }
                }
            }
            let energies = evaluate(name, &batch).energies;
            let numeric: Vec<f64> = energies
                .chunks_exact(2)
                .map(|pair| -(pair[0] - pair[1]) / (2.0 * h))
                .collect();
            let error = worst(&numeric, &flat(&forces));
            assert!(error < 1e-6, "{name}: finite differences off by {error:e}");
        }
    }
}

/// `structure` with positions and cell deformed by `r → r (1 + ε)`, ε symmetric with
/// `ε_ab = ε_ba = h / 2` (`h` on the diagonal).
fn strained(structure: &Structure, a: usize, b: usize, h: f64) -> Structure {
    let deform = |r: [f64; 3]| -> [f64; 3] {
        let mut out = r;
        out[b] += 0.5 * h * r[a];
        out[a] += 0.5 * h * r[b];
        out
    };
    Structure {
        positions: structure.positions.iter().map(|&r| deform(r)).collect(),
        cell: structure.cell.map(deform),
        ..structure.clone()
    }
}

#[test]
fn stresses_are_the_energy_strain_derivative_over_the_volume() {
    let silicon = structures().swap_remove(3);
    // The same atoms in a skewed (triclinic) cell: b leans over a, c over a and b.
    let mut skewed = silicon.clone();
    skewed.cell[1][0] += 1.3;
    skewed.cell[2][0] -= 0.7;
    skewed.cell[2][1] += 0.9;
    let h = 1e-5;
    for structure in [&silicon, &skewed] {
        let volume = structure.volume().unwrap();
        for name in MODELS {
            let stress = evaluate(name, std::slice::from_ref(structure)).stresses[0].unwrap();
            let mut batch = Vec::new();
            for a in 0..3 {
                for b in 0..3 {
                    batch.push(strained(structure, a, b, h));
                    batch.push(strained(structure, a, b, -h));
                }
            }
            let energies = evaluate(name, &batch).energies;
            for (c, pair) in energies.chunks_exact(2).enumerate() {
                let numeric = (pair[0] - pair[1]) / (2.0 * h * volume);
                let ours = stress[c / 3][c % 3];
                assert!(
                    (numeric - ours).abs() < 1e-7,
                    "{name}: stress[{}][{}] = {ours:e}, finite differences {numeric:e}",
                    c / 3,
                    c % 3
                );
            }
            assert!(stress[0][1] != 0.0, "{name}: a stress that cannot fail");
        }
    }
    // Molecules and slabs have no stress.
    let mut slab = silicon.clone();
    slab.pbc[2] = false;
    let results = evaluate("painn_gaussian", &[structures().swap_remove(0), slab]);
    assert_eq!(results.stresses, vec![None, None]);
}

#[test]
fn energy_and_forces_are_smooth_at_the_cutoff() {
    for (name, cutoff) in [("painn_gaussian", 5.0), ("painn_bessel_shared", 4.0)] {
        let pair = |d: f64| Structure::molecule(vec![8, 1], vec![[0.0; 3], [d, 0.0, 0.0]]);
        let results = evaluate(
            name,
            &[
                pair(cutoff + 1e-6),
                pair(cutoff - 1e-6),
                pair(cutoff - 1e-4),
                pair(cutoff - 0.5),
            ],
        );
        let (outside, inside) = (results.energies[0], results.energies[1]);
        assert!(
            (outside - inside).abs() < 1e-9,
            "{name}: energy jumps at the cutoff"
        );
        // The cosine cutoff's slope vanishes at rc: the force fades linearly to 0 there.
        let (near, inner) = (results.forces[4][0].abs(), results.forces[6][0].abs());
        assert!(
            near < 1e-3 * inner,
            "{name}: force {near:e} just inside the cutoff, {inner:e} 0.5 Å in"
        );
    }
}

#[test]
fn far_apart_molecules_add_up_and_batches_equal_single_structures() {
    let all = structures();
    let both = &all[5];
    let (water, ammonia) = (
        Structure::molecule(both.numbers[..3].to_vec(), both.positions[..3].to_vec()),
        Structure::molecule(both.numbers[3..].to_vec(), both.positions[3..].to_vec()),
    );
    for name in MODELS {
        let apart = evaluate(name, &[water.clone(), ammonia.clone(), both.clone()]);
        let sum = apart.energies[0] + apart.energies[1];
        assert!((apart.energies[2] - sum).abs() < 1e-10, "{name}");
        let n = water.len() + ammonia.len();
        assert!(worst(&flat(&apart.forces[..n]), &flat(&apart.forces[n..])) < 1e-12);

        let batch = evaluate(name, &all);
        let mut first = 0;
        for (s, structure) in all.iter().enumerate() {
            let alone = evaluate(name, std::slice::from_ref(structure));
            assert!(
                (batch.energies[s] - alone.energies[0]).abs() < 1e-10,
                "{name} {s}"
            );
            let atoms = first..first + structure.len();
            assert!(worst(&flat(&batch.forces[atoms.clone()]), &flat(&alone.forces)) < 1e-10);
            first = atoms.end;
        }
    }
}

/// The gradient of one structure's energy with respect to every other structure's atoms is
/// exactly zero: nothing couples structures in a batch.
#[test]
fn no_structure_depends_on_another() {
    let device = Default::default();
    let all = structures();
    let model = model("painn_gaussian");
    let graph = model.graph(&all, &device).unwrap();
    let positions = graph.positions.clone().require_grad();
    let energies = model.energies(&graph, positions.clone());
    let first: Tensor<B, 1> = energies.narrow(0, 0, 1);
    let gradients = first.sum().backward();
    let gradient: Vec<f64> = positions
        .grad(&gradients)
        .unwrap()
        .into_data()
        .convert::<f64>()
        .to_vec()
        .unwrap();
    let own = 3 * all[0].len();
    assert!(gradient[..own].iter().any(|&g| g != 0.0));
    assert!(gradient[own..].iter().all(|&g| g == 0.0));
}

/// Per-element reference energies (`atomref` in config.json) shift each energy by the sum over
/// its atoms and leave forces alone.
/// The painn_gaussian fixture with per-element reference energies `atomref` (eV, by Z), in f64.
fn with_atomref(atomref: &[f64]) -> kiln_forcefield::Painn<B> {
    let dir = tempfile::tempdir().unwrap();
    let source = support::fixtures().join("painn_gaussian");
    std::fs::copy(
        source.join("model.safetensors"),
        dir.path().join("model.safetensors"),
    )
    .unwrap();
    let mut config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(source.join("config.json")).unwrap())
            .unwrap();
    config["atomref"] = serde_json::json!(atomref);
    std::fs::write(dir.path().join("config.json"), config.to_string()).unwrap();
    kiln_forcefield::Painn::<B>::from_dir(dir.path(), &Default::default())
        .unwrap()
        .with_precision(kiln_core::Precision::F64)
}

#[test]
fn reference_energies_add_per_atom() {
    let atomref: Vec<f64> = (0..100).map(|z| -0.5 * z as f64 - 0.125).collect();
    let with = with_atomref(&atomref);
    let device = Default::default();
    let all = structures();
    let plain = evaluate("painn_gaussian", &all);
    let shifted = with.predict(&all, &device).unwrap();
    for (s, structure) in all.iter().enumerate() {
        let reference: f64 = structure.numbers.iter().map(|&z| atomref[z as usize]).sum();
        let difference = shifted.energies[s] - plain.energies[s];
        assert!((difference - reference).abs() < 1e-9, "structure {s}");
    }
    assert!(worst(&flat(&shifted.forces), &flat(&plain.forces)) < 1e-12);
}

/// Velocity Verlet is second order: the energy error of 100 fs of ethanol at 300 K falls about
/// fourfold when the timestep halves, and at 0.25 fs the drift is far below what NVE runs
/// tolerate (1 meV/atom/ps).
#[test]
fn nve_conserves_energy_to_second_order_in_the_timestep() {
    let ethanol = structures().swap_remove(2);
    let model = model("painn_gaussian");
    let run = |timestep_fs: f64| {
        let config = NveConfig {
            timestep_fs,
            steps: (100.0 / timestep_fs) as usize,
            temperature_k: 300.0,
            seed: 3,
            every: 1,
            ..NveConfig::default()
        };
        let mut temperatures = Vec::new();
        let conservation = run_nve(&model, &ethanol, &config, &Default::default(), |state| {
            temperatures.push(state.temperature_k())
        })
        .unwrap();
        assert_eq!(temperatures.len(), config.steps + 1);
        // The atoms really moved: kinetic and potential energy were exchanged.
        let (lo, hi) = temperatures
            .iter()
            .fold((f64::MAX, f64::MIN), |(l, h), &t| (l.min(t), h.max(t)));
        assert!(
            hi - lo > 20.0,
            "temperature stayed within {lo:.1}..{hi:.1} K"
        );
        conservation
    };
    let (coarse, fine) = (run(0.5), run(0.25));
    let ratio = coarse.max_deviation_mev_per_atom / fine.max_deviation_mev_per_atom;
    eprintln!("0.5 fs: {coarse:?}\n0.25 fs: {fine:?}");
    assert!(
        (2.5..6.5).contains(&ratio),
        "halving the timestep shrank the energy error {ratio:.2}× ({coarse:?}, {fine:?})"
    );
    assert!(fine.drift_mev_per_atom_ps.abs() < 1.0, "{fine:?}");
    assert_eq!(fine.doubt(), None);
}

/// Energy that stops being finite ends a run at the step where it does, before any frame
/// holds it; a time step too long to conserve energy is doubted; settings outside their
/// domains are refused before anything runs.
#[test]
fn md_stops_at_a_non_finite_energy_and_doubts_a_step_too_long() {
    let water = structures().swap_remove(0);
    let device = Default::default();
    let overflowing = with_atomref(&[1e308; 100]);
    let mut frames = 0;
    let err = run_nve(&overflowing, &water, &NveConfig::default(), &device, |_| {
        frames += 1
    })
    .unwrap_err()
    .to_string();
    assert!(
        err.contains("at step 0: the model gives a non-finite energy or force"),
        "{err}"
    );
    assert_eq!(frames, 0);

    let model = model("painn_gaussian");
    let long = NveConfig {
        timestep_fs: 50.0,
        steps: 50,
        ..NveConfig::default()
    };
    let doubt = run_nve(&model, &water, &long, &device, |_| ())
        .unwrap()
        .doubt()
        .expect("a 50 fs step does not conserve energy");
    assert!(doubt.contains("energy was not conserved"), "{doubt}");

    for (config, needle) in [
        (
            NveConfig {
                timestep_fs: 1e300,
                ..long.clone()
            },
            "timestep 1e300 fs",
        ),
        (
            NveConfig {
                temperature_k: -5.0,
                ..long.clone()
            },
            "temperature -5 K",
        ),
        (
            NveConfig {
                skin: f64::NAN,
                ..long.clone()
            },
            "skin NaN",
        ),
    ] {
        let err = run_nve(&model, &water, &config, &device, |_| ()).unwrap_err();
        assert!(err.to_string().contains(needle), "{err}");
    }
}

/// The initial velocities: the requested temperature within sampling error, no centre-of-mass
/// motion, the same draw for the same seed.
#[test]
fn maxwell_boltzmann_velocities_have_the_temperature() {
    let masses: Vec<f64> = (0..3000).map(|a| [1.008, 12.011, 15.999][a % 3]).collect();
    let velocities = maxwell_boltzmann(&masses, 500.0, 9);
    let temperature =
        2.0 * kinetic_energy(&masses, &velocities) / (3.0 * masses.len() as f64 * BOLTZMANN);
    // Relative standard error sqrt(2 / 3N) = 1.5 %; allow four of them.
    assert!((temperature - 500.0).abs() < 30.0, "{temperature} K");
    for x in 0..3 {
        let momentum: f64 = masses.iter().zip(&velocities).map(|(m, v)| m * v[x]).sum();
        assert!(momentum.abs() < 1e-10, "{momentum}");
    }
    assert_eq!(velocities, maxwell_boltzmann(&masses, 500.0, 9));
    assert_ne!(velocities, maxwell_boltzmann(&masses, 500.0, 10));
}

/// The Verlet list's trajectory is bit for bit the one of a neighbour list rebuilt every step:
/// a periodic silicon cell at 1500 K under the 4 Å model (second neighbours at 3.8 Å cross the
/// cutoff), 200 steps of 1 fs.
#[test]
fn md_with_a_verlet_list_follows_the_rebuild_every_step_trajectory() {
    let silicon = structures().swap_remove(3);
    assert!(silicon.volume().is_some());
    let model = model("painn_bessel_shared");
    let run = |skin: f64| {
        let config = NveConfig {
            timestep_fs: 1.0,
            steps: 200,
            temperature_k: 1500.0,
            seed: 8,
            every: 1,
            skin,
        };
        let mut states = Vec::new();
        let conservation = run_nve(&model, &silicon, &config, &Default::default(), |state| {
            states.push(state.clone())
        })
        .unwrap();
        (states, conservation.neighbor_builds)
    };
    let (verlet, builds) = run(0.5);
    let (fresh, every_step) = run(0.0);
    assert_eq!(every_step, 201);
    assert!((2..50).contains(&builds), "{builds} builds");
    assert_eq!(verlet.len(), fresh.len());
    for (a, b) in verlet.iter().zip(&fresh) {
        assert_eq!(a, b, "step {}", a.step);
    }
}
