//! An exact depth-first search for a placement within a target arena, after MiniMalloc
//! (M. D. Moffitt, "MiniMalloc: A Lightweight Memory Allocator for Hardware-Accelerated
//! Machine Learning", ASPLOS 2024). This is our own implementation of the ideas of that
//! paper; the names below are ours.
//!
//! **Sections.** Time is cut at every buffer end: a *section* is the set of buffers live
//! just before some buffer ends (the problem's time sections, keeping only those followed
//! by an end: the others hold a subset of the next one's buffers and prune nothing
//! more). A buffer spans a contiguous range of sections; two buffers overlap in time iff
//! their ranges meet.
//!
//! **Canonical placements.** Buffers are placed one at a time, each at its *minimum
//! offset*: the highest top among the already placed buffers that overlap it in time (0
//! if none). Any placement can be pushed down into such a form without growing, and the
//! order of placement can be taken as non-decreasing in (offset, static rank): so a
//! branch is skipped when it would place a buffer before the previous one in that order.
//!
//! **Dominance.** Let `h` be the lowest `minimum offset + size` among unplaced buffers.
//! No buffer is placed at an offset `>= h`: the buffer reaching `h` would then sit in a
//! gap it could drop into, so that branch repeats one already explored.
//!
//! **Section inference.** Per section: `floor`, a lower bound on the offset of anything
//! still to be placed there (the top of the last buffer placed across it, raised to the
//! least minimum offset of its unplaced buffers), and `total`, the units of its unplaced
//! buffers. A state is dead when some section has `max(floor, current offset) + total`
//! above the target (later placements never go below the current offset).
//!
//! **Dynamic ordering.** At each node the candidates are the unplaced buffers sorted by
//! minimum offset, then by a static rank computed per sub-problem from one of three
//! preorders (lifetime width, area, section total: `WAT`, `TAW`, `TWA`, each descending;
//! ties by index).
//!
//! **Decomposition.** Between two adjacent sections, the *cut* counts the unplaced
//! buffers spanning both. Where it drops to zero the remaining problem splits into
//! independent sub-problems (connected over time), solved one after another with fresh
//! canonical orders; one that fails fails the branch, and a solved one is never revisited.
//! The initial problem is split the same way.
//!
//! **Budget.** [`Solver::fit`] runs the preorders round-robin with a node limit doubling
//! per round (starting at twice the buffer count), as MiniMalloc does, within an overall
//! node budget (deterministic) and a deadline (a safety stop). A complete, unstopped
//! search that finds nothing proves that no placement fits the target.

use std::time::Instant;

use super::offsets::Problem;

/// The result of [`Solver::fit`].
pub(crate) enum Outcome {
    /// Offsets (units) of a placement within the target.
    Found(Vec<u64>),
    /// Proven: no placement fits the target.
    Infeasible,
    /// A limit stopped the search.
    Stopped,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Status {
    Found,
    NotFound,
    Stopped,
}

/// A static preorder key (each descending).
#[derive(Clone, Copy)]
enum Key {
    /// Lifetime length in schedule time.
    Width,
    /// Size x width.
    Area,
    /// The largest current section total over the buffer's sections.
    Total,
}

const PREORDERS: [[Key; 3]; 3] = [
    [Key::Width, Key::Area, Key::Total],
    [Key::Total, Key::Area, Key::Width],
    [Key::Total, Key::Width, Key::Area],
];

/// A sub-problem: unplaced buffers living within sections `lo..hi`.
struct Part {
    bufs: Vec<u32>,
    lo: u32,
    hi: u32,
}

/// The search's static data (built once per problem) and its state.
pub(crate) struct Solver<'a> {
    size: &'a [u64],
    /// Per buffer, its range of sections `lo..hi`.
    lo: Vec<u32>,
    hi: Vec<u32>,
    /// Per section, the buffers live in it.
    sections: Vec<&'a [u32]>,
    /// Per buffer, the buffers overlapping it in time.
    overlaps: Vec<Vec<u32>>,
    width: Vec<u64>,
    /// Per buffer, the previous buffer (by index) with the same lifetime and size: twins
    /// are interchangeable, so they are placed in index order.
    twin: Vec<u32>,
    base_total: Vec<u64>,
    base_cuts: Vec<u32>,

    target: u64,
    preorder: usize,
    min_off: Vec<u64>,
    placed: Vec<bool>,
    off: Vec<u64>,
    floor: Vec<u64>,
    total: Vec<u64>,
    cuts: Vec<u32>,
    solution: Vec<u64>,
    off_undo: Vec<(u32, u64)>,
    floor_undo: Vec<(u32, u64)>,
    nodes: u64,
    max_placed: usize,
    placed_count: usize,
    limit: u64,
    deadline: Instant,
}

impl<'a> Solver<'a> {
    pub fn new(p: &'a Problem) -> Solver<'a> {
        let n = p.len();
        // Keep the time sections followed by an end.
        let mut ends = vec![false; p.cover.len()];
        for &l in &p.last {
            if let Some(e) = (l as usize).checked_sub(1).and_then(|k| ends.get_mut(k)) {
                *e = true;
            }
        }
        // index[k]: the kept section at or after time section k.
        let mut index = vec![0u32; p.cover.len()];
        let mut kept: Vec<&'a [u32]> = Vec::new();
        let mut next = 0u32;
        for k in (0..p.cover.len()).rev() {
            if ends[k] {
                next = k as u32; // time index for now; renumbered below
            }
            index[k] = next;
        }
        let mut renum = vec![0u32; p.cover.len()];
        for (k, &e) in ends.iter().enumerate() {
            if e {
                renum[k] = kept.len() as u32;
                kept.push(&p.cover[k]);
            }
        }
        let sections = kept;
        let s = sections.len();
        let mut lo = vec![0u32; n];
        let mut hi = vec![0u32; n];
        for b in 0..n {
            let (f, l) = (p.first[b] as usize, p.last[b] as usize);
            lo[b] = index.get(f).map_or(0, |&k| renum[k as usize]);
            hi[b] = l.checked_sub(1).and_then(|k| renum.get(k)).map_or(0, |&k| k + 1);
        }
        let mut overlaps = vec![Vec::new(); n];
        for b in 0..n {
            if let Some(sec) = sections.get(lo[b] as usize) {
                // b overlaps every buffer live where it starts that started before it.
                for &q in sec.iter() {
                    let qu = q as usize;
                    if qu != b && (lo[qu], qu) < (lo[b], b) {
                        overlaps[b].push(q);
                        overlaps[qu].push(b as u32);
                    }
                }
            }
        }
        let width = (0..n)
            .map(|b| {
                let t = |k: u32| p.time.get(k as usize).copied().unwrap_or(0);
                u64::from(t(p.last[b]).saturating_sub(t(p.first[b])))
            })
            .collect();
        let base_total: Vec<u64> = sections
            .iter()
            .map(|c| c.iter().map(|&b| p.size[b as usize]).fold(0u64, u64::saturating_add))
            .collect();
        let mut base_cuts = vec![0u32; s.saturating_sub(1)];
        for b in 0..n {
            for c in &mut base_cuts[lo[b] as usize..(hi[b] as usize).saturating_sub(1).max(lo[b] as usize)] {
                *c += 1;
            }
        }
        let mut keys: Vec<(u32, u32, u64, u32)> = (0..n).map(|b| (p.first[b], p.last[b], p.size[b], b as u32)).collect();
        keys.sort_unstable();
        let mut twin = vec![u32::MAX; n];
        for w in keys.windows(2) {
            if (w[0].0, w[0].1, w[0].2) == (w[1].0, w[1].1, w[1].2) {
                twin[w[1].3 as usize] = w[0].3;
            }
        }
        Solver {
            size: &p.size,
            twin,
            lo,
            hi,
            sections,
            overlaps,
            width,
            base_total,
            base_cuts,
            target: 0,
            preorder: 0,
            min_off: vec![0; n],
            placed: vec![false; n],
            off: vec![0; n],
            floor: vec![0; s],
            total: vec![0; s],
            cuts: Vec::new(),
            solution: vec![0; n],
            off_undo: Vec::new(),
            floor_undo: Vec::new(),
            nodes: 0,
            max_placed: 0,
            placed_count: 0,
            limit: 0,
            deadline: Instant::now(),
        }
    }

    /// Looks for a placement with every buffer below `target` units within `budget`
    /// visited states and `deadline`. Returns the outcome and the states visited.
    pub fn fit(&mut self, target: u64, budget: u64, deadline: Instant) -> (Outcome, u64) {
        let n = self.size.len() as u64;
        if self.base_total.iter().any(|&t| t > target) {
            return (Outcome::Infeasible, 0);
        }
        let mut used = 0u64;
        let mut round = n.saturating_mul(2).max(16);
        loop {
            round = round.saturating_mul(2);
            for preorder in 0..PREORDERS.len() {
                let limit = round.min(budget - used);
                let status = self.run(target, preorder, limit, deadline);
                used += self.nodes.min(limit);
                match status {
                    Status::Found => return (Outcome::Found(self.solution.clone()), used),
                    Status::NotFound => return (Outcome::Infeasible, used),
                    Status::Stopped => {
                        if used >= budget || Instant::now() >= deadline {
                            return (Outcome::Stopped, used);
                        }
                    }
                }
            }
        }
    }

    /// One search with one preorder and node limit.
    fn run(&mut self, target: u64, preorder: usize, limit: u64, deadline: Instant) -> Status {
        self.target = target;
        self.preorder = preorder;
        self.nodes = 0;
        self.limit = limit;
        self.deadline = deadline;
        self.min_off.fill(0);
        self.placed.fill(false);
        self.floor.fill(0);
        self.total.clone_from(&self.base_total);
        self.cuts.clone_from(&self.base_cuts);
        self.off_undo.clear();
        self.floor_undo.clear();
        let all = Part {
            bufs: (0..self.size.len() as u32).collect(),
            lo: 0,
            hi: self.sections.len() as u32,
        };
        let cutpoints: Vec<u32> = (all.lo..all.hi.saturating_sub(1))
            .filter(|&s| self.cuts[s as usize] == 0)
            .map(|s| s + 1)
            .collect();
        self.split(&all, &cutpoints)
    }

    /// Solves the parts of `part` between `cutpoints` (ascending, inside it) one by one.
    fn split(&mut self, part: &Part, cutpoints: &[u32]) -> Status {
        let mut lo = part.lo;
        for k in 0..=cutpoints.len() {
            let hi = cutpoints.get(k).copied().unwrap_or(part.hi);
            let bufs: Vec<u32> = part
                .bufs
                .iter()
                .copied()
                .filter(|&q| {
                    let q = q as usize;
                    !self.placed[q] && self.lo[q] < hi && lo < self.hi[q]
                })
                .collect();
            if !bufs.is_empty() {
                let status = self.sub_solve(&Part { bufs, lo, hi });
                if status != Status::Found {
                    return status;
                }
            }
            lo = hi;
        }
        Status::Found
    }

    /// Ranks a sub-problem's buffers by the current preorder and searches it.
    fn sub_solve(&mut self, part: &Part) -> Status {
        let keys = PREORDERS[self.preorder];
        let key = |s: &Self, b: usize, k: Key| -> u128 {
            match k {
                Key::Width => u128::from(s.width[b]),
                Key::Area => u128::from(s.width[b]) * u128::from(s.size[b]),
                Key::Total => u128::from(
                    s.total[s.lo[b] as usize..s.hi[b] as usize]
                        .iter()
                        .copied()
                        .max()
                        .unwrap_or(0),
                ),
            }
        };
        let mut ranked: Vec<([u128; 3], u32)> = part
            .bufs
            .iter()
            .map(|&b| {
                let bu = b as usize;
                (
                    [
                        u128::MAX - key(self, bu, keys[0]),
                        u128::MAX - key(self, bu, keys[1]),
                        u128::MAX - key(self, bu, keys[2]),
                    ],
                    b,
                )
            })
            .collect();
        ranked.sort_unstable();
        let pre: Vec<u32> = ranked.into_iter().map(|(_, b)| b).collect();
        let order: Vec<(u64, u32)> = (0..pre.len() as u32).map(|r| (0, r)).collect();
        self.search(part, &pre, &order, (0, 0))
    }

    /// The search proper over `part`, whose buffers by rank are `pre`; `order` is the
    /// parent's candidate order and `last` the (offset, rank) of the last placement.
    fn search(&mut self, part: &Part, pre: &[u32], order: &[(u64, u32)], last: (u64, u32)) -> Status {
        self.nodes += 1;
        if self.nodes > self.limit || (self.nodes % 512 == 0 && Instant::now() >= self.deadline) {
            return Status::Stopped;
        }
        let mut ord: Vec<(u64, u32)> = order
            .iter()
            .filter_map(|&(_, r)| {
                let b = pre[r as usize] as usize;
                (!self.placed[b]).then(|| (self.min_off[b], r))
            })
            .collect();
        if ord.is_empty() {
            for &b in &part.bufs {
                self.solution[b as usize] = self.off[b as usize];
            }
            return Status::Found;
        }
        ord.sort_unstable();
        let min_height = ord
            .iter()
            .map(|&(o, r)| o.saturating_add(self.size[pre[r as usize] as usize]))
            .min()
            .unwrap_or(u64::MAX);
        for i in 0..ord.len() {
            let (o, r) = ord[i];
            if (o, r) < last {
                continue; // not canonical
            }
            if o >= min_height {
                break; // dominated (and so is every later candidate)
            }
            let b = pre[r as usize] as usize;
            if self.twin[b] != u32::MAX && !self.placed[self.twin[b] as usize] {
                continue; // its twin goes first
            }
            let (undo, ok, hatless) = self.place(part, b, o);
            let status = if ok {
                self.descend(part, pre, &ord, (o, r), b)
            } else {
                Status::NotFound
            };
            self.unplace(b, undo);
            if status != Status::NotFound {
                return status;
            }
            if hatless {
                break; // b constrains nothing left: placing another first cannot help
            }
        }
        Status::NotFound
    }

    /// After placing `b`: splits the part where cuts dropped to zero, else searches on.
    fn descend(&mut self, part: &Part, pre: &[u32], ord: &[(u64, u32)], last: (u64, u32), b: usize) -> Status {
        self.solution[b] = last.0;
        let (lo, hi) = (self.lo[b], self.hi[b]);
        let mut cutpoints = Vec::new();
        for s in lo..hi.saturating_sub(1) {
            let c = &mut self.cuts[s as usize];
            *c -= 1;
            if *c == 0 {
                cutpoints.push(s + 1);
            }
        }
        let status = if cutpoints.is_empty() {
            self.search(part, pre, ord, last)
        } else {
            self.split(part, &cutpoints)
        };
        for s in lo..hi.saturating_sub(1) {
            self.cuts[s as usize] += 1;
        }
        status
    }

    /// Places `b` at `o`: raises the minimum offsets of the unplaced buffers overlapping
    /// it and the floors of the sections concerned, and checks the part (section
    /// inference: everything still to place in a section sits at or above both its floor
    /// and `o`, as later placements never go lower). Returns the undo marks, whether the
    /// state is alive, and whether `b` is *hatless* (no unplaced buffer overlaps it).
    fn place(&mut self, part: &Part, b: usize, o: u64) -> ((usize, usize), bool, bool) {
        let undo = (self.off_undo.len(), self.floor_undo.len());
        self.placed[b] = true;
        self.placed_count += 1;
        self.max_placed = self.max_placed.max(self.placed_count);
        self.off[b] = o;
        let h = o.saturating_add(self.size[b]);
        let mut hatless = true;
        // The sections of the buffers whose minimum offset rose, outside b's own: every
        // such buffer meets b's range, so they form two runs beside it.
        let (mut left, mut right) = (self.lo[b], self.hi[b]);
        for &q in &self.overlaps[b] {
            let q = q as usize;
            if self.placed[q] {
                continue;
            }
            hatless = false;
            if self.min_off[q] < h {
                self.off_undo.push((q as u32, self.min_off[q]));
                self.min_off[q] = h;
                left = left.min(self.lo[q]);
                right = right.max(self.hi[q]);
            }
        }
        for s in self.lo[b] as usize..self.hi[b] as usize {
            self.floor_undo.push((s as u32, self.floor[s]));
            self.floor[s] = h;
            self.total[s] -= self.size[b];
        }
        let target = self.target;
        let fits = |floor: u64, total: u64| floor.max(o).saturating_add(total) <= target;
        if !(part.lo as usize..part.hi as usize).all(|s| fits(self.floor[s], self.total[s])) {
            return (undo, false, hatless);
        }
        // A section's floor is at least the least minimum offset of its unplaced buffers.
        for s in (left..self.lo[b]).chain(self.hi[b]..right) {
            let s = s as usize;
            let floor = self.floor[s];
            let mut least = u64::MAX;
            for &q in self.sections[s] {
                let q = q as usize;
                if !self.placed[q] {
                    least = least.min(self.min_off[q]);
                    if least <= floor {
                        break;
                    }
                }
            }
            if least != u64::MAX && floor < least {
                self.floor_undo.push((s as u32, floor));
                self.floor[s] = least;
                if !fits(least, self.total[s]) {
                    return (undo, false, hatless);
                }
            }
        }
        (undo, true, hatless)
    }

    fn unplace(&mut self, b: usize, (offs, floors): (usize, usize)) {
        while self.floor_undo.len() > floors {
            if let Some((s, f)) = self.floor_undo.pop() {
                self.floor[s as usize] = f;
            }
        }
        for s in self.lo[b] as usize..self.hi[b] as usize {
            self.total[s] += self.size[b];
        }
        while self.off_undo.len() > offs {
            if let Some((q, m)) = self.off_undo.pop() {
                self.min_off[q as usize] = m;
            }
        }
        self.placed[b] = false;
        self.placed_count -= 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::offsets::{Interval, Problem};

    /// First fit (lowest offset that fits) in `order`.
    fn first_fit(p: &Problem, order: &[usize]) -> u64 {
        let mut off = vec![0u64; p.len()];
        let mut placed: Vec<usize> = Vec::new();
        for &b in order {
            let mut occ: Vec<(u64, u64)> = placed
                .iter()
                .filter(|&&q| p.overlaps(b, q))
                .map(|&q| (off[q], off[q] + p.size[q]))
                .collect();
            occ.sort_unstable();
            let mut o = 0;
            for (lo, hi) in occ {
                if lo >= o + p.size[b] {
                    break;
                }
                o = o.max(hi);
            }
            off[b] = o;
            placed.push(b);
        }
        p.arena(&off)
    }

    fn optimum(p: &Problem) -> u64 {
        fn perms(k: usize, v: &mut Vec<usize>, p: &Problem, best: &mut u64) {
            if k == v.len() {
                *best = (*best).min(first_fit(p, v));
                return;
            }
            for i in k..v.len() {
                v.swap(k, i);
                perms(k + 1, v, p, best);
                v.swap(k, i);
            }
        }
        let mut v: Vec<usize> = (0..p.len()).collect();
        let mut best = u64::MAX;
        perms(0, &mut v, p, &mut best);
        best
    }

    #[test]
    fn exact_on_tiny_instances() {
        let mut rng = graphc_ir::Rng::new(11);
        for case in 0..300 {
            let n = 1 + rng.below(8) as usize;
            let bufs: Vec<Interval> = (0..n)
                .map(|_| {
                    let s = rng.below(6) as u32;
                    Interval::new(s, s + 1 + rng.below(4) as u32, 1 + rng.below(9))
                })
                .collect();
            let p = Problem::new(&bufs, 1).unwrap();
            let opt = optimum(&p);
            let mut s = Solver::new(&p);
            let far = Instant::now() + std::time::Duration::from_secs(10);
            match s.fit(opt, u64::MAX, far).0 {
                Outcome::Found(o) => assert!(p.arena(&o) <= opt),
                _ => panic!("case {case}: optimum {opt} not found: {bufs:?}"),
            }
            if opt > 0 {
                assert!(
                    matches!(s.fit(opt - 1, u64::MAX, far).0, Outcome::Infeasible),
                    "case {case}"
                );
            }
        }
    }

    #[test]
    fn debug_case82() {
        let bufs: Vec<Interval> = vec![Interval::new(14, 20, 39), Interval::new(2, 3, 30), Interval::new(7, 11, 46), Interval::new(19, 20, 1), Interval::new(19, 20, 1), Interval::new(19, 20, 1), Interval::new(1, 2, 16), Interval::new(0, 2, 32), Interval::new(19, 20, 7), Interval::new(1, 2, 14), Interval::new(0, 7, 28), Interval::new(0, 1, 30), Interval::new(4, 12, 5), Interval::new(0, 3, 2), Interval::new(0, 19, 3), Interval::new(3, 12, 4), Interval::new(5, 13, 30), Interval::new(4, 5, 30), Interval::new(13, 18, 3), Interval::new(18, 20, 3), Interval::new(11, 19, 11), Interval::new(9, 14, 14), Interval::new(0, 19, 5), Interval::new(12, 20, 2), Interval::new(19, 20, 1), Interval::new(0, 3, 17), Interval::new(19, 20, 1), Interval::new(14, 19, 16), Interval::new(0, 9, 20), Interval::new(11, 19, 35), Interval::new(3, 9, 17), Interval::new(13, 14, 16), Interval::new(0, 14, 7), Interval::new(14, 18, 17), Interval::new(0, 4, 5), Interval::new(4, 5, 32), Interval::new(19, 20, 1), Interval::new(19, 20, 3), Interval::new(12, 19, 2), Interval::new(19, 20, 16), Interval::new(5, 14, 32), Interval::new(19, 20, 1), Interval::new(19, 20, 1), Interval::new(19, 20, 1), Interval::new(13, 20, 11), Interval::new(19, 20, 1), Interval::new(9, 19, 20), Interval::new(0, 3, 2), Interval::new(19, 20, 12), Interval::new(18, 19, 17), Interval::new(19, 20, 1), Interval::new(19, 20, 62), Interval::new(2, 4, 32), Interval::new(19, 20, 1), Interval::new(9, 14, 3), Interval::new(12, 19, 5), Interval::new(0, 7, 18), Interval::new(19, 20, 2), Interval::new(3, 4, 30)];
        let p = Problem::new(&bufs, 1).unwrap();
        let mut s = Solver::new(&p);
        let far = Instant::now() + std::time::Duration::from_secs(10);
        for pre in 0..3 {
            let st = s.run(169, pre, 200_000, far);
            eprintln!("preorder {pre}: {st:?} nodes {} maxdepth {}", s.nodes, s.max_placed);
        }
    }
}
