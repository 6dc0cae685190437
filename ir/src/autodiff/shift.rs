//! Maxima subtracted only for numerical range: in `log_softmax` (`s - log(sum(exp(s)))`)
//! and `softmax` (`exp(s) / sum(exp(s))`) of `s = x - max(x)`, the result does not change
//! when a row of `s` moves by a constant, so the gradient reaching `s` sums to zero
//! along the reduced axes and the maximum's share (`-sum(g_s)`, spread over the elements
//! equal to it) is exactly zero. PyTorch's `log_softmax` backward has no such term
//! either. [`shift_only_maxes`] finds them, so the backward graph leaves out a pass that
//! only adds rounding noise (two row passes of cross-entropy's backward).

use crate::{BinaryOp, Graph, NodeId, Op, ReduceOp, UnaryOp};

/// The maximum nodes (and the broadcasts and casts of them) whose gradient is exactly
/// zero: each a `reduce_max(x, axes, keepdims)` read only (directly or through
/// broadcasts and casts) as the subtrahend of `s = y - max` whose every use is part of a
/// `log_softmax` or `softmax` over the same axes.
pub(super) fn shift_only_maxes(g: &Graph) -> Vec<NodeId> {
    let users = g.users();
    let uses = |id: NodeId| users.get(id.index()).map(Vec::as_slice).unwrap_or_default();
    let outputs: Vec<NodeId> = g.outputs().iter().map(|o| o.node).collect();
    let inner = |id: NodeId| !outputs.contains(&id) && !uses(id).is_empty();
    let mut found = Vec::new();
    for id in g.ids() {
        let node = g.node(id);
        let Op::Reduce {
            op: ReduceOp::Max,
            axes,
            keepdims: true,
        } = &node.op
        else {
            continue;
        };
        // The max and its broadcasts and float casts (mixed precision: the max in bf16,
        // the shift in f32), each constant along `axes`: every use a broadcast, a cast
        // or the subtrahend of `y - ·` (what `y` is does not matter: a shift-invariant
        // function of `y - c` has no gradient for `c`).
        let mut views = vec![id];
        let mut subs = Vec::new();
        let mut ok = inner(id);
        let mut k = 0;
        while ok && k < views.len() {
            for &u in uses(views[k]) {
                let un = g.node(u);
                match un.op {
                    Op::Broadcast { .. } if inner(u) => views.push(u),
                    Op::Cast { to } if inner(u) && to.is_float() => views.push(u),
                    Op::Binary(BinaryOp::Sub) if un.inputs.get(1) == Some(&views[k]) && un.inputs[0] != views[k] => {
                        subs.push(u)
                    }
                    _ => ok = false,
                }
            }
            k += 1;
        }
        if ok && !subs.is_empty() && subs.iter().all(|&s| shift_invariant_uses(g, &users, &outputs, s, axes)) {
            found.extend(views);
        }
    }
    found
}

/// Every use of `s` (or of its float casts, when they are all its uses) is the `exp` of
/// a softmax or log-softmax over `axes`, or a log-softmax's `s - log(sum(exp(s)))`; and
/// the sums and logs of those exps are read only there.
fn shift_invariant_uses(g: &Graph, users: &[Vec<NodeId>], outputs: &[NodeId], s: NodeId, axes: &[usize]) -> bool {
    let uses = |id: NodeId| users.get(id.index()).map(Vec::as_slice).unwrap_or_default();
    let inner = |id: NodeId| !outputs.contains(&id) && !uses(id).is_empty();
    let op = |id: NodeId| &g.node(id).op;
    let first = |id: NodeId| g.node(id).inputs.first().copied();
    let second = |id: NodeId| g.node(id).inputs.get(1).copied();
    // What a value is a broadcast of (itself when not a broadcast).
    let base = |mut v: NodeId| {
        while let (Op::Broadcast { .. }, Some(src)) = (op(v), first(v)) {
            v = src;
        }
        v
    };
    let is = |v: NodeId, want: &dyn Fn(&Op) -> bool| want(op(v));
    // `z = sum(e, axes)`, `e = exp(s)`.
    let sum_of = |z: NodeId, e: NodeId| {
        matches!(op(z), Op::Reduce { op: ReduceOp::Sum, axes: a, keepdims: true } if a.as_slice() == axes)
            && first(z) == Some(e)
    };
    let exp_of_s = |e: NodeId| is(e, &|o| matches!(o, Op::Unary(UnaryOp::Exp))) && first(e) == Some(s);
    // `s - y`, `y` a broadcast of `log(sum(exp(s)))`.
    let log_softmax = |u: NodeId| {
        let l = second(u).map(base);
        is(u, &|o| matches!(o, Op::Binary(BinaryOp::Sub)))
            && first(u) == Some(s)
            && l.is_some_and(|l| {
                is(l, &|o| matches!(o, Op::Unary(UnaryOp::Log)))
                    && first(l).is_some_and(|z| first(z).is_some_and(|e| exp_of_s(e) && sum_of(z, e)))
            })
    };
    // `e / y`, `y` a broadcast of `sum(e)`.
    let softmax = |u: NodeId, e: NodeId| {
        is(u, &|o| matches!(o, Op::Binary(BinaryOp::Div)))
            && first(u) == Some(e)
            && second(u).map(base).is_some_and(|z| sum_of(z, e))
    };
    // Every use of `v`, through broadcasts, accepted by `ok`.
    let only = |v: NodeId, ok: &dyn Fn(NodeId) -> bool| {
        let mut views = vec![v];
        let mut k = 0;
        while let Some(&w) = views.get(k) {
            for &u in uses(w) {
                if matches!(op(u), Op::Broadcast { .. }) && inner(u) {
                    views.push(u);
                } else if !ok(u) {
                    return false;
                }
            }
            k += 1;
        }
        true
    };
    // `s` cast (mixed precision: shifted in bf16, normalized in f32): the cast's
    // gradient is the gradient cast back, so what holds of the cast holds of `s`.
    let casts = |u: &NodeId| matches!(op(*u), Op::Cast { to } if to.is_float()) && inner(*u);
    if inner(s) && uses(s).iter().all(casts) {
        return uses(s)
            .iter()
            .all(|&c| shift_invariant_uses(g, users, outputs, c, axes));
    }
    inner(s)
        && uses(s).iter().all(|&u| {
            if log_softmax(u) {
                return true;
            }
            let e = u;
            exp_of_s(e)
                && inner(e)
                && uses(e).iter().all(|&z| {
                    softmax(z, e)
                        || (sum_of(z, e)
                            && inner(z)
                            && only(z, &|l| {
                                softmax(l, e)
                                    || (is(l, &|o| matches!(o, Op::Unary(UnaryOp::Log)))
                                        && inner(l)
                                        && only(l, &log_softmax))
                            }))
                })
        })
}
