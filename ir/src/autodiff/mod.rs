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
//! round, sign) give zero, as in PyTorch. The maximum a softmax or log-softmax
//! subtracts gets none either: its exact gradient is zero ([`shift`]). The seed is `1` of the loss's type (the
//! gradient of `sum(loss)` when the loss is not a scalar).
//!
//! Backward nodes are named under `backward/` (the builder's scope), so reports can
//! tell forward from backward work.

// reason: `gradients` verifies the graph first; node ids then index its table (and the
// per-node vectors sized by it), and operands exist.
#![allow(clippy::indexing_slicing)]

mod one_hot;
mod shift;
mod vjp;

use std::collections::HashSet;

use crate::{Graph, GraphBuilder, GraphError, NodeId, Op, PadMode, Shape, Value};

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

    let mut needs = b.with_graph(|g| needs_gradient(g, &order, loss, wrt));
    // A softmax's maximum gets no gradient: its share is exactly zero (`shift`).
    for m in b.with_graph(shift::shift_only_maxes) {
        if !wrt.contains(&m) {
            needs[m.index()] = false;
        }
    }
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

/// The sum of one or more contributions (a left-to-right chain of adds). Contributions
/// that are zero pads of disjoint, adjacent ranges along the leading axis (a value read
/// in parts of its rows, each part a slice: a chunked MLP's input) are joined by one
/// `concat` (padded where the ranges do not reach the ends) instead: the same sum,
/// without a full-size value per part.
fn sum_all<'b>(b: &'b GraphBuilder, parts: &[NodeId]) -> Result<Value<'b>, GraphError> {
    let value = |id: NodeId| {
        b.value(id)
            .ok_or_else(|| GraphError::Graph(format!("{id} is not a node")))
    };
    let mut rest: Vec<NodeId> = parts.to_vec();
    if let Some((joined, used)) = join_pads(b, parts) {
        rest.retain(|p| !used.contains(p));
        rest.insert(0, joined.id());
    }
    let mut acc = value(rest[0])?;
    for &p in &rest[1..] {
        acc = acc + value(p)?;
    }
    Ok(acc)
}

/// Of `parts`, two or more zero pads along one axis (the first of their axes) whose ranges are
/// disjoint and together one run: their operands concatenated along it (in order) and padded to
/// the whole, and the pads used (of two with the same range, the first).
fn join_pads<'b>(b: &'b GraphBuilder, parts: &[NodeId]) -> Option<(Value<'b>, Vec<NodeId>)> {
    if parts.len() < 2 {
        return None;
    }
    // (pad, operand, axis, lo, len, dims) of each zero pad along one axis.
    let pads: Vec<(NodeId, NodeId, usize, i64, i64, usize)> = b.with_graph(|g| {
        parts
            .iter()
            .filter_map(|&p| {
                let node = g.node(p);
                let Op::Pad {
                    pads,
                    mode: PadMode::Constant,
                    value,
                } = &node.op
                else {
                    return None;
                };
                if *value != 0.0 {
                    return None;
                }
                let mut axes = pads.iter().enumerate().filter(|(_, &pd)| pd != (0, 0));
                let (axis, &(lo, hi)) = axes.next()?;
                if axes.next().is_some() || lo < 0 || hi < 0 {
                    return None;
                }
                let whole = *node.ty.shape.dims().get(axis)?;
                Some((p, *node.inputs.first()?, axis, lo, whole as i64 - lo - hi, whole))
            })
            .collect()
    });
    // Along the first axis any pad is along (rows: a chunked MLP's parts; the last
    // axis: a fused QKV projection's split, whose three gradients one concat writes).
    let axis = pads.iter().map(|p| p.2).min()?;
    let whole = pads.iter().find(|p| p.2 == axis)?.5;
    let mut run: Vec<_> = pads.iter().filter(|p| p.2 == axis && p.5 == whole).copied().collect();
    if run.len() < 2 {
        return None;
    }
    // One pad per start (another of the same range, a part read twice, is summed as
    // it was); adjacent and disjoint: each range starts where the one before ends.
    run.sort_by_key(|p| p.3);
    run.dedup_by_key(|p| p.3);
    if run.len() < 2 {
        return None;
    }
    if run.windows(2).any(|w| w[0].3 + w[0].4 != w[1].3) {
        return None;
    }
    let (lo, end) = (run[0].3, run.last().map(|p| p.3 + p.4)?);
    let operands: Option<Vec<Value<'b>>> = run.iter().map(|p| b.value(p.1)).collect();
    let operands = operands?;
    let mut joined = concat_before_reshape(b, &operands, axis).unwrap_or_else(|| b.concat(&operands, axis as i64));
    if lo > 0 || end < whole as i64 {
        let rank = b.with_graph(|g| g.node(run[0].0).ty.shape.rank());
        let mut widths = vec![(0, 0); rank];
        widths[axis] = (lo, whole as i64 - end);
        joined = joined.pad(&widths, PadMode::Constant, 0.0);
    }
    Some((joined, run.iter().map(|p| p.0).collect()))
}

/// `concat(reshape(x_i), axis)` as `reshape(concat(x_i, a))` when every `x_i` has one
/// shape whose dims from `a` on merge into `axis` (the dims before agree): the same
/// values (whole blocks of the merged dims concatenated), read by the concat through
/// the `x_i`'s own layouts. A fused QKV projection's gradient: the three `[B, S, H, D]`
/// heads' gradients (transposes of attention's `[B, H, S, D]`) concatenated along `H`,
/// without a dense copy of each to merge `H` and `D`.
fn concat_before_reshape<'b>(b: &'b GraphBuilder, parts: &[Value<'b>], axis: usize) -> Option<Value<'b>> {
    let srcs: Vec<Value<'b>> = b.with_graph(|g| {
        parts
            .iter()
            .map(|p| match g.node(p.id()).op {
                Op::Reshape { .. } => g.node(p.id()).inputs.first().and_then(|&i| b.value(i)),
                _ => None,
            })
            .collect::<Option<Vec<_>>>()
    })?;
    let from = srcs.first()?.shape();
    if srcs.iter().any(|s| s.shape() != from || s.dtype() != srcs[0].dtype()) {
        return None;
    }
    let to = parts.first()?.shape();
    let (fd, td) = (from.dims(), to.dims());
    // The dims before `axis` kept, `axis` the product of `from[axis..]`, none after.
    if axis + 1 != td.len() || fd.len() <= axis || fd[..axis] != td[..axis] {
        return None;
    }
    if fd[axis..].iter().product::<usize>() != td[axis] {
        return None;
    }
    let joined = b.concat(&srcs, axis as i64);
    let mut whole = td.to_vec();
    whole[axis] *= parts.len();
    Some(joined.reshape(Shape::from(whole)))
}

#[cfg(test)]
mod tests;
