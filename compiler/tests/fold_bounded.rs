//! Constant folding bounds its work before doing it: a reduction of a scalar broadcast
//! to 2^28 elements, or a matmul of two such broadcasts, compiles with the steps
//! (`graphc_ir::work`, a fold counting the elements it reads and writes) and the
//! allocations of the same graph at 2^10 elements, never allocating the broadcast
//! (1 GiB). (One test in its own binary: it reads the process's peak resident memory.)

use graphc_compiler::{compile, CompileOptions};
use graphc_ir::work::{self, Work};
use graphc_ir::{DType, Graph, GraphBuilder};
use graphc_testkit::alloc::{self, Allocs};

#[global_allocator]
static ALLOC: alloc::Counting = alloc::Counting;

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

fn cost(g: &Graph) -> (Work, Allocs) {
    let ((_, w), a) = alloc::measure(|| work::measure(|| compile(g, &CompileOptions::default()).unwrap()));
    (w, a)
}

#[test]
fn folding_never_materializes_a_broadcast_of_batch_size() {
    let (small, huge) = (graph(1 << 10), graph(1 << 28));
    let (w_small, a_small) = cost(&small);
    let before = peak_rss_kib();
    let (w_huge, a_huge) = cost(&huge);
    let after = peak_rss_kib();
    eprintln!("2^10: {w_small}, {a_small:?}; 2^28: {w_huge}, {a_huge:?}; peak RSS {before:?} -> {after:?} KiB");
    assert!(w_huge.growth_over(&w_small) <= 1.5, "{}", w_huge.compare(&w_small));
    assert!(a_huge.peak_bytes < 64 << 20, "{a_huge:?}");
    assert!(a_huge.growth_over(&a_small) <= 1.5, "{a_small:?} -> {a_huge:?}");
    if let (Some(a), Some(b)) = (before, after) {
        assert!(b.saturating_sub(a) < 64 << 10, "peak RSS grew from {a} to {b} KiB");
    }
}
