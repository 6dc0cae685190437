//! Shared by the fusion tests: run a fused program the way models run, through the
//! arena of its memory plan.

use std::collections::{BTreeMap, HashMap};

use graphc_compiler::kernel::Program;
use graphc_compiler::plan::{plan_memory, MemoryOptions};
use graphc_ir::Tensor;
use graphc_runtime::kernels::{run_planned, KernelError};

/// Plan the program's memory (default options) and run it through the arena.
pub fn run_arena(
    program: &Program,
    weights: &BTreeMap<String, Tensor>,
    inputs: &HashMap<String, Tensor>,
) -> Result<Vec<(String, Tensor)>, KernelError> {
    let plan = plan_memory(program, &MemoryOptions::default()).expect("memory plan");
    run_planned(program, &plan, weights, inputs)
}
