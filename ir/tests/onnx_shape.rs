//! ONNX shape ops (tier d): shape subgraphs fold at import, data-dependent shapes and bad
//! axes are errors naming the node, and a few lowerings checked against known values.

mod common;

use std::collections::HashMap;

use common::{i64_init, int_attr, ints_attr, model, node, string_attr, value_info};
use graphc_ir::onnx::proto::{
    attribute_type as at, data_type as dt, AttributeProto, ModelProto, TensorProto, ValueInfoProto,
};
use graphc_ir::onnx::{import_model, ImportOptions, OnnxError};
use graphc_ir::{interpret, Graph, Op, Tensor, TensorData};

fn import(m: &ModelProto) -> Result<Graph, OnnxError> {
    import_model(m, None, &ImportOptions::default())
}

fn run(g: &Graph, inputs: &[(&str, Tensor)]) -> Vec<Tensor> {
    let inputs: HashMap<String, Tensor> = inputs.iter().map(|(n, t)| (n.to_string(), t.clone())).collect();
    interpret(g, &inputs).unwrap().into_iter().map(|(_, t)| t).collect()
}

fn iota_f32(dims: &[usize]) -> Tensor {
    let n: usize = dims.iter().product();
    Tensor::from_f32(dims.to_vec(), (0..n).map(|i| i as f32).collect()).unwrap()
}

fn f32s(t: &Tensor) -> Vec<f32> {
    match t.data() {
        TensorData::F32(v) => v.clone(),
        d => panic!("expected f32, got {:?}", d.dtype()),
    }
}

fn error_of(m: &ModelProto) -> String {
    match import(m) {
        Ok(_) => panic!("the import should fail"),
        Err(e) => e.to_string(),
    }
}

/// `Shape -> Gather -> Concat -> Reshape` (a flatten as exporters write it) imports as
/// one static reshape, with no shape nodes left.
#[test]
fn shape_subgraph_folds_to_a_static_reshape() {
    let m = model(
        13,
        vec![
            node("Shape", "shape", &["x"], &["s"], vec![]),
            node(
                "Gather",
                "gather",
                &["s", "zero"],
                &["batch"],
                vec![int_attr("axis", 0)],
            ),
            node(
                "Concat",
                "concat",
                &["batch", "minus_one"],
                &["target"],
                vec![int_attr("axis", 0)],
            ),
            node("Reshape", "reshape", &["x", "target"], &["y"], vec![]),
        ],
        vec![value_info("x", dt::FLOAT, &[2, 3, 4])],
        vec![i64_init("zero", &[1], &[0]), i64_init("minus_one", &[1], &[-1])],
        &["y"],
    );
    let g = import(&m).unwrap();
    let ops: Vec<&Op> = g.nodes().iter().map(|n| &n.op).collect();
    assert_eq!(ops.len(), 2, "{ops:?}");
    assert!(matches!(ops[0], Op::Input { .. }));
    match ops[1] {
        Op::Reshape { shape } => assert_eq!(shape.dims(), &[2, 12]),
        op => panic!("expected a reshape, got {op:?}"),
    }
    let x = iota_f32(&[2, 3, 4]);
    let y = &run(&g, &[("x", x.clone())])[0];
    assert_eq!(y.shape().dims(), &[2, 12]);
    assert_eq!(f32s(y), f32s(&x));
}

/// An initializer shape used by the graph's first node is known at import.
#[test]
fn reshape_by_an_initializer_in_the_first_node() {
    let m = model(
        14,
        vec![node("Reshape", "r", &["x", "shape"], &["y"], vec![])],
        vec![value_info("x", dt::FLOAT, &[2, 3, 4])],
        vec![i64_init("shape", &[3], &[0, -1, 2])],
        &["y"],
    );
    let g = import(&m).unwrap();
    let y = &run(&g, &[("x", iota_f32(&[2, 3, 4]))])[0];
    assert_eq!(y.shape().dims(), &[2, 6, 2]);
}

/// A reshape whose shape comes from a graph input's data is a data-dependent shape: an
/// error naming the node.
#[test]
fn reshape_by_input_data_is_an_error_naming_the_node() {
    let m = model(
        13,
        vec![
            node("Identity", "copy", &["s"], &["s2"], vec![]),
            node("Reshape", "my_reshape", &["x", "s2"], &["y"], vec![]),
        ],
        vec![value_info("x", dt::FLOAT, &[2, 3]), value_info("s", dt::INT64, &[2])],
        vec![],
        &["y"],
    );
    let e = error_of(&m);
    assert!(e.contains("my_reshape"), "{e}");
    assert!(e.contains("Reshape"), "{e}");
    assert!(e.contains("not supported"), "{e}");
    assert!(e.contains("data-dependent"), "{e}");
}

#[test]
fn range_of_input_data_is_not_supported() {
    let m = model(
        11,
        vec![node("Range", "rng", &["a", "b", "c"], &["y"], vec![])],
        vec![
            value_info("a", dt::INT64, &[]),
            value_info("b", dt::INT64, &[]),
            value_info("c", dt::INT64, &[]),
        ],
        vec![],
        &["y"],
    );
    let e = error_of(&m);
    assert!(
        e.contains("rng") && e.contains("data-dependent output shapes are not supported"),
        "{e}"
    );
}

/// A long integer `Range` (a batch-sized arange) is `start + iota * delta`, not a
/// constant of that many elements; a short one stays a constant. Same values.
#[test]
fn long_integer_ranges_are_iotas_not_constants() {
    for (limit, constant) in [(40i64, true), (30_000, false)] {
        let m = model(
            11,
            vec![node("Range", "rng", &["a", "b", "c"], &["y"], vec![])],
            vec![],
            vec![
                i64_init("a", &[], &[5]),
                i64_init("b", &[], &[limit]),
                i64_init("c", &[], &[3]),
            ],
            &["y"],
        );
        let g = import(&m).unwrap();
        let big_constant = g
            .nodes()
            .iter()
            .any(|n| matches!(&n.op, Op::Constant { value } if value.numel() > 1));
        assert_eq!(big_constant, constant, "limit {limit}");
        let want: Vec<i64> = (5..limit).step_by(3).collect();
        assert_eq!(run(&g, &[])[0].data(), &TensorData::I64(want), "limit {limit}");
    }
}

/// One op on `x: f32[2,3]` with the given attributes and extra initializers.
fn one_op(opset: i64, op: &str, extra: &[&str], attrs: Vec<AttributeProto>, inits: Vec<TensorProto>) -> ModelProto {
    let mut inputs = vec!["x"];
    inputs.extend_from_slice(extra);
    model(
        opset,
        vec![node(op, "the_node", &inputs, &["y"], attrs)],
        vec![value_info("x", dt::FLOAT, &[2, 3])],
        inits,
        &["y"],
    )
}

#[test]
fn bad_axes_are_errors_naming_the_node() {
    let cases = vec![
        (
            "Transpose",
            one_op(13, "Transpose", &[], vec![ints_attr("perm", &[0, 2])], vec![]),
        ),
        (
            "Transpose",
            one_op(13, "Transpose", &[], vec![ints_attr("perm", &[0, 0])], vec![]),
        ),
        ("Concat", one_op(13, "Concat", &[], vec![int_attr("axis", 2)], vec![])),
        (
            "Gather",
            one_op(
                13,
                "Gather",
                &["i"],
                vec![int_attr("axis", -3)],
                vec![i64_init("i", &[1], &[0])],
            ),
        ),
        ("Flatten", one_op(13, "Flatten", &[], vec![int_attr("axis", 3)], vec![])),
        ("Split", one_op(13, "Split", &[], vec![int_attr("axis", 2)], vec![])),
        (
            "Squeeze",
            one_op(11, "Squeeze", &[], vec![ints_attr("axes", &[5])], vec![]),
        ),
        (
            "Squeeze",
            one_op(13, "Squeeze", &["a"], vec![], vec![i64_init("a", &[1], &[0])]),
        ),
        (
            "Unsqueeze",
            one_op(13, "Unsqueeze", &["a"], vec![], vec![i64_init("a", &[1], &[3])]),
        ),
        (
            "Unsqueeze",
            one_op(13, "Unsqueeze", &["a"], vec![], vec![i64_init("a", &[2], &[0, 0])]),
        ),
        (
            "Slice",
            one_op(
                13,
                "Slice",
                &["s", "e", "a"],
                vec![],
                vec![
                    i64_init("s", &[1], &[0]),
                    i64_init("e", &[1], &[1]),
                    i64_init("a", &[1], &[2]),
                ],
            ),
        ),
        (
            "Slice",
            one_op(
                13,
                "Slice",
                &["s", "e", "a", "st"],
                vec![],
                vec![
                    i64_init("s", &[1], &[0]),
                    i64_init("e", &[1], &[1]),
                    i64_init("a", &[1], &[0]),
                    i64_init("st", &[1], &[0]),
                ],
            ),
        ),
        (
            "Reshape",
            one_op(13, "Reshape", &["s"], vec![], vec![i64_init("s", &[2], &[-1, -1])]),
        ),
        (
            "Reshape",
            one_op(13, "Reshape", &["s"], vec![], vec![i64_init("s", &[3], &[1, 1, 0])]),
        ),
        (
            "Reshape",
            one_op(13, "Reshape", &["s"], vec![], vec![i64_init("s", &[2], &[4, -1])]),
        ),
        (
            "Reshape",
            one_op(13, "Reshape", &["s"], vec![], vec![i64_init("s", &[1], &[-2])]),
        ),
        (
            "Expand",
            one_op(13, "Expand", &["s"], vec![], vec![i64_init("s", &[2], &[4, 3])]),
        ),
        (
            "Tile",
            one_op(13, "Tile", &["r"], vec![], vec![i64_init("r", &[1], &[2])]),
        ),
        (
            "Pad",
            one_op(
                13,
                "Pad",
                &["p"],
                vec![string_attr("mode", "reflect")],
                vec![i64_init("p", &[4], &[0, 3, 0, 0])],
            ),
        ),
        (
            "Trilu",
            model(
                14,
                vec![node("Trilu", "the_node", &["x"], &["y"], vec![])],
                vec![value_info("x", dt::FLOAT, &[3])],
                vec![],
                &["y"],
            ),
        ),
    ];
    for (what, m) in cases {
        let e = error_of(&m);
        assert!(e.contains("the_node"), "{what}: {e}");
    }
}

#[test]
fn slice_split_and_pad_from_attributes() {
    // Slice before opset 10: bounds as attributes.
    let m = one_op(
        9,
        "Slice",
        &[],
        vec![
            ints_attr("starts", &[1, -1]),
            ints_attr("ends", &[2, i64::MAX]),
            ints_attr("axes", &[0, 1]),
        ],
        vec![],
    );
    let y = &run(&import(&m).unwrap(), &[("x", iota_f32(&[2, 3]))])[0];
    assert_eq!(f32s(y), [5.0]);

    // Split before opset 13: sizes as an attribute.
    let mut m = one_op(
        11,
        "Split",
        &[],
        vec![int_attr("axis", 1), ints_attr("split", &[1, 2])],
        vec![],
    );
    let g = m.graph.as_mut().unwrap();
    g.node[0].output = vec!["a".into(), "b".into()];
    g.output = ["a", "b"]
        .iter()
        .map(|n| ValueInfoProto {
            name: n.to_string(),
            r#type: None,
        })
        .collect();
    let out = run(&import(&m).unwrap(), &[("x", iota_f32(&[2, 3]))]);
    assert_eq!(f32s(&out[0]), [0.0, 3.0]);
    assert_eq!(f32s(&out[1]), [1.0, 2.0, 4.0, 5.0]);

    // Pad before opset 11: pads and value as attributes.
    let value = AttributeProto {
        name: "value".into(),
        r#type: at::FLOAT,
        f: 9.0,
        ..Default::default()
    };
    let m = one_op(2, "Pad", &[], vec![ints_attr("pads", &[0, 1, 0, 0]), value], vec![]);
    let y = &run(&import(&m).unwrap(), &[("x", iota_f32(&[2, 3]))])[0];
    assert_eq!(f32s(y), [9.0, 0.0, 1.0, 2.0, 9.0, 3.0, 4.0, 5.0]);

    // Wrap padding, with a pad larger than the extent.
    let m = one_op(
        13,
        "Pad",
        &["p"],
        vec![string_attr("mode", "wrap")],
        vec![i64_init("p", &[4], &[0, 4, 0, 1])],
    );
    let y = &run(&import(&m).unwrap(), &[("x", iota_f32(&[2, 3]))])[0];
    assert_eq!(y.shape().dims(), &[2, 8]);
    assert_eq!(
        f32s(y),
        [2.0, 0.0, 1.0, 2.0, 0.0, 1.0, 2.0, 0.0, 5.0, 3.0, 4.0, 5.0, 3.0, 4.0, 5.0, 3.0]
    );
}
