//! The JSON form of kernel programs: kinds are externally tagged objects with the
//! kernel's fields (`{"elementwise": {"space": ..}}`), expression ids are plain numbers,
//! and every hand-built fixture round-trips.

mod codegen_common;

use codegen_common as c;
use graphc_compiler::kernel::Program;
use serde_json::{json, Value};

#[test]
fn elementwise_kernel_has_the_struct_variant_shape() {
    let p = c::ew_contiguous_f32();
    let v = serde_json::to_value(&p).unwrap();
    let f32 = serde_json::to_value(graphc_ir::DType::F32).unwrap();
    let kind = &v["kernels"][0]["kind"];
    let expected = json!({
        "elementwise": {
            "space": [64, 256],
            "inputs": [
                {"buffer": 0, "offset": 0, "strides": [256, 1]},
                {"buffer": 1, "offset": 0, "strides": [256, 1]},
                {"buffer": 2, "offset": 0, "strides": [0, 1]}
            ],
            "body": {"exprs": [
                [{"load": 0}, f32],
                [{"load": 1}, f32],
                [{"load": 2}, f32],
                [{"binary": ["mul", 0, 1]}, f32],
                [{"binary": ["add", 3, 2]}, f32],
                [{"unary": ["relu", 4]}, f32]
            ]},
            "stores": [{"value": 5, "access": {"buffer": 3, "offset": 0, "strides": [256, 1]}}]
        }
    });
    assert_eq!(kind, &expected, "{}", serde_json::to_string_pretty(kind).unwrap());
}

#[test]
fn every_kind_is_tagged_by_its_snake_case_name() {
    let tag = |p: &Program| -> String {
        let v = serde_json::to_value(p).unwrap();
        let Value::Object(kind) = &v["kernels"][0]["kind"] else {
            panic!("kind is not an object")
        };
        assert_eq!(kind.len(), 1);
        kind.keys().next().unwrap().clone()
    };
    assert_eq!(tag(&c::row_softmax(4, 8, graphc_ir::DType::F32)), "row");
    assert_eq!(tag(&c::matmul_bias_relu()), "mat_mul");
    assert_eq!(tag(&c::op_concat()), "op");
    let v = serde_json::to_value(c::row_layernorm()).unwrap();
    let row = &v["kernels"][0]["kind"]["row"];
    for field in ["outer", "inner", "inputs", "body", "stages", "row_stores", "stores"] {
        assert!(row.get(field).is_some(), "row kernel lacks {field}");
    }
    assert!(row["stages"][0]["value"].is_u64());
    let v = serde_json::to_value(c::matmul_bias_relu()).unwrap();
    let mm = &v["kernels"][0]["kind"]["mat_mul"];
    for field in ["batch", "m", "n", "k", "a", "b", "inputs", "body", "stores"] {
        assert!(mm.get(field).is_some(), "matmul kernel lacks {field}");
    }
    let v = serde_json::to_value(c::op_concat()).unwrap();
    let op = &v["kernels"][0]["kind"]["op"];
    for field in ["op", "inputs", "output"] {
        assert!(op.get(field).is_some(), "op kernel lacks {field}");
    }
}

#[test]
fn every_fixture_round_trips() {
    for (name, p) in c::all() {
        let text = serde_json::to_string(&p).unwrap();
        let back: Program = serde_json::from_str(&text).unwrap();
        assert_eq!(back, p, "{name}");
        assert_eq!(serde_json::to_string(&back).unwrap(), text, "{name}");
    }
}
