"""kiln.forcefield.Calculator against schnetpack's PaiNN outputs on the same models
(crates/kiln-forcefield/tests/fixtures, written by scripts/fixtures/painn.py with schnetpack
2.1.1), and its behaviour as an ASE calculator."""

import json
import logging
import shutil
import threading

import numpy as np
import pytest
from ase import Atoms
from ase.build import molecule
from ase.calculators.calculator import PropertyNotImplementedError
from ase.stress import full_3x3_to_voigt_6_stress
from conftest import FORCEFIELD, read_safetensors

from kiln.forcefield import Calculator

MODELS = ["painn_gaussian", "painn_bessel_shared"]


def reference(model):
    return read_safetensors(FORCEFIELD / f"{model}.safetensors")


def split_forces(structures, forces):
    bounds = np.cumsum([0] + [len(a) for a in structures])
    return [forces[a:b] for a, b in zip(bounds[:-1], bounds[1:])]


def periodic(atoms):
    return bool(atoms.pbc.all())


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("dtype, tolerance", [("float32", 1e-5), ("float64", 1e-9)])
def test_energy_forces_stress_match_schnetpack(structures, model, dtype, tolerance):
    """Molecules and periodic cells, one ASE call each: schnetpack's numbers in the same dtype
    to 1e-5 eV and eV/Å in float32 (1e-9 in float64); stresses (float64 only in the fixture) to
    1e-7 eV/Å³ (they are ~1e-2 here)."""
    calc = Calculator(FORCEFIELD / model, dtype=dtype)
    ref = reference(model)
    suffix = "f32" if dtype == "float32" else "f64"
    forces = split_forces(structures, ref[f"forces_{suffix}"])
    stresses = iter(ref["stress_f64"])
    for i, atoms in enumerate(structures):
        atoms = atoms.copy()
        atoms.calc = calc
        assert abs(atoms.get_potential_energy() - ref[f"energy_{suffix}"][i]) <= tolerance
        assert atoms.get_potential_energy(force_consistent=True) == atoms.get_potential_energy()
        assert np.abs(atoms.get_forces() - forces[i]).max() <= tolerance
        if periodic(atoms):
            expected = full_3x3_to_voigt_6_stress(next(stresses))
            bound = 1e-7 if dtype == "float32" else 1e-11
            assert np.abs(atoms.get_stress() - expected).max() <= bound
            assert atoms.get_stress().shape == (6,)
        else:
            with pytest.raises(PropertyNotImplementedError):
                atoms.get_stress()


def test_structures_cover_molecules_and_periodic_cells(structures):
    kinds = {periodic(a) for a in structures}
    assert kinds == {True, False}


def test_forces_are_the_energy_gradient(structures):
    """Central differences of the float64 energy on ethanol's atoms."""
    atoms = structures[2].copy()
    atoms.calc = Calculator(FORCEFIELD / "painn_gaussian", dtype="float64")
    forces = atoms.get_forces()
    h = 1e-5
    for atom in (0, 3, 8):
        for axis in range(3):
            shifted = []
            for sign in (1, -1):
                moved = atoms.copy()
                moved.calc = atoms.calc
                moved.positions[atom, axis] += sign * h
                shifted.append(moved.get_potential_energy())
            numeric = -(shifted[0] - shifted[1]) / (2 * h)
            assert abs(numeric - forces[atom, axis]) < 1e-6


def test_batch_matches_single_calls(structures):
    calc = Calculator(FORCEFIELD / "painn_bessel_shared")
    batch = calc.calculate_batch(structures)
    assert len(batch) == len(structures)
    for atoms, result in zip(structures, batch):
        single = Calculator(FORCEFIELD / "painn_bessel_shared")
        atoms = atoms.copy()
        atoms.calc = single
        assert abs(result["energy"] - atoms.get_potential_energy()) <= 1e-5
        assert result["free_energy"] == result["energy"]
        assert result["forces"].shape == (len(atoms), 3)
        assert result["forces"].dtype == np.float64
        assert np.abs(result["forces"] - atoms.get_forces()).max() <= 1e-5
        assert ("stress" in result) == periodic(atoms)
    assert calc.calculate_batch([]) == []


def test_results_follow_the_atoms():
    """ASE recomputes after a move and reuses results otherwise."""
    atoms = Atoms("OH2", positions=[[0, 0, 0.12], [0, 0.76, -0.47], [0, -0.76, -0.47]])
    atoms.calc = Calculator(FORCEFIELD / "painn_gaussian")
    first = atoms.get_potential_energy()
    assert atoms.get_potential_energy() == first
    atoms.positions[0, 2] += 0.1
    assert atoms.get_potential_energy() != first


def bad(atoms, match):
    calc = Calculator(FORCEFIELD / "painn_gaussian")
    atoms.calc = calc
    with pytest.raises(ValueError, match=match):
        atoms.get_potential_energy()


def test_nan_positions_are_refused():
    atoms = Atoms("H2", positions=[[0, 0, 0], [0, 0, np.nan]])
    bad(atoms, "structure 1: atom 2 has a non-finite position")


def test_elements_the_model_does_not_know_are_refused():
    bad(Atoms(numbers=[1, 118], positions=[[0, 0, 0], [0, 0, 1]]), "atomic number 118")
    bad(Atoms(numbers=[0, 1], positions=[[0, 0, 0], [0, 0, 1]]), "atom 1 has atomic number 0")


def test_overlapping_atoms_are_refused():
    bad(Atoms("H2", positions=[[0, 0, 0], [0, 0, 0]]), "structure 1")


def test_empty_structures_and_degenerate_cells_are_refused():
    bad(Atoms(), "no atoms")
    bad(Atoms("H", positions=[[0, 0, 0]], cell=[0, 0, 0], pbc=True), "periodic")


def test_a_bad_structure_in_a_batch_is_named():
    calc = Calculator(FORCEFIELD / "painn_gaussian")
    good = Atoms("H2", positions=[[0, 0, 0], [0, 0, 0.74]])
    broken = Atoms("H2", positions=[[0, 0, 0], [0, 0, np.inf]])
    with pytest.raises(ValueError, match="structure 2"):
        calc.calculate_batch([good, broken])


def test_kiln_warnings_reach_python_logging(tmp_path, caplog):
    """A model told it was trained on H and C warns (once) about oxygen through `logging`."""
    model = tmp_path / "model"
    shutil.copytree(FORCEFIELD / "painn_gaussian", model)
    config = json.loads((model / "config.json").read_text())
    (model / "config.json").write_text(json.dumps({**config, "trained_elements": [1, 6]}))
    calc = Calculator(model)
    with caplog.at_level(logging.WARNING):
        calc.calculate_batch([molecule("H2O"), molecule("CH4"), molecule("H2O")])
    records = [r for r in caplog.records if r.name.startswith("kiln_forcefield")]
    assert len(records) == 1, caplog.text
    assert records[0].levelno == logging.WARNING
    assert "[8]" in records[0].getMessage() and "not to be trusted" in records[0].getMessage()


def test_missing_or_bad_models_are_errors(tmp_path):
    with pytest.raises(FileNotFoundError):
        Calculator(tmp_path / "absent")
    with pytest.raises(FileNotFoundError):
        Calculator(tmp_path)  # a directory without the model's files
    with pytest.raises(ValueError, match="dtype"):
        Calculator(FORCEFIELD / "painn_gaussian", dtype="float16")
    with pytest.raises(ValueError, match="device"):
        Calculator(FORCEFIELD / "painn_gaussian", device="tpu")


def test_threads_share_one_calculator(structures):
    """The native model is called from several threads at once (the lock is released while it
    computes): every thread gets the single-threaded answer."""
    calc = Calculator(FORCEFIELD / "painn_gaussian")
    expected = [r["energy"] for r in calc.calculate_batch(structures)]
    found = {}

    def work(k):
        found[k] = [r["energy"] for r in calc.calculate_batch(structures)]

    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(np.allclose(found[k], expected, rtol=0, atol=1e-9) for k in range(4))
