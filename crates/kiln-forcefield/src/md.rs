//! Constant-energy (NVE) molecular dynamics with the velocity-Verlet integrator, in ASE's units:
//! Å, eV, amu, and time in `Å √(amu / eV)` (femtoseconds at the edges).

use burn::tensor::backend::AutodiffBackend;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use rand_distr::{Distribution, StandardNormal};

use crate::ForceFieldError;
use crate::elements::atomic_mass;
use crate::painn::Painn;
use crate::structure::Structure;

/// One femtosecond in ASE's time unit `Å √(amu / eV)`.
const FEMTOSECOND: f64 = 0.098_226_947_884_640_63;

/// Boltzmann's constant in eV/K (CODATA 2014, as ASE).
pub const BOLTZMANN: f64 = 8.617_330_337_217_213e-5;

/// An NVE run: integration step, length, and the initial velocities' temperature and seed.
#[derive(Debug, Clone, PartialEq)]
pub struct NveConfig {
    /// Integration step, fs.
    pub timestep_fs: f64,
    /// Steps to integrate.
    pub steps: usize,
    /// Temperature of the Maxwell–Boltzmann draw of initial velocities, K.
    pub temperature_k: f64,
    /// Seed of that draw.
    pub seed: u64,
    /// Report (and hand to the observer) every this many steps; step 0 and the last always.
    pub every: usize,
}

impl Default for NveConfig {
    /// 0.5 fs steps, 1000 of them, 300 K, seed 0, a report every 10 steps.
    fn default() -> Self {
        NveConfig {
            timestep_fs: 0.5,
            steps: 1000,
            temperature_k: 300.0,
            seed: 0,
            every: 10,
        }
    }
}

/// The state of a trajectory at one reported step.
#[derive(Debug, Clone, PartialEq)]
pub struct MdState {
    /// Steps taken.
    pub step: usize,
    /// Simulated time, fs.
    pub time_fs: f64,
    /// The structure at this step.
    pub structure: Structure,
    /// Velocities, Å/fs.
    pub velocities: Vec<[f64; 3]>,
    /// Forces, eV/Å.
    pub forces: Vec<[f64; 3]>,
    /// Potential energy, eV.
    pub potential: f64,
    /// Kinetic energy, eV.
    pub kinetic: f64,
}

impl MdState {
    /// Potential plus kinetic energy, eV.
    pub fn total(&self) -> f64 {
        self.potential + self.kinetic
    }

    /// The instantaneous temperature `2 K / (3 N k_B)`, K.
    pub fn temperature_k(&self) -> f64 {
        2.0 * self.kinetic / (3.0 * self.structure.len() as f64 * BOLTZMANN)
    }
}

/// How well a run conserved energy.
#[derive(Debug, Clone, PartialEq)]
pub struct Conservation {
    /// Slope of the least-squares line through the reported total energies, meV/atom/ps.
    pub drift_mev_per_atom_ps: f64,
    /// Largest distance of a reported total energy from the first, meV/atom.
    pub max_deviation_mev_per_atom: f64,
}

/// Velocities (Å/fs) for `masses` (amu) drawn from the Maxwell–Boltzmann distribution at
/// `temperature_k`, seeded, with the centre-of-mass momentum removed.
pub fn maxwell_boltzmann(masses: &[f64], temperature_k: f64, seed: u64) -> Vec<[f64; 3]> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut velocities: Vec<[f64; 3]> = masses
        .iter()
        .map(|&m| {
            let sigma = (BOLTZMANN * temperature_k / m).sqrt() * FEMTOSECOND;
            std::array::from_fn(|_| {
                let z: f64 = StandardNormal.sample(&mut rng);
                sigma * z
            })
        })
        .collect();
    let total: f64 = masses.iter().sum();
    let drift: [f64; 3] = std::array::from_fn(|x| {
        masses
            .iter()
            .zip(&velocities)
            .map(|(m, v)| m * v[x])
            .sum::<f64>()
            / total
    });
    for v in &mut velocities {
        *v = std::array::from_fn(|x| v[x] - drift[x]);
    }
    velocities
}

/// Kinetic energy (eV) of `velocities` (Å/fs) for `masses` (amu).
pub fn kinetic_energy(masses: &[f64], velocities: &[[f64; 3]]) -> f64 {
    masses
        .iter()
        .zip(velocities)
        .map(|(m, v)| {
            let v2 = (v[0] * v[0] + v[1] * v[1] + v[2] * v[2]) / (FEMTOSECOND * FEMTOSECOND);
            0.5 * m * v2
        })
        .sum()
}

/// Integrates `structure` under `model` at constant energy with velocity Verlet
/// (`v += F/m · dt/2; x += v dt; F = F(x); v += F/m · dt/2`), one force evaluation per step,
/// starting from Maxwell–Boltzmann velocities. `observe` sees step 0, every `every`-th step and
/// the last; the return value measures energy conservation over those.
pub fn run_nve<B: AutodiffBackend>(
    model: &Painn<B>,
    structure: &Structure,
    config: &NveConfig,
    device: &B::Device,
    mut observe: impl FnMut(&MdState),
) -> Result<Conservation, ForceFieldError> {
    let fail = |reason: String| ForceFieldError::Structure { index: 0, reason };
    structure.validate(0, model.config().max_z)?;
    if !(config.timestep_fs > 0.0 && config.timestep_fs.is_finite()) {
        return Err(fail(format!(
            "timestep {} fs: must be positive",
            config.timestep_fs
        )));
    }
    let masses: Vec<f64> = structure
        .numbers
        .iter()
        .map(|&z| atomic_mass(z).ok_or_else(|| fail(format!("no mass for element {z}"))))
        .collect::<Result<_, _>>()?;
    let evaluate = |s: &Structure| -> Result<(f64, Vec<[f64; 3]>), ForceFieldError> {
        let mut predictions = model.predict(std::slice::from_ref(s), device)?;
        Ok((
            predictions.energies[0],
            std::mem::take(&mut predictions.forces),
        ))
    };
    let dt = config.timestep_fs;
    // Å/fs per (eV/Å / amu · fs).
    let acceleration = FEMTOSECOND * FEMTOSECOND;
    let mut state = MdState {
        step: 0,
        time_fs: 0.0,
        structure: structure.clone(),
        velocities: maxwell_boltzmann(&masses, config.temperature_k, config.seed),
        forces: Vec::new(),
        potential: 0.0,
        kinetic: 0.0,
    };
    (state.potential, state.forces) = evaluate(&state.structure)?;
    state.kinetic = kinetic_energy(&masses, &state.velocities);
    observe(&state);
    let mut reports = vec![(0.0, state.total())];
    let every = config.every.max(1);
    for step in 1..=config.steps {
        let kick = |velocities: &mut [[f64; 3]], forces: &[[f64; 3]]| {
            for ((v, f), m) in velocities.iter_mut().zip(forces).zip(&masses) {
                *v = std::array::from_fn(|x| v[x] + 0.5 * dt * acceleration * f[x] / m);
            }
        };
        kick(&mut state.velocities, &state.forces);
        for (r, v) in state.structure.positions.iter_mut().zip(&state.velocities) {
            *r = std::array::from_fn(|x| r[x] + dt * v[x]);
        }
        (state.potential, state.forces) =
            evaluate(&state.structure).map_err(|e| fail(format!("at step {step}: {e}")))?;
        kick(&mut state.velocities, &state.forces);
        state.step = step;
        state.time_fs = step as f64 * dt;
        if step % every == 0 || step == config.steps {
            state.kinetic = kinetic_energy(&masses, &state.velocities);
            observe(&state);
            reports.push((state.time_fs, state.total()));
        }
    }
    Ok(conservation(&reports, structure.len()))
}

/// Drift and largest deviation of total energies `(time fs, energy eV)` of `atoms` atoms.
fn conservation(reports: &[(f64, f64)], atoms: usize) -> Conservation {
    let n = reports.len() as f64;
    let (mean_t, mean_e) = reports
        .iter()
        .fold((0.0, 0.0), |(t, e), &(ti, ei)| (t + ti / n, e + ei / n));
    let (covariance, variance) = reports.iter().fold((0.0, 0.0), |(c, v), &(t, e)| {
        (
            c + (t - mean_t) * (e - mean_e),
            v + (t - mean_t) * (t - mean_t),
        )
    });
    let slope = if variance > 0.0 {
        covariance / variance
    } else {
        0.0
    };
    let first = reports[0].1;
    let deviation = reports
        .iter()
        .map(|&(_, e)| (e - first).abs())
        .fold(0.0, f64::max);
    let per_atom_mev = 1e3 / atoms as f64;
    Conservation {
        // eV/fs → meV/ps.
        drift_mev_per_atom_ps: slope * 1e3 * per_atom_mev,
        max_deviation_mev_per_atom: deviation * per_atom_mev,
    }
}
