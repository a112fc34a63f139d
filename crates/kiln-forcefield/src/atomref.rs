//! Per-element reference energies fitted to a training set, so the network learns what is left
//! once every atom's typical energy is taken out (schnetpack's `atomref`).

use crate::ForceFieldError;
use crate::structure::Structure;

/// The reference energy `a_Z` of every element (indexed by atomic number, `max_z` values, 0 for
/// elements absent from `structures`) minimising `Σ_s (E_s − Σ_Z n_sZ a_Z)²` by least squares.
/// Where the compositions do not determine every `a_Z` (one molecule's conformers), a vanishing
/// ridge term picks the smallest-norm solution, which still fits every energy as well as any.
///
/// ```
/// use kiln_forcefield::{Structure, fit_atomref};
/// let water = Structure::molecule(vec![8, 1, 1], vec![[0.0; 3], [0.96, 0.0, 0.0], [0.0, 0.96, 0.0]]);
/// let h2 = Structure::molecule(vec![1, 1], vec![[0.0; 3], [0.74, 0.0, 0.0]]);
/// let atomref = fit_atomref(&[water, h2], &[-14.2, -6.8], 10)?;
/// assert!((atomref[1] + 3.4).abs() < 1e-6 && (atomref[8] + 7.4).abs() < 1e-6);
/// # Ok::<(), kiln_forcefield::ForceFieldError>(())
/// ```
pub fn fit_atomref(
    structures: &[Structure],
    energies: &[f64],
    max_z: usize,
) -> Result<Vec<f64>, ForceFieldError> {
    if structures.is_empty() {
        return Err(ForceFieldError::Config(
            "no structures to fit reference energies to".into(),
        ));
    }
    if structures.len() != energies.len() {
        return Err(ForceFieldError::Config(format!(
            "{} structures but {} energies",
            structures.len(),
            energies.len()
        )));
    }
    let mut elements: Vec<usize> = Vec::new();
    for (index, structure) in structures.iter().enumerate() {
        structure.validate(index, max_z)?;
        for &z in &structure.numbers {
            if let Err(at) = elements.binary_search(&(z as usize)) {
                elements.insert(at, z as usize);
            }
        }
    }
    // Normal equations AᵀA a = Aᵀ E over the elements present; A holds element counts.
    let k = elements.len();
    let mut normal = vec![vec![0.0; k]; k];
    let mut rhs = vec![0.0; k];
    for (structure, &energy) in structures.iter().zip(energies) {
        let mut counts = vec![0.0; k];
        for &z in &structure.numbers {
            let column = elements.binary_search(&(z as usize)).expect("listed above");
            counts[column] += 1.0;
        }
        for r in 0..k {
            rhs[r] += counts[r] * energy;
            for c in 0..k {
                normal[r][c] += counts[r] * counts[c];
            }
        }
    }
    let largest = (0..k).map(|r| normal[r][r]).fold(0.0, f64::max);
    for (r, row) in normal.iter_mut().enumerate() {
        row[r] += 1e-10 * largest;
    }
    let solution = solve(normal, rhs);
    let mut atomref = vec![0.0; max_z];
    for (&z, value) in elements.iter().zip(solution) {
        atomref[z] = value;
    }
    Ok(atomref)
}

/// `x` with `m x = b` for a symmetric positive definite `m` (Gaussian elimination with partial
/// pivoting).
fn solve(mut m: Vec<Vec<f64>>, mut b: Vec<f64>) -> Vec<f64> {
    let n = b.len();
    for col in 0..n {
        let pivot = (col..n)
            .max_by(|&i, &j| m[i][col].abs().total_cmp(&m[j][col].abs()))
            .expect("a row");
        m.swap(col, pivot);
        b.swap(col, pivot);
        let (above, below) = m.split_at_mut(col + 1);
        let pivot_row = &above[col];
        for (offset, row) in below.iter_mut().enumerate() {
            let factor = row[col] / pivot_row[col];
            for (value, pivot_value) in row[col..].iter_mut().zip(&pivot_row[col..]) {
                *value -= factor * pivot_value;
            }
            b[col + 1 + offset] -= factor * b[col];
        }
    }
    let mut x = vec![0.0; n];
    for row in (0..n).rev() {
        let known: f64 = (row + 1..n).map(|c| m[row][c] * x[c]).sum();
        x[row] = (b[row] - known) / m[row][row];
    }
    x
}

#[cfg(test)]
mod tests {
    use super::*;

    fn molecule(numbers: &[u32]) -> Structure {
        let positions = (0..numbers.len())
            .map(|i| [1.5 * i as f64, 0.0, 0.0])
            .collect();
        Structure::molecule(numbers.to_vec(), positions)
    }

    #[test]
    fn recovers_reference_energies_of_varied_compositions() {
        let truth = [(1, -13.6), (6, -1029.8), (8, -2041.3), (7, -1484.2)];
        let energy = |numbers: &[u32]| -> f64 {
            numbers
                .iter()
                .map(|&z| truth.iter().find(|(t, _)| *t == z).unwrap().1)
                .sum()
        };
        let sets: [&[u32]; 5] = [
            &[8, 1, 1],
            &[6, 1, 1, 1, 1],
            &[7, 1, 1, 1],
            &[6, 8],
            &[6, 6, 8, 1],
        ];
        let structures: Vec<_> = sets.iter().map(|n| molecule(n)).collect();
        let energies: Vec<f64> = sets.iter().map(|n| energy(n)).collect();
        let atomref = fit_atomref(&structures, &energies, 20).unwrap();
        for (z, value) in truth {
            assert!(
                (atomref[z as usize] - value).abs() < 1e-5,
                "{z}: {}",
                atomref[z as usize]
            );
        }
        assert_eq!(atomref[2], 0.0, "absent elements stay 0");
    }

    #[test]
    fn one_composition_still_fits_its_mean_energy() {
        let structures = vec![molecule(&[8, 1, 1]); 3];
        let atomref = fit_atomref(&structures, &[-10.0, -11.0, -12.0], 10).unwrap();
        let predicted = atomref[8] + 2.0 * atomref[1];
        assert!((predicted + 11.0).abs() < 1e-6, "{predicted}");
    }

    #[test]
    fn empty_or_mismatched_sets_are_errors() {
        assert!(fit_atomref(&[], &[], 10).is_err());
        let err = fit_atomref(&[molecule(&[1])], &[1.0, 2.0], 10).unwrap_err();
        assert!(
            err.to_string().contains("1 structures but 2 energies"),
            "{err}"
        );
        let err = fit_atomref(&[molecule(&[12])], &[1.0], 10).unwrap_err();
        assert!(err.to_string().starts_with("structure 1"), "{err}");
    }
}
