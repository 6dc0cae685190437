//! Kernel boundaries: groups of fusion nodes that become one kernel each.
//!
//! Every compute node starts as its own group. Producer-consumer edges are then tried
//! in passes by kind (see [`Groups::fuse`]), within a pass the edge carrying the most
//! bytes first (ties in topological order), and two groups merge when (1) their iteration spaces agree
//! (elementwise over one shape; a row space `(shape, reduced axes)` whose members are
//! per element ("full") or per row; a matmul with elementwise epilogue over its output),
//! (2) every edge between them can be read inside the kernel (same element, or a row
//! value broadcast along the reduced axes), and (3) no path leaves and re-enters the
//! merged group, which would make the kernel graph cyclic. A value that some consumer
//! outside its group reads is stored; everything else stays in registers.

use std::collections::HashMap;

use super::nodes::{FKind, FNode, Operand};
use crate::kernel::contiguous_strides;
use graphc_ir::work::{self, Stage};

/// See [`Groups::joins_through_a_scalar`].
const SMALL: usize = 256;
const BIG: usize = 1 << 20;

/// Where a member of a row group lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Level {
    /// One value per element of the group's space.
    Full,
    /// One value per row (reduced axes removed, or kept as extent 1).
    Row,
}

/// The iteration space of a group.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Space {
    Elementwise(Vec<usize>),
    /// Full shape and the reduced axes (sorted).
    Row(Vec<usize>, Vec<usize>),
    /// A matmul and its epilogue over the output shape.
    MatMul(Vec<usize>),
    /// A convolution and its epilogue over the output shape.
    Conv(Vec<usize>),
    /// Not fusable.
    Single,
}

impl Space {
    fn of(n: &FNode) -> Space {
        match &n.kind {
            FKind::Ew(_) | FKind::Iota { .. } | FKind::Copy | FKind::Gather { .. } => {
                Space::Elementwise(n.dims().to_vec())
            }
            FKind::Reduce { axes, .. } => Space::Row(n.operands[0].dims.clone(), axes.clone()),
            FKind::MatMul => Space::MatMul(n.dims().to_vec()),
            FKind::Conv { .. } => Space::Conv(n.dims().to_vec()),
            _ => Space::Single,
        }
    }
}

/// The dims of one row (reduced axes removed) and the keepdims form.
pub fn row_shapes(full: &[usize], axes: &[usize]) -> (Vec<usize>, Vec<usize>) {
    let outer = (0..full.len()).filter(|k| !axes.contains(k)).map(|k| full[k]).collect();
    let keep = (0..full.len())
        .map(|k| if axes.contains(&k) { 1 } else { full[k] })
        .collect();
    (outer, keep)
}

pub struct Groups {
    parent: Vec<usize>,
    pub space: Vec<Space>,
    pub members: Vec<Vec<usize>>,
    pub level: Vec<Level>,
    /// Consumers of each node: (consumer, operand index).
    pub consumers: Vec<Vec<(usize, usize)>>,
    /// Smallest and largest member index of each group (nodes are in topological order).
    span: Vec<(usize, usize)>,
    /// The compute nodes that read a member of each group, and those a member reads:
    /// maybe stale (some may since have joined the group) and with repeats, since
    /// merging joins the lists without a scan; a walk drops the stale ones it reads.
    external: Vec<Vec<usize>>,
    producers: Vec<Vec<usize>>,
    /// Groups that must stay elementwise kernels (they hold a value written in place
    /// over an input: a training step's state update, [`Groups::keep_elementwise`]).
    ew_only: Vec<bool>,
    /// A training step's regions: groups merge only within one
    /// ([`Groups::set_update_region`], [`Groups::set_forward_region`]).
    region: Vec<Region>,
}

/// Where a node of a training step belongs, for fusion: a kernel computes for one
/// region only.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Region {
    /// Not a training step, or its backward pass.
    Other,
    /// What the loss depends on.
    Forward,
    /// The optimizer's update.
    Update,
}

/// Which way a walk over the group graph follows edges.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Direction {
    /// From producers to consumers (`external`).
    Forward,
    /// From consumers to producers (`producers`).
    Backward,
}

impl Groups {
    pub fn new(nodes: &[FNode]) -> Groups {
        let n = nodes.len();
        let mut consumers = vec![Vec::new(); n];
        for (c, node) in nodes.iter().enumerate() {
            work::add_len(Stage::Fuse, 1 + node.operands.len());
            if node.is_compute() {
                for (k, o) in node.operands.iter().enumerate() {
                    consumers[o.root].push((c, k));
                }
            }
        }
        Groups {
            parent: (0..n).collect(),
            space: nodes.iter().map(Space::of).collect(),
            members: (0..n).map(|i| vec![i]).collect(),
            level: nodes
                .iter()
                .map(|n| match n.kind {
                    FKind::Reduce { .. } => Level::Row,
                    _ => Level::Full,
                })
                .collect(),
            span: (0..n).map(|i| (i, i)).collect(),
            external: consumers
                .iter()
                .map(|cs| sorted_unique(cs.iter().map(|&(c, _)| c)))
                .collect(),
            producers: nodes
                .iter()
                .map(|node| {
                    let compute = node.operands.iter().map(|o| o.root);
                    sorted_unique(compute.filter(|&p| node.is_compute() && nodes[p].is_compute()))
                })
                .collect(),
            ew_only: vec![false; n],
            region: vec![Region::Other; n],
            consumers,
        }
    }

    /// Node `n`'s group stays an elementwise kernel: it never joins a matmul's
    /// epilogue or a row kernel (its value is written over an input in place, which
    /// only an elementwise kernel reading that input at the same element can do).
    pub fn keep_elementwise(&mut self, n: usize) {
        if let Some(f) = self.ew_only.get_mut(n) {
            *f = true;
        }
    }

    /// Mark a training step's optimizer update: the elementwise nodes computed only
    /// for the state outputs in `roots` (every consumer of such a node is one too, or
    /// it is a root). They fuse only with each other, so each parameter's update is
    /// one elementwise kernel reading its gradient as stored (its `(1 - beta) * g`
    /// never lands in the gradient's GEMM epilogue or row kernel as an extra stored
    /// value), and the kernels of different parameters are alike (one multi-tensor
    /// launch can run them, [`crate::train::multi`]). Call before [`Groups::fuse`].
    pub fn set_update_region(&mut self, nodes: &[FNode], roots: &[usize], stored: &[bool]) {
        let n = nodes.len();
        let mut root = vec![false; n];
        for &r in roots {
            if let Some(x) = root.get_mut(r) {
                *x = true;
            }
        }
        // Consumers come after their operands: decide from the last node back.
        for i in (0..n).rev() {
            let elementwise = matches!(nodes[i].kind, FKind::Ew(_) | FKind::Copy);
            let only_for_update = !stored[i]
                && !self.consumers[i].is_empty()
                && self.consumers[i].iter().all(|&(c, _)| self.region[c] == Region::Update);
            if elementwise && (root[i] || only_for_update) {
                self.region[i] = Region::Update;
            }
        }
    }

    /// Mark a training step's forward pass: the compute nodes `loss` depends on. They
    /// fuse only with each other, so no kernel of the forward pass computes a value
    /// for the backward pass alone (a GELU's derivative, a norm's backward products):
    /// stored there, such a value would live from the layer's forward to its backward
    /// beside the activations it is computed from. Call before [`Groups::fuse`] (and
    /// after [`Groups::set_update_region`]).
    pub fn set_forward_region(&mut self, nodes: &[FNode], loss: usize) {
        let mut stack = vec![loss];
        while let Some(i) = stack.pop() {
            if i >= nodes.len() || self.region[i] == Region::Forward {
                continue;
            }
            self.region[i] = Region::Forward;
            stack.extend(nodes[i].operands.iter().map(|o| o.root));
        }
    }

    pub fn find(&mut self, mut x: usize) -> usize {
        while self.parent[x] != x {
            self.parent[x] = self.parent[self.parent[x]];
            x = self.parent[x];
        }
        x
    }

    pub fn find_const(&self, mut x: usize) -> usize {
        while self.parent[x] != x {
            x = self.parent[x];
        }
        x
    }

    /// Merge greedily along producer-consumer edges, in three passes that follow the
    /// cost of each choice:
    ///
    /// 1. the elementwise ops a GEMM library applies for free (alpha scale, `+ bias`,
    ///    `+ C`, ReLU, tanh-GELU, in that order) join their matmul;
    /// 2. every other merge except into a matmul: an elementwise op the GEMM cannot do
    ///    costs a write and a read of the product as a matmul epilogue, but nothing as
    ///    the prologue of the row kernel that consumes it (masked attention scores
    ///    feeding a softmax);
    /// 3. the remaining matmul epilogues (generated, run after the GEMM).
    ///
    /// Within a pass, the edge carrying the most bytes goes first (a merge that makes a
    /// value internal saves writing and reading it, and a launch); ties in topological
    /// order. Passes repeat while merges happen, since a merge can make another legal.
    /// `stored[n]`: node `n` is a graph output (its value is written whatever happens).
    pub fn fuse(&mut self, nodes: &[FNode], stored: &[bool]) {
        let mut edges: Vec<(usize, usize, usize)> = Vec::new();
        for (c, node) in nodes.iter().enumerate() {
            if !node.is_compute() {
                continue;
            }
            work::add_len(Stage::Fuse, node.operands.len());
            for o in &node.operands {
                if nodes[o.root].is_compute() {
                    edges.push((nodes[o.root].ty.size_bytes(), o.root, c));
                }
            }
        }
        edges.sort_by(|a, b| b.0.cmp(&a.0).then(a.2.cmp(&b.2)).then(a.1.cmp(&b.1)));
        edges.dedup();

        // Pass 1: native GEMM epilogues, following each matmul's chain.
        for m in 0..nodes.len() {
            if !matches!(nodes[m].kind, FKind::MatMul) {
                continue;
            }
            let mut chain = Chain::default();
            let mut tip = m;
            loop {
                work::add_len(Stage::Fuse, 1 + self.consumers[tip].len());
                let users: Vec<usize> = self.consumers[tip].iter().map(|&(c, _)| c).collect();
                let [c] = users.as_slice() else { break };
                if stored[tip] || !chain.accepts(nodes, tip, &nodes[*c]) {
                    break;
                }
                if !self.try_merge(nodes, tip, *c) {
                    break;
                }
                tip = *c;
            }
        }
        // Passes 2 and 3.
        for into_matmul in [false, true] {
            for _round in 0..4 {
                let mut merged = false;
                work::add_len(Stage::Fuse, edges.len());
                for &(_, p, c) in &edges {
                    if !into_matmul && self.touches_matmul(p, c) {
                        continue;
                    }
                    merged |= self.try_merge(nodes, p, c);
                }
                if !merged {
                    break;
                }
            }
        }
    }

    /// Whether merging along `p -> c` would add to a matmul group.
    fn touches_matmul(&self, p: usize, c: usize) -> bool {
        let (gp, gc) = (self.find_const(p), self.find_const(c));
        let big = |s: &Space| matches!(s, Space::MatMul(_) | Space::Conv(_));
        gp != gc && (big(&self.space[gp]) || big(&self.space[gc]))
    }

    fn try_merge(&mut self, nodes: &[FNode], p: usize, c: usize) -> bool {
        let (gp, gc) = (self.find(p), self.find(c));
        if gp == gc {
            return false;
        }
        if self.region[gp] != self.region[gc] {
            return false;
        }
        if self.joins_through_a_scalar(nodes, gp, gc) {
            return false;
        }
        let Some((space, levels)) = self.combine(nodes, gp, gc) else {
            return false;
        };
        if (self.ew_only[gp] || self.ew_only[gc]) && !matches!(space, Space::Elementwise(_)) {
            return false;
        }
        let changed: HashMap<usize, Level> = levels.iter().copied().collect();
        let level_of = |n: usize| changed.get(&n).copied().unwrap_or(self.level[n]);
        // Every edge between the two groups must be readable in the kernel (edges inside
        // each were checked when it formed, and a group changes level as a whole). Walk
        // the smaller group's operands and consumers.
        let (small, big) = if self.members[gp].len() <= self.members[gc].len() {
            (gp, gc)
        } else {
            (gc, gp)
        };
        for &n in &self.members[small] {
            work::add_len(Stage::Fuse, 1 + nodes[n].operands.len() + self.consumers[n].len());
            for o in &nodes[n].operands {
                if self.find_const(o.root) == big
                    && !edge_ok(&space, nodes, o, &nodes[n], level_of(o.root), level_of(n))
                {
                    return false;
                }
            }
            for &(u, k) in &self.consumers[n] {
                if self.find_const(u) == big {
                    let o = &nodes[u].operands[k];
                    if !edge_ok(&space, nodes, o, &nodes[u], level_of(n), level_of(u)) {
                        return false;
                    }
                }
            }
        }
        if self.reaches_around(gp, gc) || self.reaches_around(gc, gp) {
            return false;
        }
        for (m, l) in levels {
            self.level[m] = l;
        }
        let (keep, gone) = (gp.min(gc), gp.max(gc));
        self.parent[gone] = keep;
        self.ew_only[keep] = self.ew_only[gp] || self.ew_only[gc];
        join(&mut self.members, keep, gone);
        join(&mut self.external, keep, gone);
        join(&mut self.producers, keep, gone);
        self.space[keep] = space;
        self.span[keep] = (
            self.span[gp].0.min(self.span[gc].0),
            self.span[gp].1.max(self.span[gc].1),
        );
        true
    }

    /// Whether `gc` reads `gp` only through values [`SMALL`] times smaller than its
    /// largest while both hold values of at least [`BIG`] elements: two large
    /// computations joined by a small value they share (the gradient's scalar seed and
    /// the class indices that every part of a loss computed in parts reads). One kernel
    /// would save a few bytes and a launch, and make every part's large values live at
    /// once; apart, the schedule runs them one by one.
    fn joins_through_a_scalar(&self, nodes: &[FNode], gp: usize, gc: usize) -> bool {
        let largest = |g: usize| self.members[g].iter().map(|&m| nodes[m].ty.numel()).max().unwrap_or(0);
        let (big_p, big_c) = (largest(gp), largest(gc));
        if big_p < BIG || big_c < BIG {
            return false;
        }
        let mut reads = false;
        for &n in &self.members[gc] {
            for o in &nodes[n].operands {
                if self.find_const(o.root) == gp {
                    if nodes[o.root].ty.numel().saturating_mul(SMALL) > big_c {
                        return false;
                    }
                    reads = true;
                }
            }
        }
        reads
    }

    /// The merged space, and the new levels of members that change level.
    fn combine(&self, nodes: &[FNode], a: usize, b: usize) -> Option<(Space, Vec<(usize, Level)>)> {
        use Space::*;
        let (sa, sb) = (&self.space[a], &self.space[b]);
        match (sa, sb) {
            (Elementwise(x), Elementwise(y)) if x == y => Some((sa.clone(), vec![])),
            (Elementwise(x), Row(full, axes)) | (Row(full, axes), Elementwise(x)) => {
                let ew = if matches!(sa, Elementwise(_)) { a } else { b };
                let (outer, keep) = row_shapes(full, axes);
                let level = if x == full {
                    Level::Full
                } else if *x == outer || *x == keep {
                    Level::Row
                } else {
                    return None;
                };
                // Row kernels take no gathers (their code generator reads rows directly),
                // and no index of a per-row value.
                if self.members[ew].iter().any(|&m| {
                    matches!(nodes[m].kind, FKind::Gather { .. })
                        || (level == Level::Row && matches!(nodes[m].kind, FKind::Iota { .. }))
                }) {
                    return None;
                }
                let row = if ew == a { b } else { a };
                Some((
                    self.space[row].clone(),
                    self.members[ew].iter().map(|&m| (m, level)).collect(),
                ))
            }
            (Row(f1, a1), Row(f2, a2)) if f1 == f2 && a1 == a2 => Some((sa.clone(), vec![])),
            (Conv(x), Elementwise(y)) | (Elementwise(y), Conv(x)) if x == y => {
                let conv = if matches!(sa, Conv(_)) { a } else { b };
                // An epilogue reads no index or gather (the convolution kernel's body
                // has the output's coordinates, but keep it to plain elementwise work).
                let plain = self.members[if conv == a { b } else { a }]
                    .iter()
                    .all(|&m| matches!(nodes[m].kind, FKind::Ew(_) | FKind::Copy));
                plain.then(|| (self.space[conv].clone(), vec![]))
            }
            (MatMul(x), Elementwise(y)) | (Elementwise(y), MatMul(x)) if x == y => {
                let mm = if matches!(sa, MatMul(_)) { a } else { b };
                Some((self.space[mm].clone(), vec![]))
            }
            // An epilogue written over a reshape of the product (`[b*s, n]` from a GEMM,
            // `[b, s, n]` after it, as exported linear layers are): the elementwise
            // group is re-indexed over the product's shape when every operand it reads
            // can be (no index or gather, every layout reshapes).
            (MatMul(x), Elementwise(y)) | (Elementwise(y), MatMul(x))
                if x.iter().product::<usize>() == y.iter().product::<usize>() =>
            {
                let (mm, ew) = if matches!(sa, MatMul(_)) { (a, b) } else { (b, a) };
                let respaced = self.members[ew].iter().all(|&m| {
                    matches!(nodes[m].kind, FKind::Ew(_) | FKind::Copy)
                        && nodes[m].operands.iter().all(|o| o.layout.reshape(&o.dims, x).is_some())
                });
                respaced.then(|| (self.space[mm].clone(), vec![]))
            }
            _ => None,
        }
    }

    /// Whether some path from group `from` reaches group `to` through another group.
    ///
    /// Walked from the end with fewer neighbours: a group reading one value that 100k
    /// nodes read (`cast(x)` in `Sum(x, ..., x)` at bf16) takes its readers in one by
    /// one, and a walk over all of them at every merge was quadratic; from the reader
    /// back to its few producers it is one step.
    fn reaches_around(&mut self, from: usize, to: usize) -> bool {
        if self.external[from].len() <= self.producers[to].len() {
            self.path_around(Direction::Forward, from, to)
        } else {
            self.path_around(Direction::Backward, to, from)
        }
    }

    /// Whether a path from group `start` along `dir` reaches group `goal` through
    /// another group. Only groups that can lie between the two are entered: forward,
    /// those starting before `goal` ends; backward, those ending after `goal` starts.
    fn path_around(&mut self, dir: Direction, start: usize, goal: usize) -> bool {
        let mut seen = std::collections::HashSet::new();
        let mut stack = vec![start];
        while let Some(g) = stack.pop() {
            let mut next = std::mem::take(&mut self.neighbours(dir)[g]);
            work::add_len(Stage::Fuse, 1 + next.len());
            next.retain(|&c| self.find_const(c) != g);
            let mut found = false;
            for &c in &next {
                let h = self.find_const(c);
                if h == start {
                    continue;
                }
                if h == goal {
                    found |= g != start;
                    continue;
                }
                let between = match dir {
                    Direction::Forward => self.span[h].0 <= self.span[goal].1,
                    Direction::Backward => self.span[h].1 >= self.span[goal].0,
                };
                if between && seen.insert(h) {
                    stack.push(h);
                }
            }
            self.neighbours(dir)[g] = next;
            if found {
                return true;
            }
        }
        false
    }

    /// Each group's neighbours along `dir`.
    fn neighbours(&mut self, dir: Direction) -> &mut [Vec<usize>] {
        match dir {
            Direction::Forward => &mut self.external,
            Direction::Backward => &mut self.producers,
        }
    }
}

/// The distinct values of `it`, sorted.
fn sorted_unique(it: impl Iterator<Item = usize>) -> Vec<usize> {
    let mut v: Vec<usize> = it.collect();
    v.sort_unstable();
    v.dedup();
    v
}

/// Moves list `gone` onto list `keep`, the shorter onto the longer (a group taking in
/// single nodes one by one copies one element per merge, not all it holds).
fn join(lists: &mut [Vec<usize>], keep: usize, gone: usize) {
    let mut moved = std::mem::take(&mut lists[gone]);
    if moved.len() > lists[keep].len() {
        std::mem::swap(&mut moved, &mut lists[keep]);
    }
    work::add_len(Stage::Fuse, moved.len());
    lists[keep].extend(moved);
}

/// The epilogue a GEMM library applies in its own kernel: `act(alpha * AB + C + bias)`.
#[derive(Default)]
struct Chain {
    scaled: bool,
    bias: bool,
    c: bool,
    act: bool,
}

impl Chain {
    /// Whether `next`, consuming the chain's value `tip`, extends the native epilogue
    /// (and record it).
    fn accepts(&mut self, nodes: &[FNode], tip: usize, next: &FNode) -> bool {
        let FKind::Ew(op) = &next.kind else { return false };
        let other = || next.operands.iter().find(|o| o.root != tip);
        match op {
            graphc_ir::Op::Unary(graphc_ir::UnaryOp::Relu | graphc_ir::UnaryOp::GeluTanh) if !self.act => {
                self.act = true;
                true
            }
            graphc_ir::Op::Binary(graphc_ir::BinaryOp::Mul) if !(self.scaled || self.bias || self.c || self.act) => {
                let scalar = other().is_some_and(|o| matches!(nodes[o.root].kind, FKind::Scalar(_)));
                self.scaled = scalar;
                scalar
            }
            graphc_ir::Op::Binary(graphc_ir::BinaryOp::Add) if !self.act => {
                let Some(o) = other() else { return false };
                if matches!(nodes[o.root].kind, FKind::Scalar(_)) {
                    return false;
                }
                let n = o.dims.len();
                let bias_like = n >= 1
                    && o.layout.strides[..n - 1].iter().all(|&s| s == 0)
                    && (o.dims[n - 1] == 1 || o.layout.strides[n - 1] == 1);
                if bias_like && !self.bias && !nodes[o.root].is_compute() {
                    self.bias = true;
                    true
                } else if !self.c && o.layout.is_contiguous(&o.dims) {
                    self.c = true;
                    true
                } else {
                    false
                }
            }
            _ => false,
        }
    }
}

/// Whether consumer `c` (at level `lc`) can read operand `o` (whose root is at level
/// `lp`) inside one kernel of space `space`.
fn edge_ok(space: &Space, nodes: &[FNode], o: &Operand, c: &FNode, lp: Level, lc: Level) -> bool {
    match &c.kind {
        FKind::MatMul | FKind::Conv { .. } | FKind::Single(_) | FKind::Gather { .. } => false,
        FKind::Reduce { .. } => lp == Level::Full && o.layout.is_contiguous(&o.dims),
        _ => match (lp, lc) {
            (Level::Full, Level::Full) => {
                let same_shape = nodes[o.root].dims() == o.dims.as_slice();
                // A matmul epilogue may read the product through a reshape (see
                // `combine`): the same elements in the same order.
                let reshaped =
                    matches!(space, Space::MatMul(_)) && nodes[o.root].ty.numel() == o.dims.iter().product::<usize>();
                o.layout.is_contiguous(&o.dims) && (same_shape || reshaped)
            }
            (Level::Row, Level::Row) => o.layout.is_contiguous(&o.dims),
            (Level::Row, Level::Full) => {
                let Space::Row(full, axes) = space else {
                    return false;
                };
                if o.dims != *full || o.layout.offset != 0 {
                    return false;
                }
                let (outer, _) = row_shapes(full, axes);
                let cs = contiguous_strides(&outer);
                let mut j = 0;
                for (k, (&d, &s)) in full.iter().zip(&o.layout.strides).enumerate() {
                    let want = if axes.contains(&k) {
                        0
                    } else {
                        j += 1;
                        cs[j - 1]
                    };
                    if d != 1 && s != want {
                        return false;
                    }
                }
                true
            }
            (Level::Full, Level::Row) => false,
        },
    }
}
