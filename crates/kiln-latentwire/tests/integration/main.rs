//! kiln-latentwire's integration tests: one binary, a module per concern.

mod adapter;
mod encoder;
mod reader;
mod support;
