//! The CPU executor: runs a compiled model's fused program kernel by kernel
//! ([`crate::kernels`]) through one host arena laid out by its memory plan, so every
//! CPU run exercises the kernels the GPU would launch on the bytes it would use.

use std::collections::HashMap;

use graphc_compiler::plan::MemoryPlan;
use graphc_compiler::Compiled;
use graphc_ir::Tensor;

use crate::kernels::run_planned;
use crate::{Executor, RunError};

/// Runs a compiled model's kernels on the CPU, intermediates in one planned arena.
#[derive(Clone, Copy, Debug, Default)]
pub struct CpuExecutor;

impl CpuExecutor {
    /// The memory plan [`Executor::run`] uses for `model`: the one the pipeline made.
    pub fn plan<'m>(&self, model: &'m Compiled) -> &'m MemoryPlan {
        &model.plan
    }

    /// Run `model` through the arena laid out by `plan` (which must be a plan of
    /// `model.program`; it is checked before anything runs).
    pub fn run_with_plan(
        &self,
        model: &Compiled,
        plan: &MemoryPlan,
        inputs: &HashMap<String, Tensor>,
    ) -> Result<Vec<(String, Tensor)>, RunError> {
        Ok(run_planned(&model.program, plan, model.graph.weights(), inputs)?)
    }
}

impl Executor for CpuExecutor {
    fn run(&self, model: &Compiled, inputs: &HashMap<String, Tensor>) -> Result<Vec<(String, Tensor)>, RunError> {
        self.run_with_plan(model, &model.plan, inputs)
    }
}
