//! The training loss: each pass's text cross-entropy and per-frame head's, `fine + λ·coarse`.

use burn::tensor::Tensor;
use burn::tensor::backend::Backend;
use kiln_kernels::cross_entropy;

use super::{ClipBatch, FoveatedModel, FoveatedOutput, Losses, PassOutput};
use crate::FoveatedError;

impl<B: Backend> FoveatedModel<B> {
    /// `fine + λ·coarse` of the passes in `output`, each the target's cross-entropy (the tokens
    /// [`ClipBatch`] says are scored, mean over them) plus the per-frame head's, whichever the
    /// batch has targets for. A pass with nothing to score (the release variant's coarse pass
    /// over the visual tokens alone, λ = 0) has no loss.
    pub fn loss(
        &self,
        output: &FoveatedOutput<B>,
        batch: &ClipBatch<B>,
    ) -> Result<Losses<B>, FoveatedError> {
        let pass_loss = |pass: &PassOutput<B>| self.pass_loss(pass, batch);
        let coarse = output.coarse.as_ref().and_then(pass_loss);
        let fine = output.fine.as_ref().and_then(pass_loss);
        let total = match (&coarse, &fine) {
            (Some(coarse), Some(fine)) => fine.clone() + coarse.clone() * self.config.lambda_coarse,
            (Some(only), None) | (None, Some(only)) => only.clone(),
            (None, None) => {
                return Err(FoveatedError::Input(
                    "nothing to learn from: the batch has no scored target text and no frame \
                     targets (or the model no per-frame head)"
                        .into(),
                ));
            }
        };
        Ok(Losses {
            coarse,
            fine,
            total,
        })
    }

    fn pass_loss(&self, pass: &PassOutput<B>, batch: &ClipBatch<B>) -> Option<Tensor<B, 1>> {
        let mut parts = Vec::new();
        let [clips, tokens, vocab] = pass.text_logits.dims();
        if tokens > 0 {
            let targets = pass.scored_targets(batch);
            let logits = pass.text_logits.clone().reshape([clips * tokens, vocab]);
            parts.extend(cross_entropy(logits, &targets));
        }
        if let (Some(logits), false) = (&pass.frame_logits, batch.frame_targets.is_empty()) {
            let [clips, frames, classes] = logits.dims();
            let targets: Vec<i64> = batch.frame_targets.iter().flatten().copied().collect();
            let logits = logits.clone().reshape([clips * frames, classes]);
            parts.extend(cross_entropy(logits, &targets));
        }
        parts.into_iter().reduce(|a, b| a + b)
    }
}
