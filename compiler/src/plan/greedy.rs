//! Greedy best-fit: place buffers one at a time, each in the tightest free gap of its
//! lifetime.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet, BinaryHeap};

use super::offsets::{Problem, Strategy};
use graphc_ir::work::{self, Stage};

/// The orders greedy best-fit is run in. Ties go by index.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Order {
    /// Size, descending.
    Size,
    /// Lifetime length (in sections), descending.
    Duration,
    /// Size x lifetime length, descending.
    Area,
    /// Start, ascending.
    Start,
}

impl Order {
    pub const ALL: [Order; 4] = [Order::Size, Order::Duration, Order::Area, Order::Start];

    /// The placement strategy this order is.
    pub fn strategy(self) -> Strategy {
        match self {
            Order::Size => Strategy::GreedySize,
            Order::Duration => Strategy::GreedyDuration,
            Order::Area => Strategy::GreedyArea,
            Order::Start => Strategy::GreedyStart,
        }
    }

    /// The problem's buffers in this order.
    pub fn sequence(self, p: &Problem) -> Vec<usize> {
        let mut v: Vec<usize> = (0..p.len()).collect();
        let dur = |b: usize| u64::from(p.last[b] - p.first[b]);
        match self {
            Order::Size => v.sort_by_key(|&b| (std::cmp::Reverse(p.size[b]), b)),
            Order::Duration => v.sort_by_key(|&b| (std::cmp::Reverse(dur(b)), b)),
            Order::Area => v.sort_by_key(|&b| (std::cmp::Reverse(u128::from(p.size[b]) * u128::from(dur(b))), b)),
            Order::Start => v.sort_by_key(|&b| (p.first[b], b)),
        }
        v
    }
}

/// Best-fit in `order` (a permutation of the problem's buffers): each buffer goes into
/// the gap between the already-placed buffers overlapping it in time that it fits with
/// the least waste (lowest offset on ties), else on top of them all. Offsets in units.
pub(crate) fn best_fit(p: &Problem, order: &[usize]) -> Vec<u64> {
    let mut off = vec![0u64; p.len()];
    let mut placed: Vec<usize> = Vec::with_capacity(p.len());
    let mut occupied: Vec<(u64, u64)> = Vec::new();
    for &b in order {
        // Every placed buffer is tested for overlap.
        work::add_len(Stage::Plan, 1 + placed.len());
        occupied.clear();
        occupied.extend(
            placed
                .iter()
                .filter(|&&q| p.overlaps(b, q))
                .map(|&q| (off[q], off[q] + p.size[q])),
        );
        occupied.sort_unstable();
        let need = p.size[b];
        let mut best: Option<(u64, u64)> = None; // (waste, offset)
        let mut top = 0u64;
        for &(lo, hi) in &occupied {
            if lo > top && lo - top >= need {
                let waste = lo - top - need;
                if best.is_none_or(|(w, _)| waste < w) {
                    best = Some((waste, top));
                }
            }
            top = top.max(hi);
        }
        off[b] = best.map_or(top, |(_, o)| o);
        placed.push(b);
    }
    off
}

/// [`best_fit`] in [`Order::Start`], as a sweep over time in `O(n log n)`: the
/// buffers overlapping one in time that are already placed are exactly those still live
/// when it starts, whose address ranges are disjoint, so a map of them by offset and a
/// set of the gaps between them (by length, then offset) give the tightest gap at once.
/// Gives the very offsets of `best_fit(p, &Order::Start.sequence(p))`.
pub(crate) fn best_fit_by_start(p: &Problem) -> Vec<u64> {
    let order = Order::Start.sequence(p);
    let mut off = vec![0u64; p.len()];
    // Live placed buffers: offset -> end (disjoint); gaps between them: (len, offset).
    let mut live: BTreeMap<u64, u64> = BTreeMap::new();
    let mut gaps: BTreeSet<(u64, u64)> = BTreeSet::new();
    let mut expiry: BinaryHeap<Reverse<(u32, u64)>> = BinaryHeap::new();
    for b in order {
        work::add(Stage::Plan, 1);
        while let Some(&Reverse((end, o))) = expiry.peek() {
            if end > p.first[b] {
                break;
            }
            work::add(Stage::Plan, 1);
            expiry.pop();
            free(&mut live, &mut gaps, o);
        }
        let need = p.size[b];
        let o = match gaps.range((need, 0)..).next().copied() {
            Some((len, start)) => {
                gaps.remove(&(len, start));
                if len > need {
                    gaps.insert((len - need, start + need));
                }
                start
            }
            None => live.last_key_value().map_or(0, |(_, &e)| e),
        };
        live.insert(o, o + need);
        expiry.push(Reverse((p.last[b], o)));
        off[b] = o;
    }
    off
}

/// Removes the live buffer at offset `o`, merging the space it frees with the gaps
/// beside it (space above the highest live buffer is no gap).
fn free(live: &mut BTreeMap<u64, u64>, gaps: &mut BTreeSet<(u64, u64)>, o: u64) {
    let Some(end) = live.remove(&o) else {
        return;
    };
    let below = live.range(..o).next_back().map_or(0, |(_, &e)| e);
    let above = live.range(o..).next().map(|(&s, _)| s);
    if o > below {
        gaps.remove(&(o - below, below));
    }
    if let Some(a) = above {
        if a > end {
            gaps.remove(&(a - end, end));
        }
        gaps.insert((a - below, below));
    }
}

/// Local search over best-fit orders: from `order` (whose placement has arena `arena`),
/// repeatedly perturb the order (move a buffer that reaches the arena's top to an
/// earlier position, or swap two buffers), re-run best-fit, and keep the new order when
/// its arena is no larger (equal moves let it cross plateaus). Seeded, so deterministic;
/// each evaluation costs `p.len()` from `budget`. Stops at `goal`, when `budget` is spent
/// or at `deadline`. Returns the best improvement, if any, and the budget used.
pub(crate) fn local_search(
    p: &Problem,
    mut order: Vec<usize>,
    arena: u64,
    goal: u64,
    budget: u64,
    deadline: std::time::Instant,
) -> (Option<(Vec<u64>, u64)>, u64) {
    let n = p.len();
    let mut rng = graphc_ir::Rng::new(0x006f_6666_7365_7473);
    let (mut cur, mut best): (u64, Option<(Vec<u64>, u64)>) = (arena, None);
    let mut used = 0u64;
    let mut off = best_fit(p, &order);
    while n >= 2 && used.saturating_add(n as u64) <= budget && cur > goal {
        if std::time::Instant::now() >= deadline {
            break;
        }
        used += n as u64;
        let mut next = order.clone();
        if rng.bool() {
            // A buffer on top, moved earlier.
            let tops: Vec<usize> = (0..n).filter(|&k| off[next[k]] + p.size[next[k]] == cur).collect();
            let k = tops[rng.below(tops.len() as u64) as usize];
            if k == 0 {
                continue;
            }
            let to = rng.below(k as u64) as usize;
            let b = next.remove(k);
            next.insert(to, b);
        } else {
            let (i, j) = (rng.below(n as u64) as usize, rng.below(n as u64) as usize);
            next.swap(i, j);
        }
        let o = best_fit(p, &next);
        let a = p.arena(&o);
        if a <= cur {
            if a < cur {
                best = Some((o.clone(), a));
            }
            (cur, order, off) = (a, next, o);
        }
    }
    (best, used)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::offsets::{Interval, Problem};

    /// The sweep places every buffer where the quadratic loop does, on random problems
    /// (short and long lifetimes, repeated sizes, ties at equal starts).
    #[test]
    fn sweep_equals_best_fit_in_start_order() {
        let mut rng = graphc_ir::Rng::new(7);
        for case in 0..300 {
            let n = 1 + rng.below(120) as usize;
            let steps = 1 + rng.below(60) as u32;
            let bufs: Vec<Interval> = (0..n)
                .map(|_| {
                    let start = rng.below(u64::from(steps)) as u32;
                    let long = rng.bool();
                    let len = 1 + rng.below(if long { 40 } else { 3 }) as u32;
                    let size = if rng.bool() {
                        256 * (1 + rng.below(4))
                    } else {
                        rng.below(5000)
                    };
                    Interval::new(start, start + len, size)
                })
                .collect();
            let p = Problem::new(&bufs, 256).unwrap();
            let quadratic = best_fit(&p, &Order::Start.sequence(&p));
            assert_eq!(best_fit_by_start(&p), quadratic, "case {case}: {bufs:?}");
        }
    }
}
