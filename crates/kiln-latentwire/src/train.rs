//! LatentWire trained by kiln-train: [`LatentWireTraining`] is the trained module with the frozen
//! readers beside it (not in it: the optimizer, the checkpoints and the gradients hold only the
//! encoder and the adapters), a [`TrainStep`] of LatentWire's objective and an [`EvalStep`] of the
//! held-out answers' NLL and first-token accuracy for every language model and prompt kind.

use std::any::Any;
use std::fmt;
use std::sync::Arc;

use burn::module::{AutodiffModule, Module};
use burn::tensor::Tensor;
use burn::tensor::backend::{AutodiffBackend, Backend};
use kiln_train::{BadBatch, EvalOutput, EvalStep, StepContext, StepOutput, TrainStep};

use crate::eval::{curve_kinds, teacher_forced};
use crate::{LatentWire, Objective, QaBatch, Reader};

/// The frozen readers, kept once on the backend they were loaded on and shared by every copy of
/// the training module: the module moves between the autodiff backend and its inner one, the
/// readers are lifted onto the autodiff backend per step (their parameters as constants).
#[derive(Clone)]
pub struct FrozenReaders(Arc<dyn Any + Send + Sync>);

impl FrozenReaders {
    /// `readers`, on the backend the training runs on without autodiff.
    pub fn new<B: Backend>(readers: Vec<Reader<B>>) -> Self {
        FrozenReaders(Arc::new(readers))
    }

    /// The readers, where they are on `B`.
    pub fn on<B: Backend>(&self) -> Option<&[Reader<B>]> {
        self.0.downcast_ref::<Vec<Reader<B>>>().map(Vec::as_slice)
    }

    /// The readers on the autodiff backend `B` over the one they are on.
    fn lifted<B: AutodiffBackend>(&self) -> Option<Vec<Reader<B>>> {
        let inner = self.on::<B::InnerBackend>()?;
        Some(inner.iter().cloned().map(Reader::from_inner).collect())
    }
}

impl fmt::Debug for FrozenReaders {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("FrozenReaders")
    }
}

/// What kiln-train trains: the encoder and adapters, read by the frozen language models under
/// LatentWire's objective.
#[derive(Module, Debug)]
pub struct LatentWireTraining<B: Backend> {
    /// The trained parts.
    pub model: LatentWire<B>,
    #[module(skip)]
    readers: FrozenReaders,
    #[module(skip)]
    objective: Objective,
}

impl<B: Backend> LatentWireTraining<B> {
    /// `model` trained through `readers` (on the backend without autodiff) under `objective`.
    pub fn new(model: LatentWire<B>, readers: FrozenReaders, objective: Objective) -> Self {
        LatentWireTraining {
            model,
            readers,
            objective,
        }
    }
}

fn missing_readers() -> BadBatch {
    BadBatch("the language models were loaded on another backend than the training's".into())
}

impl<B: AutodiffBackend> TrainStep<B> for LatentWireTraining<B> {
    type Batch = QaBatch;

    /// The objective, with each language model's terms (`<name>/tf`, `/first`, `/k_token`,
    /// `/kd`) and the adapters' scale penalty logged beside it.
    fn train_step(&self, batch: QaBatch, _: &StepContext) -> Result<StepOutput<B>, BadBatch> {
        let readers = self.readers.lifted::<B>().ok_or_else(missing_readers)?;
        let items = batch.bytes.dims()[0];
        let loss = (self.objective)
            .loss(&self.model, &readers, &batch)
            .map_err(|e| BadBatch(e.to_string()))?;
        let device = loss.loss.device();
        let scalar = |v: f32| Tensor::<B, 1>::from_floats([v], &device);
        let mut output = StepOutput::new(loss.loss, items);
        for (reader, terms) in readers.iter().zip(&loss.terms) {
            let name = reader.name();
            output = output
                .with_part(&format!("{name}/tf"), scalar(terms.teacher_forced))
                .with_part(&format!("{name}/first"), scalar(terms.first_token))
                .with_part(&format!("{name}/k_token"), scalar(terms.k_token))
                .with_part(&format!("{name}/kd"), scalar(terms.distillation));
        }
        Ok(output.with_part("scale_penalty", scalar(loss.scale_penalty)))
    }
}

impl<B: Backend> EvalStep<B> for LatentWireTraining<B> {
    type Batch = QaBatch;

    /// `<name>/<kind>/nll` (per answer token) and `<name>/<kind>/first_token_accuracy` for every
    /// language model and prompt kind (`text`, `latent`, `token_budget`).
    fn eval_step(&self, batch: QaBatch) -> Result<EvalOutput<B>, BadBatch> {
        let readers = self.readers.on::<B>().ok_or_else(missing_readers)?;
        let latents = (self.model.latents(&batch, readers)).map_err(|e| BadBatch(e.to_string()))?;
        let slots = latents.dims()[1];
        let device = latents.device();
        let prefixes = self.model.prefixes(latents, readers);
        let mut output = EvalOutput::new(batch.bytes.dims()[0]);
        let scalar = |v: f64| Tensor::<B, 1>::from_floats([v as f32], &device);
        let items = readers.iter().zip(prefixes).zip(&batch.readers);
        for ((reader, prefix), items) in items {
            for (kind, contents) in curve_kinds(&items.texts, prefix, slots) {
                let scored = teacher_forced(reader, contents, &items.answers)
                    .map_err(|e| BadBatch(e.to_string()))?;
                let nll: f64 = scored.iter().map(|s| s.nll).sum();
                let tokens = scored.iter().map(|s| s.tokens).sum();
                let right = scored.iter().filter(|s| s.first_right).count();
                let name = format!("{}/{kind}", reader.name());
                output = output
                    .with_mean(&format!("{name}/nll"), scalar(nll), tokens)
                    .with_sum(
                        &format!("{name}/first_token_accuracy"),
                        scalar(right as f64),
                    );
            }
        }
        Ok(output)
    }
}
