//! One atomic structure: elements, positions, and for periodic systems the cell.

use crate::ForceFieldError;

/// Atoms and, for periodic systems, their cell. Positions in Å; `cell` rows are the lattice
/// vectors; `pbc` says along which of them the structure repeats.
#[derive(Debug, Clone, PartialEq)]
pub struct Structure {
    /// Atomic numbers.
    pub numbers: Vec<u32>,
    /// Cartesian positions, Å.
    pub positions: Vec<[f64; 3]>,
    /// Lattice vectors (rows), Å; ignored along non-periodic directions.
    pub cell: [[f64; 3]; 3],
    /// Periodicity along each lattice vector.
    pub pbc: [bool; 3],
}

impl Structure {
    /// An isolated molecule (no periodicity).
    pub fn molecule(numbers: Vec<u32>, positions: Vec<[f64; 3]>) -> Self {
        Structure {
            numbers,
            positions,
            cell: [[0.0; 3]; 3],
            pbc: [false; 3],
        }
    }

    /// A structure repeating along the lattice vectors `cell` where `pbc` says so.
    pub fn periodic(
        numbers: Vec<u32>,
        positions: Vec<[f64; 3]>,
        cell: [[f64; 3]; 3],
        pbc: [bool; 3],
    ) -> Self {
        Structure {
            numbers,
            positions,
            cell,
            pbc,
        }
    }

    /// Atoms in the structure.
    pub fn len(&self) -> usize {
        self.numbers.len()
    }

    /// Whether it has no atoms.
    pub fn is_empty(&self) -> bool {
        self.numbers.is_empty()
    }

    /// The cell's volume (Å³) when the structure is periodic along all three lattice vectors.
    pub fn volume(&self) -> Option<f64> {
        let [a, b, c] = self.cell;
        let triple = a[0] * (b[1] * c[2] - b[2] * c[1]) - a[1] * (b[0] * c[2] - b[2] * c[0])
            + a[2] * (b[0] * c[1] - b[1] * c[0]);
        self.pbc.iter().all(|&p| p).then_some(triple.abs())
    }

    /// Checks the structure can be evaluated by a model embedding elements below `max_z`;
    /// `index` names it in the error.
    pub fn validate(&self, index: usize, max_z: usize) -> Result<(), ForceFieldError> {
        let fail = |reason: String| Err(ForceFieldError::Structure { index, reason });
        if self.is_empty() {
            return fail("no atoms".into());
        }
        if self.numbers.len() != self.positions.len() {
            return fail(format!(
                "{} atomic numbers for {} positions",
                self.numbers.len(),
                self.positions.len()
            ));
        }
        if let Some((atom, z)) = self
            .numbers
            .iter()
            .enumerate()
            .find(|&(_, &z)| z == 0 || z as usize >= max_z)
        {
            return fail(format!(
                "atom {} has atomic number {z}: the model knows 1 to {}",
                atom + 1,
                max_z - 1
            ));
        }
        if let Some(atom) = self
            .positions
            .iter()
            .position(|p| p.iter().any(|x| !x.is_finite()))
        {
            return fail(format!("atom {} has a non-finite position", atom + 1));
        }
        let periodic_cell = (0..3)
            .filter(|&k| self.pbc[k])
            .map(|k| self.cell[k])
            .any(|v| v.iter().all(|&x| x == 0.0) || v.iter().any(|x| !x.is_finite()));
        if periodic_cell {
            return fail("periodic along a lattice vector that is zero or not finite".into());
        }
        Ok(())
    }
}
