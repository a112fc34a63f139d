"""schnetpack (PyTorch) force-matching training steps, for docs/PERFORMANCE.md.

The same work as `cargo bench --bench forcefield`'s `painn-train/{seed,tiny}/b=16`, which writes
what this reads into target/bench/painn/: the batch (train_batch.extxyz: 16 molecules with
energy and force labels) and the students' initial weights (seed-train/, tiny-train/). One step
is what a training loop pays per batch: ASE neighbour lists and batching (AtomsConverter), the
forward pass, forces by autograd with `create_graph=True` (schnetpack's Forces module in train
mode), the loss 1·MSE(E) + 100·MSE(F) + 10·mean(1 − cos(F, F*)), the backward pass (double
backward through the forces), clipping at global norm 1.0 and an AdamW step (lr 1e-3, weight
decay 1e-5). Prints the median seconds per step and steps/s per model.

    /work/venvs/schnetpack/bin/python scripts/bench/painn_train_torch.py --threads 2 [--runs 20]

Requirements: scripts/fixtures/requirements-schnetpack.txt (its own virtual environment).
"""

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import schnetpack as spk
import torch
from ase.io import read
from safetensors.torch import load_file

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "fixtures"))
from painn import build  # noqa: E402  (the fixtures' schnetpack model builder)

ROOT = Path("target/bench/painn")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--runs", type=int, default=20, help="timed steps per model (at most)")
    parser.add_argument("--seconds", type=float, default=10.0, help="time budget per model")
    parser.add_argument("--models", default="seed,tiny")
    parser.add_argument("--device", default="cpu", help="cpu or cuda[:N]")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    device = torch.device(args.device)
    torch.set_num_threads(args.threads)
    batch = read(ROOT / "train_batch.extxyz", index=":")
    energy = torch.tensor([a.get_potential_energy() for a in batch], device=device)
    forces = torch.cat([torch.tensor(a.get_forces(), dtype=torch.float32) for a in batch]).to(device)
    results = []
    for name in args.models.split(","):
        directory = ROOT / f"{name}-train"
        config = json.loads((directory / "config.json").read_text())
        model = build(config)
        model.load_state_dict(load_file(directory / "model.safetensors"), strict=True)
        model = model.to(device).train()
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=1e-5)
        convert = spk.interfaces.AtomsConverter(
            neighbor_list=spk.transform.ASENeighborList(cutoff=config["cutoff"]),
            dtype=torch.float32,
            device=device,
        )

        def step():
            optimizer.zero_grad()
            outputs = model(convert(batch))
            predicted = outputs["forces"]
            cosine = torch.nn.functional.cosine_similarity(predicted, forces, dim=1, eps=1e-8)
            loss = (
                ((outputs["energy"] - energy) ** 2).mean()
                + 100.0 * ((predicted - forces) ** 2).mean()
                + 10.0 * (1.0 - cosine).mean()
            )
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            return loss.item()  # waits for the device

        step()  # warm-up
        samples, start = [], time.perf_counter()
        while len(samples) < args.runs and (time.perf_counter() - start < args.seconds or len(samples) < 3):
            t0 = time.perf_counter()
            step()
            samples.append(time.perf_counter() - t0)
        median = statistics.median(samples)
        results.append({"model": name, "device": str(device), "batch": len(batch), "median_s": median,
                        "steps_per_s": 1.0 / median, "runs": len(samples)})
        print(f"{name:5} b={len(batch)} {median * 1e3:9.2f} ms/step  {1.0 / median:7.2f} steps/s  ({len(samples)} runs)",
              flush=True)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
