//! Layer and per-tensor recomputation (`--remat full|auto`): which forward values of
//! the layers the backward makes again ([`recompute_layers`], [`recompute_tensors`]),
//! what it costs ([`matmul_flops`]) and the report ([`LayerRemat`]).

use graphc_ir::{Graph, GraphError, NodeId, Op};

use super::{forward_of, is_source, is_view, rebuild};

/// What [`recompute_layers`] did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct LayerRemat {
    /// Layers found (by their parameters' names), how many of them (the first ones)
    /// are made again, forward values made again in the backward, and the layer
    /// inputs kept (the checkpoints).
    pub layers: usize,
    pub chosen: usize,
    /// The layer indices made again (first, last), when any.
    pub range: Option<(usize, usize)>,
    pub recomputed: usize,
    pub checkpoints: usize,
    /// The step's GEMM and attention FLOPs ([`matmul_flops`]) without recomputation,
    /// and what the recomputed nodes add.
    pub step_flops: u64,
    pub extra_flops: u64,
    /// The step's total bytes without this recomputation (the plan of `--remat off`)
    /// and with it, where both were planned.
    pub bytes_off: Option<u64>,
    pub bytes: Option<u64>,
    /// Chosen per tensor ([`recompute_tensors`]): the GEMM and attention outputs made
    /// again, of how many (every layer's other values are).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tensors: Option<(usize, usize)>,
    /// Whether those are the exact solver's subset rather than the greedy prefix.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub exact: bool,
}

impl LayerRemat {
    /// The recomputation's cost as a share of the step's FLOPs.
    pub fn extra_share(&self) -> f64 {
        self.extra_flops as f64 / self.step_flops.max(1) as f64
    }

    /// What the recomputation saves of the step's total bytes, where both plans were
    /// made.
    pub fn saved_bytes(&self) -> Option<u64> {
        Some(self.bytes_off?.saturating_sub(self.bytes?))
    }

    /// One line: the layers made again, the values, the checkpoints, the extra FLOPs
    /// and the bytes saved.
    pub fn text(&self) -> String {
        use crate::plan::report::human_bytes;
        let which = match self.range {
            Some((a, b)) if a == b => format!(" (layer {a})"),
            Some((a, b)) => format!(" (layers {a}..{b})"),
            None => String::new(),
        };
        let saved = match (self.bytes_off, self.bytes) {
            (Some(off), Some(on)) => format!(
                "; the step's total {} instead of {} (saves {})",
                human_bytes(on),
                human_bytes(off),
                human_bytes(off.saturating_sub(on))
            ),
            _ => String::new(),
        };
        if let Some((costly, of)) = self.tensors {
            return format!(
                "per tensor: in all {} layers the values that cost no GEMM, and {costly} of {of} saved GEMM \
                 and attention outputs ({}), made again: {} forward values computed again in their layer's \
                 backward, {} layer inputs kept; +{:.1}% of the step's GEMM and attention FLOPs{saved}",
                self.layers,
                if self.exact {
                    "the subset of fewest FLOPs"
                } else {
                    "the fewest FLOPs per byte first"
                },
                self.recomputed,
                self.checkpoints,
                100.0 * self.extra_share()
            );
        }
        format!(
            "{} of {} layers made again{which}: {} forward values computed again in their layer's backward, \
             {} layer inputs kept; +{:.1}% of the step's GEMM and attention FLOPs{saved}",
            self.chosen,
            self.layers,
            self.recomputed,
            self.checkpoints,
            100.0 * self.extra_share()
        )
    }
}

/// Multiply-adds ×2 of a node's GEMMs: a matmul's `2 m n k` per batch, attention's
/// score and value products (halved when causal), and each attention gradient's
/// (dq, dk: three products; dv: two). Elementwise work is not counted: it is memory-
/// bound and small beside these.
pub fn matmul_flops(graph: &Graph, id: NodeId) -> u64 {
    let node = graph.node(id);
    let ty = |k: usize| &graph.node(node.inputs[k]).ty;
    let attention = |products: u64, causal: bool| {
        let args: Vec<&graphc_ir::TensorType> = node.inputs.iter().take(3).map(|&i| &graph.node(i).ty).collect();
        match graphc_ir::AttentionDims::of(&args) {
            Ok(d) => {
                let b: usize = d.batch.iter().product();
                let per = 2 * (b * d.hq * d.sq * d.sk * d.d.max(d.dv)) as u64;
                let f = products * per;
                if causal {
                    f / 2
                } else {
                    f
                }
            }
            Err(_) => 0,
        }
    };
    match &node.op {
        Op::MatMul => {
            let out = node.ty.shape.dims();
            let k = ty(0).shape.dims().last().copied().unwrap_or(0);
            (2 * out.iter().product::<usize>() * k) as u64
        }
        Op::Attention { causal, .. } => attention(2, *causal),
        Op::AttentionLse { causal, .. } => attention(1, *causal),
        Op::AttentionGrad { wrt, causal, .. } => {
            attention(if *wrt == graphc_ir::AttentionOperand::V { 2 } else { 3 }, *causal)
        }
        _ => 0,
    }
}

/// Gradient checkpointing (`--remat full`, as `gradient_checkpointing_enable()`):
/// the backward keeps only each layer's input and computes the layer's forward again
/// where it needs its values — in the first `first` layers (all: `usize::MAX`; the
/// others keep what their backward reads, as without).
///
/// A forward node's *layer* is that of the parameters it reads (a state input named in
/// a layer list, `h.3`, `layers.3`: the report's `layer_of`), else the latest of its
/// operands'. A node outside the layers (it reads a parameter of none, as the
/// embeddings, the final norm and the LM head do, or only such nodes and sources) is
/// kept as it is: recomputing the LM head would cost a vocabulary-wide GEMM. A
/// *checkpoint* (a layer's input) is a layer value made from an earlier layer's (the
/// residual stream between layers). Every other layer value the backward reads is made
/// again, with what it needs, from the checkpoints, sources and kept values (the
/// copies come right before their first backward reader, so each layer's values live
/// only during its backward). Recomputing deterministic ops gives the same values:
/// the step's results do not change.
pub fn recompute_layers(graph: &Graph, first: usize) -> Result<(Graph, LayerRemat), GraphError> {
    let lv = layer_values(graph)?;
    let n = graph.len();
    let mut again = vec![false; n];
    // The layers made again: the first `first`, by index (their saved values live the
    // longest: from their forward to the end of the backward).
    let chosen: std::collections::BTreeSet<usize> = lv.layers.iter().copied().take(first).collect();
    let mut report = LayerRemat {
        layers: lv.layers.len(),
        chosen: chosen.len(),
        range: chosen.first().zip(chosen.last()).map(|(&a, &b)| (a, b)),
        ..LayerRemat::default()
    };
    for &id in &lv.order {
        let i = id.index();
        let Some(l) = lv.layer[i] else { continue };
        if !chosen.contains(&l) || !lv.computed(graph, id) {
            continue;
        }
        if lv.checkpoint[i] {
            report.checkpoints += 1;
        } else {
            again[i] = true;
        }
    }
    let (out, copies) = rebuild(graph, &lv.order, &lv.forward, &again)?;
    lv.count(graph, &copies, &mut report);
    Ok((out, report))
}

/// Which of the layers' saved GEMM and attention outputs [`recompute_tensors`] makes
/// again, by index into [`tensor_candidates`]' order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TensorPick {
    /// The first `k` (the greedy knapsack's prefix).
    First(usize),
    /// Those whose entry is true (an exact solver's choice).
    Subset(Vec<bool>),
}

impl TensorPick {
    fn picks(&self, i: usize) -> bool {
        match self {
            TensorPick::First(k) => i < *k,
            TensorPick::Subset(v) => v.get(i).copied().unwrap_or(false),
        }
    }
}

/// Recomputation chosen per saved tensor: in every layer, the values that cost no GEMM
/// (norms, activations: memory-bound work) are made again in the backward, and so are
/// the GEMM and attention outputs `pick` names among the layers' saved ones
/// ([`tensor_candidates`]); the others are kept, and what is made again is made from
/// them and the layer inputs. None picked costs no GEMM FLOPs; every one picked is
/// `--remat full`. `--remat auto` chooses the pick: the shortest prefix that fits (a
/// greedy knapsack), and on small graphs the subset of fewest FLOPs (exact).
pub fn recompute_tensors(graph: &Graph, pick: &TensorPick) -> Result<(Graph, LayerRemat), GraphError> {
    let lv = layer_values(graph)?;
    let n = graph.len();
    let mut again = vec![false; n];
    let mut checkpoints = 0;
    for &id in &lv.order {
        let i = id.index();
        if lv.layer[i].is_none() || !lv.computed(graph, id) {
            continue;
        }
        if lv.checkpoint[i] {
            checkpoints += 1;
        } else if matmul_flops(graph, id) == 0 {
            again[i] = true;
        }
    }
    let costly = lv.candidates(graph);
    let mut picked = 0;
    for (k, &id) in costly.iter().enumerate() {
        if pick.picks(k) {
            again[id.index()] = true;
            picked += 1;
        }
    }
    let mut report = LayerRemat {
        layers: lv.layers.len(),
        chosen: lv.layers.len(),
        range: lv.layers.first().zip(lv.layers.last()).map(|(&a, &b)| (a, b)),
        checkpoints,
        tensors: Some((picked, costly.len())),
        exact: matches!(pick, TensorPick::Subset(_)),
        ..LayerRemat::default()
    };
    let (out, copies) = rebuild(graph, &lv.order, &lv.forward, &again)?;
    lv.count(graph, &copies, &mut report);
    Ok((out, report))
}

/// The layers' saved GEMM and attention outputs (those the backward reads, directly
/// or through views) as (FLOPs to make again, bytes), in [`recompute_tensors`]' order:
/// the fewest FLOPs per byte first, earlier layers first among equals (their values
/// live longest).
pub fn tensor_candidates(graph: &Graph) -> Result<Vec<(u64, u64)>, GraphError> {
    let lv = layer_values(graph)?;
    Ok(lv
        .candidates(graph)
        .into_iter()
        .map(|id| (matmul_flops(graph, id), graph.node(id).ty.size_bytes() as u64))
        .collect())
}

/// Every subset of `items` (FLOPs, bytes) that costs fewer than `below` FLOPs, as bit
/// masks, in the order an exact search plans them: fewest FLOPs first, most bytes
/// first among equals. None with more than [`EXACT_ITEMS`] items.
pub fn subsets_by_flops(items: &[(u64, u64)], below: u64) -> Option<Vec<u32>> {
    let n = items.len();
    if n > EXACT_ITEMS {
        return None;
    }
    let mut all: Vec<(u64, u64, u32)> = (0u32..(1u32 << n))
        .filter_map(|mask| {
            let (mut f, mut b) = (0u64, 0u64);
            for (i, &(fi, bi)) in items.iter().enumerate() {
                if mask & (1 << i) != 0 {
                    f = f.saturating_add(fi);
                    b = b.saturating_add(bi);
                }
            }
            (f < below).then_some((f, b, mask))
        })
        .collect();
    all.sort_by(|x, y| x.0.cmp(&y.0).then(y.1.cmp(&x.1)).then(x.2.cmp(&y.2)));
    Some(all.into_iter().map(|(_, _, m)| m).collect())
}

/// The most candidates [`subsets_by_flops`] takes (2^16 subsets).
pub const EXACT_ITEMS: usize = 16;

/// The forward's nodes by layer, for recomputation.
struct LayerValues {
    order: Vec<NodeId>,
    forward: Vec<bool>,
    /// Each forward node's layer (none outside the layers).
    layer: Vec<Option<usize>>,
    layers: std::collections::BTreeSet<usize>,
    /// Whether a layer node is its layer's input: made from an earlier layer's values
    /// (what it reads from outside the layers, the embeddings or a mask, is kept
    /// anyway).
    checkpoint: Vec<bool>,
    /// Whether a backward node reads the value (directly or through views).
    saved: Vec<bool>,
}

impl LayerValues {
    /// The layers' saved GEMM and attention outputs, in [`tensor_candidates`]' order.
    fn candidates(&self, graph: &Graph) -> Vec<NodeId> {
        let mut costly: Vec<NodeId> = self
            .order
            .iter()
            .copied()
            .filter(|&id| {
                let i = id.index();
                self.layer[i].is_some()
                    && self.computed(graph, id)
                    && !self.checkpoint[i]
                    && self.saved[i]
                    && matmul_flops(graph, id) > 0
            })
            .collect();
        let bytes = |id: NodeId| graph.node(id).ty.size_bytes().max(1) as u128;
        costly.sort_by(|&a, &b| {
            (u128::from(matmul_flops(graph, a)) * bytes(b))
                .cmp(&(u128::from(matmul_flops(graph, b)) * bytes(a)))
                .then(self.layer[a.index()].cmp(&self.layer[b.index()]))
                .then(a.cmp(&b))
        });
        costly
    }

    /// Whether a node computes a value (not a view or a source).
    fn computed(&self, graph: &Graph, id: NodeId) -> bool {
        let op = &graph.node(id).op;
        !is_view(op) && !is_source(op)
    }

    /// The report's counts of what was made again (`copies`) and its FLOPs.
    fn count(&self, graph: &Graph, copies: &[Option<NodeId>], report: &mut LayerRemat) {
        let n = graph.len();
        report.recomputed = (0..n)
            .filter(|&i| copies[i].is_some() && !matches!(graph.node(NodeId(i as u32)).op, Op::Iota { .. }))
            .count();
        report.step_flops = (0..n).map(|i| matmul_flops(graph, NodeId(i as u32))).sum();
        report.extra_flops = (0..n)
            .filter(|&i| copies[i].is_some())
            .map(|i| matmul_flops(graph, NodeId(i as u32)))
            .sum();
    }
}

/// A forward node's *layer* is that of the parameters it reads (a state input named in
/// a layer list, `h.3`, `layers.3`: the report's `layer_of`), else the earliest layer
/// of its forward readers (a layer norm's statistics belong to the layer whose scale
/// reads them); none outside the layers.
fn layer_values(graph: &Graph) -> Result<LayerValues, GraphError> {
    let n = graph.len();
    let order = graph.topo_order()?;
    let forward = forward_of(graph);
    let users = graph.users();
    // The layer whose parameters a node reads directly (a layer list's index), or
    // `Outside` when it reads a parameter of no layer.
    #[derive(Clone, Copy, PartialEq)]
    enum Direct {
        None,
        Layer(usize),
        Outside,
    }
    let direct = |id: NodeId| {
        let mut d = Direct::None;
        for &op in &graph.node(id).inputs {
            // A parameter read through views (a transposed weight) or a cast.
            let mut op = op;
            while matches!(graph.node(op).op, Op::Cast { .. }) || is_view(&graph.node(op).op) {
                op = graph.node(op).inputs[0];
            }
            let src = graph.node(op);
            if let Op::Input { name, .. } = &src.op {
                if !src.ty.dtype.is_float() {
                    continue;
                }
                match crate::plan::report::layer_of(name).and_then(|k| crate::plan::report::layer_index(&k)) {
                    Some(l) => {
                        if d == Direct::None {
                            d = Direct::Layer(l);
                        }
                    }
                    None => d = Direct::Outside,
                }
            }
        }
        d
    };
    let mut layer: Vec<Option<usize>> = vec![None; n];
    let mut layers = std::collections::BTreeSet::new();
    for &id in order.iter().rev() {
        let i = id.index();
        if !forward[i] || is_source(&graph.node(id).op) {
            continue;
        }
        layer[i] = match direct(id) {
            Direct::Layer(l) => Some(l),
            Direct::Outside => None,
            Direct::None => users[i]
                .iter()
                .filter(|u| forward[u.index()])
                .filter_map(|u| layer[u.index()])
                .min(),
        };
        if let Some(l) = layer[i] {
            layers.insert(l);
        }
    }
    // The stored value behind views.
    let base = |mut id: NodeId| {
        while is_view(&graph.node(id).op) {
            id = graph.node(id).inputs[0];
        }
        id
    };
    let mut checkpoint = vec![false; n];
    for &id in &order {
        let Some(l) = layer[id.index()] else { continue };
        checkpoint[id.index()] = graph.node(id).inputs.iter().any(|&op| {
            let b = base(op);
            !is_source(&graph.node(b).op) && layer[b.index()].is_some_and(|lb| lb < l)
        });
    }
    // Read by the backward directly, or by a value that costs no GEMM and is made again
    // there (per tensor, every such layer value is): from the last node back.
    let mut saved = vec![false; n];
    for &id in order.iter().rev() {
        let i = id.index();
        let again_cheap = forward[i]
            && saved[i]
            && layer[i].is_some()
            && !checkpoint[i]
            && !is_source(&graph.node(id).op)
            && matmul_flops(graph, id) == 0;
        if forward[i] && !again_cheap {
            continue;
        }
        for &op in &graph.node(id).inputs {
            let b = base(op);
            if forward[b.index()] {
                saved[b.index()] = true;
            }
        }
    }
    Ok(LayerValues {
        order,
        forward,
        layer,
        layers,
        checkpoint,
        saved,
    })
}
