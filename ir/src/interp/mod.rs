//! The reference interpreter: the meaning of every op, on the CPU.
//!
//! [`interpret`] runs a whole graph; [`eval_op`] evaluates one op on operand values
//! (constant folding reuses it). The numerics here define the compiler's semantics:
//!
//! - f16/bf16 are computed in f32 and rounded (nearest-even) at each op's output; f32 in
//!   f32, f64 in f64. Reductions and matmuls of f16/bf16/f32 accumulate in f32.
//! - Integers are computed in wrapping i64 and cast back with `as` (wrapping in the
//!   narrow type). Division and remainder by zero are errors.
//! - Casts convert exactly once (no double rounding).

pub mod attention;
mod conv;
mod convert;
mod elementwise;
mod layout;
mod matmul;
mod reduce;

use std::borrow::Cow;
use std::collections::{HashMap, HashSet};

use crate::infer::infer_type;
use crate::{Graph, NodeId, Op, Tensor, TensorType};

pub use convert::{bf16_from_f64, f16_from_f64};
pub use layout::for_each_strided_row;

/// The tanh GELU's derivative at `x` in f32, as `gelu_tanh_grad` computes it (the
/// launch emulator's DGELU epilogue).
pub fn gelu_tanh_derivative_f32(x: f32) -> f32 {
    elementwise::gelu_tanh_derivative(x)
}

/// An error while interpreting, naming the node, input or parameter it is about.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum InterpError {
    #[error("{0}")]
    Graph(#[from] crate::GraphError),
    #[error("input \"{0}\" is missing")]
    MissingInput(String),
    #[error("input \"{name}\" should be {expected}, got {got}")]
    InputType {
        name: String,
        expected: TensorType,
        got: TensorType,
    },
    #[error("\"{0}\" is not an input of the graph")]
    UnknownInput(String),
    #[error("node {node} (param \"{name}\"): parameter \"{name}\" has no weight data")]
    MissingWeight { node: NodeId, name: String },
}

impl InterpError {
    fn at(graph: &Graph, id: NodeId, message: impl Into<String>) -> InterpError {
        InterpError::Graph(crate::GraphError::at(graph, id, message))
    }
}

/// Run `graph` on `inputs` (by input name); returns the outputs in order, by name.
///
/// The graph is verified first; every input must be given with its exact type, and no
/// other name may be given. Only the nodes outputs depend on are evaluated, and each
/// intermediate value is dropped after its last use.
pub fn interpret(graph: &Graph, inputs: &HashMap<String, Tensor>) -> Result<Vec<(String, Tensor)>, InterpError> {
    graph.verify()?;

    // Bind inputs.
    // A set: a graph may have 100k inputs, and each given name is looked up.
    let mut input_names = HashSet::with_capacity(graph.inputs().len());
    for &id in graph.inputs() {
        if let Op::Input { name, ty } = &graph.node(id).op {
            let t = inputs
                .get(name)
                .ok_or_else(|| InterpError::MissingInput(name.clone()))?;
            if &t.ty() != ty {
                return Err(InterpError::InputType {
                    name: name.clone(),
                    expected: ty.clone(),
                    got: t.ty(),
                });
            }
            input_names.insert(name.as_str());
        }
    }
    let mut extra: Vec<&String> = inputs.keys().filter(|k| !input_names.contains(&k.as_str())).collect();
    extra.sort();
    if let Some(name) = extra.first() {
        return Err(InterpError::UnknownInput((*name).clone()));
    }

    // Nodes the outputs need, and how many uses each value has among them.
    let n = graph.len();
    // The graph is verified, so every id below is < n; `get` keeps that unassumed.
    let mut needed = vec![false; n];
    let mut stack: Vec<NodeId> = graph.outputs().iter().map(|o| o.node).collect();
    while let Some(id) = stack.pop() {
        if let Some(slot) = needed.get_mut(id.index()) {
            if !std::mem::replace(slot, true) {
                stack.extend(graph.node(id).inputs.iter().copied());
            }
        }
    }
    let order: Vec<NodeId> = graph
        .topo_order()?
        .into_iter()
        .filter(|id| needed.get(id.index()) == Some(&true))
        .collect();
    let mut uses = vec![0usize; n];
    for &id in &order {
        for &i in &graph.node(id).inputs {
            if let Some(u) = uses.get_mut(i.index()) {
                *u += 1;
            }
        }
    }
    let mut is_output = vec![false; n];
    for o in graph.outputs() {
        if let Some(slot) = is_output.get_mut(o.node.index()) {
            *slot = true;
        }
    }

    let mut values: Vec<Option<Cow<'_, Tensor>>> = vec![None; n];
    for &id in &order {
        let node = graph.node(id);
        let value: Cow<'_, Tensor> = match &node.op {
            Op::Input { name, .. } => match inputs.get(name) {
                Some(t) => Cow::Borrowed(t),
                None => return Err(InterpError::MissingInput(name.clone())),
            },
            Op::Parameter { name, ty } => match graph.weight(name) {
                Some(t) if &t.ty() == ty => Cow::Borrowed(t),
                Some(t) => {
                    return Err(InterpError::at(
                        graph,
                        id,
                        format!("weight data \"{name}\" is {} but the parameter is {ty}", t.ty()),
                    ))
                }
                None => {
                    return Err(InterpError::MissingWeight {
                        node: id,
                        name: name.clone(),
                    })
                }
            },
            op => {
                let mut args = Vec::with_capacity(node.inputs.len());
                for &i in &node.inputs {
                    match values.get(i.index()).and_then(|v| v.as_deref()) {
                        Some(t) => args.push(t),
                        None => return Err(InterpError::at(graph, id, format!("operand {i} has no value"))),
                    }
                }
                Cow::Owned(eval_op(op, &args, &node.ty).map_err(|m| InterpError::at(graph, id, m))?)
            }
        };
        if let Some(slot) = values.get_mut(id.index()) {
            *slot = Some(value);
        }
        for &i in &node.inputs {
            let Some(u) = uses.get_mut(i.index()) else { continue };
            *u = u.saturating_sub(1);
            if *u == 0 && is_output.get(i.index()) == Some(&false) {
                if let Some(slot) = values.get_mut(i.index()) {
                    *slot = None;
                }
            }
        }
    }

    let mut out = Vec::with_capacity(graph.outputs().len());
    for o in graph.outputs() {
        let t = values
            .get(o.node.index())
            .and_then(|v| v.as_deref())
            .ok_or_else(|| InterpError::at(graph, o.node, format!("output \"{}\" has no value", o.name)))?;
        out.push((o.name.clone(), t.clone()));
    }
    Ok(out)
}

/// Evaluate one op on operand values; `ty` is the node's (verified) output type.
///
/// Fails, without panicking, when the operands do not have the types the op needs or
/// `ty` is not the type the op gives them, for [`Op::Input`] and [`Op::Parameter`]
/// (which have nothing to compute from), and on bad runtime values (integer division by
/// zero, gather indices out of range).
pub fn eval_op(op: &Op, args: &[&Tensor], ty: &TensorType) -> Result<Tensor, String> {
    if matches!(op, Op::Input { .. } | Op::Parameter { .. }) {
        return Err(format!(
            "{} has no operands to compute from; it is bound by name",
            op.name()
        ));
    }
    let arg_tys: Vec<TensorType> = args.iter().map(|a| a.ty()).collect();
    let arg_refs: Vec<&TensorType> = arg_tys.iter().collect();
    let inferred = infer_type(op, &arg_refs)?;
    if &inferred != ty {
        return Err(format!("declared type {ty} but the op gives {inferred}"));
    }
    // `infer_type` checked the operand count, so every arm below matches; the last one
    // reports a count it did not expect rather than assuming it.
    let data = match (op, args) {
        (Op::Input { .. } | Op::Parameter { .. }, _) => return Err(format!("{} has no operands", op.name())),
        (Op::Constant { value }, _) => return Ok(value.clone()),
        (Op::Iota { ty, axis }, _) => layout::iota(ty, *axis),
        (Op::Unary(u), [a]) => elementwise::unary(*u, a.data())?,
        (Op::Binary(b), [x, y]) => elementwise::binary(*b, x.data(), y.data())?,
        (Op::Select, [c, x, y]) => elementwise::select(c.data(), x.data(), y.data())?,
        (Op::Cast { to }, [a]) => convert::cast(a.data(), *to),
        (Op::Broadcast { shape }, [a]) => layout::broadcast(a, shape),
        (Op::Reduce { op, axes, .. }, [a]) => reduce::reduce(*op, a, axes)?,
        (Op::ArgReduce { op, axis, .. }, [a]) => reduce::arg_reduce(*op, a, *axis)?,
        (Op::MatMul, [x, y]) => matmul::matmul(x, y, ty)?,
        (Op::Reshape { .. }, [a]) => a.data().clone(),
        (Op::Transpose { perm }, [a]) => layout::transpose(a, perm),
        (Op::Slice { ranges }, [a]) => layout::slice(a, ranges),
        (Op::Concat { axis }, _) => layout::concat(args, *axis)?,
        (Op::Gather { axis }, [data, idx]) => layout::gather(data, idx, *axis)?,
        (Op::ScatterAdd { axis, size }, [upd, idx]) => layout::scatter_add(upd, idx, *axis, *size, ty)?,
        (Op::Pad { pads, mode, value }, [a]) => layout::pad(a, pads, *mode, *value)?,
        (Op::Attention { .. }, _) => attention::attention(args, attention_flags(op)?, ty)?,
        (Op::AttentionLse { .. }, _) => attention::backward_op(args, None, attention_flags(op)?, ty)?,
        (Op::AttentionGrad { wrt, .. }, _) => attention::backward_op(args, Some(*wrt), attention_flags(op)?, ty)?,
        (Op::Dequantize { bits, group }, [q, s]) => crate::quant::dequantize(q, s, *bits, *group)?,
        (Op::Conv { .. } | Op::ConvGrad { .. }, [a, b]) => conv::conv(op, a, b, ty)?,
        (Op::Pool { .. }, [x]) => conv::pool(op, x, None, ty)?,
        (Op::BatchNorm { epsilon, .. }, _) => conv::batch_norm(args, *epsilon, ty)?,
        (Op::PoolGrad { .. }, [x, dy]) => conv::pool(op, x, Some(dy), ty)?,
        _ => return Err(format!("{} cannot take {} operand(s)", op.name(), args.len())),
    };
    if data.dtype() != ty.dtype {
        return Err(format!("internal error: computed {} for {ty}", data.dtype()));
    }
    Tensor::new(ty.shape.clone(), data).map_err(|e| format!("internal error: {e}"))
}

fn attention_flags(op: &Op) -> Result<attention::Flags, String> {
    attention::Flags::of(op).ok_or_else(|| format!("internal error: {} is not an attention op", op.name()))
}
