//! Shape and dtype inference: the type every op gives its operands' types, or why not.

use crate::shape::{broadcast_shapes, broadcasts_to};
use crate::{DType, Op, PadMode, Shape, TensorType};

/// The output type of `op` applied to operands of types `args`, or a message saying
/// which rule the operands break.
pub fn infer_type(op: &Op, args: &[&TensorType]) -> Result<TensorType, String> {
    let ty = infer_unchecked(op, args)?;
    if ty.shape.checked_numel().is_none() {
        return Err(format!("{} gives {ty}, which is too large", op.name()));
    }
    Ok(ty)
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
            let a = args[0];
            if !u.accepts(a.dtype) {
                return Err(format!("{} does not accept {}", u.name(), a.dtype));
            }
            Ok(TensorType::new(u.output_dtype(a.dtype), a.shape.clone()))
        }
        Op::Binary(b) => {
            let (x, y) = (args[0], args[1]);
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
            let (c, a, b) = (args[0], args[1], args[2]);
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
        Op::Cast { to } => Ok(TensorType::new(*to, args[0].shape.clone())),
        Op::Broadcast { shape } => {
            if !broadcasts_to(args[0].shape.dims(), shape.dims()) {
                return Err(format!("{} does not broadcast to {shape}", args[0].shape));
            }
            Ok(TensorType::new(args[0].dtype, shape.clone()))
        }
        Op::Reduce { op, axes, keepdims } => {
            let a = args[0];
            if !a.dtype.is_numeric() {
                return Err(format!("{} does not accept {}", op.name(), a.dtype));
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
        Op::ArgReduce { op, axis, keepdims } => {
            let a = args[0];
            if !a.dtype.is_numeric() {
                return Err(format!("{} does not accept {}", op.name(), a.dtype));
            }
            check_axis(*axis, a.shape.rank())?;
            if a.shape.dims()[*axis] == 0 {
                return Err(format!("{} over an empty axis {axis}", op.name()));
            }
            let mut dims = a.shape.0.clone();
            if *keepdims {
                dims[*axis] = 1;
            } else {
                dims.remove(*axis);
            }
            Ok(TensorType::new(DType::I64, dims))
        }
        Op::MatMul => {
            let (a, b) = (args[0], args[1]);
            if a.dtype != b.dtype || !a.dtype.is_numeric() {
                return Err(format!("matmul needs numeric operands of one dtype, got {a} and {b}"));
            }
            let (ra, rb) = (a.shape.rank(), b.shape.rank());
            if ra < 2 || rb < 2 {
                return Err(format!("matmul needs operands of rank >= 2, got {a} and {b}"));
            }
            let (m, k) = (a.shape.0[ra - 2], a.shape.0[ra - 1]);
            let (k2, n) = (b.shape.0[rb - 2], b.shape.0[rb - 1]);
            if k != k2 {
                return Err(format!("matmul contraction dims differ: {a} x {b} ({k} vs {k2})"));
            }
            let mut dims = broadcast_shapes(&a.shape.0[..ra - 2], &b.shape.0[..rb - 2])
                .ok_or_else(|| format!("matmul batch dims do not broadcast: {a} x {b}"))?;
            dims.extend([m, n]);
            Ok(TensorType::new(a.dtype, dims))
        }
        Op::Reshape { shape } => {
            let a = args[0];
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
            let a = args[0];
            let rank = a.shape.rank();
            let mut seen = vec![false; rank];
            if perm.len() != rank || perm.iter().any(|&p| p >= rank || std::mem::replace(&mut seen[p], true)) {
                return Err(format!("transpose perm {perm:?} is not a permutation of {rank} axes"));
            }
            Ok(TensorType::new(
                a.dtype,
                perm.iter().map(|&p| a.shape.0[p]).collect::<Vec<_>>(),
            ))
        }
        Op::Slice { ranges } => {
            let a = args[0];
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
        Op::Concat { axis } => {
            let first = args[0];
            check_axis(*axis, first.shape.rank())?;
            let mut dims = first.shape.0.clone();
            for a in &args[1..] {
                let same_other_dims = a.shape.rank() == first.shape.rank()
                    && a.shape
                        .dims()
                        .iter()
                        .zip(first.shape.dims())
                        .enumerate()
                        .all(|(i, (x, y))| i == *axis || x == y);
                if a.dtype != first.dtype || !same_other_dims {
                    return Err(format!("concat along axis {axis} of {first} and {a}"));
                }
                dims[*axis] = dims[*axis]
                    .checked_add(a.shape.0[*axis])
                    .ok_or_else(|| format!("concat along axis {axis} is too large"))?;
            }
            Ok(TensorType::new(first.dtype, dims))
        }
        Op::Gather { axis } => {
            let (data, idx) = (args[0], args[1]);
            check_axis(*axis, data.shape.rank())?;
            if !matches!(idx.dtype, DType::I64 | DType::I32) {
                return Err(format!("gather indices must be i64 or i32, got {}", idx.dtype));
            }
            let mut dims = data.shape.0[..*axis].to_vec();
            dims.extend_from_slice(idx.shape.dims());
            dims.extend_from_slice(&data.shape.0[axis + 1..]);
            Ok(TensorType::new(data.dtype, dims))
        }
        Op::Pad { pads, mode, .. } => {
            let a = args[0];
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
    }
}

fn check_axis(axis: usize, rank: usize) -> Result<(), String> {
    if axis >= rank {
        return Err(format!("axis {axis} out of range for rank {rank}"));
    }
    Ok(())
}

fn check_axes(axes: &[usize], rank: usize) -> Result<(), String> {
    for (i, &a) in axes.iter().enumerate() {
        check_axis(a, rank)?;
        if i > 0 && axes[i - 1] >= a {
            return Err(format!("axes {axes:?} must be sorted and unique"));
        }
    }
    Ok(())
}

/// The shape both operands of a binary op are broadcast to, numpy rules.
pub fn broadcast_pair(a: &Shape, b: &Shape) -> Option<Shape> {
    broadcast_shapes(a.dims(), b.dims()).map(Shape)
}
