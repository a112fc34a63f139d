//! How a model plugs into the loop: one training step (a micro-batch in, a loss and named parts
//! out) on the autodiff backend, and one evaluation step (summed metrics) on its inner backend.

use burn::module::{AutodiffModule, Module};
use burn::tensor::Tensor;
use burn::tensor::backend::{AutodiffBackend, Backend};
use kiln_core::splitmix64;

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

/// A batch a step cannot use (a caption longer than the model's positions, a structure with an
/// element it has no embedding for), said in the data's terms; the loop names the step. Loaders
/// should refuse such items before training starts: this is the step's own last check.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct BadBatch(pub String);

/// A model the loop trains.
pub trait TrainStep<B: AutodiffBackend>: AutodiffModule<B> {
    /// What one micro-batch is (`Send`: on host backends the step runs on one of rayon's
    /// threads, see [`kiln_core::on_host_pool`]).
    type Batch: Send;

    /// The loss of one micro-batch (the loop scales it, runs the backward pass and steps), or
    /// why the batch cannot be used.
    fn train_step(
        &self,
        batch: Self::Batch,
        context: &StepContext,
    ) -> Result<StepOutput<B>, BadBatch>;
}

/// What an evaluation step gives: named metric sums over the batch, `[1]` each. The loop adds
/// them up over the evaluation set and divides each total by the number of items (a loss summed
/// over items, a count of correct answers), or by its own count (errors per atom, per force
/// component), taking the square root where the metric is a root mean square.
///
/// ```
/// # use burn::tensor::{Tensor, backend::Backend};
/// # fn metrics<B: Backend>(loss_sum: Tensor<B, 1>, squared_errors: Tensor<B, 1>) -> kiln_train::EvalOutput<B> {
/// kiln_train::EvalOutput::new(16)              // 16 structures
///     .with_sum("loss", loss_sum)              // reported per structure
///     .with_root_mean("force_rmse", squared_errors, 3 * 250) // RMSE over 250 atoms' components
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct EvalOutput<B: Backend> {
    /// The metrics.
    pub sums: Vec<EvalSum<B>>,
    /// Items in the batch.
    pub items: usize,
}

/// One metric of an evaluation batch.
#[derive(Debug, Clone)]
pub struct EvalSum<B: Backend> {
    /// Its name.
    pub name: String,
    /// The batch's sum, `[1]`.
    pub sum: Tensor<B, 1>,
    /// What the batch adds to the divisor (`None`: its items).
    pub count: Option<usize>,
    /// Whether the metric is the square root of the mean.
    pub root: bool,
}

impl<B: Backend> EvalOutput<B> {
    /// No metrics yet, for a batch of `items`.
    pub fn new(items: usize) -> Self {
        EvalOutput {
            sums: Vec::new(),
            items,
        }
    }

    /// A metric averaged over items.
    pub fn with_sum(self, name: &str, sum: Tensor<B, 1>) -> Self {
        self.with(name, sum, None, false)
    }

    /// A metric averaged over its own `count` of terms in this batch.
    pub fn with_mean(self, name: &str, sum: Tensor<B, 1>, count: usize) -> Self {
        self.with(name, sum, Some(count), false)
    }

    /// The root of the mean of `squares` over `count` terms in this batch (an RMSE).
    pub fn with_root_mean(self, name: &str, squares: Tensor<B, 1>, count: usize) -> Self {
        self.with(name, squares, Some(count), true)
    }

    fn with(mut self, name: &str, sum: Tensor<B, 1>, count: Option<usize>, root: bool) -> Self {
        self.sums.push(EvalSum {
            name: name.into(),
            sum,
            count,
            root,
        });
        self
    }
}

/// A model the loop evaluates (implemented by the inner module of a [`TrainStep`] model: no
/// gradients are recorded).
pub trait EvalStep<B: Backend>: Module<B> {
    /// What one evaluation batch is (`Send`, as [`TrainStep::Batch`]).
    type Batch: Send;

    /// Metric sums over one batch, or why the batch cannot be used.
    fn eval_step(&self, batch: Self::Batch) -> Result<EvalOutput<B>, BadBatch>;
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
