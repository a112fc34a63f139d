"""schnetpack (PyTorch) throughput of PaiNN energies and forces, for docs/PERFORMANCE.md.

Same work as `cargo bench --bench forcefield`, which writes what this reads into
target/bench/painn/: the molecules (molecules.extxyz, 256 of 3-60 atoms) and the two models
(seed/ and tiny/, kiln's save format = a schnetpack state dict and its config.json). One call
is what a user's loop pays: ASE neighbour lists and batching (AtomsConverter), forward, forces by
autograd. Every call moves the atoms by a fresh jitter, as the Rust benchmark does. Prints, per
model and batch size, the median seconds per call, structures/s, atoms/s and µs per structure.

    /work/venvs/spk/bin/python scripts/bench/painn_torch.py --threads 2 [--runs 20] [--json out.json]
    python3 scripts/bench/painn_torch.py --device cuda    # on a GPU (then ASE's neighbour lists
                                                          # and the batching stay on the CPU)

Requirements: scripts/fixtures/requirements-schnetpack.txt (its own virtual environment).
"""

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import schnetpack as spk
import torch
from ase.io import read
from safetensors.torch import load_file

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "fixtures"))
from painn import build  # noqa: E402  (the fixtures' schnetpack model builder)

ROOT = Path("target/bench/painn")


def load(directory):
    config = json.loads((directory / "config.json").read_text())
    model = build(config)
    # strict: kiln's files hold exactly schnetpack's keys.
    model.load_state_dict(load_file(directory / "model.safetensors"), strict=True)
    return model.eval(), config["cutoff"]


def batch_sizes(largest):
    sizes, b = [], 1
    while b <= largest:
        sizes.append(b)
        b *= 2
    return sizes


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--runs", type=int, default=20, help="timed calls per batch size (at most)")
    parser.add_argument("--seconds", type=float, default=3.0, help="time budget per batch size")
    parser.add_argument("--models", default="seed,tiny")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--device", default="cpu", help="cpu or cuda[:N]")
    args = parser.parse_args()
    device = torch.device(args.device)
    torch.set_num_threads(args.threads)
    molecules = read(ROOT / "molecules.extxyz", index=":")
    rng = np.random.default_rng(0)
    results = []
    for name in args.models.split(","):
        model, cutoff = load(ROOT / name)
        model = model.to(device)
        convert = spk.interfaces.AtomsConverter(
            neighbor_list=spk.transform.ASENeighborList(cutoff=cutoff),
            dtype=torch.float32,
            device=device,
        )

        def call(batch):
            atoms = [a.copy() for a in molecules[:batch]]
            for a in atoms:
                a.positions += rng.uniform(-0.01, 0.01, size=a.positions.shape)
            outputs = model(convert(atoms))
            # Reading the results back to the host waits for the GPU.
            return outputs["energy"].detach().cpu().numpy(), outputs["forces"].detach().cpu().numpy()

        for batch in batch_sizes(len(molecules)):
            atoms = sum(len(a) for a in molecules[:batch])
            call(batch)  # warm-up
            samples, start = [], time.perf_counter()
            while len(samples) < args.runs and (time.perf_counter() - start < args.seconds or len(samples) < 3):
                t0 = time.perf_counter()
                call(batch)
                samples.append(time.perf_counter() - t0)
            median = statistics.median(samples)
            row = {
                "model": name,
                "device": str(device),
                "batch": batch,
                "atoms": atoms,
                "median_s": median,
                "structures_per_s": batch / median,
                "atoms_per_s": atoms / median,
                "us_per_structure": 1e6 * median / batch,
                "runs": len(samples),
            }
            results.append(row)
            print(
                f"{name:5} b={batch:<4} {median * 1e3:9.2f} ms  {batch / median:9.1f} structures/s"
                f"  {atoms / median:10.0f} atoms/s  {1e6 * median / batch:9.1f} µs/structure"
                f"  ({len(samples)} runs)",
                flush=True,
            )
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
