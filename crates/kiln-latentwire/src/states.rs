//! The interlingua read from a frozen language model's hidden states, the encoder variant beside
//! LatentWire's byte encoder. LatentWire's later "stq" encoder (`STQueryEncoder`,
//! `latentwire/models.py` at 220ce571) reads a text's token states from a frozen sentence
//! encoder (MiniLM's `last_hidden_state`) and pools them with learned queries; here the frozen
//! model is the first language model itself ([`Reader::text_states`](crate::Reader): its final
//! norm's output over the text's ids, computed without gradient), its states projected to `d_z`,
//! normalised, and pooled by the byte encoder's pooler (the same learned queries, cross-attention,
//! gate and feed-forward). As stq masks its padding, the pooler reads each text's own tokens, not
//! the end ids that pad the shorter texts of its batch (LatentWire's byte encoder masks none, and
//! kiln's keeps that). stq also adds sinusoids of the slot index to its queries; the byte
//! encoder's pooler, shared here, has none.

use burn::module::Module;
use burn::nn::{LayerNorm, LayerNormConfig, Linear, LinearConfig};
use burn::tensor::Tensor;
use burn::tensor::backend::Backend;
use kiln_transformer::projection::{Then, project};
use kiln_transformer::{Pass, PreparedWeights, Settings};

use crate::EncoderConfig;
use crate::encoder::LatentPooler;

/// A frozen model's hidden states → `M` latents.
#[derive(Module, Debug)]
pub struct StateEncoder<B: Backend> {
    /// The model's hidden width → `d_z`.
    pub project: Linear<B>,
    /// After the projection.
    pub norm: LayerNorm<B>,
    /// The learned queries' pooling, as the byte encoder's.
    pub shared_pooler: LatentPooler<B>,
    #[module(skip)]
    prepared: PreparedWeights,
}

impl EncoderConfig {
    /// An encoder of a frozen model's hidden states, `hidden` wide, into this configuration's
    /// `latents` of `width` (its byte and layer settings unused).
    pub fn init_states<B: Backend>(&self, hidden: usize, device: &B::Device) -> StateEncoder<B> {
        StateEncoder {
            project: LinearConfig::new(hidden, self.width).init(device),
            norm: LayerNormConfig::new(self.width).init(device),
            shared_pooler: LatentPooler::init(self.latents, self.width, self.heads, device),
            prepared: PreparedWeights::default(),
        }
    }
}

impl<B: Backend> StateEncoder<B> {
    /// The latents `[texts, M, d_z]` of the hidden states `[texts, tokens, hidden]`, each
    /// text's of its first `lengths[text]` tokens alone: the padding after them is masked, as
    /// stq's `key_padding_mask` masks its sentence encoder's (each text is pooled on its own
    /// where the lengths differ, which is the masked attention exactly).
    pub fn forward(&self, states: Tensor<B, 3>, lengths: &[usize]) -> Tensor<B, 3> {
        let pass = Pass::new(&Settings::default(), &self.prepared, None);
        let [texts, tokens, _] = states.dims();
        assert_eq!(lengths.len(), texts, "one length per text");
        let features = project(&self.project, states, Then::Nothing, &pass);
        let features = pass.norm(&self.norm, features);
        if lengths.iter().all(|&length| length == tokens) {
            return self.shared_pooler.forward(features, &pass);
        }
        let rows = (lengths.iter().enumerate())
            .map(|(row, &length)| {
                let text = features.clone().narrow(0, row, 1);
                let text = text.narrow(1, 0, length.clamp(1, tokens));
                self.shared_pooler.forward(text, &pass)
            })
            .collect();
        Tensor::cat(rows, 0)
    }
}
