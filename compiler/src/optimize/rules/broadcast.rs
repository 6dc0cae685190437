//! Computing each distinct element once: ops over broadcasts become broadcasts of ops
//! at the small shape. Exact (every rewrite computes the same elements, fewer times).
//!
//! Exports compute index-only tensors (causal and padding masks, position ids, packed-
//! sequence ids) at batch size from position indices broadcast over the batch. These
//! rules move the broadcast outward, so such a tensor is computed at its small shape
//! (and, when small enough, folded to a constant) and read through a view; the mask the
//! attention rule looks at is then `[1, 1, s, s]`, not `[b, 1, s, s]`.
//!
//! - `elementwise-of-broadcasts`: `op(broadcast(x1), .., broadcast(xn))` for an
//!   elementwise op `-> broadcast(op(x1', .., xn'))`, each `xi'` broadcast only to the
//!   operands' common shape, when that is smaller than the output. A splat (a class
//!   known to hold one value) counts as a broadcast of that value.
//! - `pad-of-broadcast`: `pad(broadcast(x))` `-> broadcast(pad(x'))`, `x'` broadcast
//!   only along the padded dims.
//! - `slice-of-broadcast`: `slice(broadcast(x))` `-> broadcast(slice(x'))` (a range
//!   along a broadcast dim only changes the extent it is broadcast to).
//! - `concat-of-broadcasts`: a concat of broadcasts along an axis each has in full
//!   `-> broadcast(concat(..))` at the operands' common shape.
//! - `gather-of-broadcast-index`: `gather(data, broadcast(i))` `-> broadcast(gather(data, i'))`.
//! - `gather-of-periodic`: `gather(reshape(broadcast(x)), idx)` along axis 0 of a
//!   flattened broadcast whose broadcast dims all lead (so element `k` is element
//!   `k mod p` of `x`, `p` its element count) `-> gather(reshape(x, [p]), mod(idx, p))`.
//!   (An index outside `-n..n` is an error before and not after; valid indices read
//!   the same element.)
//! - `mod-of-add-multiple`: `mod(a + b, m)` with `m` a known positive integer and `b`
//!   a multiple of `m` (known values that are, a view of such, a product with such a
//!   factor: `iota * m`) `-> mod(a, m)`.

use egg::{Id, Rewrite};
use graphc_ir::{BinaryOp, Op, Shape, SliceRange, Tensor};

use crate::optimize::analysis::{Known, TEGraph, TensorAnalysis};
use crate::optimize::lang::TNode;
use crate::optimize::rule::{nodes_where, rule, Term};

pub fn rules() -> Vec<Rewrite<TNode, TensorAnalysis>> {
    vec![
        rule("elementwise-of-broadcasts", elementwise_of_broadcasts),
        rule("pad-of-broadcast", pad_of_broadcast),
        rule("slice-of-broadcast", slice_of_broadcast),
        rule("concat-of-broadcasts", concat_of_broadcasts),
        rule("gather-of-broadcast-index", gather_of_broadcast_index),
        rule("gather-of-periodic", gather_of_periodic),
        rule("mod-of-add-multiple", mod_of_add_multiple),
    ]
}

fn dims(eg: &TEGraph, id: Id) -> &[usize] {
    eg[id].data.ty.shape.dims()
}

/// The operand of the broadcast node of `id` with the fewest elements, if any.
pub(super) fn smallest_broadcast_source(eg: &TEGraph, id: Id) -> Option<Id> {
    nodes_where(eg, id, |o| matches!(o, Op::Broadcast { .. }))
        .map(|n| n.children[0])
        .min_by_key(|&c| eg[c].data.ty.numel())
}

/// What `id` is a broadcast of: the smallest broadcast source, or for a class known to
/// hold one value (of more than one element) that value as a rank-0 constant; with its
/// dims right-aligned to `rank` (1 where broadcast).
fn source(eg: &TEGraph, id: Id, rank: usize) -> Option<(Term, Vec<usize>)> {
    let (term, d) = if let Some(x) = smallest_broadcast_source(eg, id) {
        (Term::Class(x), dims(eg, x).to_vec())
    } else {
        let data = &eg[id].data;
        if data.ty.numel() <= 1 {
            return None;
        }
        let value = data.known.as_ref()?.as_scalar()?;
        (Term::node(Op::Constant { value }, vec![]), vec![])
    };
    if d.len() > rank {
        return None;
    }
    let mut padded = vec![1usize; rank - d.len()];
    padded.extend_from_slice(&d);
    Some((term, padded))
}

/// `term` (of dims `from`, right-aligned as `to`'s rank) as a value of dims `to`: as it
/// is, reshaped (rank only) or broadcast.
fn fit(term: Term, from_rank: usize, padded: &[usize], to: &[usize]) -> Term {
    if padded == to && from_rank == to.len() {
        term
    } else if padded == to {
        Term::node(Op::Reshape { shape: Shape::new(to) }, vec![term])
    } else {
        Term::node(Op::Broadcast { shape: Shape::new(to) }, vec![term])
    }
}

fn rank_of(eg: &TEGraph, t: &Term) -> usize {
    match t {
        Term::Class(c) => dims(eg, *c).len(),
        Term::Node(..) => 0,
    }
}

fn broadcast_to(out: &[usize], small: Term) -> Term {
    Term::node(Op::Broadcast { shape: Shape::new(out) }, vec![small])
}

fn elementwise_of_broadcasts(eg: &TEGraph, id: Id) -> Vec<Term> {
    let out = dims(eg, id).to_vec();
    if out.contains(&0) {
        return vec![];
    }
    let r = out.len();
    for n in nodes_where(eg, id, |o| o.is_elementwise()) {
        let Some(sources) = n.children.iter().map(|&c| source(eg, c, r)).collect::<Option<Vec<_>>>() else {
            continue;
        };
        // The common shape takes the larger extent per dim (each is 1 or the output's).
        let mut common = vec![1usize; r];
        for (_, p) in &sources {
            for (c, &e) in common.iter_mut().zip(p) {
                *c = (*c).max(e);
            }
        }
        if common == out {
            continue;
        }
        let operands = sources
            .into_iter()
            .map(|(t, p)| {
                let fr = rank_of(eg, &t);
                fit(t, fr, &p, &common)
            })
            .collect();
        return vec![broadcast_to(&out, Term::node(n.op().clone(), operands))];
    }
    vec![]
}

fn pad_of_broadcast(eg: &TEGraph, id: Id) -> Vec<Term> {
    let out = dims(eg, id).to_vec();
    if out.contains(&0) {
        return vec![];
    }
    for n in nodes_where(eg, id, |o| matches!(o, Op::Pad { .. })) {
        let Op::Pad { pads, mode, value } = n.op() else {
            continue;
        };
        let x = n.children[0];
        let full = dims(eg, x).to_vec();
        let Some((t, p)) = source(eg, x, full.len()) else {
            continue;
        };
        // The source, taken in full along the padded dims only.
        let small: Vec<usize> = p
            .iter()
            .zip(&full)
            .zip(pads)
            .map(|((&s, &f), &pd)| if pd == (0, 0) { s } else { f })
            .collect();
        if small == full {
            continue;
        }
        let fr = rank_of(eg, &t);
        let src = fit(t, fr, &p, &small);
        let padded = Term::node(
            Op::Pad {
                pads: pads.clone(),
                mode: *mode,
                value: *value,
            },
            vec![src],
        );
        return vec![broadcast_to(&out, padded)];
    }
    vec![]
}

fn slice_of_broadcast(eg: &TEGraph, id: Id) -> Vec<Term> {
    let out = dims(eg, id).to_vec();
    if out.contains(&0) {
        return vec![];
    }
    for n in nodes_where(eg, id, |o| matches!(o, Op::Slice { .. })) {
        let Op::Slice { ranges } = n.op() else { continue };
        let x = n.children[0];
        let full = dims(eg, x).to_vec();
        let Some((t, p)) = source(eg, x, full.len()) else {
            continue;
        };
        if p == full {
            continue;
        }
        // Along a broadcast dim every index reads the one element: take it.
        let small_ranges: Vec<SliceRange> = ranges
            .iter()
            .zip(p.iter().zip(&full))
            .map(|(r, (&s, &f))| if s != f { SliceRange::full() } else { *r })
            .collect();
        let fr = rank_of(eg, &t);
        let src = fit(t, fr, &p, &p);
        let small = Term::node(Op::Slice { ranges: small_ranges }, vec![src]);
        return vec![broadcast_to(&out, small)];
    }
    vec![]
}

fn concat_of_broadcasts(eg: &TEGraph, id: Id) -> Vec<Term> {
    let out = dims(eg, id).to_vec();
    if out.contains(&0) {
        return vec![];
    }
    let r = out.len();
    for n in nodes_where(eg, id, |o| matches!(o, Op::Concat { .. })) {
        let Op::Concat { axis } = *n.op() else { continue };
        let Some(sources) = n
            .children
            .iter()
            .map(|&c| source(eg, c, r).map(|s| (s, dims(eg, c)[axis])))
            .collect::<Option<Vec<_>>>()
        else {
            continue;
        };
        let mut common = vec![1usize; r];
        for ((_, p), _) in &sources {
            for (k, (c, &e)) in common.iter_mut().zip(p).enumerate() {
                if k != axis {
                    *c = (*c).max(e);
                }
            }
        }
        common[axis] = out[axis];
        if common == out {
            continue;
        }
        let operands = sources
            .into_iter()
            .map(|((t, p), extent)| {
                let mut want = common.clone();
                want[axis] = extent;
                let mut p = p;
                // Along the axis each operand is taken in full (a broadcast one too).
                if p[axis] != extent {
                    p[axis] = 1;
                }
                let fr = rank_of(eg, &t);
                fit(t, fr, &p, &want)
            })
            .collect();
        return vec![broadcast_to(&out, Term::node(Op::Concat { axis }, operands))];
    }
    vec![]
}

fn gather_of_broadcast_index(eg: &TEGraph, id: Id) -> Vec<Term> {
    let out = dims(eg, id).to_vec();
    if out.contains(&0) {
        return vec![];
    }
    for n in nodes_where(eg, id, |o| matches!(o, Op::Gather { .. })) {
        let Op::Gather { axis } = *n.op() else { continue };
        let (data, idx) = (n.children[0], n.children[1]);
        let id_dims = dims(eg, idx).to_vec();
        let Some(i) = smallest_broadcast_source(eg, idx) else {
            continue;
        };
        let mut p = vec![1usize; id_dims.len().saturating_sub(dims(eg, i).len())];
        p.extend_from_slice(dims(eg, i));
        if p.len() != id_dims.len() || p == id_dims {
            continue;
        }
        let small_idx = fit(Term::Class(i), dims(eg, i).len(), &p, &p);
        return vec![broadcast_to(
            &out,
            Term::node(Op::Gather { axis }, vec![Term::Class(data), small_idx]),
        )];
    }
    vec![]
}

fn gather_of_periodic(eg: &TEGraph, id: Id) -> Vec<Term> {
    if eg[id].data.ty.numel() == 0 {
        return vec![];
    }
    for n in nodes_where(eg, id, |o| *o == Op::Gather { axis: 0 }) {
        let (data, idx) = (n.children[0], n.children[1]);
        let [total] = *dims(eg, data) else { continue };
        let dtype = eg[idx].data.ty.dtype;
        for flat in nodes_where(eg, data, |o| matches!(o, Op::Reshape { .. })) {
            let b = flat.children[0];
            let full = dims(eg, b).to_vec();
            let Some(x) = smallest_broadcast_source(eg, b) else {
                continue;
            };
            let xd = dims(eg, x);
            let mut p = vec![1usize; full.len().saturating_sub(xd.len())];
            p.extend_from_slice(xd);
            // Broadcast dims all lead: [1, .., 1, full..].
            let lead = p.iter().zip(&full).rposition(|(a, b)| a != b).map_or(0, |i| i + 1);
            if p[..lead].iter().any(|&d| d != 1) {
                continue;
            }
            let period: usize = p.iter().product();
            if period == 0 || period == total {
                continue;
            }
            let Ok(m) = i64::try_from(period) else { continue };
            let modulus = Term::node(
                Op::Broadcast {
                    shape: eg[idx].data.ty.shape.clone(),
                },
                vec![Term::node(
                    Op::Constant {
                        value: Tensor::scalar(dtype, m as f64),
                    },
                    vec![],
                )],
            );
            let wrapped = Term::node(Op::Binary(BinaryOp::Mod), vec![Term::Class(idx), modulus]);
            let x_flat = Term::node(
                Op::Reshape {
                    shape: Shape::new([period]),
                },
                vec![Term::Class(x)],
            );
            return vec![Term::node(Op::Gather { axis: 0 }, vec![x_flat, wrapped])];
        }
    }
    vec![]
}

/// Whether every element of the integer class `id` is a multiple of `m`: known values
/// (up to 2^20 of them) that are, a view (broadcast, reshape) of such, a product with
/// such a factor, or a sum of such terms (`depth` bounds the walk).
fn is_multiple_of(eg: &TEGraph, id: Id, m: f64, depth: usize) -> bool {
    match eg[id].data.known.as_ref() {
        Some(Known::Splat(t)) => return t.to_f64_vec().iter().all(|x| x % m == 0.0),
        Some(Known::Full(t)) if t.numel() <= 1 << 20 => return t.to_f64_vec().iter().all(|x| x % m == 0.0),
        _ => {}
    }
    if depth == 0 {
        return false;
    }
    eg[id].nodes.iter().any(|n| match n.op() {
        Op::Broadcast { .. } | Op::Reshape { .. } => is_multiple_of(eg, n.children[0], m, depth - 1),
        Op::Binary(BinaryOp::Mul) => n.children.iter().any(|&c| is_multiple_of(eg, c, m, depth - 1)),
        Op::Binary(BinaryOp::Add | BinaryOp::Sub) => n.children.iter().all(|&c| is_multiple_of(eg, c, m, depth - 1)),
        _ => false,
    })
}

fn mod_of_add_multiple(eg: &TEGraph, id: Id) -> Vec<Term> {
    if !eg[id].data.ty.dtype.is_int() {
        return vec![];
    }
    for n in nodes_where(eg, id, |o| *o == Op::Binary(BinaryOp::Mod)) {
        let (sum, m) = (n.children[0], n.children[1]);
        let Some(mv) = eg[m].data.known.as_ref().and_then(|k| k.splat()) else {
            continue;
        };
        if mv < 1.0 || mv.fract() != 0.0 {
            continue;
        }
        for add in nodes_where(eg, sum, |o| *o == Op::Binary(BinaryOp::Add)) {
            for (a, b) in [(add.children[0], add.children[1]), (add.children[1], add.children[0])] {
                if is_multiple_of(eg, b, mv, 8) {
                    return vec![Term::node(
                        Op::Binary(BinaryOp::Mod),
                        vec![Term::Class(a), Term::Class(m)],
                    )];
                }
            }
        }
    }
    vec![]
}
