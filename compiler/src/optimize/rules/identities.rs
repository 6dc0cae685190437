//! Algebraic identities: neutral elements, involutions, idempotent ops, constant
//! conditions, and exact cast chains.

use egg::{Id, Rewrite};
use graphc_ir::{BinaryOp, DType, Op, Shape, SliceRange, UnaryOp};

use crate::optimize::analysis::{TEGraph, TensorAnalysis};
use crate::optimize::lang::TNode;
use crate::optimize::rule::{nodes_where, rule, Term};

pub fn rules() -> Vec<Rewrite<TNode, TensorAnalysis>> {
    vec![
        rule("add-zero", |eg, id| {
            binary_with_splat(eg, id, BinaryOp::Add, 0.0, Side::Either)
        }),
        rule("sub-zero", |eg, id| {
            binary_with_splat(eg, id, BinaryOp::Sub, 0.0, Side::Right)
        }),
        rule("mul-one", |eg, id| {
            binary_with_splat(eg, id, BinaryOp::Mul, 1.0, Side::Either)
        }),
        rule("div-one", |eg, id| {
            binary_with_splat(eg, id, BinaryOp::Div, 1.0, Side::Right)
        }),
        // Exported masks `and` their conditions with constants that are true
        // everywhere (a padding test of a sequence with no padding).
        rule("and-true", |eg, id| {
            binary_with_splat(eg, id, BinaryOp::And, 1.0, Side::Either)
        }),
        rule("or-false", |eg, id| {
            binary_with_splat(eg, id, BinaryOp::Or, 0.0, Side::Either)
        }),
        rule("mul-zero-int", mul_zero_int),
        rule("neg-neg", |eg, id| {
            unary_twice(eg, id, UnaryOp::Neg, UnaryOp::Neg, false)
        }),
        rule("relu-relu", |eg, id| {
            unary_twice(eg, id, UnaryOp::Relu, UnaryOp::Relu, true)
        }),
        rule("max-self", |eg, id| binary_self(eg, id, BinaryOp::Max)),
        rule("min-self", |eg, id| binary_self(eg, id, BinaryOp::Min)),
        rule("add-neg", add_neg),
        rule("pow-two", |eg, id| pow_const(eg, id, 2.0)),
        rule("pow-half", |eg, id| pow_const(eg, id, 0.5)),
        rule("select-const", select_const),
        rule("cast-same", cast_same),
        rule("cast-chain", cast_chain),
        rule("gather-splat-index", gather_splat_index),
        rule("one-over", one_over),
        rule("reciprocal-sqrt", reciprocal_sqrt),
    ]
}

#[derive(Clone, Copy, PartialEq)]
enum Side {
    Right,
    Either,
}

/// The single value of every element of `id`, if known.
pub fn splat(eg: &TEGraph, id: Id) -> Option<f64> {
    eg[id].data.known.as_ref().and_then(|k| k.splat())
}

/// `x op c -> x` (and `c op x -> x` for commutative ops) when `c` is all `value`.
fn binary_with_splat(eg: &TEGraph, id: Id, op: BinaryOp, value: f64, side: Side) -> Vec<Term> {
    let mut out = Vec::new();
    for n in nodes_where(eg, id, |o| *o == Op::Binary(op)) {
        let (a, b) = (n.children[0], n.children[1]);
        if splat(eg, b) == Some(value) {
            out.push(Term::Class(a));
        } else if side == Side::Either && splat(eg, a) == Some(value) {
            out.push(Term::Class(b));
        }
    }
    out
}

/// `x * 0 -> 0` for integers only (for floats, NaN and infinities times 0 are NaN).
fn mul_zero_int(eg: &TEGraph, id: Id) -> Vec<Term> {
    if !eg[id].data.ty.dtype.is_int() {
        return vec![];
    }
    let mut out = Vec::new();
    for n in nodes_where(eg, id, |o| *o == Op::Binary(BinaryOp::Mul)) {
        for &c in &n.children {
            if splat(eg, c) == Some(0.0) {
                out.push(Term::Class(c));
            }
        }
    }
    out
}

/// `outer(inner(x))`: `x` for an involution, `inner(x)` for an idempotent op.
fn unary_twice(eg: &TEGraph, id: Id, outer: UnaryOp, inner: UnaryOp, idempotent: bool) -> Vec<Term> {
    let mut out = Vec::new();
    for n in nodes_where(eg, id, |o| *o == Op::Unary(outer)) {
        let child = n.children[0];
        for m in nodes_where(eg, child, |o| *o == Op::Unary(inner)) {
            out.push(Term::Class(if idempotent { child } else { m.children[0] }));
        }
    }
    out
}

/// `max(x, x) -> x`, `min(x, x) -> x`.
fn binary_self(eg: &TEGraph, id: Id, op: BinaryOp) -> Vec<Term> {
    nodes_where(eg, id, |o| *o == Op::Binary(op))
        .filter(|n| eg.find(n.children[0]) == eg.find(n.children[1]))
        .map(|n| Term::Class(n.children[0]))
        .collect()
}

/// `a + neg(b) -> a - b`, `neg(a) + b -> b - a`.
fn add_neg(eg: &TEGraph, id: Id) -> Vec<Term> {
    let mut out = Vec::new();
    for n in nodes_where(eg, id, |o| *o == Op::Binary(BinaryOp::Add)) {
        let (a, b) = (n.children[0], n.children[1]);
        for (keep, negated) in [(a, b), (b, a)] {
            for m in nodes_where(eg, negated, |o| *o == Op::Unary(UnaryOp::Neg)) {
                out.push(Term::node(
                    Op::Binary(BinaryOp::Sub),
                    vec![Term::Class(keep), Term::Class(m.children[0])],
                ));
            }
        }
    }
    out
}

/// `pow(x, 2) -> x * x` (the interpreter's square is `x * x`); `pow(x, 0.5) ->
/// sqrt(x)` where `x` is known not to be negative (`pow(-inf, 0.5)` is `+inf` but
/// `sqrt(-inf)` NaN; the two agree on every other value up to the sign of zero).
/// Floats only.
fn pow_const(eg: &TEGraph, id: Id, exponent: f64) -> Vec<Term> {
    if !eg[id].data.ty.dtype.is_float() {
        return vec![];
    }
    let mut out = Vec::new();
    for n in nodes_where(eg, id, |o| *o == Op::Binary(BinaryOp::Pow)) {
        let (x, e) = (n.children[0], n.children[1]);
        if splat(eg, e) != Some(exponent) {
            continue;
        }
        if exponent == 2.0 {
            out.push(Term::node(
                Op::Binary(BinaryOp::Mul),
                vec![Term::Class(x), Term::Class(x)],
            ));
        } else if non_negative(eg, x) {
            out.push(Term::node(Op::Unary(UnaryOp::Sqrt), vec![Term::Class(x)]));
        }
    }
    out
}

/// Whether every value of class `id` is `>= 0` or NaN, by the ops that compute it.
fn non_negative(eg: &TEGraph, id: Id) -> bool {
    if let Some(v) = splat(eg, id) {
        return v >= 0.0 || v.is_nan();
    }
    eg[id].nodes.iter().any(|n| match n.op() {
        Op::Unary(UnaryOp::Abs | UnaryOp::Exp | UnaryOp::Sqrt | UnaryOp::Relu | UnaryOp::Sigmoid) => true,
        Op::Binary(BinaryOp::Mul) => eg.find(n.children[0]) == eg.find(n.children[1]),
        _ => false,
    })
}

/// `select(c, a, b)` with `c` all true or all false.
fn select_const(eg: &TEGraph, id: Id) -> Vec<Term> {
    let mut out = Vec::new();
    for n in nodes_where(eg, id, |o| *o == Op::Select) {
        match splat(eg, n.children[0]) {
            Some(v) if v != 0.0 => out.push(Term::Class(n.children[1])),
            Some(_) => out.push(Term::Class(n.children[2])),
            None => {}
        }
    }
    out
}

/// `cast(x, T) -> x` when `x` is already `T`.
fn cast_same(eg: &TEGraph, id: Id) -> Vec<Term> {
    nodes_where(eg, id, |o| matches!(o, Op::Cast { .. }))
        .filter(|n| eg[n.children[0]].data.ty.dtype == eg[id].data.ty.dtype)
        .map(|n| Term::Class(n.children[0]))
        .collect()
}

/// Whether every value of `from` converts to `to` exactly (so a cast through `to` loses
/// nothing).
pub fn lossless(from: DType, to: DType) -> bool {
    use DType::*;
    from == to
        || matches!(
            (from, to),
            (Bool, _)
                | (F16, F32 | F64)
                | (BF16, F32 | F64)
                | (F32, F64)
                | (I8, I32 | I64 | F16 | BF16 | F32 | F64)
                | (U8, I32 | I64 | F16 | BF16 | F32 | F64)
                | (I32, I64 | F64)
        )
}

/// `cast(cast(x, T1), T2) -> cast(x, T2)` when `x -> T1` is exact (f32 -> f16 -> f32 is
/// not the identity, and is left alone), and the last cast treats the value the same
/// way from either type: into an integer, float sources saturate and integer sources
/// wrap, so an integer -> float -> integer chain is kept (i8 -1 -> f16 -> u8 is 0,
/// i8 -1 -> u8 is 255).
fn cast_chain(eg: &TEGraph, id: Id) -> Vec<Term> {
    let to = eg[id].data.ty.dtype;
    let mut out = Vec::new();
    for n in nodes_where(eg, id, |o| matches!(o, Op::Cast { .. })) {
        let mid = n.children[0];
        let mid_ty = eg[mid].data.ty.dtype;
        for m in nodes_where(eg, mid, |o| matches!(o, Op::Cast { .. })) {
            let x = m.children[0];
            let from = eg[x].data.ty.dtype;
            let same_treatment = !to.is_int() || from == DType::Bool || from.is_float() == mid_ty.is_float();
            if lossless(from, mid_ty) && same_treatment {
                out.push(if eg[x].data.ty.dtype == to {
                    Term::Class(x)
                } else {
                    Term::node(Op::Cast { to }, vec![Term::Class(x)])
                });
            }
        }
    }
    out
}

/// `gather(data, idx)` with every index equal to `k`: the slice `k` of `data`, broadcast
/// to the output (a lookup with constant indices is a broadcast, and the slice of a
/// weight folds into a smaller weight).
fn gather_splat_index(eg: &TEGraph, id: Id) -> Vec<Term> {
    let mut out = Vec::new();
    for n in nodes_where(eg, id, |o| matches!(o, Op::Gather { .. })) {
        let Op::Gather { axis } = *n.op() else { continue };
        let (data, idx) = (n.children[0], n.children[1]);
        let Some(k) = splat(eg, idx) else { continue };
        let dims = eg[data].data.ty.shape.0.clone();
        let extent = dims[axis] as i64;
        let k = if k < 0.0 { k as i64 + extent } else { k as i64 };
        if !(0..extent).contains(&k) {
            continue; // an out-of-range index is a run-time error; keep it
        }
        let mut ranges = vec![SliceRange::full(); dims.len()];
        ranges[axis] = SliceRange {
            start: k,
            end: k + 1,
            step: 1,
        };
        let idx_rank = eg[idx].data.ty.shape.rank();
        let mut kept: Vec<usize> = dims[..axis].to_vec();
        kept.extend(std::iter::repeat_n(1, idx_rank));
        kept.extend_from_slice(&dims[axis + 1..]);
        let slice = Term::node(Op::Slice { ranges }, vec![Term::Class(data)]);
        let reshaped = Term::node(Op::Reshape { shape: Shape(kept) }, vec![slice]);
        out.push(Term::node(
            Op::Broadcast {
                shape: eg[id].data.ty.shape.clone(),
            },
            vec![reshaped],
        ));
    }
    out
}

/// `1 / x -> reciprocal(x)` (floats; the interpreter's reciprocal is `1 / x`): the
/// canonical form norms and softmaxes are recognized in.
fn one_over(eg: &TEGraph, id: Id) -> Vec<Term> {
    if !eg[id].data.ty.dtype.is_float() {
        return vec![];
    }
    nodes_where(eg, id, |o| *o == Op::Binary(BinaryOp::Div))
        .filter(|n| splat(eg, n.children[0]) == Some(1.0))
        .map(|n| Term::node(Op::Unary(UnaryOp::Reciprocal), vec![Term::Class(n.children[1])]))
        .collect()
}

/// `reciprocal(sqrt(x)) -> rsqrt(x)`, exact for f32 and f64 (rsqrt is `1 / sqrt(x)`
/// with one rounding; f16/bf16 would round the square root first, so they keep both).
/// This is how exported RMSNorm and LayerNorm statistics reach the builder's form.
fn reciprocal_sqrt(eg: &TEGraph, id: Id) -> Vec<Term> {
    if !matches!(eg[id].data.ty.dtype, DType::F32 | DType::F64) {
        return vec![];
    }
    let mut out = Vec::new();
    for n in nodes_where(eg, id, |o| *o == Op::Unary(UnaryOp::Reciprocal)) {
        for m in nodes_where(eg, n.children[0], |o| *o == Op::Unary(UnaryOp::Sqrt)) {
            out.push(Term::node(Op::Unary(UnaryOp::Rsqrt), vec![Term::Class(m.children[0])]));
        }
    }
    out
}
