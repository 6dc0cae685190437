//! Affine accesses: gathering a dense tensor over an iteration space, and scattering one
//! into a whole buffer (accesses are checked against their buffers by the kernel IR's
//! verifier).

use graphc_compiler::kernel::{contiguous_strides, strides_equal, Access};
use graphc_ir::{map_data, Tensor, TensorType};

/// Element count of `dims`, or an error when it overflows.
pub(crate) fn numel(dims: &[usize]) -> Result<usize, String> {
    dims.iter()
        .try_fold(1usize, |n, &d| n.checked_mul(d))
        .ok_or_else(|| format!("space {dims:?} has too many elements"))
}

/// Drop extent-1 dims and merge dims that step contiguously into each other, so the
/// innermost row is as long as possible. Returns (dims, strides); empty for one element.
fn coalesce(space: &[usize], strides: &[i64]) -> (Vec<usize>, Vec<i64>) {
    let mut dims: Vec<usize> = Vec::with_capacity(space.len());
    let mut st: Vec<i64> = Vec::with_capacity(space.len());
    for (&d, &s) in space.iter().zip(strides) {
        if d == 1 {
            continue;
        }
        if let (Some(&pd), Some(&ps)) = (dims.last(), st.last()) {
            if ps == s.wrapping_mul(d as i64) {
                let last = dims.len() - 1;
                dims[last] = pd * d;
                st[last] = s;
                continue;
            }
        }
        dims.push(d);
        st.push(s);
    }
    (dims, st)
}

/// Call `f(base, len, stride)` for each innermost row of the walk of `space` from
/// `offset` with `strides`, in row-major order, dims coalesced first. Nothing for an
/// empty space.
fn walk_rows(space: &[usize], strides: &[i64], offset: i64, f: impl FnMut(i64, usize, i64)) {
    if space.contains(&0) {
        return;
    }
    let (dims, st) = coalesce(space, strides);
    graphc_ir::interp::for_each_strided_row(&dims, &st, offset, f);
}

fn gather_vec<T: Copy>(v: &[T], space: &[usize], strides: &[i64], offset: i64, n: usize) -> Vec<T> {
    let mut out = Vec::with_capacity(n);
    walk_rows(space, strides, offset, |base, len, s| {
        let b = base as usize;
        match s {
            1 => out.extend_from_slice(&v[b..b + len]),
            0 => out.resize(out.len() + len, v[b]),
            _ => out.extend((0..len as i64).map(|j| v[(base + j * s) as usize])),
        }
    });
    out
}

/// The dense tensor of shape `space` whose element `i` is element
/// `offset + sum_k i_k * strides[k]` of `t`. The access must have been verified
/// against `t`'s element count.
pub(crate) fn gather_strided(t: &Tensor, offset: i64, strides: &[i64], space: &[usize]) -> Result<Tensor, String> {
    let n = numel(space)?;
    let contiguous = strides_equal(strides, &contiguous_strides(space), space);
    let data = if n == 0 {
        map_data!(t.data(), _v => Vec::new())
    } else if contiguous && offset == 0 && n == t.numel() {
        t.data().clone()
    } else if contiguous {
        let start = offset as usize;
        map_data!(t.data(), v => v[start..start + n].to_vec())
    } else {
        map_data!(t.data(), v => gather_vec(v, space, strides, offset, n))
    };
    Tensor::new(space.to_vec(), data).map_err(|e| format!("internal error: {e}"))
}

/// [`gather_strided`] through an access.
pub(crate) fn gather(t: &Tensor, acc: &Access, space: &[usize]) -> Result<Tensor, String> {
    gather_strided(t, acc.offset, &acc.strides, space)
}

fn scatter_vec<T: Copy>(v: &[T], space: &[usize], strides: &[i64], offset: i64) -> Vec<T> {
    let Some(&first) = v.first() else {
        return Vec::new();
    };
    let mut out = vec![first; v.len()];
    let mut i = 0usize;
    walk_rows(space, strides, offset, |base, len, s| {
        if s == 1 {
            let b = base as usize;
            out[b..b + len].copy_from_slice(&v[i..i + len]);
        } else {
            for j in 0..len as i64 {
                out[(base + j * s) as usize] = v[i + j as usize];
            }
        }
        i += len;
    });
    out
}

/// The buffer of type `ty` written by storing `value` (a dense tensor over the store's
/// space) through `acc`. The store must have been verified.
pub(crate) fn scatter(value: Tensor, acc: &Access, ty: &TensorType) -> Result<Tensor, String> {
    let space = value.shape().dims().to_vec();
    if value.dtype() != ty.dtype {
        return Err(format!("stores {} into a buffer of {}", value.dtype(), ty.dtype));
    }
    let data = if acc.is_contiguous(&space) {
        value.into_data()
    } else {
        map_data!(value.data(), v => scatter_vec(v, &space, &acc.strides, acc.offset))
    };
    Tensor::new(ty.shape.clone(), data).map_err(|e| format!("internal error: {e}"))
}

/// An indexed read over `space`: element `i` is element
/// `offset + sum_k i_k * strides[k] + k_i * stride` of `t`, where `k_i` is element `i` of
/// `index` (an integer tensor of shape `space`), counted from the end when negative.
/// An index outside `-extent..extent`, or an address outside `t`, is an error.
pub(crate) fn gather_indexed(
    t: &Tensor,
    acc: &Access,
    space: &[usize],
    index: &Tensor,
    stride: i64,
    extent: u64,
) -> Result<Tensor, String> {
    let n = numel(space)?;
    let ks: Vec<i64> = match index.data() {
        graphc_ir::TensorData::I64(v) => v.clone(),
        graphc_ir::TensorData::I32(v) => v.iter().map(|&x| x as i64).collect(),
        d => return Err(format!("gather index of type {}", d.dtype())),
    };
    if ks.len() != n {
        return Err(format!("gather index has {} elements for a space of {n}", ks.len()));
    }
    let len = t.numel() as i128;
    let mut addrs = Vec::with_capacity(n);
    let mut j = 0usize;
    let mut err = None;
    if n > 0 {
        walk_rows(space, &acc.strides, acc.offset, |base, row, s| {
            for r in 0..row as i64 {
                let k = ks[j];
                let e = extent as i128;
                let kn = if k < 0 { k as i128 + e } else { k as i128 };
                let a = base as i128 + r as i128 * s as i128 + kn * stride as i128;
                if err.is_none() && (kn < 0 || kn >= e || a < 0 || a >= len) {
                    err = Some(format!(
                        "gather index {k} out of range for an axis of {extent} (element {j} of the space)"
                    ));
                }
                addrs.push(a.clamp(0, (len - 1).max(0)) as usize);
                j += 1;
            }
        });
    }
    if let Some(e) = err {
        return Err(e);
    }
    Tensor::new(space.to_vec(), t.data().take(&addrs)).map_err(|e| format!("internal error: {e}"))
}
