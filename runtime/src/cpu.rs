//! The CPU executor: runs a compiled model's fused program kernel by kernel
//! ([`crate::kernels`]), so every CPU run exercises the kernels the GPU would launch.

use std::collections::HashMap;

use graphc_compiler::Compiled;
use graphc_ir::Tensor;

use crate::kernels::run_program;
use crate::{Executor, RunError};

/// Runs a compiled model's kernels on the CPU.
#[derive(Clone, Copy, Debug, Default)]
pub struct CpuExecutor;

impl Executor for CpuExecutor {
    fn run(&self, model: &Compiled, inputs: &HashMap<String, Tensor>) -> Result<Vec<(String, Tensor)>, RunError> {
        Ok(run_program(&model.program, model.graph.weights(), inputs)?)
    }
}
