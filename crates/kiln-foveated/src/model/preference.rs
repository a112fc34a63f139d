//! fVLM's stage 3: direct preference optimisation on pairs of conversations about the same
//! clips (`FoveatedVLM.forward_dpo`, `train.compute_dpo_loss`).

use burn::tensor::activation::{log_sigmoid, log_softmax};
use burn::tensor::backend::Backend;
use burn::tensor::{Int, Tensor, TensorData};

use super::{ClipBatch, FoveatedModel, Mode, PassOutput, Text, frame_rows};
use crate::FoveatedError;

/// fVLM's DPO temperature.
pub const DPO_BETA: f64 = 0.1;

/// Per clip, the summed log-probability of the chosen and of the rejected conversation's scored
/// tokens (their answers), `[clips]` each.
#[derive(Debug, Clone)]
pub struct PreferenceLogps<B: Backend> {
    /// The chosen conversations'.
    pub chosen: Tensor<B, 1>,
    /// The rejected conversations'.
    pub rejected: Tensor<B, 1>,
}

impl<B: Backend> PreferenceLogps<B> {
    /// The same, outside the autodiff graph (a frozen reference model's).
    pub fn detach(self) -> Self {
        PreferenceLogps {
            chosen: self.chosen.detach(),
            rejected: self.rejected.detach(),
        }
    }
}

impl<B: Backend> FoveatedModel<B> {
    /// fVLM's `forward_dpo`: the clips of `chosen` (its frames and frame lengths) read once — the
    /// coarse pass over the visual tokens alone, the fine queries and visual tokens — then the
    /// LM over `[visual tokens, conversation]` for `chosen`'s and for `rejected`'s target text
    /// (each with its own lengths and loss mask, which should mark the answer). `rejected`
    /// holds the same clips (its pixels are not read).
    pub fn preference_logps(
        &self,
        chosen: &ClipBatch<B>,
        rejected: &ClipBatch<B>,
    ) -> Result<PreferenceLogps<B>, FoveatedError> {
        self.check(chosen)?;
        self.check(rejected)?;
        let (clips, frames) = (chosen.clips(), chosen.frames());
        let same_clips = rejected.clips() == clips
            && rejected.frames() == frames
            && rejected.frame_lengths == chosen.frame_lengths;
        if !same_clips || chosen.target.is_empty() || rejected.target.is_empty() {
            return Err(FoveatedError::Input(
                "a preference pair is two conversations about the same clips: the same clips, \
                 frames and frame lengths, each batch with its target text"
                    .into(),
            ));
        }
        let rows = frame_rows(chosen);
        let patches = self.encode_rows(chosen.pixels.clone(), &rows)?;
        let first_target = self.first_target(Mode::CoarseFine);
        let looked = self.look(
            &patches,
            &rows,
            [clips, frames],
            Mode::CoarseFine,
            &Text::none(),
            first_target,
        )?;
        let (_, glimpse) = looked
            .fine
            .expect("the coarse-fine mode reads a fine glimpse");
        let tokens = self.per_clip(glimpse.tokens, clips);
        let fine_token = self.mode_token(&self.connectors.fine_token);
        let logps = |batch: &ClipBatch<B>| {
            let text = self.embedded_text(batch);
            let pass = self.lm_pass(fine_token.clone(), tokens.clone(), 1, &text, first_target)?;
            sequence_logps(&pass, batch).ok_or_else(nothing_scored)
        };
        Ok(PreferenceLogps {
            chosen: logps(chosen)?,
            rejected: logps(rejected)?,
        })
    }
}

/// fVLM's DPO loss: `−log σ(β · ((π_chosen − ref_chosen) − (π_rejected − ref_rejected)))`, mean
/// over the clips, of the policy's and the frozen reference model's [`PreferenceLogps`].
pub fn dpo_loss<B: Backend>(
    policy: &PreferenceLogps<B>,
    reference: &PreferenceLogps<B>,
    beta: f64,
) -> Tensor<B, 1> {
    let chosen = (policy.chosen.clone() - reference.chosen.clone()) * beta;
    let rejected = (policy.rejected.clone() - reference.rejected.clone()) * beta;
    log_sigmoid(chosen - rejected).mean().neg()
}

fn nothing_scored() -> FoveatedError {
    FoveatedError::Input("a conversation with no scored token: give its answer a loss mask".into())
}

/// Per clip, the sum of log p over the target tokens `batch` scores (`None` when none is).
fn sequence_logps<B: Backend>(pass: &PassOutput<B>, batch: &ClipBatch<B>) -> Option<Tensor<B, 1>> {
    let [clips, tokens, _] = pass.text_logits.dims();
    let targets = pass.scored_targets(batch);
    if targets.iter().all(|&t| t < 0) {
        return None;
    }
    let ids: Vec<i64> = targets.iter().map(|&t| t.max(0)).collect();
    let scored: Vec<f32> = targets
        .iter()
        .map(|&t| f32::from(u8::from(t >= 0)))
        .collect();
    let device = pass.text_logits.device();
    let ids = Tensor::<B, 3, Int>::from_data(TensorData::new(ids, [clips, tokens, 1]), &device);
    let scored = Tensor::<B, 2>::from_data(TensorData::new(scored, [clips, tokens]), &device);
    let per_token = log_softmax(pass.text_logits.clone(), 2)
        .gather(2, ids)
        .reshape([clips, tokens]);
    Some((per_token * scored).sum_dim(1).reshape([clips]))
}
