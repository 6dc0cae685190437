//! Greedy best-fit: place buffers one at a time, each in the tightest free gap of its
//! lifetime.

use super::offsets::Problem;

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

    pub fn name(self) -> &'static str {
        match self {
            Order::Size => "greedy:size",
            Order::Duration => "greedy:duration",
            Order::Area => "greedy:area",
            Order::Start => "greedy:start",
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
