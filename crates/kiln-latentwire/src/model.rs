//! What LatentWire trains: the interlingua encoder and one adapter per language model. The
//! language models themselves ([`Reader`]s) stay frozen and outside the module, so that the
//! optimizer, the checkpoints and the gradients hold only these.

use burn::module::Module;
use burn::tensor::Tensor;
use burn::tensor::backend::Backend;

use crate::encoder::LatentPooler;
use crate::{
    Adapter, AdapterConfig, EncoderConfig, InterlinguaEncoder, LatentWireError, QaBatch, Reader,
    StateEncoder,
};

/// What the interlingua reads of a text.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum EncoderKind {
    /// Its UTF-8 bytes, through LatentWire's byte encoder.
    #[default]
    Bytes,
    /// The first language model's hidden states of its ids ([`StateEncoder`]).
    States,
}

/// The interlingua encoder: LatentWire's byte encoder, or the pooling of a frozen model's hidden
/// states.
#[derive(Module, Debug)]
pub enum Encoder<B: Backend> {
    /// Bytes → transformer → pooled latents.
    Bytes(InterlinguaEncoder<B>),
    /// The first language model's hidden states → pooled latents.
    States(StateEncoder<B>),
}

impl<B: Backend> Encoder<B> {
    /// The learned-query pooler the latents come from.
    pub fn pooler(&self) -> &LatentPooler<B> {
        match self {
            Encoder::Bytes(encoder) => &encoder.shared_pooler,
            Encoder::States(encoder) => &encoder.shared_pooler,
        }
    }

    /// The bytes of a text the encoder reads (none: the state encoder reads token ids).
    pub fn max_bytes(&self) -> usize {
        match self {
            Encoder::Bytes(encoder) => encoder.max_bytes(),
            Encoder::States(_) => 0,
        }
    }

    /// `[M, d_z]`: the latents per text and their width.
    pub fn latent_shape(&self) -> [usize; 2] {
        self.pooler().latent.dims()
    }
}

/// The interlingua encoder and an adapter per language model, in the readers' order.
#[derive(Module, Debug)]
pub struct LatentWire<B: Backend> {
    /// Texts → `M` shared latents.
    pub encoder: Encoder<B>,
    /// Latents → each language model's soft prompt.
    pub adapters: Vec<Adapter<B>>,
}

impl<B: Backend> LatentWire<B> {
    /// A new system for language models of input widths `model_widths` (the first the state
    /// encoder reads), its encoder reading what `kind` says, initialised as LatentWire's
    /// (adapters with train.py's settings: slot embeddings, no answer lengths).
    pub fn init(
        encoder: &EncoderConfig,
        kind: EncoderKind,
        model_widths: &[usize],
        device: &B::Device,
    ) -> Self {
        let adapters = model_widths
            .iter()
            .map(|&width| AdapterConfig::new(encoder.width, width, encoder.latents).init(device))
            .collect();
        let encoder_module = match kind {
            EncoderKind::Bytes => Encoder::Bytes(encoder.init(device)),
            EncoderKind::States => {
                let width = *model_widths.first().expect("at least one language model");
                Encoder::States(encoder.init_states(width, device))
            }
        };
        LatentWire {
            encoder: encoder_module,
            adapters,
        }
    }

    /// The shared latents `[texts, M, d_z]` of a batch's texts: from their bytes, or from the
    /// first reader's hidden states of their ids for it.
    pub fn latents(
        &self,
        batch: &QaBatch,
        readers: &[Reader<B>],
    ) -> Result<Tensor<B, 3>, LatentWireError> {
        match &self.encoder {
            Encoder::Bytes(encoder) => Ok(encoder.forward(&batch.bytes)),
            Encoder::States(encoder) => {
                let (Some(reader), Some(items)) = (readers.first(), batch.readers.first()) else {
                    return Err(LatentWireError::Input(
                        "the state encoder reads the first language model's hidden states, and \
                         there is none"
                            .into(),
                    ));
                };
                let lengths: Vec<usize> = items.texts.iter().map(Vec::len).collect();
                Ok(encoder.forward(reader.text_states(&items.texts)?, &lengths))
            }
        }
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
