//! Token chunking: a position-wise MLP run over chunks of its tokens, so that only one
//! chunk's wide hidden value is live at a time (Mini-Sequence Transformer's MLP chunks).
//!
//! A transformer's MLP widens each token to a hidden of 4·d (or SwiGLU's gate and up
//! projections) and narrows it back; for a batch of long sequences that hidden is the
//! largest value of the forward pass. Every op of the MLP works on each token alone, so
//! the tokens can go through it in `chunks` parts: the parts' outputs are concatenated,
//! and the result is the same, element for element (each row of a GEMM is the same sum
//! in the same order, every other op is per element).
//!
//! A *region* ends at a down projection: a matmul whose right operand does not depend
//! on the graph's inputs (a weight) and whose left operand (the hidden) is wider than
//! its output, plus the elementwise ops and views after it that only add
//! elementwise ops and reshapes after it (the bias, the residual add). Walking back from
//! the hidden it takes unary, binary, select and cast ops, reshapes and further weight
//! matmuls (the up projections), up to the values it reads from outside (the MLP's
//! input, the weights' broadcasts). Every value inside is read only inside, and every
//! value it touches is `[rows, width]` with the same rows (the tokens: `[tokens, w]`
//! and `[batch, seq, w]` alike), a reshape keeping the width. A part is a range of
//! rows: every value of the part is made as `[part rows, width]` (values from outside
//! viewed so and sliced, reshapes dropped, weights read whole), so parts need not
//! divide anything: the first `tokens % chunks` parts take one row more, and a batch
//! of one long sequence splits as well as many short ones.
//!
//! Where the model's batch has at least as many sequences as parts, the sub-blocks run
//! in parts of it instead ([`batch`]): each attention block and MLP from its norm to
//! its residual add, so the norm's output, the QKV projection and the attention's
//! output are a part's too, and consecutive sub-blocks pass their parts on without a
//! `concat` between; token parts are for fewer sequences than parts (a batch of one
//! long sequence) and for MLPs outside any batch region.
//!
//! The parts are emitted one after another where the region ended, then one `concat`:
//! the program order (and the schedulers) run one part's hidden to its end before the
//! next part's begins. Run after the last optimizer run (its rules would fold
//! `concat` of slices back) and before fusion.

mod batch;

use graphc_ir::{Graph, GraphError, Node, NodeId, Op, Shape, SliceRange};

/// What [`chunk_mlps`] did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ChunkReport {
    /// MLPs run in parts of their tokens, and into how many parts each.
    pub regions: usize,
    pub chunks: usize,
    /// Sub-blocks run in parts of the batch ([`batch`]): attention blocks and MLPs,
    /// each from its norm to its residual add, and into how many parts each.
    pub attention_blocks: usize,
    pub batch_mlps: usize,
    pub batch_parts: usize,
    /// Whether what follows the last sub-block (the final norm) runs in the parts too.
    pub tail: bool,
}

impl ChunkReport {
    /// `2 MLPs run in 4 parts of their tokens`; `2 attention blocks and 2 MLPs run in
    /// 4 parts of the batch`.
    pub fn summary(&self) -> String {
        let plural = |n: usize, what: &str| format!("{n} {what}{}", if n == 1 { "" } else { "s" });
        let mut parts = Vec::new();
        if self.attention_blocks + self.batch_mlps > 0 {
            let mut what = Vec::new();
            if self.attention_blocks > 0 {
                what.push(plural(self.attention_blocks, "attention block"));
            }
            if self.batch_mlps > 0 {
                what.push(plural(self.batch_mlps, "MLP"));
            }
            parts.push(format!(
                "{} (each from its norm to its residual add{}) run in {} parts of the batch, one part's values live at a time",
                what.join(" and "),
                if self.tail { ", and what follows the last to the output" } else { "" },
                self.batch_parts
            ));
        }
        if self.regions > 0 {
            parts.push(format!(
                "{} run in {} parts of {} tokens, one part's hidden live at a time",
                plural(self.regions, "MLP"),
                self.chunks,
                if self.regions == 1 { "its" } else { "their" }
            ));
        }
        parts.join("; ")
    }

    /// Whether anything runs in parts.
    pub fn any(&self) -> bool {
        self.regions + self.attention_blocks + self.batch_mlps > 0
    }
}

/// One region: its nodes (in topological order) and its last node.
struct Region {
    nodes: Vec<NodeId>,
    end: NodeId,
}

/// `graph` with every MLP region (see the module doc) run over `chunks` parts of its
/// tokens; `chunks < 2` or a graph without a region gives the graph back.
pub fn chunk_mlps(graph: &Graph, chunks: usize) -> Result<(Graph, ChunkReport), GraphError> {
    chunk(graph, chunks, true, &|_| false)
}

/// The MLPs of a training step's forward graph in `chunks` parts of their tokens
/// (never of the batch): [`chunk_mlps`] with the inputs `parameter` names read as
/// weights (the trained parameters are inputs of the step). Differentiated, each part's
/// backward reads its part of the output's gradient and writes its part of the input's
/// (the parts' gradients joined by one `concat`, `autodiff`'s sum of disjoint pads), and
/// each weight's gradient is the sum of the parts'.
pub fn chunk_mlp_tokens(
    graph: &Graph,
    chunks: usize,
    parameter: &dyn Fn(&Node) -> bool,
) -> Result<(Graph, ChunkReport), GraphError> {
    chunk(graph, chunks, false, parameter)
}

fn chunk(
    graph: &Graph,
    chunks: usize,
    batch_parts_allowed: bool,
    parameter: &dyn Fn(&Node) -> bool,
) -> Result<(Graph, ChunkReport), GraphError> {
    let mut report = ChunkReport::default();
    if chunks < 2 {
        return Ok((graph.clone(), report));
    }
    let order = graph.topo_order()?;
    let n = graph.len();
    // Whether each value depends on a graph input (a token value) or not (a weight).
    let mut dynamic = vec![false; n];
    for &id in &order {
        let node = graph.node(id);
        dynamic[id.index()] = (matches!(node.op, Op::Input { .. }) && !parameter(node))
            || node.inputs.iter().any(|&i| dynamic[i.index()]);
    }
    let users = graph.users();
    let outputs: Vec<bool> = {
        let mut v = vec![false; n];
        for o in graph.outputs() {
            v[o.node.index()] = true;
        }
        v
    };
    let mut in_region = vec![false; n];
    // Sub-blocks in parts of the batch first, where there is a batch to split; then
    // the MLPs left, in parts of their tokens.
    let pos: std::collections::HashMap<NodeId, usize> = order.iter().enumerate().map(|(p, &v)| (v, p)).collect();
    let batch_size = batch::batch_of(graph).unwrap_or(0);
    let bcx = batch::Context {
        graph,
        dynamic: &dynamic,
        users: &users,
        outputs: &outputs,
        pos: &pos,
        batch: batch_size,
    };
    // Only where the batch has as many sequences as parts asked for: a few long
    // sequences go through their MLPs in parts of their tokens instead.
    let batch_regions = if batch_parts_allowed && batch_size >= chunks {
        batch_regions_of(&bcx, &order, &mut in_region, &mut report)
    } else {
        Vec::new()
    };
    let batch_parts = chunks;
    if !batch_regions.is_empty() {
        report.batch_parts = batch_parts;
    }
    let mut regions = Vec::new();
    for &id in &order {
        if let Some(r) = region_at(graph, id, chunks, &dynamic, &users, &outputs, &in_region) {
            for &m in &r.nodes {
                in_region[m.index()] = true;
            }
            regions.push(r);
        }
    }
    if regions.is_empty() && batch_regions.is_empty() {
        return Ok((graph.clone(), report));
    }
    if !regions.is_empty() {
        report.regions = regions.len();
        report.chunks = chunks;
    }
    let end_of: std::collections::HashMap<NodeId, usize> =
        regions.iter().enumerate().map(|(i, r)| (r.end, i)).collect();
    let batch_end_of: std::collections::HashMap<NodeId, usize> =
        batch_regions.iter().enumerate().map(|(i, r)| (r.end, i)).collect();
    let mut in_batch = vec![false; n];
    for r in &batch_regions {
        for &m in &r.nodes {
            in_batch[m.index()] = true;
        }
    }
    let mut parts_of: std::collections::HashMap<NodeId, Vec<NodeId>> = std::collections::HashMap::new();
    let mut out = Graph::new();
    let mut map: Vec<Option<NodeId>> = vec![None; n];
    for &id in &order {
        if let Some(&r) = batch_end_of.get(&id) {
            let region = &batch_regions[r];
            let mut parts = Vec::with_capacity(batch_parts);
            for c in 0..batch_parts {
                let blocks = part_rows(batch_size, batch_parts, c);
                parts.push(batch::emit_part(&bcx, &mut out, (&map, &parts_of), region, blocks, c)?);
            }
            // The whole value only where something outside the batch regions reads it
            // (a region reads the parts).
            if outputs[id.index()] || users[id.index()].iter().any(|u| !in_batch[u.index()]) {
                let name = graph.node(id).name.as_ref().map(|s| format!("{s}/parts"));
                map[id.index()] = Some(out.add(Op::Concat { axis: 0 }, parts.clone(), name)?);
            }
            parts_of.insert(id, parts);
            continue;
        }
        if let Some(&r) = end_of.get(&id) {
            let region = &regions[r];
            let mut views = std::collections::HashMap::new();
            let mut parts = Vec::with_capacity(chunks);
            for c in 0..chunks {
                parts.push(emit_part(graph, &mut out, &map, &mut views, region, c, chunks)?);
            }
            let name = graph.node(id).name.as_ref().map(|s| format!("{s}/chunks"));
            let mut joined = out.add(Op::Concat { axis: 0 }, parts, name.clone())?;
            if graph.node(id).ty.shape.rank() != 2 {
                let shape = graph.node(id).ty.shape.clone();
                joined = out.add(Op::Reshape { shape }, vec![joined], name)?;
            }
            map[id.index()] = Some(joined);
            continue;
        }
        if in_region[id.index()] {
            continue;
        }
        let node = graph.node(id);
        let inputs = node
            .inputs
            .iter()
            .map(|&i| map[i.index()].expect("operands come first in topological order"))
            .collect();
        map[id.index()] = Some(out.push(Node { inputs, ..node.clone() }));
    }
    crate::train::remat::finish(graph, &mut out, &map);
    Ok((out, report))
}

/// The batch regions of the graph (attention blocks first, then MLPs, then what follows
/// the last to the output), marked in `in_region` and counted in `report`.
fn batch_regions_of(
    bcx: &batch::Context,
    order: &[NodeId],
    in_region: &mut [bool],
    report: &mut ChunkReport,
) -> Vec<batch::BatchRegion> {
    let graph = bcx.graph;
    let pos = bcx.pos;
    let mut batch_regions = Vec::new();
    // Attention blocks first (a grouped-query attention's key projection narrows
    // like a down projection), then MLPs.
    let attention = order
        .iter()
        .filter(|&&v| matches!(graph.node(v).op, Op::Attention { .. }));
    let rest = order
        .iter()
        .filter(|&&v| !matches!(graph.node(v).op, Op::Attention { .. }));
    for &id in attention.chain(rest) {
        if let Some(r) = batch::region_at(bcx, id, in_region) {
            for &m in &r.nodes {
                in_region[m.index()] = true;
            }
            match r.anchor {
                batch::Anchor::Attention => report.attention_blocks += 1,
                batch::Anchor::Mlp => report.batch_mlps += 1,
                batch::Anchor::Tail => {}
            }
            batch_regions.push(r);
        }
    }
    // What reads the last region's end on to the output (the final norm).
    let last = batch_regions.iter().max_by_key(|r| pos[&r.end]).map(|r| r.end);
    if let Some(r) = last.and_then(|e| batch::tail_at(bcx, e, in_region)) {
        for &m in &r.nodes {
            in_region[m.index()] = true;
        }
        report.tail = true;
        batch_regions.push(r);
    }
    batch_regions
}

/// A value as `[rows, width]`: the product of its leading dims and its last dim.
fn rows(graph: &Graph, id: NodeId) -> (usize, usize) {
    let d = graph.node(id).ty.shape.dims();
    match d.split_last() {
        Some((&w, lead)) if !lead.is_empty() => (lead.iter().product(), w),
        _ => (0, 0),
    }
}

/// A weight matmul: a 2-d input-independent right operand.
fn weight_matmul(graph: &Graph, id: NodeId, dynamic: &[bool]) -> bool {
    let node = graph.node(id);
    matches!(node.op, Op::MatMul)
        && node.inputs.len() == 2
        && dynamic[node.inputs[0].index()]
        && !dynamic[node.inputs[1].index()]
        && graph.node(node.inputs[1]).ty.shape.rank() == 2
}

/// Whether operand `k` of region node `v` is read whole by every part (a matmul's
/// weight) rather than split into rows.
fn whole(graph: &Graph, v: NodeId, k: usize) -> bool {
    matches!(graph.node(v).op, Op::MatMul) && k == 1
}

/// The region whose down projection is `id`, if it is one (see the module doc).
fn region_at(
    graph: &Graph,
    id: NodeId,
    chunks: usize,
    dynamic: &[bool],
    users: &[Vec<NodeId>],
    outputs: &[bool],
    taken: &[bool],
) -> Option<Region> {
    if !weight_matmul(graph, id, dynamic) || taken[id.index()] {
        return None;
    }
    let hidden = graph.node(id).inputs[0];
    let (tokens, width) = rows(graph, id);
    if rows(graph, hidden).1 <= width || tokens < chunks {
        return None;
    }
    // Back from the hidden: the region's nodes (besides `id` and what follows it).
    let mut nodes = vec![id];
    let mut stack = vec![hidden];
    let mut seen = std::collections::HashSet::new();
    let mut reached_matmul = false;
    while let Some(v) = stack.pop() {
        if !seen.insert(v) {
            continue;
        }
        let node = graph.node(v);
        let inside = dynamic[v.index()]
            && !taken[v.index()]
            && match &node.op {
                Op::Unary(_) | Op::Binary(_) | Op::Select | Op::Cast { .. } | Op::Reshape { .. } => true,
                Op::MatMul => weight_matmul(graph, v, dynamic),
                _ => false,
            };
        if !inside {
            // A value from outside: the MLP's input (split into rows) or a weight.
            continue;
        }
        reached_matmul |= matches!(node.op, Op::MatMul);
        nodes.push(v);
        if matches!(node.op, Op::MatMul) {
            continue;
        }
        stack.extend(node.inputs.iter().copied());
    }
    if !reached_matmul {
        return None;
    }
    // Forward from the down projection: elementwise ops (adding a bias, a residual)
    // and views, while each is the only reader.
    let mut end = id;
    while let [u] = users[end.index()][..] {
        let follows = !outputs[end.index()]
            && matches!(
                graph.node(u).op,
                Op::Unary(_) | Op::Binary(_) | Op::Select | Op::Cast { .. } | Op::Reshape { .. }
            );
        if !follows {
            break;
        }
        nodes.push(u);
        end = u;
    }
    let set: std::collections::HashSet<NodeId> = nodes.iter().copied().collect();
    for &v in &nodes {
        // Read only inside (but the end), no output; `tokens` rows; a reshape keeps the
        // width (it only regroups the rows).
        if v != end && (outputs[v.index()] || users[v.index()].iter().any(|u| !set.contains(u))) {
            return None;
        }
        let node = graph.node(v);
        if rows(graph, v).0 != tokens {
            return None;
        }
        for (k, &i) in node.inputs.iter().enumerate() {
            let ok = if whole(graph, v, k) {
                true
            } else {
                let (r, w) = rows(graph, i);
                r == tokens && (!matches!(node.op, Op::Reshape { .. }) || w == rows(graph, v).1)
            };
            if !ok {
                return None;
            }
        }
    }
    // Topological order within the region: operands first.
    let order = graph.topo_order().ok()?;
    let pos: std::collections::HashMap<NodeId, usize> = order.iter().enumerate().map(|(p, &v)| (v, p)).collect();
    nodes.sort_by_key(|v| pos[v]);
    Some(Region { nodes, end })
}

/// The first row and the row count of part `c` of `chunks` of `tokens` rows (the
/// first `tokens % chunks` parts take one row more).
fn part_rows(tokens: usize, chunks: usize, c: usize) -> (usize, usize) {
    let (q, r) = (tokens / chunks, tokens % chunks);
    (c * q + c.min(r), q + usize::from(c < r))
}

/// Part `c` of `chunks` of the region, every value as `[rows, width]`: values from
/// outside viewed so (once, in `views`) and sliced to the part's rows, reshapes inside
/// the region dropped (they only regroup rows), weights read whole.
#[allow(clippy::too_many_arguments)]
fn emit_part(
    graph: &Graph,
    out: &mut Graph,
    map: &[Option<NodeId>],
    views: &mut std::collections::HashMap<NodeId, NodeId>,
    region: &Region,
    c: usize,
    chunks: usize,
) -> Result<NodeId, GraphError> {
    let tokens = rows(graph, region.end).0;
    let (r0, len) = part_rows(tokens, chunks, c);
    let mut local: std::collections::HashMap<NodeId, NodeId> = std::collections::HashMap::new();
    let mut sliced: std::collections::HashMap<NodeId, NodeId> = std::collections::HashMap::new();
    let part_name = |v: NodeId| graph.node(v).name.as_ref().map(|s| format!("{s}/chunk{c}"));
    for &v in &region.nodes {
        let node = graph.node(v);
        let mut inputs = Vec::with_capacity(node.inputs.len());
        for (k, &i) in node.inputs.iter().enumerate() {
            if let Some(&x) = local.get(&i) {
                inputs.push(x);
                continue;
            }
            let outer = map[i.index()].expect("operands come first in topological order");
            if whole(graph, v, k) {
                inputs.push(outer);
                continue;
            }
            if let Some(&x) = sliced.get(&i) {
                inputs.push(x);
                continue;
            }
            let (r, w) = rows(graph, i);
            let flat = match views.get(&i) {
                Some(&f) => f,
                None => {
                    let f = if graph.node(i).ty.shape.rank() == 2 {
                        outer
                    } else {
                        let name = graph.node(i).name.as_ref().map(|s| format!("{s}/rows"));
                        out.add(
                            Op::Reshape {
                                shape: Shape::new(vec![r, w]),
                            },
                            vec![outer],
                            name,
                        )?
                    };
                    views.insert(i, f);
                    f
                }
            };
            let ranges = vec![
                SliceRange {
                    start: r0 as i64,
                    end: (r0 + len) as i64,
                    step: 1,
                },
                SliceRange::full(),
            ];
            let x = out.add(Op::Slice { ranges }, vec![flat], part_name(i))?;
            sliced.insert(i, x);
            inputs.push(x);
        }
        let x = match node.op {
            Op::Reshape { .. } => inputs[0],
            _ => out.add(node.op.clone(), inputs, part_name(v))?,
        };
        local.insert(v, x);
    }
    Ok(local[&region.end])
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use graphc_ir::{interpret, BinaryOp, DType, Graph, GraphBuilder, Tensor, TensorType, UnaryOp};

    use super::*;

    fn weight<'b>(b: &'b GraphBuilder, name: &str, dims: &[usize], seed: u64) -> graphc_ir::Value<'b> {
        let ty = TensorType::new(DType::F32, dims.to_vec());
        b.param(name, Tensor::randn(&ty, 0.3, seed))
    }

    /// GPT-2's MLP as exported: tokens flattened for the GEMMs, `[batch, seq, 4d]` for
    /// the GELU, the bias adds, and the residual after the down projection; and a
    /// SwiGLU MLP (Llama's: two up projections, `silu(gate) * up`).
    fn model(swiglu: bool) -> Graph {
        let (bt, s, d, h) = (4, 6, 16, 64);
        let b = GraphBuilder::new();
        let x = b.input("x", DType::F32, [bt, s, d]);
        let flat = x.reshape([bt * s, d]);
        let hidden = if swiglu {
            let gate = flat.matmul(weight(&b, "wg", &[d, h], 1));
            let up = flat.matmul(weight(&b, "wu", &[d, h], 2));
            gate.unary(UnaryOp::Silu).binary(BinaryOp::Mul, up)
        } else {
            let up = flat.matmul(weight(&b, "w1", &[d, h], 1)) + weight(&b, "b1", &[h], 2);
            up.reshape([bt, s, h]).unary(UnaryOp::GeluTanh).reshape([bt * s, h])
        };
        let down = hidden.matmul(weight(&b, "w2", &[h, d], 3)) + weight(&b, "b2", &[d], 4);
        b.output("y", down.reshape([bt, s, d]) + x);
        b.finish().unwrap()
    }

    fn run(g: &Graph) -> Vec<f64> {
        let x = Tensor::randn(&TensorType::new(DType::F32, vec![4, 6, 16]), 1.0, 7);
        let out = interpret(g, &HashMap::from([("x".to_string(), x)])).unwrap();
        out[0].1.to_f64_vec()
    }

    /// Both MLPs run in 2 to 7 parts give the same values bit for bit, with one
    /// `concat` and a set of projections per part: up to 4 parts, parts of the batch of
    /// 4 (3: of 2, 1 and 1 sequences); 5 and 7, parts of the 24 tokens (of unequal rows,
    /// crossing the sequences of 6). More parts than tokens leave the graph whole.
    #[test]
    fn mlps_run_in_parts_give_the_same_values() {
        for swiglu in [false, true] {
            let g = model(swiglu);
            let want = run(&g);
            for chunks in [2, 3, 4, 5, 7] {
                let (c, report) = chunk_mlps(&g, chunks).unwrap();
                c.verify().unwrap();
                let expect = if chunks <= 4 {
                    ChunkReport {
                        batch_mlps: 1,
                        batch_parts: chunks,
                        ..Default::default()
                    }
                } else {
                    ChunkReport {
                        regions: 1,
                        chunks,
                        ..Default::default()
                    }
                };
                assert_eq!(report, expect, "swiglu {swiglu}");
                let count = |f: &dyn Fn(&Op) -> bool| c.nodes().iter().filter(|n| f(&n.op)).count();
                assert_eq!(count(&|o| matches!(o, Op::Concat { .. })), 1);
                let matmuls = if swiglu { 3 } else { 2 };
                assert_eq!(count(&|o| matches!(o, Op::MatMul)), matmuls * chunks);
                assert_eq!(run(&c), want, "swiglu {swiglu}, {chunks} parts");
            }
            let (c, report) = chunk_mlps(&g, 25).unwrap();
            assert!(!report.any());
            assert_eq!(c.len(), g.len());
        }
    }

    /// A hidden value read outside the MLP (kept for something else) keeps it whole.
    #[test]
    fn a_hidden_read_elsewhere_is_not_split() {
        let b = GraphBuilder::new();
        let x = b.input("x", DType::F32, [8, 16]);
        let h = x.matmul(weight(&b, "w1", &[16, 64], 1)).unary(UnaryOp::GeluTanh);
        b.output("y", h.matmul(weight(&b, "w2", &[64, 16], 2)));
        b.output("h", h);
        let g = b.finish().unwrap();
        assert_eq!(chunk_mlps(&g, 2).unwrap().1.regions, 0);
    }
}
