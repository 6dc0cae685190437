//! # graphc-compiler: from a verified graph to an executable form
//!
//! [`compile`] runs the passes in a fixed, visible order, with the verifier between
//! stages, and reports what each did: dead-code elimination, the e-graph optimizer
//! ([`optimize`]) and fusion into kernels ([`fuse`], producing a [`kernel::Program`]).
//! [`codegen`] prints a program's kernels as CUDA C and [`nvrtc`] compiles them;
//! scheduling and memory planning slot in as further stages (see ARCHITECTURE.md).

pub mod codegen;
pub mod fuse;
pub mod kernel;
pub mod nvrtc;
pub mod optimize;
pub mod passes;
pub mod pipeline;
pub mod plan;

pub use pipeline::{compile, CompileError, CompileOptions, Compiled, PassReport};
