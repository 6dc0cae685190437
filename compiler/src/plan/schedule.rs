//! Memory-aware scheduling: the order kernels run in decides which intermediates are
//! live at once, so the planner tries several valid orders and keeps the one whose peak
//! of live intermediate bytes is lowest.
//!
//! Candidates (every one a topological order of the kernels' buffer dependencies):
//! - `program`: the order fusion emitted (the graph's canonical order);
//! - `dfs`: depth-first post-order from the outputs, producers in operand order;
//! - `dfs:largest-first`: the same, visiting the producer of the largest operand first
//!   (its big result is then consumed sooner relative to the others);
//! - `dfs:heaviest-first`: the same, visiting first the producer whose subtree needs the
//!   most memory beyond its own result (the Sethi-Ullman order for expression trees:
//!   a subtree's `need` is the most it holds at once; producers are visited by
//!   `need - result` descending, so what stays live while the others run is small);
//! - `list:free-largest`: a list scheduler that, among ready kernels, runs the one that
//!   frees the most bytes net of what it allocates (frees: operands it is the last
//!   reader of);
//! - `bfs`: level by level (Kahn's algorithm), the widest order; usually the worst for
//!   memory, kept as a baseline;
//! - `program:hoist`: the program order, with every kernel that frees more bytes than
//!   it allocates run as soon as it can (its producers done, and it the last reader of
//!   what it frees): a training step's column reductions (a norm's scale gradient, a
//!   bias gradient: `[tokens, d]` read, `[d]` written) then run inside their layer's
//!   backward instead of wherever fusion emitted them, often at the end of the pass
//!   with every layer's products held until then.
//!
//! The peak counts intermediate temps only (graph outputs live outside the arena for the
//! whole run). Ties go to the earlier candidate in the list above, so the program order
//! is kept unless another order is strictly better.

use serde::{Deserialize, Serialize};

use crate::kernel::{BufferKind, Program};
use graphc_ir::work::{self, Stage};

/// A candidate kernel order (see the module doc); serialized as its name (`program`,
/// `dfs`, `dfs:largest-first`, `dfs:heaviest-first`, `list:free-largest`, `bfs`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Scheduler {
    /// The order fusion emitted.
    #[default]
    #[serde(rename = "program")]
    Program,
    #[serde(rename = "dfs")]
    Dfs,
    #[serde(rename = "dfs:largest-first")]
    DfsLargestFirst,
    #[serde(rename = "dfs:heaviest-first")]
    DfsHeaviestFirst,
    #[serde(rename = "list:free-largest")]
    ListFreeLargest,
    #[serde(rename = "bfs")]
    Bfs,
    #[serde(rename = "program:hoist")]
    ProgramHoist,
}

impl Scheduler {
    /// Every candidate, in the order [`schedule`] tries them (ties go to the earlier).
    pub const ALL: [Scheduler; 7] = [
        Scheduler::Program,
        Scheduler::Dfs,
        Scheduler::DfsLargestFirst,
        Scheduler::DfsHeaviestFirst,
        Scheduler::ListFreeLargest,
        Scheduler::Bfs,
        Scheduler::ProgramHoist,
    ];

    /// The candidate's name, as serialized.
    pub fn name(self) -> &'static str {
        match self {
            Scheduler::Program => "program",
            Scheduler::Dfs => "dfs",
            Scheduler::DfsLargestFirst => "dfs:largest-first",
            Scheduler::DfsHeaviestFirst => "dfs:heaviest-first",
            Scheduler::ListFreeLargest => "list:free-largest",
            Scheduler::Bfs => "bfs",
            Scheduler::ProgramHoist => "program:hoist",
        }
    }

    /// The order this candidate gives.
    fn order(self, deps: &Deps, k: usize) -> Vec<usize> {
        match self {
            Scheduler::Program => (0..k).collect(),
            Scheduler::Dfs => deps.dfs(Visit::InOrder),
            Scheduler::DfsLargestFirst => deps.dfs(Visit::LargestFirst),
            Scheduler::DfsHeaviestFirst => deps.dfs(Visit::HeaviestFirst),
            Scheduler::ListFreeLargest => deps.list(),
            Scheduler::Bfs => deps.bfs(),
            Scheduler::ProgramHoist => deps.hoist(&(0..k).collect::<Vec<_>>()),
        }
    }
}

impl std::fmt::Display for Scheduler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for Scheduler {
    type Err = String;

    fn from_str(s: &str) -> Result<Scheduler, String> {
        Scheduler::ALL
            .into_iter()
            .find(|c| c.name() == s)
            .ok_or_else(|| format!("unknown schedule `{s}`"))
    }
}

/// The chosen order and how every candidate did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Schedule {
    /// Kernel indices of the input program, in the order to run them: `order[pos]` is
    /// the original index of the kernel that runs at position `pos`. (A training step's
    /// program then has its updates merged, `crate::train::multi`: its kernels are
    /// fewer than this order's.)
    pub order: Vec<usize>,
    /// The winning candidate.
    pub name: Scheduler,
    /// Its peak of live intermediate bytes (unaligned; the plan's lower bound aligns).
    pub peak: u64,
    /// Every candidate tried, with its peak, in the order tried.
    pub candidates: Vec<(Scheduler, u64)>,
}

impl Schedule {
    /// Whether the order is the program's own (every kernel at its original position).
    pub fn is_identity(&self) -> bool {
        self.order.iter().enumerate().all(|(pos, &i)| pos == i)
    }

    /// `program` (the one this schedule was computed for) with its kernels in this
    /// order: the program itself when the order is its own, else [`apply_schedule`].
    pub fn apply(&self, program: Program) -> Program {
        if self.is_identity() {
            program
        } else {
            apply_schedule(&program, &self.order)
        }
    }
}

/// Who writes and reads what: the dependency structure the schedulers share.
struct Deps {
    /// Per kernel, the kernels it depends on (writers of buffers it reads), sorted.
    preds: Vec<Vec<usize>>,
    /// Per kernel, the kernels that depend on it, sorted.
    succs: Vec<Vec<usize>>,
    /// Per kernel, the arena-resident temps it reads and writes.
    reads: Vec<Vec<usize>>,
    writes: Vec<Vec<usize>>,
    /// Bytes of each buffer if it is an arena temp (a temp that is not an output), else 0.
    bytes: Vec<u64>,
}

impl Deps {
    fn new(program: &Program) -> Deps {
        let n = program.buffers.len();
        let k = program.kernels.len();
        let mut is_output = vec![false; n];
        for (_, b) in &program.outputs {
            if let Some(o) = is_output.get_mut(b.index()) {
                *o = true;
            }
        }
        let bytes: Vec<u64> = program
            .buffers
            .iter()
            .enumerate()
            .map(|(i, b)| match b.kind {
                BufferKind::Temp if !is_output[i] => b.ty.size_bytes() as u64,
                _ => 0,
            })
            .collect();
        let mut writer = vec![usize::MAX; n];
        let mut reads = Vec::with_capacity(k);
        let mut writes = Vec::with_capacity(k);
        for (i, kernel) in program.kernels.iter().enumerate() {
            work::add(Stage::Schedule, 1);
            let w: Vec<usize> = kernel.writes().iter().map(|b| b.index()).filter(|&b| b < n).collect();
            for &b in &w {
                if writer[b] == usize::MAX {
                    writer[b] = i;
                }
            }
            work::add_len(Stage::Schedule, w.len());
            writes.push(w);
            reads.push(
                kernel
                    .reads()
                    .iter()
                    .map(|b| b.index())
                    .filter(|&b| b < n)
                    .collect::<Vec<_>>(),
            );
        }
        let mut preds = vec![Vec::new(); k];
        let mut succs = vec![Vec::new(); k];
        for (i, r) in reads.iter().enumerate() {
            work::add_len(Stage::Schedule, r.len());
            for &b in r {
                let w = writer[b];
                if w != usize::MAX && w != i {
                    preds[i].push(w);
                    succs[w].push(i);
                }
            }
        }
        // A donated output's writer runs after every other reader of its input.
        for d in &program.donated {
            let w = writer.get(d.output.index()).copied().unwrap_or(usize::MAX);
            if w == usize::MAX {
                continue;
            }
            for (r, rd) in reads.iter().enumerate() {
                if r != w && rd.contains(&d.input.index()) {
                    preds[w].push(r);
                    succs[r].push(w);
                }
            }
        }
        for v in preds.iter_mut().chain(succs.iter_mut()) {
            v.sort_unstable();
            v.dedup();
        }
        Deps {
            preds,
            succs,
            reads,
            writes,
            bytes,
        }
    }

    /// Whether `order` is a permutation of the kernels that respects the dependencies.
    fn is_valid(&self, order: &[usize]) -> bool {
        let k = self.preds.len();
        if order.len() != k {
            return false;
        }
        let mut pos = vec![usize::MAX; k];
        for (t, &i) in order.iter().enumerate() {
            if i >= k || pos[i] != usize::MAX {
                return false;
            }
            pos[i] = t;
        }
        (0..k).all(|i| {
            work::add_len(Stage::Schedule, 1 + self.preds[i].len());
            self.preds[i].iter().all(|&p| pos[p] < pos[i])
        })
    }

    /// The peak of live arena bytes when kernels run in `order`: a temp is live from the
    /// step that writes it through the last step that reads it.
    fn peak(&self, order: &[usize]) -> u64 {
        self.live(order).into_iter().max().unwrap_or(0)
    }

    /// The live arena bytes at each step of `order` ([`Deps::peak`]'s count).
    fn live(&self, order: &[usize]) -> Vec<u64> {
        let n = self.bytes.len();
        let (mut first, mut last) = (vec![usize::MAX; n], vec![0usize; n]);
        for (t, &i) in order.iter().enumerate() {
            work::add_len(Stage::Schedule, 1 + self.writes[i].len() + self.reads[i].len());
            for &b in self.writes[i].iter().chain(&self.reads[i]) {
                if self.bytes[b] == 0 {
                    continue;
                }
                first[b] = first[b].min(t);
                last[b] = last[b].max(t);
            }
        }
        let mut delta = vec![0i128; order.len() + 1];
        for b in 0..n {
            if first[b] != usize::MAX {
                delta[first[b]] += i128::from(self.bytes[b]);
                delta[last[b] + 1] -= i128::from(self.bytes[b]);
            }
        }
        let mut live = 0i128;
        delta[..order.len()]
            .iter()
            .map(|d| {
                live += d;
                live.max(0) as u64
            })
            .collect()
    }

    /// Depth-first post-order from the kernels no other kernel depends on (in program
    /// order), each kernel's producers visited in index order, or largest result first.
    fn dfs(&self, visit: Visit) -> Vec<usize> {
        let k = self.preds.len();
        // The arena bytes a kernel writes, to order producers by.
        let out_bytes: Vec<u64> = self
            .writes
            .iter()
            .map(|w| w.iter().map(|&b| self.bytes[b]).fold(0, u64::saturating_add))
            .collect();
        let need = if visit == Visit::HeaviestFirst {
            self.need(&out_bytes)
        } else {
            Vec::new()
        };
        let children = |i: usize| -> Vec<usize> {
            work::add_len(Stage::Schedule, 1 + self.preds[i].len());
            let mut c = self.preds[i].clone();
            match visit {
                Visit::InOrder => {}
                Visit::LargestFirst => c.sort_by_key(|&p| (std::cmp::Reverse(out_bytes[p]), p)),
                Visit::HeaviestFirst => {
                    c.sort_by_key(|&p| (std::cmp::Reverse(need[p].saturating_sub(out_bytes[p])), p))
                }
            }
            c
        };
        let mut done = vec![false; k];
        let mut on_stack = vec![false; k];
        let mut order = Vec::with_capacity(k);
        let roots: Vec<usize> = (0..k).filter(|&i| self.succs[i].is_empty()).chain(0..k).collect();
        for root in roots {
            if done[root] {
                continue;
            }
            // Iterative post-order: (kernel, its children, next child).
            let mut stack: Vec<(usize, Vec<usize>, usize)> = vec![(root, children(root), 0)];
            on_stack[root] = true;
            while let Some((node, kids, next)) = stack.last_mut() {
                work::add(Stage::Schedule, 1);
                if *next < kids.len() {
                    let c = kids[*next];
                    *next += 1;
                    if !done[c] && !on_stack[c] {
                        on_stack[c] = true;
                        let grand = children(c);
                        stack.push((c, grand, 0));
                    }
                } else {
                    let node = *node;
                    done[node] = true;
                    on_stack[node] = false;
                    order.push(node);
                    stack.pop();
                }
            }
        }
        order
    }

    /// Per kernel, the Sethi-Ullman estimate of the most bytes its subtree holds at once
    /// when producers run heaviest first (shared producers counted in each consumer:
    /// an estimate for DAGs, exact for trees). Kernels are indexed in a valid order, so
    /// producers come first (a malformed program's back edges are ignored).
    fn need(&self, out_bytes: &[u64]) -> Vec<u64> {
        let k = self.preds.len();
        let mut need = vec![0u64; k];
        for i in 0..k {
            work::add_len(Stage::Schedule, 1 + self.preds[i].len());
            let mut kids: Vec<(u64, u64)> = self.preds[i]
                .iter()
                .filter(|&&p| p < i)
                .map(|&p| (need[p], out_bytes[p]))
                .collect();
            kids.sort_by_key(|&(n, o)| std::cmp::Reverse(n.saturating_sub(o)));
            let (mut held, mut most) = (0u64, 0u64);
            for (n, o) in kids {
                most = most.max(held.saturating_add(n));
                held = held.saturating_add(o);
            }
            need[i] = most.max(held.saturating_add(out_bytes[i]));
        }
        need
    }

    /// Kahn's algorithm, level by level, program order within a level.
    fn bfs(&self) -> Vec<usize> {
        let k = self.preds.len();
        let mut indeg: Vec<usize> = self.preds.iter().map(Vec::len).collect();
        let mut level: Vec<usize> = (0..k).filter(|&i| indeg[i] == 0).collect();
        let mut order = Vec::with_capacity(k);
        while !level.is_empty() {
            let mut next = Vec::new();
            for &i in &level {
                work::add_len(Stage::Schedule, 1 + self.succs[i].len());
                order.push(i);
                for &s in &self.succs[i] {
                    indeg[s] -= 1;
                    if indeg[s] == 0 {
                        next.push(s);
                    }
                }
            }
            next.sort_unstable();
            level = next;
        }
        order
    }

    /// The list scheduler: among ready kernels, the one with the largest
    /// `freed - allocated` bytes (ties: lowest index). Scores change only when a buffer
    /// drops to its last reader, so they are kept up to date in a heap (stale entries
    /// skipped): `O((k + reads) log k)`, not a scan of every ready kernel per step.
    /// `base` (a valid order) with every kernel that frees more arena bytes than it
    /// writes run as soon as it is ready and the last reader of what it frees: after
    /// each kernel, the kernels it made ready, or made the last reader of a buffer,
    /// run next when they free more than they write (and so on from them).
    fn hoist(&self, base: &[usize]) -> Vec<usize> {
        let k = self.preds.len();
        let n = self.bytes.len();
        let mut readers: Vec<Vec<usize>> = vec![Vec::new(); n];
        for (i, r) in self.reads.iter().enumerate() {
            let mut r = r.clone();
            r.sort_unstable();
            r.dedup();
            for b in r {
                readers[b].push(i);
            }
        }
        let mut readers_left: Vec<usize> = readers.iter().map(Vec::len).collect();
        let mut indeg: Vec<usize> = self.preds.iter().map(Vec::len).collect();
        let mut done = vec![false; k];
        let mut order = Vec::with_capacity(k);
        let writes_arena = |r: usize| self.writes[r].iter().any(|&b| self.bytes[b] > 0);
        // Whether running `i` now frees more than it allocates. What it writes counts
        // as freed at once when its every reader writes nothing to the arena and waits
        // only for `i` (an optimizer update reading a weight gradient: the GEMM and the
        // update together free the GEMM's operands).
        let frees_net = |i: usize, readers_left: &[usize], indeg: &[usize]| {
            let mut seen = Vec::new();
            let mut freed = 0u64;
            for &b in &self.reads[i] {
                if readers_left[b] == 1 && !seen.contains(&b) && !self.writes[i].contains(&b) {
                    seen.push(b);
                    freed = freed.saturating_add(self.bytes[b]);
                }
            }
            let alloc = self.writes[i]
                .iter()
                .filter(|&&b| {
                    !readers[b]
                        .iter()
                        .all(|&r| !writes_arena(r) && indeg[r] == usize::from(self.preds[r].binary_search(&i).is_ok()))
                        || readers[b].is_empty()
                })
                .map(|&b| self.bytes[b])
                .fold(0, u64::saturating_add);
            // Next to nothing allocated: running it now costs nothing and may make
            // another kernel ready, or the last reader of what it reads (an update's
            // step-size scalars, a bias gradient).
            freed > alloc || alloc <= HOIST_SMALL_BYTES
        };
        // Kernels ready from the start that cost nothing run first; then the base
        // order, each kernel followed by what it makes worth running. A base kernel
        // not ready when its turn comes (the base order breaks a donation's order)
        // waits, and runs as soon as it is.
        let first: Vec<usize> = (0..k)
            .filter(|&i| indeg[i] == 0 && frees_net(i, &readers_left, &indeg))
            .collect();
        let mut passed = vec![false; k];
        for start in first.into_iter().chain(base.iter().copied()) {
            if start >= k || done[start] {
                continue;
            }
            passed[start] = true;
            let mut stack = vec![start];
            while let Some(i) = stack.pop() {
                work::add(Stage::Schedule, 1);
                if done[i] || indeg[i] != 0 {
                    continue;
                }
                if i != start && !passed[i] && !frees_net(i, &readers_left, &indeg) {
                    continue;
                }
                done[i] = true;
                order.push(i);
                let mut woken = Vec::new();
                let mut reads = self.reads[i].clone();
                reads.sort_unstable();
                reads.dedup();
                work::add_len(Stage::Schedule, reads.len() + self.succs[i].len());
                for b in reads {
                    readers_left[b] -= 1;
                    if readers_left[b] == 1 && self.bytes[b] > 0 {
                        work::add_len(Stage::Schedule, readers[b].len());
                        woken.extend(readers[b].iter().copied().filter(|&r| !done[r]));
                    }
                }
                for &s in &self.succs[i] {
                    indeg[s] -= 1;
                    if indeg[s] == 0 {
                        woken.push(s);
                    }
                }
                // Pushed last runs first: the base order's own kernels come from
                // `base`; these are the extras.
                stack.extend(woken.into_iter().rev());
            }
        }
        order
    }

    fn list(&self) -> Vec<usize> {
        let k = self.preds.len();
        let n = self.bytes.len();
        let mut readers: Vec<Vec<usize>> = vec![Vec::new(); n];
        for (i, r) in self.reads.iter().enumerate() {
            for &b in r {
                readers[b].push(i);
            }
        }
        let mut readers_left: Vec<usize> = readers.iter().map(Vec::len).collect();
        // A temp nobody reads dies at once; it still takes memory at its step.
        let mut score: Vec<i128> = (0..k)
            .map(|i| {
                let freed: u64 = self.reads[i]
                    .iter()
                    .filter(|&&b| readers_left[b] == 1)
                    .map(|&b| self.bytes[b])
                    .fold(0, u64::saturating_add);
                let alloc: u64 = self.writes[i]
                    .iter()
                    .map(|&b| self.bytes[b])
                    .fold(0, u64::saturating_add);
                i128::from(freed) - i128::from(alloc)
            })
            .collect();
        let mut indeg: Vec<usize> = self.preds.iter().map(Vec::len).collect();
        let mut done = vec![false; k];
        let mut heap: std::collections::BinaryHeap<(i128, std::cmp::Reverse<usize>)> = (0..k)
            .filter(|&i| indeg[i] == 0)
            .map(|i| (score[i], std::cmp::Reverse(i)))
            .collect();
        let mut order = Vec::with_capacity(k);
        while let Some((s, std::cmp::Reverse(best))) = heap.pop() {
            work::add(Stage::Schedule, 1);
            if done[best] || s != score[best] {
                continue; // stale
            }
            done[best] = true;
            order.push(best);
            work::add_len(Stage::Schedule, self.reads[best].len() + self.succs[best].len());
            for &b in &self.reads[best] {
                readers_left[b] -= 1;
                if readers_left[b] == 1 && self.bytes[b] > 0 {
                    // Its one reader left now frees it.
                    work::add_len(Stage::Schedule, readers[b].len());
                    if let Some(&r) = readers[b].iter().find(|&&r| !done[r]) {
                        score[r] += i128::from(self.bytes[b]);
                        if indeg[r] == 0 {
                            heap.push((score[r], std::cmp::Reverse(r)));
                        }
                    }
                }
            }
            for &s in &self.succs[best] {
                indeg[s] -= 1;
                if indeg[s] == 0 {
                    heap.push((score[s], std::cmp::Reverse(s)));
                }
            }
        }
        order
    }
}

/// What [`Deps::hoist`] counts as allocating nothing (a few scalars, a bias's
/// gradient).
const HOIST_SMALL_BYTES: u64 = 4096;

/// How the DFS orders a kernel's producers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Visit {
    InOrder,
    LargestFirst,
    HeaviestFirst,
}

/// Every candidate order, in the order [`schedule`] tries them (an order of a malformed
/// program may be incomplete).
pub fn candidate_orders(program: &Program) -> Vec<(Scheduler, Vec<usize>)> {
    candidates(&Deps::new(program), program.kernels.len())
}

fn candidates(deps: &Deps, k: usize) -> Vec<(Scheduler, Vec<usize>)> {
    Scheduler::ALL.into_iter().map(|c| (c, c.order(deps, k))).collect()
}

/// Try every candidate order and keep the lowest peak (see the module doc).
pub fn schedule(program: &Program) -> Schedule {
    let deps = Deps::new(program);
    let k = program.kernels.len();
    let candidates = candidates(&deps, k);
    let mut best: Option<(u64, usize)> = None;
    let mut tried = Vec::new();
    for (c, (name, order)) in candidates.iter().enumerate() {
        // A malformed program (a cycle through buffers) can make an order incomplete:
        // such a candidate is skipped. The program order too, when it runs a donated
        // output's writer before another reader of its input (fusion emits in graph
        // order, which knows no donation); it stays the fallback when no order is valid.
        if !deps.is_valid(order) {
            continue;
        }
        let peak = deps.peak(order);
        tried.push((*name, peak));
        if best.is_none_or(|(p, _)| peak < p) {
            best = Some((peak, c));
        }
    }
    let (peak, c) = best.unwrap_or_else(|| (candidates.first().map_or(0, |(_, o)| deps.peak(o)), 0));
    let (name, order) = candidates
        .into_iter()
        .nth(c)
        .unwrap_or((Scheduler::Program, (0..k).collect()));
    Schedule {
        order,
        name,
        peak,
        candidates: tried,
    }
}

/// The live arena bytes at each step of `program` run in its own order (a temp that
/// is not an output is live from the step that writes it through its last reader),
/// whose maximum is the peak [`schedule`] minimizes.
pub fn live_bytes(program: &Program) -> Vec<u64> {
    let deps = Deps::new(program);
    deps.live(&(0..program.kernels.len()).collect::<Vec<_>>())
}

/// `program` with its kernels in `order` (a permutation of its kernel indices: `order[pos]`
/// is the original index of the kernel to run at `pos`), renamed so that kernel names
/// still start with their position (`k3_...`).
/// The program order made valid: a topological order of the kernels' dependencies
/// (including donations) that runs, of the kernels ready, the one earliest in the
/// program first. A valid program order is returned unchanged; a kernel that must
/// move (a reader now before its writer) moves only as late as it has to.
pub fn stable_order(program: &Program) -> Vec<usize> {
    let deps = Deps::new(program);
    let k = program.kernels.len();
    let mut waiting: Vec<usize> = deps.preds.iter().map(Vec::len).collect();
    let mut ready: std::collections::BinaryHeap<std::cmp::Reverse<usize>> =
        (0..k).filter(|&i| waiting[i] == 0).map(std::cmp::Reverse).collect();
    let mut order = Vec::with_capacity(k);
    while let Some(std::cmp::Reverse(i)) = ready.pop() {
        order.push(i);
        for &s in &deps.succs[i] {
            waiting[s] -= 1;
            if waiting[s] == 0 {
                ready.push(std::cmp::Reverse(s));
            }
        }
    }
    // A cycle (no valid order) leaves kernels out: keep the program's order, which
    // verification then reports.
    if order.len() < k {
        return (0..k).collect();
    }
    order
}

pub fn apply_schedule(program: &Program, order: &[usize]) -> Program {
    let mut out = program.clone();
    out.kernels = order
        .iter()
        .enumerate()
        .map(|(pos, &i)| {
            let mut kernel = program.kernels[i].clone();
            kernel.name = rename(&kernel.name, i, pos);
            kernel
        })
        .collect();
    out
}

/// The name of the kernel at original index `from`, moved to position `to`: fusion names
/// kernels by their index (`k12_row_softmax` at 12), so that prefix becomes the new
/// position (`k3_row_softmax`); a name without it gets a `k3_` prefix.
pub(crate) fn rename(name: &str, from: usize, to: usize) -> String {
    let rest = name
        .strip_prefix(&format!("k{from}"))
        .filter(|r| !r.starts_with(|c: char| c.is_ascii_digit()));
    match rest {
        Some(r) => format!("k{to}{r}"),
        None => format!("k{to}_{name}"),
    }
}

#[cfg(test)]
mod tests;
