//! The offset-assignment API and its driver.

use std::fmt;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use super::greedy::{best_fit, best_fit_by_start, local_search, Order};
use super::search::{Outcome, Solver};
use graphc_ir::work::{self, Stage};

/// A buffer live over `[start, end)` of a schedule (`end > start`), taking `size` bytes.
///
/// A buffer of size 0 is allowed: it gets offset 0 and occupies no address.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Interval {
    pub start: u32,
    /// Exclusive; must be greater than `start`.
    pub end: u32,
    pub size: u64,
}

impl Interval {
    pub fn new(start: u32, end: u32, size: u64) -> Interval {
        Interval { start, end, size }
    }
}

/// Which method gave a placement; serialized as its name (`greedy:size`, `search`, ...).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Strategy {
    /// Nothing occupies memory.
    #[default]
    #[serde(rename = "empty")]
    Empty,
    /// Greedy best-fit, size descending.
    #[serde(rename = "greedy:size")]
    GreedySize,
    /// Greedy best-fit, lifetime length descending.
    #[serde(rename = "greedy:duration")]
    GreedyDuration,
    /// Greedy best-fit, size x lifetime descending.
    #[serde(rename = "greedy:area")]
    GreedyArea,
    /// Greedy best-fit, start ascending (also the sweep for very large inputs).
    #[serde(rename = "greedy:start")]
    GreedyStart,
    /// The exact search.
    #[serde(rename = "search")]
    Search,
    /// The local search over greedy orders.
    #[serde(rename = "local")]
    Local,
}

impl Strategy {
    /// The strategy's name, as serialized.
    pub fn name(self) -> &'static str {
        match self {
            Strategy::Empty => "empty",
            Strategy::GreedySize => "greedy:size",
            Strategy::GreedyDuration => "greedy:duration",
            Strategy::GreedyArea => "greedy:area",
            Strategy::GreedyStart => "greedy:start",
            Strategy::Search => "search",
            Strategy::Local => "local",
        }
    }

    /// One of the greedy best-fit orders.
    pub fn is_greedy(self) -> bool {
        matches!(
            self,
            Strategy::GreedySize | Strategy::GreedyDuration | Strategy::GreedyArea | Strategy::GreedyStart
        )
    }
}

impl fmt::Display for Strategy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Options of [`assign_offsets`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PlanOptions {
    /// Every offset is a multiple of `align`, and every size is rounded up to it (so the
    /// arena is a multiple of it). Must be positive; need not be a power of two.
    pub align: u64,
    /// A safety stop on the improvement phase (greedy always runs to the end). When it
    /// triggers, the result depends on the machine's speed: `node_limit` is the limit
    /// meant to stop the search, and keeps the result deterministic (the memory planner
    /// sizes it by the problem: [`search_nodes`]).
    pub time_budget: Duration,
    /// A target: stop improving once the arena is at most this many bytes (or equals the
    /// lower bound). `None`: aim for the lower bound.
    pub capacity: Option<u64>,
    /// The search's budget in visited states (over all its attempts): the primary,
    /// deterministic limit of the improvement phase. 0 turns the search off.
    pub node_limit: u64,
}

impl Default for PlanOptions {
    fn default() -> PlanOptions {
        PlanOptions {
            align: 256,
            time_budget: Duration::from_millis(200),
            capacity: None,
            node_limit: 200_000,
        }
    }
}

/// The result of [`assign_offsets`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Placement {
    /// The byte offset of each buffer, in input order (multiples of the alignment).
    pub offsets: Vec<u64>,
    /// The arena's size in bytes: the highest `offset + size rounded up to align`.
    pub arena: u64,
    /// [`lower_bound`] of the input at the same alignment.
    pub lower_bound: u64,
    /// Which method gave the final placement: a greedy order, the search or the local
    /// search over greedy orders; [`Strategy::Empty`] when nothing occupies memory.
    pub strategy: Strategy,
    /// The best greedy arena (bytes) and its order, for reports.
    pub greedy_arena: u64,
    pub greedy_strategy: Strategy,
    /// Budget used by the improvement phase: states the search visited plus, for the
    /// local search, the number of buffers per best-fit evaluation (0 if neither ran).
    pub search_nodes: u64,
    /// Wall time of the whole call.
    pub time: Duration,
}

/// Why [`assign_offsets`] refused its input.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PlanError {
    /// `align` is 0.
    ZeroAlign,
    /// A buffer's `end` is not after its `start`.
    EmptyLifetime { buffer: usize, start: u32, end: u32 },
    /// The sizes (rounded up to the alignment) add up past `u64`.
    Overflow,
    /// The GEMM scratch of a matmul kernel cannot be sized: its epilogue split
    /// ([`crate::codegen::epilogue_plan`]) found the kernel malformed.
    Codegen(Box<crate::codegen::CodegenError>),
}

impl fmt::Display for PlanError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PlanError::ZeroAlign => write!(f, "alignment must be positive"),
            PlanError::EmptyLifetime { buffer, start, end } => {
                write!(
                    f,
                    "buffer {buffer}: lifetime [{start}, {end}) is empty (end must be after start)"
                )
            }
            PlanError::Overflow => write!(f, "buffer sizes add up past 2^64 bytes"),
            PlanError::Codegen(e) => write!(f, "GEMM scratch: {e}"),
        }
    }
}

impl std::error::Error for PlanError {}

/// `size` rounded up to a multiple of `align`, in units of `align` (`align > 0`).
pub(crate) fn units(size: u64, align: u64) -> u64 {
    size.div_ceil(align)
}

/// The most bytes live at once, each size rounded up to a multiple of `align` (as the
/// planner places them; `align` 0 is taken as 1). Buffers whose `end <= start` count as
/// never live. No placement can use a smaller arena.
pub fn lower_bound(bufs: &[Interval], align: u64) -> u64 {
    let align = align.max(1);
    let mut events: Vec<(u32, bool, u64)> = Vec::with_capacity(2 * bufs.len());
    for b in bufs.iter().filter(|b| b.end > b.start) {
        let s = units(b.size, align).saturating_mul(align);
        events.push((b.start, true, s));
        events.push((b.end, false, s));
    }
    // At equal times, ends (false) sort before starts (true): `end` is exclusive.
    events.sort_unstable();
    let (mut live, mut peak) = (0u64, 0u64);
    for (_, start, s) in events {
        if start {
            live = live.saturating_add(s);
            peak = peak.max(live);
        } else {
            live = live.saturating_sub(s);
        }
    }
    peak
}

/// Problems of at most this many buffers get every greedy order and the search; larger
/// ones the one greedy order that runs as a sweep in `O(n log n)` (greedy best-fit in
/// other orders costs `O(n^2)`, the search's tables up to `O(n^2)` memory).
pub const EXACT_MAX_BUFFERS: usize = 4096;

/// Nor is a problem searched when its buffers span more than this many (buffer,
/// section) pairs in all (the search's per-section tables).
const EXACT_MAX_COVER: u64 = 1 << 22;

/// The buffers that occupy memory, with time compressed to sections and sizes in units
/// of the alignment. Section `k` is the time between the `k`-th and `k+1`-th distinct
/// endpoint; a buffer spans sections `first..last`.
pub(crate) struct Problem {
    /// Index into the caller's slice.
    pub orig: Vec<usize>,
    pub first: Vec<u32>,
    pub last: Vec<u32>,
    /// Size in units of the alignment (> 0).
    pub size: Vec<u64>,
    /// Per section, the buffers covering it (ascending). Built only for problems small
    /// enough to search (`exact`); empty otherwise.
    pub cover: Vec<Vec<u32>>,
    /// Whether the problem is small enough for every greedy order and the search
    /// ([`EXACT_MAX_BUFFERS`], [`EXACT_MAX_COVER`]).
    pub exact: bool,
    /// The distinct endpoints: section `k` is `time[k]..time[k + 1]` of the schedule.
    pub time: Vec<u32>,
    /// Live-units lower bound.
    pub lower: u64,
}

impl Problem {
    pub(crate) fn new(bufs: &[Interval], align: u64) -> Result<Problem, PlanError> {
        let mut points: Vec<u32> = Vec::with_capacity(2 * bufs.len());
        let mut total: u64 = 0;
        for (i, b) in bufs.iter().enumerate() {
            if b.end <= b.start {
                return Err(PlanError::EmptyLifetime {
                    buffer: i,
                    start: b.start,
                    end: b.end,
                });
            }
            let u = units(b.size, align);
            total = total.checked_add(u).ok_or(PlanError::Overflow)?;
            if u > 0 {
                points.push(b.start);
                points.push(b.end);
            }
        }
        total.checked_mul(align).ok_or(PlanError::Overflow)?;
        points.sort_unstable();
        points.dedup();
        let sections = points.len().saturating_sub(1);
        let index = |t: u32| points.partition_point(|&p| p < t) as u32;
        let mut p = Problem {
            orig: Vec::new(),
            first: Vec::new(),
            last: Vec::new(),
            size: Vec::new(),
            cover: Vec::new(),
            exact: false,
            time: Vec::new(),
            lower: 0,
        };
        // Live units per section, as differences (the lower bound without the cover).
        let mut delta = vec![0i128; sections + 1];
        let mut spans = 0u64;
        work::add_len(Stage::Plan, 2 * bufs.len());
        for (i, b) in bufs.iter().enumerate() {
            let u = units(b.size, align);
            if u == 0 {
                continue;
            }
            let (f, l) = (index(b.start), index(b.end));
            delta[f as usize] += i128::from(u);
            delta[l as usize] -= i128::from(u);
            spans += u64::from(l - f);
            p.orig.push(i);
            p.first.push(f);
            p.last.push(l);
            p.size.push(u);
        }
        // The running sum stays within 0..=total, which fits u64 (checked above).
        let mut live = 0i128;
        for d in &delta[..sections] {
            live += d;
            p.lower = p.lower.max(u64::try_from(live).unwrap_or(u64::MAX));
        }
        p.exact = p.len() <= EXACT_MAX_BUFFERS && spans <= EXACT_MAX_COVER;
        if p.exact {
            p.cover = vec![Vec::new(); sections];
            work::add(Stage::Plan, spans);
            for id in 0..p.len() {
                for c in &mut p.cover[p.first[id] as usize..p.last[id] as usize] {
                    c.push(id as u32);
                }
            }
        }
        p.time = points;
        Ok(p)
    }

    pub fn len(&self) -> usize {
        self.orig.len()
    }

    pub fn overlaps(&self, a: usize, b: usize) -> bool {
        self.first[a] < self.last[b] && self.first[b] < self.last[a]
    }

    /// The arena (units) of offsets (units) of every buffer.
    pub fn arena(&self, off: &[u64]) -> u64 {
        off.iter().zip(&self.size).map(|(o, s)| o + s).max().unwrap_or(0)
    }
}

/// Places every buffer at an offset in one arena; see the module doc.
///
/// 1. Greedy best-fit in four orders (size, duration, area = size x duration, all
///    descending; start ascending; ties by index): each buffer goes into the gap, among
///    the buffers already placed that overlap it in time, that it fits with the least
///    waste (lowest offset on ties), else on top of them. The smallest arena wins; if it
///    is at most `max(lower bound, capacity)` (the goal), that is the result.
/// 2. Else the exact search of `search.rs` (after MiniMalloc) asks "does everything fit
///    under the goal?" with half of `node_limit` and of the time left; then, if it did
///    not say yes, it bisects over targets between the goal and the best arena found,
///    each try with half of what is left, taking every placement it finds.
/// 3. If the search found nothing below greedy, a local search over best-fit orders
///    (`greedy.rs`) spends what is left.
///
/// The result is never worse than the best greedy order. Deterministic for equal inputs
/// and options as long as `time_budget` does not run out before `node_limit`.
///
/// A problem of more than [`EXACT_MAX_BUFFERS`] buffers (or whose lifetimes span more
/// than 2^22 buffer-sections) gets only best-fit in start order, run as a sweep in
/// `O(n log n)` (the same placement as the quadratic loop): the other orders, the search
/// and its tables cost up to `O(n^2)` time or memory, so a 100k-buffer program would
/// take minutes to plan.
pub fn assign_offsets(bufs: &[Interval], opts: &PlanOptions) -> Result<Placement, PlanError> {
    let t0 = Instant::now();
    let align = opts.align;
    if align == 0 {
        return Err(PlanError::ZeroAlign);
    }
    let p = Problem::new(bufs, align)?;
    let to_bytes = |off: &[u64]| {
        let mut out = vec![0u64; bufs.len()];
        for (k, &o) in off.iter().enumerate() {
            out[p.orig[k]] = o * align;
        }
        out
    };
    if p.len() == 0 {
        return Ok(Placement {
            offsets: vec![0; bufs.len()],
            arena: 0,
            lower_bound: 0,
            strategy: Strategy::Empty,
            greedy_arena: 0,
            greedy_strategy: Strategy::Empty,
            search_nodes: 0,
            time: t0.elapsed(),
        });
    }

    if !p.exact {
        // Too large for the orders that cost O(n^2) and for the search: the sweep.
        let off = best_fit_by_start(&p);
        let arena = p.arena(&off) * align;
        let name = Order::Start.strategy();
        return Ok(Placement {
            offsets: to_bytes(&off),
            arena,
            lower_bound: p.lower * align,
            strategy: name,
            greedy_arena: arena,
            greedy_strategy: name,
            search_nodes: 0,
            time: t0.elapsed(),
        });
    }
    let (mut greedy_arena, mut off, mut greedy_name, mut greedy_order) =
        (u64::MAX, Vec::new(), Strategy::Empty, Vec::new());
    for order in Order::ALL {
        let seq = order.sequence(&p);
        let o = best_fit(&p, &seq);
        let a = p.arena(&o);
        if a < greedy_arena {
            (greedy_arena, off, greedy_name, greedy_order) = (a, o, order.strategy(), seq);
        }
    }
    let mut arena = greedy_arena;
    let mut strategy = greedy_name;

    // Improvement: the exact search (`search.rs`) for the goal, then for targets between
    // the best arena known not to fit and the best found; the local search over greedy
    // orders if that found nothing better.
    let goal = p.lower.max(opts.capacity.map_or(0, |c| c / align));
    let deadline = t0 + opts.time_budget;
    let node_limit = opts.node_limit;
    let mut nodes = 0u64;
    if arena > goal && node_limit > 0 {
        let (better, used) = improve(&p, goal, arena, node_limit, deadline);
        // The search's states, visited on a thread of its own.
        work::add(Stage::Plan, used);
        nodes += used;
        if let Some(o) = better {
            let a = p.arena(&o);
            if a < arena && valid(&p, &o) {
                (arena, off) = (a, o);
                strategy = Strategy::Search;
            }
        }
    }
    if arena > goal && arena == greedy_arena && node_limit > nodes {
        let (better, used) = local_search(&p, greedy_order, arena, goal, node_limit - nodes, deadline);
        work::add(Stage::Plan, used);
        nodes += used;
        if let Some((o, a)) = better {
            if a < arena {
                (arena, off) = (a, o);
                strategy = Strategy::Local;
            }
        }
    }

    Ok(Placement {
        offsets: to_bytes(&off),
        arena: arena * align,
        lower_bound: p.lower * align,
        strategy,
        greedy_arena: greedy_arena * align,
        greedy_strategy: greedy_name,
        search_nodes: nodes,
        time: t0.elapsed(),
    })
}

/// The work of the improvement phase, in visited states times buffers: a state of a
/// problem of `n` buffers costs about `n` (its overlaps), and a search's descent is `n`
/// states. 2 * 10^7 is about 0.2 s of search on one core.
pub const SEARCH_WORK: u64 = 20_000_000;

/// The states the improvement phase of a problem of `n` buffers may visit: `limit`, but
/// at most [`SEARCH_WORK`] / `n` (at least two descents), so that the budget, not the
/// time (a safety stop only), ends the search of a large problem and the plan does not
/// depend on the machine's speed or load (fit's probes plan on two cores at once).
/// The memory planner's limit; [`assign_offsets`] takes its caller's as it is.
pub fn search_nodes(limit: u64, n: usize) -> u64 {
    let n = n.max(1) as u64;
    limit.min((SEARCH_WORK / n).max(2 * n))
}

/// The search phase of [`assign_offsets`]: the goal with half the budget (nodes and
/// time), then a bisection over targets between the highest target that failed and the
/// best arena found (`arena` to start with), each try with half of what is left. Returns
/// the best placement found below `arena`, if any, and the states visited. Runs on a
/// thread with a stack sized for the search's recursion (depth about 4 per buffer);
/// finds nothing if that thread cannot be started.
fn improve(p: &Problem, goal: u64, arena: u64, budget: u64, deadline: Instant) -> (Option<Vec<u64>>, u64) {
    let run = || {
        let mut solver = Solver::new(p);
        // Targets below `lo` are out of reach; `hi` is the largest one that improves.
        let (mut lo, mut hi, mut best) = (goal, arena.saturating_sub(1), None);
        let mut used = 0u64;
        let mut target = goal;
        while lo <= hi && used < budget {
            let now = Instant::now();
            if now >= deadline {
                break;
            }
            let share = ((budget - used) / 2).max(1);
            let until = now + deadline.saturating_duration_since(now) / 2;
            let (outcome, u) = solver.fit(target, share, until);
            used = used.saturating_add(u);
            match outcome {
                Outcome::Found(o) => {
                    hi = p.arena(&o).min(target).saturating_sub(1);
                    best = Some(o);
                }
                // Not found: the target is out of reach (proven or not).
                Outcome::Infeasible | Outcome::Stopped => lo = target + 1,
            }
            target = lo + hi.saturating_sub(lo) / 2;
        }
        (best, used)
    };
    let stack = (p.len() as u64).saturating_mul(4096).saturating_add(4 << 20);
    std::thread::scope(|s| {
        std::thread::Builder::new()
            .name("graphc-plan-search".into())
            .stack_size(usize::try_from(stack).unwrap_or(usize::MAX))
            .spawn_scoped(s, run)
            .ok()
            .and_then(|h| h.join().ok())
            .unwrap_or((None, 0))
    })
}

/// Whether `off` (units) places every buffer of `p` without two overlapping in both time
/// and address: a guard on the search's output.
fn valid(p: &Problem, off: &[u64]) -> bool {
    if off.len() != p.len() {
        return false;
    }
    let mut order: Vec<usize> = (0..p.len()).collect();
    order.sort_unstable_by_key(|&b| (p.first[b], b));
    let mut live: Vec<usize> = Vec::new();
    for &b in &order {
        work::add_len(Stage::Plan, 1 + 2 * live.len());
        live.retain(|&q| p.last[q] > p.first[b]);
        let (lo, hi) = (off[b], off[b].saturating_add(p.size[b]));
        if live
            .iter()
            .any(|&q| off[q] < hi && lo < off[q].saturating_add(p.size[q]))
        {
            return false;
        }
        live.push(b);
    }
    true
}

/// The best-fit arena (bytes) of one greedy order by name (`size`, `duration`, `area`,
/// `start`), for tests and reports; `None` for an unknown name.
pub fn greedy_arena(bufs: &[Interval], align: u64, order: &str) -> Result<Option<u64>, PlanError> {
    if align == 0 {
        return Err(PlanError::ZeroAlign);
    }
    let p = Problem::new(bufs, align)?;
    let Some(o) = Order::ALL
        .into_iter()
        .find(|o| o.strategy().name().strip_prefix("greedy:") == Some(order))
    else {
        return Ok(None);
    };
    Ok(Some(p.arena(&best_fit(&p, &o.sequence(&p))) * align))
}
