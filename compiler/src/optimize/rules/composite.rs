//! Composite ops spelled out by front ends, recognized as the IR's own op.
//!
//! `gelu-erf`: `0.5 * x * (1 + erf(x / sqrt 2))` (PyTorch's default `F.gelu`, BERT's and
//! ViT's activation; the division by `sqrt 2` or a product with `1/sqrt 2`) becomes
//! `gelu(x)`, in the same associations as the tanh form below.
//!
//! `gelu-tanh`: `0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 * x^3)))`, as PyTorch's
//! `F.gelu(approximate="tanh")` and GPT-2's `gelu_new` export to ONNX, becomes
//! `gelu_tanh(x)`: one op instead of nine, and the activation cuBLASLt applies in a GEMM
//! epilogue (so a linear layer followed by it is one GEMM, without a scratch round trip
//! through memory).
//!
//! This is the one documented exception to "exact" in README.md: the op computes the
//! same formula with its own association and constants (`x * x * x` and `sqrt(2/pi)` at
//! full precision), so results may differ in the last bits (a few ulps).
//!
//! Matched forms: the scale `0.5` on either side and at any of the three products
//! (`0.5 * (x * (1 + t))`, `(0.5 * x) * (1 + t)`, `x * (0.5 * (1 + t))`), `1 + t`
//! either way, `x + c * x^3` either way with `x^3` as `x * (x * x)`, `(x * x) * x` or
//! `pow(x, 3)`, and the constants within a relative 1e-6 or exactly as rounded to the
//! model's dtype (an f32, f16 or bf16 `sqrt(2/pi)` or `0.044715` matches).

use egg::{Id, Rewrite};
use graphc_ir::{BinaryOp, DType, Op, UnaryOp};

use crate::optimize::analysis::{Known, TEGraph, TensorAnalysis};
use crate::optimize::lang::TNode;
use crate::optimize::rule::{nodes_where, rule, Term};

pub fn rules() -> Vec<Rewrite<TNode, TensorAnalysis>> {
    vec![rule("gelu-tanh", gelu_tanh), rule("gelu-erf", gelu_erf)]
}

const SQRT_2_OVER_PI: f64 = 0.797_884_560_802_865_4;
const FRAC_1_SQRT_2: f64 = std::f64::consts::FRAC_1_SQRT_2;
const SQRT_2: f64 = std::f64::consts::SQRT_2;
const CUBIC: f64 = 0.044715;

/// The single value of a small known class (a splat or a one-element tensor); never
/// looks at a large tensor's data.
pub(super) fn scalar(eg: &TEGraph, id: Id) -> Option<f64> {
    match eg[id].data.known.as_ref()? {
        k @ Known::Splat(_) => k.splat(),
        Known::Full(t) if t.shape().numel() == 1 => t.to_f64_vec().first().copied(),
        Known::Full(_) => None,
    }
}

/// Whether `id` is known to be `v`: within `rel` (relative), or exactly `v` rounded to
/// the class's dtype (an f16 or bf16 model's constants are rounded).
fn is_const(eg: &TEGraph, id: Id, v: f64, rel: f64) -> bool {
    let rounded = match eg[id].data.ty.dtype {
        DType::F16 => half::f16::from_f64(v).to_f64(),
        DType::BF16 => half::bf16::from_f64(v).to_f64(),
        DType::F32 => v as f32 as f64,
        _ => v,
    };
    scalar(eg, id).is_some_and(|c| c == rounded || (c - v).abs() <= rel * v.abs())
}

/// The operand pairs of every `op` node of `id`, in both orders.
fn pairs(eg: &TEGraph, id: Id, op: BinaryOp) -> Vec<(Id, Id)> {
    let mut out = Vec::new();
    for n in nodes_where(eg, id, |o| *o == Op::Binary(op)) {
        let (a, b) = (n.children[0], n.children[1]);
        out.push((a, b));
        out.push((b, a));
    }
    out
}

pub(super) fn same(eg: &TEGraph, a: Id, b: Id) -> bool {
    eg.find(a) == eg.find(b)
}

/// `x^3` as `x * (x * x)`, `(x * x) * x` or `pow(x, 3)`.
fn is_cube(eg: &TEGraph, id: Id, x: Id) -> bool {
    pairs(eg, id, BinaryOp::Mul).into_iter().any(|(a, b)| {
        same(eg, a, x)
            && pairs(eg, b, BinaryOp::Mul)
                .into_iter()
                .any(|(c, d)| same(eg, c, x) && same(eg, d, x))
    }) || nodes_where(eg, id, |o| *o == Op::Binary(BinaryOp::Pow))
        .any(|n| same(eg, n.children[0], x) && is_const(eg, n.children[1], 3.0, 0.0))
}

/// `tanh(sqrt(2/pi) * (x + 0.044715 * x^3))`.
fn is_tanh_term(eg: &TEGraph, id: Id, x: Id) -> bool {
    nodes_where(eg, id, |o| *o == Op::Unary(UnaryOp::Tanh)).any(|n| {
        pairs(eg, n.children[0], BinaryOp::Mul).into_iter().any(|(k, inner)| {
            is_const(eg, k, SQRT_2_OVER_PI, 1e-6)
                && pairs(eg, inner, BinaryOp::Add).into_iter().any(|(a, b)| {
                    same(eg, a, x)
                        && pairs(eg, b, BinaryOp::Mul)
                            .into_iter()
                            .any(|(c, cube)| is_const(eg, c, CUBIC, 1e-6) && is_cube(eg, cube, x))
                })
        })
    })
}

/// `erf(x / sqrt 2)`, as `erf(x * (1/sqrt 2))` or `erf(x / sqrt 2)` (either order of
/// the product).
fn is_erf_term(eg: &TEGraph, id: Id, x: Id) -> bool {
    nodes_where(eg, id, |o| *o == Op::Unary(UnaryOp::Erf)).any(|n| {
        let arg = n.children[0];
        pairs(eg, arg, BinaryOp::Mul)
            .into_iter()
            .any(|(a, k)| same(eg, a, x) && is_const(eg, k, FRAC_1_SQRT_2, 1e-6))
            || nodes_where(eg, arg, |o| *o == Op::Binary(BinaryOp::Div))
                .any(|d| same(eg, d.children[0], x) && is_const(eg, d.children[1], SQRT_2, 1e-6))
    })
}

/// `1 + t` of `x`, for the inner term `is_term` recognizes.
fn is_one_plus(eg: &TEGraph, id: Id, x: Id, is_term: fn(&TEGraph, Id, Id) -> bool) -> bool {
    pairs(eg, id, BinaryOp::Add)
        .into_iter()
        .any(|(one, t)| is_const(eg, one, 1.0, 0.0) && is_term(eg, t, x))
}

/// The `x`s for which `id` is `0.5 * x * (1 + t(x))`, in any association of the
/// products, for the inner term `is_term` recognizes.
fn gelu_forms(eg: &TEGraph, id: Id, is_term: fn(&TEGraph, Id, Id) -> bool) -> Vec<Id> {
    let mut xs: Vec<Id> = Vec::new();
    for (p, q) in pairs(eg, id, BinaryOp::Mul) {
        // 0.5 * (x * (1 + t))
        if is_const(eg, p, 0.5, 0.0) {
            for (x, t) in pairs(eg, q, BinaryOp::Mul) {
                if is_one_plus(eg, t, x, is_term) {
                    xs.push(x);
                }
            }
        }
        // (0.5 * x) * (1 + t)
        for (half, x) in pairs(eg, p, BinaryOp::Mul) {
            if is_const(eg, half, 0.5, 0.0) && is_one_plus(eg, q, x, is_term) {
                xs.push(x);
            }
        }
        // x * (0.5 * (1 + t))
        for (half, t) in pairs(eg, q, BinaryOp::Mul) {
            if is_const(eg, half, 0.5, 0.0) && is_one_plus(eg, t, p, is_term) {
                xs.push(p);
            }
        }
    }
    xs.sort();
    xs.dedup_by(|a, b| same(eg, *a, *b));
    xs
}

fn gelu_of(eg: &TEGraph, id: Id, is_term: fn(&TEGraph, Id, Id) -> bool, op: UnaryOp) -> Vec<Term> {
    let ty = &eg[id].data.ty;
    if !ty.dtype.is_float() {
        return vec![];
    }
    gelu_forms(eg, id, is_term)
        .into_iter()
        .filter(|&x| eg[x].data.ty == *ty)
        .map(|x| Term::node(Op::Unary(op), vec![Term::Class(x)]))
        .collect()
}

fn gelu_tanh(eg: &TEGraph, id: Id) -> Vec<Term> {
    gelu_of(eg, id, is_tanh_term, UnaryOp::GeluTanh)
}

fn gelu_erf(eg: &TEGraph, id: Id) -> Vec<Term> {
    gelu_of(eg, id, is_erf_term, UnaryOp::Gelu)
}
