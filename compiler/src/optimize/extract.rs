//! Extraction: one e-node per e-class, chosen by a sharing-aware cost, acyclic by
//! construction.
//!
//! Classes are finalized cheapest first (Knuth's lightest-derivation order, the
//! generalization of Dijkstra's algorithm): a node becomes eligible once all its
//! children's classes are finalized, with its total cost; eligible nodes wait in a
//! priority queue, and the cheapest one finalizes its class (a class's later, dearer
//! nodes are skipped). A class's cost is its node's own cost plus each child's cost
//! divided by the child's number of parent classes, so a value used in many places is
//! paid for about once (tree costs count it once per use and blow up exponentially on
//! residual chains). Finalizing children first makes the selection acyclic without a
//! separate check; taking the cheapest eligible node first (not the first to become
//! eligible) lets a deeper but cheaper derivation win: `broadcast(op(small))` over
//! `op` at full size. `O(n log n)` in the e-graph's size; ties break by class id, then
//! node index, so the result is deterministic.

use std::cmp::{Ordering, Reverse};
use std::collections::{BinaryHeap, HashMap};

use egg::Id;
use graphc_ir::work::{self, Stage};
use graphc_ir::Op;

use super::analysis::TEGraph;
use super::lang::TNode;

/// Own cost of an e-node: views and leaves are cheap; computing ops cost a launch plus
/// their output size, scaled up for the slow ones (division, powers, transcendental
/// functions); materialized constants cost their size.
pub fn node_cost(eg: &TEGraph, class: Id, node: &TNode) -> f64 {
    use graphc_ir::{BinaryOp, UnaryOp};
    let bytes = eg[class].data.ty.size_bytes() as f64 / (1 << 20) as f64;
    match node.op() {
        Op::Input { .. } | Op::Parameter { .. } => 0.1,
        Op::Constant { .. } => 0.1 + bytes,
        // Below any constant: an iota folded to a constant (a small one) stays an
        // iota, which kernels compute from their index instead of reading memory.
        Op::Iota { .. } => 0.05,
        Op::Reshape { .. } | Op::Broadcast { .. } => 0.5,
        Op::Binary(BinaryOp::Pow) => 2.0 * (1.0 + bytes),
        Op::Binary(BinaryOp::Div | BinaryOp::Mod | BinaryOp::Fmod) => 1.2 * (1.0 + bytes),
        Op::Unary(
            UnaryOp::Exp
            | UnaryOp::Log
            | UnaryOp::Tanh
            | UnaryOp::Erf
            | UnaryOp::Sin
            | UnaryOp::Cos
            | UnaryOp::Sigmoid
            | UnaryOp::Gelu
            | UnaryOp::GeluTanh
            | UnaryOp::Silu,
        ) => 1.2 * (1.0 + bytes),
        _ => 1.0 + bytes,
    }
}

/// The chosen node of every class reachable from the graph (finalized classes).
pub fn extract(eg: &TEGraph) -> HashMap<Id, TNode> {
    let classes: Vec<Id> = eg.classes().map(|c| c.id).collect();
    // Parent classes of each class, and for each (class, node index) its pending children.
    let mut parents: HashMap<Id, Vec<(Id, usize)>> = HashMap::new();
    let mut pending: HashMap<(Id, usize), usize> = HashMap::new();
    let mut eligible: Vec<(Id, usize)> = Vec::new();
    let mut fan_out: HashMap<Id, usize> = HashMap::new();
    for &c in &classes {
        // A child's fan-out counts parent classes, not the several nodes of one class
        // that read it (alternatives, of which extraction keeps one).
        let mut class_kids: Vec<Id> = eg[c]
            .nodes
            .iter()
            .flat_map(|n| n.children.iter().map(|&k| eg.find(k)))
            .collect();
        class_kids.sort();
        class_kids.dedup();
        for &k in &class_kids {
            *fan_out.entry(k).or_default() += 1;
        }
        for (i, n) in eg[c].nodes.iter().enumerate() {
            work::add_len(Stage::Extract, 1 + n.children.len());
            let mut kids: Vec<Id> = n.children.iter().map(|&k| eg.find(k)).collect();
            kids.sort();
            kids.dedup();
            for &k in &kids {
                parents.entry(k).or_default().push((c, i));
            }
            if kids.is_empty() {
                eligible.push((c, i));
            } else {
                pending.insert((c, i), kids.len());
            }
        }
    }
    let mut cost: HashMap<Id, f64> = HashMap::new();
    let mut chosen: HashMap<Id, TNode> = HashMap::new();
    let total = |cost: &HashMap<Id, f64>, c: Id, i: usize| -> f64 {
        let n = &eg[c].nodes[i];
        let shared: f64 = n
            .children
            .iter()
            .map(|&k| {
                let k = eg.find(k);
                cost[&k] / fan_out.get(&k).copied().unwrap_or(1).max(1) as f64
            })
            .sum();
        node_cost(eg, c, n) + shared
    };
    let mut queue: BinaryHeap<Reverse<Eligible>> = eligible
        .into_iter()
        .map(|(c, i)| Reverse(Eligible(total(&cost, c, i), c, i)))
        .collect();
    while let Some(Reverse(Eligible(t, c, i))) = queue.pop() {
        work::add(Stage::Extract, 1);
        if chosen.contains_key(&c) {
            continue;
        }
        cost.insert(c, t);
        chosen.insert(c, eg[c].nodes[i].clone());
        for &(p, j) in parents.get(&c).map(Vec::as_slice).unwrap_or(&[]) {
            work::add(Stage::Extract, 1);
            if let Some(left) = pending.get_mut(&(p, j)) {
                *left -= 1;
                if *left == 0 && !chosen.contains_key(&p) {
                    queue.push(Reverse(Eligible(total(&cost, p, j), p, j)));
                }
            }
        }
    }
    chosen
}

/// An eligible node: its total cost, class and index, ordered by cost (a total order
/// on the floats), then class, then index.
struct Eligible(f64, Id, usize);

impl PartialEq for Eligible {
    fn eq(&self, other: &Eligible) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}

impl Eq for Eligible {}

impl PartialOrd for Eligible {
    fn partial_cmp(&self, other: &Eligible) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Eligible {
    fn cmp(&self, other: &Eligible) -> Ordering {
        self.0
            .total_cmp(&other.0)
            .then_with(|| self.1.cmp(&other.1))
            .then_with(|| self.2.cmp(&other.2))
    }
}
