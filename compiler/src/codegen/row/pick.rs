//! Sums that pick one element of the row: `sum_j select(j == r, f(j), 0)` for a
//! row-level integer `r` (cross-entropy's label logit, written as a one-hot mask over the
//! class index) is `f(r)` when `0 <= r < n` and `0` otherwise. The stage then reads one
//! element instead of passing over the row: the same value (a sum of zeros and one
//! term), without the pass.

use graphc_ir::{BinaryOp, DType, ReduceOp, UnaryOp};

use super::RowFields;
use crate::kernel::{Expr, ExprId, Stage};

/// The row-level index `r` a stage picks its one element at, when it is such a sum
/// over a rank-1 row (`elem`: per expression, whether it varies along the row).
pub(super) fn picked_index(k: RowFields, elem: &[bool], stage: &Stage) -> Option<ExprId> {
    if stage.op != ReduceOp::Sum || k.inner.len() != 1 || !k.body.dtype(stage.value).is_float() {
        return None;
    }
    zero_unless_hit(k, elem, stage.value, 0)
}

/// `id` is 0 wherever `j != r`: a select on `j == r` whose other branch is a zero, or a
/// negation or float cast of one (not a product: `0 * inf` is not 0). Returns `r`.
fn zero_unless_hit(k: RowFields, elem: &[bool], id: ExprId, depth: usize) -> Option<ExprId> {
    if depth > 8 {
        return None;
    }
    let (e, d) = k.body.exprs.get(id.index())?;
    match e {
        Expr::Unary(UnaryOp::Neg, x) => zero_unless_hit(k, elem, *x, depth + 1),
        Expr::Cast(x) if d.is_float() && k.body.dtype(*x).is_float() => zero_unless_hit(k, elem, *x, depth + 1),
        Expr::Select(c, _, z) if is_zero(k, *z) => hit_index(k, elem, *c),
        _ => None,
    }
}

fn is_zero(k: RowFields, id: ExprId) -> bool {
    matches!(k.body.exprs.get(id.index()), Some((Expr::Const(t), d)) if d.is_float() && t.to_f64_vec().first() == Some(&0.0))
}

/// `c` is `j == r` (either order) for the row's index `j` (an integer) and a row-level
/// integer `r`: returns `r`.
fn hit_index(k: RowFields, elem: &[bool], c: ExprId) -> Option<ExprId> {
    let (Expr::Binary(BinaryOp::Eq, a, b), _) = k.body.exprs.get(c.index())? else {
        return None;
    };
    let ro = k.outer.len() as u32;
    let is_index =
        |x: ExprId| matches!(k.body.exprs.get(x.index()), Some((Expr::Index(n), d)) if *n == ro && is_int(*d));
    let row_int = |x: ExprId| !elem.get(x.index()).copied().unwrap_or(true) && is_int(k.body.dtype(x));
    if is_index(*a) && row_int(*b) {
        Some(*b)
    } else if is_index(*b) && row_int(*a) {
        Some(*a)
    } else {
        None
    }
}

fn is_int(d: DType) -> bool {
    matches!(d, DType::I64 | DType::I32)
}
