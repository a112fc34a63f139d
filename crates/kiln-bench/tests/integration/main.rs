//! kiln-bench's integration tests, one binary: baseline files and comparisons, the timing loop on
//! Flex.

mod baseline;
mod measure;
