//! Graph-to-graph passes. Each takes a verified graph and returns an equivalent one
//! (equal outputs on every input, by the reference interpreter).

pub mod dce;
pub mod precision;
