//! # kiln-text
//!
//! Decoder-only language models of the Llama family read from Hugging Face checkpoints and
//! checked against transformers: Llama (SmolLM2, TinyLlama) and Qwen2, with grouped-query
//! attention, rotary embeddings, tied or untied `lm_head`, left-padded batches, input
//! embeddings, every hidden state, and a key/value cache for incremental decoding. They run on
//! kiln-transformer's blocks, the same projections and host kernels as kiln-vision's towers,
//! under a precision policy (half-precision compute, f32 norms and softmax).
//!
//! ```no_run
//! use burn::backend::Flex;
//! use kiln_core::Policy;
//! use kiln_text::{CausalLm, KvCache, TextInput};
//!
//! let device = Default::default();
//! let model = CausalLm::<Flex>::from_hf_dir("SmolLM2-135M-Instruct", &device, &Policy::full())?;
//! let mut cache = KvCache::new();
//! let prompt = TextInput::ids(vec![vec![1, 504, 3458]]).with_last_logits_only();
//! let logits = model.forward_cached(prompt, &mut cache)?.logits; // [1, 1, vocab]
//! # Ok::<(), kiln_text::TextError>(())
//! ```

mod config;
mod generate;
mod gguf;
mod input;
mod llama;
mod load;
mod stored;
mod tokenizer;

pub use config::{Family, MODEL_TYPES, RopeScaling, TextConfig};
pub use generate::{GenerationConfig, Sampling, generate, generate_after, generate_from};
pub use input::{Logits, TextInput, Tokens};
pub use kiln_transformer::decoder::{KvCache, SharedPrefix, TokensError};
pub use llama::{CausalLm, CausalLmOutput, DecoderLayer, LlamaModel};
pub use stored::Weights;
pub use tokenizer::{Message, TextTokenizer, TokenCache, byte_spelling};

/// Why a checkpoint or an input cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum TextError {
    /// A `config.json` kiln cannot use.
    #[error("{0}")]
    Config(String),
    /// A checkpoint that cannot be found, read or loaded (which tensors, which file).
    #[error(transparent)]
    Checkpoint(#[from] kiln_core::CheckpointError),
    /// Tokens the model cannot take (ids outside the vocabulary, sequences of unequal length).
    #[error("{0}")]
    Input(String),
    /// New tokens, masks or positions the model cannot take after what its cache holds.
    #[error(transparent)]
    Tokens(#[from] TokensError),
    /// A tokenizer or chat template that cannot be used.
    #[error("{0}")]
    Tokenizer(String),
    /// The model computed NaN or infinite values (damaged weights, or an overflow in 16-bit
    /// arithmetic).
    #[error("{0}")]
    NonFinite(String),
}
