//! A batch of clips with its text and per-frame targets, and the checks a model makes of it.

use burn::tensor::Tensor;
use burn::tensor::backend::Backend;

use super::FoveatedModel;
use crate::{FoveatedError, FrameHead, Variant};

/// A batch of clips: normalised frames and, optionally, text around them.
#[derive(Debug, Clone)]
pub struct ClipBatch<B: Backend> {
    /// Normalised frames `[clips, frames, 3, H, W]`.
    pub pixels: Tensor<B, 5>,
    /// Per clip, how many of its frames are real (the rest, at the end, are padding: never
    /// encoded, read as zero, as fVLM's `frame_mask`); empty: all of them. 0 is a text-only
    /// sample (fVLM's text retention batches: one padding frame, its visual token zero).
    pub frame_lengths: Vec<usize>,
    /// Token ids before the visual tokens, the same number per clip (the research variant's
    /// prompt; the release variant has none: its whole text is the target).
    pub prompt: Vec<Vec<u32>>,
    /// Token ids after them (captions, answers; the release variant's chat-templated
    /// conversation), the same number per clip; the text loss predicts each from the position
    /// before it.
    pub target: Vec<Vec<u32>>,
    /// Per clip, how many of its target tokens are text (the rest are padding, never scored);
    /// empty: all of them.
    pub target_lengths: Vec<usize>,
    /// Per clip and target token, whether the text loss scores it (fVLM's `loss_mask`: stage 2
    /// scores the answer only); empty: every text token.
    pub loss_mask: Vec<Vec<bool>>,
    /// Per clip and frame, the class the per-frame head should give (negative: none).
    pub frame_targets: Vec<Vec<i64>>,
}

impl<B: Backend> ClipBatch<B> {
    /// Frames only: no text, no per-frame targets.
    pub fn new(pixels: Tensor<B, 5>) -> Self {
        ClipBatch {
            pixels,
            frame_lengths: Vec::new(),
            prompt: Vec::new(),
            target: Vec::new(),
            target_lengths: Vec::new(),
            loss_mask: Vec::new(),
            frame_targets: Vec::new(),
        }
    }

    /// With the number of real frames per clip (the rest are padding).
    pub fn with_frame_lengths(mut self, frame_lengths: Vec<usize>) -> Self {
        self.frame_lengths = frame_lengths;
        self
    }

    /// With the target tokens the text loss scores (stage 2: the answer's).
    pub fn with_loss_mask(mut self, loss_mask: Vec<Vec<bool>>) -> Self {
        self.loss_mask = loss_mask;
        self
    }

    /// With token ids before the visual tokens.
    pub fn with_prompt(mut self, prompt: Vec<Vec<u32>>) -> Self {
        self.prompt = prompt;
        self
    }

    /// With target token ids after the visual tokens.
    pub fn with_target(mut self, target: Vec<Vec<u32>>) -> Self {
        self.target = target;
        self
    }

    /// With target texts of any lengths (captions), padded with `pad` to the longest; the
    /// padding is outside the text loss.
    pub fn with_captions(mut self, captions: Vec<Vec<u32>>, pad: u32) -> Self {
        let longest = captions.iter().map(Vec::len).max().unwrap_or(0);
        self.target_lengths = captions.iter().map(Vec::len).collect();
        self.target = captions
            .into_iter()
            .map(|mut ids| {
                ids.resize(longest, pad);
                ids
            })
            .collect();
        self
    }

    /// With per-frame classes (negative for frames without one).
    pub fn with_frame_targets(mut self, frame_targets: Vec<Vec<i64>>) -> Self {
        self.frame_targets = frame_targets;
        self
    }

    pub(crate) fn clips(&self) -> usize {
        self.pixels.dims()[0]
    }

    pub(crate) fn frames(&self) -> usize {
        self.pixels.dims()[1]
    }

    /// Whether the text loss scores target token `at` of `clip`: text, not padding, and in the
    /// loss mask.
    pub(crate) fn scores(&self, clip: usize, at: usize) -> bool {
        let text = self.target_lengths.get(clip).is_none_or(|&n| at < n);
        let masked = self.loss_mask.get(clip).is_none_or(|mask| mask[at]);
        text && masked
    }
}

impl<B: Backend> FoveatedModel<B> {
    /// Refuses a batch the model cannot take, naming the clip, frame or token (1-based):
    /// text of unequal lengths or outside the vocabulary, per-frame targets that do not fit.
    /// [`FoveatedModel::forward`] checks; loaders for kiln-train check as they make batches.
    pub fn check(&self, batch: &ClipBatch<B>) -> Result<(), FoveatedError> {
        let (clips, frames) = (batch.clips(), batch.frames());
        if clips == 0 || frames == 0 {
            return Err(FoveatedError::Input(format!(
                "a batch of {clips} clip(s) of {frames} frame(s): nothing to read"
            )));
        }
        if self.config.variant == Variant::Release && !batch.prompt.is_empty() {
            return Err(FoveatedError::Input(
                "the release variant reads no prompt before the visual tokens: put the \
                 chat-templated conversation in the target, and the loss mask on its answer"
                    .into(),
            ));
        }
        if !batch.frame_lengths.is_empty() {
            if batch.frame_lengths.len() != clips {
                return Err(FoveatedError::Input(format!(
                    "frame lengths for {} clip(s), the batch has {clips}",
                    batch.frame_lengths.len()
                )));
            }
            if let Some(c) = (batch.frame_lengths.iter()).position(|&n| n > frames) {
                return Err(FoveatedError::Input(format!(
                    "clip {}: {} real frame(s) of {frames}: a clip has no more than the batch's",
                    c + 1,
                    batch.frame_lengths[c]
                )));
            }
        }
        let vocab = self.lm.config().vocab_size;
        for (name, ids) in [("prompt", &batch.prompt), ("target", &batch.target)] {
            if ids.is_empty() {
                continue;
            }
            if ids.len() != clips {
                return Err(FoveatedError::Input(format!(
                    "{} {name}(s) for {clips} clip(s)",
                    ids.len()
                )));
            }
            let length = ids[0].len();
            for (c, ids) in ids.iter().enumerate() {
                if ids.len() != length {
                    return Err(FoveatedError::Input(format!(
                        "clip {}: a {name} of {} token(s), clip 1's has {length}: pad them to one \
                         length",
                        c + 1,
                        ids.len()
                    )));
                }
                if let Some(at) = ids.iter().position(|&id| id as usize >= vocab) {
                    return Err(FoveatedError::Input(format!(
                        "clip {}, {name} token {}: id {} is not below the vocabulary size {vocab}",
                        c + 1,
                        at + 1,
                        ids[at]
                    )));
                }
            }
        }
        if !batch.target_lengths.is_empty() {
            let length = batch.target.first().map_or(0, Vec::len);
            if batch.target_lengths.len() != clips {
                return Err(FoveatedError::Input(format!(
                    "target lengths for {} clip(s), the batch has {clips}",
                    batch.target_lengths.len()
                )));
            }
            if let Some(c) = batch.target_lengths.iter().position(|&n| n > length) {
                return Err(FoveatedError::Input(format!(
                    "clip {}: {} target token(s) counted of {length}",
                    c + 1,
                    batch.target_lengths[c]
                )));
            }
        }
        if !batch.loss_mask.is_empty() {
            let length = batch.target.first().map_or(0, Vec::len);
            if batch.loss_mask.len() != clips {
                return Err(FoveatedError::Input(format!(
                    "loss masks for {} clip(s), the batch has {clips}",
                    batch.loss_mask.len()
                )));
            }
            if let Some(c) = batch.loss_mask.iter().position(|mask| mask.len() != length) {
                return Err(FoveatedError::Input(format!(
                    "clip {}: a loss mask of {} token(s) for a target of {length}",
                    c + 1,
                    batch.loss_mask[c].len()
                )));
            }
        }
        if !batch.frame_targets.is_empty() {
            let FrameHead::Classes(classes) = self.config.frame_head else {
                return Err(FoveatedError::Input(
                    "frame targets for a model without a per-frame head".into(),
                ));
            };
            if batch.frame_targets.len() != clips {
                return Err(FoveatedError::Input(format!(
                    "frame targets for {} clip(s), the batch has {clips}",
                    batch.frame_targets.len()
                )));
            }
            for (c, targets) in batch.frame_targets.iter().enumerate() {
                if targets.len() != frames {
                    return Err(FoveatedError::Input(format!(
                        "clip {}: {} frame target(s) for {frames} frame(s)",
                        c + 1,
                        targets.len()
                    )));
                }
                if let Some(t) = targets.iter().position(|&k| k >= classes as i64) {
                    return Err(FoveatedError::Input(format!(
                        "clip {}, frame {}: class {} is not below the head's {classes} classes",
                        c + 1,
                        t + 1,
                        targets[t]
                    )));
                }
            }
        }
        Ok(())
    }
}
