"""The distillation report's numbers: a student's errors against the teacher on held-out
structures, and the teacher's time per structure on them.

    target/release/examples/forcefield --model RUN/model --input DATA/test.extxyz --output RUN/test.extxyz
    /work/venvs/xtb/bin/python scripts/distill/report.py --labels DATA/test.extxyz --predicted RUN/test.extxyz

Prints energy MAE per atom (eV/atom), force MAE and RMSE (eV/Å) over every component, and
GFN2-xTB's median milliseconds per structure over the same structures (tblite, the threads
OMP_NUM_THREADS allows).
"""

import argparse
import statistics
import time

import numpy as np
from ase.io import read
from tblite.ase import TBLite


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--labels", required=True)
    parser.add_argument("--predicted", required=True)
    parser.add_argument("--teacher-runs", type=int, default=100, help="structures timed")
    args = parser.parse_args()
    labelled = read(args.labels, index=":")
    predicted = read(args.predicted, index=":")
    assert len(labelled) == len(predicted)
    energy_errors = [
        abs(p.get_potential_energy() - l.get_potential_energy()) / len(l) for l, p in zip(labelled, predicted)
    ]
    force_errors = np.concatenate([(p.get_forces() - l.get_forces()).ravel() for l, p in zip(labelled, predicted)])
    print(f"structures: {len(labelled)} ({np.mean([len(a) for a in labelled]):.1f} atoms on average)")
    print(f"energy MAE: {1e3 * np.mean(energy_errors):.2f} meV/atom")
    print(f"force MAE: {1e3 * np.mean(np.abs(force_errors)):.1f} meV/Å")
    print(f"force RMSE: {1e3 * np.sqrt(np.mean(force_errors**2)):.1f} meV/Å")
    calculator = TBLite(method="GFN2-xTB", verbosity=0)
    seconds = []
    for atoms in labelled[: args.teacher_runs]:
        atoms = atoms.copy()
        atoms.calc = calculator
        start = time.perf_counter()
        atoms.get_forces()
        seconds.append(time.perf_counter() - start)
    print(f"teacher (GFN2-xTB, tblite): median {1e3 * statistics.median(seconds):.2f} ms per structure, "
          f"mean {1e3 * np.mean(seconds):.2f} ms over {len(seconds)} structures")


if __name__ == "__main__":
    main()
