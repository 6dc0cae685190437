//! Helpers shared by the ir integration tests: one-op graphs run through the
//! interpreter, and a generator of random valid graphs.
#![allow(dead_code, unused_imports)]

mod one_op;
mod random_graph;

pub use one_op::*;
pub use random_graph::*;
