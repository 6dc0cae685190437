//! Shape and dtype inference: the type every op gives its operands' types, or why not.
//!
//! Runs on unverified graphs (from the `.gir` parser, JSON and the ONNX importer), so
//! every operand count, axis, permutation and extent is checked here before use.

use crate::shape::{broadcast_shapes, broadcasts_to};
use crate::{DType, Op, PadMode, Shape, SliceRange, TensorType};

/// The output type of `op` applied to operands of types `args`, or a message saying
/// which rule the operands break.
pub fn infer_type(op: &Op, args: &[&TensorType]) -> Result<TensorType, String> {
    let ty = infer_unchecked(op, args)?;
    if ty.shape.checked_numel().is_none() {
        return Err(format!("{} gives {ty}, which is too large", op.name()));
    }
    Ok(ty)
}

/// The operands of an op of fixed arity `N`, or the error saying how many it takes.
fn operands<'a, const N: usize>(op: &Op, args: &[&'a TensorType]) -> Result<[&'a TensorType; N], String> {
    <[&TensorType; N]>::try_from(args).map_err(|_| format!("{} takes {N} operand(s), got {}", op.name(), args.len()))
}

fn infer_unchecked(op: &Op, args: &[&TensorType]) -> Result<TensorType, String> {
    if let Some(n) = op.arity() {
        if args.len() != n {
            return Err(format!("{} takes {n} operand(s), got {}", op.name(), args.len()));
        }
    } else if args.is_empty() {
        return Err(format!("{} takes at least one operand", op.name()));
    }
    match op {
        Op::Input { ty, .. } | Op::Parameter { ty, .. } => Ok(ty.clone()),
        Op::Constant { value } => Ok(value.ty()),
        Op::Iota { ty, axis } => {
            if !ty.dtype.is_numeric() {
                return Err(format!("iota needs a numeric dtype, got {}", ty.dtype));
            }
            check_axis(*axis, ty.shape.rank())?;
            Ok(ty.clone())
        }
        Op::Unary(u) => {
            let [a] = operands(op, args)?;
            if !u.accepts(a.dtype) {
                return Err(format!("{} does not accept {}", u.name(), a.dtype));
            }
            Ok(TensorType::new(u.output_dtype(a.dtype), a.shape.clone()))
        }
        Op::Binary(b) => {
            let [x, y] = operands(op, args)?;
            if x != y {
                return Err(format!(
                    "{} needs operands of one type (broadcasts and casts are explicit), got {x} and {y}",
                    b.name()
                ));
            }
            if !b.accepts(x.dtype) {
                return Err(format!("{} does not accept {}", b.name(), x.dtype));
            }
            Ok(TensorType::new(b.output_dtype(x.dtype), x.shape.clone()))
        }
        Op::Select => {
            let [c, a, b] = operands(op, args)?;
            if c.dtype != DType::Bool {
                return Err(format!("select needs a bool condition, got {c}"));
            }
            if a != b || c.shape != a.shape {
                return Err(format!(
                    "select needs operands of one shape and the two values of one type, got {c}, {a}, {b}"
                ));
            }
            Ok(a.clone())
        }
        Op::Cast { to } => {
            let [a] = operands(op, args)?;
            Ok(TensorType::new(*to, a.shape.clone()))
        }
        Op::Broadcast { shape } => {
            let [a] = operands(op, args)?;
            if !broadcasts_to(a.shape.dims(), shape.dims()) {
                return Err(format!("{} does not broadcast to {shape}", a.shape));
            }
            Ok(TensorType::new(a.dtype, shape.clone()))
        }
        Op::Reduce { op: r, axes, keepdims } => {
            let [a] = operands(op, args)?;
            if !a.dtype.is_numeric() {
                return Err(format!("{} does not accept {}", r.name(), a.dtype));
            }
            check_axes(axes, a.shape.rank())?;
            let dims = a
                .shape
                .dims()
                .iter()
                .enumerate()
                .filter_map(|(i, &d)| match (axes.contains(&i), keepdims) {
                    (false, _) => Some(d),
                    (true, true) => Some(1),
                    (true, false) => None,
                })
                .collect::<Vec<_>>();
            Ok(TensorType::new(a.dtype, dims))
        }
        Op::ArgReduce { op: r, axis, keepdims } => {
            let [a] = operands(op, args)?;
            if !a.dtype.is_numeric() {
                return Err(format!("{} does not accept {}", r.name(), a.dtype));
            }
            let (before, extent, after) = split_axis(*axis, a.shape.dims())?;
            if extent == 0 {
                return Err(format!("{} over an empty axis {axis}", r.name()));
            }
            let mut dims = before.to_vec();
            if *keepdims {
                dims.push(1);
            }
            dims.extend_from_slice(after);
            Ok(TensorType::new(DType::I64, dims))
        }
        Op::MatMul => {
            let [a, b] = operands(op, args)?;
            infer_matmul(a, b)
        }
        Op::Reshape { shape } => {
            let [a] = operands(op, args)?;
            if shape.numel() != a.numel() {
                return Err(format!(
                    "reshape of {a} ({} elements) to {shape} ({} elements)",
                    a.numel(),
                    shape.numel()
                ));
            }
            Ok(TensorType::new(a.dtype, shape.clone()))
        }
        Op::Transpose { perm } => {
            let [a] = operands(op, args)?;
            infer_transpose(a, perm)
        }
        Op::Slice { ranges } => {
            let [a] = operands(op, args)?;
            infer_slice(a, ranges)
        }
        Op::Concat { axis } => infer_concat(*axis, args),
        Op::Gather { axis } => {
            let [data, idx] = operands(op, args)?;
            let (before, _, after) = split_axis(*axis, data.shape.dims())?;
            if !matches!(idx.dtype, DType::I64 | DType::I32) {
                return Err(format!("gather indices must be i64 or i32, got {}", idx.dtype));
            }
            let mut dims = before.to_vec();
            dims.extend_from_slice(idx.shape.dims());
            dims.extend_from_slice(after);
            Ok(TensorType::new(data.dtype, dims))
        }
        Op::ScatterAdd { axis, size } => {
            let [upd, idx] = operands(op, args)?;
            infer_scatter_add(*axis, *size, upd, idx)
        }
        Op::Pad { pads, mode, .. } => {
            let [a] = operands(op, args)?;
            infer_pad(a, pads, *mode)
        }
        Op::Attention { .. } => {
            let dims = AttentionDims::of(args)?;
            Ok(TensorType::new(dims.dtype, dims.out_dims()))
        }
        Op::AttentionLse { .. } => {
            let (q, k, mask) = match args {
                [q, k] => (*q, *k, None),
                [q, k, m] => (*q, *k, Some(*m)),
                _ => {
                    return Err(format!(
                        "attention_lse takes 2 or 3 operands (q, k, mask), got {}",
                        args.len()
                    ))
                }
            };
            let mut tys = vec![q, k, k];
            tys.extend(mask);
            let dims = AttentionDims::of(&tys)?;
            let mut out = dims.batch.clone();
            out.extend([dims.hq, dims.sq]);
            Ok(TensorType::new(attention_stats_dtype(dims.dtype), out))
        }
        Op::AttentionGrad { wrt, .. } => {
            let (q, k, v, dout, lse, delta, mask) = match args {
                [q, k, v, o, l, d] => (*q, *k, *v, *o, *l, *d, None),
                [q, k, v, o, l, d, m] => (*q, *k, *v, *o, *l, *d, Some(*m)),
                _ => {
                    return Err(format!(
                        "attention_grad takes 6 or 7 operands (q, k, v, dout, lse, delta, mask), got {}",
                        args.len()
                    ))
                }
            };
            let mut tys = vec![q, k, v];
            tys.extend(mask);
            let dims = AttentionDims::of(&tys)?;
            let out = TensorType::new(dims.dtype, dims.out_dims());
            if *dout != out {
                return Err(format!("attention_grad dout must be {out}, got {dout}"));
            }
            let mut rows = dims.batch.clone();
            rows.extend([dims.hq, dims.sq]);
            let stats = TensorType::new(attention_stats_dtype(dims.dtype), rows);
            for (what, t) in [("lse", lse), ("delta", delta)] {
                if *t != stats {
                    return Err(format!("attention_grad {what} must be {stats}, got {t}"));
                }
            }
            Ok(match wrt {
                crate::AttentionOperand::Q => q.clone(),
                crate::AttentionOperand::K => k.clone(),
                crate::AttentionOperand::V => v.clone(),
            })
        }
        Op::Dequantize { bits, group } => {
            let [q, scales] = operands(op, args)?;
            infer_dequantize(*bits, *group, q, scales)
        }
        Op::BatchNorm { .. } => infer_batch_norm(args),
        Op::Conv { window, groups } => {
            let [x, w] = operands(op, args)?;
            float_pair("conv", x, w)?;
            let g = crate::ConvGeom::new(window, *groups, x.shape.dims(), w.shape.dims())?;
            Ok(TensorType::new(x.dtype, g.out_dims()))
        }
        Op::ConvGrad {
            wrt,
            window,
            groups,
            shape,
        } => {
            let [a, b] = operands(op, args)?;
            float_pair("conv_grad", a, b)?;
            let (x, w, dy) = match wrt {
                crate::ConvOperand::Input => (shape.dims(), b.shape.dims(), a),
                crate::ConvOperand::Weight => (a.shape.dims(), shape.dims(), b),
            };
            let g = crate::ConvGeom::new(window, *groups, x, w)?;
            if dy.shape.dims() != g.out_dims().as_slice() {
                return Err(format!(
                    "conv_grad of the {}: the output gradient must be {:?}, got {}",
                    wrt.name(),
                    g.out_dims(),
                    dy.shape
                ));
            }
            Ok(TensorType::new(a.dtype, shape.clone()))
        }
        Op::Pool {
            kernel,
            window,
            ceil_mode,
            ..
        } => {
            let [x] = operands(op, args)?;
            Ok(TensorType::new(
                x.dtype,
                pool_dims(op.name(), x, kernel, window, *ceil_mode)?,
            ))
        }
        Op::PoolGrad {
            kernel,
            window,
            ceil_mode,
            ..
        } => {
            let [x, dy] = operands(op, args)?;
            let out = pool_dims(op.name(), x, kernel, window, *ceil_mode)?;
            if dy.dtype != x.dtype || dy.shape.dims() != out.as_slice() {
                return Err(format!(
                    "{} needs an output gradient {} {out:?}, got {dy}",
                    op.name(),
                    x.dtype
                ));
            }
            Ok(x.clone())
        }
    }
}

/// [`Op::BatchNorm`]: `x` `[n, c, ..]` and four `[c]` of its float dtype.
fn infer_batch_norm(args: &[&TensorType]) -> Result<TensorType, String> {
    let [x, rest @ ..] = args else {
        return Err("batch_norm takes 5 operands".into());
    };
    let c = match x.shape.dims() {
        [_, c, ..] if x.dtype.is_float() => *c,
        _ => return Err(format!("batch_norm needs a float [N, C, ..], got {x}")),
    };
    let per = TensorType::new(x.dtype, vec![c]);
    if let Some(bad) = rest.iter().find(|t| ***t != per) {
        return Err(format!("batch_norm scale, bias, mean and var must be {per}, got {bad}"));
    }
    Ok((*x).clone())
}

/// Two float operands of one dtype (a convolution's).
fn float_pair(name: &str, a: &TensorType, b: &TensorType) -> Result<(), String> {
    if !a.dtype.is_float() || a.dtype != b.dtype {
        return Err(format!("{name} needs float operands of one dtype, got {a} and {b}"));
    }
    Ok(())
}

/// The output dims of a pooling of `x` `[n, c, spatial..]`.
fn pool_dims(
    name: &str,
    x: &TensorType,
    kernel: &[usize],
    window: &crate::Window,
    ceil_mode: bool,
) -> Result<Vec<usize>, String> {
    let [n, c, spatial @ ..] = x.shape.dims() else {
        return Err(format!("{name} needs [N, C, spatial..], got {x}"));
    };
    if !x.dtype.is_float() || spatial.is_empty() || spatial.len() > 3 {
        return Err(format!(
            "{name} needs a float [N, C, spatial..] with 1 to 3 spatial axes, got {x}"
        ));
    }
    let axes = window.axes(spatial, kernel, ceil_mode)?;
    Ok([*n, *c].into_iter().chain(axes.iter().map(|a| a.out)).collect())
}

/// The type of attention's row statistics (log-sum-exp, `delta`): f64 for f64
/// operands, else f32.
pub fn attention_stats_dtype(d: DType) -> DType {
    if d == DType::F64 {
        DType::F64
    } else {
        DType::F32
    }
}

/// [`Op::ScatterAdd`]: `updates` is `before ++ indices ++ after`; the result
/// `before ++ [size] ++ after`.
fn infer_scatter_add(axis: usize, size: usize, upd: &TensorType, idx: &TensorType) -> Result<TensorType, String> {
    if !matches!(idx.dtype, DType::I64 | DType::I32) {
        return Err(format!("scatter_add indices must be i64 or i32, got {}", idx.dtype));
    }
    if !upd.dtype.is_numeric() {
        return Err(format!("scatter_add updates must be numeric, got {}", upd.dtype));
    }
    let (ud, id) = (upd.shape.dims(), idx.shape.dims());
    let end = axis.checked_add(id.len()).filter(|&e| e <= ud.len()).ok_or_else(|| {
        format!(
            "scatter_add along axis {axis} with indices {} needs updates of rank >= {}, got {}",
            idx.shape,
            axis.saturating_add(id.len()),
            upd.shape
        )
    })?;
    let (Some(before), Some(held), Some(after)) = (ud.get(..axis), ud.get(axis..end), ud.get(end..)) else {
        return Err(format!("scatter_add axis {axis} is out of range for {}", upd.shape));
    };
    if held != id {
        return Err(format!(
            "scatter_add updates {} do not hold indices {} at axis {axis}",
            upd.shape, idx.shape
        ));
    }
    if size == 0 && id.iter().product::<usize>() > 0 {
        return Err("scatter_add into an empty axis".to_string());
    }
    let mut dims = before.to_vec();
    dims.push(size);
    dims.extend_from_slice(after);
    Ok(TensorType::new(upd.dtype, dims))
}

/// [`Op::Dequantize`]: the unpacked `[.., k]` of the scales' dtype.
fn infer_dequantize(bits: usize, group: usize, q: &TensorType, scales: &TensorType) -> Result<TensorType, String> {
    let want = match bits {
        8 => DType::I8,
        4 => DType::U8,
        _ => return Err(format!("dequantize takes bits 4 or 8, got {bits}")),
    };
    if q.dtype != want {
        return Err(format!("dequantize bits={bits} needs {want} data, got {q}"));
    }
    if !scales.dtype.is_float() {
        return Err(format!("dequantize needs float scales, got {scales}"));
    }
    if group == 0 {
        return Err("dequantize needs a group of at least 1".into());
    }
    let Some((&last, outer)) = q.shape.dims().split_last() else {
        return Err(format!("dequantize needs data of rank 1 or more, got {q}"));
    };
    let k = if bits == 4 { last.saturating_mul(2) } else { last };
    let mut want_scales = outer.to_vec();
    want_scales.push(k.div_ceil(group));
    if scales.shape.dims() != want_scales.as_slice() {
        return Err(format!(
            "dequantize of {q} in groups of {group} needs scales of shape {}, got {scales}",
            Shape::new(want_scales)
        ));
    }
    let mut dims = outer.to_vec();
    dims.push(k);
    Ok(TensorType::new(scales.dtype, dims))
}

/// The dimensions of an [`Op::Attention`], checked: `q` `[batch.., hq, sq, d]`, `k`
/// `[batch.., hkv, sk, d]`, `v` `[batch.., hkv, sk, dv]`, and whether a mask is given
/// (its dims each 1 or the scores').
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AttentionDims {
    /// The operands' (and the output's) dtype.
    pub dtype: DType,
    pub batch: Vec<usize>,
    pub hq: usize,
    pub hkv: usize,
    pub sq: usize,
    pub sk: usize,
    pub d: usize,
    pub dv: usize,
    pub masked: bool,
}

impl AttentionDims {
    /// The dims of attention over operands of types `args` (q, k, v and maybe a
    /// mask), or the rule they break.
    pub fn of(args: &[&TensorType]) -> Result<AttentionDims, String> {
        let (q, k, v, mask) = match args {
            [q, k, v] => (*q, *k, *v, None),
            [q, k, v, m] => (*q, *k, *v, Some(*m)),
            _ => {
                return Err(format!(
                    "attention takes 3 or 4 operands (q, k, v, mask), got {}",
                    args.len()
                ))
            }
        };
        if !q.dtype.is_float() || [k, v].iter().chain(&mask).any(|t| t.dtype != q.dtype) {
            let mut tys = format!("{q}, {k}, {v}");
            if let Some(m) = mask {
                tys.push_str(&format!(", {m}"));
            }
            return Err(format!("attention needs float operands of one dtype, got {tys}"));
        }
        let split = |t: &TensorType| -> Option<(Vec<usize>, [usize; 3])> {
            let (b, &[h, s, d]) = t.shape.dims().split_last_chunk::<3>()?;
            (!b.is_empty()).then(|| (b.to_vec(), [h, s, d]))
        };
        let (Some((bq, [hq, sq, d])), Some((bk, [hkv, sk, dk])), Some((bv, [hv, sv, dv]))) =
            (split(q), split(k), split(v))
        else {
            return Err(format!(
                "attention needs q, k, v of rank >= 4 ([batch.., heads, seq, dim]), got {q}, {k}, {v}"
            ));
        };
        if bq != bk || bq != bv {
            return Err(format!("attention batch dims differ: q {q}, k {k}, v {v}"));
        }
        if dk != d || hv != hkv || sv != sk {
            return Err(format!(
                "attention needs k [.., hkv, sk, {d}] and v [.., hkv, sk, dv] agreeing, got q {q}, k {k}, v {v}"
            ));
        }
        if hkv == 0 || hq % hkv != 0 {
            return Err(format!(
                "attention needs the query heads ({hq}) a multiple of the key/value heads ({hkv})"
            ));
        }
        let dims = AttentionDims {
            dtype: q.dtype,
            batch: bq,
            hq,
            hkv,
            sq,
            sk,
            d,
            dv,
            masked: mask.is_some(),
        };
        if let Some(m) = mask {
            let scores = dims.score_dims();
            let md = m.shape.dims();
            if md.len() != scores.len() || md.iter().zip(&scores).any(|(&a, &b)| a != 1 && a != b) {
                return Err(format!(
                    "attention mask {m} does not broadcast to the scores {:?} (same rank, each dim 1 or equal)",
                    scores
                ));
            }
        }
        Ok(dims)
    }

    /// `[batch.., hq, sq, sk]`.
    pub fn score_dims(&self) -> Vec<usize> {
        self.batch.iter().copied().chain([self.hq, self.sq, self.sk]).collect()
    }

    /// `[batch.., hq, sq, dv]`.
    pub fn out_dims(&self) -> Vec<usize> {
        self.batch.iter().copied().chain([self.hq, self.sq, self.dv]).collect()
    }

    /// Query heads per key/value head.
    pub fn group(&self) -> usize {
        self.hq / self.hkv.max(1)
    }
}

fn infer_matmul(a: &TensorType, b: &TensorType) -> Result<TensorType, String> {
    if a.dtype != b.dtype || !a.dtype.is_numeric() {
        return Err(format!("matmul needs numeric operands of one dtype, got {a} and {b}"));
    }
    let (Some((batch_a, &[m, k])), Some((batch_b, &[k2, n]))) = (
        a.shape.dims().split_last_chunk::<2>(),
        b.shape.dims().split_last_chunk::<2>(),
    ) else {
        return Err(format!("matmul needs operands of rank >= 2, got {a} and {b}"));
    };
    if k != k2 {
        return Err(format!("matmul contraction dims differ: {a} x {b} ({k} vs {k2})"));
    }
    let mut dims =
        broadcast_shapes(batch_a, batch_b).ok_or_else(|| format!("matmul batch dims do not broadcast: {a} x {b}"))?;
    dims.extend([m, n]);
    Ok(TensorType::new(a.dtype, dims))
}

fn infer_transpose(a: &TensorType, perm: &[usize]) -> Result<TensorType, String> {
    let rank = a.shape.rank();
    let bad = || format!("transpose perm {perm:?} is not a permutation of {rank} axes");
    if perm.len() != rank {
        return Err(bad());
    }
    let mut seen = vec![false; rank];
    let mut dims = Vec::with_capacity(rank);
    for &p in perm {
        let (Some(s), Some(&d)) = (seen.get_mut(p), a.shape.dims().get(p)) else {
            return Err(bad());
        };
        if std::mem::replace(s, true) {
            return Err(bad());
        }
        dims.push(d);
    }
    Ok(TensorType::new(a.dtype, dims))
}

fn infer_slice(a: &TensorType, ranges: &[SliceRange]) -> Result<TensorType, String> {
    if ranges.len() != a.shape.rank() {
        return Err(format!(
            "slice has {} ranges for an operand of rank {}",
            ranges.len(),
            a.shape.rank()
        ));
    }
    let mut dims = Vec::with_capacity(ranges.len());
    for (i, (r, &d)) in ranges.iter().zip(a.shape.dims()).enumerate() {
        if r.step == 0 {
            return Err(format!("slice step of axis {i} is 0"));
        }
        dims.push(r.resolve(d).1);
    }
    Ok(TensorType::new(a.dtype, dims))
}

fn infer_concat(axis: usize, args: &[&TensorType]) -> Result<TensorType, String> {
    let Some((first, rest)) = args.split_first() else {
        return Err("concat takes at least one operand".to_string());
    };
    let (_, mut total, _) = split_axis(axis, first.shape.dims())?;
    for a in rest {
        let same_other_dims = a.shape.rank() == first.shape.rank()
            && a.shape
                .dims()
                .iter()
                .zip(first.shape.dims())
                .enumerate()
                .all(|(i, (x, y))| i == axis || x == y);
        if a.dtype != first.dtype || !same_other_dims {
            return Err(format!("concat along axis {axis} of {first} and {a}"));
        }
        let (_, extent, _) = split_axis(axis, a.shape.dims())?;
        total = total
            .checked_add(extent)
            .ok_or_else(|| format!("concat along axis {axis} is too large"))?;
    }
    let dims = first
        .shape
        .dims()
        .iter()
        .enumerate()
        .map(|(i, &d)| if i == axis { total } else { d })
        .collect::<Vec<_>>();
    Ok(TensorType::new(first.dtype, dims))
}

fn infer_pad(a: &TensorType, pads: &[(i64, i64)], mode: PadMode) -> Result<TensorType, String> {
    if pads.len() != a.shape.rank() {
        return Err(format!(
            "pad has {} pairs for an operand of rank {}",
            pads.len(),
            a.shape.rank()
        ));
    }
    let mut dims = Vec::with_capacity(pads.len());
    for (i, (&(lo, hi), &d)) in pads.iter().zip(a.shape.dims()).enumerate() {
        let out = d as i128 + lo as i128 + hi as i128;
        if out < 0 {
            return Err(format!(
                "pad ({lo}, {hi}) of axis {i} (extent {d}) gives a negative extent"
            ));
        }
        let grows = lo > 0 || hi > 0;
        match mode {
            PadMode::Reflect if grows && (lo as i128 >= d as i128 || hi as i128 >= d as i128) => {
                return Err(format!(
                    "reflect pad ({lo}, {hi}) of axis {i} needs pads smaller than its extent {d}"
                ));
            }
            PadMode::Edge if grows && d == 0 => {
                return Err(format!("edge pad of empty axis {i}"));
            }
            _ => {}
        }
        dims.push(usize::try_from(out).map_err(|_| format!("pad of axis {i} is too large"))?);
    }
    Ok(TensorType::new(a.dtype, dims))
}

fn check_axis(axis: usize, rank: usize) -> Result<(), String> {
    if axis >= rank {
        return Err(format!("axis {axis} out of range for rank {rank}"));
    }
    Ok(())
}

/// `dims` split at `axis`: the extents before it, its extent, and those after it; or
/// the error of [`check_axis`].
fn split_axis(axis: usize, dims: &[usize]) -> Result<(&[usize], usize, &[usize]), String> {
    let out_of_range = || format!("axis {axis} out of range for rank {}", dims.len());
    let (before, rest) = dims.split_at_checked(axis).ok_or_else(out_of_range)?;
    let (&extent, after) = rest.split_first().ok_or_else(out_of_range)?;
    Ok((before, extent, after))
}

fn check_axes(axes: &[usize], rank: usize) -> Result<(), String> {
    let mut prev: Option<usize> = None;
    for &a in axes {
        check_axis(a, rank)?;
        if prev.is_some_and(|p| p >= a) {
            return Err(format!("axes {axes:?} must be sorted and unique"));
        }
        prev = Some(a);
    }
    Ok(())
}

/// The shape both operands of a binary op are broadcast to, numpy rules.
pub fn broadcast_pair(a: &Shape, b: &Shape) -> Option<Shape> {
    broadcast_shapes(a.dims(), b.dims()).map(Shape)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{interp::eval_op, ArgReduceOp, BinaryOp, ReduceOp, SliceRange, Tensor, UnaryOp};

    fn f32s(dims: &[usize]) -> TensorType {
        TensorType::new(DType::F32, dims.to_vec())
    }

    fn err(op: Op, args: &[&TensorType]) -> String {
        infer_type(&op, args).unwrap_err()
    }

    #[test]
    fn operand_counts_are_checked() {
        let a = f32s(&[2]);
        assert!(err(Op::Unary(UnaryOp::Neg), &[]).contains("takes 1 operand(s), got 0"));
        assert!(err(Op::Binary(BinaryOp::Add), &[&a]).contains("takes 2 operand(s), got 1"));
        assert!(err(Op::Select, &[&a, &a]).contains("takes 3 operand(s), got 2"));
        assert!(err(Op::MatMul, &[&a, &a, &a]).contains("takes 2 operand(s), got 3"));
        assert!(err(Op::Concat { axis: 0 }, &[]).contains("at least one operand"));
    }

    #[test]
    fn axes_perms_and_ranks_are_checked() {
        let a = f32s(&[2, 3]);
        let v = f32s(&[3]);
        let i = TensorType::new(DType::I64, [4]);
        assert!(err(Op::Transpose { perm: vec![0, 0] }, &[&a]).contains("not a permutation"));
        assert!(err(Op::Transpose { perm: vec![0, 2] }, &[&a]).contains("not a permutation"));
        assert!(err(Op::Transpose { perm: vec![0] }, &[&a]).contains("not a permutation"));
        let arg = |axis| Op::ArgReduce {
            op: ArgReduceOp::ArgMax,
            axis,
            keepdims: true,
        };
        assert!(err(arg(2), &[&a]).contains("axis 2 out of range for rank 2"));
        assert!(err(arg(0), &[&f32s(&[0, 3])]).contains("empty axis"));
        assert_eq!(infer_type(&arg(1), &[&a]).unwrap(), TensorType::new(DType::I64, [2, 1]));
        assert!(err(Op::Gather { axis: 2 }, &[&a, &i]).contains("out of range"));
        assert_eq!(infer_type(&Op::Gather { axis: 1 }, &[&a, &i]).unwrap(), f32s(&[2, 4]));
        assert!(err(Op::MatMul, &[&v, &a]).contains("rank >= 2"));
        assert!(err(Op::Concat { axis: 1 }, &[&a, &v]).contains("concat along axis 1"));
        assert!(err(Op::Concat { axis: 2 }, &[&a, &a]).contains("out of range"));
        assert_eq!(infer_type(&Op::Concat { axis: 1 }, &[&a, &a]).unwrap(), f32s(&[2, 6]));
        let reduce = |axes| Op::Reduce {
            op: ReduceOp::Sum,
            axes,
            keepdims: false,
        };
        assert!(err(reduce(vec![1, 0]), &[&a]).contains("sorted and unique"));
        assert!(err(reduce(vec![0, 0]), &[&a]).contains("sorted and unique"));
        assert!(err(reduce(vec![5]), &[&a]).contains("out of range"));
        let slice = Op::Slice {
            ranges: vec![SliceRange::full()],
        };
        assert!(err(slice, &[&a]).contains("1 ranges for an operand of rank 2"));
    }

    #[test]
    fn eval_op_refuses_mismatched_operands() {
        let x = Tensor::scalar(DType::F32, 1.0);
        let ty = x.ty();
        assert!(eval_op(&Op::Binary(BinaryOp::Add), &[&x], &ty).is_err());
        assert!(eval_op(&Op::Select, &[&x, &x], &ty).is_err());
        assert!(eval_op(&Op::Transpose { perm: vec![0] }, &[&x], &ty).is_err());
        assert!(eval_op(&Op::Concat { axis: 0 }, &[], &ty).is_err());
        assert_eq!(
            eval_op(&Op::Binary(BinaryOp::Add), &[&x, &x], &ty).unwrap(),
            Tensor::scalar(DType::F32, 2.0)
        );
    }
}
