"""PaiNN potentials as an ASE calculator.

>>> from ase.build import molecule
>>> from kiln.forcefield import Calculator
>>> atoms = molecule("C6H6")
>>> atoms.calc = Calculator("painn_model/")          # model.safetensors + config.json
>>> atoms.get_potential_energy(), atoms.get_forces().shape

The model directory holds kiln's format: a kiln-trained potential (``train_forcefield``) or a
schnetpack ``NeuralNetworkPotential`` state dict with its ``config.json``. Neighbour lists are
built in Rust (brute force for molecules, cell lists for large or periodic systems); stresses
are given for cells periodic along all three lattice vectors.
"""

import numpy as np
from ase.calculators.calculator import Calculator as _AseCalculator
from ase.calculators.calculator import all_changes
from ase.stress import full_3x3_to_voigt_6_stress

from kiln._kiln import Potential
from kiln._paths import existing_dir

__all__ = ["Calculator", "Potential"]


def _arrays(atoms):
    """What the native model reads, in place where the arrays already have its dtypes."""
    return (
        np.ascontiguousarray(atoms.numbers, dtype=np.int64),
        np.ascontiguousarray(atoms.positions, dtype=np.float64),
        np.ascontiguousarray(atoms.cell.array, dtype=np.float64),
        tuple(bool(p) for p in atoms.pbc),
    )


def _results(energy, forces, stress):
    results = {"energy": energy, "free_energy": energy, "forces": forces}
    if stress is not None:
        results["stress"] = full_3x3_to_voigt_6_stress(stress)
    return results


class Calculator(_AseCalculator):
    """An ASE calculator for a PaiNN potential kiln loads.

    ``model_dir``: a directory with ``model.safetensors`` and ``config.json``. ``device``:
    ``"cpu"`` (default), or ``"wgpu"`` / ``"cuda"`` in builds with those features. ``dtype``:
    ``"float32"`` (default, as schnetpack's ``SpkCalculator``) or ``"float64"``.

    Gives ``energy`` and ``free_energy`` (eV), ``forces`` (eV/Å) and, for fully periodic cells,
    ``stress`` (eV/Å³, Voigt order, ASE's sign).
    """

    implemented_properties = ["energy", "free_energy", "forces", "stress"]

    def __init__(self, model_dir, device="cpu", dtype="float32", **kwargs):
        super().__init__(**kwargs)
        self.model = Potential(existing_dir(model_dir, "model_dir"), device, dtype)

    def calculate(self, atoms=None, properties=("energy",), system_changes=all_changes):
        super().calculate(atoms, properties, system_changes)
        ((energy, forces, stress),) = self.model.predict([_arrays(self.atoms)])
        self.results = _results(energy, forces, stress)

    def calculate_batch(self, images):
        """Results of every ``ase.Atoms`` in ``images``, evaluated together as one batch: a list
        of dicts with ``energy``, ``free_energy``, ``forces`` and, for fully periodic cells,
        ``stress``, as :meth:`calculate` puts them in ``results``. A structure the model cannot
        evaluate raises ``ValueError`` naming it (1-based)."""
        images = list(images)
        if not images:
            return []
        return [_results(*r) for r in self.model.predict([_arrays(a) for a in images])]
