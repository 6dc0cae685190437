//! The stages after autodiff, run once per recomputation tried ([`Back`]), and
//! `--remat auto`'s search over the count of layers ([`auto_remat`]).

use graphc_ir::Graph;

use super::{
    account_precision, check, run_chunk, run_fuse, run_plan, run_quantize, CompileError, CompileOptions, Compiled,
    Pass, PassReport, Training,
};
use crate::optimize::OptimizeReport;
use crate::passes::precision::PrecisionReport;

/// `--remat auto`: the fewest layers made again (the first ones) for the step to fit
/// the budget. Without recomputation when that fits; else every layer's when even that
/// does not (that plan, with its diagnosis). Between, the bytes are close to a line in
/// the count (each layer's saved values are about the same), so the first guess is
/// where the line through none and all meets the budget, then the count moves by one
/// toward the answer: a few plans, each exact.
pub(super) fn auto_remat(
    back: Back,
    graph: &Graph,
    opts: &CompileOptions,
    off_bytes: Option<u64>,
) -> Result<Compiled, CompileError> {
    let off_bytes = match off_bytes {
        Some(b) => b,
        None => {
            let off = back.clone().with_layers(graph, 0, opts)?;
            if off.plan.fits() {
                return Ok(off);
            }
            off.plan.total_bytes
        }
    };
    let mut full = back.clone().with_layers(graph, usize::MAX, opts)?;
    set_bytes_off(&mut full, off_bytes);
    let layers = full
        .train
        .as_ref()
        .and_then(|t| t.report.recomputed_layers)
        .map_or(0, |r| r.layers);
    if !full.plan.fits() || layers <= 1 {
        return Ok(full);
    }
    // Counts `lo` (does not fit) and `hi` (fits), with their totals.
    let budget = opts.memory.budget_bytes;
    let (mut lo, mut lo_bytes) = (0usize, off_bytes);
    let (mut hi, mut hi_bytes) = (layers, full.plan.total_bytes);
    let mut best = full;
    let mut tries = 0;
    while hi - lo > 1 {
        // Where the line through the two meets the budget (bisection after a few
        // tries, should the bytes not be close to a line).
        let k = if tries < 3 && lo_bytes > hi_bytes {
            let over = u128::from(lo_bytes.saturating_sub(budget)) * (hi - lo) as u128;
            lo + usize::try_from(over.div_ceil(u128::from(lo_bytes - hi_bytes))).unwrap_or(hi)
        } else {
            lo + (hi - lo) / 2
        }
        .clamp(lo + 1, hi - 1);
        tries += 1;
        let mut c = back.clone().with_layers(graph, k, opts)?;
        set_bytes_off(&mut c, off_bytes);
        if c.plan.fits() {
            (hi, hi_bytes) = (k, c.plan.total_bytes);
            best = c;
        } else {
            (lo, lo_bytes) = (k, c.plan.total_bytes);
        }
    }
    Ok(best)
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
    pub(super) fn with_layers(
        mut self,
        graph: &Graph,
        layers: usize,
        opts: &CompileOptions,
    ) -> Result<Compiled, CompileError> {
        let pass_error = |error| CompileError::Pass {
            pass: "autodiff",
            error,
        };
        let mut graph = std::borrow::Cow::Borrowed(graph);
        if let Some(training) = self.training.as_mut() {
            if layers > 0 {
                let (g, r) = crate::train::remat::recompute_layers(&graph, layers).map_err(pass_error)?;
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
