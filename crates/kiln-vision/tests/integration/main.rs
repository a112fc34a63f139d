//! kiln-vision's integration tests, one binary: configs, Hugging Face ids, images through kiln-
//! cache, parity with transformers, sampling.

mod support;

mod config;
mod hub;
mod images;
mod parity;
mod sampling;
