//! Scaled dot-product attention, spelled out by front ends and the builder,
//! recognized as the IR's `attention` op: one kernel that never stores the scores.
//!
//! `attention`: `matmul(softmax(mask(scale(matmul(q, kᵀ)))), v)`, where
//! - the softmax is the importer's and the builder's decomposition over the last axis,
//!   `e / broadcast(reduce_sum(e))` with `e = exp(s - broadcast(reduce_max(s)))`;
//! - the mask is none, an additive `s + m` (either order; `m` a broadcast of a small
//!   tensor is kept at its small shape, so a padding mask stays `[b, 1, 1, sk]`), a
//!   `select(cond, s, fill)` with `fill` `-inf` or at most -1e30 (the dtype's lowest, as
//!   transformers' masks use; becomes the additive `select(cond, 0, fill)` at the
//!   condition's small shape), or one of each; a known mask (a folded constant or
//!   weight) that is exactly the causal pattern (0 / true on and below the diagonal,
//!   at most -1e30 / false above it, for every batch and head) becomes `causal=true`
//!   with no mask operand; so does a mask computed only from constants and iota (the
//!   position indices of a dynamic export) that `causal.rs` proves causal from its
//!   structure (comparisons of position vectors, at any length), or whose value,
//!   evaluated once at its small shape (at most 2^24 elements), is that pattern;
//! - the scale is a multiplication by a known scalar (either order), a division by one,
//!   or none (a scale folded into q stays in q's computation);
//! - `kᵀ` is un-transposed (a transpose of the last two axes of k, or a transpose into
//!   that layout from another);
//! - k and v heads repeated for grouped-query attention (`reshape` to add an axis,
//!   `broadcast` it to the group, `reshape` back, as Llama exports do) are read from
//!   the kv heads directly.
//!
//! Not bit-exact (README.md's documented exceptions): the op applies the scale and the
//! mask in f32 where the spelled-out graph rounded each op to the dtype, and a
//! `select` with the dtype's lowest becomes an addition of it (`x + lowest` rounds to
//! `lowest` for every |x| < 1e31, so the softmax is the same). Tested against the
//! spelled-out graphs within 1e-5 (f32).

use std::collections::HashMap;
use std::sync::Arc;

use egg::{Id, Rewrite};
use graphc_ir::interp::eval_op;
use graphc_ir::{AttentionDims, BinaryOp, DType, Op, ReduceOp, Shape, Tensor, TensorType, UnaryOp};

use crate::optimize::analysis::{Known, TEGraph, TensorAnalysis};
use crate::optimize::lang::TNode;
use crate::optimize::rule::{nodes_where, rule, Term};

use super::causal::causal_by_structure;
use super::composite::{same, scalar};

pub fn rules() -> Vec<Rewrite<TNode, TensorAnalysis>> {
    vec![
        rule("attention", attention),
        rule("attention-causal-mask", attention_causal_mask),
    ]
}

/// An attention op whose mask operand is the causal pattern (a static export's folded
/// mask given to ONNX's Attention op) is the causal attention without the mask.
fn attention_causal_mask(eg: &TEGraph, id: Id) -> Vec<Term> {
    for n in nodes_where(eg, id, |o| matches!(o, Op::Attention { .. })) {
        let (
            Op::Attention {
                scale,
                zero_masked_rows,
                ..
            },
            [q, k, v, m],
        ) = (n.op(), &n.children[..])
        else {
            continue;
        };
        if is_causal(eg, unbroadcast(eg, *m), MaskForm::Additive) {
            let op = Op::Attention {
                scale: *scale,
                causal: true,
                zero_masked_rows: *zero_masked_rows,
            };
            return vec![Term::node(op, vec![Term::Class(*q), Term::Class(*k), Term::Class(*v)])];
        }
    }
    vec![]
}

/// A fill value that masks a score out: `-inf`, or a finite value so negative that
/// adding any score to it leaves it (transformers use the dtype's lowest).
const MASK_FILL: f64 = -1e30;

fn ty(eg: &TEGraph, id: Id) -> &TensorType {
    &eg[id].data.ty
}

/// Whether `id` is `reduce_op` over the last axis with keepdims, of `of`.
fn is_last_axis_reduce(eg: &TEGraph, id: Id, op: ReduceOp, of: Id) -> bool {
    let rank = ty(eg, of).shape.rank();
    let found = nodes_where(
        eg,
        id,
        |o| matches!(o, Op::Reduce { op: r, axes, keepdims: true } if *r == op && axes[..] == [rank - 1]),
    )
    .any(|n| same(eg, n.children[0], of));
    found
}

/// Whether `id` is a broadcast of a last-axis `op` reduction of `of`.
fn is_broadcast_reduce(eg: &TEGraph, id: Id, op: ReduceOp, of: Id) -> bool {
    nodes_where(eg, id, |o| matches!(o, Op::Broadcast { .. })).any(|n| is_last_axis_reduce(eg, n.children[0], op, of))
}

/// The scores `s` of a class that is `softmax(s)` over the last axis, spelled out.
fn softmax_input(eg: &TEGraph, p: Id) -> Option<Id> {
    for div in nodes_where(eg, p, |o| *o == Op::Binary(BinaryOp::Div)) {
        let (e, sum) = (div.children[0], div.children[1]);
        if !is_broadcast_reduce(eg, sum, ReduceOp::Sum, e) {
            continue;
        }
        for exp in nodes_where(eg, e, |o| *o == Op::Unary(UnaryOp::Exp)) {
            for sub in nodes_where(eg, exp.children[0], |o| *o == Op::Binary(BinaryOp::Sub)) {
                let (s, max) = (sub.children[0], sub.children[1]);
                if is_broadcast_reduce(eg, max, ReduceOp::Max, s) {
                    return Some(s);
                }
            }
        }
    }
    None
}

/// The smallest class `id` is a broadcast of (or `id` itself).
pub(super) fn unbroadcast(eg: &TEGraph, id: Id) -> Id {
    super::broadcast::smallest_broadcast_source(eg, id).unwrap_or(id)
}

/// An additive mask at its small shape, and that shape.
type SmallMask = (Term, Vec<usize>);

/// A mask found around the scores.
#[derive(Clone, Debug)]
struct Masks {
    /// The scores under the masks.
    inner: Id,
    causal: bool,
    /// The additive mask at its small shape (before padding to the scores' rank).
    additive: Option<SmallMask>,
}

/// Whether element `(i, j)` of every `[.., sq, sk]` matrix of `t` is what `keep(i, j)`
/// says: `on(value)` where `j <= i`, `off(value)` above the diagonal.
fn is_causal_pattern(t: &Tensor, on: impl Fn(f64) -> bool, off: impl Fn(f64) -> bool) -> bool {
    let dims = t.shape().dims();
    let (Some(&sk), Some(&sq)) = (dims.last(), dims.len().checked_sub(2).and_then(|i| dims.get(i))) else {
        return false;
    };
    if sq != sk || sq < 2 {
        return false;
    }
    t.to_f64_vec().chunks(sk).enumerate().all(|(r, row)| {
        let i = r % sq;
        row.iter()
            .enumerate()
            .all(|(j, &x)| if j <= i { on(x) } else { off(x) })
    })
}

/// Masks are evaluated (when not already known) up to this many elements: a
/// `[1, 1, 4096, 4096]` causal mask.
pub(super) const MAX_MASK_EVAL: usize = 1 << 24;

/// A whole mask is evaluated with its intermediates up to this many elements in all
/// (a 4096 x 4096 mask and three intermediates of its size).
const WHOLE_MASK_BUDGET: usize = 4 * MAX_MASK_EVAL;

/// The values one question about a mask has evaluated, and the elements they hold:
/// evaluation stops (`None`) before the values held would pass the budget, so the work
/// and memory of a proof stay bounded whatever the leading (batch) dimensions are.
pub(super) struct Evaluated {
    values: HashMap<Id, Option<Arc<Tensor>>>,
    elements: usize,
    budget: usize,
}

impl Evaluated {
    /// Up to `budget` elements evaluated in all (each class at most [`MAX_MASK_EVAL`]).
    pub(super) fn with_budget(budget: usize) -> Evaluated {
        Evaluated {
            values: HashMap::new(),
            elements: 0,
            budget,
        }
    }
}

/// The value of a class computed only from known classes (constants, iota, weights),
/// evaluated with the interpreter at the class's own shape, or `None` (an input
/// reaches it, it is larger than [`MAX_MASK_EVAL`] or than what is left of the budget
/// of `memo`, or deeper than `depth`).
pub(super) fn evaluate(eg: &TEGraph, id: Id, depth: usize, memo: &mut Evaluated) -> Option<Arc<Tensor>> {
    let id = eg.find(id);
    if let Some(v) = memo.values.get(&id) {
        return v.clone();
    }
    let ty = &eg[id].data.ty;
    let numel = ty.numel();
    let mut value = None;
    if numel <= MAX_MASK_EVAL && numel <= memo.budget.saturating_sub(memo.elements) {
        memo.elements += numel;
        graphc_ir::work::add_len(graphc_ir::work::Stage::Optimize, numel);
        if let Some(k) = &eg[id].data.known {
            value = Some(match k {
                Known::Full(t) => t.clone(),
                Known::Splat(_) => Arc::new(k.materialize(ty)),
            });
        } else if depth > 0 {
            memo.values.insert(id, None); // no cycles
            for n in &eg[id].nodes {
                if matches!(n.op(), Op::Input { .. } | Op::Parameter { .. }) {
                    continue;
                }
                let Some(args) = n
                    .children
                    .iter()
                    .map(|&c| evaluate(eg, c, depth - 1, memo))
                    .collect::<Option<Vec<_>>>()
                else {
                    continue;
                };
                let refs: Vec<&Tensor> = args.iter().map(|a| &**a).collect();
                if let Ok(t) = eval_op(n.op(), &refs, ty) {
                    value = Some(Arc::new(t));
                    break;
                }
            }
        }
    }
    memo.values.insert(id, value.clone());
    value
}

/// How a mask class reads.
#[derive(Clone, Copy, PartialEq, Eq)]
enum MaskForm {
    /// A condition true where a score is kept (`select(cond, s, fill)`, `torch.where`).
    Kept,
    /// A condition true where a score is masked out (`select(cond, fill, s)`, what
    /// `masked_fill(mask, -inf)` exports to).
    Masked,
    /// An additive mask (0 where kept, a fill at most -1e30 elsewhere).
    Additive,
}

/// Whether the mask class `id`, read as `form`, is the causal pattern (kept on and
/// below the diagonal, masked above it, for every leading index), evaluated once per
/// class and form and cached in the analysis.
fn is_causal(eg: &TEGraph, id: Id, form: MaskForm) -> bool {
    let id = eg.find(id);
    let key = (id, form as u8);
    if let Ok(cache) = eg.analysis.causal_masks.lock() {
        if let Some(&c) = cache.get(&key) {
            return c;
        }
    }
    // From the structure first (linear in the length, so the same at every length),
    // then, for a mask small enough, by evaluating it whole.
    let causal =
        match form {
            MaskForm::Kept => causal_by_structure(eg, id),
            // (The structural proof is of a kept-where-true condition.)
            MaskForm::Masked => false,
            MaskForm::Additive => {
                additive_select(eg, id).is_some_and(|cond| causal_by_structure(eg, unbroadcast(eg, cond)))
            }
        } || evaluate(eg, id, 24, &mut Evaluated::with_budget(WHOLE_MASK_BUDGET)).is_some_and(|t| match form {
            MaskForm::Kept => is_causal_pattern(&t, |v| v != 0.0, |v| v == 0.0),
            MaskForm::Masked => is_causal_pattern(&t, |v| v == 0.0, |v| v != 0.0),
            MaskForm::Additive => is_causal_pattern(&t, |v| v == 0.0, |v| v <= MASK_FILL),
        });
    if let Ok(mut cache) = eg.analysis.causal_masks.lock() {
        cache.insert(key, causal);
    }
    causal
}

/// The condition `c` of an additive mask spelled `select(c, 0, fill)` (0 where kept,
/// a fill that masks out elsewhere).
fn additive_select(eg: &TEGraph, id: Id) -> Option<Id> {
    nodes_where(eg, id, |o| *o == Op::Select)
        .find(|n| scalar(eg, n.children[1]) == Some(0.0) && is_fill(eg, n.children[2]).is_some())
        .map(|n| n.children[0])
}

fn is_fill(eg: &TEGraph, id: Id) -> Option<f64> {
    scalar(eg, id).filter(|&x| x <= MASK_FILL)
}

/// The ways `s` is masked scores: none, additive, `select`, or two of them nested.
fn masks(eg: &TEGraph, s: Id, depth: usize) -> Vec<Masks> {
    let mut out = vec![Masks {
        inner: s,
        causal: false,
        additive: None,
    }];
    if depth == 0 {
        return out;
    }
    let dtype = ty(eg, s).dtype;
    // (the scores under one mask, causal, the additive mask at its small shape)
    let mut found: Vec<(Id, bool, Option<SmallMask>)> = Vec::new();
    for add in nodes_where(eg, s, |o| *o == Op::Binary(BinaryOp::Add)) {
        for (x, m) in [(add.children[0], add.children[1]), (add.children[1], add.children[0])] {
            let small = unbroadcast(eg, m);
            if is_causal(eg, small, MaskForm::Additive) {
                found.push((x, true, None));
                continue;
            }
            found.push((
                x,
                false,
                Some((Term::Class(small), ty(eg, small).shape.dims().to_vec())),
            ));
        }
    }
    for sel in nodes_where(eg, s, |o| *o == Op::Select) {
        let (cond, a, b) = (sel.children[0], sel.children[1], sel.children[2]);
        // `select(cond, s, fill)`, kept where `cond`; `select(cond, fill, s)`
        // (`masked_fill`), masked out where `cond`.
        for (x, fill, form) in [(a, b, MaskForm::Kept), (b, a, MaskForm::Masked)] {
            let Some(f) = is_fill(eg, fill) else { continue };
            let small = unbroadcast(eg, cond);
            if is_causal(eg, small, form) {
                found.push((x, true, None));
                continue;
            }
            let dims = ty(eg, small).shape.dims().to_vec();
            let splat = |v: f64| {
                Term::node(
                    Op::Broadcast {
                        shape: Shape::new(&dims[..]),
                    },
                    vec![Term::node(
                        Op::Constant {
                            value: Tensor::scalar(dtype, v),
                        },
                        vec![],
                    )],
                )
            };
            let (kept, masked) = (splat(0.0), splat(f));
            let values = match form {
                MaskForm::Masked => vec![Term::Class(small), masked, kept],
                _ => vec![Term::Class(small), kept, masked],
            };
            let additive = Term::node(Op::Select, values);
            found.push((x, false, Some((additive, dims))));
        }
    }
    for (x, causal, additive) in found {
        for m in masks(eg, x, depth - 1) {
            if (m.causal && causal) || (m.additive.is_some() && additive.is_some()) {
                continue;
            }
            out.push(Masks {
                inner: m.inner,
                causal: m.causal || causal,
                additive: m.additive.or_else(|| additive.clone()),
            });
        }
    }
    out
}

/// `(unscaled, scale)` for each way `id` is a scaling of scores.
fn scales(eg: &TEGraph, id: Id) -> Vec<(Id, f64)> {
    let mut out = vec![(id, 1.0)];
    for n in nodes_where(eg, id, |o| *o == Op::Binary(BinaryOp::Mul)) {
        let (a, b) = (n.children[0], n.children[1]);
        if let Some(c) = scalar(eg, b) {
            out.push((a, c));
        }
        if let Some(c) = scalar(eg, a) {
            out.push((b, c));
        }
    }
    for n in nodes_where(eg, id, |o| *o == Op::Binary(BinaryOp::Div)) {
        if let Some(c) = scalar(eg, n.children[1]).filter(|c| *c != 0.0) {
            out.push((n.children[0], 1.0 / c));
        }
    }
    out.retain(|(_, c)| c.is_finite());
    out
}

/// `(kv, group)`: a class that is `kv` with its heads (axis -3) each repeated `group`
/// times by reshape / broadcast / reshape.
fn repeated_heads(eg: &TEGraph, id: Id) -> Option<(Id, usize)> {
    let dims = ty(eg, id).shape.dims();
    let r = dims.len();
    for outer in nodes_where(eg, id, |o| matches!(o, Op::Reshape { .. })) {
        let b = outer.children[0];
        for bc in nodes_where(eg, b, |o| matches!(o, Op::Broadcast { .. })) {
            let e = bc.children[0];
            let (bd, ed) = (ty(eg, b).shape.dims(), ty(eg, e).shape.dims());
            // [b.., hkv, g, s, d] from [b.., hkv, 1, s, d].
            if bd.len() != r + 1 || ed.len() != r + 1 || ed[r - 2] != 1 || bd[r - 2] < 1 {
                continue;
            }
            let g = bd[r - 2];
            let mut want = bd.to_vec();
            want[r - 2] = 1;
            if ed != want
                || bd[..r - 3] != dims[..r - 3]
                || bd[r - 3] * g != dims[r - 3]
                || bd[r - 1..] != dims[r - 2..]
            {
                continue;
            }
            for inner in nodes_where(eg, e, |o| matches!(o, Op::Reshape { .. })) {
                let kv = inner.children[0];
                let kd = ty(eg, kv).shape.dims();
                let mut expect = bd.to_vec();
                expect.remove(r - 2);
                if kd == expect {
                    return Some((kv, g));
                }
            }
        }
    }
    None
}

/// `k` from `kᵀ`: the child of a transpose of the last two axes, or of that transpose
/// between two reshapes that only regroup the leading (matrix-index) axes (PyTorch's
/// export flattens `[b, h, s, d]` to `[b*h, s, d]`, transposes, and reshapes back),
/// or else that transpose.
fn untranspose(eg: &TEGraph, kt: Id) -> (Term, Option<Id>) {
    let r = ty(eg, kt).shape.rank();
    let swap = |r: usize| {
        let mut p: Vec<usize> = (0..r).collect();
        p.swap(r - 2, r - 1);
        p
    };
    let swap_r = swap(r);
    if let Some(n) = nodes_where(eg, kt, |o| matches!(o, Op::Transpose { perm } if *perm == swap_r)).next() {
        return (Term::Class(n.children[0]), Some(n.children[0]));
    }
    let ktd = ty(eg, kt).shape.dims().to_vec();
    // The last two dims of a value of at least rank 2.
    let tail = |id: Id| -> Option<[usize; 2]> {
        let d = ty(eg, id).shape.dims();
        d.len().checked_sub(2).map(|i| [d[i], d[i + 1]])
    };
    for outer in nodes_where(eg, kt, |o| matches!(o, Op::Reshape { .. })) {
        let x = outer.children[0];
        let rx = ty(eg, x).shape.rank();
        if rx < 2 || tail(x) != Some([ktd[r - 2], ktd[r - 1]]) {
            continue;
        }
        let perm_x = swap(rx);
        for t in nodes_where(eg, x, |o| matches!(o, Op::Transpose { perm } if *perm == perm_x)) {
            let y = t.children[0];
            for inner in nodes_where(eg, y, |o| matches!(o, Op::Reshape { .. })) {
                let k = inner.children[0];
                let kd = ty(eg, k).shape.dims();
                if kd.len() == r
                    && kd[..r - 2] == ktd[..r - 2]
                    && [kd[r - 2], kd[r - 1]] == [ktd[r - 1], ktd[r - 2]]
                    && tail(y) == Some([kd[r - 2], kd[r - 1]])
                {
                    return (Term::Class(k), Some(k));
                }
            }
        }
    }
    (Term::node(Op::Transpose { perm: swap_r }, vec![Term::Class(kt)]), None)
}

/// `(p, zero_masked_rows)` for each way `id` is attention probabilities: `id` itself,
/// or `p` under PyTorch's guard `select(isnan(p), 0, p)` (a row whose softmax is NaN,
/// every key masked, gives 0).
fn guarded(eg: &TEGraph, id: Id) -> Vec<(Id, bool)> {
    let mut out = vec![(id, false)];
    for sel in nodes_where(eg, id, |o| *o == Op::Select) {
        let (cond, zero, p) = (sel.children[0], sel.children[1], sel.children[2]);
        if scalar(eg, zero) != Some(0.0) {
            continue;
        }
        let nan_test = nodes_where(eg, cond, |o| *o == Op::Unary(UnaryOp::IsNan)).any(|n| same(eg, n.children[0], p));
        if nan_test {
            out.push((p, true));
        }
    }
    out
}

fn attention(eg: &TEGraph, id: Id) -> Vec<Term> {
    let out_ty = ty(eg, id).clone();
    if !out_ty.dtype.is_float() || out_ty.shape.rank() < 4 {
        return vec![];
    }
    for pv in nodes_where(eg, id, |o| *o == Op::MatMul) {
        let v = pv.children[1];
        for (p, zero_rows) in guarded(eg, pv.children[0]) {
            let Some(s) = softmax_input(eg, p) else { continue };
            let scores = ty(eg, s).shape.dims().to_vec();
            for m in masks(eg, s, 2) {
                for (t, scale) in scales(eg, m.inner) {
                    for qk in nodes_where(eg, t, |o| *o == Op::MatMul) {
                        // The scale may also sit on either operand, or be split over
                        // both (PyTorch's export multiplies q and kᵀ by √scale each):
                        // operands taken out of their scalings first, so that the op
                        // absorbs them (the unscaled operand always type-checks).
                        for (q, sq) in scales(eg, qk.children[0]).into_iter().rev() {
                            for (kt, sk) in scales(eg, qk.children[1]).into_iter().rev() {
                                let flags = Flags {
                                    scale: scale * sq * sk,
                                    zero_rows,
                                };
                                if let Some(term) = build(eg, (q, kt, v), &m, flags, &scores, &out_ty) {
                                    return vec![term];
                                }
                            }
                        }
                    }
                }
            }
        }
    }
    vec![]
}

/// The attention's scale and whether fully masked rows give 0.
#[derive(Clone, Copy)]
struct Flags {
    scale: f64,
    zero_rows: bool,
}

/// The attention term for `q`, `kᵀ`, `v` and the masks, if its type checks out as the
/// class's.
fn build(
    eg: &TEGraph,
    (q, kt, v): (Id, Id, Id),
    m: &Masks,
    flags: Flags,
    scores: &[usize],
    out_ty: &TensorType,
) -> Option<Term> {
    let dtype: DType = out_ty.dtype;
    let r = scores.len();
    let (k_term, k_class) = untranspose(eg, kt);
    let mut kd = ty(eg, kt).shape.dims().to_vec();
    kd.swap(r - 2, r - 1);
    let vd = ty(eg, v).shape.dims().to_vec();
    // Grouped-query attention: both k and v repeated by the same group.
    let (k_term, v_term, kd, vd) = match (k_class.and_then(|k| repeated_heads(eg, k)), repeated_heads(eg, v)) {
        (Some((k0, g)), Some((v0, gv))) if g == gv => (
            Term::Class(k0),
            Term::Class(v0),
            ty(eg, k0).shape.dims().to_vec(),
            ty(eg, v0).shape.dims().to_vec(),
        ),
        _ => (k_term, Term::Class(v), kd, vd),
    };
    let mut children = vec![Term::Class(q), k_term, v_term];
    let qt = ty(eg, q).clone();
    let kt_ty = TensorType::new(dtype, kd);
    let vt_ty = TensorType::new(dtype, vd);
    let mut tys = vec![qt, kt_ty, vt_ty];
    if let Some((mask, dims)) = &m.additive {
        if dims.len() > r {
            return None;
        }
        let mut padded = vec![1; r - dims.len()];
        padded.extend_from_slice(dims);
        let mask = if padded.len() == dims.len() {
            mask.clone()
        } else {
            Term::node(
                Op::Reshape {
                    shape: Shape::new(&padded[..]),
                },
                vec![mask.clone()],
            )
        };
        children.push(mask);
        tys.push(TensorType::new(dtype, padded));
    }
    let refs: Vec<&TensorType> = tys.iter().collect();
    let dims = AttentionDims::of(&refs).ok()?;
    if dims.score_dims() != scores || TensorType::new(dtype, dims.out_dims()) != *out_ty {
        return None;
    }
    Some(Term::node(
        Op::Attention {
            scale: flags.scale,
            causal: m.causal,
            zero_masked_rows: flags.zero_rows,
        },
        children,
    ))
}
