//! The plan verifier.

use super::memory::{MemoryPlan, Place, PlannedBuffer};
use super::offsets::{lower_bound, units, Interval, Placement};
use crate::kernel::{BufferId, BufferKind, Program};
use graphc_ir::work::{self, Stage};

/// Checks a placement of `bufs` at alignment `align`:
/// - one offset per buffer, each a multiple of `align`;
/// - no two buffers live at the same time (their `[start, end)` intersect) overlap in
///   address, each taking its size rounded up to `align` (what the planner reserves);
///   buffers of size 0 occupy nothing;
/// - the arena covers every buffer (`offset + rounded size <= arena`);
/// - `lower_bound` is [`lower_bound`]`(bufs, align)` and the arena is at least it.
///
/// Errors name the buffers by index.
pub fn verify(bufs: &[Interval], p: &Placement, align: u64) -> Result<(), String> {
    if align == 0 {
        return Err("alignment must be positive".into());
    }
    if p.offsets.len() != bufs.len() {
        return Err(format!("{} offsets for {} buffers", p.offsets.len(), bufs.len()));
    }
    let mut spans = Vec::with_capacity(bufs.len());
    for (i, (b, &o)) in bufs.iter().zip(&p.offsets).enumerate() {
        if b.end <= b.start {
            return Err(format!("buffer {i}: lifetime [{}, {}) is empty", b.start, b.end));
        }
        if o % align != 0 {
            return Err(format!("buffer {i}: offset {o} is not a multiple of {align}"));
        }
        let size = units(b.size, align)
            .checked_mul(align)
            .ok_or_else(|| format!("buffer {i}: size overflows"))?;
        let top = o
            .checked_add(size)
            .ok_or_else(|| format!("buffer {i}: offset {o} + size {size} overflows"))?;
        if size > 0 && top > p.arena {
            return Err(format!(
                "buffer {i}: [{o}, {top}) ends past the arena ({} bytes)",
                p.arena
            ));
        }
        if size > 0 {
            spans.push((b.start, b.end, o, top, i));
        }
    }
    // Sweep over time: a buffer is checked against those still live when it starts,
    // which (if all is well so far) are disjoint in address: only the neighbours by
    // address can overlap it.
    spans.sort_unstable();
    let mut live = LiveSet::default();
    for &(start, end, lo, hi, i) in &spans {
        live.expire(start);
        if let Some(j) = live.overlapping(lo, hi).next() {
            let (olo, ohi) = live.range_of(j);
            let (a, b) = (i.min(j), i.max(j));
            let (ba, bb) = (&bufs[a], &bufs[b]);
            return Err(format!(
                "buffers {a} and {b} overlap: both live over [{}, {}) and at addresses [{}, {})",
                ba.start.max(bb.start),
                ba.end.min(bb.end),
                lo.max(olo),
                hi.min(ohi)
            ));
        }
        live.insert(end, lo, hi, i);
    }
    let lb = lower_bound(bufs, align);
    if p.lower_bound != lb {
        return Err(format!(
            "lower bound is {lb} bytes, the placement says {}",
            p.lower_bound
        ));
    }
    if p.arena < lb {
        return Err(format!("arena {} is below the lower bound {lb}", p.arena));
    }
    Ok(())
}

/// Checks a [`MemoryPlan`] against the program it was made for:
/// - one step per kernel, in order, naming it, with every argument where the plan puts
///   its buffer;
/// - every arena buffer is a temp that is not a graph output, has its type's size, an
///   offset that is a multiple of the plan's alignment, and lies inside the arena; every
///   temp a kernel writes that is not an output is in the arena;
/// - lifetimes: a buffer starts at the kernel that writes it and lives through every
///   kernel that reads it;
/// - no two arena buffers live at the same step overlap in address, except a buffer and
///   the one whose storage it takes over ([`PlannedBuffer::reuses`]: same offset, at the
///   one step where the old one is last read and the new one written);
/// - the lower bound is the most aligned bytes live at once, and the arena is at least it;
/// - the total is the sum of its parts.
///
/// Errors name the buffer or kernel.
pub fn verify_plan(program: &Program, plan: &MemoryPlan) -> Result<(), String> {
    let align = plan.align;
    if align == 0 {
        return Err("alignment must be positive".into());
    }
    let nk = program.kernels.len();
    if plan.kernels != nk || plan.steps.len() != nk {
        return Err(format!(
            "the plan has {} kernels and {} steps for a program of {nk} kernels",
            plan.kernels,
            plan.steps.len()
        ));
    }
    let n = program.buffers.len();
    let mut is_output = vec![false; n];
    for (_, b) in &program.outputs {
        if b.index() < n {
            is_output[b.index()] = true;
        }
    }
    let planned = planned_buffers(program, plan, &is_output)?;
    check_steps(program, plan, &planned, &is_output)?;
    crate::train::donate::check(program)?;
    let scratch_spans = scratch_spans(plan)?;
    let steps_live = check_overlaps(plan, &scratch_spans)?;
    let lb = steps_live.iter().copied().max().unwrap_or(0);
    if plan.lower_bound_bytes != lb {
        return Err(format!(
            "lower bound is {lb} bytes, the plan says {}",
            plan.lower_bound_bytes
        ));
    }
    if plan.arena_bytes < lb {
        return Err(format!("arena {} is below the lower bound {lb}", plan.arena_bytes));
    }
    // Saturating, as the planner adds them.
    let sum = plan
        .weights_bytes
        .saturating_add(plan.inputs_bytes)
        .saturating_add(plan.outputs_bytes)
        .saturating_add(plan.workspace_bytes)
        .saturating_add(plan.arena_bytes);
    if plan.total_bytes != sum {
        return Err(format!(
            "total {} is not the sum of its parts ({sum})",
            plan.total_bytes
        ));
    }
    Ok(())
}

/// Each arena buffer of `plan` checked against the program (a temp that is not an
/// output, its type's size, aligned, inside the arena, a lifetime within the kernels),
/// by buffer id.
fn planned_buffers<'p>(
    program: &Program,
    plan: &'p MemoryPlan,
    is_output: &[bool],
) -> Result<Vec<Option<&'p PlannedBuffer>>, String> {
    let (align, nk, n) = (plan.align, program.kernels.len(), program.buffers.len());
    let mut planned: Vec<Option<&PlannedBuffer>> = vec![None; n];
    for pb in &plan.buffers {
        let i = pb.buffer.index();
        let buf = program
            .buffers
            .get(i)
            .ok_or_else(|| format!("planned buffer b{i} does not exist"))?;
        if !matches!(buf.kind, BufferKind::Temp) || is_output[i] {
            return Err(format!("b{i} is in the arena but is not an intermediate temp"));
        }
        if planned[i].replace(pb).is_some() {
            return Err(format!("b{i} is planned twice"));
        }
        if pb.bytes != buf.ty.size_bytes() as u64 {
            return Err(format!(
                "b{i}: planned {} bytes for a {} ({} bytes)",
                pb.bytes,
                buf.ty,
                buf.ty.size_bytes()
            ));
        }
        if pb.offset % align != 0 {
            return Err(format!("b{i}: offset {} is not a multiple of {align}", pb.offset));
        }
        let top = pb
            .offset
            .checked_add(pb.bytes)
            .ok_or_else(|| format!("b{i}: offset + size overflows"))?;
        if top > plan.arena_bytes {
            return Err(format!(
                "b{i}: [{}, {top}) ends past the arena ({} bytes)",
                pb.offset, plan.arena_bytes
            ));
        }
        if pb.end <= pb.start || pb.end as usize > nk {
            return Err(format!(
                "b{i}: lifetime [{}, {}) is empty or past the last kernel",
                pb.start, pb.end
            ));
        }
    }
    Ok(planned)
}

/// Each step against its kernel: the name, lifetimes covering every write and read,
/// every arena argument at its buffer's offset.
fn check_steps(
    program: &Program,
    plan: &MemoryPlan,
    planned: &[Option<&PlannedBuffer>],
    is_output: &[bool],
) -> Result<(), String> {
    let n = program.buffers.len();
    for (k, (kernel, step)) in program.kernels.iter().zip(&plan.steps).enumerate() {
        if step.kernel != kernel.name {
            return Err(format!(
                "step {k} is kernel {} but the program's is {}",
                step.kernel, kernel.name
            ));
        }
        work::add_len(Stage::Verify, 1 + 2 * step.args.len());
        for b in kernel.writes() {
            let i = b.index();
            if i >= n {
                return Err(format!(
                    "kernel {k} ({}) writes b{i}, which does not exist",
                    kernel.name
                ));
            }
            if matches!(program.buffers[i].kind, BufferKind::Temp) && !is_output[i] {
                let pb = planned[i].ok_or_else(|| format!("b{i}, written by kernel {k}, is not in the arena"))?;
                if pb.start as usize != k {
                    return Err(format!(
                        "b{i}: written by kernel {k} but its lifetime starts at {}",
                        pb.start
                    ));
                }
            }
        }
        for b in kernel.reads() {
            if let Some(pb) = planned.get(b.index()).copied().flatten() {
                if !(pb.start as usize <= k && k < pb.end as usize) {
                    return Err(format!(
                        "b{}: read by kernel {k} ({}) outside its lifetime [{}, {})",
                        b.0, kernel.name, pb.start, pb.end
                    ));
                }
            }
        }
        for arg in &step.args {
            if let (Place::Arena { offset }, Some(pb)) =
                (&arg.place, planned.get(arg.buffer.index()).copied().flatten())
            {
                if *offset != pb.offset {
                    return Err(format!(
                        "step {k}: b{} at offset {offset}, but the buffer is planned at {}",
                        arg.buffer.0, pb.offset
                    ));
                }
            } else if matches!(arg.place, Place::Arena { .. }) {
                return Err(format!(
                    "step {k}: b{} is placed in the arena but not planned",
                    arg.buffer.0
                ));
            }
        }
    }
    Ok(())
}

/// The buffer id of a GEMM scratch span in the overlap sweep (no program buffer).
const SCRATCH: BufferId = BufferId(u32::MAX);

/// The GEMM scratch areas, checked, as spans for the overlap sweep.
fn scratch_spans(plan: &MemoryPlan) -> Result<Vec<PlannedBuffer>, String> {
    let (align, nk) = (plan.align, plan.steps.len());
    // GEMM scratch: aligned, inside the arena, one per step that names it, live for that
    // step only. For the sweep it is a buffer with no program id.
    let mut scratch_spans = Vec::with_capacity(plan.scratch.len());
    let mut scratch_of: std::collections::HashMap<usize, Vec<u64>> = std::collections::HashMap::new();
    for s in &plan.scratch {
        scratch_of.entry(s.step as usize).or_default().push(s.offset);
    }
    for (k, step) in plan.steps.iter().enumerate() {
        let planned = scratch_of.get(&k).map(Vec::as_slice).unwrap_or_default();
        match (step.scratch, planned) {
            (None, []) => {}
            (Some(offset), [s]) if *s == offset => {}
            _ => {
                return Err(format!(
                    "step {k}: its scratch offset and the plan's scratch areas disagree"
                ))
            }
        }
    }
    for s in &plan.scratch {
        let top = s.offset.saturating_add(s.bytes);
        if s.offset % align != 0 || top > plan.arena_bytes || s.step as usize >= nk {
            return Err(format!(
                "the GEMM scratch of step {} ([{}, {top})) is misaligned, past the arena ({} bytes) or past the last step",
                s.step, s.offset, plan.arena_bytes
            ));
        }
        scratch_spans.push(PlannedBuffer {
            buffer: SCRATCH,
            name: Some(format!("the GEMM scratch of step {}", s.step)),
            offset: s.offset,
            bytes: s.bytes,
            start: s.step,
            end: s.step + 1,
            reuses: None,
        });
    }
    Ok(scratch_spans)
}

/// No two arena buffers (or scratch areas) live at one step overlap in address, but
/// for in-place pairs; returns the aligned bytes live at each step.
fn check_overlaps(plan: &MemoryPlan, scratch_spans: &[PlannedBuffer]) -> Result<Vec<u64>, String> {
    let (align, nk) = (plan.align, plan.steps.len());
    let label = |b: &PlannedBuffer| match (&b.name, b.buffer) {
        (Some(n), SCRATCH) => n.clone(),
        _ => format!("b{}", b.buffer.0),
    };

    // Overlaps: sweep over time (see [`verify`]). An in-place pair shares its range at
    // one step, so a buffer may meet one live buffer at its very address.
    let rounded = |b: &PlannedBuffer| b.bytes.div_ceil(align).saturating_mul(align);
    let mut spans: Vec<&PlannedBuffer> = plan
        .buffers
        .iter()
        .chain(scratch_spans)
        .filter(|b| b.bytes > 0)
        .collect();
    spans.sort_by_key(|b| (b.start, b.buffer));
    let mut live = LiveSet::default();
    // Aligned bytes live per step, as differences.
    let mut delta = vec![0i128; nk + 1];
    for (k, b) in spans.iter().enumerate() {
        live.expire(b.start);
        work::add(Stage::Verify, 1);
        let (lo, hi) = (b.offset, b.offset.saturating_add(rounded(b)));
        for j in live.overlapping(lo, hi) {
            work::add(Stage::Verify, 1);
            let o = spans[j];
            let in_place = (b.reuses == Some(o.buffer) && b.offset == o.offset && o.end == b.start + 1)
                || (o.reuses == Some(b.buffer) && b.offset == o.offset && b.end == o.start + 1);
            if !in_place {
                return Err(format!(
                    "{} and {} overlap: both live at step {} and at addresses [{}, {})",
                    label(o),
                    label(b),
                    b.start.max(o.start),
                    b.offset.max(o.offset),
                    (b.offset + rounded(b)).min(o.offset + rounded(o))
                ));
            }
        }
        live.insert(b.end, lo, hi, k);
        // The step that writes in place holds one slot for the two buffers.
        let from = b.start as usize + usize::from(b.reuses.is_some());
        let to = (b.end as usize).min(nk);
        if from < to {
            delta[from] += i128::from(rounded(b));
            delta[to] -= i128::from(rounded(b));
        }
    }
    let mut steps_live = Vec::with_capacity(nk);
    let mut running = 0i128;
    for d in &delta[..nk] {
        running += d;
        steps_live.push(u64::try_from(running).unwrap_or(u64::MAX));
    }
    Ok(steps_live)
}

/// The buffers live at a point of a sweep over time: address ranges by offset, and
/// their ends in a heap to drop them when time passes them.
#[derive(Default)]
struct LiveSet {
    /// (lo, id) -> hi.
    by_addr: std::collections::BTreeMap<(u64, usize), u64>,
    /// (end, lo, id), earliest end first.
    ends: std::collections::BinaryHeap<std::cmp::Reverse<(u32, u64, usize)>>,
}

impl LiveSet {
    /// Drops the buffers whose lifetime ends at or before `t`.
    fn expire(&mut self, t: u32) {
        while let Some(&std::cmp::Reverse((end, lo, id))) = self.ends.peek() {
            if end > t {
                break;
            }
            self.ends.pop();
            self.by_addr.remove(&(lo, id));
        }
    }

    fn insert(&mut self, end: u32, lo: u64, hi: u64, id: usize) {
        self.by_addr.insert((lo, id), hi);
        self.ends.push(std::cmp::Reverse((end, lo, id)));
    }

    fn range_of(&self, id: usize) -> (u64, u64) {
        self.by_addr
            .iter()
            .find(|(&(_, j), _)| j == id)
            .map_or((0, 0), |(&(lo, _), &hi)| (lo, hi))
    }

    /// The live buffers whose range meets `[lo, hi)`, given that live buffers at
    /// different addresses are disjoint (buffers at one same address may overlap: an
    /// in-place pair). Then of those starting below `lo` only the ones at the highest
    /// such address can reach past `lo`; the others meeting it start in `[lo, hi)`.
    fn overlapping(&self, lo: u64, hi: u64) -> impl Iterator<Item = usize> + '_ {
        let next_below = self.by_addr.range(..(lo, 0)).next_back().map(|(&(s, _), _)| s);
        let below = next_below
            .into_iter()
            .flat_map(move |s| self.by_addr.range((s, 0)..=(s, usize::MAX)))
            .filter(move |(_, &h)| h > lo)
            .map(|(&(_, id), _)| id);
        let inside = self.by_addr.range((lo, 0)..(hi, 0)).map(|(&(_, id), _)| id);
        below.chain(inside)
    }
}
