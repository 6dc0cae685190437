//! The graph: a table of nodes, each defining one value, plus inputs, outputs and weights.

use petgraph::graph::DiGraph;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fmt;

use crate::infer::infer_type;
use crate::{Op, Tensor, TensorType};

/// A node, and the one value it defines. A u32 index into [`Graph::nodes`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct NodeId(pub u32);

impl NodeId {
    pub fn index(self) -> usize {
        self.0 as usize
    }
}

impl fmt::Display for NodeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "%{}", self.0)
    }
}

/// One operation applied to earlier values. `ty` is the type of the value it defines;
/// the verifier checks it against [`infer_type`].
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Node {
    pub op: Op,
    pub inputs: Vec<NodeId>,
    pub ty: TensorType,
    /// A name for people (from the builder or the front end); not semantic, except that
    /// inputs and parameters are bound by the name inside their op.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
}

/// A named graph output.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Output {
    pub name: String,
    pub node: NodeId,
}

/// A tensor program: nodes in a table (any order; the verifier checks it is acyclic),
/// the input nodes in call order, named outputs, and the data of parameters by name.
///
/// A parameter without an entry in `weights` is allowed (a graph printed without its
/// weights); the interpreter then reports it missing.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Graph {
    nodes: Vec<Node>,
    inputs: Vec<NodeId>,
    outputs: Vec<Output>,
    weights: BTreeMap<String, Tensor>,
}

/// An error in a graph, naming the node it is about.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum GraphError {
    #[error("node {node} ({op}{name}): {message}")]
    Node {
        node: NodeId,
        op: String,
        name: String,
        message: String,
    },
    #[error("{0}")]
    Graph(String),
}

impl GraphError {
    pub(crate) fn at(graph: &Graph, id: NodeId, message: impl Into<String>) -> GraphError {
        let (op, name) = match graph.nodes.get(id.index()) {
            Some(n) => (
                n.op.name().to_string(),
                n.name.as_ref().map(|s| format!(" \"{s}\"")).unwrap_or_default(),
            ),
            None => ("?".to_string(), String::new()),
        };
        GraphError::Node {
            node: id,
            op,
            name,
            message: message.into(),
        }
    }
}

impl Graph {
    pub fn new() -> Graph {
        Graph::default()
    }

    /// Append a node, inferring its type from its operands. Input ops are appended to
    /// the input list. Fails when an operand does not exist or the types do not fit.
    pub fn add(&mut self, op: Op, inputs: Vec<NodeId>, name: Option<String>) -> Result<NodeId, GraphError> {
        let id = NodeId(self.nodes.len() as u32);
        crate::work::add_len(crate::work::Stage::Graph, 1 + inputs.len());
        let mut tys = Vec::with_capacity(inputs.len());
        for &i in &inputs {
            match self.nodes.get(i.index()) {
                Some(n) => tys.push(&n.ty),
                None => {
                    return Err(GraphError::Node {
                        node: id,
                        op: op.name().into(),
                        name: String::new(),
                        message: format!("operand {i} does not exist"),
                    })
                }
            }
        }
        let ty = infer_type(&op, &tys).map_err(|message| GraphError::Node {
            node: id,
            op: op.name().into(),
            name: name.as_ref().map(|s| format!(" \"{s}\"")).unwrap_or_default(),
            message,
        })?;
        Ok(self.push(Node { op, inputs, ty, name }))
    }

    /// Append a node as given, unchecked (for parsers and deserializers, which verify
    /// afterwards). Input ops are appended to the input list.
    pub fn push(&mut self, node: Node) -> NodeId {
        let id = NodeId(self.nodes.len() as u32);
        if matches!(node.op, Op::Input { .. }) {
            self.inputs.push(id);
        }
        self.nodes.push(node);
        id
    }

    /// Add a parameter node with its data.
    pub fn add_parameter(&mut self, name: &str, value: Tensor) -> NodeId {
        let ty = value.ty();
        self.weights.insert(name.to_string(), value);
        self.push(Node {
            op: Op::Parameter {
                name: name.to_string(),
                ty: ty.clone(),
            },
            inputs: vec![],
            ty,
            name: None,
        })
    }

    /// Replace the output list.
    pub fn set_outputs(&mut self, outputs: Vec<Output>) {
        self.outputs = outputs;
    }

    pub fn add_output(&mut self, name: impl Into<String>, node: NodeId) {
        self.outputs.push(Output {
            name: name.into(),
            node,
        });
    }

    /// The node `id`.
    ///
    /// # Panics
    ///
    /// When `id` is not a node of this graph, as slice indexing does; [`Graph::get`] is
    /// the checked form, for ids not yet verified.
    // reason: a panicking accessor like `[]`, for ids taken from this graph (its table,
    // or the operands and outputs of a verified graph).
    #[allow(clippy::indexing_slicing)]
    pub fn node(&self, id: NodeId) -> &Node {
        &self.nodes[id.index()]
    }

    pub fn get(&self, id: NodeId) -> Option<&Node> {
        self.nodes.get(id.index())
    }

    pub fn nodes(&self) -> &[Node] {
        &self.nodes
    }

    pub fn ids(&self) -> impl Iterator<Item = NodeId> {
        (0..self.nodes.len() as u32).map(NodeId)
    }

    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    pub fn inputs(&self) -> &[NodeId] {
        &self.inputs
    }

    pub fn outputs(&self) -> &[Output] {
        &self.outputs
    }

    pub fn weights(&self) -> &BTreeMap<String, Tensor> {
        &self.weights
    }

    pub fn weight(&self, name: &str) -> Option<&Tensor> {
        self.weights.get(name)
    }

    /// Set or replace the data of a parameter.
    pub fn set_weight(&mut self, name: impl Into<String>, value: Tensor) {
        self.weights.insert(name.into(), value);
    }

    /// The graph with its weights' data taken out (the parameters stay: a graph
    /// printed or serialized without its weights), and those weights.
    pub fn split_weights(&self) -> (Graph, BTreeMap<String, Tensor>) {
        let structure = Graph {
            nodes: self.nodes.clone(),
            inputs: self.inputs.clone(),
            outputs: self.outputs.clone(),
            weights: BTreeMap::new(),
        };
        (structure, self.weights.clone())
    }

    /// The name an input node is bound by.
    pub fn input_name(&self, id: NodeId) -> Option<&str> {
        match &self.node(id).op {
            Op::Input { name, .. } => Some(name),
            _ => None,
        }
    }

    /// Parameter nodes, in table order.
    pub fn parameters(&self) -> impl Iterator<Item = (NodeId, &str, &TensorType)> {
        self.ids().filter_map(|id| match &self.node(id).op {
            Op::Parameter { name, ty } => Some((id, name.as_str(), ty)),
            _ => None,
        })
    }

    /// Total bytes of weight data.
    pub fn weights_bytes(&self) -> usize {
        self.weights.values().map(|t| t.ty().size_bytes()).sum()
    }

    /// The dependency graph (edge operand -> user), for petgraph's algorithms.
    /// Node indices equal [`NodeId`] indices. Operands that do not exist are skipped.
    pub fn to_petgraph(&self) -> DiGraph<NodeId, ()> {
        let mut g = DiGraph::with_capacity(self.nodes.len(), self.nodes.len() * 2);
        for id in self.ids() {
            g.add_node(id);
        }
        for (id, n) in self.ids().zip(&self.nodes) {
            for &i in &n.inputs {
                if i.index() < self.nodes.len() {
                    g.add_edge(
                        petgraph::graph::NodeIndex::new(i.index()),
                        petgraph::graph::NodeIndex::new(id.index()),
                        (),
                    );
                }
            }
        }
        g
    }

    /// All nodes, operands before users. Fails naming a node on a cycle.
    pub fn topo_order(&self) -> Result<Vec<NodeId>, GraphError> {
        petgraph::algo::toposort(&self.to_petgraph(), None)
            .map(|order| order.into_iter().map(|i| NodeId(i.index() as u32)).collect())
            .map_err(|cycle| {
                let id = NodeId(cycle.node_id().index() as u32);
                GraphError::at(self, id, "is on a cycle")
            })
    }

    /// The canonical order: inputs in call order, then a depth-first post-order from the
    /// outputs (operands in order), then nodes no output reaches, in table order.
    /// Adding a node elsewhere does not move the ones that do not depend on it.
    /// The graph must be acyclic with valid operands.
    pub fn canonical_order(&self) -> Vec<NodeId> {
        let n = self.nodes.len();
        let mut placed = vec![false; n];
        // Marks `id` placed; false when it already was, or is not a node of this graph.
        let mut place = |id: NodeId| match placed.get_mut(id.index()) {
            Some(p) if !*p => {
                *p = true;
                true
            }
            _ => false,
        };
        let mut order = Vec::with_capacity(n);
        for &i in &self.inputs {
            if place(i) {
                order.push(i);
            }
        }
        let roots = self.outputs.iter().map(|o| o.node).chain(self.ids());
        for root in roots {
            if !place(root) {
                continue;
            }
            // Iterative post-order DFS: (node, next operand to visit).
            let mut stack = vec![(root, 0usize)];
            while let Some(&mut (id, ref mut next)) = stack.last_mut() {
                let inputs = self.nodes.get(id.index()).map_or(&[][..], |node| &node.inputs);
                if let Some(&operand) = inputs.get(*next) {
                    *next += 1;
                    if place(operand) {
                        stack.push((operand, 0));
                    }
                } else {
                    order.push(id);
                    stack.pop();
                }
            }
        }
        order
    }

    /// The same graph with nodes renumbered in [`Graph::canonical_order`]. Two graphs
    /// that differ only in numbering canonicalize to equal values.
    pub fn canonicalize(&self) -> Graph {
        let order = self.canonical_order();
        let mut new_id = vec![NodeId(u32::MAX); self.nodes.len()];
        for (i, &old) in order.iter().enumerate() {
            if let Some(slot) = new_id.get_mut(old.index()) {
                *slot = NodeId(i as u32);
            }
        }
        let remap = |id: NodeId| new_id.get(id.index()).copied().unwrap_or(id);
        Graph {
            nodes: order
                .iter()
                .filter_map(|&old| self.nodes.get(old.index()))
                .map(|node| {
                    let mut node = node.clone();
                    node.inputs = node.inputs.iter().map(|&i| remap(i)).collect();
                    node
                })
                .collect(),
            inputs: self.inputs.iter().map(|&i| remap(i)).collect(),
            outputs: self
                .outputs
                .iter()
                .map(|o| Output {
                    name: o.name.clone(),
                    node: remap(o.node),
                })
                .collect(),
            weights: self.weights.clone(),
        }
    }

    /// Users of each node, indexed by node: each user once, in increasing id order.
    pub fn users(&self) -> Vec<Vec<NodeId>> {
        let mut users = vec![Vec::new(); self.nodes.len()];
        for (id, n) in self.ids().zip(&self.nodes) {
            crate::work::add_len(crate::work::Stage::Graph, 1 + n.inputs.len());
            for &i in &n.inputs {
                if let Some(u) = users.get_mut(i.index()) {
                    // Users are visited in id order, so a user already listed (an
                    // operand named twice, `x + x`) is the last one: no scan of the list,
                    // which for a value read 100k times was quadratic.
                    if u.last() != Some(&id) {
                        u.push(id);
                    }
                }
            }
        }
        users
    }

    /// The graph as JSON (weights included, exactly).
    // reason: serde_json fails only on map keys that are not strings or a Serialize impl
    // that errs; a graph's maps are keyed by String and none of its impls err.
    #[allow(clippy::expect_used)]
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).expect("a graph always serializes")
    }

    /// A graph from JSON, verified.
    pub fn from_json(s: &str) -> Result<Graph, GraphError> {
        let g: Graph = serde_json::from_str(s).map_err(|e| GraphError::Graph(format!("graph JSON: {e}")))?;
        g.verify()?;
        Ok(g)
    }
}

impl Graph {
    /// Set a node's human-readable name.
    pub fn set_name(&mut self, id: NodeId, name: impl Into<String>) {
        if let Some(n) = self.nodes.get_mut(id.index()) {
            n.name = Some(name.into());
        }
    }
}

impl Graph {
    /// Reorder the input list (a permutation of the current input nodes).
    pub fn set_input_order(&mut self, order: Vec<NodeId>) {
        debug_assert_eq!(
            {
                let mut a = order.clone();
                a.sort();
                a
            },
            {
                let mut b = self.inputs.clone();
                b.sort();
                b
            }
        );
        self.inputs = order;
    }
}

impl Graph {
    /// Turn a node into a constant of its (known) value, keeping its name. The value
    /// must have the node's type.
    pub fn replace_with_constant(&mut self, id: NodeId, value: Tensor) {
        if let Some(n) = self.nodes.get_mut(id.index()) {
            debug_assert_eq!(n.ty, value.ty());
            n.op = Op::Constant { value };
            n.inputs.clear();
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::{DType, GraphBuilder, NodeId};

    /// A node that names an operand twice (`x + x`) is one user of it; users come in id
    /// order, and listing them is one step per operand however often a value is read.
    #[test]
    fn users_lists_each_user_once_in_id_order() {
        let b = GraphBuilder::new();
        let x = b.input("x", DType::F32, [4]);
        let mut acc = x + x;
        for _ in 0..1000 {
            acc = acc + x;
        }
        b.output("y", acc * acc);
        let g = b.finish().unwrap();
        let (users, work) = crate::work::measure(|| g.users());
        let x_users = &users[0];
        assert_eq!(x_users.len(), 1001);
        assert!(x_users.windows(2).all(|w| w[0] < w[1]));
        let square = NodeId((g.len() - 1) as u32);
        assert_eq!(users[g.len() - 2], vec![square], "acc * acc reads acc once");
        assert!(work.total() <= 3 * g.len() as u64, "{work}");
    }
}
