//! kiln-cache's integration tests, one binary: the cache's life cycle, video clips, feeding
//! devices, parity with transformers' image processors.

mod cache;
mod clips;
mod feed;
mod processor_parity;
