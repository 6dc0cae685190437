//! The builder: operators, broadcasting, errors as values, and the composite layers
//! checked against independently computed numbers.

use std::collections::HashMap;

use graphc_ir::nn::{self, GeluApprox};
use graphc_ir::{interpret, BinaryOp, DType, Graph, GraphBuilder, Op, Tensor, TensorType};

fn run1(g: &Graph, inputs: &[(&str, Tensor)]) -> Vec<f64> {
    let inputs: HashMap<String, Tensor> = inputs.iter().map(|(n, t)| (n.to_string(), t.clone())).collect();
    interpret(g, &inputs).expect("runs")[0].1.to_f64_vec()
}

fn f32s(shape: &[usize], v: &[f32]) -> Tensor {
    Tensor::from_f32(shape.to_vec(), v.to_vec()).unwrap()
}

fn close(a: &[f64], b: &[f64], tol: f64) {
    assert_eq!(a.len(), b.len(), "{a:?} vs {b:?}");
    for (x, y) in a.iter().zip(b) {
        assert!((x - y).abs() <= tol, "{a:?} vs {b:?}");
    }
}

#[test]
fn operators_broadcast_explicitly() {
    let b = GraphBuilder::new();
    let x = b.input("x", DType::F32, [2, 3]);
    let row = b.input("row", DType::F32, [3]);
    let y = (x + row) * 2.0 - 1.0;
    b.output("y", y);
    let g = b.finish().unwrap();
    let broadcasts = g
        .nodes()
        .iter()
        .filter(|n| matches!(n.op, Op::Broadcast { .. }))
        .count();
    assert_eq!(broadcasts, 3, "row, the 2.0 and the 1.0 are broadcast");
    let out = run1(
        &g,
        &[
            ("x", f32s(&[2, 3], &[0., 1., 2., 3., 4., 5.])),
            ("row", f32s(&[3], &[10., 20., 30.])),
        ],
    );
    assert_eq!(out, vec![19., 41., 63., 25., 47., 69.]);
}

#[test]
fn scalar_on_the_left() {
    let b = GraphBuilder::new();
    let x = b.input("x", DType::F64, [2]);
    b.output("y", 1.0 / x - 3.0 * x);
    let g = b.finish().unwrap();
    assert_eq!(
        run1(&g, &[("x", Tensor::from_f64(DType::F64, [2], &[2.0, 4.0]).unwrap())]),
        vec![-5.5, -11.75]
    );
}

#[test]
fn shape_errors_are_values_naming_the_op() {
    let b = GraphBuilder::new();
    let x = b.input("x", DType::F32, [2, 3]);
    let y = b.input("y", DType::F32, [4]);
    let z = (x + y).exp();
    b.output("z", z);
    let err = b.finish().unwrap_err().to_string();
    assert!(
        err.contains("add operands do not broadcast: f32[2,3] and f32[4]"),
        "{err}"
    );
}

#[test]
fn dtype_mismatch_is_an_error() {
    let b = GraphBuilder::new();
    let x = b.input("x", DType::F32, [2]);
    let y = b.input("y", DType::F16, [2]);
    b.output("z", x.maximum(y));
    let err = b.finish().unwrap_err().to_string();
    assert!(err.contains("max needs operands of one type"), "{err}");
}

#[test]
fn matmul_and_axis_errors() {
    let b = GraphBuilder::new();
    let x = b.input("x", DType::F32, [2, 3]);
    b.output("y", x.matmul(x));
    let err = b.finish().unwrap_err().to_string();
    assert!(err.contains("matmul contraction dims differ"), "{err}");

    let b = GraphBuilder::new();
    let x = b.input("x", DType::F32, [2, 3]);
    b.output("y", x.sum(&[2], false));
    let err = b.finish().unwrap_err().to_string();
    assert!(err.contains("axis 2 out of range for rank 2"), "{err}");
}

#[test]
fn duplicate_parameter_names_are_an_error() {
    let b = GraphBuilder::new();
    let t = Tensor::zeros(&TensorType::new(DType::F32, [2]));
    let p = b.param("w", t.clone());
    let q = b.param("w", t);
    b.output("y", p + q);
    assert!(b.finish().unwrap_err().to_string().contains("\"w\" is used twice"));
}

#[test]
fn negative_axes_normalize() {
    let b = GraphBuilder::new();
    let x = b.input("x", DType::F32, [2, 3, 4]);
    let s = x.sum(&[-1, 0], true);
    assert_eq!(s.shape().dims(), &[1, 3, 1]);
    b.output("s", s);
    let g = b.finish().unwrap();
    match &g.node(g.outputs()[0].node).op {
        Op::Reduce { axes, .. } => assert_eq!(axes, &[0, 2]),
        op => panic!("unexpected {op:?}"),
    }
}

#[test]
fn scopes_name_nodes() {
    let b = GraphBuilder::new();
    let x = b.input("x", DType::F32, [2]);
    let y = b.scope("block", || (x * 2.0).named("double"));
    b.output("y", y);
    let g = b.finish().unwrap();
    let out = g.node(g.outputs()[0].node);
    assert_eq!(out.name.as_deref(), Some("block/double"));
    assert!(matches!(out.op, Op::Binary(BinaryOp::Mul)));
}

#[test]
fn softmax_matches_hand_values() {
    let b = GraphBuilder::new();
    let x = b.input("x", DType::F32, [2, 3]);
    b.output("y", nn::softmax(x, -1));
    let g = b.finish().unwrap();
    let out = run1(&g, &[("x", f32s(&[2, 3], &[1., 2., 3., 1000., 1000., 1000.]))]);
    // softmax([1,2,3]) = [0.09003057, 0.24472847, 0.66524096]; large equal logits stay finite.
    close(
        &out,
        &[0.09003057, 0.24472847, 0.66524096, 1. / 3., 1. / 3., 1. / 3.],
        1e-6,
    );
}

#[test]
fn log_softmax_matches_hand_values() {
    let b = GraphBuilder::new();
    let x = b.input("x", DType::F32, [3]);
    b.output("y", nn::log_softmax(x, 0));
    let g = b.finish().unwrap();
    let out = run1(&g, &[("x", f32s(&[3], &[1., 2., 3.]))]);
    close(&out, &[-2.40760596, -1.40760596, -0.40760596], 1e-6);
}

#[test]
fn layer_norm_and_rms_norm_match_hand_values() {
    let b = GraphBuilder::new();
    let x = b.input("x", DType::F32, [1, 4]);
    let g = b.param("g", f32s(&[4], &[1., 2., 1., 1.]));
    let beta = b.param("beta", f32s(&[4], &[0., 0., 0., 1.]));
    b.output("ln", nn::layer_norm(x, Some(g), Some(beta), 0.0));
    b.output("rms", nn::rms_norm(x, None, 0.0));
    let graph = b.finish().unwrap();
    let inputs = [("x".to_string(), f32s(&[1, 4], &[1., 2., 3., 4.]))].into();
    let out = interpret(&graph, &inputs).unwrap();
    // mean 2.5, biased variance 1.25: (x - 2.5) / sqrt(1.25).
    let s = 1.25f64.sqrt();
    close(
        &out[0].1.to_f64_vec(),
        &[-1.5 / s, 2. * -0.5 / s, 0.5 / s, 1.5 / s + 1.],
        1e-6,
    );
    // rms = sqrt(30 / 4).
    let r = 7.5f64.sqrt();
    close(&out[1].1.to_f64_vec(), &[1. / r, 2. / r, 3. / r, 4. / r], 1e-6);
}

#[test]
fn decomposed_gelus_match_the_primitives_and_hand_values() {
    let b = GraphBuilder::new();
    let x = b.input("x", DType::F32, [3]);
    b.output("erf", nn::gelu(x, GeluApprox::Erf));
    b.output("tanh", nn::gelu(x, GeluApprox::Tanh));
    b.output("prim", x.gelu());
    b.output("prim_tanh", x.gelu_tanh());
    let g = b.finish().unwrap();
    let inputs = [("x".to_string(), f32s(&[3], &[-1., 0.5, 2.]))].into();
    let out = interpret(&g, &inputs).unwrap();
    // torch.nn.functional.gelu([-1, .5, 2]) and approximate='tanh'.
    let erf = [-0.15865526, 0.34573123, 1.95449974];
    let tanh = [-0.15880801, 0.34571401, 1.95459769];
    close(&out[0].1.to_f64_vec(), &erf, 1e-6);
    close(&out[1].1.to_f64_vec(), &tanh, 1e-6);
    close(&out[2].1.to_f64_vec(), &erf, 1e-6);
    close(&out[3].1.to_f64_vec(), &tanh, 1e-6);
}

#[test]
fn linear_uses_pytorch_weight_layout() {
    let b = GraphBuilder::new();
    let x = b.input("x", DType::F32, [1, 2]);
    let w = b.param("w", f32s(&[3, 2], &[1., 0., 0., 1., 1., 1.]));
    let bias = b.param("b", f32s(&[3], &[0.5, 0.5, 0.5]));
    b.output("y", nn::linear(x, w, Some(bias)));
    let g = b.finish().unwrap();
    assert_eq!(run1(&g, &[("x", f32s(&[1, 2], &[2., 3.]))]), vec![2.5, 3.5, 5.5]);
}

#[test]
fn causal_attention_attends_only_to_the_past() {
    // One head, d = 1: q = k = 0 gives uniform weights over positions <= t, so the
    // output at t is the mean of v[0..=t].
    let b = GraphBuilder::new();
    let qkv = b.input("qkv", DType::F32, [1, 3, 3]);
    b.output("y", nn::causal_attention(qkv, 1));
    let g = b.finish().unwrap();
    let v = [3., 6., 9.];
    let data: Vec<f32> = v.iter().flat_map(|&x| [0., 0., x]).collect();
    assert_eq!(run1(&g, &[("qkv", f32s(&[1, 3, 3], &data))]), vec![3., 4.5, 6.]);
}

#[test]
fn rem_and_not_operators() {
    let b = GraphBuilder::new();
    let x = b.input("x", DType::I32, [4]);
    b.output("m", x % 3.0);
    b.output("nonneg", !x.lt(0.0));
    let g = b.finish().unwrap();
    let x = Tensor::from_f64(DType::I32, [4], &[-7., 7., -1., 5.]).unwrap();
    let out = interpret(&g, &[("x".to_string(), x)].into()).unwrap();
    assert_eq!(
        out[0].1.to_f64_vec(),
        vec![2., 1., 2., 2.],
        "sign of the divisor, as Python"
    );
    assert_eq!(out[1].1.to_f64_vec(), vec![0., 1., 0., 1.]);
}
