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
    let counted = targets.iter().filter(|&&t| t >= 0).count();
    if counted == 0 {
        return None;
    }
    let weights = vec![1.0 / counted as f32; targets.len()];
    Some(weighted_cross_entropy(logits, targets, &weights))
}

/// `Σ_rows weight · −log softmax(logits)[target]` for `logits` `[rows, classes]`, one target and
/// one weight per row (a negative target or a zero weight: the row is not counted and costs
/// nothing). Several losses over one forward's logits (all of a sequence's tokens, its first
/// ones) are each a weighting of the same rows. Targets must be below `classes`.
///
/// ```
/// # use burn::backend::{Autodiff, Flex};
/// # use burn::tensor::Tensor;
/// let logits = Tensor::<Autodiff<Flex>, 2>::from_floats([[0.0, 0.0], [5.0, 1.0]], &Default::default());
/// let loss = kiln_kernels::weighted_cross_entropy(logits, &[1, 0], &[2.0, 0.0]);
/// assert!((loss.into_scalar() - 2.0 * std::f32::consts::LN_2).abs() < 1e-6);
/// ```
pub fn weighted_cross_entropy<B: Backend>(
    logits: Tensor<B, 2>,
    targets: &[i64],
    weights: &[f32],
) -> Tensor<B, 1> {
    let [rows, classes] = logits.dims();
    assert_eq!(targets.len(), rows, "cross_entropy: one target per row");
    assert_eq!(weights.len(), rows, "cross_entropy: one weight per row");
    assert!(
        targets.iter().all(|&t| t < classes as i64),
        "cross_entropy: a target at or above {classes} classes"
    );
    let targets: Arc<[i64]> = (targets.iter().zip(weights))
        .map(|(&t, &w)| if w == 0.0 { -1 } else { t })
        .collect();
    let op = CrossEntropy {
        classes,
        targets: targets.clone(),
        weights: weights.into(),
    };
    host_op(op, [&logits], [1]).unwrap_or_else(|| with_tensor_operations(logits, &targets, weights))
}

/// [`weighted_cross_entropy`] through burn's operations.
fn with_tensor_operations<B: Backend>(
    logits: Tensor<B, 2>,
    targets: &[i64],
    weights: &[f32],
) -> Tensor<B, 1> {
    let device = logits.device();
    let counted: Vec<usize> = (0..targets.len()).filter(|&i| targets[i] >= 0).collect();
    let count = counted.len();
    if count == 0 {
        return (logits.sum() * 0.0).reshape([1]);
    }
    let pick = |f: &dyn Fn(usize) -> i64| -> Vec<i64> { counted.iter().map(|&i| f(i)).collect() };
    let rows =
        Tensor::<B, 1, Int>::from_data(TensorData::new(pick(&|i| i as i64), [count]), &device);
    let classes = TensorData::new(pick(&|i| targets[i]), [count, 1]);
    let classes = Tensor::<B, 2, Int>::from_data(classes, &device);
    let weights: Vec<f32> = counted.iter().map(|&i| weights[i]).collect();
    let weights = Tensor::<B, 2>::from_data(TensorData::new(weights, [count, 1]), &device);
    let log_probs = log_softmax(logits.select(0, rows), 1);
    (log_probs.gather(1, classes) * weights).sum().neg()
}

/// `[logits]` → `[Σ weight · loss]`.
#[derive(Debug, Clone)]
struct CrossEntropy {
    classes: usize,
    /// Negative for rows not counted.
    targets: Arc<[i64]>,
    weights: Arc<[f32]>,
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
            .zip(self.targets.par_iter().zip(self.weights.par_iter()))
            .map(|(row, (&target, &weight))| match target {
                ..0 => 0.0,
                _ => {
                    let (max, sum) = shifted_sum(row);
                    f64::from(weight) * f64::from(max + sum.ln() - row[target as usize])
                }
            })
            .collect_into_vec(&mut losses);
        // Summed in row order, whatever the threads did: the same bits every run.
        vec![losses.iter().sum::<f64>() as f32]
    }

    /// `g · weight · (softmax(row) − one_hot(target))` on counted rows, 0 on the others.
    fn backward(&self, grad: &[f32], [logits]: [&[f32]; 1]) -> [Vec<f32>; 1] {
        let mut dlogits = zeros(logits.len());
        (dlogits.par_chunks_mut(self.classes.max(1)))
            .zip(logits.par_chunks(self.classes.max(1)))
            .zip(self.targets.par_iter().zip(self.weights.par_iter()))
            .filter(|&(_, (&target, _))| target >= 0)
            .for_each(|((d, row), (&target, &weight))| {
                let scale = grad[0] * weight;
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

/// Knowledge distillation at temperature `τ`: `Σ_rows weight · τ² · KL(softmax(teacher / τ) ‖
/// softmax(student / τ))` for logits `[rows, classes]` (PyTorch's `kl_div(log_softmax(s / τ),
/// softmax(t / τ))` per row, times `τ²` so the gradient's scale does not fall with `τ`). The
/// teacher takes no gradient; rows of weight 0 cost nothing.
///
/// ```
/// # use burn::backend::{Autodiff, Flex};
/// # use burn::tensor::Tensor;
/// let device = Default::default();
/// let student = Tensor::<Autodiff<Flex>, 2>::from_floats([[1.0, 2.0, 3.0]], &device);
/// let same = kiln_kernels::distillation(student.clone(), student.clone(), 2.0, &[1.0]);
/// assert!(same.into_scalar().abs() < 1e-6);
/// ```
pub fn distillation<B: Backend>(
    student: Tensor<B, 2>,
    teacher: Tensor<B, 2>,
    temperature: f32,
    weights: &[f32],
) -> Tensor<B, 1> {
    let [rows, classes] = student.dims();
    assert_eq!(
        teacher.dims(),
        [rows, classes],
        "distillation: logits of one shape"
    );
    assert_eq!(weights.len(), rows, "distillation: one weight per row");
    assert!(temperature > 0.0, "distillation: a positive temperature");
    let teacher = teacher.detach();
    let op = Distillation {
        classes,
        temperature,
        weights: weights.into(),
    };
    host_op(op, [&student, &teacher], [1]).unwrap_or_else(|| {
        let device = student.device();
        let weights =
            Tensor::<B, 2>::from_data(TensorData::new(weights.to_vec(), [rows, 1]), &device);
        let student = log_softmax(student / temperature, 1);
        let teacher = log_softmax(teacher / temperature, 1);
        let kl = (teacher.clone().exp() * (teacher - student)).sum_dim(1);
        (kl * weights).sum() * (temperature * temperature)
    })
}

/// `[student, teacher]` → `[Σ weight · τ² · KL(teacher ‖ student)]`.
#[derive(Debug, Clone)]
struct Distillation {
    classes: usize,
    temperature: f32,
    weights: Arc<[f32]>,
}

impl Distillation {
    /// `log softmax(row / τ)`.
    fn log_probs(&self, row: &[f32]) -> Vec<f32> {
        let t = self.temperature;
        let max = row.iter().fold(f32::NEG_INFINITY, |m, &x| m.max(x)) / t;
        let sum: f32 = row.iter().map(|&x| math::exp(x / t - max)).sum();
        let shift = max + sum.ln();
        row.iter().map(|&x| x / t - shift).collect()
    }

    /// Each counted row's `(row, student, teacher, weight)`, in parallel.
    fn rows<'a>(
        &'a self,
        student: &'a [f32],
        teacher: &'a [f32],
    ) -> impl IndexedParallelIterator<Item = (&'a [f32], &'a [f32], f32)> {
        let width = self.classes.max(1);
        (student.par_chunks(width).zip(teacher.par_chunks(width)))
            .zip(self.weights.par_iter())
            .map(|((s, t), &w)| (s, t, w))
    }
}

impl HostOp<2> for Distillation {
    fn forward(&self, [student, teacher]: [&[f32]; 2]) -> Vec<f32> {
        let scale = f64::from(self.temperature * self.temperature);
        let mut losses = Vec::new();
        self.rows(student, teacher)
            .map(|(s, t, w)| {
                if w == 0.0 {
                    return 0.0;
                }
                let (s, t) = (self.log_probs(s), self.log_probs(t));
                let kl: f64 = (s.iter().zip(&t))
                    .map(|(&s, &t)| f64::from(math::exp(t) * (t - s)))
                    .sum();
                f64::from(w) * kl
            })
            .collect_into_vec(&mut losses);
        vec![(scale * losses.iter().sum::<f64>()) as f32]
    }

    /// `g · weight · τ · (softmax(s / τ) − softmax(t / τ))` for the student; the teacher gets none.
    fn backward(&self, grad: &[f32], [student, teacher]: [&[f32]; 2]) -> [Vec<f32>; 2] {
        let mut dstudent = zeros(student.len());
        (dstudent.par_chunks_mut(self.classes.max(1)))
            .zip(self.rows(student, teacher))
            .filter(|(_, (_, _, w))| *w != 0.0)
            .for_each(|(d, (s, t, w))| {
                let scale = grad[0] * w * self.temperature;
                let (s, t) = (self.log_probs(s), self.log_probs(t));
                for ((d, s), t) in d.iter_mut().zip(s).zip(t) {
                    *d = flushed(scale * (math::exp(s) - math::exp(t)));
                }
            });
        [dstudent, Vec::new()]
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
        let burns = super::with_tensor_operations(logits.clone(), &targets, &[1.0 / 7.0; 9]);
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
        let quarter = [0.25; 4];
        let burns = slope(super::with_tensor_operations(
            logits.clone(),
            &targets,
            &quarter,
        ));
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

    /// Per-row weights (zero ones skipped) against burn's operations: value and gradient.
    #[test]
    fn weighted_rows_match_burns_value_and_gradient() {
        type Ad = Autodiff<Flex>;
        let device = Default::default();
        let logits = Tensor::<Ad, 2>::random([5, 301], Distribution::Normal(0.0, 3.0), &device)
            .require_grad();
        let (targets, weights) = ([4, 0, 300, -1, 9], [0.5, 0.0, 2.0, 1.0, 0.125]);
        let ours = super::weighted_cross_entropy(logits.clone(), &targets, &weights);
        let burns = super::with_tensor_operations(logits.clone(), &[4, -1, 300, -1, 9], &weights);
        let (a, b) = (ours.clone().into_scalar(), burns.clone().into_scalar());
        assert!((a - b).abs() <= 1e-5 * b.abs(), "{a} vs {b}");
        let slope = |loss: Tensor<Ad, 1>| logits.grad(&loss.backward()).unwrap();
        let gap = (slope(ours) - slope(burns)).abs().max().into_scalar();
        assert!(gap <= 1e-6, "gradients: {gap}");
    }

    /// The host distillation against the same formula through burn's operations on Flex without
    /// autodiff's host operation (`Autodiff<Flex>` values compared on the inner backend), and
    /// its student gradient against central finite differences of the value.
    #[test]
    fn distillation_matches_its_formula_and_finite_differences() {
        type Ad = Autodiff<Flex>;
        let device = Default::default();
        let normal = Distribution::Normal(0.0, 2.0);
        let student = Tensor::<Ad, 2>::random([3, 41], normal, &device).require_grad();
        let teacher = Tensor::<Ad, 2>::random([3, 41], normal, &device);
        let weights = [0.5, 0.0, 1.5];
        let loss = super::distillation(student.clone(), teacher.clone(), 2.0, &weights);
        let value = |s: Tensor<Flex, 2>| {
            super::distillation(s, teacher.clone().inner(), 2.0, &weights).into_scalar()
        };
        let inner = student.clone().inner();
        let formula = value(inner.clone());
        let ours = loss.clone().into_scalar();
        assert!(
            (ours - formula).abs() <= 1e-5 * formula.abs(),
            "{ours} vs {formula}"
        );
        let grad = student
            .grad(&loss.backward())
            .unwrap()
            .into_data()
            .to_vec::<f32>()
            .unwrap();
        let base = inner.into_data().to_vec::<f32>().unwrap();
        let at =
            |values: Vec<f32>| value(Tensor::from_data(TensorData::new(values, [3, 41]), &device));
        for index in [0, 17, 40, 41, 100, 122] {
            let h = 1e-2;
            let (mut up, mut down) = (base.clone(), base.clone());
            up[index] += h;
            down[index] -= h;
            let numeric = (at(up) - at(down)) / (2.0 * h);
            assert!(
                (grad[index] - numeric).abs() < 2e-3,
                "{index}: {} vs {numeric}",
                grad[index]
            );
        }
        // The zero-weight row gets no gradient.
        assert!(grad[41..82].iter().all(|&g| g == 0.0));
    }
}
