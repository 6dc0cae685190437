//! Batch-size fitting: the largest value of one dimension whose memory plan fits the
//! budget, found by replanning.
//!
//! The search assumes that memory grows with the dimension (true of batch and sequence
//! dims): it probes 1, then grows the value (doubling it, then to where the totals seen
//! so far, extended as a straight line, meet the budget) until a plan does not fit (or
//! `max` is reached), then closes in between the last value that fit and the first
//! that did not: at the point where the line through the two totals meets the budget
//! (memory is close to linear in a batch dim, so this lands at or next to the answer),
//! or at the midpoint after such steps in a row that did not halve the bracket (two,
//! the last over; or four), or when the upper end could not be planned at all. A probe whose graph cannot be built or
//! compiled at a value larger than 1 (a shape too large to index, sizes past 2^64
//! bytes) counts as not fitting, and its reason is kept.
//!
//! How a probe compiles: [`fit`] (a graph built in Rust at each value) builds and
//! compiles it through the whole pipeline. [`fit_model`] (an ONNX model) imports and
//! optimizes the model once per shape family instead (`pipeline::family`): it compiles
//! the model at 1 (the first probe) and at `family::LOW` (2, the second) and, on the
//! other core, at `family::MARKER`; from the last two it captures the family, and every later
//! probe writes the family's graph out at its value, then fuses and plans it — the
//! schedule and memory plan are computed at that value exactly as `graphc plan` computes
//! them. When the two samples differ other than in polynomials of the dimension (the
//! model's compile changes with the value), every probe compiles, and [`Fit::compiles`]
//! says why.
//!
//! At most [`MAX_PROBES`] probes are made, whatever `max` is (up to `usize::MAX`): the
//! values are integers, so overflow saturates at `max`. Should the budget run out before
//! the bracket closes, the result says so ([`Fit::exhausted`]): the answer is then at
//! least [`Fit::value`] and below [`Fit::first_over`].
//!
//! A training step's probes come from a shape family of the step (`fit_step`): the
//! step graph (made trainable, its loss, gradients and update, optimized) captured at
//! `family::LOW` and `family::MARKER`, written out at each value, then recomputation
//! chosen, fused and planned; with `--remat auto`, the step as it is and with every
//! layer made again are searched on one core each.

use graphc_compiler::pipeline::family::{self, FamilyError, ShapeFamily, StepFamily};
use graphc_compiler::train::{Remat, TrainOptions};
use graphc_compiler::{CompileOptions, Compiled};
use graphc_ir::{Graph, TensorType};

use crate::Error;

mod step;

/// One value tried.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Probe {
    pub value: usize,
    /// What the run needs at this value (`None` when it could not be planned).
    pub total_bytes: Option<u64>,
    pub fits: bool,
    /// Why it could not be planned, when it could not.
    pub error: Option<String>,
}

/// The result of [`fit`].
#[derive(Debug)]
pub struct Fit {
    /// The largest value whose plan fits the budget.
    pub value: usize,
    /// Whether the search stopped at `max` with the plan still fitting (the true largest
    /// value may be higher).
    pub capped: bool,
    /// Whether the search used all [`MAX_PROBES`] probes before it closed in: the true
    /// largest value is then between `value` and the first value over.
    pub exhausted: bool,
    /// The model compiled at `value` (its `plan` is the plan that fits).
    pub compiled: Compiled,
    /// Every value tried, in the order tried.
    pub probes: Vec<Probe>,
    /// How the probes were compiled.
    pub compiles: ProbeCompiles,
    /// The model compiled at the first value over ([`Fit::first_over`]), when the
    /// search kept it: planned as [`Fit::compiled`] is, so the two tell what grows.
    pub over: Option<Compiled>,
    /// A training step fitted with `--remat auto`: the largest value with nothing made
    /// again (`--remat off`), or why none is.
    pub without: Option<Result<usize, Box<Error>>>,
}

/// How [`fit`]'s probes got their compiled model.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ProbeCompiles {
    /// Each probe built and compiled the graph ([`fit`]).
    Each,
    /// Probes past `family::LOW` wrote out the shape family of the dimension: `integers`
    /// of its optimized graph depend on it.
    Family { integers: usize },
    /// The shape family could not be captured (why), so each probe compiled.
    EachBecause(String),
}

impl Fit {
    /// The smallest value tried that did not fit, if any.
    pub fn first_over(&self) -> Option<&Probe> {
        self.probes
            .iter()
            .filter(|p| !p.fits && p.value > self.value)
            .min_by_key(|p| p.value)
    }
}

/// The most values [`fit`] tries, the first (1) included.
pub const MAX_PROBES: usize = 64;

/// The largest `value` in `1..=max` for which `build(value)`, compiled with `opts`, has
/// a plan within `opts.memory.budget_bytes`, in at most [`MAX_PROBES`] probes. Errors
/// when even `value = 1` does not fit ([`Error::DoesNotFit`], with the plan at 1) or
/// cannot be built.
pub fn fit<F>(mut build: F, opts: &CompileOptions, max: usize) -> Result<Fit, Error>
where
    F: FnMut(usize) -> Result<Graph, Error>,
{
    search(
        |value| build(value).and_then(|g| Ok(graphc_compiler::compile(&g, opts)?)),
        opts,
        max,
        ProbeCompiles::Each,
        1,
    )
}

/// The search of [`fit`], given the model compiled at each value.
///
/// `start` above 1: the first probe (a value that fitting makes 1 fit too, so 1 is not
/// probed; when it does not fit, the search goes on from 1 below it).
fn search<F>(
    compile_at: F,
    opts: &CompileOptions,
    max: usize,
    compiles: ProbeCompiles,
    start: usize,
) -> Result<Fit, Error>
where
    F: FnMut(usize) -> Result<Compiled, Error>,
{
    search_with(compile_at, None, opts, max, compiles, start)
}

/// Compiles two values at once (one per core): `value` and `value + 1`.
type Pair<'a> = &'a mut dyn FnMut(usize) -> [Result<Compiled, Error>; 2];

/// [`search`], which closes in with `pair` when given: each value between the ends
/// is probed with the one above it, so that a prediction that fits with the next one
/// over settles the answer in one round (the line's guesses usually land at or just
/// below the boundary).
fn search_with<F>(
    mut compile_at: F,
    mut pair: Option<Pair<'_>>,
    opts: &CompileOptions,
    max: usize,
    compiles: ProbeCompiles,
    start: usize,
) -> Result<Fit, Error>
where
    F: FnMut(usize) -> Result<Compiled, Error>,
{
    let max = max.max(1);
    let budget = opts.memory.budget_bytes;
    let Opening {
        mut probes,
        one,
        mut hi,
        mut over,
    } = opening(&mut compile_at, start, max)?;
    let mut probe =
        |value: usize, probes: &mut Vec<Probe>| -> Result<Probed, Error> { record(value, compile_at(value), probes) };
    // The last value that fit and its total; the first that did not (and its total).
    let lo = probes.iter().filter(|p| p.fits).map(|p| p.value).max().unwrap_or(1);
    let (mut lo, mut lo_total, mut best) = (lo, one.plan.total_bytes, one);
    let mut prev: Option<(usize, u64)> = None;
    while hi.is_none() && lo < max && probes.len() < MAX_PROBES {
        let next = grow(lo, lo_total, prev, budget, max);
        match probe(next, &mut probes)? {
            Ok(c) => {
                prev = Some((lo, lo_total));
                (lo, lo_total, best) = (next, c.plan.total_bytes, c);
            }
            Err(c) => {
                hi = Some((next, probes.last().and_then(|p| p.total_bytes)));
                over = c;
                break;
            }
        }
    }
    // Interpolation steps in a row that did not halve the bracket; after two whose
    // last was over, or four, a midpoint (a line that keeps landing just below the
    // boundary is closing in on it: the step after usually closes the bracket).
    // After a step that fit, the line through it and the value that fit before (the
    // local slope) is the better guess: the line to a far upper end is steeper.
    let (mut slow, mut halving) = (0, false);
    let mut below: Option<(usize, u64)> = None;
    while let Some((h, h_total)) = hi {
        if h - lo <= 1 || probes.len() >= MAX_PROBES {
            break;
        }
        let mid = match h_total {
            _ if halving => lo + (h - lo) / 2,
            _ if below.is_some() => grow(lo, lo_total, below, budget, h - 1).max(lo + 1),
            Some(t) => interpolate((lo, lo_total), (h, t), budget),
            None => lo + (h - lo) / 2,
        };
        let width = h - lo;
        // With `pair`: the value above `mid` too, when it is below the upper end.
        let (at_mid, above) = match pair.as_mut() {
            Some(pair) if mid + 1 < h && probes.len() + 1 < MAX_PROBES => {
                let [a, b] = pair(mid);
                (a, Some(b))
            }
            _ => (compile_at(mid), None),
        };
        let mut last = mid;
        match record(mid, at_mid, &mut probes)? {
            Ok(c) => {
                below = Some((lo, lo_total));
                (lo, lo_total, best) = (mid, c.plan.total_bytes, c);
                // `mid` fit: the value above it is the next probe.
                if let Some(above) = above {
                    last = mid + 1;
                    match record(mid + 1, above, &mut probes)? {
                        Ok(c) => {
                            below = Some((lo, lo_total));
                            (lo, lo_total, best) = (mid + 1, c.plan.total_bytes, c);
                        }
                        Err(c) => {
                            hi = Some((mid + 1, probes.last().and_then(|p| p.total_bytes)));
                            over = c;
                        }
                    }
                }
            }
            Err(c) => {
                hi = Some((mid, probes.last().and_then(|p| p.total_bytes)));
                over = c;
            }
        }
        let new_width = hi.map_or(0, |(h, _)| h - lo);
        slow = if !halving && new_width > width / 2 { slow + 1 } else { 0 };
        let over_again = hi.is_some_and(|(h, _)| h == last);
        halving = (slow >= 2 && over_again) || slow >= 4;
        if halving {
            slow = 0;
        }
    }
    let open = hi.is_some_and(|(h, _)| h - lo > 1) || (hi.is_none() && lo < max);
    Ok(Fit {
        value: lo,
        capped: hi.is_none() && lo >= max,
        exhausted: open,
        compiled: best,
        probes,
        compiles,
        over,
        without: None,
    })
}

/// The search's first probes: `start` (when above 1), then 1 when `start` did not fit.
struct Opening {
    probes: Vec<Probe>,
    /// The plan at the lowest value that fits (1 must; its diagnosis otherwise).
    one: Compiled,
    /// The first value over (`start`), its total and its plan, if it did not fit.
    hi: Option<(usize, Option<u64>)>,
    over: Option<Compiled>,
}

fn opening<F>(compile_at: &mut F, start: usize, max: usize) -> Result<Opening, Error>
where
    F: FnMut(usize) -> Result<Compiled, Error>,
{
    let mut probes = Vec::new();
    // The start, when above 1: the plan that fits there, or the first value over.
    let mut started = None;
    let mut hi: Option<(usize, Option<u64>)> = None;
    let mut over: Option<Compiled> = None;
    if start > 1 && start <= max {
        let c = compile_at(start);
        let total_bytes = c.as_ref().ok().map(|c| c.plan.total_bytes);
        probes.push(Probe {
            value: start,
            total_bytes,
            fits: c.as_ref().is_ok_and(|c| c.plan.fits()),
            error: c.as_ref().err().map(|e| e.to_string()),
        });
        match c {
            Ok(c) if c.plan.fits() => started = Some(c),
            c => {
                hi = Some((start, total_bytes));
                over = c.ok();
            }
        }
    }
    let one = match started {
        Some(c) => c,
        None => {
            // Value 1 must fit; report its plan otherwise.
            let one = compile_at(1)?;
            probes.push(Probe {
                value: 1,
                total_bytes: Some(one.plan.total_bytes),
                fits: one.plan.fits(),
                error: None,
            });
            if let Some(diagnosis) = graphc_compiler::plan::diagnose(&one.program, &one.plan, &crate::Rerun::default())
            {
                return Err(Error::DoesNotFit {
                    value: 1,
                    plan: Box::new(one.plan),
                    diagnosis: Box::new(diagnosis),
                });
            }
            one
        }
    };
    Ok(Opening { probes, one, hi, over })
}

/// A probe's outcome: `Ok(plan that fits)`, `Err(plan over, if it could be planned)`.
type Probed = Result<Compiled, Option<Compiled>>;

/// Records the probe at `value` in `probes`; a compile that failed above 1 counts as
/// over (its reason kept), at 1 it is the search's error.
fn record(value: usize, compiled: Result<Compiled, Error>, probes: &mut Vec<Probe>) -> Result<Probed, Error> {
    match compiled {
        Ok(c) => {
            let fits = c.plan.fits();
            probes.push(Probe {
                value,
                total_bytes: Some(c.plan.total_bytes),
                fits,
                error: None,
            });
            Ok(if fits { Ok(c) } else { Err(Some(c)) })
        }
        Err(e) if value > 1 => {
            probes.push(Probe {
                value,
                total_bytes: None,
                fits: false,
                error: Some(e.to_string()),
            });
            Ok(Err(None))
        }
        Err(e) => Err(e),
    }
}

/// The next value to try above `lo` (which fit, with `lo_total` bytes): where the line
/// through the last two totals meets the budget (`2 * lo` without a line); but `lo + 1`
/// when that line puts the boundary at `lo` itself (a probe at the line's prediction
/// that fit: one more settles it). Never past `max`; saturates instead of overflowing.
fn grow(lo: usize, lo_total: u64, prev: Option<(usize, u64)>, budget: u64, max: usize) -> usize {
    let double = lo.saturating_mul(2);
    let line = prev.and_then(|(v, t)| {
        let (dv, dt) = (u128::try_from(lo - v).ok()?, u128::from(lo_total.checked_sub(t)?));
        if dt == 0 {
            return None;
        }
        let room = u128::from(budget.saturating_sub(lo_total));
        let ahead = room.saturating_mul(dv) / dt;
        usize::try_from(ahead).ok().map(|a| lo.saturating_add(a))
    });
    match line {
        Some(l) if l == lo => lo.saturating_add(1).min(max),
        Some(l) => l.min(max),
        None => double.min(max),
    }
}

/// The value strictly between `lo` and `hi` where the line through their totals meets
/// the budget (`lo_total <= budget < hi_total`), rounded down.
fn interpolate((lo, lo_total): (usize, u64), (hi, hi_total): (usize, u64), budget: u64) -> usize {
    let (room, rise) = (
        budget.saturating_sub(lo_total),
        hi_total.saturating_sub(lo_total).max(1),
    );
    let step = u128::from(room) * (hi - lo) as u128 / u128::from(rise);
    let at = lo.saturating_add(usize::try_from(step).unwrap_or(usize::MAX));
    at.clamp(lo + 1, hi - 1)
}

/// [`fit`] for a model file: the symbolic dimension `dim` of an ONNX model, the other
/// symbolic dims fixed by `fixed`.
pub fn fit_model(
    path: &std::path::Path,
    fixed: &[(String, usize)],
    dim: &str,
    opts: &CompileOptions,
    max: usize,
) -> Result<Fit, Error> {
    fit_model_with(path, fixed, dim, opts, max, &mut |_| {})
}

/// [`fit_model`], calling `on_probe(value)` as each probe starts (for progress).
pub fn fit_model_with(
    path: &std::path::Path,
    fixed: &[(String, usize)],
    dim: &str,
    opts: &CompileOptions,
    max: usize,
    on_probe: &mut dyn FnMut(usize),
) -> Result<Fit, Error> {
    if fixed.iter().any(|(n, _)| n == dim) {
        return Err(Error::Model {
            path: path.display().to_string(),
            message: format!("--dim {dim} is both searched and fixed"),
        });
    }
    if let Some(train) = &opts.train {
        return step::fit_step(path, fixed, dim, opts, train, max, on_probe);
    }
    let compile = |value: usize| -> Result<Compiled, Error> {
        let mut dims = fixed.to_vec();
        dims.push((dim.to_string(), value));
        let graph = crate::load_model(path, &dims)?;
        Ok(graphc_compiler::compile(&graph, opts)?)
    };
    // The marker on one core; the first two probes (1, then LOW) on the other. Folds of
    // mapped weights (casts, quantizations) made by the first compile to reach them
    // are remembered while they live (and stored in the fold cache), so the others
    // map them.
    let (one, low, high) = std::thread::scope(|s| {
        let high = (max >= family::LOW).then(|| s.spawn(|| compile(family::MARKER)));
        on_probe(1);
        let one = compile(1);
        let low = (one.is_ok() && max >= family::LOW).then(|| {
            on_probe(family::LOW);
            compile(family::LOW)
        });
        let high = high.map(|h| h.join().unwrap_or_else(|panic| std::panic::resume_unwind(panic)));
        (one, low, high)
    });
    let (family, compiles) = match (&low, high) {
        (Some(Ok(low)), Some(Ok(high))) => match ShapeFamily::capture(dim, low.clone(), &high) {
            Ok(f) => {
                let integers = f.dependent();
                (Some(f), ProbeCompiles::Family { integers })
            }
            Err(e) => (None, ProbeCompiles::EachBecause(e.to_string())),
        },
        (_, Some(Err(e))) => (
            None,
            ProbeCompiles::EachBecause(format!("the compile at {dim}={} failed: {e}", family::MARKER)),
        ),
        _ => (None, ProbeCompiles::Each),
    };
    let mut ready = vec![(1, one)];
    ready.extend(low.map(|low| (family::LOW, low)));
    search(
        |value| {
            if let Some(i) = ready.iter().position(|(v, _)| *v == value) {
                return ready.swap_remove(i).1;
            }
            on_probe(value);
            match &family {
                Some(f) => Ok(f.compile_at(value, opts)?),
                None => compile(value),
            }
        },
        opts,
        max,
        compiles,
        1,
    )
}
