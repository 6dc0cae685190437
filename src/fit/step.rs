//! `fit --train`: the probes of a training step from a shape family of the step
//! ([`StepProbes`]), and with `--remat auto` the two searches, one core each
//! ([`fit_step`]).

use super::*;

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
pub(super) fn fit_step(
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
