//! kiln-core's integration tests on Flex, one binary: loss scaling through a real backward pass,
//! the precision policy in every dtype, GGUF files against the `gguf` package. (`flex_threads` stays a binary of its own: it inspects the
//! process-wide thread pool.)

mod gguf;
mod loss_scale_autodiff;
mod policy_flex;
