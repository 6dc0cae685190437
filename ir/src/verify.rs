//! The verifier: the rules every graph obeys between stages. Each error names the node.

use std::collections::BTreeSet;

use crate::infer::infer_type;
use crate::{Graph, GraphError, NodeId, Op};

impl Graph {
    /// Check operands exist, the graph is acyclic, every node's type is the one its op
    /// gives its operands, inputs/outputs/parameters are well formed and bound by unique
    /// names, and weight data matches its parameter's type.
    pub fn verify(&self) -> Result<(), GraphError> {
        for id in self.ids() {
            for &operand in &self.node(id).inputs {
                if self.get(operand).is_none() {
                    return Err(GraphError::at(self, id, format!("operand {operand} does not exist")));
                }
            }
        }
        let order = self.topo_order()?;
        for id in order {
            let node = self.node(id);
            // The operands checked above, then typed here: twice each, and the node.
            crate::work::add_len(crate::work::Stage::Graph, 1 + 2 * node.inputs.len());
            let tys: Vec<_> = node.inputs.iter().map(|&i| &self.node(i).ty).collect();
            let inferred = infer_type(&node.op, &tys).map_err(|m| GraphError::at(self, id, m))?;
            if inferred != node.ty {
                return Err(GraphError::at(
                    self,
                    id,
                    format!("declared type {} but the op gives {inferred}", node.ty),
                ));
            }
        }
        self.verify_bindings()
    }

    fn verify_bindings(&self) -> Result<(), GraphError> {
        let mut input_names = BTreeSet::new();
        let mut listed = BTreeSet::new();
        for &id in self.inputs() {
            let Some(node) = self.get(id) else {
                return Err(GraphError::Graph(format!(
                    "input list names {id}, which does not exist"
                )));
            };
            let Op::Input { name, .. } = &node.op else {
                return Err(GraphError::at(self, id, "is in the input list but is not an input"));
            };
            if !listed.insert(id) {
                return Err(GraphError::at(self, id, "is listed twice as an input"));
            }
            if !input_names.insert(name.as_str()) {
                return Err(GraphError::at(self, id, format!("input name \"{name}\" is used twice")));
            }
        }
        let mut param_names = BTreeSet::new();
        crate::work::add_len(crate::work::Stage::Graph, self.len() + self.outputs().len());
        for id in self.ids() {
            match &self.node(id).op {
                Op::Input { .. } if !listed.contains(&id) => {
                    return Err(GraphError::at(self, id, "input is missing from the graph's input list"));
                }
                Op::Parameter { name, ty } => {
                    if !param_names.insert(name.as_str()) {
                        return Err(GraphError::at(
                            self,
                            id,
                            format!("parameter name \"{name}\" is used twice"),
                        ));
                    }
                    if let Some(w) = self.weight(name) {
                        if &w.ty() != ty {
                            return Err(GraphError::at(
                                self,
                                id,
                                format!("weight data \"{name}\" is {} but the parameter is {ty}", w.ty()),
                            ));
                        }
                    }
                }
                _ => {}
            }
        }
        if let Some(name) = self.weights().keys().find(|k| !param_names.contains(k.as_str())) {
            return Err(GraphError::Graph(format!("weight \"{name}\" has no parameter node")));
        }
        let mut output_names = BTreeSet::new();
        for o in self.outputs() {
            if self.get(o.node).is_none() {
                return Err(GraphError::Graph(format!(
                    "output \"{}\" names {}, which does not exist",
                    o.name, o.node
                )));
            }
            if !output_names.insert(o.name.as_str()) {
                return Err(GraphError::Graph(format!("output name \"{}\" is used twice", o.name)));
            }
        }
        Ok(())
    }

    /// Verify in debug builds only (between passes).
    pub fn debug_verify(&self) {
        #[cfg(debug_assertions)]
        if let Err(e) = self.verify() {
            panic!("graph failed verification: {e}");
        }
    }
}

/// Ids of nodes on which `id` depends (transitively), including itself.
pub fn ancestors(graph: &Graph, id: NodeId) -> Vec<NodeId> {
    let mut seen = vec![false; graph.len()];
    let mut stack = vec![id];
    let mut out = Vec::new();
    while let Some(n) = stack.pop() {
        let Some(s) = seen.get_mut(n.index()) else { continue };
        if std::mem::replace(s, true) {
            continue;
        }
        out.push(n);
        stack.extend(graph.node(n).inputs.iter().copied());
    }
    out
}
