//! Sums of a one-hot selection, taken where the backward graph makes them: the
//! gradient of cross-entropy's picked log-probability is `select(iota == label, g, 0)`
//! over the classes, and the log-softmax's backward sums it over the classes. With `g`
//! and `label` constant along the summed axis (broadcasts of a value per token), at
//! most one class matches, so the sum is `select(0 <= label < n, g, 0)` per token: no
//! pass over the classes, and the one-hot is computed only where the gradient is
//! written (a kernel over the classes would otherwise sum it, or store it).
//! The same values, up to the sign of a zero sum.

use crate::{BinaryOp, DType, Graph, NodeId, Op, Shape, UnaryOp, Value};

/// `sum(g, [axis])` (kept dims) when `g` is such a selection (or its negation).
pub(super) fn one_hot_sum<'b>(g: Value<'b>, axis: usize) -> Option<Value<'b>> {
    let b = g.builder();
    let full = g.shape().dims().to_vec();
    let n = *full.get(axis)?;
    let mut kept = full.clone();
    kept[axis] = 1;
    let kept = Shape::from(kept);
    let found = b.with_graph(|gr| {
        let node = gr.node(g.id());
        let (neg, sel) = match node.op {
            Op::Unary(UnaryOp::Neg) => (true, *node.inputs.first()?),
            _ => (false, g.id()),
        };
        let s = gr.node(sel);
        let (Op::Select, [c, x, z]) = (&s.op, s.inputs.as_slice()) else {
            return None;
        };
        if !is_zero(gr, *z) {
            return None;
        }
        let e = gr.node(*c);
        let (Op::Binary(BinaryOp::Eq), [p, q]) = (&e.op, e.inputs.as_slice()) else {
            return None;
        };
        let q = if counts_along(gr, *p, axis, n) {
            *q
        } else if counts_along(gr, *q, axis, n) {
            *p
        } else {
            return None;
        };
        if !matches!(gr.node(q).ty.dtype, DType::I64 | DType::I32) {
            return None;
        }
        Some((neg, constant_along(gr, q, axis)?, constant_along(gr, *x, axis)?))
    })?;
    let (neg, q, x) = found;
    let at_kept = |v: NodeId| {
        let v = b.value(v)?;
        let rank = v.rank();
        let mut padded = vec![1usize; kept.rank() - rank];
        padded.extend_from_slice(v.shape().dims());
        Some(v.reshape(Shape::from(padded)).broadcast_to(&kept))
    };
    let (q, x) = (at_kept(q)?, at_kept(x)?);
    let in_range = q
        .binary(BinaryOp::Ge, 0.0)
        .binary(BinaryOp::And, q.binary(BinaryOp::Lt, n as f64));
    let zero = b.scalar(x.dtype(), 0.0).broadcast_to(&kept);
    let picked = b.select(in_range, x, zero);
    Some(if neg { -picked } else { picked })
}

/// A constant 0 (through broadcasts and reshapes).
fn is_zero(g: &Graph, mut id: NodeId) -> bool {
    loop {
        let node = g.node(id);
        match &node.op {
            Op::Broadcast { .. } | Op::Reshape { .. } => id = node.inputs[0],
            Op::Constant { value } => return value.numel() <= 1 && value.to_f64_vec().iter().all(|&v| v == 0.0),
            _ => return false,
        }
    }
}

/// `id` counts along `axis` (extent `n`): an iota along it, or a broadcast of one whose
/// counted axis lands there.
fn counts_along(g: &Graph, id: NodeId, axis: usize, n: usize) -> bool {
    let node = g.node(id);
    let rank = node.ty.shape.rank();
    let src = match node.op {
        Op::Broadcast { .. } => node.inputs[0],
        _ => id,
    };
    let s = g.node(src);
    let lead = rank.saturating_sub(s.ty.shape.rank());
    matches!(s.op, Op::Iota { axis: a, .. } if a + lead == axis && s.ty.shape.dims().get(a) == Some(&n))
}

/// The source of a broadcast `id` that has extent 1 at `axis` (right-aligned).
fn constant_along(g: &Graph, id: NodeId, axis: usize) -> Option<NodeId> {
    let node = g.node(id);
    let Op::Broadcast { .. } = node.op else { return None };
    let src = *node.inputs.first()?;
    let sd = g.node(src).ty.shape.dims().to_vec();
    let lead = node.ty.shape.rank().checked_sub(sd.len())?;
    match axis.checked_sub(lead) {
        Some(k) if sd.get(k) != Some(&1) => None,
        _ => Some(src),
    }
}
