//! Mixed precision: an f32 graph computed in bf16 or f16 where that is safe, in f32
//! where it is not (in the manner of `torch.autocast`).
//!
//! [`apply_precision_with`] rewrites a graph. Inputs keep their types (cast down where
//! they are used); float outputs are given in the low type, as PyTorch's model after
//! `.to(torch.bfloat16)` returns them ([`Outputs::Low`], what `compile` does unless
//! told otherwise), or in their declared types ([`Outputs::Declared`], cast back up;
//! [`apply_precision`]). Every f32 compute node gets one of two types:
//!
//! - **f32** ("deny"), numerically sensitive ops: sum/mean/product reductions (the
//!   statistics of layer and RMS norms, softmax's denominator), `exp`, `log`, `pow`,
//!   `sqrt`, `rsqrt`, `reciprocal`, `erf`, comparisons (a mask must not flip with a
//!   rounding), and, by promotion, every elementwise op with an f32-computed operand
//!   (the rest of a softmax or a norm). An elementwise op, a max/min reduction or a
//!   view whose only user computes in f32 computes in f32 too, so `exp(x - max(x))`
//!   subtracts in f32; a value with several users (the residual stream) is stored
//!   between kernels, and stored in the low type.
//! - **the low type** (everything else): matmuls (their kernels accumulate in f32),
//!   attention (its kernel computes scores, softmax and sums in f32, so the logits
//!   never overflow f16),
//!   elementwise ops, views, gathers, concatenation, padding.
//!
//! Weights and constants used in the low type are cast where they are used; the
//! optimizer folds those casts at compile time, so they are stored in the low type
//! (and the f32 originals drop out). A small one (at most [`SATURATE_MAX_ELEMENTS`])
//! holding finite values past the low type's range is converted here instead,
//! saturating them to its largest finite values: transformers fill masks with f32's
//! lowest (-3.4e38), which rounds to `-inf` in bf16 and f16, and a row that masks
//! every key (a padding-only sequence) would then be a NaN softmax instead of the
//! uniform one the f32 graph gives; a bf16 model's mask holds bf16's lowest instead,
//! as this conversion does. Infinities and NaN stay as they are. Fusion then puts every cast inside a kernel: a
//! value crosses memory in the type its consumers want.
//!
//! **f16 range.** f16 overflows above 65504 where bf16 and f32 do not. With f16, a
//! matmul whose every user computes in f32 and whose value reaches an `exp` (the
//! pre-softmax logits: `q k^T` feeding `exp(x - max)`) computes in f32 too. Reductions already run in f32, and the
//! variance of a norm is a mean. bf16 has f32's range and needs no such rule.
//!
//! `fp32` and `tf32` leave the graph alone (TF32 is the GEMM compute type, chosen at
//! run time).

use std::collections::HashMap;
use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use graphc_ir::{BinaryOp, DType, Graph, GraphError, NodeId, Op, ReduceOp, Tensor, TensorData, UnaryOp};

/// The precision a model is compiled for.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Precision {
    /// As written.
    #[default]
    Fp32,
    /// As written; f32 GEMMs on TF32 tensor cores (`CUBLAS_COMPUTE_32F_FAST_TF32`).
    Tf32,
    /// bf16 compute and storage, f32 where it matters.
    Bf16,
    /// f16 compute and storage, f32 where it matters or could overflow.
    Fp16,
}

impl Precision {
    pub const ALL: [Precision; 4] = [Precision::Fp32, Precision::Tf32, Precision::Bf16, Precision::Fp16];

    /// The low type, for the mixed precisions.
    pub fn low_type(self) -> Option<DType> {
        match self {
            Precision::Bf16 => Some(DType::BF16),
            Precision::Fp16 => Some(DType::F16),
            Precision::Fp32 | Precision::Tf32 => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Precision::Fp32 => "fp32",
            Precision::Tf32 => "tf32",
            Precision::Bf16 => "bf16",
            Precision::Fp16 => "fp16",
        }
    }
}

impl fmt::Display for Precision {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Precision {
    type Err = String;
    fn from_str(s: &str) -> Result<Precision, String> {
        Precision::ALL
            .into_iter()
            .find(|p| p.name() == s.to_ascii_lowercase())
            .ok_or_else(|| format!("unknown precision `{s}` (fp32, tf32, bf16 or fp16)"))
    }
}

/// What [`apply_precision`] did.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PrecisionReport {
    pub precision: Precision,
    /// f32 compute nodes now computed in the low type.
    pub low_nodes: usize,
    /// f32 compute nodes kept in f32.
    pub f32_nodes: usize,
    /// Casts inserted (before the optimizer folds the weight casts).
    pub casts: usize,
    /// The plan's weights (and constants), as the memory plan counts them
    /// ([`MemoryPlan::weights_bytes`](crate::plan::MemoryPlan::weights_bytes)), and
    /// the same tensors with the low-type ones in f32. Set by the pipeline.
    pub weights_bytes: u64,
    pub weights_f32_bytes: u64,
    /// The most arena bytes live at once (the plan's lower bound), and the same with
    /// every low-type intermediate in f32 ([`MemoryPlan::peak_with`](crate::plan::MemoryPlan::peak_with)).
    /// Set by the pipeline.
    pub peak_bytes: u64,
    pub peak_f32_bytes: u64,
}

impl PrecisionReport {
    /// One line for reports: what the precision saved (empty for fp32 and tf32).
    pub fn summary(&self) -> String {
        let Some(low) = self.precision.low_type() else {
            return String::new();
        };
        let h = crate::plan::report::human_bytes;
        let pct = |a: u64, b: u64| {
            if b == 0 {
                0.0
            } else {
                100.0 * (1.0 - a as f64 / b as f64)
            }
        };
        format!(
            "{}: weights {} ({} in f32, -{:.0}%), the arena's peak {} ({} with its tensors in f32, -{:.0}%); \
             {} ops in {low}, {} kept in f32",
            self.precision,
            h(self.weights_bytes),
            h(self.weights_f32_bytes),
            pct(self.weights_bytes, self.weights_f32_bytes),
            h(self.peak_bytes),
            h(self.peak_f32_bytes),
            pct(self.peak_bytes, self.peak_f32_bytes),
            self.low_nodes,
            self.f32_nodes
        )
    }
}

/// How a node computes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Class {
    /// Not an f32 compute node: copied as is.
    Keep,
    /// Input, parameter or constant of f32: cast where used.
    Source,
    Low,
    F32,
}

/// Ops that compute in f32 whatever their operands.
fn denied(op: &Op) -> bool {
    match op {
        Op::Reduce { op, .. } => matches!(op, ReduceOp::Sum | ReduceOp::Mean | ReduceOp::Prod),
        Op::Unary(u) => matches!(
            u,
            UnaryOp::Exp | UnaryOp::Log | UnaryOp::Sqrt | UnaryOp::Rsqrt | UnaryOp::Reciprocal | UnaryOp::Erf
        ),
        Op::Binary(b) => matches!(
            b,
            BinaryOp::Pow | BinaryOp::Eq | BinaryOp::Ne | BinaryOp::Lt | BinaryOp::Le | BinaryOp::Gt | BinaryOp::Ge
        ),
        _ => false,
    }
}

/// Ops that may follow their users into f32 (cheap, and fused into the user's kernel).
fn follows_users(op: &Op) -> bool {
    matches!(
        op,
        Op::Unary(_)
            | Op::Binary(_)
            | Op::Select
            | Op::Broadcast { .. }
            | Op::Reshape { .. }
            | Op::Transpose { .. }
            | Op::Slice { .. }
            | Op::Reduce {
                op: ReduceOp::Max | ReduceOp::Min,
                ..
            }
    )
}

/// The types of a low-precision graph's float outputs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Outputs {
    /// The low type, as a model converted with `model.to(torch.bfloat16)` returns
    /// (the default: an f32 output costs twice the bytes and a conversion).
    #[default]
    Low,
    /// The declared types (f32 outputs stay f32: cast up at the end).
    Declared,
}

/// Compute `graph` in `precision` (see the module doc), keeping the declared output
/// types. `fp32` and `tf32` return the graph unchanged.
pub fn apply_precision(graph: &Graph, precision: Precision) -> Result<(Graph, PrecisionReport), GraphError> {
    apply_precision_with(graph, precision, Outputs::Declared)
}

/// [`apply_precision`], with float outputs in the low type or as declared.
pub fn apply_precision_with(
    graph: &Graph,
    precision: Precision,
    outputs: Outputs,
) -> Result<(Graph, PrecisionReport), GraphError> {
    let report = PrecisionReport {
        precision,
        ..Default::default()
    };
    let Some(low) = precision.low_type() else {
        return Ok((graph.clone(), report));
    };
    let order = graph.topo_order()?;
    let class = classify(graph, &order, low);
    rebuild(graph, &order, &class, low, outputs, report)
}

/// The class of every node: forward (sources, denied ops, promotion), then backward
/// (what only one f32 op uses computes in f32), then views read only in the low type.
fn classify(graph: &Graph, order: &[NodeId], low: DType) -> Vec<Class> {
    let users = graph.users();
    let n = graph.len();
    let is_f32 = |id: NodeId| graph.node(id).ty.dtype == DType::F32;

    // Forward: sources, denied ops, promotion.
    let mut class = vec![Class::Keep; n];
    for &id in order {
        let node = graph.node(id);
        let float_operand = node.inputs.iter().any(|&i| is_f32(i));
        class[id.index()] = match &node.op {
            Op::Input { .. } | Op::Parameter { .. } | Op::Constant { .. } | Op::Iota { .. } if is_f32(id) => {
                Class::Source
            }
            Op::Input { .. } | Op::Parameter { .. } | Op::Constant { .. } | Op::Iota { .. } => Class::Keep,
            // A cast keeps its meaning (its operand comes in the type it had).
            Op::Cast { .. } => Class::Keep,
            _ if !(is_f32(id) || float_operand) => Class::Keep,
            op if denied(op) => Class::F32,
            // Attention computes its scores, softmax and sums in f32 inside its kernel.
            Op::MatMul | Op::Attention { .. } => Class::Low,
            _ => {
                // A per-channel value (batch norm's scale and shift of this batch)
                // is cast down where used, as a weight is: it does not promote.
                let promoted = node
                    .inputs
                    .iter()
                    .any(|&i| class[i.index()] == Class::F32 && !is_per_channel(graph, i));
                if promoted {
                    Class::F32
                } else if is_f32(id) || float_operand {
                    Class::Low
                } else {
                    Class::Keep
                }
            }
        };
    }
    // Whether a node's value reaches an `exp` through ops that follow their users
    // (softmax's logits: `exp(x - max(x))`).
    let mut feeds_exp = vec![false; n];
    for &id in order.iter().rev() {
        feeds_exp[id.index()] = users[id.index()].iter().any(|&u| {
            let op = &graph.node(u).op;
            *op == Op::Unary(UnaryOp::Exp) || (follows_users(op) && feeds_exp[u.index()])
        });
    }
    // Backward: what only f32 ops use computes in f32 (and, with f16, matmuls whose
    // every user computes in f32 on the way to an `exp`: logits could overflow f16).
    for &id in order.iter().rev() {
        let i = id.index();
        if class[i] != Class::Low || users[i].is_empty() {
            continue;
        }
        let all_f32 = users[i].iter().all(|&u| class[u.index()] == Class::F32);
        let op = &graph.node(id).op;
        let is_output = graph.outputs().iter().any(|o| o.node == id);
        let logits = low == DType::F16 && *op == Op::MatMul && feeds_exp[i];
        // Only a value with one user follows it into f32: that value is computed in
        // its user's kernel. A value with several users (the residual stream, read by
        // a norm and by the next residual add) is stored between kernels, and stored
        // in the low type.
        let single_user = users[i].len() == 1;
        if all_f32 && !is_output && ((follows_users(op) && single_user) || logits) {
            class[i] = Class::F32;
        }
    }
    // A view of an f32 value read only by low-type ops is itself low: the cast goes
    // before the view, into the kernel that computes the value (a norm's output,
    // reshaped for the next GEMM, is stored in the low type by the norm's kernel).
    for &id in order.iter().rev() {
        let i = id.index();
        let op = &graph.node(id).op;
        let view = matches!(
            op,
            Op::Reshape { .. } | Op::Transpose { .. } | Op::Slice { .. } | Op::Broadcast { .. }
        );
        let is_output = graph.outputs().iter().any(|o| o.node == id);
        if view
            && class[i] == Class::F32
            && !is_output
            && !users[i].is_empty()
            && users[i].iter().all(|&u| class[u.index()] == Class::Low)
        {
            class[i] = Class::Low;
        }
    }

    class
}

/// Whether `id` is a `[c]` value reshaped to `[c, 1, ..]` and broadcast over
/// `[n, c, ..]` (rank 3 or more): a per-channel operand, as `passes::batch_norm` writes
/// the batch's scale and shift.
fn is_per_channel(graph: &Graph, id: NodeId) -> bool {
    let node = graph.node(id);
    let (Op::Broadcast { shape }, [r]) = (&node.op, node.inputs.as_slice()) else {
        return false;
    };
    let reshape = graph.node(*r);
    let (Op::Reshape { shape: to }, [v]) = (&reshape.op, reshape.inputs.as_slice()) else {
        return false;
    };
    let (out, to, from) = (shape.dims(), to.dims(), graph.node(*v).ty.shape.dims());
    out.len() >= 3
        && to.len() + 1 == out.len()
        && from.len() == 1
        && to.first() == from.first()
        && out.get(1) == from.first()
        && to.iter().skip(1).all(|&d| d == 1)
}

/// Weights and constants of at most this many elements are converted with saturation.
pub const SATURATE_MAX_ELEMENTS: usize = 1 << 20;

/// A small f32 weight or constant `id` (of `out`) with finite values past the range of
/// `to`, converted to `to` with those values saturated to its largest finite ones: a
/// constant, or a new weight `<name>:<to>`. `None` when a plain cast keeps every finite
/// value finite (or the value is not at hand).
fn saturated(graph: &Graph, out: &mut Graph, id: NodeId, to: DType) -> Option<NodeId> {
    let node = out.node(id);
    if node.ty.dtype != DType::F32 || !to.is_float() || node.ty.numel() > SATURATE_MAX_ELEMENTS {
        return None;
    }
    let max = match to {
        DType::BF16 => half::bf16::MAX.to_f64(),
        DType::F16 => half::f16::MAX.to_f64(),
        _ => return None,
    };
    let value = match &node.op {
        Op::Constant { value } => value.clone(),
        Op::Parameter { name, .. } => graph.weight(name)?.clone(),
        _ => return None,
    };
    // Finite values that round past the low type's largest finite value (beyond it by
    // more than half an ulp of the low type). Read from the little-endian bytes: a
    // weight mapped from its file is not decoded (nor copied) to be checked.
    let rounds_to_inf = |x: f64| {
        x.is_finite()
            && match to {
                DType::BF16 => half::bf16::from_f64(x).is_infinite(),
                _ => half::f16::from_f64(x).is_infinite(),
            }
    };
    let bytes = value.le_bytes();
    let values = || {
        bytes
            .chunks_exact(4)
            .map(|c| f64::from(f32::from_le_bytes([c[0], c[1], c[2], c[3]])))
    };
    if !values().any(rounds_to_inf) {
        return None;
    }
    let v: Vec<f64> = values()
        .map(|x| if rounds_to_inf(x) { max.copysign(x) } else { x })
        .collect();
    let t = Tensor::new(value.shape().clone(), TensorData::from_f64(to, &v)).ok()?;
    let op = match &node.op {
        Op::Parameter { name, .. } => {
            let name = format!("{name}:{to}");
            out.set_weight(name.clone(), t.clone());
            Op::Parameter { name, ty: t.ty() }
        }
        _ => Op::Constant { value: t },
    };
    out.add(op, vec![], None).ok()
}

/// The graph rebuilt with each node computing in its class's type, casts at the
/// operands that need them (one per value and type), and the outputs in the type asked
/// for.
fn rebuild(
    graph: &Graph,
    order: &[NodeId],
    class: &[Class],
    low: DType,
    outputs: Outputs,
    mut report: PrecisionReport,
) -> Result<(Graph, PrecisionReport), GraphError> {
    let n = graph.len();
    let mut out = Graph::new();
    let mut map: Vec<Option<NodeId>> = vec![None; n];
    let mut casts: HashMap<(NodeId, DType), NodeId> = HashMap::new();
    for &id in order {
        let node = graph.node(id);
        let c = class[id.index()];
        let want = match c {
            Class::Low => Some(low),
            Class::F32 => Some(DType::F32),
            Class::Keep | Class::Source => None,
        };
        let mut inputs = Vec::with_capacity(node.inputs.len());
        for &operand in &node.inputs {
            let new = map[operand.index()].expect("operands come first in topological order");
            let have = out.node(new).ty.dtype;
            let converted = match want {
                Some(t) if have != t && (have == DType::F32 || have == low) => {
                    let key = (new, t);
                    match casts.get(&key) {
                        Some(&x) => x,
                        None => {
                            // The cast of a computed value stands for it in the other
                            // type: its name goes with it (reports name buffers by it).
                            // A cast of a weight folds into a new weight, nameless.
                            if let Some(x) = saturated(graph, &mut out, new, t) {
                                casts.insert(key, x);
                                inputs.push(x);
                                continue;
                            }
                            let from = out.node(new);
                            let name = match from.op {
                                Op::Parameter { .. } | Op::Constant { .. } | Op::Input { .. } => None,
                                _ => from.name.clone(),
                            };
                            let x = out.add(Op::Cast { to: t }, vec![new], name)?;
                            report.casts += 1;
                            casts.insert(key, x);
                            x
                        }
                    }
                }
                _ => new,
            };
            inputs.push(converted);
        }
        let new = match &node.op {
            Op::Input { .. } | Op::Parameter { .. } | Op::Constant { .. } | Op::Iota { .. } => out.push(node.clone()),
            op => out.add(op.clone(), inputs, node.name.clone())?,
        };
        match c {
            Class::Low => report.low_nodes += 1,
            Class::F32 => report.f32_nodes += 1,
            _ => {}
        }
        map[id.index()] = Some(new);
    }
    for (name, w) in graph.weights() {
        out.set_weight(name.clone(), w.clone());
    }
    out.set_input_order(
        graph
            .inputs()
            .iter()
            .map(|&i| map[i.index()].expect("mapped"))
            .collect(),
    );
    for o in graph.outputs() {
        let mut id = map[o.node.index()].expect("mapped");
        let declared = graph.node(o.node).ty.dtype;
        let want = match outputs {
            Outputs::Low if declared == DType::F32 => low,
            _ => declared,
        };
        if out.node(id).ty.dtype != want {
            let name = out.node(id).name.clone();
            id = out.add(Op::Cast { to: want }, vec![id], name)?;
            report.casts += 1;
        }
        out.add_output(o.name.clone(), id);
    }
    Ok((out, report))
}
