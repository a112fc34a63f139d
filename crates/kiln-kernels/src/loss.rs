//! Cross-entropy of class logits, with a faster path where training spends its time: on
//! `Autodiff<Flex>` in f32 one [`HostOp`] whose rows run on every thread with kiln's vectorised
//! [`math::exp`], where burn's `log_softmax` is five passes over the logits on one thread each
//! way (a language model's 49 152-wide vocabulary makes them large).

use std::sync::Arc;

use burn::tensor::activation::log_softmax;
use burn::tensor::backend::Backend;
use burn::tensor::{Int, Tensor, TensorData};
use rayon::prelude::*;

use crate::host_op::{HostOp, host_op};
use crate::math;
use crate::values::zeros;

/// The mean over the counted rows of `−log softmax(logits)[target]`, for `logits` `[rows,
/// classes]` and one target per row (negative: the row is not counted); `None` when no row
/// counts. Targets must be below `classes`.
///
/// ```
/// # use burn::backend::{Autodiff, Flex};
/// # use burn::tensor::Tensor;
/// let logits = Tensor::<Autodiff<Flex>, 2>::from_floats([[0.0, 0.0], [5.0, 1.0]], &Default::default());
/// let loss = kiln_kernels::cross_entropy(logits, &[1, -1]).unwrap();
/// assert!((loss.into_scalar() - std::f32::consts::LN_2).abs() < 1e-6);
/// ```
pub fn cross_entropy<B: Backend>(logits: Tensor<B, 2>, targets: &[i64]) -> Option<Tensor<B, 1>> {
    let [rows, classes] = logits.dims();
    assert_eq!(targets.len(), rows, "cross_entropy: one target per row");
    assert!(
        targets.iter().all(|&t| t < classes as i64),
        "cross_entropy: a target at or above {classes} classes"
    );
    let counted = targets.iter().filter(|&&t| t >= 0).count();
    if counted == 0 {
        return None;
    }
    let op = CrossEntropy {
        classes,
        counted,
        targets: targets.into(),
    };
    host_op(op, [&logits], [1]).or_else(|| Some(with_tensor_operations(logits, targets)))
}

/// [`cross_entropy`] through burn's operations.
fn with_tensor_operations<B: Backend>(logits: Tensor<B, 2>, targets: &[i64]) -> Tensor<B, 1> {
    let device = logits.device();
    let (rows, classes): (Vec<i64>, Vec<i64>) = (targets.iter().enumerate())
        .filter(|&(_, &class)| class >= 0)
        .map(|(row, &class)| (row as i64, class))
        .unzip();
    let count = rows.len();
    let rows = Tensor::<B, 1, Int>::from_data(TensorData::new(rows, [count]), &device);
    let classes = Tensor::<B, 2, Int>::from_data(TensorData::new(classes, [count, 1]), &device);
    let log_probs = log_softmax(logits.select(0, rows), 1);
    log_probs.gather(1, classes).mean().neg()
}

/// `[logits]` → `[mean loss]`.
#[derive(Debug, Clone)]
struct CrossEntropy {
    classes: usize,
    counted: usize,
    targets: Arc<[i64]>,
}

/// `(max, Σ exp(x − max))` of a row, compiled (through `pulp`'s dispatch) for the best SIMD
/// instruction set the CPU has.
fn shifted_sum(row: &[f32]) -> (f32, f32) {
    pulp::Arch::new().dispatch(
        #[inline(always)]
        || shifted_sum_of(row),
    )
}

/// [`shifted_sum`]'s arithmetic.
#[inline(always)]
fn shifted_sum_of(row: &[f32]) -> (f32, f32) {
    let max = row.iter().fold(f32::NEG_INFINITY, |m, &x| m.max(x));
    let mut lanes = [0.0f32; 16];
    let mut chunks = row.chunks_exact(16);
    for chunk in &mut chunks {
        for (lane, &x) in lanes.iter_mut().zip(chunk) {
            *lane += math::exp(x - max);
        }
    }
    let rest: f32 = chunks.remainder().iter().map(|&x| math::exp(x - max)).sum();
    (max, lanes.iter().sum::<f32>() + rest)
}

/// `x`, or 0 where it is subnormal. A probability that small weighs nothing in any gradient, but
/// every product that reads a subnormal on x86 takes a microcode assist: a language model's
/// `[rows, vocabulary]` logit gradient that was 98% subnormal (logits spread over ±100, as a
/// randomly initialised head gives) made its head's weight gradient 90× slower.
#[inline(always)]
fn flushed(x: f32) -> f32 {
    if x.abs() < f32::MIN_POSITIVE { 0.0 } else { x }
}

impl HostOp<1> for CrossEntropy {
    fn forward(&self, [logits]: [&[f32]; 1]) -> Vec<f32> {
        let mut losses = Vec::new();
        (logits.par_chunks(self.classes.max(1)))
            .zip(self.targets.par_iter())
            .map(|(row, &target)| match target {
                ..0 => 0.0,
                _ => {
                    let (max, sum) = shifted_sum(row);
                    f64::from(max + sum.ln() - row[target as usize])
                }
            })
            .collect_into_vec(&mut losses);
        // Summed in row order, whatever the threads did: the same bits every run.
        vec![(losses.iter().sum::<f64>() / self.counted as f64) as f32]
    }

    /// `g / counted · (softmax(row) − one_hot(target))` on counted rows, 0 on the others.
    fn backward(&self, grad: &[f32], [logits]: [&[f32]; 1]) -> [Vec<f32>; 1] {
        let scale = grad[0] / self.counted as f32;
        let mut dlogits = zeros(logits.len());
        (dlogits.par_chunks_mut(self.classes.max(1)))
            .zip(logits.par_chunks(self.classes.max(1)))
            .zip(self.targets.par_iter())
            .filter(|&(_, &target)| target >= 0)
            .for_each(|((d, row), &target)| {
                pulp::Arch::new().dispatch(
                    #[inline(always)]
                    || {
                        let (max, sum) = shifted_sum_of(row);
                        let factor = scale / sum;
                        (d.iter_mut().zip(row))
                            .for_each(|(d, &x)| *d = flushed(factor * math::exp(x - max)));
                    },
                );
                d[target as usize] -= scale;
            });
        [dlogits]
    }
}

#[cfg(all(test, feature = "flex"))]
mod tests {
    use burn::backend::{Autodiff, Flex};
    use burn::tensor::{Distribution, Tensor, TensorData};

    /// The operation against the same loss through burn's operations on the same backend:
    /// the value and the logits' gradient, uncounted rows included.
    #[test]
    fn the_host_loss_matches_burns_value_and_gradient() {
        type Ad = Autodiff<Flex>;
        let device = Default::default();
        let logits = Tensor::<Ad, 2>::random([9, 1003], Distribution::Normal(0.0, 4.0), &device)
            .require_grad();
        let targets = [3, -1, 1002, 0, 500, -1, 7, 7, 999];
        let ours = super::cross_entropy(logits.clone(), &targets).unwrap();
        let burns = super::with_tensor_operations(logits.clone(), &targets);
        let value = |t: &Tensor<Ad, 1>| t.clone().into_scalar();
        assert!((value(&ours) - value(&burns)).abs() <= 1e-5 * value(&burns).abs());
        let slope = |loss: Tensor<Ad, 1>| logits.grad(&loss.backward()).unwrap();
        let (ours, burns) = (slope(ours), slope(burns));
        let max = |t: Tensor<Flex, 2>| t.abs().max().into_scalar();
        let gap = max(ours.clone() - burns.clone());
        assert!(gap <= 1e-6 * max(burns), "gradients: {gap}");
        // Uncounted rows get no gradient.
        assert_eq!(max(ours.slice([1..2, 0..1003])), 0.0);
        assert!(super::cross_entropy(logits, &[-1; 9]).is_none());
    }

    /// Logits spread over 110 (as a randomly initialised head's): burn's gradient holds
    /// subnormal probabilities; ours has none and is otherwise the same.
    #[test]
    fn the_gradient_has_no_subnormal_values() {
        type Ad = Autodiff<Flex>;
        let device = Default::default();
        // Each row falls from 0 to −110: the probabilities below e^−86 / 4 are subnormal.
        let ramp: Vec<f32> = (0..4 * 4096)
            .map(|i| -110.0 * (i % 4096) as f32 / 4095.0)
            .collect();
        let logits =
            Tensor::<Ad, 2>::from_data(TensorData::new(ramp, [4, 4096]), &device).require_grad();
        let targets = [5, 4000, 17, 2048];
        let slope = |loss: Tensor<Ad, 1>| {
            let grad = logits.grad(&loss.backward()).unwrap();
            grad.into_data().to_vec::<f32>().unwrap()
        };
        let ours = slope(super::cross_entropy(logits.clone(), &targets).unwrap());
        let burns = slope(super::with_tensor_operations(logits.clone(), &targets));
        let subnormal = |values: &[f32]| values.iter().filter(|x| x.is_subnormal()).count();
        assert!(
            subnormal(&burns) > 1000,
            "the case must produce subnormal values"
        );
        assert_eq!(subnormal(&ours), 0);
        for (a, b) in ours.iter().zip(&burns) {
            // Flushed values differ by less than the smallest normal f32.
            assert!(
                (a - b).abs() <= 1e-6 * b.abs() + f32::MIN_POSITIVE,
                "{a} vs {b}"
            );
        }
    }
}
