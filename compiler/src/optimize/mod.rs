//! The e-graph optimizer: constant folding, algebraic simplification, CSE and DCE.
//!
//! The graph goes into an egg e-graph (hash-consing gives CSE), rules from `rules/`
//! saturate it under node, iteration and time limits set from the graph's size, the
//! analysis folds every class whose operands are known (see `analysis`), and one
//! e-node per class is extracted from the outputs (DCE: what no output reaches is not
//! extracted). The result is verified; any stop of the runner still yields a graph
//! equal to the input, since every class only ever holds equal values.

mod analysis;
mod convert;
mod extract;
mod lang;
mod rule;
pub mod rules;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use egg::{Runner, StopReason};
use graphc_ir::Graph;

pub use analysis::{Known, TensorAnalysis, MAX_FOLDED_BYTES};
pub use convert::OptimizeError;
pub use lang::TNode;

/// Limits of one optimization; `None` fields are derived from the graph's size.
#[derive(Clone, Debug, Default)]
pub struct OptimizeOptions {
    /// Keep weights as they are (no folding of weight-only chains).
    pub keep_weights: bool,
    pub node_limit: Option<usize>,
    pub iter_limit: Option<usize>,
    pub time_limit: Option<Duration>,
}

/// What the optimizer did.
#[derive(Clone, Debug)]
pub struct OptimizeReport {
    pub nodes_before: usize,
    pub nodes_after: usize,
    /// Classes folded to constants during saturation.
    pub constants_folded: usize,
    pub weight_bytes_before: usize,
    pub weight_bytes_after: usize,
    /// Parameters no output uses any more (unused, or replaced by a folded weight).
    pub weights_dropped: Vec<String>,
    /// Weights made by folding weight-only chains (`fc0.weight:transpose`).
    pub weights_added: Vec<String>,
    /// Times each rule fired, by rule name.
    pub rules_fired: BTreeMap<String, usize>,
    pub iterations: usize,
    pub egraph_nodes: usize,
    pub egraph_classes: usize,
    /// Why saturation stopped: "saturated", or the limit it hit.
    pub stop_reason: String,
    pub time: Duration,
}

/// Optimize a verified graph; the result computes the same outputs.
pub fn optimize(graph: &Graph, opts: &OptimizeOptions) -> Result<(Graph, OptimizeReport), OptimizeError> {
    let start = Instant::now();
    let n = graph.len().max(1);
    let mut runner = Runner::<TNode, TensorAnalysis>::new(TensorAnalysis::default())
        .with_node_limit(opts.node_limit.unwrap_or(4 * n + 10_000))
        .with_iter_limit(opts.iter_limit.unwrap_or(30))
        .with_time_limit(opts.time_limit.unwrap_or(Duration::from_secs(10)));
    if !opts.keep_weights {
        runner.egraph.analysis.weights = graph
            .weights()
            .iter()
            .map(|(k, v)| (k.clone(), std::sync::Arc::new(v.clone())))
            .collect();
    }
    let classes = convert::to_egraph(graph, &mut runner.egraph)?;
    runner.egraph.rebuild();
    let runner = runner.run(&rules::all());
    let stop_reason = match &runner.stop_reason {
        Some(StopReason::Saturated) | None => "saturated".to_string(),
        Some(StopReason::IterationLimit(i)) => format!("iteration limit ({i})"),
        Some(StopReason::NodeLimit(k)) => format!("node limit ({k})"),
        Some(StopReason::TimeLimit(t)) => format!("time limit ({t:.2} s)"),
        Some(StopReason::Other(s)) => s.clone(),
    };
    let mut rules_fired = BTreeMap::new();
    for it in &runner.iterations {
        // Each iteration searches every e-node with every rule, then rebuilds.
        graphc_ir::work::add_len(graphc_ir::work::Stage::Optimize, it.egraph_nodes);
        for (name, count) in &it.applied {
            *rules_fired.entry(name.to_string()).or_insert(0) += count;
        }
    }
    let eg = &runner.egraph;
    let chosen = extract::extract(eg);
    let out = convert::from_egraph(graph, &classes, eg, &chosen, &eg.analysis.folded_weights)?;
    out.verify()?;
    let weights_dropped = graph
        .parameters()
        .filter(|(_, name, _)| out.weight(name).is_none() && graph.weight(name).is_some())
        .map(|(_, name, _)| name.to_string())
        .collect();
    let weights_added = out
        .parameters()
        .filter(|(_, name, _)| graph.weight(name).is_none())
        .map(|(_, name, _)| name.to_string())
        .collect();
    let report = OptimizeReport {
        nodes_before: graph.len(),
        nodes_after: out.len(),
        constants_folded: eg.analysis.folded,
        weight_bytes_before: graph.weights_bytes(),
        weight_bytes_after: out.weights_bytes(),
        weights_dropped,
        weights_added,
        rules_fired,
        iterations: runner.iterations.len(),
        egraph_nodes: eg.total_number_of_nodes(),
        egraph_classes: eg.number_of_classes(),
        stop_reason,
        time: start.elapsed(),
    };
    Ok((out, report))
}
