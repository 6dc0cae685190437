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
    // Ok(Ok(plan that fits)), Ok(Err(plan over, if it could be planned)).
    type Probed = Result<Compiled, Option<Compiled>>;
    let record = |value: usize, compiled: Result<Compiled, Error>, probes: &mut Vec<Probe>| -> Result<Probed, Error> {
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
    };
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
        return fit_step(path, fixed, dim, opts, train, max, on_probe);
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

/// A training step's model at one value: the graph, and its training target's type
/// there (the labels take their shape from the model's output).
fn step_model(
    path: &std::path::Path,
    fixed: &[(String, usize)],
    dim: &str,
    train: &TrainOptions,
    value: usize,
) -> Result<(Graph, TensorType), Error> {
    let mut dims = fixed.to_vec();
    dims.push((dim.to_string(), value));
    let graph = crate::load_model(path, &dims)?;
    let target = crate::train::expected_target(&graph, train)?;
    Ok((graph, target))
}

/// Compiles a training step at each value a search asks for: at 1 from the model
/// imported there, past it from a [`StepFamily`] (the step imported, differentiated
/// and optimized at [`family::LOW`] and [`family::MARKER`] only), or from the model
/// imported at the value when the family cannot give it (and then says why).
struct StepProbes<'a> {
    path: &'a std::path::Path,
    fixed: &'a [(String, usize)],
    dim: &'a str,
    train: &'a TrainOptions,
    family: Option<StepFamily>,
    /// Why some probe compiled whole, if one did.
    whole: Option<String>,
}

impl<'a> StepProbes<'a> {
    fn new(
        path: &'a std::path::Path,
        fixed: &'a [(String, usize)],
        dim: &'a str,
        train: &'a TrainOptions,
        samples: Option<((Graph, TensorType), (Graph, TensorType))>,
    ) -> StepProbes<'a> {
        StepProbes {
            path,
            fixed,
            dim,
            train,
            family: samples.map(|(low, high)| StepFamily::new(dim, low, high)),
            whole: None,
        }
    }

    /// The step compiled at `value` with `opts` (`opts.train`'s target is set here).
    fn compile(&mut self, value: usize, opts: &CompileOptions) -> Result<Compiled, Error> {
        let (compiled, why) = self.compile_shared(value, opts);
        if let Some(why) = why {
            self.whole.get_or_insert(why);
        }
        compiled
    }

    /// [`Self::compile`] from a shared `self` (the family captures a step when first
    /// asked, on whichever thread), and why the family could not give it, if it could
    /// not.
    fn compile_shared(&self, value: usize, opts: &CompileOptions) -> (Result<Compiled, Error>, Option<String>) {
        let mut why = None;
        if value >= family::LOW {
            match self.family.as_ref().map(|f| f.compile_at(value, opts)) {
                Some(Ok(c)) => return (Ok(c), None),
                // The compile itself failed at this value: a direct compile would too.
                Some(Err(FamilyError::Compile(e))) => return (Err(e.into()), None),
                Some(Err(e)) => why = Some(e.to_string()),
                None => {}
            }
        }
        let direct = || -> Result<Compiled, Error> {
            let (graph, target) = step_model(self.path, self.fixed, self.dim, self.train, value)?;
            let mut opts = opts.clone();
            if let Some(t) = opts.train.as_mut() {
                t.target = target;
            }
            Ok(graphc_compiler::compile(&graph, &opts)?)
        };
        (direct(), why)
    }

    /// The step at `value` with `--remat auto` in parts (`opts`), given the plan there
    /// with every layer made again (`full`, a probe's), which auto plans first.
    fn auto(&mut self, value: usize, opts: &CompileOptions, full: Compiled) -> Result<Compiled, Error> {
        let every_layer = full
            .train
            .as_ref()
            .is_some_and(|t| t.report.recomputed_layers.is_some());
        if value >= family::LOW && every_layer && opts.token_chunks != 0 {
            match self.family.as_ref().map(|f| f.auto_at(value, opts, full)) {
                Some(Ok(c)) => return Ok(c),
                Some(Err(FamilyError::Compile(e))) => return Err(e.into()),
                Some(Err(e)) => {
                    self.whole.get_or_insert_with(|| e.to_string());
                }
                None => {}
            }
        }
        self.compile(value, opts)
    }

    /// Keeps why a probe compiled whole (the first reason).
    fn note(&mut self, why: Option<String>) {
        if let Some(why) = why {
            self.whole.get_or_insert(why);
        }
    }

    /// The search's first value: [`family::LOW`] from the family (1 fits when it does).
    fn start(&self) -> usize {
        if self.family.is_some() {
            family::LOW
        } else {
            1
        }
    }

    /// How the probes compiled.
    fn compiles(&self) -> ProbeCompiles {
        match (&self.whole, &self.family) {
            (Some(why), _) => ProbeCompiles::EachBecause(why.clone()),
            (None, Some(f)) => ProbeCompiles::Family {
                integers: f.dependent(),
            },
            (None, None) => ProbeCompiles::EachBecause(format!(
                "the model could not be imported at {}={}",
                self.dim,
                family::MARKER
            )),
        }
    }
}

/// [`fit_model_with`] for a training step: every probe from a shape family of the
/// step ([`StepProbes`]). With `--remat auto`, a value fits when the step fits as it
/// is, or with every layer made again (its loss in parts where it reads an LM head),
/// or with its loss in parts alone (a model whose recomputation costs more than it
/// saves): each of these grows with the value, so the largest value is the larger of
/// two searches, one core each: the step as it is (also [`Fit::without`]), and the
/// others (a kind that did not fit at a value is not tried above it). The answer is
/// then planned with auto (the fewest extra FLOPs that fit).
fn fit_step(
    path: &std::path::Path,
    fixed: &[(String, usize)],
    dim: &str,
    opts: &CompileOptions,
    train: &TrainOptions,
    max: usize,
    on_probe: &mut dyn FnMut(usize),
) -> Result<Fit, Error> {
    let samples = |train: &TrainOptions| -> Option<((Graph, TensorType), (Graph, TensorType))> {
        if max < family::LOW {
            return None;
        }
        let low = step_model(path, fixed, dim, train, family::LOW).ok()?;
        let high = step_model(path, fixed, dim, train, family::MARKER).ok()?;
        Some((low, high))
    };
    let with_remat = |remat: Remat, token_chunks: usize| CompileOptions {
        train: Some(TrainOptions { remat, ..train.clone() }),
        token_chunks,
        ..opts.clone()
    };
    if train.remat != Remat::Auto {
        let mut probes = StepProbes::new(path, fixed, dim, train, samples(train));
        let start = probes.start();
        let mut fit = search(
            |value| {
                on_probe(value);
                probes.compile(value, opts)
            },
            opts,
            max,
            ProbeCompiles::Each,
            start,
        )?;
        fit.compiles = probes.compiles();
        return Ok(fit);
    }
    let off = with_remat(Remat::Off, opts.token_chunks);
    // The loss in parts: the count asked for, else auto's.
    let parts = match opts.token_chunks {
        0 => graphc_compiler::train::loss::AUTO_PARTS,
        n => n,
    };
    let (full, parts_off) = (with_remat(Remat::FullProbe, parts), with_remat(Remat::Off, parts));
    let (without, fit, mut probes) = std::thread::scope(|s| {
        let without = s.spawn(|| {
            let mut probes = StepProbes::new(path, fixed, dim, train, samples(train));
            let start = probes.start();
            let fit = search(
                |value| probes.compile(value, &off),
                &off,
                max,
                ProbeCompiles::Each,
                start,
            );
            fit.map(|mut f| {
                f.compiles = probes.compiles();
                f
            })
        });
        let mut probes = StepProbes::new(path, fixed, dim, train, samples(train));
        let start = probes.start();
        // The first value each kind did not fit at, and whether the loss has parts.
        let kinds = std::cell::Cell::new(Kinds {
            full_over: usize::MAX,
            parts_over: usize::MAX,
            parted: true,
        });
        let probes_cell = std::cell::RefCell::new(&mut probes);
        let one = |value: usize| -> Result<Compiled, Error> {
            let mut probes = probes_cell.borrow_mut();
            let (c, k, why) = kinds.get().probe(&probes, value, &full, &parts_off);
            kinds.set(k);
            probes.note(why);
            c
        };
        let on_probe = std::cell::RefCell::new(on_probe);
        let mut two = |value: usize| -> [Result<Compiled, Error>; 2] {
            (on_probe.borrow_mut())(value);
            (on_probe.borrow_mut())(value + 1);
            let mut probes = probes_cell.borrow_mut();
            let k = kinds.get();
            let shared: &StepProbes = &probes;
            let ((a, ka, wa), (b, kb, wb)) = std::thread::scope(|s| {
                let above = s.spawn(|| k.probe(shared, value + 1, &full, &parts_off));
                let at = k.probe(shared, value, &full, &parts_off);
                (
                    at,
                    above.join().unwrap_or_else(|panic| std::panic::resume_unwind(panic)),
                )
            });
            kinds.set(ka.merge(kb));
            probes.note(wa);
            probes.note(wb);
            [a, b]
        };
        let fit = search_with(
            |value| {
                (on_probe.borrow_mut())(value);
                one(value)
            },
            Some(&mut two),
            opts,
            max,
            ProbeCompiles::Each,
            start,
        );
        let without = without.join().unwrap_or_else(|panic| std::panic::resume_unwind(panic));
        (without, fit, probes)
    });
    let without = without.map(|off| (off.value, off));
    let mut fit = match (fit, without) {
        // Nothing made again fits as much: auto plans the step as it is.
        (Ok(fit), Ok((value, mut off))) if value >= fit.value => {
            off.without = Some(Ok(value));
            return Ok(off);
        }
        (Err(_), Ok((value, mut off))) => {
            off.without = Some(Ok(value));
            return Ok(off);
        }
        (Ok(mut fit), without) => {
            fit.compiles = probes.compiles();
            fit.without = Some(without.map(|(v, _)| v).map_err(Box::new));
            fit
        }
        (Err(e), Err(_)) => return Err(e),
    };
    fit.over = fit.over.filter(|c| has_parts(c) == has_parts(&fit.compiled));
    // The answer planned with auto: the loss in parts (the step as it is does not fit
    // there), the fewest layers or tensors made again that fit.
    // (With the parts' count even where there are none: the same step, captured.)
    let auto = with_remat(Remat::Auto, parts);
    fit.compiled = probes.auto(fit.value, &auto, fit.compiled.clone())?;
    Ok(fit)
}

/// What the `--remat auto` search of [`fit_step`] has learned of its two kinds of
/// step (every layer made again; the loss in parts alone): the first value each did
/// not fit at (neither is tried above it), and whether the loss has parts at all.
#[derive(Clone, Copy)]
struct Kinds {
    full_over: usize,
    parts_over: usize,
    parted: bool,
}

impl Kinds {
    /// The step at `value`: every layer made again (`full`), else the loss in parts
    /// alone (`parts_off`), each unless it did not fit below; the plan that fits, or
    /// the first tried. With what it learned, and why the family could not give a
    /// compile, if it could not.
    fn probe(
        mut self,
        probes: &StepProbes<'_>,
        value: usize,
        full: &CompileOptions,
        parts_off: &CompileOptions,
    ) -> (Result<Compiled, Error>, Kinds, Option<String>) {
        let mut why = None;
        let c = {
            let mut compile = |opts: &CompileOptions| {
                let (c, w) = probes.compile_shared(value, opts);
                why = why.take().or(w);
                c
            };
            self.choose(&mut compile, value, full, parts_off)
        };
        (c, self, why)
    }

    /// [`Self::probe`]'s choice, each kind compiled by `compile`.
    fn choose(
        &mut self,
        compile: &mut dyn FnMut(&CompileOptions) -> Result<Compiled, Error>,
        value: usize,
        full: &CompileOptions,
        parts_off: &CompileOptions,
    ) -> Result<Compiled, Error> {
        let mut tried = None;
        if value < self.full_over || !self.parted {
            let c = compile(full)?;
            if c.plan.fits() {
                return Ok(c);
            }
            self.full_over = self.full_over.min(value);
            self.parted = has_parts(&c);
            tried = Some(c);
        }
        if self.parted && value < self.parts_over {
            let c = compile(parts_off)?;
            if c.plan.fits() {
                return Ok(c);
            }
            self.parts_over = self.parts_over.min(value);
            tried.get_or_insert(c);
        }
        match tried {
            Some(c) => Ok(c),
            None => compile(full),
        }
    }

    /// What two probes learned together.
    fn merge(self, other: Kinds) -> Kinds {
        Kinds {
            full_over: self.full_over.min(other.full_over),
            parts_over: self.parts_over.min(other.parts_over),
            parted: self.parted && other.parted,
        }
    }
}

/// Whether a compiled step computes its loss in parts.
fn has_parts(c: &Compiled) -> bool {
    c.train.as_ref().is_some_and(|t| t.report.loss_parts > 1)
}
