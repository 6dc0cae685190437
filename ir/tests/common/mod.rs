//! Helpers shared by the ir integration tests: one-op graphs run through the
//! interpreter, a generator of random valid graphs, and hand-made ONNX models.
#![allow(dead_code, unused_imports)]

mod one_op;
mod onnx_model;
mod random_graph;

pub use one_op::*;
pub use onnx_model::*;
pub use random_graph::*;
