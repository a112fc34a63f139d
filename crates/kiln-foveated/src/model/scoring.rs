//! Multiple-choice answers scored as fVLM's `benchmark.py` scores them
//! (`score_options_batched`): every option after the clip in one batch, each option's mean
//! cross-entropy over its answer's tokens.

use burn::tensor::activation::log_softmax;
use burn::tensor::backend::Backend;
use burn::tensor::{FloatDType, Int, Tensor, TensorData};

use super::{ClipBatch, FoveatedModel, Mode};
use crate::FoveatedError;

impl<B: Backend> FoveatedModel<B> {
    /// The loss of each of `options` after the clip `frames` (`[1, T, 3, H, W]`), as fVLM's
    /// `benchmark.py` computes it in `mode`: each option is a whole conversation's ids (the
    /// question and the option as the assistant's answer, [`CaptionTokenizer::option`](crate::CaptionTokenizer)),
    /// its first `answer_start` tokens the question; its loss is the sum of the cross-entropies
    /// of its tokens from `answer_start` on, each predicted from the position before it, over
    /// how many there are. As fVLM's, a token equal to `pad` (its padding id, which SmolLM2
    /// shares with the end of a turn) adds nothing to the sum but counts in the mean. The lowest
    /// loss is the model's answer.
    pub fn option_losses(
        &self,
        frames: Tensor<B, 5>,
        options: &[Vec<u32>],
        answer_start: usize,
        pad: u32,
        mode: Mode,
    ) -> Result<Vec<f64>, FoveatedError> {
        let [clips, ..] = frames.dims();
        if clips != 1 {
            return Err(FoveatedError::Input(format!(
                "{clips} clips: options are scored after one clip"
            )));
        }
        if let Some(at) = options.iter().position(|ids| ids.len() <= answer_start) {
            return Err(FoveatedError::Input(format!(
                "option {}: {} tokens, none of them after the question's {answer_start}",
                at + 1,
                options[at].len()
            )));
        }
        if answer_start == 0 {
            return Err(FoveatedError::Input(
                "the question has no tokens: fVLM predicts each answer token from the text \
                 before it"
                    .into(),
            ));
        }
        let count = options.len();
        let batch =
            ClipBatch::new(frames.repeat_dim(0, count)).with_captions(options.to_vec(), pad);
        let output = self.forward(&batch, mode)?;
        let pass = match mode {
            Mode::CoarseOnly => output.coarse,
            _ => output.fine,
        }
        .expect("the mode's scoring pass ran");
        let [_, rows, _] = pass.text_logits.dims();
        let first = pass.first_target;
        // Row r predicts target token r + first; a padded row reads the pad id, never scored.
        let targets: Vec<i64> = (batch.target.iter())
            .flat_map(|ids| (first..first + rows).map(move |at| i64::from(ids[at])))
            .collect();
        let device = pass.text_logits.device();
        let targets =
            Tensor::<B, 3, Int>::from_data(TensorData::new(targets, [count, rows, 1]), &device);
        let log_probs = log_softmax(pass.text_logits.cast(FloatDType::F32), 2)
            .gather(2, targets)
            .into_data()
            .to_vec::<f32>()
            .expect("f32 after the cast");
        Ok(options
            .iter()
            .zip(log_probs.chunks(rows))
            .map(|(ids, log_probs)| {
                let answer = answer_start..ids.len();
                let sum: f64 = answer
                    .clone()
                    .filter(|&at| ids[at] != pad)
                    .map(|at| -f64::from(log_probs[at - first]))
                    .sum();
                sum / answer.len() as f64
            })
            .collect())
    }
}
