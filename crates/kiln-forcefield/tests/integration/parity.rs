//! Energies, forces and stresses against schnetpack on the committed fixtures
//! (scripts/fixtures/painn.py): two random-init PaiNN potentials with non-zero biases (Gaussian
//! basis with separate filters; Bessel basis with shared interactions and filters) over
//! molecules, a periodic silicon cell smaller than twice the cutoff, an isolated atom, two
//! far-apart molecules and a triclinic rock-salt cell; neighbour lists against ASE's.

use kiln_core::Precision;
use kiln_forcefield::{NeighborMethod, Painn, Structure, neighbor_list_with};

use crate::support;

use support::{B, fixtures, model, names, read, structures, worst};

/// `predict` (on Flex: the fused host kernel) or `predict_tensors` (burn's tensor operations and
/// autodiff, the path of the GPU backends).
#[derive(Debug, Clone, Copy)]
enum Route {
    Predict,
    Tensors,
}

fn check(name: &str, precision: Precision, tolerance: f64) {
    for route in [Route::Predict, Route::Tensors] {
        check_route(name, precision, tolerance, route);
    }
}

fn check_route(name: &str, precision: Precision, tolerance: f64, route: Route) {
    let device = Default::default();
    let model = Painn::<B>::from_dir(fixtures().join(name), &device)
        .unwrap()
        .with_precision(precision);
    let results = match route {
        Route::Predict => model.predict(&structures(), &device),
        Route::Tensors => model.predict_tensors(&structures(), &device),
    }
    .unwrap();
    let reference = format!("{name}.safetensors");
    let energy = worst(&results.energies, &read(&reference, "energy_f64"));
    let forces: Vec<f64> = results.forces.iter().flatten().copied().collect();
    let force = worst(&forces, &read(&reference, "forces_f64"));
    assert!(
        energy <= tolerance,
        "{name} {precision:?} {route:?}: energy off by {energy:e} eV"
    );
    assert!(
        force <= tolerance,
        "{name} {precision:?} {route:?}: forces off by {force:e} eV/Å"
    );
    let stresses: Vec<f64> = results
        .stresses
        .iter()
        .flatten()
        .flat_map(|s| s.iter().flatten().copied())
        .collect();
    let expected = read(&reference, "stress_f64");
    assert_eq!(
        stresses.len(),
        expected.len(),
        "one stress per periodic cell"
    );
    // Stresses are ~1e-2 eV/Å³ here: hold them to the same relative accuracy as the energies.
    let stress = worst(&stresses, &expected);
    assert!(
        stress <= tolerance * 1e-2,
        "{name} {precision:?} {route:?}: stresses off by {stress:e} eV/Å³"
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
    let results = model.predict(&[isolated], &device).unwrap();
    let expected = read("painn_gaussian.safetensors", "energy_f64")[4];
    assert!((results.energies[0] - expected).abs() <= 1e-9);
    assert_eq!(results.forces, vec![[0.0; 3]]);
}

/// Both neighbour-list methods find exactly ASE's pairs (`neighbor_list("ijS")`) on the fixture
/// structures and on awkward cells: a 100-atom triclinic box, a one-atom skewed cell with a
/// cutoff of several cells, a wire and a slab (whose open lattice vector is zero), atoms outside
/// their cells.
#[test]
fn neighbour_lists_match_ase() {
    let file = "neighbors.safetensors";
    let cases = names(file)
        .iter()
        .filter(|n| n.ends_with(".cutoff"))
        .count();
    assert!(cases >= 18, "{cases} cases in {file}");
    for case in 0..cases {
        let key = |name: &str| read(file, &format!("case{case}.{name}"));
        let (positions, cell, pbc) = (key("positions"), key("cell"), key("pbc"));
        let structure = Structure::periodic(
            key("numbers").iter().map(|&z| z as u32).collect(),
            positions
                .chunks_exact(3)
                .map(|r| [r[0], r[1], r[2]])
                .collect(),
            std::array::from_fn(|r| std::array::from_fn(|c| cell[3 * r + c])),
            std::array::from_fn(|k| pbc[k] != 0.0),
        );
        let (i, j, shifts) = (key("i"), key("j"), key("S"));
        let mut expected: Vec<(u32, u32, [i32; 3])> = (0..i.len())
            .map(|p| {
                let s = std::array::from_fn(|k| shifts[3 * p + k] as i32);
                (i[p] as u32, j[p] as u32, s)
            })
            .collect();
        expected.sort_unstable();
        for method in [NeighborMethod::BruteForce, NeighborMethod::CellList] {
            let list = neighbor_list_with(&structure, key("cutoff")[0], method).unwrap();
            let mut ours: Vec<_> = (0..list.len())
                .map(|p| (list.i[p], list.j[p], list.cell_shifts[p]))
                .collect();
            ours.sort_unstable();
            assert_eq!(ours, expected, "case {case}, {method:?}");
        }
    }
}

/// kiln's save format is schnetpack's: a loaded fixture saved again holds exactly the tensors of
/// the state dict schnetpack wrote (names, shapes, f32 values), and reloads to the same energies.
#[test]
fn saved_models_are_schnetpack_state_dicts() {
    let device = Default::default();
    for name in ["painn_gaussian", "painn_bessel_shared"] {
        let dir = tempfile::tempdir().unwrap();
        let original = fixtures().join(name);
        Painn::<B>::from_dir(&original, &device)
            .unwrap()
            .save(dir.path())
            .unwrap();
        let tensors = |path: &std::path::Path| {
            let bytes = std::fs::read(path.join("model.safetensors")).unwrap();
            let file = safetensors::SafeTensors::deserialize(&bytes).unwrap();
            let mut all: Vec<(String, Vec<usize>, safetensors::Dtype, Vec<u8>)> = file
                .tensors()
                .into_iter()
                .map(|(key, view)| {
                    (
                        key,
                        view.shape().to_vec(),
                        view.dtype(),
                        view.data().to_vec(),
                    )
                })
                .collect();
            all.sort_by(|a, b| a.0.cmp(&b.0));
            all
        };
        assert_eq!(tensors(dir.path()), tensors(&original), "{name}");
        let reloaded = Painn::<B>::from_dir(dir.path(), &device).unwrap();
        assert_eq!(reloaded.config(), model(name).config());
        let again = reloaded.predict(&structures(), &device).unwrap();
        let first = model(name)
            .with_precision(Precision::F32)
            .predict(&structures(), &device)
            .unwrap();
        assert_eq!(again.energies, first.energies, "{name}");
    }
}

/// A config.json whose cutoff differs from the one the weights were trained with is an error.
#[test]
fn a_cutoff_that_contradicts_the_weights_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let original = fixtures().join("painn_gaussian");
    std::fs::copy(
        original.join("model.safetensors"),
        dir.path().join("model.safetensors"),
    )
    .unwrap();
    let config = std::fs::read_to_string(original.join("config.json")).unwrap();
    std::fs::write(
        dir.path().join("config.json"),
        config.replace("\"cutoff\": 5.0", "\"cutoff\": 6.0"),
    )
    .unwrap();
    let err = Painn::<B>::from_dir(dir.path(), &Default::default()).unwrap_err();
    assert!(err.to_string().contains("cutoff_fn.cutoff"), "{err}");
}
