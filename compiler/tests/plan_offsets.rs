//! The memory planner's offset assignment: hand cases, random lifetimes (properties),
//! and perfect packings the search must find.

use std::time::Duration;

use graphc_compiler::plan::{assign_offsets, greedy_arena, lower_bound, verify, Interval, PlanError, PlanOptions};
use graphc_ir::Rng;
use proptest::prelude::*;

fn iv(start: u32, end: u32, size: u64) -> Interval {
    Interval { start, end, size }
}

fn opts(align: u64) -> PlanOptions {
    // Node limits, not time, bound the search here: results must be deterministic.
    PlanOptions {
        align,
        time_budget: Duration::from_secs(60),
        capacity: None,
        node_limit: 2_000,
    }
}

#[test]
fn disjoint_lifetimes_share_offset_zero() {
    let bufs = [iv(0, 2, 1000), iv(2, 5, 700), iv(5, 6, 4096), iv(7, 9, 1)];
    let p = assign_offsets(&bufs, &opts(256)).unwrap();
    verify(&bufs, &p, 256).unwrap();
    assert_eq!(p.offsets, vec![0; 4]);
    assert_eq!(p.arena, 4096);
    assert_eq!(p.lower_bound, 4096);
}

#[test]
fn staircase_reaches_the_lower_bound() {
    // Each buffer overlaps its two neighbours: at most two live at once.
    let bufs: Vec<Interval> = (0..8).map(|i| iv(i, i + 2, 256 * (1 + u64::from(i % 3)))).collect();
    let p = assign_offsets(&bufs, &opts(256)).unwrap();
    verify(&bufs, &p, 256).unwrap();
    assert_eq!(p.lower_bound, 256 * 5);
    assert_eq!(p.arena, p.lower_bound, "{p:?}");
}

#[test]
fn staircase_up_and_down() {
    // A pyramid: nested lifetimes, all live at the middle.
    let bufs: Vec<Interval> = (0..6).map(|i| iv(i, 12 - i, 100 + 50 * u64::from(i))).collect();
    let p = assign_offsets(&bufs, &opts(1)).unwrap();
    verify(&bufs, &p, 1).unwrap();
    assert_eq!(p.arena, bufs.iter().map(|b| b.size).sum::<u64>());
    assert_eq!(p.arena, p.lower_bound);
}

#[test]
fn alignment_rounds_sizes_and_offsets() {
    let bufs = [iv(0, 4, 1), iv(1, 3, 300), iv(2, 6, 256), iv(0, 1, 0)];
    assert_eq!(lower_bound(&bufs, 256), 256 + 512 + 256);
    assert_eq!(lower_bound(&bufs, 1), 1 + 300 + 256);
    let p = assign_offsets(&bufs, &opts(256)).unwrap();
    verify(&bufs, &p, 256).unwrap();
    assert!(p.offsets.iter().all(|o| o % 256 == 0), "{:?}", p.offsets);
    assert_eq!(p.arena % 256, 0);
    assert_eq!(p.arena, 1024);
    // A non-power-of-two alignment works the same way.
    let p = assign_offsets(&bufs, &opts(96)).unwrap();
    verify(&bufs, &p, 96).unwrap();
    assert!(p.offsets.iter().all(|o| o % 96 == 0));
}

#[test]
fn zero_sizes_and_empty_inputs() {
    let p = assign_offsets(&[], &PlanOptions::default()).unwrap();
    assert_eq!((p.arena, p.lower_bound, p.offsets.len()), (0, 0, 0));
    let bufs = [iv(0, 3, 0), iv(1, 2, 0)];
    let p = assign_offsets(&bufs, &PlanOptions::default()).unwrap();
    verify(&bufs, &p, 256).unwrap();
    assert_eq!((p.arena, p.offsets.clone()), (0, vec![0, 0]));
}

#[test]
fn invalid_inputs_are_errors() {
    let e = assign_offsets(&[iv(0, 1, 8), iv(3, 3, 8)], &PlanOptions::default()).unwrap_err();
    assert_eq!(
        e,
        PlanError::EmptyLifetime {
            buffer: 1,
            start: 3,
            end: 3
        }
    );
    assert!(e.to_string().contains("buffer 1"), "{e}");
    let e = assign_offsets(
        &[iv(0, 1, 8)],
        &PlanOptions {
            align: 0,
            ..PlanOptions::default()
        },
    )
    .unwrap_err();
    assert_eq!(e, PlanError::ZeroAlign);
    let e = assign_offsets(&[iv(0, 1, u64::MAX), iv(0, 1, u64::MAX)], &opts(1)).unwrap_err();
    assert_eq!(e, PlanError::Overflow);
    let e = assign_offsets(&[iv(0, 1, u64::MAX)], &opts(256)).unwrap_err();
    assert_eq!(e, PlanError::Overflow);
}

#[test]
fn verify_names_the_overlapping_buffers() {
    let bufs = [iv(0, 4, 256), iv(5, 6, 256), iv(2, 6, 256)];
    let mut p = assign_offsets(&bufs, &opts(256)).unwrap();
    verify(&bufs, &p, 256).unwrap();
    p.offsets = vec![0, 256, 0];
    let e = verify(&bufs, &p, 256).unwrap_err();
    assert!(e.contains("buffers 0 and 2"), "{e}");
    p.offsets = vec![0, 0, 100];
    let e = verify(&bufs, &p, 256).unwrap_err();
    assert!(e.contains("buffer 2") && e.contains("multiple"), "{e}");
    p.offsets = vec![0, 0, 512];
    let e = verify(&bufs, &p, 256).unwrap_err();
    assert!(e.contains("buffer 2") && e.contains("arena"), "{e}");
    p.offsets = vec![0, 0, 256];
    p.arena = 256;
    let e = verify(&bufs, &p, 256).unwrap_err();
    assert!(e.contains("arena"), "{e}");
}

#[test]
fn capacity_target_stops_the_search() {
    let bufs: Vec<Interval> = (0..20)
        .map(|i| iv(i % 7, i % 7 + 1 + i % 5, 256 * (1 + u64::from(i * 7 % 5))))
        .collect();
    let loose = PlanOptions {
        capacity: Some(u64::MAX / 2),
        ..opts(256)
    };
    let p = assign_offsets(&bufs, &loose).unwrap();
    verify(&bufs, &p, 256).unwrap();
    assert_eq!(p.search_nodes, 0);
    assert!(p.strategy.is_greedy(), "{}", p.strategy);
    let off = PlanOptions {
        node_limit: 0,
        ..opts(256)
    };
    let q = assign_offsets(&bufs, &off).unwrap();
    assert_eq!((q.arena, q.search_nodes), (p.arena, 0));
}

fn random_instance(rng: &mut Rng) -> Vec<Interval> {
    let n = 1 + rng.below(60) as usize;
    let horizon = 1 + rng.below(80) as u32;
    (0..n)
        .map(|_| {
            let start = rng.below(u64::from(horizon)) as u32;
            let max_len = 1 + rng.below(30);
            let len = 1 + rng.below(u64::from(horizon - start).min(max_len)) as u32;
            let size = match rng.below(4) {
                0 => 1 + rng.below(256),
                1 => 256 * (1 + rng.below(16)),
                _ => 1 + rng.below(1 << 16),
            };
            iv(start, start + len, size)
        })
        .collect()
}

#[test]
fn random_lifetimes_verify_and_never_lose_to_greedy() {
    let mut rng = Rng::new(0x9a11_0c0f);
    let (mut at_bound, mut improved) = (0, 0);
    for case in 0..500 {
        let bufs = random_instance(&mut rng);
        let align = [1, 256, 512][case % 3];
        let o = opts(align);
        let p = assign_offsets(&bufs, &o).unwrap();
        verify(&bufs, &p, align).unwrap_or_else(|e| panic!("case {case}: {e}\n{bufs:?}"));
        assert!(p.arena >= p.lower_bound);
        assert_eq!(p.lower_bound, lower_bound(&bufs, align));
        for order in ["size", "duration", "area", "start"] {
            let g = greedy_arena(&bufs, align, order).unwrap().unwrap();
            assert!(p.arena <= g, "case {case}: arena {} above greedy {order} {g}", p.arena);
        }
        assert!(p.arena <= p.greedy_arena);
        let q = assign_offsets(&bufs, &o).unwrap();
        assert_eq!(
            (&p.offsets, p.arena, &p.strategy, p.search_nodes),
            (&q.offsets, q.arena, &q.strategy, q.search_nodes),
            "case {case}: not deterministic"
        );
        at_bound += usize::from(p.arena == p.lower_bound);
        improved += usize::from(p.arena < p.greedy_arena);
    }
    eprintln!("random: {at_bound}/500 at the lower bound, search improved on greedy in {improved}");
}

/// Cuts a `width` x `[t0, t1)` rectangle into pieces by guillotine cuts: a packing
/// without waste, so the lower bound is `width` and reachable.
fn guillotine(rng: &mut Rng, t0: u32, t1: u32, width: u64, pieces: usize, out: &mut Vec<Interval>) {
    let can_time = t1 - t0 >= 2;
    let can_addr = width >= 2;
    if pieces <= 1 || !(can_time || can_addr) {
        out.push(iv(t0, t1, width));
        return;
    }
    let left = 1 + rng.below(pieces as u64 - 1) as usize;
    if can_time && (!can_addr || rng.bool()) {
        let t = t0 + 1 + rng.below(u64::from(t1 - t0 - 1)) as u32;
        guillotine(rng, t0, t, width, left, out);
        guillotine(rng, t, t1, width, pieces - left, out);
    } else {
        let w = 1 + rng.below(width - 1);
        guillotine(rng, t0, t1, w, left, out);
        guillotine(rng, t0, t1, width - w, pieces - left, out);
    }
}

#[test]
fn perfect_packings_reach_the_lower_bound() {
    let mut rng = Rng::new(7);
    let (cases, mut fit, mut greedy_fit) = (200, 0, 0);
    for case in 0..cases {
        let width = 64 + rng.below(960);
        let mut bufs = Vec::new();
        let (t1, pieces) = (10 + rng.below(50) as u32, 20 + rng.below(60) as usize);
        guillotine(&mut rng, 0, t1, width, pieces, &mut bufs);
        for i in (1..bufs.len()).rev() {
            bufs.swap(i, rng.below(i as u64 + 1) as usize);
        }
        let o = PlanOptions {
            node_limit: 1_000_000,
            ..opts(1)
        };
        let p = assign_offsets(&bufs, &o).unwrap();
        verify(&bufs, &p, 1).unwrap_or_else(|e| panic!("case {case}: {e}"));
        assert_eq!(p.lower_bound, width);
        if p.arena != width {
            eprintln!(
                "case {case}: width {width} arena {} nodes {} {:?}",
                p.arena, p.search_nodes, bufs
            );
        }
        fit += usize::from(p.arena == width);
        greedy_fit += usize::from(p.greedy_arena == width);
    }
    eprintln!("perfect packings: search fits {fit}/{cases}, greedy alone {greedy_fit}/{cases}");
    assert_eq!(fit, cases, "the search must fit every waste-free packing");
}

fn arb_interval() -> impl Strategy<Value = Interval> {
    (
        0u32..60,
        1u32..25,
        prop_oneof![1u64..300, (1u64..16).prop_map(|k| 256 * k), 1u64..70_000, Just(0u64)],
    )
        .prop_map(|(start, len, size)| iv(start, start + len, size))
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, ..ProptestConfig::default() })]

    /// Random lifetimes: a valid, aligned plan, at least the lower bound, never worse than
    /// any greedy order, and the same on a second run.
    #[test]
    fn prop_random_lifetimes(bufs in prop::collection::vec(arb_interval(), 0..50), align_pick in 0usize..3) {
        let align = [1, 256, 96][align_pick];
        let o = PlanOptions { node_limit: 5_000, ..opts(align) };
        let p = assign_offsets(&bufs, &o).unwrap();
        prop_assert!(verify(&bufs, &p, align).is_ok(), "{:?}", verify(&bufs, &p, align));
        prop_assert!(p.offsets.iter().all(|x| x % align == 0));
        prop_assert_eq!(p.arena % align, 0);
        prop_assert_eq!(p.lower_bound, lower_bound(&bufs, align));
        prop_assert!(p.arena >= p.lower_bound);
        for order in ["size", "duration", "area", "start"] {
            let g = greedy_arena(&bufs, align, order).unwrap().unwrap();
            prop_assert!(p.arena <= g, "arena {} above greedy {} {}", p.arena, order, g);
        }
        let q = assign_offsets(&bufs, &o).unwrap();
        prop_assert_eq!((&p.offsets, p.arena, &p.strategy, p.search_nodes), (&q.offsets, q.arena, &q.strategy, q.search_nodes));
    }
}

/// A model-sized input (thousands of buffers): the default options end the call near
/// its time budget (checked only as a hang guard, 30 s: a loaded machine stretches any
/// time), and a binding node limit keeps it deterministic.
#[test]
fn large_inputs_respect_the_budgets() {
    let mut rng = Rng::new(42);
    let bufs: Vec<Interval> = (0..4000)
        .map(|i| {
            let start = i / 2 + rng.below(8) as u32;
            let long = rng.below(10) == 0;
            let len = 1 + rng.below(if long { 400 } else { 12 }) as u32;
            iv(start, start + len, 256 * (1 + rng.below(64)) + rng.below(256))
        })
        .collect();
    let d = PlanOptions::default();
    let g = assign_offsets(
        &bufs,
        &PlanOptions {
            node_limit: 0,
            ..d.clone()
        },
    )
    .unwrap();
    eprintln!("large, greedy only: {:?}", g.time);
    let p = assign_offsets(&bufs, &d).unwrap();
    verify(&bufs, &p, d.align).unwrap();
    eprintln!(
        "large: arena {} lower {} greedy {} ({}), {} states, {:?}",
        p.arena, p.lower_bound, p.greedy_arena, p.strategy, p.search_nodes, p.time
    );
    assert!(p.time < d.time_budget + Duration::from_secs(30), "{:?}", p.time);
    assert!(p.arena <= p.greedy_arena);
    let o = PlanOptions {
        node_limit: 3_000,
        time_budget: Duration::from_secs(120),
        ..d
    };
    let p = assign_offsets(&bufs, &o).unwrap();
    let q = assign_offsets(&bufs, &o).unwrap();
    verify(&bufs, &p, o.align).unwrap();
    assert!(p.search_nodes <= 3_000);
    assert_eq!(
        (&p.offsets, p.arena, p.search_nodes),
        (&q.offsets, q.arena, q.search_nodes)
    );
    eprintln!("large, 3000 states: arena {} ({}), {:?}", p.arena, p.strategy, p.time);
}
