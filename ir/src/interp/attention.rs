//! `attention`: scaled dot-product attention, by its definition (two passes over each
//! row's scores: the max, then the exponentials and their sum), in f32 for
//! f32/f16/bf16 and f64 for f64, rounded once to the dtype.
//!
//! This is the reference the fused kernels are compared with; it follows the
//! spelled-out softmax's order of operations (`exp(s - max) / sum`, then the product
//! with `v`), so a recognized attention stays within a few ulps of the graph it
//! replaced.

// reason: the operands passed `AttentionDims::of` against the node's type (checked by
// `eval_op` before dispatching here), and a tensor's data holds its shape's element
// count, so every index computed from those dims is in range.
#![allow(clippy::indexing_slicing)]

use std::ops::{Add, Div, Mul, Sub};

use super::convert::{from_f32, vals, Vals};
use super::layout::broadcast_strides;
use crate::infer::AttentionDims;
use crate::{Shape, Tensor, TensorData, TensorType};

/// The arithmetic attention is computed in (f32 or f64).
pub trait Real:
    Copy + PartialOrd + Add<Output = Self> + Sub<Output = Self> + Mul<Output = Self> + Div<Output = Self>
{
    const ZERO: Self;
    const NEG_INF: Self;
    const NAN: Self;
    fn from_f64(x: f64) -> Self;
    fn exp(self) -> Self;
    fn ln(self) -> Self;
    fn is_nan(self) -> bool;
}

impl Real for f32 {
    const ZERO: f32 = 0.0;
    const NEG_INF: f32 = f32::NEG_INFINITY;
    const NAN: f32 = f32::NAN;
    fn from_f64(x: f64) -> f32 {
        x as f32
    }
    fn exp(self) -> f32 {
        f32::exp(self)
    }
    fn ln(self) -> f32 {
        f32::ln(self)
    }
    fn is_nan(self) -> bool {
        f32::is_nan(self)
    }
}

impl Real for f64 {
    const ZERO: f64 = 0.0;
    const NEG_INF: f64 = f64::NEG_INFINITY;
    const NAN: f64 = f64::NAN;
    fn from_f64(x: f64) -> f64 {
        x
    }
    fn exp(self) -> f64 {
        f64::exp(self)
    }
    fn ln(self) -> f64 {
        f64::ln(self)
    }
    fn is_nan(self) -> bool {
        f64::is_nan(self)
    }
}

/// NaN-propagating max (as `reduce_max`).
pub fn nan_max<T: Real>(a: T, b: T) -> T {
    if a.is_nan() || b.is_nan() {
        T::NAN
    } else if b > a {
        b
    } else {
        a
    }
}

/// The operands of one attention, as flat row-major slices with the mask's strides
/// over the scores' dims.
pub struct Operands<'a, T> {
    pub q: &'a [T],
    pub k: &'a [T],
    pub v: &'a [T],
    /// The mask and its strides over `[batch (flat), hq, sq, sk]`.
    pub mask: Option<(&'a [T], [usize; 4])>,
}

/// The attributes of one attention (those of `Op::Attention`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Flags {
    pub scale: f64,
    pub causal: bool,
    /// A row whose softmax is NaN (every score `-inf`) gives 0.
    pub zero_masked_rows: bool,
}

impl Flags {
    /// The flags of an attention op or one of its backward ops (`attention_lse` keeps
    /// every row's log-sum-exp: no zeroed rows); `None` for any other op.
    pub fn of(op: &crate::Op) -> Option<Flags> {
        use crate::Op;
        match *op {
            Op::Attention {
                scale,
                causal,
                zero_masked_rows,
            }
            | Op::AttentionGrad {
                scale,
                causal,
                zero_masked_rows,
                ..
            } => Some(Flags {
                scale,
                causal,
                zero_masked_rows,
            }),
            Op::AttentionLse { scale, causal } => Some(Flags {
                scale,
                causal,
                zero_masked_rows: false,
            }),
            _ => None,
        }
    }
}

/// Attention by definition into `out` (`[batch.., hq, sq, dv]`, row-major).
pub fn reference<T: Real>(dims: &AttentionDims, x: &Operands<'_, T>, flags: Flags, out: &mut [T]) {
    let Flags {
        scale,
        causal,
        zero_masked_rows,
    } = flags;
    let nb: usize = dims.batch.iter().product();
    let (hq, hkv, sq, sk, dv) = (dims.hq, dims.hkv, dims.sq, dims.sk, dims.dv);
    let group = dims.group();
    let scale = T::from_f64(scale);
    let mut s = vec![T::ZERO; sk];
    for b in 0..nb {
        for h in 0..hq {
            let g = h / group;
            let kv = (b * hkv + g) * sk;
            for i in 0..sq {
                scores_row(dims, x, scale, causal, b, h, i, &mut s);
                let max = s.iter().fold(T::NEG_INF, |m, &v| nan_max(m, v));
                let mut sum = T::ZERO;
                for sj in s.iter_mut() {
                    *sj = (*sj - max).exp();
                    sum = sum + *sj;
                }
                let orow = &mut out[((b * hq + h) * sq + i) * dv..][..dv];
                orow.fill(T::ZERO);
                if zero_masked_rows && sum.is_nan() {
                    continue;
                }
                for (j, sj) in s.iter().enumerate() {
                    let p = *sj / sum;
                    let vrow = &x.v[(kv + j) * dv..][..dv];
                    for (o, c) in orow.iter_mut().zip(vrow) {
                        *o = *o + p * *c;
                    }
                }
            }
        }
    }
}

/// The mask's strides over `[batch (flat), hq, sq, sk]`: its own row-major strides
/// with 0 on broadcast dims, the batch dims flattened (a mask broadcast on some batch
/// dims and not others is expanded over the batch first).
pub fn mask_strides(dims: &AttentionDims, mask: &[usize]) -> Option<[usize; 4]> {
    let scores = dims.score_dims();
    let st = broadcast_strides(mask, &scores);
    let nbd = dims.batch.len();
    // The flat batch index b walks the batch dims row-major; the mask steps it by one
    // stride only if its batch dims are all full (contiguous) or all broadcast.
    let full = (0..nbd).all(|i| mask[i] == scores[i]);
    let none = (0..nbd).all(|i| st[i] == 0);
    let b = if none {
        0
    } else if full {
        st[nbd - 1].max(0) as usize
    } else {
        return None;
    };
    Some([
        b,
        st[nbd].max(0) as usize,
        st[nbd + 1].max(0) as usize,
        st[nbd + 2].max(0) as usize,
    ])
}

/// The mask as the kernels walk it, with its strides over `[batch (flat), hq, sq,
/// sk]`: as it is, or, when it is broadcast over some batch dims and not others,
/// expanded over the batch first so that one stride walks it.
pub fn flat_batch_mask(dims: &AttentionDims, m: &Tensor) -> Result<(Tensor, [usize; 4]), String> {
    let md = m.shape().dims();
    if let Some(st) = mask_strides(dims, md) {
        return Ok((m.clone(), st));
    }
    let mut full = dims.batch.clone();
    full.extend_from_slice(md.get(dims.batch.len()..).unwrap_or_default());
    let shape = Shape::new(&full[..]);
    let t =
        Tensor::new(shape.clone(), super::layout::broadcast(m, &shape)).map_err(|e| format!("internal error: {e}"))?;
    let st = mask_strides(dims, &full).ok_or("internal error: mask strides")?;
    Ok((t, st))
}

pub(crate) fn attention(args: &[&Tensor], flags: Flags, ty: &TensorType) -> Result<TensorData, String> {
    let tys: Vec<TensorType> = args.iter().map(|a| a.ty()).collect();
    let refs: Vec<&TensorType> = tys.iter().collect();
    let dims = AttentionDims::of(&refs)?;
    let n = ty.numel();
    let mask_t = match args.get(3) {
        Some(m) => Some(flat_batch_mask(&dims, m)?),
        None => None,
    };
    let (q, k, v) = (vals(args[0].data()), vals(args[1].data()), vals(args[2].data()));
    let m = mask_t.as_ref().map(|(t, st)| (vals(t.data()), *st));
    match (q, k, v) {
        (Vals::F32(q), Vals::F32(k), Vals::F32(v)) => {
            let mask = match &m {
                Some((Vals::F32(x), st)) => Some((&x[..], *st)),
                Some(_) => return Err("attention mask of another dtype".into()),
                None => None,
            };
            let mut out = vec![0f32; n];
            let x = Operands {
                q: &q,
                k: &k,
                v: &v,
                mask,
            };
            reference(&dims, &x, flags, &mut out);
            Ok(from_f32(ty.dtype, out))
        }
        (Vals::F64(q), Vals::F64(k), Vals::F64(v)) => {
            let mask = match &m {
                Some((Vals::F64(x), st)) => Some((&x[..], *st)),
                Some(_) => return Err("attention mask of another dtype".into()),
                None => None,
            };
            let mut out = vec![0f64; n];
            let x = Operands { q, k, v, mask };
            reference(&dims, &x, flags, &mut out);
            Ok(TensorData::F64(out))
        }
        _ => Err(format!("attention does not accept {}", ty.dtype)),
    }
}

/// One row's scores `s[j]` (query `i` of head `h`, batch `b`), as [`reference`]
/// computes them.
#[allow(clippy::too_many_arguments)]
fn scores_row<T: Real>(
    dims: &AttentionDims,
    x: &Operands<'_, T>,
    scale: T,
    causal: bool,
    b: usize,
    h: usize,
    i: usize,
    s: &mut [T],
) {
    let (hq, hkv, sq, sk, d) = (dims.hq, dims.hkv, dims.sq, dims.sk, dims.d);
    let g = h / dims.group();
    let kv = (b * hkv + g) * sk;
    let qrow = &x.q[((b * hq + h) * sq + i) * d..][..d];
    for (j, sj) in s.iter_mut().enumerate() {
        let krow = &x.k[(kv + j) * d..][..d];
        let mut dot = T::ZERO;
        for (a, c) in qrow.iter().zip(krow) {
            dot = dot + *a * *c;
        }
        let mut v = dot * scale;
        if let Some((m, st)) = &x.mask {
            v = v + m[b * st[0] + h * st[1] + i * st[2] + j * st[3]];
        }
        if causal && j > i {
            v = T::NEG_INF;
        }
        *sj = v;
    }
}

/// [`Op::AttentionLse`](crate::Op::AttentionLse) by definition into `out`
/// (`[batch.., hq, sq]`): `max + log(sum exp(s - max))`, `-inf` for a row of `-inf`s.
pub fn lse_reference<T: Real>(dims: &AttentionDims, x: &Operands<'_, T>, scale: f64, causal: bool, out: &mut [T]) {
    let nb: usize = dims.batch.iter().product();
    let scale = T::from_f64(scale);
    let mut s = vec![T::ZERO; dims.sk];
    for b in 0..nb {
        for h in 0..dims.hq {
            for i in 0..dims.sq {
                scores_row(dims, x, scale, causal, b, h, i, &mut s);
                let max = s.iter().fold(T::NEG_INF, |m, &v| nan_max(m, v));
                let mut sum = T::ZERO;
                for &v in &s {
                    sum = sum + (v - max).exp();
                }
                out[(b * dims.hq + h) * dims.sq + i] = if max == T::NEG_INF { T::NEG_INF } else { max + sum.ln() };
            }
        }
    }
}

/// The extra operands of attention's backward: the output's gradient and the row
/// statistics, flat row-major.
pub struct GradOperands<'a, T> {
    pub dout: &'a [T],
    pub lse: &'a [T],
    pub delta: &'a [T],
}

/// [`Op::AttentionGrad`](crate::Op::AttentionGrad) by definition into `out` (the
/// shape of the operand `wrt` names), summing in row-major order of `(h, i)` for the
/// gradients of `k` and `v`.
pub fn grad_reference<T: Real>(
    dims: &AttentionDims,
    x: &Operands<'_, T>,
    g: &GradOperands<'_, T>,
    wrt: crate::AttentionOperand,
    flags: Flags,
    out: &mut [T],
) {
    let nb: usize = dims.batch.iter().product();
    let (hq, hkv, sq, sk, d, dv) = (dims.hq, dims.hkv, dims.sq, dims.sk, dims.d, dims.dv);
    let group = dims.group();
    let scale = T::from_f64(flags.scale);
    out.fill(T::ZERO);
    let mut s = vec![T::ZERO; sk];
    for b in 0..nb {
        for h in 0..hq {
            let kvh = h / group;
            let kv = (b * hkv + kvh) * sk;
            for i in 0..sq {
                let row = (b * hq + h) * sq + i;
                scores_row(dims, x, scale, flags.causal, b, h, i, &mut s);
                let lse = g.lse[row];
                let delta = g.delta[row];
                let masked_row =
                    flags.zero_masked_rows && lse.partial_cmp(&T::NEG_INF) != Some(std::cmp::Ordering::Greater);
                let orow = &g.dout[row * dv..][..dv];
                let qrow = &x.q[row * d..][..d];
                for (j, &sj) in s.iter().enumerate() {
                    let p = if masked_row { T::ZERO } else { (sj - lse).exp() };
                    let vrow = &x.v[(kv + j) * dv..][..dv];
                    let krow = &x.k[(kv + j) * d..][..d];
                    match wrt {
                        crate::AttentionOperand::V => {
                            let dst = &mut out[(kv + j) * dv..][..dv];
                            for (o, c) in dst.iter_mut().zip(orow) {
                                *o = *o + p * *c;
                            }
                        }
                        crate::AttentionOperand::Q | crate::AttentionOperand::K => {
                            let mut dp = T::ZERO;
                            for (a, c) in orow.iter().zip(vrow) {
                                dp = dp + *a * *c;
                            }
                            let ds = p * (dp - delta) * scale;
                            if wrt == crate::AttentionOperand::Q {
                                let dst = &mut out[row * d..][..d];
                                for (o, c) in dst.iter_mut().zip(krow) {
                                    *o = *o + ds * *c;
                                }
                            } else {
                                let dst = &mut out[(kv + j) * d..][..d];
                                for (o, c) in dst.iter_mut().zip(qrow) {
                                    *o = *o + ds * *c;
                                }
                            }
                        }
                    }
                }
            }
        }
    }
}

/// `eval_op` of [`Op::AttentionLse`](crate::Op::AttentionLse) and
/// [`Op::AttentionGrad`](crate::Op::AttentionGrad) (`wrt` `None` for the former).
pub(crate) fn backward_op(
    args: &[&Tensor],
    wrt: Option<crate::AttentionOperand>,
    flags: Flags,
    ty: &TensorType,
) -> Result<TensorData, String> {
    // The attention operands (q, k, v, mask) and the backward's (dout, lse, delta).
    let (att, extra): (Vec<&Tensor>, Vec<&Tensor>) = match wrt {
        None => {
            let mut a = vec![args[0], args[1], args[1]];
            a.extend(args.get(2));
            (a, vec![])
        }
        Some(_) => {
            let mut a = vec![args[0], args[1], args[2]];
            a.extend(args.get(6));
            (a, vec![args[3], args[4], args[5]])
        }
    };
    let tys: Vec<TensorType> = att.iter().map(|a| a.ty()).collect();
    let refs: Vec<&TensorType> = tys.iter().collect();
    let dims = AttentionDims::of(&refs)?;
    let n = ty.numel();
    let mask_t = match att.get(3) {
        Some(m) => Some(flat_batch_mask(&dims, m)?),
        None => None,
    };
    let (q, k, v) = (vals(att[0].data()), vals(att[1].data()), vals(att[2].data()));
    let m = mask_t.as_ref().map(|(t, st)| (vals(t.data()), *st));
    let ex: Vec<Vals> = extra.iter().map(|t| vals(t.data())).collect();
    macro_rules! run {
        ($q:expr, $k:expr, $v:expr, $variant:ident, $t:ty) => {{
            let mask = match &m {
                Some((Vals::$variant(x), st)) => Some((&x[..], *st)),
                Some(_) => return Err("attention mask of another dtype".into()),
                None => None,
            };
            let x = Operands {
                q: &$q[..],
                k: &$k[..],
                v: &$v[..],
                mask,
            };
            let mut out = vec![<$t as Real>::ZERO; n];
            match wrt {
                None => lse_reference(&dims, &x, flags.scale, flags.causal, &mut out),
                Some(w) => {
                    let [Vals::$variant(o), Vals::$variant(l), Vals::$variant(dl)] = &ex[..] else {
                        return Err("attention_grad operands of another dtype".into());
                    };
                    let g = GradOperands {
                        dout: &o[..],
                        lse: &l[..],
                        delta: &dl[..],
                    };
                    grad_reference(&dims, &x, &g, w, flags, &mut out);
                }
            }
            out
        }};
    }
    match (q, k, v) {
        (Vals::F32(q), Vals::F32(k), Vals::F32(v)) => {
            let out = run!(q, k, v, F32, f32);
            Ok(from_f32(ty.dtype, out))
        }
        (Vals::F64(q), Vals::F64(k), Vals::F64(v)) => Ok(TensorData::F64(run!(q, k, v, F64, f64))),
        _ => Err(format!("attention's backward does not accept {}", ty.dtype)),
    }
}
