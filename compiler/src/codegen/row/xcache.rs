//! Values kept in registers across a row's passes, not only inputs: an expression that
//! varies along the row, needs no stage, is read by two or more passes, and whose
//! operands (down to its loads) nothing else reads is computed once, where the
//! register cache is loaded, and read from there by every pass. A pre-norm residual
//! `x + h` rounded to bf16 is then added and rounded once a row instead of once per
//! pass, and one register per element holds it instead of two (for `x` and `h`).

use super::RowFields;
use crate::codegen::cuda;
use crate::kernel::{Expr, ExprId};

/// The expressions to keep (maximal: none inside another's operands), and per
/// expression whether it is an operand of one of them (computed only with it).
pub(super) struct Kept {
    pub exprs: Vec<ExprId>,
    pub inner: Vec<bool>,
}

impl Kept {
    /// None kept, over a body of `n` expressions.
    pub fn none(n: usize) -> Kept {
        Kept {
            exprs: Vec::new(),
            inner: vec![false; n],
        }
    }

    /// Whether `id` is computed only as part of a kept value.
    pub fn is_inner(&self, id: ExprId) -> bool {
        self.inner.get(id.index()).copied().unwrap_or(false)
    }
}

/// `passes`: each pass's expressions; `counted`: whether a pass is one over the row (a
/// picked stage's is not); `stored`: the values the kernel stores.
pub(super) fn kept_exprs(
    k: RowFields,
    elem: &[bool],
    stage_dep: &[Option<usize>],
    passes: &[Vec<ExprId>],
    counted: &[bool],
    stored: &[ExprId],
) -> Kept {
    let n = k.body.exprs.len();
    let mut users: Vec<Vec<ExprId>> = vec![Vec::new(); n];
    for id in k.body.ids() {
        for o in cuda::operands(&k.body.exprs[id.index()].0) {
            if let Some(u) = users.get_mut(o.index()) {
                u.push(id);
            }
        }
    }
    let in_passes = |id: ExprId| {
        passes
            .iter()
            .zip(counted)
            .filter(|(p, &c)| c && p.contains(&id))
            .count()
    };
    let computed = |id: ExprId| {
        matches!(
            k.body.exprs[id.index()].0,
            Expr::Unary(..) | Expr::Binary(..) | Expr::Select(..) | Expr::Cast(_)
        )
    };
    // Whether every operand of `e` (down to its leaves) is read only within them.
    let sealed = |e: ExprId, inside: &[ExprId]| {
        inside
            .iter()
            .filter(|&&i| i != e)
            .all(|&i| !stored.contains(&i) && users[i.index()].iter().all(|u| inside.contains(u)))
    };
    let mut exprs: Vec<ExprId> = Vec::new();
    let mut closures: Vec<Vec<ExprId>> = Vec::new();
    let ids: Vec<ExprId> = k.body.ids().collect();
    for &id in ids.iter().rev() {
        let i = id.index();
        if !elem[i] || stage_dep[i].is_some() || !computed(id) || in_passes(id) < 2 {
            continue;
        }
        if closures.iter().any(|c| c.contains(&id)) {
            continue;
        }
        // Its operands that vary along the row (row-level ones are computed once a
        // row, before the cache is loaded).
        let inside: Vec<ExprId> = cuda::closure(k.body, &[id], &|x| !elem[x.index()])
            .into_iter()
            .filter(|x| elem[x.index()])
            .collect();
        let leaves_ok = inside.iter().all(|&i| {
            matches!(
                k.body.exprs[i.index()].0,
                Expr::Load(_) | Expr::Unary(..) | Expr::Binary(..) | Expr::Select(..) | Expr::Cast(_)
            ) && stage_dep[i.index()].is_none()
        });
        if leaves_ok && sealed(id, &inside) {
            exprs.push(id);
            closures.push(inside);
        }
    }
    let mut inner = vec![false; n];
    for (e, c) in exprs.iter().zip(&closures) {
        for &i in c {
            if i != *e {
                inner[i.index()] = true;
            }
        }
    }
    exprs.reverse();
    Kept { exprs, inner }
}
