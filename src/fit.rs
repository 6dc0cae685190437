//! Batch-size fitting: the largest value of one dimension whose memory plan fits the
//! budget, found by replanning.
//!
//! The search assumes that memory grows with the dimension (true of batch and sequence
//! dims): it probes 1, then doubles until a plan does not fit (or `max` is reached),
//! then bisects between the last value that fit and the first that did not. Every probe
//! builds the graph at that value and compiles it through the whole pipeline (schedule
//! and memory plan included), so the answer is exactly what `graphc plan` says at that
//! value. A probe whose graph cannot be built or compiled at a value larger than 1
//! (a shape too large to index, say) counts as not fitting, and its reason is kept.

use graphc_compiler::{CompileOptions, Compiled};
use graphc_ir::Graph;

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
    /// The model compiled at `value` (its `plan` is the plan that fits).
    pub compiled: Compiled,
    /// Every value tried, in the order tried.
    pub probes: Vec<Probe>,
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

/// The largest `value` in `1..=max` for which `build(value)`, compiled with `opts`, has
/// a plan within `opts.memory.budget_bytes`. Errors when even `value = 1` does not fit
/// ([`Error::DoesNotFit`], with the plan at 1) or cannot be built.
pub fn fit<F>(mut build: F, opts: &CompileOptions, max: usize) -> Result<Fit, Error>
where
    F: FnMut(usize) -> Result<Graph, Error>,
{
    let max = max.max(1);
    // Value 1 must fit; report its plan otherwise.
    let one = build(1).and_then(|g| Ok(graphc_compiler::compile(&g, opts)?))?;
    let mut probes = vec![Probe {
        value: 1,
        total_bytes: Some(one.plan.total_bytes),
        fits: one.plan.fits(),
        error: None,
    }];
    if !one.plan.fits() {
        let diagnosis = graphc_compiler::plan::over_budget_diagnosis(&one.program, &one.plan, &[])
            .unwrap_or_default()
            .trim_end()
            .to_string();
        return Err(Error::DoesNotFit {
            value: 1,
            plan: Box::new(one.plan),
            diagnosis,
        });
    }
    let mut probe = |value: usize, probes: &mut Vec<Probe>| -> Result<Option<Compiled>, Error> {
        let compiled = build(value).and_then(|g| Ok(graphc_compiler::compile(&g, opts)?));
        match compiled {
            Ok(c) => {
                let fits = c.plan.fits();
                probes.push(Probe {
                    value,
                    total_bytes: Some(c.plan.total_bytes),
                    fits,
                    error: None,
                });
                Ok(fits.then_some(c))
            }
            Err(e) if value > 1 => {
                probes.push(Probe {
                    value,
                    total_bytes: None,
                    fits: false,
                    error: Some(e.to_string()),
                });
                Ok(None)
            }
            Err(e) => Err(e),
        }
    };
    let (mut lo, mut best) = (1usize, one);
    let mut hi: Option<usize> = None;
    while lo < max {
        let next = lo.saturating_mul(2).min(max);
        match probe(next, &mut probes)? {
            Some(c) => (lo, best) = (next, c),
            None => {
                hi = Some(next);
                break;
            }
        }
    }
    if let Some(mut hi) = hi {
        while hi - lo > 1 {
            let mid = lo + (hi - lo) / 2;
            match probe(mid, &mut probes)? {
                Some(c) => (lo, best) = (mid, c),
                None => hi = mid,
            }
        }
    }
    Ok(Fit {
        value: lo,
        capped: hi.is_none(),
        compiled: best,
        probes,
    })
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
    if fixed.iter().any(|(n, _)| n == dim) {
        return Err(Error::Model {
            path: path.display().to_string(),
            message: format!("--dim {dim} is both searched and fixed"),
        });
    }
    fit(
        |value| {
            let mut dims = fixed.to_vec();
            dims.push((dim.to_string(), value));
            crate::load_model(path, &dims)
        },
        opts,
        max,
    )
}
