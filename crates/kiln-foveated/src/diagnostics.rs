//! Where the readouts look and how the two passes differ: the figures the training and
//! evaluation steps log beside the losses.

use burn::tensor::Tensor;
use burn::tensor::backend::Backend;

use crate::FoveatedOutput;

/// Keeps `0 · ln 0` at 0 in the entropy.
const TINY: f64 = 1e-30;

impl<B: Backend> FoveatedOutput<B> {
    /// Named one-element figures of this forward, those that apply to its mode:
    /// - `coarse_attention_entropy`, `fine_attention_entropy`: the readout's attention entropy
    ///   as a fraction of the uniform distribution's (1: every token alike; 0: one token), mean
    ///   over frames, layers and heads;
    /// - `coarse_attention_max`, `fine_attention_max`: the largest probability, same mean;
    /// - `coarse_fine_cosine`: cosine similarity of each frame's coarse and fine visual tokens;
    /// - `query_similarity`: cosine similarity of a clip's fine queries between two different
    ///   frames, mean over such pairs (needs two frames).
    pub fn diagnostics(&self) -> Vec<(&'static str, Tensor<B, 1>)> {
        let mut figures = Vec::new();
        let passes = [
            (
                "coarse_attention_entropy",
                "coarse_attention_max",
                &self.coarse,
            ),
            ("fine_attention_entropy", "fine_attention_max", &self.fine),
        ];
        for (entropy, max, pass) in passes {
            if let Some(attention) = pass.as_ref().and_then(|p| p.attention.clone()) {
                figures.push((entropy, relative_entropy(attention.clone())));
                figures.push((max, attention.max_dim(2).mean()));
            }
        }
        if let (Some(coarse), Some(fine)) = (&self.coarse, &self.fine) {
            figures.push((
                "coarse_fine_cosine",
                cosine(coarse.tokens.clone(), fine.tokens.clone()).mean(),
            ));
        }
        if let Some(queries) = self.queries.clone().filter(|q| q.dims()[1] > 1) {
            figures.push(("query_similarity", between_frames(queries)));
        }
        figures
    }
}

/// Entropy of each distribution along the last axis of `p` over `ln(len)`, mean of all.
fn relative_entropy<B: Backend>(p: Tensor<B, 3>) -> Tensor<B, 1> {
    let tokens = p.dims()[2];
    let entropy = (p.clone() * p.clamp_min(TINY).log()).sum_dim(2).neg();
    (entropy / (tokens as f64).ln().max(TINY)).mean()
}

/// Cosine similarity of `a` and `b` along their last axis.
fn cosine<B: Backend>(a: Tensor<B, 3>, b: Tensor<B, 3>) -> Tensor<B, 3> {
    let norm = |x: &Tensor<B, 3>| x.clone().powi_scalar(2).sum_dim(2).sqrt().clamp_min(TINY);
    let (na, nb) = (norm(&a), norm(&b));
    (a * b).sum_dim(2) / (na * nb)
}

/// Mean cosine similarity between the rows of each clip's `[frames, width]` block of `queries`
/// `[clips, frames, width]`, over pairs of distinct frames: `(|Σ q̂|² − Σ |q̂|²) / (T (T − 1))`
/// per clip, with `q̂` the unit rows.
fn between_frames<B: Backend>(queries: Tensor<B, 3>) -> Tensor<B, 1> {
    let [clips, frames, _] = queries.dims();
    let norms = queries
        .clone()
        .powi_scalar(2)
        .sum_dim(2)
        .sqrt()
        .clamp_min(TINY);
    let unit = queries / norms;
    let total = unit.clone().sum_dim(1).powi_scalar(2).sum();
    let own = unit.powi_scalar(2).sum();
    (total - own) / (clips * frames * (frames - 1)) as f64
}

#[cfg(test)]
mod tests {
    use burn::backend::Flex;
    use burn::tensor::{Distribution, Tensor, TensorData};

    use super::*;

    fn scalar(x: Tensor<Flex, 1>) -> f32 {
        x.into_scalar()
    }

    #[test]
    fn entropy_is_one_for_uniform_and_zero_for_one_token() {
        let device = Default::default();
        let uniform = Tensor::<Flex, 3>::full([2, 3, 8], 1.0 / 8.0, &device);
        assert!((scalar(relative_entropy(uniform)) - 1.0).abs() < 1e-6);
        let mut one_hot = vec![0f32; 2 * 8];
        one_hot[3] = 1.0;
        one_hot[8 + 5] = 1.0;
        let one = Tensor::<Flex, 3>::from_data(TensorData::new(one_hot, [2, 1, 8]), &device);
        assert!(scalar(relative_entropy(one)).abs() < 1e-6);
        // Two tokens at ½: ln 2 / ln 8 = ⅓.
        let half = Tensor::<Flex, 3>::from_data(
            TensorData::new(vec![0.5f32, 0.5, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0], [1, 1, 8]),
            &device,
        );
        assert!((scalar(relative_entropy(half)) - 1.0 / 3.0).abs() < 1e-6);
    }

    #[test]
    fn similarity_between_frames_matches_every_pair() {
        let device = Default::default();
        let queries = Tensor::<Flex, 3>::random([3, 4, 5], Distribution::Normal(0.0, 1.0), &device);
        let rows: Vec<f32> = queries.to_data().to_vec().unwrap();
        let row = |c: usize, t: usize| &rows[(c * 4 + t) * 5..(c * 4 + t + 1) * 5];
        let cos = |a: &[f32], b: &[f32]| {
            let dot: f32 = a.iter().zip(b).map(|(x, y)| x * y).sum();
            let norm = |x: &[f32]| x.iter().map(|v| v * v).sum::<f32>().sqrt();
            dot / (norm(a) * norm(b))
        };
        let (mut sum, mut pairs) = (0.0, 0);
        for c in 0..3 {
            for s in 0..4 {
                for t in (0..4).filter(|&t| t != s) {
                    sum += cos(row(c, s), row(c, t));
                    pairs += 1;
                }
            }
        }
        let ours = scalar(between_frames(queries.clone()));
        assert!(
            (ours - sum / pairs as f32).abs() < 1e-5,
            "{ours} vs {}",
            sum / pairs as f32
        );
        let same = scalar(cosine(queries.clone(), queries.clone() * 3.0).mean());
        let opposite = scalar(cosine(queries.clone(), queries.neg()).mean());
        assert!((same - 1.0).abs() < 1e-5 && (opposite + 1.0).abs() < 1e-5);
    }
}
