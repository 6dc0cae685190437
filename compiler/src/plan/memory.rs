//! The memory plan of a fused program: every intermediate buffer at an offset in one
//! arena, from its lifetime over the kernel order.
//!
//! Liveness: a temp buffer is live from the kernel that writes it to the last kernel
//! that reads it (inclusive). Graph inputs, weights, constants and graph outputs live
//! outside the arena (caller-owned, or for the whole run). Views need no buffers: fusion
//! already folded them into accesses.
//!
//! Today the schedule is the program's kernel order; memory-aware scheduling, in-place
//! reuse and the over-budget diagnosis come next (issue 6).

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::{assign_offsets, verify, Interval, PlanError, PlanOptions};
use crate::kernel::{BufferKind, Program};

/// 24 GiB, an RTX 4090D.
pub const DEFAULT_BUDGET: u64 = 24 << 30;

/// Knobs of [`plan_memory`].
#[derive(Clone, Debug)]
pub struct MemoryOptions {
    pub budget_bytes: u64,
    pub align: u64,
    pub time_budget: Duration,
}

impl Default for MemoryOptions {
    fn default() -> MemoryOptions {
        MemoryOptions {
            budget_bytes: DEFAULT_BUDGET,
            align: 256,
            time_budget: Duration::from_millis(200),
        }
    }
}

/// One arena buffer: its place and lifetime (kernel indices, `end` exclusive).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PlannedBuffer {
    pub buffer: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    pub offset: u64,
    pub bytes: u64,
    pub start: u32,
    pub end: u32,
}

/// Where every intermediate goes, and what the whole run needs.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemoryPlan {
    pub kernels: usize,
    pub arena_bytes: u64,
    pub lower_bound_bytes: u64,
    pub weights_bytes: u64,
    pub inputs_bytes: u64,
    pub outputs_bytes: u64,
    pub budget_bytes: u64,
    /// weights + inputs + outputs + arena.
    pub total_bytes: u64,
    /// Which offset heuristic won (`greedy:size`, `search`, ...).
    pub strategy: String,
    pub buffers: Vec<PlannedBuffer>,
}

impl MemoryPlan {
    pub fn fits(&self) -> bool {
        self.total_bytes <= self.budget_bytes
    }
}

/// Plan a program's intermediates into one arena.
pub fn plan_memory(program: &Program, opts: &MemoryOptions) -> Result<MemoryPlan, PlanError> {
    let n = program.buffers.len();
    let mut first = vec![None::<u32>; n];
    let mut last = vec![None::<u32>; n];
    for (k, kernel) in program.kernels.iter().enumerate() {
        let k = k as u32;
        for b in kernel.writes() {
            first[b.index()].get_or_insert(k);
            last[b.index()] = Some(last[b.index()].map_or(k, |l| l.max(k)));
        }
        for b in kernel.reads() {
            last[b.index()] = Some(last[b.index()].map_or(k, |l| l.max(k)));
        }
    }
    let is_output: Vec<bool> = (0..n)
        .map(|i| program.outputs.iter().any(|(_, b)| b.index() == i))
        .collect();
    let (mut weights, mut inputs, mut outputs) = (0u64, 0u64, 0u64);
    let mut ids = Vec::new();
    let mut intervals = Vec::new();
    for (i, b) in program.buffers.iter().enumerate() {
        let bytes = b.ty.size_bytes() as u64;
        match (&b.kind, is_output[i]) {
            (BufferKind::Weight { .. } | BufferKind::Constant { .. }, _) => weights += bytes,
            (BufferKind::Input { .. }, _) => inputs += bytes,
            (BufferKind::Temp, true) => outputs += bytes,
            (BufferKind::Temp, false) => {
                if let (Some(s), Some(e)) = (first[i], last[i]) {
                    ids.push(i);
                    intervals.push(Interval::new(s, e + 1, bytes));
                }
            }
        }
    }
    let placement = assign_offsets(
        &intervals,
        &PlanOptions {
            align: opts.align,
            time_budget: opts.time_budget,
            ..PlanOptions::default()
        },
    )?;
    debug_assert!(verify(&intervals, &placement, opts.align).is_ok());
    let buffers = ids
        .iter()
        .zip(&intervals)
        .zip(&placement.offsets)
        .map(|((&i, iv), &offset)| PlannedBuffer {
            buffer: i as u32,
            name: program.buffers[i].name.clone(),
            offset,
            bytes: iv.size,
            start: iv.start,
            end: iv.end,
        })
        .collect();
    Ok(MemoryPlan {
        kernels: program.kernels.len(),
        arena_bytes: placement.arena,
        lower_bound_bytes: placement.lower_bound,
        weights_bytes: weights,
        inputs_bytes: inputs,
        outputs_bytes: outputs,
        budget_bytes: opts.budget_bytes,
        total_bytes: weights + inputs + outputs + placement.arena,
        strategy: placement.strategy,
        buffers,
    })
}
