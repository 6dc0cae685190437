//! Shape families: one front-half compile for every value of a symbolic dimension.
//!
//! `graphc fit` asks the same question of many values of one dimension (a batch, a
//! sequence). Importing and optimizing the model again at every value costs a whole
//! compile per probe, and the optimizer is most of a compile. A [`ShapeFamily`] is the
//! optimized graph (the input of fusion) with every integer written as a polynomial in
//! the dimension, so that a value costs only what comes after the optimizer: write the
//! integers out, verify, fuse and plan.
//!
//! It is captured from two compiles of the same model with the same options: at a small
//! value ([`LOW`]) and at a large prime marker ([`MARKER`]). The two optimized graphs
//! must agree in everything but integers: the same nodes in the same order, ops,
//! operands, names, floats, constants' data, and the same weights (by their mapped
//! range or their data). An integer that is the same in both is a constant. One that
//! differs (a dim of a type, a reshape's or broadcast's target, a slice bound, an iota's
//! extent) is read as a polynomial in the dimension: its value at the marker written in
//! balanced base [`MARKER`] gives the coefficients (`b`, `1024 b` for a flattened
//! `[b, 1024]`, `s² ` for an `[s, s]` extent, `s - 1` for a bound), which holds whenever
//! they are below half the marker in magnitude; and the polynomial must give the small
//! compile's integer at [`LOW`] exactly. Anything else is a [`FamilyError`] naming the
//! place: a structure that changes with the value (a mask folded to a constant at small
//! sizes only, a fold that is bounded by size), an integer that is no polynomial (a
//! reshape by `s / 2`, a clamp `min(s, 1024)`: the two samples disagree), a weight or
//! constant whose data depends on the dimension. The caller then compiles each value.
//!
//! At a value `v`, [`ShapeFamily::compile_at`] writes every polynomial's value into the
//! graph and verifies it — every node's type must be the one its op infers from its
//! operands, so a misread integer does not get through — then fuses and plans it. The
//! two samples bracket the values a fit probes: a decision of the compiler that
//! changes somewhere between them (a size threshold) shows up as a difference between
//! them, so within the family the graph is the one a compile at `v` optimizes to
//! (`tests/fit.rs` compares the two at many values: same program, same plan).

use std::collections::BTreeMap;
use std::fmt;
use std::time::Instant;

use graphc_ir::{Graph, GraphError, Tensor};
use serde_json::{Number, Value};

mod fill;

use super::remat::Back;
use super::{
    account_precision, compile_from, front, run_chunk, run_fuse, run_plan, CompileError, CompileOptions, Compiled,
    Pass, PassDetail, PassReport,
};

/// The small sample: the smallest value whose shapes are generic (at 1, a dimension
/// of extent 1 lets the optimizer drop broadcasts and reshapes that other values need).
pub const LOW: usize = 2;

/// The large sample: a prime just above 2^20. Polynomials decode from it whenever
/// their coefficients are below 2^19 in magnitude, and its square (an `[s, s]`
/// extent) stays far below the IR's element limit.
pub const MARKER: usize = 1_048_583;

/// Polynomials of higher degree are not read (no model's shapes need them, and
/// `MARKER^4` is past `i128`'s reach for products of them).
const MAX_DEGREE: usize = 3;

/// An integer of the graph as a polynomial in the family's dimension.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DimPoly {
    /// Coefficients, the constant term first; the last is not zero.
    coefficients: Vec<i128>,
}

impl DimPoly {
    /// `n` written in balanced base `base` (digits in `(-base/2, base/2]`), as a
    /// polynomial of degree at most [`MAX_DEGREE`].
    fn decode(n: i128, base: i128) -> Option<DimPoly> {
        let mut coefficients = Vec::new();
        let mut rest = n;
        while rest != 0 {
            let mut digit = rest.rem_euclid(base);
            if digit > base / 2 {
                digit -= base;
            }
            coefficients.push(digit);
            rest = (rest - digit) / base;
            if coefficients.len() > MAX_DEGREE + 1 {
                return None;
            }
        }
        Some(DimPoly { coefficients })
    }

    /// The value at `x`, or `None` past `i128`.
    pub fn eval(&self, x: i128) -> Option<i128> {
        self.coefficients
            .iter()
            .rev()
            .try_fold(0i128, |acc, &c| acc.checked_mul(x)?.checked_add(c))
    }

    /// `1024*batch - 1`, with `dim` for the variable.
    pub fn describe(&self, dim: &str) -> String {
        let mut terms = Vec::new();
        for (power, &c) in self.coefficients.iter().enumerate().rev() {
            if c == 0 {
                continue;
            }
            let var = match power {
                0 => String::new(),
                1 => dim.to_string(),
                p => format!("{dim}^{p}"),
            };
            let magnitude = c.unsigned_abs();
            let term = match (power, magnitude) {
                (0, m) => m.to_string(),
                (_, 1) => var,
                (_, m) => format!("{m}*{var}"),
            };
            let sign = if c < 0 { "-" } else { "+" };
            if terms.is_empty() {
                terms.push(if c < 0 { format!("-{term}") } else { term });
            } else {
                terms.push(format!("{sign} {term}"));
            }
        }
        if terms.is_empty() {
            "0".to_string()
        } else {
            terms.join(" ")
        }
    }
}

/// Why a shape family could not be captured, or not be written out at a value.
#[derive(Debug, thiserror::Error)]
pub enum FamilyError {
    /// The two samples' optimized graphs differ other than in integers that are
    /// polynomials of the dimension.
    #[error("the optimized graphs at {dim}={LOW} and {dim}={MARKER} differ at {place}: {low} vs {high}")]
    Differs {
        dim: String,
        place: String,
        low: String,
        high: String,
    },
    /// A weight of one sample is missing from the other or has other data.
    #[error("weight \"{name}\" differs between {dim}={LOW} and {dim}={MARKER}")]
    Weight { dim: String, name: String },
    /// An integer's polynomial has no value of its type at this value.
    #[error("at {dim}={value}, {place} = {poly} is out of range")]
    OutOfRange {
        dim: String,
        value: usize,
        place: String,
        poly: String,
    },
    /// The graph written out at a value does not verify (a value the model cannot take).
    #[error("at {dim}={value}: {error}")]
    Graph { dim: String, value: usize, error: String },
    #[error(transparent)]
    Compile(#[from] CompileError),
}

impl FamilyError {
    fn differs(dim: &str, low: &Graph, path: &[Seg], a: &Value, b: &Value) -> FamilyError {
        let both_lists = matches!((a, b), (Value::Array(_), Value::Array(_)));
        let show = |v: &Value| {
            // Lists of different lengths (the graphs' nodes): their lengths say it.
            if let (Value::Array(items), true) = (v, both_lists) {
                return format!("{} entries", items.len());
            }
            let s = v.to_string();
            if s.len() > 80 {
                format!("{}...", &s[..s.char_indices().nth(77).map_or(s.len(), |(i, _)| i)])
            } else {
                s
            }
        };
        FamilyError::Differs {
            dim: dim.to_string(),
            place: place(low, path),
            low: show(a),
            high: show(b),
        }
    }
}

/// A step into a JSON value: a field or an element.
#[derive(Clone, Debug)]
enum Seg {
    Key(String),
    Index(usize),
}

/// Where a path points, for people: `node 12 (reshape "name") ty.shape[0]`.
fn place(graph: &Graph, path: &[Seg]) -> String {
    let rest = |segs: &[Seg]| {
        let mut s = String::new();
        for seg in segs {
            match seg {
                Seg::Key(k) if s.is_empty() => s.push_str(k),
                Seg::Key(k) => {
                    s.push('.');
                    s.push_str(k);
                }
                Seg::Index(i) => s.push_str(&format!("[{i}]")),
            }
        }
        s
    };
    match path {
        [Seg::Key(k), Seg::Index(i), tail @ ..] if k == "nodes" => {
            let node = graph.nodes().get(*i);
            let op = node.map_or("?", |n| n.op.kind().name());
            let name = node
                .and_then(|n| n.name.as_deref())
                .map(|n| format!(" \"{n}\""))
                .unwrap_or_default();
            format!("node {i} ({op}{name}) {}", rest(tail))
        }
        _ => rest(path),
    }
}

fn integer(n: &Number) -> Option<i128> {
    n.as_i64().map(i128::from).or_else(|| n.as_u64().map(i128::from))
}

/// A graph with every integer a polynomial in one dimension: captured from the same
/// stage of two compiles (at [`LOW`] and [`MARKER`]), written out at any value.
pub struct GraphFamily {
    dim: String,
    /// The graph at the marker, without its weights, as JSON.
    template: Value,
    /// Every integer of the template, in the order [`Fill`] meets them: its polynomial,
    /// or `None` for a constant.
    integers: Vec<Option<DimPoly>>,
    weights: BTreeMap<String, Tensor>,
    /// The graph at [`LOW`], whose nodes name the places of errors.
    low: Graph,
}

impl fmt::Debug for GraphFamily {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GraphFamily")
            .field("dim", &self.dim)
            .field("integers", &self.integers.len())
            .field("dependent", &self.dependent())
            .finish()
    }
}

impl GraphFamily {
    /// The family of `dim` from the same stage's graph at [`LOW`] (`low`) and at
    /// [`MARKER`] (`high`), made with the same options.
    pub fn capture(dim: &str, low: &Graph, high: &Graph) -> Result<GraphFamily, FamilyError> {
        let (low_structure, low_weights) = low.split_weights();
        let (high_structure, high_weights) = high.split_weights();
        same_weights(dim, &low_weights, &high_weights)?;
        let (a, b) = (json(&low_structure)?, json(&high_structure)?);
        let mut zip = Zip {
            dim,
            graph: low,
            integers: Vec::new(),
            path: Vec::new(),
        };
        zip.walk(&a, &b)?;
        let integers = zip.integers;
        Ok(GraphFamily {
            dim: dim.to_string(),
            template: b,
            integers,
            weights: high_weights,
            low: low.clone(),
        })
    }

    /// The dimension the family is over.
    pub fn dim(&self) -> &str {
        &self.dim
    }

    /// How many integers of the graph depend on the dimension.
    pub fn dependent(&self) -> usize {
        self.integers.iter().filter(|p| p.is_some()).count()
    }

    /// The graph at `value`, verified.
    pub fn graph_at(&self, value: usize) -> Result<Graph, FamilyError> {
        if value == LOW {
            return Ok(self.low.clone());
        }
        let bad = |error: String| FamilyError::Graph {
            dim: self.dim.clone(),
            value,
            error,
        };
        // Straight from the template; should that not meet every integer once (or
        // one be out of range), the template copied and walked, which names the place.
        let filler = fill::Filler::new(&self.integers, value);
        let direct = <Graph as serde::Deserialize>::deserialize(filler.at(&self.template));
        let mut graph = match direct {
            Ok(graph) if filler.met() => graph,
            _ => self.graph_walked(value)?,
        };
        for (name, w) in &self.weights {
            graph.set_weight(name.clone(), w.clone());
        }
        graph.verify().map_err(|e: GraphError| bad(e.to_string()))?;
        Ok(graph)
    }

    /// The graph at `value` (without its weights) from a copy of the template with
    /// every integer written in.
    fn graph_walked(&self, value: usize) -> Result<Graph, FamilyError> {
        let mut json = self.template.clone();
        let mut fill = Fill {
            family: self,
            value,
            next: 0,
            path: Vec::new(),
        };
        fill.walk(&mut json)?;
        serde_json::from_value(json).map_err(|e| FamilyError::Graph {
            dim: self.dim.clone(),
            value,
            error: e.to_string(),
        })
    }
}

/// The optimized graph of a model (the input of fusion) with every integer a
/// polynomial in one dimension, and the compile at [`LOW`] it was captured with.
pub struct ShapeFamily {
    graph: GraphFamily,
    /// The compile at [`LOW`]: its reports stand for the family's front half.
    low: Compiled,
}

impl fmt::Debug for ShapeFamily {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ShapeFamily").field("graph", &self.graph).finish()
    }
}

impl ShapeFamily {
    /// The family of `dim` from its compiles at [`LOW`] (`low`) and at [`MARKER`]
    /// (`high`), made with the same options.
    pub fn capture(dim: &str, low: Compiled, high: &Compiled) -> Result<ShapeFamily, FamilyError> {
        // The input of fusion before token chunking: a value's graph is chunked anew.
        let graph = GraphFamily::capture(dim, low.fusion_input(), high.fusion_input())?;
        Ok(ShapeFamily { graph, low })
    }

    /// The dimension the family is over.
    pub fn dim(&self) -> &str {
        self.graph.dim()
    }

    /// How many integers of the graph depend on the dimension.
    pub fn dependent(&self) -> usize {
        self.graph.dependent()
    }

    /// The optimized graph at `value`, verified.
    pub fn graph_at(&self, value: usize) -> Result<Graph, FamilyError> {
        self.graph.graph_at(value)
    }

    /// The model compiled at `value`: the family's graph written out at it, then fused
    /// and planned with `opts` (the options the samples were compiled with). The
    /// front half's reports are those of the compile at [`LOW`].
    pub fn compile_at(&self, value: usize, opts: &CompileOptions) -> Result<Compiled, FamilyError> {
        if value == LOW {
            return Ok(self.low.clone());
        }
        let start = Instant::now();
        let graph = self.graph_at(value)?;
        let unchunked = (opts.token_chunks > 1).then(|| graph.clone());
        let specialize = specialized(self.dim(), value, self.dependent(), graph.len(), start);
        let (graph, chunks) = run_chunk(graph, opts)?;
        let (program, fusion, fused) = run_fuse(&graph, &[], opts)?;
        let (program, schedule, plan, planned) = run_plan(program, opts)?;
        let mut passes: Vec<PassReport> = self
            .low
            .passes
            .iter()
            .filter(|p| !matches!(p.pass, Pass::Fuse | Pass::Plan))
            .cloned()
            .collect();
        passes.extend([specialize, fused, planned]);
        let precision = account_precision(self.low.precision.clone(), &program, &plan);
        Ok(Compiled {
            graph,
            program,
            passes,
            optimize: self.low.optimize.clone(),
            chunks,
            unchunked,
            fusion,
            schedule,
            plan,
            precision,
            quantize: self.low.quantize.clone(),
            train: self.low.train.clone(),
        })
    }
}

/// A step graph's family and what made the step graph at [`LOW`].
type Step = (GraphFamily, Back);

/// The steps captured, by the key of their options, or why not.
type Steps = Vec<(String, std::sync::Arc<Result<Step, String>>)>;

/// A training step's shape family: the step graph before recomputation (the model
/// made trainable, its loss, gradients and update, optimized) with every integer a
/// polynomial in one dimension, captured from the model imported at [`LOW`] and at
/// [`MARKER`]. What comes after (the recomputation chosen, fusion, the plan) runs at
/// each value, as a compile does: [`StepFamily::compile_at`] is `compile` at that
/// value without importing, differentiating and optimizing again. A step is captured
/// once per set of options asked for (but the recomputation: `--remat auto` asks for
/// the step whole and its loss in parts, two steps), when first asked.
pub struct StepFamily {
    dim: String,
    /// The model at [`LOW`] and at [`MARKER`], and the training targets' types there.
    low: (Graph, graphc_ir::TensorType),
    high: (Graph, graphc_ir::TensorType),
    /// The steps captured so far, by the options they were captured with (all but the
    /// recomputation and the target's type, which `front` does not read), or why not.
    /// Captured when first asked for, by whichever thread asks (the lock is held while
    /// capturing: two threads asking for the same step capture it once).
    steps: std::sync::Mutex<Steps>,
}

impl fmt::Debug for StepFamily {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StepFamily")
            .field("dim", &self.dim)
            .field(
                "steps",
                &self
                    .steps()
                    .iter()
                    .map(|(c, s)| (c.clone(), s.is_ok()))
                    .collect::<Vec<_>>(),
            )
            .finish()
    }
}

impl StepFamily {
    /// The family of `dim` of the model imported at [`LOW`] (`low`, its training
    /// target's type there) and at [`MARKER`] (`high`). Nothing is compiled yet.
    pub fn new(dim: &str, low: (Graph, graphc_ir::TensorType), high: (Graph, graphc_ir::TensorType)) -> StepFamily {
        StepFamily {
            dim: dim.to_string(),
            low,
            high,
            steps: std::sync::Mutex::new(Vec::new()),
        }
    }

    /// How many integers of the step graphs captured so far depend on the dimension
    /// (the most of any).
    pub fn dependent(&self) -> usize {
        self.steps()
            .iter()
            .filter_map(|(_, s)| s.as_ref().as_ref().ok())
            .map(|(g, _)| g.dependent())
            .max()
            .unwrap_or(0)
    }

    /// The steps captured so far (a poisoned lock: a capture panicked on another
    /// thread, whose panic the caller sees; the list is still whole).
    fn steps(&self) -> std::sync::MutexGuard<'_, Steps> {
        self.steps.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The step graph for `opts`, captured now unless it was (or could not be).
    fn step(&self, opts: &CompileOptions) -> std::sync::Arc<Result<Step, String>> {
        let key = Self::key(opts);
        let mut steps = self.steps();
        if let Some((_, s)) = steps.iter().find(|(c, _)| *c == key) {
            return s.clone();
        }
        let captured = std::sync::Arc::new(self.capture(opts).map_err(|e| e.to_string()));
        steps.push((key, captured.clone()));
        captured
    }

    /// The step graph before recomputation at `value`, for `opts` (a training step's).
    fn front_at(&self, value: usize, opts: &CompileOptions) -> Result<(Back, Graph), FamilyError> {
        let why = |error: String| FamilyError::Graph {
            dim: self.dim.clone(),
            value,
            error,
        };
        let step = self.step(opts);
        let (family, back) = match step.as_ref() {
            Ok(step) => step,
            Err(e) => return Err(why(format!("no step family: {e}"))),
        };
        let start = Instant::now();
        let graph = family.graph_at(value)?;
        let mut back = back.clone();
        back.passes
            .push(specialized(&self.dim, value, family.dependent(), graph.len(), start));
        Ok((back, graph))
    }

    /// What tells the step graphs of two options apart: the options, but for what the
    /// stages before recomputation do not read.
    fn key(opts: &CompileOptions) -> String {
        let mut o = opts.clone();
        if let Some(t) = o.train.as_mut() {
            t.remat = crate::train::Remat::Off;
            t.target = graphc_ir::TensorType::new(t.target.dtype, Vec::<usize>::new());
        }
        format!("{o:?}")
    }

    /// The step graphs at the two samples for `opts`, and the family they make.
    fn capture(&self, opts: &CompileOptions) -> Result<Step, FamilyError> {
        let at = |(model, target): &(Graph, graphc_ir::TensorType)| {
            let mut o = opts.clone();
            if let Some(t) = o.train.as_mut() {
                t.target = target.clone();
            }
            front(model, &o)
        };
        let (back, low) = at(&self.low)?;
        let (_, high) = at(&self.high)?;
        Ok((GraphFamily::capture(&self.dim, &low, &high)?, back))
    }

    /// `compile_at` with `--remat auto` and the loss's parts set (`opts.token_chunks`
    /// not 0), given the plan there with every layer made again (`full`: a
    /// `Remat::FullProbe` compile at `value` with the same parts), which auto plans
    /// first: the same plan as `compile_at`, one plan fewer.
    pub fn auto_at(&self, value: usize, opts: &CompileOptions, full: Compiled) -> Result<Compiled, FamilyError> {
        let (back, graph) = self.front_at(value, opts)?;
        Ok(super::remat::auto_remat(back, &graph, opts, None, Some(full))?)
    }

    /// The training step compiled at `value` with `opts`, as `compile` compiles it
    /// (the same recomputation, fusion and plan), from the family's step graphs.
    pub fn compile_at(&self, value: usize, opts: &CompileOptions) -> Result<Compiled, FamilyError> {
        compile_from(opts, &mut |o: &CompileOptions| self.front_at(value, o))
    }
}

/// The report of writing a family's graph out at `value`.
fn specialized(dim: &str, value: usize, integers: usize, nodes: usize, start: Instant) -> PassReport {
    PassReport {
        pass: Pass::Specialize,
        nodes_before: nodes,
        nodes_after: nodes,
        time: start.elapsed(),
        details: vec![PassDetail::Specialized {
            dim: dim.to_string(),
            value,
            integers,
        }],
    }
}

fn json(graph: &Graph) -> Result<Value, FamilyError> {
    serde_json::to_value(graph).map_err(|e| {
        FamilyError::Compile(CompileError::Pass {
            pass: "specialize",
            error: GraphError::Graph(format!("graph JSON: {e}")),
        })
    })
}

/// The two samples' weights: the same names, each the same tensor (the same mapped
/// range, shared data, or equal elements).
fn same_weights(dim: &str, a: &BTreeMap<String, Tensor>, b: &BTreeMap<String, Tensor>) -> Result<(), FamilyError> {
    let differs = |name: &String| FamilyError::Weight {
        dim: dim.to_string(),
        name: name.clone(),
    };
    if let Some(name) = a
        .keys()
        .chain(b.keys())
        .find(|n| !a.contains_key(*n) || !b.contains_key(*n))
    {
        return Err(differs(name));
    }
    match a.iter().find(|(name, t)| !t.same_as(&b[*name])) {
        Some((name, _)) => Err(differs(name)),
        None => Ok(()),
    }
}

/// Walks the two samples' JSON together, reading every integer's polynomial.
struct Zip<'a> {
    dim: &'a str,
    graph: &'a Graph,
    integers: Vec<Option<DimPoly>>,
    path: Vec<Seg>,
}

impl Zip<'_> {
    fn walk(&mut self, a: &Value, b: &Value) -> Result<(), FamilyError> {
        match (a, b) {
            (Value::Number(x), Value::Number(y)) => match (integer(x), integer(y)) {
                (Some(x), Some(y)) if x == y => self.integers.push(None),
                (Some(x), Some(y)) => {
                    let poly = DimPoly::decode(y, MARKER as i128).filter(|p| p.eval(LOW as i128) == Some(x));
                    match poly {
                        Some(p) => self.integers.push(Some(p)),
                        None => return Err(self.differs(a, b)),
                    }
                }
                (None, None) if x == y => {}
                _ => return Err(self.differs(a, b)),
            },
            (Value::Array(x), Value::Array(y)) if x.len() == y.len() => {
                for (i, (p, q)) in x.iter().zip(y).enumerate() {
                    self.path.push(Seg::Index(i));
                    self.walk(p, q)?;
                    self.path.pop();
                }
            }
            (Value::Object(x), Value::Object(y)) if x.len() == y.len() && x.keys().eq(y.keys()) => {
                for ((k, p), q) in x.iter().zip(y.values()) {
                    self.path.push(Seg::Key(k.clone()));
                    self.walk(p, q)?;
                    self.path.pop();
                }
            }
            (Value::Null, Value::Null) | (Value::Bool(_), Value::Bool(_)) | (Value::String(_), Value::String(_))
                if a == b => {}
            _ => return Err(self.differs(a, b)),
        }
        Ok(())
    }

    fn differs(&self, a: &Value, b: &Value) -> FamilyError {
        FamilyError::differs(self.dim, self.graph, &self.path, a, b)
    }
}

/// Walks the template, writing each polynomial's value at `value`.
struct Fill<'a> {
    family: &'a GraphFamily,
    value: usize,
    next: usize,
    path: Vec<Seg>,
}

impl Fill<'_> {
    fn walk(&mut self, v: &mut Value) -> Result<(), FamilyError> {
        match v {
            Value::Number(n) if integer(n).is_some() => {
                let i = self.next;
                self.next += 1;
                if let Some(Some(poly)) = self.family.integers.get(i) {
                    let at = i128::try_from(self.value).ok().and_then(|x| poly.eval(x));
                    let number = at.and_then(|x| match u64::try_from(x) {
                        Ok(u) => Some(Number::from(u)),
                        Err(_) => i64::try_from(x).ok().map(Number::from),
                    });
                    match number {
                        Some(number) => *n = number,
                        None => {
                            return Err(FamilyError::OutOfRange {
                                dim: self.family.dim.clone(),
                                value: self.value,
                                place: place(&self.family.low, &self.path),
                                poly: poly.describe(&self.family.dim),
                            })
                        }
                    }
                }
            }
            Value::Array(items) => {
                for (i, item) in items.iter_mut().enumerate() {
                    self.path.push(Seg::Index(i));
                    self.walk(item)?;
                    self.path.pop();
                }
            }
            Value::Object(fields) => {
                for (k, item) in fields.iter_mut() {
                    self.path.push(Seg::Key(k.clone()));
                    self.walk(item)?;
                    self.path.pop();
                }
            }
            _ => {}
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn polynomials_decode_from_the_marker() {
        let m = MARKER as i128;
        for coefficients in [
            vec![0, 1],
            vec![-1, 1],
            vec![0, 1024],
            vec![3, -2, 16],
            vec![0, 0, 1],
            vec![7],
        ] {
            let p = DimPoly { coefficients };
            let n = p.eval(m).unwrap();
            assert_eq!(DimPoly::decode(n, m).unwrap(), p);
        }
        // A constant past half the marker reads as some polynomial: only the second
        // sample tells it apart (capture checks the polynomial at LOW).
        let big = DimPoly::decode(m / 2 + 5, m).unwrap();
        assert_ne!(big.eval(LOW as i128), Some(m / 2 + 5));
    }

    /// The write-out straight from the template meets every integer once and gives
    /// the graph the walked copy gives, and the graph imported at the value.
    #[test]
    fn a_graph_is_written_out_straight_from_the_template() {
        let path =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/onnx/gpt2_dynamic/model.onnx");
        let at = |batch: usize| {
            let opts = graphc_ir::onnx::ImportOptions {
                dims: [("batch".to_string(), batch), ("seq".to_string(), 16)].into(),
            };
            let model = graphc_ir::onnx::import_onnx(&path, &opts).unwrap();
            let compiled = crate::compile(&model, &CompileOptions::default()).unwrap();
            compiled.fusion_input().clone()
        };
        let family = GraphFamily::capture("batch", &at(LOW), &at(MARKER)).unwrap();
        assert!(family.dependent() > 10, "{family:?}");
        for value in [3, 5, 64, 1000] {
            let filler = fill::Filler::new(&family.integers, value);
            let direct = <Graph as serde::Deserialize>::deserialize(filler.at(&family.template)).unwrap();
            assert!(filler.met(), "batch={value}: not every integer was met once");
            let mut walked = family.graph_walked(value).unwrap();
            assert_eq!(direct, walked, "batch={value}");
            for (name, w) in &family.weights {
                walked.set_weight(name.clone(), w.clone());
            }
            assert_eq!(family.graph_at(value).unwrap(), walked, "batch={value}");
            assert_eq!(walked, at(value), "batch={value}");
        }
        // An integer out of range at the value: the walked copy names its place.
        let err = family.graph_at(usize::MAX / 2).unwrap_err().to_string();
        assert!(err.contains("batch"), "{err}");
    }

    #[test]
    fn polynomials_describe_themselves() {
        let p = DimPoly {
            coefficients: vec![-1, 1024, 2],
        };
        assert_eq!(p.describe("seq"), "2*seq^2 + 1024*seq - 1");
        assert_eq!(
            DimPoly {
                coefficients: vec![0, -1]
            }
            .describe("b"),
            "-b"
        );
    }
}
