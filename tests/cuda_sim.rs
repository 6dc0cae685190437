//! `--device cuda-sim` end to end: every example and fixture's launch list, with each
//! generated kernel's own CUDA C built for the host, gives the CPU executor's and the
//! interpreter's outputs, plain and under ASan/UBSan and TSan; every self-test case
//! passes; the CLI runs it, checks it, and says when it cannot (no host compiler: exit
//! code 3).
//!
//! The self-test runs plain and under both sanitizers. Without a host C++ compiler
//! these tests say they skipped, unless `GRAPHC_REQUIRE` lists `cxx`.

mod common;

use std::collections::HashMap;
use std::process::Command;

use common::{example_models, fixtures, random_inputs, repo_path};
use graphc::cuda::sim::{Sanitize, SimOptions, SimSession};
use graphc::ir::Tensor;
use graphc::selftest::compare_outputs;
use graphc_testkit::{skip, Need};

fn have_cxx() -> bool {
    match graphc::cuda::sim::build::find_compiler() {
        Ok(_) => true,
        Err(e) => {
            skip(Need::Cxx, e);
            false
        }
    }
}

/// `got` against `want` within the self-test's tolerances, every output.
fn check(name: &str, what: &str, got: &[(String, Tensor)], want: &[(String, Tensor)]) {
    let checks = compare_outputs(got, want, false).unwrap_or_else(|e| panic!("{name}: {e}"));
    for c in checks {
        assert!(
            c.pass,
            "{name}/{}: cuda-sim vs {what}: relative L2 {:.3e} (tolerance {:.0e})",
            c.name, c.rel_l2, c.tolerance
        );
    }
}

/// `g` on cuda-sim (plain, then under both sanitizers, which must report nothing)
/// against the CPU executor and the interpreter.
fn run_sim(name: &str, g: &graphc::ir::Graph, seed: u64) {
    let c = graphc::compile(g).unwrap_or_else(|e| panic!("{name}: {e}"));
    let inputs = random_inputs(g, seed);
    let want = graphc::run_cpu(&c, inputs.clone()).unwrap();
    let reference = graphc::ir::interpret(g, &inputs).unwrap_or_else(|e| panic!("{name}: interpreter: {e}"));
    for sanitize in [Sanitize::None, Sanitize::Address, Sanitize::Thread] {
        let opts = SimOptions {
            sanitize,
            ..SimOptions::default()
        };
        let name = format!("{name} ({})", sanitize.name());
        let mut s = SimSession::new(&c, &opts).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert!(
            s.launch_plan().kernel_launch_count() > 0,
            "{name}: runs generated kernels"
        );
        let got = s
            .run(c.graph.weights(), &inputs)
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        check(&name, "the CPU executor", &got, &want);
        check(&name, "the interpreter", &got, &reference);
    }
}

#[test]
fn examples_run_on_cuda_sim_as_on_the_cpu() {
    if !have_cxx() {
        return;
    }
    for (name, g) in example_models() {
        run_sim(&name, &g, 5);
    }
}

#[test]
fn fixtures_run_on_cuda_sim_as_on_the_cpu() {
    if !have_cxx() {
        return;
    }
    for (name, dims) in fixtures() {
        let dir = repo_path(&format!("tests/fixtures/onnx/{name}"));
        let g = graphc::load_model(&dir.join("model.onnx"), &dims).unwrap();
        run_sim(name, &g, 3);
    }
}

/// Every self-test case (every kind of launch) passes on cuda-sim: plain, under
/// AddressSanitizer + UBSan, and under ThreadSanitizer (which reports nothing).
fn selftest_cases_pass(sanitize: Sanitize) {
    if !have_cxx() {
        return;
    }
    let cases = graphc::selftest::cases().unwrap();
    let opts = SimOptions {
        sanitize,
        ..SimOptions::default()
    };
    let mut sim = |c: &graphc::Compiled, inputs: &HashMap<String, Tensor>| {
        graphc::cuda::sim::run_sim(c, inputs, &opts).map_err(graphc::Error::Cuda)
    };
    let mut failed = Vec::new();
    for case in &cases {
        let r = graphc::selftest::run_case(case, false, &mut sim);
        if !r.pass {
            failed.push(format!("{}: {:?} {} {:.2e}", r.name, r.error, r.worst_output, r.rel_l2));
        }
    }
    assert!(
        failed.is_empty(),
        "{} under {}: {failed:#?}",
        cases.len(),
        sanitize.name()
    );
}

#[test]
fn selftest_cases_pass_on_cuda_sim() {
    selftest_cases_pass(Sanitize::None);
}

#[test]
fn selftest_cases_pass_on_cuda_sim_under_asan_and_ubsan() {
    selftest_cases_pass(Sanitize::Address);
}

#[test]
fn selftest_cases_pass_on_cuda_sim_under_tsan() {
    selftest_cases_pass(Sanitize::Thread);
}

fn graphc() -> Command {
    Command::new(env!("CARGO_BIN_EXE_graphc"))
}

#[test]
fn the_cli_runs_and_checks_on_cuda_sim() {
    if !have_cxx() {
        return;
    }
    let model = repo_path("examples/models/transformer_block.gir");
    let out = graphc()
        .args(["run", model.to_str().unwrap(), "--device", "cuda-sim", "--check"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}\n{}", String::from_utf8_lossy(&out.stderr));
    assert!(
        text.contains("device   cuda-sim: the launch list of NVIDIA GeForce RTX 4090 D"),
        "{text}"
    );
    assert!(text.contains("check    y rel_l2"), "{text}");
    let out = graphc()
        .args([
            "selftest",
            "--device",
            "cuda-sim",
            "--filter",
            "row softmax f32 [64,100]",
        ])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert!(text.contains("1 of 1 cases pass on cuda-sim"), "{text}");
    let out = graphc()
        .args([
            "bench",
            model.to_str().unwrap(),
            "--device",
            "cuda-sim",
            "--warmup",
            "0",
            "--iters",
            "1",
        ])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert!(text.contains("bench    cuda-sim (on the host, not GPU time)"), "{text}");
}

#[test]
fn cuda_sim_without_a_compiler_is_exit_code_3_and_options_need_it() {
    let model = repo_path("examples/models/transformer_block.gir");
    let out = graphc()
        .args(["run", model.to_str().unwrap(), "--device", "cuda-sim"])
        .env("CXX", "/nonexistent/c++")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(3), "{err}");
    assert!(err.contains("cuda-sim needs a host C++ compiler"), "{err}");
    assert!(err.contains("--device cpu"), "{err}");
    let out = graphc()
        .args([
            "run",
            model.to_str().unwrap(),
            "--device",
            "cpu",
            "--sanitize",
            "address",
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("options of --device cuda-sim"));
}

/// A bf16 value a fused kernel stores is the value the kernel's other expressions read:
/// rounded where it is defined, not only at its store. An elementwise kernel (`t = 3 *
/// f32(s)` beside `s = x + y`) and a row kernel (the mean of `f32(s)`, beside `s`) give
/// exactly what a kernel loading the stored `s` would compute, which is what makes a
/// value recomputed in the backward from a stored tensor equal to the forward's (the
/// sum of two bf16 values is exact in f32 and almost never a bf16 value).
#[test]
fn a_stored_bf16_value_is_the_value_its_kernel_reads() {
    use graphc::ir::{DType, GraphBuilder, TensorType};
    if !have_cxx() {
        return;
    }
    let (n, d) = (64, 96);
    let b = GraphBuilder::new();
    let x = b.input("x", DType::BF16, [n, d]);
    let y = b.input("y", DType::BF16, [n, d]);
    let s = x + y;
    b.output("s", s);
    b.output("t", s.cast(DType::F32) * 3.0);
    b.output("m", s.cast(DType::F32).mean(&[-1], false));
    let g = b.finish().unwrap();
    let c = graphc::compile(&g).unwrap();
    let ty = TensorType::new(DType::BF16, [n, d]);
    let inputs: HashMap<String, Tensor> = [
        ("x".to_string(), Tensor::randn(&ty, 1.0, 1)),
        ("y".to_string(), Tensor::randn(&ty, 1.0, 2)),
    ]
    .into();
    let mut sim = SimSession::new(&c, &SimOptions::default()).unwrap();
    let out: HashMap<String, Tensor> = sim.run(c.graph.weights(), &inputs).unwrap().into_iter().collect();
    let s = out["s"].to_f64_vec();
    let t = out["t"].to_f64_vec();
    assert!(
        s.iter().zip(&t).all(|(s, t)| 3.0 * s == *t),
        "t = 3 * f32(s) for the stored s"
    );
    let m = out["m"].to_f64_vec();
    for (r, m) in m.iter().enumerate() {
        let want = s[r * d..(r + 1) * d].iter().sum::<f64>() / d as f64;
        assert!((m - want).abs() <= 1e-6 * want.abs().max(1.0), "row {r}: {m} vs {want}");
    }
}

#[test]
fn cross_entropy_stores_its_shifted_logits_in_the_sums_pass_in_place() {
    // The self-test cases run them (plain, ASan, TSan); here: the kernels they are.
    // Rows of 20,000 bf16 start 16-byte aligned; of 20,001 anywhere: the vectors of a
    // row start at its first aligned element, the elements before and after them apart.
    for (n, shifted) in [(20000, false), (20001, true)] {
        let case = graphc::selftest::cases()
            .unwrap()
            .into_iter()
            .find(|c| c.name.starts_with(&format!("row cross-entropy bf16 [8,{n}]")))
            .expect("the case");
        let compiled = graphc::compile(&case.graph).unwrap();
        let p = &compiled.program;
        let k = p
            .kernels
            .iter()
            .position(|k| matches!(k.kind, graphc_compiler::kernel::KernelKind::Row(_)))
            .expect("a row kernel");
        let src = graphc_compiler::codegen::generate(p, k).unwrap().source;
        // Two passes over the row (the max; the sum with the stores), the label's logit
        // read before the second, then a barrier before any store.
        assert_eq!(src.matches("for (int ci = t;").count(), 2, "{src}");
        assert_eq!(src.contains("const int h_ = "), shifted, "{src}");
        assert_eq!(
            src.matches("for (int e = t;").count(),
            if shifted { 2 } else { 0 },
            "{src}"
        );
        assert!(src.contains("reduce_sum over the row, and the stores"), "{src}");
        let pf = src.find(" pf2_").expect("a prefetch");
        let sync = src[pf..].find("__syncthreads();").map(|i| i + pf).unwrap();
        assert!(sync < src.find("and the stores").unwrap(), "{src}");
        // The shifted logits take the logits' storage.
        let writes = p.kernels[k].writes();
        let reuse = compiled
            .plan
            .buffers
            .iter()
            .find(|b| writes.contains(&b.buffer) && b.reuses.is_some());
        assert!(reuse.is_some(), "no store in place: {:?}", compiled.plan.buffers);
    }
}

#[test]
fn a_transpose_of_heads_moves_vectors_along_the_head_dim() {
    // The self-test case runs it (plain, ASan, TSan); here: the path it takes.
    let case = graphc::selftest::cases()
        .unwrap()
        .into_iter()
        .find(|c| c.name.starts_with("elementwise bf16 heads transposed"))
        .expect("the case");
    let compiled = graphc::compile(&case.graph).unwrap();
    assert_eq!(compiled.program.kernels.len(), 1);
    let src = graphc_compiler::codegen::generate(&compiled.program, 0).unwrap().source;
    assert!(
        src.contains("// strided vectors: collapsed space [2, 6, 4, 16], 4 elements"),
        "{src}"
    );
    // x by 8-byte vectors (4 bf16), the scale one element a step, y by 16-byte vectors.
    assert!(src.contains("*(g_vec8*)a0 = *(const g_vec8*)(p0 + "), "{src}");
    assert!(src.contains("const float s1 = p1["), "{src}");
    assert!(src.contains("*(g_vec16*)(p2 + "), "{src}");
}
