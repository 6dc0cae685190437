//! Constant folding bounds its work before doing it: a reduction of a scalar broadcast
//! to 2^28 elements, or a matmul of two such broadcasts, compiles in about the time of
//! the same graph at 2^10 elements and without allocating the broadcast (1 GiB). (One
//! test in its own binary: it reads the process's peak resident memory.)

use std::time::{Duration, Instant};

use graphc_compiler::{compile, CompileOptions};
use graphc_ir::{DType, Graph, GraphBuilder};

/// `x + sum(broadcast(1.5, [n]))` and `x + max(broadcast(0.5, [m, m]) @ same)`, `m * m = n`.
fn graph(n: usize) -> Graph {
    let b = GraphBuilder::new();
    let x = b.input("x", DType::F32, [1usize; 0]);
    let big = b.scalar(DType::F32, 1.5).broadcast_to(&[n].into());
    let m = (n as f64).sqrt() as usize;
    let sq = b.scalar(DType::F32, 0.5).broadcast_to(&[m, m].into());
    let prod = sq.matmul(sq).reduce(graphc_ir::ReduceOp::Max, &[0, 1], false);
    b.output("y", x + big.sum(&[0], false) + prod);
    b.finish().unwrap()
}

fn peak_rss_kib() -> Option<u64> {
    let s = std::fs::read_to_string("/proc/self/status").ok()?;
    s.lines()
        .find(|l| l.starts_with("VmHWM:"))?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

fn time(g: &Graph) -> Duration {
    let t = Instant::now();
    compile(g, &CompileOptions::default()).unwrap();
    t.elapsed()
}

#[test]
fn folding_never_materializes_a_broadcast_of_batch_size() {
    let (small, huge) = (graph(1 << 10), graph(1 << 28));
    let t_small = time(&small).min(time(&small));
    let before = peak_rss_kib();
    let t_huge = time(&huge);
    let after = peak_rss_kib();
    eprintln!("2^10: {t_small:?}, 2^28: {t_huge:?}; peak RSS {before:?} -> {after:?} KiB");
    assert!(
        t_huge.as_secs_f64() <= 3.0 * t_small.as_secs_f64().max(0.02),
        "2^10: {t_small:?}, 2^28: {t_huge:?}"
    );
    if let (Some(a), Some(b)) = (before, after) {
        assert!(b.saturating_sub(a) < 64 << 10, "peak RSS grew from {a} to {b} KiB");
    }
}
