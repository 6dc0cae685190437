//! Tier (a): elementwise ops, activations, casts, and `Constant`. Binary ops broadcast
//! by numpy rules (the builder inserts the broadcasts).

use super::{Lowering, Node};
use crate::onnx::import::Importer;
use crate::onnx::tensor::{dtype_from_onnx, tensor_from_proto};
use crate::{BinaryOp, DType, Tensor, TensorData, UnaryOp, Value};

pub const OPS: &[(&str, Lowering)] = &[
    ("Constant", constant),
    ("Add", |_, n| binary(n, BinaryOp::Add)),
    ("Sub", |_, n| binary(n, BinaryOp::Sub)),
    ("Mul", |_, n| binary(n, BinaryOp::Mul)),
    ("Div", |_, n| binary(n, BinaryOp::Div)),
    ("Pow", pow),
    ("Mod", modulo),
    ("And", |_, n| binary(n, BinaryOp::And)),
    ("Or", |_, n| binary(n, BinaryOp::Or)),
    ("Xor", |_, n| binary(n, BinaryOp::Xor)),
    ("Equal", |_, n| binary(n, BinaryOp::Eq)),
    ("Less", |_, n| binary(n, BinaryOp::Lt)),
    ("LessOrEqual", |_, n| binary(n, BinaryOp::Le)),
    ("Greater", |_, n| binary(n, BinaryOp::Gt)),
    ("GreaterOrEqual", |_, n| binary(n, BinaryOp::Ge)),
    ("Max", |_, n| variadic(n, BinaryOp::Max)),
    ("Min", |_, n| variadic(n, BinaryOp::Min)),
    ("Sum", |_, n| variadic(n, BinaryOp::Add)),
    ("Mean", mean),
    ("Neg", |_, n| unary(n, UnaryOp::Neg)),
    ("Abs", |_, n| unary(n, UnaryOp::Abs)),
    ("Exp", |_, n| unary(n, UnaryOp::Exp)),
    ("Log", |_, n| unary(n, UnaryOp::Log)),
    ("Sqrt", |_, n| unary(n, UnaryOp::Sqrt)),
    ("Reciprocal", |_, n| unary(n, UnaryOp::Reciprocal)),
    ("Tanh", |_, n| unary(n, UnaryOp::Tanh)),
    ("Sigmoid", |_, n| unary(n, UnaryOp::Sigmoid)),
    ("Relu", |_, n| unary(n, UnaryOp::Relu)),
    ("Erf", |_, n| unary(n, UnaryOp::Erf)),
    ("Sin", |_, n| unary(n, UnaryOp::Sin)),
    ("Cos", |_, n| unary(n, UnaryOp::Cos)),
    ("Floor", |_, n| unary(n, UnaryOp::Floor)),
    ("Ceil", |_, n| unary(n, UnaryOp::Ceil)),
    ("Round", |_, n| unary(n, UnaryOp::Round)),
    ("Sign", |_, n| unary(n, UnaryOp::Sign)),
    ("Not", |_, n| unary(n, UnaryOp::Not)),
    ("IsNaN", |_, n| unary(n, UnaryOp::IsNan)),
    ("IsInf", is_inf),
    ("Where", where_),
    ("Cast", cast),
    ("CastLike", cast_like),
    ("Clip", clip),
    ("Gelu", gelu),
    ("LeakyRelu", leaky_relu),
    ("PRelu", prelu),
    ("Elu", elu),
    ("Selu", selu),
    ("Celu", celu),
    ("HardSigmoid", hard_sigmoid),
    ("HardSwish", hard_swish),
    ("Mish", mish),
    ("Softplus", |_, n| Ok(vec![softplus(n.input(0)?)])),
    ("Softsign", softsign),
    ("ThresholdedRelu", thresholded_relu),
];

type Out<'b> = Result<Vec<Value<'b>>, String>;

/// The attributes of which a `Constant` has exactly one.
const CONSTANT_VALUES: [&str; 8] = [
    "value",
    "value_float",
    "value_floats",
    "value_int",
    "value_ints",
    "value_string",
    "value_strings",
    "sparse_value",
];

/// `Constant`: one of `value`, `value_float(s)`, `value_int(s)`.
fn constant<'b>(imp: &mut Importer<'b>, n: &Node<'_, 'b>) -> Out<'b> {
    let a = &n.attrs;
    let given: Vec<&str> = CONSTANT_VALUES.into_iter().filter(|v| a.has(v)).collect();
    if given.len() != 1 {
        return Err(format!(
            "a Constant has exactly one of the attributes {}; this one has {}{}",
            CONSTANT_VALUES.join(", "),
            given.len(),
            if given.is_empty() {
                String::new()
            } else {
                format!(" ({})", given.join(", "))
            }
        ));
    }
    let t = if let Some(t) = a.tensor("value")? {
        tensor_from_proto(t, None)?
    } else if let Some(x) = a.float_opt("value_float")? {
        Tensor::scalar(DType::F32, x as f64)
    } else if let Some(v) = a.floats("value_floats")? {
        Tensor::from_f32([v.len()], v).map_err(|e| e.to_string())?
    } else if let Some(x) = a.int_opt("value_int")? {
        Tensor::new([], TensorData::I64(vec![x])).map_err(|e| e.to_string())?
    } else if let Some(v) = a.ints("value_ints")? {
        Tensor::new([v.len()], TensorData::I64(v)).map_err(|e| e.to_string())?
    } else if a.has("sparse_value") || a.has("value_string") || a.has("value_strings") {
        return Err("sparse and string constants are not supported".into());
    } else {
        return Err(format!("Constant attribute `{}` is not supported", given.join("")));
    };
    Ok(vec![imp.constant(t)])
}

fn unary<'b>(n: &Node<'_, 'b>, op: UnaryOp) -> Out<'b> {
    Ok(vec![n.input(0)?.unary(op)])
}

fn binary<'b>(n: &Node<'_, 'b>, op: BinaryOp) -> Out<'b> {
    Ok(vec![n.input(0)?.binary(op, n.input(1)?)])
}

/// Max, Min, Sum: one or more operands, broadcast together.
fn variadic<'b>(n: &Node<'_, 'b>, op: BinaryOp) -> Out<'b> {
    let mut acc = n.input(0)?;
    for i in 1..n.inputs.len() {
        acc = acc.binary(op, n.input(i)?);
    }
    Ok(vec![acc])
}

fn mean<'b>(_: &mut Importer<'b>, n: &Node<'_, 'b>) -> Out<'b> {
    let sum = variadic(n, BinaryOp::Add)?.remove(0);
    Ok(vec![sum / n.inputs.len() as f64])
}

/// The exponent may have another dtype than the base; the result has the base's.
fn pow<'b>(_: &mut Importer<'b>, n: &Node<'_, 'b>) -> Out<'b> {
    let x = n.input(0)?;
    Ok(vec![x.pow(n.input(1)?.cast(x.dtype()))])
}

fn modulo<'b>(_: &mut Importer<'b>, n: &Node<'_, 'b>) -> Out<'b> {
    let fmod = n.attrs.int("fmod", 0)? != 0;
    let x = n.input(0)?;
    if x.dtype().is_float() && !fmod {
        return Err("Mod of floats needs fmod=1".into());
    }
    binary(n, if fmod { BinaryOp::Fmod } else { BinaryOp::Mod })
}

fn is_inf<'b>(_: &mut Importer<'b>, n: &Node<'_, 'b>) -> Out<'b> {
    let x = n.input(0)?;
    let neg = n.attrs.int("detect_negative", 1)? != 0;
    let pos = n.attrs.int("detect_positive", 1)? != 0;
    let inf = x.isinf();
    Ok(vec![match (neg, pos) {
        (true, true) => inf,
        (false, true) => inf.and(x.gt(0.0)),
        (true, false) => inf.and(x.lt(0.0)),
        (false, false) => inf.and(x.ne(x)), // all false, of the right shape
    }])
}

fn where_<'b>(imp: &mut Importer<'b>, n: &Node<'_, 'b>) -> Out<'b> {
    Ok(vec![imp.b.select(n.input(0)?, n.input(1)?, n.input(2)?)])
}

fn cast<'b>(_: &mut Importer<'b>, n: &Node<'_, 'b>) -> Out<'b> {
    let to = n.attrs.int_opt("to")?.ok_or("Cast needs the `to` attribute")?;
    let to = dtype_from_onnx(to as i32)?;
    let x = n.input(0)?;
    Ok(vec![x.cast(to)])
}

fn cast_like<'b>(_: &mut Importer<'b>, n: &Node<'_, 'b>) -> Out<'b> {
    Ok(vec![n.input(0)?.cast(n.input(1)?.dtype())])
}

/// `min(max(x, lo), hi)`; bounds are inputs (opset >= 11) or attributes.
fn clip<'b>(imp: &mut Importer<'b>, n: &Node<'_, 'b>) -> Out<'b> {
    let x = n.input(0)?;
    let (lo, hi) = if n.opset >= 11 {
        (n.opt_input(1), n.opt_input(2))
    } else {
        let lo = n.attrs.float_opt("min")?.map(|v| imp.scalar(x.dtype(), v as f64));
        let hi = n.attrs.float_opt("max")?.map(|v| imp.scalar(x.dtype(), v as f64));
        (lo, hi)
    };
    let mut y = x;
    if let Some(lo) = lo {
        y = y.maximum(lo);
    }
    if let Some(hi) = hi {
        y = y.minimum(hi);
    }
    Ok(vec![y])
}

fn gelu<'b>(_: &mut Importer<'b>, n: &Node<'_, 'b>) -> Out<'b> {
    let x = n.input(0)?;
    match n.attrs.string("approximate", "none")?.as_str() {
        "none" => Ok(vec![x.gelu()]),
        "tanh" => Ok(vec![x.gelu_tanh()]),
        other => Err(format!("Gelu approximate=`{other}` is not supported (none or tanh)")),
    }
}

/// `x < 0 ? negative : x`.
fn where_negative<'b>(x: Value<'b>, negative: Value<'b>) -> Value<'b> {
    x.builder().select(x.lt(0.0), negative, x)
}

fn leaky_relu<'b>(_: &mut Importer<'b>, n: &Node<'_, 'b>) -> Out<'b> {
    let x = n.input(0)?;
    let alpha = n.attrs.float("alpha", 0.01)? as f64;
    Ok(vec![where_negative(x, x * alpha)])
}

fn prelu<'b>(_: &mut Importer<'b>, n: &Node<'_, 'b>) -> Out<'b> {
    let x = n.input(0)?;
    let slope = n.input(1)?;
    Ok(vec![where_negative(x, x * slope)])
}

fn elu<'b>(_: &mut Importer<'b>, n: &Node<'_, 'b>) -> Out<'b> {
    let x = n.input(0)?;
    let alpha = n.attrs.float("alpha", 1.0)? as f64;
    Ok(vec![where_negative(x, (x.exp() - 1.0) * alpha)])
}

fn selu<'b>(_: &mut Importer<'b>, n: &Node<'_, 'b>) -> Out<'b> {
    let x = n.input(0)?;
    let alpha = n.attrs.float("alpha", 1.673_263_2)? as f64;
    let gamma = n.attrs.float("gamma", 1.050_701)? as f64;
    let b = x.builder();
    let neg = (x.exp() * alpha - alpha) * gamma;
    Ok(vec![b.select(x.le(0.0), neg, x * gamma)])
}

/// `max(0, x) + min(0, alpha (exp(x / alpha) - 1))`.
fn celu<'b>(_: &mut Importer<'b>, n: &Node<'_, 'b>) -> Out<'b> {
    let x = n.input(0)?;
    let alpha = n.attrs.float("alpha", 1.0)? as f64;
    let zero = x.builder().scalar(x.dtype(), 0.0);
    let neg = (((x / alpha).exp() - 1.0) * alpha).minimum(zero);
    Ok(vec![x.maximum(zero) + neg])
}

/// `max(0, min(1, alpha x + beta))`.
fn hard_sigmoid_of<'b>(x: Value<'b>, alpha: f64, beta: f64) -> Value<'b> {
    let b = x.builder();
    let (zero, one) = (b.scalar(x.dtype(), 0.0), b.scalar(x.dtype(), 1.0));
    (x * alpha + beta).minimum(one).maximum(zero)
}

fn hard_sigmoid<'b>(_: &mut Importer<'b>, n: &Node<'_, 'b>) -> Out<'b> {
    let alpha = n.attrs.float("alpha", 0.2)? as f64;
    let beta = n.attrs.float("beta", 0.5)? as f64;
    Ok(vec![hard_sigmoid_of(n.input(0)?, alpha, beta)])
}

fn hard_swish<'b>(_: &mut Importer<'b>, n: &Node<'_, 'b>) -> Out<'b> {
    let x = n.input(0)?;
    Ok(vec![x * hard_sigmoid_of(x, 1.0 / 6.0, 0.5)])
}

/// `log(1 + exp(x))`, written to stay finite for large `x`: `max(x, 0) + log(1 + exp(-|x|))`.
fn softplus(x: Value<'_>) -> Value<'_> {
    let zero = x.builder().scalar(x.dtype(), 0.0);
    x.maximum(zero) + ((-x.abs()).exp() + 1.0).log()
}

fn mish<'b>(_: &mut Importer<'b>, n: &Node<'_, 'b>) -> Out<'b> {
    let x = n.input(0)?;
    Ok(vec![x * softplus(x).tanh()])
}

fn softsign<'b>(_: &mut Importer<'b>, n: &Node<'_, 'b>) -> Out<'b> {
    let x = n.input(0)?;
    Ok(vec![x / (x.abs() + 1.0)])
}

fn thresholded_relu<'b>(_: &mut Importer<'b>, n: &Node<'_, 'b>) -> Out<'b> {
    let x = n.input(0)?;
    let alpha = n.attrs.float("alpha", 1.0)? as f64;
    let b = x.builder();
    Ok(vec![b.select(x.gt(alpha), x, b.scalar(x.dtype(), 0.0))])
}
