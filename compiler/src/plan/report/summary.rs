//! The memory summary of a plan (a static `torch.cuda.memory_summary`): where the bytes
//! go, how good the placement is, the schedule, the peak step and the tensors live
//! there, total vs budget.

use std::fmt::Write;

use super::{display_name, human_bytes, live_at_peak, peak_bytes, percent, plural, size_row, table};
use crate::kernel::{BufferKind, Program};
use crate::plan::{Device, MemoryPlan};

/// What the program holds outside the arena, by kind.
struct Outside {
    weights: usize,
    inputs: usize,
    outputs: usize,
}

fn outside(program: &Program) -> Outside {
    let mut out = Outside {
        weights: 0,
        inputs: 0,
        outputs: 0,
    };
    for b in &program.buffers {
        match b.kind {
            BufferKind::Weight { .. } | BufferKind::Constant { .. } => out.weights += 1,
            BufferKind::Input { .. } => out.inputs += 1,
            BufferKind::Temp => {}
        }
    }
    let mut outs: Vec<u32> = program.outputs.iter().map(|(_, b)| b.0).collect();
    outs.sort_unstable();
    outs.dedup();
    out.outputs = outs.len();
    out
}

/// The memory summary of a GPU run: [`summary_for`] [`Device::Cuda`].
pub fn summary(program: &Program, plan: &MemoryPlan) -> String {
    summary_for(program, plan, Device::Cuda)
}

/// The memory summary of a run on `device`: on the CPU without the cuBLASLt workspace
/// (its total is [`MemoryPlan::total_bytes_for`] the CPU).
pub fn summary_for(program: &Program, plan: &MemoryPlan, device: Device) -> String {
    let mut out = sizes(program, plan, device);
    out.push('\n');
    out.push_str(&facts(program, plan));
    if !plan.peak_live.is_empty() {
        out.push('\n');
        out.push_str(&peak_tensors(plan));
    }
    out
}

/// The sizes table: weights, inputs, outputs, workspace, arena, lower bound, total,
/// budget.
fn sizes(program: &Program, plan: &MemoryPlan, device: Device) -> String {
    let counts = outside(program);
    let total = plan.total_bytes_for(device);
    let fits = if total <= plan.budget_bytes {
        let room = plan.budget_bytes - total;
        format!("fits, headroom {} ({room} B)", human_bytes(room))
    } else {
        let over = total - plan.budget_bytes;
        format!("OVER BUDGET by {} ({over} B)", human_bytes(over))
    };
    let gemms = gemm_counts(program);
    let workspace = match device {
        Device::Cpu => size_row("workspace", 0, "none on the CPU (cuBLASLt is GPU only)".into()),
        Device::Cuda => size_row("workspace", plan.workspace_bytes, workspace_note(plan, gemms)),
    };
    // Which run the total is for, and what the other device's run needs.
    let (this, other) = match device {
        Device::Cuda => ("a GPU run", Device::Cpu),
        Device::Cpu => ("a CPU run", Device::Cuda),
    };
    let total_note = if plan.total_bytes_for(other) == total {
        format!(
            "{} of the budget, for a GPU or a CPU run",
            percent(total, plan.budget_bytes)
        )
    } else {
        format!(
            "{} of the budget, for {this} ({} {}: {})",
            percent(total, plan.budget_bytes),
            match other {
                Device::Cpu => "a CPU run needs",
                Device::Cuda => "a GPU run needs",
            },
            human_bytes(plan.total_bytes_for(other)),
            match other {
                Device::Cpu => "no cuBLASLt workspace",
                Device::Cuda => "the cuBLASLt workspace too",
            }
        )
    };
    let scratch_areas = if plan.scratch.is_empty() {
        String::new()
    } else {
        format!(
            " + {}",
            plural(plan.scratch.len(), "GEMM scratch area", "GEMM scratch areas")
        )
    };
    let bound_note = if plan.peak_scratch_bytes > 0 {
        format!(
            "most arena bytes live at once, {} of it GEMM scratch",
            human_bytes(plan.peak_scratch_bytes)
        )
    } else {
        "most arena bytes live at once".into()
    };
    let rows = vec![
        size_row(
            "weights",
            plan.weights_bytes,
            plural(
                counts.weights,
                "tensor (weights, constants)",
                "tensors (weights, constants)",
            ),
        ),
        size_row("inputs", plan.inputs_bytes, plural(counts.inputs, "tensor", "tensors")),
        size_row(
            "outputs",
            plan.outputs_bytes,
            plural(counts.outputs, "tensor", "tensors"),
        ),
        workspace,
        size_row(
            "arena",
            plan.arena_bytes,
            format!(
                "{}{scratch_areas}, offsets by {}",
                plural(plan.buffers.len(), "intermediate", "intermediates"),
                plan.strategy
            ),
        ),
        size_row("lower bound", plan.lower_bound_bytes, bound_note),
        size_row("total", total, total_note),
        size_row("budget", plan.budget_bytes, fits),
    ];
    table("", &rows, &[false, true, true, false])
}

/// The program's GEMMs: (all, those reading int8/int4 weights, which are generated
/// kernels and need no cuBLASLt).
fn gemm_counts(program: &Program) -> (usize, usize) {
    program
        .kernels
        .iter()
        .filter_map(|k| match &k.kind {
            crate::kernel::KernelKind::MatMul(m) => Some(m.quant.is_some()),
            _ => None,
        })
        .fold((0, 0), |(all, q), quant| (all + 1, q + usize::from(quant)))
}

/// What the workspace row says on a GPU: who reserves it, or why there is none.
fn workspace_note(plan: &MemoryPlan, (gemms, quantized): (usize, usize)) -> String {
    if plan.workspace_bytes > 0 {
        let generated = if quantized > 0 {
            format!("; {quantized} more read int8/int4 weights in generated kernels")
        } else {
            String::new()
        };
        format!(
            "cuBLASLt, for {}{generated}",
            plural(gemms - quantized, "GEMM", "GEMMs")
        )
    } else if quantized > 0 {
        format!(
            "none: the {} read int8/int4 weights in generated kernels, not cuBLASLt",
            plural(quantized, "GEMM", "GEMMs")
        )
    } else {
        "none (no GEMMs)".into()
    }
}

/// The attention kernels of a program and the bytes of the score matrices they never
/// store (`[batch.., heads, sq, sk]` each, in the kernel's dtype: what the spelled-out
/// attention would have written, at least once, for its softmax).
pub fn attention_savings(program: &Program) -> (usize, u64) {
    let mut kernels = 0;
    let mut bytes = 0u64;
    for k in &program.kernels {
        let crate::kernel::KernelKind::Op(op) = &k.kind else {
            continue;
        };
        if !matches!(op.op, graphc_ir::Op::Attention { .. }) {
            continue;
        }
        let tys: Vec<&graphc_ir::TensorType> = op.inputs.iter().map(|(_, t)| t).collect();
        let Ok(dims) = graphc_ir::AttentionDims::of(&tys) else {
            continue;
        };
        let elems = dims.score_dims().iter().fold(1u64, |a, &d| a.saturating_mul(d as u64));
        kernels += 1;
        bytes = bytes.saturating_add(elems.saturating_mul(dims.dtype.size_bytes() as u64));
    }
    (kernels, bytes)
}

/// The facts table: kernels, schedule, placement quality, in place, views, alignment,
/// the peak, and the attention kernels with the score bytes they never store.
fn facts(program: &Program, plan: &MemoryPlan) -> String {
    let fragmentation = if plan.arena_bytes == 0 {
        0.0
    } else {
        1.0 - plan.lower_bound_bytes as f64 / plan.arena_bytes as f64
    };
    let greedy_ratio = if plan.lower_bound_bytes == 0 {
        1.0
    } else {
        plan.greedy_arena_bytes as f64 / plan.lower_bound_bytes as f64
    };
    let peak = match plan.steps.get(plan.peak_step as usize) {
        Some(step) if !plan.buffers.is_empty() => format!(
            "step {} of {}: {} ({}), {} live, {}",
            plan.peak_step,
            plan.kernels,
            step.kernel,
            step.kind,
            live_at_peak(plan),
            human_bytes(peak_bytes(plan))
        ),
        _ => "none (the arena is empty)".into(),
    };
    let rows = vec![
        vec!["kernels".into(), format!("{} (target {})", plan.kernels, plan.arch)],
        vec!["schedule".into(), plan.schedule.to_string()],
        vec!["arena / bound".into(), format!("{:.3}x", plan.ratio())],
        vec![
            "fragmentation".into(),
            format!(
                "{:.1}% (1 - lower bound / arena); best greedy arena {} ({:.3}x)",
                fragmentation * 100.0,
                human_bytes(plan.greedy_arena_bytes),
                greedy_ratio
            ),
        ],
        vec![
            "in place".into(),
            plural(
                plan.in_place,
                "buffer takes over an input's storage",
                "buffers take over an input's storage",
            ),
        ],
        vec![
            "views".into(),
            plural(
                plan.aliases,
                "read through a view (no buffer)",
                "reads through views (no buffer)",
            ),
        ],
        vec!["alignment".into(), format!("{} B", plan.align)],
        vec!["peak".into(), peak],
    ];
    let mut rows = rows;
    let (attention, scores) = attention_savings(program);
    if attention > 0 {
        rows.push(vec![
            "attention".into(),
            format!(
                "{}, fused: the score matrices are never stored (stored, they would take {}, summed over \
                 the kernels)",
                plural(attention, "kernel", "kernels"),
                human_bytes(scores)
            ),
        ]);
    }
    table("", &rows, &[false, false])
}

/// The tensors live at the peak, largest first (the top 10, then a count), and the GEMM
/// scratch there.
fn peak_tensors(plan: &MemoryPlan) -> String {
    const TOP: usize = 10;
    let mut out = String::from("tensors live at the peak, largest first:\n");
    let mut rows = vec![vec![
        "buffer".into(),
        "name".into(),
        "written by".into(),
        "op".into(),
        "size".into(),
        "bytes".into(),
        "of arena".into(),
    ]];
    for t in plan.peak_live.iter().take(TOP) {
        rows.push(vec![
            format!("b{}", t.buffer.0),
            display_name(&t.name).to_string(),
            t.kernel.clone(),
            t.op.to_string(),
            human_bytes(t.bytes),
            t.bytes.to_string(),
            percent(t.bytes, plan.arena_bytes),
        ]);
    }
    for sc in plan.scratch.iter().filter(|sc| sc.step == plan.peak_step) {
        let step = plan.steps.get(sc.step as usize);
        rows.push(vec![
            "-".into(),
            "(GEMM scratch)".into(),
            step.map_or(String::new(), |st| st.kernel.clone()),
            step.map_or(String::new(), |st| st.kind.to_string()),
            human_bytes(sc.bytes),
            sc.bytes.to_string(),
            percent(sc.bytes, plan.arena_bytes),
        ]);
    }
    out.push_str(&table("  ", &rows, &[false, false, false, false, true, true, true]));
    if let Some(rest) = plan.peak_live.get(TOP..).filter(|r| !r.is_empty()) {
        let _ = writeln!(
            out,
            "  and {} more totalling {}",
            rest.len(),
            human_bytes(rest.iter().map(|t| t.bytes).fold(0, u64::saturating_add))
        );
    }
    out
}
