//! Reverse-mode automatic differentiation as a graph transformation.
//!
//! [`gradients`] takes a builder holding a forward graph, a scalar (or any float) loss
//! node and the nodes to differentiate with respect to, and appends the backward graph:
//! one vector-Jacobian product per primitive ([`vjp`]), walked in reverse topological
//! order from the loss, each node's incoming contributions summed (a value read twice
//! — a tied parameter, a residual — gets the sum of its uses). The result names the
//! gradient node of every requested node (a zero tensor where the loss does not depend
//! on it) and the **saved-for-backward set**: the forward values the backward graph
//! reads, as data, so a later pass (rematerialization) can choose to recompute some of
//! them instead of keeping them.
//!
//! Gradients flow only through float values: integer and bool values (indices, masks,
//! comparisons, arg-reductions) carry none, and piecewise-constant ops (floor, ceil,
//! round, sign) give zero, as in PyTorch. The seed is `1` of the loss's type (the
//! gradient of `sum(loss)` when the loss is not a scalar).
//!
//! Backward nodes are named under `backward/` (the builder's scope), so reports can
//! tell forward from backward work.

// reason: `gradients` verifies the graph first; node ids then index its table (and the
// per-node vectors sized by it), and operands exist.
#![allow(clippy::indexing_slicing)]

mod vjp;

use std::collections::HashSet;

use crate::{Graph, GraphBuilder, GraphError, NodeId, Value};

/// What [`gradients`] added.
#[derive(Clone, Debug, PartialEq)]
pub struct Gradients {
    /// The gradient of the loss with respect to each requested node, in request order.
    pub grads: Vec<NodeId>,
    /// Forward nodes the backward graph reads (sorted): what must be kept from the
    /// forward pass until the backward pass uses it, or recomputed.
    pub saved: Vec<NodeId>,
}

/// Append to `b`'s graph the gradient of `loss` with respect to each of `wrt`.
///
/// Fails (naming the node) when a requested node or the loss is not a float value, or
/// when an op on the path from a requested node to the loss has no gradient graphc can
/// build (a reflect or edge pad; the quantized operand of a dequantize).
pub fn gradients(b: &GraphBuilder, loss: NodeId, wrt: &[NodeId]) -> Result<Gradients, GraphError> {
    b.with_graph(|g| g.verify())?;
    let forward_len = b.with_graph(|g| g.len());
    let order = b.with_graph(|g| g.topo_order())?;
    let (loss_ty, wrt_ok) = b.with_graph(|g| {
        let bad = wrt
            .iter()
            .find(|&&w| !g.get(w).is_some_and(|n| n.ty.dtype.is_float()))
            .copied();
        (g.get(loss).map(|n| n.ty.clone()), bad)
    });
    let loss_ty = loss_ty.ok_or_else(|| GraphError::Graph(format!("loss {loss} is not a node")))?;
    if !loss_ty.dtype.is_float() {
        return Err(b.with_graph(|g| GraphError::at(g, loss, "the loss must be a float value")));
    }
    if let Some(w) = wrt_ok {
        return Err(b.with_graph(|g| match g.get(w) {
            Some(_) => GraphError::at(g, w, "only float values have gradients"),
            None => GraphError::Graph(format!("{w} is not a node")),
        }));
    }

    let needs = b.with_graph(|g| needs_gradient(g, &order, loss, wrt));
    // Contributions to each node's gradient, summed when the node is reached.
    let mut incoming: Vec<Vec<NodeId>> = vec![Vec::new(); forward_len];
    let mut grad_of: Vec<Option<NodeId>> = vec![None; forward_len];
    let result = b.scope("backward", || -> Result<(), GraphError> {
        let seed = b.scalar(loss_ty.dtype, 1.0).broadcast_to(&loss_ty.shape);
        incoming[loss.index()].push(seed.id());
        for &id in order.iter().rev() {
            let parts = std::mem::take(&mut incoming[id.index()]);
            if parts.is_empty() {
                continue;
            }
            let g = sum_all(b, &parts)?;
            grad_of[id.index()] = Some(g.id());
            let (op, operands) = b.with_graph(|gr| {
                let n = gr.node(id);
                (n.op.clone(), n.inputs.clone())
            });
            if operands.iter().all(|o| !needs[o.index()]) {
                continue;
            }
            let wanted: Vec<bool> = operands.iter().map(|o| needs[o.index()]).collect();
            let contributions = vjp::vjp(b, id, &op, &operands, &wanted, g)
                .map_err(|message| b.with_graph(|gr| GraphError::at(gr, id, format!("no gradient: {message}"))))?;
            for (k, c) in contributions.into_iter().enumerate() {
                if let (Some(c), true) = (c, wanted.get(k).copied().unwrap_or(false)) {
                    incoming[operands[k].index()].push(c.id());
                }
            }
        }
        Ok(())
    });
    result?;
    if let Some(e) = b.take_error() {
        return Err(e);
    }
    let grads = b.scope("backward", || {
        wrt.iter()
            .map(|&w| match grad_of[w.index()] {
                Some(g) => g,
                None => {
                    let ty = b.with_graph(|g| g.node(w).ty.clone());
                    b.scalar(ty.dtype, 0.0).broadcast_to(&ty.shape).id()
                }
            })
            .collect::<Vec<_>>()
    });
    let saved = b.with_graph(|g| saved_set(g, forward_len));
    if let Some(e) = b.take_error() {
        return Err(e);
    }
    Ok(Gradients { grads, saved })
}

/// Nodes a gradient flows through: float values that the loss reads and that read one
/// of `wrt`.
fn needs_gradient(g: &Graph, order: &[NodeId], loss: NodeId, wrt: &[NodeId]) -> Vec<bool> {
    let n = g.len();
    let mut from_wrt = vec![false; n];
    for &w in wrt {
        from_wrt[w.index()] = true;
    }
    for &id in order {
        if !from_wrt[id.index()] && g.node(id).inputs.iter().any(|o| from_wrt[o.index()]) {
            from_wrt[id.index()] = true;
        }
    }
    let mut to_loss = vec![false; n];
    to_loss[loss.index()] = true;
    for &id in order.iter().rev() {
        if to_loss[id.index()] {
            for o in &g.node(id).inputs {
                to_loss[o.index()] = true;
            }
        }
    }
    (0..n)
        .map(|i| from_wrt[i] && to_loss[i] && g.nodes()[i].ty.dtype.is_float())
        .collect()
}

/// Forward nodes (ids below `forward_len`) read by a backward node, constants and
/// iotas excluded (they are not memory kept between the passes).
fn saved_set(g: &Graph, forward_len: usize) -> Vec<NodeId> {
    let mut saved = HashSet::new();
    for node in &g.nodes()[forward_len..] {
        for &o in &node.inputs {
            if o.index() < forward_len && !matches!(g.node(o).op, crate::Op::Constant { .. } | crate::Op::Iota { .. }) {
                saved.insert(o);
            }
        }
    }
    let mut v: Vec<NodeId> = saved.into_iter().collect();
    v.sort();
    v
}

/// The sum of one or more contributions (a left-to-right chain of adds).
fn sum_all<'b>(b: &'b GraphBuilder, parts: &[NodeId]) -> Result<Value<'b>, GraphError> {
    let value = |id: NodeId| {
        b.value(id)
            .ok_or_else(|| GraphError::Graph(format!("{id} is not a node")))
    };
    let mut acc = value(parts[0])?;
    for &p in &parts[1..] {
        acc = acc + value(p)?;
    }
    Ok(acc)
}

#[cfg(test)]
mod tests;
