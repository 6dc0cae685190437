//! Scales and products: constant divisors that are exact as multipliers, integer scale
//! chains, and matmuls whose result is transposed.
//!
//! - `div-pow2`: `x / c -> x * (1/c)` when `c` is ±2^k and `1/c` is a normal number of
//!   the dtype (then both round the same exact quotient; other divisors are left alone).
//! - `mul-const-int`: `(x * c1) * c2 -> x * (c1 * c2)` for integers (wrapping
//!   multiplication is associative; for floats it is not, and the rule stays off).
//! - `transpose-of-matmul`: `transpose(matmul(a, b))` over the last two axes ->
//!   `matmul(b^T, a^T)`; the extractor takes it when the operand transposes fold (a
//!   weight) or cancel (an operand that is itself a transpose).

use egg::{Id, Rewrite};
use graphc_ir::{BinaryOp, DType, Op, Tensor};

use super::identities::splat;
use crate::optimize::analysis::{TEGraph, TensorAnalysis};
use crate::optimize::lang::TNode;
use crate::optimize::rule::{nodes_where, rule, Term};

pub fn rules() -> Vec<Rewrite<TNode, TensorAnalysis>> {
    vec![
        rule("div-pow2", div_pow2),
        rule("mul-const-int", mul_const_int),
        rule("transpose-of-matmul", transpose_of_matmul),
    ]
}

/// A splat of `v` with the type of class `like`.
fn splat_like(eg: &TEGraph, like: Id, v: f64) -> Term {
    let ty = &eg[like].data.ty;
    let scalar = Term::node(
        Op::Constant {
            value: Tensor::scalar(ty.dtype, v),
        },
        vec![],
    );
    if ty.shape.rank() == 0 {
        scalar
    } else {
        Term::node(
            Op::Broadcast {
                shape: ty.shape.clone(),
            },
            vec![scalar],
        )
    }
}

/// Whether `1/c` is exactly representable as a normal number of `dtype`, for `c = ±2^k`.
fn exact_reciprocal(c: f64, dtype: DType) -> bool {
    if c == 0.0 || !c.is_finite() || c.abs().log2().fract() != 0.0 {
        return false;
    }
    let r = 1.0 / c;
    let (min_normal, max) = match dtype {
        DType::F32 => (f32::MIN_POSITIVE as f64, f32::MAX as f64),
        DType::F64 => (f64::MIN_POSITIVE, f64::MAX),
        DType::F16 => (half::f16::MIN_POSITIVE.to_f64(), half::f16::MAX.to_f64()),
        DType::BF16 => (half::bf16::MIN_POSITIVE.to_f64(), half::bf16::MAX.to_f64()),
        _ => return false,
    };
    (min_normal..=max).contains(&r.abs()) && (min_normal..=max).contains(&c.abs())
}

fn div_pow2(eg: &TEGraph, id: Id) -> Vec<Term> {
    let dtype = eg[id].data.ty.dtype;
    let mut out = Vec::new();
    for n in nodes_where(eg, id, |o| *o == Op::Binary(BinaryOp::Div)) {
        let (x, c) = (n.children[0], n.children[1]);
        match splat(eg, c) {
            Some(v) if exact_reciprocal(v, dtype) => out.push(Term::node(
                Op::Binary(BinaryOp::Mul),
                vec![Term::Class(x), splat_like(eg, c, 1.0 / v)],
            )),
            _ => {}
        }
    }
    out
}

fn mul_const_int(eg: &TEGraph, id: Id) -> Vec<Term> {
    if !eg[id].data.ty.dtype.is_int() {
        return vec![];
    }
    let mut out = Vec::new();
    for n in nodes_where(eg, id, |o| *o == Op::Binary(BinaryOp::Mul)) {
        let (inner, c2) = (n.children[0], n.children[1]);
        if eg[c2].data.known.is_none() {
            continue;
        }
        for m in nodes_where(eg, inner, |o| *o == Op::Binary(BinaryOp::Mul)) {
            let (x, c1) = (m.children[0], m.children[1]);
            if eg[c1].data.known.is_some() && eg[x].data.known.is_none() {
                let product = Term::node(Op::Binary(BinaryOp::Mul), vec![Term::Class(c1), Term::Class(c2)]);
                out.push(Term::node(Op::Binary(BinaryOp::Mul), vec![Term::Class(x), product]));
            }
        }
    }
    out
}

/// The permutation swapping the last two of `rank` axes.
fn swap_last_two(rank: usize) -> Vec<usize> {
    let mut p: Vec<usize> = (0..rank).collect();
    p.swap(rank - 1, rank - 2);
    p
}

fn transpose_of_matmul(eg: &TEGraph, id: Id) -> Vec<Term> {
    let rank = eg[id].data.ty.shape.rank();
    if rank < 2 {
        return vec![];
    }
    let swap = swap_last_two(rank);
    let mut out = Vec::new();
    for n in nodes_where(eg, id, |o| matches!(o, Op::Transpose { perm } if *perm == swap)) {
        for m in nodes_where(eg, n.children[0], |o| *o == Op::MatMul) {
            let (a, b) = (m.children[0], m.children[1]);
            // Same-rank operands only: then the batch dims need no broadcast reordering.
            if eg[a].data.ty.shape.rank() != rank || eg[b].data.ty.shape.rank() != rank {
                continue;
            }
            let t = |x: Id| Term::node(Op::Transpose { perm: swap.clone() }, vec![Term::Class(x)]);
            out.push(Term::node(Op::MatMul, vec![t(b), t(a)]));
        }
    }
    out
}
