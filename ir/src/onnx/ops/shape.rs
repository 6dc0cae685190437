//! Tier (d): shape and data-movement ops. Operands that decide an output shape (Reshape's
//! shape, Slice's bounds, Pad's pads, ...) must be known at import; when they are computed
//! from the model's inputs the output shape is data-dependent, which graphc does not
//! support (static shapes).

use super::{Lowering, Node};
use crate::onnx::import::Importer;
use crate::onnx::tensor::tensor_from_proto;
use crate::shape::{broadcast_shapes, MAX_ELEMENTS};
use crate::{DType, Shape, SliceRange, Tensor, TensorData, Value};

pub const OPS: &[(&str, Lowering)] = &[
    ("Reshape", reshape),
    ("Transpose", transpose),
    ("Concat", concat),
    ("Slice", slice),
    ("Gather", gather),
    ("GatherElements", gather_elements),
    ("Unsqueeze", unsqueeze),
    ("Squeeze", squeeze),
    ("Expand", expand),
    ("Split", split),
    ("Flatten", flatten),
    ("Shape", shape_op),
    ("Size", size),
    ("Tile", tile),
    ("Range", range),
    ("ConstantOfShape", constant_of_shape),
    ("Trilu", trilu),
    ("OneHot", one_hot),
    ("Identity", identity),
];

type Out<'b> = Result<Vec<Value<'b>>, String>;

// ---------------------------------------------------------------------------------------
// Helpers

/// The value of `v` if it is known at import. Constant nodes count even before the
/// importer has examined them (initializers used by the graph's first node).
pub(super) fn known<'b>(imp: &Importer<'b>, v: Value<'b>) -> Option<Tensor> {
    imp.known(v).or_else(|| unexamined_constant(imp, v))
}

fn unexamined_constant<'b>(imp: &Importer<'b>, v: Value<'b>) -> Option<Tensor> {
    imp.b.with_graph(|g| match &g.node(v.id()).op {
        crate::Op::Constant { value } => Some(value.clone()),
        _ => None,
    })
}

/// The integers of an operand that decides an output shape; not known at import means a
/// data-dependent output shape.
pub(super) fn shape_ints<'b>(imp: &Importer<'b>, v: Value<'b>, what: &str) -> Result<Vec<i64>, String> {
    if imp.known(v).is_some() {
        return imp.static_ints(v, what);
    }
    let t = unexamined_constant(imp, v).ok_or_else(|| data_dependent(what))?;
    if !t.dtype().is_int() {
        return Err(format!("{what} must be integers, got {}", t.dtype()));
    }
    Ok(t.to_f64_vec().iter().map(|&x| x as i64).collect())
}

/// The numbers of an operand that must be known at import, as f64.
fn known_f64s<'b>(imp: &Importer<'b>, v: Value<'b>, what: &str) -> Result<Vec<f64>, String> {
    if imp.known(v).is_some() {
        return imp.static_f64s(v, what);
    }
    unexamined_constant(imp, v)
        .map(|t| t.to_f64_vec())
        .ok_or_else(|| data_dependent(what))
}

fn data_dependent(what: &str) -> String {
    format!(
        "data-dependent output shapes are not supported: {what} must be known at compile time, \
         but it is computed from the model's inputs"
    )
}

/// A possibly negative axis of a tensor of rank `rank`.
fn norm_axis(axis: i64, rank: usize, what: &str) -> Result<usize, String> {
    crate::shape::normalize_axis(axis, rank).ok_or_else(|| {
        format!(
            "{what} {axis} is out of range for rank {rank} (valid: {}..{rank})",
            -(rank as i64)
        )
    })
}

/// Distinct normalized axes (order kept).
pub(super) fn norm_axes(axes: &[i64], rank: usize, what: &str) -> Result<Vec<usize>, String> {
    let mut out = Vec::with_capacity(axes.len());
    for &a in axes {
        let a = norm_axis(a, rank, what)?;
        if out.contains(&a) {
            return Err(format!("{what} list {axes:?} repeats axis {a}"));
        }
        out.push(a);
    }
    Ok(out)
}

/// Dims from ints, which must be non-negative, with a total size graphc can hold.
fn dims_of(v: &[i64], what: &str) -> Result<Shape, String> {
    let dims = v
        .iter()
        .map(|&d| usize::try_from(d).map_err(|_| format!("{what} {v:?} has a negative dimension {d}")))
        .collect::<Result<Vec<_>, _>>()?;
    checked(Shape::new(dims), what)
}

fn checked(s: Shape, what: &str) -> Result<Shape, String> {
    if s.checked_numel().is_none() {
        return Err(format!("{what} {s} is too large (more than {MAX_ELEMENTS} elements)"));
    }
    Ok(s)
}

/// A 1-D i64 tensor of `v`.
fn i64_tensor(v: Vec<i64>) -> Result<Tensor, String> {
    let n = v.len();
    Tensor::new([n], TensorData::I64(v)).map_err(|e| e.to_string())
}

/// A rank-0 tensor of one datum (`data` of length 1).
pub(super) fn scalar_tensor(data: TensorData) -> Result<Tensor, String> {
    Tensor::new([], data).map_err(|e| e.to_string())
}

/// The extent of the (normalized) axis `axis` of `shape`.
pub(super) fn extent(shape: &Shape, axis: usize) -> Result<usize, String> {
    shape
        .dims()
        .get(axis)
        .copied()
        .ok_or_else(|| format!("axis {axis} is out of range for shape {shape}"))
}

/// Axes of an op that takes them as an attribute before opset 13 and as an input after.
fn axes_operand<'b>(imp: &Importer<'b>, n: &Node<'_, 'b>, input: usize) -> Result<Option<Vec<i64>>, String> {
    if n.opset < 13 {
        n.attrs.ints("axes")
    } else {
        n.opt_input(input).map(|v| shape_ints(imp, v, "axes")).transpose()
    }
}

// ---------------------------------------------------------------------------------------
// Lowerings

fn identity<'b>(_: &mut Importer<'b>, n: &Node<'_, 'b>) -> Out<'b> {
    Ok(vec![n.input(0)?])
}

/// `Reshape`: 0 copies the input dim (unless `allowzero`), one -1 is inferred.
fn reshape<'b>(imp: &mut Importer<'b>, n: &Node<'_, 'b>) -> Out<'b> {
    let x = n.input(0)?;
    let spec = if n.opset < 5 {
        n.attrs.ints("shape")?.ok_or("attribute `shape` is required")?
    } else {
        shape_ints(imp, n.input(1)?, "the target shape")?
    };
    let allowzero = n.attrs.int("allowzero", 0)? != 0;
    let in_dims = x.shape().0;
    let numel = x.shape().numel();
    let mut dims = Vec::with_capacity(spec.len());
    let mut infer = None;
    for (i, &d) in spec.iter().enumerate() {
        dims.push(match d {
            -1 => {
                if infer.replace(i).is_some() {
                    return Err(format!("shape {spec:?} has more than one -1"));
                }
                1
            }
            0 if !allowzero => *in_dims.get(i).ok_or_else(|| {
                format!(
                    "shape {spec:?} copies dim {i} (0) of an input of rank {}",
                    in_dims.len()
                )
            })?,
            d if d < 0 => return Err(format!("shape {spec:?} has an invalid dimension {d}")),
            d => usize::try_from(d).map_err(|_| format!("shape {spec:?} is too large"))?,
        });
    }
    if allowzero && infer.is_some() && spec.contains(&0) {
        return Err(format!("shape {spec:?} has both 0 and -1 with allowzero=1"));
    }
    let known = checked(Shape::new(dims.clone()), "target shape")?.numel();
    if let Some(i) = infer {
        if known == 0 || numel % known != 0 {
            return Err(format!(
                "cannot infer the -1 of shape {spec:?} for an input of shape {} ({numel} elements)",
                x.shape()
            ));
        }
        if let Some(d) = dims.get_mut(i) {
            *d = numel / known; // `i` is a position of `spec`, as of `dims`
        }
    } else if known != numel {
        return Err(format!(
            "cannot reshape {} ({numel} elements) to {spec:?} ({known} elements)",
            x.shape()
        ));
    }
    Ok(vec![x.reshape(dims)])
}

/// `Transpose`: `perm` defaults to reversing the axes.
fn transpose<'b>(_: &mut Importer<'b>, n: &Node<'_, 'b>) -> Out<'b> {
    let x = n.input(0)?;
    let rank = x.rank();
    let perm: Vec<usize> = match n.attrs.ints("perm")? {
        None => (0..rank).rev().collect(),
        Some(p) => {
            // As the ONNX checker has it: entries are axes 0..rank, each once (no
            // negative axes, unlike most axis attributes).
            let mut seen = vec![false; rank];
            let mut perm = Vec::with_capacity(p.len());
            for &axis in &p {
                let slot = usize::try_from(axis).ok().and_then(|a| seen.get_mut(a).map(|s| (a, s)));
                let Some((a, seen_a)) = slot else {
                    return Err(format!(
                        "perm {p:?} has the entry {axis}, which is not an axis 0 to {} of the rank-{rank} operand",
                        rank as i64 - 1
                    ));
                };
                if std::mem::replace(seen_a, true) {
                    return Err(format!(
                        "perm {p:?} repeats the axis {a}; it must be a permutation of 0..{rank}"
                    ));
                }
                perm.push(a);
            }
            if perm.len() != rank {
                return Err(format!(
                    "perm {p:?} has {} entries; it must be a permutation of the {rank} axes",
                    p.len()
                ));
            }
            perm
        }
    };
    if perm.iter().enumerate().all(|(i, &p)| i == p) {
        return Ok(vec![x]);
    }
    Ok(vec![x.transpose(&perm)])
}

fn concat<'b>(imp: &mut Importer<'b>, n: &Node<'_, 'b>) -> Out<'b> {
    let parts: Vec<Value<'b>> = n.inputs.iter().flatten().copied().collect();
    let first = *parts.first().ok_or("Concat needs at least one operand")?;
    let axis = n.attrs.int_opt("axis")?.ok_or("attribute `axis` is required")?;
    let rank = first.rank();
    let ax = norm_axis(axis, rank, "axis")?;
    for p in parts.iter().skip(1) {
        let (a, b) = (first.ty(), p.ty());
        let ok = a.dtype == b.dtype
            && a.shape.rank() == b.shape.rank()
            && (a.shape.0.iter().zip(&b.shape.0).enumerate()).all(|(i, (da, db))| i == ax || da == db);
        if !ok {
            return Err(format!("operands {a} and {b} do not concatenate along axis {axis}"));
        }
    }
    if parts.len() == 1 {
        return Ok(vec![first]);
    }
    Ok(vec![imp.b.concat(&parts, ax as i64)])
}

/// `Slice`: bounds as attributes before opset 10, as inputs after.
fn slice<'b>(imp: &mut Importer<'b>, n: &Node<'_, 'b>) -> Out<'b> {
    let x = n.input(0)?;
    let rank = x.rank();
    let (starts, ends, axes, steps) = if n.opset < 10 {
        (
            n.attrs.ints("starts")?.ok_or("attribute `starts` is required")?,
            n.attrs.ints("ends")?.ok_or("attribute `ends` is required")?,
            n.attrs.ints("axes")?,
            None,
        )
    } else {
        let get = |i: usize, what: &str| n.opt_input(i).map(|v| shape_ints(imp, v, what)).transpose();
        (
            shape_ints(imp, n.input(1)?, "starts")?,
            shape_ints(imp, n.input(2)?, "ends")?,
            get(3, "axes")?,
            get(4, "steps")?,
        )
    };
    let axes = axes.unwrap_or_else(|| (0..starts.len() as i64).collect());
    let steps = steps.unwrap_or_else(|| vec![1; starts.len()]);
    if ends.len() != starts.len() || axes.len() != starts.len() || steps.len() != starts.len() {
        return Err(format!(
            "starts {starts:?}, ends {ends:?}, axes {axes:?} and steps {steps:?} differ in length"
        ));
    }
    let axes = norm_axes(&axes, rank, "axis")?;
    let mut ranges = vec![SliceRange::full(); rank];
    let bounds = starts.iter().zip(&ends).zip(&steps);
    for (&a, ((&start, &end), &step)) in axes.iter().zip(bounds) {
        if step == 0 {
            return Err(format!("step of axis {a} is 0"));
        }
        let range = ranges
            .get_mut(a)
            .ok_or_else(|| format!("axis {a} is out of range for rank {rank}"))?;
        *range = SliceRange { start, end, step };
    }
    if ranges.iter().all(|r| *r == SliceRange::full()) {
        return Ok(vec![x]);
    }
    Ok(vec![x.slice_ranges(ranges)])
}

fn gather<'b>(_: &mut Importer<'b>, n: &Node<'_, 'b>) -> Out<'b> {
    let (x, idx) = (n.input(0)?, n.input(1)?);
    let axis = norm_axis(n.attrs.int("axis", 0)?, x.rank(), "axis")?;
    if !matches!(idx.dtype(), DType::I64 | DType::I32) {
        return Err(format!("indices must be i64 or i32, got {}", idx.dtype()));
    }
    Ok(vec![x.gather(idx, axis as i64)])
}

/// `GatherElements`: `out[i] = data[i with i[axis] = indices[i]]`, as a gather of the
/// flattened data at flat indices built from iotas.
fn gather_elements<'b>(imp: &mut Importer<'b>, n: &Node<'_, 'b>) -> Out<'b> {
    let (x, idx) = (n.input(0)?, n.input(1)?);
    let (xs, is) = (x.shape(), idx.shape());
    let rank = xs.rank();
    let axis = norm_axis(n.attrs.int("axis", 0)?, rank, "axis")?;
    if !matches!(idx.dtype(), DType::I64 | DType::I32) {
        return Err(format!("indices must be i64 or i32, got {}", idx.dtype()));
    }
    if is.rank() != rank || (is.0.iter().zip(&xs.0).enumerate()).any(|(i, (di, dx))| i != axis && di > dx) {
        return Err(format!(
            "indices of shape {is} do not fit data of shape {xs} (axis {axis})"
        ));
    }
    let b = imp.b;
    let d = extent(&xs, axis)? as f64;
    let i = idx.cast(DType::I64);
    let i = b.select(i.lt(0.0), i + d, i);
    let strides = xs.strides();
    let axis_stride = *strides
        .get(axis)
        .ok_or_else(|| format!("axis {axis} is out of range for {xs}"))?;
    let mut flat = i * axis_stride as f64;
    for (k, (&stride, &di)) in strides.iter().zip(&is.0).enumerate() {
        if k != axis && di > 1 {
            flat = flat + b.iota(DType::I64, is.clone(), k as i64) * stride as f64;
        }
    }
    Ok(vec![x.reshape([xs.numel()]).gather(flat, 0)])
}

fn unsqueeze<'b>(imp: &mut Importer<'b>, n: &Node<'_, 'b>) -> Out<'b> {
    let x = n.input(0)?;
    let axes = axes_operand(imp, n, 1)?.ok_or("axes are required")?;
    let out_rank = x.rank() + axes.len();
    let axes = norm_axes(&axes, out_rank, "axis")?;
    let mut rest = x.shape().0.into_iter();
    let dims: Vec<usize> = (0..out_rank)
        .map(|i| if axes.contains(&i) { 1 } else { rest.next().unwrap_or(1) })
        .collect();
    Ok(vec![x.reshape(dims)])
}

fn squeeze<'b>(imp: &mut Importer<'b>, n: &Node<'_, 'b>) -> Out<'b> {
    let x = n.input(0)?;
    let shape = x.shape();
    let axes: Vec<usize> = match axes_operand(imp, n, 1)? {
        None => (shape.0.iter().enumerate())
            .filter(|&(_, &d)| d == 1)
            .map(|(i, _)| i)
            .collect(),
        Some(a) => norm_axes(&a, shape.rank(), "axis")?,
    };
    for &a in &axes {
        if extent(&shape, a)? != 1 {
            return Err(format!("cannot squeeze axis {a} of shape {shape}: its extent is not 1"));
        }
    }
    let dims: Vec<usize> = (shape.0.iter().enumerate())
        .filter(|(i, _)| !axes.contains(i))
        .map(|(_, &d)| d)
        .collect();
    Ok(vec![x.reshape(dims)])
}

/// `Expand`: numpy broadcast of the input and the shape, both ways.
fn expand<'b>(imp: &mut Importer<'b>, n: &Node<'_, 'b>) -> Out<'b> {
    let x = n.input(0)?;
    let spec = shape_ints(imp, n.input(1)?, "the target shape")?;
    let target = dims_of(&spec, "target shape")?;
    let out = broadcast_shapes(x.shape().dims(), target.dims())
        .ok_or_else(|| format!("input of shape {} does not broadcast with shape {spec:?}", x.shape()))?;
    let out = checked(Shape::new(out), "output shape")?;
    Ok(vec![x.broadcast_to(&out)])
}

/// `Split`: sizes from the `split` attribute (before opset 13) or input (after), else
/// equal parts (`num_outputs` at opset 18, whose last part may be smaller).
fn split<'b>(imp: &mut Importer<'b>, n: &Node<'_, 'b>) -> Out<'b> {
    let x = n.input(0)?;
    let rank = x.rank();
    let axis = norm_axis(n.attrs.int("axis", 0)?, rank, "axis")?;
    let d = extent(&x.shape(), axis)?;
    let outputs = n.num_outputs();
    let sizes = if n.opset < 13 {
        n.attrs.ints("split")?
    } else {
        n.opt_input(1).map(|v| shape_ints(imp, v, "split")).transpose()?
    };
    let sizes: Vec<usize> = match sizes {
        Some(s) => {
            let sizes = dims_of(&s, "split")?.0;
            if sizes.len() != outputs {
                return Err(format!("split {s:?} has {} parts for {outputs} outputs", s.len()));
            }
            if sizes.iter().sum::<usize>() != d {
                return Err(format!("split {s:?} does not sum to the extent {d} of axis {axis}"));
            }
            sizes
        }
        None => {
            let parts = match n.attrs.int_opt("num_outputs")? {
                Some(k) if n.opset >= 18 => {
                    if k < 1 || k as usize != outputs {
                        return Err(format!("num_outputs {k} does not match the node's {outputs} outputs"));
                    }
                    k as usize
                }
                _ => outputs,
            };
            if parts == 0 {
                return Err("Split has no outputs".into());
            }
            if n.opset >= 18 {
                let chunk = d.div_ceil(parts);
                if chunk * (parts - 1) > d {
                    return Err(format!("axis {axis} of extent {d} cannot be split into {parts} parts"));
                }
                (0..parts).map(|i| chunk.min(d - chunk * i)).collect()
            } else {
                if d % parts != 0 {
                    return Err(format!(
                        "axis {axis} of extent {d} does not split into {parts} equal parts"
                    ));
                }
                vec![d / parts; parts]
            }
        }
    };
    let mut start = 0;
    let mut outs = Vec::with_capacity(sizes.len());
    for s in sizes {
        outs.push(if s == d {
            x
        } else {
            x.slice(axis as i64, start as i64, (start + s) as i64, 1)
        });
        start += s;
    }
    Ok(outs)
}

fn flatten<'b>(_: &mut Importer<'b>, n: &Node<'_, 'b>) -> Out<'b> {
    let x = n.input(0)?;
    let shape = x.shape();
    let rank = shape.rank() as i64;
    let axis = n.attrs.int("axis", 1)?;
    let a = if axis < 0 { axis + rank } else { axis };
    if !(0..=rank).contains(&a) {
        return Err(format!(
            "axis {axis} is out of range for rank {rank} (valid: {}..={rank})",
            -rank
        ));
    }
    let (before, after) = shape
        .0
        .split_at_checked(a as usize)
        .ok_or_else(|| format!("axis {axis} is out of range for rank {rank}"))?;
    let outer: usize = before.iter().product();
    let inner: usize = after.iter().product();
    Ok(vec![x.reshape([outer, inner])])
}

/// `Shape`: a constant (shapes are static), with `start`/`end` (opset 15) clamped.
fn shape_op<'b>(imp: &mut Importer<'b>, n: &Node<'_, 'b>) -> Out<'b> {
    let x = n.input(0)?;
    let dims = x.shape().0;
    let rank = dims.len() as i64;
    let clamp = |v: i64| (if v < 0 { v + rank } else { v }).clamp(0, rank) as usize;
    let start = clamp(n.attrs.int("start", 0)?);
    let end = clamp(n.attrs.int("end", rank)?);
    let v: Vec<i64> = dims.iter().take(end).skip(start).map(|&d| d as i64).collect();
    Ok(vec![imp.constant(i64_tensor(v)?)])
}

fn size<'b>(imp: &mut Importer<'b>, n: &Node<'_, 'b>) -> Out<'b> {
    let x = n.input(0)?;
    let t = scalar_tensor(TensorData::I64(vec![x.shape().numel() as i64]))?;
    Ok(vec![imp.constant(t)])
}

/// `Tile`: `[d0, d1, ..]` → reshape `[1, d0, 1, d1, ..]` → broadcast `[r0, d0, r1, d1, ..]`
/// → reshape `[r0 d0, r1 d1, ..]`.
fn tile<'b>(imp: &mut Importer<'b>, n: &Node<'_, 'b>) -> Out<'b> {
    let x = n.input(0)?;
    let reps = shape_ints(imp, n.input(1)?, "repeats")?;
    let shape = x.shape();
    if reps.len() != shape.rank() {
        return Err(format!(
            "repeats {reps:?} must have one entry per axis of the input {shape}"
        ));
    }
    let reps = dims_of(&reps, "repeats")?.0;
    if reps.iter().all(|&r| r == 1) {
        return Ok(vec![x]);
    }
    let out: Vec<usize> = shape.0.iter().zip(&reps).map(|(&d, &r)| d.saturating_mul(r)).collect();
    let out = checked(Shape::new(out), "output shape")?;
    let split: Vec<usize> = shape.0.iter().flat_map(|&d| [1, d]).collect();
    let wide: Vec<usize> = shape.0.iter().zip(&reps).flat_map(|(&d, &r)| [r, d]).collect();
    Ok(vec![x.reshape(split).broadcast_to(&Shape::new(wide)).reshape(out)])
}

/// `Range`: start, limit and delta must be known at import; the output is a constant.
/// Integer ranges up to this many elements are constants; longer ones an iota.
const RANGE_CONSTANT_MAX: usize = 1 << 12;

fn range<'b>(imp: &mut Importer<'b>, n: &Node<'_, 'b>) -> Out<'b> {
    let (s, l, d) = (n.input(0)?, n.input(1)?, n.input(2)?);
    let dtype = s.dtype();
    let mut vals = [0.0; 3];
    for (slot, (v, what)) in vals.iter_mut().zip([(s, "start"), (l, "limit"), (d, "delta")]) {
        let t = known_f64s(imp, v, &format!("Range's {what}"))?;
        match t[..] {
            [x] if v.dtype() == dtype => *slot = x,
            _ => return Err(format!("{what} must be a scalar of type {dtype}, got {}", v.ty())),
        }
    }
    let [start, limit, delta] = vals;
    if delta == 0.0 || !delta.is_finite() || !start.is_finite() || !limit.is_finite() {
        return Err(format!("invalid range start {start}, limit {limit}, delta {delta}"));
    }
    let count = ((limit - start) / delta).ceil().max(0.0);
    if dtype.is_int() && count > RANGE_CONSTANT_MAX as f64 && count <= MAX_ELEMENTS as f64 {
        // `start + iota * delta`: a long integer range (a batch-sized `arange`) is
        // computed by a kernel, not stored as a constant of that many elements.
        let iota = s.builder().iota(dtype, [count as usize], 0);
        return Ok(vec![iota * delta + start]);
    }
    if count > (1u64 << 24) as f64 {
        return Err(format!("range of {count} elements is too large"));
    }
    let count = count as usize;
    let t = if dtype.is_float() {
        // Elements accumulate in the output type, as the ONNX definition's loop does.
        // `x` rounded to `dtype`.
        let round = |x: f64| {
            TensorData::from_f64(dtype, &[x])
                .to_f64_vec()
                .first()
                .copied()
                .unwrap_or(x)
        };
        let mut out = Vec::with_capacity(count);
        let mut acc = round(start);
        let step = round(delta);
        for _ in 0..count {
            out.push(acc);
            acc = round(acc + step);
        }
        Tensor::from_f64(dtype, [count], &out)
    } else if dtype.is_int() {
        let v: Vec<f64> = (0..count).map(|i| start + i as f64 * delta).collect();
        Tensor::from_f64(dtype, [count], &v)
    } else {
        return Err(format!("Range does not accept {dtype}"));
    }
    .map_err(|e| e.to_string())?;
    Ok(vec![imp.constant(t)])
}

/// `ConstantOfShape`: the one-element `value` (default f32 0) broadcast to the shape.
fn constant_of_shape<'b>(imp: &mut Importer<'b>, n: &Node<'_, 'b>) -> Out<'b> {
    let spec = shape_ints(imp, n.input(0)?, "the shape")?;
    let shape = dims_of(&spec, "shape")?;
    let value = match n.attrs.tensor("value")? {
        Some(t) => tensor_from_proto(t, None)?,
        None => Tensor::scalar(DType::F32, 0.0),
    };
    if value.numel() != 1 {
        return Err(format!("`value` must have one element, got {}", value.ty()));
    }
    let value = value.reshape(Shape::scalar()).map_err(|e| e.to_string())?;
    Ok(vec![imp.constant(value).broadcast_to(&shape)])
}

/// `Trilu`: keep elements with `col - row >= k` (upper) or `<= k` (lower); `k` may be
/// computed at run time.
fn trilu<'b>(imp: &mut Importer<'b>, n: &Node<'_, 'b>) -> Out<'b> {
    let x = n.input(0)?;
    let [.., rows, cols] = x.shape().0[..] else {
        return Err(format!("Trilu needs an input of rank 2 or more, got {}", x.ty()));
    };
    let upper = n.attrs.int("upper", 1)? != 0;
    let b = imp.b;
    let k = match n.opt_input(1) {
        None => imp.scalar(DType::I64, 0.0),
        Some(k) => {
            if k.shape().numel() != 1 || !k.dtype().is_int() {
                return Err(format!("k must be an integer scalar, got {}", k.ty()));
            }
            match known(imp, k) {
                Some(_) => {
                    let [v] = shape_ints(imp, k, "k")?[..] else {
                        return Err(format!("k must be an integer scalar, got {}", k.ty()));
                    };
                    // Clamp so the i64 comparison below cannot overflow.
                    let v = v.clamp(-(1 << 62), 1 << 62);
                    b.constant(scalar_tensor(TensorData::I64(vec![v]))?)
                }
                None => k.reshape(Shape::scalar()).cast(DType::I64),
            }
        }
    };
    let mat = Shape::new([rows, cols]);
    let diff = b.iota(DType::I64, mat.clone(), 1) - b.iota(DType::I64, mat, 0);
    let keep = if upper { diff.ge(k) } else { diff.le(k) };
    let zero = imp.scalar(x.dtype(), 0.0);
    Ok(vec![b.select(keep, x, zero)])
}

/// `OneHot`: `values[1]` where the (wrapped) index equals the position along `axis`, else
/// `values[0]`. Depth must be known at import; indices and values may not be.
fn one_hot<'b>(imp: &mut Importer<'b>, n: &Node<'_, 'b>) -> Out<'b> {
    let (idx, depth, values) = (n.input(0)?, n.input(1)?, n.input(2)?);
    let dv = known_f64s(imp, depth, "depth")?;
    let depth = match dv[..] {
        [d] if (1.0..=(1u64 << 31) as f64).contains(&d) => d as usize,
        _ => return Err(format!("depth must be one positive number, got {dv:?}")),
    };
    if values.shape().0 != [2] {
        return Err(format!("values must be [off, on] (2 elements), got {}", values.ty()));
    }
    if !idx.dtype().is_numeric() {
        return Err(format!("indices must be numbers, got {}", idx.dtype()));
    }
    let in_shape = idx.shape();
    let rank = in_shape.rank();
    let axis = n.attrs.int("axis", -1)?;
    let a = if axis < 0 { axis + rank as i64 + 1 } else { axis };
    if !(0..=rank as i64).contains(&a) {
        return Err(format!(
            "axis {axis} is out of range for an output of rank {}",
            rank + 1
        ));
    }
    let a = a as usize;
    let mut out_dims = in_shape.0.clone();
    out_dims.insert(a, depth);
    let out_shape = checked(Shape::new(out_dims.clone()), "output shape")?;
    let b = imp.b;
    let i = idx.cast(DType::I64);
    let i = b.select(i.lt(0.0), i + depth as f64, i);
    let mut unsq = out_dims;
    if let Some(d) = unsq.get_mut(a) {
        *d = 1; // the axis inserted above
    }
    let i = i.reshape(unsq);
    let hot = i.eq(b.iota(DType::I64, out_shape, a as i64));
    let off = values.slice(0, 0, 1, 1).reshape(Shape::scalar());
    let on = values.slice(0, 1, 2, 1).reshape(Shape::scalar());
    Ok(vec![b.select(hot, on, off)])
}
