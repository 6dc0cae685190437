//! # graphc-compiler: from a verified graph to an executable form
//!
//! [`compile`] runs the passes in a fixed, visible order, with the verifier between
//! stages, and reports what each did: dead-code elimination, the e-graph optimizer
//! ([`optimize`]) and fusion into kernels ([`fuse`], producing a [`kernel::Program`]).
//! Scheduling and memory planning ([`plan`]) close it. Two backend stages follow for
//! the GPU: [`generate_kernels`] ([`codegen`] prints every kernel as CUDA C) and
//! [`build`] ([`nvrtc`] compiles them for one architecture, cached on disk); the
//! runtime only loads and runs what they produce (see ARCHITECTURE.md).

pub mod chunk;
pub mod codegen;
pub mod fuse;
pub mod kernel;
pub mod nvrtc;
pub mod optimize;
pub mod passes;
pub mod perf;
pub mod pipeline;
pub mod plan;
pub mod train;

pub use pipeline::{
    build, compile, generate_kernels, Binary, CompileError, CompileOptions, Compiled, Kernels, Pass, PassDetail,
    PassReport,
};
