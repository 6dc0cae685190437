//! Index-mapping ops: each output element is an element of the operand(s), found by a
//! flat source index (or a fill value). They work for every dtype at once.

// reason: these kernels run on operands that passed `infer_type` against the node's type
// (`eval_op` checks that before dispatching here, and `interpret` also verifies the graph),
// and a tensor's data always holds its shape's element count; so every axis is < rank and
// every flat index computed from the shapes and strides is in range.
#![allow(clippy::indexing_slicing)]

use super::convert::{from_f64, from_i64};
use crate::{PadMode, Shape, SliceRange, Tensor, TensorData, TensorType};

/// Call `f(base, len, stride)` for each innermost row of the strided walk of `dims`
/// from `offset`: row-major, a row being the elements `base + j * stride` for
/// `j < len` (the last dim). Nothing for an empty space; one row of one element for
/// rank 0. `strides` has (at least) one stride per dim.
///
/// Offsets use wrapping arithmetic: a stride may be huge (a slice step far beyond the
/// extent) when it only ever multiplies coordinate 0; every offset reached is in range
/// for a checked walk. This is the one strided loop of the interpreter and the CPU
/// kernel executor.
pub fn for_each_strided_row(dims: &[usize], strides: &[i64], offset: i64, mut f: impl FnMut(i64, usize, i64)) {
    if dims.contains(&0) {
        return;
    }
    let rank = dims.len();
    if rank == 0 {
        f(offset, 1, 0);
        return;
    }
    let mut coord = vec![0usize; rank];
    let mut base = offset;
    let (last_d, last_s) = (dims[rank - 1], strides[rank - 1]);
    loop {
        f(base, last_d, last_s);
        let mut k = rank - 1;
        loop {
            if k == 0 {
                return;
            }
            k -= 1;
            coord[k] += 1;
            base = base.wrapping_add(strides[k]);
            if coord[k] < dims[k] {
                break;
            }
            base = base.wrapping_sub(strides[k].wrapping_mul(dims[k] as i64));
            coord[k] = 0;
        }
    }
}

/// The flat indices `offset + sum_i c_i * strides[i]` for every coordinate `c` of
/// `dims`, in row-major order.
pub(crate) fn affine_indices(dims: &[usize], strides: &[i64], offset: i64) -> Vec<usize> {
    let n: usize = dims.iter().product();
    let mut out = Vec::with_capacity(n);
    for_each_strided_row(dims, strides, offset, |base, len, s| {
        out.extend((0..len as i64).map(|j| base.wrapping_add(j.wrapping_mul(s)) as usize));
    });
    out
}

fn strides_i64(shape: &Shape) -> Vec<i64> {
    shape.strides().into_iter().map(|s| s as i64).collect()
}

/// Strides (0 on broadcast dims) that read an operand of shape `from` at every
/// coordinate of `to`, numpy right-aligned.
pub(crate) fn broadcast_strides(from: &[usize], to: &[usize]) -> Vec<i64> {
    let src = strides_i64(&Shape::new(from));
    let lead = to.len() - from.len().min(to.len());
    (0..to.len())
        .map(|i| {
            if i < lead {
                0
            } else {
                let j = i - lead;
                if from[j] == 1 && to[i] != 1 {
                    0
                } else {
                    src[j]
                }
            }
        })
        .collect()
}

pub(crate) fn broadcast(x: &Tensor, shape: &Shape) -> TensorData {
    let strides = broadcast_strides(x.shape().dims(), shape.dims());
    x.data().take(&affine_indices(shape.dims(), &strides, 0))
}

pub(crate) fn transpose(x: &Tensor, perm: &[usize]) -> TensorData {
    let src = strides_i64(x.shape());
    let dims: Vec<usize> = perm.iter().map(|&p| x.shape().dims()[p]).collect();
    let strides: Vec<i64> = perm.iter().map(|&p| src[p]).collect();
    x.data().take(&affine_indices(&dims, &strides, 0))
}

pub(crate) fn slice(x: &Tensor, ranges: &[SliceRange]) -> TensorData {
    let src = strides_i64(x.shape());
    let mut dims = Vec::with_capacity(ranges.len());
    let mut strides = Vec::with_capacity(ranges.len());
    let mut offset = 0i64;
    for ((r, &d), &s) in ranges.iter().zip(x.shape().dims()).zip(&src) {
        let (start, len) = r.resolve(d);
        dims.push(len);
        strides.push(r.step.wrapping_mul(s));
        if len > 0 {
            offset += start * s;
        }
    }
    x.data().take(&affine_indices(&dims, &strides, offset))
}

pub(crate) fn concat(parts: &[&Tensor], axis: usize) -> Result<TensorData, String> {
    let first = parts.first().ok_or("concat takes at least one operand")?;
    let dims = first.shape().dims();
    let outer: usize = dims[..axis].iter().product();
    let inner: usize = dims[axis + 1..].iter().product();
    let all = TensorData::concat(&parts.iter().map(|p| p.data()).collect::<Vec<_>>())
        .ok_or("concat operands differ in dtype")?;
    let mut idx = Vec::with_capacity(all.len());
    for o in 0..outer {
        let mut base = 0;
        for p in parts {
            let chunk = p.shape().dims()[axis] * inner;
            let start = base + o * chunk;
            idx.extend(start..start + chunk);
            base += p.numel();
        }
    }
    Ok(all.take(&idx))
}

/// Integer `indices` into an axis of extent `d`, counted from the end when negative,
/// as positions `0..d`; an index outside `-d..d` is an error naming `op`.
fn normalized_indices(op: &str, indices: &Tensor, axis: usize, d: usize) -> Result<Vec<usize>, String> {
    let raw: Vec<i64> = match indices.data() {
        TensorData::I64(v) => v.clone(),
        TensorData::I32(v) => v.iter().map(|&i| i as i64).collect(),
        other => return Err(format!("{op} indices must be i64 or i32, got {}", other.dtype())),
    };
    raw.iter()
        .map(|&i| {
            let j = if i < 0 { i + d as i64 } else { i };
            if j < 0 || j >= d as i64 {
                Err(format!("{op} index {i} is out of range for axis {axis} of extent {d}"))
            } else {
                Ok(j as usize)
            }
        })
        .collect()
}

pub(crate) fn gather(data: &Tensor, indices: &Tensor, axis: usize) -> Result<TensorData, String> {
    let dims = data.shape().dims();
    let d = dims[axis];
    let outer: usize = dims[..axis].iter().product();
    let inner: usize = dims[axis + 1..].iter().product();
    let norm = normalized_indices("gather", indices, axis, d)?;
    let mut idx = Vec::with_capacity(outer * norm.len() * inner);
    for o in 0..outer {
        for &j in &norm {
            let start = (o * d + j) * inner;
            idx.extend(start..start + inner);
        }
    }
    Ok(data.data().take(&idx))
}

/// [`Op::ScatterAdd`]: sums `updates` into rows of a zero tensor of type `ty`, in
/// row-major order of the index positions, in the updates' own type (f32 for f16/bf16,
/// rounded once at the end; integers wrap).
pub(crate) fn scatter_add(
    updates: &Tensor,
    indices: &Tensor,
    axis: usize,
    size: usize,
    ty: &TensorType,
) -> Result<TensorData, String> {
    let ud = updates.shape().dims();
    let outer: usize = ud[..axis].iter().product();
    let n_idx = indices.shape().numel();
    let inner: usize = ud[axis + indices.shape().rank()..].iter().product();
    let norm = normalized_indices("scatter_add", indices, axis, size)?;
    let total = outer * size * inner;
    Ok(match updates.data() {
        TensorData::I64(v) => {
            let mut out = vec![0i64; total];
            scatter_rows(&mut out, v, outer, n_idx, inner, size, &norm, |a, b| a.wrapping_add(b));
            TensorData::I64(out)
        }
        TensorData::F64(v) => {
            let mut out = vec![0f64; total];
            scatter_rows(&mut out, v, outer, n_idx, inner, size, &norm, |a, b| a + b);
            TensorData::F64(out)
        }
        other if other.dtype().is_float() => {
            let TensorData::F32(v) = super::convert::cast(other, crate::DType::F32) else {
                return Err(format!("scatter_add of {} is not supported", other.dtype()));
            };
            let mut out = vec![0f32; total];
            scatter_rows(&mut out, &v, outer, n_idx, inner, size, &norm, |a, b| a + b);
            super::convert::cast(&TensorData::F32(out), ty.dtype)
        }
        other => {
            let TensorData::I64(v) = super::convert::cast(other, crate::DType::I64) else {
                return Err(format!("scatter_add of {} is not supported", other.dtype()));
            };
            let mut out = vec![0i64; total];
            scatter_rows(&mut out, &v, outer, n_idx, inner, size, &norm, |a, b| a.wrapping_add(b));
            super::convert::cast(&TensorData::I64(out), ty.dtype)
        }
    })
}

#[allow(clippy::too_many_arguments)]
fn scatter_rows<T: Copy>(
    out: &mut [T],
    upd: &[T],
    outer: usize,
    n_idx: usize,
    inner: usize,
    size: usize,
    rows: &[usize],
    add: impl Fn(T, T) -> T,
) {
    for o in 0..outer {
        for (j, &r) in rows.iter().enumerate() {
            let src = (o * n_idx + j) * inner;
            let dst = (o * size + r) * inner;
            for c in 0..inner {
                out[dst + c] = add(out[dst + c], upd[src + c]);
            }
        }
    }
}

pub(crate) fn pad(x: &Tensor, pads: &[(i64, i64)], mode: PadMode, value: f64) -> Result<TensorData, String> {
    // Per dimension: the source coordinate of each output coordinate, None to fill.
    let mut flat: Vec<Option<usize>> = vec![Some(0)];
    for (axis, (&(lo, hi), &d)) in pads.iter().zip(x.shape().dims()).enumerate() {
        let di = d as i64;
        let out_d = di.checked_add(lo).and_then(|x| x.checked_add(hi)).unwrap_or(-1);
        if out_d < 0 {
            return Err(format!("pad ({lo}, {hi}) of axis {axis} gives a negative extent"));
        }
        let mut map = Vec::with_capacity(out_d as usize);
        for c_out in 0..out_d {
            let c = c_out - lo;
            let src = match mode {
                PadMode::Constant => (0..di).contains(&c).then_some(c),
                PadMode::Reflect => {
                    let r = if c < 0 { -c } else { c };
                    let r = if r >= di { 2 * (di - 1) - r } else { r };
                    if !(0..di).contains(&r) {
                        return Err(format!(
                            "reflect pad ({lo}, {hi}) of axis {axis} needs pads smaller than its extent {d}"
                        ));
                    }
                    Some(r)
                }
                PadMode::Edge => {
                    if di == 0 {
                        return Err(format!("edge pad of empty axis {axis}"));
                    }
                    Some(c.clamp(0, di - 1))
                }
            };
            map.push(src.map(|s| s as usize));
        }
        let mut next = Vec::with_capacity(flat.len() * map.len());
        for p in &flat {
            for c in &map {
                next.push(match (p, c) {
                    (Some(p), Some(c)) => Some(p * d + c),
                    _ => None,
                });
            }
        }
        flat = next;
    }
    let fill = from_f64(x.dtype(), &[value]);
    x.data()
        .take_or(&flat, &fill)
        .ok_or_else(|| "internal error: pad fill or source index out of range".to_string())
}

/// `out[i0, .., in] = i_axis`, converted like a cast from i64.
pub(crate) fn iota(ty: &TensorType, axis: usize) -> TensorData {
    let dims = ty.shape.dims();
    let strides: Vec<i64> = (0..dims.len()).map(|i| (i == axis) as i64).collect();
    let v: Vec<i64> = affine_indices(dims, &strides, 0)
        .into_iter()
        .map(|i| i as i64)
        .collect();
    from_i64(ty.dtype, &v)
}
