//! Neighbour lists: every ordered pair of atoms closer than the cutoff, with the lattice shift
//! that brings the second atom next to the first in periodic directions (an atom may neighbour
//! its own images when the cell is shorter than twice the cutoff). Same convention as ASE's
//! `neighbor_list("ijS")`: `r_ij = r_j − r_i + S · cell`.
//!
//! Two methods give the same pairs: brute force (every atom against every image of every atom
//! within reach, for molecules and small cells) and a cell list (atoms and the periodic images
//! within a cutoff of the cell hashed into cutoff-sized bins, each atom tested against the 27
//! bins around it: O(N) at fixed density, for large and periodic systems). Triclinic cells,
//! periodicity along some lattice vectors only and cutoffs longer than the cell are handled by
//! both.

use std::collections::HashMap;

use crate::structure::Structure;

/// Atoms closer than this (Å) overlap: no physical structure has them.
const OVERLAP: f64 = 1e-2;

/// Up to this many atoms, [`neighbor_list`] uses brute force.
const BRUTE_FORCE_MAX_ATOMS: usize = 48;

/// The neighbour pairs of one structure: atom `j[p]`, shifted by `cell_shifts[p]` lattice
/// vectors, is within the cutoff of atom `i[p]`; both orders of every pair are listed.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct NeighborList {
    /// Centre atoms.
    pub i: Vec<u32>,
    /// Neighbour atoms.
    pub j: Vec<u32>,
    /// Lattice vectors (integer multiples of the cell's rows) shifting the neighbour's image.
    pub cell_shifts: Vec<[i32; 3]>,
}

/// How a neighbour list is built; both give the same pairs (in different orders).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NeighborMethod {
    /// Every atom against every image of every atom within reach: O(N² × images).
    BruteForce,
    /// Cutoff-sized bins: O(N) at fixed density.
    CellList,
}

impl NeighborList {
    /// Number of (ordered) pairs.
    pub fn len(&self) -> usize {
        self.i.len()
    }

    /// Whether no atom has a neighbour.
    pub fn is_empty(&self) -> bool {
        self.i.is_empty()
    }

    /// The Cartesian shift (Å) of pair `p`'s neighbour image in `cell`.
    pub fn shift(&self, p: usize, cell: &[[f64; 3]; 3]) -> [f64; 3] {
        lattice_vector(cell, self.cell_shifts[p])
    }

    /// The shortest distance (Å) between two atoms of `structure` (the list's), or an atom and
    /// a periodic image of one, itself included; infinite without pairs.
    pub fn closest(&self, structure: &Structure) -> f64 {
        // The smallest square, then one root (the root is monotonic: the same value).
        (0..self.len())
            .map(|p| {
                let (i, j) = (self.i[p] as usize, self.j[p] as usize);
                let shift = self.shift(p, &structure.cell);
                (0..3)
                    .map(|a| {
                        let d = structure.positions[j][a] - structure.positions[i][a] + shift[a];
                        d * d
                    })
                    .sum::<f64>()
            })
            .fold(f64::INFINITY, f64::min)
            .sqrt()
    }

    fn push(&mut self, i: usize, j: usize, shift: [i32; 3]) {
        self.i.push(i as u32);
        self.j.push(j as u32);
        self.cell_shifts.push(shift);
    }
}

/// Why a structure's neighbour list cannot be built; atoms are said 1-based.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum NeighborError {
    /// The periodic lattice vectors do not span their directions.
    #[error("the periodic lattice vectors are linearly dependent")]
    DependentLattice,
    /// A periodic cell so small against the cutoff that each atom would meet too many images.
    #[error(
        "the periodic cell is far smaller than the {cutoff} Å cutoff: each atom would meet \
         {images:.0} images of the cell (more than {MAX_SHIFTS:.0}); are its lengths in Å?"
    )]
    CellTooSmall {
        /// The cutoff, Å.
        cutoff: f64,
        /// The images each atom would meet.
        images: f64,
    },
    /// An atom absurdly far from the periodic cell (or at a NaN position).
    #[error(
        "atom {} lies {cells:.1e} cells from the periodic cell (more than {MAX_CELLS_AWAY:.0e}); \
         are its coordinates in Å?",
        atom + 1
    )]
    FarFromCell {
        /// The atom's 0-based index.
        atom: usize,
        /// How many cells away.
        cells: f64,
    },
    /// More pairs within the cutoff than one structure can be evaluated with.
    #[error(
        "more than {MAX_PAIRS} neighbour pairs within {cutoff} Å: too dense to evaluate as one \
         structure (are the lengths in Å?)"
    )]
    TooDense {
        /// The cutoff, Å.
        cutoff: f64,
    },
    /// Two atoms closer than 0.01 Å.
    #[error("atoms {} and {} overlap ({distance:.1e} Å apart)", atoms.0 + 1, atoms.1 + 1)]
    Overlap {
        /// Their 0-based indices.
        atoms: (usize, usize),
        /// Their distance, Å.
        distance: f64,
    },
    /// Atoms spread over too many cells for a brute-force list.
    #[error(
        "the atoms spread over {reach:?} cells: too many lattice images for a brute-force list \
         (more than {MAX_SHIFTS:.0}); use the cell list"
    )]
    SpreadTooFar {
        /// Cells reached along each lattice vector.
        reach: [i32; 3],
    },
}

impl NeighborError {
    /// As the error of structure `index` (0-based) of an input.
    pub fn in_structure(self, index: usize) -> crate::ForceFieldError {
        crate::ForceFieldError::Structure {
            index,
            reason: self.to_string(),
        }
    }
}

/// The neighbour list of `structure` for `cutoff` (Å): brute force for up to 48 atoms, a cell
/// list above. Overlapping atoms (closer than 0.01 Å) and a cell whose periodic lattice vectors
/// are linearly dependent are errors.
pub fn neighbor_list(structure: &Structure, cutoff: f64) -> Result<NeighborList, NeighborError> {
    // Brute force visits every image within the atoms' spread; atoms spread over many cells
    // (unwrapped coordinates) go through the cell list, which wraps them first.
    let compact = Frame::new(structure)
        .is_ok_and(|frame| shift_count(brute_force_reach(structure, &frame, cutoff)) <= MAX_SHIFTS);
    let method = if structure.len() <= BRUTE_FORCE_MAX_ATOMS && compact {
        NeighborMethod::BruteForce
    } else {
        NeighborMethod::CellList
    };
    neighbor_list_with(structure, cutoff, method)
}

/// The most lattice shifts a neighbour list may visit per atom: a periodic cell this much
/// smaller than the cutoff (a 0.2 Å cell for 5 Å) is not a physical structure (lengths in nm or
/// Bohr?), and its list would take gigabytes.
pub const MAX_SHIFTS: f64 = 1e5;

/// The farthest an atom may lie from the periodic cell, in cells along a periodic lattice vector
/// (coordinates further out are not Å, and wrapping them would overflow the lattice shifts).
pub const MAX_CELLS_AWAY: f64 = 1e6;

/// The most pairs one structure's neighbour list may hold (about 1 GB with the list's indices).
pub const MAX_PAIRS: usize = 50_000_000;

/// The neighbour list of `structure` for `cutoff` (Å) built by `method`. A cell so much smaller
/// than the cutoff that it needs more than [`MAX_SHIFTS`] lattice shifts, or a list of more than
/// [`MAX_PAIRS`] pairs, is an error before the memory is taken.
pub fn neighbor_list_with(
    structure: &Structure,
    cutoff: f64,
    method: NeighborMethod,
) -> Result<NeighborList, NeighborError> {
    let frame = Frame::new(structure)?;
    let shifts: f64 = (0..3)
        .filter(|&k| structure.pbc[k])
        .map(|k| 2.0 * frame.padding(k, cutoff).ceil() + 1.0)
        .product();
    if shifts > MAX_SHIFTS {
        return Err(NeighborError::CellTooSmall {
            cutoff,
            images: shifts,
        });
    }
    let far = structure
        .positions
        .iter()
        .enumerate()
        .find_map(|(atom, r)| {
            (0..3)
                .filter(|&k| structure.pbc[k])
                .map(|k| frame.fractional(r, k).abs())
                .find(|&cells| cells.is_nan() || cells > MAX_CELLS_AWAY)
                .map(|cells| (atom, cells))
        });
    if let Some((atom, cells)) = far {
        return Err(NeighborError::FarFromCell { atom, cells });
    }
    let mut list = NeighborList::default();
    let mut visit = |i: usize, j: usize, shift: [i32; 3], d: [f64; 3]| {
        let d2 = d[0] * d[0] + d[1] * d[1] + d[2] * d[2];
        if d2 >= cutoff * cutoff || (i == j && shift == [0; 3]) {
            return Ok(());
        }
        if list.len() >= MAX_PAIRS {
            return Err(NeighborError::TooDense { cutoff });
        }
        if d2 < OVERLAP * OVERLAP {
            return Err(NeighborError::Overlap {
                atoms: (i, j),
                distance: d2.sqrt(),
            });
        }
        list.push(i, j, shift);
        Ok(())
    };
    match method {
        NeighborMethod::BruteForce => brute_force(structure, &frame, cutoff, &mut visit)?,
        NeighborMethod::CellList => cell_list(structure, &frame, cutoff, &mut visit)?,
    }
    Ok(list)
}

/// Calls `visit(i, j, S, r_j − r_i + S·cell)` for every atom pair and every lattice shift `S`
/// that can bring them within `cutoff`.
fn brute_force(
    structure: &Structure,
    frame: &Frame,
    cutoff: f64,
    visit: &mut impl FnMut(usize, usize, [i32; 3], [f64; 3]) -> Result<(), NeighborError>,
) -> Result<(), NeighborError> {
    let positions = &structure.positions;
    let reach = brute_force_reach(structure, frame, cutoff);
    if shift_count(reach) > MAX_SHIFTS {
        return Err(NeighborError::SpreadTooFar { reach });
    }
    let shifts = lattice_shifts(reach);
    let vectors: Vec<[f64; 3]> = shifts
        .iter()
        .map(|&s| lattice_vector(&structure.cell, s))
        .collect();
    for (i, ri) in positions.iter().enumerate() {
        for (j, rj) in positions.iter().enumerate() {
            for (&shift, v) in shifts.iter().zip(&vectors) {
                visit(i, j, shift, std::array::from_fn(|x| rj[x] + v[x] - ri[x]))?;
            }
        }
    }
    Ok(())
}

/// Along each periodic lattice vector, the shifts brute force visits: the cutoff in cells plus
/// the atoms' own spread.
fn brute_force_reach(structure: &Structure, frame: &Frame, cutoff: f64) -> [i32; 3] {
    std::array::from_fn(|k| {
        if !structure.pbc[k] {
            return 0;
        }
        let fractions = structure.positions.iter().map(|r| frame.fractional(r, k));
        let (lo, hi) = fractions.fold((f64::MAX, f64::MIN), |(l, h), f| (l.min(f), h.max(f)));
        // Saturates for absurd spreads, which the shift count then refuses.
        (frame.padding(k, cutoff) + (hi - lo))
            .ceil()
            .min(f64::from(i32::MAX / 4)) as i32
    })
}

/// How many lattice shifts reach `[a, b, c]` spans, `(2a + 1)(2b + 1)(2c + 1)`.
fn shift_count(reach: [i32; 3]) -> f64 {
    reach.iter().map(|&r| 2.0 * f64::from(r) + 1.0).product()
}

/// Calls `visit` like [`brute_force`], for the pairs a cell list finds: atoms wrapped into the
/// cell along periodic directions, their images within `cutoff` of it, all hashed into bins of
/// side `cutoff`; each atom meets the points of the 27 bins around its own.
fn cell_list(
    structure: &Structure,
    frame: &Frame,
    cutoff: f64,
    visit: &mut impl FnMut(usize, usize, [i32; 3], [f64; 3]) -> Result<(), NeighborError>,
) -> Result<(), NeighborError> {
    let cell = &structure.cell;
    // Each atom wrapped into the cell: position, and the lattice shift that took it there.
    let wrapped: Vec<([f64; 3], [i32; 3])> = structure
        .positions
        .iter()
        .map(|r| {
            let shift: [i32; 3] = std::array::from_fn(|k| {
                if structure.pbc[k] {
                    -frame.fractional(r, k).floor() as i32
                } else {
                    0
                }
            });
            let v = lattice_vector(cell, shift);
            (std::array::from_fn(|x| r[x] + v[x]), shift)
        })
        .collect();
    // Images of wrapped atoms no further than the cutoff from the cell, in fractional units.
    let padding: [f64; 3] = std::array::from_fn(|k| frame.padding(k, cutoff));
    let reach: [i32; 3] = std::array::from_fn(|k| {
        if structure.pbc[k] {
            padding[k].ceil() as i32
        } else {
            0
        }
    });
    let images = lattice_shifts(reach);
    let bin = |p: &[f64; 3]| -> [i64; 3] { p.map(|x| (x / cutoff).floor() as i64) };
    let mut points: Vec<(usize, [i32; 3], [f64; 3])> = Vec::new();
    let mut bins: HashMap<[i64; 3], Vec<u32>> = HashMap::new();
    for (j, (w, _)) in wrapped.iter().enumerate() {
        for &image in &images {
            let p = {
                let v = lattice_vector(cell, image);
                std::array::from_fn(|x| w[x] + v[x])
            };
            let inside = (0..3).all(|k| {
                !structure.pbc[k] || {
                    let s = frame.fractional(&p, k);
                    s >= -padding[k] && s < 1.0 + padding[k]
                }
            });
            if image == [0; 3] || inside {
                bins.entry(bin(&p)).or_default().push(points.len() as u32);
                points.push((j, image, p));
            }
        }
    }
    for (i, (wi, shift_i)) in wrapped.iter().enumerate() {
        let home = bin(wi);
        for offset in lattice_shifts([1; 3]) {
            let key = std::array::from_fn(|x| home[x] + i64::from(offset[x]));
            for &point in bins.get(&key).map_or(&[][..], Vec::as_slice) {
                let (j, image, p) = points[point as usize];
                let shift_j = wrapped[j].1;
                let shift = std::array::from_fn(|k| shift_j[k] + image[k] - shift_i[k]);
                visit(i, j, shift, std::array::from_fn(|x| p[x] - wi[x]))?;
            }
        }
    }
    Ok(())
}

/// Every integer triple with `|n_k| ≤ reach_k`.
fn lattice_shifts(reach: [i32; 3]) -> Vec<[i32; 3]> {
    let mut shifts = Vec::new();
    for a in -reach[0]..=reach[0] {
        for b in -reach[1]..=reach[1] {
            for c in -reach[2]..=reach[2] {
                shifts.push([a, b, c]);
            }
        }
    }
    shifts
}

/// `n · cell`: the Cartesian lattice vector of integer multiples `n` of the cell's rows.
fn lattice_vector(cell: &[[f64; 3]; 3], n: [i32; 3]) -> [f64; 3] {
    std::array::from_fn(|x| (0..3).map(|k| f64::from(n[k]) * cell[k][x]).sum())
}

/// The reciprocal vectors of a non-singular frame: the periodic lattice vectors completed by unit
/// vectors orthogonal to them (a molecule's or a slab's cell may be zero along its open
/// directions). Along a periodic lattice vector `k`, `fractional(r, k)` is the coordinate in
/// cells and planes of equal coordinate are `1 / |b_k|` apart.
struct Frame {
    reciprocal: [[f64; 3]; 3],
}

impl Frame {
    fn new(structure: &Structure) -> Result<Self, NeighborError> {
        let mut rows = [[0.0; 3]; 3];
        // Gram–Schmidt basis of what the rows span so far, to find the open directions.
        let mut basis: Vec<[f64; 3]> = Vec::new();
        let add = |v: [f64; 3], basis: &mut Vec<[f64; 3]>| -> Option<[f64; 3]> {
            let scale = norm(v);
            let mut u = v;
            for b in basis.iter() {
                let along = dot(u, *b);
                u = std::array::from_fn(|x| u[x] - along * b[x]);
            }
            let length = norm(u);
            (scale > 0.0 && length > 1e-9 * scale).then(|| {
                let unit = u.map(|x| x / length);
                basis.push(unit);
                unit
            })
        };
        for k in (0..3).filter(|&k| structure.pbc[k]) {
            if add(structure.cell[k], &mut basis).is_none() {
                return Err(NeighborError::DependentLattice);
            }
            rows[k] = structure.cell[k];
        }
        let mut axes = [[1.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 1.0]].into_iter();
        for k in (0..3).filter(|&k| !structure.pbc[k]) {
            rows[k] = axes
                .by_ref()
                .find_map(|axis| add(axis, &mut basis))
                .expect("three axes complete any basis");
        }
        let c = [
            cross(rows[1], rows[2]),
            cross(rows[2], rows[0]),
            cross(rows[0], rows[1]),
        ];
        let volume = dot(rows[0], c[0]);
        Ok(Frame {
            reciprocal: c.map(|row| row.map(|x| x / volume)),
        })
    }

    /// Coordinate of `r` along frame row `k`, in units of that row.
    fn fractional(&self, r: &[f64; 3], k: usize) -> f64 {
        dot(*r, self.reciprocal[k])
    }

    /// `cutoff` in units of frame row `k` (measured between planes of equal coordinate).
    fn padding(&self, k: usize, cutoff: f64) -> f64 {
        cutoff * norm(self.reciprocal[k])
    }
}

fn dot(u: [f64; 3], v: [f64; 3]) -> f64 {
    u[0] * v[0] + u[1] * v[1] + u[2] * v[2]
}

fn norm(u: [f64; 3]) -> f64 {
    dot(u, u).sqrt()
}

fn cross(u: [f64; 3], v: [f64; 3]) -> [f64; 3] {
    [
        u[1] * v[2] - u[2] * v[1],
        u[2] * v[0] - u[0] * v[2],
        u[0] * v[1] - u[1] * v[0],
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The pairs as a sorted set, to compare methods that list them in different orders.
    fn sorted(list: &NeighborList) -> Vec<(u32, u32, [i32; 3])> {
        let mut pairs: Vec<_> = (0..list.len())
            .map(|p| (list.i[p], list.j[p], list.cell_shifts[p]))
            .collect();
        pairs.sort_unstable();
        pairs
    }

    fn both(structure: &Structure, cutoff: f64) -> [NeighborList; 2] {
        [NeighborMethod::BruteForce, NeighborMethod::CellList]
            .map(|method| neighbor_list_with(structure, cutoff, method).unwrap())
    }

    #[test]
    fn a_small_cell_neighbours_its_own_images() {
        // One atom in a 2 Å cubic cell, cutoff 2.5 Å: its 6 face images at 2 Å (the edge images
        // are 2.83 Å away); as a slab periodic in x and y only, 4 — also when the open
        // direction's lattice vector is zero.
        let cell = [[2.0, 0.0, 0.0], [0.0, 2.0, 0.0], [0.0, 0.0, 2.0]];
        let atom = |cell, pbc| Structure::periodic(vec![14], vec![[0.3, 0.2, 0.1]], cell, pbc);
        for list in both(&atom(cell, [true; 3]), 2.5) {
            assert_eq!(list.len(), 6);
        }
        let flat = [[2.0, 0.0, 0.0], [0.0, 2.0, 0.0], [0.0; 3]];
        for slab in [
            atom(cell, [true, true, false]),
            atom(flat, [true, true, false]),
        ] {
            for list in both(&slab, 2.5) {
                assert_eq!(list.len(), 4);
            }
        }
    }

    /// A cell far smaller than the cutoff (here 0.01 Å for 5 Å: 10⁹ lattice shifts) is an error
    /// before anything is allocated; a small but physical one (2 Å) is not.
    #[test]
    fn a_cell_far_smaller_than_the_cutoff_is_an_error() {
        let cubic = |side: f64| [[side, 0.0, 0.0], [0.0, side, 0.0], [0.0, 0.0, side]];
        let atom = |side| Structure::periodic(vec![14], vec![[0.0; 3]], cubic(side), [true; 3]);
        for method in [NeighborMethod::BruteForce, NeighborMethod::CellList] {
            let err = neighbor_list_with(&atom(0.01), 5.0, method).unwrap_err();
            assert!(matches!(err, NeighborError::CellTooSmall { .. }), "{err}");
            assert!(
                err.to_string().contains("far smaller than the 5 Å cutoff"),
                "{err}"
            );
            assert!(neighbor_list_with(&atom(2.0), 5.0, method).is_ok());
        }
    }

    /// Unwrapped coordinates many cells away go through the cell list (the brute-force one would
    /// visit every image between them); coordinates absurdly far away are an error, not an
    /// overflow.
    #[test]
    fn atoms_far_outside_the_cell() {
        let cubic = [[4.0, 0.0, 0.0], [0.0, 4.0, 0.0], [0.0, 0.0, 4.0]];
        let at = |x: f64| {
            Structure::periodic(vec![1, 1], vec![[0.0; 3], [x, 1.0, 1.0]], cubic, [true; 3])
        };
        let near = sorted(&neighbor_list(&at(1.0), 3.0).unwrap());
        // 40 000 cells further along a: the same pairs (brute force would visit 7e5 images).
        let far = neighbor_list(&at(1.0 + 160_000.0), 3.0).unwrap();
        assert_eq!(far.len(), near.len());
        let err = neighbor_list_with(&at(160_000.0), 3.0, NeighborMethod::BruteForce).unwrap_err();
        assert!(matches!(err, NeighborError::SpreadTooFar { .. }), "{err}");
        assert!(err.to_string().contains("use the cell list"), "{err}");
        for method in [NeighborMethod::BruteForce, NeighborMethod::CellList] {
            let err = neighbor_list_with(&at(1e300), 3.0, method).unwrap_err();
            assert!(
                matches!(err, NeighborError::FarFromCell { atom: 1, .. }),
                "{err}"
            );
            assert!(
                err.to_string().contains("atom 2 lies 2.5e299 cells"),
                "{err}"
            );
        }
    }

    #[test]
    fn pairs_come_in_both_orders_and_overlaps_are_errors() {
        let molecule = Structure::molecule(
            vec![1, 1, 8],
            vec![[0.0; 3], [0.0, 0.0, 0.74], [9.0, 0.0, 0.0]],
        );
        for list in both(&molecule, 2.0) {
            assert_eq!(sorted(&list), vec![(0, 1, [0; 3]), (1, 0, [0; 3])]);
        }
        let overlapping = Structure::molecule(vec![1, 1], vec![[0.0; 3], [0.0, 0.0, 0.001]]);
        for method in [NeighborMethod::BruteForce, NeighborMethod::CellList] {
            let err = neighbor_list_with(&overlapping, 2.0, method).unwrap_err();
            assert!(
                matches!(err, NeighborError::Overlap { atoms: (0, 1), .. }),
                "{err}"
            );
            assert!(err.to_string().contains("atoms 1 and 2 overlap"), "{err}");
        }
    }

    #[test]
    fn dependent_periodic_lattice_vectors_are_an_error() {
        let cell = [[2.0, 0.0, 0.0], [4.0, 0.0, 0.0], [0.0, 0.0, 2.0]];
        let structure = Structure::periodic(vec![1], vec![[0.0; 3]], cell, [true; 3]);
        let err = neighbor_list(&structure, 2.0).unwrap_err();
        assert_eq!(err, NeighborError::DependentLattice);
        assert!(err.to_string().contains("linearly dependent"), "{err}");
    }

    /// A deterministic stream of numbers in [0, 1) (no test-only dependency).
    fn uniform(seed: u64) -> impl FnMut() -> f64 {
        let mut state = seed;
        move || {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (state >> 11) as f64 / (1u64 << 53) as f64
        }
    }

    /// Random atoms (kept 1 Å apart) in skewed cells, with every periodicity pattern, atoms
    /// outside the cell and cutoffs from a fraction of the cell to several cells: the cell list
    /// finds exactly the brute-force pairs.
    #[test]
    fn the_cell_list_finds_the_brute_force_pairs() {
        let mut next = uniform(11);
        let mut found = 0;
        for case in 0..24 {
            let cell: [[f64; 3]; 3] = std::array::from_fn(|k| {
                std::array::from_fn(|x| {
                    let diagonal = if x == k { 3.0 + 4.0 * next() } else { 0.0 };
                    diagonal + 2.0 * (next() - 0.5)
                })
            });
            let pbc = [case & 1 != 0, case & 2 != 0, case & 4 != 0];
            let mut positions: Vec<[f64; 3]> = Vec::new();
            while positions.len() < 4 + case % 9 {
                // Fractional coordinates in [-0.5, 1.5): some atoms outside the cell.
                let f: [f64; 3] = std::array::from_fn(|_| 2.0 * next() - 0.5);
                let r = std::array::from_fn(|x| (0..3).map(|k| f[k] * cell[k][x]).sum());
                if positions
                    .iter()
                    .all(|q: &[f64; 3]| norm(std::array::from_fn(|x| q[x] - r[x])) > 1.0)
                {
                    positions.push(r);
                }
            }
            let numbers = vec![6; positions.len()];
            let structure = Structure::periodic(numbers, positions, cell, pbc);
            let cutoff = [1.5, 3.0, 6.0, 11.0][case % 4];
            let [brute, cells] = both(&structure, cutoff);
            assert_eq!(
                sorted(&brute),
                sorted(&cells),
                "case {case}, cutoff {cutoff}"
            );
            found += brute.len();
        }
        assert!(found > 1000, "only {found} pairs in all cases");
    }
}
