//! Batch scaling: per-item time at batch sizes 1, 2, 4, … N. Batching should never make an item
//! more expensive; the check catches models that loop over items or build batch² intermediates.

use std::fmt;

use crate::BenchError;
use crate::report::BenchResult;
use crate::stats::relative_change_noise;

/// Relative drop of the per-item cost below which doubling the batch no longer counts as helping.
const STILL_FALLING: f64 = 0.05;

/// The batch sizes to try: powers of two up to `max`, then `max` itself.
pub fn batch_sizes(max: usize) -> Vec<usize> {
    let mut sizes: Vec<usize> = std::iter::successors(Some(1usize), |b| b.checked_mul(2))
        .take_while(|&b| b <= max.max(1))
        .collect();
    if sizes.last() != Some(&max.max(1)) {
        sizes.push(max);
    }
    sizes
}

/// Per-item cost of one benchmark at growing batch sizes.
#[derive(Debug, Clone)]
pub struct BatchScaling {
    /// What was scaled.
    pub name: String,
    /// (batch size, result) in increasing batch size; the first is batch 1.
    pub points: Vec<(usize, BenchResult)>,
}

impl BatchScaling {
    /// Median seconds per item at each batch size.
    pub fn per_item(&self) -> Vec<(usize, f64)> {
        self.points
            .iter()
            .map(|(batch, r)| (*batch, r.summary.median / *batch as f64))
            .collect()
    }

    /// The batch size after which doubling stops cutting the per-item cost by 5% or more.
    pub fn stops_falling_at(&self) -> usize {
        let per_item = self.per_item();
        per_item
            .windows(2)
            .find(|w| w[1].1 > w[0].1 * (1.0 - STILL_FALLING))
            .map_or_else(|| per_item.last().map_or(1, |p| p.0), |w| w[0].0)
    }

    /// Fails when an item costs more at the largest batch than alone, by more than both the
    /// relative `threshold` and the noise (the rule comparisons with a baseline use).
    pub fn check(&self, threshold: f64) -> Result<(), BenchError> {
        let (Some((_, single)), Some((batch, largest))) = (self.points.first(), self.points.last())
        else {
            return Ok(());
        };
        let single_item = single.summary.median;
        let batched_item = largest.summary.median / *batch as f64;
        let noise = relative_change_noise(&single.summary, &largest.summary);
        if batched_item > single_item * (1.0 + noise.max(threshold)) {
            Err(BenchError::BatchSlower {
                name: self.name.clone(),
                batch: *batch,
                single_item,
                batched_item,
            })
        } else {
            Ok(())
        }
    }
}

impl fmt::Display for BatchScaling {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "batch scaling of {}:", self.name)?;
        let per_item = self.per_item();
        let single = per_item.first().map_or(f64::NAN, |p| p.1);
        for (batch, seconds) in &per_item {
            writeln!(
                f,
                "  batch {batch:>4}: {:>12} per item ({:.2}x batch 1)",
                crate::baseline::format_seconds(*seconds),
                seconds / single
            )?;
        }
        writeln!(
            f,
            "  per-item cost stops falling at batch {}",
            self.stops_falling_at()
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::{Timings, Work};
    use crate::report::Setting;

    fn point(batch: usize, median: f64) -> (usize, BenchResult) {
        let setting = Setting {
            backend: "test".into(),
            device: "cpu".into(),
            dtype: "f32".into(),
        };
        let timings = Timings {
            cold: median,
            samples: vec![median; 20],
            peak_host_bytes: None,
            device_bytes: None,
        };
        let result = BenchResult::new(
            "b".into(),
            &setting,
            Work::items(batch as u64),
            timings,
            None,
        );
        (batch, result.unwrap())
    }

    fn scaling(medians: &[(usize, f64)]) -> BatchScaling {
        BatchScaling {
            name: "model".into(),
            points: medians.iter().map(|&(b, m)| point(b, m)).collect(),
        }
    }

    #[test]
    fn sizes_are_powers_of_two_then_the_maximum() {
        assert_eq!(batch_sizes(1), [1]);
        assert_eq!(batch_sizes(8), [1, 2, 4, 8]);
        assert_eq!(batch_sizes(12), [1, 2, 4, 8, 12]);
    }

    #[test]
    fn good_scaling_passes_and_reports_where_it_flattens() {
        // Per item: 10, 6, 4, 3.9, 3.8 ms: falling by 5% or more until batch 4.
        let s = scaling(&[
            (1, 0.010),
            (2, 0.012),
            (4, 0.016),
            (8, 0.0312),
            (16, 0.0608),
        ]);
        assert!(s.check(0.05).is_ok());
        assert_eq!(s.stops_falling_at(), 4);
        let always_falling = scaling(&[(1, 0.010), (2, 0.010), (4, 0.010)]);
        assert_eq!(always_falling.stops_falling_at(), 4);
        // Flat per-item cost, 3% dearer at batch 4: within a 5% threshold, beyond a 1% one.
        let flat = scaling(&[(1, 0.010), (2, 0.020), (4, 0.0412)]);
        assert_eq!(flat.stops_falling_at(), 1);
        assert!(flat.check(0.05).is_ok());
        assert!(flat.check(0.01).is_err());
    }

    #[test]
    fn batches_slower_per_item_fail() {
        // The reference failure: batched inference slower per structure than single.
        let s = scaling(&[(1, 0.010), (2, 0.030), (4, 0.080)]);
        let err = s.check(0.05).unwrap_err().to_string();
        assert!(err.contains("batch 4") && err.contains("model"), "{err}");
        assert_eq!(s.stops_falling_at(), 1);
    }
}
