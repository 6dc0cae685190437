//! The schedulers' unit tests.

use super::{rename, Deps, Scheduler};
use crate::plan::Strategy;

/// The enums serialize as the names they replaced, and parse back.
#[test]
fn scheduler_and_strategy_names_are_the_serialized_strings() {
    let names: Vec<&str> = Scheduler::ALL.iter().map(|c| c.name()).collect();
    assert_eq!(
        names,
        [
            "program",
            "dfs",
            "dfs:largest-first",
            "dfs:heaviest-first",
            "list:free-largest",
            "bfs",
            "program:hoist"
        ]
    );
    for c in Scheduler::ALL {
        assert_eq!(serde_json::to_string(&c).ok(), Some(format!("\"{c}\"")));
        assert_eq!(c.name().parse::<Scheduler>(), Ok(c));
        assert_eq!(serde_json::from_str::<Scheduler>(&format!("\"{c}\"")).ok(), Some(c));
    }
    assert!("nope".parse::<Scheduler>().is_err());
    for (s, name) in [
        (Strategy::Empty, "empty"),
        (Strategy::GreedySize, "greedy:size"),
        (Strategy::GreedyDuration, "greedy:duration"),
        (Strategy::GreedyArea, "greedy:area"),
        (Strategy::GreedyStart, "greedy:start"),
        (Strategy::Search, "search"),
        (Strategy::Local, "local"),
    ] {
        assert_eq!(s.to_string(), name);
        assert_eq!(serde_json::to_string(&s).ok(), Some(format!("\"{name}\"")));
        assert_eq!(s.is_greedy(), name.starts_with("greedy:"));
    }
}

/// The list scheduler as first written: a scan of every ready kernel per step.
fn list_by_scan(d: &Deps) -> Vec<usize> {
    let k = d.preds.len();
    let mut readers_left = vec![0usize; d.bytes.len()];
    for r in &d.reads {
        for &b in r {
            readers_left[b] += 1;
        }
    }
    let mut indeg: Vec<usize> = d.preds.iter().map(Vec::len).collect();
    let mut ready: std::collections::BTreeSet<usize> = (0..k).filter(|&i| indeg[i] == 0).collect();
    let mut order = Vec::new();
    while !ready.is_empty() {
        let score = |i: usize| -> i128 {
            let freed: u64 = d.reads[i]
                .iter()
                .filter(|&&b| readers_left[b] == 1)
                .map(|&b| d.bytes[b])
                .sum();
            let alloc: u64 = d.writes[i].iter().map(|&b| d.bytes[b]).sum();
            i128::from(freed) - i128::from(alloc)
        };
        let (mut best, mut best_score) = (usize::MAX, i128::MIN);
        for &i in &ready {
            if score(i) > best_score {
                (best, best_score) = (i, score(i));
            }
        }
        ready.remove(&best);
        order.push(best);
        for &b in &d.reads[best] {
            readers_left[b] -= 1;
        }
        for &s in &d.succs[best] {
            indeg[s] -= 1;
            if indeg[s] == 0 {
                ready.insert(s);
            }
        }
    }
    order
}

/// Random DAGs of kernels, each writing one buffer and reading earlier ones: the
/// heap scheduler picks what the scan picks.
#[test]
fn list_scheduler_equals_the_scan() {
    let mut rng = graphc_ir::Rng::new(11);
    for case in 0..300 {
        let k = 1 + rng.below(60) as usize;
        let mut reads = Vec::new();
        for i in 0..k {
            let mut r: Vec<usize> = (0..rng.below(4))
                .filter(|_| i > 0)
                .map(|_| rng.below(i as u64) as usize)
                .collect();
            r.sort_unstable();
            r.dedup();
            reads.push(r);
        }
        let bytes: Vec<u64> = (0..k)
            .map(|_| if rng.below(4) == 0 { 0 } else { rng.below(5) * 100 })
            .collect();
        let mut preds = reads.clone();
        let mut succs = vec![Vec::new(); k];
        for (i, r) in reads.iter().enumerate() {
            for &p in r {
                succs[p].push(i);
            }
        }
        for v in preds.iter_mut().chain(succs.iter_mut()) {
            v.sort_unstable();
            v.dedup();
        }
        let d = Deps {
            preds,
            succs,
            reads,
            writes: (0..k).map(|i| vec![i]).collect(),
            bytes,
        };
        assert_eq!(d.list(), list_by_scan(&d), "case {case}");
    }
}

#[test]
fn renames_keep_the_suffix() {
    assert_eq!(rename("k12_row_softmax", 12, 3), "k3_row_softmax");
    assert_eq!(rename("k0", 0, 7), "k7");
    assert_eq!(rename("kernel", 4, 2), "k2_kernel");
    // Only the kernel's own index is its position prefix.
    assert_eq!(rename("k12_x", 1, 2), "k2_k12_x");
    assert_eq!(rename("k5_x", 6, 2), "k2_k5_x");
}

/// `k0` writes a 1 MiB product `p`, `k1` another value, `k2` reduces `p` to a
/// scalar, `k3` reads the rest: in the program's order `p` lives until `k2`;
/// hoisted, the reduction (it frees more than it writes) runs right after `k0`.
/// A donated input's writer placed before another reader in the base order waits
/// for it (the hoisted order stays valid).
#[test]
fn net_freeing_kernels_run_as_soon_as_they_are_ready() {
    let deps = Deps {
        preds: vec![vec![], vec![], vec![0], vec![1, 2]],
        succs: vec![vec![2], vec![3], vec![3], vec![]],
        reads: vec![vec![], vec![], vec![0], vec![1, 2]],
        writes: vec![vec![0], vec![1], vec![2], vec![]],
        bytes: vec![1 << 20, 1 << 20, 4],
    };
    let base = vec![0, 1, 2, 3];
    let hoisted = deps.hoist(&base);
    assert_eq!(hoisted, vec![0, 2, 1, 3]);
    assert!(deps.is_valid(&hoisted));
    assert!(deps.peak(&hoisted) < deps.peak(&base));
    // k3 must run after k1 (say a donation); a base order with k3 first still
    // gives every kernel once, in a valid order.
    let hoisted = deps.hoist(&[3, 0, 1, 2]);
    assert!(deps.is_valid(&hoisted), "{hoisted:?}");
}
