//! Helpers shared by the interpreter tests: one-op graphs and value checks.
#![allow(dead_code)]

use std::collections::HashMap;

use graphc_ir::{interpret, DType, Graph, InterpError, Op, Shape, Tensor, TensorData};

/// A tensor of `dtype` from f64 literals (cast semantics).
pub fn t(dtype: DType, shape: &[usize], v: &[f64]) -> Tensor {
    Tensor::from_f64(dtype, shape.to_vec(), v).unwrap()
}

pub fn f32t(shape: &[usize], v: &[f64]) -> Tensor {
    t(DType::F32, shape, v)
}

pub fn i64t(shape: &[usize], v: &[i64]) -> Tensor {
    Tensor::new(shape.to_vec(), TensorData::I64(v.to_vec())).unwrap()
}

pub fn boolt(shape: &[usize], v: &[bool]) -> Tensor {
    Tensor::new(shape.to_vec(), TensorData::Bool(v.to_vec())).unwrap()
}

/// Build a graph applying `op` to inputs `x0, x1, ..` holding `args`, and run it.
pub fn try_run(op: Op, args: &[Tensor]) -> Result<Tensor, InterpError> {
    let mut g = Graph::new();
    let mut ids = Vec::new();
    let mut inputs = HashMap::new();
    for (i, a) in args.iter().enumerate() {
        let name = format!("x{i}");
        ids.push(
            g.add(
                Op::Input {
                    name: name.clone(),
                    ty: a.ty(),
                },
                vec![],
                None,
            )
            .unwrap(),
        );
        inputs.insert(name, a.clone());
    }
    let y = g.add(op, ids, Some("y".into())).unwrap();
    g.add_output("y", y);
    let mut out = interpret(&g, &inputs)?;
    assert_eq!(out.len(), 1);
    let (name, value) = out.remove(0);
    assert_eq!(name, "y");
    assert_eq!(value.ty(), g.node(y).ty, "output has the inferred type");
    Ok(value)
}

pub fn run(op: Op, args: &[Tensor]) -> Tensor {
    try_run(op, args).unwrap()
}

/// Check dtype, shape and values (NaN matches NaN; relative tolerance `tol`).
pub fn check(got: &Tensor, dtype: DType, shape: &[usize], expected: &[f64], tol: f64) {
    assert_eq!(got.dtype(), dtype, "dtype of {got}");
    assert_eq!(got.shape(), &Shape::new(shape), "shape of {got}");
    let g = got.to_f64_vec();
    assert_eq!(g.len(), expected.len(), "element count of {got}");
    for (i, (&x, &e)) in g.iter().zip(expected).enumerate() {
        let ok = if e.is_nan() {
            x.is_nan()
        } else if e.is_infinite() {
            x == e
        } else {
            (x - e).abs() <= tol * e.abs().max(1.0)
        };
        assert!(ok, "element {i}: got {x}, expected {e} (all: {g:?})");
    }
}

/// Exact check for any dtype.
pub fn check_exact(got: &Tensor, dtype: DType, shape: &[usize], expected: &[f64]) {
    check(got, dtype, shape, expected, 0.0);
}
