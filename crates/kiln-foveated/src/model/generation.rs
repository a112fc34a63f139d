//! Text from clips on fVLM's inference path (`generate_captions.py`): the frames read in turn,
//! the LM's keys and values kept, then one LM step a new token.

use burn::tensor::Tensor;
use burn::tensor::backend::Backend;
use kiln_text::{GenerationConfig, TextInput, generate_after};

use super::{ClipBatch, FoveatedModel, frame_rows, mode_embedding};
use crate::FoveatedError;

impl<B: Backend> FoveatedModel<B> {
    /// What the model says after each clip of `batch`, on fVLM's inference path
    /// (`generate_captions.py`): frame t + 1's query comes from the LM's state after frame t's
    /// visual token (no coarse pass), the LM keeping its keys and values; the text after the
    /// visual tokens (`batch.target`: for the release variant the chat-templated question with
    /// the assistant's turn opened, [`CaptionTokenizer::question`](crate::CaptionTokenizer))
    /// is read once; then each new token costs one LM step. `on_step` sees each step's tokens
    /// as [`kiln_text::generate`]'s does. Returns each clip's new tokens, a stop token included
    /// (fVLM's script stops there and leaves it out).
    ///
    /// Every frame must be real (with padding frames fVLM's inference reads zeroed keys and
    /// values, which kiln does not reproduce: caption such clips one at a time) and every
    /// clip's text the same length.
    pub fn generate(
        &self,
        batch: &ClipBatch<B>,
        config: &GenerationConfig,
        on_step: impl FnMut(&[Option<u32>]),
    ) -> Result<Vec<Vec<u32>>, FoveatedError> {
        self.check(batch)?;
        let (clips, frames) = (batch.clips(), batch.frames());
        if let Some(clip) = batch.frame_lengths.iter().position(|&n| n != frames) {
            return Err(FoveatedError::Input(format!(
                "clip {}: {} of its {frames} frames are real, and generation reads clips \
                 without padding frames (caption it alone)",
                clip + 1,
                batch.frame_lengths[clip]
            )));
        }
        let width = batch.target.first().map_or(0, Vec::len);
        if let Some(clip) = batch.target_lengths.iter().position(|&n| n != width) {
            return Err(FoveatedError::Input(format!(
                "clip {}: its text is padded ({} of {width} tokens), and generation continues \
                 every clip's text from its last token (give clips texts of one length)",
                clip + 1,
                batch.target_lengths[clip]
            )));
        }
        let config = &self.fitting(batch, config)?;
        let rows = frame_rows(batch);
        let patches = self.encode_rows(batch.pixels.clone(), &rows)?;
        let text = self.embedded_text(batch);
        let mut read = self.read_in_turn(&patches, &rows, &text, clips, frames)?;
        let last = read.tokens.pop().expect("a checked batch has frames");
        // The LM has read all but the last visual token; a one-frame clip's prefix too is new.
        let mut parts: Vec<Tensor<B, 3>> = Vec::new();
        if frames == 1 {
            parts.extend(text.prompt.iter().cloned());
            let fine_token = self.mode_token(&self.connectors.fine_token);
            parts.extend(fine_token.map(|m| mode_embedding(m, clips)));
        }
        parts.push(self.visual_embeddings(last));
        parts.extend(text.target.iter().cloned());
        let input = TextInput::embeddings(Tensor::cat(parts, 1));
        Ok(generate_after(
            &self.lm, read.cache, input, config, on_step,
        )?)
    }

    /// `config` with at most as many new tokens as the LM has positions left after `batch`'s
    /// prompt, visual tokens and text (a warning says when that is fewer than asked); a batch
    /// that leaves none is refused.
    fn fitting(
        &self,
        batch: &ClipBatch<B>,
        config: &GenerationConfig,
    ) -> Result<GenerationConfig, FoveatedError> {
        let positions = self.lm.config().max_position_embeddings;
        let mode_token = usize::from(self.connectors.fine_token.is_some());
        let prompt = batch.prompt.first().map_or(0, Vec::len);
        let text = batch.target.first().map_or(0, Vec::len);
        let read = prompt + mode_token + batch.frames() + text;
        let room = positions.saturating_sub(read);
        if room == 0 {
            return Err(FoveatedError::Input(format!(
                "the LM's {positions} positions hold no new token after {read} read ({prompt} \
                 of prompt, {} frames, {text} of text): use fewer frames or a shorter prompt",
                batch.frames()
            )));
        }
        if config.max_new_tokens > room {
            log::warn!(
                "the LM has {positions} positions: room for {room} new tokens after the {read} \
                 it reads, not the {} asked",
                config.max_new_tokens
            );
        }
        Ok(GenerationConfig {
            max_new_tokens: config.max_new_tokens.min(room),
            ..config.clone()
        })
    }
}
