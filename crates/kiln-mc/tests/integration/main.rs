//! kiln-mc's integration tests, one binary: trials of a real tower over a kiln-cache dataset, the
//! statistics against independent computations.

mod runner;
mod statistics;
