//! kiln-core's integration tests on Flex, one binary: loss scaling through a real backward pass,
//! the precision policy in every dtype. (`flex_threads` stays a binary of its own: it inspects the
//! process-wide thread pool.)

mod loss_scale_autodiff;
mod policy_flex;
