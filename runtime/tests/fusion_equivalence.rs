//! Fusion keeps meaning: random graphs (every op kind and dtype), fused into kernels and
//! run by the kernel-IR CPU executor through their memory plan's arena, give the
//! reference interpreter's outputs.
//!
//! The executor evaluates each kernel expression with the interpreter's own op
//! functions, so a correct fusion is bitwise equal (up to NaN payloads); what this
//! catches is wrong indexing (views folded into accesses, row/broadcast levels, stores),
//! wrong kernel order, and values that should have been stored but were not.
//!
//! The same graphs also go through code generation and the plan-to-launch translation
//! for an H200, and the launch list, run by the launch emulator, gives the arena
//! executor's outputs (bitwise where no GEMM is involved, since the emulator runs the
//! same kernel-IR functions; within GEMM rounding else).

#[path = "../../ir/tests/common/random_graph.rs"]
mod random_graph;

mod seeded;
use seeded::{inputs, with_weights};

mod planned;

use graphc_compiler::codegen;
use graphc_compiler::fuse::fuse;
use graphc_compiler::plan::{plan_memory, MemoryOptions};
use graphc_ir::compare::bitwise_equal as same;
use graphc_ir::compare::{relative_l2, zip_outputs};
use graphc_ir::{interpret, DType, Op, Tensor};
use graphc_runtime::cuda::{emulate, plan_launches, DeviceInfo};
use graphc_runtime::kernels::run_planned;
use planned::run_arena;

const GRAPHS: u64 = 400;

#[test]
fn fused_random_graphs_match_the_interpreter() {
    let mut checked = 0;
    let mut kernels = 0;
    for seed in 0..GRAPHS {
        let g = with_weights(random_graph::random_graph(seed), seed);
        if std::env::var("FUSION_DEBUG").is_ok() {
            eprintln!("seed {seed}");
        }
        let program = fuse(&g).unwrap_or_else(|e| panic!("graph {seed}: fuse failed: {e}"));
        kernels += program.kernels.len();
        let ins = inputs(&g, seed);
        let Ok(want) = interpret(&g, &ins) else {
            continue; // e.g. integer division by zero: nothing to compare
        };
        let got = run_arena(&program, g.weights(), &ins)
            .unwrap_or_else(|e| panic!("graph {seed}: run failed: {e}\n{}", graphc_ir::print(&g)));
        for (n1, a, b) in zip_outputs(&got, &want).unwrap_or_else(|e| panic!("graph {seed}: {e}")) {
            assert!(
                same(a, b),
                "graph {seed}, output {n1}: fused {a} vs interpreter {b}\n{}\n{}",
                graphc_ir::print(&g),
                graphc_compiler::kernel::print_program(&program)
            );
        }
        checked += 1;
    }
    assert!(checked > GRAPHS / 2, "only {checked} graphs ran");
    eprintln!("{checked} random graphs fused into {kernels} kernels in all, all equal");
}

/// Views of every kind between fused ops: a transposed, sliced, broadcast chain feeding
/// an elementwise tree, a softmax over a middle axis, and a matmul with epilogue.
#[test]
fn views_rows_and_epilogues_match() {
    use graphc_ir::nn;
    use graphc_ir::{DType, GraphBuilder, SliceRange, UnaryOp};
    let b = GraphBuilder::new();
    let x = b.input("x", DType::F32, [2, 6, 5]);
    let w = b.input("w", DType::F32, [5, 4]);
    let t = x.transpose(&[0, 2, 1]); // [2,5,6]
    let s = t.slice_ranges(vec![
        SliceRange::full(),
        SliceRange {
            start: -1,
            end: i64::MIN,
            step: -1,
        },
        SliceRange {
            start: 1,
            end: 6,
            step: 2,
        },
    ]); // [2,5,3]
    let e = (s.unary(UnaryOp::Exp) + 1.0).unary(UnaryOp::Sqrt);
    let sm = nn::softmax(e, 1); // over the middle axis
    let mm = x.matmul(w); // [2,6,4]
    let y = (mm.unary(UnaryOp::Relu) * 2.0) + 1.0;
    b.output("sm", sm);
    b.output("y", y);
    b.output("t", t);
    let g = b.finish().unwrap();
    let program = fuse(&g).unwrap();
    let ins = inputs(&g, 7);
    let want = interpret(&g, &ins).unwrap();
    let got = run_arena(&program, g.weights(), &ins).unwrap();
    for (n, a, b) in zip_outputs(&got, &want).unwrap() {
        assert!(
            same(a, b),
            "{n}: {a} vs {b}\n{}",
            graphc_compiler::kernel::print_program(&program)
        );
    }
    // The softmax is one row kernel; the matmul carries its epilogue.
    let rows = program.kernels.iter().filter(|k| k.kind_name() == "row").count();
    assert_eq!(rows, 1);
    let mm_kernel = program.kernels.iter().find(|k| k.kind_name() == "matmul").unwrap();
    assert!(mm_kernel.nodes.len() >= 4, "{:?}", mm_kernel.nodes);
    assert!(program.kernels.iter().all(|k| !matches!(
        k.kind,
        graphc_compiler::kernel::KernelKind::Op(graphc_compiler::kernel::OpKernel {
            op: Op::Reshape { .. },
            ..
        })
    )));
}

/// Close as a GPU result may be: non-finite values in the same places, finite ones
/// within a relative L2 error for the dtype.
fn close(a: &Tensor, b: &Tensor) -> bool {
    if a.ty() != b.ty() {
        return false;
    }
    let tol = match a.ty().dtype {
        DType::F16 | DType::BF16 => 2e-2,
        DType::F32 | DType::F64 => 1e-5,
        _ => return a == b,
    };
    relative_l2(a, b) <= tol
}

/// Elements of an integer (or bool) output that differ, out of how many.
fn differing(a: &Tensor, b: &Tensor) -> (usize, usize) {
    let (x, y) = (a.to_f64_vec(), b.to_f64_vec());
    assert_eq!(x.len(), y.len());
    (x.iter().zip(&y).filter(|(p, q)| p != q).count(), x.len())
}

#[test]
fn emulated_launches_of_random_graphs_match_the_arena_executor() {
    let device = DeviceInfo::h200();
    let (mut checked, mut with_gemm, mut launches, mut int_elements) = (0, 0, 0, 0);
    let mut unsupported = Vec::new();
    for seed in 0..GRAPHS {
        let g = with_weights(random_graph::random_graph(seed), seed);
        let program = fuse(&g).unwrap_or_else(|e| panic!("graph {seed}: fuse failed: {e}"));
        let kernels = match codegen::generate_all(&program) {
            Ok(k) => k,
            Err(e) => {
                unsupported.push(format!("{seed}: {e}"));
                continue;
            }
        };
        let ins = inputs(&g, seed);
        if interpret(&g, &ins).is_err() {
            continue; // e.g. integer division by zero: nothing to compare
        }
        let plan = plan_memory(&program, &MemoryOptions::default()).expect("memory plan");
        let want = run_planned(&program, &plan, g.weights(), &ins).unwrap_or_else(|e| panic!("graph {seed}: {e}"));
        let lp = plan_launches(&program, &plan, &kernels, &device)
            .unwrap_or_else(|e| panic!("graph {seed}: launch plan: {e}\n{}", graphc_ir::print(&g)));
        let got = emulate(&program, &lp, g.weights(), &ins).unwrap_or_else(|e| {
            panic!(
                "graph {seed}: emulated launches failed: {e}\n{}\n{}",
                graphc_compiler::kernel::print_program(&program),
                lp.describe()
            )
        });
        launches += lp.launches.len();
        let gemms = lp.gemm_count() > 0;
        with_gemm += gemms as usize;
        for (n, a, b) in zip_outputs(&got, &want).unwrap_or_else(|e| panic!("graph {seed}: {e}")) {
            let float = matches!(a.ty().dtype, DType::F16 | DType::BF16 | DType::F32 | DType::F64);
            let ok = if gemms && !float {
                // Integer results computed from GEMM outputs (argmax, casts): the
                // emulator's GEMM rounds as the CPU executor's does, so they are equal.
                let (diff, of) = differing(a, b);
                int_elements += of;
                diff == 0
            } else if gemms {
                close(a, b)
            } else {
                same(a, b)
            };
            assert!(
                ok,
                "graph {seed}, output {n}: emulated {a} vs arena {b}\n{}\n{}",
                graphc_compiler::kernel::print_program(&program),
                lp.describe()
            );
        }
        checked += 1;
    }
    eprintln!(
        "{checked} random graphs ({with_gemm} with GEMMs), {launches} launches emulated; {} not generated; \
         {int_elements} integer elements downstream of GEMMs, all equal",
        unsupported.len()
    );
    assert!(int_elements > 0, "no integer output downstream of a GEMM was compared");
    assert!(
        checked > GRAPHS / 2,
        "only {checked} graphs ran; unsupported: {unsupported:?}"
    );
}
