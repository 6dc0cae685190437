//! Dead-code elimination: keep what the outputs reach, drop the rest (and the weights
//! only dead parameters used).

use crate::{Graph, Node, NodeId, Op};

/// What [`eliminate_dead_code`] removed.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DceReport {
    pub nodes_removed: usize,
    /// Names of parameters no output uses, whose data was dropped.
    pub weights_removed: Vec<String>,
}

/// The graph restricted to nodes some output depends on. Graph inputs are kept even
/// when unused, so the signature callers bind does not change. Live nodes keep their
/// relative table order, wherever their operands sit in the table.
///
/// Meant for verified graphs; on any other it does not panic: an operand, input or
/// output naming no node stays a reference to no node (`NodeId(u32::MAX)`), which
/// [`Graph::verify`] rejects.
pub fn eliminate_dead_code(graph: &Graph) -> (Graph, DceReport) {
    let n = graph.len();
    let mut live = vec![false; n];
    let mut stack: Vec<NodeId> = graph.outputs().iter().map(|o| o.node).collect();
    stack.extend(graph.inputs().iter().copied());
    while let Some(id) = stack.pop() {
        match live.get_mut(id.index()) {
            Some(l) if !*l => *l = true,
            _ => continue,
        }
        stack.extend(graph.node(id).inputs.iter().copied());
    }
    // New ids first, so operands may come before or after their users in the table.
    let mut new_id = vec![NodeId(u32::MAX); n];
    for (next, (i, _)) in live.iter().enumerate().filter(|(_, l)| **l).enumerate() {
        if let Some(slot) = new_id.get_mut(i) {
            *slot = NodeId(next as u32);
        }
    }
    let remap = |id: NodeId| new_id.get(id.index()).copied().unwrap_or(NodeId(u32::MAX));
    let mut out = Graph::new();
    let mut report = DceReport::default();
    for id in graph.ids() {
        let node = graph.node(id);
        if !live.get(id.index()).copied().unwrap_or(false) {
            report.nodes_removed += 1;
            if let Op::Parameter { name, .. } = &node.op {
                report.weights_removed.push(name.clone());
            }
            continue;
        }
        if let Op::Parameter { name, .. } = &node.op {
            if let Some(w) = graph.weight(name) {
                out.set_weight(name.clone(), w.clone());
            }
        }
        let inputs = node.inputs.iter().map(|&i| remap(i)).collect();
        out.push(Node { inputs, ..node.clone() });
    }
    // `push` lists input nodes in table order; restore the original call order.
    out.set_input_order(graph.inputs().iter().map(|&i| remap(i)).collect());
    for o in graph.outputs() {
        out.add_output(o.name.clone(), remap(o.node));
    }
    (out, report)
}
