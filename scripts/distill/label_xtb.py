"""Reference labels from GFN2-xTB (tblite) for distilling it into a PaiNN student.

Molecules of 3-60 atoms, hydrogens included: the H/C/N/O molecules of ASE's G2 set, the S22
complexes, and clusters of 2-4 of them placed side by side. Each structure is one of them rattled
(every coordinate moved by a Gaussian of σ between 0.02 and 0.12 Å, randomly rotated), then
labelled by GFN2-xTB's energy and forces, stored as ASE stores calculator results (a
SinglePointCalculator: `energy=` on the comment line, a `forces:R:3` column). Ethanol is held
out of every set: held_out.extxyz holds it, unlabelled, to start NVE runs from a molecule the
student never saw.

    python3 -m venv /work/venvs/xtb && /work/venvs/xtb/bin/pip install -r scripts/distill/requirements.txt
    /work/venvs/xtb/bin/python scripts/distill/label_xtb.py --out target/distill/xtb [--structures 2400]
    /work/venvs/xtb/bin/python scripts/distill/label_xtb.py --out crates/kiln-forcefield/tests/fixtures/xtb --structures 150

Writes OUT/train.extxyz, valid.extxyz and test.extxyz (80/10/10 by seed), OUT/held_out.extxyz and
OUT/teacher.json (the teacher, its version and its time per structure). No network is needed
once the environment is installed.
"""

import argparse
import json
import time
from pathlib import Path

import numpy as np
from importlib.metadata import version

from ase import Atoms
from ase.build import molecule
from ase.calculators.singlepoint import SinglePointCalculator
from ase.collections import g2, s22
from ase.io import write
from tblite.ase import TBLite

HELD_OUT = "CH3CH2OH"


def pool():
    """Single molecules and complexes of H, C, N and O with hydrogens, ethanol excluded."""
    organic = set("HCNO")
    singles = [
        g2[name]
        for name in g2.names
        if name != HELD_OUT
        and len(g2[name]) >= 3
        and set(g2[name].get_chemical_symbols()) <= organic
        and "H" in g2[name].get_chemical_symbols()
    ]
    complexes = [s22[name] for name in s22.names if set(s22[name].get_chemical_symbols()) <= organic]
    return singles, complexes


def rotated(atoms, rng):
    q = rng.normal(size=4)
    q /= np.linalg.norm(q)
    a, b, c, d = q
    rotation = np.array(
        [
            [a * a + b * b - c * c - d * d, 2 * (b * c - a * d), 2 * (b * d + a * c)],
            [2 * (b * c + a * d), a * a - b * b + c * c - d * d, 2 * (c * d - a * b)],
            [2 * (b * d - a * c), 2 * (c * d + a * b), a * a - b * b - c * c + d * d],
        ]
    )
    out = atoms.copy()
    centred = out.positions - out.positions.mean(axis=0)
    out.positions = centred @ rotation.T
    return out


def cluster(parts, rng):
    """Molecules side by side along x, 3 Å between their closest atoms."""
    out = Atoms()
    for part in parts:
        part = rotated(part, rng)
        if len(out):
            shift = out.positions[:, 0].max() - part.positions[:, 0].min() + 3.0
            part.positions += [shift, rng.normal(scale=0.5), rng.normal(scale=0.5)]
        out += part
    return out


def structure(singles, complexes, rng):
    kind = rng.random()
    if kind < 0.55:
        base = rotated(singles[rng.integers(len(singles))], rng)
    elif kind < 0.75:
        base = rotated(complexes[rng.integers(len(complexes))], rng)
    else:
        while True:
            parts = [singles[rng.integers(len(singles))] for _ in range(rng.integers(2, 5))]
            if rng.random() < 0.3:
                parts[0] = complexes[rng.integers(len(complexes))]
            if sum(len(p) for p in parts) <= 60:
                break
        base = cluster(parts, rng)
    base.positions += rng.normal(scale=rng.uniform(0.02, 0.12), size=base.positions.shape)
    return base


def label(atoms, calculator):
    atoms.calc = calculator
    energy = atoms.get_potential_energy()
    forces = atoms.get_forces()
    atoms.calc = SinglePointCalculator(atoms, energy=energy, forces=forces)
    return atoms


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--structures", type=int, default=2400)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    rng = np.random.default_rng(args.seed)
    singles, complexes = pool()
    calculator = TBLite(method="GFN2-xTB", verbosity=0)
    labelled, seconds = [], 0.0
    while len(labelled) < args.structures:
        atoms = structure(singles, complexes, rng)
        distances = atoms.get_all_distances() + 10 * np.eye(len(atoms))
        if distances.min() < 0.7:
            continue
        start = time.perf_counter()
        try:
            labelled.append(label(atoms, calculator))
        except Exception as error:  # an SCF that does not converge: draw another
            print("skipped:", error)
            continue
        seconds += time.perf_counter() - start
        if len(labelled) % 200 == 0:
            print(f"{len(labelled)} structures labelled", flush=True)
    order = rng.permutation(len(labelled))
    n_valid = n_test = max(1, len(labelled) // 10)
    splits = {
        "valid": order[:n_valid],
        "test": order[n_valid : n_valid + n_test],
        "train": order[n_valid + n_test :],
    }
    args.out.mkdir(parents=True, exist_ok=True)
    for name, indices in splits.items():
        write(args.out / f"{name}.extxyz", [labelled[i] for i in indices], format="extxyz")
    write(args.out / "held_out.extxyz", molecule(HELD_OUT), format="extxyz")
    sizes = [len(a) for a in labelled]
    teacher = {
        "method": "GFN2-xTB",
        "package": f"tblite {version('tblite')}",
        "structures": len(labelled),
        "atoms_min": min(sizes),
        "atoms_max": max(sizes),
        "atoms_mean": float(np.mean(sizes)),
        "ms_per_structure": 1e3 * seconds / len(labelled),
        "held_out": HELD_OUT,
    }
    (args.out / "teacher.json").write_text(json.dumps(teacher, indent=2) + "\n")
    print(json.dumps(teacher, indent=2))


if __name__ == "__main__":
    main()
