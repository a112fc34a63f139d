//! kiln-foveated's integration tests, one binary: parity with fVLM's computation, training on
//! kiln-train.

mod parity;
#[cfg(feature = "train")]
mod training;
