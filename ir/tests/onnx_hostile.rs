//! Hostile and invalid ONNX models: what the ONNX checker and onnxruntime reject is an
//! error here too, naming the node, attribute, function or opset and the rule; models
//! that expand without bound (nested local functions) fail before lowering anything.

mod common;

use std::collections::HashMap;

use common::{i64_init, int_attr, ints_attr, node, string_attr, value_info};
use graphc_ir::onnx::proto::{
    attribute_type as at, data_type as dt, AttributeProto, FunctionProto, ModelProto, NodeProto, OperatorSetIdProto,
    TensorProto,
};
use graphc_ir::onnx::{import_model, list_unsupported, ImportOptions};
use graphc_ir::work;
use graphc_ir::{interpret, Tensor};
use graphc_testkit::alloc;
use prost::Message;

#[global_allocator]
static ALLOC: alloc::Counting = alloc::Counting;

/// `f`, which must fail fast: at most 10^5 counted steps (`graphc_ir::work`) and 16 MiB
/// asked of the allocator, whatever the model would expand to (a count, unlike a time,
/// does not depend on the machine's load).
fn fast<T>(what: &str, f: impl FnOnce() -> T) -> T {
    let ((out, w), a) = alloc::measure(|| work::measure(f));
    eprintln!("{what}: {w}, {a:?}");
    assert!(w.total() <= 100_000, "{what}: {w}");
    assert!(a.bytes <= 16 << 20, "{what}: {a:?}");
    out
}

/// `x: f32[2,3]` → `nodes` → `z`, at the default-domain `opset`.
fn model(opset: i64, nodes: Vec<NodeProto>) -> ModelProto {
    common::model(opset, nodes, vec![value_info("x", dt::FLOAT, &[2, 3])], vec![], &["z"])
}

fn import_err(m: &ModelProto) -> String {
    match import_model(m, None, &ImportOptions::default()) {
        Ok(_) => panic!("import succeeded"),
        Err(e) => e.to_string(),
    }
}

fn opset(domain: &str, version: i64) -> OperatorSetIdProto {
    OperatorSetIdProto {
        domain: domain.into(),
        version,
    }
}

fn float_attr(name: &str, f: f32) -> AttributeProto {
    AttributeProto {
        name: name.into(),
        r#type: at::FLOAT,
        f,
        ..Default::default()
    }
}

fn in_domain(n: NodeProto, domain: &str) -> NodeProto {
    NodeProto {
        domain: domain.into(),
        ..n
    }
}

/// A local function `local::name` of `inputs` → `outputs`, importing opset 20 and the
/// local domain.
fn function(name: &str, inputs: &[&str], outputs: &[&str], nodes: Vec<NodeProto>) -> FunctionProto {
    FunctionProto {
        name: name.into(),
        domain: "local".into(),
        input: inputs.iter().map(|s| s.to_string()).collect(),
        output: outputs.iter().map(|s| s.to_string()).collect(),
        node: nodes,
        opset_import: vec![opset("", 20), opset("local", 1)],
        ..Default::default()
    }
}

/// A call of `local::name`.
fn call(name: &str, node_name: &str, inputs: &[&str], outputs: &[&str]) -> NodeProto {
    in_domain(node(name, node_name, inputs, outputs, vec![]), "local")
}

/// `model` at opset 20 with the local domain imported and `functions`.
fn with_functions(nodes: Vec<NodeProto>, functions: Vec<FunctionProto>) -> ModelProto {
    let mut m = model(20, nodes);
    m.opset_import.push(opset("local", 1));
    m.functions = functions;
    m
}

fn run(m: &ModelProto, x: &[f32]) -> Vec<f64> {
    let g = import_model(m, None, &ImportOptions::default()).expect("import");
    let x = Tensor::from_f32([2, 3], x.to_vec()).unwrap();
    let out = interpret(&g, &HashMap::from([("x".to_string(), x)])).expect("run");
    out[0].1.to_f64_vec()
}

// ---------------------------------------------------------------------------------
// Local functions

/// `F0 .. F{n-1}`: each calls the next twice in a row; the last applies Relu twice.
fn doubling_chain(n: usize) -> Vec<FunctionProto> {
    doubling_chain_to(
        n,
        vec![
            node("Relu", "r1", &["a"], &["t"], vec![]),
            node("Relu", "r2", &["t"], &["b"], vec![]),
        ],
    )
}

/// `F0 .. F{n-1}`: each calls the next twice in a row; the last is `leaf` (`a` → `b`).
fn doubling_chain_to(n: usize, leaf: Vec<NodeProto>) -> Vec<FunctionProto> {
    let mut fs: Vec<FunctionProto> = (0..n - 1)
        .map(|k| {
            let next = format!("F{}", k + 1);
            let nodes = vec![
                call(&next, "first", &["a"], &["t"]),
                call(&next, "second", &["t"], &["b"]),
            ];
            function(&format!("F{k}"), &["a"], &["b"], nodes)
        })
        .collect();
    fs.push(function(&format!("F{}", n - 1), &["a"], &["b"], leaf));
    fs
}

#[test]
fn nested_functions_called_twice_fail_fast_with_the_expansion() {
    let m = with_functions(vec![call("F0", "top", &["x"], &["z"])], doubling_chain(20));
    let bytes = m.encode_to_vec();
    assert!(bytes.len() < 2500, "a small file: {} bytes", bytes.len());
    let e = fast("nested functions", || import_err(&m));
    assert_eq!(
        e,
        "the model would lower 2097151 ONNX nodes with its local functions inlined, more than graphc's limit of \
         1000000: local function `local::F0` expands to 2097150 nodes at each call (node `top` calls it)"
    );

    // --list-unsupported walks the expansion too: the same bound.
    let dir = std::env::temp_dir().join(format!("graphc-onnx-hostile-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("nested.onnx");
    std::fs::write(&path, &bytes).unwrap();
    let e = fast("--list-unsupported", || {
        list_unsupported(&path).unwrap_err().to_string()
    });
    assert!(e.contains("local function `local::F0` expands to 2097150 nodes"), "{e}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_large_constant_inlined_many_times_fails_fast() {
    // 1 MiB of constant, 512 calls: few nodes, but 512 MiB of copies.
    let value = AttributeProto {
        name: "value".into(),
        r#type: at::TENSOR,
        t: Some(TensorProto {
            dims: vec![1 << 18],
            data_type: dt::FLOAT,
            raw_data: vec![0; 1 << 20],
            ..Default::default()
        }),
        ..Default::default()
    };
    let leaf = vec![
        node("Constant", "big", &[], &["c"], vec![value]),
        node("Identity", "id", &["a"], &["b"], vec![]),
    ];
    let m = with_functions(vec![call("F0", "top", &["x"], &["z"])], doubling_chain_to(10, leaf));
    let e = fast("a large constant inlined", || import_err(&m));
    assert!(
        e.starts_with("inlining the model's local functions would copy 53") && e.contains("bytes of function bodies"),
        "{e}"
    );
    assert!(
        e.contains("more than graphc's limit of 268435456: local function `local::F0` expands to"),
        "{e}"
    );
}

#[test]
fn a_few_nested_functions_import() {
    // F0 calls F1 twice (the same inner names, scoped per call), F1 calls F2 twice, F2
    // is two Relus.
    let m = with_functions(vec![call("F0", "top", &["x"], &["z"])], doubling_chain(3));
    assert_eq!(
        run(&m, &[-1.0, 2.0, -3.0, 4.0, 0.5, -0.5]),
        [0.0, 2.0, 0.0, 4.0, 0.5, 0.0]
    );

    // A function attribute passed down (`ref_attr_name`), with a default; the functions'
    // own opset imports (at 12 and 11 ReduceSum is ReduceSum-11, which takes `axes` as
    // an attribute).
    let alpha = AttributeProto {
        name: "alpha".into(),
        r#type: at::FLOAT,
        ref_attr_name: "slope".into(),
        ..Default::default()
    };
    let mut leaky = function(
        "Leaky",
        &["a"],
        &["b"],
        vec![node("LeakyRelu", "lr", &["a"], &["b"], vec![alpha])],
    );
    leaky.attribute_proto = vec![float_attr("slope", 0.5)];
    let mut sum = function(
        "RowSum",
        &["a"],
        &["b"],
        vec![node(
            "ReduceSum",
            "rs",
            &["a"],
            &["b"],
            vec![ints_attr("axes", &[1]), int_attr("keepdims", 0)],
        )],
    );
    leaky.opset_import = vec![opset("", 11)];
    sum.opset_import = vec![opset("", 12)];
    let mut scaled = call("Leaky", "scaled", &["x"], &["s"]);
    scaled.attribute.push(float_attr("slope", 0.25));
    let mut m = with_functions(
        vec![
            scaled,
            call("Leaky", "halved", &["s"], &["h"]),
            call("RowSum", "rows", &["h"], &["z"]),
        ],
        vec![leaky, sum],
    );
    m.opset_import[0].version = 11;
    // 0.25 then 0.5 on negatives: [-8 * 0.125, 2, 4] and [1, -16 * 0.125, 3].
    let got = run(&m, &[-8.0, 2.0, 4.0, 1.0, -16.0, 3.0]);
    assert_eq!(got, [5.0, 2.0]);
}

#[test]
fn recursive_functions_are_errors() {
    let me = function("F", &["a"], &["b"], vec![call("F", "again", &["a"], &["b"])]);
    let m = with_functions(vec![call("F", "top", &["x"], &["z"])], vec![me]);
    assert_eq!(
        import_err(&m),
        "local function `local::F` calls itself (local::F -> local::F); recursive functions cannot be inlined"
    );

    // Through another, and fanning out: found before any work.
    let f = function(
        "F",
        &["a"],
        &["b"],
        vec![call("G", "g1", &["a"], &["t"]), call("G", "g2", &["t"], &["b"])],
    );
    let g = function(
        "G",
        &["a"],
        &["b"],
        vec![call("F", "f1", &["a"], &["t"]), call("F", "f2", &["t"], &["b"])],
    );
    let m = with_functions(vec![call("F", "top", &["x"], &["z"])], vec![f, g]);
    assert_eq!(
        fast("recursive functions", || import_err(&m)),
        "local function `local::F` calls itself (local::F -> local::G -> local::F); recursive functions cannot be \
         inlined"
    );
}

#[test]
fn deeply_nested_functions_are_errors() {
    let chain: Vec<FunctionProto> = (0..40)
        .map(|k| {
            let body = if k < 39 {
                call(&format!("F{}", k + 1), "next", &["a"], &["b"])
            } else {
                node("Relu", "r", &["a"], &["b"], vec![])
            };
            function(&format!("F{k}"), &["a"], &["b"], vec![body])
        })
        .collect();
    let m = with_functions(vec![call("F0", "top", &["x"], &["z"])], chain);
    assert_eq!(
        import_err(&m),
        "local function `local::F0` (called by node `top`) nests function calls 40 deep; graphc inlines at most 32 \
         levels"
    );
}

#[test]
fn local_functions_must_be_well_formed() {
    let relu = || function("F", &["a"], &["b"], vec![node("Relu", "r", &["a"], &["b"], vec![])]);
    let m = with_functions(vec![call("F", "top", &["x"], &["z"])], vec![relu(), relu()]);
    assert_eq!(
        import_err(&m),
        "the model defines the local function `local::F` more than once"
    );

    let mut f = relu();
    f.opset_import.push(opset("ai.onnx", 19));
    let m = with_functions(vec![call("F", "top", &["x"], &["z"])], vec![f]);
    assert_eq!(
        import_err(&m),
        "local function `local::F`: opset import of the default domain (ai.onnx): the domain is imported more than \
         once (versions 20 and 19)"
    );

    // A function's opsets must agree with the model's for the ops it uses.
    let mut old = function(
        "F",
        &["a"],
        &["b"],
        vec![node("ReduceSum", "rs", &["a"], &["b"], vec![ints_attr("axes", &[1])])],
    );
    old.opset_import = vec![opset("", 11)];
    let m = with_functions(vec![call("F", "top", &["x"], &["z"])], vec![old]);
    assert_eq!(
        import_err(&m),
        "node `rs` (ReduceSum, opset 11): local function `local::F` imports the default domain at opset 11, where \
         ReduceSum is version 11, but the model imports opset 20, where it is version 13; a function's ops must be \
         the versions of the model's opsets"
    );
    let mut f = relu();
    f.opset_import = vec![opset("", 18)]; // Relu-14 at 18 and 20
    let m = with_functions(vec![call("F", "top", &["x"], &["z"])], vec![f]);
    assert_eq!(
        run(&m, &[-1.0, 1.0, -2.0, 2.0, 0.0, 3.0]),
        [0.0, 1.0, 0.0, 2.0, 0.0, 3.0]
    );

    // A function imports the domains of its nodes.
    let mut f = function("F", &["a"], &["b"], vec![call("G", "g", &["a"], &["b"])]);
    f.opset_import.truncate(1);
    let g = function("G", &["a"], &["b"], vec![node("Relu", "r", &["a"], &["b"], vec![])]);
    let m = with_functions(vec![call("F", "top", &["x"], &["z"])], vec![f, g]);
    assert_eq!(
        import_err(&m),
        "node `g` (G in domain local, opset 1): local function `local::F` does not import an opset of domain \
         `local` (a function's opset imports cover the domains of its nodes)"
    );

    let missing = function("F", &["a"], &["b"], vec![node("Relu", "r", &["a"], &["c"], vec![])]);
    let m = with_functions(vec![call("F", "top", &["x"], &["z"])], vec![missing]);
    assert_eq!(
        import_err(&m),
        "node `top` (F in domain local, opset 1): local function `local::F` does not produce its output `b`"
    );
}

// ---------------------------------------------------------------------------------
// Single assignment

#[test]
fn two_nodes_writing_one_value() {
    let m = model(
        20,
        vec![
            node("Relu", "a", &["x"], &["z"], vec![]),
            node("Neg", "b", &["x"], &["z"], vec![]),
        ],
    );
    assert_eq!(
        import_err(&m),
        "node `b` (Neg, opset 20): output `z` is already written by node `a` in the graph (each value must be \
         assigned exactly once)"
    );
}

#[test]
fn a_node_writing_a_graph_input_or_an_initializer() {
    let m = model(
        20,
        vec![
            node("Relu", "over_x", &["x"], &["x"], vec![]),
            node("Neg", "n", &["x"], &["z"], vec![]),
        ],
    );
    assert_eq!(
        import_err(&m),
        "node `over_x` (Relu, opset 20): output `x` is an input in the graph (each value must be assigned exactly \
         once)"
    );

    let mut m = model(
        20,
        vec![
            node("Relu", "over_w", &["x"], &["w"], vec![]),
            node("Add", "n", &["x", "w"], &["z"], vec![]),
        ],
    );
    m.graph.as_mut().unwrap().initializer.push(i64_init("w", &[1], &[1]));
    assert_eq!(
        import_err(&m),
        "node `over_w` (Relu, opset 20): output `w` is an initializer in the graph (each value must be assigned \
         exactly once)"
    );

    // Listed twice.
    let mut m = model(20, vec![node("Relu", "r", &["x"], &["z"], vec![])]);
    let g = m.graph.as_mut().unwrap();
    g.input.push(value_info("x", dt::FLOAT, &[3]));
    assert_eq!(import_err(&m), "the graph: input `x` is listed twice");
    let mut m = model(20, vec![node("Relu", "r", &["x"], &["z"], vec![])]);
    let g = m.graph.as_mut().unwrap();
    g.initializer = vec![i64_init("w", &[1], &[1]), i64_init("w", &[1], &[2])];
    assert_eq!(import_err(&m), "the graph: initializer `w` is defined twice");

    // An initializer that is also listed as an input (IR version < 4) is one value.
    let mut m = model(20, vec![node("Add", "a", &["x", "w"], &["z"], vec![])]);
    let g = m.graph.as_mut().unwrap();
    g.initializer.push(TensorProto {
        name: "w".into(),
        dims: vec![3],
        data_type: dt::FLOAT,
        float_data: vec![1.0, 2.0, 3.0],
        ..Default::default()
    });
    g.input.push(value_info("w", dt::FLOAT, &[3]));
    assert_eq!(run(&m, &[0.0; 6]), [1.0, 2.0, 3.0, 1.0, 2.0, 3.0]);
}

#[test]
fn function_bodies_assign_once() {
    let twice = function(
        "F",
        &["a"],
        &["b"],
        vec![
            node("Relu", "r1", &["a"], &["c"], vec![]),
            node("Neg", "r2", &["a"], &["c"], vec![]),
            node("Relu", "r3", &["c"], &["b"], vec![]),
        ],
    );
    let m = with_functions(vec![call("F", "top", &["x"], &["z"])], vec![twice]);
    assert_eq!(
        import_err(&m),
        "node `r2` (Neg, opset 20): output `c` is already written by node `r1` in local function `local::F` (each \
         value must be assigned exactly once)"
    );

    let over_input = function(
        "F",
        &["a"],
        &["b"],
        vec![
            node("Relu", "r1", &["a"], &["a"], vec![]),
            node("Relu", "r2", &["a"], &["b"], vec![]),
        ],
    );
    let m = with_functions(vec![call("F", "top", &["x"], &["z"])], vec![over_input]);
    assert_eq!(
        import_err(&m),
        "node `r1` (Relu, opset 20): output `a` is an input in local function `local::F` (each value must be \
         assigned exactly once)"
    );

    // Two calls writing the same value: the graph's rule.
    let relu = function("F", &["a"], &["b"], vec![node("Relu", "r", &["a"], &["b"], vec![])]);
    let m = with_functions(
        vec![call("F", "c1", &["x"], &["z"]), call("F", "c2", &["x"], &["z"])],
        vec![relu],
    );
    assert!(
        import_err(&m)
            .starts_with("node `c2` (F in domain local, opset 1): output `z` is already written by node `c1`"),
        "{}",
        import_err(&m)
    );
}

// ---------------------------------------------------------------------------------
// Opset imports

#[test]
fn default_opset_versions_out_of_range() {
    let relu = || vec![node("Relu", "r", &["x"], &["z"], vec![])];
    for v in [0, -1] {
        assert_eq!(
            import_err(&model(v, relu())),
            format!(
                "the model: opset import of the default domain (ai.onnx): version {v} is not valid (versions start at 1)"
            )
        );
    }
    for v in [1i64 << 62, 28] {
        assert_eq!(
            import_err(&model(v, relu())),
            format!(
                "the model: opset import of the default domain (ai.onnx): version {v} is outside the opsets graphc \
                 supports (1 to 27)"
            )
        );
    }
    let mut m = model(20, relu());
    m.opset_import.push(opset("com.example", 0));
    assert_eq!(
        import_err(&m),
        "the model: opset import of domain `com.example`: version 0 is not valid (versions start at 1)"
    );
}

#[test]
fn default_domain_nodes_need_a_default_opset() {
    let mut m = model(20, vec![node("Relu", "r", &["x"], &["z"], vec![])]);
    m.opset_import = vec![opset("com.example", 1)];
    assert_eq!(
        import_err(&m),
        "node `r` (Relu, opset 0): the model imports no opset for the default domain (ai.onnx), so the version of \
         its ops is unknown"
    );
}

#[test]
fn duplicate_opset_imports() {
    let mut m = model(20, vec![node("Relu", "r", &["x"], &["z"], vec![])]);
    m.opset_import.push(opset("ai.onnx", 19));
    assert_eq!(
        import_err(&m),
        "the model: opset import of the default domain (ai.onnx): the domain is imported more than once (versions \
         20 and 19)"
    );
    let mut m = model(20, vec![node("Relu", "r", &["x"], &["z"], vec![])]);
    m.opset_import
        .extend([opset("com.example", 1), opset("com.example", 1)]);
    assert!(import_err(&m).contains("domain `com.example`: the domain is imported more than once"));
}

#[test]
fn ops_below_their_first_opset() {
    let m = model(19, vec![node("Gelu", "g", &["x"], &["z"], vec![])]);
    assert_eq!(
        import_err(&m),
        "node `g` (Gelu, opset 19): Gelu is not defined before opset 20; the node is at opset 19"
    );
    let m = model(6, vec![node("Add", "a", &["x", "x"], &["z"], vec![])]);
    assert_eq!(
        import_err(&m),
        "node `a` (Add, opset 6): graphc lowers Add from opset 7 (before opset 7 it broadcast through the \
         `broadcast` and `axis` attributes); the node is at opset 6"
    );
    // The oldest opset: Not-1 is today's Not.
    let mut m = model(1, vec![node("Not", "n", &["b"], &["z"], vec![])]);
    m.graph.as_mut().unwrap().input = vec![value_info("b", dt::BOOL, &[2])];
    import_model(&m, None, &ImportOptions::default()).expect("Not at opset 1");
}

// ---------------------------------------------------------------------------------
// Attributes

fn leaky(attrs: Vec<AttributeProto>) -> ModelProto {
    model(20, vec![node("LeakyRelu", "lr", &["x"], &["z"], attrs)])
}

#[test]
fn duplicate_attribute_names() {
    assert_eq!(
        import_err(&leaky(vec![float_attr("alpha", 0.1), float_attr("alpha", 0.2)])),
        "node `lr` (LeakyRelu, opset 20): attribute `alpha` appears more than once"
    );
}

#[test]
fn undefined_attribute_type() {
    let a = AttributeProto {
        r#type: 0,
        ..float_attr("alpha", 0.1)
    };
    assert_eq!(
        import_err(&leaky(vec![a])),
        "node `lr` (LeakyRelu, opset 20): attribute `alpha` has type UNDEFINED (0); its type must be set"
    );
    let a = AttributeProto {
        r#type: 99,
        ..float_attr("alpha", 0.1)
    };
    assert_eq!(
        import_err(&leaky(vec![a])),
        "node `lr` (LeakyRelu, opset 20): attribute `alpha` has an unknown type 99"
    );
}

#[test]
fn attribute_type_must_match_the_field_set() {
    let a = AttributeProto {
        r#type: at::INT,
        ..float_attr("alpha", 0.1)
    };
    assert_eq!(
        import_err(&leaky(vec![a])),
        "node `lr` (LeakyRelu, opset 20): attribute `alpha` is declared INT (type 2) but sets the field `f` of a \
         FLOAT attribute"
    );
    // Two value fields.
    let a = AttributeProto {
        i: 3,
        ..float_attr("alpha", 0.1)
    };
    assert!(import_err(&leaky(vec![a])).contains("declared FLOAT (type 1) but sets the field `i` of a INT attribute"));
    // A tensor attribute without its tensor.
    let value = AttributeProto {
        name: "value".into(),
        r#type: at::TENSOR,
        ..Default::default()
    };
    let m = model(20, vec![node("Constant", "c", &[], &["z"], vec![value])]);
    assert_eq!(
        import_err(&m),
        "node `c` (Constant, opset 20): attribute `value` is declared TENSOR but has no value (its field `t` is unset)"
    );
    // A reference to a function attribute outside a function.
    let a = AttributeProto {
        ref_attr_name: "slope".into(),
        ..float_attr("alpha", 0.1)
    };
    assert_eq!(
        import_err(&leaky(vec![a])),
        "node `lr` (LeakyRelu, opset 20): attribute `alpha` refers to the function attribute `slope`, but the node \
         is not in a function body"
    );
}

#[test]
fn constant_has_exactly_one_value() {
    let two = model(
        20,
        vec![node(
            "Constant",
            "c",
            &[],
            &["z"],
            vec![float_attr("value_float", 1.0), int_attr("value_int", 2)],
        )],
    );
    assert_eq!(
        import_err(&two),
        "node `c` (Constant, opset 20): a Constant has exactly one of the attributes value, value_float, \
         value_floats, value_int, value_ints, value_string, value_strings, sparse_value; this one has 2 \
         (value_float, value_int)"
    );
    let none = model(20, vec![node("Constant", "c", &[], &["z"], vec![])]);
    assert!(import_err(&none).ends_with("this one has 0"), "{}", import_err(&none));
}

#[test]
fn axes_as_an_attribute_where_the_opset_takes_an_operand() {
    let cases = [
        ("ReduceSum", 13, "from opset 13 `axes` is operand 1"),
        ("ReduceMean", 18, "from opset 18 `axes` is operand 1"),
        ("ReduceMax", 20, "from opset 18 `axes` is operand 1"),
        ("Squeeze", 13, "from opset 13 `axes` is operand 1"),
        ("Unsqueeze", 21, "from opset 13 `axes` is operand 1"),
    ];
    for (op, opset, rule) in cases {
        let m = model(
            opset,
            vec![node(op, "n", &["x"], &["z"], vec![ints_attr("axes", &[0])])],
        );
        assert_eq!(
            import_err(&m),
            format!(
                "node `n` ({op}, opset {opset}): attribute `axes` is not an attribute of {op} at opset {opset}: {rule}"
            )
        );
    }
    // The other way round: an operand the opset does not have.
    let m = common::model(
        11,
        vec![node("ReduceSum", "n", &["x", "axes"], &["z"], vec![])],
        vec![value_info("x", dt::FLOAT, &[2, 3])],
        vec![i64_init("axes", &[1], &[0])],
        &["z"],
    );
    assert_eq!(
        import_err(&m),
        "node `n` (ReduceSum, opset 11): ReduceSum has no operand 1 at opset 11: before opset 13 `axes` is an \
         attribute"
    );
    let m = model(
        13,
        vec![node("Split", "n", &["x"], &["z"], vec![ints_attr("split", &[1, 1])])],
    );
    assert!(import_err(&m).contains("from opset 13 `split` is operand 1"));
}

#[test]
fn transpose_perm_must_be_a_permutation() {
    let t = |perm: &[i64]| {
        model(
            20,
            vec![node("Transpose", "t", &["x"], &["z"], vec![ints_attr("perm", perm)])],
        )
    };
    assert_eq!(
        import_err(&t(&[-1, 0])),
        "node `t` (Transpose, opset 20): perm [-1, 0] has the entry -1, which is not an axis 0 to 1 of the rank-2 \
         operand"
    );
    assert_eq!(
        import_err(&t(&[0, 0])),
        "node `t` (Transpose, opset 20): perm [0, 0] repeats the axis 0; it must be a permutation of 0..2"
    );
    assert_eq!(
        import_err(&t(&[1])),
        "node `t` (Transpose, opset 20): perm [1] has 1 entries; it must be a permutation of the 2 axes"
    );
    assert_eq!(
        run(&t(&[1, 0]), &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]),
        [1.0, 4.0, 2.0, 5.0, 3.0, 6.0]
    );
}

// ---------------------------------------------------------------------------------
// Operand shapes, attribute lists and axes, as the file gives them

/// `model` with the i64 initializers `inits`.
fn model_with(opset: i64, nodes: Vec<NodeProto>, inits: Vec<TensorProto>) -> ModelProto {
    common::model(opset, nodes, vec![value_info("x", dt::FLOAT, &[2, 3])], inits, &["z"])
}

/// Conv `c` of `x: f32[1,2,4,4]` by `w: f32[w_dims]`, with `attrs`.
fn conv(w_dims: &[i64], attrs: Vec<AttributeProto>) -> ModelProto {
    let inputs = vec![
        value_info("x", dt::FLOAT, &[1, 2, 4, 4]),
        value_info("w", dt::FLOAT, w_dims),
    ];
    common::model(
        20,
        vec![node("Conv", "c", &["x", "w"], &["z"], attrs)],
        inputs,
        vec![],
        &["z"],
    )
}

#[test]
fn conv_attribute_lists_and_extents_are_checked() {
    let e = |attrs: Vec<AttributeProto>| import_err(&conv(&[2, 2, 3, 3], attrs));
    assert_eq!(
        e(vec![ints_attr("pads", &[1, 1])]),
        "node `c` (Conv, opset 20): Conv `pads` has 2 values, expected 4"
    );
    assert_eq!(
        e(vec![ints_attr("strides", &[1])]),
        "node `c` (Conv, opset 20): Conv `strides` has 1 values, expected 2"
    );
    assert_eq!(
        e(vec![ints_attr("kernel_shape", &[3])]),
        "node `c` (Conv, opset 20): Conv kernel_shape [3] differs from the weights f32[2,2,3,3]"
    );
    // Dilations, pads and strides of any i64 overflowed the i64 arithmetic (a panic).
    assert_eq!(
        e(vec![ints_attr("dilations", &[i64::MAX, 1])]),
        "node `c` (Conv, opset 20): Conv kernel (extent 18446744073709551615) is larger than the padded input (4) on \
         axis 2"
    );
    assert_eq!(
        e(vec![ints_attr("pads", &[i64::MAX, 0, i64::MAX, 0])]),
        "node `c` (Conv, opset 20): Conv padded input extent 18446744073709551618 of axis 2 is too large"
    );
    assert_eq!(
        e(vec![ints_attr("pads", &[i64::MIN, 0, i64::MIN, 0])]),
        "node `c` (Conv, opset 20): Conv kernel (extent 3) is larger than the padded input (-18446744073709551612) \
         on axis 2"
    );
    assert_eq!(
        e(vec![
            string_attr("auto_pad", "SAME_LOWER"),
            ints_attr("dilations", &[i64::MAX, 1])
        ]),
        "node `c` (Conv, opset 20): Conv padded input extent 18446744073709551618 of axis 2 is too large"
    );
    assert_eq!(
        e(vec![ints_attr("pads", &[1 << 40, 1 << 40, 1 << 40, 1 << 40])]),
        "node `c` (Conv, opset 20): Conv padded input [1,2,2199023255556,2199023255556] is too large (more than \
         72057594037927936 elements)"
    );
    assert_eq!(
        import_err(&conv(&[2, 2, 0, 3], vec![])),
        "node `c` (Conv, opset 20): Conv weights f32[2,2,0,3] have an empty kernel"
    );
    assert_eq!(
        import_err(&conv(&[2, 2, 3], vec![])),
        "node `c` (Conv, opset 20): Conv needs input [N, C, spatial...] and weights of the same rank, got \
         f32[1,2,4,4] and f32[2,2,3]"
    );
    // Huge strides are fine: one output position per axis.
    let m = conv(
        &[2, 2, 3, 3],
        vec![
            string_attr("auto_pad", "SAME_UPPER"),
            ints_attr("strides", &[i64::MAX, i64::MAX]),
        ],
    );
    let g = import_model(&m, None, &ImportOptions::default()).expect("import");
    assert_eq!(g.node(g.outputs()[0].node).ty.to_string(), "f32[1,2,1,1]");
}

#[test]
fn wrap_pads_of_any_i64_are_errors() {
    let pad = |pads: &[i64]| {
        model_with(
            20,
            vec![node(
                "Pad",
                "p",
                &["x", "pads"],
                &["z"],
                vec![string_attr("mode", "wrap")],
            )],
            vec![i64_init("pads", &[pads.len() as i64], pads)],
        )
    };
    // `-lo` and `lo + d - 1` overflowed (a panic).
    assert_eq!(
        import_err(&pad(&[i64::MIN, 0, 0, 0])),
        "node `p` (Pad, opset 20): pads (-9223372036854775808, 0) crop more than the extent 2 of axis 0"
    );
    assert_eq!(
        import_err(&pad(&[i64::MAX, 0, 0, 0])),
        "node `p` (Pad, opset 20): wrap pads (9223372036854775807, 0) of axis 0 are too large"
    );
    assert_eq!(
        import_err(&pad(&[0, i64::MAX, 0, i64::MAX])),
        "node `p` (Pad, opset 20): wrap pads (9223372036854775807, 9223372036854775807) of axis 1 are too large"
    );
    assert_eq!(
        import_err(&pad(&[1, 1])),
        "node `p` (Pad, opset 20): pads [1, 1] must have 2 entries per padded axis (2 axes)"
    );
}

#[test]
fn slice_bounds_of_different_lengths_are_errors() {
    let slice = |starts: &[i64], ends: &[i64]| {
        model_with(
            20,
            vec![node("Slice", "s", &["x", "starts", "ends"], &["z"], vec![])],
            vec![
                i64_init("starts", &[starts.len() as i64], starts),
                i64_init("ends", &[ends.len() as i64], ends),
            ],
        )
    };
    assert_eq!(
        import_err(&slice(&[0, 0], &[1])),
        "node `s` (Slice, opset 20): starts [0, 0], ends [1], axes [0, 1] and steps [1, 1] differ in length"
    );
    assert_eq!(
        import_err(&slice(&[0, 0, 0], &[1, 1, 1])),
        "node `s` (Slice, opset 20): axis 2 is out of range for rank 2 (valid: -2..2)"
    );
    let m = model(
        9,
        vec![node(
            "Slice",
            "s",
            &["x"],
            &["z"],
            vec![ints_attr("starts", &[0]), ints_attr("ends", &[1, 2])],
        )],
    );
    assert_eq!(
        import_err(&m),
        "node `s` (Slice, opset 9): starts [0], ends [1, 2], axes [0] and steps [1] differ in length"
    );
}

#[test]
fn gather_concat_and_gather_nd_axes_are_checked() {
    let gather = |op: &str, axis: i64, idx: TensorProto| {
        model_with(
            20,
            vec![node(op, "g", &["x", "i"], &["z"], vec![int_attr("axis", axis)])],
            vec![idx],
        )
    };
    assert_eq!(
        import_err(&gather("Gather", 2, i64_init("i", &[1], &[0]))),
        "node `g` (Gather, opset 20): axis 2 is out of range for rank 2 (valid: -2..2)"
    );
    assert_eq!(
        import_err(&gather("Gather", i64::MIN, i64_init("i", &[1], &[0]))),
        "node `g` (Gather, opset 20): axis -9223372036854775808 is out of range for rank 2 (valid: -2..2)"
    );
    assert_eq!(
        import_err(&gather("GatherElements", 1, i64_init("i", &[3, 1], &[0, 0, 0]))),
        "node `g` (GatherElements, opset 20): indices of shape [3,1] do not fit data of shape [2,3] (axis 1)"
    );
    let concat = |axis: i64| {
        model(
            20,
            vec![node("Concat", "c", &["x", "x"], &["z"], vec![int_attr("axis", axis)])],
        )
    };
    assert_eq!(
        import_err(&concat(3)),
        "node `c` (Concat, opset 20): axis 3 is out of range for rank 2 (valid: -2..2)"
    );
    assert_eq!(
        import_err(&concat(-3)),
        "node `c` (Concat, opset 20): axis -3 is out of range for rank 2 (valid: -2..2)"
    );
    let gather_nd = |dims: &[i64], v: &[i64], batch_dims: i64| {
        model_with(
            20,
            vec![node(
                "GatherND",
                "g",
                &["x", "i"],
                &["z"],
                vec![int_attr("batch_dims", batch_dims)],
            )],
            vec![i64_init("i", dims, v)],
        )
    };
    assert_eq!(
        import_err(&gather_nd(&[], &[0], 0)),
        "node `g` (GatherND, opset 20): GatherND batch_dims 0 does not fit data f32[2,3] and indices i64[]"
    );
    assert_eq!(
        import_err(&gather_nd(&[2, 1], &[0, 0], 5)),
        "node `g` (GatherND, opset 20): GatherND batch_dims 5 does not fit data f32[2,3] and indices i64[2,1]"
    );
    assert_eq!(
        import_err(&gather_nd(&[1, 5], &[0; 5], 0)),
        "node `g` (GatherND, opset 20): GatherND indices address 5 axes past the batch, data f32[2,3] has fewer"
    );
}

#[test]
fn a_large_conv_kernel_is_one_node() {
    // A declared 200x200 kernel was 40000 slices when Conv was lowered by im2col; it is
    // one convolution node now, imported at once.
    let model = conv(&[1, 2, 200, 200], vec![ints_attr("pads", &[100, 100, 100, 100])]);
    let g = fast("a 200x200 conv kernel", || {
        import_model(&model, None, &ImportOptions::default()).unwrap()
    });
    let convs = g
        .nodes()
        .iter()
        .filter(|n| matches!(n.op, graphc_ir::Op::Conv { .. }))
        .count();
    assert_eq!(convs, 1);
    assert!(g.len() < 10, "{} nodes", g.len());
}
