//! ONNX operators, lowered to graphc primitives. One file per family; each exports a
//! table of `(op_type, lowering)`.

mod attention;
mod cnn;
mod elementwise;
mod linalg;
mod nn;
mod pad;
mod reduce;
mod shape;

use super::attrs::Attrs;
use super::import::Importer;
use super::proto::NodeProto;
use crate::Value;

/// One ONNX node being lowered: its operands (None for omitted optional ones), its
/// attributes and the opset in force.
pub struct Node<'a, 'b> {
    pub proto: &'a NodeProto,
    pub inputs: Vec<Option<Value<'b>>>,
    pub attrs: Attrs<'a>,
    pub opset: i64,
}

impl<'b> Node<'_, 'b> {
    /// A required operand.
    pub fn input(&self, i: usize) -> Result<Value<'b>, String> {
        self.opt_input(i).ok_or_else(|| format!("operand {i} is required"))
    }

    /// An optional operand (absent, or given as the empty name).
    pub fn opt_input(&self, i: usize) -> Option<Value<'b>> {
        self.inputs.get(i).copied().flatten()
    }

    pub fn num_outputs(&self) -> usize {
        self.proto.output.len()
    }
}

/// Lowers one node: returns one value per ONNX output.
pub type Lowering = for<'a, 'b> fn(&mut Importer<'b>, &Node<'a, 'b>) -> Result<Vec<Value<'b>>, String>;

const TABLES: &[&[(&str, Lowering)]] = &[
    elementwise::OPS,
    reduce::OPS,
    linalg::OPS,
    shape::OPS,
    pad::OPS,
    nn::OPS,
    cnn::OPS,
    attention::OPS,
];

/// The lowering of a default-domain op type.
pub fn find(op_type: &str) -> Option<Lowering> {
    TABLES
        .iter()
        .flat_map(|t| t.iter())
        .find(|(name, _)| *name == op_type)
        .map(|&(_, f)| f)
}

/// Every default-domain op type graphc lowers.
#[cfg(test)]
pub fn op_types() -> impl Iterator<Item = &'static str> {
    TABLES.iter().flat_map(|t| t.iter()).map(|&(name, _)| name)
}
