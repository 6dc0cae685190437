//! Compile time and host memory do not depend on the values of symbolic dimensions:
//! GPT-2 with a dynamic batch plans at batch 2^24 (2.3 TiB of activations) about as
//! fast as at batch 1, without allocating anything of batch size, and its plan's sizes
//! are exactly those of a smaller batch scaled up. (One test in its own binary: it
//! reads the process's peak resident memory.)

mod common;

use std::time::{Duration, Instant};

use common::repo_path;
use graphc::Compiled;

const DYNAMIC: &str = "tests/fixtures/onnx/gpt2_dynamic/model.onnx";
const SEQ: usize = 64;

/// Load and compile at `batch` (seq 64); the compiled model and the faster of three.
fn plan(batch: usize) -> (Compiled, Duration) {
    let dims = [("batch".to_string(), batch), ("seq".to_string(), SEQ)];
    let mut best = Duration::MAX;
    let mut out = None;
    for _ in 0..3 {
        let t = Instant::now();
        let g = graphc::load_model(&repo_path(DYNAMIC), &dims).unwrap();
        let c = graphc::compile(&g).unwrap();
        best = best.min(t.elapsed());
        out = Some(c);
    }
    (out.unwrap(), best)
}

/// The process's peak resident set (KiB), where `/proc` says.
fn peak_rss_kib() -> Option<u64> {
    let s = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = s.lines().find(|l| l.starts_with("VmHWM:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

#[test]
fn a_huge_batch_plans_as_fast_as_batch_1_and_scales_exactly() {
    let (_, t1) = plan(1);
    let (mid, _) = plan(1024);
    let rss_before = peak_rss_kib();
    let huge = 1usize << 24;
    let (c, t_huge) = plan(huge);
    let rss_after = peak_rss_kib();

    // Time: within 3x of batch 1 (a floor for timer noise on a fast compile).
    let ratio = t_huge.as_secs_f64() / t1.as_secs_f64().max(0.02);
    eprintln!("batch 1: {t1:?}; batch 2^24: {t_huge:?} ({ratio:.1}x)");
    assert!(ratio <= 3.0, "batch 1: {t1:?}; batch 2^24: {t_huge:?}");
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
    let t = Instant::now();
    let g = graphc::load_model(&repo_path(DYNAMIC), &dims).unwrap();
    let c = graphc::compile(&g).unwrap();
    eprintln!("seq 2^20: {:?}", t.elapsed());
    // Terabytes of activations, but no [heads, s, s] score matrix (16 TiB of f32 at
    // this length): attention is one kernel.
    assert!(c.plan.total_bytes > 1 << 40, "{} bytes", c.plan.total_bytes);
    assert!(c.plan.total_bytes < 16 << 40, "{} bytes", c.plan.total_bytes);
    if let (Some(a), Some(b)) = (rss_before, peak_rss_kib()) {
        eprintln!("peak RSS {a} KiB before, {b} KiB after seq 2^20");
        assert!(b.saturating_sub(a) < 192 << 10, "peak RSS grew from {a} to {b} KiB");
    }
}
