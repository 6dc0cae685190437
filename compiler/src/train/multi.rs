//! Multi-tensor optimizer kernels: a training step's per-parameter update kernels
//! merged into a few launches ([`MultiTensorKernel`], as PyTorch's `foreach` kernels),
//! without raising the step's peak memory.
//!
//! Fusion gives each parameter's update one elementwise kernel (the update region fuses
//! only with itself, `crate::fuse::group::Groups::set_update_region`), and the
//! scheduler runs it as soon as its gradient is ready, so the gradient is freed at once.
//! Running several updates as one launch at the position of the last of them holds the
//! earlier ones' gradients (the temps they are the last reader of) until then. After
//! scheduling, [`merge_updates`] walks the program and grows a group of updates while
//! holding those bytes keeps the live bytes of every step in between at or under the
//! schedule's peak: merging never raises the peak the schedule chose. Before the peak
//! groups stay small; after it (the backward pass frees activations) they grow to the
//! launch's limits: [`MAX_PARTS`] parts, [`MAX_PARAMS`] pointer arguments (CUDA's 4 KiB
//! of kernel arguments).
//!
//! A merged update still runs after every other reader of its donated input (it only
//! moves later), no kernel reads what an update writes (donated outputs have no
//! readers), the parts of one launch share no written buffer, and no part reads a state
//! input another part writes over (such updates stay in different launches), so the
//! program stays valid; the pipeline verifies it and the plan again.

use std::collections::{HashMap, HashSet};

use crate::kernel::{BufferId, BufferKind, Kernel, KernelKind, MultiTensorKernel, Program};
use crate::plan::live_bytes;

/// The most parts one multi-tensor kernel runs.
pub const MAX_PARTS: usize = 64;
/// The most distinct buffers (pointer arguments, 8 bytes each) one multi-tensor kernel
/// takes: 4000 bytes of CUDA's 4 KiB kernel argument space.
pub const MAX_PARAMS: usize = 500;

/// What [`merge_updates`] did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MultiTensorReport {
    /// Update kernels before merging (elementwise kernels that write only donated state).
    pub updates: usize,
    /// Multi-tensor kernels made, and the update kernels they run.
    pub kernels: usize,
    pub parts: usize,
}

/// A group being grown: its members (positions in the program), the arena bytes held
/// by delaying them to the last member, and the buffers its launch takes.
struct Group {
    members: Vec<usize>,
    held: u64,
    buffers: HashSet<BufferId>,
    /// Buffers the members read, and the state inputs they write over (donated).
    reads: HashSet<BufferId>,
    overwrites: HashSet<BufferId>,
}

impl Group {
    /// Kernel `t` (reading `reads`, writing over `overwrites`) may run at the same time
    /// as the members: no member reads what it overwrites, and it reads nothing a
    /// member overwrites (the parts of a launch are independent).
    fn independent(&self, reads: &[BufferId], overwrites: &[BufferId]) -> bool {
        reads.iter().all(|b| !self.overwrites.contains(b)) && overwrites.iter().all(|b| !self.reads.contains(b))
    }
}

/// Merge the update kernels of the scheduled training step `program` into multi-tensor
/// kernels (see the module doc). A program without donated state is returned as it is.
pub fn merge_updates(program: Program) -> (Program, MultiTensorReport) {
    let mut report = MultiTensorReport::default();
    if program.donated.is_empty() {
        return (program, report);
    }
    let k = program.kernels.len();
    let donated: HashSet<BufferId> = program.donated.iter().map(|d| d.output).collect();
    // Each donated output, and the input it is written over.
    let overwritten: HashMap<BufferId, BufferId> = program.donated.iter().map(|d| (d.output, d.input)).collect();
    let is_update = |kernel: &Kernel| match &kernel.kind {
        KernelKind::Elementwise(e) => {
            !e.stores.is_empty() && e.stores.iter().all(|s| donated.contains(&s.access.buffer))
        }
        _ => false,
    };
    // Arena temps (temps that are not outputs) and the last step that reads each.
    let outputs: HashSet<BufferId> = program.outputs.iter().map(|(_, b)| *b).collect();
    let arena_bytes = |b: BufferId| -> u64 {
        match program.buffers.get(b.index()) {
            Some(buf) if matches!(buf.kind, BufferKind::Temp) && !outputs.contains(&b) => buf.ty.size_bytes() as u64,
            _ => 0,
        }
    };
    let mut last_read: HashMap<BufferId, usize> = HashMap::new();
    for (t, kernel) in program.kernels.iter().enumerate() {
        for b in kernel.reads() {
            last_read.insert(b, t);
        }
    }
    let held_by = |t: usize| -> u64 {
        program.kernels[t]
            .reads()
            .into_iter()
            .filter(|b| last_read.get(b) == Some(&t))
            .map(arena_bytes)
            .sum()
    };
    let live = live_bytes(&program);
    let peak = live.iter().copied().max().unwrap_or(0);
    let mut extra = vec![0u64; k];
    let mut groups: Vec<Vec<usize>> = Vec::new();
    let mut open: Option<Group> = None;
    for t in 0..k {
        if !is_update(&program.kernels[t]) {
            continue;
        }
        report.updates += 1;
        let reads = program.kernels[t].reads();
        let overwrites: Vec<BufferId> = program.kernels[t]
            .writes()
            .iter()
            .filter_map(|w| overwritten.get(w).copied())
            .collect();
        let mut buffers: HashSet<BufferId> = reads.iter().copied().collect();
        buffers.extend(program.kernels[t].writes());
        let joins = open.as_ref().is_some_and(|g| {
            let last = *g.members.last().unwrap_or(&t);
            g.members.len() < MAX_PARTS
                && g.buffers.union(&buffers).count() <= MAX_PARAMS
                && g.independent(&reads, &overwrites)
                && (last + 1..=t).all(|x| live[x] + extra[x] + g.held <= peak)
        });
        match open.as_mut() {
            Some(g) if joins => {
                let last = *g.members.last().unwrap_or(&t);
                for e in &mut extra[last + 1..=t] {
                    *e += g.held;
                }
                g.members.push(t);
                g.held += held_by(t);
                g.buffers.extend(buffers);
                g.reads.extend(reads);
                g.overwrites.extend(overwrites);
            }
            _ => {
                if let Some(g) = open.take() {
                    groups.push(g.members);
                }
                open = Some(Group {
                    members: vec![t],
                    held: held_by(t),
                    buffers,
                    reads: reads.into_iter().collect(),
                    overwrites: overwrites.into_iter().collect(),
                });
            }
        }
    }
    if let Some(g) = open.take() {
        groups.push(g.members);
    }
    // Each group of two or more runs at its last member's position.
    let groups: Vec<Vec<usize>> = groups.into_iter().filter(|m| m.len() > 1).collect();
    report.kernels = groups.len();
    report.parts = groups.iter().map(Vec::len).sum();
    (run_merged(program, groups, |m| *m.last().unwrap_or(&0)), report)
}

/// `program` with each group of its elementwise kernels (two or more each) run as one
/// multi-tensor kernel at the position `at(group)` gives (one of its members').
fn run_merged(program: Program, groups: Vec<Vec<usize>>, at: impl Fn(&[usize]) -> usize) -> Program {
    if groups.is_empty() {
        return program;
    }
    let k = program.kernels.len();
    let mut merged_at: HashMap<usize, Vec<usize>> = HashMap::new();
    let mut moved = vec![false; k];
    for members in groups {
        for &m in &members {
            moved[m] = true;
        }
        merged_at.insert(at(&members), members);
    }
    let mut slots: Vec<Option<Kernel>> = program.kernels.iter().cloned().map(Some).collect();
    let mut kernels = Vec::with_capacity(k);
    for t in 0..k {
        let pos = kernels.len();
        if let Some(members) = merged_at.get(&t) {
            let mut parts = Vec::with_capacity(members.len());
            let mut nodes = Vec::new();
            for &m in members {
                if let Some(Kernel {
                    kind: KernelKind::Elementwise(e),
                    nodes: n,
                    ..
                }) = slots[m].take()
                {
                    parts.push(e);
                    nodes.extend(n);
                }
            }
            nodes.sort_unstable();
            nodes.dedup();
            kernels.push(Kernel {
                name: format!("k{pos}_multi_tensor"),
                kind: KernelKind::MultiTensor(MultiTensorKernel { parts }),
                nodes,
            });
        } else if !moved[t] {
            if let Some(mut kernel) = slots[t].take() {
                kernel.name = renumber(&kernel.name, pos);
                kernels.push(kernel);
            }
        }
    }
    Program { kernels, ..program }
}

/// The largest output (bytes) of a kernel [`merge_small_casts`] moves.
pub const SMALL_CAST_BYTES: u64 = 8 << 20;

/// Merge the small elementwise kernels that read only the program's inputs, weights
/// and constants (a mixed-precision step's bf16 copies of its parameters: in GPT-2
/// small 48 launches of a few thousand elements for the biases and norm weights, and
/// the weight matrices' casts up to [`SMALL_CAST_BYTES`], each a launch's cost for
/// nothing) into multi-tensor kernels, each run at its first member's position: a
/// later member moves earlier, which its inputs allow (they exist from the start), and
/// holds its output from there, so it joins a group only while that keeps the live
/// bytes of every step in between at or under the schedule's peak. Returns how many
/// kernels were merged.
pub fn merge_small_casts(program: Program) -> (Program, usize) {
    let k = program.kernels.len();
    let outputs: HashSet<BufferId> = program.outputs.iter().map(|(_, b)| *b).collect();
    let temp = |b: &BufferId| matches!(program.buffers.get(b.index()).map(|x| &x.kind), Some(BufferKind::Temp));
    let out_bytes = |kernel: &Kernel| -> Option<u64> {
        if !matches!(kernel.kind, KernelKind::Elementwise(_)) || kernel.reads().iter().any(temp) {
            return None;
        }
        let writes = kernel.writes();
        if writes.is_empty() || writes.iter().any(|b| !temp(b) || outputs.contains(b)) {
            return None;
        }
        let bytes: u64 = writes
            .iter()
            .filter_map(|b| program.buffers.get(b.index()))
            .map(|b| b.ty.size_bytes() as u64)
            .sum();
        (bytes <= SMALL_CAST_BYTES).then_some(bytes)
    };
    let live = live_bytes(&program);
    let peak = live.iter().copied().max().unwrap_or(0);
    let mut extra = vec![0u64; k];
    let mut groups: Vec<Vec<usize>> = Vec::new();
    let mut open: Option<(Vec<usize>, HashSet<BufferId>)> = None;
    for t in 0..k {
        let Some(bytes) = out_bytes(&program.kernels[t]) else {
            continue;
        };
        let mut buffers: HashSet<BufferId> = program.kernels[t].reads().into_iter().collect();
        buffers.extend(program.kernels[t].writes());
        let joins = open.as_ref().is_some_and(|(members, bufs)| {
            let first = members[0];
            members.len() < MAX_PARTS
                && bufs.union(&buffers).count() <= MAX_PARAMS
                && (first..t).all(|x| live[x] + extra[x] + bytes <= peak)
        });
        match open.as_mut() {
            Some((members, bufs)) if joins => {
                for e in &mut extra[members[0]..t] {
                    *e += bytes;
                }
                members.push(t);
                bufs.extend(buffers);
            }
            _ => {
                if let Some((members, _)) = open.take() {
                    groups.push(members);
                }
                open = Some((vec![t], buffers));
            }
        }
    }
    if let Some((members, _)) = open.take() {
        groups.push(members);
    }
    let groups: Vec<Vec<usize>> = groups.into_iter().filter(|m| m.len() > 1).collect();
    let merged = groups.iter().map(Vec::len).sum();
    (run_merged(program, groups, |m| m[0]), merged)
}

/// A kernel's name with its position prefix (`k12_...`, as fusion and the scheduler
/// name kernels) set to `pos`.
fn renumber(name: &str, pos: usize) -> String {
    let rest = name
        .strip_prefix('k')
        .map(|r| r.trim_start_matches(|c: char| c.is_ascii_digit()))
        .filter(|r| r.len() < name.len() - 1 && r.starts_with('_'));
    match rest {
        Some(r) => format!("k{pos}{r}"),
        None => format!("k{pos}_{name}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernel::{Access, Body, Donation, ElementwiseKernel, Expr, InputId, Store};
    use graphc_ir::{BinaryOp, DType, TensorType};

    /// Two updates: `b' = y + x` (or `y + y`) over `y`, then `a' = x * x` over `x`.
    fn program(b_reads_x: bool) -> Program {
        let mut p = Program::default();
        let ty = TensorType::new(DType::F32, [4]);
        let x = p.add_buffer(ty.clone(), BufferKind::Input { name: "x".into() }, None);
        let y = p.add_buffer(ty.clone(), BufferKind::Input { name: "y".into() }, None);
        let b_out = p.add_buffer(ty.clone(), BufferKind::Temp, None);
        let a_out = p.add_buffer(ty, BufferKind::Temp, None);
        p.inputs = vec![x, y];
        p.outputs = vec![("y".into(), b_out), ("x".into(), a_out)];
        p.donated = vec![
            Donation {
                output: b_out,
                input: y,
            },
            Donation {
                output: a_out,
                input: x,
            },
        ];
        let update = |reads: Vec<BufferId>, out: BufferId, op: BinaryOp| {
            let mut body = Body::default();
            let l0 = body.push(Expr::Load(InputId(0)), DType::F32);
            let l1 = body.push(Expr::Load(InputId((reads.len() - 1) as u32)), DType::F32);
            let v = body.push(Expr::Binary(op, l0, l1), DType::F32);
            Kernel {
                name: "k_ew".into(),
                kind: KernelKind::Elementwise(ElementwiseKernel {
                    space: vec![4],
                    inputs: reads.iter().map(|&b| Access::contiguous(b, &[4])).collect(),
                    body,
                    stores: vec![Store {
                        value: v,
                        access: Access::contiguous(out, &[4]),
                    }],
                }),
                nodes: vec![],
            }
        };
        let b_reads = if b_reads_x { vec![y, x] } else { vec![y] };
        p.kernels = vec![
            update(b_reads, b_out, BinaryOp::Add),
            update(vec![x], a_out, BinaryOp::Mul),
        ];
        p
    }

    #[test]
    fn independent_updates_share_a_launch_and_dependent_ones_do_not() {
        let (merged, r) = merge_updates(program(false));
        assert_eq!((r.updates, r.kernels, r.parts), (2, 1, 2));
        assert_eq!(merged.kernels.len(), 1);
        assert_eq!(merged.kernels[0].name, "k0_multi_tensor");
        crate::kernel::verify(&merged).unwrap();
        crate::train::donate::check(&merged).unwrap();
        // `b'` reads `x`, which `a'` is written over: one launch would race.
        let (kept, r) = merge_updates(program(true));
        assert_eq!((r.updates, r.kernels), (2, 0));
        assert_eq!(kept.kernels.len(), 2);
        crate::train::donate::check(&kept).unwrap();
    }

    /// Casts `c_i = x * 2` of a weight into temps, each read by a kernel after it: the
    /// casts of the weight run as one launch at the first one's position; a kernel
    /// whose output is large, or that reads a temp, stays.
    #[test]
    fn small_copies_of_weights_share_a_launch_at_the_first() {
        let mut p = Program::default();
        let ty = TensorType::new(DType::F32, [4]);
        let x = p.add_buffer(ty.clone(), BufferKind::Weight { name: "x".into() }, None);
        p.inputs = vec![];
        let ew = |p: &mut Program, reads: BufferId, ty: &TensorType| {
            let out = p.add_buffer(ty.clone(), BufferKind::Temp, None);
            let mut body = Body::default();
            let l = body.push(Expr::Load(InputId(0)), DType::F32);
            let v = body.push(Expr::Binary(BinaryOp::Add, l, l), DType::F32);
            let dims = ty.shape.dims().to_vec();
            let k = Kernel {
                name: "k_ew".into(),
                kind: KernelKind::Elementwise(ElementwiseKernel {
                    space: dims.clone(),
                    inputs: vec![Access::contiguous(reads, &dims)],
                    body,
                    stores: vec![Store {
                        value: v,
                        access: Access::contiguous(out, &dims),
                    }],
                }),
                nodes: vec![],
            };
            (k, out)
        };
        let (c0, o0) = ew(&mut p, x, &ty);
        let (u0, r0) = ew(&mut p, o0, &ty);
        let (c1, o1) = ew(&mut p, x, &ty);
        let (u1, r1) = ew(&mut p, o1, &ty);
        let (c2, o2) = ew(&mut p, x, &ty);
        let (u2, r2) = ew(&mut p, o2, &ty);
        // The peak: a large copy and its reader at the end (too large to move).
        let large = TensorType::new(DType::F32, [SMALL_CAST_BYTES as usize / 2]);
        let y = p.add_buffer(large.clone(), BufferKind::Weight { name: "y".into() }, None);
        let (cy, oy) = ew(&mut p, y, &large);
        let (uy, ry) = ew(&mut p, oy, &large);
        p.kernels = vec![c0, u0, c1, u1, c2, u2, cy, uy];
        p.outputs = vec![
            ("r0".into(), r0),
            ("r1".into(), r1),
            ("r2".into(), r2),
            ("ry".into(), ry),
        ];
        let (merged, n) = merge_small_casts(p.clone());
        // Holding c1's and c2's outputs longer keeps every step under the peak.
        assert_eq!(n, 3);
        assert_eq!(merged.kernels.len(), 6);
        assert_eq!(merged.kernels[0].name, "k0_multi_tensor");
        assert!(matches!(&merged.kernels[0].kind, KernelKind::MultiTensor(m) if m.parts.len() == 3));
        crate::kernel::verify(&merged).unwrap();
        // Without room under the peak nothing moves; outputs over the limit neither.
        p.kernels.truncate(6);
        p.outputs.truncate(3);
        assert_eq!(merge_small_casts(p).1, 0);
        let big = large;
        let mut q = Program::default();
        let w = q.add_buffer(big.clone(), BufferKind::Weight { name: "w".into() }, None);
        let (a, ao) = ew(&mut q, w, &big);
        let (ua, ra) = ew(&mut q, ao, &big);
        let (b, bo) = ew(&mut q, w, &big);
        let (ub, rb) = ew(&mut q, bo, &big);
        q.kernels = vec![a, ua, b, ub];
        q.outputs = vec![("a".into(), ra), ("b".into(), rb)];
        assert_eq!(merge_small_casts(q).1, 0);
    }
}
