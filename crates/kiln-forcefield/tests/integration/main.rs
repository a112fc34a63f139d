//! kiln-forcefield's integration tests, one binary: parity with schnetpack, gradients against
//! PyTorch, physical properties, the distillation data.

mod support;

#[cfg(feature = "train")]
mod distill_data;
mod gradients;
mod parity;
mod properties;
