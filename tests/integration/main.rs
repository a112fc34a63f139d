//! The facade's integration tests, one binary (each test binary links all of kiln and burn's
//! backends again, so one binary instead of sixteen saves CI minutes):
//! - backends: the same model code on Flex, NdArray and wgpu (`*_backends`, `cache_upload`);
//! - the examples end to end, with the flags their issues call a contract (`*_example`,
//!   `bench_cli`);
//! - bad input: parsers property-tested never to panic (`parsers`, replaying the fuzz corpus)
//!   and every example against hostile files (`hostile`).
//!
//! Run one module with `cargo test --test integration hostile::`.

#[macro_use]
mod common;

mod backends;
mod bench_cli;
mod cache_upload;
mod embed_example;
mod exp0_example;
mod forcefield_backends;
mod forcefield_example;
mod foveated_example;
mod generate_example;
mod hostile;
mod latentwire_example;
mod mc_backends;
mod parsers;
mod policies;
mod realtime_example;
mod text_backends;
mod train_example;
mod train_forcefield_example;
mod vision_backends;
