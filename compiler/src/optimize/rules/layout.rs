//! Layout rules: chains and identities of transposes, reshapes, broadcasts, slices and
//! concats. Each rewrite only moves or selects elements, so results are bit-identical.
//!
//! - `transpose-identity`: `transpose(x, identity) -> x`.
//! - `transpose-transpose`: `transpose(transpose(x, p), q) -> transpose(x, p∘q)`
//!   (`composed[i] = p[q[i]]`), or `x` when that is the identity.
//! - `reshape-identity`: `reshape(x)` to `x`'s own shape `-> x`.
//! - `reshape-reshape`: `reshape(reshape(x, s1), s2) -> reshape(x, s2)`, or `x` when `s2`
//!   is `x`'s shape.
//! - `broadcast-identity`: `broadcast(x)` to `x`'s own shape `-> x`.
//! - `broadcast-broadcast`: `broadcast(broadcast(x, s1), s2) -> broadcast(x, s2)` (numpy
//!   broadcasting composes).
//! - `slice-identity`: a slice taking every element in order `-> x`.
//! - `slice-slice`: two slices compose into one per dimension (start `s1 + s2*step1`,
//!   step `step1*step2`), when the result is expressible with non-negative bounds (always
//!   for positive composed steps; a negative composed step that runs down to index 0
//!   would need a negative end and is left alone).
//! - `slice-of-concat`: a slice whose range along the concat axis lies inside one operand
//!   -> a slice of that operand (or the operand itself when it takes all of it). Other
//!   dimensions may be sliced too: every operand has the same extent there.
//! - `concat-of-slices`: adjacent operands of a concat that are slices of the same value
//!   with contiguous step-1 ranges along the axis (and identical ranges elsewhere) merge
//!   into one slice; when all operands merge, the concat is that slice (or the value).

use egg::{Id, Rewrite};
use graphc_ir::{Op, SliceRange};

use crate::optimize::analysis::{TEGraph, TensorAnalysis};
use crate::optimize::lang::TNode;
use crate::optimize::rule::{nodes_where, rule, Term};

pub fn rules() -> Vec<Rewrite<TNode, TensorAnalysis>> {
    vec![
        rule("transpose-identity", transpose_identity),
        rule("transpose-transpose", transpose_transpose),
        rule("reshape-identity", reshape_identity),
        rule("reshape-reshape", reshape_reshape),
        rule("broadcast-identity", broadcast_identity),
        rule("broadcast-broadcast", broadcast_broadcast),
        rule("slice-identity", slice_identity),
        rule("slice-slice", slice_slice),
        rule("slice-of-concat", slice_of_concat),
        rule("concat-of-slices", concat_of_slices),
    ]
}

fn dims(eg: &TEGraph, id: Id) -> &[usize] {
    eg[id].data.ty.shape.dims()
}

fn is_identity_perm(perm: &[usize]) -> bool {
    perm.iter().enumerate().all(|(i, &p)| i == p)
}

/// `transpose(x, identity) -> x`.
fn transpose_identity(eg: &TEGraph, id: Id) -> Vec<Term> {
    nodes_where(
        eg,
        id,
        |o| matches!(o, Op::Transpose { perm } if is_identity_perm(perm)),
    )
    .map(|n| Term::Class(n.children[0]))
    .collect()
}

/// `transpose(transpose(x, p), q) -> transpose(x, p∘q)`, or `x`.
fn transpose_transpose(eg: &TEGraph, id: Id) -> Vec<Term> {
    let mut out = Vec::new();
    for n in eg[id].nodes.iter() {
        let Op::Transpose { perm: q } = n.op() else { continue };
        for m in eg[n.children[0]].nodes.iter() {
            let Op::Transpose { perm: p } = m.op() else { continue };
            let x = m.children[0];
            let composed: Vec<usize> = q.iter().map(|&i| p[i]).collect();
            out.push(if is_identity_perm(&composed) {
                Term::Class(x)
            } else {
                Term::node(Op::Transpose { perm: composed }, vec![Term::Class(x)])
            });
        }
    }
    out
}

/// `reshape(x)` or `broadcast(x)` to `x`'s own shape `-> x`.
fn same_shape(eg: &TEGraph, id: Id, pred: fn(&Op) -> bool) -> Vec<Term> {
    nodes_where(eg, id, pred)
        .filter(|n| dims(eg, n.children[0]) == dims(eg, id))
        .map(|n| Term::Class(n.children[0]))
        .collect()
}

fn reshape_identity(eg: &TEGraph, id: Id) -> Vec<Term> {
    same_shape(eg, id, |o| matches!(o, Op::Reshape { .. }))
}

fn broadcast_identity(eg: &TEGraph, id: Id) -> Vec<Term> {
    same_shape(eg, id, |o| matches!(o, Op::Broadcast { .. }))
}

/// `outer(inner(x)) -> outer(x)` to the class's shape (or `x` when it has that shape),
/// for reshape/reshape and broadcast/broadcast.
fn chain(eg: &TEGraph, id: Id, pred: fn(&Op) -> bool, make: fn(graphc_ir::Shape) -> Op) -> Vec<Term> {
    let shape = &eg[id].data.ty.shape;
    let mut out = Vec::new();
    for n in nodes_where(eg, id, pred) {
        for m in nodes_where(eg, n.children[0], pred) {
            let x = m.children[0];
            out.push(if dims(eg, x) == shape.dims() {
                Term::Class(x)
            } else {
                Term::node(make(shape.clone()), vec![Term::Class(x)])
            });
        }
    }
    out
}

fn reshape_reshape(eg: &TEGraph, id: Id) -> Vec<Term> {
    chain(
        eg,
        id,
        |o| matches!(o, Op::Reshape { .. }),
        |shape| Op::Reshape { shape },
    )
}

fn broadcast_broadcast(eg: &TEGraph, id: Id) -> Vec<Term> {
    // Broadcasting composes: x -> s1 -> s2 is x -> s2 (each dim of x equals s1's or is
    // 1, and each of s1 equals s2's or is 1), so the node is well typed.
    chain(
        eg,
        id,
        |o| matches!(o, Op::Broadcast { .. }),
        |shape| Op::Broadcast { shape },
    )
}

/// The elements a range takes from a dimension of extent `d`: first index, count and
/// step, with the step normalized to 1 when at most one element is taken (and the start
/// to 0 when none is), so equal index sets give equal triples.
fn take(r: &SliceRange, d: usize) -> (i64, usize, i64) {
    let (s, len) = r.resolve(d);
    match len {
        0 => (0, 0, 1),
        1 => (s, 1, 1),
        _ => (s, len, r.step),
    }
}

/// The canonical range taking `len` elements from `start` by `step` from a dimension of
/// extent `d` (the indices lie in `0..d`): the full range when it takes every element in
/// order, else explicit non-negative bounds; `None` when a negative step runs down to
/// index 0 (the end would be -1, which counts from the end).
fn express(start: i64, len: usize, step: i64, d: usize) -> Option<SliceRange> {
    if len == 0 {
        return Some(SliceRange {
            start: 0,
            end: 0,
            step: 1,
        });
    }
    let step = if len == 1 { 1 } else { step };
    if start == 0 && len == d && step == 1 {
        return Some(SliceRange::full());
    }
    let last = start as i128 + (len as i128 - 1) * step as i128;
    let end = if step > 0 { last + 1 } else { last - 1 };
    if end < 0 || last < 0 || last >= d as i128 || start < 0 || start as usize >= d {
        return None;
    }
    Some(SliceRange {
        start,
        end: end as i64,
        step,
    })
}

/// Whether slicing `ranges` from a value of extent `dims` gives the value unchanged.
fn is_identity_slice(ranges: &[SliceRange], dims: &[usize]) -> bool {
    ranges.iter().zip(dims).all(|(r, &d)| {
        let (s, len, step) = take(r, d);
        len == d && (d == 0 || (s == 0 && step == 1))
    })
}

/// A slice of `x` by `ranges`, or `x` when it takes everything.
fn slice_of(eg: &TEGraph, x: Id, ranges: Vec<SliceRange>) -> Term {
    if is_identity_slice(&ranges, dims(eg, x)) {
        Term::Class(x)
    } else {
        Term::node(Op::Slice { ranges }, vec![Term::Class(x)])
    }
}

/// A slice taking every element in order `-> x`.
fn slice_identity(eg: &TEGraph, id: Id) -> Vec<Term> {
    nodes_where(eg, id, |o| matches!(o, Op::Slice { .. }))
        .filter(|n| match n.op() {
            Op::Slice { ranges } => is_identity_slice(ranges, dims(eg, n.children[0])),
            _ => false,
        })
        .map(|n| Term::Class(n.children[0]))
        .collect()
}

/// `slice(slice(x, r1), r2) -> slice(x, r)`: per dimension the outer slice takes inner
/// positions `s2 + k*step2`, which are `x` indices `s1 + (s2 + k*step2)*step1`.
fn slice_slice(eg: &TEGraph, id: Id) -> Vec<Term> {
    let mut out = Vec::new();
    for n in eg[id].nodes.iter() {
        let Op::Slice { ranges: outer } = n.op() else { continue };
        let mid = n.children[0];
        for m in eg[mid].nodes.iter() {
            let Op::Slice { ranges: inner } = m.op() else { continue };
            let x = m.children[0];
            let composed: Option<Vec<SliceRange>> = inner
                .iter()
                .zip(outer)
                .zip(dims(eg, x).iter().zip(dims(eg, mid)))
                .map(|((r1, r2), (&d, &d_mid))| {
                    let (s1, _, step1) = take(r1, d);
                    let (s2, len, step2) = take(r2, d_mid);
                    if len == 0 {
                        return express(0, 0, 1, d);
                    }
                    let start = i64::try_from(s1 as i128 + s2 as i128 * step1 as i128).ok()?;
                    let step = if len == 1 { 1 } else { step1.checked_mul(step2)? };
                    express(start, len, step, d)
                })
                .collect();
            if let Some(ranges) = composed {
                out.push(slice_of(eg, x, ranges));
            }
        }
    }
    out
}

/// `slice(concat(a_0, .., a_n), r) -> slice(a_k, r')` when the range along the axis lies
/// inside `a_k`.
fn slice_of_concat(eg: &TEGraph, id: Id) -> Vec<Term> {
    let mut out = Vec::new();
    for n in eg[id].nodes.iter() {
        let Op::Slice { ranges } = n.op() else { continue };
        let cat = n.children[0];
        for m in eg[cat].nodes.iter() {
            let &Op::Concat { axis } = m.op() else { continue };
            let (s, len, step) = take(&ranges[axis], dims(eg, cat)[axis]);
            if len == 0 {
                continue;
            }
            let last = s + (len as i64 - 1) * step;
            let (lo, hi) = (s.min(last), s.max(last));
            let mut offset = 0i64;
            for &part in &m.children {
                let extent = dims(eg, part)[axis];
                if lo >= offset && hi < offset + extent as i64 {
                    if let Some(r) = express(s - offset, len, step, extent) {
                        let mut moved = ranges.clone();
                        moved[axis] = r;
                        out.push(slice_of(eg, part, moved));
                    }
                    break;
                }
                offset += extent as i64;
            }
        }
    }
    out
}

/// A slice operand of a concat: the value sliced, its first index and count along the
/// axis (step 1), and what it takes along the other dimensions.
struct Piece<'a> {
    x: Id,
    start: i64,
    len: usize,
    others: Vec<(i64, usize, i64)>,
    ranges: &'a [SliceRange],
}

/// The ways operand `part` of a concat along `axis` is a step-1 slice.
fn pieces(eg: &TEGraph, part: Id, axis: usize) -> Vec<Piece<'_>> {
    let mut out = Vec::new();
    for n in eg[part].nodes.iter() {
        let Op::Slice { ranges } = n.op() else { continue };
        let x = n.children[0];
        let xd = dims(eg, x);
        let (start, len, step) = take(&ranges[axis], xd[axis]);
        if step != 1 {
            continue;
        }
        let others = (0..xd.len())
            .filter(|&i| i != axis)
            .map(|i| take(&ranges[i], xd[i]))
            .collect();
        out.push(Piece {
            x: eg.find(x),
            start,
            len,
            others,
            ranges,
        });
    }
    out
}

/// `concat(slice(x, a:b), slice(x, b:c), ..) -> slice(x, a:c)`, merging every run of at
/// least two adjacent operands.
fn concat_of_slices(eg: &TEGraph, id: Id) -> Vec<Term> {
    let mut out = Vec::new();
    for n in eg[id].nodes.iter() {
        let &Op::Concat { axis } = n.op() else { continue };
        let parts: Vec<Vec<Piece>> = n.children.iter().map(|&c| pieces(eg, c, axis)).collect();
        let mut terms = Vec::new();
        let mut merged = false;
        let mut i = 0;
        while i < parts.len() {
            // The longest run of adjacent pieces starting at operand i.
            let mut best: Option<(usize, &Piece, usize)> = None;
            for first in &parts[i] {
                let (mut j, mut end) = (i + 1, first.start + first.len as i64);
                while j < parts.len() {
                    let next = parts[j]
                        .iter()
                        .find(|p| p.x == first.x && p.start == end && p.others == first.others);
                    let Some(p) = next else { break };
                    end += p.len as i64;
                    j += 1;
                }
                if !matches!(best, Some((k, _, _)) if k >= j) {
                    best = Some((j, first, (end - first.start) as usize));
                }
            }
            match best {
                Some((j, first, len)) if j - i >= 2 => {
                    let Some(r) = express(first.start, len, 1, dims(eg, first.x)[axis]) else {
                        return out;
                    };
                    let mut ranges = first.ranges.to_vec();
                    ranges[axis] = r;
                    terms.push(slice_of(eg, first.x, ranges));
                    merged = true;
                    i = j;
                }
                _ => {
                    terms.push(Term::Class(n.children[i]));
                    i += 1;
                }
            }
        }
        if merged {
            out.push(if terms.len() == 1 {
                terms.pop().expect("one term")
            } else {
                Term::node(Op::Concat { axis }, terms)
            });
        }
    }
    out
}
