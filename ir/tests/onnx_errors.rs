//! Malformed and unsupported ONNX models: every problem is an error that names the
//! place (input, initializer, node) and the problem; nothing panics.

mod common;

use std::path::{Path, PathBuf};

use common::{node, symbolic_info, value_info};
use graphc_ir::onnx::proto::{
    data_type, AttributeProto, ModelProto, NodeProto, OperatorSetIdProto, StringStringEntryProto, TensorProto,
    ValueInfoProto,
};
use graphc_ir::onnx::{import_model, import_onnx, list_unsupported, ImportOptions};
use prost::Message;

fn f32_in(name: &str, dims: &[i64]) -> ValueInfoProto {
    value_info(name, data_type::FLOAT, dims)
}

/// A model at opset 20 whose outputs are declared with their types.
fn model(nodes: Vec<NodeProto>, inputs: Vec<ValueInfoProto>, outputs: Vec<ValueInfoProto>) -> ModelProto {
    let mut m = common::model(20, nodes, inputs, vec![], &[]);
    m.graph.as_mut().expect("graph").output = outputs;
    m
}

fn err(m: &ModelProto, dir: Option<&Path>, opts: &ImportOptions) -> String {
    import_model(m, dir, opts).expect_err("must not import").to_string()
}

fn temp_dir(test: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("graphc-onnx-{}-{test}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn add_model() -> ModelProto {
    model(
        vec![node("Add", "add0", &["x", "y"], &["z"], vec![])],
        vec![f32_in("x", &[2, 3]), f32_in("y", &[3])],
        vec![f32_in("z", &[2, 3])],
    )
}

#[test]
fn a_valid_model_imports() {
    let g = import_model(&add_model(), None, &ImportOptions::default()).unwrap();
    assert_eq!(g.inputs().len(), 2);
    assert_eq!(g.outputs()[0].name, "z");
}

#[test]
fn undefined_operand_and_cycles_are_named() {
    let m = model(
        vec![
            node("Neg", "first", &["b"], &["a"], vec![]),
            node("Neg", "second", &["a"], &["b"], vec![]),
        ],
        vec![],
        vec![f32_in("b", &[2])],
    );
    let e = err(&m, None, &ImportOptions::default());
    assert!(
        e.starts_with("node `first` (Neg, opset 20): operand `b` is not defined before this node"),
        "{e}"
    );
    assert!(e.contains("cycle"), "{e}");
}

#[test]
fn missing_required_operand() {
    let m = model(
        vec![node("Add", "lonely", &["x"], &["z"], vec![])],
        vec![f32_in("x", &[2])],
        vec![f32_in("z", &[2])],
    );
    assert_eq!(
        err(&m, None, &ImportOptions::default()),
        "node `lonely` (Add, opset 20): operand 1 is required"
    );
}

#[test]
fn wrong_types_are_named() {
    let mut m = add_model();
    m.graph.as_mut().unwrap().input[1] = value_info("y", data_type::INT64, &[3]);
    let e = err(&m, None, &ImportOptions::default());
    assert!(e.starts_with("node `add0` (Add, opset 20):"), "{e}");
    assert!(e.contains("one type"), "{e}");

    let mut m = add_model();
    m.graph.as_mut().unwrap().input[0] = value_info("x", data_type::STRING, &[2]);
    assert_eq!(
        err(&m, None, &ImportOptions::default()),
        "graph input `x`: element type STRING is not supported"
    );

    // A LayerNormalization whose scale is bf16 over an f32 input (as the TorchScript
    // exporter writes a bf16 model with SDPA; onnx.checker rejects it too).
    let m = model(
        vec![node("LayerNormalization", "ln", &["x", "s"], &["y"], vec![])],
        vec![f32_in("x", &[2, 3]), value_info("s", data_type::BFLOAT16, &[3])],
        vec![f32_in("y", &[2, 3])],
    );
    let e = err(&m, None, &ImportOptions::default());
    assert!(e.starts_with("node `ln` (LayerNormalization, opset 20):"), "{e}");
    assert!(e.contains("Scale bf16[3] must have the dtype of X f32[2,3]"), "{e}");

    let mut m = add_model();
    m.graph.as_mut().unwrap().output[0] = f32_in("z", &[3, 2]);
    assert_eq!(
        err(&m, None, &ImportOptions::default()),
        "output `z` is declared with shape [3,2] but computes [2,3]"
    );
}

#[test]
fn symbolic_dims_must_be_fixed() {
    let m = model(
        vec![node("Relu", "r", &["x"], &["y"], vec![])],
        vec![symbolic_info("x", data_type::FLOAT, &[Err("batch"), Ok(4)])],
        vec![symbolic_info("y", data_type::FLOAT, &[Err("batch"), Ok(4)])],
    );
    assert_eq!(
        err(&m, None, &ImportOptions::default()),
        "graph input `x`: symbolic dimension `batch` (axis 0) is not set; fix it with --dim batch=N"
    );
    // Several unset dimensions (a name met again is named once): one error for all.
    let two = model(
        vec![node("Add", "a", &["x", "z"], &["y"], vec![])],
        vec![
            symbolic_info("x", data_type::FLOAT, &[Err("batch"), Err("seq")]),
            symbolic_info("z", data_type::FLOAT, &[Err("batch"), Err("seq")]),
        ],
        vec![symbolic_info("y", data_type::FLOAT, &[Err("batch"), Err("seq")])],
    );
    assert_eq!(
        err(&two, None, &ImportOptions::default()),
        "2 symbolic dimensions are not set: `batch` (graph input `x`, axis 0), `seq` (graph input `x`, axis 1); \
         fix them with --dim batch=N --dim seq=N"
    );
    let mut opts = ImportOptions::default();
    opts.dims.insert("batch".into(), 8);
    let g = import_model(&m, None, &opts).unwrap();
    assert_eq!(g.node(g.inputs()[0]).ty.to_string(), "f32[8,4]");
    opts.dims.insert("seq".into(), 3);
    assert_eq!(
        err(&m, None, &opts),
        "--dim seq: the model has no symbolic input dimension `seq` (it has: batch)"
    );
}

#[test]
fn unsupported_ops_name_op_domain_and_opset() {
    let mut m = model(
        vec![
            node("Relu", "ok", &["x"], &["a"], vec![]),
            node("Frobnicate", "f1", &["a"], &["b"], vec![]),
            NodeProto {
                domain: "com.example".into(),
                ..node("Custom", "f2", &["b"], &["c"], vec![])
            },
        ],
        vec![f32_in("x", &[2])],
        vec![f32_in("c", &[2])],
    );
    m.opset_import.push(OperatorSetIdProto {
        domain: "com.example".into(),
        version: 3,
    });
    assert_eq!(
        err(&m, None, &ImportOptions::default()),
        "node `f1` (Frobnicate, opset 20): unsupported op"
    );
    let dir = temp_dir("unsupported");
    let path = dir.join("m.onnx");
    std::fs::write(&path, m.encode_to_vec()).unwrap();
    let listed = list_unsupported(&path).unwrap();
    let names: Vec<_> = listed
        .iter()
        .map(|u| (u.op_type.as_str(), u.domain.as_str(), u.opset))
        .collect();
    assert_eq!(names, [("Frobnicate", "", 20), ("Custom", "com.example", 3)]);
}

#[test]
fn attributes_of_the_wrong_type() {
    let mut n = node("LeakyRelu", "lr", &["x"], &["y"], vec![]);
    n.attribute.push(AttributeProto {
        name: "alpha".into(),
        r#type: 3, // STRING
        s: b"oops".to_vec(),
        ..Default::default()
    });
    let m = model(vec![n], vec![f32_in("x", &[2])], vec![f32_in("y", &[2])]);
    assert_eq!(
        err(&m, None, &ImportOptions::default()),
        "node `lr` (LeakyRelu, opset 20): attribute `alpha` must be a float, found attribute type 3"
    );
}

fn external_initializer(location: &str, offset: &str, length: &str) -> ModelProto {
    let mut m = model(
        vec![node("Add", "add", &["x", "w"], &["y"], vec![])],
        vec![f32_in("x", &[4])],
        vec![f32_in("y", &[4])],
    );
    let entry = |k: &str, v: &str| StringStringEntryProto {
        key: k.into(),
        value: v.into(),
    };
    m.graph.as_mut().unwrap().initializer.push(TensorProto {
        dims: vec![4],
        data_type: data_type::FLOAT,
        name: "w".into(),
        data_location: 1,
        external_data: vec![
            entry("location", location),
            entry("offset", offset),
            entry("length", length),
        ],
        ..Default::default()
    });
    m
}

#[test]
fn external_data_is_read_and_bad_paths_are_errors() {
    let dir = temp_dir("external");
    let mut bytes = vec![0u8; 8];
    for x in [1.0f32, 2.0, 3.0, 4.0] {
        bytes.extend_from_slice(&x.to_le_bytes());
    }
    std::fs::write(dir.join("model.onnx.data"), &bytes).unwrap();
    let opts = ImportOptions::default();

    let g = import_model(&external_initializer("model.onnx.data", "8", "16"), Some(&dir), &opts).unwrap();
    assert_eq!(g.weight("w").unwrap().to_f64_vec(), vec![1.0, 2.0, 3.0, 4.0]);

    let e = err(
        &external_initializer("../model.onnx.data", "8", "16"),
        Some(&dir),
        &opts,
    );
    assert!(e.contains("initializer `w`: external data ../model.onnx.data: external data path must be relative and inside the model's folder"), "{e}");
    let e = err(&external_initializer("/etc/passwd", "0", "16"), Some(&dir), &opts);
    assert!(e.contains("must be relative"), "{e}");
    let e = err(&external_initializer("missing.data", "0", "16"), Some(&dir), &opts);
    assert!(
        e.starts_with("initializer `w`: external data") && e.contains("missing.data"),
        "{e}"
    );
    let e = err(&external_initializer("model.onnx.data", "32", "16"), Some(&dir), &opts);
    assert!(e.contains("bytes 32..48 are outside the file (24 bytes)"), "{e}");
    let e = err(&external_initializer("model.onnx.data", "8", "12"), Some(&dir), &opts);
    assert!(
        e.contains("external data `length` is 12 bytes but the tensor needs 16"),
        "{e}"
    );
    let e = err(&external_initializer("model.onnx.data", "x", "16"), Some(&dir), &opts);
    assert!(e.contains("external data `offset` is not a byte count: `x`"), "{e}");
}

/// External data is a view into the mapped file: nothing is decoded until the elements
/// are read, the mapping holds the exact bytes at any offset (aligned or not), and the
/// tensors of one file share one mapping.
#[test]
fn external_data_is_mapped_not_read() {
    let dir = temp_dir("external-mapped");
    let mut bytes = vec![0u8; 3];
    for x in [1.5f32, -2.0, 3.25, 4.0] {
        bytes.extend_from_slice(&x.to_le_bytes());
    }
    std::fs::write(dir.join("w.data"), &bytes).unwrap();
    let opts = ImportOptions::default();
    // Offset 3: not a multiple of the element size.
    let g = import_model(&external_initializer("w.data", "3", "16"), Some(&dir), &opts).unwrap();
    let w = g.weight("w").unwrap();
    assert!(w.is_mapped() && !w.is_decoded());
    assert_eq!(&*w.le_bytes(), &bytes[3..]);
    assert!(!w.is_decoded(), "the bytes are borrowed, not decoded");
    let copy = w.clone();
    assert!(copy.shares_data(w));
    assert_eq!(w.to_f64_vec(), vec![1.5, -2.0, 3.25, 4.0]);
    assert!(w.is_decoded() && copy.is_decoded(), "decoded once, for every handle");
    // The same values as an owned tensor: equal, and the same content hash.
    let owned = graphc_ir::Tensor::from_f32([4], vec![1.5, -2.0, 3.25, 4.0]).unwrap();
    assert_eq!(&owned, w);
    assert_eq!(owned.content_hash(), w.content_hash());
    let other = graphc_ir::Tensor::from_f32([4], vec![1.5, -2.0, 3.25, 4.5]).unwrap();
    assert_ne!(other.content_hash(), w.content_hash());
    let reshaped = owned.clone().reshape([2, 2]).unwrap();
    assert_ne!(
        reshaped.content_hash(),
        owned.content_hash(),
        "the hash covers the shape"
    );
    // A transient copy (what a fold reads) leaves a fresh view undecoded, with the same
    // bytes after its pages are given back.
    let g = import_model(&external_initializer("w.data", "3", "16"), Some(&dir), &opts).unwrap();
    let w = g.weight("w").unwrap();
    let copy = w.detached();
    assert!(!copy.is_mapped() && !w.is_decoded());
    assert_eq!(copy.to_f64_vec(), vec![1.5, -2.0, 3.25, 4.0]);
    assert_eq!(&*w.le_bytes(), &bytes[3..], "the mapping reads the same bytes again");
    // A memoized fold of the same mapped bytes is computed once while its result lives.
    let mut calls = 0;
    let mut fold = |t: &graphc_ir::Tensor| {
        calls += 1;
        Some(t.detached())
    };
    let a = w.memoized_fold("test-copy", &mut fold).unwrap();
    let g2 = import_model(&external_initializer("w.data", "3", "16"), Some(&dir), &opts).unwrap();
    let b = g2.weight("w").unwrap().memoized_fold("test-copy", &mut fold).unwrap();
    assert!(a.shares_data(&b));
    drop((a, b));
    let _ = g2.weight("w").unwrap().memoized_fold("test-copy", &mut fold).unwrap();
    assert_eq!(calls, 2, "computed again once no result was alive");
}

#[test]
fn typed_data_fields_must_match_the_shape() {
    let mut m = add_model();
    let g = m.graph.as_mut().unwrap();
    g.input.truncate(1);
    g.initializer.push(TensorProto {
        dims: vec![3],
        data_type: data_type::FLOAT,
        name: "y".into(),
        float_data: vec![1.0, 2.0],
        ..Default::default()
    });
    assert_eq!(
        err(&m, None, &ImportOptions::default()),
        "initializer `y`: float_data has 2 values; f32 tensor needs 3"
    );
}

#[test]
fn truncated_and_corrupted_files_never_panic() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/onnx/gpt2/model.onnx");
    let bytes = std::fs::read(&path).unwrap();
    let dir = temp_dir("truncated");
    let target = dir.join("model.onnx");
    // External data lives beside the model; mutations of the model must not read past it.
    std::fs::copy(path.with_extension("onnx.data"), dir.join("model.onnx.data")).unwrap();
    let opts = ImportOptions::default();
    let mut rng = graphc_ir::Rng::new(7);
    let mut errors = 0;
    for i in 0..300 {
        let mut b = bytes.clone();
        if i % 2 == 0 {
            b.truncate(rng.below(bytes.len() as u64) as usize);
        } else {
            for _ in 0..4 {
                let at = rng.below(b.len() as u64) as usize;
                b[at] = rng.next_u64() as u8;
            }
        }
        std::fs::write(&target, &b).unwrap();
        if let Err(e) = import_onnx(&target, &opts) {
            assert!(!e.to_string().is_empty());
            errors += 1;
        }
    }
    assert!(errors > 100, "most damaged files must be rejected ({errors})");
    std::fs::write(&target, b"not a protobuf at all").unwrap();
    let e = import_onnx(&target, &opts).unwrap_err().to_string();
    assert!(e.starts_with("not a valid ONNX model"), "{e}");
}
