//! # graphc-ir: the tensor IR
//!
//! A [`Graph`] is a table of [`Node`]s. Each node applies one primitive [`Op`] to the
//! values of earlier nodes and defines exactly one value, named by its [`NodeId`]
//! (a u32 newtype; there is no separate value table, since no primitive has two
//! results — ops that do in front ends, such as ONNX `Split`, lower to several nodes).
//!
//! ## Rules every graph obeys (checked by [`Graph::verify`])
//!
//! - **Static types.** Every value has a [`TensorType`]: a [`DType`] and a static
//!   [`Shape`]. A symbolic dimension is fixed before import. The type stored in a node
//!   is the one [`infer_type`] gives its op and operand types.
//! - **Explicit broadcasts and casts.** Binary ops and `select` take operands of one
//!   shape (and dtype); numpy broadcasting is an explicit [`Op::Broadcast`] and dtype
//!   promotion an explicit [`Op::Cast`]. The builder inserts both.
//! - **Acyclic.** Operands may sit anywhere in the table; the graph is evaluated in a
//!   topological order. Evaluation is pure: a node's value depends only on its op and
//!   operands, so any topological order gives the same result.
//! - **Bindings by name.** [`Op::Input`] nodes are listed once each in the input list
//!   (call order) and have unique names; [`Op::Parameter`] nodes have unique names and
//!   their data, when present, lives in the graph's weights with the same type.
//!   Outputs are named, uniquely.
//! - **Constants.** [`Op::Constant`] holds its tensor inline; a value is constant when
//!   it depends only on constants and iotas. Parameters are not constants (their data
//!   can change without recompiling) but optimizations may fold them when told to.
//!
//! ## Numerics (defined by the reference interpreter, [`interpret`])
//!
//! f16 and bf16 are computed in f32 and rounded to nearest-even at each op's output;
//! f64 is computed in f64; reductions and matmuls of f16/bf16/f32 accumulate in f32.
//! Integer arithmetic wraps; integer division truncates toward zero and division by
//! zero is an error. See each op's docs for its exact meaning.
//!
//! ## Front ends
//!
//! Graphs come from the [`GraphBuilder`] (with the composite layers of [`nn`]), from
//! the `.gir` text form below, or from ONNX files through [`onnx`], which lowers every
//! ONNX operator to these primitives and folds shape computations at import.
//!
//! ## Text form
//!
//! [`print()`] and [`parse()`] convert to and from the `.gir` text format, which
//! round-trips exactly and numbers nodes canonically ([`Graph::canonical_order`]).
//! Weights live in a safetensors file beside the `.gir`, named in its header.

// No panic on user input: index with `get`, match slices, return errors (tests are exempt).
#![cfg_attr(not(test), warn(clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing))]

pub mod autodiff;
pub mod builder;
pub mod compare;
pub mod dce;
pub mod dtype;
pub mod files;
pub mod fold_cache;
pub mod graph;
pub mod infer;
pub mod interp;
pub mod nn;
pub mod onnx;
pub mod op;
pub mod quant;
pub mod rng;
pub mod shape;
pub mod tensor;
pub mod text;
pub mod verify;
pub mod weights;
pub mod window;
pub mod work;

pub use builder::{GraphBuilder, IntoValue, Value};
pub use dtype::DType;
pub use graph::{Graph, GraphError, Node, NodeId, Output};
pub use infer::{infer_type, AttentionDims};
pub use interp::{interpret, InterpError};
pub use op::{ArgReduceOp, AttentionOperand, BinaryOp, Op, PadMode, ReduceOp, SliceRange, UnaryOp};
pub use rng::Rng;
pub use shape::{Shape, TensorType};
pub use tensor::{MappedFile, Tensor, TensorData};
pub use text::{parse, parse_module, print, print_with_weights, ParseError};
pub use weights::{load_gir, load_safetensors, save_gir, save_safetensors, LoadError, WeightsError};
pub use window::{ConvGeom, ConvOperand, PoolOp, Window};
