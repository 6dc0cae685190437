//! A depth-first search for a placement within a target arena, in the manner of
//! MiniMalloc (Moffitt, ASPLOS 2024).
//!
//! The search builds *canonical* placements: buffers are placed in non-decreasing
//! offset order, each as low as the buffers placed before it allow (it rests on one of
//! them or on 0). Every placement can be pushed down into such a form without growing.
//! The state is a skyline: per time section, the `floor` (the top of what is placed
//! there) and `rem`, the units of the unplaced buffers live there.
//!
//! At each state the section with the lowest floor `x` among the sections that still have
//! unplaced buffers is filled next. Branches:
//! - each unplaced buffer covering it whose lowest possible offset (the highest floor
//!   over its lifetime) is `x`, placed at `x` (largest first; of buffers with equal
//!   lifetime and size only the first is tried: they are interchangeable);
//! - last, "nothing starts at `x` here": the section's floor is raised to the next level
//!   (the lowest floor above `x` among the live sections, or the lowest offset above `x`
//!   of a buffer covering it). When no buffer can start at `x` this is the only branch.
//!
//! Pruning: a state is dead when some section's floor plus its unplaced units exceed the
//! target (only raising a floor can cause it: a placement moves units from `rem` to
//! `floor`), or a buffer covering the filled section cannot fit under the target even at
//! its lowest offset.
//!
//! Limits: `node_limit` states (deterministic), a deadline (a safety stop), and a depth
//! limit. The "next level" of the raising branch is a heuristic, so the search is exact
//! (finds a placement whenever one exists) for placements without waste, but a failure
//! is not a proof of infeasibility in general.

use std::time::Instant;

use super::offsets::Problem;

pub(crate) enum Outcome {
    /// Offsets (units) of a placement within the target.
    Found(Vec<u64>),
    /// The search space was exhausted (no canonical placement of the kind searched).
    NotFound,
    /// A limit stopped the search.
    Stopped,
}

struct State<'a> {
    p: &'a Problem,
    target: u64,
    floor: Vec<u64>,
    rem: Vec<u64>,
    placed: Vec<bool>,
    off: Vec<u64>,
    left: usize,
    /// Candidate stack shared by all depths.
    cand: Vec<u32>,
    /// Buffers with equal lifetime and size share a class.
    class: Vec<u32>,
    /// Preference among candidates (lower first).
    rank: Vec<u32>,
    nodes: u64,
    node_limit: u64,
    deadline: Instant,
    max_depth: usize,
    stopped: bool,
    /// Whether to try "nothing starts at x here" when some buffer could.
    waste_branch: bool,
}

/// How many search variants [`search`] knows (candidate preference x raising branch).
pub(crate) const VARIANTS: usize = 10;

/// Looks for a placement of `p` with every buffer below `target` units, visiting at
/// most `node_limit` states. Returns the outcome and the states visited. `variant`
/// (mod [`VARIANTS`]) picks the candidates' preference order (size, duration and
/// area descending, start ascending, end descending) and, for the
/// upper half, drops the raising branch when some buffer can start at the lowest floor
/// (a narrower search that often finds tight placements sooner, but is not exact).
pub(crate) fn search(p: &Problem, target: u64, node_limit: u64, deadline: Instant, variant: usize) -> (Outcome, u64) {
    let n = p.len();
    let sections = p.cover.len();
    let mut rem = vec![0u64; sections];
    for (s, c) in p.cover.iter().enumerate() {
        rem[s] = c.iter().map(|&b| p.size[b as usize]).sum();
    }
    if rem.iter().any(|&r| r > target) {
        return (Outcome::NotFound, 0);
    }
    let variant = variant % VARIANTS;
    let mut by_pref: Vec<usize> = (0..n).collect();
    let dur = |b: usize| u64::from(p.last[b] - p.first[b]);
    use std::cmp::Reverse as R;
    match variant % 5 {
        0 => by_pref.sort_by_key(|&b| (R(p.size[b]), R(dur(b)), b)),
        1 => by_pref.sort_by_key(|&b| (R(dur(b)), R(p.size[b]), b)),
        2 => by_pref.sort_by_key(|&b| (R(u128::from(p.size[b]) * u128::from(dur(b))), b)),
        3 => by_pref.sort_by_key(|&b| (p.first[b], R(p.size[b]), b)),
        _ => by_pref.sort_by_key(|&b| (R(p.last[b]), R(p.size[b]), b)),
    }
    let mut rank = vec![0u32; n];
    for (r, &b) in by_pref.iter().enumerate() {
        rank[b] = r as u32;
    }
    let mut keys: Vec<(u32, u32, u64, usize)> = (0..n).map(|b| (p.first[b], p.last[b], p.size[b], b)).collect();
    keys.sort_unstable();
    let mut class = vec![0u32; n];
    let mut c = 0u32;
    for k in 0..n {
        if k > 0 && (keys[k].0, keys[k].1, keys[k].2) != (keys[k - 1].0, keys[k - 1].1, keys[k - 1].2) {
            c += 1;
        }
        class[keys[k].3] = c;
    }
    let mut st = State {
        p,
        target,
        floor: vec![0; sections],
        rem,
        placed: vec![false; n],
        off: vec![0; n],
        left: n,
        cand: Vec::with_capacity(4 * n),
        class,
        rank,
        nodes: 0,
        node_limit,
        deadline,
        max_depth: 2 * (n + sections) + 64,
        stopped: false,
        waste_branch: variant < 5,
    };
    let found = st.dfs(0);
    let outcome = if found {
        Outcome::Found(st.off)
    } else if st.stopped {
        Outcome::Stopped
    } else {
        Outcome::NotFound
    };
    (outcome, st.nodes)
}

impl State<'_> {
    fn lowest(&self, b: usize) -> u64 {
        let (f, l) = (self.p.first[b] as usize, self.p.last[b] as usize);
        self.floor[f..l].iter().copied().max().unwrap_or(0)
    }

    fn dfs(&mut self, depth: usize) -> bool {
        if self.left == 0 {
            return true;
        }
        self.nodes += 1;
        if self.nodes > self.node_limit || (self.nodes.is_multiple_of(256) && Instant::now() >= self.deadline) {
            self.stopped = true;
            return false;
        }
        if depth > self.max_depth {
            return false;
        }
        // The lowest floor among sections with unplaced buffers.
        let (mut fill, mut x) = (usize::MAX, u64::MAX);
        for (s, (&f, &r)) in self.floor.iter().zip(&self.rem).enumerate() {
            if r > 0 && f < x {
                (fill, x) = (s, f);
            }
        }
        if fill == usize::MAX {
            return false; // unreachable while buffers are left; harmless
        }
        let p = self.p;
        let base = self.cand.len();
        let mut next = u64::MAX;
        for &b in &p.cover[fill] {
            let b = b as usize;
            if self.placed[b] {
                continue;
            }
            let low = self.lowest(b);
            if low + p.size[b] > self.target {
                self.cand.truncate(base);
                return false;
            }
            if low == x {
                self.cand.push(b as u32);
            } else {
                next = next.min(low);
            }
        }
        {
            let rank = &self.rank;
            self.cand[base..].sort_unstable_by_key(|&b| rank[b as usize]);
        }
        for i in base..self.cand.len() {
            let b = self.cand[i] as usize;
            if self.cand[base..i]
                .iter()
                .any(|&o| self.class[o as usize] == self.class[b])
            {
                continue;
            }
            // Every floor over b's lifetime is x (x is the lowest live floor and b's
            // lowest offset), so placing b moves its units from `rem` to `floor`.
            let (f, l) = (p.first[b] as usize, p.last[b] as usize);
            let top = x + p.size[b];
            for s in f..l {
                self.floor[s] = top;
                self.rem[s] -= p.size[b];
            }
            self.placed[b] = true;
            self.off[b] = x;
            self.left -= 1;
            if self.dfs(depth + 1) {
                self.cand.truncate(base);
                return true;
            }
            self.left += 1;
            self.placed[b] = false;
            for s in f..l {
                self.floor[s] = x;
                self.rem[s] += p.size[b];
            }
            if self.stopped {
                break;
            }
        }
        let had_cand = self.cand.len() > base;
        self.cand.truncate(base);
        if self.stopped || (had_cand && !self.waste_branch) {
            return false;
        }
        // Nothing starts at x in this section: raise its floor to the next level.
        for (&f, &r) in self.floor.iter().zip(&self.rem) {
            if r > 0 && f > x {
                next = next.min(f);
            }
        }
        if next == u64::MAX || next + self.rem[fill] > self.target {
            return false;
        }
        self.floor[fill] = next;
        if self.dfs(depth + 1) {
            return true;
        }
        self.floor[fill] = x;
        false
    }
}
