//! Gathers whose indices are an affine function of their own position: views, not
//! gathers.
//!
//! - `gather-affine`: `gather(x, idx)` along axis 0 of an `x` of shape `[n, rest..]`,
//!   where `idx[c] = Σ_k coef_k · c_k` over the index tensor's coordinates `c` is a
//!   row-major walk of `x`'s first axis (the nonzero coefficients are the row-major
//!   strides of their axes' extents, whose product is `n`; zero coefficients are axes
//!   the walk is repeated over) -> `broadcast(reshape(x, ..), ..)`.
//!
//! ONNX's `GatherND` is lowered to one flat gather whose index is `batch_index * s +
//! j` over iotas (PyTorch's exports index a padding mask this way, by a vmapped index
//! of every batch entry and position): at small sizes the importer folds the index to
//! a constant, at large ones it is computed. Either way it is an identity walk, and the
//! gather is a reshape, the same at every size (so a shape family is captured).
//!
//! An index is affine when it is an iota; a constant (a known splat, or a known tensor
//! of at most [`MAX_KNOWN_CHECK`] elements whose values are checked); a broadcast,
//! unit-axis reshape or integer cast of an affine index; a sum or difference of two; a
//! product with a constant; or `select(x < 0, x + d, x)` with `x` affine and never
//! negative over its extents (the wrap of negative indices, which then never fires).
//! Exact: a reshape reads the elements the gather read.

use std::collections::HashMap;

use egg::{Id, Rewrite};
use graphc_ir::{BinaryOp, Op, Shape};

use crate::optimize::analysis::{Known, TEGraph, TensorAnalysis};
use crate::optimize::lang::TNode;
use crate::optimize::rule::{nodes_where, rule, Term};

use super::composite::scalar;

pub fn rules() -> Vec<Rewrite<TNode, TensorAnalysis>> {
    vec![rule("gather-affine", gather_affine)]
}

/// Known index tensors up to this many elements are checked element by element.
const MAX_KNOWN_CHECK: usize = 1 << 20;

/// How deep an index's computation is followed.
const MAX_DEPTH: usize = 24;

/// `off + Σ_k coef[k] · c_k` over the coordinates `c` of a value of the class's shape.
#[derive(Clone, Debug, PartialEq)]
struct Affine {
    off: i128,
    coef: Vec<i128>,
}

impl Affine {
    fn constant(off: i128, rank: usize) -> Affine {
        Affine {
            off,
            coef: vec![0; rank],
        }
    }

    /// The smallest value over a shape of extents `dims` (none when a dim is 0).
    fn min_over(&self, dims: &[usize]) -> i128 {
        self.off
            + self
                .coef
                .iter()
                .zip(dims)
                .map(|(&c, &d)| (c * (d as i128 - 1).max(0)).min(0))
                .sum::<i128>()
    }
}

fn dims(eg: &TEGraph, id: Id) -> Vec<usize> {
    eg[id].data.ty.shape.dims().to_vec()
}

/// The affine form of an integer class, if one of its nodes gives one.
fn affine(eg: &TEGraph, id: Id, depth: usize, memo: &mut HashMap<Id, Option<Affine>>) -> Option<Affine> {
    let id = eg.find(id);
    if let Some(a) = memo.get(&id) {
        return a.clone();
    }
    memo.insert(id, None); // no cycles
    let ty = &eg[id].data.ty;
    let rank = ty.shape.rank();
    let result = if !ty.dtype.is_int() || depth == 0 {
        None
    } else if let Some(k) = &eg[id].data.known {
        known_affine(k, &ty.shape)
    } else {
        eg[id]
            .nodes
            .iter()
            .find_map(|n| node_affine(eg, n, rank, depth - 1, memo))
    };
    memo.insert(id, result.clone());
    result
}

/// The affine form of a known index, checked at every element.
fn known_affine(k: &Known, shape: &Shape) -> Option<Affine> {
    let rank = shape.rank();
    if let Some(v) = k.splat() {
        return (v.fract() == 0.0 && v.abs() < 1e15).then(|| Affine::constant(v as i128, rank));
    }
    let Known::Full(t) = k else { return None };
    let n = shape.numel();
    if n > MAX_KNOWN_CHECK || n == 0 {
        return None;
    }
    let v = t.to_f64_vec();
    let dims = shape.dims();
    // Row-major strides of the shape; a coefficient is the step along its axis.
    let mut strides = vec![1usize; rank];
    for k in (0..rank.saturating_sub(1)).rev() {
        strides[k] = strides[k + 1] * dims[k + 1];
    }
    let at = |i: usize| v.get(i).copied().map(|x| x as i128);
    let off = at(0)?;
    let coef: Vec<i128> = (0..rank)
        .map(|k| {
            if dims[k] > 1 {
                at(strides[k]).map(|x| x - off)
            } else {
                Some(0)
            }
        })
        .collect::<Option<_>>()?;
    let a = Affine { off, coef };
    // Every element: the coordinates walked row-major.
    let mut c = vec![0usize; rank];
    for &x in &v {
        let want = a.off + a.coef.iter().zip(&c).map(|(&k, &ci)| k * ci as i128).sum::<i128>();
        if x as i128 != want || x.fract() != 0.0 {
            return None;
        }
        for k in (0..rank).rev() {
            c[k] += 1;
            if c[k] < dims[k] {
                break;
            }
            c[k] = 0;
        }
    }
    Some(a)
}

fn node_affine(
    eg: &TEGraph,
    n: &TNode,
    rank: usize,
    depth: usize,
    memo: &mut HashMap<Id, Option<Affine>>,
) -> Option<Affine> {
    let child = |i: usize, memo: &mut HashMap<Id, Option<Affine>>| affine(eg, n.children[i], depth, memo);
    match n.op() {
        Op::Iota { axis, .. } => {
            let mut a = Affine::constant(0, rank);
            *a.coef.get_mut(*axis)? = 1;
            Some(a)
        }
        Op::Cast { .. } => child(0, memo),
        Op::Broadcast { shape } => {
            // numpy alignment: the operand's axis k is axis k + (rank - its rank).
            let from = dims(eg, n.children[0]);
            let a = child(0, memo)?;
            let lead = shape.rank().checked_sub(from.len())?;
            let mut coef = vec![0; rank];
            for (k, &c) in a.coef.iter().enumerate() {
                if from[k] != 1 {
                    coef[lead + k] = c;
                }
            }
            Some(Affine { off: a.off, coef })
        }
        Op::Reshape { shape } => {
            // Only axes of extent 1 inserted or removed: the others keep their order.
            let a = child(0, memo)?;
            let from = dims(eg, n.children[0]);
            let kept_from: Vec<usize> = (0..from.len()).filter(|&k| from[k] != 1).collect();
            let kept_to: Vec<usize> = (0..shape.rank()).filter(|&k| shape.dims()[k] != 1).collect();
            if kept_from.len() != kept_to.len()
                || kept_from
                    .iter()
                    .zip(&kept_to)
                    .any(|(&f, &t)| from[f] != shape.dims()[t])
            {
                return None;
            }
            let mut coef = vec![0; rank];
            for (&f, &t) in kept_from.iter().zip(&kept_to) {
                coef[t] = a.coef[f];
            }
            Some(Affine { off: a.off, coef })
        }
        Op::Binary(op @ (BinaryOp::Add | BinaryOp::Sub)) => {
            let (a, b) = (child(0, memo)?, child(1, memo)?);
            let s = if *op == BinaryOp::Add { 1 } else { -1 };
            Some(Affine {
                off: a.off + s * b.off,
                coef: a.coef.iter().zip(&b.coef).map(|(&x, &y)| x + s * y).collect(),
            })
        }
        Op::Binary(BinaryOp::Mul) => {
            let (x, c) = if let Some(c) = scalar(eg, n.children[1]) {
                (0, c)
            } else {
                (1, scalar(eg, n.children[0])?)
            };
            if c.fract() != 0.0 || c.abs() > 1e12 {
                return None;
            }
            let a = child(x, memo)?;
            let c = c as i128;
            Some(Affine {
                off: a.off * c,
                coef: a.coef.iter().map(|&k| k * c).collect(),
            })
        }
        Op::Select => {
            // select(x < 0, _, x) with x never negative is x.
            let (cond, other) = (n.children[0], n.children[2]);
            let is_neg_test = nodes_where(eg, cond, |o| *o == Op::Binary(BinaryOp::Lt))
                .any(|lt| eg.find(lt.children[0]) == eg.find(other) && scalar(eg, lt.children[1]) == Some(0.0));
            if !is_neg_test {
                return None;
            }
            let a = affine(eg, other, depth, memo)?;
            (a.min_over(&dims(eg, other)) >= 0).then_some(a)
        }
        _ => None,
    }
}

fn gather_affine(eg: &TEGraph, id: Id) -> Vec<Term> {
    for n in nodes_where(eg, id, |o| matches!(o, Op::Gather { axis: 0 })) {
        let (x, idx) = (n.children[0], n.children[1]);
        let xd = dims(eg, x);
        let idd = dims(eg, idx);
        let Some((&rows, rest)) = xd.split_first() else {
            continue;
        };
        let Some(a) = affine(eg, idx, MAX_DEPTH, &mut HashMap::new()) else {
            continue;
        };
        if a.off != 0 {
            continue;
        }
        // The nonzero coefficients must be the row-major strides of their extents.
        let mut stride: i128 = 1;
        let mut ok = true;
        for k in (0..idd.len()).rev() {
            let c = a.coef[k];
            if c == 0 || idd[k] == 1 {
                continue;
            }
            if c != stride {
                ok = false;
                break;
            }
            stride *= idd[k] as i128;
        }
        if !ok || stride != rows as i128 {
            continue;
        }
        // x as the index's shape (1 on repeated axes) and its own trailing axes, then
        // broadcast over the repeated axes.
        let walked: Vec<usize> = idd
            .iter()
            .zip(&a.coef)
            .map(|(&d, &c)| if c == 0 { 1 } else { d })
            .chain(rest.iter().copied())
            .collect();
        let full: Vec<usize> = idd.iter().copied().chain(rest.iter().copied()).collect();
        let mut term = Term::node(
            Op::Reshape {
                shape: Shape::new(&walked[..]),
            },
            vec![Term::Class(x)],
        );
        if walked != full {
            term = Term::node(
                Op::Broadcast {
                    shape: Shape::new(&full[..]),
                },
                vec![term],
            );
        }
        return vec![term];
    }
    vec![]
}
