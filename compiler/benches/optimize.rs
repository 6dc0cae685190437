//! Compile-time benchmark: the optimizer's time, e-graph size and memory, then fusion
//! and CUDA code generation of its result, on GPT-style stacks of 1 to 96 layers and on
//! a 100k-node elementwise graph.
//!
//! `cargo bench -p graphc-compiler --bench optimize` prints a markdown table. Times
//! are the median of a few runs. Memory is the process's peak RSS (`VmHWM` from
//! /proc/self/status) after each case: a high-water mark of the whole process, so it
//! only grows, and a case's value includes everything before it (cases run smallest
//! first).

use std::time::{Duration, Instant};

use graphc_compiler::codegen::generate_all;
use graphc_compiler::fuse::fuse_with_report;
use graphc_compiler::optimize::{optimize, OptimizeOptions, OptimizeReport};
use graphc_ir::nn::{self, GeluApprox};
use graphc_ir::{DType, Graph, GraphBuilder, Tensor, TensorType, Value};

const RUNS: usize = 5;

/// A GPT-style stack of pre-LN blocks with small dims: only the graph's size matters.
fn gpt(layers: usize) -> Graph {
    let (batch, seq, d, heads) = (1, 16, 64, 4);
    let b = GraphBuilder::new();
    let mut seed = 0u64;
    let mut linear = |name: &str, x, d_in, d_out| linear(&b, &mut seed, name, x, d_in, d_out);
    let mut x = b.input("x", DType::F32, [batch, seq, d]);
    for l in 0..layers {
        let h = ln(&b, x, &format!("h{l}.ln1"), d);
        let qkv = linear(&format!("h{l}.attn.qkv"), h, d, 3 * d);
        let a = nn::causal_attention(qkv, heads);
        let a = linear(&format!("h{l}.attn.proj"), a, d, d);
        x = x + a;
        let h = ln(&b, x, &format!("h{l}.ln2"), d);
        let h = linear(&format!("h{l}.mlp.fc1"), h, d, 4 * d);
        let h = nn::gelu(h, GeluApprox::Erf);
        let h = linear(&format!("h{l}.mlp.fc2"), h, 4 * d, d);
        x = x + h;
    }
    b.output("y", x);
    b.finish().expect("the GPT stack builds")
}

fn linear<'b>(b: &'b GraphBuilder, seed: &mut u64, name: &str, x: Value<'b>, d_in: usize, d_out: usize) -> Value<'b> {
    let mut param = |name: String, shape: &[usize]| {
        *seed += 1;
        b.param(&name, Tensor::randn(&TensorType::new(DType::F32, shape), 0.02, *seed))
    };
    let w = param(format!("{name}.weight"), &[d_out, d_in]);
    let bias = param(format!("{name}.bias"), &[d_out]);
    nn::linear(x, w, Some(bias))
}

fn ln<'b>(b: &'b GraphBuilder, x: Value<'b>, name: &str, d: usize) -> Value<'b> {
    let g = b.param(
        &format!("{name}.weight"),
        Tensor::full(&TensorType::new(DType::F32, [d]), 1.0),
    );
    let beta = b.param(
        &format!("{name}.bias"),
        Tensor::full(&TensorType::new(DType::F32, [d]), 0.0),
    );
    nn::layer_norm(x, Some(g), Some(beta), 1e-5)
}

/// About `n` elementwise ops on a small input: a chain of add/mul/exp/neg where every
/// fourth step recomputes an earlier subexpression (CSE has work) and some steps add
/// zero or multiply by one (rules have work).
fn elementwise(n: usize) -> Graph {
    let b = GraphBuilder::new();
    let x = b.input("x", DType::F32, [4]);
    let zero = b.constant(Tensor::full(&TensorType::new(DType::F32, [4]), 0.0));
    let one = b.constant(Tensor::full(&TensorType::new(DType::F32, [4]), 1.0));
    let mut recent = vec![x];
    let mut h = x;
    let mut count = 0;
    while count < n {
        let prev = recent[recent.len().saturating_sub(3)];
        h = match count % 8 {
            0 => h + prev,
            1 => h * prev,
            2 => -(h * 0.5).exp(),
            3 => h + zero,
            4 => (prev + recent[recent.len().saturating_sub(2)]) * h, // repeats step 0's shape
            5 => h * one,
            6 => -(-h) + prev,
            _ => (prev + recent[recent.len().saturating_sub(2)]) + h,
        };
        recent.push(h);
        count = b.with_graph(|g| g.len());
    }
    b.output("y", h);
    b.finish().expect("the elementwise graph builds")
}

/// The process's peak resident set size in KiB (`VmHWM`), if /proc is there.
fn peak_rss_kib() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

struct Row {
    name: String,
    report: OptimizeReport,
    median: Duration,
    peak_before: Option<u64>,
    peak_after: Option<u64>,
    kernels: usize,
    fuse: Duration,
    codegen: Duration,
}

fn median(v: Vec<Duration>) -> Duration {
    let mut secs: Vec<f64> = v.iter().map(Duration::as_secs_f64).collect();
    Duration::from_secs_f64(graphc_ir::compare::median(&mut secs))
}

fn bench(name: &str, g: &Graph) -> Row {
    let peak_before = peak_rss_kib();
    let mut times = Vec::new();
    let mut report = None;
    let mut optimized = None;
    for _ in 0..RUNS {
        let start = Instant::now();
        let (out, r) = optimize(g, &OptimizeOptions::default()).expect("optimize succeeds");
        times.push(start.elapsed());
        optimized = Some(out);
        report = Some(r);
    }
    let optimized = optimized.expect("at least one run");
    let (mut fuse_times, mut codegen_times, mut kernels) = (Vec::new(), Vec::new(), 0);
    for _ in 0..RUNS {
        let start = Instant::now();
        let (program, _) = fuse_with_report(&optimized).expect("fusion succeeds");
        fuse_times.push(start.elapsed());
        kernels = program.kernels.len();
        let start = Instant::now();
        generate_all(&program).expect("codegen succeeds");
        codegen_times.push(start.elapsed());
    }
    Row {
        name: name.to_string(),
        report: report.expect("at least one run"),
        median: median(times),
        peak_before,
        peak_after: peak_rss_kib(),
        kernels,
        fuse: median(fuse_times),
        codegen: median(codegen_times),
    }
}

fn mib(kib: Option<u64>) -> String {
    kib.map_or("?".into(), |k| format!("{:.1}", k as f64 / 1024.0))
}

fn main() {
    // `cargo bench` passes `--bench`; a filter argument selects cases by name.
    let filter: Vec<String> = std::env::args().skip(1).filter(|a| !a.starts_with("--")).collect();
    let wanted = |name: &str| filter.is_empty() || filter.iter().any(|f| name.contains(f.as_str()));
    let mut rows = Vec::new();
    for layers in [1, 12, 48, 96] {
        let name = format!("gpt {layers} layers");
        if wanted(&name) {
            rows.push(bench(&name, &gpt(layers)));
        }
    }
    if wanted("elementwise 100k") {
        rows.push(bench("elementwise 100k", &elementwise(100_000)));
    }

    println!(
        "optimize, then fuse and generate CUDA C; medians of {RUNS} runs (default limits); peak RSS is the \
         process high-water mark\n"
    );
    println!(
        "| graph | nodes before | nodes after | e-graph nodes | e-graph classes | iterations | stop reason \
         | optimize (median) | optimize / node | peak RSS before → after (MiB) | kernels | fuse | codegen |"
    );
    println!("|---|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|");
    for r in &rows {
        let per_node = r.median.as_secs_f64() * 1e6 / r.report.nodes_before as f64;
        println!(
            "| {} | {} | {} | {} | {} | {} | {} | {:.1} ms | {:.2} µs | {} → {} | {} | {:.1} ms | {:.1} ms |",
            r.name,
            r.report.nodes_before,
            r.report.nodes_after,
            r.report.egraph_nodes,
            r.report.egraph_classes,
            r.report.iterations,
            r.report.stop_reason,
            r.median.as_secs_f64() * 1e3,
            per_node,
            mib(r.peak_before),
            mib(r.peak_after),
            r.kernels,
            r.fuse.as_secs_f64() * 1e3,
            r.codegen.as_secs_f64() * 1e3,
        );
    }
}
