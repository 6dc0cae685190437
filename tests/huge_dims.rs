//! Compile work and host memory are bounded whatever the values of symbolic
//! dimensions: GPT-2 with a dynamic batch plans at batch 2^24 (2.3 TiB of activations)
//! with the steps (`graphc_ir::work`) of batch 2^20, none of batch size, and its plan's
//! sizes are exactly those of a smaller batch scaled up. (One test in its
//! own binary: it reads the process's peak resident memory.)

mod common;

use common::repo_path;
use graphc::Compiled;
use graphc_ir::work::{self, Work};
use graphc_testkit::alloc::{self, Allocs};

#[global_allocator]
static ALLOC: alloc::Counting = alloc::Counting;

const DYNAMIC: &str = "tests/fixtures/onnx/gpt2_dynamic/model.onnx";
const SEQ: usize = 64;

/// Load and compile at `batch` (seq 64): the compiled model, the steps and allocations.
fn plan(batch: usize) -> (Compiled, Work, Allocs) {
    let dims = [("batch".to_string(), batch), ("seq".to_string(), SEQ)];
    let ((c, w), a) = alloc::measure(|| {
        work::measure(|| {
            let g = graphc::load_model(&repo_path(DYNAMIC), &dims).unwrap();
            graphc::compile(&g).unwrap()
        })
    });
    (c, w, a)
}

/// The process's peak resident set (KiB), where `/proc` says.
fn peak_rss_kib() -> Option<u64> {
    let s = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = s.lines().find(|l| l.starts_with("VmHWM:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

#[test]
fn a_huge_batch_plans_as_fast_as_batch_1_and_scales_exactly() {
    let (_, w1, a1) = plan(1);
    let (mid, _, _) = plan(1024);
    let (_, w16, a16) = plan(1 << 16);
    let (_, w20, _) = plan(1 << 20);
    let rss_before = peak_rss_kib();
    let huge = 1usize << 24;
    let (c, w_huge, a_huge) = plan(huge);
    let rss_after = peak_rss_kib();

    // Work: the only batch-sized work is evaluating position vectors to prove a mask
    // causal, which stops at 2^24 elements per proof (then a later, batch-free form of
    // the mask is proved); past that, the value changes nothing: 2^24 takes the steps
    // of 2^20 (within 1%). No batch holds more than 256 MiB while compiling.
    eprintln!("batch 1: {w1}, {a1:?}\n2^16: {w16}, {a16:?}\n2^20: {w20}\n2^24: {w_huge}, {a_huge:?}");
    assert!(w_huge.growth_over(&w20) <= 1.01, "{}", w_huge.compare(&w20));
    for (w, a) in [(w16, a16), (w_huge, a_huge)] {
        assert!(w.total() <= w1.total() + (1 << 25), "{}", w.compare(&w1));
        assert!(a.peak_bytes < 256 << 20, "{a:?}");
    }
    // Memory: nothing of batch size (an i64 arange of 2^24 is 128 MiB; it took 3.5 GB).
    if let (Some(a), Some(b)) = (rss_before, rss_after) {
        eprintln!("peak RSS {a} KiB before, {b} KiB after");
        assert!(b.saturating_sub(a) < 64 << 10, "peak RSS grew from {a} to {b} KiB");
    }

    // Sizes: the input and output at that batch, the arena and its bound exactly the
    // batch-1024 plan's times 2^14, the total the sum of its parts.
    let p = &c.plan;
    let scale = (huge / 1024) as u64;
    assert_eq!(p.inputs_bytes, (huge * SEQ * 8) as u64);
    assert_eq!(p.outputs_bytes, (huge * SEQ * 128 * 4) as u64);
    assert_eq!(p.lower_bound_bytes, mid.plan.lower_bound_bytes * scale);
    assert_eq!(p.arena_bytes, mid.plan.arena_bytes * scale);
    assert_eq!(
        p.total_bytes,
        p.weights_bytes + p.inputs_bytes + p.outputs_bytes + p.workspace_bytes + p.arena_bytes
    );
    assert!(p.total_bytes > 2 << 40, "{} bytes", p.total_bytes);
    // Constants stay small: no batch-sized arange.
    assert!(
        p.weights_bytes < 1 << 20,
        "{} bytes of weights and constants",
        p.weights_bytes
    );
    let report = graphc_compiler::plan::report::summary(&c.program, p);
    assert!(report.contains("2.01 TiB"), "{report}");

    // A sequence of 2^20: the importer keeps known values of at most 64 MiB in all (the
    // causal mask's intermediates alone would be gigabytes), so memory stays bounded.
    let rss_before = peak_rss_kib();
    let dims = [("batch".to_string(), 1), ("seq".to_string(), 1 << 20)];
    let ((c, w), a) = alloc::measure(|| {
        work::measure(|| {
            let g = graphc::load_model(&repo_path(DYNAMIC), &dims).unwrap();
            graphc::compile(&g).unwrap()
        })
    });
    eprintln!("seq 2^20: {w}, {a:?}");
    // Terabytes of activations, but no [heads, s, s] score matrix (16 TiB of f32 at
    // this length): attention is one kernel.
    assert!(c.plan.total_bytes > 1 << 40, "{} bytes", c.plan.total_bytes);
    assert!(c.plan.total_bytes < 16 << 40, "{} bytes", c.plan.total_bytes);
    if let (Some(a), Some(b)) = (rss_before, peak_rss_kib()) {
        eprintln!("peak RSS {a} KiB before, {b} KiB after seq 2^20");
        assert!(b.saturating_sub(a) < 192 << 10, "peak RSS grew from {a} to {b} KiB");
    }
}
