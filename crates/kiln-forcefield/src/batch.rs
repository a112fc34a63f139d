//! A batch of structures as one graph: atoms concatenated, each structure's neighbour pairs
//! offset by the atoms before it, and the structure every atom belongs to (for the scatter-add
//! of atomic energies). No structure sees another: pairs never cross structures.
//!
//! Every index is a [`RowIndex`]: messages gathered from neighbours and summed into centres
//! (and atoms into structures) take kiln's segment-sum kernel on burn's GPU backends.

use burn::tensor::backend::Backend;
use burn::tensor::{DType, Int, Tensor, TensorData};
use kiln_kernels::RowIndex;

use crate::neighbors::neighbor_list;
use crate::structure::Structure;
use crate::{ForceFieldError, PainnConfig};

/// Structures batched into one graph on a device.
#[derive(Debug, Clone)]
pub struct Graph<B: Backend> {
    /// Atomic numbers `[N]`.
    pub numbers: Tensor<B, 1, Int>,
    /// Positions `[N, 3]`, Å.
    pub positions: Tensor<B, 2>,
    /// Centre atom of every pair `[P]`, into the atoms.
    pub idx_i: RowIndex<B>,
    /// Neighbour atom of every pair `[P]`, into the atoms.
    pub idx_j: RowIndex<B>,
    /// Cartesian lattice shift of every pair's neighbour `[P, 3]`, Å.
    pub shifts: Tensor<B, 2>,
    /// Structure of every atom `[N]`, into the structures.
    pub structure: RowIndex<B>,
    /// Structure of every pair `[P]` (its centre's), into the structures.
    pub pair_structure: RowIndex<B>,
    /// Atoms in each structure.
    pub atoms: Vec<usize>,
    /// Cell volume (Å³) of each structure periodic along all three lattice vectors.
    pub volumes: Vec<Option<f64>>,
    /// Each structure's shortest distance between atoms within the cutoff, Å (infinite
    /// without pairs).
    pub closest: Vec<f64>,
}

impl<B: Backend> Graph<B> {
    /// The graph of `structures` for a model of `config` (its cutoff, the elements it embeds),
    /// floats in `dtype`. The first structure that cannot be evaluated is an error naming it,
    /// one whose neighbour pairs the device has no memory for included
    /// ([`PainnConfig::check_pairs`]).
    pub fn new(
        structures: &[Structure],
        config: &PainnConfig,
        device: &B::Device,
        dtype: DType,
    ) -> Result<Self, ForceFieldError> {
        let available = kiln_core::free_memory::<B>(device);
        let (mut numbers, mut positions, mut structure) = (Vec::new(), Vec::new(), Vec::new());
        let (mut idx_i, mut idx_j, mut shifts) = (Vec::new(), Vec::new(), Vec::new());
        let mut atoms = Vec::with_capacity(structures.len());
        let mut volumes = Vec::with_capacity(structures.len());
        let mut closest = Vec::with_capacity(structures.len());
        for (index, s) in structures.iter().enumerate() {
            s.validate(index, config.max_z)?;
            let list = neighbor_list(s, config.cutoff).map_err(|e| e.in_structure(index))?;
            config.check_pairs(index, list.len(), dtype.size(), available)?;
            let offset = numbers.len() as i64;
            idx_i.extend(list.i.iter().map(|&i| i64::from(i) + offset));
            idx_j.extend(list.j.iter().map(|&j| i64::from(j) + offset));
            shifts.extend((0..list.len()).flat_map(|p| list.shift(p, &s.cell)));
            numbers.extend(s.numbers.iter().map(|&z| i64::from(z)));
            positions.extend(s.positions.iter().flatten());
            structure.extend(std::iter::repeat_n(index as i64, s.len()));
            atoms.push(s.len());
            volumes.push(s.volume());
            closest.push(list.closest(s));
        }
        let ints = |values: Vec<i64>| {
            let n = values.len();
            Tensor::<B, 1, Int>::from_data(TensorData::new(values, [n]), device)
        };
        // Every entry names a row that exists: the neighbour list's atoms are the structure's.
        let index = |values: &[i64], rows: usize| {
            RowIndex::new(values, rows, device).expect("indices within the batch")
        };
        let pair_structure: Vec<i64> = idx_i.iter().map(|&i| structure[i as usize]).collect();
        let floats = |values: Vec<f64>| {
            let rows = values.len() / 3;
            Tensor::<B, 2>::from_data(TensorData::new(values, [rows, 3]), (device, dtype))
        };
        Ok(Graph {
            idx_i: index(&idx_i, numbers.len()),
            idx_j: index(&idx_j, numbers.len()),
            structure: index(&structure, structures.len()),
            pair_structure: index(&pair_structure, structures.len()),
            numbers: ints(numbers),
            positions: floats(positions),
            shifts: floats(shifts),
            atoms,
            volumes,
            closest,
        })
    }
}
