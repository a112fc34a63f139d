//! How a model plugs into the loop: one training step (a micro-batch in, a loss and named parts
//! out) on the autodiff backend, and one evaluation step (summed metrics) on its inner backend.

use burn::module::{AutodiffModule, Module};
use burn::tensor::Tensor;
use burn::tensor::backend::{AutodiffBackend, Backend};

/// Where a training step stands, for models that draw random numbers (dropout, augmentation):
/// seeding from `(seed, step, micro_batch)` makes a resumed run draw what the uninterrupted run
/// drew. The loop also seeds the backend's generator from them before every micro-batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StepContext {
    /// The run's seed.
    pub seed: u64,
    /// Optimizer steps taken before this one.
    pub step: u64,
    /// The micro-batch within the step (0..accumulate).
    pub micro_batch: usize,
}

impl StepContext {
    /// One 64-bit seed for this micro-batch (SplitMix64 over the three numbers).
    pub fn derived_seed(&self) -> u64 {
        let mut z = self.seed;
        for v in [self.step, self.micro_batch as u64] {
            z = splitmix64(z ^ v.wrapping_mul(0x9E37_79B9_7F4A_7C15));
        }
        z
    }
}

fn splitmix64(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// What a training step gives: the loss to minimise (mean over the micro-batch) and named parts
/// to log beside it (energy and force terms, accuracy…), all one-element tensors.
#[derive(Debug, Clone)]
pub struct StepOutput<B: Backend> {
    /// The loss, `[1]`.
    pub loss: Tensor<B, 1>,
    /// Named values logged per step (averaged over the micro-batches), `[1]` each.
    pub parts: Vec<(String, Tensor<B, 1>)>,
    /// Items in the micro-batch (for items/s).
    pub items: usize,
}

impl<B: Backend> StepOutput<B> {
    /// A loss alone.
    pub fn new(loss: Tensor<B, 1>, items: usize) -> Self {
        StepOutput {
            loss,
            parts: Vec::new(),
            items,
        }
    }

    /// The same with a named part.
    pub fn with_part(mut self, name: &str, value: Tensor<B, 1>) -> Self {
        self.parts.push((name.into(), value));
        self
    }
}

/// A model the loop trains.
pub trait TrainStep<B: AutodiffBackend>: AutodiffModule<B> {
    /// What one micro-batch is (`Send`: on host backends the step runs on one of rayon's
    /// threads, see [`kiln_precision::on_host_pool`]).
    type Batch: Send;

    /// The loss of one micro-batch (the loop scales it, runs the backward pass and steps).
    fn train_step(&self, batch: Self::Batch, context: &StepContext) -> StepOutput<B>;
}

/// What an evaluation step gives: sums over the batch's items of named metrics (a loss summed
/// over items, a count of correct answers), `[1]` each; the loop divides the totals by the
/// number of items.
#[derive(Debug, Clone)]
pub struct EvalOutput<B: Backend> {
    /// Named sums, `[1]` each.
    pub sums: Vec<(String, Tensor<B, 1>)>,
    /// Items in the batch.
    pub items: usize,
}

/// A model the loop evaluates (implemented by the inner module of a [`TrainStep`] model: no
/// gradients are recorded).
pub trait EvalStep<B: Backend>: Module<B> {
    /// What one evaluation batch is (`Send`, as [`TrainStep::Batch`]).
    type Batch: Send;

    /// Metric sums over one batch.
    fn eval_step(&self, batch: Self::Batch) -> EvalOutput<B>;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn derived_seeds_differ_by_step_and_micro_batch() {
        let at = |step, micro_batch| {
            StepContext {
                seed: 7,
                step,
                micro_batch,
            }
            .derived_seed()
        };
        let seeds = [at(0, 0), at(0, 1), at(1, 0), at(1, 1)];
        for i in 0..4 {
            for j in i + 1..4 {
                assert_ne!(seeds[i], seeds[j]);
            }
        }
        assert_eq!(at(3, 1), at(3, 1));
    }
}
