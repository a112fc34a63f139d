//! kiln-foveated's integration tests, one binary: parity with fVLM's computation (the research
//! variant against a PyTorch reading of it, the release variant against fVLM's own code), training
//! on kiln-train.

#[cfg(feature = "train")]
mod caption;
mod parity;
#[cfg(feature = "train")]
mod recipe;
mod release;
mod support;
#[cfg(feature = "train")]
mod training;
