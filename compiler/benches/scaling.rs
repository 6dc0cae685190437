//! How compile time grows with a program's width: the wide programs of
//! `tests/plan_wide.rs` compiled at `n / 10` and `n`, timed (fastest of three) beside
//! the steps the stages count (`graphc_ir::work`). The test checks the counts, which do
//! not depend on the machine's load; this benchmark shows what they mean in time.
//!
//! `cargo bench -p graphc-compiler --bench scaling` prints a markdown table: n log n
//! measures 10-25x the time for 10x the size here (caches and the allocator included),
//! a quadratic step 100x.

#[path = "../tests/wide_programs/mod.rs"]
mod wide_programs;

use std::time::{Duration, Instant};

use graphc_compiler::passes::precision::Precision;
use graphc_compiler::{compile, CompileOptions};
use graphc_ir::work;
use graphc_ir::Graph;

/// The fastest of three runs of `f`, and the steps of the last.
fn timed(f: impl Fn()) -> (Duration, u64) {
    let mut best = Duration::MAX;
    let mut steps = 0;
    for _ in 0..3 {
        let t = Instant::now();
        let ((), w) = work::measure(&f);
        best = best.min(t.elapsed());
        steps = w.total();
    }
    (best, steps)
}

fn row(what: &str, n: usize, run: impl Fn(usize)) {
    let (t_small, s_small) = timed(|| run(n / 10));
    let (t_big, s_big) = timed(|| run(n));
    println!(
        "| {what} | {} / {n} | {:.1} ms / {:.1} ms | {:.1}x | {s_small} / {s_big} | {:.1}x |",
        n / 10,
        t_small.as_secs_f64() * 1e3,
        t_big.as_secs_f64() * 1e3,
        t_big.as_secs_f64() / t_small.as_secs_f64().max(1e-9),
        s_big as f64 / s_small.max(1) as f64
    );
}

fn main() {
    let compile_it = |g: &Graph| drop(compile(g, &CompileOptions::default()).unwrap());
    println!("| program | n / 10 / n | time | time ratio | steps | steps ratio |");
    println!("|---|---|---|---|---|---|");
    let build = |n| wide_programs::sum_of_inputs(n);
    row("sum of inputs (compile)", 20_000, |n| compile_it(&build(n)));
    row("sum of inputs (fusion)", 100_000, |n| {
        drop(graphc_compiler::fuse::fuse(&build(n)).unwrap())
    });
    let bf16 = CompileOptions {
        precision: Precision::Bf16,
        ..CompileOptions::default()
    };
    row("sum of one input (compile)", 20_000, |n| {
        compile_it(&wide_programs::sum_of_repeated_input(n, 1))
    });
    row("sum of one input, bf16 (compile)", 20_000, |n| {
        drop(compile(&wide_programs::sum_of_repeated_input(n, 1), &bf16).unwrap())
    });
    row("sum of weights (compile)", 20_000, |n| {
        compile_it(&wide_programs::sum_of_weights(n))
    });
    row("concat of matmuls (compile)", 50_000, |n| {
        compile_it(&wide_programs::matmuls(n, true))
    });
    row("chain of matmuls (compile)", 50_000, |n| {
        compile_it(&wide_programs::matmuls(n, false))
    });
}
