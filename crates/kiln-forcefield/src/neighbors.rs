//! Neighbour lists: every ordered pair of atoms closer than the cutoff, with the lattice shift
//! that brings the second atom next to the first in periodic directions (an atom may neighbour
//! its own images when the cell is shorter than twice the cutoff).

use crate::structure::Structure;

/// Atoms closer than a cutoff are too close to be physical below this distance (Å).
const OVERLAP: f64 = 1e-2;

/// The neighbour pairs of one structure: atom `j[p]` (shifted by the Cartesian lattice vector
/// `shifts[p]`) is within the cutoff of atom `i[p]`; both orders of every pair are listed.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct NeighborList {
    /// Centre atoms.
    pub i: Vec<u32>,
    /// Neighbour atoms.
    pub j: Vec<u32>,
    /// Cartesian shift of the neighbour's image, Å.
    pub shifts: Vec<[f64; 3]>,
}

/// The neighbour list of `structure` for `cutoff` (Å): every atom against every image of every
/// atom within reach, O(N² × images), the right choice for molecules and small cells. Overlapping
/// atoms (closer than 0.01 Å) are an error naming them.
pub fn neighbor_list(structure: &Structure, cutoff: f64) -> Result<NeighborList, String> {
    let positions = &structure.positions;
    let shifts = image_shifts(structure, cutoff);
    let mut list = NeighborList::default();
    let cutoff2 = cutoff * cutoff;
    for (i, ri) in positions.iter().enumerate() {
        for (j, rj) in positions.iter().enumerate() {
            for shift in &shifts {
                let d = [
                    rj[0] + shift[0] - ri[0],
                    rj[1] + shift[1] - ri[1],
                    rj[2] + shift[2] - ri[2],
                ];
                let d2 = d[0] * d[0] + d[1] * d[1] + d[2] * d[2];
                if d2 >= cutoff2 {
                    continue;
                }
                if d2 < OVERLAP * OVERLAP {
                    if i == j && shift.iter().all(|&s| s == 0.0) {
                        continue;
                    }
                    return Err(format!(
                        "atoms {i} and {j} overlap ({:.1e} Å apart)",
                        d2.sqrt()
                    ));
                }
                list.i.push(i as u32);
                list.j.push(j as u32);
                list.shifts.push(*shift);
            }
        }
    }
    Ok(list)
}

/// The Cartesian lattice shifts to try: along each periodic lattice vector, enough images to
/// cover the cutoff from anywhere in the span of the atoms' fractional coordinates.
fn image_shifts(structure: &Structure, cutoff: f64) -> Vec<[f64; 3]> {
    let cell = structure.cell;
    let reciprocal = inverse_transpose(cell);
    let mut range = [0i64; 3];
    for k in 0..3 {
        if !structure.pbc[k] {
            continue;
        }
        let b = reciprocal[k];
        let norm = (b[0] * b[0] + b[1] * b[1] + b[2] * b[2]).sqrt();
        let fractions = structure
            .positions
            .iter()
            .map(|r| r[0] * b[0] + r[1] * b[1] + r[2] * b[2]);
        let (lo, hi) = fractions.fold((f64::MAX, f64::MIN), |(l, h), f| (l.min(f), h.max(f)));
        // Plane spacing 1 / |b_k|: cutoff · |b_k| cells, plus the atoms' own spread.
        range[k] = (cutoff * norm + (hi - lo)).ceil() as i64;
    }
    let mut shifts = Vec::new();
    for a in -range[0]..=range[0] {
        for b in -range[1]..=range[1] {
            for c in -range[2]..=range[2] {
                let n = [a as f64, b as f64, c as f64];
                shifts.push(std::array::from_fn(|x| {
                    n[0] * cell[0][x] + n[1] * cell[1][x] + n[2] * cell[2][x]
                }));
            }
        }
    }
    shifts
}

/// `(A⁻¹)ᵀ` of the lattice `A` (rows = lattice vectors): its rows are the reciprocal vectors
/// (without 2π), `a_k · b_l = δ_kl`. A singular cell (a molecule's zero cell) gives zeros, which
/// only non-periodic directions use.
fn inverse_transpose(a: [[f64; 3]; 3]) -> [[f64; 3]; 3] {
    let cross = |u: [f64; 3], v: [f64; 3]| {
        [
            u[1] * v[2] - u[2] * v[1],
            u[2] * v[0] - u[0] * v[2],
            u[0] * v[1] - u[1] * v[0],
        ]
    };
    let volume = {
        let c = cross(a[1], a[2]);
        a[0][0] * c[0] + a[0][1] * c[1] + a[0][2] * c[2]
    };
    if volume == 0.0 {
        return [[0.0; 3]; 3];
    }
    [cross(a[1], a[2]), cross(a[2], a[0]), cross(a[0], a[1])].map(|row| row.map(|x| x / volume))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_small_cell_neighbours_its_own_images() {
        // One atom in a 2 Å cubic cell, cutoff 2.5 Å: its 6 face images at 2 Å (the edge images
        // are 2.83 Å away); as a slab periodic in x and y only, 4.
        let cell = [[2.0, 0.0, 0.0], [0.0, 2.0, 0.0], [0.0, 0.0, 2.0]];
        let atom = Structure::periodic(vec![14], vec![[0.3, 0.2, 0.1]], cell, [true; 3]);
        let list = neighbor_list(&atom, 2.5).unwrap();
        assert_eq!(list.i.len(), 6);
        let slab = Structure::periodic(vec![14], vec![[0.3, 0.2, 0.1]], cell, [true, true, false]);
        assert_eq!(neighbor_list(&slab, 2.5).unwrap().i.len(), 4);
    }

    #[test]
    fn pairs_come_in_both_orders_and_overlaps_are_errors() {
        let molecule = Structure::molecule(
            vec![1, 1, 8],
            vec![[0.0; 3], [0.0, 0.0, 0.74], [9.0, 0.0, 0.0]],
        );
        let list = neighbor_list(&molecule, 2.0).unwrap();
        assert_eq!((list.i.clone(), list.j.clone()), (vec![0, 1], vec![1, 0]));
        let overlapping = Structure::molecule(vec![1, 1], vec![[0.0; 3], [0.0, 0.0, 0.001]]);
        let err = neighbor_list(&overlapping, 2.0).unwrap_err();
        assert!(err.contains("atoms 0 and 1 overlap"), "{err}");
    }
}
