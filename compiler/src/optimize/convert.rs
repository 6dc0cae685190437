//! Graph to e-graph and back.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use egg::Id;
use graphc_ir::{Graph, GraphError, Node, NodeId, Op, Tensor};

use super::analysis::TEGraph;
use super::lang::TNode;

/// Why the optimizer failed: the graph going in or out does not verify, or extraction
/// gave no graph (a bug of the extractor).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum OptimizeError {
    #[error(transparent)]
    Graph(#[from] GraphError),
    #[error("extraction chose no node for e-class {class}")]
    NoChoice { class: usize },
    #[error("extraction of e-class {class} is cyclic")]
    Cyclic { class: usize },
}

/// Add every node of `graph` to `eg`; returns the class of each node (by node index).
pub fn to_egraph(graph: &Graph, eg: &mut TEGraph) -> Result<Vec<Id>, OptimizeError> {
    let mut class = vec![Id::from(0usize); graph.len()];
    for id in graph.topo_order()? {
        let node = graph.node(id);
        graphc_ir::work::add_len(graphc_ir::work::Stage::Optimize, 1 + node.inputs.len());
        let children = node.inputs.iter().map(|i| class[i.index()]).collect();
        class[id.index()] = eg.add(TNode::new(node.op.clone(), children));
    }
    Ok(class)
}

/// Build the graph of the chosen nodes reachable from the outputs, keeping every graph
/// input (in order), the output names, node names where a class kept one, and the
/// weights of the parameters still used.
pub fn from_egraph(
    original: &Graph,
    classes: &[Id],
    eg: &TEGraph,
    chosen: &HashMap<Id, TNode>,
    folded_weights: &BTreeMap<String, Arc<Tensor>>,
) -> Result<Graph, OptimizeError> {
    let mut names: HashMap<Id, &str> = HashMap::new();
    for (i, n) in original.nodes().iter().enumerate() {
        if let Some(name) = &n.name {
            names.entry(eg.find(classes[i])).or_insert(name);
        }
    }
    let mut out = Graph::new();
    let mut built: HashMap<Id, NodeId> = HashMap::new();
    let build = |root: Id, out: &mut Graph, built: &mut HashMap<Id, NodeId>| -> Result<NodeId, OptimizeError> {
        let root = eg.find(root);
        // Iterative post-order: (class, children pushed?).
        let mut stack = vec![(root, false)];
        while let Some((c, expanded)) = stack.pop() {
            graphc_ir::work::add(graphc_ir::work::Stage::Optimize, 1);
            if built.contains_key(&c) {
                continue;
            }
            let node = chosen
                .get(&c)
                .ok_or(OptimizeError::NoChoice { class: usize::from(c) })?;
            if !expanded {
                stack.push((c, true));
                for &k in node.children.iter().rev() {
                    let k = eg.find(k);
                    if !built.contains_key(&k) {
                        stack.push((k, false));
                    }
                }
                continue;
            }
            let inputs = node
                .children
                .iter()
                .map(|&k| built.get(&eg.find(k)).copied())
                .collect::<Option<Vec<_>>>()
                .ok_or(OptimizeError::Cyclic { class: usize::from(c) })?;
            let id = out.push(Node {
                op: node.op().clone(),
                inputs,
                ty: eg[c].data.ty.clone(),
                name: names.get(&c).map(|s| s.to_string()),
            });
            built.insert(c, id);
        }
        Ok(built[&root])
    };
    for &i in original.inputs() {
        build(classes[i.index()], &mut out, &mut built)?;
    }
    for o in original.outputs() {
        let id = build(classes[o.node.index()], &mut out, &mut built)?;
        out.add_output(o.name.clone(), id);
    }
    let used: Vec<String> = out
        .nodes()
        .iter()
        .filter_map(|n| match &n.op {
            Op::Parameter { name, .. } => Some(name.clone()),
            _ => None,
        })
        .collect();
    for name in used {
        if let Some(w) = original.weight(&name) {
            out.set_weight(name, w.clone());
        } else if let Some(w) = folded_weights.get(&name) {
            out.set_weight(name, (**w).clone());
        }
    }
    Ok(out)
}
