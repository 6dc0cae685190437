//! Batch normalization ([`Op::BatchNorm`]) lowered to primitives before the optimizer:
//!
//! - **Inference**: a per-channel affine map `x * s + t`, `s = scale / sqrt(var + eps)`,
//!   `t = bias - mean * s`; folding computes `s` and `t` once from the weights, and the
//!   fuser puts the map in the preceding convolution's epilogue.
//! - **Training** (`torch.nn.BatchNorm*` in `train()` mode): the batch's own statistics
//!   over every axis but the channels (the variance biased), the running statistics
//!   updated as state: `running = running * momentum + batch * (1 - momentum)` with
//!   ONNX's momentum (PyTorch's `1 - momentum`), the variance there unbiased
//!   (`* count / (count - 1)`). Each running statistic that is a weight becomes a
//!   [`StateClass::Statistics`] slot: an input of the step and an output of the same
//!   name (a statistic that is not a weight is read, never updated).

use std::collections::HashMap;

use graphc_ir::{Graph, GraphBuilder, GraphError, Node, NodeId, Op, ReduceOp, Shape, Value};

use crate::train::{Init, State, StateClass, StateSlot};

/// Whether the graph has a batch normalization to lower.
pub fn has_batch_norm(graph: &Graph) -> bool {
    graph.nodes().iter().any(|n| matches!(n.op, Op::BatchNorm { .. }))
}

/// `v` `[c]` reshaped to `[c, 1, ..]` and broadcast over `x`'s shape (the form the
/// precision pass knows as per-channel: `passes::precision`).
fn per_channel<'b>(v: Value<'b>, x: &Shape) -> Value<'b> {
    let mut along = vec![v.shape().dims()[0]];
    along.extend(std::iter::repeat_n(1, x.rank() - 2));
    v.reshape(along).broadcast_to(x)
}

/// The inference form.
pub fn lower_for_inference(graph: &Graph) -> Result<Graph, GraphError> {
    rebuild(graph, |_, _, epsilon, _, a| {
        let [x, scale, bias, mean, var] = a;
        let s = scale * (var + epsilon).rsqrt();
        let t = bias - mean * s;
        let shape = x.shape();
        Ok(x * per_channel(s, &shape) + per_channel(t, &shape))
    })
}

/// The training form; the running statistics that are weights become state slots of
/// `state` (after its parameters) and outputs of the graph.
pub fn lower_for_training(graph: &Graph, state: &mut State) -> Result<Graph, GraphError> {
    let graph = statistics_as_state(graph, state)?;
    let mut updates: Vec<(String, NodeId)> = Vec::new();
    let mut out = rebuild(&graph, |b, _, epsilon, momentum, a| {
        let [x, scale, bias, mean, var] = a;
        let shape = x.shape();
        let axes: Vec<i64> = std::iter::once(0).chain(2..shape.rank() as i64).collect();
        let count = shape.numel() / shape.dims()[1].max(1);
        let batch_mean = x.reduce(ReduceOp::Mean, &axes, false);
        let centered = x - per_channel(batch_mean, &shape);
        let batch_var = (centered * centered).reduce(ReduceOp::Mean, &axes, false);
        // The map per element is `x * s + t` with per-channel `s` and `t` (as for
        // inference): in a low precision the per-channel values are cast down and the
        // output stored in the low type, as autocast's batch norm gives it.
        let s = scale * (batch_var + epsilon).rsqrt();
        let t = bias - batch_mean * s;
        let y = x * per_channel(s, &shape) + per_channel(t, &shape);
        let unbias = count as f64 / (count.max(2) - 1) as f64;
        for (running, batch, factor) in [(mean, batch_mean, 1.0), (var, batch_var, unbias)] {
            let name = b.with_graph(|g| match &g.node(running.id()).op {
                Op::Input { name, .. } => Some(name.clone()),
                _ => None,
            });
            if let Some(name) = name {
                let next = running * momentum + batch * (factor * (1.0 - momentum));
                updates.push((name, next.id()));
            }
        }
        Ok(y)
    })?;
    for (name, id) in updates {
        out.add_output(name, id);
    }
    out.verify()?;
    Ok(out)
}

/// Running statistics as state: every weight a batch norm reads as its mean or
/// variance becomes an input bound by its name and a state slot (its initial value
/// the weight).
fn statistics_as_state(graph: &Graph, state: &mut State) -> Result<Graph, GraphError> {
    let mut stats = std::collections::BTreeSet::new();
    for n in graph.nodes() {
        if let (Op::BatchNorm { .. }, [_, _, _, m, v]) = (&n.op, n.inputs.as_slice()) {
            for id in [*m, *v] {
                if let Op::Parameter { name, .. } = &graph.node(id).op {
                    stats.insert(name.clone());
                }
            }
        }
    }
    let mut out = Graph::new();
    for node in graph.nodes() {
        let mut node = node.clone();
        if let Op::Parameter { name, ty } = &node.op {
            if stats.contains(name) && state.get(name).is_none() {
                let init = graph
                    .weight(name)
                    .cloned()
                    .ok_or_else(|| GraphError::Graph(format!("running statistic \"{name}\" has no weight data")))?;
                state.slots.push(StateSlot {
                    name: name.clone(),
                    class: StateClass::Statistics,
                    init: Init::Value(init),
                });
                node = Node {
                    op: Op::Input {
                        name: name.clone(),
                        ty: ty.clone(),
                    },
                    ..node
                };
            }
        }
        out.push(node);
    }
    for o in graph.outputs() {
        out.add_output(o.name.clone(), o.node);
    }
    for (name, w) in graph.weights() {
        if !stats.contains(name) {
            out.set_weight(name.clone(), w.clone());
        }
    }
    let mut order: Vec<NodeId> = graph.inputs().to_vec();
    order.extend(out.inputs().iter().filter(|i| !graph.inputs().contains(i)));
    out.set_input_order(order);
    out.verify()?;
    Ok(out)
}

type Lowering<'f> =
    dyn for<'b> FnMut(&'b GraphBuilder, &Node, f64, f64, [Value<'b>; 5]) -> Result<Value<'b>, GraphError> + 'f;

/// A copy of `graph` with every batch norm replaced by `lower`'s value (nodes keep
/// their names, inputs their order, weights their data).
fn rebuild(
    graph: &Graph,
    mut lower: impl for<'b> FnMut(&'b GraphBuilder, &Node, f64, f64, [Value<'b>; 5]) -> Result<Value<'b>, GraphError>,
) -> Result<Graph, GraphError> {
    let lower: &mut Lowering = &mut lower;
    let b = GraphBuilder::new();
    let mut map: Vec<NodeId> = Vec::with_capacity(graph.len());
    let mut names: HashMap<NodeId, String> = HashMap::new();
    for node in graph.nodes() {
        let operands: Vec<Value> = node
            .inputs
            .iter()
            .map(|i| {
                b.value(map[i.index()])
                    .ok_or_else(|| GraphError::Graph(format!("{i} is not a node")))
            })
            .collect::<Result<_, _>>()?;
        let v = match (&node.op, <[Value; 5]>::try_from(operands.clone())) {
            (Op::BatchNorm { epsilon, momentum }, Ok(a)) => lower(&b, node, *epsilon, *momentum, a)?,
            _ => b.add_op(node.op.clone(), &operands),
        };
        if let Some(n) = &node.name {
            names.insert(v.id(), n.clone());
        }
        map.push(v.id());
    }
    let (mut out, err) = b.into_parts();
    if let Some(e) = err {
        return Err(e);
    }
    for (id, n) in names {
        out.set_name(id, n);
    }
    for o in graph.outputs() {
        out.add_output(o.name.clone(), map[o.node.index()]);
    }
    for (name, w) in graph.weights() {
        out.set_weight(name.clone(), w.clone());
    }
    out.set_input_order(graph.inputs().iter().map(|i| map[i.index()]).collect());
    Ok(out)
}
