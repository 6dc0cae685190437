//! The stages after autodiff, run once per recomputation tried ([`Back`]), and
//! `--remat auto`'s searches, by layers and per tensor ([`auto_remat`]).

use graphc_ir::Graph;

use super::{
    account_precision, check, run_chunk, run_fuse, run_plan, run_quantize, CompileError, CompileOptions, Compiled,
    Pass, PassReport, Training,
};
use crate::optimize::OptimizeReport;
use crate::passes::precision::PrecisionReport;
use crate::train::remat::TensorPick;

/// The most plans the exact per-tensor search makes.
const EXACT_PLANS: usize = 32;

/// What the stages after autodiff recompute.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Selection {
    /// The first `k` layers whole (0: none; `usize::MAX`: all, `--remat full`).
    Layers(usize),
    /// Per tensor: every layer's GEMM-free values and the GEMM and attention outputs
    /// picked (`train::remat::recompute_tensors`).
    Tensors(TensorPick),
}

/// What a plan's layer or per-tensor recomputation did, if any.
fn remat_of(c: &Compiled) -> Option<crate::train::remat::LayerRemat> {
    c.train.as_ref().and_then(|t| t.report.recomputed_layers)
}

/// The extra GEMM and attention FLOPs of a plan's recomputation.
fn extra_flops(c: &Compiled) -> u64 {
    remat_of(c).map_or(0, |r| r.extra_flops)
}

/// The smallest count `k` in `lo+1 ..= hi` for which `plan(k)` fits, given `lo` does
/// not (its total `lo_bytes`) and `hi` does (`hi_bytes`, its plan `best`): where the
/// line through the two totals meets the budget first, then bisection.
fn smallest_fitting(
    (mut lo, mut lo_bytes): (usize, u64),
    (mut hi, mut hi_bytes, mut best): (usize, u64, Compiled),
    budget: u64,
    mut plan: impl FnMut(usize) -> Result<Compiled, CompileError>,
) -> Result<Compiled, CompileError> {
    let mut tries = 0;
    while hi - lo > 1 {
        let k = if tries < 3 && lo_bytes > hi_bytes {
            let over = u128::from(lo_bytes.saturating_sub(budget)) * (hi - lo) as u128;
            lo + usize::try_from(over.div_ceil(u128::from(lo_bytes - hi_bytes))).unwrap_or(hi)
        } else {
            lo + (hi - lo) / 2
        }
        .clamp(lo + 1, hi - 1);
        tries += 1;
        let c = plan(k)?;
        if c.plan.fits() {
            (hi, hi_bytes) = (k, c.plan.total_bytes);
            best = c;
        } else {
            (lo, lo_bytes) = (k, c.plan.total_bytes);
        }
    }
    Ok(best)
}

/// `--remat auto`: the recomputation that fits the budget for the fewest extra FLOPs.
/// Without recomputation when that fits; else every layer's when even that does not
/// (that plan, with its diagnosis). Between, two searches ([`smallest_fitting`], each
/// count planned exactly): the fewest first layers, and per tensor the shortest
/// greedy prefix, then on small graphs the exact search; the fewer FLOPs wins.
///
/// `full`: the plan with every layer made again, when the caller has it (a fit's
/// probe at this value: `Remat::FullProbe`, the same plan).
pub(super) fn auto_remat(
    back: Back,
    graph: &Graph,
    opts: &CompileOptions,
    off_bytes: Option<u64>,
    full: Option<Compiled>,
) -> Result<Compiled, CompileError> {
    // Given every layer's plan (that fits), the step as it is planned on one core and
    // all layers but the last made again on the other: where `off` is far over the
    // budget, the count the layer search tries first.
    let every_but_one = full
        .as_ref()
        .filter(|f| off_bytes.is_none() && f.plan.fits())
        .and_then(remat_of)
        .map(|r| r.layers)
        .filter(|&layers| layers > 1)
        .map(|layers| layers - 1);
    let (off, mut guess) = match (off_bytes, every_but_one) {
        (Some(b), _) => (Ok(Ok(b)), None),
        (None, k) => {
            let plan_off = || -> Result<Result<u64, Compiled>, CompileError> {
                let off = back.clone().with_remat(graph, Selection::Layers(0), opts)?;
                Ok(if off.plan.fits() {
                    Err(off)
                } else {
                    Ok(off.plan.total_bytes)
                })
            };
            match k {
                Some(k) => std::thread::scope(|s| {
                    let guess = s.spawn(|| back.clone().with_remat(graph, Selection::Layers(k), opts));
                    let off = plan_off();
                    let guess = guess.join().unwrap_or_else(|panic| std::panic::resume_unwind(panic));
                    (off, Some((k, guess)))
                }),
                None => (plan_off(), None),
            }
        }
    };
    let off_bytes = match off? {
        Ok(b) => b,
        Err(off) => return Ok(off),
    };
    let mut full = match full {
        Some(full) => full,
        None => back.clone().with_remat(graph, Selection::Layers(usize::MAX), opts)?,
    };
    set_bytes_off(&mut full, off_bytes);
    let layers = remat_of(&full).map_or(0, |r| r.layers);
    if !full.plan.fits() || layers <= 1 {
        return Ok(full);
    }
    // Counts `lo` (does not fit) and `hi` (fits), with their totals.
    let budget = opts.memory.budget_bytes;
    let full_bytes = full.plan.total_bytes;
    let every_layer = full.clone();
    let by_layers = smallest_fitting((0, off_bytes), (layers, full_bytes, full), budget, |k| {
        let planned = match guess.take() {
            Some((g, c)) if g == k => Some(c?),
            _ => None,
        };
        let mut c = match planned {
            Some(c) => c,
            None => back.clone().with_remat(graph, Selection::Layers(k), opts)?,
        };
        set_bytes_off(&mut c, off_bytes);
        Ok(c)
    })?;
    // Per tensor: the GEMM-free values of every layer, then the fewest GEMM and
    // attention outputs; the plan with fewer extra FLOPs wins (the layers' on a tie).
    // Every output made again is every layer made again: nothing to choose then.
    if remat_of(&by_layers).is_some_and(|r| r.chosen == r.layers) {
        return Ok(by_layers);
    }
    let pass_error = |error| CompileError::Pass {
        pass: "autodiff",
        error,
    };
    let candidates = crate::train::remat::tensor_candidates(graph).map_err(pass_error)?;
    let tensors = |pick: TensorPick| -> Result<Compiled, CompileError> {
        let mut c = back.clone().with_remat(graph, Selection::Tensors(pick), opts)?;
        set_bytes_off(&mut c, off_bytes);
        Ok(c)
    };
    let none = tensors(TensorPick::First(0))?;
    if none.plan.fits() {
        return Ok(none);
    }
    // The greedy knapsack: the shortest prefix by FLOPs per byte that fits (all of
    // them is every layer made again, the same values: that plan).
    let none_bytes = none.plan.total_bytes;
    let mut by_tensors = smallest_fitting(
        (0, none_bytes),
        (candidates.len(), full_bytes, every_layer),
        budget,
        |k| tensors(TensorPick::First(k)),
    )?;
    // Exact on small graphs: every subset that costs fewer FLOPs than the greedy's
    // answer, fewest FLOPs first, planned until one fits (the first that does is the
    // fewest FLOPs that fit); a subset of one that did not fit is taken not to, and at
    // most `EXACT_PLANS` are planned.
    let greedy_flops = extra_flops(&by_tensors);
    if let Some(order) = crate::train::remat::subsets_by_flops(&candidates, greedy_flops) {
        let mut over: Vec<u32> = Vec::new();
        let mut planned = 0;
        for mask in order {
            if mask == 0 || over.iter().any(|&o| mask & !o == 0) {
                continue;
            }
            if planned == EXACT_PLANS {
                break;
            }
            planned += 1;
            let subset = (0..candidates.len()).map(|i| mask & (1 << i) != 0).collect();
            let c = tensors(TensorPick::Subset(subset))?;
            if c.plan.fits() {
                by_tensors = c;
                break;
            }
            over.push(mask);
        }
    }
    Ok(if extra_flops(&by_tensors) < extra_flops(&by_layers) {
        by_tensors
    } else {
        by_layers
    })
}

pub(super) fn set_bytes_off(c: &mut Compiled, off: u64) {
    let total = c.plan.total_bytes;
    if let Some(r) = c.train.as_mut().and_then(|t| t.report.recomputed_layers.as_mut()) {
        r.bytes_off = Some(off);
        r.bytes = Some(total);
    }
}

/// What the stages before recomputation made, for the stages after it (quantization,
/// chunking, fusion, scheduling, the memory plan), which `--remat auto` runs once per
/// count of layers it tries.
#[derive(Clone)]
pub(super) struct Back {
    pub(super) passes: Vec<PassReport>,
    pub(super) optimize: OptimizeReport,
    pub(super) precision: PrecisionReport,
    pub(super) training: Option<Training>,
}

impl Back {
    /// A training step with the first `layers` layers made again in their backward
    /// (`recompute_layers`; none: 0), then the cheap saved values.
    pub(super) fn with_remat(
        mut self,
        graph: &Graph,
        selection: Selection,
        opts: &CompileOptions,
    ) -> Result<Compiled, CompileError> {
        let pass_error = |error| CompileError::Pass {
            pass: "autodiff",
            error,
        };
        let mut graph = std::borrow::Cow::Borrowed(graph);
        if let Some(training) = self.training.as_mut() {
            let made = match selection {
                Selection::Layers(0) => None,
                Selection::Layers(k) => Some(crate::train::remat::recompute_layers(&graph, k)),
                Selection::Tensors(k) => Some(crate::train::remat::recompute_tensors(&graph, &k)),
            };
            if let Some(made) = made {
                let (g, r) = made.map_err(pass_error)?;
                training.report.recomputed_layers = Some(r);
                graph = std::borrow::Cow::Owned(g);
            }
            // A loss computed in parts: each part's logits made again in its backward.
            if let (true, Some(classes)) = (opts.token_chunks > 1, training.report.classes) {
                let (g, logits) = crate::train::remat::recompute_loss_chunks(&graph, classes).map_err(pass_error)?;
                training.report.recomputed_logits = (logits.parts > 0).then_some(logits);
                graph = std::borrow::Cow::Owned(g);
            }
            // Cheap saved activations computed again in the backward.
            let (g, again) = crate::train::remat::recompute_saved_elementwise(&graph).map_err(pass_error)?;
            training.report.recomputed_elementwise = again;
            check(&g, Pass::Autodiff, opts)?;
            graph = std::borrow::Cow::Owned(g);
        }
        self.finish(graph.into_owned(), opts)
    }

    /// Quantization, chunking, fusion, the schedule and the memory plan.
    pub(super) fn finish(self, graph: Graph, opts: &CompileOptions) -> Result<Compiled, CompileError> {
        let Back {
            mut passes,
            optimize,
            precision,
            training,
        } = self;
        let (graph, quantize, report) = run_quantize(&graph, opts)?;
        passes.extend(report);
        let in_place: Vec<String> = training
            .as_ref()
            .map(|t| t.state.slots.iter().map(|s| s.name.clone()).collect())
            .unwrap_or_default();
        let unchunked = (opts.token_chunks > 1 && training.is_none()).then(|| graph.clone());
        let (graph, chunks) = run_chunk(graph, opts)?;
        let (mut program, fusion, report) = run_fuse(&graph, &in_place, opts)?;
        passes.push(report);
        // Training: each state output written over its input (in place), where it can be.
        if let Some(training) = &training {
            program.donated = crate::train::donate::donations(&program, &training.state);
        }
        let (program, schedule, plan, report) = run_plan(program, opts)?;
        passes.push(report);
        let precision = account_precision(precision, &program, &plan);
        Ok(Compiled {
            graph,
            program,
            passes,
            optimize,
            chunks,
            unchunked,
            fusion,
            schedule,
            plan,
            precision,
            quantize,
            train: training,
        })
    }
}
