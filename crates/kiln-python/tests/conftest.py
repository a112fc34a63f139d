"""Shared helpers: the repository's committed reference fixtures (written by PyTorch, schnetpack
and transformers through `cargo xtask fixtures`), read without those packages."""

import json
import struct
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[3]
FORCEFIELD = ROOT / "crates/kiln-forcefield/tests/fixtures"
VISION = ROOT / "crates/kiln-vision/tests/fixtures"
TEXT = ROOT / "crates/kiln-text/tests/fixtures"

_DTYPES = {"F64": np.float64, "F32": np.float32, "I64": np.int64, "U8": np.uint8}


def read_safetensors(path):
    """Every tensor of a safetensors file as a numpy array."""
    data = Path(path).read_bytes()
    (length,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + length])
    body = data[8 + length :]
    tensors = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        start, end = entry["data_offsets"]
        array = np.frombuffer(body[start:end], dtype=_DTYPES[entry["dtype"]])
        tensors[name] = array.reshape(entry["shape"])
    return tensors


def relative(ours, theirs):
    """max |ours − theirs| / max |theirs|, the measure of kiln-vision's parity tests."""
    ours, theirs = np.asarray(ours, np.float64), np.asarray(theirs, np.float64)
    return float(np.abs(ours - theirs).max() / np.abs(theirs).max())


@pytest.fixture(scope="session")
def structures():
    """The parity structures (molecules, periodic cells) with the exact float64 positions
    schnetpack was given (structures.safetensors; the extxyz file rounds them)."""
    from ase import Atoms

    arrays = read_safetensors(FORCEFIELD / "structures.safetensors")
    bounds = np.cumsum([0, *arrays["atoms"]])
    return [
        Atoms(
            numbers=arrays["numbers"][a:b],
            positions=arrays["positions"][a:b],
            cell=arrays["cells"][s],
            pbc=arrays["pbc"][s].astype(bool),
        )
        for s, (a, b) in enumerate(zip(bounds[:-1], bounds[1:]))
    ]
