"""ASE molecular dynamics through kiln's calculator and schnetpack's, for docs/PERFORMANCE.md.

ASE's VelocityVerlet on benzene (0.5 fs, 300 K Maxwell-Boltzmann start, seeded), one
calculator call a step, with the seed's PaiNN size (F = 128, 3 blocks, 20 Gaussians, 5 Å) and
random weights. Both calculators read the same model directory (kiln's format: a schnetpack
state dict and its config.json; the schnetpack model is also saved whole for SpkCalculator).
Prints the seconds, steps/s and the total-energy drift. `batch` times kiln's
`calculate_batch` on 64 perturbed benzenes against 64 single calls (median of 15 rounds);
`calls` times kiln's native `Potential.predict` alone (no ASE) on one water, one, two and eight
benzenes.

    # the model (schnetpack's environment: scripts/fixtures/requirements-schnetpack.txt)
    /work/venvs/spk/bin/python scripts/bench/ase_md.py model target/bench/ase_md/seed
    # kiln's `md` example on the same model and molecule, without ASE
    target/release/examples/md --model target/bench/ase_md/seed \
        --input target/bench/ase_md/benzene.extxyz --trajectory /tmp/md.extxyz --steps 1000
    # kiln (an environment with `pip install ./crates/kiln-python[ase]`)
    python scripts/bench/ase_md.py md --calculator kiln --model target/bench/ase_md/seed
    /work/venvs/spk/bin/python scripts/bench/ase_md.py md --calculator schnetpack \
        --model target/bench/ase_md/seed
    python scripts/bench/ase_md.py batch --model target/bench/ase_md/seed
    python scripts/bench/ase_md.py calls --model target/bench/ase_md/seed
"""

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np
from ase import units
from ase.build import molecule
from ase.io import write
from ase.md.verlet import VelocityVerlet

try:
    from ase.md.velocitydistribution import thermalize_momenta
except ImportError:  # ase < 3.29 has it under its older name
    from ase.md.velocitydistribution import MaxwellBoltzmannDistribution as thermalize_momenta

SEED_SIZE = dict(
    representation="painn",
    n_atom_basis=128,
    n_interactions=3,
    n_rbf=20,
    cutoff=5.0,
    radial_basis="gaussian",
    cutoff_fn="cosine",
    shared_interactions=False,
    shared_filters=False,
    max_z=100,
    readout_n_layers=2,
    readout_n_hidden=None,
    # schnetpack's model has no offset: keep both calculators' energies the same.
    mean_per_atom=0.0,
)


def make_model(directory):
    import torch
    from safetensors.torch import save_file

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "fixtures"))
    from painn import build  # the fixtures' schnetpack model builder

    torch.manual_seed(7)
    model = build(SEED_SIZE)
    directory.mkdir(parents=True, exist_ok=True)
    state = {k: v.contiguous() for k, v in model.state_dict().items()}
    save_file(state, directory / "model.safetensors")
    (directory / "config.json").write_text(json.dumps(SEED_SIZE, indent=2))
    torch.save(model, directory / "schnetpack_model.pt")
    # The same molecule for kiln's `md` example (which draws its own 300 K start).
    write(directory.parent / "benzene.extxyz", molecule("C6H6"), format="extxyz")
    print(f"wrote {directory} and {directory.parent / 'benzene.extxyz'}")


def calculator(kind, directory, threads):
    if kind == "kiln":
        from kiln.forcefield import Calculator

        return Calculator(directory)
    import schnetpack as spk
    import torch

    torch.set_num_threads(threads)
    return spk.interfaces.SpkCalculator(
        model_file=str(directory / "schnetpack_model.pt"),
        neighbor_list=spk.transform.ASENeighborList(cutoff=SEED_SIZE["cutoff"]),
        energy_key="energy",
        force_key="forces",
        energy_unit="eV",
        position_unit="Ang",
        device="cpu",
        dtype=torch.float32,
    )


def benzene(seed=0):
    atoms = molecule("C6H6")
    thermalize_momenta(atoms, temperature_K=300, rng=np.random.default_rng(seed))
    return atoms


def md(args):
    atoms = benzene()
    atoms.calc = calculator(args.calculator, args.model, args.threads)
    dyn = VelocityVerlet(atoms, timestep=0.5 * units.fs)
    first = atoms.get_potential_energy()
    start_total = first + atoms.get_kinetic_energy()
    start = time.perf_counter()
    dyn.run(args.steps)
    seconds = time.perf_counter() - start
    drift = atoms.get_potential_energy() + atoms.get_kinetic_energy() - start_total
    print(
        f"{args.calculator}: {args.steps} steps of benzene in {seconds:.2f} s "
        f"({args.steps / seconds:.0f} steps/s, {1e3 * seconds / args.steps:.2f} ms a step); "
        f"first energy {first:.6f} eV, drift {drift * 1e3:.3f} meV"
    )


def batch(args):
    from kiln.forcefield import Calculator

    calc = Calculator(args.model)
    rng = np.random.default_rng(1)
    structures = []
    for _ in range(64):
        atoms = molecule("C6H6")
        atoms.positions += rng.normal(scale=0.05, size=atoms.positions.shape)
        structures.append(atoms)
    singles, batches = [], []
    for _ in range(args.rounds):
        start = time.perf_counter()
        for atoms in structures:
            atoms.calc = calc
            calc.calculate(atoms, ["energy", "forces"])
        singles.append(time.perf_counter() - start)
        start = time.perf_counter()
        calc.calculate_batch(structures)
        batches.append(time.perf_counter() - start)
    single, together = statistics.median(singles), statistics.median(batches)
    print(
        f"kiln: 64 single calls {1e3 * single:.1f} ms, calculate_batch(64) {1e3 * together:.1f} ms "
        f"(median of {args.rounds}): batch / singles = {together / single:.2f}"
    )


def calls(args):
    from kiln.forcefield import Calculator, _arrays

    model = Calculator(args.model).model
    benzene_arrays, water = _arrays(molecule("C6H6")), _arrays(molecule("H2O"))
    cases = [("water", [water]), ("benzene", [benzene_arrays])]
    cases += [("2 benzenes", [benzene_arrays] * 2), ("8 benzenes", [benzene_arrays] * 8)]
    for name, structures in cases:
        model.predict(structures)
        start = time.perf_counter()
        for _ in range(args.rounds):
            model.predict(structures)
        per_call = (time.perf_counter() - start) / args.rounds
        print(f"kiln Potential.predict, {name}: {1e3 * per_call:.2f} ms a call")


def main():
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(dest="command", required=True)
    model = sub.add_parser("model", help="write the seed-size model (schnetpack's environment)")
    model.add_argument("directory", type=Path)
    run = sub.add_parser("md", help="VelocityVerlet on benzene")
    run.add_argument("--calculator", choices=["kiln", "schnetpack"], required=True)
    run.add_argument("--model", type=Path, required=True)
    run.add_argument("--steps", type=int, default=1000)
    run.add_argument("--threads", type=int, default=2)
    timed = sub.add_parser("batch", help="calculate_batch(64) against 64 single calls")
    timed.add_argument("--model", type=Path, required=True)
    timed.add_argument("--rounds", type=int, default=15)
    native = sub.add_parser("calls", help="the native model's cost per call, without ASE")
    native.add_argument("--model", type=Path, required=True)
    native.add_argument("--rounds", type=int, default=30)
    args = parser.parse_args()
    if args.command == "model":
        make_model(args.directory)
    elif args.command == "md":
        os.environ.setdefault("RAYON_NUM_THREADS", str(args.threads))
        md(args)
    elif args.command == "batch":
        batch(args)
    else:
        calls(args)


if __name__ == "__main__":
    main()
