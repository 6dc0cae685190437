//! Graph-to-graph passes. Each takes a verified graph and returns an equivalent one
//! (equal outputs on every input, by the reference interpreter), except that
//! `precision` and `quantize` change the outputs by their rounding (bounded by tests).

pub mod batch_norm;
pub mod dce;
pub mod precision;
pub mod quantize;
