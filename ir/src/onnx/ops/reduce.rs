//! Tier (b): reductions (`Reduce*`), `ArgMax`/`ArgMin`, `CumSum`, and the normalizations
//! (`Softmax`, `LogSoftmax`, `LayerNormalization`, `RMSNormalization`), lowered to
//! graphc's reduce and elementwise primitives.

use super::{Lowering, Node};
use crate::onnx::import::Importer;
use crate::onnx::tensor::dtype_from_onnx;
use crate::shape::normalize_axis;
use crate::{nn, DType, PadMode, Value};

pub const OPS: &[(&str, Lowering)] = &[
    ("ReduceSum", |imp, n| lower_reduce(imp, n, Reduce::Sum)),
    ("ReduceMean", |imp, n| lower_reduce(imp, n, Reduce::Mean)),
    ("ReduceMax", |imp, n| lower_reduce(imp, n, Reduce::Max)),
    ("ReduceMin", |imp, n| lower_reduce(imp, n, Reduce::Min)),
    ("ReduceProd", |imp, n| lower_reduce(imp, n, Reduce::Prod)),
    ("ReduceL1", |imp, n| lower_reduce(imp, n, Reduce::L1)),
    ("ReduceL2", |imp, n| lower_reduce(imp, n, Reduce::L2)),
    ("ReduceLogSum", |imp, n| lower_reduce(imp, n, Reduce::LogSum)),
    ("ReduceLogSumExp", |imp, n| lower_reduce(imp, n, Reduce::LogSumExp)),
    ("ReduceSumSquare", |imp, n| lower_reduce(imp, n, Reduce::SumSquare)),
    ("Softmax", softmax),
    ("LogSoftmax", log_softmax),
    ("LayerNormalization", layer_normalization),
    ("RMSNormalization", rms_normalization),
    ("ArgMax", argmax),
    ("ArgMin", argmin),
    ("CumSum", cumsum),
];

type Out<'b> = Result<Vec<Value<'b>>, String>;

/// `axis` normalized for a rank-`rank` operand, or an error naming it.
fn axis_in(axis: i64, rank: usize, what: &str) -> Result<usize, String> {
    normalize_axis(axis, rank).ok_or_else(|| {
        format!(
            "{what} {axis} is out of range for an operand of rank {rank} (valid: {} to {})",
            -(rank as i64),
            rank as i64 - 1
        )
    })
}

/// The extent of the (normalized) axis `axis` of `x`.
fn extent(x: Value<'_>, axis: usize) -> Result<usize, String> {
    x.shape()
        .dims()
        .get(axis)
        .copied()
        .ok_or_else(|| format!("axis {axis} is out of range for an operand {}", x.ty()))
}

/// The operand's dtype must be a float.
fn need_float(x: Value<'_>, op: &str) -> Result<(), String> {
    if x.dtype().is_float() {
        Ok(())
    } else {
        Err(format!("{op} of {} is not supported (it takes floats)", x.dtype()))
    }
}

// ---------------------------------------------------------------------------------
// Reduce*

#[derive(Clone, Copy, PartialEq, Eq)]
enum Reduce {
    Sum,
    Mean,
    Max,
    Min,
    Prod,
    L1,
    L2,
    LogSum,
    LogSumExp,
    SumSquare,
}

impl Reduce {
    fn name(self) -> &'static str {
        match self {
            Reduce::Sum => "ReduceSum",
            Reduce::Mean => "ReduceMean",
            Reduce::Max => "ReduceMax",
            Reduce::Min => "ReduceMin",
            Reduce::Prod => "ReduceProd",
            Reduce::L1 => "ReduceL1",
            Reduce::L2 => "ReduceL2",
            Reduce::LogSum => "ReduceLogSum",
            Reduce::LogSumExp => "ReduceLogSumExp",
            Reduce::SumSquare => "ReduceSumSquare",
        }
    }

    /// The opset from which `axes` is an (optional) operand instead of an attribute.
    fn axes_input_since(self) -> i64 {
        if self == Reduce::Sum {
            13
        } else {
            18
        }
    }
}

/// The axes a reduction reduces (normalized, sorted, unique), or `None` when it is a
/// no-op (`noop_with_empty_axes` with empty axes).
fn reduce_axes(imp: &Importer<'_>, n: &Node<'_, '_>, kind: Reduce, rank: usize) -> Result<Option<Vec<i64>>, String> {
    let axes = if n.opset >= kind.axes_input_since() {
        // An `axes` attribute at this opset was rejected before lowering.
        let axes = match n.opt_input(1) {
            Some(v) => imp.static_ints(v, "axes").map_err(|e| {
                format!("{e}; axes computed at run time are not supported (the output shape depends on them)")
            })?,
            None => Vec::new(),
        };
        if axes.is_empty() && n.attrs.int("noop_with_empty_axes", 0)? != 0 {
            return Ok(None);
        }
        axes
    } else {
        n.attrs.ints("axes")?.unwrap_or_default()
    };
    let mut out = if axes.is_empty() {
        (0..rank).collect::<Vec<_>>()
    } else {
        axes.iter()
            .map(|&a| axis_in(a, rank, "axis"))
            .collect::<Result<Vec<_>, _>>()?
    };
    out.sort_unstable();
    let len = out.len();
    out.dedup();
    if out.len() != len {
        return Err(format!("axes {axes:?} name an axis twice"));
    }
    Ok(Some(out.into_iter().map(|a| a as i64).collect()))
}

fn lower_reduce<'b>(imp: &mut Importer<'b>, n: &Node<'_, 'b>, kind: Reduce) -> Out<'b> {
    let x = n.input(0)?;
    let dtype = x.dtype();
    let bool_ok = matches!(kind, Reduce::Max | Reduce::Min);
    if !(dtype.is_numeric() || (bool_ok && dtype == DType::Bool)) {
        return Err(format!("{} of {dtype} is not supported", kind.name()));
    }
    let keepdims = n.attrs.int("keepdims", 1)? != 0;
    let axes = reduce_axes(imp, n, kind, x.rank())?;
    // Integer results of float functions (sqrt, log, exp) are computed in f64 and
    // truncated back, as the ONNX reference does.
    let to_float = |v: Value<'b>| if v.dtype().is_float() { v } else { v.cast(DType::F64) };
    let back = |v: Value<'b>| v.cast(dtype);
    let red = |v: Value<'b>, f: fn(Value<'b>, &[i64], bool) -> Value<'b>| match &axes {
        Some(a) => f(v, a, keepdims),
        None => v,
    };
    let y = match kind {
        Reduce::Sum => red(x, Value::sum),
        Reduce::Mean => red(x, Value::mean),
        Reduce::Prod => red(x, Value::prod),
        Reduce::Max | Reduce::Min => {
            let f = if kind == Reduce::Max {
                Value::reduce_max
            } else {
                Value::reduce_min
            };
            if dtype == DType::Bool {
                back(red(x.cast(DType::U8), f))
            } else {
                red(x, f)
            }
        }
        Reduce::L1 => red(x.abs(), Value::sum),
        Reduce::SumSquare => red(x * x, Value::sum),
        Reduce::L2 => back(to_float(red(x * x, Value::sum)).sqrt()),
        Reduce::LogSum => back(to_float(red(x, Value::sum)).log()),
        Reduce::LogSumExp => {
            let xf = to_float(x);
            match &axes {
                None => back(xf),
                Some(a) => {
                    // log(sum(exp(x - m))) + m with m the max, taken as 0 where it is
                    // not finite (empty sets, all -inf, inf): exact there, stable elsewhere.
                    let m = xf.reduce_max(a, true);
                    let zero = imp.scalar(xf.dtype(), 0.0);
                    let finite = !m.isinf().or(m.isnan());
                    let m = imp.b.select(finite, m, zero);
                    let mut y = (xf - m).exp().sum(a, true).log() + m;
                    if !keepdims {
                        let dims: Vec<usize> = y
                            .shape()
                            .dims()
                            .iter()
                            .enumerate()
                            .filter(|(i, _)| !a.contains(&(*i as i64)))
                            .map(|(_, &d)| d)
                            .collect();
                        y = y.reshape(dims);
                    }
                    back(y)
                }
            }
        }
    };
    Ok(vec![y])
}

// ---------------------------------------------------------------------------------
// Softmax, LogSoftmax

fn lower_softmax<'b>(n: &Node<'_, 'b>, name: &str, f: fn(Value<'b>, i64) -> Value<'b>) -> Out<'b> {
    let x = n.input(0)?;
    need_float(x, name)?;
    let rank = x.rank();
    if n.opset >= 13 {
        let axis = axis_in(n.attrs.int("axis", -1)?, rank, "axis")?;
        return Ok(vec![f(x, axis as i64)]);
    }
    // Before opset 13: the input is seen as a matrix [d0 * .. * d(axis-1), d(axis) * ..].
    let axis = axis_in(n.attrs.int("axis", 1)?, rank, "axis")?;
    let dims = x.shape().0;
    let (before, after) = dims
        .split_at_checked(axis)
        .ok_or_else(|| format!("axis {axis} is out of range for an operand {}", x.ty()))?;
    let outer: usize = before.iter().product();
    let inner: usize = after.iter().product();
    let y = f(x.reshape([outer, inner]), 1).reshape(dims);
    Ok(vec![y])
}

fn softmax<'b>(_: &mut Importer<'b>, n: &Node<'_, 'b>) -> Out<'b> {
    lower_softmax(n, "Softmax", nn::softmax)
}

fn log_softmax<'b>(_: &mut Importer<'b>, n: &Node<'_, 'b>) -> Out<'b> {
    lower_softmax(n, "LogSoftmax", nn::log_softmax)
}

// ---------------------------------------------------------------------------------
// LayerNormalization, RMSNormalization

/// The normalized axes `[axis, rank)` and the dtype statistics are computed in
/// (`stash_type`).
fn norm_setup(n: &Node<'_, '_>, x: Value<'_>, name: &str) -> Result<(Vec<i64>, DType), String> {
    need_float(x, name)?;
    let rank = x.rank();
    let axis = axis_in(n.attrs.int("axis", -1)?, rank, "axis")?;
    let stash = n.attrs.int("stash_type", 1)?;
    let stash = i32::try_from(stash)
        .map_err(|_| format!("stash_type {stash} is not an ONNX data type"))
        .and_then(|s| dtype_from_onnx(s).map_err(|e| format!("stash_type: {e}")))?;
    if !stash.is_float() {
        return Err(format!("stash_type {stash} is not supported (it must be a float type)"));
    }
    Ok(((axis as i64..rank as i64).collect(), stash))
}

/// LayerNormalization (opset 17): `Y = (X - mean) / sqrt(var + epsilon) * Scale + B` over
/// the axes from `axis` on; optional outputs `Mean` and `InvStdDev` (in `stash_type`,
/// with the normalized axes kept as 1s).
fn layer_normalization<'b>(_: &mut Importer<'b>, n: &Node<'_, 'b>) -> Out<'b> {
    let x = n.input(0)?;
    let (axes, stash) = norm_setup(n, x, "LayerNormalization")?;
    for (i, what) in [(1, "Scale"), (2, "B")] {
        if let Some(v) = n.opt_input(i).filter(|v| v.dtype() != x.dtype()) {
            return Err(format!(
                "LayerNormalization's {what} {} must have the dtype of X {} (the model is invalid ONNX)",
                v.ty(),
                x.ty()
            ));
        }
    }
    let eps = n.attrs.float("epsilon", 1e-5)? as f64;
    let xu = x.cast(stash);
    let mean = xu.mean(&axes, true);
    let d = xu - mean;
    let var = (d * d).mean(&axes, true);
    let inv_std = (var + eps).sqrt().reciprocal();
    let mut y = (d * inv_std).cast(x.dtype());
    if let Some(scale) = n.opt_input(1) {
        y = y * scale;
    }
    if let Some(bias) = n.opt_input(2) {
        y = y + bias;
    }
    let mut outs = vec![y, mean, inv_std];
    outs.truncate(n.num_outputs().max(1));
    Ok(outs)
}

/// RMSNormalization (opset 23): `Y = X / sqrt(mean(X^2) + epsilon) * scale` over the
/// axes from `axis` on.
fn rms_normalization<'b>(_: &mut Importer<'b>, n: &Node<'_, 'b>) -> Out<'b> {
    let x = n.input(0)?;
    let (axes, stash) = norm_setup(n, x, "RMSNormalization")?;
    let eps = n.attrs.float("epsilon", 1e-5)? as f64;
    let xu = x.cast(stash);
    let rms = ((xu * xu).mean(&axes, true) + eps).sqrt();
    let mut y = (xu / rms).cast(x.dtype());
    if let Some(scale) = n.opt_input(1) {
        y = y * scale;
    }
    Ok(vec![y])
}

// ---------------------------------------------------------------------------------
// ArgMax, ArgMin

fn lower_arg<'b>(imp: &mut Importer<'b>, n: &Node<'_, 'b>, max: bool) -> Out<'b> {
    let name = if max { "ArgMax" } else { "ArgMin" };
    let x = n.input(0)?;
    if !x.dtype().is_numeric() {
        return Err(format!("{name} of {} is not supported", x.dtype()));
    }
    let axis = axis_in(n.attrs.int("axis", 0)?, x.rank(), "axis")?;
    let keepdims = n.attrs.int("keepdims", 1)? != 0;
    let last = n.attrs.int("select_last_index", 0)? != 0;
    let d = extent(x, axis)?;
    if d == 0 {
        return Err(format!("{name} over axis {axis} of extent 0 is not defined"));
    }
    let f = if max { Value::argmax } else { Value::argmin };
    let y = if last {
        // The first extreme of the reversed axis is the last one: i = (d - 1) - j.
        let rev = x.slice(axis as i64, -1, i64::MIN, -1);
        imp.scalar(DType::I64, (d - 1) as f64) - f(rev, axis as i64, keepdims)
    } else {
        f(x, axis as i64, keepdims)
    };
    Ok(vec![y])
}

fn argmax<'b>(imp: &mut Importer<'b>, n: &Node<'_, 'b>) -> Out<'b> {
    lower_arg(imp, n, true)
}

fn argmin<'b>(imp: &mut Importer<'b>, n: &Node<'_, 'b>) -> Out<'b> {
    lower_arg(imp, n, false)
}

// ---------------------------------------------------------------------------------
// CumSum

/// CumSum: running sums along `axis` (an operand known at compile time), inclusive or
/// `exclusive`, forward or `reverse`. A log-step scan (Hillis-Steele): `y += y shifted
/// by k` for k = 1, 2, 4, ..., the shift a zero-filling pad; exact for integers.
fn cumsum<'b>(imp: &mut Importer<'b>, n: &Node<'_, 'b>) -> Out<'b> {
    let x = n.input(0)?;
    if !x.dtype().is_numeric() {
        return Err(format!("CumSum of {} is not supported", x.dtype()));
    }
    let axis = imp
        .static_ints(n.input(1)?, "axis")
        .map_err(|e| format!("{e}; an axis computed at run time is not supported"))?;
    let [axis] = axis[..] else {
        return Err(format!("axis must be a single integer, got {} values", axis.len()));
    };
    let rank = x.rank();
    let axis = axis_in(axis, rank, "axis")?;
    let exclusive = n.attrs.int("exclusive", 0)? != 0;
    let reverse = n.attrs.int("reverse", 0)? != 0;
    let d = extent(x, axis)? as i64;
    // y shifted by k along the axis (toward the end, or the start when reversed).
    let shift = |y: Value<'b>, k: i64| {
        let mut pads = vec![(0, 0); rank];
        if let Some(p) = pads.get_mut(axis) {
            *p = if reverse { (-k, k) } else { (k, -k) };
        }
        y.pad(&pads, PadMode::Constant, 0.0)
    };
    let mut y = x;
    let mut k = 1;
    while k < d {
        y = y + shift(y, k);
        k *= 2;
    }
    if exclusive && d > 0 {
        y = shift(y, 1);
    }
    Ok(vec![y])
}
