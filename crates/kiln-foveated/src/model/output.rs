//! What the model's passes and forward give.

use burn::tensor::Tensor;
use burn::tensor::backend::Backend;

#[cfg(doc)]
use super::{FoveatedModel, Mode};

/// One pass of the LM over `[prompt, mode token, visual tokens, target]` (whichever of them
/// the variant and the batch have).
#[derive(Debug, Clone)]
pub struct PassOutput<B: Backend> {
    /// The visual tokens `[clips, frames · per_frame, vision hidden]` (before `dino_to_llm`):
    /// the readout's, one per frame, or every token of every frame ([`Mode::AllPatches`]).
    pub tokens: Tensor<B, 3>,
    /// Visual tokens per frame.
    pub per_frame: usize,
    /// The LM's last hidden state over the whole sequence, `[clips, sequence, lm hidden]`.
    pub hidden: Tensor<B, 3>,
    /// The logits that predict the target's tokens from [`PassOutput::first_target`] on,
    /// `[clips, target − first_target, vocab]` (empty without target).
    pub text_logits: Tensor<B, 3>,
    /// The first target token `text_logits` predicts: 1 in the release variant's training
    /// passes (fVLM scores text positions only, so the text's first token is not predicted
    /// from the visual tokens), else 0.
    pub first_target: usize,
    /// The per-frame head's logits at each frame's last visual token, `[clips, frames,
    /// classes]`.
    pub frame_logits: Option<Tensor<B, 3>>,
    /// Where the visual tokens start in the sequence.
    pub first_visual: usize,
    /// Where the readout looked: attention probabilities `[clips · frames, layers · heads,
    /// tokens]` (the deep readout's every layer; none in [`Mode::AllPatches`]).
    pub attention: Option<Tensor<B, 3>>,
}

impl<B: Backend> PassOutput<B> {
    /// The target token each row of `text_logits` predicts, clip by clip, or −1 where `batch`
    /// does not score it (padding, outside the loss mask).
    pub(crate) fn scored_targets(&self, batch: &super::ClipBatch<B>) -> Vec<i64> {
        let (first, tokens) = (self.first_target, self.text_logits.dims()[1]);
        (batch.target.iter().enumerate())
            .flat_map(|(clip, ids)| {
                (first..first + tokens).map(move |at| match batch.scores(clip, at) {
                    true => ids[at] as i64,
                    false => -1,
                })
            })
            .collect()
    }

    /// The LM's hidden states at each frame's last visual token, `[clips, frames, lm hidden]`.
    pub fn at_frames(&self) -> Tensor<B, 3> {
        let [clips, _, width] = self.hidden.dims();
        let (visual, per_frame) = (self.tokens.dims()[1], self.per_frame);
        let (start, frames) = (self.first_visual, visual / per_frame);
        self.hidden
            .clone()
            .slice([0..clips, start..start + visual, 0..width])
            .reshape([clips, frames, per_frame, width])
            .slice([0..clips, 0..frames, per_frame - 1..per_frame, 0..width])
            .reshape([clips, frames, width])
    }
}

/// What a readout gives for a batch of frames, one query each.
#[derive(Debug, Clone)]
pub struct Glimpse<B: Backend> {
    /// The visual tokens `[frames, vision hidden]` (after `output_proj`).
    pub tokens: Tensor<B, 2>,
    /// The attention probabilities over each frame's tokens, `[frames, layers · heads,
    /// tokens]` (one layer for the shallow readout).
    pub attention: Tensor<B, 3>,
}

/// What [`FoveatedModel::forward`] gives.
#[derive(Debug, Clone)]
pub struct FoveatedOutput<B: Backend> {
    /// The coarse pass (all modes but [`Mode::Autoregressive`]).
    pub coarse: Option<PassOutput<B>>,
    /// The fine pass (all modes but [`Mode::CoarseOnly`]; for [`Mode::AllPatches`] its one
    /// pass over every token).
    pub fine: Option<PassOutput<B>>,
    /// The fine pass's queries, `[clips, frames, query_dim]` (`q_init` first).
    pub queries: Option<Tensor<B, 3>>,
}

/// The losses of one forward.
#[derive(Debug, Clone)]
pub struct Losses<B: Backend> {
    /// The coarse pass's (text plus per-frame), when it ran.
    pub coarse: Option<Tensor<B, 1>>,
    /// The fine pass's, when it ran.
    pub fine: Option<Tensor<B, 1>>,
    /// `fine + λ·coarse` (either alone when the other did not run).
    pub total: Tensor<B, 1>,
}
