//! Hand-made ONNX models for the importer tests: prost messages with the fields that
//! matter, and the rest default.

use graphc_ir::onnx::proto::{
    attribute_type as at, data_type as dt, tensor_shape_proto::dimension, tensor_shape_proto::Dimension, type_proto,
    AttributeProto, GraphProto, ModelProto, NodeProto, OperatorSetIdProto, TensorProto, TensorShapeProto, TypeProto,
    ValueInfoProto,
};

/// A tensor value of element type `elem_type`; each dim is a size (`Ok`) or a symbolic
/// name (`Err`).
pub fn symbolic_info(name: &str, elem_type: i32, dims: &[Result<i64, &str>]) -> ValueInfoProto {
    let dim = dims
        .iter()
        .map(|d| Dimension {
            value: Some(match d {
                Ok(n) => dimension::Value::DimValue(*n),
                Err(p) => dimension::Value::DimParam(p.to_string()),
            }),
        })
        .collect();
    ValueInfoProto {
        name: name.into(),
        r#type: Some(TypeProto {
            value: Some(type_proto::Value::TensorType(type_proto::Tensor {
                elem_type,
                shape: Some(TensorShapeProto { dim }),
            })),
        }),
    }
}

/// A tensor value of static shape.
pub fn value_info(name: &str, elem_type: i32, dims: &[i64]) -> ValueInfoProto {
    symbolic_info(name, elem_type, &dims.iter().map(|&d| Ok(d)).collect::<Vec<_>>())
}

pub fn node(op: &str, name: &str, inputs: &[&str], outputs: &[&str], attrs: Vec<AttributeProto>) -> NodeProto {
    NodeProto {
        input: inputs.iter().map(|s| s.to_string()).collect(),
        output: outputs.iter().map(|s| s.to_string()).collect(),
        name: name.into(),
        op_type: op.into(),
        attribute: attrs,
        ..Default::default()
    }
}

pub fn int_attr(name: &str, i: i64) -> AttributeProto {
    AttributeProto {
        name: name.into(),
        r#type: at::INT,
        i,
        ..Default::default()
    }
}

pub fn ints_attr(name: &str, ints: &[i64]) -> AttributeProto {
    AttributeProto {
        name: name.into(),
        r#type: at::INTS,
        ints: ints.to_vec(),
        ..Default::default()
    }
}

pub fn string_attr(name: &str, v: &str) -> AttributeProto {
    AttributeProto {
        name: name.into(),
        r#type: at::STRING,
        s: v.as_bytes().to_vec(),
        ..Default::default()
    }
}

pub fn i64_init(name: &str, dims: &[i64], v: &[i64]) -> TensorProto {
    TensorProto {
        name: name.into(),
        dims: dims.to_vec(),
        data_type: dt::INT64,
        int64_data: v.to_vec(),
        ..Default::default()
    }
}

/// A model of `nodes` with graph inputs `inputs`, initializers `inits` and untyped
/// outputs `outputs`, in the default domain at `opset`.
pub fn model(
    opset: i64,
    nodes: Vec<NodeProto>,
    inputs: Vec<ValueInfoProto>,
    inits: Vec<TensorProto>,
    outputs: &[&str],
) -> ModelProto {
    ModelProto {
        ir_version: 8,
        opset_import: vec![OperatorSetIdProto {
            domain: String::new(),
            version: opset,
        }],
        graph: Some(GraphProto {
            node: nodes,
            name: "g".into(),
            initializer: inits,
            input: inputs,
            output: outputs
                .iter()
                .map(|o| ValueInfoProto {
                    name: o.to_string(),
                    r#type: None,
                })
                .collect(),
            ..Default::default()
        }),
        ..Default::default()
    }
}
