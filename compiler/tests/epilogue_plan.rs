//! `codegen::epilogue_plan`, the cheap query fusion's report and the memory planner
//! use, agrees with full code generation for every kernel: hand-built fixtures and the
//! fused random graphs.

#[path = "../../ir/tests/common/random_graph.rs"]
mod random_graph;

mod codegen_common;

use graphc_compiler::codegen::{epilogue_plan, generate};
use graphc_compiler::fuse::fuse;
use graphc_compiler::kernel::{KernelKind, Program};
use graphc_ir::{BinaryOp, DType, UnaryOp};

/// The query and the generator agree on kernel `k`: no plan for other kinds; for a
/// matmul, an epilogue kernel exactly when the generated kernel has source, the same
/// scratch bytes, and the same error.
fn agree(p: &Program, k: usize, what: &str) -> usize {
    let plan = epilogue_plan(p, k);
    let generated = generate(p, k);
    let is_matmul = matches!(p.kernels[k].kind, KernelKind::MatMul(_));
    match (plan, generated) {
        (Ok(None), g) => {
            assert!(!is_matmul, "{what} k{k}: a matmul without a plan");
            if let Ok(g) = g {
                assert!(g.gemm.is_none(), "{what} k{k}");
            }
            0
        }
        (Ok(Some(plan)), Ok(g)) => {
            assert_eq!(plan.needs_kernel(), g.has_source(), "{what} k{k}");
            let gemm = g.gemm.unwrap_or_else(|| panic!("{what} k{k}: a matmul without a GEMM"));
            assert_eq!(plan.scratch_bytes(), gemm.scratch_bytes, "{what} k{k}");
            1
        }
        (Err(a), Err(b)) => {
            assert_eq!(a, b, "{what} k{k}");
            1
        }
        (plan, g) => panic!(
            "{what} k{k}: the plan says {plan:?}, generation {:?}",
            g.map(|g| g.name)
        ),
    }
}

#[test]
fn fixtures_agree() {
    let mut matmuls = 0;
    for (name, p) in codegen_common::all() {
        for k in 0..p.kernels.len() {
            matmuls += agree(&p, k, name);
        }
    }
    assert!(matmuls > 3, "only {matmuls} matmul fixtures");
}

#[test]
fn fused_random_graphs_agree() {
    for seed in 0..60 {
        let g = random_graph::random_graph(seed);
        let p = fuse(&g).unwrap_or_else(|e| panic!("graph {seed}: {e}"));
        for k in 0..p.kernels.len() {
            agree(&p, k, &format!("graph {seed}"));
        }
    }
}

/// Matmuls with random epilogues: chains of bias and full-tensor adds, scales,
/// activations and other ops, in f32, f16 and f64, with and without transposed `b`.
#[test]
fn random_matmul_epilogues_agree() {
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = move |n: u64| {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state % n
    };
    let (mut with_kernel, mut native) = (0, 0);
    for seed in 0..300 {
        let d = [DType::F32, DType::F16, DType::F64][next(3) as usize];
        let (m, n, k) = (1 + next(9) as usize, 1 + next(9) as usize, 1 + next(9) as usize);
        let trans_b = next(2) == 0;
        let steps: Vec<u64> = (0..next(5)).map(|_| next(7)).collect();
        let p = codegen_common::matmul(
            d,
            (m, n, k),
            None,
            trans_b.then(|| vec![1, k as i64]),
            |p, b, acc, inputs| {
                let mut v = acc;
                for (i, step) in steps.iter().enumerate() {
                    v = match step {
                        0 | 1 => {
                            let dims: Vec<usize> = if *step == 0 { vec![n] } else { vec![m, n] };
                            let x = p.input(&format!("x{i}"), d, &dims);
                            let strides: Vec<i64> = if *step == 0 { vec![0, 1] } else { vec![n as i64, 1] };
                            inputs.push(codegen_common::acc(x, 0, &strides));
                            let l = b.load((inputs.len() - 1) as u32, d);
                            b.bin(BinaryOp::Add, v, l)
                        }
                        2 => {
                            let c = b.c(d, 0.5);
                            b.bin(BinaryOp::Mul, v, c)
                        }
                        3 => b.un(UnaryOp::Relu, v),
                        4 => b.un(UnaryOp::GeluTanh, v),
                        5 => b.un(UnaryOp::Neg, v),
                        _ => {
                            let a2 = b.acc(d);
                            b.bin(BinaryOp::Add, v, a2)
                        }
                    };
                }
                v
            },
        );
        agree(&p, 0, &format!("matmul {seed}"));
        let plan = epilogue_plan(&p, 0).unwrap().unwrap();
        with_kernel += usize::from(plan.needs_kernel());
        native += usize::from(!plan.needs_kernel());
    }
    assert!(
        with_kernel > 10 && native > 10,
        "{with_kernel} generated, {native} native"
    );
}
