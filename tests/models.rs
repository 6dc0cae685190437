//! The example models: the saved block matches the builder, snapshots of their IR, and
//! compilation preserves their outputs.

mod common;

use common::{random_inputs, repo_path};
use graphc::ir::compare::{relative_l2, zip_outputs};
use graphc::ir::{interpret, print};
use graphc::models::{gpt, mlp, GptConfig, MlpConfig};

#[test]
fn saved_block_is_the_builders_block() {
    let saved = graphc::load_model(&repo_path("examples/models/transformer_block.gir"), &[]).unwrap();
    let built = gpt(&GptConfig::default()).unwrap();
    assert_eq!(
        saved,
        built.canonicalize(),
        "rerun `cargo run --example transformer_block -- --save`"
    );
}

#[test]
fn snapshot_mlp_ir() {
    insta::assert_snapshot!("mlp", print(&mlp(&MlpConfig::default()).unwrap()));
}

#[test]
fn snapshot_transformer_block_ir() {
    insta::assert_snapshot!("transformer_block", print(&gpt(&GptConfig::default()).unwrap()));
}

#[test]
fn compiling_preserves_outputs() {
    let models = [
        mlp(&MlpConfig::default()).unwrap(),
        gpt(&GptConfig {
            layers: 2,
            d_model: 64,
            ..GptConfig::default()
        })
        .unwrap(),
    ];
    for g in &models {
        let compiled = graphc::compile(g).unwrap();
        // Bitwise, unless a documented inexact rule fired (GELU and attention
        // recognized: the same formulas in their own association, a few ulps apart).
        let inexact = graphc_compiler::optimize::rules::INEXACT
            .iter()
            .any(|r| compiled.optimize.rules_fired.contains_key(*r));
        for seed in 0..3 {
            let inputs = random_inputs(g, seed);
            let (want, got) = (
                interpret(g, &inputs).unwrap(),
                interpret(&compiled.graph, &inputs).unwrap(),
            );
            if inexact {
                for (n, a, b) in zip_outputs(&got, &want).unwrap() {
                    let err = relative_l2(a, b);
                    assert!(err < 1e-6, "{n}: relative L2 {err:e}");
                }
            } else {
                assert_eq!(want, got);
            }
        }
    }
}

/// Every example model, run on the CPU (its fused kernels through the memory plan's
/// arena): bitwise what the interpreter computes for the compiled graph and what the
/// unplanned executor computes, and within rounding of the interpreter on the model.
#[test]
fn examples_run_through_the_arena_as_the_interpreter() {
    use graphc::models::kernel_bench;
    let models = [
        ("mlp", mlp(&MlpConfig::default()).unwrap()),
        ("block", gpt(&GptConfig::default()).unwrap()),
        (
            "saved block",
            graphc::load_model(&repo_path("examples/models/transformer_block.gir"), &[]).unwrap(),
        ),
        (
            "2-layer gpt",
            gpt(&GptConfig {
                layers: 2,
                d_model: 64,
                ..GptConfig::default()
            })
            .unwrap(),
        ),
        ("gelu_sigmoid", kernel_bench::gelu_sigmoid(1000).unwrap()),
        (
            "layernorm_gelu",
            kernel_bench::layernorm_gelu(8, 96, graphc::ir::DType::F32).unwrap(),
        ),
        ("softmax", kernel_bench::softmax(8, 100).unwrap()),
    ];
    for (name, g) in &models {
        let c = graphc::compile(g).unwrap();
        let plan = &c.plan;
        assert!(
            !plan.buffers.is_empty() || c.program.kernels.len() == 1,
            "{name}: nothing planned"
        );
        let inputs = random_inputs(g, 11);
        let got = graphc::run_cpu(&c, inputs.clone()).unwrap_or_else(|e| panic!("{name}: {e}"));
        // Bitwise, except that the attention kernel is tiled (online softmax) where the
        // interpreter computes attention by its two-pass definition.
        let optimized = interpret(&c.graph, &inputs).unwrap();
        if c.program.kernels.iter().any(|k| k.kind_name() == "attention") {
            for (n, a, b) in zip_outputs(&got, &optimized).unwrap() {
                let err = relative_l2(a, b);
                assert!(err < 1e-6, "{name}/{n}: arena vs interpreter, relative L2 {err:.2e}");
            }
        } else {
            assert_eq!(got, optimized, "{name}: arena vs interpreter");
        }
        let unplanned = graphc_runtime::kernels::run_program(&c.program, c.graph.weights(), &inputs).unwrap();
        assert_eq!(got, unplanned, "{name}: arena vs unplanned executor");
        let want = interpret(g, &inputs).unwrap();
        for (n, a, b) in zip_outputs(&got, &want).unwrap() {
            let err = relative_l2(a, b);
            assert!(err < 1e-5, "{name}/{n}: relative L2 error {err:.2e}");
        }
    }
}

#[test]
fn gpt_outputs_are_finite_and_depend_on_every_position_causally() {
    let cfg = GptConfig {
        batch: 1,
        seq: 4,
        d_model: 32,
        heads: 2,
        ..GptConfig::default()
    };
    let g = gpt(&cfg).unwrap();
    let mut inputs = random_inputs(&g, 1);
    let y0 = interpret(&g, &inputs).unwrap()[0].1.to_f64_vec();
    assert!(y0.iter().all(|v| v.is_finite()));
    // Change the last position only: earlier positions' outputs must not move.
    let x = inputs["x"].to_f64_vec();
    let mut x2 = x.clone();
    for v in &mut x2[3 * 32..] {
        *v += 0.5;
    }
    inputs.insert(
        "x".into(),
        graphc::ir::Tensor::from_f64(graphc::ir::DType::F32, [1, 4, 32], &x2).unwrap(),
    );
    let y1 = interpret(&g, &inputs).unwrap()[0].1.to_f64_vec();
    assert_eq!(&y0[..3 * 32], &y1[..3 * 32]);
    assert_ne!(&y0[3 * 32..], &y1[3 * 32..]);
}

#[test]
fn snapshot_optimized_transformer_block_ir() {
    let compiled = graphc::compile(&gpt(&GptConfig::default()).unwrap()).unwrap();
    insta::assert_snapshot!("transformer_block_optimized", print(&compiled.graph));
}

#[test]
fn snapshot_optimized_mlp_ir() {
    let compiled = graphc::compile(&mlp(&MlpConfig::default()).unwrap()).unwrap();
    insta::assert_snapshot!("mlp_optimized", print(&compiled.graph));
}

/// How many kernels of each kind a program has, as `kind: count` lines.
fn kernel_census(p: &graphc_compiler::kernel::Program) -> std::collections::BTreeMap<String, usize> {
    let mut m = std::collections::BTreeMap::new();
    for k in &p.kernels {
        *m.entry(k.kind_name().to_string()).or_insert(0) += 1;
    }
    m
}

/// The pre-LN block fuses into 8 kernels: 2 layer norms (one row kernel each), 4 linear
/// layers with their epilogues (bias; bias + GELU; bias + residual add, twice), one
/// attention kernel (scores, causal mask, softmax and the product with v: the e-graph's
/// `attention`, reading q, k and v through strided views of the qkv projection), and
/// one copy that merges the heads (the attention writes [b, h, s, d]; the projection's
/// GEMM reads [b, s, h*d]).
#[test]
fn transformer_block_kernel_count() {
    let compiled = graphc::compile(&gpt(&GptConfig::default()).unwrap()).unwrap();
    let census = kernel_census(&compiled.program);
    let want: std::collections::BTreeMap<String, usize> =
        [("row", 2), ("matmul", 4), ("attention", 1), ("elementwise", 1)]
            .map(|(k, v)| (k.to_string(), v))
            .into();
    assert_eq!(
        census,
        want,
        "{}",
        graphc_compiler::kernel::print_program(&compiled.program)
    );
    let mm_with_epilogue = compiled
        .program
        .kernels
        .iter()
        .filter(|k| k.kind_name() == "matmul" && k.nodes.len() > 1)
        .count();
    assert_eq!(mm_with_epilogue, 4, "4 linear layers with their epilogues");
    let attention = compiled
        .program
        .kernels
        .iter()
        .find(|k| k.kind_name() == "attention")
        .unwrap();
    let graphc::ir::Op::Attention { causal, .. } = compiled
        .graph
        .node(compiled.graph.canonical_order()[attention.nodes[0] as usize])
        .op
    else {
        panic!("the attention kernel runs the attention op")
    };
    assert!(
        causal,
        "the iota-built causal mask is recognized as causal: no mask tensor"
    );
}

#[test]
fn snapshot_fused_programs() {
    let mlp = graphc::compile(&mlp(&MlpConfig::default()).unwrap()).unwrap();
    insta::assert_snapshot!("mlp_kernels", graphc_compiler::kernel::print_program(&mlp.program));
    let block = graphc::compile(&gpt(&GptConfig::default()).unwrap()).unwrap();
    insta::assert_snapshot!(
        "transformer_block_kernels",
        graphc_compiler::kernel::print_program(&block.program)
    );
}

/// The GPU comparison's kernels are one kernel each, and small versions of them compute
/// what the interpreter computes.
#[test]
fn kernel_benchmarks_are_one_kernel_each() {
    use graphc::ir::DType;
    use graphc::models::kernel_bench;
    for (name, g) in kernel_bench::all().unwrap() {
        let c = graphc::compile(&g).unwrap();
        assert_eq!(
            c.program.kernels.len(),
            1,
            "{name}: {}",
            graphc_compiler::kernel::print_program(&c.program)
        );
    }
    for g in [
        kernel_bench::gelu_sigmoid(1000).unwrap(),
        kernel_bench::layernorm_gelu(8, 96, DType::F32).unwrap(),
        kernel_bench::softmax(8, 100).unwrap(),
    ] {
        let c = graphc::compile(&g).unwrap();
        let inputs = random_inputs(&g, 3);
        let want = graphc::ir::interpret(&g, &inputs).unwrap();
        let got = graphc::run_cpu(&c, inputs).unwrap();
        for (_, a, b) in zip_outputs(&got, &want).unwrap() {
            let err = relative_l2(a, b);
            assert!(err < 1e-6, "relative L2 error {err:.2e}");
        }
    }
}

/// The generated CUDA of three kernels of the block: the first layer norm (one row
/// kernel), the causal attention (scores, softmax and the product with v in one
/// kernel, q, k and v read through strided views of the qkv projection) and the first
/// MLP linear layer (cuBLASLt with bias, then the erf GELU, recognized as `gelu`, as a
/// generated epilogue).
#[test]
fn snapshot_transformer_block_cuda() {
    let block = graphc::compile(&gpt(&GptConfig::default()).unwrap()).unwrap();
    let p = &block.program;
    let pick =
        |pred: &dyn Fn(&graphc_compiler::kernel::Kernel) -> bool| p.kernels.iter().position(pred).expect("kernel");
    let ln = pick(&|k| k.name.contains("row_mean_mean"));
    let attention = pick(&|k| k.kind_name() == "attention");
    let order = block.graph.canonical_order();
    let fc1 = pick(&|k| {
        k.kind_name() == "matmul"
            && k.nodes
                .iter()
                .any(|&n| block.graph.node(order[n as usize]).op == graphc::ir::Op::Unary(graphc::ir::UnaryOp::Gelu))
    });
    let mut text = String::new();
    for k in [ln, attention, fc1] {
        let c = graphc_compiler::codegen::generate(p, k).unwrap();
        text.push_str(&format!("// ==== {} ({:?})\n", p.kernels[k].name, c.launch));
        if let Some(g) = &c.gemm {
            text.push_str(&format!("// gemm: {}\n", serde_json::to_string(g).unwrap()));
        }
        text.push_str(&c.source);
        text.push('\n');
    }
    insta::assert_snapshot!("transformer_block_cuda", text);
}

/// Memory plans of the examples and fixtures pass the plan verifier (no two
/// intermediates share an address while both are live, except an output written in
/// place of its input; offsets 256-byte aligned; lifetimes cover every use), the arena
/// is within 2% of the most bytes live at once, and the chosen schedule is the lowest
/// peak of the candidates.
#[test]
fn memory_plans_are_valid_and_tight() {
    use graphc_compiler::plan::verify_plan;
    let mut models = vec![
        ("mlp".to_string(), mlp(&MlpConfig::default()).unwrap()),
        ("block".to_string(), gpt(&GptConfig::default()).unwrap()),
    ];
    for name in ["gpt2", "bert", "llama", "vit"] {
        let path = repo_path(&format!("tests/fixtures/onnx/{name}/model.onnx"));
        models.push((name.to_string(), graphc::load_model(&path, &[]).unwrap()));
    }
    for (name, g) in models {
        let c = graphc::compile(&g).unwrap();
        let p = &c.plan;
        verify_plan(&c.program, p).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert!(p.buffers.iter().all(|b| b.offset % 256 == 0));
        assert!(p.arena_bytes >= p.lower_bound_bytes);
        assert!(p.ratio() <= 1.02, "{name}: arena / lower bound {:.3}", p.ratio());
        let best = c.schedule.candidates.iter().map(|(_, peak)| *peak).min().unwrap();
        assert_eq!(c.schedule.peak, best, "{name}: {:?}", c.schedule.candidates);
        assert!(p.fits());
        println!(
            "{name}: {} kernels, schedule {}, arena {} (lower bound {}, {:.3}x), {} in place",
            p.kernels,
            p.schedule,
            p.arena_bytes,
            p.lower_bound_bytes,
            p.ratio(),
            p.in_place
        );
    }
}

/// A 12-layer GPT (d_model 1024, 16 heads, batch 8, sequence 1024, bf16) is scheduled
/// and planned deterministically, with the arena at the lower bound. The times printed
/// are for `.ci/run`'s log; `cargo bench --bench plan` measures them (about 1 ms in
/// release builds), since a time bound in a test fails on a loaded machine.
#[test]
fn gpt12_plans_deterministically_at_its_lower_bound() {
    use graphc_compiler::plan::{apply_schedule, plan_memory, schedule, MemoryOptions};
    let g = gpt(&GptConfig {
        batch: 8,
        seq: 1024,
        d_model: 1024,
        heads: 16,
        layers: 12,
        dtype: graphc::ir::DType::BF16,
        seed: 0,
    })
    .unwrap();
    let t = std::time::Instant::now();
    let c = graphc::compile(&g).unwrap();
    println!("compile: {:.0} ms", t.elapsed().as_secs_f64() * 1e3);
    let mut times = Vec::new();
    for _ in 0..5 {
        let t = std::time::Instant::now();
        let s = schedule(&c.program);
        let p = apply_schedule(&c.program, &s.order);
        let mut plan = plan_memory(&p, &MemoryOptions::default()).unwrap();
        times.push(t.elapsed());
        // Scheduling the scheduled program keeps its order (under the name `program`).
        assert_eq!(s.order, (0..c.program.kernels.len()).collect::<Vec<_>>());
        plan.schedule.clone_from(&c.plan.schedule);
        // Deterministic (the serialized plan leaves out only the time it took).
        assert!(
            serde_json::to_string(&plan).unwrap() == serde_json::to_string(&c.plan).unwrap(),
            "planning is not deterministic"
        );
    }
    times.sort();
    let median = times[times.len() / 2];
    println!(
        "plan: {:.2} ms; arena {} MiB, lower bound {} MiB",
        median.as_secs_f64() * 1e3,
        c.plan.arena_bytes >> 20,
        c.plan.lower_bound_bytes >> 20
    );
    assert!(c.plan.ratio() <= 1.02);
}

/// A GEMM whose epilogue cuBLASLt cannot apply and no output can hold in place (two
/// stores read the product) writes its product to a scratch area: the plan places it
/// in the arena for that one step, with the size codegen asks for, and the verifier
/// rejects it on a live buffer. (The block's erf GELU after fc1 runs in place.)
#[test]
fn gemm_scratch_is_planned() {
    use graphc_compiler::plan::verify_plan;
    let block = graphc::compile(&gpt(&GptConfig::default()).unwrap()).unwrap();
    assert!(block.plan.scratch.is_empty(), "the block's GELU epilogue runs in place");
    let c = graphc::compile(&common::scratch_epilogue_model()).unwrap();
    assert!(!c.plan.scratch.is_empty(), "a generated GEMM epilogue with scratch");
    for s in &c.plan.scratch {
        let ck = graphc_compiler::codegen::generate(&c.program, s.step as usize).unwrap();
        assert_eq!(Some(s.bytes), ck.gemm.map(|g| g.scratch_bytes));
        assert_eq!(c.plan.steps[s.step as usize].scratch, Some(s.offset));
    }
    verify_plan(&c.program, &c.plan).unwrap();
    // On top of a buffer live at that step: an overlap.
    let mut bad = c.plan.clone();
    let (step, bytes) = (bad.scratch[0].step, bad.scratch[0].bytes);
    let victim = bad
        .buffers
        .iter()
        .find(|b| b.start <= step && step < b.end && b.offset + bytes <= bad.arena_bytes)
        .map(|b| b.offset)
        .unwrap();
    bad.scratch[0].offset = victim;
    bad.steps[step as usize].scratch = Some(victim);
    let e = verify_plan(&c.program, &bad).unwrap_err();
    assert!(e.contains("GEMM scratch") && e.contains("overlap"), "{e}");
}
