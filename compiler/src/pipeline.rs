//! The compile pipeline: every stage, in order, readable top to bottom.
//!
//! [`compile`] runs the graph stages (dead-code elimination, the optimizer, precision
//! and, with a low type, the optimizer again; fusion, scheduling and memory planning), each a function returning its value and a
//! typed [`PassReport`] ([`report`] renders their text). Two backend stages follow,
//! called by whoever runs the model on a GPU: [`generate_kernels`] (the CUDA C of every
//! kernel, [`Kernels`]) and [`build`] (NVRTC's cubins or PTX for one architecture,
//! [`Binary`], through the on-disk cache of [`crate::nvrtc`]). They stay out of
//! `compile` because a model the CUDA backend cannot generate still compiles and runs
//! on the CPU.

pub mod family;
mod remat;
pub mod report;

use std::collections::HashSet;
use std::ops::Deref;
use std::time::{Duration, Instant};

use graphc_ir::{Graph, GraphError};
use serde::{Deserialize, Serialize};

use crate::codegen::{self, CodegenError, CudaKernel};
use crate::fuse::{fuse_keeping, FuseReport};
use crate::kernel::{BufferKind, Program};
use crate::nvrtc::{self, NvrtcError, NvrtcOptions, OutputKind};
use crate::optimize::{optimize, OptimizeOptions, OptimizeReport};
use crate::passes::dce::eliminate_dead_code;
use crate::passes::precision::{apply_precision_with, Outputs, Precision, PrecisionReport};
use crate::passes::quantize::{quantize_weights, QuantReport, WeightQuant};
use crate::plan::{plan_memory, schedule, verify_plan, MemoryOptions, MemoryPlan, PlanError, Schedule};
use crate::train::{Remat, State, TrainOptions, TrainReport};
use remat::{auto_remat, set_bytes_off, Back, Selection};

pub use report::{Pass, PassDetail, PassReport};

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
    /// With a low precision, the type of the float outputs: the low type (the default,
    /// as PyTorch's bf16 model returns them) or as declared (`--f32-outputs`).
    pub outputs: Outputs,
    /// Weight-only quantization of matmul and embedding weights (`--weights`).
    pub weights: WeightQuant,
    /// Compile a whole training step (loss, backward, optimizer update) instead of
    /// the forward graph ([`crate::train`]).
    pub train: Option<TrainOptions>,
    /// Run each position-wise MLP over this many parts of its tokens
    /// ([`crate::chunk`]; 0 or 1: whole). Inference only.
    pub token_chunks: usize,
    /// A training step: run each MLP over this many parts of its tokens, in the forward
    /// and the backward ([`crate::chunk::chunk_mlp_tokens`]; 0 or 1: whole).
    pub mlp_chunks: usize,
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
    /// The weights quantized (none unless `CompileOptions::weights` asks).
    pub quantize: QuantReport,
    /// Token chunking ([`CompileOptions::token_chunks`]): the MLPs run in parts.
    pub chunks: crate::chunk::ChunkReport,
    /// With token chunking, the graph before it (what a shape family is made of:
    /// each value's graph is chunked anew).
    pub unchunked: Option<Graph>,
    /// A training step: its state (parameters, optimizer moments, step counter, with
    /// their initial values) and what the training stages did.
    pub train: Option<Training>,
}

/// The training side of a compiled step.
#[derive(Clone, Debug)]
pub struct Training {
    pub state: State,
    pub report: TrainReport,
}

#[derive(Debug, thiserror::Error)]
pub enum CompileError {
    #[error("input graph: {0}")]
    Input(GraphError),
    #[error("after pass {pass}: {error}")]
    Pass { pass: &'static str, error: GraphError },
    #[error("training: {0}")]
    Train(crate::train::TrainError),
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

/// A training error is this error's message (not its source too: printed with its
/// causes, the message would repeat).
impl From<crate::train::TrainError> for CompileError {
    fn from(e: crate::train::TrainError) -> CompileError {
        CompileError::Train(e)
    }
}

/// Compile a graph: verify, then run each stage, verifying between them.
///
/// A training step with `--remat auto` and no `token_chunks` given (0) that does not
/// fit its budget as it is computes its loss over an LM head in parts
/// ([`crate::train::build_loss_in_parts`], the count chosen: one part's logits about
/// an MLP hidden wide), the cheapest memory there is (the parts' logits made again: the
/// LM head's GEMM once more), then recomputes the fewest layers that fit.
pub fn compile(graph: &Graph, opts: &CompileOptions) -> Result<Compiled, CompileError> {
    compile_from(opts, &mut |o: &CompileOptions| front(graph, o))
}

/// [`compile`], given the stages up to recomputation for a setting of the options
/// (`front`: the graph's, or a shape family's written out at a value).
fn compile_from<E: From<CompileError>>(opts: &CompileOptions, front: &mut Front<'_, E>) -> Result<Compiled, E> {
    let (back, stepped) = front(opts)?;
    let Some(remat) = opts.train.as_ref().map(|t| t.remat) else {
        return Ok(back.finish(stepped, opts)?);
    };
    match remat {
        Remat::Off => Ok(back.with_remat(&stepped, Selection::Layers(0), opts)?),
        Remat::Full => {
            let off = back.clone().with_remat(&stepped, Selection::Layers(0), opts)?;
            let mut full = back.with_remat(&stepped, Selection::Layers(usize::MAX), opts)?;
            set_bytes_off(&mut full, off.plan.total_bytes);
            Ok(full)
        }
        Remat::FullProbe => Ok(back.with_remat(&stepped, Selection::Layers(usize::MAX), opts)?),
        Remat::Auto if opts.token_chunks != 0 => Ok(auto_remat(back, &stepped, opts, None, None)?),
        Remat::Auto => {
            // The step as it is; over the budget, its loss in parts (when it reads an
            // LM head), then layers.
            let whole = back.clone().with_remat(&stepped, Selection::Layers(0), opts)?;
            if whole.plan.fits() {
                return Ok(whole);
            }
            // The loss in parts, where its logits are made again (what saves memory).
            if !whole.train.as_ref().is_some_and(|t| t.report.lm_head) {
                return Ok(auto_remat(back, &stepped, opts, Some(whole.plan.total_bytes), None)?);
            }
            let parts = CompileOptions {
                token_chunks: crate::train::loss::AUTO_PARTS,
                ..opts.clone()
            };
            let (back, stepped) = front(&parts)?;
            Ok(auto_remat(back, &stepped, &parts, None, None)?)
        }
    }
}

/// The stages up to recomputation for a setting of the options: what made the step
/// graph, and the step graph ([`front`], or a shape family's written out).
type Front<'a, E> = dyn FnMut(&CompileOptions) -> Result<(Back, Graph), E> + 'a;

/// The stages up to recomputation: the step graph (or the forward graph, without
/// training) and what made it, for [`Back`].
fn front(graph: &Graph, opts: &CompileOptions) -> Result<(Back, Graph), CompileError> {
    graph.verify().map_err(CompileError::Input)?;
    let mut passes = Vec::new();
    // Training: trainable parameters become state (inputs the step updates), so
    // nothing below folds through them.
    let (graph, mut training) = match &opts.train {
        Some(train) => {
            let (graph, training, report) = run_make_state(graph, train, opts)?;
            passes.push(report);
            (graph, Some(training))
        }
        None => (graph.clone(), None),
    };
    // Batch normalization: batch statistics in a training step (its running
    // statistics state), a per-channel affine map otherwise.
    let graph = match (&mut training, crate::passes::batch_norm::has_batch_norm(&graph)) {
        (_, false) => Ok(graph),
        (Some(t), true) => crate::passes::batch_norm::lower_for_training(&graph, &mut t.state),
        (None, true) => crate::passes::batch_norm::lower_for_inference(&graph),
    }
    .map_err(|error| CompileError::Pass {
        pass: "batch_norm",
        error,
    })?;
    let (graph, dce) = run_dce(&graph, opts)?;
    passes.push(dce);
    // The optimizer runs on the model as written (recognizing attention and GELU in
    // f32, as the front ends spell them), then the precision pass types it, and with
    // a low type the optimizer runs again to fold the weight casts into low-type
    // weights: precision never changes what fusion sees but the types.
    let (graph, mut optimize, report) = run_optimize(&graph, opts)?;
    passes.push(report);
    // Training: the loss, its gradients and the optimizer's update, built on the
    // optimized forward graph (so attention and GELU are differentiated as the fused
    // forms), then optimized as one step.
    // With mixed precision, the precision pass types the forward graph and the loss
    // before autodiff (as `torch.autocast` runs the forward): each op's backward then
    // runs in its forward's type, and the optimizer's update stays in f32 on the f32
    // master parameters.
    let (graph, precision) = match (&opts.train, &mut training) {
        (Some(train), Some(training)) => {
            let start = Instant::now();
            let with_loss = crate::train::build_loss_in_parts(
                &graph,
                &training.state,
                train,
                &mut training.report,
                opts.token_chunks,
            )?;
            let loss_time = start.elapsed();
            let mut p = opts.clone();
            p.outputs = Outputs::Declared;
            let (with_loss, precision, again) = run_precision_then_optimize(&with_loss, &p, opts, &mut passes)?;
            if let Some(again) = again {
                optimize = merge_optimize_reports(optimize, again);
            }
            // The MLPs in parts of their tokens (after the last optimizer run on the
            // forward graph, whose rules would join the parts).
            let with_loss = if opts.mlp_chunks > 1 {
                let names: std::collections::HashSet<&str> =
                    training.state.parameters().map(|s| s.name.as_str()).collect();
                let parameter = |n: &graphc_ir::Node| matches!(&n.op, graphc_ir::Op::Input { name, .. } if names.contains(name.as_str()));
                let (chunked, report) = crate::chunk::chunk_mlp_tokens(&with_loss, opts.mlp_chunks, &parameter)
                    .map_err(|error| CompileError::Pass { pass: "chunk", error })?;
                training.report.mlp_parts = report;
                chunked
            } else {
                with_loss
            };
            let (graph, mut report) = run_autodiff(&with_loss, train, training, opts)?;
            report.time += loss_time;
            passes.push(report);
            let (graph, again, report) = run_optimize(&graph, opts)?;
            passes.push(report);
            optimize = merge_optimize_reports(optimize, again);
            // Low-precision parameter copies made again for the backward, not held.
            let (graph, recast) =
                crate::train::remat::recompute_parameter_casts(&graph, &training.state).map_err(|error| {
                    CompileError::Pass {
                        pass: "autodiff",
                        error,
                    }
                })?;
            training.report.recomputed_casts = recast;
            check(&graph, Pass::Autodiff, opts)?;
            (graph, precision)
        }
        _ => {
            let (graph, precision, again) = run_precision_then_optimize(&graph, opts, opts, &mut passes)?;
            if let Some(again) = again {
                optimize = merge_optimize_reports(optimize, again);
            }
            (graph, precision)
        }
    };
    let back = Back {
        passes,
        optimize,
        precision,
        training,
    };
    Ok((back, graph))
}

/// Training, stage 1 ([`crate::train::make_state`]). Quantized weights are not
/// trained.
fn run_make_state(
    graph: &Graph,
    train: &TrainOptions,
    opts: &CompileOptions,
) -> Result<(Graph, Training, PassReport), CompileError> {
    let start = Instant::now();
    if opts.weights.bits().is_some() {
        return Err(crate::train::TrainError::Invalid(
            "a training step trains float weights (no --weights int8/int4)".into(),
        )
        .into());
    }
    let (out, state, report) = crate::train::make_state(graph, train)?;
    let pass = PassReport {
        pass: Pass::State,
        nodes_before: graph.len(),
        nodes_after: out.len(),
        time: start.elapsed(),
        details: vec![PassDetail::State {
            parameters: report.trainable.len(),
            elements: report.trainable_elements,
            frozen: report.frozen.len() + report.buffers.len(),
        }],
    };
    check(&out, Pass::State, opts)?;
    Ok((out, Training { state, report }, pass))
}

/// Training, stage 2b ([`crate::train::build_backward`]): the gradients of the
/// loss ([`crate::train::build_loss`], typed by the precision pass) and the update.
fn run_autodiff(
    graph: &Graph,
    train: &TrainOptions,
    training: &mut Training,
    opts: &CompileOptions,
) -> Result<(Graph, PassReport), CompileError> {
    let start = Instant::now();
    let out = crate::train::build_backward(graph, &mut training.state, train, &mut training.report)?;
    let pass = PassReport {
        pass: Pass::Autodiff,
        nodes_before: graph.len(),
        nodes_after: out.len(),
        time: start.elapsed(),
        details: vec![PassDetail::Autodiff {
            loss: train.loss.kind.name().to_string(),
            optimizer: train.optimizer.name().to_string(),
            saved: training.report.saved.len(),
            state_slots: training.state.slots.len(),
        }],
    };
    check(&out, Pass::Autodiff, opts)?;
    Ok((out, pass))
}

/// The optimizer's report over both runs (before and after the precision pass): the
/// first run's graph and weights before, the second's after, counts added up.
fn merge_optimize_reports(first: OptimizeReport, second: OptimizeReport) -> OptimizeReport {
    let mut rules_fired = first.rules_fired;
    for (rule, n) in second.rules_fired {
        *rules_fired.entry(rule).or_default() += n;
    }
    let mut weights_added: Vec<String> = first
        .weights_added
        .into_iter()
        .filter(|w| !second.weights_dropped.contains(w))
        .collect();
    weights_added.extend(second.weights_added);
    let mut weights_dropped = first.weights_dropped;
    weights_dropped.extend(
        second
            .weights_dropped
            .into_iter()
            .filter(|w| !weights_added.contains(w)),
    );
    OptimizeReport {
        nodes_before: first.nodes_before,
        nodes_after: second.nodes_after,
        constants_folded: first.constants_folded + second.constants_folded,
        weight_bytes_before: first.weight_bytes_before,
        weight_bytes_after: second.weight_bytes_after,
        weights_dropped,
        weights_added,
        rules_fired,
        iterations: first.iterations + second.iterations,
        egraph_nodes: first.egraph_nodes.max(second.egraph_nodes),
        egraph_classes: first.egraph_classes.max(second.egraph_classes),
        stop_reason: second.stop_reason,
        time: first.time + second.time,
    }
}

/// Dead-code elimination: nodes and weights no output depends on.
fn run_dce(graph: &Graph, opts: &CompileOptions) -> Result<(Graph, PassReport), CompileError> {
    let start = Instant::now();
    let (graph, dce) = eliminate_dead_code(graph);
    let mut details = Vec::new();
    if !dce.weights_removed.is_empty() {
        details.push(PassDetail::UnusedWeightsDropped(dce.weights_removed.clone()));
    }
    let report = PassReport {
        pass: Pass::Dce,
        nodes_before: graph.len() + dce.nodes_removed,
        nodes_after: graph.len(),
        time: start.elapsed(),
        details,
    };
    check(&graph, Pass::Dce, opts)?;
    Ok((graph, report))
}

/// The precision pass with `precision_opts`, and with a low type the optimizer again
/// (with `opts`) to fold the weight casts: the graph, the precision report, and that
/// optimizer run's report; the passes' reports pushed onto `passes`.
fn run_precision_then_optimize(
    graph: &Graph,
    precision_opts: &CompileOptions,
    opts: &CompileOptions,
    passes: &mut Vec<PassReport>,
) -> Result<(Graph, PrecisionReport, Option<OptimizeReport>), CompileError> {
    let (graph, precision, report) = run_precision(graph, precision_opts)?;
    let Some(report) = report else {
        return Ok((graph, precision, None));
    };
    passes.push(report);
    let (graph, again, report) = run_optimize(&graph, opts)?;
    passes.push(report);
    Ok((graph, precision, Some(again)))
}

/// The precision pass: f32 compute in the low type (bf16, fp16), casts at the edges.
/// Reported only when there is a low type.
fn run_precision(
    graph: &Graph,
    opts: &CompileOptions,
) -> Result<(Graph, PrecisionReport, Option<PassReport>), CompileError> {
    let start = Instant::now();
    let nodes_before = graph.len();
    let (graph, precision) =
        apply_precision_with(graph, opts.precision, opts.outputs).map_err(|error| CompileError::Pass {
            pass: Pass::Precision.name(),
            error,
        })?;
    if opts.precision.low_type().is_none() {
        return Ok((graph, precision, None));
    }
    let report = PassReport {
        pass: Pass::Precision,
        nodes_before,
        nodes_after: graph.len(),
        time: start.elapsed(),
        details: vec![PassDetail::Precision {
            precision: opts.precision,
            low_nodes: precision.low_nodes,
            f32_nodes: precision.f32_nodes,
            casts: precision.casts,
        }],
    };
    check(&graph, Pass::Precision, opts)?;
    Ok((graph, precision, Some(report)))
}

/// Weight-only quantization, after the optimizer (weights folded) and before fusion.
/// Reported only when asked for.
fn run_quantize(
    graph: &Graph,
    opts: &CompileOptions,
) -> Result<(Graph, QuantReport, Option<PassReport>), CompileError> {
    let start = Instant::now();
    let Some(bits) = opts.weights.bits() else {
        return Ok((graph.clone(), QuantReport::default(), None));
    };
    let (out, report) = quantize_weights(graph, opts.weights).map_err(|error| CompileError::Pass {
        pass: Pass::Quantize.name(),
        error,
    })?;
    let pass = PassReport {
        pass: Pass::Quantize,
        nodes_before: graph.len(),
        nodes_after: out.len(),
        time: start.elapsed(),
        details: vec![PassDetail::Quantized {
            weights: report.quantized.len(),
            bits,
            bytes_before: report.bytes_before(),
            bytes_after: report.bytes_after(),
        }],
    };
    check(&out, Pass::Quantize, opts)?;
    Ok((out, report, Some(pass)))
}

/// The e-graph optimizer.
fn run_optimize(graph: &Graph, opts: &CompileOptions) -> Result<(Graph, OptimizeReport, PassReport), CompileError> {
    let (graph, report) = optimize(graph, &opts.optimize)?;
    let mut details = vec![PassDetail::Optimize {
        constants_folded: report.constants_folded,
        rule_applications: report.rules_fired.values().sum::<usize>(),
        iterations: report.iterations,
        stop_reason: report.stop_reason.clone(),
    }];
    if !report.weights_added.is_empty() {
        details.push(PassDetail::WeightsFolded(report.weights_added.clone()));
    }
    if !report.weights_dropped.is_empty() {
        details.push(PassDetail::WeightsNoLongerUsed(report.weights_dropped.clone()));
    }
    let pass = PassReport {
        pass: Pass::Optimize,
        nodes_before: report.nodes_before,
        nodes_after: report.nodes_after,
        time: report.time,
        details,
    };
    check(&graph, Pass::Optimize, opts)?;
    Ok((graph, report, pass))
}

impl Compiled {
    /// The graph fusion started from, before token chunking.
    pub fn fusion_input(&self) -> &Graph {
        self.unchunked.as_ref().unwrap_or(&self.graph)
    }
}

/// Token chunking of an inference graph's MLPs, just before fusion (after the last
/// optimizer run, which would fold the parts back; shape families write their graph
/// out at a value and chunk it then).
fn run_chunk(graph: Graph, opts: &CompileOptions) -> Result<(Graph, crate::chunk::ChunkReport), CompileError> {
    if opts.token_chunks < 2 {
        return Ok((graph, Default::default()));
    }
    // A training step's parts are its loss's (`train::build_loss_in_parts`): its MLPs'
    // values are saved for the backward, which no region may keep.
    if opts.train.is_some() {
        return Ok((graph, Default::default()));
    }
    let (graph, report) = crate::chunk::chunk_mlps(&graph, opts.token_chunks)
        .map_err(|error| CompileError::Pass { pass: "chunk", error })?;
    if report.any() {
        graph
            .verify()
            .map_err(|error| CompileError::Pass { pass: "chunk", error })?;
    }
    Ok((graph, report))
}

/// Fusion of the graph into kernels.
fn run_fuse(
    graph: &Graph,
    in_place: &[String],
    opts: &CompileOptions,
) -> Result<(Program, FuseReport, PassReport), CompileError> {
    let start = Instant::now();
    let (program, fusion) = fuse_keeping(graph, in_place)?;
    if cfg!(debug_assertions) || opts.verify_each_pass {
        crate::kernel::verify(&program).map_err(Box::new)?;
    }
    let report = PassReport {
        pass: Pass::Fuse,
        nodes_before: graph.len(),
        nodes_after: program.kernels.len(),
        time: start.elapsed(),
        details: vec![PassDetail::Fusion {
            launches: fusion.launches,
            unfused_kernels: fusion.unfused_kernels,
            bytes: fusion.bytes,
            unfused_bytes: fusion.unfused_bytes,
        }],
    };
    Ok((program, fusion, report))
}

/// Scheduling (the kernel order, applied to the program) and memory planning.
fn run_plan(
    program: Program,
    opts: &CompileOptions,
) -> Result<(Program, Schedule, MemoryPlan, PassReport), CompileError> {
    let start = Instant::now();
    let order = schedule(&program);
    let program = order.apply(program);
    // Training: the parameters' update kernels merged into multi-tensor launches where
    // that keeps the schedule's peak (the schedule's order is of the program before).
    let (program, _) = crate::train::multi::merge_updates(program);
    // And the small copies made from the inputs and weights (mixed precision's bf16
    // biases) merged the same way, at the first one's position.
    let (program, _) = crate::train::multi::merge_small_casts(program);
    let mut plan = plan_memory(&program, &opts.memory)?;
    plan.schedule = order.name;
    if cfg!(debug_assertions) || opts.verify_each_pass {
        crate::kernel::verify(&program).map_err(Box::new)?;
        verify_plan(&program, &plan).map_err(CompileError::PlanInvalid)?;
    }
    let details = vec![
        PassDetail::Schedule {
            name: order.name,
            peak: order.peak,
            candidates: order.candidates.clone(),
        },
        PassDetail::Arena {
            arena_bytes: plan.arena_bytes,
            lower_bound_bytes: plan.lower_bound_bytes,
            ratio: plan.ratio(),
            strategy: plan.strategy,
            in_place: plan.in_place,
            peak_scratch_bytes: plan.peak_scratch_bytes,
            peak_step: plan.peak_step,
        },
    ];
    let report = PassReport {
        pass: Pass::Plan,
        nodes_before: program.kernels.len(),
        nodes_after: plan.buffers.len(),
        time: start.elapsed(),
        details,
    };
    Ok((program, order, plan, report))
}

/// What the precision saved: the weights' bytes before and after the optimizer folded
/// the weight casts, and the planned intermediates against their f32 size (counted
/// anew from `plan`, so a report accounted for another plan can be accounted again).
fn account_precision(mut precision: PrecisionReport, program: &Program, plan: &MemoryPlan) -> PrecisionReport {
    let Some(low) = precision.precision.low_type() else {
        return precision;
    };
    // Each tensor's bytes with the low type's in f32.
    let f32_bytes = |ty: &graphc_ir::TensorType| {
        if ty.dtype == low {
            (ty.numel() as u64).saturating_mul(4)
        } else {
            ty.size_bytes() as u64
        }
    };
    precision.weights_bytes = plan.weights_bytes;
    precision.weights_f32_bytes = program
        .buffers
        .iter()
        .filter(|b| matches!(b.kind, BufferKind::Weight { .. } | BufferKind::Constant { .. }))
        .map(|b| f32_bytes(&b.ty))
        .fold(0, u64::saturating_add);
    precision.peak_bytes = plan.lower_bound_bytes;
    // GEMM scratch holds a product of the low type: twice its bytes in f32.
    precision.peak_f32_bytes = plan.peak_with(
        |b| {
            program
                .buffers
                .get(b.buffer.index())
                .map_or(b.bytes, |pb| f32_bytes(&pb.ty))
        },
        |sc| sc.bytes.saturating_mul(2),
    );
    precision
}

fn check(graph: &Graph, pass: Pass, opts: &CompileOptions) -> Result<(), CompileError> {
    if opts.verify_each_pass || cfg!(debug_assertions) {
        graph.verify().map_err(|error| CompileError::Pass {
            pass: pass.name(),
            error,
        })?;
    }
    Ok(())
}

/// The generated CUDA C of a compiled model: one [`CudaKernel`] per kernel of its
/// program, in order (derefs to the slice the launch planner takes).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Kernels {
    pub kernels: Vec<CudaKernel>,
    /// How long generation took.
    #[serde(skip)]
    pub time: Duration,
}

impl Deref for Kernels {
    type Target = [CudaKernel];

    fn deref(&self) -> &[CudaKernel] {
        &self.kernels
    }
}

impl Kernels {
    /// The kernels [`build`] compiles, as the launch planner makes modules of them:
    /// those with source and work (a grid without blocks has none on any device), the
    /// first of each entry name.
    pub fn launched(&self) -> Vec<usize> {
        let mut entries = HashSet::new();
        let mut launched = Vec::new();
        for (i, k) in self.kernels.iter().enumerate() {
            if k.has_source() && k.launch.grid.blocks(1) > 0 && entries.insert(k.entry.as_str()) {
                launched.push(i);
            }
        }
        launched
    }

    /// The codegen stage's report (counts kernels with CUDA C source).
    pub fn report(&self) -> PassReport {
        PassReport {
            pass: Pass::Codegen,
            nodes_before: self.kernels.len(),
            nodes_after: self.kernels.iter().filter(|k| k.has_source()).count(),
            time: self.time,
            details: Vec::new(),
        }
    }
}

/// The codegen stage: the CUDA C of every kernel of `model.program`.
pub fn generate_kernels(model: &Compiled) -> Result<Kernels, CodegenError> {
    let start = Instant::now();
    let kernels = codegen::generate_all(&model.program)?;
    Ok(Kernels {
        kernels,
        time: start.elapsed(),
    })
}

/// NVRTC's output for a model's kernels on one architecture.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Binary {
    /// The architecture (`sm_XX`) and output kind built for.
    pub arch: String,
    pub output: OutputKind,
    /// One entry per kernel of the program, in order: the image of every kernel that
    /// is launched (it has CUDA C source and a grid with blocks; the first kernel of
    /// each entry name), `None` for the rest.
    pub images: Vec<Option<nvrtc::Compiled>>,
    /// How long NVRTC (or the cache) took.
    #[serde(skip)]
    pub time: Duration,
}

impl Binary {
    /// The build stage's report (kernels in, images out).
    pub fn report(&self) -> PassReport {
        PassReport {
            pass: Pass::Build,
            nodes_before: self.images.len(),
            nodes_after: self.images.iter().filter(|i| i.is_some()).count(),
            time: self.time,
            details: Vec::new(),
        }
    }
}

/// The build stage: compile the launched kernels of `kernels` with NVRTC for
/// `opts.arch` (identical sources once, in parallel, through the on-disk cache as
/// `opts` say).
pub fn build(kernels: &Kernels, opts: &NvrtcOptions) -> Result<Binary, NvrtcError> {
    let start = Instant::now();
    let launched = kernels.launched();
    let to_compile: Vec<CudaKernel> = launched.iter().filter_map(|&i| kernels.get(i).cloned()).collect();
    let mut images: Vec<Option<nvrtc::Compiled>> = vec![None; kernels.len()];
    for (i, image) in launched.into_iter().zip(nvrtc::compile(&to_compile, opts)?) {
        if let Some(slot) = images.get_mut(i) {
            *slot = Some(image);
        }
    }
    Ok(Binary {
        arch: opts.arch.clone(),
        output: opts.output,
        images,
        time: start.elapsed(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use graphc_ir::{DType, GraphBuilder};

    #[test]
    fn kernels_without_source_build_without_nvrtc() {
        let b = GraphBuilder::new();
        let x = b.input("x", DType::F32, [4, 8]);
        let w = b.input("w", DType::F32, [8, 2]);
        b.output("y", x.matmul(w));
        let c = compile(&b.finish().unwrap(), &CompileOptions::default()).unwrap();
        let mut kernels = generate_kernels(&c).unwrap();
        assert_eq!(kernels.len(), c.program.kernels.len());
        for k in &mut kernels.kernels {
            k.source.clear();
        }
        assert!(kernels.launched().is_empty());
        let binary = build(&kernels, &NvrtcOptions::default()).unwrap();
        assert_eq!(binary.images, vec![None; kernels.len()]);
        let report = binary.report();
        assert_eq!(
            (report.pass, report.nodes_before, report.nodes_after),
            (Pass::Build, kernels.len(), 0)
        );
    }
}
