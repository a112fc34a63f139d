//! Order statistics of timing samples, and the noise of a median.

use serde::{Deserialize, Serialize};

/// `1/Φ⁻¹(3/4)`: scales a median absolute deviation to a standard deviation for normal data.
const MAD_TO_SIGMA: f64 = 1.482_602_218_505_602;
/// `√(π/2)`: the standard error of a median is this times the standard error of a mean.
const MEDIAN_SE_FACTOR: f64 = 1.253_314_137_315_500_3;
/// Two-sided 95% normal quantile.
const Z95: f64 = 1.959_963_984_540_054;
/// Consecutive blocks the samples are cut into to see slow drifts (interference, throttling).
const DRIFT_BLOCKS: usize = 5;

/// Summary of a set of samples (seconds per run, or any other positive quantity).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Summary {
    /// Number of samples.
    pub count: usize,
    /// Smallest sample.
    pub min: f64,
    /// 50th percentile.
    pub median: f64,
    /// Arithmetic mean.
    pub mean: f64,
    /// Largest sample.
    pub max: f64,
    /// 90th percentile.
    pub p90: f64,
    /// 99th percentile.
    pub p99: f64,
    /// Median absolute deviation from the median (unscaled).
    pub mad: f64,
    /// Half the range of the medians of 5 consecutive blocks of samples, relative to the median:
    /// how far the median moves with time within the run (0 with fewer than 10 samples).
    #[serde(default)]
    pub drift: f64,
}

impl Summary {
    /// Summarises `samples`; `None` when there are none or one is not finite.
    pub fn of(samples: &[f64]) -> Option<Summary> {
        if samples.is_empty() || samples.iter().any(|x| !x.is_finite()) {
            return None;
        }
        let mut sorted = samples.to_vec();
        sorted.sort_by(f64::total_cmp);
        let median = percentile_sorted(&sorted, 50.0);
        let drift = relative_block_drift(samples, median);
        let mut deviations: Vec<f64> = sorted.iter().map(|x| (x - median).abs()).collect();
        deviations.sort_by(f64::total_cmp);
        Some(Summary {
            count: sorted.len(),
            min: sorted[0],
            median,
            mean: sorted.iter().sum::<f64>() / sorted.len() as f64,
            max: sorted[sorted.len() - 1],
            p90: percentile_sorted(&sorted, 90.0),
            p99: percentile_sorted(&sorted, 99.0),
            mad: percentile_sorted(&deviations, 50.0),
            drift,
        })
    }

    /// The 50th percentile (same as [`median`](Self::median)).
    pub fn p50(&self) -> f64 {
        self.median
    }

    /// Relative uncertainty of the median: the larger of the half-width of its 95% confidence
    /// interval for independent samples (a robust standard deviation from the MAD, turned into
    /// the standard error of a median) and the [`drift`](Self::drift) of the median with time,
    /// which the first misses when samples are correlated (a noisy neighbour, throttling).
    pub fn relative_median_error(&self) -> f64 {
        if self.median <= 0.0 {
            return 0.0;
        }
        let sigma = MAD_TO_SIGMA * self.mad;
        let independent =
            Z95 * MEDIAN_SE_FACTOR * sigma / (self.median * (self.count as f64).sqrt());
        independent.max(self.drift)
    }
}

/// Half the range of the medians of [`DRIFT_BLOCKS`] consecutive blocks of `samples` (in the order
/// they were taken), relative to `median`.
fn relative_block_drift(samples: &[f64], median: f64) -> f64 {
    let block = samples.len() / DRIFT_BLOCKS;
    if block < 2 || median <= 0.0 {
        return 0.0;
    }
    let medians: Vec<f64> = samples
        .chunks_exact(block)
        .take(DRIFT_BLOCKS)
        .map(|chunk| {
            let mut chunk = chunk.to_vec();
            chunk.sort_by(f64::total_cmp);
            percentile_sorted(&chunk, 50.0)
        })
        .collect();
    let (low, high) = medians
        .iter()
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), &m| {
            (lo.min(m), hi.max(m))
        });
    (high - low) / (2.0 * median)
}

/// The `p`-th percentile (0–100) of ascending `sorted` samples, interpolating linearly between
/// closest ranks (NumPy's default, Hyndman & Fan type 7).
///
/// # Panics
/// If `sorted` is empty.
pub fn percentile_sorted(sorted: &[f64], p: f64) -> f64 {
    assert!(!sorted.is_empty(), "percentile of no samples");
    let rank = (p.clamp(0.0, 100.0) / 100.0) * (sorted.len() - 1) as f64;
    let below = rank.floor() as usize;
    let above = rank.ceil() as usize;
    sorted[below] + (sorted[above] - sorted[below]) * (rank - below as f64)
}

/// Noise of the relative change between two medians: the two 95% half-widths combined in
/// quadrature.
pub fn relative_change_noise(old: &Summary, new: &Summary) -> f64 {
    old.relative_median_error()
        .hypot(new.relative_median_error())
}

/// Confidence of a paired change's interval: 99%.
const PAIRED_CONFIDENCE: f64 = 0.99;

/// Fewest pairs a paired change is read from: the widest interval, from the smallest to the
/// largest ratio, covers the median with 1 − 2·½⁸ = 99.2% at 8 pairs.
pub const MIN_PAIRS: usize = 8;

/// A change read from pairs of measurements taken back to back (the baseline's build, then the
/// new one, or the other way round), so that drift of the machine cancels in their ratio.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PairedChange {
    /// Relative change, the median of the pairs' `new / old` ratios minus 1.
    pub change: f64,
    /// Half-width of the 99% confidence interval of that median, as a relative change. The
    /// interval lies between order statistics of the ratios (the sign test's), so it assumes
    /// nothing of their distribution: a few pairs hit by a passing slowdown cannot widen it.
    pub noise: f64,
    /// Whether that interval leaves out "no change".
    pub beyond_noise: bool,
}

/// The change shown by `ratios` (`new / old` medians, one per pair). `None` with fewer than
/// [`MIN_PAIRS`] ratios or one that is not finite and positive.
pub fn paired_change(ratios: &[f64]) -> Option<PairedChange> {
    if ratios.len() < MIN_PAIRS || ratios.iter().any(|r| !(r.is_finite() && *r > 0.0)) {
        return None;
    }
    let mut logs: Vec<f64> = ratios.iter().map(|r| r.ln()).collect();
    logs.sort_by(f64::total_cmp);
    let n = logs.len();
    // The interval [l(k), l(n+1-k)] misses the median with probability 2·P(Binomial(n, ½) < k):
    // take the largest k that keeps this within 1%.
    let mut log_pmf = -(n as f64) * std::f64::consts::LN_2;
    let mut below = 0.0;
    let mut k = 0;
    while k < n / 2 {
        let with_next = below + log_pmf.exp();
        if 2.0 * with_next > 1.0 - PAIRED_CONFIDENCE {
            break;
        }
        below = with_next;
        log_pmf += ((n - k) as f64 / (k + 1) as f64).ln();
        k += 1;
    }
    let (low, high) = (logs[k.max(1) - 1], logs[n - k.max(1)]);
    let median = percentile_sorted(&logs, 50.0);
    Some(PairedChange {
        change: median.exp() - 1.0,
        noise: ((high - low) / 2.0).exp() - 1.0,
        beyond_noise: low > 0.0 || high < 0.0,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Type-7 percentile written out from its definition, independently of `percentile_sorted`:
    /// the value at fractional position h = (n-1)p between order statistics.
    fn reference(samples: &[f64], p: f64) -> f64 {
        let mut s = samples.to_vec();
        s.sort_by(f64::total_cmp);
        let h = (s.len() as f64 - 1.0) * p / 100.0;
        let lo = h as usize;
        let frac = h - lo as f64;
        if lo + 1 < s.len() {
            s[lo] * (1.0 - frac) + s[lo + 1] * frac
        } else {
            s[lo]
        }
    }

    #[test]
    fn percentiles_match_numpy_on_known_samples() {
        // numpy.percentile([15, 20, 35, 40, 50], [50, 90, 99]) = [35., 46., 49.6]
        let s = Summary::of(&[40.0, 15.0, 50.0, 35.0, 20.0]).unwrap();
        assert_eq!((s.min, s.median, s.max), (15.0, 35.0, 50.0));
        assert!(
            (s.p90 - 46.0).abs() < 1e-12 && (s.p99 - 49.6).abs() < 1e-12,
            "{s:?}"
        );
        assert_eq!(s.mean, 32.0);
        // deviations from 35: 20 15 0 5 15 -> median 15
        assert_eq!(s.mad, 15.0);
        // numpy.percentile([1, 2, 3, 4], 50) = 2.5
        assert_eq!(Summary::of(&[4.0, 1.0, 3.0, 2.0]).unwrap().median, 2.5);
    }

    #[test]
    fn percentiles_match_the_definition_on_many_samples() {
        // A deterministic, unsorted, skewed sample set (a logistic map).
        let mut x = 0.3_f64;
        let samples: Vec<f64> = (0..997)
            .map(|_| {
                x = 3.9 * x * (1.0 - x);
                1e-3 * (1.0 + 4.0 * x * x)
            })
            .collect();
        let s = Summary::of(&samples).unwrap();
        for (got, p) in [
            (s.median, 50.0),
            (s.p90, 90.0),
            (s.p99, 99.0),
            (s.min, 0.0),
            (s.max, 100.0),
        ] {
            assert!((got - reference(&samples, p)).abs() < 1e-15, "p{p}: {got}");
        }
        assert!(s.min <= s.median && s.median <= s.p90 && s.p90 <= s.p99 && s.p99 <= s.max);
    }

    #[test]
    fn a_single_sample_is_every_percentile_and_bad_samples_give_none() {
        let s = Summary::of(&[2.5]).unwrap();
        assert_eq!(
            (s.min, s.median, s.p90, s.p99, s.max, s.mad, s.drift),
            (2.5, 2.5, 2.5, 2.5, 2.5, 0.0, 0.0)
        );
        assert!(Summary::of(&[]).is_none());
        assert!(Summary::of(&[1.0, f64::NAN]).is_none());
    }

    #[test]
    fn median_error_shrinks_with_the_square_root_of_the_count() {
        // Normal-ish data: the scaled MAD estimates sigma, so the relative error of the median
        // for n samples is about 1.96 * 1.2533 * sigma / (median * sqrt(n)).
        let spread = |n: usize| -> Vec<f64> {
            (0..n)
                .map(|i| 1.0 + 0.01 * (((i * 7919) % n) as f64 / n as f64 - 0.5))
                .collect()
        };
        let small = Summary::of(&spread(100)).unwrap().relative_median_error();
        let large = Summary::of(&spread(400)).unwrap().relative_median_error();
        assert!((small / large - 2.0).abs() < 0.05, "{small} vs {large}");
        // Uniform on [0.995, 1.005]: MAD = 0.0025, sigma estimate 0.003707.
        let expected = Z95 * MEDIAN_SE_FACTOR * MAD_TO_SIGMA * 0.0025 / 10.0;
        assert!(
            (small - expected).abs() / expected < 0.02,
            "{small} vs {expected}"
        );
    }

    #[test]
    fn a_slow_phase_within_a_run_widens_the_noise() {
        // The same multiset of samples, interleaved or with the slow ones bunched in time.
        let fast = 1.0;
        let slow = 1.2;
        let interleaved: Vec<f64> = (0..100)
            .map(|i| if i % 5 == 0 { slow } else { fast })
            .collect();
        let mut bunched = interleaved.clone();
        bunched.sort_by(|a, b| b.total_cmp(a));
        let independent = Summary::of(&interleaved).unwrap();
        let drifting = Summary::of(&bunched).unwrap();
        assert_eq!(independent.median, drifting.median);
        assert_eq!(independent.drift, 0.0);
        // Block medians 1.2, 1, 1, 1, 1: half the range is 0.1 of the median.
        assert!((drifting.drift - 0.1).abs() < 1e-12, "{}", drifting.drift);
        assert!((drifting.relative_median_error() - 0.1).abs() < 1e-12);
        assert!(independent.relative_median_error() < 0.01);
    }

    #[test]
    fn paired_changes_have_a_sign_test_interval() {
        // 20 pairs: 2·P(Binomial(20, ½) ≤ 3) = 0.0026 and 2·P(≤ 4) = 0.0118 (1 351 and 6 196 of
        // 2²⁰), so the 99% interval runs from the 4th to the 17th smallest ratio.
        let ratios: Vec<f64> = (1..=20).map(|i| 1.0 + f64::from(i) / 100.0).collect();
        let paired = paired_change(&ratios).unwrap();
        let (low, high) = (1.04f64.ln(), 1.17f64.ln());
        assert!((paired.noise - (((high - low) / 2.0).exp() - 1.0)).abs() < 1e-12);
        let median = (1.10f64.ln() + 1.11f64.ln()) / 2.0;
        assert!((paired.change - (median.exp() - 1.0)).abs() < 1e-12);
        assert!(paired.beyond_noise);
        // Three pairs hit by a passing slowdown the other way do not hide the change...
        let mut hit = ratios.clone();
        hit[..3].copy_from_slice(&[0.5, 0.6, 0.7]);
        assert!(paired_change(&hit).unwrap().beyond_noise);
        // ...and four do.
        hit[3] = 0.8;
        assert!(!paired_change(&hit).unwrap().beyond_noise);
        // 10 pairs: only the whole range reaches 99% (2·11/1 024 = 2.1% at the next).
        let ten = paired_change(&ratios[..10]).unwrap();
        assert!((ten.noise - (((1.10f64.ln() - 1.01f64.ln()) / 2.0).exp() - 1.0)).abs() < 1e-12);
        // A faster build is a negative change.
        let faster: Vec<f64> = ratios.iter().map(|r| 1.0 / r).collect();
        let faster = paired_change(&faster).unwrap();
        assert!(faster.change < -0.09 && faster.beyond_noise, "{faster:?}");
        // Too few pairs, or a lost sample, conclude nothing.
        assert_eq!(paired_change(&ratios[..7]), None);
        let mut lost = ratios.clone();
        lost[5] = f64::NAN;
        assert_eq!(paired_change(&lost), None);
    }
}
