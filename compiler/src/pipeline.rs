//! The compile pipeline: every stage, in order, readable top to bottom.

use std::time::{Duration, Instant};

use graphc_ir::{Graph, GraphError};

use crate::fuse::{fuse_with_report, FuseReport};
use crate::kernel::Program;
use crate::optimize::{optimize, OptimizeOptions, OptimizeReport};
use crate::passes::dce::eliminate_dead_code;
use crate::passes::precision::{apply_precision, Precision, PrecisionReport};
use crate::plan::{apply_schedule, plan_memory, schedule, verify_plan, MemoryOptions, MemoryPlan, PlanError, Schedule};

/// Knobs of the pipeline.
#[derive(Clone, Debug, Default)]
pub struct CompileOptions {
    /// Verify the graph after every pass (always on in debug builds).
    pub verify_each_pass: bool,
    /// Limits of the e-graph optimizer.
    pub optimize: OptimizeOptions,
    /// The memory planner's budget, alignment, target architecture.
    pub memory: MemoryOptions,
    /// fp32 (default), tf32 (f32 GEMMs on TF32 tensor cores), or bf16 / fp16 mixed
    /// precision (`passes::precision`).
    pub precision: Precision,
}

/// What one pass did.
#[derive(Clone, Debug)]
pub struct PassReport {
    pub pass: &'static str,
    pub nodes_before: usize,
    pub nodes_after: usize,
    pub time: Duration,
    pub notes: Vec<String>,
}

/// The result of compiling: the graph to execute and the report of every pass.
#[derive(Clone, Debug)]
pub struct Compiled {
    pub graph: Graph,
    /// The graph fused into kernels (`nodes_after` of the `fuse` pass counts kernels).
    pub program: Program,
    pub passes: Vec<PassReport>,
    /// The optimizer's full report.
    pub optimize: OptimizeReport,
    /// What fusion saved, by the cost model.
    pub fusion: FuseReport,
    /// The kernel order chosen (already applied to `program`) and every candidate's peak.
    pub schedule: Schedule,
    /// Where every intermediate lives, and whether the run fits the budget.
    pub plan: MemoryPlan,
    /// The precision compiled for, and what the precision pass did.
    pub precision: PrecisionReport,
}

#[derive(Debug, thiserror::Error)]
pub enum CompileError {
    #[error("input graph: {0}")]
    Input(GraphError),
    #[error("after pass {pass}: {error}")]
    Pass { pass: &'static str, error: GraphError },
    #[error("after pass optimize: {0}")]
    Optimize(#[from] crate::optimize::OptimizeError),
    #[error("after pass fuse: {0}")]
    Fuse(#[from] crate::fuse::FuseError),
    #[error("memory plan: {0}")]
    Plan(#[from] PlanError),
    /// The planner produced an invalid plan (a bug; checked in debug builds).
    #[error("memory plan failed verification: {0}")]
    PlanInvalid(String),
    /// A kernel program that is not well-formed kernel IR (a bug; checked after fusion
    /// and scheduling in debug builds and with `verify_each_pass`).
    #[error("kernel IR: {0}")]
    Kernel(#[from] Box<crate::kernel::KernelVerifyError>),
}

/// Compile a graph: verify, then run each pass, verifying between passes.
pub fn compile(graph: &Graph, opts: &CompileOptions) -> Result<Compiled, CompileError> {
    graph.verify().map_err(CompileError::Input)?;
    let mut passes = Vec::new();

    let start = Instant::now();
    let (graph, dce) = eliminate_dead_code(graph);
    let mut notes = Vec::new();
    if !dce.weights_removed.is_empty() {
        notes.push(format!("unused weights dropped: {}", dce.weights_removed.join(", ")));
    }
    passes.push(PassReport {
        pass: "dce",
        nodes_before: graph.len() + dce.nodes_removed,
        nodes_after: graph.len(),
        time: start.elapsed(),
        notes,
    });
    check(&graph, "dce", opts)?;

    let start = Instant::now();
    let (graph, mut precision) = apply_precision(&graph, opts.precision).map_err(|error| CompileError::Pass {
        pass: "precision",
        error,
    })?;
    if opts.precision.low_type().is_some() {
        passes.push(PassReport {
            pass: "precision",
            nodes_before: passes.last().map(|p| p.nodes_after).unwrap_or(0),
            nodes_after: graph.len(),
            time: start.elapsed(),
            notes: vec![format!(
                "{}: {} nodes in {}, {} kept in f32, {} casts (weight casts fold into {} weights)",
                opts.precision,
                precision.low_nodes,
                opts.precision,
                precision.f32_nodes,
                precision.casts,
                opts.precision
            )],
        });
        check(&graph, "precision", opts)?;
    }

    let (graph, report) = optimize(&graph, &opts.optimize)?;
    let mut notes = vec![format!(
        "{} constants folded, {} rule applications, {} iterations, stopped: {}",
        report.constants_folded,
        report.rules_fired.values().sum::<usize>(),
        report.iterations,
        report.stop_reason
    )];
    if !report.weights_added.is_empty() {
        notes.push(format!("weights folded: {}", report.weights_added.join(", ")));
    }
    if !report.weights_dropped.is_empty() {
        notes.push(format!("weights no longer used: {}", report.weights_dropped.join(", ")));
    }
    passes.push(PassReport {
        pass: "optimize",
        nodes_before: report.nodes_before,
        nodes_after: report.nodes_after,
        time: report.time,
        notes,
    });
    check(&graph, "optimize", opts)?;

    let start = Instant::now();
    let (program, fusion) = fuse_with_report(&graph)?;
    if cfg!(debug_assertions) || opts.verify_each_pass {
        crate::kernel::verify(&program).map_err(Box::new)?;
    }
    passes.push(PassReport {
        pass: "fuse",
        nodes_before: graph.len(),
        nodes_after: program.kernels.len(),
        time: start.elapsed(),
        notes: vec![format!(
            "{} launches instead of {} unfused; {} bytes of global memory traffic instead of {}",
            fusion.launches, fusion.unfused_kernels, fusion.bytes, fusion.unfused_bytes
        )],
    });

    let start = Instant::now();
    let order = schedule(&program);
    let program = if order.name == "program" {
        program
    } else {
        apply_schedule(&program, &order.order)
    };
    let mut plan = plan_memory(&program, &opts.memory)?;
    plan.schedule = order.name.to_string();
    if cfg!(debug_assertions) || opts.verify_each_pass {
        crate::kernel::verify(&program).map_err(Box::new)?;
        verify_plan(&program, &plan).map_err(CompileError::PlanInvalid)?;
    }
    let mut plan_notes = vec![format!(
        "schedule {} (peak {} bytes; {})",
        order.name,
        order.peak,
        order
            .candidates
            .iter()
            .map(|(n, p)| format!("{n} {p}"))
            .collect::<Vec<_>>()
            .join(", ")
    )];
    plan_notes.push(format!(
        "arena {} bytes, lower bound {} ({:.3}x, {}), {} in place",
        plan.arena_bytes,
        plan.lower_bound_bytes,
        plan.ratio(),
        plan.strategy,
        plan.in_place
    ));
    passes.push(PassReport {
        pass: "plan",
        nodes_before: program.kernels.len(),
        nodes_after: plan.buffers.len(),
        time: start.elapsed(),
        notes: plan_notes,
    });
    // What the precision saved.
    let low = precision.precision.low_type();
    precision.weights_bytes_before = report.weight_bytes_before as u64;
    precision.weights_bytes_after = report.weight_bytes_after as u64;
    for b in &plan.buffers {
        let ty = &program.buffers[b.buffer as usize].ty;
        let bytes = ty.size_bytes() as u64;
        precision.intermediates_bytes = precision.intermediates_bytes.saturating_add(bytes);
        let f32_bytes = if Some(ty.dtype) == low {
            (ty.numel() as u64).saturating_mul(4)
        } else {
            bytes
        };
        precision.intermediates_f32_bytes = precision.intermediates_f32_bytes.saturating_add(f32_bytes);
    }
    Ok(Compiled {
        graph,
        program,
        passes,
        optimize: report,
        fusion,
        schedule: order,
        plan,
        precision,
    })
}

fn check(graph: &Graph, pass: &'static str, opts: &CompileOptions) -> Result<(), CompileError> {
    if opts.verify_each_pass || cfg!(debug_assertions) {
        graph.verify().map_err(|error| CompileError::Pass { pass, error })?;
    }
    Ok(())
}
