//! Why a plan does not fit its budget and what would help: [`diagnose`] computes a
//! serializable [`Diagnosis`] (by how much, the breakdown, the peak step and its
//! tensors, the [`Remedy`]s with their estimates); `diagnosis_text.rs` renders the
//! text that [`over_budget_diagnosis`] and [`check_budget`] / [`OverBudget`] give, each
//! remedy with the command that applies it ([`Rerun`]).
//!
//! The remedies, each offered only where it applies:
//! - a smaller symbolic dimension (or, for static shapes, a smaller batch or sequence),
//!   with the share of the activations that fits if they scale linearly;
//! - bf16/fp16 instead of f32, unless the program already stores tensors in bf16 or
//!   fp16 (a low-precision compile keeps some tensors in f32 on purpose);
//! - int8 and int4 weights for the weight matrices the GEMMs read, with the cuBLASLt
//!   workspace they make unneeded when every GEMM would read one;
//! - recomputation of tensors that cheap kernels produced and that are idle across the
//!   peak, with the same bytes as the peak table, less the operands that would have to
//!   stay live instead;
//! - and, when the weights (or the weights and the cuBLASLt workspace) alone exceed the
//!   budget, that no activation remedy on its own can help; when the workspace alone
//!   does and int4 weights would need none, a smaller dimension together with them.
//!
//! A training step's state (its donated inputs: parameters, optimizer state, the loss
//! scale) is fixed like the weights: a smaller dimension shrinks the activations beside
//! it, and quantized weights are no remedy (what is trained stays f32).
//! [`check_training_budget_for`] adds recomputing the layers not recomputed yet,
//! gradient accumulation over a microbatch that fits and the GPUs ZeRO sharding would
//! need (`train_remedies.rs`), and freezing ([`Remedy::Freeze`]): the embedding
//! tables (or the largest parameter) left untrained, without gradients and optimizer
//! state, stored in the low type under mixed precision.

use std::collections::HashMap;
use std::fmt;

use graphc_ir::DType;
use serde::Serialize;

use super::{peak_bytes, Rerun};
use crate::kernel::{BufferId, BufferKind, Program};
use crate::plan::{ArgAccess, Device, LiveTensor, MemoryPlan, PlannedBuffer, StepKind};

/// Bytes of one element type.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct DTypeBytes {
    pub dtype: DType,
    pub bytes: u64,
}

/// Where the plan's total goes.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Breakdown {
    pub weights_bytes: u64,
    /// The weights (and constants) by element type, largest first.
    pub weights_by_dtype: Vec<DTypeBytes>,
    pub arena_bytes: u64,
    /// Arena buffers.
    pub intermediates: usize,
    pub lower_bound_bytes: u64,
    pub inputs_bytes: u64,
    /// Of the inputs, a training step's state (the donated inputs: parameters,
    /// optimizer state), which the batch does not change.
    #[serde(default)]
    pub state_bytes: u64,
    pub outputs_bytes: u64,
    /// The cuBLASLt workspace (0 without GEMMs).
    pub workspace_bytes: u64,
    pub total_bytes: u64,
}

/// The step where the most arena bytes are live, and what is live there.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct PeakReport {
    pub step: u32,
    /// Steps in all.
    pub kernels: usize,
    pub kernel: String,
    pub kind: StepKind,
    /// The tensors live there, largest first (the plan's `peak_live`).
    pub tensors: Vec<LiveTensor>,
    /// GEMM scratch live there.
    pub scratch_bytes: u64,
    /// Tensors and scratch together.
    pub bytes: u64,
}

/// A tensor that could be recomputed instead of kept across the peak.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Remat {
    pub buffer: BufferId,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// The kernel that produces it, and its kind.
    pub kernel: String,
    pub kind: StepKind,
    /// Its bytes (as in the peak table).
    pub bytes: u64,
    /// Bytes of its producer's arena operands that would have to stay live across the
    /// peak to recompute it.
    pub kept_bytes: u64,
    /// `bytes - kept_bytes`.
    pub frees_bytes: u64,
    /// The step that produces it and the first step after the peak that reads it.
    pub produced: u32,
    pub next_read: u32,
}

/// A smaller dimension: the activations scale with it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct DimEstimate {
    /// The symbolic dimension; absent for a model with static shapes (a smaller batch or
    /// sequence then means re-exporting it).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dim: Option<String>,
    /// Arena, inputs and outputs.
    pub activations_bytes: u64,
    /// The percentage of the current size that fits if they scale linearly (at most 99;
    /// 0: less than 1%).
    pub fits_percent: u32,
    /// Only together with int`N` weights (`--weights intN`): the cuBLASLt workspace
    /// alone is over the budget, and quantized GEMMs need none.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub with_weights: Option<u32>,
}

/// bf16/fp16 instead of f32: what is in f32 and what halving it saves.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct PrecisionEstimate {
    pub f32_weights_bytes: u64,
    pub weights_bytes: u64,
    /// The f32 tensors live at the peak, of all bytes live there.
    pub peak_f32_bytes: u64,
    pub peak_bytes: u64,
    pub f32_io_bytes: u64,
    /// Halving the f32 weights, inputs, outputs and the f32 share of the arena.
    pub saves_bytes: u64,
    pub total_after_bytes: u64,
}

/// Weight-only quantization (`--weights int8|int4`) of the weight matrices the GEMMs
/// read: their bytes and what the packed integers and scales would take.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct QuantEstimate {
    pub bits: u32,
    /// Weight matrices read as a GEMM's right operand, and their bytes.
    pub matrices: usize,
    pub matrix_bytes: u64,
    /// The packed integers and scales.
    pub matrix_after_bytes: u64,
    /// The cuBLASLt workspace no longer needed when every GEMM reads a quantized weight
    /// (they are generated kernels), else 0.
    pub workspace_bytes: u64,
    pub saves_bytes: u64,
    pub total_after_bytes: u64,
}

/// Recomputing tensors idle across the peak just before their next read.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct RecomputeEstimate {
    /// Every candidate, in peak-table order.
    pub tensors: Vec<Remat>,
    pub frees_bytes: u64,
    pub total_after_bytes: u64,
}

/// What would help a plan over its budget, with its estimate (or why nothing in the
/// model can help). Serialized with a `remedy` tag beside the fields.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "remedy", rename_all = "snake_case")]
pub enum Remedy {
    /// The weights alone exceed the budget: no activation remedy can help.
    WeightsExceedBudget { weights_bytes: u64 },
    /// The cuBLASLt workspace alone exceeds the budget: no activation remedy can help;
    /// `quantized_gemms_need_none`: int8/int4 weights would make every GEMM a generated
    /// kernel, which needs no workspace (the [`Remedy::QuantizeWeights`] that follow).
    WorkspaceExceedsBudget {
        workspace_bytes: u64,
        weights_bytes: u64,
        quantized_gemms_need_none: bool,
    },
    /// The weights and the workspace together exceed the budget.
    FixedExceedBudget { weights_bytes: u64, workspace_bytes: u64 },
    /// A smaller symbolic dimension, or batch or sequence.
    SmallerDim(DimEstimate),
    /// bf16/fp16 instead of f32 (offered only when no tensor is in bf16 or fp16 yet).
    LowerPrecision(PrecisionEstimate),
    /// Recomputation of tensors idle across the peak.
    Recompute(RecomputeEstimate),
    /// int8 or int4 weights for the GEMMs (offered when none is quantized yet).
    QuantizeWeights(QuantEstimate),
    /// A training step: parameters left frozen.
    Freeze(FreezeEstimate),
    /// A training step: its layers recomputed in the backward (`--remat`).
    RecomputeLayers(super::train_remedies::LayersEstimate),
    /// A training step: a smaller microbatch with gradient accumulation.
    Accumulate(super::train_remedies::AccumulateEstimate),
    /// A training step: its state sharded across GPUs (ZeRO; a statement).
    Shard(super::train_remedies::ShardEstimate),
}

/// Freezing parameters of a training step: they keep no gradient and no optimizer
/// state, and under mixed precision are stored in the low type.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct FreezeEstimate {
    /// What is frozen (`the embeddings`, or the parameter's name).
    pub what: String,
    /// The parameters, and the `--freeze` regular expression matching exactly them.
    pub parameters: Vec<String>,
    pub regex: String,
    pub elements: u64,
    /// Their optimizer state, and what storing them as frozen weights saves.
    pub optimizer_state_bytes: u64,
    pub parameter_bytes_saved: u64,
    pub saves_bytes: u64,
    pub total_after_bytes: u64,
}

/// A plan over its budget: by how much, where the bytes go, the peak, what would help.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Diagnosis {
    pub total_bytes: u64,
    pub budget_bytes: u64,
    pub over_by: u64,
    /// Some tensors are stored in bf16 or fp16 already (a low-precision compile, or a
    /// model that came so): then no remedy proposes bf16/fp16.
    pub low_precision: bool,
    pub breakdown: Breakdown,
    /// `None` when the arena is empty (nothing to shrink there).
    pub peak: Option<PeakReport>,
    pub remedies: Vec<Remedy>,
}

/// A plan over its budget, with what [`over_budget_diagnosis`] says about it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OverBudget {
    /// Bytes over the budget.
    pub over_by: u64,
    pub total_bytes: u64,
    pub budget_bytes: u64,
    /// The full diagnosis (what `Display` prints).
    pub diagnosis: String,
    /// The same, as data.
    pub details: Box<Diagnosis>,
}

impl fmt::Display for OverBudget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.diagnosis.trim_end())
    }
}

impl std::error::Error for OverBudget {}

/// `Ok` when the plan fits its budget, else [`OverBudget`] with the diagnosis (of a GPU
/// run: [`check_budget_for`] [`Device::Cuda`]).
pub fn check_budget(program: &Program, plan: &MemoryPlan, rerun: &Rerun) -> Result<(), OverBudget> {
    check_budget_for(program, plan, rerun, Device::Cuda)
}

/// `Ok` when a run of the plan on `device` fits its budget, else [`OverBudget`] with
/// [`diagnose_for`] that device.
pub fn check_budget_for(program: &Program, plan: &MemoryPlan, rerun: &Rerun, device: Device) -> Result<(), OverBudget> {
    match diagnose_for(program, plan, rerun, device) {
        None => Ok(()),
        Some(d) => Err(OverBudget {
            over_by: d.over_by,
            total_bytes: d.total_bytes,
            budget_bytes: d.budget_bytes,
            diagnosis: d.text(rerun),
            details: Box::new(d),
        }),
    }
}

/// [`check_budget_for`] for a training step with `state`, whose layers (`layers`
/// found, `recomputed` of them) the step recomputes: the diagnosis adds recomputing
/// the rest ([`Remedy::RecomputeLayers`]), gradient accumulation over a microbatch that
/// fits ([`Remedy::Accumulate`]), [`Remedy::Freeze`] when freezing the embeddings (or
/// the largest parameter) applies, and the GPUs ZeRO sharding would need
/// ([`Remedy::Shard`]).
pub fn check_training_budget_for(
    program: &Program,
    plan: &MemoryPlan,
    state: &crate::train::State,
    (layers, recomputed): (usize, usize),
    rerun: &Rerun,
    device: Device,
) -> Result<(), OverBudget> {
    use super::train_remedies;
    match diagnose_for(program, plan, rerun, device) {
        None => Ok(()),
        Some(mut d) => {
            let t = super::TrainBytes::of(program, plan, state, device);
            let budget = d.budget_bytes;
            if let Some(l) = train_remedies::layers(&t, layers, recomputed) {
                d.remedies.push(Remedy::RecomputeLayers(l));
            }
            let sums: u64 = state
                .parameters()
                .map(|s| s.init.ty().size_bytes() as u64)
                .fold(8, u64::saturating_add);
            if let Some(a) = train_remedies::accumulate(&t, budget, rerun, sums) {
                d.remedies.push(Remedy::Accumulate(a));
            }
            if let Some(f) = freeze_estimate(program, state, d.total_bytes) {
                d.remedies.push(Remedy::Freeze(f));
            }
            d.remedies.push(Remedy::Shard(train_remedies::shard(&t, budget, rerun)));
            Err(OverBudget {
                over_by: d.over_by,
                total_bytes: d.total_bytes,
                budget_bytes: d.budget_bytes,
                diagnosis: d.text(rerun),
                details: Box::new(d),
            })
        }
    }
}

/// Freezing the embedding tables (parameters named as one: `wte`, `wpe`,
/// `embed_tokens`, `word_embeddings`, ... and a tied or separate `lm_head`), or else
/// the largest parameter: the state they would no longer need. `None` when nothing
/// would be left to train or nothing is saved.
fn freeze_estimate(program: &Program, state: &crate::train::State, total: u64) -> Option<FreezeEstimate> {
    use crate::train::StateClass;
    let params: Vec<&crate::train::StateSlot> = state.parameters().collect();
    let is_embedding = |n: &str| {
        let last = n.rsplit('.').nth(1).unwrap_or(n);
        matches!(last, "wte" | "wpe" | "embed_tokens" | "lm_head")
            || last.ends_with("_embeddings")
            || last == "embeddings"
    };
    let mut chosen: Vec<&crate::train::StateSlot> = params.iter().copied().filter(|s| is_embedding(&s.name)).collect();
    let what = if chosen.is_empty() {
        let largest = params.iter().copied().max_by_key(|s| s.init.ty().numel())?;
        chosen.push(largest);
        format!("`{}`", largest.name)
    } else {
        "the embeddings".to_string()
    };
    if chosen.len() == params.len() {
        return None;
    }
    let names: Vec<String> = chosen.iter().map(|s| s.name.clone()).collect();
    // A parameter's optimizer state: the slots named after it (`NAME.exp_avg`).
    let optimizer_state_bytes: u64 = state
        .slots
        .iter()
        .filter(|s| s.class == StateClass::OptimizerState)
        .filter(|s| {
            names
                .iter()
                .any(|n| s.name.strip_prefix(n.as_str()).is_some_and(|r| r.starts_with('.')))
        })
        .map(|s| s.init.ty().size_bytes() as u64)
        .sum();
    // Under mixed precision a frozen weight is stored in the low type.
    let low = program
        .buffers
        .iter()
        .any(|b| matches!(b.ty.dtype, DType::BF16 | DType::F16));
    let parameter_bytes_saved: u64 = if low {
        chosen.iter().map(|s| (s.init.ty().size_bytes() / 2) as u64).sum()
    } else {
        0
    };
    let saves_bytes = optimizer_state_bytes + parameter_bytes_saved;
    if saves_bytes == 0 {
        return None;
    }
    let regex = format!(
        "^({})$",
        names.iter().map(|n| regex_escape(n)).collect::<Vec<_>>().join("|")
    );
    Some(FreezeEstimate {
        what,
        elements: chosen.iter().map(|s| s.init.ty().numel() as u64).sum(),
        parameters: names,
        regex,
        optimizer_state_bytes,
        parameter_bytes_saved,
        saves_bytes,
        total_after_bytes: total.saturating_sub(saves_bytes),
    })
}

/// `s` with the regular-expression metacharacters escaped.
fn regex_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if "\\.+*?()|[]{}^$".contains(c) {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

/// Why a plan does not fit and what would help, as text ([`Diagnosis::text`], its
/// commands written from `rerun`); `None` when it fits.
pub fn over_budget_diagnosis(program: &Program, plan: &MemoryPlan, rerun: &Rerun) -> Option<String> {
    diagnose(program, plan, rerun).map(|d| d.text(rerun))
}

/// Why a plan does not fit and what would help; `None` when it fits.
///
/// `rerun.dims` names the model's symbolic dimensions (e.g. ONNX `--dim` names), each
/// offered as a remedy. The totals are the plan's own (a GPU run's, with the cuBLASLt
/// workspace): [`diagnose_for`] [`Device::Cuda`].
pub fn diagnose(program: &Program, plan: &MemoryPlan, rerun: &Rerun) -> Option<Diagnosis> {
    diagnose_for(program, plan, rerun, Device::Cuda)
}

/// [`diagnose`] for a run on `device`: on the CPU the total has no cuBLASLt workspace
/// ([`MemoryPlan::total_bytes_for`]), and neither do the breakdown and the remedies.
pub fn diagnose_for(program: &Program, plan: &MemoryPlan, rerun: &Rerun, device: Device) -> Option<Diagnosis> {
    if plan.fits_on(device) {
        return None;
    }
    match device {
        Device::Cuda => over_budget(program, plan, rerun),
        Device::Cpu => {
            // The plan as the CPU executor sees it (cloned only when it is over).
            let mut cpu = plan.clone();
            cpu.total_bytes = plan.total_bytes_for(Device::Cpu);
            cpu.workspace_bytes = 0;
            over_budget(program, &cpu, rerun)
        }
    }
}

/// The diagnosis of a plan whose own total is over its budget.
fn over_budget(program: &Program, plan: &MemoryPlan, rerun: &Rerun) -> Option<Diagnosis> {
    let over_by = plan.over_budget()?;
    let peak = plan
        .steps
        .get(plan.peak_step as usize)
        .filter(|_| !plan.peak_live.is_empty())
        .map(|step| PeakReport {
            step: plan.peak_step,
            kernels: plan.kernels,
            kernel: step.kernel.clone(),
            kind: step.kind.clone(),
            tensors: plan.peak_live.clone(),
            scratch_bytes: plan.peak_scratch_bytes,
            bytes: peak_bytes(plan),
        });
    Some(Diagnosis {
        total_bytes: plan.total_bytes,
        budget_bytes: plan.budget_bytes,
        over_by,
        low_precision: low_precision(program),
        breakdown: breakdown(program, plan),
        peak,
        remedies: remedies(program, plan, rerun),
    })
}

fn breakdown(program: &Program, plan: &MemoryPlan) -> Breakdown {
    let mut by_dtype: HashMap<DType, u64> = HashMap::new();
    for b in &program.buffers {
        if matches!(b.kind, BufferKind::Weight { .. } | BufferKind::Constant { .. }) {
            let e = by_dtype.entry(b.ty.dtype).or_default();
            *e = e.saturating_add(b.ty.size_bytes() as u64);
        }
    }
    let mut weights_by_dtype: Vec<DTypeBytes> = by_dtype
        .into_iter()
        .map(|(dtype, bytes)| DTypeBytes { dtype, bytes })
        .collect();
    weights_by_dtype.sort_by_key(|d| (std::cmp::Reverse(d.bytes), d.dtype));
    Breakdown {
        weights_bytes: plan.weights_bytes,
        weights_by_dtype,
        arena_bytes: plan.arena_bytes,
        intermediates: plan.buffers.len(),
        lower_bound_bytes: plan.lower_bound_bytes,
        inputs_bytes: plan.inputs_bytes,
        state_bytes: state_bytes(program),
        outputs_bytes: plan.outputs_bytes,
        workspace_bytes: plan.workspace_bytes,
        total_bytes: plan.total_bytes,
    }
}

/// A training step's state: the inputs its outputs are written over (donated).
fn state_bytes(program: &Program) -> u64 {
    let mut seen = std::collections::HashSet::new();
    program
        .donated
        .iter()
        .filter(|d| seen.insert(d.input))
        .filter_map(|d| program.buffers.get(d.input.index()))
        .filter(|b| matches!(b.kind, BufferKind::Input { .. }))
        .map(|b| b.ty.size_bytes() as u64)
        .fold(0, u64::saturating_add)
}

/// The remedies that apply, in the order the text lists them.
fn remedies(program: &Program, plan: &MemoryPlan, rerun: &Rerun) -> Vec<Remedy> {
    let budget = plan.budget_bytes;
    // What a training step trains stays f32: quantizing is no remedy there.
    let training = !program.donated.is_empty();
    let state = state_bytes(program);
    let quantized = if training {
        Vec::new()
    } else {
        quantized_weights(program, plan)
    };
    let mut out = Vec::new();
    let weights_over = plan.weights_bytes > budget;
    if weights_over {
        out.push(Remedy::WeightsExceedBudget {
            weights_bytes: plan.weights_bytes,
        });
    }
    let fixed = plan
        .weights_bytes
        .saturating_add(plan.workspace_bytes)
        .saturating_add(state);
    let fixed_over = !weights_over && fixed > budget;
    if fixed_over && plan.workspace_bytes > budget {
        out.push(Remedy::WorkspaceExceedsBudget {
            workspace_bytes: plan.workspace_bytes,
            weights_bytes: plan.weights_bytes,
            quantized_gemms_need_none: quantized
                .iter()
                .any(|r| matches!(r, Remedy::QuantizeWeights(q) if q.workspace_bytes > 0)),
        });
    } else if fixed_over {
        out.push(Remedy::FixedExceedBudget {
            weights_bytes: plan.weights_bytes,
            workspace_bytes: plan.workspace_bytes,
        });
    }
    let activations = plan
        .arena_bytes
        .saturating_add(plan.inputs_bytes.saturating_sub(state))
        .saturating_add(plan.outputs_bytes);
    // The bytes the activations must fit beside: the weights and the workspace; or,
    // when the workspace alone is over the budget and int4 weights would make every
    // GEMM a generated kernel without one, the int4 weights (the dims then come after
    // the quantization remedies, as a combination with it).
    let int4_fixed = quantized.iter().find_map(|r| match r {
        Remedy::QuantizeWeights(q) if q.bits == 4 && q.workspace_bytes > 0 => Some(
            plan.weights_bytes
                .saturating_sub(q.matrix_bytes)
                .saturating_add(q.matrix_after_bytes),
        ),
        _ => None,
    });
    let beside = if !weights_over && !fixed_over {
        Some((fixed, None))
    } else if fixed_over && plan.workspace_bytes > budget {
        int4_fixed.filter(|&f| f < budget).map(|f| (f, Some(4)))
    } else {
        None
    };
    let mut dims_remedies = Vec::new();
    if let (Some((fixed, with_weights)), true) = (beside, activations > 0) {
        let share = (budget - fixed) as f64 / activations as f64;
        let fits_percent = if share < 0.01 {
            0
        } else {
            (share * 100.0).floor().min(99.0) as u32
        };
        let dims: Vec<Option<String>> = if rerun.dims.is_empty() {
            vec![None]
        } else {
            rerun.dim_names().map(|d| Some(d.to_string())).collect()
        };
        dims_remedies.extend(dims.into_iter().map(|dim| {
            Remedy::SmallerDim(DimEstimate {
                dim,
                activations_bytes: activations,
                fits_percent,
                with_weights,
            })
        }));
    }
    let dims_after_quantization = beside.is_some_and(|(_, w)| w.is_some());
    if !dims_after_quantization {
        out.append(&mut dims_remedies);
    }
    if plan.workspace_bytes <= budget {
        out.extend(lower_precision(program, plan));
    }
    out.extend(quantized);
    out.append(&mut dims_remedies);
    if !weights_over && !fixed_over {
        let tensors = remat_candidates(plan);
        if !tensors.is_empty() {
            let frees = tensors.iter().map(|r| r.frees_bytes).fold(0, u64::saturating_add);
            out.push(Remedy::Recompute(RecomputeEstimate {
                tensors,
                frees_bytes: frees,
                total_after_bytes: plan.total_bytes.saturating_sub(frees),
            }));
        }
    }
    out
}

/// Whether some buffer of the program is stored in bf16 or fp16.
fn low_precision(program: &Program) -> bool {
    program
        .buffers
        .iter()
        .any(|b| matches!(b.ty.dtype, DType::BF16 | DType::F16))
}

/// bf16/fp16 instead of f32, when there is f32 to halve and no tensor is in bf16 or
/// fp16 already (then the precision was chosen; what stays f32 stays on purpose).
fn lower_precision(program: &Program, plan: &MemoryPlan) -> Option<Remedy> {
    if low_precision(program) {
        return None;
    }
    let mut is_output = vec![false; program.buffers.len()];
    for (_, b) in &program.outputs {
        if let Some(o) = is_output.get_mut(b.index()) {
            *o = true;
        }
    }
    // A training step's state stays f32 (master parameters, optimizer state).
    let mut state = vec![false; program.buffers.len()];
    for d in &program.donated {
        for id in [d.input, d.output] {
            if let Some(x) = state.get_mut(id.index()) {
                *x = true;
            }
        }
    }
    let (mut f32_weights, mut f32_io) = (0u64, 0u64);
    for (i, b) in program.buffers.iter().enumerate() {
        if b.ty.dtype != DType::F32 || state[i] {
            continue;
        }
        let bytes = b.ty.size_bytes() as u64;
        match b.kind {
            BufferKind::Weight { .. } | BufferKind::Constant { .. } => f32_weights = f32_weights.saturating_add(bytes),
            BufferKind::Input { .. } => f32_io = f32_io.saturating_add(bytes),
            BufferKind::Temp if is_output[i] => f32_io = f32_io.saturating_add(bytes),
            BufferKind::Temp => {}
        }
    }
    let peak_total = peak_bytes(plan);
    let peak_f32: u64 = plan
        .peak_live
        .iter()
        .filter(|t| {
            program
                .buffers
                .get(t.buffer.index())
                .is_some_and(|b| b.ty.dtype == DType::F32)
        })
        .map(|t| t.bytes)
        .fold(0, u64::saturating_add);
    let arena_f32 = if peak_total == 0 {
        0
    } else {
        (u128::from(plan.arena_bytes) * u128::from(peak_f32) / u128::from(peak_total)) as u64
    };
    if f32_weights == 0 && arena_f32 == 0 {
        return None;
    }
    let saves = f32_weights / 2 + f32_io / 2 + arena_f32 / 2;
    Some(Remedy::LowerPrecision(PrecisionEstimate {
        f32_weights_bytes: f32_weights,
        weights_bytes: plan.weights_bytes,
        peak_f32_bytes: peak_f32,
        peak_bytes: peak_total,
        f32_io_bytes: f32_io,
        saves_bytes: saves,
        total_after_bytes: plan.total_bytes.saturating_sub(saves),
    }))
}

/// int8 and int4 weights for the float weight matrices GEMMs read (each distinct
/// weight once), when no GEMM reads a quantized weight yet: a byte per element plus a
/// scale per row (int8), half a byte plus a scale per 128 (int4), scales in the
/// weight's type.
fn quantized_weights(program: &Program, plan: &MemoryPlan) -> Vec<Remedy> {
    let mut seen = std::collections::BTreeSet::new();
    let mut shapes: Vec<(u64, u64, u64)> = Vec::new(); // (n, k, element bytes)
                                                       // Whether every GEMM would be a quantized one (then no cuBLASLt workspace).
    let mut all = true;
    for k in &program.kernels {
        let crate::kernel::KernelKind::MatMul(mm) = &k.kind else {
            continue;
        };
        if mm.quant.is_some() {
            return Vec::new();
        }
        let Some(b) = program.buffers.get(mm.b.buffer.index()) else {
            continue;
        };
        let is_weight = matches!(b.kind, BufferKind::Weight { .. } | BufferKind::Constant { .. });
        let takes = is_weight && b.ty.dtype.is_float() && b.ty.shape.rank() == 2 && mm.k >= 16;
        all &= takes;
        if takes && seen.insert(mm.b.buffer) {
            shapes.push((mm.n as u64, mm.k as u64, b.ty.dtype.size_bytes() as u64));
        }
    }
    if shapes.is_empty() {
        return Vec::new();
    }
    let matrix_bytes = shapes.iter().map(|&(n, k, e)| n * k * e).fold(0, u64::saturating_add);
    [8u32, 4]
        .into_iter()
        .map(|bits| {
            let after = shapes
                .iter()
                .map(|&(n, k, e)| {
                    let group = if bits == 8 { k } else { 128.min(k) };
                    n * k * u64::from(bits) / 8 + n * k.div_ceil(group) * e
                })
                .fold(0, u64::saturating_add);
            let workspace = if all { plan.workspace_bytes } else { 0 };
            let saves = matrix_bytes.saturating_sub(after).saturating_add(workspace);
            Remedy::QuantizeWeights(QuantEstimate {
                bits,
                matrices: shapes.len(),
                matrix_bytes,
                matrix_after_bytes: after,
                workspace_bytes: workspace,
                saves_bytes: saves,
                total_after_bytes: plan.total_bytes.saturating_sub(saves),
            })
        })
        .collect()
}

/// Tensors live at the peak that a cheap kernel (elementwise, row) produced at least two
/// steps earlier and that nothing touches at the peak step (read again only later).
fn remat_candidates(plan: &MemoryPlan) -> Vec<Remat> {
    let peak = plan.peak_step;
    let mut accesses: HashMap<BufferId, Vec<u32>> = HashMap::new();
    for (k, step) in plan.steps.iter().enumerate() {
        for a in &step.args {
            accesses.entry(a.buffer).or_default().push(k as u32);
        }
    }
    // By id, once: a lookup per argument of a scan of all buffers would be quadratic.
    let by_id: HashMap<BufferId, &PlannedBuffer> = plan.buffers.iter().map(|b| (b.buffer, b)).collect();
    let buffer = |id: BufferId| by_id.get(&id).copied();
    let live_at_peak = |id: BufferId| buffer(id).is_some_and(|b| b.start <= peak && peak < b.end);
    let mut out = Vec::new();
    for t in &plan.peak_live {
        let Some(b) = buffer(t.buffer) else { continue };
        if !t.op.is_cheap() || b.start + 2 > peak {
            continue;
        }
        let steps = accesses.get(&t.buffer).map(Vec::as_slice).unwrap_or_default();
        if steps.contains(&peak) {
            continue;
        }
        let Some(&next_read) = steps.iter().filter(|&&k| k > peak).min() else {
            continue;
        };
        // The producer's operands that live in the arena and would have to outlive the
        // peak (weights and inputs are always there).
        let kept: u64 = plan
            .steps
            .get(b.start as usize)
            .map_or(&[][..], |s| s.args.as_slice())
            .iter()
            .filter(|a| a.access == ArgAccess::Read && a.buffer != t.buffer)
            .filter_map(|a| buffer(a.buffer))
            .filter(|ob| !live_at_peak(ob.buffer))
            .map(|ob| ob.bytes)
            .fold(0, u64::saturating_add);
        let frees = t.bytes.saturating_sub(kept);
        if frees == 0 {
            continue;
        }
        out.push(Remat {
            buffer: t.buffer,
            name: t.name.clone(),
            kernel: t.kernel.clone(),
            kind: t.op.clone(),
            bytes: t.bytes,
            kept_bytes: kept,
            frees_bytes: frees,
            produced: b.start,
            next_read,
        });
    }
    out
}
