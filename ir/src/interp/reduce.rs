//! Reductions: `reduce_*` over several axes, and `argmax`/`argmin` along one.

// reason: these kernels run on operands that passed `infer_type` against the node's type
// (`eval_op` checks that before dispatching here, and `interpret` also verifies the graph),
// and a tensor's data always holds its shape's element count; so every axis is < rank and
// every flat index computed from the shapes and strides is in range.
#![allow(clippy::indexing_slicing)]

use super::convert::{from_f32, from_i64, vals, Vals};
use super::elementwise::Float;
use super::layout::affine_indices;
use crate::{ArgReduceOp, DType, ReduceOp, Tensor, TensorData};

/// For each input element, the flat index of the output element it reduces into.
fn reduce_map(dims: &[usize], axes: &[usize]) -> (Vec<usize>, usize, usize) {
    let mut strides = vec![0i64; dims.len()];
    let mut out_n = 1usize;
    let mut count = 1usize;
    for i in (0..dims.len()).rev() {
        if axes.contains(&i) {
            count *= dims[i];
        } else {
            strides[i] = out_n as i64;
            out_n *= dims[i];
        }
    }
    (affine_indices(dims, &strides, 0), out_n, count)
}

fn reduce_float<F: Float>(op: ReduceOp, x: &[F], map: &[usize], out_n: usize, count: usize) -> Vec<F> {
    let init = match op {
        ReduceOp::Sum | ReduceOp::Mean => F::ZERO,
        ReduceOp::Prod => F::ONE,
        ReduceOp::Max => -F::INFINITY,
        ReduceOp::Min => F::INFINITY,
    };
    let mut acc = vec![init; out_n];
    match op {
        ReduceOp::Sum | ReduceOp::Mean => {
            for (&v, &o) in x.iter().zip(map) {
                acc[o] = acc[o] + v;
            }
        }
        ReduceOp::Prod => {
            for (&v, &o) in x.iter().zip(map) {
                acc[o] = acc[o] * v;
            }
        }
        ReduceOp::Max => {
            for (&v, &o) in x.iter().zip(map) {
                if v > acc[o] || v.is_nan() {
                    acc[o] = v;
                }
            }
        }
        ReduceOp::Min => {
            for (&v, &o) in x.iter().zip(map) {
                if v < acc[o] || v.is_nan() {
                    acc[o] = v;
                }
            }
        }
    }
    if op == ReduceOp::Mean {
        let n = F::c(count as f64);
        for a in &mut acc {
            *a = *a / n;
        }
    }
    acc
}

/// The least and greatest value of an integer dtype.
fn int_range(d: DType) -> (i64, i64) {
    match d {
        DType::I32 => (i32::MIN as i64, i32::MAX as i64),
        DType::I8 => (i8::MIN as i64, i8::MAX as i64),
        DType::U8 => (0, u8::MAX as i64),
        _ => (i64::MIN, i64::MAX),
    }
}

fn reduce_int(
    op: ReduceOp,
    dtype: DType,
    x: &[i64],
    map: &[usize],
    out_n: usize,
    count: usize,
) -> Result<Vec<i64>, String> {
    let (lo, hi) = int_range(dtype);
    let init = match op {
        ReduceOp::Sum | ReduceOp::Mean => 0,
        ReduceOp::Prod => 1,
        ReduceOp::Max => lo,
        ReduceOp::Min => hi,
    };
    let mut acc = vec![init; out_n];
    let f: fn(i64, i64) -> i64 = match op {
        ReduceOp::Sum | ReduceOp::Mean => i64::wrapping_add,
        ReduceOp::Prod => i64::wrapping_mul,
        ReduceOp::Max => i64::max,
        ReduceOp::Min => i64::min,
    };
    for (&v, &o) in x.iter().zip(map) {
        acc[o] = f(acc[o], v);
    }
    if op == ReduceOp::Mean && out_n > 0 {
        if count == 0 {
            return Err("integer mean over zero elements".to_string());
        }
        for a in &mut acc {
            *a = a.wrapping_div(count as i64);
        }
    }
    Ok(acc)
}

pub(crate) fn reduce(op: ReduceOp, x: &Tensor, axes: &[usize]) -> Result<TensorData, String> {
    let dims = x.shape().dims();
    if let Some(&a) = axes.iter().find(|&&a| a >= dims.len()) {
        return Err(format!("axis {a} out of range for rank {}", dims.len()));
    }
    let (map, out_n, count) = reduce_map(dims, axes);
    let dtype = x.dtype();
    Ok(match vals(x.data()) {
        Vals::F32(v) => from_f32(dtype, reduce_float(op, &v, &map, out_n, count)),
        Vals::F64(v) => TensorData::F64(reduce_float(op, v, &map, out_n, count)),
        Vals::Int(v) => from_i64(dtype, &reduce_int(op, dtype, &v, &map, out_n, count)?),
        Vals::Bool(_) => return Err(format!("{} does not accept bool", op.name())),
    })
}

fn arg_extreme<T: Copy + PartialOrd>(
    v: &[T],
    (outer, len, inner): (usize, usize, usize),
    max: bool,
    is_nan: fn(T) -> bool,
) -> Vec<i64> {
    let mut out = Vec::with_capacity(outer * inner);
    for o in 0..outer {
        let base = o * len * inner;
        for i in 0..inner {
            let mut best = 0usize;
            let mut bv = v[base + i];
            if !is_nan(bv) {
                for k in 1..len {
                    let x = v[base + k * inner + i];
                    if is_nan(x) {
                        best = k;
                        break;
                    }
                    if (max && x > bv) || (!max && x < bv) {
                        best = k;
                        bv = x;
                    }
                }
            }
            out.push(best as i64);
        }
    }
    out
}

pub(crate) fn arg_reduce(op: ArgReduceOp, x: &Tensor, axis: usize) -> Result<TensorData, String> {
    let dims = x.shape().dims();
    let Some(&len) = dims.get(axis) else {
        return Err(format!("axis {axis} out of range for rank {}", dims.len()));
    };
    let outer: usize = dims[..axis].iter().product();
    let inner: usize = dims[axis + 1..].iter().product();
    if outer * inner == 0 {
        return Ok(TensorData::I64(Vec::new()));
    }
    if len == 0 {
        return Err(format!("{} over an empty axis {axis}", op.name()));
    }
    let geom = (outer, len, inner);
    let max = op == ArgReduceOp::ArgMax;
    Ok(TensorData::I64(match vals(x.data()) {
        Vals::F32(v) => arg_extreme(&v, geom, max, f32::is_nan),
        Vals::F64(v) => arg_extreme(v, geom, max, f64::is_nan),
        Vals::Int(v) => arg_extreme(&v, geom, max, |_| false),
        Vals::Bool(_) => return Err(format!("{} does not accept bool", op.name())),
    }))
}
