//! Per-image running mean and variance of embeddings over passes, in f64.

use crate::McError;

/// For each of `images` images and each of `dims` embedding dimensions, the number of passes
/// seen, their mean and the sum of squared deviations from it (Welford's `M2`), in f64.
///
/// Passes update one batch of images at a time ([`Self::add_pass`]); statistics built apart
/// (shards, devices, batches) combine exactly with [`Self::merge`] (Chan, Golub and LeVeque's
/// pairwise update). The variance is the sample variance, `M2 / (n − 1)`.
#[derive(Debug, Clone, PartialEq)]
pub struct EmbeddingStats {
    dims: usize,
    count: Vec<u64>,
    mean: Vec<f64>,
    m2: Vec<f64>,
}

impl EmbeddingStats {
    /// No passes yet for `images` images of `dims`-dimensional embeddings.
    pub fn new(images: usize, dims: usize) -> Self {
        EmbeddingStats {
            dims,
            count: vec![0; images],
            mean: vec![0.0; images * dims],
            m2: vec![0.0; images * dims],
        }
    }

    /// Statistics from their moments: per image the pass count, and per image and dimension the
    /// mean and `M2` (sum of squared deviations from the mean), `[images, dims]` row-major.
    pub fn from_moments(
        dims: usize,
        count: Vec<u64>,
        mean: Vec<f64>,
        m2: Vec<f64>,
    ) -> Result<Self, McError> {
        let values = count.len() * dims;
        if mean.len() != values || m2.len() != values {
            return Err(McError::Shape(format!(
                "{} means and {} M2 values for {} images of {dims} dimensions",
                mean.len(),
                m2.len(),
                count.len()
            )));
        }
        Ok(EmbeddingStats {
            dims,
            count,
            mean,
            m2,
        })
    }

    /// Statistics from each image's pass count, mean and sample variance (as
    /// [`Self::variances`] gives them).
    pub fn from_variances(
        dims: usize,
        count: Vec<u64>,
        mean: Vec<f64>,
        variance: &[f64],
    ) -> Result<Self, McError> {
        let m2 = variance
            .chunks(dims.max(1))
            .zip(&count)
            .flat_map(|(row, &n)| row.iter().map(move |v| v * n.saturating_sub(1) as f64))
            .collect();
        Self::from_moments(dims, count, mean, m2)
    }

    /// Passes seen per image.
    pub fn counts(&self) -> &[u64] {
        &self.count
    }

    /// Images tracked.
    pub fn images(&self) -> usize {
        self.count.len()
    }

    /// Embedding dimensions.
    pub fn dims(&self) -> usize {
        self.dims
    }

    /// Passes seen for `image`.
    pub fn count(&self, image: usize) -> u64 {
        self.count[image]
    }

    /// Adds one pass over the images `items`: `embeddings` holds their rows, `[items.len(), dims]`
    /// row-major (an image may appear more than once: each row is one pass).
    pub fn add_pass(&mut self, items: &[usize], embeddings: &[f32]) -> Result<(), McError> {
        if embeddings.len() != items.len() * self.dims {
            return Err(McError::Shape(format!(
                "{} values for {} images of {} dimensions",
                embeddings.len(),
                items.len(),
                self.dims
            )));
        }
        if let Some(&bad) = items.iter().find(|&&i| i >= self.images()) {
            return Err(McError::Shape(format!(
                "image {bad} of {} tracked",
                self.images()
            )));
        }
        for (&image, row) in items.iter().zip(embeddings.chunks_exact(self.dims)) {
            self.count[image] += 1;
            let n = self.count[image] as f64;
            let span = image * self.dims..(image + 1) * self.dims;
            for ((mean, m2), &x) in self.mean[span.clone()]
                .iter_mut()
                .zip(&mut self.m2[span])
                .zip(row)
            {
                let x = f64::from(x);
                let delta = x - *mean;
                *mean += delta / n;
                *m2 += delta * (x - *mean);
            }
        }
        Ok(())
    }

    /// Folds in statistics of the same images built elsewhere, as if their passes had been added
    /// here.
    pub fn merge(&mut self, other: &EmbeddingStats) -> Result<(), McError> {
        if (other.images(), other.dims) != (self.images(), self.dims) {
            return Err(McError::Shape(format!(
                "cannot merge statistics of {} × {} into {} × {}",
                other.images(),
                other.dims,
                self.images(),
                self.dims
            )));
        }
        for image in 0..self.images() {
            let (a, b) = (self.count[image] as f64, other.count[image] as f64);
            if b == 0.0 {
                continue;
            }
            let n = a + b;
            let span = image * self.dims..(image + 1) * self.dims;
            for d in span {
                let delta = other.mean[d] - self.mean[d];
                self.mean[d] += delta * b / n;
                self.m2[d] += other.m2[d] + delta * delta * a * b / n;
            }
            self.count[image] += other.count[image];
        }
        Ok(())
    }

    /// The mean embedding of `image` over its passes.
    pub fn mean(&self, image: usize) -> &[f64] {
        &self.mean[image * self.dims..(image + 1) * self.dims]
    }

    /// The sample variance of each dimension of `image`'s embedding (0 with fewer than two
    /// passes).
    pub fn variance(&self, image: usize) -> Vec<f64> {
        let n = self.count[image];
        self.m2[image * self.dims..(image + 1) * self.dims]
            .iter()
            .map(|&m2| if n > 1 { m2 / (n - 1) as f64 } else { 0.0 })
            .collect()
    }

    /// Every image's mean, `[images, dims]` row-major.
    pub fn means(&self) -> &[f64] {
        &self.mean
    }

    /// Each image's uncertainty score: the sum over dimensions of its embedding's variance.
    pub fn uncertainty(&self) -> Vec<f64> {
        (0..self.images())
            .map(|image| self.variance(image).iter().sum())
            .collect()
    }

    /// Every image's variance, `[images, dims]` row-major.
    pub fn variances(&self) -> Vec<f64> {
        (0..self.images()).flat_map(|i| self.variance(i)).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wrong_shapes_are_errors_that_change_nothing() {
        let mut stats = EmbeddingStats::new(2, 3);
        let before = stats.clone();
        assert!(
            stats
                .add_pass(&[0], &[1.0, 2.0])
                .unwrap_err()
                .to_string()
                .contains("2 values")
        );
        assert!(
            stats
                .add_pass(&[5], &[1.0, 2.0, 3.0])
                .unwrap_err()
                .to_string()
                .contains("image 5")
        );
        assert!(stats.merge(&EmbeddingStats::new(3, 3)).is_err());
        assert_eq!(stats, before);
    }
}
