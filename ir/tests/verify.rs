//! The verifier on malformed graphs: every error names the node and the rule, and
//! nothing panics.

use graphc_ir::{BinaryOp, DType, Graph, GraphError, Node, NodeId, Op, Tensor, TensorType, UnaryOp};

fn f32_ty(shape: &[usize]) -> TensorType {
    TensorType::new(DType::F32, shape.to_vec())
}

fn input(name: &str, shape: &[usize]) -> Node {
    Node {
        op: Op::Input {
            name: name.into(),
            ty: f32_ty(shape),
        },
        inputs: vec![],
        ty: f32_ty(shape),
        name: None,
    }
}

fn node(op: Op, inputs: &[u32], ty: TensorType) -> Node {
    Node {
        op,
        inputs: inputs.iter().map(|&i| NodeId(i)).collect(),
        ty,
        name: Some("n".into()),
    }
}

fn err(g: &Graph) -> String {
    g.verify().expect_err("must not verify").to_string()
}

#[test]
fn valid_graph_verifies() {
    let mut g = Graph::new();
    let x = g.push(input("x", &[2]));
    let y = g.add(Op::Unary(UnaryOp::Exp), vec![x], None).unwrap();
    g.add_output("y", y);
    g.verify().unwrap();
}

#[test]
fn dangling_operand() {
    let mut g = Graph::new();
    g.push(input("x", &[2]));
    g.push(node(Op::Unary(UnaryOp::Exp), &[7], f32_ty(&[2])));
    assert_eq!(err(&g), "node %1 (exp \"n\"): operand %7 does not exist");
}

#[test]
fn cycle_is_named() {
    let mut g = Graph::new();
    g.push(input("x", &[2]));
    g.push(node(Op::Binary(BinaryOp::Add), &[0, 2], f32_ty(&[2])));
    g.push(node(Op::Unary(UnaryOp::Exp), &[1], f32_ty(&[2])));
    let e = err(&g);
    assert!(e.contains("is on a cycle"), "{e}");
    assert!(e.starts_with("node %1") || e.starts_with("node %2"), "{e}");
}

#[test]
fn declared_type_must_match_inference() {
    let mut g = Graph::new();
    g.push(input("x", &[2, 3]));
    g.push(node(
        Op::Reduce {
            op: graphc_ir::ReduceOp::Sum,
            axes: vec![1],
            keepdims: false,
        },
        &[0],
        f32_ty(&[3]),
    ));
    assert_eq!(
        err(&g),
        "node %1 (reduce_sum \"n\"): declared type f32[3] but the op gives f32[2]"
    );
}

#[test]
fn operand_types_must_fit_the_op() {
    let mut g = Graph::new();
    g.push(input("x", &[2]));
    g.push(input("y", &[3]));
    g.push(node(Op::Binary(BinaryOp::Mul), &[0, 1], f32_ty(&[2])));
    assert!(err(&g).contains("node %2 (mul \"n\"): mul needs operands of one type"));

    let mut g = Graph::new();
    g.push(input("x", &[2]));
    g.push(node(Op::Unary(UnaryOp::Not), &[0], f32_ty(&[2])));
    assert_eq!(err(&g), "node %1 (not \"n\"): not does not accept f32");

    let mut g = Graph::new();
    g.push(input("x", &[2]));
    g.push(node(Op::Binary(BinaryOp::Add), &[0], f32_ty(&[2])));
    assert_eq!(err(&g), "node %1 (add \"n\"): add takes 2 operand(s), got 1");
}

#[test]
fn bindings_are_unique_and_typed() {
    let mut g = Graph::new();
    g.push(input("x", &[2]));
    g.push(input("x", &[2]));
    assert_eq!(err(&g), "node %1 (input): input name \"x\" is used twice");

    let mut g = Graph::new();
    g.add_parameter("w", Tensor::zeros(&f32_ty(&[2])));
    g.set_weight("w", Tensor::zeros(&f32_ty(&[3])));
    assert_eq!(
        err(&g),
        "node %0 (param): weight data \"w\" is f32[3] but the parameter is f32[2]"
    );

    let mut g = Graph::new();
    g.set_weight("orphan", Tensor::zeros(&f32_ty(&[3])));
    assert_eq!(err(&g), "weight \"orphan\" has no parameter node");

    let mut g = Graph::new();
    let x = g.push(input("x", &[2]));
    g.add_output("y", x);
    g.add_output("y", x);
    assert_eq!(err(&g), "output name \"y\" is used twice");

    let mut g = Graph::new();
    g.add_output("y", NodeId(4));
    assert_eq!(err(&g), "output \"y\" names %4, which does not exist");
}

#[test]
fn graph_add_rejects_bad_nodes_without_adding_them() {
    let mut g = Graph::new();
    let x = g.push(input("x", &[2, 3]));
    let e = g
        .add(Op::Transpose { perm: vec![0, 0] }, vec![x], Some("t".into()))
        .unwrap_err();
    assert_eq!(
        e.to_string(),
        "node %1 (transpose \"t\"): transpose perm [0, 0] is not a permutation of 2 axes"
    );
    assert!(matches!(e, GraphError::Node { .. }));
    assert_eq!(g.len(), 1);
    let e = g.add(Op::Unary(UnaryOp::Exp), vec![NodeId(9)], None).unwrap_err();
    assert!(e.to_string().contains("operand %9 does not exist"));
}

#[test]
fn malformed_json_is_an_error() {
    for text in [
        "",
        "{",
        "{\"nodes\": 3}",
        "[1,2]",
        "{\"nodes\":[],\"inputs\":[5],\"outputs\":[],\"weights\":{}}",
    ] {
        assert!(Graph::from_json(text).is_err(), "{text}");
    }
}

#[test]
fn type_rules_of_every_op_family() {
    use graphc_ir::{infer_type, PadMode, Shape, SliceRange};
    let t = |d: DType, s: &[usize]| TensorType::new(d, s.to_vec());
    let x = t(DType::F32, &[2, 3, 4]);
    let ok = |op: Op, args: &[&TensorType]| infer_type(&op, args).unwrap().to_string();
    let bad = |op: Op, args: &[&TensorType]| infer_type(&op, args).unwrap_err();
    assert_eq!(
        ok(Op::MatMul, &[&t(DType::F32, &[5, 1, 2, 3]), &t(DType::F32, &[4, 3, 7])]),
        "f32[5,4,2,7]"
    );
    assert!(bad(Op::MatMul, &[&t(DType::F32, &[2, 2, 3]), &t(DType::F32, &[3, 3, 7])]).contains("batch dims"));
    assert_eq!(
        ok(Op::Gather { axis: 1 }, &[&x, &t(DType::I64, &[5, 6])]),
        "f32[2,5,6,4]"
    );
    assert!(bad(Op::Gather { axis: 1 }, &[&x, &t(DType::F32, &[5])]).contains("i64 or i32"));
    let r = |start, end, step| SliceRange { start, end, step };
    assert_eq!(
        ok(
            Op::Slice {
                ranges: vec![r(0, 2, 1), r(-1, -4, -1), r(1, 100, 2)]
            },
            &[&x]
        ),
        "f32[2,3,2]"
    );
    assert!(bad(
        Op::Slice {
            ranges: vec![r(0, 2, 0), r(0, 1, 1), r(0, 1, 1)]
        },
        &[&x]
    )
    .contains("step of axis 0 is 0"));
    assert_eq!(
        ok(Op::Concat { axis: 2 }, &[&x, &t(DType::F32, &[2, 3, 1])]),
        "f32[2,3,5]"
    );
    assert!(bad(Op::Concat { axis: 2 }, &[&x, &t(DType::F32, &[2, 2, 1])]).contains("concat"));
    let pad = |pads: Vec<(i64, i64)>, mode| Op::Pad { pads, mode, value: 0.0 };
    assert_eq!(
        ok(pad(vec![(1, 1), (0, -1), (2, 0)], PadMode::Constant), &[&x]),
        "f32[4,2,6]"
    );
    assert!(bad(pad(vec![(0, 0), (3, 0), (0, 0)], PadMode::Reflect), &[&x]).contains("smaller than its extent"));
    assert!(bad(
        Op::Broadcast {
            shape: Shape::new([3, 3, 4])
        },
        &[&x]
    )
    .contains("does not broadcast"));
    assert_eq!(
        ok(
            Op::Broadcast {
                shape: Shape::new([5, 2, 3, 4])
            },
            &[&x]
        ),
        "f32[5,2,3,4]"
    );
    assert!(bad(Op::Reshape { shape: Shape::new([5]) }, &[&x]).contains("24 elements"));
    assert_eq!(ok(Op::Cast { to: DType::BF16 }, &[&x]), "bf16[2,3,4]");
    let cmp = Op::Binary(BinaryOp::Lt);
    assert_eq!(ok(cmp, &[&x, &x]), "bool[2,3,4]");
    let b = t(DType::Bool, &[2, 3, 4]);
    assert_eq!(ok(Op::Select, &[&b, &x, &x]), "f32[2,3,4]");
    assert!(bad(Op::Select, &[&x, &x, &x]).contains("bool condition"));
    assert_eq!(
        ok(
            Op::ArgReduce {
                op: graphc_ir::ArgReduceOp::ArgMax,
                axis: 1,
                keepdims: true
            },
            &[&x]
        ),
        "i64[2,1,4]"
    );
    assert!(bad(Op::Binary(BinaryOp::And), &[&x, &x]).contains("does not accept f32"));
    assert!(bad(Op::Unary(UnaryOp::Exp), &[&t(DType::I32, &[2])]).contains("does not accept i32"));
    assert!(bad(Op::Concat { axis: 0 }, &[]).contains("at least one operand"));
}
