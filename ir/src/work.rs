//! Counted work: the elementary steps each stage of graphc takes, counted per thread.
//!
//! A test that checks how a stage's cost grows with its input (10x the nodes should
//! cost about 10x, not 100x) cannot use a clock: on a loaded machine the same work
//! takes twice as long, and a ratio of two timings fails at random (CI did). A count
//! of steps is the same on any machine under any load. Each stage adds to its
//! [`Stage`] counter in the loops its cost is made of, one step per element a loop
//! visits (a token, a node, an operand, an e-node, a buffer, a candidate gap, a heap
//! operation), so a loop nested in another one over the same input shows up as a
//! count that grows with the square of it.
//!
//! Counters are thread-local (tests run side by side in one process) and cost an add
//! each; work a stage hands to a thread of its own is added to the caller's count when
//! the thread is joined. [`measure`] gives what a closure did. Wall-clock figures
//! belong in the benchmarks (`benches/`, `bench/`), not in tests.

use std::cell::Cell;
use std::fmt;

/// The stages whose work is counted.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Stage {
    /// The `.gir` lexer and parser: tokens, and the lookups of each definition.
    Parse,
    /// ONNX import: nodes lowered and their operands, function bodies expanded.
    Import,
    /// Building and checking graphs: nodes added, operands verified, names looked up.
    Graph,
    /// The e-graph optimizer: e-nodes searched per iteration, conversions in and out.
    Optimize,
    /// Extraction from the e-graph: e-nodes considered, parent edges followed.
    Extract,
    /// Fusion: operands visited while grouping, group members walked while merging,
    /// kernel arguments interned.
    Fuse,
    /// Scheduling: candidate orders' steps and heap operations.
    Schedule,
    /// Memory planning: liveness, offsets (candidate gaps probed, search states),
    /// the peak.
    Plan,
    /// The kernel-IR and plan verifiers.
    Verify,
}

impl Stage {
    pub const ALL: [Stage; 9] = [
        Stage::Parse,
        Stage::Import,
        Stage::Graph,
        Stage::Optimize,
        Stage::Extract,
        Stage::Fuse,
        Stage::Schedule,
        Stage::Plan,
        Stage::Verify,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Stage::Parse => "parse",
            Stage::Import => "import",
            Stage::Graph => "graph",
            Stage::Optimize => "optimize",
            Stage::Extract => "extract",
            Stage::Fuse => "fuse",
            Stage::Schedule => "schedule",
            Stage::Plan => "plan",
            Stage::Verify => "verify",
        }
    }
}

const N: usize = Stage::ALL.len();

thread_local! {
    static STEPS: [Cell<u64>; N] = const { [const { Cell::new(0) }; N] };
}

/// Count `n` steps of `stage` on this thread.
#[inline]
pub fn add(stage: Stage, n: u64) {
    STEPS.with(|s| {
        if let Some(c) = s.get(stage as usize) {
            c.set(c.get().wrapping_add(n));
        }
    });
}

/// Count `n` steps (a length) of `stage` on this thread.
#[inline]
pub fn add_len(stage: Stage, n: usize) {
    add(stage, n as u64);
}

/// Steps counted per stage.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Work([u64; N]);

impl Work {
    /// What this thread has counted so far.
    pub fn now() -> Work {
        Work(STEPS.with(|s| s.each_ref().map(Cell::get)))
    }

    pub fn get(&self, stage: Stage) -> u64 {
        self.0.get(stage as usize).copied().unwrap_or(0)
    }

    /// All stages together.
    pub fn total(&self) -> u64 {
        self.0.iter().fold(0u64, |a, &b| a.saturating_add(b))
    }

    /// Work done since `earlier`.
    pub fn since(&self, earlier: &Work) -> Work {
        let mut out = self.0;
        for (o, e) in out.iter_mut().zip(earlier.0) {
            *o = o.wrapping_sub(e);
        }
        Work(out)
    }

    /// How many times `self`'s total is `small`'s (the growth of a cost when the input
    /// grows), at least 1 step on each side.
    pub fn growth_over(&self, small: &Work) -> f64 {
        self.total().max(1) as f64 / small.total().max(1) as f64
    }

    /// Each stage's growth from `small` to `self`, for a failure message:
    /// `fuse 20000 -> 200000 (10.0x), plan ...`.
    pub fn compare(&self, small: &Work) -> String {
        Stage::ALL
            .iter()
            .filter(|&&s| self.get(s) > 0 || small.get(s) > 0)
            .map(|&s| {
                let (a, b) = (small.get(s), self.get(s));
                format!("{} {a} -> {b} ({:.1}x)", s.name(), b.max(1) as f64 / a.max(1) as f64)
            })
            .collect::<Vec<_>>()
            .join(", ")
    }
}

impl fmt::Display for Work {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let parts: Vec<String> = Stage::ALL
            .iter()
            .filter(|&&s| self.get(s) > 0)
            .map(|&s| format!("{} {}", s.name(), self.get(s)))
            .collect();
        if parts.is_empty() {
            f.write_str("no steps")
        } else {
            write!(f, "{} steps ({})", self.total(), parts.join(", "))
        }
    }
}

/// Run `f` and count the steps it took on this thread.
pub fn measure<R>(f: impl FnOnce() -> R) -> (R, Work) {
    let before = Work::now();
    let r = f();
    (r, Work::now().since(&before))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_per_thread_and_stage() {
        let ((), w) = measure(|| {
            add(Stage::Fuse, 3);
            add_len(Stage::Plan, 5);
            // Another thread's steps are its own.
            std::thread::spawn(|| add(Stage::Fuse, 100)).join().unwrap();
        });
        assert_eq!(w.get(Stage::Fuse), 3);
        assert_eq!(w.get(Stage::Plan), 5);
        assert_eq!(w.total(), 8);
        assert_eq!(w.to_string(), "8 steps (fuse 3, plan 5)");
        let ((), big) = measure(|| add(Stage::Fuse, 30));
        assert_eq!(big.growth_over(&w), 30.0 / 8.0);
        assert_eq!(big.compare(&w), "fuse 3 -> 30 (10.0x), plan 5 -> 0 (0.2x)");
    }
}
