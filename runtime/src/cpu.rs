//! The CPU executor.

use std::collections::HashMap;

use graphc_compiler::Compiled;
use graphc_ir::{interpret, Tensor};

use crate::{Executor, RunError};

/// Runs a compiled graph through the reference interpreter.
#[derive(Clone, Copy, Debug, Default)]
pub struct CpuExecutor;

impl Executor for CpuExecutor {
    fn run(&self, model: &Compiled, inputs: &HashMap<String, Tensor>) -> Result<Vec<(String, Tensor)>, RunError> {
        Ok(interpret(&model.graph, inputs)?)
    }
}
