//! kiln-latentwire's integration tests: one binary, a module per concern.

mod adapter;
mod encoder;
mod eval;
mod objective;
mod reader;
mod support;
