//! kiln-text's integration tests, one binary: parity with transformers, the tokenizer, GGUF files,
//! errors on bad input.

mod errors;
mod gguf;
mod parity;
mod tokenizer;
