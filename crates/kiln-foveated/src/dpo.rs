//! fVLM's stage 3 on kiln-train: the model trained by DPO on preference pairs against a frozen
//! reference model (`train.py`'s stage 3: `forward_dpo` on the policy and on a frozen copy of
//! the stage-2 model, `compute_dpo_loss` with β = 0.1).
//!
//! The reference model runs where its numbers cannot be trained: on the autodiff backend's inner
//! backend, when [`PreferenceBatch::new`] makes a batch (in the loader), so a step's graph holds
//! the policy alone.
//!
//! A pairs file is JSON Lines, one pair a clip (RLAIF-V's fields as fVLM's shards hold them;
//! `chosen_assistant` and `rejected_assistant` are read too):
//!
//! ```text
//! {"video": "kitchen.jpg", "user": "What is on the table?", "chosen": "A red kettle.", "rejected": "Two cats."}
//! ```

use std::path::Path;

use burn::module::Module;
use burn::tensor::Tensor;
use burn::tensor::backend::{AutodiffBackend, Backend};
use kiln_cache::{Order, Residency, VideoSource};
use kiln_train::{BadBatch, EvalOutput, EvalStep, Loader, StepContext, StepOutput, TrainStep};
use serde::Deserialize;

use crate::captions::{match_videos, read_by_video};
use crate::{
    Caption, CaptionedClipReader, CaptionedClips, ClipBatch, Conversation, DPO_BETA, FoveatedError,
    FoveatedModel, PreferenceLogps, dpo_loss,
};

/// One line of a preference-pairs file: two answers about one clip, the first preferred.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PreferencePair {
    /// The clip, as the clip cache names it.
    pub video: String,
    /// The user's turn (empty or absent: the source's prompt, as for captions).
    #[serde(default)]
    pub user: Option<String>,
    /// Where the clip comes from (picks the user's turn when the line has none).
    #[serde(default)]
    pub source: Option<String>,
    /// The preferred answer.
    #[serde(alias = "chosen_assistant")]
    pub chosen: String,
    /// The other answer.
    #[serde(alias = "rejected_assistant")]
    pub rejected: String,
}

impl PreferencePair {
    /// The pair's two answers as caption lines (the same clip and user turn).
    fn answers(&self) -> [Caption; 2] {
        [&self.chosen, &self.rejected].map(|answer| Caption {
            video: self.video.clone(),
            caption: answer.clone(),
            user: self.user.clone(),
            source: self.source.clone(),
        })
    }
}

/// The pairs of a JSON Lines file (blank lines skipped), refusing a line that is not a pair or
/// names a video an earlier line named, by its 1-based number.
pub fn read_preference_pairs(path: impl AsRef<Path>) -> Result<Vec<PreferencePair>, FoveatedError> {
    let form = "{\"video\": NAME, \"chosen\": TEXT, \"rejected\": TEXT[, \"user\": TEXT][, \"source\": NAME]}";
    read_by_video(
        path.as_ref(),
        "preference pair",
        form,
        |p: &PreferencePair| &p.video,
    )
}

/// Preference pairs about cached clips, in batches for [`PreferenceTraining`]: fVLM's stage-3
/// data, each batch's reference log-probabilities from the frozen model.
#[derive(Debug)]
pub struct PreferencePairs<B: AutodiffBackend> {
    /// The clips with their chosen conversations, the answers alone scored.
    chosen: CaptionedClips<B>,
    /// Per clip, the rejected conversation.
    rejected: Vec<Conversation>,
    /// The frozen model the policy is measured against (fVLM's stage-2 model).
    reference: FoveatedModel<B::InnerBackend>,
}

impl CaptionedClipReader {
    /// The clips below the folder `clips` with the pairs of the JSON Lines file `pairs`, for
    /// `device`, measured against `reference`: each answer after the pair's user turn as fVLM's
    /// `tokenize_sft` makes it (truncated at the tokenizer's stage's length, with a warning
    /// that counts the conversations cut), the answer alone scored.
    ///
    /// # Errors
    /// As [`CaptionedClipReader::read`]; an answer cut off whole, a token outside the
    /// reference's vocabulary.
    pub fn read_pairs<B: AutodiffBackend>(
        &self,
        clips: &Path,
        pairs: &Path,
        reference: FoveatedModel<B::InnerBackend>,
        device: &B::Device,
    ) -> Result<PreferencePairs<B>, FoveatedError> {
        let lines = read_preference_pairs(pairs)?;
        let videos = self
            .cache
            .load_clips(&VideoSource::Folder(clips.into()), &self.spec)?;
        let matched = match_videos(videos.names(), &lines, |p| &p.video, pairs, "pair")?;
        let mut texts = [Vec::new(), Vec::new()];
        for pair in matched {
            for (texts, answer) in texts.iter_mut().zip(pair.answers()) {
                texts.push(self.tokens.clip_text(&answer)?);
            }
        }
        let [chosen, rejected] = texts.map(|t| self.tokens.checked(t, pairs, "pair"));
        let (chosen, rejected) = (chosen?, rejected?);
        let vocab = reference.lm.config().vocab_size;
        for (index, text) in chosen.iter().chain(&rejected).enumerate() {
            if let Some(&id) = text.ids.iter().find(|&&id| id as usize >= vocab) {
                return Err(FoveatedError::Data(format!(
                    "{}: pair {}: token id {id} is not below the model's vocabulary size {vocab} \
                     (a tokenizer of another model?)",
                    pairs.display(),
                    index % chosen.len() + 1
                )));
            }
        }
        let feed = videos.to_device::<B>(device, self.precision, Residency::Host);
        let chosen = CaptionedClips::new(
            feed,
            self.tokens.prompt().to_vec(),
            chosen,
            self.tokens.end(),
            self.batch_size,
        )?
        .answer_only(true);
        Ok(PreferencePairs {
            chosen,
            rejected,
            reference,
        })
    }
}

impl<B: AutodiffBackend> PreferencePairs<B> {
    /// A clip of one frame becomes `frames` copies of it (fVLM's stage 3: 8).
    pub fn replicating_images(mut self, frames: usize) -> Self {
        self.chosen = self.chosen.replicating_images(frames);
        self
    }

    /// Refuses a conversation longer than `room` tokens, as [`CaptionedClips::check_room`].
    pub fn check_room(&self, room: usize) -> Result<(), FoveatedError> {
        self.chosen.check_room(room)?;
        match self.rejected.iter().position(|text| text.ids.len() > room) {
            Some(index) => Err(FoveatedError::Data(format!(
                "pair {}: a rejected conversation of {} tokens; after the visual tokens the \
                 language model has room for {room}",
                index + 1,
                self.rejected[index].ids.len()
            ))),
            None => Ok(()),
        }
    }

    /// Pairs in the dataset.
    pub fn len(&self) -> usize {
        self.chosen.len()
    }

    /// Whether there is no pair.
    pub fn is_empty(&self) -> bool {
        self.chosen.is_empty()
    }
}

impl<B: AutodiffBackend> Loader for PreferencePairs<B> {
    type Batch = PreferenceBatch<B>;

    fn batches_per_epoch(&self) -> usize {
        self.chosen.clip_batches()
    }

    fn sizes(&self) -> Option<(usize, usize)> {
        self.chosen.sizes()
    }

    fn batches(&self, order: Order, first: usize) -> Box<dyn Iterator<Item = Self::Batch> + '_> {
        Box::new(
            (self.chosen.indexed_clip_batches(order, first)).map(|(indices, chosen)| {
                let texts: Vec<&Conversation> =
                    indices.iter().map(|&i| &self.rejected[i]).collect();
                let clips = ClipBatch::new(chosen.pixels.clone())
                    .with_frame_lengths(chosen.frame_lengths.clone());
                let rejected = self.chosen.with_text(clips, &texts);
                PreferenceBatch::new(chosen, rejected, &self.reference).expect(
                    "pairs are checked when read: each has an answer, its ids in the vocabulary",
                )
            }),
        )
    }
}

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
