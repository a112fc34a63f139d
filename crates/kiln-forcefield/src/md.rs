//! Constant-energy (NVE) molecular dynamics with the velocity-Verlet integrator, in ASE's units:
//! Å, eV, amu, and time in `Å √(amu / eV)` (femtoseconds at the edges).

use burn::tensor::backend::AutodiffBackend;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use rand_distr::{Distribution, StandardNormal};

use crate::ForceFieldError;
use crate::elements::atomic_mass;
use crate::host::{Host, parts_for};
use crate::neighbors::{NeighborError, NeighborList, neighbor_list};
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
    /// The neighbour list's skin, Å: pairs within cutoff + skin are listed once and rebuilt
    /// only when an atom has moved more than half of it ([`VerletList`]); 0 rebuilds every
    /// step.
    pub skin: f64,
}

impl Default for NveConfig {
    /// 0.5 fs steps, 1000 of them, 300 K, seed 0, a report every 10 steps, a 1 Å skin.
    fn default() -> Self {
        NveConfig {
            timestep_fs: 0.5,
            steps: 1000,
            temperature_k: 300.0,
            seed: 0,
            every: 10,
            skin: 1.0,
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

/// The longest time step [`run_nve`] takes, fs: ten periods of the fastest molecular vibration
/// (O–H stretch, about 9 fs). Usual steps are 0.5–2 fs; much beyond that atoms jump past one
/// another and the trajectory means nothing.
pub const MAX_TIMESTEP_FS: f64 = 100.0;

/// The highest temperature [`run_nve`] draws initial velocities for, K: far above where any
/// molecule holds together, so far beyond what a force field describes.
pub const MAX_TEMPERATURE_K: f64 = 1e5;

/// The total energy's largest deviation over a run, meV/atom, beyond which
/// [`Conservation::doubt`] says energy was not conserved: about the thermal kinetic energy per
/// atom at room temperature (39 meV).
pub const UNCONSERVED_MEV_PER_ATOM: f64 = 50.0;

impl NveConfig {
    /// Refuses settings outside their domains: a time step in (0, [`MAX_TIMESTEP_FS`]], a
    /// temperature in [0, [`MAX_TEMPERATURE_K`]], a finite skin ≥ 0.
    pub fn validate(&self) -> Result<(), ForceFieldError> {
        // 1e300 as written, not as three hundred digits.
        let said = |x: f64| {
            if x.abs() < 1e6 {
                x.to_string()
            } else {
                format!("{x:e}")
            }
        };
        if !(self.timestep_fs > 0.0 && self.timestep_fs <= MAX_TIMESTEP_FS) {
            return Err(ForceFieldError::Config(format!(
                "timestep {} fs: must be > 0 and at most {MAX_TIMESTEP_FS} fs",
                said(self.timestep_fs)
            )));
        }
        if !(0.0..=MAX_TEMPERATURE_K).contains(&self.temperature_k) {
            return Err(ForceFieldError::Config(format!(
                "temperature {} K: must be ≥ 0 and at most {MAX_TEMPERATURE_K} K",
                said(self.temperature_k)
            )));
        }
        if !(self.skin >= 0.0 && self.skin.is_finite()) {
            return Err(ForceFieldError::Config(format!(
                "skin {} Å: must be a finite number ≥ 0",
                self.skin
            )));
        }
        Ok(())
    }
}

/// How well a run conserved energy.
#[derive(Debug, Clone, PartialEq)]
pub struct Conservation {
    /// Slope of the least-squares line through the reported total energies, meV/atom/ps.
    pub drift_mev_per_atom_ps: f64,
    /// Largest distance of a reported total energy from the first, meV/atom.
    pub max_deviation_mev_per_atom: f64,
    /// Times the neighbour list was built (on CPU backends; see [`VerletList`]).
    pub neighbor_builds: usize,
}

impl Conservation {
    /// Why the run's trajectory should not be trusted: its total energy moved by more than
    /// [`UNCONSERVED_MEV_PER_ATOM`] (a time step too long for the motion, or a rough model);
    /// `None` when energy was conserved.
    pub fn doubt(&self) -> Option<String> {
        let deviation = self.max_deviation_mev_per_atom;
        (deviation.is_nan() || deviation > UNCONSERVED_MEV_PER_ATOM).then(|| {
            format!(
                "energy was not conserved: the total energy moved by up to {deviation:.1} \
                 meV/atom (more than {UNCONSERVED_MEV_PER_ATOM} meV/atom); shorten the time \
                 step (0.5–2 fs is usual) or check the model"
            )
        })
    }
}

/// A Verlet neighbour list, as ASE and LAMMPS keep one: the pairs within `cutoff + skin`, built
/// once and filtered every step down to those within the cutoff; built again only when some
/// atom has moved more than half the skin since (then no pair can have come from beyond the
/// skin). Pairs are kept in sorted order, so the filtered list is exactly the pairs, in the
/// order, of a list built afresh each step: the forces and the trajectory are bit for bit the
/// same.
#[derive(Debug, Clone)]
pub struct VerletList {
    cutoff: f64,
    skin: f64,
    candidates: NeighborList,
    built_at: Vec<[f64; 3]>,
    builds: usize,
}

impl VerletList {
    /// An empty list for `cutoff` and `skin` (Å); the first [`pairs`](Self::pairs) builds it.
    pub fn new(cutoff: f64, skin: f64) -> Self {
        VerletList {
            cutoff,
            skin: skin.max(0.0),
            candidates: NeighborList::default(),
            built_at: Vec::new(),
            builds: 0,
        }
    }

    /// The pairs of `structure` within the cutoff, sorted by centre, neighbour and shift.
    pub fn pairs(&mut self, structure: &Structure) -> Result<NeighborList, NeighborError> {
        let limit = 0.25 * self.skin * self.skin; // (skin / 2)²
        let moved = self.built_at.len() != structure.len()
            || self.skin == 0.0
            || structure
                .positions
                .iter()
                .zip(&self.built_at)
                .any(|(r, r0)| (0..3).map(|a| (r[a] - r0[a]).powi(2)).sum::<f64>() > limit);
        if moved {
            self.candidates = sorted(neighbor_list(structure, self.cutoff + self.skin)?);
            self.built_at = structure.positions.clone();
            self.builds += 1;
        }
        let mut pairs = NeighborList::default();
        let c2 = self.cutoff * self.cutoff;
        for p in 0..self.candidates.len() {
            let (i, j) = (self.candidates.i[p] as usize, self.candidates.j[p] as usize);
            let shift = self.candidates.shift(p, &structure.cell);
            let d2: f64 = (0..3)
                .map(|a| (structure.positions[j][a] - structure.positions[i][a] + shift[a]).powi(2))
                .sum();
            if d2 < c2 {
                pairs.i.push(self.candidates.i[p]);
                pairs.j.push(self.candidates.j[p]);
                pairs.cell_shifts.push(self.candidates.cell_shifts[p]);
            }
        }
        Ok(pairs)
    }

    /// Times the list was built.
    pub fn builds(&self) -> usize {
        self.builds
    }
}

/// `list` ordered by centre, neighbour and shift.
fn sorted(list: NeighborList) -> NeighborList {
    let mut pairs: Vec<(u32, u32, [i32; 3])> = (0..list.len())
        .map(|p| (list.i[p], list.j[p], list.cell_shifts[p]))
        .collect();
    pairs.sort_unstable();
    NeighborList {
        i: pairs.iter().map(|p| p.0).collect(),
        j: pairs.iter().map(|p| p.1).collect(),
        cell_shifts: pairs.iter().map(|p| p.2).collect(),
    }
}

/// How a trajectory's forces are computed: on CPU backends the fused host kernel over a Verlet
/// list, weights read once; elsewhere [`Painn::predict`] (a neighbour list per step).
enum Forces<'m, B: AutodiffBackend> {
    Host(Host, VerletList),
    Device(&'m Painn<B>, B::Device),
}

impl<'m, B: AutodiffBackend> Forces<'m, B> {
    fn new(model: &'m Painn<B>, skin: f64, device: &B::Device) -> Self {
        match Host::for_model(model, device) {
            Some(host) => Forces::Host(host, VerletList::new(model.config().cutoff, skin)),
            None => Forces::Device(model, device.clone()),
        }
    }

    /// The potential energy and forces of `s`.
    fn evaluate(&mut self, s: &Structure) -> Result<(f64, Vec<[f64; 3]>), ForceFieldError> {
        match self {
            Forces::Host(host, list) => {
                let list = list.pairs(s).map_err(|e| e.in_structure(0))?;
                let evaluated = host.evaluate(s, &list, parts_for(s.len()));
                Ok((evaluated.energy, evaluated.forces))
            }
            Forces::Device(model, device) => {
                let mut predictions = model.predict(std::slice::from_ref(s), device)?;
                Ok((
                    predictions.energies[0],
                    std::mem::take(&mut predictions.forces),
                ))
            }
        }
    }

    fn builds(&self) -> usize {
        match self {
            Forces::Host(_, list) => list.builds(),
            Forces::Device(..) => 0,
        }
    }
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
/// starting from Maxwell–Boltzmann velocities. On CPU backends the forces come from the fused
/// host kernel over a [`VerletList`], the weights read once. `observe` sees step 0, every `every`-th step and
/// the last; the return value measures energy conservation over those.
pub fn run_nve<B: AutodiffBackend>(
    model: &Painn<B>,
    structure: &Structure,
    config: &NveConfig,
    device: &B::Device,
    mut observe: impl FnMut(&MdState),
) -> Result<Conservation, ForceFieldError> {
    let fail = |reason: String| ForceFieldError::Structure { index: 0, reason };
    config.validate()?;
    structure.validate(0, model.config().max_z)?;
    let masses: Vec<f64> = structure
        .numbers
        .iter()
        .map(|&z| atomic_mass(z).ok_or_else(|| fail(format!("no mass for element {z}"))))
        .collect::<Result<_, _>>()?;
    model.warn_unseen_elements(std::slice::from_ref(structure));
    let mut forces = Forces::new(model, config.skin, device);
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
    // A NaN or infinite energy, force, position or velocity ends the run where it appears,
    // before it spreads into every frame of the trajectory.
    let finite = |step: usize, (potential, forces): (f64, Vec<[f64; 3]>)| {
        if potential.is_finite() && forces.iter().flatten().all(|f| f.is_finite()) {
            return Ok((potential, forces));
        }
        Err(fail(format!(
            "at step {step}: the model gives a non-finite energy or force (energy {potential} \
             eV): atoms closer than it can describe, or a time step too long for the motion"
        )))
    };
    let moving = |step: usize, state: &MdState| {
        let values = state.structure.positions.iter().chain(&state.velocities);
        if values.flatten().all(|x| x.is_finite()) {
            return Ok(());
        }
        Err(fail(format!(
            "at step {step}: positions or velocities became non-finite: the forces are too \
             large for a time step of {dt} fs"
        )))
    };
    (state.potential, state.forces) = finite(0, forces.evaluate(&state.structure)?)?;
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
        moving(step, &state)?;
        let evaluated = forces
            .evaluate(&state.structure)
            .map_err(|e| fail(format!("at step {step}: {e}")))?;
        (state.potential, state.forces) = finite(step, evaluated)?;
        kick(&mut state.velocities, &state.forces);
        moving(step, &state)?;
        state.step = step;
        state.time_fs = step as f64 * dt;
        if step % every == 0 || step == config.steps {
            state.kinetic = kinetic_energy(&masses, &state.velocities);
            observe(&state);
            reports.push((state.time_fs, state.total()));
        }
    }
    Ok(conservation(&reports, structure.len(), forces.builds()))
}

/// Drift and largest deviation of total energies `(time fs, energy eV)` of `atoms` atoms.
fn conservation(reports: &[(f64, f64)], atoms: usize, neighbor_builds: usize) -> Conservation {
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
        neighbor_builds,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Atoms random-walking through a periodic box (and a molecule-like open cluster): at every
    /// step the Verlet list gives exactly a fresh list's pairs, sorted, while building itself
    /// far less often; pairs cross the cutoff in both directions all along.
    #[test]
    fn a_verlet_list_gives_a_fresh_lists_pairs_at_every_step() {
        let mut rng = ChaCha8Rng::seed_from_u64(5);
        let mut normal = || -> f64 { StandardNormal.sample(&mut rng) };
        for periodic in [true, false] {
            let side = 9.0;
            let positions: Vec<[f64; 3]> = (0..40)
                .map(|k| {
                    let g = [k % 4, (k / 4) % 4, k / 16].map(|c| c as f64 * side / 4.0);
                    std::array::from_fn(|a| g[a] + 0.3 * normal())
                })
                .collect();
            let cell = [[side, 0.0, 0.0], [0.0, side, 0.0], [0.0, 0.0, side]];
            let mut structure = Structure::periodic(vec![1; 40], positions, cell, [periodic; 3]);
            let (cutoff, steps) = (3.0, 400);
            let mut list = VerletList::new(cutoff, 0.6);
            let mut changes = 0;
            let mut previous = NeighborList::default();
            for _ in 0..steps {
                for r in &mut structure.positions {
                    r.iter_mut().for_each(|x| *x += 0.02 * normal());
                }
                let pairs = list.pairs(&structure).unwrap();
                assert_eq!(pairs, sorted(neighbor_list(&structure, cutoff).unwrap()));
                changes += usize::from(pairs != previous);
                previous = pairs;
            }
            assert!(changes > steps / 4, "pairs changed at only {changes} steps");
            assert!(
                (2..steps / 5).contains(&list.builds()),
                "{} builds in {steps} steps",
                list.builds()
            );
        }
    }
}
