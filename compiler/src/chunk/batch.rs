//! Batch parts: a transformer sub-block, from its norm to its residual add, run over
//! parts of the batch, so that only one part's values of it are live at a time.
//!
//! Token parts ([`super`]) split the rows of position-wise work; attention mixes the
//! tokens of a sequence, so an attention sub-block (norm, QKV projection, attention,
//! output projection, residual add) cannot be cut between tokens, but it can between
//! sequences. A *batch region* is anchored at an attention, or at an MLP's down
//! projection (as for token parts), and holds:
//!
//! - forward from the anchor, while each value has a single reader: views, elementwise
//!   ops (the bias, the residual add) and weight matmuls (the output projection); the
//!   last one is the region's end, read by what follows;
//! - back from the anchor's operands, every value it reads that depends on the model's
//!   inputs and is computed by a block-local op (below), up to the values the forward
//!   chain reads from outside (the residual stream) and to values read elsewhere.
//!
//! Correctness does not depend on what the leading dim means. Let `B` be the leading
//! dim of the model's first input of rank 2 or more (the batch). Every value of the
//! region has a leading dim `d0` that `B` divides, and *block* `k` of it is the
//! elements whose leading index lies in `[k d0/B, (k+1) d0/B)` (a contiguous range of
//! elements, so a reshape between two such shapes maps block `k` to block `k`). Every
//! op of the region is block-local: block `k` of its result reads only block `k` of
//! each operand (elementwise ops; reshapes; transposes that keep dim 0; slices,
//! reductions and concatenations that do not touch it; broadcasts along other dims; a
//! matmul by a weight, or of two values batched along dim 0; attention, batched along
//! dim 0). So computing the region on blocks `[b0, b1)` of every value it reads from
//! outside gives blocks `[b0, b1)` of its end, bit for bit; a weight, or a value
//! broadcast along dim 0 (a padding mask of one row), is read whole. The parts are
//! emitted one after another, then one `concat` along dim 0.

use std::collections::{HashMap, HashSet};

use graphc_ir::{Graph, GraphError, NodeId, Op, Shape, SliceRange};

/// What a batch region is anchored at.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Anchor {
    Attention,
    Mlp,
    /// What reads the last region's end up to the model's output (the final norm, an
    /// LM head): [`tail_at`].
    Tail,
}

/// One batch region: its nodes (topological order), its end, what it is anchored at.
pub(super) struct BatchRegion {
    pub nodes: Vec<NodeId>,
    pub end: NodeId,
    pub anchor: Anchor,
}

/// What the region search needs of the graph.
pub(super) struct Context<'a> {
    pub graph: &'a Graph,
    pub dynamic: &'a [bool],
    pub users: &'a [Vec<NodeId>],
    pub outputs: &'a [bool],
    /// Topological position of every node.
    pub pos: &'a HashMap<NodeId, usize>,
    /// The blocks every value is split into (the batch).
    pub batch: usize,
}

/// The batch: the leading dim of the model's first input of rank ≥ 2.
pub(super) fn batch_of(graph: &Graph) -> Option<usize> {
    graph
        .inputs()
        .iter()
        .map(|&i| graph.node(i).ty.shape.dims())
        .find(|d| d.len() >= 2)
        .map(|d| d[0])
}

fn dim0(graph: &Graph, v: NodeId) -> Option<usize> {
    graph.node(v).ty.shape.dims().first().copied()
}

/// Whether operand `k` of region node `v` is read whole by every part rather than
/// split into blocks: a matmul's weight, or the operand of a broadcast along dim 0.
fn whole(cx: &Context, v: NodeId, k: usize) -> bool {
    let node = cx.graph.node(v);
    let i = node.inputs[k];
    match &node.op {
        Op::MatMul => k == 1 && !cx.dynamic[i.index()] && cx.graph.node(i).ty.shape.rank() == 2,
        Op::Broadcast { shape } => {
            let r = cx.graph.node(i).ty.shape.rank();
            r < shape.rank() || dim0(cx.graph, i) != shape.dims().first().copied()
        }
        Op::Attention { .. } => k == 3 && dim0(cx.graph, i) == Some(1),
        _ => false,
    }
}

/// Whether `v` computes its value block by block (see the module doc), its leading dim
/// and those of the operands it splits a multiple of the batch.
fn block_local(cx: &Context, v: NodeId) -> bool {
    let (g, b) = (cx.graph, cx.batch);
    let node = g.node(v);
    let divides = |x: NodeId| dim0(g, x).is_some_and(|d| d > 0 && d % b == 0);
    if !divides(v) {
        return false;
    }
    let op_ok = match &node.op {
        Op::Unary(_) | Op::Binary(_) | Op::Select | Op::Cast { .. } | Op::Reshape { .. } => true,
        Op::Broadcast { .. } => true,
        Op::Transpose { perm } => perm.first() == Some(&0),
        Op::Reduce { axes, .. } => !axes.contains(&0),
        Op::Concat { axis } => *axis != 0,
        Op::Slice { ranges } => {
            let d = dim0(g, node.inputs[0]).unwrap_or(0) as i64;
            ranges
                .first()
                .is_some_and(|r| r.start == 0 && r.step == 1 && r.end >= d)
        }
        Op::MatMul => {
            let (l, r) = (node.inputs[0], node.inputs[1]);
            if whole(cx, v, 1) {
                g.node(l).ty.shape.rank() >= 2
            } else {
                let (lr, rr) = (g.node(l).ty.shape.rank(), g.node(r).ty.shape.rank());
                lr >= 3 && lr == rr && dim0(g, l) == dim0(g, r)
            }
        }
        Op::Attention { .. } => {
            let d = dim0(g, node.inputs[0]);
            node.inputs[..3].iter().all(|&i| dim0(g, i) == d)
        }
        _ => false,
    };
    op_ok
        && node
            .inputs
            .iter()
            .enumerate()
            .all(|(k, &i)| whole(cx, v, k) || divides(i))
}

/// Whether weight matmul `id` is an MLP's down projection: its operand wider than its
/// result and made from a weight matmul's (the up projection) by elementwise ops and
/// views (not a grouped-query attention's narrower key or value projection).
fn down_projection(cx: &Context, id: NodeId) -> bool {
    let g = cx.graph;
    let w = |v: NodeId| g.node(v).ty.shape.dims().last().copied().unwrap_or(0);
    let hidden = g.node(id).inputs[0];
    if w(hidden) <= w(id) {
        return false;
    }
    let mut stack = vec![hidden];
    let mut seen = HashSet::new();
    while let Some(v) = stack.pop() {
        if !seen.insert(v) || !cx.dynamic[v.index()] {
            continue;
        }
        let node = g.node(v);
        match &node.op {
            Op::MatMul if whole(cx, v, 1) && w(v) == w(hidden) => return true,
            Op::Unary(_) | Op::Binary(_) | Op::Select | Op::Cast { .. } | Op::Reshape { .. } => {
                stack.extend(node.inputs.iter().copied())
            }
            _ => {}
        }
    }
    false
}

/// The batch region anchored at `id`, if it is one; nodes in `taken` are outside.
pub(super) fn region_at(cx: &Context, id: NodeId, taken: &[bool]) -> Option<BatchRegion> {
    let g = cx.graph;
    if taken[id.index()] || !cx.dynamic[id.index()] {
        return None;
    }
    let anchor = match &g.node(id).op {
        Op::Attention { .. } => Anchor::Attention,
        Op::MatMul if whole(cx, id, 1) && down_projection(cx, id) => Anchor::Mlp,
        _ => return None,
    };
    if !block_local(cx, id) {
        return None;
    }
    // Forward: single readers, block-local, up to the end.
    let mut chain = vec![id];
    let mut end = id;
    while let [u] = cx.users[end.index()][..] {
        if cx.outputs[end.index()] || taken[u.index()] || !block_local(cx, u) {
            break;
        }
        chain.push(u);
        end = u;
    }
    let mut set: HashSet<NodeId> = chain.iter().copied().collect();
    // What the chain reads from outside (the residual stream) bounds the walk back.
    let boundary: HashSet<NodeId> = chain[1..]
        .iter()
        .flat_map(|&v| g.node(v).inputs.iter().copied())
        .filter(|i| !set.contains(i))
        .collect();
    let mut stack: Vec<NodeId> = g.node(id).inputs.clone();
    if anchor == Anchor::Mlp {
        stack.truncate(1);
    }
    while let Some(v) = stack.pop() {
        if set.contains(&v)
            || boundary.contains(&v)
            || !cx.dynamic[v.index()]
            || taken[v.index()]
            || !block_local(cx, v)
        {
            continue;
        }
        set.insert(v);
        let node = g.node(v);
        for (k, &i) in node.inputs.iter().enumerate() {
            if !whole(cx, v, k) {
                stack.push(i);
            }
        }
    }
    // Keep only what is read inside: drop, until none is left, every value (but the
    // end) read outside the region or given out by the model.
    loop {
        let out: Vec<NodeId> = set
            .iter()
            .copied()
            .filter(|&v| v != end && (cx.outputs[v.index()] || cx.users[v.index()].iter().any(|u| !set.contains(u))))
            .collect();
        if out.is_empty() {
            break;
        }
        for v in out {
            set.remove(&v);
        }
    }
    if chain.iter().any(|v| !set.contains(v)) {
        return None;
    }
    // Worth it only with a weight matmul besides the anchor's chain (the norm and the
    // QKV projection, or the up projection) or an attention.
    let mut nodes: Vec<NodeId> = set.into_iter().collect();
    nodes.sort_by_key(|v| cx.pos[v]);
    let matmuls = nodes
        .iter()
        .filter(|&&v| matches!(g.node(v).op, Op::MatMul | Op::Attention { .. }))
        .count();
    (matmuls >= 2).then_some(BatchRegion { nodes, end, anchor })
}

/// The tail after batch region end `e`: every value that depends on it through
/// block-local ops, when they make one value read outside (the model's output, the
/// final norm's); so the parts of `e` go on to the output without a `concat` between.
pub(super) fn tail_at(cx: &Context, e: NodeId, taken: &[bool]) -> Option<BatchRegion> {
    if cx.outputs[e.index()] {
        return None;
    }
    let mut set = HashSet::new();
    let mut stack: Vec<NodeId> = cx.users[e.index()].clone();
    while let Some(v) = stack.pop() {
        if set.contains(&v) || taken[v.index()] || !cx.dynamic[v.index()] || !block_local(cx, v) {
            continue;
        }
        set.insert(v);
        stack.extend(cx.users[v.index()].iter().copied());
    }
    // Every reader of `e` inside, and one value read outside.
    if cx.users[e.index()].iter().any(|u| !set.contains(u)) {
        return None;
    }
    let exits: Vec<NodeId> = set
        .iter()
        .copied()
        .filter(|&v| cx.outputs[v.index()] || cx.users[v.index()].iter().any(|u| !set.contains(u)))
        .collect();
    let [end] = exits[..] else {
        return None;
    };
    let mut nodes: Vec<NodeId> = set.into_iter().collect();
    nodes.sort_by_key(|v| cx.pos[v]);
    Some(BatchRegion {
        nodes,
        end,
        anchor: Anchor::Tail,
    })
}

/// The op of region node `v` for a part of `len` blocks of `batch`: reshapes and
/// broadcasts take the part's leading dim; a slice's leading range is the whole part.
fn part_op(op: &Op, batch: usize, len: usize) -> Op {
    let scale = |s: &Shape| {
        let mut d = s.dims().to_vec();
        if let Some(d0) = d.first_mut() {
            *d0 = *d0 / batch * len;
        }
        Shape::new(d)
    };
    match op {
        Op::Reshape { shape } => Op::Reshape { shape: scale(shape) },
        Op::Broadcast { shape } => Op::Broadcast { shape: scale(shape) },
        Op::Slice { ranges } => {
            let mut ranges = ranges.clone();
            if let Some(r) = ranges.first_mut() {
                *r = SliceRange::full();
            }
            Op::Slice { ranges }
        }
        other => other.clone(),
    }
}

/// Blocks `[b0, b0 + len)` of the region, emitted into `out`; returns the part's end.
///
/// A value read from outside that is the end of an earlier batch region is read as
/// that region's part `c` (in `parts_of`: the same blocks), not sliced from the whole.
pub(super) fn emit_part(
    cx: &Context,
    out: &mut Graph,
    (map, parts_of): (&[Option<NodeId>], &HashMap<NodeId, Vec<NodeId>>),
    region: &BatchRegion,
    (b0, len): (usize, usize),
    c: usize,
) -> Result<NodeId, GraphError> {
    let g = cx.graph;
    let b = cx.batch;
    let mut local: HashMap<NodeId, NodeId> = HashMap::new();
    let mut sliced: HashMap<NodeId, NodeId> = HashMap::new();
    let part_name = |v: NodeId| g.node(v).name.as_ref().map(|s| format!("{s}/part{c}"));
    for &v in &region.nodes {
        let node = g.node(v);
        let mut inputs = Vec::with_capacity(node.inputs.len());
        for (k, &i) in node.inputs.iter().enumerate() {
            if let Some(&x) = local.get(&i) {
                inputs.push(x);
                continue;
            }
            if let Some(&x) = parts_of.get(&i).and_then(|p| p.get(c)) {
                inputs.push(x);
                continue;
            }
            let outer = map[i.index()].ok_or_else(|| {
                GraphError::Graph(format!("batch part {c}: node {v} reads {i}, which has no whole value"))
            })?;
            if whole(cx, v, k) {
                inputs.push(outer);
                continue;
            }
            if let Some(&x) = sliced.get(&i) {
                inputs.push(x);
                continue;
            }
            let ty = &g.node(i).ty;
            let u = ty.shape.dims()[0] / b;
            let mut ranges = vec![SliceRange::full(); ty.shape.rank()];
            ranges[0] = SliceRange {
                start: (b0 * u) as i64,
                end: ((b0 + len) * u) as i64,
                step: 1,
            };
            let x = out.add(Op::Slice { ranges }, vec![outer], part_name(i))?;
            sliced.insert(i, x);
            inputs.push(x);
        }
        let x = out.add(part_op(&node.op, b, len), inputs, part_name(v))?;
        let want = node.ty.shape.dims()[0] / b * len;
        if out.node(x).ty.shape.dims().first() != Some(&want) {
            return Err(GraphError::Graph(format!(
                "batch part {c} of node {v}: leading dim {:?}, expected {want}",
                out.node(x).ty.shape.dims().first()
            )));
        }
        local.insert(v, x);
    }
    Ok(local[&region.end])
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use graphc_ir::{interpret, nn, DType, Graph, GraphBuilder, Tensor, TensorType, UnaryOp, Value};

    use super::super::{chunk_mlps, ChunkReport};
    use super::*;

    fn weight<'b>(b: &'b GraphBuilder, name: &str, dims: &[usize], seed: u64) -> Value<'b> {
        let ty = TensorType::new(DType::F32, dims.to_vec());
        b.param(name, Tensor::randn(&ty, 0.3, seed))
    }

    const BATCH: usize = 5;

    /// Two pre-norm transformer layers (causal attention with a padding mask of one row
    /// per sequence, GELU MLP) and a final norm; with `leak`, the first layer's QKV
    /// projection is an output too.
    fn model(leak: bool) -> Graph {
        let (bt, s, d, h, heads) = (BATCH, 6, 16, 64, 4);
        let b = GraphBuilder::new();
        let mut x = b.input("x", DType::F32, [bt, s, d]);
        let mask = b.input("mask", DType::F32, [bt, 1, 1, s]);
        for l in 0..2u64 {
            let n = nn::layer_norm(x, None, None, 1e-5);
            let qkv = n
                .reshape([bt * s, d])
                .matmul(weight(&b, &format!("wqkv{l}"), &[d, 3 * d], 10 * l + 1));
            if leak && l == 0 {
                b.output("qkv", qkv);
            }
            let head = |i: i64| {
                qkv.reshape([bt, s, 3 * d])
                    .slice(2, i * d as i64, (i + 1) * d as i64, 1)
                    .reshape([bt, s, heads, d / heads])
                    .transpose(&[0, 2, 1, 3])
            };
            let a = b.attention(head(0), head(1), head(2), Some(mask), 0.5, true);
            let a = a.transpose(&[0, 2, 1, 3]).reshape([bt * s, d]);
            let o = a
                .matmul(weight(&b, &format!("wo{l}"), &[d, d], 10 * l + 2))
                .reshape([bt, s, d]);
            x = x + o;
            let n = nn::layer_norm(x, None, None, 1e-5).reshape([bt * s, d]);
            let up = n
                .matmul(weight(&b, &format!("w1{l}"), &[d, h], 10 * l + 3))
                .unary(UnaryOp::GeluTanh);
            let down = up
                .matmul(weight(&b, &format!("w2{l}"), &[h, d], 10 * l + 4))
                .reshape([bt, s, d]);
            x = x + down;
        }
        b.output("y", nn::layer_norm(x, None, None, 1e-5));
        b.finish().unwrap()
    }

    fn run(g: &Graph) -> Vec<Vec<f64>> {
        let x = Tensor::randn(&TensorType::new(DType::F32, vec![BATCH, 6, 16]), 1.0, 7);
        let m: Vec<f64> = (0..BATCH * 6)
            .map(|i| if i % 6 == 5 && i / 6 == 1 { -1e9 } else { 0.0 })
            .collect();
        let mask = Tensor::from_f64(DType::F32, vec![BATCH, 1, 1, 6], &m).unwrap();
        let out = interpret(g, &HashMap::from([("x".to_string(), x), ("mask".to_string(), mask)])).unwrap();
        out.into_iter().map(|(_, t)| t.to_f64_vec()).collect()
    }

    /// Both layers' attention blocks and MLPs, and the final norm, in 2 to 5 parts of
    /// the batch of 5 (unequal parts but for 5): the same values bit for bit; one
    /// `concat` (the output's): each sub-block reads the previous one's parts.
    #[test]
    fn layers_run_in_parts_of_the_batch_give_the_same_values() {
        let g = model(false);
        let want = run(&g);
        for chunks in 2..=BATCH {
            let (c, report) = chunk_mlps(&g, chunks).unwrap();
            c.verify().unwrap();
            assert_eq!(
                report,
                ChunkReport {
                    attention_blocks: 2,
                    batch_mlps: 2,
                    batch_parts: chunks,
                    tail: true,
                    ..Default::default()
                }
            );
            let count = |f: &dyn Fn(&Op) -> bool| c.nodes().iter().filter(|n| f(&n.op)).count();
            assert_eq!(count(&|o| matches!(o, Op::Concat { axis: 0 })), 1, "{chunks} parts");
            assert_eq!(count(&|o| matches!(o, Op::Attention { .. })), 2 * chunks);
            assert_eq!(count(&|o| matches!(o, Op::MatMul)), 8 * chunks);
            assert_eq!(run(&c), want, "{chunks} parts");
        }
        // More parts than sequences: the MLPs in parts of their tokens.
        let (c, report) = chunk_mlps(&g, BATCH + 1).unwrap();
        assert_eq!((report.attention_blocks, report.regions), (0, 2));
        assert_eq!(run(&c), want);
    }

    /// A QKV projection read outside its block (an output) stays whole: the block
    /// starts after it, the norm before it is not a part's.
    #[test]
    fn a_value_read_outside_stays_whole() {
        let g = model(true);
        let want = run(&g);
        let (c, report) = chunk_mlps(&g, 2).unwrap();
        assert_eq!((report.attention_blocks, report.batch_mlps), (2, 2));
        let whole_qkv = c
            .nodes()
            .iter()
            .filter(|n| matches!(n.op, Op::MatMul) && n.ty.shape.dims() == [BATCH * 6, 48])
            .count();
        assert_eq!(whole_qkv, 1, "the first layer's QKV projection, whole");
        assert_eq!(run(&c), want);
    }
}
