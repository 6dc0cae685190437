//! Reports of a [`MemoryPlan`], for people and for tools:
//!
//! - `summary.rs` — [`summary`] / [`summary_for`]: a static `torch.cuda.memory_summary`;
//! - `picture.rs` — [`picture`]: the arena over time as a terminal picture;
//! - `svg.rs` — [`svg`]: the same as a standalone SVG;
//! - `diagnosis.rs` — [`diagnose`]: a plan over its budget as a serializable
//!   [`Diagnosis`] (by how much, the breakdown, the peak, the [`Remedy`]s with their
//!   estimates), rendered as text by its `Display`; [`over_budget_diagnosis`],
//!   [`check_budget`] / [`OverBudget`] for callers that want the text or an error.
//!
//! This file holds what they share (sizes in words, tables) and [`PlanJson`] (what
//! `graphc plan --json` prints). Everything is computed from the plan and its program, deterministically (no
//! times), so the text can be snapshot-tested.

mod diagnosis;
mod diagnosis_text;
mod picture;
mod rerun;
mod summary;
mod svg;
mod train;
pub mod train_remedies;

use serde::Serialize;

pub use diagnosis::{
    check_budget, check_budget_for, check_training_budget_for, diagnose, diagnose_for, over_budget_diagnosis,
    Breakdown, DTypeBytes, Diagnosis, DimEstimate, FreezeEstimate, OverBudget, PeakReport, PrecisionEstimate,
    QuantEstimate, RecomputeEstimate, Remat, Remedy,
};
pub use picture::picture;
pub use rerun::{shell_word, CommandLine, Rerun};
pub use summary::{attention_savings, summary, summary_for};
pub use svg::{svg, xml_escape};
pub use train::TrainBytes;
pub(crate) use train::{layer_index, layer_of};

use super::{Device, MemoryPlan, PlanStep, PlannedBuffer};
use crate::kernel::Program;

/// `1536` -> `1.50 KiB`; below 1 KiB, exact bytes (`512 B`). Two decimals below 10 of
/// a unit, one above.
pub fn human_bytes(b: u64) -> String {
    const UNITS: [&str; 5] = ["KiB", "MiB", "GiB", "TiB", "PiB"];
    if b < 1024 {
        return format!("{b} B");
    }
    let mut v = b as f64 / 1024.0;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    if v < 10.0 {
        format!("{v:.2} {}", UNITS[u])
    } else {
        format!("{v:.1} {}", UNITS[u])
    }
}

/// A size as `--budget` accepts it: `24GiB`, `1MiB`, or plain bytes.
pub fn budget_arg(b: u64) -> String {
    for (shift, unit) in [(40, "TiB"), (30, "GiB"), (20, "MiB"), (10, "KiB")] {
        if b > 0 && b.is_multiple_of(1u64 << shift) {
            return format!("{}{unit}", b >> shift);
        }
    }
    b.to_string()
}

fn percent(part: u64, whole: u64) -> String {
    if whole == 0 {
        "-".into()
    } else {
        format!("{:.1}%", part as f64 * 100.0 / whole as f64)
    }
}

fn plural(n: usize, one: &str, many: &str) -> String {
    format!("{n} {}", if n == 1 { one } else { many })
}

/// The step (kernel) that writes a planned buffer.
fn producer<'a>(plan: &'a MemoryPlan, b: &PlannedBuffer) -> Option<&'a PlanStep> {
    plan.steps.get(b.start as usize)
}

/// `kernel (kind)` of a step, `? (?)` when there is none.
fn step_label(step: Option<&PlanStep>) -> String {
    step.map_or_else(|| "? (?)".to_string(), |s| format!("{} ({})", s.kernel, s.kind))
}

fn display_name(name: &Option<String>) -> &str {
    name.as_deref().unwrap_or("-")
}

/// Rows of text in columns: each column as wide as its widest cell; `right` says which
/// columns are right-aligned. Every line starts with `indent`.
fn table(indent: &str, rows: &[Vec<String>], right: &[bool]) -> String {
    let ncol = rows.iter().map(Vec::len).max().unwrap_or(0);
    let mut widths = vec![0; ncol];
    for row in rows {
        for (i, cell) in row.iter().enumerate() {
            widths[i] = widths[i].max(cell.chars().count());
        }
    }
    let mut out = String::new();
    for row in rows {
        let mut line = indent.to_string();
        for (i, cell) in row.iter().enumerate() {
            if i > 0 {
                line.push_str("  ");
            }
            let pad = widths[i] - cell.chars().count();
            if right.get(i).copied().unwrap_or(false) {
                line.extend(std::iter::repeat_n(' ', pad));
                line.push_str(cell);
            } else {
                line.push_str(cell);
                line.extend(std::iter::repeat_n(' ', pad));
            }
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

/// A size row: label, human size, exact bytes, note.
fn size_row(label: &str, bytes: u64, note: String) -> Vec<String> {
    vec![label.to_string(), human_bytes(bytes), format!("{bytes} B"), note]
}

/// Bytes live at the peak step: the tensors' own bytes and the GEMM scratch there
/// (aligned slots are what the lower bound counts).
fn peak_bytes(plan: &MemoryPlan) -> u64 {
    plan.peak_live
        .iter()
        .map(|t| t.bytes)
        .fold(plan.peak_scratch_bytes, u64::saturating_add)
}

/// What is live at the peak, in words: `3 tensors`, or `3 tensors and 64.0 KiB of GEMM
/// scratch` (so the count agrees with the table below it, whose last row is the
/// scratch).
fn live_at_peak(plan: &MemoryPlan) -> String {
    live_words(plan.peak_live.len(), plan.peak_scratch_bytes)
}

/// [`live_at_peak`] of `tensors` tensors and `scratch` bytes of GEMM scratch.
fn live_words(tensors: usize, scratch: u64) -> String {
    let words = plural(tensors, "tensor", "tensors");
    if scratch > 0 {
        format!("{words} and {} of GEMM scratch", human_bytes(scratch))
    } else {
        words
    }
}

/// The figures of [`summary`] for tools (part of [`PlanJson`]).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct SummaryJson {
    /// The device the totals are for.
    pub device: Device,
    /// [`MemoryPlan::total_bytes_for`] that device.
    pub total_bytes: u64,
    pub fits: bool,
    /// Budget left (when it fits) or bytes over it (when not).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub headroom_bytes: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub over_by_bytes: Option<u64>,
    /// arena / lower bound.
    pub arena_ratio: f64,
    /// Bytes live at the peak step: its tensors and GEMM scratch.
    pub peak_bytes: u64,
}

/// What `graphc plan --json` prints: the whole plan (its fields at the top level, as
/// before), a `summary` and, when the plan is over its budget, the `diagnosis`.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct PlanJson<'a> {
    #[serde(flatten)]
    pub plan: &'a MemoryPlan,
    pub summary: SummaryJson,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub diagnosis: Option<Diagnosis>,
}

impl<'a> PlanJson<'a> {
    /// The JSON of `plan` for a run on `device` (the summary's totals and the diagnosis
    /// are that device's: [`diagnose_for`]); `rerun` as for [`diagnose`].
    pub fn new(program: &Program, plan: &'a MemoryPlan, device: Device, rerun: &Rerun) -> PlanJson<'a> {
        let total = plan.total_bytes_for(device);
        let fits = total <= plan.budget_bytes;
        PlanJson {
            plan,
            summary: SummaryJson {
                device,
                total_bytes: total,
                fits,
                headroom_bytes: fits.then(|| plan.budget_bytes - total),
                over_by_bytes: (!fits).then(|| total - plan.budget_bytes),
                arena_ratio: plan.ratio(),
                peak_bytes: peak_bytes(plan),
            },
            diagnosis: diagnose_for(program, plan, rerun, device),
        }
    }
}
