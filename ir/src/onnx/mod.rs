//! ONNX import: `.onnx` models (as torch.onnx.export writes them) into graphc graphs.
//!
//! - **Static shapes.** Every symbolic dimension of a graph input (`dim_param`) must be
//!   fixed by the caller ([`ImportOptions::dims`]); an unset one is an error naming it.
//! - **Shape arithmetic folds at import.** The importer knows the value of every IR node
//!   computed only from constants (Constant nodes, integer initializers, `Shape` of a
//!   static type, ...), so `Reshape`, `Expand`, `Slice`, `Pad`, ... whose shape operands
//!   are computed that way import as static ops, and the shape subgraph disappears. A
//!   shape that depends on input data is an error naming the node.
//! - **Initializers.** Float initializers become parameters (weights, bound by name);
//!   integer and bool initializers become constants (they are shapes, indices, masks).
//! - **Composite ops lower to primitives** (Softmax, LayerNormalization, Gemm, Gelu,
//!   ...); the fuser re-forms kernels from them.
//! - **Errors** name the node (its name, op type, domain and opset) and the problem; an
//!   op graphc does not support is an error naming it, and [`list_unsupported`] lists
//!   every such node at once.
//! - **Validity.** What the ONNX checker and onnxruntime reject is an error: values
//!   assigned twice (in the graph or a function body), opset imports out of range
//!   (default domain: 1 to 27, and per op from the opset graphc lowers it at) or
//!   repeated, attributes repeated or typed unlike their value, attributes the node's
//!   opset takes as operands (`axes` of ReduceSum-13, ...), and op-specific rules
//!   (Constant's single value, Transpose's permutation).
//! - **Local functions** (`ModelProto.functions`, which exporters emit for custom
//!   domains) are inlined at their call sites, in a scope of their own and at their own
//!   opset imports (which, as the checker requires, cover the body's domains and give
//!   its ops the versions the model's opsets give them). The inlined size is computed up front (memoized over the call
//!   graph): recursion, nesting deeper than 32, more than 1,000,000 lowered nodes and
//!   more than 256 MiB of copied function bodies are errors before anything is lowered.
//! - **Hostile input.** A `.onnx` file reaches every line here, so nothing in the
//!   importer unwraps, expects or indexes: operand counts, attribute lists, ranks and
//!   axes are checked, each with an error naming the problem (enforced by the lints
//!   below, outside tests).

#![cfg_attr(not(test), warn(clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing))]

mod attrs;
mod check;
mod functions;
mod import;
mod ops;
pub mod proto;
pub mod tensor;

use std::collections::BTreeMap;

pub use import::{import_model, import_onnx, list_unsupported, UnsupportedNode};

/// Options of an import.
#[derive(Clone, Debug, Default)]
pub struct ImportOptions {
    /// Values of symbolic dimensions, by name (`batch` -> 8).
    pub dims: BTreeMap<String, usize>,
}

/// An import error, naming where in the model it is.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum OnnxError {
    #[error("{0}")]
    Model(String),
    /// The model file cannot be read (the error names it).
    #[error(transparent)]
    File(#[from] crate::files::FileError),
    #[error("node {node} ({op_type}{domain}, opset {opset}): {message}")]
    Node {
        node: String,
        op_type: String,
        /// ` in domain X` for non-default domains, else empty.
        domain: String,
        opset: i64,
        message: String,
    },
}
