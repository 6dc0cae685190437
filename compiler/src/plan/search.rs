//! An exact depth-first search for a placement within a target arena, after MiniMalloc
//! (M. D. Moffitt, "MiniMalloc: A Lightweight Memory Allocator for Hardware-Accelerated
//! Machine Learning", ASPLOS 2023, proceedings vol. 4, 2024; doi:10.1145/3623278.3624752).
//! This is our own implementation of the ideas of that paper; the names are ours.
//!
//! **Sections.** A *section* is the set of buffers live just before some buffer ends (the
//! problem's time sections, keeping only those followed by an end: any other holds a
//! subset of the next one's buffers and prunes nothing more). A buffer spans a contiguous
//! range of sections; two buffers overlap in time iff their ranges meet.
//!
//! **Canonical placements.** Buffers are placed one at a time, each at its *minimum
//! offset*: the highest top among the already placed buffers that overlap it in time (0
//! if none). Any placement can be pushed down into one built this way, in non-decreasing
//! order of (offset, static rank); so a branch that would place a buffer before the
//! previous one in that order is skipped. Buffers with equal lifetime and size (*twins*)
//! are interchangeable and placed in index order.
//!
//! **Dominance.** Let `h` be the least `minimum offset + size` of the unplaced buffers. No
//! buffer is placed at an offset `>= h`: the buffer reaching `h` would then fit in the gap
//! below, a placement another branch builds. **Hatless pruning:** if the buffer just tried
//! overlaps no unplaced buffer and its branch failed, so do its siblings (it constrains
//! nothing that is left, so it could as well go first in each of them).
//!
//! **Section inference.** Per section: `floor`, a lower bound on the offset of anything
//! still to be placed there (the top of the last buffer placed across it, raised to the
//! least minimum offset of its unplaced buffers where those rose), and `total`, the units
//! of its unplaced buffers. A state is dead when some section has `max(floor, offset) +
//! total` above the target, `offset` being that of the last placement (later ones never
//! go lower). Before the floors rise this bound does not depend on which buffer is placed,
//! so each node computes once the highest offset with room and tries no candidate above.
//!
//! **Dynamic ordering.** At each node the candidates are the unplaced buffers sorted by
//! minimum offset, then by a static rank computed per sub-problem from one of four
//! preorders: MiniMalloc's `WAT`, `TAW`, `TWA` (lifetime width, area, largest section
//! total; each descending) and size first (which settles tight, waste-free packings much
//! sooner); ties by index.
//!
//! **Decomposition.** Between two adjacent sections, the *cut* counts the unplaced
//! buffers spanning both. Where it drops to zero the rest splits into independent
//! sub-problems (connected over time), solved one after another, each with fresh ranks
//! and canonical order; one that fails fails the branch, and a solved one is never
//! revisited. The whole problem is split the same way to start with.
//!
//! **Failed states.** What can still happen below a node depends only on its
//! sub-problem, the minimum offsets of its unplaced buffers and the canonical front (the
//! last (offset, rank)). A node whose sub-problem failed exhaustively is remembered by a
//! 128-bit fingerprint of the first two with the least restrictive front it failed
//! under; a node reaching the same fingerprint with a front at least as restrictive fails
//! at once (this cuts the permutations of placements that end in the same state).
//!
//! **Budget.** [`Solver::fit`] runs the preorders round-robin with a node limit doubling
//! per round (starting at four times the buffer count), as MiniMalloc does, within an
//! overall node budget (deterministic) and a deadline (a safety stop). A complete search
//! that finds nothing proves that no placement fits the target.

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
    /// Size.
    Size,
}

/// The static preorders tried in turn: MiniMalloc's three (`WAT`, `TAW`, `TWA`), then
/// size first (which finds tight, waste-free packings much sooner).
const PREORDERS: [[Key; 3]; 4] = [
    [Key::Width, Key::Area, Key::Total],
    [Key::Total, Key::Area, Key::Width],
    [Key::Total, Key::Width, Key::Area],
    [Key::Size, Key::Width, Key::Area],
];

/// A sub-problem: unplaced buffers living within sections `lo..hi`.
struct Part {
    bufs: Vec<u32>,
    lo: u32,
    hi: u32,
}

/// A 128-bit fingerprint, built from words (two multiply-rotate streams).
#[derive(Clone, Copy)]
struct Fingerprint(u64, u64);

impl Fingerprint {
    fn new(seed: u64) -> Fingerprint {
        Fingerprint(
            seed ^ 0x243f_6a88_85a3_08d3,
            seed.rotate_left(32) ^ 0x1319_8a2e_0370_7344,
        )
    }

    fn add(&mut self, x: u64) {
        self.0 = (self.0.rotate_left(23) ^ x).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        self.1 = (self.1 ^ x.rotate_left(17))
            .wrapping_mul(0xff51_afd7_ed55_8ccd)
            .rotate_left(29);
    }

    fn get(self) -> u128 {
        (u128::from(self.0) << 64) | u128::from(self.1)
    }
}

impl Part {
    /// Identifies the sub-problem (its buffers and sections), which fixes its ranks.
    fn root(&self) -> u64 {
        let mut f = Fingerprint::new(u64::from(self.lo) << 32 | u64::from(self.hi));
        for &b in &self.bufs {
            f.add(u64::from(b));
        }
        f.0 ^ f.1
    }
}

/// Hashes `u128` fingerprints by their low bits (they are already mixed).
#[derive(Default)]
struct FingerprintHasher(u64);

impl std::hash::Hasher for FingerprintHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0.rotate_left(8) ^ u64::from(b)).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        }
    }

    fn write_u128(&mut self, x: u128) {
        self.0 = x as u64;
    }
}

/// Failed states: fingerprint of (sub-problem, unplaced buffers with their minimum
/// offsets) -> the least restrictive (offset, rank) front under which it failed.
type Failed = std::collections::HashMap<u128, (u64, u32), std::hash::BuildHasherDefault<FingerprintHasher>>;

/// At most this many failed states are remembered per search.
const FAILED_CAP: usize = 1 << 20;

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
    failed: Failed,
    /// Reused by [`Solver::search`] to sort the unplaced buffers.
    scratch: Vec<(u64, u32)>,
    nodes: u64,
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
        let mut keys: Vec<(u32, u32, u64, u32)> =
            (0..n).map(|b| (p.first[b], p.last[b], p.size[b], b as u32)).collect();
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
            failed: Failed::default(),
            scratch: Vec::new(),
            nodes: 0,
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
        self.failed.clear();
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
                Key::Size => u128::from(s.size[b]),
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
        self.search(part, part.root(), &pre, (0, 0))
    }

    /// The search proper over `part`, whose buffers by rank are `pre`; `last` is the
    /// (offset, rank) of the last placement. Only the candidates outlive the setup (in a
    /// vector per depth), so memory stays small on deep searches.
    fn search(&mut self, part: &Part, root: u64, pre: &[u32], last: (u64, u32)) -> Status {
        self.nodes += 1;
        if self.nodes > self.limit || (self.nodes.is_multiple_of(16) && Instant::now() >= self.deadline) {
            return Status::Stopped;
        }
        let mut ord = std::mem::take(&mut self.scratch);
        ord.clear();
        ord.extend(
            pre.iter()
                .zip(0u32..)
                .filter(|&(&b, _)| !self.placed[b as usize])
                .map(|(&b, r)| (self.min_off[b as usize], r)),
        );
        if ord.is_empty() {
            self.scratch = ord;
            for &b in &part.bufs {
                self.solution[b as usize] = self.off[b as usize];
            }
            return Status::Found;
        }
        ord.sort_unstable();
        // The rest depends only on the unplaced buffers' minimum offsets and the front.
        let mut fp = Fingerprint::new(root);
        for &(o, r) in &ord {
            fp.add(o);
            fp.add(u64::from(r));
        }
        let key = fp.get();
        let min_height = ord
            .iter()
            .map(|&(o, r)| o.saturating_add(self.size[pre[r as usize] as usize]))
            .min()
            .unwrap_or(u64::MAX);
        // Section inference, for every candidate at once: whatever is placed next at `o`,
        // each section still needs room for its unplaced units above `max(o, floor)`.
        let mut top = u64::MAX;
        let mut dead = self.failed.get(&key).is_some_and(|&front| front <= last);
        for s in part.lo as usize..part.hi as usize {
            let (f, t) = (self.floor[s], self.total[s]);
            dead |= f.saturating_add(t) > self.target;
            top = top.min(self.target.saturating_sub(t));
        }
        // The candidates: canonical (not before `last`), below `min_height` (dominance)
        // and at most `top`.
        let from = ord.partition_point(|&e| e < last);
        let to = from + ord[from..].partition_point(|&(o, _)| o < min_height && o <= top);
        let cands: Vec<(u64, u32)> = if dead { Vec::new() } else { ord[from..to].to_vec() };
        self.scratch = ord;
        if dead {
            return Status::NotFound;
        }
        for &(o, r) in &cands {
            let b = pre[r as usize] as usize;
            if self.twin[b] != u32::MAX && !self.placed[self.twin[b] as usize] {
                continue; // its twin goes first
            }
            let (undo, ok, hatless) = self.place(b, o);
            let status = if ok {
                self.descend(part, root, pre, (o, r), b)
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
        if self.failed.len() < FAILED_CAP {
            let front = self.failed.entry(key).or_insert(last);
            *front = (*front).min(last);
        }
        Status::NotFound
    }

    /// After placing `b`: splits the part where cuts dropped to zero, else searches on.
    fn descend(&mut self, part: &Part, root: u64, pre: &[u32], last: (u64, u32), b: usize) -> Status {
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
            self.search(part, root, pre, last)
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
    fn place(&mut self, b: usize, o: u64) -> ((usize, usize), bool, bool) {
        let undo = (self.off_undo.len(), self.floor_undo.len());
        self.placed[b] = true;
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
        // Section inference before the floors rise: for b's sections `max(o, floor) +
        // total` is unchanged (its floor there is at most o), elsewhere nothing changed:
        // the caller only places b at an offset where it holds (see `search`).
        let target = self.target;
        let fits = |floor: u64, total: u64| floor.max(o).saturating_add(total) <= target;
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
}
