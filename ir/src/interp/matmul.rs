//! `matmul`: `[.., M, K] x [.., K, N] -> [.., M, N]` with numpy-broadcast batch dims.

// reason: these kernels run on operands that passed `infer_type` against the node's type
// (`eval_op` checks that before dispatching here, and `interpret` also verifies the graph),
// and a tensor's data always holds its shape's element count; so every axis is < rank and
// every flat index computed from the shapes and strides is in range.
#![allow(clippy::indexing_slicing)]

use super::convert::{from_f32, from_i64, vals, Vals};
use super::layout::{affine_indices, broadcast_strides};
use crate::{Tensor, TensorData, TensorType};

/// One `[m, k] x [k, n]` product added into `out`, in i-k-j order: each output element
/// accumulates its terms in increasing `k`.
fn kernel<T: Copy>(a: &[T], b: &[T], out: &mut [T], (m, k, n): (usize, usize, usize), mac: impl Fn(T, T, T) -> T) {
    for i in 0..m {
        let orow = &mut out[i * n..(i + 1) * n];
        for p in 0..k {
            let av = a[i * k + p];
            let brow = &b[p * n..(p + 1) * n];
            for (o, &bv) in orow.iter_mut().zip(brow) {
                *o = mac(*o, av, bv);
            }
        }
    }
}

fn batched<T: Copy>(
    a: &[T],
    b: &[T],
    zero: T,
    offsets: (&[usize], &[usize]),
    mkn: (usize, usize, usize),
    mac: impl Fn(T, T, T) -> T + Copy,
) -> Vec<T> {
    let (m, k, n) = mkn;
    let (a_off, b_off) = offsets;
    let mut out = vec![zero; a_off.len() * m * n];
    if m * n == 0 {
        return out;
    }
    for ((chunk, &ai), &bi) in out.chunks_mut(m * n).zip(a_off).zip(b_off) {
        let am = &a[ai * m * k..(ai + 1) * m * k];
        let bm = &b[bi * k * n..(bi + 1) * k * n];
        kernel(am, bm, chunk, mkn, mac);
    }
    out
}

pub(crate) fn matmul(a: &Tensor, b: &Tensor, ty: &TensorType) -> Result<TensorData, String> {
    let (ad, bd, od) = (a.shape().dims(), b.shape().dims(), ty.shape.dims());
    if ad.len() < 2 || bd.len() < 2 || od.len() < 2 {
        return Err("matmul needs operands of rank >= 2".to_string());
    }
    let (m, k, n) = (ad[ad.len() - 2], ad[ad.len() - 1], bd[bd.len() - 1]);
    let batch = &od[..od.len() - 2];
    let a_off = affine_indices(batch, &broadcast_strides(&ad[..ad.len() - 2], batch), 0);
    let b_off = affine_indices(batch, &broadcast_strides(&bd[..bd.len() - 2], batch), 0);
    let offsets = (&a_off[..], &b_off[..]);
    let dtype = a.dtype();
    Ok(match (vals(a.data()), vals(b.data())) {
        (Vals::F32(x), Vals::F32(y)) => {
            from_f32(dtype, batched(&x, &y, 0.0f32, offsets, (m, k, n), |o, p, q| o + p * q))
        }
        (Vals::F64(x), Vals::F64(y)) => TensorData::F64(batched(x, y, 0.0f64, offsets, (m, k, n), |o, p, q| o + p * q)),
        (Vals::Int(x), Vals::Int(y)) => from_i64(
            dtype,
            &batched(&x, &y, 0i64, offsets, (m, k, n), |o, p, q| {
                o.wrapping_add(p.wrapping_mul(q))
            }),
        ),
        _ => return Err(format!("matmul does not accept {dtype} and {}", b.dtype())),
    })
}
