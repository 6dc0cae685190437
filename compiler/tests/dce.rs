//! Dead-code elimination: removes exactly what no output reaches, keeps outputs equal.

use std::collections::HashMap;

use graphc_compiler::passes::dce::eliminate_dead_code;
use graphc_compiler::{compile, CompileOptions};
use graphc_ir::{interpret, DType, GraphBuilder, Tensor, TensorType};

#[test]
fn removes_dead_nodes_and_unused_weights_keeping_outputs() {
    let b = GraphBuilder::new();
    let x = b.input("x", DType::F32, [4]);
    let _unused_input = b.input("mask", DType::Bool, [4]);
    let w = b.param("w", Tensor::random(&TensorType::new(DType::F32, [4]), 1));
    let dead_w = b.param("dead", Tensor::random(&TensorType::new(DType::F32, [4]), 2));
    let _dead = (x * dead_w).exp();
    let y = (x + w).relu();
    b.output("y", y);
    b.output("y_again", y);
    let g = b.finish().unwrap();

    let (out, report) = eliminate_dead_code(&g);
    out.verify().unwrap();
    assert_eq!(report.weights_removed, vec!["dead".to_string()]);
    assert_eq!(report.nodes_removed, 3, "dead param, mul, exp");
    assert_eq!(out.len(), g.len() - 3);
    assert!(out.weight("dead").is_none());
    assert_eq!(out.inputs().len(), 2, "inputs are part of the signature and stay");

    for seed in 0..5 {
        let inputs: HashMap<String, Tensor> = [
            ("x".to_string(), Tensor::random(&TensorType::new(DType::F32, [4]), seed)),
            (
                "mask".to_string(),
                Tensor::random(&TensorType::new(DType::Bool, [4]), seed),
            ),
        ]
        .into();
        assert_eq!(interpret(&g, &inputs).unwrap(), interpret(&out, &inputs).unwrap());
    }
}

#[test]
fn pipeline_reports_each_pass() {
    let b = GraphBuilder::new();
    let x = b.input("x", DType::F32, [2]);
    b.output("y", x.exp());
    let g = b.finish().unwrap();
    let c = compile(
        &g,
        &CompileOptions {
            verify_each_pass: true,
            ..Default::default()
        },
    )
    .unwrap();
    let names: Vec<&str> = c.passes.iter().map(|p| p.pass.name()).collect();
    assert_eq!(names, ["dce", "optimize", "fuse", "plan"]);
    assert_eq!((c.passes[0].nodes_before, c.passes[0].nodes_after), (2, 2));
}

#[test]
fn input_order_survives() {
    let b = GraphBuilder::new();
    let a = b.input("a", DType::F32, [2]);
    let c = b.input("c", DType::F32, [2]);
    let bb = b.input("b", DType::F32, [2]);
    b.output("y", a + bb + c);
    let g = b.finish().unwrap();
    let (out, _) = eliminate_dead_code(&g);
    let names: Vec<_> = out.inputs().iter().map(|&i| out.input_name(i).unwrap()).collect();
    assert_eq!(names, ["a", "c", "b"]);
}
