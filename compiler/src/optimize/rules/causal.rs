//! A causal mask proved from its structure, in time and memory linear in the sequence
//! length (and a logarithm), up to 2^18 positions, so that recognizing it does not
//! cost `n²`.
//!
//! Exported models build the causal mask from position indices: `k[j] <= q[i]` over
//! broadcasts of a key vector `k` (along the last axis) and a query vector `q` (along
//! the one before), often `and`-ed with terms that are true everywhere (a padding mask
//! of ones, "same packed sequence" tests of equal document ids). Evaluating such a
//! mask at its full `[n, n]` shape costs `n²` time and memory (3 s and 0.7 GB at 4096;
//! past 2^24 elements it is not evaluated at all, and the attention then keeps an
//! explicit mask). Here each vector is evaluated exactly at its own size, and:
//! - the mask is a conjunction (`and`) of atoms;
//! - a vector is what a broadcast reads (a `[.., n, 1]` or `[.., 1, n]` value, with
//!   leading axes of extent 1 or the mask's), or an iota over the whole `[.., n, n]`
//!   along one of the last two axes (the builder's causal mask: `0..n` along it);
//! - an atom is true everywhere (a splat of true; a broadcast of a value that varies
//!   over neither of the last two axes and is all true; `eq` of two vectors that hold
//!   one and the same value), or a comparison of a key vector with a query vector,
//!   `k[j] <= q[i]` or `k[j] < q[i]` in either operand order, with `k`
//!   non-decreasing: in row `i` it keeps the keys `j < ub(i)`, the number of `k[j]`
//!   at most (below) `q[i]`, found by binary search;
//! - the mask is causal when there is at least one comparison and every row `i` keeps
//!   exactly `0..=i`. Anything else is not proved here (the caller may still evaluate
//!   a small mask in full).
//!
//! Sound for what it accepts: every element of the mask is the conjunction of its
//! atoms' elements, and each atom's elements are what the exact vectors say.

use egg::Id;
use graphc_ir::{BinaryOp, Op};

use crate::optimize::analysis::TEGraph;
use crate::optimize::rule::nodes_where;

use super::attention::{evaluate, unbroadcast, Evaluated, MAX_MASK_EVAL};

/// How deep a vector's computation is followed (a cumulative sum lowered to
/// `log2(n)` shifted additions of a 2^24-long vector is 48 levels).
const VECTOR_DEPTH: usize = 96;

/// How many `and`s deep the conjunction is followed.
const MAX_ATOMS_DEPTH: usize = 16;

/// What one proof evaluates: its vectors and every intermediate of their computation,
/// at most [`MAX_MASK_EVAL`] elements in all (a cumulative sum over 2^18 positions keeps
/// 36 vectors of that length; per-batch vectors of a large batch are not evaluated,
/// and the proof is left to a later, simplified form of the mask, whose vectors do not
/// repeat over the batch).
type Memo = Evaluated;

/// Along which of the mask's last two axes a broadcast vector varies.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Along {
    /// Neither: one value (per leading index).
    None,
    /// The queries (`i`, the second-to-last axis).
    Queries,
    /// The keys (`j`, the last axis).
    Keys,
}

/// The exact value of what a class broadcasts, seen from the mask: one vector (or
/// value) per index of the mask's leading axes (batch, heads), where an axis of extent
/// 1 serves every index.
struct Vector {
    along: Along,
    /// The leading axes' extents (1 or the mask's).
    lead: Vec<usize>,
    /// Elements per vector: `n`, or 1 for [`Along::None`].
    len: usize,
    values: Vec<f64>,
}

impl Vector {
    /// The vector at the mask's leading index `at`.
    fn at(&self, at: &[usize]) -> &[f64] {
        let flat = self
            .lead
            .iter()
            .zip(at)
            .fold(0, |f, (&d, &i)| f * d + if d == 1 { 0 } else { i });
        &self.values[flat * self.len..(flat + 1) * self.len]
    }
}

/// The mask's shape, split: its leading axes and the length `n` of the last two.
struct MaskShape {
    lead: Vec<usize>,
    n: usize,
}

impl MaskShape {
    /// Every leading index, in row-major order.
    fn leading_indices(&self) -> Vec<Vec<usize>> {
        let mut out = vec![vec![]];
        for &d in &self.lead {
            out = out
                .into_iter()
                .flat_map(|p| {
                    (0..d).map(move |i| {
                        let mut q = p.clone();
                        q.push(i);
                        q
                    })
                })
                .collect();
        }
        out
    }
}

/// The longest mask proved: the vectors and every intermediate of their computation
/// are held while it runs (a cumulative sum lowered to `2 log2(n)` steps keeps as many
/// vectors), about 100 MiB at this length; longer masks are left to the caller.
const MAX_LENGTH: usize = 1 << 18;

/// Leading indices and rows checked at most (`batch * heads * n`): beyond, the
/// structure is not checked (the caller then does not evaluate the mask either).
const MAX_ROWS: usize = 1 << 26;

/// Whether the boolean class `id`, of shape `[.., n, n]`, is true exactly where
/// `j <= i` for every leading index, proved from its structure (see the module doc).
pub(super) fn causal_by_structure(eg: &TEGraph, id: Id) -> bool {
    let dims = eg[id].data.ty.shape.dims().to_vec();
    let r = dims.len();
    if r < 2 || dims[r - 1] != dims[r - 2] || dims[r - 1] < 2 || dims[r - 1] > MAX_LENGTH {
        return false;
    }
    let shape = MaskShape {
        lead: dims[..r - 2].to_vec(),
        n: dims[r - 1],
    };
    if dims[..r - 1]
        .iter()
        .try_fold(1usize, |a, &d| a.checked_mul(d))
        .is_none_or(|rows| rows > MAX_ROWS)
    {
        return false;
    }
    let mut atoms = Vec::new();
    if !conjunction(eg, id, MAX_ATOMS_DEPTH, &mut atoms) {
        return false;
    }
    let leading = shape.leading_indices();
    let mut memo = Memo::with_budget(MAX_MASK_EVAL);
    // Per leading index, the keys each row keeps: `0..keep[l][i]`.
    let mut keep: Option<Vec<Vec<usize>>> = None;
    for atom in atoms {
        if always_true(eg, atom, &shape, &mut memo) {
            continue;
        }
        let Some(bounds) = prefix_bounds(eg, atom, &shape, &leading, &mut memo) else {
            return false;
        };
        keep = Some(match keep {
            None => bounds,
            Some(k) => k
                .iter()
                .zip(&bounds)
                .map(|(a, b)| a.iter().zip(b).map(|(&x, &y)| x.min(y)).collect())
                .collect(),
        });
    }
    keep.is_some_and(|k| k.iter().all(|rows| rows.iter().enumerate().all(|(i, &ub)| ub == i + 1)))
}

/// The atoms of `id` as a conjunction: both sides of an `and`, recursively.
fn conjunction(eg: &TEGraph, id: Id, depth: usize, out: &mut Vec<Id>) -> bool {
    let id = eg.find(id);
    // An `and` with the class itself as an operand (`x and true` merged with `x`) is
    // no conjunction to split; nor one past the depth: the class is then one atom.
    for node in nodes_where(eg, id, |o| *o == Op::Binary(BinaryOp::And)) {
        if depth == 0 || node.children.iter().any(|&c| eg.find(c) == id) {
            continue;
        }
        let mut atoms = Vec::new();
        if node.children.iter().all(|&c| conjunction(eg, c, depth - 1, &mut atoms)) {
            out.extend(atoms);
            return true;
        }
    }
    out.push(id);
    true
}

/// What `id` broadcasts, evaluated exactly: `None` when it varies over both of the
/// last two axes, has a leading axis the mask does not, or cannot be evaluated.
fn vector(eg: &TEGraph, id: Id, shape: &MaskShape, memo: &mut Memo) -> Option<Vector> {
    let src = unbroadcast(eg, id);
    let sdims = eg[src].data.ty.shape.dims().to_vec();
    let r = shape.lead.len() + 2;
    if sdims.len() > r {
        return None;
    }
    let mut padded = vec![1usize; r - sdims.len()];
    padded.extend_from_slice(&sdims);
    let lead = padded[..r - 2].to_vec();
    if lead.iter().zip(&shape.lead).any(|(&d, &m)| d != 1 && d != m) {
        return None;
    }
    let n = shape.n;
    // An iota over the whole `[.., n, n]` counts along one of the two axes.
    let iota = nodes_where(eg, src, |o| matches!(o, Op::Iota { .. })).find_map(|node| match node.op() {
        Op::Iota { axis, .. } if sdims.len() >= 2 && padded[r - 2..] == [n, n] => {
            let axis = axis + (r - sdims.len());
            (axis + 2 >= r).then_some(axis)
        }
        _ => None,
    });
    if let Some(axis) = iota {
        return Some(Vector {
            along: if axis == r - 1 { Along::Keys } else { Along::Queries },
            lead: vec![1; r - 2],
            len: n,
            values: (0..n).map(|x| x as f64).collect(),
        });
    }
    let (along, len) = match (padded[r - 2], padded[r - 1]) {
        (1, 1) => (Along::None, 1),
        (q, 1) if q == n => (Along::Queries, n),
        (1, k) if k == n => (Along::Keys, n),
        _ => return None,
    };
    let values = evaluate(eg, src, VECTOR_DEPTH, memo)?.to_f64_vec();
    (values.len() == lead.iter().product::<usize>() * len).then_some(Vector {
        along,
        lead,
        len,
        values,
    })
}

/// Whether atom `id` is true everywhere.
fn always_true(eg: &TEGraph, id: Id, shape: &MaskShape, memo: &mut Memo) -> bool {
    if let Some(v) = vector(eg, id, shape, memo).filter(|v| v.along == Along::None) {
        return v.values.iter().all(|&x| x != 0.0);
    }
    nodes_where(eg, id, |o| *o == Op::Binary(BinaryOp::Eq)).any(|node| {
        let (Some(a), Some(b)) = (
            vector(eg, node.children[0], shape, memo),
            vector(eg, node.children[1], shape, memo),
        ) else {
            return false;
        };
        a.values
            .first()
            .is_some_and(|&x| !x.is_nan() && a.values.iter().chain(&b.values).all(|&y| y == x))
    })
}

/// For an atom `k[j] <= q[i]` (or `<`), with every key vector non-decreasing: per
/// leading index, the number of keys each row keeps (a prefix of them).
fn prefix_bounds(
    eg: &TEGraph,
    id: Id,
    shape: &MaskShape,
    leading: &[Vec<usize>],
    memo: &mut Memo,
) -> Option<Vec<Vec<usize>>> {
    let comparisons = nodes_where(eg, id, |o| {
        matches!(o, Op::Binary(BinaryOp::Le | BinaryOp::Lt | BinaryOp::Ge | BinaryOp::Gt))
    });
    for node in comparisons {
        let Op::Binary(op) = node.op() else { continue };
        let (x, y) = (node.children[0], node.children[1]);
        // As `lhs <= rhs` or `lhs < rhs`.
        let (lhs, rhs, strict) = match op {
            BinaryOp::Le => (x, y, false),
            BinaryOp::Lt => (x, y, true),
            BinaryOp::Ge => (y, x, false),
            _ => (y, x, true),
        };
        let (Some(k), Some(q)) = (vector(eg, lhs, shape, memo), vector(eg, rhs, shape, memo)) else {
            continue;
        };
        if k.along != Along::Keys || q.along != Along::Queries || k.values.iter().chain(&q.values).any(|v| v.is_nan()) {
            continue;
        }
        let mut out = Vec::with_capacity(leading.len());
        for at in leading {
            let (kv, qv) = (k.at(at), q.at(at));
            if kv.windows(2).any(|w| w[0] > w[1]) {
                return None;
            }
            out.push(
                qv.iter()
                    .map(|&qi| {
                        if strict {
                            kv.partition_point(|&kj| kj < qi)
                        } else {
                            kv.partition_point(|&kj| kj <= qi)
                        }
                    })
                    .collect(),
            );
        }
        return Some(out);
    }
    None
}
