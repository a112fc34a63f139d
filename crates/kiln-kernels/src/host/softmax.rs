//! The rows' softmax attention forms its probabilities with: scaled, masked (causal rows,
//! padding), with dropout's multipliers formed as the rows are normalised.

use crate::mask::RowMask;
use crate::math::exp;

use super::{LANES, row_max, row_sum};

/// `softmax(scale · row)` of each `width`-long row of `rows`, in place, vectorised as
/// [`BiasMap`], over the keys each row sees (the others come out 0).
pub(super) struct SoftmaxRows<'a> {
    pub(super) rows: &'a mut [f32],
    pub(super) width: usize,
    pub(super) scale: f32,
    /// Dropout's multipliers of the rows' elements, in order, formed as they are normalised.
    pub(super) dropout: Option<RowMask>,
    /// Causal rows: row `r` sees its first `causal + r` elements.
    pub(super) causal: Option<usize>,
    /// The keys any row may see (`false`: padding).
    pub(super) real: Option<&'a [bool]>,
}

impl pulp::WithSimd for SoftmaxRows<'_> {
    type Output = ();

    #[inline(always)]
    fn with_simd<S: pulp::Simd>(self, _: S) {
        if self.causal.is_none() && self.real.is_none() {
            // Every key seen (the vision towers): the loop without the masking steps.
            for (r, row) in self.rows.chunks_exact_mut(self.width).enumerate() {
                let max = row_max(row);
                row.iter_mut()
                    .for_each(|v| *v = exp(self.scale * (*v - max)));
                normalise(row, r * self.width, self.dropout);
            }
            return;
        }
        for (r, row) in self.rows.chunks_exact_mut(self.width).enumerate() {
            let seen = self.causal.map_or(self.width, |c| (c + r).min(self.width));
            let (row, unseen) = row.split_at_mut(seen);
            unseen.fill(0.0);
            if let Some(real) = self.real {
                row.iter_mut()
                    .zip(real)
                    .for_each(|(v, &real)| *v = if real { *v } else { f32::NEG_INFINITY });
            }
            let max = row_max(row);
            if max == f32::NEG_INFINITY {
                // Nothing to attend to (a padding query): zeros, never NaN.
                row.fill(0.0);
                continue;
            }
            let sum = match self.real {
                Some(real) => {
                    row.iter_mut().zip(real).for_each(|(v, &real)| {
                        *v = if real {
                            exp(self.scale * (*v - max))
                        } else {
                            0.0
                        }
                    });
                    row_sum(row)
                }
                None => exp_and_sum(row, self.scale, max),
            };
            normalise_by(row, sum, r * self.width, self.dropout);
        }
    }
}

/// `exp(scale · (v − max))` of each element of `row` in place; returns their sum (one pass).
#[inline(always)]
fn exp_and_sum(row: &mut [f32], scale: f32, max: f32) -> f32 {
    let mut lanes = [0.0f32; LANES];
    let mut chunks = row.chunks_exact_mut(LANES);
    for chunk in &mut chunks {
        for (lane, v) in lanes.iter_mut().zip(chunk.iter_mut()) {
            *v = exp(scale * (*v - max));
            *lane += *v;
        }
    }
    let mut rest = 0.0;
    for v in chunks.into_remainder() {
        *v = exp(scale * (*v - max));
        rest += *v;
    }
    lanes.iter().sum::<f32>() + rest
}

/// Divides the exponentials of `row` by their sum, times dropout's multipliers of the row's
/// elements (from element `first` of the mask) when there are any.
#[inline(always)]
fn normalise(row: &mut [f32], first: usize, dropout: Option<RowMask>) {
    normalise_by(row, row_sum(row), first, dropout);
}

/// [`normalise`] with the exponentials' sum known.
#[inline(always)]
fn normalise_by(row: &mut [f32], sum: f32, first: usize, dropout: Option<RowMask>) {
    let norm = 1.0 / sum;
    match dropout {
        None => row.iter_mut().for_each(|v| *v *= norm),
        Some(mask) => row
            .iter_mut()
            .enumerate()
            .for_each(|(k, v)| *v = *v * norm * mask.factor(first + k)),
    }
}
