//! Fusion: from an optimized graph to a [`Program`] of kernels.
//!
//! 1. `nodes`: views (reshape, transpose, slice, broadcast) are resolved into affine
//!    layouts of the tensors they view, so they cost nothing; a non-affine reshape, a
//!    matmul operand a GEMM cannot stride through, and an output that is a view get an
//!    explicit copy.
//! 2. `group`: kernel boundaries, chosen by merging producer-consumer groups whose
//!    iteration spaces agree (see there). Elementwise trees become one kernel with as
//!    many stores as values read outside it; a reduction takes its elementwise prologue,
//!    further reductions over the same rows and its epilogue, so softmax, log-softmax,
//!    layer norm and RMS norm each become one row kernel; a matmul takes the elementwise
//!    ops on its output as its epilogue.
//! 3. `emit`: one kernel per group in a topological order, with buffers for every value
//!    read across a kernel boundary.

mod bias_grad;
mod emit;
mod group;
pub mod layout;
mod nodes;
mod siblings;

use graphc_ir::{Graph, GraphError};

use crate::codegen::CodegenError;
use crate::kernel::{KernelKind, Program};

pub use nodes::gemm_readable;

/// Why fusion failed.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum FuseError {
    /// The input graph does not verify.
    #[error(transparent)]
    Graph(#[from] GraphError),
    /// The launch count of the report: a matmul kernel's epilogue split
    /// ([`crate::codegen::epilogue_plan`]) found the kernel malformed (a matmul the
    /// CUDA backend cannot run is counted without an epilogue launch, not an error).
    #[error("fusion report: {0}")]
    Report(#[from] CodegenError),
}

/// Fuse a verified graph into kernels.
pub fn fuse(graph: &Graph) -> Result<Program, FuseError> {
    Ok(fuse_with_report(graph)?.0)
}

/// The cost model's view of a fusion: launches and global-memory bytes, fused and not.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FuseReport {
    pub kernels: usize,
    /// Launches: kernels, plus the generated epilogue of each matmul whose epilogue the
    /// GEMM library cannot apply.
    pub launches: usize,
    /// Bytes the kernels read and write ([`Program::traffic`]), plus the product each
    /// generated matmul epilogue writes and reads back.
    pub bytes: usize,
    /// One launch per compute op (views free), as an eager framework runs the graph.
    pub unfused_kernels: usize,
    pub unfused_bytes: usize,
}

/// Fuse, and say what fusion saved.
pub fn fuse_with_report(graph: &Graph) -> Result<(Program, FuseReport), FuseError> {
    fuse_keeping(graph, &[])
}

/// [`fuse_with_report`], with the outputs named in `in_place` computed by elementwise
/// kernels of their own (a training step's state updates, written over their inputs:
/// fused into a GEMM epilogue or a row kernel they could not be).
pub fn fuse_keeping(graph: &Graph, in_place: &[String]) -> Result<(Program, FuseReport), FuseError> {
    graph.verify()?;
    let nodes = nodes::Nodes::build(graph);
    let mut groups = group::Groups::new(&nodes.nodes);
    let mut is_output = vec![false; nodes.nodes.len()];
    let mut roots = Vec::new();
    for (name, o) in &nodes.outputs {
        is_output[o.root] = true;
        if in_place.contains(name) {
            groups.keep_elementwise(o.root);
            roots.push(o.root);
        }
    }
    if !roots.is_empty() {
        groups.set_update_region(&nodes.nodes, &roots, &is_output);
        if let Some((_, loss)) = nodes.outputs.iter().find(|(n, _)| n == crate::train::LOSS_OUTPUT) {
            groups.set_forward_region(&nodes.nodes, loss.root);
        }
    }
    groups.fuse(&nodes.nodes, &is_output);
    let program = siblings::merge(bias_grad::merge(emit::emit(graph, &nodes, &mut groups)));
    let (unfused_kernels, unfused_bytes) = nodes.unfused_cost();
    // A matmul whose epilogue the GEMM library cannot apply writes its product and reads
    // it back in a generated epilogue kernel (one more launch).
    let (mut extra_bytes, mut extra_launches) = (0, 0);
    for (k, kernel) in program.kernels.iter().enumerate() {
        if let KernelKind::MatMul(mm) = &kernel.kind {
            // A matmul the CUDA backend cannot run has no GPU epilogue launch.
            let plan = match crate::codegen::epilogue_plan(&program, k) {
                Err(e) if e.is_backend_limit() => None,
                plan => plan?,
            };
            if plan.is_some_and(|p| p.needs_kernel()) {
                let elems = mm
                    .batch
                    .iter()
                    .fold(mm.m.saturating_mul(mm.n), |e, &d| e.saturating_mul(d));
                let dtype = kernel
                    .writes()
                    .first()
                    .map_or(4, |b| program.buffer(*b).ty.dtype.size_bytes());
                extra_bytes = elems.saturating_mul(2 * dtype).saturating_add(extra_bytes);
                extra_launches += 1;
            }
        }
    }
    let report = FuseReport {
        kernels: program.kernels.len(),
        launches: program.kernels.len() + extra_launches,
        bytes: program.traffic() + extra_bytes,
        unfused_kernels,
        unfused_bytes,
    };
    Ok((program, report))
}
