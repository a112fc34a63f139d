//! Rotary position embeddings as transformers' Llama applies them: frequencies
//! `θ^(−2i/d)` (divided by the factor of `linear` scaling), the angles of each position rotating
//! the pairs `(x_i, x_{i + d/2})` (`rotate_half`, not interleaved pairs).

use burn::tensor::backend::Backend;
use burn::tensor::{Tensor, TensorData};

/// A model's rotary frequencies.
#[derive(Debug, Clone)]
pub struct Rope {
    /// One per pair of columns, `d / 2` of them, in f64.
    inverse_frequencies: Vec<f64>,
}

impl Rope {
    /// The frequencies `θ^(−2i/d) / divisor` of heads of `head_dim` columns (`divisor`: the
    /// factor of `linear` scaling, 1 without).
    pub fn new(head_dim: usize, theta: f64, divisor: f64) -> Self {
        let dim = head_dim;
        let inverse_frequencies = (0..dim / 2)
            .map(|i| theta.powf(-((2 * i) as f64) / dim as f64) / divisor)
            .collect();
        Rope {
            inverse_frequencies,
        }
    }

    /// `cos` and `sin` of the angles of `positions` `[batch][tokens]`, each row-major
    /// `[batch, tokens, head_dim]` (the two halves of a row equal), computed in f64.
    pub fn table(&self, positions: &[Vec<usize>]) -> (Vec<f32>, Vec<f32>) {
        let half = self.inverse_frequencies.len();
        let count = positions.iter().map(Vec::len).sum::<usize>();
        let mut cos = Vec::with_capacity(count * 2 * half);
        let mut sin = Vec::with_capacity(count * 2 * half);
        for &position in positions.iter().flatten() {
            for _ in 0..2 {
                for frequency in &self.inverse_frequencies {
                    let angle = position as f64 * frequency;
                    cos.push(angle.cos() as f32);
                    sin.push(angle.sin() as f32);
                }
            }
        }
        (cos, sin)
    }

    /// [`Self::table`] as tensors `[batch, 1, tokens, head_dim]`, to broadcast over the heads.
    pub fn angles<B: Backend>(
        &self,
        positions: &[Vec<usize>],
        device: &B::Device,
    ) -> (Tensor<B, 4>, Tensor<B, 4>) {
        let (batch, tokens) = (positions.len(), positions.first().map_or(0, Vec::len));
        let shape = [batch, 1, tokens, 2 * self.inverse_frequencies.len()];
        let (cos, sin) = self.table(positions);
        let tensor = |values| Tensor::from_data(TensorData::new(values, shape), device);
        (tensor(cos), tensor(sin))
    }

    /// `x cos + rotate_half(x) sin` for `x` `[batch, heads, tokens, head_dim]`.
    pub fn apply<B: Backend>(
        x: Tensor<B, 4>,
        cos: &Tensor<B, 4>,
        sin: &Tensor<B, 4>,
    ) -> Tensor<B, 4> {
        let [batch, heads, tokens, dim] = x.dims();
        let half = dim / 2;
        let first = x.clone().slice([0..batch, 0..heads, 0..tokens, 0..half]);
        let second = x.clone().slice([0..batch, 0..heads, 0..tokens, half..dim]);
        let rotated = Tensor::cat(vec![second.neg(), first], 3);
        x * cos.clone() + rotated * sin.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::backend::Flex;
    use kiln_kernels::rotary::{Angles, Turn, rotate_rows};

    /// Rotating keeps each pair's length, and the score of a query and a key rotated to
    /// positions m and n depends on m − n only (RoPE's defining property).
    #[test]
    fn scores_depend_on_relative_position_only() {
        let rope = Rope::new(8, 100_000.0, 1.0);
        let device = Default::default();
        let q = Tensor::<Flex, 4>::from_floats(
            [[[[0.3, -1.2, 0.7, 2.0, -0.4, 0.9, 1.1, -0.8]]]],
            &device,
        );
        let k = Tensor::<Flex, 4>::from_floats(
            [[[[1.5, 0.2, -0.6, 0.4, 0.8, -1.3, 0.5, 0.1]]]],
            &device,
        );
        let score = |m: usize, n: usize| {
            let (cos, sin) = rope.angles::<Flex>(&[vec![m]], &device);
            let q = Rope::apply(q.clone(), &cos, &sin);
            let (cos, sin) = rope.angles::<Flex>(&[vec![n]], &device);
            let k = Rope::apply(k.clone(), &cos, &sin);
            (q * k).sum().into_scalar()
        };
        let (near, far) = (score(3, 1), score(40, 38));
        assert!((near - far).abs() < 1e-4, "{near} vs {far}");
        assert!((score(3, 1) - score(1, 3)).abs() > 1e-3);
        let (cos, sin) = rope.angles::<Flex>(&[vec![17]], &device);
        let norm = |x: Tensor<Flex, 4>| x.powi_scalar(2).sum().into_scalar();
        assert!((norm(Rope::apply(q.clone(), &cos, &sin)) - norm(q.clone())).abs() < 1e-4);
        // The host rotation of rows is the tensor one.
        let mut rows: Vec<f32> = q.clone().into_data().to_vec().unwrap();
        let (cos_rows, sin_rows) = rope.table(&[vec![17]]);
        let angles = Angles {
            cos: &cos_rows,
            sin: &sin_rows,
        };
        rotate_rows(&mut rows, 8, 0, 1, angles, Turn::Forward);
        let tensor: Vec<f32> = Rope::apply(q, &cos, &sin).into_data().to_vec().unwrap();
        assert!(rows.iter().zip(&tensor).all(|(a, b)| (a - b).abs() < 1e-6));
    }
}
