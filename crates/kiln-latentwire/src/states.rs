//! The interlingua read from a frozen language model's hidden states, the encoder variant beside
//! LatentWire's byte encoder. LatentWire's later "stq" encoder (`STQueryEncoder`,
//! `latentwire/models.py` at 220ce571) reads a text's token states from a frozen sentence
//! encoder (MiniLM's `last_hidden_state`) and pools them with learned queries; here the frozen
//! model is the first language model itself ([`Reader::text_states`](crate::Reader): its final
//! norm's output over the text's ids, computed without gradient), its states projected to `d_z`,
//! normalised, and pooled by the byte encoder's pooler (the same learned queries, cross-attention,
//! gate and feed-forward). As LatentWire's byte encoder, the pooler attends to every position of
//! the batch, the end ids that pad the shorter texts included.

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
    /// The latents `[texts, M, d_z]` of the hidden states `[texts, tokens, hidden]`.
    pub fn forward(&self, states: Tensor<B, 3>) -> Tensor<B, 3> {
        let pass = Pass::new(&Settings::default(), &self.prepared, None);
        let features = project(&self.project, states, Then::Nothing, &pass);
        self.shared_pooler
            .forward(pass.norm(&self.norm, features), &pass)
    }
}
