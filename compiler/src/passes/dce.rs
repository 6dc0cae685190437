//! Dead-code elimination: keep what the outputs reach, drop the rest (and the weights
//! only dead parameters used). The algorithm lives in the IR crate, since importers
//! prune with it too.

pub use graphc_ir::dce::{eliminate_dead_code, DceReport};
