//! kiln-text's integration tests, one binary: parity with transformers, the tokenizer, errors on
//! bad input.

mod errors;
mod parity;
mod tokenizer;
