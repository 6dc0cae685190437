//! One vector-Jacobian product per primitive op.
//!
//! `vjp(b, node, op, operands, wanted, g)` returns, for each operand `k` with
//! `wanted[k]`, the contribution `g · ∂node/∂operand_k`, built from primitives in `b`
//! (None: no gradient flows to that operand). Each rule is checked against central
//! finite differences in f64 (`autodiff/tests.rs`).

// reason: the rules run on a verified graph (`gradients` verifies it first): every
// node's type is `infer_type` of its operands', so every attribute axis is < its
// operand's rank, operand counts are the op's, and shapes agree as the typing rules say.
#![allow(clippy::indexing_slicing)]

use std::f64::consts::PI;

use crate::op::SliceRange;
use crate::{
    AttentionDims, BinaryOp, DType, GraphBuilder, NodeId, Op, PadMode, ReduceOp, Shape, Tensor, TensorType, UnaryOp,
    Value,
};

type Grads<'b> = Vec<Option<Value<'b>>>;

pub(super) fn vjp<'b>(
    b: &'b GraphBuilder,
    node: NodeId,
    op: &Op,
    operands: &[NodeId],
    wanted: &[bool],
    g: Value<'b>,
) -> Result<Grads<'b>, String> {
    let v = |id: NodeId| b.value(id).ok_or_else(|| format!("{id} is not a node"));
    let y = v(node)?;
    let x: Vec<Value<'b>> = operands.iter().map(|&o| v(o)).collect::<Result<_, _>>()?;
    let want = |k: usize| wanted.get(k).copied().unwrap_or(false);
    Ok(match (op, x.as_slice()) {
        (Op::Unary(u), [a]) => vec![unary(*u, *a, y, g)],
        (Op::Binary(op), [l, r]) => {
            let (gl, gr) = binary(*op, *l, *r, y, g, want(0), want(1))?;
            vec![gl, gr]
        }
        (Op::Select, [c, _, _]) => {
            let zero = zeros_like(g);
            vec![None, Some(b.select(*c, g, zero)), Some(b.select(*c, zero, g))]
        }
        (Op::Cast { .. }, [a]) => vec![a.dtype().is_float().then(|| g.cast(a.dtype()))],
        (Op::Broadcast { .. }, [a]) => vec![Some(sum_to_shape(g, &a.shape()))],
        (Op::Reduce { op, axes, keepdims }, [a]) => vec![Some(reduce(*op, axes, *keepdims, *a, y, g)?)],
        (Op::MatMul, [l, r]) => {
            let (gl, gr) = matmul(*l, *r, g, want(0), want(1));
            vec![gl, gr]
        }
        (Op::Reshape { .. }, [a]) => vec![Some(g.reshape(a.shape()))],
        (Op::Transpose { perm }, [_]) => {
            let mut inv = vec![0; perm.len()];
            for (i, &p) in perm.iter().enumerate() {
                inv[p] = i;
            }
            vec![Some(g.transpose(&inv))]
        }
        (Op::Slice { ranges }, [a]) => vec![Some(slice(b, ranges, *a, g))],
        (Op::Concat { axis }, parts) => {
            let mut at = 0i64;
            parts
                .iter()
                .map(|p| {
                    let len = p.shape().dims()[*axis] as i64;
                    let s = g.slice(*axis as i64, at, at + len, 1);
                    at += len;
                    Some(s)
                })
                .collect()
        }
        (Op::Gather { axis }, [data, idx]) => {
            let size = data.shape().dims()[*axis];
            vec![Some(g.scatter_add(*idx, *axis as i64, size)), None]
        }
        (Op::ScatterAdd { axis, .. }, [_, idx]) => vec![Some(g.gather(*idx, *axis as i64)), None],
        (Op::Pad { pads, mode, .. }, [a]) => {
            if *mode != PadMode::Constant {
                return Err(format!("a {} pad (only constant pads are differentiated)", mode.name()));
            }
            // The operand's part of the output: the pads undone (a crop becomes a pad).
            let undo: Vec<(i64, i64)> = pads.iter().map(|&(lo, hi)| (-lo, -hi)).collect();
            let back = g.pad(&undo, PadMode::Constant, 0.0);
            debug_assert_eq!(back.shape(), a.shape());
            vec![Some(back)]
        }
        (
            Op::Attention {
                scale,
                causal,
                zero_masked_rows,
            },
            args,
        ) => {
            if wanted.get(3).copied().unwrap_or(false) {
                attention(b, args, *scale, *causal, *zero_masked_rows, g, wanted)?
            } else {
                attention_fused(b, args, y, *scale, *causal, *zero_masked_rows, g, wanted)
            }
        }
        (Op::Conv { window, groups }, [xv, w]) => {
            let dx = want(0).then(|| {
                g.conv_grad(
                    *w,
                    crate::ConvOperand::Input,
                    window.clone(),
                    *groups,
                    xv.shape().dims(),
                )
            });
            let dw =
                want(1).then(|| xv.conv_grad(g, crate::ConvOperand::Weight, window.clone(), *groups, w.shape().dims()));
            vec![dx, dw]
        }
        (Op::Pool { .. }, [xv]) => vec![Some(xv.pool_grad(g, op))],
        (Op::Dequantize { .. }, [_, _]) => {
            return Err("a dequantized weight (quantized weights are frozen)".into());
        }
        (Op::Input { .. } | Op::Parameter { .. } | Op::Constant { .. } | Op::Iota { .. }, _) => vec![],
        (Op::ArgReduce { .. }, _) => vec![None],
        (op, _) => return Err(format!("{} with {} operand(s)", op.name(), x.len())),
    })
}

fn zeros_like(x: Value<'_>) -> Value<'_> {
    x.builder().scalar(x.dtype(), 0.0).broadcast_to(&x.shape())
}

fn unary<'b>(u: UnaryOp, x: Value<'b>, y: Value<'b>, g: Value<'b>) -> Option<Value<'b>> {
    let b = x.builder();
    Some(match u {
        UnaryOp::Neg => -g,
        UnaryOp::Abs => g * x.sign(),
        UnaryOp::Exp => g * y,
        UnaryOp::Log => g / x,
        UnaryOp::Sqrt => g / (y * 2.0),
        // d x^-1/2 = -1/2 x^-3/2 = -1/2 y^3
        UnaryOp::Rsqrt => g * (y * y * y * -0.5),
        UnaryOp::Reciprocal => -(g * y * y),
        UnaryOp::Tanh => g * (1.0 - y * y),
        UnaryOp::Sigmoid => g * (y * (1.0 - y)),
        UnaryOp::Relu => b.select(x.gt(0.0), g, zeros_like(g)),
        // Φ(x) + x φ(x)
        UnaryOp::Gelu => {
            let cdf = ((x * std::f64::consts::FRAC_1_SQRT_2).erf() + 1.0) * 0.5;
            let pdf = (x * x * -0.5).exp() * (1.0 / (2.0 * PI).sqrt());
            g * (cdf + x * pdf)
        }
        // PyTorch's gelu_backward for approximate='tanh', one op (cuBLASLt's DGELU
        // epilogue when it follows a GEMM).
        UnaryOp::GeluTanh => g.binary(BinaryOp::GeluTanhGrad, x),
        // s (1 + x (1 - s))
        UnaryOp::Silu => {
            let s = x.sigmoid();
            g * (s * (x * (1.0 - s) + 1.0))
        }
        UnaryOp::Erf => g * ((x * x * -1.0).exp() * (2.0 / PI.sqrt())),
        UnaryOp::Sin => g * x.cos(),
        UnaryOp::Cos => -(g * x.sin()),
        UnaryOp::Floor | UnaryOp::Ceil | UnaryOp::Round | UnaryOp::Sign => return None,
        UnaryOp::Not | UnaryOp::IsNan | UnaryOp::IsInf => return None,
    })
}

type Pair<'b> = (Option<Value<'b>>, Option<Value<'b>>);

fn binary<'b>(
    op: BinaryOp,
    l: Value<'b>,
    r: Value<'b>,
    y: Value<'b>,
    g: Value<'b>,
    wl: bool,
    wr: bool,
) -> Result<Pair<'b>, String> {
    let b = l.builder();
    let only = |gl: Option<Value<'b>>, gr: Option<Value<'b>>| (gl.filter(|_| wl), gr.filter(|_| wr));
    Ok(match op {
        BinaryOp::Add => (Some(g), Some(g)),
        BinaryOp::Sub => (Some(g), wr.then(|| -g)),
        BinaryOp::Mul => only(wl.then(|| g * r), wr.then(|| g * l)),
        BinaryOp::Div => only(wl.then(|| g / r), wr.then(|| -(g * y / r))),
        BinaryOp::Pow => only(
            wl.then(|| g * r * l.pow(r - 1.0)),
            // As PyTorch: 0 where the base is 0 (0^r is constant in r there).
            wr.then(|| {
                let d = g * y * l.log();
                b.select(l.eq(0.0), zeros_like(g), d)
            }),
        ),
        BinaryOp::Max | BinaryOp::Min => {
            // As torch.maximum / minimum: the winner takes the gradient, a tie halves it.
            let (win_l, win_r) = if op == BinaryOp::Max {
                (l.gt(r), r.gt(l))
            } else {
                (l.lt(r), r.lt(l))
            };
            let half = g * 0.5;
            let zero = zeros_like(g);
            let tie = l.eq(r);
            let gl = wl.then(|| b.select(win_l, g, b.select(tie, half, zero)));
            let gr = wr.then(|| b.select(win_r, g, b.select(tie, half, zero)));
            (gl, gr)
        }
        // a - b floor(a / b) and a - b trunc(a / b).
        BinaryOp::Mod => only(Some(g), wr.then(|| -(g * (l / r).floor()))),
        BinaryOp::Fmod => only(
            Some(g),
            wr.then(|| {
                let q = l / r;
                -(g * (q.abs().floor() * q.sign()))
            }),
        ),
        // Linear in the gradient; its derivative in x (second order) is not built.
        BinaryOp::GeluTanhGrad if wr => {
            return Err("the tanh GELU's backward with respect to its input (a second derivative)".into())
        }
        BinaryOp::GeluTanhGrad => (Some(g.binary(BinaryOp::GeluTanhGrad, r)), None),
        _ => (None, None),
    })
}

/// Sum `g` down to `shape` (the transpose of a numpy broadcast of `shape`).
fn sum_to_shape<'b>(g: Value<'b>, shape: &Shape) -> Value<'b> {
    let gd = g.shape().dims().to_vec();
    let sd = shape.dims();
    if gd == sd {
        return g;
    }
    let lead = gd.len() - sd.len();
    let axes: Vec<i64> = (0..gd.len())
        .filter(|&i| i < lead || (sd[i - lead] == 1 && gd[i] != 1))
        .map(|i| i as i64)
        .collect();
    let s = match axes.as_slice() {
        [] => g,
        // A one-hot selection summed over its classes: one element (`one_hot`).
        &[a] => match super::one_hot::one_hot_sum(g, a as usize) {
            Some(picked) => picked,
            None => g.sum(&axes, false),
        },
        _ => g.sum(&axes, false),
    };
    s.reshape(shape.clone())
}

fn reduce<'b>(
    op: ReduceOp,
    axes: &[usize],
    keepdims: bool,
    x: Value<'b>,
    y: Value<'b>,
    g: Value<'b>,
) -> Result<Value<'b>, String> {
    let xs = x.shape();
    let kept: Vec<usize> = xs
        .dims()
        .iter()
        .enumerate()
        .map(|(i, &d)| if axes.contains(&i) { 1 } else { d })
        .collect();
    let kept = Shape::from(kept);
    let up = |t: Value<'b>| {
        if keepdims {
            t.broadcast_to(&xs)
        } else {
            t.reshape(kept.clone()).broadcast_to(&xs)
        }
    };
    Ok(match op {
        ReduceOp::Sum => up(g),
        ReduceOp::Mean => {
            let n: usize = axes.iter().map(|&a| xs.dims()[a]).product();
            up(g) * (1.0 / n as f64)
        }
        ReduceOp::Max | ReduceOp::Min => {
            // As torch.amax / amin: shared evenly among the elements equal to the extreme.
            // The count is at least 1: where `x` is a recomputed copy of the forward's
            // input (rematerialization) whose kernels round differently, no element may
            // equal the saved extreme, and the share is then dropped rather than 0/0.
            let hit = x.eq(up(y)).cast(x.dtype());
            let count = hit
                .sum(&axes.iter().map(|&a| a as i64).collect::<Vec<_>>(), true)
                .binary(BinaryOp::Max, 1.0);
            up(if keepdims { g } else { g.reshape(kept.clone()) } / count) * hit
        }
        ReduceOp::Prod => up(g) * up(y) / x,
    })
}

/// `l [.., M, K] @ r [.., K, N]`: `g @ rᵀ` and `lᵀ @ g`, each summed over the batch
/// dims its operand was broadcast along. A rank-2 right operand under a batched left
/// one (a linear layer) gets one `[K, rows] @ [rows, N]` product.
fn matmul<'b>(l: Value<'b>, r: Value<'b>, g: Value<'b>, wl: bool, wr: bool) -> Pair<'b> {
    let (ld, rd, gd) = (
        l.shape().dims().to_vec(),
        r.shape().dims().to_vec(),
        g.shape().dims().to_vec(),
    );
    let t = |v: Value<'b>| {
        let n = v.rank();
        let mut perm: Vec<usize> = (0..n).collect();
        perm.swap(n - 2, n - 1);
        v.transpose(&perm)
    };
    let gl = wl.then(|| {
        let full = g.matmul(t(r));
        sum_to_shape(full, &l.shape())
    });
    let gr = wr.then(|| {
        if rd.len() == 2 && ld.len() > 2 {
            let (k, n) = (rd[0], rd[1]);
            let rows: usize = gd[..gd.len() - 1].iter().product();
            let lf = l.broadcast_to(&Shape::from([&gd[..gd.len() - 2], &ld[ld.len() - 2..]].concat()));
            let l2 = lf.reshape([rows, k]);
            t(l2).matmul(g.reshape([rows, n]))
        } else {
            sum_to_shape(t(l).matmul(g), &r.shape())
        }
    });
    (gl, gr)
}

/// The transpose of a slice: the gradient put back at the positions the slice read,
/// zero elsewhere (a pad for unit steps, a scatter-add along an axis otherwise).
fn slice<'b>(b: &'b GraphBuilder, ranges: &[SliceRange], x: Value<'b>, g: Value<'b>) -> Value<'b> {
    let dims = x.shape().dims().to_vec();
    let mut out = g;
    let mut pads = Vec::with_capacity(dims.len());
    let mut strided = Vec::new();
    for (axis, (r, &d)) in ranges.iter().zip(&dims).enumerate() {
        let (start, len) = r.resolve(d);
        if r.step == 1 || len == 0 {
            let lo = if len == 0 { 0 } else { start };
            pads.push((lo, d as i64 - lo - len as i64));
        } else {
            pads.push((0, 0));
            strided.push((axis, start, r.step, len, d));
        }
    }
    for (axis, start, step, len, d) in strided {
        let idx: Vec<i64> = (0..len as i64).map(|i| start + i * step).collect();
        let idx = Tensor::new([len], crate::TensorData::I64(idx)).map(|t| b.constant(t));
        let Ok(idx) = idx else { continue };
        out = out.scatter_add(idx, axis as i64, d);
    }
    if pads.iter().any(|&p| p != (0, 0)) {
        out = out.pad(&pads, PadMode::Constant, 0.0);
    }
    out
}

/// Attention's backward as FlashAttention-2 computes it, with no `[sq, sk]` tensor:
/// the log-sum-exp of every score row ([`Op::AttentionLse`], from q, k and the mask:
/// forward values) and `delta = rowsum(dout * out)`, then one [`Op::AttentionGrad`]
/// per operand wanted, each recomputing the probabilities from them.
#[allow(clippy::too_many_arguments)]
fn attention_fused<'b>(
    b: &'b GraphBuilder,
    args: &[Value<'b>],
    out: Value<'b>,
    scale: f64,
    causal: bool,
    zero_masked_rows: bool,
    g: Value<'b>,
    wanted: &[bool],
) -> Grads<'b> {
    let (q, k, v) = (args[0], args[1], args[2]);
    let mask = args.get(3).copied();
    let stats = crate::infer::attention_stats_dtype(q.dtype());
    let mut lse_args = vec![q.id(), k.id()];
    lse_args.extend(mask.map(|m| m.id()));
    let lse = b.op(Op::AttentionLse { scale, causal }, &lse_args);
    let delta = (g.cast(stats) * out.cast(stats)).sum(&[-1], false);
    let mut res: Grads<'b> = vec![None; args.len()];
    for wrt in [
        crate::AttentionOperand::Q,
        crate::AttentionOperand::K,
        crate::AttentionOperand::V,
    ] {
        if !wanted.get(wrt.index()).copied().unwrap_or(false) {
            continue;
        }
        let mut operands = vec![q.id(), k.id(), v.id(), g.id(), lse.id(), delta.id()];
        operands.extend(mask.map(|m| m.id()));
        let op = Op::AttentionGrad {
            wrt,
            scale,
            causal,
            zero_masked_rows,
        };
        res[wrt.index()] = Some(b.op(op, &operands));
    }
    res
}

/// Attention's backward from its definition, recomputing the probabilities from q, k
/// and the mask (nothing of `[.., sq, sk]` is saved from the forward pass):
/// `dv = pᵀ g`, `dp = g vᵀ`, `ds = p (dp - rowsum(dp p))`, `dq = ds k scale`,
/// `dk = dsᵀ q scale`, the mask's gradient `ds` summed to its shape; grouped kv heads
/// sum over the query heads that read them.
fn attention<'b>(
    b: &'b GraphBuilder,
    args: &[Value<'b>],
    scale: f64,
    causal: bool,
    zero_masked_rows: bool,
    g: Value<'b>,
    wanted: &[bool],
) -> Result<Grads<'b>, String> {
    let tys: Vec<TensorType> = args.iter().map(|a| a.ty()).collect();
    let refs: Vec<&TensorType> = tys.iter().collect();
    let dims = AttentionDims::of(&refs)?;
    let (q, k, v) = (args[0], args[1], args[2]);
    let nb = dims.batch.len();
    let group = dims.hq / dims.hkv;
    // kv heads repeated for the query heads that read them: [.., hkv, s, d] -> [.., hq, s, d].
    let expand = |t: Value<'b>| {
        if group == 1 {
            return t;
        }
        let td = t.shape().dims().to_vec();
        let mut five = td[..nb + 1].to_vec();
        five.push(1);
        five.extend_from_slice(&td[nb + 1..]);
        let mut wide = five.clone();
        wide[nb + 1] = group;
        let mut out = td.clone();
        out[nb] = dims.hq;
        t.reshape(five).broadcast_to(&Shape::from(wide)).reshape(out)
    };
    // [.., hq, s, d] -> [.., hkv, s, d], summing each group.
    let fold = |t: Value<'b>| {
        if group == 1 {
            return t;
        }
        let td = t.shape().dims().to_vec();
        let mut five = td[..nb].to_vec();
        five.extend([dims.hkv, group]);
        five.extend_from_slice(&td[nb + 1..]);
        t.reshape(five).sum(&[nb as i64 + 1], false)
    };
    let tr = |t: Value<'b>| {
        let n = t.rank();
        let mut perm: Vec<usize> = (0..n).collect();
        perm.swap(n - 2, n - 1);
        t.transpose(&perm)
    };
    let (ke, ve) = (expand(k), expand(v));
    let mut s = q.matmul(tr(ke)) * scale;
    let sshape = s.shape();
    if let Some(m) = args.get(3) {
        s = s + m.broadcast_to(&sshape);
    }
    if causal {
        let r = sshape.rank() as i64;
        let i = b.iota(DType::I64, sshape.clone(), r - 2);
        let j = b.iota(DType::I64, sshape.clone(), r - 1);
        let ninf = b.scalar(s.dtype(), f64::NEG_INFINITY).broadcast_to(&sshape);
        s = b.select(j.gt(i), ninf, s);
    }
    let mut p = crate::nn::softmax(s, -1);
    if zero_masked_rows {
        // The forward pass zeroes a row whose sum is NaN or 0; p is NaN on such a row.
        p = b.select(p.isnan(), zeros_like(p), p);
    }
    let mut out: Grads<'b> = vec![None; args.len()];
    if wanted.get(2).copied().unwrap_or(false) {
        out[2] = Some(fold(tr(p).matmul(g)));
    }
    let need_s = wanted.iter().take(2).any(|&w| w) || wanted.get(3).copied().unwrap_or(false);
    if need_s {
        let dp = g.matmul(tr(ve));
        let ds = p * (dp - (dp * p).sum(&[-1], true));
        if wanted.first().copied().unwrap_or(false) {
            out[0] = Some(ds.matmul(ke) * scale);
        }
        if wanted.get(1).copied().unwrap_or(false) {
            out[1] = Some(fold(tr(ds).matmul(q)) * scale);
        }
        if let (Some(m), true) = (args.get(3), wanted.get(3).copied().unwrap_or(false)) {
            out[3] = Some(sum_to_shape(ds, &m.shape()));
        }
    }
    Ok(out)
}
