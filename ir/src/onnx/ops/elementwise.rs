//! Tier (a): elementwise ops, activations, casts, and `Constant`.

use super::{Lowering, Node};
use crate::onnx::import::Importer;
use crate::onnx::tensor::{dtype_from_onnx, tensor_from_proto};
use crate::{DType, Tensor, Value};

pub const OPS: &[(&str, Lowering)] = &[("Constant", constant)];

/// `Constant`: one of `value`, `value_float(s)`, `value_int(s)`.
fn constant<'b>(imp: &mut Importer<'b>, n: &Node<'_, 'b>) -> Result<Vec<Value<'b>>, String> {
    let a = &n.attrs;
    let t = if let Some(t) = a.tensor("value")? {
        tensor_from_proto(t, None)?
    } else if let Some(x) = a.float_opt("value_float")? {
        Tensor::scalar(DType::F32, x as f64)
    } else if let Some(v) = a.floats("value_floats")? {
        Tensor::from_f32([v.len()], v).map_err(|e| e.to_string())?
    } else if let Some(x) = a.int_opt("value_int")? {
        Tensor::new([], crate::TensorData::I64(vec![x])).map_err(|e| e.to_string())?
    } else if let Some(v) = a.ints("value_ints")? {
        Tensor::new([v.len()], crate::TensorData::I64(v)).map_err(|e| e.to_string())?
    } else if a.has("sparse_value") || a.has("value_string") || a.has("value_strings") {
        return Err("sparse and string constants are not supported".into());
    } else {
        return Err("Constant needs one of value, value_float(s), value_int(s)".into());
    };
    let _ = dtype_from_onnx;
    Ok(vec![imp.constant(t)])
}
