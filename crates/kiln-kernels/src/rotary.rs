//! Rotary position embeddings' rotation of f32 rows as transformers' Llama applies it: each
//! head's pairs `(x_i, x_{i + d/2})` turned by its row's angles (`rotate_half`, not interleaved
//! pairs). The angles themselves (frequencies, scaling) belong to the model (kiln-text's
//! `Rope`); this is the arithmetic its host kernels and its attention in training share.

use rayon::prelude::*;

/// Rows per parallel task.
const ROWS_PER_TASK: usize = 64;

/// Which way [`rotate_rows`] turns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Turn {
    /// By the angles: the embedding.
    Forward,
    /// By the opposite angles: the rotation's transpose, which carries a gradient back through
    /// it.
    Back,
}

/// The cosines and sines of each row's angles, `[rows, head_dim]` row-major, the two halves of
/// a row equal.
#[derive(Debug, Clone, Copy)]
pub struct Angles<'a> {
    /// `cos` of the angles.
    pub cos: &'a [f32],
    /// `sin` of the angles.
    pub sin: &'a [f32],
}

/// Rotates, in place, the `heads` heads of `head_dim` columns from `column` in each of the rows
/// (`row_stride` apart) of `values`, row `r` by the angles of `angles`' row `r`, the rows split
/// across rayon's threads.
pub fn rotate_rows(
    values: &mut [f32],
    row_stride: usize,
    column: usize,
    heads: usize,
    angles: Angles<'_>,
    turn: Turn,
) {
    let rows = values.len() / row_stride.max(1);
    let head_dim = angles.cos.len() / rows.max(1);
    assert!(
        angles.cos.len() == rows * head_dim && angles.sin.len() == angles.cos.len(),
        "rotary angles: one row of {head_dim} per row of values"
    );
    assert!(
        column + heads * head_dim <= row_stride,
        "heads past the row"
    );
    if rows == 0 || head_dim == 0 {
        return;
    }
    let sign = match turn {
        Turn::Forward => 1.0,
        Turn::Back => -1.0,
    };
    let half = head_dim / 2;
    values
        .par_chunks_mut(ROWS_PER_TASK * row_stride)
        .zip(angles.cos.par_chunks(ROWS_PER_TASK * head_dim))
        .zip(angles.sin.par_chunks(ROWS_PER_TASK * head_dim))
        .for_each(|((values, cos), sin)| {
            for ((row, cos), sin) in values
                .chunks_exact_mut(row_stride)
                .zip(cos.chunks_exact(head_dim))
                .zip(sin.chunks_exact(head_dim))
            {
                for head in row[column..column + heads * head_dim].chunks_exact_mut(head_dim) {
                    let (first, second) = head.split_at_mut(half);
                    for i in 0..half {
                        let (x1, x2) = (first[i], second[i]);
                        let (s1, s2) = (sign * sin[i], sign * sin[half + i]);
                        first[i] = x1 * cos[i] - x2 * s1;
                        second[i] = x2 * cos[half + i] + x1 * s2;
                    }
                }
            }
        });
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A rotation keeps each pair's length, turning back undoes it, and turning back is the
    /// transpose: `⟨R x, y⟩ = ⟨x, Rᵀ y⟩`.
    #[test]
    fn turning_back_is_the_transpose() {
        let (rows, heads, head_dim, stride, column) = (70, 2, 6, 15, 2);
        let angles: Vec<f32> = (0..rows * head_dim / 2)
            .map(|i| (i as f32 * 0.71).sin() * 3.0)
            .collect();
        let table = |f: fn(f32) -> f32| -> Vec<f32> {
            angles
                .chunks(head_dim / 2)
                .flat_map(|row| row.iter().chain(row).map(|&a| f(a)))
                .collect()
        };
        let (cos, sin) = (table(f32::cos), table(f32::sin));
        let angles = Angles {
            cos: &cos,
            sin: &sin,
        };
        let x: Vec<f32> = (0..rows * stride)
            .map(|i| (i as f32 * 0.37).cos())
            .collect();
        let y: Vec<f32> = (0..rows * stride)
            .map(|i| (i as f32 * 0.13).sin())
            .collect();
        let turned = |values: &[f32], turn| {
            let mut values = values.to_vec();
            rotate_rows(&mut values, stride, column, heads, angles, turn);
            values
        };
        let dot = |a: &[f32], b: &[f32]| a.iter().zip(b).map(|(a, b)| a * b).sum::<f32>();
        let rx = turned(&x, Turn::Forward);
        assert!((dot(&rx, &rx) - dot(&x, &x)).abs() < 1e-3);
        let back = turned(&rx, Turn::Back);
        assert!(back.iter().zip(&x).all(|(a, b)| (a - b).abs() < 1e-5));
        assert!((dot(&rx, &y) - dot(&x, &turned(&y, Turn::Back))).abs() < 1e-3);
        // Columns outside the heads are untouched.
        for row in 0..rows {
            let outside = (0..column).chain(column + heads * head_dim..stride);
            for c in outside {
                assert_eq!(rx[row * stride + c], x[row * stride + c]);
            }
        }
    }
}
