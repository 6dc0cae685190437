//! # graphc-runtime: executing compiled models
//!
//! Two executors of one plan. [`cpu::CpuExecutor`] runs a compiled model's fused kernels
//! ([`kernels`]: the kernel IR executed column-at-a-time with the interpreter's op
//! functions) through one host arena laid out by the model's memory plan
//! ([`kernels::run_planned`]): every intermediate at its planned offset, the bytes the
//! GPU would use, so a plan that overlaps live buffers gives wrong numbers on the CPU
//! too. [`kernels::run_program`] (one allocation per buffer, no plan) stays as the
//! unplanned reference of the low-level kernel tests. [`cuda`] runs the same plan on an
//! NVIDIA GPU ([`cuda::Session`], and [`cuda::CudaExecutor`] behind the same
//! [`Executor`] trait), with its plan-to-launch translation checked on the CPU by the
//! launch emulator.

pub mod cpu;
pub mod cuda;
pub mod kernels;
pub mod state;

use std::collections::HashMap;

use graphc_compiler::Compiled;
use graphc_ir::{InterpError, Tensor};

/// Runs a compiled model on named inputs, returning named outputs in order.
pub trait Executor {
    fn run(&self, model: &Compiled, inputs: &HashMap<String, Tensor>) -> Result<Vec<(String, Tensor)>, RunError>;
}

#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error("{0}")]
    Interp(#[from] InterpError),
    #[error("{0}")]
    Kernel(#[from] kernels::KernelError),
    #[error("memory plan: {0}")]
    Plan(#[from] graphc_compiler::plan::PlanError),
    #[error("{0}")]
    Cuda(#[from] cuda::CudaError),
}
