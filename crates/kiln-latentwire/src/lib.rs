//! LatentWire on kiln (Jinesh, github.com/SujeethJinesh/LatentWire at 220ce571): a text is
//! compressed into `M` learned latent vectors, an interlingua that several frozen language
//! models each read as a soft prompt through their own small adapter, instead of the text.
//!
//! ```
//! use burn::backend::{Autodiff, Flex};
//! use kiln_latentwire::{
//!     EncoderConfig, EncoderKind, LatentWire, Objective, Split, TokenizedSplit, generate,
//!     tiny_readers,
//! };
//!
//! type Ad = Autodiff<Flex>;
//! let device = Default::default();
//! // Two frozen language models (tiny random ones here: `Reader::from_hf_dir` reads real ones).
//! let readers = tiny_readers::<Ad>(&device)?;
//! let widths: Vec<usize> = readers.iter().map(|r| r.model_width()).collect();
//! let encoder = EncoderConfig::new(8).with_layers(1); // M = 8 latents
//! let model = LatentWire::<Ad>::init(&encoder, EncoderKind::Bytes, &widths, &device);
//! // Questions about invented people, tokenized once for both models.
//! let items = generate(Split::Train, 2, 0);
//! let split = TokenizedSplit::new(&items, &readers, "example")?;
//! let loss = Objective::new().loss(&model, &readers, &split.batch(&[0, 1], 512))?;
//! let grads = loss.loss.backward(); // into the encoder and adapters; the models stay frozen
//! assert!(model.encoder.pooler().latent.grad(&grads).is_some());
//! # Ok::<(), kiln_latentwire::LatentWireError>(())
//! ```
//!
//! docs/LATENTWIRE.md says how each part was checked against LatentWire's code and where kiln
//! departs from it. Being built (issue 53). So far:
//! - [`data`]: the seeded extractive QA set the system is trained and evaluated on (there is no
//!   network for SQuAD here): contexts of facts about invented people, places, dates and
//!   objects, questions about one fact, answers that are spans of the context, with the test
//!   split's entities and phrasings held out of training;
//! - [`adapter`]: the adapter that turns the latents into one language model's soft prompt,
//!   checked against LatentWire's own module (scripts/fixtures/latentwire_modules.py);
//! - [`reader`]: one frozen language model reading the text, its first `M` tokens or the soft
//!   prompt in the user's turn of its chat template, with the answer after LatentWire's
//!   `Answer:` anchor;
//! - [`model`]: what trains, the encoder and an adapter per language model;
//! - [`objective`]: LatentWire's training loss, every term from one forward per language model;
//! - [`eval`]: held-out scores per language model and relation for the text, the latent
//!   prefix, the token budget and three baselines that know the question or another item's
//!   latent, with LatentWire's own measures beside kiln's;
//! - [`tokenized`]: a split tokenized once for every language model, kept on disk;
//! - [`train`]: the module kiln-train trains, with the frozen language models beside it;
//! - [`builtin`]: two tiny random language models to run the pipeline without checkpoints;
//! - [`curves`]: `curves.png`, the held-out scores over training;
//! - [`encoder`]: the interlingua encoder (bytes → transformer → `M` pooled latents), checked
//!   against LatentWire's `InterlinguaEncoder` likewise;
//! - [`states`]: the variant that pools the first language model's hidden states of the text
//!   instead (LatentWire's "stq" encoder read a frozen sentence encoder's).

pub mod adapter;
pub mod builtin;
pub mod curves;
pub mod data;
pub mod encoder;
pub mod eval;
pub mod model;
pub mod objective;
pub mod reader;
pub mod states;
pub mod tokenized;
pub mod train;

pub use adapter::{Adapter, AdapterConfig};
pub use builtin::tiny_readers;
pub use data::{QaItem, Relation, Split, generate};
pub use encoder::{ByteBatch, EncoderConfig, InterlinguaEncoder};
pub use eval::{
    Evaluation, JointScores, PROMPT_KINDS, ReaderReport, RelationReport, Report, Scores, Spread,
    StandardErrors,
};
pub use model::{Encoder, EncoderKind, LatentWire};
pub use objective::{LossTerms, Objective, QaBatch, ReaderBatch, TrainingLoss};
pub use reader::{Composed, Contents, Layout, Reader, Template};
pub use states::StateEncoder;
pub use tokenized::TokenizedSplit;
pub use train::{FrozenReaders, LatentWireTraining};

/// What can go wrong building or running LatentWire.
#[derive(Debug, thiserror::Error)]
pub enum LatentWireError {
    /// A language model or tokenizer that cannot be loaded or run.
    #[error(transparent)]
    Text(#[from] kiln_text::TextError),
    /// A checkpoint that cannot be read or loaded.
    #[error(transparent)]
    Checkpoint(#[from] kiln_core::CheckpointError),
    /// Input that cannot be used: what and where.
    #[error("{0}")]
    Input(String),
}
