//! # graphc-compiler: from a verified graph to an executable form
//!
//! [`compile`] runs the passes in a fixed, visible order, with the verifier between
//! stages, and reports what each did. Today the pipeline holds dead-code elimination
//! and the e-graph optimizer ([`optimize`]); fusion, scheduling, memory planning and
//! CUDA code generation slot in as further stages of [`pipeline`] (see ARCHITECTURE.md).

pub mod codegen;
pub mod kernel;
pub mod nvrtc;
pub mod optimize;
pub mod passes;
pub mod pipeline;

pub use pipeline::{compile, CompileError, CompileOptions, Compiled, PassReport};
