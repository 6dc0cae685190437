//! ONNX tier (b) lowerings on hand-made models: opset-dependent operands and attributes,
//! error messages, and numerics the node suite does not cover.

mod common;

use std::collections::HashMap;

use common::{i64_init, int_attr, ints_attr, model, node, value_info};
use graphc_ir::onnx::proto::{data_type as dt, ModelProto};
use graphc_ir::onnx::{import_model, ImportOptions};
use graphc_ir::{interpret, DType, Tensor, TensorData};

/// Import and run `m` on `inputs`; the outputs in order.
fn run(m: &ModelProto, inputs: &[(&str, Tensor)]) -> Vec<Tensor> {
    let g = import_model(m, None, &ImportOptions::default()).expect("import");
    let inputs: HashMap<String, Tensor> = inputs.iter().map(|(n, t)| (n.to_string(), t.clone())).collect();
    interpret(&g, &inputs)
        .expect("run")
        .into_iter()
        .map(|(_, t)| t)
        .collect()
}

fn import_err(m: &ModelProto) -> String {
    match import_model(m, None, &ImportOptions::default()) {
        Ok(_) => panic!("import succeeded"),
        Err(e) => e.to_string(),
    }
}

fn f32s(shape: &[usize], v: &[f32]) -> Tensor {
    Tensor::from_f32(shape.to_vec(), v.to_vec()).unwrap()
}

fn i64s(shape: &[usize], v: &[i64]) -> Tensor {
    Tensor::new(shape.to_vec(), TensorData::I64(v.to_vec())).unwrap()
}

fn close(got: &Tensor, want: &[f64]) {
    let g = got.to_f64_vec();
    assert_eq!(g.len(), want.len(), "{g:?} vs {want:?}");
    for (x, y) in g.iter().zip(want) {
        assert!((x - y).abs() <= 1e-5 + 1e-4 * y.abs(), "{g:?} vs {want:?}");
    }
}

const X23: [f32; 6] = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0];

#[test]
fn reduce_sum_axes_attribute_before_opset_13_and_operand_after() {
    let x = || value_info("x", dt::FLOAT, &[2, 3]);
    let old = model(
        11,
        vec![node(
            "ReduceSum",
            "",
            &["x"],
            &["y"],
            vec![ints_attr("axes", &[1]), int_attr("keepdims", 0)],
        )],
        vec![x()],
        vec![],
        &["y"],
    );
    let new = model(
        13,
        vec![node(
            "ReduceSum",
            "",
            &["x", "axes"],
            &["y"],
            vec![int_attr("keepdims", 0)],
        )],
        vec![x()],
        vec![i64_init("axes", &[1], &[-1])],
        &["y"],
    );
    for m in [old, new] {
        let y = run(&m, &[("x", f32s(&[2, 3], &X23))]);
        assert_eq!(y[0].shape().dims(), &[2]);
        close(&y[0], &[6.0, 15.0]);
    }
}

#[test]
fn reduce_mean_axes_attribute_until_opset_17() {
    let m = |opset| {
        model(
            opset,
            vec![node("ReduceMean", "", &["x"], &["y"], vec![ints_attr("axes", &[0])])],
            vec![value_info("x", dt::FLOAT, &[2, 3])],
            vec![],
            &["y"],
        )
    };
    let y = run(&m(17), &[("x", f32s(&[2, 3], &X23))]);
    assert_eq!(y[0].shape().dims(), &[1, 3]);
    close(&y[0], &[2.5, 3.5, 4.5]);
    // No axes at all: every axis.
    let all = model(
        18,
        vec![node("ReduceMean", "", &["x"], &["y"], vec![])],
        vec![value_info("x", dt::FLOAT, &[2, 3])],
        vec![],
        &["y"],
    );
    let y = run(&all, &[("x", f32s(&[2, 3], &X23))]);
    assert_eq!(y[0].shape().dims(), &[1, 1]);
    close(&y[0], &[3.5]);
}

#[test]
fn empty_axes_with_noop_is_the_identity() {
    let m = model(
        18,
        vec![node(
            "ReduceMax",
            "",
            &["x", "axes"],
            &["y"],
            vec![int_attr("noop_with_empty_axes", 1)],
        )],
        vec![value_info("x", dt::FLOAT, &[2, 3])],
        vec![i64_init("axes", &[0], &[])],
        &["y"],
    );
    let y = run(&m, &[("x", f32s(&[2, 3], &X23))]);
    assert_eq!(y[0].shape().dims(), &[2, 3]);
    close(&y[0], &X23.map(f64::from));
}

#[test]
fn runtime_axes_are_not_supported() {
    let m = model(
        18,
        vec![node("ReduceSum", "", &["x", "axes"], &["y"], vec![])],
        vec![value_info("x", dt::FLOAT, &[2, 3]), value_info("axes", dt::INT64, &[1])],
        vec![],
        &["y"],
    );
    let e = import_err(&m);
    assert!(
        e.contains("ReduceSum") && e.contains("axes") && e.contains("not supported"),
        "{e}"
    );
}

#[test]
fn out_of_range_axes_are_errors() {
    let bad_reduce = model(
        13,
        vec![node("ReduceProd", "", &["x"], &["y"], vec![ints_attr("axes", &[2])])],
        vec![value_info("x", dt::FLOAT, &[2, 3])],
        vec![],
        &["y"],
    );
    let e = import_err(&bad_reduce);
    assert!(e.contains("ReduceProd") && e.contains("axis 2 is out of range"), "{e}");
    let twice = model(
        13,
        vec![node("ReduceMin", "", &["x"], &["y"], vec![ints_attr("axes", &[1, -1])])],
        vec![value_info("x", dt::FLOAT, &[2, 3])],
        vec![],
        &["y"],
    );
    assert!(import_err(&twice).contains("twice"));
    for (op, attrs) in [
        ("Softmax", vec![int_attr("axis", -3)]),
        ("ArgMax", vec![int_attr("axis", 2)]),
        ("LayerNormalization", vec![int_attr("axis", 5)]),
    ] {
        let m = model(
            17,
            vec![node(op, "", &["x"], &["y"], attrs)],
            vec![value_info("x", dt::FLOAT, &[2, 3])],
            vec![],
            &["y"],
        );
        let e = import_err(&m);
        assert!(e.contains(op) && e.contains("out of range"), "{e}");
    }
    let cumsum = model(
        14,
        vec![node("CumSum", "", &["x", "axis"], &["y"], vec![])],
        vec![value_info("x", dt::FLOAT, &[2, 3])],
        vec![i64_init("axis", &[], &[-3])],
        &["y"],
    );
    assert!(import_err(&cumsum).contains("out of range"));
}

#[test]
fn softmax_flattens_before_opset_13() {
    // [1, 2, 2] with axis 1: opset 11 normalizes over the 4 trailing elements,
    // opset 13 over axis 1 only.
    let x = f32s(&[1, 2, 2], &[0.0, 1.0, 2.0, 3.0]);
    let m = |opset| {
        model(
            opset,
            vec![node("Softmax", "", &["x"], &["y"], vec![int_attr("axis", 1)])],
            vec![value_info("x", dt::FLOAT, &[1, 2, 2])],
            vec![],
            &["y"],
        )
    };
    let e: Vec<f64> = (0..4).map(|i| (i as f64).exp()).collect();
    let total: f64 = e.iter().sum();
    let y = run(&m(11), &[("x", x.clone())]);
    close(&y[0], &e.iter().map(|v| v / total).collect::<Vec<_>>());
    let y = run(&m(13), &[("x", x)]);
    let (a, b) = (e[0] + e[2], e[1] + e[3]);
    close(&y[0], &[e[0] / a, e[1] / b, e[2] / a, e[3] / b]);
}

#[test]
fn layer_norm_outputs_mean_and_inv_std_in_stash_type() {
    let m = model(
        17,
        vec![node(
            "LayerNormalization",
            "",
            &["x", "scale"],
            &["y", "mean", "inv_std"],
            vec![int_attr("axis", 1)],
        )],
        vec![
            value_info("x", dt::FLOAT16, &[2, 2]),
            value_info("scale", dt::FLOAT16, &[2]),
        ],
        vec![],
        &["y", "mean", "inv_std"],
    );
    let h = |v: &[f64]| Tensor::from_f64(DType::F16, [v.len()], v).unwrap();
    let x = h(&[1.0, 3.0, 2.0, 2.0]).reshape([2, 2]).unwrap();
    let out = run(&m, &[("x", x), ("scale", h(&[1.0, 2.0]))]);
    assert_eq!(out[0].ty().to_string(), "f16[2,2]");
    assert_eq!(out[1].ty().to_string(), "f32[2,1]");
    assert_eq!(out[2].ty().to_string(), "f32[2,1]");
    let inv = 1.0 / (1.0f64 + 1e-5).sqrt();
    close(&out[0], &[-inv, 2.0 * inv, 0.0, 0.0]);
    close(&out[1], &[2.0, 2.0]);
    close(&out[2], &[inv, 1.0 / 1e-5f64.sqrt()]);
}

#[test]
fn argmax_select_last_index() {
    let m = |last| {
        model(
            13,
            vec![node(
                "ArgMax",
                "",
                &["x"],
                &["y"],
                vec![
                    int_attr("axis", 1),
                    int_attr("keepdims", 0),
                    int_attr("select_last_index", last),
                ],
            )],
            vec![value_info("x", dt::FLOAT, &[2, 3])],
            vec![],
            &["y"],
        )
    };
    let x = f32s(&[2, 3], &[5.0, 1.0, 5.0, 0.0, 7.0, 7.0]);
    assert_eq!(run(&m(0), &[("x", x.clone())])[0], i64s(&[2], &[0, 1]));
    assert_eq!(run(&m(1), &[("x", x)])[0], i64s(&[2], &[2, 2]));
}

#[test]
fn cumsum_is_exact_for_integers_in_all_modes() {
    let x: Vec<i64> = vec![1 << 40, 3, -7, 11, 13, 1 << 50, 17];
    for (exclusive, reverse) in [(0, 0), (1, 0), (0, 1), (1, 1)] {
        let m = model(
            14,
            vec![node(
                "CumSum",
                "",
                &["x", "axis"],
                &["y"],
                vec![int_attr("exclusive", exclusive), int_attr("reverse", reverse)],
            )],
            vec![value_info("x", dt::INT64, &[1, 7])],
            vec![i64_init("axis", &[1], &[-1])],
            &["y"],
        );
        let mut want = vec![0i64; 7];
        for (j, w) in want.iter_mut().enumerate() {
            *w = (0..7)
                .filter(|&i| match (exclusive, reverse) {
                    (0, 0) => i <= j,
                    (1, 0) => i < j,
                    (0, _) => i >= j,
                    _ => i > j,
                })
                .map(|i| x[i])
                .sum();
        }
        let y = run(&m, &[("x", i64s(&[1, 7], &x))]);
        assert_eq!(y[0], i64s(&[1, 7], &want), "exclusive {exclusive} reverse {reverse}");
    }
}

#[test]
fn log_sum_exp_is_stable_and_handles_minus_infinity() {
    let m = model(
        18,
        vec![node(
            "ReduceLogSumExp",
            "",
            &["x", "axes"],
            &["y"],
            vec![int_attr("keepdims", 0)],
        )],
        vec![value_info("x", dt::FLOAT, &[3, 2])],
        vec![i64_init("axes", &[1], &[1])],
        &["y"],
    );
    let x = f32s(
        &[3, 2],
        &[1000.0, 1000.0, f32::NEG_INFINITY, f32::NEG_INFINITY, 0.0, 0.0],
    );
    let y = run(&m, &[("x", x)]);
    let l2 = 2f64.ln();
    let g = y[0].to_f64_vec();
    assert!((g[0] - (1000.0 + l2)).abs() < 1e-3, "{g:?}");
    assert_eq!(g[1], f64::NEG_INFINITY, "{g:?}");
    assert!((g[2] - l2).abs() < 1e-6, "{g:?}");
}

#[test]
fn reduce_max_of_bool() {
    let m = model(
        20,
        vec![node("ReduceMax", "", &["x"], &["y"], vec![int_attr("keepdims", 0)])],
        vec![value_info("x", dt::BOOL, &[2, 2])],
        vec![],
        &["y"],
    );
    let x = Tensor::new([2, 2], TensorData::Bool(vec![false, true, false, false])).unwrap();
    let y = run(&m, &[("x", x)]);
    assert_eq!(y[0], Tensor::new([], TensorData::Bool(vec![true])).unwrap());
}
