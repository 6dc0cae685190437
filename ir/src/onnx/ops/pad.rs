//! Tier (d): `Pad`, its modes constant, reflect, edge and wrap (wrap built from slices
//! and concats). The pads (and the constant value) must be known at import, as for the
//! other shape ops of [`super::shape`]; a constant value computed at run time is selected
//! in through a padded mask.

use super::shape::{extent, known, norm_axes, scalar_tensor, shape_ints};
use super::{Lowering, Node};
use crate::onnx::import::Importer;
use crate::{PadMode, Shape, TensorData, Value};

pub const OPS: &[(&str, Lowering)] = &[("Pad", pad)];

type Out<'b> = Result<Vec<Value<'b>>, String>;

/// `Pad`: pads (and the constant value and axes, opset 11/18) as inputs, or attributes
/// before opset 11. Modes constant, reflect, edge and wrap.
fn pad<'b>(imp: &mut Importer<'b>, n: &Node<'_, 'b>) -> Out<'b> {
    let x = n.input(0)?;
    let rank = x.rank();
    let mode = n.attrs.string("mode", "constant")?;
    let (pads, value, axes) = if n.opset < 11 {
        let pads = match n.attrs.ints("pads")? {
            Some(p) => p,
            None => n.attrs.ints("paddings")?.ok_or("attribute `pads` is required")?,
        };
        (pads, Ok(n.attrs.float("value", 0.0)? as f64), None)
    } else {
        let pads = shape_ints(imp, n.input(1)?, "pads")?;
        let value = match n.opt_input(2) {
            None => Ok(0.0),
            Some(v) => match known(imp, v).map(|t| (t.to_f64_vec(), t)) {
                Some((values, t)) => match values[..] {
                    [value] => Ok(value),
                    _ => return Err(format!("constant_value must have one element, got {}", t.ty())),
                },
                None => Err(v),
            },
        };
        let axes = n.opt_input(3).map(|v| shape_ints(imp, v, "axes")).transpose()?;
        (pads, value, axes)
    };
    let axes = match axes {
        Some(a) => norm_axes(&a, rank, "axis")?,
        None => (0..rank).collect(),
    };
    if pads.len() != 2 * axes.len() {
        return Err(format!(
            "pads {pads:?} must have 2 entries per padded axis ({} axes)",
            axes.len()
        ));
    }
    let mut pairs = vec![(0i64, 0i64); rank];
    let (los, his) = pads.split_at(axes.len().min(pads.len()));
    for (&a, (&lo, &hi)) in axes.iter().zip(los.iter().zip(his)) {
        let pair = pairs
            .get_mut(a)
            .ok_or_else(|| format!("axis {a} is out of range for rank {rank}"))?;
        *pair = (lo, hi);
    }
    if pairs.iter().all(|&p| p == (0, 0)) {
        return Ok(vec![x]);
    }
    let mode = match mode.as_str() {
        "constant" => PadMode::Constant,
        "reflect" => PadMode::Reflect,
        "edge" => PadMode::Edge,
        "wrap" => return pad_wrap(x, &pairs).map(|v| vec![v]),
        m => return Err(format!("pad mode `{m}` is not supported")),
    };
    match value {
        Ok(v) => Ok(vec![x.pad(&pairs, mode, v)]),
        Err(dynamic) if mode == PadMode::Constant => {
            // The value is computed at run time: pad with 0, then select it where a padded
            // mask of the input's extent is false.
            let dynamic = if dynamic.dtype() != x.dtype() {
                return Err(format!(
                    "constant_value of type {} does not match the input's {}",
                    dynamic.ty(),
                    x.dtype()
                ));
            } else if dynamic.shape().numel() != 1 {
                return Err(format!("constant_value must have one element, got {}", dynamic.ty()));
            } else {
                dynamic.reshape(Shape::scalar())
            };
            let b = imp.b;
            let ones = b.constant(scalar_tensor(TensorData::Bool(vec![true]))?);
            let mask = ones.broadcast_to(&x.shape()).pad(&pairs, PadMode::Constant, 0.0);
            Ok(vec![b.select(mask, x.pad(&pairs, mode, 0.0), dynamic)])
        }
        Err(_) => Ok(vec![x.pad(&pairs, mode, 0.0)]),
    }
}

/// Wrap padding from slices and concats: crop negative pads, then take the tail (head)
/// of enough copies of each axis.
fn pad_wrap<'b>(x: Value<'b>, pairs: &[(i64, i64)]) -> Result<Value<'b>, String> {
    let b = x.builder();
    let mut v = x;
    for (axis, &(lo, hi)) in pairs.iter().enumerate() {
        let ax = axis as i64;
        let d = extent(&v.shape(), axis)? as i64;
        let crop_more = || format!("pads ({lo}, {hi}) crop more than the extent {d} of axis {axis}");
        // `lo` and `hi` are any i64: `-lo` and `d + hi` are checked.
        let start = if lo < 0 {
            lo.checked_neg().ok_or_else(crop_more)?
        } else {
            0
        };
        let end = if hi < 0 { d + hi } else { d };
        if start > 0 || end < d {
            if start > end {
                return Err(crop_more());
            }
            v = v.slice(ax, start, end, 1);
        }
        let (lo, hi) = (lo.max(0), hi.max(0));
        if lo == 0 && hi == 0 {
            continue;
        }
        let d = extent(&v.shape(), axis)? as i64;
        if d == 0 {
            return Err(format!("wrap pad of empty axis {axis}"));
        }
        // Whole copies of the axis before and after it: at most 2^32 elements in all.
        let copies_for = |p: i64| p / d + i64::from(p % d != 0);
        let (before, after) = (copies_for(lo), copies_for(hi));
        let copies = before.saturating_add(1).saturating_add(after);
        if copies.saturating_mul(d) > 1 << 32 {
            return Err(format!("wrap pads ({lo}, {hi}) of axis {axis} are too large"));
        }
        let parts = vec![v; copies as usize];
        let all = b.concat(&parts, ax);
        let s = before * d - lo;
        v = all.slice(ax, s, s + lo + d + hi, 1);
    }
    Ok(v)
}
