//! Low-precision copies of the parameters made twice rather than held across the
//! step.
//!
//! With mixed precision a matmul reads its f32 parameter through a cast to bf16/f16
//! (`torch.autocast` makes the same copy). The forward pass and the backward pass both
//! read that copy (`dx = dy · Wᵀ`), so as one value it would live from the layer's
//! forward to its backward: every parameter's low-precision copy held across the step
//! (710 MB for GPT-2-medium in bf16). [`recompute_parameter_casts`] gives the backward
//! readers a copy of their own, made again from the parameter where they read it: the
//! copies are short-lived temporaries, at the cost of one more cast of each parameter
//! (2 + 4 bytes per element read and written, against a GEMM that reads the copy).
//!
//! Run after the last optimizer run (the e-graph would merge the two copies again),
//! before fusion. A node is a *parameter cast* when it is a cast or a view whose
//! operands are state inputs or parameter casts; the forward pass is what the `loss`
//! output depends on.

use std::collections::HashSet;

use graphc_ir::{Graph, GraphError, Node, NodeId, Op};

use super::{State, LOSS_OUTPUT};

mod layers;

pub use layers::{
    matmul_flops, recompute_layers, recompute_tensors, subsets_by_flops, tensor_candidates, LayerRemat, TensorPick,
    EXACT_ITEMS,
};

/// `graph` with every parameter cast read by both passes made again for the
/// backward's readers; and how many were.
pub fn recompute_parameter_casts(graph: &Graph, state: &State) -> Result<(Graph, usize), GraphError> {
    let n = graph.len();
    let state_names: HashSet<&str> = state.slots.iter().map(|s| s.name.as_str()).collect();
    let order = graph.topo_order()?;
    // Parameter casts, in topological order.
    let mut cast = vec![false; n];
    for &id in &order {
        let node = graph.node(id);
        let of_params = |g: &Graph| {
            !node.inputs.is_empty()
                && node.inputs.iter().all(|&i| {
                    cast[i.index()]
                        || matches!(&g.node(i).op, Op::Input { name, .. } if state_names.contains(name.as_str()))
                })
        };
        cast[id.index()] = matches!(
            node.op,
            Op::Cast { .. } | Op::Reshape { .. } | Op::Transpose { .. } | Op::Broadcast { .. } | Op::Slice { .. }
        ) && of_params(graph)
            // A cast between float types only (a view of a parameter alone is free).
            && (matches!(node.op, Op::Cast { .. }) || node.inputs.iter().any(|&i| cast[i.index()]));
    }
    let forward = forward_of(graph);
    // Casts a backward node reads (directly) that the forward pass computes.
    let users = graph.users();
    let shared =
        |id: NodeId| cast[id.index()] && forward[id.index()] && users[id.index()].iter().any(|&u| !forward[u.index()]);
    if !(0..n).any(|i| shared(NodeId(i as u32))) {
        return Ok((graph.clone(), 0));
    }
    let mut out = Graph::new();
    let mut map: Vec<Option<NodeId>> = vec![None; n];
    // The backward's copy of a parameter cast (and of the casts it is made from).
    let mut again: Vec<Option<NodeId>> = vec![None; n];
    let mut made = 0;
    for &id in &order {
        let node = graph.node(id);
        // A backward node (a view of a cast the backward makes is one too).
        let backward = !forward[id.index()];
        let mut inputs = Vec::with_capacity(node.inputs.len());
        for &i in &node.inputs {
            let new = if backward && shared(i) {
                copy(graph, &mut out, &map, &cast, &mut again, i, &mut made)?
            } else {
                map[i.index()].expect("operands come first in topological order")
            };
            inputs.push(new);
        }
        let new = out.push(Node { inputs, ..node.clone() });
        map[id.index()] = Some(new);
    }
    finish(graph, &mut out, &map);
    Ok((out, made))
}

/// The backward's copy of parameter cast `id` (its cast operands copied too; state
/// inputs shared), made once.
fn copy(
    graph: &Graph,
    out: &mut Graph,
    map: &[Option<NodeId>],
    cast: &[bool],
    again: &mut [Option<NodeId>],
    id: NodeId,
    made: &mut usize,
) -> Result<NodeId, GraphError> {
    if let Some(c) = again[id.index()] {
        return Ok(c);
    }
    let node = graph.node(id);
    let mut inputs = Vec::with_capacity(node.inputs.len());
    for &i in &node.inputs {
        inputs.push(if cast[i.index()] {
            copy(graph, out, map, cast, again, i, made)?
        } else {
            map[i.index()].expect("operands come first in topological order")
        });
    }
    let name = node.name.as_ref().map(|n| format!("backward/{n}"));
    let c = out.add(node.op.clone(), inputs, name)?;
    if matches!(node.op, Op::Cast { .. }) {
        *made += 1;
    }
    again[id.index()] = Some(c);
    Ok(c)
}

/// Saved activations that are elementwise functions of values the backward has
/// anyway (or of fewer bytes of values it does not), computed again in the backward
/// pass instead of stored across the step: a layer norm's centered and normalized
/// input in f32 (again from its bf16 input and the row statistics: 8 bytes an element
/// saved for 2), the GELU's output beside its input. [`recompute_saved_elementwise`]
/// decides from the last forward value to the first: a value is recomputed when the
/// bytes its operands add to what the backward keeps are fewer than its own.
pub fn recompute_saved_elementwise(graph: &Graph) -> Result<(Graph, usize), GraphError> {
    let n = graph.len();
    let order = graph.topo_order()?;
    let forward = forward_of(graph);
    let users = graph.users();
    // Whether the backward reads a node (directly, or through a recomputed node).
    let mut kept = vec![false; n];
    for (i, us) in users.iter().enumerate() {
        kept[i] = forward[i] && us.iter().any(|u| !forward[u.index()]);
    }
    let bytes = |id: NodeId| graph.node(id).ty.size_bytes() as u64;
    // The stored value behind views (a view is no buffer).
    let base = |mut id: NodeId| {
        while is_view(&graph.node(id).op) {
            id = graph.node(id).inputs[0];
        }
        id
    };
    for i in 0..n {
        if kept[i] {
            let b = base(NodeId(i as u32));
            kept[b.index()] = true;
        }
    }
    let mut again = vec![false; n];
    let mut count = 0;
    for &id in order.iter().rev() {
        let i = id.index();
        if !kept[i] || again[i] || !is_cheap(&graph.node(id).op) {
            continue;
        }
        let plan = Recompute {
            graph,
            kept: &kept,
            base: &base,
        };
        let (added, chain) = plan.cost_of_recomputing(id, MAX_DEPTH);
        if added < bytes(id) {
            // The chain is made again; what it reads is kept.
            for &c in &chain {
                if !again[c.index()] {
                    again[c.index()] = true;
                    count += 1;
                }
            }
            for &c in &chain {
                for &op in &graph.node(c).inputs {
                    let b = base(op);
                    if !again[b.index()] && !is_source(&graph.node(b).op) {
                        kept[b.index()] = true;
                    }
                }
            }
        }
    }
    if count == 0 {
        return Ok((graph.clone(), 0));
    }
    let (out, _) = rebuild(graph, &order, &forward, &again)?;
    Ok((out, count))
}

/// `graph` rebuilt so that backward readers of a value in `again` read its copy (made
/// from the copies of its recomputed operands and the originals of the rest, right
/// before the first reader); and which nodes got a copy.
fn rebuild(
    graph: &Graph,
    order: &[NodeId],
    forward: &[bool],
    again: &[bool],
) -> Result<(Graph, Vec<Option<NodeId>>), GraphError> {
    let n = graph.len();
    let mut out = Graph::new();
    let mut map: Vec<Option<NodeId>> = vec![None; n];
    let mut copies: Vec<Option<NodeId>> = vec![None; n];
    for &id in order {
        let node = graph.node(id);
        let backward = !forward[id.index()];
        let mut inputs = Vec::with_capacity(node.inputs.len());
        for &i in &node.inputs {
            inputs.push(if backward {
                backward_value(graph, &mut out, &map, again, &mut copies, i)?
            } else {
                map[i.index()].expect("operands come first in topological order")
            });
        }
        map[id.index()] = Some(out.push(Node { inputs, ..node.clone() }));
    }
    finish(graph, &mut out, &map);
    Ok((out, copies))
}

/// The LM head's logits of a loss computed in parts ([`super::build_loss_in_parts`]):
/// every forward matmul output of `classes` columns that feeds no other matmul (only
/// the loss reads it), with what the loss computes from it at its shape, is made again
/// where the backward reads it, from the part's hidden rows, instead of held from the forward to the
/// backward, so that each part's logits live only while its loss is computed and
/// while its gradient is. Returns how many were.
pub fn recompute_loss_chunks(graph: &Graph, classes: usize) -> Result<(Graph, LossParts), GraphError> {
    let n = graph.len();
    let order = graph.topo_order()?;
    let forward = forward_of(graph);
    let users = graph.users();
    // Whether a forward value feeds a matmul of the forward (the loss's logits do not:
    // only the loss reads them; a layer's output of as many columns does).
    let mut feeds_matmul = vec![false; n];
    for &id in order.iter().rev() {
        let i = id.index();
        feeds_matmul[i] = users[i]
            .iter()
            .filter(|u| forward[u.index()])
            .any(|u| matches!(graph.node(*u).op, Op::MatMul) || feeds_matmul[u.index()]);
    }
    let mut again = vec![false; n];
    for &id in &order {
        let i = id.index();
        let node = graph.node(id);
        if !forward[i] || node.ty.shape.dims().last() != Some(&classes) {
            continue;
        }
        if matches!(node.op, Op::MatMul) {
            again[i] = !feeds_matmul[i];
        } else if !matches!(node.op, Op::MatMul)
            && node
                .inputs
                .iter()
                .any(|&op| again[op.index()] && graph.node(op).ty.shape == node.ty.shape)
        {
            // What the loss computes from them at their shape (the logits less their
            // row maximum that the softmax's backward reads): made again with them.
            again[i] = true;
        }
    }
    if !again.iter().any(|&a| a) {
        return Ok((graph.clone(), LossParts::default()));
    }
    let (out, copies) = rebuild(graph, &order, &forward, &again)?;
    let copied: Vec<usize> = (0..n)
        .filter(|&i| copies[i].is_some() && matches!(graph.nodes()[i].op, Op::MatMul))
        .collect();
    if copied.is_empty() {
        return Ok((graph.clone(), LossParts::default()));
    }
    let flops = |i: usize| matmul_flops(graph, NodeId(i as u32));
    Ok((
        out,
        LossParts {
            parts: copied.len(),
            extra_flops: copied.iter().map(|&i| flops(i)).sum(),
            step_flops: (0..n).map(flops).sum(),
        },
    ))
}

/// What [`recompute_loss_chunks`] did: the parts' logits made again, and the GEMM
/// FLOPs that adds to the step's.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct LossParts {
    pub parts: usize,
    pub extra_flops: u64,
    pub step_flops: u64,
}

impl LossParts {
    /// `the LM head and the cross-entropy in 13 parts of the tokens, ...`.
    pub fn text(&self) -> String {
        format!(
            "the LM head and the cross-entropy in {} parts of the tokens, each part's logits made again in its \
             backward (+{:.1}% of the step's GEMM and attention FLOPs): one part's logits and their gradient live \
             at a time",
            self.parts,
            100.0 * self.extra_flops as f64 / self.step_flops.max(1) as f64
        )
    }
}

/// How deep a chain of elementwise ops [`recompute_saved_elementwise`] makes again.
const MAX_DEPTH: usize = 6;

struct Recompute<'a, F: Fn(NodeId) -> NodeId> {
    graph: &'a Graph,
    kept: &'a [bool],
    base: &'a F,
}

impl<F: Fn(NodeId) -> NodeId> Recompute<'_, F> {
    /// The bytes the backward must keep to compute `id` again (its operands' stored
    /// values not kept already, or what computing those again needs, whichever is
    /// less), and the nodes computed again (`id` first).
    fn cost_of_recomputing(&self, id: NodeId, depth: usize) -> (u64, Vec<NodeId>) {
        let mut added = 0u64;
        let mut chain = vec![id];
        let mut seen: Vec<NodeId> = Vec::new();
        for &op in &self.graph.node(id).inputs {
            let b = (self.base)(op);
            if seen.contains(&b) || self.kept[b.index()] || is_source(&self.graph.node(b).op) {
                continue;
            }
            seen.push(b);
            let stored = self.graph.node(b).ty.size_bytes() as u64;
            if depth > 0 && is_cheap(&self.graph.node(b).op) {
                let (deeper, sub) = self.cost_of_recomputing(b, depth - 1);
                if deeper < stored {
                    added = added.saturating_add(deeper);
                    chain.extend(sub);
                    continue;
                }
            }
            added = added.saturating_add(stored);
        }
        (added, chain)
    }
}

/// The value a backward node reads for `id`: a copy when `id` (or a view's base) is
/// recomputed, else the forward's.
fn backward_value(
    graph: &Graph,
    out: &mut Graph,
    map: &[Option<NodeId>],
    again: &[bool],
    copies: &mut [Option<NodeId>],
    id: NodeId,
) -> Result<NodeId, GraphError> {
    if let Some(c) = copies[id.index()] {
        return Ok(c);
    }
    let node = graph.node(id);
    // An iota is computed where it is read (never stored for another pass).
    let recompute = again[id.index()]
        || matches!(node.op, Op::Iota { .. })
        || (is_view(&node.op) && depends_on_copy(graph, again, id));
    if !recompute {
        return Ok(map[id.index()].expect("operands come first in topological order"));
    }
    let mut inputs = Vec::with_capacity(node.inputs.len());
    for &i in &node.inputs {
        inputs.push(backward_value(graph, out, map, again, copies, i)?);
    }
    let name = node.name.as_ref().map(|n| format!("backward/recompute/{n}"));
    let c = out.add(node.op.clone(), inputs, name)?;
    copies[id.index()] = Some(c);
    Ok(c)
}

fn depends_on_copy(graph: &Graph, again: &[bool], mut id: NodeId) -> bool {
    while is_view(&graph.node(id).op) {
        id = graph.node(id).inputs[0];
    }
    again[id.index()] || matches!(graph.node(id).op, Op::Iota { .. })
}

/// What the `loss` output depends on, and the running statistics the forward pass
/// updates (batch norm's, outputs named as the buffers: [`crate::train::is_buffer`]):
/// read from the forward's own values, not from copies made for the backward.
fn forward_of(graph: &Graph) -> Vec<bool> {
    let mut forward = vec![false; graph.len()];
    let mut stack: Vec<NodeId> = graph
        .outputs()
        .iter()
        .filter(|o| o.name == LOSS_OUTPUT || crate::train::is_buffer(&o.name))
        .map(|o| o.node)
        .collect();
    while let Some(id) = stack.pop() {
        if std::mem::replace(&mut forward[id.index()], true) {
            continue;
        }
        stack.extend(graph.node(id).inputs.iter().copied());
    }
    forward
}

/// Weights, inputs and the like, which the step holds anyway.
fn is_source(op: &Op) -> bool {
    matches!(
        op,
        Op::Input { .. } | Op::Parameter { .. } | Op::Constant { .. } | Op::Iota { .. }
    )
}

fn is_view(op: &Op) -> bool {
    matches!(
        op,
        Op::Reshape { .. } | Op::Transpose { .. } | Op::Broadcast { .. } | Op::Slice { .. }
    )
}

/// Elementwise compute, one pass over memory to make again.
fn is_cheap(op: &Op) -> bool {
    matches!(op, Op::Unary(_) | Op::Binary(_) | Op::Select | Op::Cast { .. })
}

/// Weights, input order and outputs of `graph` onto its rebuilt copy.
pub(crate) fn finish(graph: &Graph, out: &mut Graph, map: &[Option<NodeId>]) {
    for (name, w) in graph.weights() {
        out.set_weight(name.clone(), w.clone());
    }
    out.set_input_order(
        graph
            .inputs()
            .iter()
            .map(|&i| map[i.index()].expect("mapped"))
            .collect(),
    );
    for o in graph.outputs() {
        out.add_output(o.name.clone(), map[o.node.index()].expect("mapped"));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::train::{Init, StateClass, StateSlot};
    use graphc_ir::{DType, GraphBuilder, Shape, Tensor, TensorType};

    /// The exact search's order: subsets under the bound, fewest FLOPs first, most
    /// bytes among equals; none past `EXACT_ITEMS` items.
    #[test]
    fn subsets_come_fewest_flops_first() {
        let items = [(4, 10), (4, 30), (6, 5)];
        assert_eq!(
            subsets_by_flops(&items, 9),
            Some(vec![0b000, 0b010, 0b001, 0b100, 0b011])
        );
        assert_eq!(subsets_by_flops(&items, 0), Some(vec![]));
        assert_eq!(subsets_by_flops(&[(1, 1); EXACT_ITEMS + 1], 5), None);
    }

    /// `loss = sum(x @ cast(w))` and a backward-like reader of the cast: the reader
    /// gets a cast of its own; the forward keeps its one.
    #[test]
    fn the_backward_reads_a_cast_of_its_own() {
        let b = GraphBuilder::new();
        let x = b.input("x", DType::BF16, Shape::from([2, 3]));
        let w = b.input("w", DType::F32, Shape::from([3, 4]));
        let wc = w.cast(DType::BF16);
        let y = x.matmul(wc);
        let loss = y.cast(DType::F32).sum(&[0, 1], false);
        let dy = b.input("dy", DType::BF16, Shape::from([2, 4]));
        let dx = dy.matmul(wc.t());
        b.output(LOSS_OUTPUT, loss);
        b.output("dx", dx);
        let g = b.finish().unwrap();
        let state = State {
            slots: vec![StateSlot {
                name: "w".into(),
                class: StateClass::Parameter,
                init: Init::Value(Tensor::zeros(&graphc_ir::TensorType::new(
                    DType::F32,
                    Shape::from([3, 4]),
                ))),
            }],
        };
        let (out, made) = recompute_parameter_casts(&g, &state).unwrap();
        out.verify().unwrap();
        assert_eq!(made, 1);
        let casts = out
            .nodes()
            .iter()
            .filter(|n| matches!(n.op, Op::Cast { to: DType::BF16 }))
            .count();
        assert_eq!(casts, 2);
        // Without a backward reader nothing changes.
        let b = GraphBuilder::new();
        let w = b.input("w", DType::F32, Shape::from([3, 4]));
        let loss = w.cast(DType::BF16).cast(DType::F32).sum(&[0, 1], false);
        b.output(LOSS_OUTPUT, loss);
        let g = b.finish().unwrap();
        assert_eq!(recompute_parameter_casts(&g, &state).unwrap().1, 0);
    }

    /// A layer norm's backward reads `xc = x - mean` and `xhat = xc * rstd` (f32,
    /// [rows, 64]) and the GELU's output beside its input: computed again in the
    /// backward from `x` (bf16), the row statistics and the GELU's input, they are no
    /// longer what the backward keeps; the step computes the same values.
    #[test]
    fn saved_elementwise_values_are_made_again_when_that_keeps_fewer_bytes() {
        let b = GraphBuilder::new();
        let x = b.input("x", DType::BF16, Shape::from([8, 64]));
        let xf = x.cast(DType::F32);
        let mean = xf.mean(&[1], true);
        let xc = xf - mean;
        let rstd = (xc * xc).mean(&[1], true).rsqrt();
        let xhat = xc * rstd;
        let h = xhat.cast(DType::BF16);
        let g = h.gelu();
        let loss = (g.cast(DType::F32) + xhat).sum(&[0, 1], false);
        // A stand-in backward reading the saved values.
        let dy = b.input("dy", DType::F32, Shape::from([8, 64]));
        let back = dy * xhat + dy * xc + g.cast(DType::F32);
        b.output(LOSS_OUTPUT, loss);
        b.output("back", back);
        let graph = b.finish().unwrap();
        let (out, n) = recompute_saved_elementwise(&graph).unwrap();
        out.verify().unwrap();
        assert!(n >= 3, "xhat, xc and the gelu output made again: {n}");
        // What the backward reads of the forward, before and after.
        let saved = |g: &Graph| -> u64 {
            let f = forward_of(g);
            let users = g.users();
            (0..g.len())
                .filter(|&i| f[i] && !is_source(&g.nodes()[i].op) && users[i].iter().any(|u| !f[u.index()]))
                .map(|i| g.nodes()[i].ty.size_bytes() as u64)
                .sum()
        };
        assert!(saved(&out) < saved(&graph), "{} -> {}", saved(&graph), saved(&out));
        let inputs: std::collections::HashMap<String, Tensor> = [
            (
                "x".to_string(),
                Tensor::random(&TensorType::new(DType::BF16, Shape::from([8, 64])), 1),
            ),
            (
                "dy".to_string(),
                Tensor::random(&TensorType::new(DType::F32, Shape::from([8, 64])), 2),
            ),
        ]
        .into();
        let a = graphc_ir::interpret(&graph, &inputs).unwrap();
        let c = graphc_ir::interpret(&out, &inputs).unwrap();
        assert_eq!(a, c, "bitwise the same outputs");
    }
}
