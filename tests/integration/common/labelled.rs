//! Labelled force-field data for the examples' tests: rattled molecules labelled by
//! kiln-forcefield's committed schnetpack fixture model.

use std::path::{Path, PathBuf};

use kiln::burn::backend::{Autodiff, Flex};
use kiln::forcefield::{Frame, Painn, Structure, read_extxyz, write_extxyz};

/// A normal deviate from a seeded xorshift generator (Box–Muller), so the data need no crate.
pub struct Normal(u64);

impl Normal {
    fn uniform(&mut self) -> f64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        ((self.0 >> 11) as f64 + 0.5) / (1u64 << 53) as f64
    }

    fn sample(&mut self) -> f64 {
        let (u, v) = (self.uniform(), self.uniform());
        (-2.0 * u.ln()).sqrt() * (std::f64::consts::TAU * v).cos()
    }
}

/// `count` rattled copies (σ = 0.08 Å) of the fixture's water, methane and ethanol, labelled by
/// the teacher, written to `path`; returns the mean |F*| component (a force predictor of zeros
/// has this MAE).
pub fn labelled_set(path: &Path, count: usize, seed: u64) -> f64 {
    let fixtures = super::forcefield_fixtures();
    let molecules: Vec<Structure> =
        read_extxyz(&std::fs::read_to_string(fixtures.join("structures.extxyz")).unwrap())
            .unwrap()
            .into_iter()
            .take(3)
            .map(|f| f.structure)
            .collect();
    let mut normal = Normal(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
    let structures: Vec<Structure> = (0..count)
        .map(|k| {
            let mut s = molecules[k % 3].clone();
            for p in &mut s.positions {
                p.iter_mut().for_each(|x| *x += 0.08 * normal.sample());
            }
            s
        })
        .collect();
    let device = Default::default();
    let teacher =
        Painn::<Autodiff<Flex>>::from_dir(fixtures.join("painn_gaussian"), &device).unwrap();
    let labels = teacher.predict(&structures, &device).unwrap();
    let mut first = 0;
    let frames: Vec<Frame> = structures
        .into_iter()
        .enumerate()
        .map(|(s, structure)| {
            let atoms = first..first + structure.len();
            first += structure.len();
            let mut frame = Frame::new(structure);
            frame
                .info
                .insert("energy".into(), labels.energies[s].to_string());
            let forces = labels.forces[atoms].iter().flatten().copied().collect();
            frame.arrays.insert("forces".into(), (3, forces));
            frame
        })
        .collect();
    std::fs::write(path, write_extxyz(&frames)).unwrap();
    let components = labels.forces.iter().flatten();
    components.clone().map(|f| f.abs()).sum::<f64>() / components.count() as f64
}

/// A training and a validation set in a temporary directory.
pub struct Data {
    _dir: tempfile::TempDir,
    /// 48 labelled structures.
    pub train: PathBuf,
    /// 12 labelled structures.
    pub valid: PathBuf,
    /// The validation set's mean |F*| component.
    pub valid_force_scale: f64,
}

/// Labelled training and validation sets.
pub fn data() -> Data {
    let dir = tempfile::tempdir().unwrap();
    let (train, valid) = (
        dir.path().join("train.extxyz"),
        dir.path().join("valid.extxyz"),
    );
    labelled_set(&train, 48, 1);
    let valid_force_scale = labelled_set(&valid, 12, 2);
    Data {
        _dir: dir,
        train,
        valid,
        valid_force_scale,
    }
}
