pub(crate) mod base;
pub(crate) mod state;

pub use base::start_global_orchestrator;
