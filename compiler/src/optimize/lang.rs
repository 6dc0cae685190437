//! The e-graph language: one e-node per IR op, attributes included in the operator.
//!
//! Attributes make the operator set open-ended (a reshape to every shape is its own
//! operator), so an operator is an [`Op`] with a canonical byte key that gives it the
//! total order and hash egg needs.

use std::cmp::Ordering;
use std::fmt;
use std::hash::{Hash, Hasher};
use std::sync::Arc;

use egg::{Id, Language};
use graphc_ir::Op;

/// An operator: the IR op and its canonical key (its JSON form).
#[derive(Debug)]
pub struct OpKey {
    pub op: Op,
    key: Vec<u8>,
}

impl OpKey {
    /// A constant is keyed by its type and content hash (computed once per tensor), not
    /// its bytes: a weight-sized constant costs the e-graph 50-odd bytes of key.
    pub fn new(op: Op) -> Arc<OpKey> {
        let key = match &op {
            Op::Constant { value } => {
                format!("{{\"constant\":\"{}:{:032x}\"}}", value.ty(), value.content_hash()).into_bytes()
            }
            _ => serde_json::to_vec(&op).expect("ops serialize"),
        };
        Arc::new(OpKey { op, key })
    }
}

/// An e-node: an operator applied to e-classes.
#[derive(Clone, Debug)]
pub struct TNode {
    pub op: Arc<OpKey>,
    pub children: Vec<Id>,
}

impl TNode {
    pub fn new(op: Op, children: Vec<Id>) -> TNode {
        TNode {
            op: OpKey::new(op),
            children,
        }
    }

    pub fn op(&self) -> &Op {
        &self.op.op
    }
}

impl PartialEq for TNode {
    fn eq(&self, other: &TNode) -> bool {
        self.children == other.children && (Arc::ptr_eq(&self.op, &other.op) || self.op.key == other.op.key)
    }
}

impl Eq for TNode {}

impl PartialOrd for TNode {
    fn partial_cmp(&self, other: &TNode) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for TNode {
    fn cmp(&self, other: &TNode) -> Ordering {
        self.op
            .key
            .cmp(&other.op.key)
            .then_with(|| self.children.cmp(&other.children))
    }
}

impl Hash for TNode {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.op.key.hash(state);
        self.children.hash(state);
    }
}

impl Language for TNode {
    type Discriminant = Vec<u8>;

    fn discriminant(&self) -> Vec<u8> {
        self.op.key.clone()
    }

    fn matches(&self, other: &TNode) -> bool {
        self.op.key == other.op.key && self.children.len() == other.children.len()
    }

    fn children(&self) -> &[Id] {
        &self.children
    }

    fn children_mut(&mut self) -> &mut [Id] {
        &mut self.children
    }
}

impl fmt::Display for TNode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.op.op.name())
    }
}
