//! Statistics across the K trials of one (model, T): how far the T-pass estimates still move
//! from trial to trial.

use crate::McError;
use crate::welford::EmbeddingStats;

/// What K trials of T passes each say about whether T is enough.
///
/// Per image, the uncertainty score of a trial is the sum over dimensions of the embedding's
/// variance over its passes (the trace of the covariance). Every figure is a mean over images.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct NestedStats {
    /// Trials compared (K).
    pub trials: usize,
    /// Sum over dimensions of the between-trial sample variance of the T-pass mean embedding:
    /// falls as 1/T for independent passes.
    pub mean_variance: f64,
    /// The uncertainty score, averaged over trials.
    pub uncertainty: f64,
    /// The between-trial standard deviation of the uncertainty score.
    pub uncertainty_spread: f64,
    /// Mean Spearman correlation of the images' uncertainty scores over all pairs of trials: 1
    /// when every trial ranks the images alike; NaN when a trial's scores are all equal (no
    /// ranking, e.g. without dropout).
    pub rank_stability: f64,
}

impl NestedStats {
    /// The statistics of `trials`, each over the same images and dimensions (at least two).
    pub fn new(trials: &[EmbeddingStats]) -> Result<Self, McError> {
        let [first, ..] = trials else {
            return Err(McError::Shape("no trials".into()));
        };
        if trials.len() < 2 {
            return Err(McError::Shape(
                "between-trial statistics need at least two trials".into(),
            ));
        }
        let (images, dims) = (first.images(), first.dims());
        if let Some(other) = trials
            .iter()
            .find(|t| (t.images(), t.dims()) != (images, dims))
        {
            return Err(McError::Shape(format!(
                "trials over {images} × {dims} and {} × {}",
                other.images(),
                other.dims()
            )));
        }
        let k = trials.len() as f64;
        let scores: Vec<Vec<f64>> = trials.iter().map(EmbeddingStats::uncertainty).collect();
        let per_image = |image: usize| {
            let mean_variance: f64 = (0..dims)
                .map(|d| sample_variance(trials.iter().map(|t| t.mean(image)[d])))
                .sum();
            let image_scores = scores.iter().map(|s| s[image]);
            let uncertainty = image_scores.clone().sum::<f64>() / k;
            let spread = sample_variance(image_scores).sqrt();
            (mean_variance, uncertainty, spread)
        };
        let (mut mean_variance, mut uncertainty, mut spread) = (0.0, 0.0, 0.0);
        for image in 0..images {
            let (m, u, s) = per_image(image);
            mean_variance += m;
            uncertainty += u;
            spread += s;
        }
        let n = images.max(1) as f64;
        let mut correlations = Vec::new();
        for (i, a) in scores.iter().enumerate() {
            for b in &scores[i + 1..] {
                correlations.push(spearman(a, b));
            }
        }
        Ok(NestedStats {
            trials: trials.len(),
            mean_variance: mean_variance / n,
            uncertainty: uncertainty / n,
            uncertainty_spread: spread / n,
            rank_stability: correlations.iter().sum::<f64>() / correlations.len() as f64,
        })
    }
}

/// Sample variance (n − 1) of `values`, two-pass.
fn sample_variance(values: impl Iterator<Item = f64> + Clone) -> f64 {
    let n = values.clone().count() as f64;
    let mean = values.clone().sum::<f64>() / n;
    values.map(|v| (v - mean).powi(2)).sum::<f64>() / (n - 1.0)
}

/// Spearman's rank correlation of `a` and `b`: Pearson's correlation of their ranks, tied
/// values sharing their mean rank. NaN when either is constant.
pub fn spearman(a: &[f64], b: &[f64]) -> f64 {
    pearson(&ranks(a), &ranks(b))
}

/// 1-based ranks, ties given the mean of the ranks they span.
fn ranks(values: &[f64]) -> Vec<f64> {
    let mut order: Vec<usize> = (0..values.len()).collect();
    order.sort_by(|&i, &j| values[i].total_cmp(&values[j]));
    let mut ranks = vec![0.0; values.len()];
    let mut start = 0;
    while start < order.len() {
        let mut end = start + 1;
        while end < order.len() && values[order[end]] == values[order[start]] {
            end += 1;
        }
        let rank = (start + end + 1) as f64 / 2.0;
        for &i in &order[start..end] {
            ranks[i] = rank;
        }
        start = end;
    }
    ranks
}

fn pearson(a: &[f64], b: &[f64]) -> f64 {
    let n = a.len() as f64;
    let (ma, mb) = (a.iter().sum::<f64>() / n, b.iter().sum::<f64>() / n);
    let (mut ab, mut aa, mut bb) = (0.0, 0.0, 0.0);
    for (x, y) in a.iter().zip(b) {
        ab += (x - ma) * (y - mb);
        aa += (x - ma).powi(2);
        bb += (y - mb).powi(2);
    }
    ab / (aa * bb).sqrt()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spearman_of_known_rankings() {
        let a = [1.0, 2.0, 3.0, 4.0, 5.0];
        assert!((spearman(&a, &[10.0, 20.0, 30.0, 40.0, 50.0]) - 1.0).abs() < 1e-15);
        assert!((spearman(&a, &[5.0, 4.0, 3.0, 2.0, 1.0]) + 1.0).abs() < 1e-15);
        // Ranks of b with a tie: [1, 2.5, 2.5, 4, 5]; Pearson with 1..5 is 9.5 / √(10 · 9.5).
        let tied = spearman(&a, &[1.0, 7.0, 7.0, 8.0, 9.0]);
        assert!(
            (tied - 9.5 / (10.0f64 * 9.5).sqrt()).abs() < 1e-15,
            "{tied}"
        );
        assert!(spearman(&a, &[2.0; 5]).is_nan());
    }

    #[test]
    fn fewer_than_two_trials_or_unlike_trials_are_errors() {
        let one = EmbeddingStats::new(3, 2);
        assert!(NestedStats::new(&[]).is_err());
        assert!(
            NestedStats::new(std::slice::from_ref(&one))
                .unwrap_err()
                .to_string()
                .contains("two")
        );
        assert!(NestedStats::new(&[one, EmbeddingStats::new(3, 4)]).is_err());
    }
}
