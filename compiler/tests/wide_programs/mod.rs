//! Wide programs whose compile cost must grow near-linearly with their size: shared by
//! `tests/plan_wide.rs` (counted work) and `benches/scaling.rs` (time).

use graphc_ir::{DType, Graph, GraphBuilder, Tensor, TensorData};

/// `x0 + x1 + ... ` over `n` inputs of 4 elements, as ONNX `Sum` lowers.
pub fn sum_of_inputs(n: usize) -> Graph {
    let b = GraphBuilder::new();
    let mut acc = b.input("x0", DType::F32, [4]);
    for i in 1..n {
        acc = acc + b.input(&format!("x{i}"), DType::F32, [4]);
    }
    b.output("y", acc);
    b.finish().unwrap()
}

/// The same over weights: the chain folds into one weight.
pub fn sum_of_weights(n: usize) -> Graph {
    let b = GraphBuilder::new();
    let w = |i: usize| Tensor::new([4], TensorData::F32((0..4).map(|k| (i + k) as f32).collect())).unwrap();
    let mut acc = b.param("w0", w(0));
    for i in 1..n {
        acc = acc + b.param(&format!("w{i}"), w(i));
    }
    b.output("y", acc + b.input("x", DType::F32, [4]));
    b.finish().unwrap()
}

/// `n` row blocks of one input, each times the same matrix; `concat` (every product
/// live until the concat) or a running sum (each live for one step).
pub fn matmuls(n: usize, concat: bool) -> Graph {
    let b = GraphBuilder::new();
    let x = b.input("x", DType::F32, [2 * n, 2]);
    let w = b.input("w", DType::F32, [2, 2]);
    let parts: Vec<_> = (0..n)
        .map(|i| x.slice(0, 2 * i as i64, 2 * i as i64 + 2, 1).matmul(w))
        .collect();
    let y = if concat {
        b.concat(&parts, 0)
    } else {
        parts[1..].iter().fold(parts[0], |acc, &p| acc + p)
    };
    b.output("y", y);
    b.finish().unwrap()
}

/// `x + x + ... ` with `n` operands that all name one input, as ONNX `Sum` lowers
/// `Sum(x, x, ..., x)`; with `repeat_every` 2, every other operand is `x` and the rest
/// are inputs of their own.
pub fn sum_of_repeated_input(n: usize, repeat_every: usize) -> Graph {
    let b = GraphBuilder::new();
    let x = b.input("x", DType::F32, [4]);
    let mut acc = x;
    for i in 1..n {
        let operand = if i % repeat_every.max(1) == 0 {
            x
        } else {
            b.input(&format!("x{i}"), DType::F32, [4])
        };
        acc = acc + operand;
    }
    b.output("y", acc);
    b.finish().unwrap()
}
