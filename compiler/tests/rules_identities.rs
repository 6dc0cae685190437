//! A test per identity and scale rule: the rewrite fires, the result has the expected shape, and
//! outputs are unchanged through the reference interpreter on random inputs.

use std::collections::HashMap;

use graphc_compiler::optimize::{optimize, OptimizeReport};
use graphc_ir::{interpret, BinaryOp, DType, Graph, GraphBuilder, Op, Tensor, TensorType, UnaryOp, Value};

/// Build `f(x)` for an input `x` of type `ty`, optimize it, check equivalence, and
/// return the optimized graph and report.
fn check(dtype: DType, shape: &[usize], f: impl for<'b> Fn(Value<'b>) -> Value<'b>) -> (Graph, OptimizeReport) {
    let b = GraphBuilder::new();
    let x = b.input("x", dtype, shape.to_vec());
    b.output("y", f(x));
    let g = b.finish().unwrap();
    let (opt, report) = optimize(&g, &Default::default()).unwrap();
    opt.verify().unwrap();
    for seed in 0..4 {
        let inputs: HashMap<String, Tensor> = [(
            "x".to_string(),
            Tensor::random(&TensorType::new(dtype, shape.to_vec()), seed),
        )]
        .into();
        let (want, got) = (interpret(&g, &inputs).unwrap(), interpret(&opt, &inputs).unwrap());
        let same = want[0]
            .1
            .to_f64_vec()
            .iter()
            .zip(got[0].1.to_f64_vec())
            .all(|(a, b)| a == &b || a.is_nan() && b.is_nan());
        assert!(
            same,
            "outputs differ:\n{}\nvs\n{}",
            graphc_ir::print(&g),
            graphc_ir::print(&opt)
        );
    }
    (opt, report)
}

fn fired(report: &OptimizeReport, rule: &str) -> bool {
    report.rules_fired.get(rule).copied().unwrap_or(0) > 0
}

fn count(g: &Graph, pred: impl Fn(&Op) -> bool) -> usize {
    g.nodes().iter().filter(|n| pred(&n.op)).count()
}

/// The output node's op.
fn output_op(g: &Graph) -> &Op {
    &g.node(g.outputs()[0].node).op
}

#[test]
fn add_zero_either_side() {
    let (g, r) = check(DType::F32, &[3], |x| (x + 0.0).exp());
    assert!(fired(&r, "add-zero"));
    assert_eq!(count(&g, |o| *o == Op::Binary(BinaryOp::Add)), 0);
    let (g, _) = check(DType::I32, &[3], |x| 0.0 + x);
    assert!(matches!(output_op(&g), Op::Input { .. }));
}

#[test]
fn sub_zero_only_on_the_right() {
    let (g, r) = check(DType::F32, &[3], |x| x - 0.0);
    assert!(fired(&r, "sub-zero"));
    assert!(matches!(output_op(&g), Op::Input { .. }));
    let (g, _) = check(DType::F32, &[3], |x| 0.0 - x);
    assert_eq!(count(&g, |o| *o == Op::Binary(BinaryOp::Sub)), 1, "0 - x is not x");
}

#[test]
fn mul_one_and_div_one() {
    let (g, r) = check(DType::F64, &[2, 2], |x| (1.0 * x) / 1.0);
    assert!(fired(&r, "mul-one") && fired(&r, "div-one"));
    assert!(matches!(output_op(&g), Op::Input { .. }));
    let (g, _) = check(DType::F32, &[2], |x| 1.0 / x);
    assert!(!matches!(output_op(&g), Op::Input { .. }), "1 / x is not x");
}

#[test]
fn mul_zero_only_for_integers() {
    let (g, r) = check(DType::I64, &[4], |x| x * 0.0 + 3.0);
    assert!(fired(&r, "mul-zero-int"));
    assert_eq!(count(&g, |o| *o == Op::Binary(BinaryOp::Mul)), 0);
    assert_eq!(count(&g, |o| matches!(o, Op::Input { .. })), 1);
    let (g, r) = check(DType::F32, &[4], |x| x * 0.0);
    assert!(!fired(&r, "mul-zero-int"), "NaN * 0 is NaN");
    assert_eq!(count(&g, |o| *o == Op::Binary(BinaryOp::Mul)), 1);
}

#[test]
fn neg_neg_and_relu_relu() {
    let (g, r) = check(DType::F32, &[5], |x| -(-x));
    assert!(fired(&r, "neg-neg"));
    assert!(matches!(output_op(&g), Op::Input { .. }));
    let (g, r) = check(DType::F32, &[5], |x| x.relu().relu());
    assert!(fired(&r, "relu-relu"));
    assert_eq!(count(&g, |o| *o == Op::Unary(UnaryOp::Relu)), 1);
}

#[test]
fn max_and_min_of_a_value_with_itself() {
    let (g, r) = check(DType::F32, &[5], |x| x.maximum(x).minimum(x));
    assert!(fired(&r, "max-self") && fired(&r, "min-self"));
    assert!(matches!(output_op(&g), Op::Input { .. }));
}

#[test]
fn add_of_a_negation_is_a_subtraction() {
    let b = GraphBuilder::new();
    let x = b.input("x", DType::F32, [3]);
    let y = b.input("y", DType::F32, [3]);
    b.output("z", x + (-y));
    let g = b.finish().unwrap();
    let (opt, r) = optimize(&g, &Default::default()).unwrap();
    assert!(fired(&r, "add-neg"));
    assert_eq!(*output_op(&opt), Op::Binary(BinaryOp::Sub));
    assert_eq!(count(&opt, |o| *o == Op::Unary(UnaryOp::Neg)), 0);
    let inputs: HashMap<String, Tensor> = [
        ("x".to_string(), Tensor::random(&TensorType::new(DType::F32, [3]), 1)),
        ("y".to_string(), Tensor::random(&TensorType::new(DType::F32, [3]), 2)),
    ]
    .into();
    assert_eq!(interpret(&g, &inputs).unwrap(), interpret(&opt, &inputs).unwrap());
}

#[test]
fn pow_two_and_pow_half() {
    let (g, r) = check(DType::F32, &[4], |x| x.pow(2.0));
    assert!(fired(&r, "pow-two"));
    assert_eq!(*output_op(&g), Op::Binary(BinaryOp::Mul));
    let (g, r) = check(DType::F32, &[4], |x| x.abs().pow(0.5));
    assert!(fired(&r, "pow-half"));
    assert_eq!(*output_op(&g), Op::Unary(UnaryOp::Sqrt));
    let (g, r) = check(DType::F32, &[4], |x| x.pow(0.5));
    assert!(!fired(&r, "pow-half"), "x may be -inf, where pow and sqrt differ");
    assert_eq!(*output_op(&g), Op::Binary(BinaryOp::Pow));
}

#[test]
fn select_with_a_constant_condition() {
    let (g, r) = check(DType::F32, &[3], |x| {
        let b = x.builder();
        let yes = b.scalar(DType::Bool, 1.0);
        b.select(yes, x.exp(), -x)
    });
    assert!(fired(&r, "select-const"));
    assert_eq!(*output_op(&g), Op::Unary(UnaryOp::Exp));
}

#[test]
fn casts_to_the_same_type_and_exact_chains() {
    let (g, r) = check(DType::F16, &[3], |x| x.cast(DType::F32).cast(DType::F64));
    assert!(fired(&r, "cast-chain"));
    assert_eq!(count(&g, |o| matches!(o, Op::Cast { .. })), 1);
    let (g, r) = check(DType::F32, &[3], |x| x.cast(DType::F16).cast(DType::F32));
    assert!(!fired(&r, "cast-chain"), "f32 -> f16 -> f32 rounds");
    assert_eq!(count(&g, |o| matches!(o, Op::Cast { .. })), 2);
    let (g, _) = check(DType::I8, &[3], |x| x.cast(DType::I32).cast(DType::I8));
    assert!(matches!(output_op(&g), Op::Input { .. }));
}

#[test]
fn gather_of_a_weight_with_a_constant_index_is_a_broadcast_slice() {
    // An embedding lookup with constant ids (BERT's token types): the row folds into a
    // smaller weight and the lookup becomes a broadcast.
    let (g, r) = check(DType::F32, &[2, 5, 3], |x| {
        let b = x.builder();
        let table = b.param("table", Tensor::random(&TensorType::new(DType::F32, [4, 3]), 9));
        let idx = b.constant(Tensor::from_f64(DType::I64, [2, 5], &[-1.0; 10]).unwrap());
        x + table.gather(idx, 0)
    });
    assert!(fired(&r, "gather-splat-index"));
    assert_eq!(count(&g, |o| matches!(o, Op::Gather { .. })), 0);
    assert_eq!(r.weights_dropped, vec!["table".to_string()]);
    assert!(r.weight_bytes_after < r.weight_bytes_before);
}

#[test]
fn constants_fold_bit_identically() {
    // exp(2) * 3 over a constant folds; the result equals the interpreter's.
    let (g, r) = check(DType::F32, &[2], |x| {
        let b = x.builder();
        let c = b.constant(Tensor::from_f32([2], vec![2.0, -1.5]).unwrap());
        x + c.exp() * 3.0
    });
    assert!(r.constants_folded > 0);
    assert_eq!(count(&g, |o| *o == Op::Unary(UnaryOp::Exp)), 0);
}

#[test]
fn norms_reach_the_canonical_rsqrt_form() {
    let (g, r) = check(DType::F32, &[4], |x| 1.0 / (x.abs() + 1.0).sqrt());
    assert!(fired(&r, "one-over") && fired(&r, "reciprocal-sqrt"));
    assert_eq!(count(&g, |o| *o == Op::Unary(UnaryOp::Rsqrt)), 1);
    assert_eq!(count(&g, |o| *o == Op::Unary(UnaryOp::Sqrt)), 0);
    let (g, r) = check(DType::F16, &[4], |x| x.abs().sqrt().reciprocal());
    assert!(!fired(&r, "reciprocal-sqrt"), "f16 rounds the square root first");
    assert_eq!(count(&g, |o| *o == Op::Unary(UnaryOp::Sqrt)), 1);
}

#[test]
fn hitting_a_limit_still_gives_an_equivalent_graph_and_says_which() {
    let b = GraphBuilder::new();
    let x = b.input("x", DType::F32, [3]);
    b.output("y", -(-(x * 1.0 + 0.0)).relu().relu());
    let g = b.finish().unwrap();
    let opts = graphc_compiler::optimize::OptimizeOptions {
        iter_limit: Some(1),
        ..Default::default()
    };
    let (opt, r) = optimize(&g, &opts).unwrap();
    assert_eq!(r.stop_reason, "iteration limit (1)");
    opt.verify().unwrap();
    let inputs: HashMap<String, Tensor> =
        [("x".to_string(), Tensor::random(&TensorType::new(DType::F32, [3]), 3))].into();
    assert_eq!(interpret(&g, &inputs).unwrap(), interpret(&opt, &inputs).unwrap());
    let opts = graphc_compiler::optimize::OptimizeOptions {
        node_limit: Some(1),
        ..Default::default()
    };
    let (opt, r) = optimize(&g, &opts).unwrap();
    assert!(r.stop_reason.starts_with("node limit"), "{}", r.stop_reason);
    assert_eq!(interpret(&g, &inputs).unwrap(), interpret(&opt, &inputs).unwrap());
}

#[test]
fn division_by_a_power_of_two_is_a_multiplication() {
    let (g, r) = check(DType::F32, &[4], |x| x / 8.0);
    assert!(fired(&r, "div-pow2"));
    assert_eq!(*output_op(&g), Op::Binary(BinaryOp::Mul));
    let (g, r) = check(DType::F32, &[4], |x| x / 3.0);
    assert!(!fired(&r, "div-pow2"), "1/3 is not exact");
    assert_eq!(*output_op(&g), Op::Binary(BinaryOp::Div));
}

#[test]
fn integer_scale_chains_fold() {
    let (g, r) = check(DType::I32, &[4], |x| (x * 3.0) * 5.0);
    assert!(fired(&r, "mul-const-int"));
    assert_eq!(count(&g, |o| *o == Op::Binary(BinaryOp::Mul)), 1);
    let (g, r) = check(DType::F32, &[4], |x| (x * 3.0) * 5.0);
    assert!(!fired(&r, "mul-const-int"), "float products do not reassociate exactly");
    assert_eq!(count(&g, |o| *o == Op::Binary(BinaryOp::Mul)), 2);
}

#[test]
fn transposed_matmul_of_a_weight_folds_the_transposes() {
    // (x W)^T = W^T x^T: with x itself a transpose, both operand transposes vanish or fold.
    let (g, r) = check(DType::F32, &[3, 2], |x| {
        let b = x.builder();
        let w = b.param("w", Tensor::random(&TensorType::new(DType::F32, [3, 4]), 5));
        x.t().matmul(w).t()
    });
    assert!(fired(&r, "transpose-of-matmul"));
    assert_eq!(count(&g, |o| matches!(o, Op::Transpose { .. })), 0);
    assert_eq!(*output_op(&g), Op::MatMul);
}

#[test]
fn and_true_and_or_false() {
    fn splat(x: Value<'_>, v: f64) -> Value<'_> {
        x.builder().scalar(DType::Bool, v).broadcast_to(&x.shape())
    }
    for left in [false, true] {
        let (g, r) = check(DType::Bool, &[2, 3], |x| {
            let t = splat(x, 1.0);
            if left {
                t.and(x)
            } else {
                x.and(t)
            }
        });
        assert!(fired(&r, "and-true"));
        assert!(matches!(output_op(&g), Op::Input { .. }), "{}", graphc_ir::print(&g));
        let (g, r) = check(DType::Bool, &[2, 3], |x| {
            let f = splat(x, 0.0);
            if left {
                f.or(x)
            } else {
                x.or(f)
            }
        });
        assert!(fired(&r, "or-false"));
        assert!(matches!(output_op(&g), Op::Input { .. }));
    }
    // `and` with false and `or` with true are not identities.
    let (g, _) = check(DType::Bool, &[2, 3], |x| x.and(splat(x, 0.0)).or(x));
    assert!(!matches!(output_op(&g), Op::Input { .. }));
}
