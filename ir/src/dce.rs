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
/// when unused, so the signature callers bind does not change.
pub fn eliminate_dead_code(graph: &Graph) -> (Graph, DceReport) {
    let mut live = vec![false; graph.len()];
    let mut stack: Vec<NodeId> = graph.outputs().iter().map(|o| o.node).collect();
    stack.extend(graph.inputs().iter().copied());
    while let Some(id) = stack.pop() {
        if std::mem::replace(&mut live[id.index()], true) {
            continue;
        }
        stack.extend(graph.node(id).inputs.iter().copied());
    }
    let mut out = Graph::new();
    let mut new_id = vec![None; graph.len()];
    let mut report = DceReport::default();
    for id in graph.ids() {
        let node = graph.node(id);
        if !live[id.index()] {
            report.nodes_removed += 1;
            if let Op::Parameter { name, .. } = &node.op {
                report.weights_removed.push(name.clone());
            }
            continue;
        }
        new_id[id.index()] = Some(out.len());
        if let Op::Parameter { name, .. } = &node.op {
            if let Some(w) = graph.weight(name) {
                out.set_weight(name.clone(), w.clone());
            }
        }
        let inputs = node
            .inputs
            .iter()
            .map(|i| NodeId(new_id[i.index()].expect("operands of live nodes are live") as u32))
            .collect();
        out.push(Node { inputs, ..node.clone() });
    }
    // `push` lists input nodes in table order; restore the original call order.
    let order: Vec<NodeId> = graph
        .inputs()
        .iter()
        .map(|i| NodeId(new_id[i.index()].expect("inputs are live") as u32))
        .collect();
    out.set_input_order(order);
    for o in graph.outputs() {
        out.add_output(
            o.name.clone(),
            NodeId(new_id[o.node.index()].expect("outputs are live") as u32),
        );
    }
    (out, report)
}
