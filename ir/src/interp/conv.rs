//! Convolution and pooling ([`Op::Conv`], [`Op::ConvGrad`], [`Op::Pool`],
//! [`Op::PoolGrad`]): direct loops over one `[n, c]` plane at a time, in f32 (f64 for
//! f64). Every output element accumulates its terms in a fixed order (the order the
//! op's doc names), so the result does not depend on how the loops are blocked.
//!
//! One and two spatial axes are run as three, the leading ones of extent 1.

// reason: these kernels run on operands that passed `infer_type` against the node's type
// (`eval_op` checks that before dispatching here), so every plane, tap and output index
// computed from the window's axes is in range of the operands' data.
#![allow(clippy::indexing_slicing)]

use std::ops::{Add, Mul};

use super::convert::{from_f32, vals, Vals};
use crate::window::{Axis, ConvGeom, ConvOperand, PoolOp, Window};
use crate::{Op, Tensor, TensorData, TensorType};

/// Arithmetic the loops need, for f32 and f64.
trait Num: Copy + Default + PartialOrd + Add<Output = Self> + Mul<Output = Self> + From<f32> {
    fn div(self, by: Self) -> Self;
    fn is_nan(self) -> bool;
}

impl Num for f32 {
    fn div(self, by: f32) -> f32 {
        self / by
    }
    fn is_nan(self) -> bool {
        f32::is_nan(self)
    }
}

impl Num for f64 {
    fn div(self, by: f64) -> f64 {
        self / by
    }
    fn is_nan(self) -> bool {
        f64::is_nan(self)
    }
}

/// A trivial leading axis (extent 1, one tap).
const UNIT: Axis = Axis {
    len: 1,
    kernel: 1,
    stride: 1,
    dilation: 1,
    pad_lo: 0,
    pad_hi: 0,
    out: 1,
};

/// The axes as three, padded in front with trivial ones.
fn three(axes: &[Axis]) -> [Axis; 3] {
    let mut a = [UNIT; 3];
    let skip = 3 - axes.len().min(3);
    for (slot, axis) in a[skip..].iter_mut().zip(axes) {
        *slot = *axis;
    }
    a
}

fn plane_in(a: &[Axis; 3]) -> usize {
    a[0].len * a[1].len * a[2].len
}

fn plane_out(a: &[Axis; 3]) -> usize {
    a[0].out * a[1].out * a[2].out
}

fn taps(a: &[Axis; 3]) -> usize {
    a[0].kernel * a[1].kernel * a[2].kernel
}

/// For every output position and tap of a plane with a tap inside the input, in
/// row-major (output, tap) order... calls `f(out_index, tap_index, in_index)`. The taps
/// are walked per tap for each output row, so the innermost loop is over outputs.
fn for_each_tap(a: &[Axis; 3], tap_major: bool, mut f: impl FnMut(usize, usize, usize)) {
    let [ad, ah, aw] = a;
    let kk = [ad.kernel, ah.kernel, aw.kernel];
    let visit =
        |od: usize, oh: usize, ow: usize, td: usize, th: usize, tw: usize, f: &mut dyn FnMut(usize, usize, usize)| {
            let (id, ih, iw) = (ad.tap(od, td), ah.tap(oh, th), aw.tap(ow, tw));
            if id < 0 || ih < 0 || iw < 0 || id >= ad.len as i64 || ih >= ah.len as i64 || iw >= aw.len as i64 {
                return;
            }
            let o = (od * ah.out + oh) * aw.out + ow;
            let t = (td * kk[1] + th) * kk[2] + tw;
            let i = (id as usize * ah.len + ih as usize) * aw.len + iw as usize;
            f(o, t, i);
        };
    if tap_major {
        for td in 0..kk[0] {
            for th in 0..kk[1] {
                for tw in 0..kk[2] {
                    for od in 0..ad.out {
                        for oh in 0..ah.out {
                            for ow in 0..aw.out {
                                visit(od, oh, ow, td, th, tw, &mut f);
                            }
                        }
                    }
                }
            }
        }
    } else {
        for od in 0..ad.out {
            for oh in 0..ah.out {
                for ow in 0..aw.out {
                    for td in 0..kk[0] {
                        for th in 0..kk[1] {
                            for tw in 0..kk[2] {
                                visit(od, oh, ow, td, th, tw, &mut f);
                            }
                        }
                    }
                }
            }
        }
    }
}

/// The (out, tap, in) triples of a plane with an inside tap, tap-major: computed once
/// per op and reused for every plane.
fn tap_table(a: &[Axis; 3]) -> Vec<(u32, u32, u32)> {
    let mut v = Vec::new();
    for_each_tap(a, true, |o, t, i| v.push((o as u32, t as u32, i as u32)));
    v
}

fn conv_fwd<T: Num>(x: &[T], w: &[T], g: &ConvGeom) -> Vec<T> {
    let a = three(&g.axes);
    let (pi, po, nt) = (plane_in(&a), plane_out(&a), taps(&a));
    let (cg, og) = (g.c / g.groups, g.o / g.groups);
    let table = tap_table(&a);
    let mut out = vec![T::default(); g.n * g.o * po];
    for b in 0..g.n {
        for j in 0..g.o {
            let acc = &mut out[(b * g.o + j) * po..][..po];
            let grp = j / og;
            // Channel-major, then tap-major: each output sums in increasing (i, t).
            for i in 0..cg {
                let xp = &x[(b * g.c + grp * cg + i) * pi..][..pi];
                let wp = &w[(j * cg + i) * nt..][..nt];
                for &(o, t, ix) in &table {
                    acc[o as usize] = acc[o as usize] + wp[t as usize] * xp[ix as usize];
                }
            }
        }
    }
    out
}

fn conv_grad_input<T: Num>(dy: &[T], w: &[T], g: &ConvGeom) -> Vec<T> {
    let a = three(&g.axes);
    let (pi, po, nt) = (plane_in(&a), plane_out(&a), taps(&a));
    let (cg, og) = (g.c / g.groups, g.o / g.groups);
    let table = tap_table(&a);
    let mut out = vec![T::default(); g.n * g.c * pi];
    for b in 0..g.n {
        for c in 0..g.c {
            let (grp, i) = (c / cg, c % cg);
            let acc = &mut out[(b * g.c + c) * pi..][..pi];
            for j in grp * og..(grp + 1) * og {
                let dp = &dy[(b * g.o + j) * po..][..po];
                let wp = &w[(j * cg + i) * nt..][..nt];
                for &(o, t, ix) in &table {
                    acc[ix as usize] = acc[ix as usize] + wp[t as usize] * dp[o as usize];
                }
            }
        }
    }
    out
}

fn conv_grad_weight<T: Num>(x: &[T], dy: &[T], g: &ConvGeom) -> Vec<T> {
    let a = three(&g.axes);
    let (pi, po, nt) = (plane_in(&a), plane_out(&a), taps(&a));
    let (cg, og) = (g.c / g.groups, g.o / g.groups);
    let table = tap_table(&a);
    let mut out = vec![T::default(); g.o * cg * nt];
    for j in 0..g.o {
        let grp = j / og;
        for i in 0..cg {
            let acc = &mut out[(j * cg + i) * nt..][..nt];
            for b in 0..g.n {
                let xp = &x[(b * g.c + grp * cg + i) * pi..][..pi];
                let dp = &dy[(b * g.o + j) * po..][..po];
                for &(o, t, ix) in &table {
                    acc[t as usize] = acc[t as usize] + dp[o as usize] * xp[ix as usize];
                }
            }
        }
    }
    out
}

/// Pooling attributes, read from [`Op::Pool`] or [`Op::PoolGrad`].
struct Pool<'a> {
    op: PoolOp,
    kernel: &'a [usize],
    window: &'a Window,
    ceil_mode: bool,
    count_include_pad: bool,
}

impl Pool<'_> {
    fn of(op: &Op) -> Option<Pool<'_>> {
        match op {
            Op::Pool {
                op,
                kernel,
                window,
                ceil_mode,
                count_include_pad,
            }
            | Op::PoolGrad {
                op,
                kernel,
                window,
                ceil_mode,
                count_include_pad,
            } => Some(Pool {
                op: *op,
                kernel,
                window,
                ceil_mode: *ceil_mode,
                count_include_pad: *count_include_pad,
            }),
            _ => None,
        }
    }

    /// The plane's axes and the `[n, c]` plane count of `x`.
    fn axes(&self, x: &[usize]) -> Result<([Axis; 3], usize), String> {
        let (lead, spatial) = x.split_at(2.min(x.len()));
        let axes = self.window.axes(spatial, self.kernel, self.ceil_mode)?;
        Ok((three(&axes), lead.iter().product()))
    }

    /// The divisor of an average at output `o` (multi-index over the three axes).
    fn count(&self, a: &[Axis; 3], o: [usize; 3]) -> usize {
        (0..3)
            .map(|k| {
                let (lo, hi) = if self.count_include_pad {
                    a[k].taps_within(o[k], -(a[k].pad_lo as i64), (a[k].len + a[k].pad_hi) as i64)
                } else {
                    a[k].inside(o[k])
                };
                hi - lo
            })
            .product()
    }
}

/// Index of the output `o` of a plane as three coordinates.
fn coords(a: &[Axis; 3], o: usize) -> [usize; 3] {
    [o / (a[1].out * a[2].out), (o / a[2].out) % a[1].out, o % a[2].out]
}

/// For each output of each plane, the winning input index (max) or the divisor (avg).
fn pool_fwd<T: Num>(x: &[T], p: &Pool, a: &[Axis; 3], planes: usize) -> Vec<T> {
    let (pi, po) = (plane_in(a), plane_out(a));
    let mut out = vec![T::default(); planes * po];
    let mut best: Vec<Option<T>> = vec![None; po];
    for pl in 0..planes {
        let xp = &x[pl * pi..][..pi];
        let op = &mut out[pl * po..][..po];
        match p.op {
            PoolOp::Max => {
                best.iter_mut().for_each(|b| *b = None);
                for_each_tap(a, false, |o, _, i| {
                    let v = xp[i];
                    if better(best[o], v) {
                        best[o] = Some(v);
                    }
                });
                for (slot, b) in op.iter_mut().zip(&best) {
                    *slot = b.unwrap_or_else(|| T::from(f32::NEG_INFINITY));
                }
            }
            PoolOp::Avg => {
                for_each_tap(a, false, |o, _, i| op[o] = op[o] + xp[i]);
                for (o, slot) in op.iter_mut().enumerate() {
                    let n = p.count(a, coords(a, o));
                    *slot = if n == 0 {
                        T::default()
                    } else {
                        slot.div(T::from(n as f32))
                    };
                }
            }
        }
    }
    out
}

/// Whether `v` replaces the window's running maximum: the first largest wins, and a NaN
/// (once met) stays.
fn better<T: Num>(best: Option<T>, v: T) -> bool {
    match best {
        None => true,
        Some(b) => !b.is_nan() && (v > b || v.is_nan()),
    }
}

fn pool_grad<T: Num>(x: &[T], dy: &[T], p: &Pool, a: &[Axis; 3], planes: usize) -> Vec<T> {
    let (pi, po) = (plane_in(a), plane_out(a));
    let mut out = vec![T::default(); planes * pi];
    let mut arg: Vec<Option<(T, usize)>> = vec![None; po];
    for pl in 0..planes {
        let xp = &x[pl * pi..][..pi];
        let dp = &dy[pl * po..][..po];
        let acc = &mut out[pl * pi..][..pi];
        match p.op {
            PoolOp::Max => {
                arg.iter_mut().for_each(|b| *b = None);
                for_each_tap(a, false, |o, _, i| {
                    if better(arg[o].map(|b| b.0), xp[i]) {
                        arg[o] = Some((xp[i], i));
                    }
                });
                for (o, w) in arg.iter().enumerate() {
                    if let Some((_, i)) = w {
                        acc[*i] = acc[*i] + dp[o];
                    }
                }
            }
            PoolOp::Avg => {
                let share: Vec<T> = (0..po)
                    .map(|o| match p.count(a, coords(a, o)) {
                        0 => T::default(),
                        n => dp[o].div(T::from(n as f32)),
                    })
                    .collect();
                for_each_tap(a, false, |o, _, i| acc[i] = acc[i] + share[o]);
            }
        }
    }
    out
}

/// Two float operands as one numeric type, the result converted to `ty`'s dtype.
fn on_floats(
    x: &Tensor,
    y: Option<&Tensor>,
    ty: &TensorType,
    f32_fn: impl FnOnce(&[f32], &[f32]) -> Vec<f32>,
    f64_fn: impl FnOnce(&[f64], &[f64]) -> Vec<f64>,
) -> Result<TensorData, String> {
    let y = y.unwrap_or(x);
    Ok(match (vals(x.data()), vals(y.data())) {
        (Vals::F32(a), Vals::F32(b)) => from_f32(ty.dtype, f32_fn(&a, &b)),
        (Vals::F64(a), Vals::F64(b)) => TensorData::F64(f64_fn(a, b)),
        _ => return Err(format!("needs float operands, got {} and {}", x.dtype(), y.dtype())),
    })
}

/// [`Op::Conv`] and [`Op::ConvGrad`].
pub(crate) fn conv(op: &Op, a: &Tensor, b: &Tensor, ty: &TensorType) -> Result<TensorData, String> {
    match op {
        Op::Conv { window, groups } => {
            let g = ConvGeom::new(window, *groups, a.shape().dims(), b.shape().dims())?;
            on_floats(a, Some(b), ty, |x, w| conv_fwd(x, w, &g), |x, w| conv_fwd(x, w, &g))
        }
        Op::ConvGrad {
            wrt: ConvOperand::Input,
            window,
            groups,
            shape,
        } => {
            let g = ConvGeom::new(window, *groups, shape.dims(), b.shape().dims())?;
            on_floats(
                a,
                Some(b),
                ty,
                |d, w| conv_grad_input(d, w, &g),
                |d, w| conv_grad_input(d, w, &g),
            )
        }
        Op::ConvGrad {
            wrt: ConvOperand::Weight,
            window,
            groups,
            shape,
        } => {
            let g = ConvGeom::new(window, *groups, a.shape().dims(), shape.dims())?;
            on_floats(
                a,
                Some(b),
                ty,
                |x, d| conv_grad_weight(x, d, &g),
                |x, d| conv_grad_weight(x, d, &g),
            )
        }
        _ => Err(format!("internal error: {} is not a convolution", op.name())),
    }
}

/// [`Op::Pool`] (`dy` none) and [`Op::PoolGrad`].
pub(crate) fn pool(op: &Op, x: &Tensor, dy: Option<&Tensor>, ty: &TensorType) -> Result<TensorData, String> {
    let p = Pool::of(op).ok_or_else(|| format!("internal error: {} is not a pooling", op.name()))?;
    let (a, planes) = p.axes(x.shape().dims())?;
    match dy {
        None => on_floats(
            x,
            None,
            ty,
            |x, _| pool_fwd(x, &p, &a, planes),
            |x, _| pool_fwd(x, &p, &a, planes),
        ),
        Some(d) => on_floats(
            x,
            Some(d),
            ty,
            |x, d| pool_grad(x, d, &p, &a, planes),
            |x, d| pool_grad(x, d, &p, &a, planes),
        ),
    }
}

/// [`Op::BatchNorm`] (inference): per channel `(x - mean) / sqrt(var + eps) * scale + bias`.
pub(crate) fn batch_norm(args: &[&Tensor], epsilon: f64, ty: &TensorType) -> Result<TensorData, String> {
    let [x, scale, bias, mean, var] = args else {
        return Err("batch_norm takes 5 operands".into());
    };
    let dims = x.shape().dims();
    let c = dims.get(1).copied().unwrap_or(1);
    let inner: usize = dims.iter().skip(2).product();
    fn go<T: Num>(x: &[T], p: [&[T]; 4], c: usize, inner: usize, eps: T, sqrt: fn(T) -> T) -> Vec<T> {
        let [scale, bias, mean, var] = p;
        x.iter()
            .enumerate()
            .map(|(i, &v)| {
                let k = (i / inner.max(1)) % c.max(1);
                let neg = T::from(-1.0);
                (v + neg * mean[k]).div(sqrt(var[k] + eps)) * scale[k] + bias[k]
            })
            .collect()
    }
    Ok(
        match (
            vals(x.data()),
            vals(scale.data()),
            vals(bias.data()),
            vals(mean.data()),
            vals(var.data()),
        ) {
            (Vals::F32(x), Vals::F32(s), Vals::F32(b), Vals::F32(m), Vals::F32(v)) => {
                from_f32(ty.dtype, go(&x, [&s, &b, &m, &v], c, inner, epsilon as f32, f32::sqrt))
            }
            (Vals::F64(x), Vals::F64(s), Vals::F64(b), Vals::F64(m), Vals::F64(v)) => {
                TensorData::F64(go(x, [s, b, m, v], c, inner, epsilon, f64::sqrt))
            }
            _ => return Err(format!("batch_norm needs float operands, got {}", x.dtype())),
        },
    )
}
