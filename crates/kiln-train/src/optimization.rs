//! One optimizer step, on its own: k micro-batches (each loss scaled by 1/k and by the loss
//! scale, gradients accumulated by burn-optim's `GradientsAccumulator`), one device read for the
//! loss, its parts and the global gradient norm, a skipped step for anything non-finite,
//! unscaling and clipping as one multiplication, each group's AdamW at its scheduled rate. The
//! [`crate::Trainer`] loop runs it; a custom loop (or a benchmark) can too.

use std::time::{Duration, Instant};

use burn::module::{AutodiffModule, ModuleVisitor, Param};
use burn::optim::{GradientsAccumulator, GradientsParams};
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{DType, Tensor};
use kiln_core::{DynamicLossScale, LossScale, StepDecision, on_host_pool};

use crate::TrainError;
use crate::config::{LossScaling, TrainConfig};
use crate::grads::{clip_factor, large_norm, scale, squared_norm};
use crate::optim::{GroupedAdamW, parameters};
use crate::step::{StepContext, TrainStep};

/// What one optimizer step did.
#[derive(Debug, Clone, PartialEq)]
pub struct StepReport {
    /// The loss, averaged over the micro-batches.
    pub loss: f64,
    /// The named parts, averaged over the micro-batches.
    pub parts: Vec<(String, f64)>,
    /// The global gradient norm before clipping (unscaled).
    pub grad_norm: f64,
    /// The loss scale the step ran with.
    pub loss_scale: f64,
    /// Whether the update was applied (else skipped for a non-finite loss or gradient).
    pub applied: bool,
    /// The learning rate of each group.
    pub lrs: Vec<f64>,
    /// Items over all micro-batches.
    pub items: usize,
    /// Time spent waiting for batches.
    pub data_wait: Duration,
}

/// Averages over the participants of a data-parallel run (see [`crate::DataParallel`]).
pub trait Averaging<B: Backend> {
    /// This participant and how many there are.
    fn place(&self) -> (usize, usize);
    /// `values` averaged over the participants (all pass tensors of one length).
    fn mean(&self, values: Tensor<B, 1>) -> Result<Tensor<B, 1>, TrainError>;
}

/// The optimizer, the loss scale and the settings that shape a step.
pub struct Optimization<B: AutodiffBackend, M: TrainStep<B>> {
    config: TrainConfig,
    optimizer: GroupedAdamW<B, M>,
    loss_scale: LossScale,
    device: B::Device,
    averaging: Option<Box<dyn Averaging<B::InnerBackend>>>,
}

impl<B: AutodiffBackend, M: TrainStep<B>> Optimization<B, M> {
    /// Steps under `config` with `optimizer` (built for the model's parameter ids) and
    /// `loss_scale`.
    pub fn new(
        config: &TrainConfig,
        optimizer: GroupedAdamW<B, M>,
        loss_scale: LossScale,
        device: &B::Device,
    ) -> Self {
        Optimization {
            config: config.clone(),
            optimizer,
            loss_scale,
            device: device.clone(),
            averaging: None,
        }
    }

    /// The same, one participant of a data-parallel run: it takes its share of each step's
    /// micro-batches and averages gradients and logged values with the others.
    pub fn with_averaging(mut self, averaging: Box<dyn Averaging<B::InnerBackend>>) -> Self {
        self.averaging = Some(averaging);
        self
    }

    /// A fresh optimizer and loss scale for `model` under `config`.
    pub fn fresh(config: &TrainConfig, model: &M, device: &B::Device) -> Self {
        let optimizer = GroupedAdamW::new(&config.optimizer, &parameters(model));
        let loss_scale = loss_scale(config.loss_scaling, None);
        Self::new(config, optimizer, loss_scale, device)
    }

    /// The optimizer (its moments go into checkpoints).
    pub fn optimizer(&self) -> &GroupedAdamW<B, M> {
        &self.optimizer
    }

    /// The loss scale and its finite steps since it last changed.
    pub fn loss_scale_state(&self) -> (f32, u32) {
        loss_scale_state(&self.loss_scale)
    }

    /// Optimizer step `step` (0-based: steps taken before it) of `model` over the next
    /// `accumulate` batches `next_batch` gives (data-parallel: over this participant's share of
    /// the next `accumulate × participants`).
    pub fn step(
        &mut self,
        mut model: M,
        step: u64,
        mut next_batch: impl FnMut() -> M::Batch,
    ) -> Result<(M, StepReport), TrainError> {
        let k = self.config.accumulate;
        let (rank, world) = self.averaging.as_ref().map_or((0, 1), |a| a.place());
        let mut accumulator = GradientsAccumulator::<M>::new();
        let mut data_wait = Duration::ZERO;
        let mut sums: Vec<Tensor<B::InnerBackend, 1>> = Vec::new();
        let mut names = Vec::new();
        let mut items = 0;
        for round in 0..k {
            let waiting = Instant::now();
            // The others' micro-batches of this round pass by unused.
            let mut mine = None;
            for participant in 0..world {
                let batch = next_batch();
                if participant == rank {
                    mine = Some(batch);
                }
            }
            let batch = mine.expect("this participant's micro-batch");
            data_wait += waiting.elapsed();
            let context = StepContext {
                seed: self.config.seed,
                step,
                micro_batch: round * world + rank,
            };
            B::seed(&self.device, context.derived_seed());
            let loss_scale = &self.loss_scale;
            // The model goes to the pool's thread and comes back (modules are `Send`, not `Sync`).
            let (back, output, grads) = on_host_pool::<B, _>(&self.device, move || {
                let output = out_of_memory_as_error(step, || model.train_step(batch, &context))?
                    .map_err(|problem| TrainError::BadBatch {
                        stage: format!("step {}", step + 1),
                        problem,
                    })?;
                let loss = loss_scale.scale_loss(output.loss.clone().div_scalar(k as f32));
                let grads = out_of_memory_as_error(step, || loss.backward())?;
                let grads = GradientsParams::from_grads(grads, &model);
                Ok::<_, TrainError>((model, output, grads))
            })?;
            model = back;
            items += output.items;
            let values = std::iter::once(output.loss.clone())
                .chain(output.parts.iter().map(|(_, v)| v.clone()))
                .map(|v| v.inner().cast(DType::F32));
            if sums.is_empty() {
                sums = values.collect();
                names = output.parts.iter().map(|(n, _)| n.clone()).collect();
            } else {
                sums = sums.into_iter().zip(values).map(|(s, v)| s + v).collect();
            }
            accumulator.accumulate(&model, grads);
        }
        let mut grads = accumulator.grads();
        let mut sums = Tensor::cat(sums, 0);
        if let Some(averaging) = &self.averaging {
            sums = average(&model, &mut grads, sums, averaging.as_ref())?;
            items *= world;
        }
        let squared = squared_norm::<B, M>(&model, &grads)
            .unwrap_or_else(|| Tensor::zeros([1], &self.device));
        let read: Vec<f32> = Tensor::cat(vec![sums, squared], 0)
            .into_data()
            .to_vec()
            .expect("f32 values");
        let loss_scale = f64::from(self.loss_scale.scale());
        let mean = |v: f32| f64::from(v) / k as f64;
        let squared = f64::from(read[read.len() - 1]);
        let norm = if squared == f64::INFINITY {
            large_norm::<B, M>(&model, &grads)
        } else {
            squared.sqrt()
        };
        let loss = mean(read[0]);
        let grad_norm = norm / loss_scale;
        let schedule = &self.config.schedule;
        let lrs: Vec<f64> = (self.config.optimizer.group_lrs().iter())
            .map(|&peak| schedule.rate(step, peak))
            .collect();
        let finite = loss.is_finite() && grad_norm.is_finite();
        let applied = self.loss_scale.adjust(finite) == StepDecision::Apply;
        let model = if applied {
            let factor = clip_factor(grad_norm, self.config.max_grad_norm) / loss_scale;
            if factor != 1.0 {
                scale::<B, M>(&model, &mut grads, factor as f32);
            }
            self.optimizer.step(&lrs, model, grads)
        } else {
            model
        };
        let report = StepReport {
            loss,
            parts: names
                .into_iter()
                .zip(&read[1..read.len() - 1])
                .map(|(n, v)| (n, mean(*v)))
                .collect(),
            grad_norm,
            loss_scale,
            applied,
            lrs,
            items,
            data_wait,
        };
        Ok((model, report))
    }
}

/// `work()`, with a panic that says the device ran out of memory (burn's GPU runtimes panic
/// there) turned into [`TrainError::OutOfMemory`]; any other panic goes on.
fn out_of_memory_as_error<T>(step: u64, work: impl FnOnce() -> T) -> Result<T, TrainError> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(work)).map_err(|panic| {
        let message = panic
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| panic.downcast_ref::<&str>().copied())
            .unwrap_or_default();
        let lower = message.to_ascii_lowercase();
        let memory = [
            "out of memory",
            "outofmemory",
            "out_of_memory",
            "failed to allocate",
        ]
        .iter()
        .any(|m| lower.contains(m));
        if !memory {
            std::panic::resume_unwind(panic);
        }
        TrainError::OutOfMemory {
            step: step + 1,
            detail: message.lines().next().unwrap_or_default().to_string(),
        }
    })
}

/// Averages every gradient of `model` and `values` over the participants in one all-reduce:
/// the gradients flattened in the module's visiting order (the same in every process; burn's
/// parameter ids are not, so burn-optim's per-id all-reduce cannot pair them across processes)
/// and `values` after them, then cut back into place. Returns the averaged `values`.
fn average<B: AutodiffBackend, M: AutodiffModule<B>>(
    model: &M,
    grads: &mut GradientsParams,
    values: Tensor<B::InnerBackend, 1>,
    averaging: &dyn Averaging<B::InnerBackend>,
) -> Result<Tensor<B::InnerBackend, 1>, TrainError> {
    struct Gather<'a, IB: Backend> {
        grads: &'a GradientsParams,
        flat: Vec<Tensor<IB, 1>>,
    }
    impl<B: AutodiffBackend> ModuleVisitor<B> for Gather<'_, B::InnerBackend> {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
            if let Some(grad) = self.grads.get::<B::InnerBackend, D>(param.id) {
                let n = grad.shape().num_elements();
                self.flat.push(grad.reshape([n]));
            }
        }
    }
    struct Scatter<'a, IB: Backend> {
        grads: &'a mut GradientsParams,
        averaged: Tensor<IB, 1>,
        offset: usize,
    }
    impl<B: AutodiffBackend> ModuleVisitor<B> for Scatter<'_, B::InnerBackend> {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
            if let Some(grad) = self.grads.remove::<B::InnerBackend, D>(param.id) {
                let shape = grad.shape();
                let len = shape.num_elements();
                let part = self.averaged.clone().narrow(0, self.offset, len);
                self.grads
                    .register::<B::InnerBackend, D>(param.id, part.reshape(shape));
                self.offset += len;
            }
        }
    }
    let mut gather = Gather::<B::InnerBackend> {
        grads,
        flat: Vec::new(),
    };
    model.visit(&mut gather);
    let count = values.dims()[0];
    let gradients: usize = gather.flat.iter().map(|t| t.dims()[0]).sum();
    gather.flat.push(values);
    let averaged = averaging.mean(Tensor::cat(gather.flat, 0))?;
    let mut scatter = Scatter::<B::InnerBackend> {
        grads,
        averaged: averaged.clone(),
        offset: 0,
    };
    model.visit(&mut scatter);
    Ok(averaged.narrow(0, gradients, count))
}

/// The loss scaler `scaling` asks for: fresh, or a dynamic one resumed at `saved`
/// `(scale, good_steps)`.
pub(crate) fn loss_scale(scaling: LossScaling, saved: Option<(f32, u32)>) -> LossScale {
    match (scaling, saved) {
        (LossScaling::Off, _) => LossScale::NoOp,
        (LossScaling::Static(s), _) => LossScale::Static(s),
        (LossScaling::Dynamic, None) => LossScale::dynamic(),
        (LossScaling::Dynamic, Some((scale, good_steps))) => LossScale::Dynamic(DynamicLossScale {
            scale,
            good_steps,
            ..DynamicLossScale::default()
        }),
    }
}

/// `(scale, good_steps)` of a loss scaler (what a checkpoint keeps).
pub(crate) fn loss_scale_state(scale: &LossScale) -> (f32, u32) {
    match scale {
        LossScale::Dynamic(d) => (d.scale, d.good_steps),
        other => (other.scale(), 0),
    }
}
