//! The reference interpreter: the meaning of every op, on the CPU.

use std::collections::HashMap;

use crate::{Graph, Op, Tensor, TensorType};

/// An error while interpreting, naming the node.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum InterpError {
    #[error("{0}")]
    Graph(#[from] crate::GraphError),
    #[error("input \"{0}\" is missing")]
    MissingInput(String),
}

/// Run `graph` on `inputs` (by input name); returns the outputs in order, by name.
pub fn interpret(_graph: &Graph, _inputs: &HashMap<String, Tensor>) -> Result<Vec<(String, Tensor)>, InterpError> {
    todo!("interpreter")
}

/// Evaluate one op on operand values; `ty` is the node's (verified) output type.
pub fn eval_op(_op: &Op, _args: &[&Tensor], _ty: &TensorType) -> Result<Tensor, String> {
    todo!("interpreter")
}
