//! The planned executor (`run_planned`): every intermediate in one host arena at the
//! offsets of a memory plan.
//!
//! - On small models (a two-layer transformer, a mixed-dtype MLP with integer and bool
//!   intermediates) it gives exactly what the unplanned executor (`run_program`) and
//!   the reference interpreter give.
//! - The arena is really used: moving one buffer onto another that is still to be read
//!   changes the outputs; moving a kernel's output onto the bytes of an input it reads
//!   last (in-place reuse) does not.
//! - A plan that does not fit the program is an error naming the buffer, never a panic.
//! - A sum of one value named thousands of times (f32, bf16) runs as the interpreter.

use std::collections::HashMap;

use graphc_compiler::fuse::fuse;
use graphc_compiler::kernel::{BufferId, BufferKind, Program};
use graphc_compiler::passes::precision::Precision;
use graphc_compiler::plan::{plan_memory, MemoryOptions, MemoryPlan, PlannedBuffer};
use graphc_compiler::{compile, CompileOptions};
use graphc_ir::compare::bitwise_equal as same;
use graphc_ir::nn::{self, GeluApprox};
use graphc_ir::{interpret, DType, Graph, GraphBuilder, Tensor, TensorType, UnaryOp};
use graphc_runtime::kernels::{run_planned, run_program, KernelError};

/// A pre-LN GPT stack written with the builder (as `graphc::models::gpt`), small.
fn transformer(layers: usize) -> Graph {
    let (batch, seq, d, heads) = (2, 8, 32, 2);
    let b = GraphBuilder::new();
    let mut seed = 100;
    let mut param = |name: String, dims: &[usize], std: f64| {
        seed += 1;
        b.param(&name, Tensor::randn(&TensorType::new(DType::F32, dims), std, seed))
    };
    let mut x = b.input("x", DType::F32, [batch, seq, d]);
    for l in 0..layers {
        let g1 = param(format!("h{l}.ln1.weight"), &[d], 1.0);
        let b1 = param(format!("h{l}.ln1.bias"), &[d], 0.02);
        let h = nn::layer_norm(x, Some(g1), Some(b1), 1e-5);
        let w = param(format!("h{l}.qkv.weight"), &[3 * d, d], 0.2);
        let bias = param(format!("h{l}.qkv.bias"), &[3 * d], 0.02);
        let qkv = nn::linear(h, w, Some(bias));
        let a = nn::causal_attention(qkv, heads);
        let w = param(format!("h{l}.proj.weight"), &[d, d], 0.2);
        let a = nn::linear(a, w, None);
        x = x + a;
        let g2 = param(format!("h{l}.ln2.weight"), &[d], 1.0);
        let h = nn::layer_norm(x, Some(g2), None, 1e-5);
        let w = param(format!("h{l}.fc1.weight"), &[4 * d, d], 0.2);
        let h = nn::gelu(nn::linear(h, w, None), GeluApprox::Erf);
        let w = param(format!("h{l}.fc2.weight"), &[d, 4 * d], 0.1);
        x = x + nn::linear(h, w, None);
    }
    b.output("y", x);
    b.finish().unwrap()
}

/// An MLP in f16 and bf16 with a softmax, an argmax (i64), an i32 round trip and a
/// bool mask between kernels: every element size the arena encodes.
fn mixed_dtypes() -> Graph {
    let b = GraphBuilder::new();
    let x = b.input("x", DType::F16, [6, 24]);
    let w1 = b.param("w1", Tensor::randn(&TensorType::new(DType::F16, [24, 40]), 0.3, 1));
    let w2 = b.param("w2", Tensor::randn(&TensorType::new(DType::BF16, [40, 16]), 0.3, 2));
    let h = x.matmul(w1).unary(UnaryOp::Tanh);
    let hb = nn::softmax(h.cast(DType::BF16), -1);
    let logits = hb.matmul(w2);
    let probs = nn::softmax(logits.cast(DType::F32), -1);
    let arg = probs.argmax(-1, true); // i64 [6,1]
    let mask = probs.gt(probs.mean(&[-1], true)); // bool, read by a later row kernel
    let scaled = (probs * 1000.0).cast(DType::I32).cast(DType::F64);
    let picked = b.select(mask, scaled, b.scalar(DType::F64, -1.0));
    b.output("arg", arg);
    b.output("picked", picked.sum(&[-1], false));
    b.output("h", h);
    b.finish().unwrap()
}

fn random_inputs(g: &Graph, seed: u64) -> HashMap<String, Tensor> {
    g.inputs()
        .iter()
        .map(|&id| {
            let name = g.input_name(id).unwrap().to_string();
            (name, Tensor::randn(&g.node(id).ty, 1.0, seed))
        })
        .collect()
}

fn all_same(a: &[(String, Tensor)], b: &[(String, Tensor)]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|((n1, x), (n2, y))| n1 == n2 && same(x, y))
}

struct Case {
    graph: Graph,
    program: Program,
    plan: MemoryPlan,
    inputs: HashMap<String, Tensor>,
    want: Vec<(String, Tensor)>,
}

fn case(graph: Graph) -> Case {
    let program = fuse(&graph).unwrap();
    let plan = plan_memory(&program, &MemoryOptions::default()).unwrap();
    let inputs = random_inputs(&graph, 5);
    let want = interpret(&graph, &inputs).unwrap();
    Case {
        graph,
        program,
        plan,
        inputs,
        want,
    }
}

impl Case {
    fn run(&self, plan: &MemoryPlan) -> Result<Vec<(String, Tensor)>, KernelError> {
        run_planned(&self.program, plan, self.graph.weights(), &self.inputs)
    }
}

/// Pairs of planned buffers (indices into `plan.buffers`) live at the same time on
/// overlapping bytes, other than the planner's in-place pairs (a buffer that takes over
/// its input's storage at the kernel that last reads it).
fn conflicts(plan: &MemoryPlan) -> Vec<(usize, usize)> {
    let mut out = Vec::new();
    for (i, a) in plan.buffers.iter().enumerate() {
        for (j, b) in plan.buffers.iter().enumerate().skip(i + 1) {
            if a.reuses == Some(b.buffer) || b.reuses == Some(a.buffer) {
                continue;
            }
            let time = a.start < b.end && b.start < a.end;
            let space = a.offset < b.offset + b.bytes && b.offset < a.offset + a.bytes;
            if time && space {
                out.push((i, j));
            }
        }
    }
    out
}

#[test]
fn arena_equals_the_unplanned_executor_and_the_interpreter() {
    for (what, graph) in [
        ("1-layer transformer", transformer(1)),
        ("2-layer transformer", transformer(2)),
        ("mixed dtypes", mixed_dtypes()),
    ] {
        let c = case(graph);
        assert!(conflicts(&c.plan).is_empty(), "{what}: the planner overlapped buffers");
        let got = c.run(&c.plan).unwrap_or_else(|e| panic!("{what}: {e}"));
        let unplanned = run_program(&c.program, c.graph.weights(), &c.inputs).unwrap();
        assert_eq!(got, unplanned, "{what}: arena vs unplanned executor");
        assert!(all_same(&got, &c.want), "{what}: arena vs interpreter");
        // The arena is smaller than the buffers it holds: bytes really are shared.
        let sum: u64 = c.plan.buffers.iter().map(|b| b.bytes).sum();
        assert!(
            c.plan.buffers.len() >= 3,
            "{what}: {} planned buffers",
            c.plan.buffers.len()
        );
        if what.contains("transformer") {
            assert!(
                c.plan.arena_bytes < sum,
                "{what}: arena {} of {sum} bytes",
                c.plan.arena_bytes
            );
        }
    }
}

/// Put buffer `b` of a valid plan on the bytes of buffer `a`, which is still read after
/// `b` is written: the outputs must change (or the run fail), for every such pair.
#[test]
fn an_overlap_of_live_buffers_gives_wrong_numbers() {
    let c = case(transformer(1));
    let mut tried = 0;
    for (ia, a) in c.plan.buffers.iter().enumerate() {
        for (ib, b) in c.plan.buffers.iter().enumerate() {
            // a is written before b and read by a kernel after b's writer; b covers a.
            if !(a.start < b.start && b.start + 1 < a.end && b.bytes >= a.bytes) || ia == ib {
                continue;
            }
            let mut plan = c.plan.clone();
            plan.buffers[ib].offset = a.offset;
            plan.arena_bytes = plan.arena_bytes.max(a.offset + b.bytes);
            assert!(conflicts(&plan).contains(&(ia.min(ib), ia.max(ib))));
            match c.run(&plan) {
                Ok(got) => assert!(
                    !all_same(&got, &c.want),
                    "b{} moved onto b{} (read after it is clobbered) but the outputs did not change",
                    b.buffer.0,
                    a.buffer.0
                ),
                Err(e) => eprintln!("b{} onto b{}: {e}", b.buffer.0, a.buffer.0),
            }
            tried += 1;
        }
    }
    assert!(tried >= 3, "only {tried} clobbering pairs in the transformer's plan");
    eprintln!("{tried} clobbering overlaps, all detected");
}

/// `Sum(x, x, ..., x)` and a sum naming `x` every other operand, as ONNX `Sum` lowers
/// them (a chain of adds), compiled in f32 and bf16 (where every add reads `cast(x)`):
/// one kernel, giving exactly what the interpreter gives on the compiled graph, and in
/// f32 on the graph as written.
#[test]
fn a_sum_of_one_value_named_many_times_equals_the_interpreter() {
    let sum = |n: usize, every: usize| {
        let b = GraphBuilder::new();
        let x = b.input("x", DType::F32, [3, 5]);
        let mut acc = x;
        for i in 1..n {
            acc = acc
                + if i % every == 0 {
                    x
                } else {
                    b.input(&format!("x{i}"), DType::F32, [3, 5])
                };
        }
        b.output("y", acc);
        b.finish().unwrap()
    };
    for precision in [Precision::Fp32, Precision::Bf16] {
        for every in [1, 2] {
            let graph = sum(3000, every);
            let opts = CompileOptions {
                precision,
                ..CompileOptions::default()
            };
            let c = compile(&graph, &opts).unwrap();
            assert_eq!(c.program.kernels.len(), 1);
            let inputs = random_inputs(&graph, 7);
            let got = run_planned(&c.program, &c.plan, c.graph.weights(), &inputs).unwrap();
            let what = format!("{precision:?}, x every {every} operands");
            assert!(all_same(&got, &interpret(&c.graph, &inputs).unwrap()), "{what}");
            if precision == Precision::Fp32 {
                assert!(all_same(&got, &interpret(&graph, &inputs).unwrap()), "{what}");
            }
        }
    }
}

/// In-place reuse: a kernel's output on the bytes of an input it is the last reader of
/// is correct, since every input is decoded before the outputs are written.
#[test]
fn an_output_on_the_bytes_of_its_last_read_input_is_correct() {
    let mut tried = 0;
    for graph in [transformer(2), mixed_dtypes()] {
        let c = case(graph);
        for (ia, a) in c.plan.buffers.iter().enumerate() {
            for (ib, b) in c.plan.buffers.iter().enumerate() {
                if a.end != b.start + 1 || b.bytes > a.bytes {
                    continue;
                }
                let mut plan = c.plan.clone();
                plan.buffers[ib].offset = a.offset;
                // Only the intended overlap (a dies where b is born).
                if conflicts(&plan) != [(ia.min(ib), ia.max(ib))] {
                    continue;
                }
                let got = c.run(&plan).unwrap();
                assert!(all_same(&got, &c.want), "b{} in place of b{}", b.buffer.0, a.buffer.0);
                tried += 1;
            }
        }
    }
    assert!(tried >= 3, "only {tried} in-place pairs");
}

fn expect_plan_error(c: &Case, plan: &MemoryPlan, wants: &[&str]) {
    let e = c.run(plan).expect_err("a malformed plan must be refused");
    assert!(matches!(e, KernelError::Plan(_)), "{e:?}");
    let msg = e.to_string();
    for w in wants {
        assert!(msg.contains(w), "{msg:?} should contain {w:?}");
    }
}

fn temp_read_later(c: &Case) -> (usize, PlannedBuffer) {
    let i = c
        .plan
        .buffers
        .iter()
        .position(|b| b.end > b.start + 1 && c.program.buffers[b.buffer.index()].ty.dtype == DType::F32)
        .expect("an f32 buffer read after the kernel that writes it");
    (i, c.plan.buffers[i].clone())
}

#[test]
fn malformed_plans_are_errors_naming_the_buffer() {
    let c = case(transformer(1));
    assert!(c.run(&c.plan).is_ok());
    let (i, pb) = temp_read_later(&c);
    let name = format!("b{} (temp", pb.buffer.0);

    // An offset past the arena.
    let mut p = c.plan.clone();
    p.buffers[i].offset = p.arena_bytes;
    expect_plan_error(&c, &p, &[&name, "past the end"]);
    let mut p = c.plan.clone();
    p.buffers[i].offset = u64::MAX - 3;
    expect_plan_error(&c, &p, &[&name, "past the end"]);

    // A missing buffer: written by a kernel but neither planned nor an output.
    let mut p = c.plan.clone();
    p.buffers.remove(i);
    expect_plan_error(&c, &p, &[&name, "neither planned nor a graph output"]);

    // A plan for another number of kernels.
    let mut p = c.plan.clone();
    p.kernels += 1;
    expect_plan_error(&c, &p, &["kernels"]);

    // A weight, an input and a graph output are not arena buffers.
    let weight = c
        .program
        .buffers
        .iter()
        .position(|b| matches!(b.kind, BufferKind::Weight { .. }))
        .unwrap();
    let input = c
        .program
        .buffers
        .iter()
        .position(|b| matches!(b.kind, BufferKind::Input { .. }))
        .unwrap();
    let output = c.program.outputs[0].1 .0;
    for (id, what) in [
        (weight as u32, "(weight \""),
        (input as u32, "(input \"x\")"),
        (output, "graph output"),
    ] {
        let mut p = c.plan.clone();
        p.buffers.push(PlannedBuffer {
            buffer: BufferId(id),
            offset: 0,
            ..pb.clone()
        });
        expect_plan_error(&c, &p, &[&format!("b{id} "), what]);
    }

    // A buffer that does not exist; one planned twice.
    let mut p = c.plan.clone();
    p.buffers.push(PlannedBuffer {
        buffer: BufferId(9999),
        ..pb.clone()
    });
    expect_plan_error(&c, &p, &["b9999", "does not exist"]);
    let mut p = c.plan.clone();
    p.buffers.push(pb.clone());
    expect_plan_error(&c, &p, &[&name, "planned twice"]);

    // Too few bytes; an offset not aligned to the element size.
    let mut p = c.plan.clone();
    p.buffers[i].bytes -= 4;
    expect_plan_error(&c, &p, &[&name, "bytes"]);
    let mut p = c.plan.clone();
    p.buffers[i].offset += 2;
    p.arena_bytes += 256;
    expect_plan_error(&c, &p, &[&name, "not a multiple"]);

    // Lifetimes that do not cover the kernels using the buffer.
    let mut p = c.plan.clone();
    p.buffers[i].end = pb.start + 1;
    expect_plan_error(&c, &p, &[&name, "outside its planned lifetime"]);
    let mut p = c.plan.clone();
    p.buffers[i].start = pb.start + 1;
    expect_plan_error(&c, &p, &[&name, "written by kernel"]);
    let mut p = c.plan.clone();
    p.buffers[i].end = p.kernels as u32 + 1;
    expect_plan_error(&c, &p, &[&name, "lifetime"]);
    let mut p = c.plan.clone();
    p.buffers[i].end = pb.start;
    expect_plan_error(&c, &p, &[&name, "empty"]);

    // An arena too large to allocate is an error, not an abort.
    let mut p = c.plan.clone();
    p.arena_bytes = u64::MAX;
    expect_plan_error(&c, &p, &["cannot allocate"]);
}

/// The errors of the unplanned executor (inputs, kernels) come through unchanged.
#[test]
fn input_errors_are_the_unplanned_executors() {
    let c = case(mixed_dtypes());
    let mut bad = c.inputs.clone();
    bad.insert("x".into(), Tensor::zeros(&TensorType::new(DType::F32, [6, 24])));
    let planned = run_planned(&c.program, &c.plan, c.graph.weights(), &bad).unwrap_err();
    let unplanned = run_program(&c.program, c.graph.weights(), &bad).unwrap_err();
    assert_eq!(planned, unplanned);
    assert!(planned.to_string().contains("input \"x\""), "{planned}");
    let mut extra = c.inputs.clone();
    extra.insert("nope".into(), Tensor::scalar(DType::F32, 1.0));
    assert_eq!(
        run_planned(&c.program, &c.plan, c.graph.weights(), &extra).unwrap_err(),
        KernelError::UnknownInput("nope".into())
    );
}
