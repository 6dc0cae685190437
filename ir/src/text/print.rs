//! The printer.

use half::{bf16, f16};
use std::fmt::Write;

use crate::{Graph, NodeId, Op, SliceRange, Tensor, TensorData, TensorType};

/// The graph in text form, canonically numbered. With `weights_file`, and only when the
/// graph has parameters, a `weights "<file>"` line names the safetensors side file.
pub fn print_with_weights(graph: &Graph, weights_file: Option<&str>) -> String {
    let order = graph.canonical_order();
    let mut new_id = vec![None; graph.len()];
    for (i, &old) in order.iter().enumerate() {
        if let Some(slot) = new_id.get_mut(old.index()) {
            *slot = Some(i);
        }
    }
    let id = |old: NodeId| new_id.get(old.index()).copied().flatten().unwrap_or(old.index());

    let mut out = String::from("graph {\n");
    if let Some(file) = weights_file {
        if graph.parameters().next().is_some() {
            out.push_str("  weights ");
            push_str_lit(&mut out, file);
            out.push('\n');
        }
    }
    for (i, &old) in order.iter().enumerate() {
        let node = graph.node(old);
        let _ = write!(out, "  %{i} = {}", node.op.name());
        match &node.op {
            Op::Input { name, .. } | Op::Parameter { name, .. } => {
                out.push(' ');
                push_str_lit(&mut out, name);
            }
            _ => {
                if let Some(name) = &node.name {
                    out.push(' ');
                    push_str_lit(&mut out, name);
                }
            }
        }
        if !node.inputs.is_empty() {
            if node.name.is_some() && !matches!(node.op, Op::Input { .. } | Op::Parameter { .. }) {
                out.push(' ');
            }
            out.push('(');
            for (k, &operand) in node.inputs.iter().enumerate() {
                if k > 0 {
                    out.push_str(", ");
                }
                let _ = write!(out, "%{}", id(operand));
            }
            out.push(')');
        }
        let attrs = attributes(&node.op, node.name.as_deref());
        if !attrs.is_empty() {
            out.push_str(" {");
            out.push_str(&attrs);
            out.push('}');
        }
        out.push_str(" : ");
        push_type(&mut out, &node.ty);
        out.push('\n');
    }
    for o in graph.outputs() {
        out.push_str("  output ");
        push_str_lit(&mut out, &o.name);
        let _ = writeln!(out, " = %{}", id(o.node));
    }
    out.push_str("}\n");
    out
}

fn attributes(op: &Op, node_name: Option<&str>) -> String {
    let mut s = String::new();
    match op {
        Op::Input { .. } | Op::Parameter { .. } => {
            if let Some(n) = node_name {
                s.push_str("name=");
                push_str_lit(&mut s, n);
            }
        }
        Op::Constant { value } => {
            s.push_str("value=");
            push_tensor_values(&mut s, value);
        }
        Op::Iota { axis, .. } => {
            let _ = write!(s, "axis={axis}");
        }
        Op::Unary(_) | Op::Binary(_) | Op::Select | Op::MatMul => {}
        Op::Cast { to } => {
            let _ = write!(s, "to={to}");
        }
        Op::Broadcast { shape } | Op::Reshape { shape } => {
            s.push_str("shape=");
            push_usizes(&mut s, shape.dims());
        }
        Op::Reduce { axes, keepdims, .. } => {
            s.push_str("axes=");
            push_usizes(&mut s, axes);
            let _ = write!(s, ", keepdims={keepdims}");
        }
        Op::ArgReduce { axis, keepdims, .. } => {
            let _ = write!(s, "axis={axis}, keepdims={keepdims}");
        }
        Op::Transpose { perm } => {
            s.push_str("perm=");
            push_usizes(&mut s, perm);
        }
        Op::Slice { ranges } => {
            s.push_str("ranges=[");
            for (i, r) in ranges.iter().enumerate() {
                if i > 0 {
                    s.push_str(", ");
                }
                push_range(&mut s, r);
            }
            s.push(']');
        }
        Op::Concat { axis } | Op::Gather { axis } => {
            let _ = write!(s, "axis={axis}");
        }
        Op::ScatterAdd { axis, size } => {
            let _ = write!(s, "axis={axis}, size={size}");
        }
        Op::Pad { pads, mode, value } => {
            s.push_str("pads=[");
            for (i, (lo, hi)) in pads.iter().enumerate() {
                if i > 0 {
                    s.push(',');
                }
                let _ = write!(s, "({lo},{hi})");
            }
            let _ = write!(s, "], mode={}, value=", mode.name());
            push_f64(&mut s, *value);
        }
        Op::Attention {
            scale,
            causal,
            zero_masked_rows,
        } => {
            s.push_str("scale=");
            push_f64(&mut s, *scale);
            let _ = write!(s, ", causal={causal}");
            if *zero_masked_rows {
                s.push_str(", zero_masked_rows=true");
            }
        }
        Op::AttentionLse { scale, causal } => {
            s.push_str("scale=");
            push_f64(&mut s, *scale);
            let _ = write!(s, ", causal={causal}");
        }
        Op::AttentionGrad {
            wrt,
            scale,
            causal,
            zero_masked_rows,
        } => {
            let _ = write!(s, "wrt={}, scale=", wrt.name());
            push_f64(&mut s, *scale);
            let _ = write!(s, ", causal={causal}");
            if *zero_masked_rows {
                s.push_str(", zero_masked_rows=true");
            }
        }
        Op::Dequantize { bits, group } => {
            let _ = write!(s, "bits={bits}, group={group}");
        }
        Op::BatchNorm { epsilon, momentum } => {
            s.push_str("epsilon=");
            push_f64(&mut s, *epsilon);
            s.push_str(", momentum=");
            push_f64(&mut s, *momentum);
        }
        Op::Conv { window, groups } => {
            push_window(&mut s, window);
            let _ = write!(s, ", groups={groups}");
        }
        Op::ConvGrad {
            wrt,
            window,
            groups,
            shape,
        } => {
            let _ = write!(s, "wrt={}, ", wrt.name());
            push_window(&mut s, window);
            let _ = write!(s, ", groups={groups}, shape=");
            push_usizes(&mut s, shape.dims());
        }
        Op::Pool {
            kernel,
            window,
            ceil_mode,
            count_include_pad,
            ..
        }
        | Op::PoolGrad {
            kernel,
            window,
            ceil_mode,
            count_include_pad,
            ..
        } => {
            s.push_str("kernel=");
            push_usizes(&mut s, kernel);
            s.push_str(", ");
            push_window(&mut s, window);
            let _ = write!(s, ", ceil_mode={ceil_mode}, count_include_pad={count_include_pad}");
        }
    }
    s
}

/// `strides=[..], pads=[(lo,hi),..], dilations=[..]`.
fn push_window(s: &mut String, w: &crate::Window) {
    s.push_str("strides=");
    push_usizes(s, &w.strides);
    s.push_str(", pads=[");
    for (i, (lo, hi)) in w.pads.iter().enumerate() {
        if i > 0 {
            s.push(',');
        }
        let _ = write!(s, "({lo},{hi})");
    }
    s.push_str("], dilations=");
    push_usizes(s, &w.dilations);
}

fn push_usizes(s: &mut String, v: &[usize]) {
    s.push('[');
    for (i, x) in v.iter().enumerate() {
        if i > 0 {
            s.push(',');
        }
        let _ = write!(s, "{x}");
    }
    s.push(']');
}

fn push_bound(s: &mut String, x: i64) {
    match x {
        i64::MAX => s.push_str("max"),
        i64::MIN => s.push_str("min"),
        _ => {
            let _ = write!(s, "{x}");
        }
    }
}

fn push_range(s: &mut String, r: &SliceRange) {
    push_bound(s, r.start);
    s.push(':');
    push_bound(s, r.end);
    s.push(':');
    push_bound(s, r.step);
}

pub(crate) fn push_type(s: &mut String, ty: &TensorType) {
    s.push_str(ty.dtype.name());
    push_usizes(s, ty.shape.dims());
}

/// A double-quoted string literal with escapes.
pub(crate) fn push_str_lit(s: &mut String, text: &str) {
    s.push('"');
    for c in text.chars() {
        match c {
            '"' => s.push_str("\\\""),
            '\\' => s.push_str("\\\\"),
            '\n' => s.push_str("\\n"),
            '\t' => s.push_str("\\t"),
            '\r' => s.push_str("\\r"),
            c if c.is_control() => {
                let _ = write!(s, "\\u{{{:x}}}", c as u32);
            }
            c => s.push(c),
        }
    }
    s.push('"');
}

/// The canonical quiet NaN bits of each float width (positive).
pub(crate) const F32_NAN: u64 = 0x7fc0_0000;
pub(crate) const F64_NAN: u64 = 0x7ff8_0000_0000_0000;
pub(crate) const F16_NAN: u64 = 0x7e00;
pub(crate) const BF16_NAN: u64 = 0x7fc0;

/// A NaN of `bits`, as `nan`, `-nan` or `nan(0x..)`.
fn push_nan(s: &mut String, bits: u64, canonical: u64, sign: u64) {
    if bits == canonical {
        s.push_str("nan");
    } else if bits == canonical | sign {
        s.push_str("-nan");
    } else {
        let _ = write!(s, "nan(0x{bits:x})");
    }
}

fn push_float32(s: &mut String, x: f32) {
    if x.is_infinite() {
        s.push_str(if x > 0.0 { "inf" } else { "-inf" });
    } else {
        let _ = write!(s, "{x:?}");
    }
}

pub(crate) fn push_f64(s: &mut String, x: f64) {
    if x.is_nan() {
        push_nan(s, x.to_bits(), F64_NAN, 1 << 63);
    } else if x.is_infinite() {
        s.push_str(if x > 0.0 { "inf" } else { "-inf" });
    } else {
        let _ = write!(s, "{x:?}");
    }
}

fn push_f32(s: &mut String, x: f32) {
    if x.is_nan() {
        push_nan(s, x.to_bits() as u64, F32_NAN, 1 << 31);
    } else {
        push_float32(s, x);
    }
}

fn push_f16(s: &mut String, x: f16) {
    if x.is_nan() {
        push_nan(s, x.to_bits() as u64, F16_NAN, 1 << 15);
    } else {
        push_float32(s, x.to_f32());
    }
}

fn push_bf16(s: &mut String, x: bf16) {
    if x.is_nan() {
        push_nan(s, x.to_bits() as u64, BF16_NAN, 1 << 15);
    } else {
        push_float32(s, x.to_f32());
    }
}

fn push_list<T: Copy>(s: &mut String, v: &[T], f: impl Fn(&mut String, T)) {
    s.push('[');
    for (i, &x) in v.iter().enumerate() {
        if i > 0 {
            s.push_str(", ");
        }
        f(s, x);
    }
    s.push(']');
}

fn push_tensor_values(s: &mut String, t: &Tensor) {
    fn int<T: std::fmt::Display>(s: &mut String, x: T) {
        let _ = write!(s, "{x}");
    }
    match t.data() {
        TensorData::F32(v) => push_list(s, v, push_f32),
        TensorData::F16(v) => push_list(s, v, push_f16),
        TensorData::BF16(v) => push_list(s, v, push_bf16),
        TensorData::F64(v) => push_list(s, v, push_f64),
        TensorData::I64(v) => push_list(s, v, int),
        TensorData::I32(v) => push_list(s, v, int),
        TensorData::I8(v) => push_list(s, v, int),
        TensorData::U8(v) => push_list(s, v, int),
        TensorData::Bool(v) => push_list(s, v, int),
    }
}
