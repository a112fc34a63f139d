//! What the force-field tests share: the committed fixtures (scripts/fixtures/painn.py).

use std::path::{Path, PathBuf};

use burn::backend::{Autodiff, Flex};
use kiln_core::Precision;
use kiln_forcefield::{Painn, Structure};
use safetensors::SafeTensors;

/// The backend the tests run on: Flex with gradients (forces).
pub type B = Autodiff<Flex>;

/// crates/kiln-forcefield/tests/fixtures.
pub fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures")
}

/// Tensor `key` of a fixture file as f64 values (integers converted).
pub fn read(file: &str, key: &str) -> Vec<f64> {
    let bytes = std::fs::read(fixtures().join(file)).unwrap();
    let tensors = SafeTensors::deserialize(&bytes).unwrap();
    let view = tensors.tensor(key).unwrap();
    let data = view.data();
    match view.dtype() {
        safetensors::Dtype::F64 => data
            .chunks_exact(8)
            .map(|b| f64::from_le_bytes(b.try_into().unwrap()))
            .collect(),
        safetensors::Dtype::I64 => data
            .chunks_exact(8)
            .map(|b| i64::from_le_bytes(b.try_into().unwrap()) as f64)
            .collect(),
        safetensors::Dtype::I32 => data
            .chunks_exact(4)
            .map(|b| f64::from(i32::from_le_bytes(b.try_into().unwrap())))
            .collect(),
        safetensors::Dtype::U8 => data.iter().map(|&b| f64::from(b)).collect(),
        other => panic!("{key}: {other:?}"),
    }
}

/// The names of the tensors in a fixture file.
pub fn names(file: &str) -> Vec<String> {
    let bytes = std::fs::read(fixtures().join(file)).unwrap();
    let tensors = SafeTensors::deserialize(&bytes).unwrap();
    tensors.names().into_iter().map(String::from).collect()
}

/// The fixture structures, in order (from structures.safetensors).
pub fn structures() -> Vec<Structure> {
    let (numbers, positions) = (
        read("structures.safetensors", "numbers"),
        read("structures.safetensors", "positions"),
    );
    let (cells, pbc) = (
        read("structures.safetensors", "cells"),
        read("structures.safetensors", "pbc"),
    );
    let mut first = 0;
    read("structures.safetensors", "atoms")
        .iter()
        .enumerate()
        .map(|(s, &n)| {
            let atoms = first..first + n as usize;
            first += n as usize;
            Structure::periodic(
                atoms.clone().map(|a| numbers[a] as u32).collect(),
                atoms
                    .map(|a| [positions[3 * a], positions[3 * a + 1], positions[3 * a + 2]])
                    .collect(),
                std::array::from_fn(|r| std::array::from_fn(|c| cells[9 * s + 3 * r + c])),
                std::array::from_fn(|k| pbc[3 * s + k] != 0.0),
            )
        })
        .collect()
}

/// A fixture model in f64.
pub fn model(name: &str) -> Painn<B> {
    Painn::<B>::from_dir(fixtures().join(name), &Default::default())
        .unwrap()
        .with_precision(Precision::F64)
}

/// max |ours − expected|.
pub fn worst(ours: &[f64], expected: &[f64]) -> f64 {
    assert_eq!(ours.len(), expected.len());
    ours.iter()
        .zip(expected)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0, f64::max)
}
