//! fVLM's stage 3 on kiln-train: the model trained by DPO on preference pairs against a frozen
//! reference model (`train.py`'s stage 3: `forward_dpo` on the policy and on a frozen copy of
//! the stage-2 model, `compute_dpo_loss` with β = 0.1).
//!
//! The reference model runs where its numbers cannot be trained: on the autodiff backend's inner
//! backend, when [`PreferenceBatch::new`] makes a batch (in the loader), so a step's graph holds
//! the policy alone.

use burn::module::Module;
use burn::tensor::Tensor;
use burn::tensor::backend::{AutodiffBackend, Backend};
use kiln_train::{BadBatch, EvalOutput, EvalStep, StepContext, StepOutput, TrainStep};

use crate::{ClipBatch, DPO_BETA, FoveatedError, FoveatedModel, PreferenceLogps, dpo_loss};

/// The model trained on preference pairs ([`PreferenceBatch`]) by fVLM's DPO loss.
/// `Trainer::fit` takes it as it takes a [`FoveatedModel`]; the trained model is `policy`.
#[derive(Module, Debug)]
pub struct PreferenceTraining<B: Backend> {
    /// The model being trained (fVLM's policy, started from the stage-2 model).
    pub policy: FoveatedModel<B>,
}

/// Preference pairs about the same clips, and the frozen reference model's log-probabilities of
/// both conversations.
#[derive(Debug, Clone)]
pub struct PreferenceBatch<B: Backend> {
    /// The clips and the preferred conversations (their answers under the loss mask).
    pub chosen: ClipBatch<B>,
    /// The same clips and the other conversations.
    pub rejected: ClipBatch<B>,
    /// What the reference model gives `chosen` and `rejected` (outside any graph).
    pub reference: PreferenceLogps<B>,
}

impl<B: AutodiffBackend> PreferenceBatch<B> {
    /// The pair, with `reference`'s log-probabilities of it computed on the inner backend.
    ///
    /// # Errors
    /// A pair the reference refuses ([`FoveatedModel::preference_logps`]).
    pub fn new(
        chosen: ClipBatch<B>,
        rejected: ClipBatch<B>,
        reference: &FoveatedModel<B::InnerBackend>,
    ) -> Result<Self, FoveatedError> {
        let logps = reference.preference_logps(&inner(&chosen), &inner(&rejected))?;
        Ok(PreferenceBatch {
            chosen,
            rejected,
            reference: PreferenceLogps {
                chosen: Tensor::from_inner(logps.chosen),
                rejected: Tensor::from_inner(logps.rejected),
            },
        })
    }
}

/// `batch` on the inner backend (the same frames and text).
fn inner<B: AutodiffBackend>(batch: &ClipBatch<B>) -> ClipBatch<B::InnerBackend> {
    ClipBatch {
        pixels: batch.pixels.clone().inner(),
        frame_lengths: batch.frame_lengths.clone(),
        prompt: batch.prompt.clone(),
        target: batch.target.clone(),
        target_lengths: batch.target_lengths.clone(),
        loss_mask: batch.loss_mask.clone(),
        frame_targets: batch.frame_targets.clone(),
    }
}

/// The DPO loss of `batch` under `policy` and fVLM's figures: per pair the implicit rewards
/// `β · (log π − log π_ref)` of each conversation and whether the chosen one's is higher.
struct Scored<B: Backend> {
    loss: Tensor<B, 1>,
    chosen_reward: Tensor<B, 1>,
    rejected_reward: Tensor<B, 1>,
    preferred: Tensor<B, 1>,
}

fn scored<B: Backend>(
    policy: &FoveatedModel<B>,
    batch: &PreferenceBatch<B>,
) -> Result<Scored<B>, BadBatch> {
    let logps = policy
        .preference_logps(&batch.chosen, &batch.rejected)
        .map_err(|e| BadBatch(e.to_string()))?;
    let loss = dpo_loss(&logps, &batch.reference, DPO_BETA);
    let logps = logps.detach();
    let chosen_reward = (logps.chosen - batch.reference.chosen.clone()) * DPO_BETA;
    let rejected_reward = (logps.rejected - batch.reference.rejected.clone()) * DPO_BETA;
    let preferred = chosen_reward
        .clone()
        .greater(rejected_reward.clone())
        .float();
    Ok(Scored {
        loss,
        chosen_reward,
        rejected_reward,
        preferred,
    })
}

impl<B: AutodiffBackend> TrainStep<B> for PreferenceTraining<B> {
    type Batch = PreferenceBatch<B>;

    /// fVLM's DPO loss, with `reward_accuracy` (the pairs whose chosen conversation the policy
    /// prefers, relative to the reference) and the mean `chosen_reward` and `rejected_reward`.
    fn train_step(
        &self,
        batch: PreferenceBatch<B>,
        _: &StepContext,
    ) -> Result<StepOutput<B>, BadBatch> {
        let pairs = batch.chosen.clips();
        let scored = scored(&self.policy, &batch)?;
        Ok(StepOutput::new(scored.loss, pairs)
            .with_part("reward_accuracy", scored.preferred.mean())
            .with_part("chosen_reward", scored.chosen_reward.mean())
            .with_part("rejected_reward", scored.rejected_reward.mean()))
    }
}

impl<B: Backend> EvalStep<B> for PreferenceTraining<B> {
    type Batch = PreferenceBatch<B>;

    fn eval_step(&self, batch: PreferenceBatch<B>) -> Result<EvalOutput<B>, BadBatch> {
        let pairs = batch.chosen.clips();
        let scored = scored(&self.policy, &batch)?;
        Ok(EvalOutput::new(pairs)
            .with_sum("loss", scored.loss.mul_scalar(pairs as f32))
            .with_sum("reward_accuracy", scored.preferred.sum())
            .with_sum("chosen_reward", scored.chosen_reward.sum())
            .with_sum("rejected_reward", scored.rejected_reward.sum()))
    }
}
