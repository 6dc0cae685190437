//! The offset planner on MiniMalloc's benchmark instances A–K (`id,lower,upper,size`,
//! capacity 1 MiB), vendored in `compiler/tests/data/minimalloc` (see its README.md for
//! the source and license). The tests fail when that folder is missing.
//!
//! Node limits, not time, bound the search here, so the results are deterministic and
//! do not depend on the machine's load (the time budget is only a far safety stop).
//!
//! - `minimalloc_all_fit`: all eleven fit in 1 MiB (each needs under 200,000 states).
//! - `minimalloc_small_budget_beats_greedy`: with 20,000 states each, every instance
//!   still ends strictly below the best greedy order.

use std::path::{Path, PathBuf};
use std::time::Duration;

use graphc_compiler::plan::{assign_offsets, verify, Interval, PlanOptions};

const MIB: u64 = 1 << 20;

/// The vendored instances; panics (the test fails) when they are missing.
fn dir() -> PathBuf {
    let d = PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/minimalloc"));
    assert!(
        d.join("A.csv").is_file(),
        "minimalloc: the vendored instances are missing ({} has no A.csv)",
        d.display()
    );
    d
}

fn load(path: &Path) -> Vec<Interval> {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    text.lines()
        .skip(1)
        .filter(|l| !l.trim().is_empty())
        .map(|line| {
            let f: Vec<u64> = line.split(',').skip(1).map(|v| v.trim().parse().unwrap()).collect();
            Interval::new(f[0] as u32, f[1] as u32, f[2])
        })
        .collect()
}

fn opts(node_limit: u64) -> PlanOptions {
    PlanOptions {
        align: 1,
        time_budget: Duration::from_secs(600),
        capacity: Some(MIB),
        node_limit,
    }
}

/// Plans instance `name` under `node_limit`; checks the plan and that it beats greedy.
/// Returns the arena.
fn plan(dir: &Path, name: &str, node_limit: u64) -> u64 {
    let bufs = load(&dir.join(format!("{name}.csv")));
    let p = assign_offsets(&bufs, &opts(node_limit)).unwrap();
    verify(&bufs, &p, 1).unwrap_or_else(|e| panic!("{name}: {e}"));
    eprintln!(
        "{name}: arena {:.4} MiB (greedy {:.4}), {} states, {} ({:.2} s)",
        p.arena as f64 / MIB as f64,
        p.greedy_arena as f64 / MIB as f64,
        p.search_nodes,
        p.strategy,
        p.time.as_secs_f64()
    );
    assert!(
        p.arena < p.greedy_arena,
        "{name}: arena {} not below greedy {}",
        p.arena,
        p.greedy_arena
    );
    assert!(p.search_nodes <= node_limit);
    // Deterministic under a node limit.
    let q = assign_offsets(&bufs, &opts(node_limit)).unwrap();
    assert_eq!(
        (&p.offsets, p.arena, p.search_nodes),
        (&q.offsets, q.arena, q.search_nodes),
        "{name}"
    );
    p.arena
}

const ALL: [&str; 11] = ["A", "B", "C", "D", "E", "F", "G", "H", "I", "J", "K"];

#[test]
fn minimalloc_all_fit() {
    let d = dir();
    let mut fit = Vec::new();
    for name in ALL {
        if plan(&d, name, 2_000_000) <= MIB {
            fit.push(name);
        }
    }
    assert_eq!(fit, ALL, "instances within 1 MiB");
}

#[test]
fn minimalloc_small_budget_beats_greedy() {
    let d = dir();
    for name in ALL {
        plan(&d, name, 20_000);
    }
}
