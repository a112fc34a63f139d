//! # kiln-forcefield
//!
//! PaiNN (Schütt, Unke and Gastegger, ICML 2021) exactly as schnetpack 2.x implements it, loading
//! schnetpack's state dicts, with energies and forces for a batch of structures of any sizes in
//! one graph: per-structure neighbour lists concatenated with atom offsets (never one dense
//! N_total² matrix; brute force for molecules, an O(N) cell list for large and periodic systems),
//! one scatter-add of atomic energies into structures, forces (and stresses of periodic cells)
//! from one backward pass over the whole batch. Also: extxyz as ASE reads and writes it, and
//! velocity-Verlet NVE molecular dynamics ([`run_nve`]).
//!
//! ```no_run
//! use burn::backend::{Autodiff, Flex};
//! use kiln_forcefield::{Painn, Structure};
//!
//! let device = Default::default();
//! let model = Painn::<Autodiff<Flex>>::from_dir("painn_model/", &device)?;
//! let water = Structure::molecule(
//!     vec![8, 1, 1],
//!     vec![[0.0, 0.0, 0.12], [0.0, 0.76, -0.47], [0.0, -0.76, -0.47]],
//! );
//! let results = model.predict(&[water], &device)?;
//! println!("E = {} eV, F(O) = {:?} eV/Å", results.energies[0], results.forces[0]);
//! # Ok::<(), kiln_forcefield::ForceFieldError>(())
//! ```

mod atomref;
mod batch;
mod config;
mod dual;
mod elements;
mod extxyz;
mod host;
mod labels;
mod loss;
mod md;
mod neighbors;
mod painn;
mod structure;
#[cfg(feature = "train")]
mod train;

pub use atomref::fit_atomref;
pub use batch::Graph;
pub use config::{CutoffFn, PainnConfig, RadialBasisKind};
pub use elements::{atomic_mass, atomic_number};
pub use extxyz::{ExtxyzError, Frame, read_extxyz, write_extxyz};
pub use labels::{LabelKeys, Labels};
pub use loss::{COSINE_EPS, ForceLoss, LossWeights};
pub use md::{
    BOLTZMANN, Conservation, MAX_TEMPERATURE_K, MAX_TIMESTEP_FS, MdState, NveConfig,
    UNCONSERVED_MEV_PER_ATOM, VerletList, kinetic_energy, maxwell_boltzmann, run_nve,
};
pub use neighbors::{
    NeighborError, NeighborList, NeighborMethod, neighbor_list, neighbor_list_with,
};
pub use painn::{
    CLOSEST_PLAUSIBLE_DISTANCE, Doubt, IMPLAUSIBLE_EV_PER_ATOM, Painn, Predictions, Predictor,
};
pub use structure::Structure;
#[cfg(feature = "train")]
pub use train::{ForceBatch, LabelledStructures, Recipe};

/// Why a model or a structure cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum ForceFieldError {
    /// A config.json kiln cannot use.
    #[error("{0}")]
    Config(String),
    /// A checkpoint that cannot be found, read, loaded or saved (which tensors, which file).
    #[error(transparent)]
    Checkpoint(#[from] kiln_core::CheckpointError),
    /// A structure that cannot be evaluated (its position in the input and why); said 1-based.
    #[error("structure {}: {reason}", index + 1)]
    Structure {
        /// The structure's 0-based index in the input (messages show it 1-based).
        index: usize,
        /// What is wrong with it.
        reason: String,
    },
}
