//! cuda-sim: the generated CUDA C itself, compiled for the host and run with a thread
//! (or fiber) per CUDA thread, against the arena executor; the PTX helpers' CPU bodies
//! by their small kernels; and bugs put into generated kernels, each of which cuda-sim
//! (plain, or under ASan/UBSan or TSan) must report.
//!
//! Without a host C++ compiler these tests say they skipped (`graphc_testkit::skip`),
//! unless `GRAPHC_REQUIRE` lists `cxx`, when they fail.

#[path = "../../ir/tests/common/random_graph.rs"]
mod random_graph;

mod seeded;
use seeded::{inputs, with_weights};

#[path = "../../compiler/tests/ptx_cases/mod.rs"]
mod ptx_cases;

use std::collections::HashMap;

use graphc_compiler::codegen::{self, CudaKernel};
use graphc_compiler::fuse::fuse;
use graphc_compiler::kernel::Program;
use graphc_compiler::plan::{plan_memory, MemoryOptions, MemoryPlan};
use graphc_ir::compare::{relative_l2, zip_outputs};
use graphc_ir::{interpret, DType, Graph, Tensor};
use graphc_runtime::cuda::sim::{self, run_kernel_source, Sanitize, SimArg, SimError, SimOptions, SimSession};
use graphc_runtime::cuda::CudaError;
use graphc_runtime::kernels::run_planned;
use graphc_testkit::{skip, Need};

/// Whether to run: a host C++ compiler is there, or (skip) it is not and not required.
fn have_cxx() -> bool {
    match sim::build::find_compiler() {
        Ok(_) => true,
        Err(e) => {
            skip(Need::Cxx, e);
            false
        }
    }
}

fn opts(sanitize: Sanitize) -> SimOptions {
    SimOptions {
        sanitize,
        ..SimOptions::default()
    }
}

/// Close as the GPU's result may be: floats within the dtype's relative L2, integers
/// and bools exactly.
fn close(a: &Tensor, b: &Tensor) -> bool {
    let tol = match a.ty().dtype {
        DType::F16 | DType::BF16 => 2e-2,
        DType::F32 | DType::F64 => 1e-5,
        _ => 0.0,
    };
    a.ty() == b.ty() && relative_l2(a, b) <= tol
}

/// A graph fused, planned and generated.
struct Built {
    graph: Graph,
    program: Program,
    plan: MemoryPlan,
    kernels: Vec<CudaKernel>,
}

fn build(g: Graph) -> Built {
    let program = fuse(&g).expect("fuse");
    let plan = plan_memory(&program, &MemoryOptions::default()).expect("plan");
    let kernels = codegen::generate_all(&program).expect("codegen");
    Built {
        graph: g,
        program,
        plan,
        kernels,
    }
}

impl Built {
    /// The arena executor's outputs.
    fn want(&self, ins: &HashMap<String, Tensor>) -> Vec<(String, Tensor)> {
        run_planned(&self.program, &self.plan, self.graph.weights(), ins).expect("arena executor")
    }

    /// cuda-sim's outputs with `kernels` (the generated ones, or edited).
    fn sim(
        &self,
        kernels: &[CudaKernel],
        ins: &HashMap<String, Tensor>,
        sanitize: Sanitize,
    ) -> Result<Vec<(String, Tensor)>, CudaError> {
        SimSession::with_kernels(&self.program, &self.plan, kernels, &opts(sanitize))?.run(self.graph.weights(), ins)
    }
}

fn parse(text: &str) -> Graph {
    graphc_ir::parse(text).expect("parse")
}

/// A sample of the random graphs of the fusion tests (every op kind and dtype): their
/// generated kernels, run by cuda-sim, give the arena executor's outputs. Every 10th
/// graph, plain, by default; `GRAPHC_SIM_GRAPHS=STEP[:address|thread]` runs every
/// STEP-th (1: all 400) under that sanitizer.
#[test]
fn random_graphs_through_cuda_sim_match_the_arena_executor() {
    if !have_cxx() {
        return;
    }
    let knob = std::env::var("GRAPHC_SIM_GRAPHS").unwrap_or_default();
    let (step, mode) = knob.split_once(':').unwrap_or((knob.as_str(), ""));
    let step: usize = step.parse().unwrap_or(10).max(1);
    let mode = match mode {
        "address" => Sanitize::Address,
        "thread" => Sanitize::Thread,
        _ => Sanitize::None,
    };
    let (mut checked, mut launches) = (0, 0);
    for seed in (0..400).step_by(step) {
        let g = with_weights(random_graph::random_graph(seed), seed);
        let program = fuse(&g).unwrap_or_else(|e| panic!("graph {seed}: fuse failed: {e}"));
        let Ok(kernels) = codegen::generate_all(&program) else {
            continue;
        };
        let ins = inputs(&g, seed);
        if interpret(&g, &ins).is_err() {
            continue;
        }
        let plan = plan_memory(&program, &MemoryOptions::default()).expect("memory plan");
        let b = Built {
            graph: g,
            program,
            plan,
            kernels,
        };
        let want = b.want(&ins);
        let mut session = SimSession::with_kernels(&b.program, &b.plan, &b.kernels, &opts(mode))
            .unwrap_or_else(|e| panic!("graph {seed}: {e}"));
        launches += session.launch_plan().launches.len();
        let got = session
            .run(b.graph.weights(), &ins)
            .unwrap_or_else(|e| panic!("graph {seed}: {e}\n{}", graphc_ir::print(&b.graph)));
        for (n, a, w) in zip_outputs(&got, &want).unwrap_or_else(|e| panic!("graph {seed}: {e}")) {
            assert!(
                close(a, w),
                "graph {seed}, output {n}: cuda-sim {a} vs arena {w} (rel L2 {:e})\n{}",
                relative_l2(a, w),
                graphc_ir::print(&b.graph)
            );
        }
        checked += 1;
    }
    eprintln!(
        "{checked} random graphs, {launches} launches through cuda-sim ({})",
        mode.name()
    );
    assert!(
        checked >= 40 / step,
        "only {checked} random graphs ran through cuda-sim"
    );
}

/// The PTX helpers' CPU bodies (f16 conversions, mma.sync m16n8k16, ldmatrix, cp.async)
/// give the PTX ISA's results, by their small kernels.
#[test]
fn ptx_helpers_run_on_cuda_sim_as_the_isa_defines() {
    if !have_cxx() {
        return;
    }
    let cases = ptx_cases::cases();
    assert!(cases.len() >= 12);
    for mode in [Sanitize::None, Sanitize::Address] {
        for c in &cases {
            let mut args: Vec<SimArg> = c
                .buffers
                .iter()
                .enumerate()
                .map(|(i, b)| SimArg {
                    data: b.clone(),
                    read: true,
                    write: i == c.output,
                    alias: None,
                })
                .collect();
            run_kernel_source(
                &c.name,
                &c.source,
                &c.entry,
                c.grid_blocks,
                c.block_threads,
                0,
                &mut args,
                &opts(mode),
            )
            .unwrap_or_else(|e| panic!("{} ({}): {e}", c.name, mode.name()));
            (c.check)(&args[c.output].data, ptx_cases::Exec::Sim)
                .unwrap_or_else(|e| panic!("{} ({}): {e}", c.name, mode.name()));
        }
    }
}

/// `f32[n]` in, `exp(x) * x` out: one vectorized kernel with a scalar tail (n % 4 = 3).
fn vector_kernel() -> Built {
    build(parse(
        "graph {\n  %0 = input \"x\" : f32[4099]\n  %1 = exp(%0) : f32[4099]\n  %2 = mul(%1, %0) : f32[4099]\n  output \"y\" = %2\n}\n",
    ))
}

/// The generated kernels with `from` replaced by `to` in kernel `k`'s source (which
/// must contain it).
fn inject(kernels: &[CudaKernel], k: usize, from: &str, to: &str) -> Vec<CudaKernel> {
    let mut v = kernels.to_vec();
    assert!(
        v[k].source.contains(from),
        "kernel {k} has no `{from}`:\n{}",
        v[k].source
    );
    v[k].source = v[k].source.replace(from, to);
    v
}

fn sim_error(r: Result<Vec<(String, Tensor)>, CudaError>) -> String {
    match r {
        Err(CudaError::Sim(e @ SimError::Kernel { .. })) => e.to_string(),
        Err(e) => panic!("expected a kernel error from cuda-sim, got: {e}"),
        Ok(_) => panic!("cuda-sim ran the broken kernel without an error"),
    }
}

#[test]
fn the_unchanged_kernels_pass_plain_and_sanitized() {
    if !have_cxx() {
        return;
    }
    let b = vector_kernel();
    let ins = inputs(&b.graph, 1);
    let want = b.want(&ins);
    for mode in [Sanitize::None, Sanitize::Address, Sanitize::Thread] {
        let got = b
            .sim(&b.kernels, &ins, mode)
            .unwrap_or_else(|e| panic!("{}: {e}", mode.name()));
        for (n, a, w) in zip_outputs(&got, &want).unwrap() {
            assert!(close(a, w), "{n} ({})", mode.name());
        }
    }
}

/// An off-by-one in the tail loop's bound: the write past the end lands in the guard
/// bytes (plain), the read past the end is ASan's heap-buffer-overflow, naming the
/// kernel and its buffer.
#[test]
fn an_off_by_one_index_is_caught() {
    if !have_cxx() {
        return;
    }
    let b = vector_kernel();
    let ins = inputs(&b.graph, 1);
    let bad = inject(&b.kernels, 0, "i < 4099;", "i <= 4099;");
    let plain = sim_error(b.sim(&bad, &ins, Sanitize::None));
    assert!(plain.contains("past the end of argument 1"), "{plain}");
    assert!(plain.contains("k0_"), "names the kernel: {plain}");
    let asan = sim_error(b.sim(&bad, &ins, Sanitize::Address));
    assert!(asan.contains("heap-buffer-overflow"), "{asan}");
    assert!(asan.contains("0 bytes past the end of argument 0"), "{asan}");
    assert!(asan.contains("argument 0 = p0: b0"), "names the buffer: {asan}");
}

/// The scalar tail starting one element late: that element is never written, so it
/// keeps the poison cuda-sim fills outputs with, and the output differs.
#[test]
fn a_misplaced_vector_tail_is_caught() {
    if !have_cxx() {
        return;
    }
    let b = vector_kernel();
    let ins = inputs(&b.graph, 1);
    let want = b.want(&ins);
    let bad = inject(&b.kernels, 0, "4096 + tid", "4097 + tid");
    let got = b.sim(&bad, &ins, Sanitize::None).expect("runs");
    let (_, a, w) = zip_outputs(&got, &want).unwrap().remove(0);
    assert!(!close(a, w), "the unwritten element went unnoticed");
    assert!(a.to_f64_vec()[4096].is_nan(), "element 4096 keeps the NaN poison");
}

/// Signed overflow in index arithmetic is UBSan's error under `--sanitize address`.
#[test]
fn signed_overflow_in_an_index_is_caught() {
    if !have_cxx() {
        return;
    }
    let b = vector_kernel();
    let ins = inputs(&b.graph, 1);
    let bad = inject(
        &b.kernels,
        0,
        "const int i = v * 4;",
        "const int i = (v + 2147483000) * 4 - 2147483000 * 4;",
    );
    let e = sim_error(b.sim(&bad, &ins, Sanitize::Address));
    assert!(e.contains("signed integer overflow"), "{e}");
}

/// A row kernel with a block per row reduces through shared memory between barriers.
fn block_row_kernel() -> (Built, usize) {
    let gb = graphc_ir::GraphBuilder::new();
    let x = gb.input("x", DType::F32, [8, 4096]);
    gb.output("y", graphc_ir::nn::softmax(x, -1));
    let b = build(gb.finish().expect("softmax graph"));
    let k = b
        .kernels
        .iter()
        .position(|k| k.source.contains("__syncthreads();"))
        .expect("a kernel with barriers");
    (b, k)
}

/// Without its barriers, the block reduction reads shared memory before the other
/// warps wrote it: wrong numbers on cuda-sim, a data race under TSan.
#[test]
fn a_missing_barrier_is_caught() {
    if !have_cxx() {
        return;
    }
    let (b, k) = block_row_kernel();
    let ins = inputs(&b.graph, 2);
    let want = b.want(&ins);
    let bad = inject(&b.kernels, k, "__syncthreads();", "");
    let got = b.sim(&bad, &ins, Sanitize::None).expect("runs");
    let (_, a, w) = zip_outputs(&got, &want).unwrap().remove(0);
    assert!(!close(a, w), "the missing barrier went unnoticed without TSan");
    let e = sim_error(b.sim(&bad, &ins, Sanitize::Thread));
    assert!(e.contains("ThreadSanitizer: data race"), "{e}");
}

/// An in-place kernel whose threads write the element the next thread reads: TSan's
/// data race, naming the kernel.
#[test]
fn a_racy_in_place_write_is_caught() {
    if !have_cxx() {
        return;
    }
    let b = vector_kernel();
    let src = &b.kernels[0];
    let racy = src
        .source
        .replace("*(g_vec16*)(p1 + i) =", "*(g_vec16*)(p1 + (i + 4) % 4096) =");
    assert_ne!(racy, src.source);
    let x: Vec<u8> = (0..4099u32).flat_map(|i| (i as f32 * 1e-3).to_le_bytes()).collect();
    let n = x.len();
    let run = |source: &str, mode| {
        let mut args = vec![
            SimArg::input(x.clone()),
            SimArg {
                data: vec![0; n],
                write: true,
                alias: Some(0),
                ..SimArg::default()
            },
        ];
        run_kernel_source(&src.name, source, &src.entry, 4, 256, 0, &mut args, &opts(mode)).map(|_| args)
    };
    let ok = run(&src.source, Sanitize::Thread).expect("in place, each thread its own elements: no race");
    assert_eq!(ok[0].data.len(), n);
    let e = run(&racy, Sanitize::Thread)
        .expect_err("the race went unnoticed")
        .to_string();
    assert!(e.contains("ThreadSanitizer: data race"), "{e}");
    assert!(e.contains(&src.name), "names the kernel: {e}");
}

/// Barriers and collectives that cannot complete are errors, not hangs.
#[test]
fn divergent_barriers_and_shuffles_are_reported() {
    if !have_cxx() {
        return;
    }
    // The same reports (and no sanitizer's) in every mode: the abort path unwinds
    // fibers under ASan's and TSan's fiber annotations too.
    for mode in [Sanitize::None, Sanitize::Address, Sanitize::Thread] {
        let run = |body: &str| {
            let src = format!("extern \"C\" __global__ void g_t(float* __restrict__ p0) {{\n{body}\n}}\n");
            let mut args = vec![SimArg::output(64 * 4)];
            run_kernel_source("t", &src, "g_t", 1, 64, 0, &mut args, &opts(mode)).map(|_| args)
        };
        let ok = run("  float v = (float)threadIdx.x;\n  v += __shfl_xor_sync(0xffffffffu, v, 1);\n  __syncthreads();\n  p0[threadIdx.x] = v;").unwrap();
        let v: Vec<f32> = ok[0]
            .data
            .chunks(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect();
        assert_eq!(v[0], 1.0);
        assert_eq!(v[5], 9.0);
        let e = run("  if (threadIdx.x < 32) __syncthreads();\n  p0[threadIdx.x] = 0.0f;")
            .unwrap_err()
            .to_string();
        assert!(e.contains("divergent code"), "{} {e}", mode.name());
        let e = run("  float v = 1.0f;\n  if (threadIdx.x % 2 == 0) v = __shfl_xor_sync(0xffffffffu, v, 1);\n  p0[threadIdx.x] = v;")
            .unwrap_err()
            .to_string();
        assert!(e.contains("exited while lanes"), "{e}");
        let e = run("  float v = 1.0f;\n  if (threadIdx.x == 0) v = __shfl_sync(0x1u, v, 3);\n  p0[threadIdx.x] = v;")
            .unwrap_err()
            .to_string();
        assert!(e.contains("not in the mask"), "{e}");
    }
}

/// The cache folder as a hostile user may leave it: a link (to a file outside) or a
/// FIFO where a kernel's object goes is neither followed, read nor replaced.
#[test]
fn planted_links_and_fifos_in_the_cache_are_refused() {
    if !have_cxx() {
        return;
    }
    let dir = std::env::temp_dir().join(format!("graphc-sim-hostile-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let victim = dir.join("victim.txt");
    std::fs::write(&victim, b"keep me").unwrap();
    let b = vector_kernel();
    let k = &b.kernels[0];
    let compiler = sim::build::find_compiler().unwrap();
    let (_, obj) = sim::build::object(&compiler, Sanitize::None, &dir, &k.name, &k.source, &k.entry).unwrap();
    let o = SimOptions {
        cache_dir: Some(dir.clone()),
        ..SimOptions::default()
    };
    std::os::unix::fs::symlink(&victim, &obj).unwrap();
    let e = SimSession::with_kernels(&b.program, &b.plan, &b.kernels, &o)
        .err()
        .expect("refused");
    assert!(e.to_string().contains("is not a regular file"), "{e}");
    assert_eq!(std::fs::read(&victim).unwrap(), b"keep me");
    assert!(std::fs::symlink_metadata(&obj).unwrap().file_type().is_symlink());
    std::fs::remove_file(&obj).unwrap();
    let status = std::process::Command::new("mkfifo").arg(&obj).status().unwrap();
    assert!(status.success());
    let e = SimSession::with_kernels(&b.program, &b.plan, &b.kernels, &o)
        .err()
        .expect("refused");
    assert!(e.to_string().contains("is not a regular file"), "{e}");
    std::fs::remove_file(&obj).unwrap();
    let ins = inputs(&b.graph, 1);
    let got = SimSession::with_kernels(&b.program, &b.plan, &b.kernels, &o)
        .and_then(|mut s| s.run(b.graph.weights(), &ins))
        .expect("a clean cache works");
    assert_eq!(got.len(), 1);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A launch that kills the shared runner (a sanitizer's report) fails only itself: a
/// session made before it runs on, in a runner started again.
#[test]
fn one_sessions_failure_is_not_anothers() {
    if !have_cxx() {
        return;
    }
    let b = vector_kernel();
    let ins = inputs(&b.graph, 1);
    let want = b.want(&ins);
    let o = opts(Sanitize::Address);
    let mut good = SimSession::with_kernels(&b.program, &b.plan, &b.kernels, &o).unwrap();
    let bad = inject(&b.kernels, 0, "i < 4099;", "i <= 4099;");
    let mut broken = SimSession::with_kernels(&b.program, &b.plan, &bad, &o).unwrap();
    let e = sim_error(broken.run(b.graph.weights(), &ins));
    assert!(e.contains("heap-buffer-overflow"), "{e}");
    for _ in 0..2 {
        let got = good.run(b.graph.weights(), &ins).expect("the other session runs on");
        let (_, a, w) = zip_outputs(&got, &want).unwrap().remove(0);
        assert!(close(a, w));
    }
    sim_error(broken.run(b.graph.weights(), &ins));
}
