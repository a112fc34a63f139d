//! LatentWire on kiln (Jinesh, github.com/SujeethJinesh/LatentWire at 220ce571): a text is
//! compressed into `M` learned latent vectors, an interlingua that several frozen language
//! models each read as a soft prompt through their own small adapter, instead of the text.
//!
//! Being built (issue 53). So far:
//! - [`data`]: the seeded extractive QA set the system is trained and evaluated on (there is no
//!   network for SQuAD here): contexts of facts about invented people, places, dates and
//!   objects, questions about one fact, answers that are spans of the context, with the test
//!   split's entities and phrasings held out of training;
//! - [`adapter`]: the adapter that turns the latents into one language model's soft prompt,
//!   checked against LatentWire's own module (scripts/fixtures/latentwire.py);
//! - [`encoder`]: the interlingua encoder (bytes → transformer → `M` pooled latents), checked
//!   against LatentWire's `InterlinguaEncoder` likewise.

pub mod adapter;
pub mod data;
pub mod encoder;

pub use adapter::{Adapter, AdapterConfig};
pub use data::{QaItem, Relation, Split, generate};
pub use encoder::{ByteBatch, EncoderConfig, InterlinguaEncoder};
