//! What LatentWire trains: the interlingua encoder and one adapter per language model. The
//! language models themselves ([`Reader`]s) stay frozen and outside the module, so that the
//! optimizer, the checkpoints and the gradients hold only these.

use burn::module::Module;
use burn::tensor::Tensor;
use burn::tensor::backend::Backend;

use crate::{Adapter, AdapterConfig, ByteBatch, EncoderConfig, InterlinguaEncoder, Reader};

/// The interlingua encoder and an adapter per language model, in the readers' order.
#[derive(Module, Debug)]
pub struct LatentWire<B: Backend> {
    /// Texts → `M` shared latents.
    pub encoder: InterlinguaEncoder<B>,
    /// Latents → each language model's soft prompt.
    pub adapters: Vec<Adapter<B>>,
}

impl<B: Backend> LatentWire<B> {
    /// A new system for language models of input widths `model_widths`, initialised as
    /// LatentWire's (adapters with train.py's settings: slot embeddings, no answer lengths).
    pub fn init(encoder: &EncoderConfig, model_widths: &[usize], device: &B::Device) -> Self {
        let adapters = model_widths
            .iter()
            .map(|&width| AdapterConfig::new(encoder.width, width, encoder.latents).init(device))
            .collect();
        LatentWire {
            encoder: encoder.init(device),
            adapters,
        }
    }

    /// The shared latents of `bytes` `[texts, M, d_z]`.
    pub fn latents(&self, bytes: &ByteBatch) -> Tensor<B, 3> {
        self.encoder.forward(bytes)
    }

    /// Each reader's soft prompt `[texts, M, hidden]` from the latents, scaled to its input
    /// embeddings' RMS. The adapters are given no answer lengths: LatentWire's fed the gold
    /// answer's length in (at evaluation too), which tells the model about the answer.
    pub fn prefixes(&self, latents: Tensor<B, 3>, readers: &[Reader<B>]) -> Vec<Tensor<B, 3>> {
        assert_eq!(self.adapters.len(), readers.len(), "one adapter per reader");
        (self.adapters.iter().zip(readers))
            .map(|(adapter, reader)| reader.calibrate(adapter.forward(latents.clone(), None)))
            .collect()
    }
}
