//! Weight-only quantization (`--weights int8|int4`): the weights of matmuls and
//! embedding tables stored as 8- or 4-bit integers with scales, dequantized where they
//! are read ([`Op::Dequantize`]).
//!
//! Runs on the optimized graph (after the precision pass and the optimizer's second
//! run, so transposes and casts are already folded into the weights), before fusion.
//! A float weight matrix (a parameter of rank 2) is quantized where it is
//!
//! - a matmul's right operand `[k, n]`: its transpose is quantized, `q` `[n, k]` with
//!   groups along `k`, and the matmul reads `transpose(dequantize(q, s))`;
//! - a transposed matmul operand (`transpose(w)` of `w` `[n, k]`, a tied or an
//!   `[out, in]` weight): `w` itself, read as `transpose(dequantize(q, s))`;
//! - the table of a gather along axis 0 (an embedding `[vocab, d]`): quantized along
//!   `d`, and `gather(w, ids)` becomes `dequantize(gather(q, ids), gather(s, ids))`, so
//!   only the rows read are dequantized.
//!
//! Fusion turns `matmul(x, transpose(dequantize(q, s)))` into one GEMM that
//! dequantizes as it reads ([`crate::kernel::QuantB`]). int8 has one scale per output
//! channel (the group is the whole `k`), int4 one per [`INT4_GROUP`] elements along `k`
//! (as GPTQ and AWQ checkpoints store them), round-to-nearest
//! ([`graphc_ir::quant::quantize`]); scales have the weight's dtype (bf16 under
//! `--precision bf16`). Matrices with `k` below [`MIN_K`] (or odd `k` at 4 bits), 1-D
//! weights (biases, norms) and weights read any other way stay as they are. The outputs
//! change by the quantization error, which `tests/quantize.rs` bounds per fixture.

use std::collections::HashMap;
use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use graphc_ir::quant::{quantize, quantize_transposed};
use graphc_ir::{DType, Graph, GraphError, NodeId, Op, Tensor};

/// The int4 group size along `k`.
pub const INT4_GROUP: usize = 128;
/// The smallest `k` worth quantizing.
pub const MIN_K: usize = 16;

/// How weights are stored.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum WeightQuant {
    /// As the model (and the precision) gives them.
    #[default]
    None,
    /// 8-bit integers, one scale per output channel.
    Int8,
    /// 4-bit integers, one scale per 128 elements along `k`.
    Int4,
}

impl WeightQuant {
    pub const ALL: [WeightQuant; 3] = [WeightQuant::None, WeightQuant::Int8, WeightQuant::Int4];

    pub fn name(self) -> &'static str {
        match self {
            WeightQuant::None => "none",
            WeightQuant::Int8 => "int8",
            WeightQuant::Int4 => "int4",
        }
    }

    /// The integer width, or `None` for unquantized weights.
    pub fn bits(self) -> Option<usize> {
        match self {
            WeightQuant::None => None,
            WeightQuant::Int8 => Some(8),
            WeightQuant::Int4 => Some(4),
        }
    }

    /// The group size for a row of `k` elements.
    pub fn group(self, k: usize) -> usize {
        match self {
            WeightQuant::Int4 => INT4_GROUP.min(k.max(1)),
            _ => k.max(1),
        }
    }
}

impl fmt::Display for WeightQuant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for WeightQuant {
    type Err = String;

    fn from_str(s: &str) -> Result<WeightQuant, String> {
        WeightQuant::ALL
            .into_iter()
            .find(|w| w.name() == s)
            .ok_or_else(|| format!("unknown weight format `{s}` (expected none, int8 or int4)"))
    }
}

/// One quantized weight.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct QuantizedWeight {
    /// The weight's parameter name.
    pub name: String,
    /// Its shape as stored in the model.
    pub shape: Vec<usize>,
    pub bits: usize,
    pub group: usize,
    /// Whether its transpose was quantized (a `[k, n]` matmul operand).
    pub transposed: bool,
    /// Bytes before (the weight's dtype) and after (packed integers and scales).
    pub bytes_before: u64,
    pub bytes_after: u64,
}

/// What the pass did.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct QuantReport {
    pub weights: WeightQuant,
    pub quantized: Vec<QuantizedWeight>,
}

impl QuantReport {
    pub fn bytes_before(&self) -> u64 {
        self.quantized.iter().map(|q| q.bytes_before).sum()
    }

    pub fn bytes_after(&self) -> u64 {
        self.quantized.iter().map(|q| q.bytes_after).sum()
    }

    /// One line for reports: what was quantized and what it saved (empty when nothing
    /// was).
    pub fn summary(&self) -> String {
        let Some(bits) = self.weights.bits() else {
            return String::new();
        };
        let h = crate::plan::report::human_bytes;
        let (before, after) = (self.bytes_before(), self.bytes_after());
        let groups = if bits == 8 {
            "one scale per output channel".to_string()
        } else {
            format!("one scale per {INT4_GROUP} along k")
        };
        format!(
            "{}: {} weight matrices ({groups}, round to nearest), {} instead of {} ({:.3}x); GEMMs and embedding gathers dequantize what they read",
            self.weights,
            self.quantized.len(),
            h(after),
            h(before),
            after as f64 / before.max(1) as f64,
        )
    }
}

/// A weight matrix's parameter name and data, when `id` is one.
fn weight_matrix(graph: &Graph, id: NodeId) -> Option<(&str, &Tensor)> {
    let node = graph.node(id);
    let Op::Parameter { name, ty } = &node.op else {
        return None;
    };
    if ty.shape.rank() != 2 || !ty.dtype.is_float() {
        return None;
    }
    Some((name.as_str(), graph.weight(name)?))
}

/// Quantizes the weights of matmuls and gathers in `graph` (see the module doc).
/// `WeightQuant::None` returns the graph as it is.
pub fn quantize_weights(graph: &Graph, mode: WeightQuant) -> Result<(Graph, QuantReport), GraphError> {
    let mut report = QuantReport {
        weights: mode,
        quantized: Vec::new(),
    };
    let Some(bits) = mode.bits() else {
        return Ok((graph.clone(), report));
    };
    let order = graph.topo_order()?;
    let mut out = Graph::new();
    let mut map: Vec<Option<NodeId>> = vec![None; graph.len()];
    // (weight node, transposed) -> its packed data, scales and group, or None.
    let mut done: HashMap<(NodeId, bool), Option<Packed>> = HashMap::new();
    let mapped =
        |map: &[Option<NodeId>], id: NodeId| map[id.index()].expect("operands come first in topological order");
    for &id in &order {
        let node = graph.node(id);
        let inputs: Vec<NodeId> = node.inputs.iter().map(|&i| mapped(&map, i)).collect();
        // The weight this node reads quantized, the orientation, and how it reads it.
        let target = match (&node.op, node.inputs.as_slice()) {
            (Op::MatMul, [_, w]) => match &graph.node(*w).op {
                Op::Transpose { perm } if perm == &[1, 0] => {
                    let src = graph.node(*w).inputs[0];
                    weight_matrix(graph, src).map(|_| (src, false, Use::MatMulT))
                }
                _ => weight_matrix(graph, *w).map(|_| (*w, true, Use::MatMul)),
            },
            (Op::Gather { axis: 0 }, [w, _]) => weight_matrix(graph, *w).map(|_| (*w, false, Use::Gather)),
            _ => None,
        };
        let quantized = match target {
            Some((w, transposed, how)) => {
                let entry = match done.get(&(w, transposed)) {
                    Some(e) => *e,
                    None => {
                        let e = quantize_one(graph, w, transposed, mode, bits, &mut out, &mut report);
                        done.insert((w, transposed), e);
                        e
                    }
                };
                entry.map(|(q, s, group)| (q, s, group, how))
            }
            None => None,
        };
        let new = match (quantized, &node.op) {
            (Some((q, s, group, Use::MatMul | Use::MatMulT)), _) => {
                let d = out.add(Op::Dequantize { bits, group }, vec![q, s], None)?;
                let t = out.add(Op::Transpose { perm: vec![1, 0] }, vec![d], None)?;
                out.add(Op::MatMul, vec![inputs[0], t], node.name.clone())?
            }
            (Some((q, s, group, Use::Gather)), _) => {
                let gq = out.add(Op::Gather { axis: 0 }, vec![q, inputs[1]], None)?;
                let gs = out.add(Op::Gather { axis: 0 }, vec![s, inputs[1]], None)?;
                out.add(Op::Dequantize { bits, group }, vec![gq, gs], node.name.clone())?
            }
            (None, Op::Input { .. } | Op::Parameter { .. } | Op::Constant { .. } | Op::Iota { .. }) => {
                out.push(node.clone())
            }
            (None, op) => out.add(op.clone(), inputs, node.name.clone())?,
        };
        map[id.index()] = Some(new);
    }
    for (name, w) in graph.weights() {
        if out
            .nodes()
            .iter()
            .any(|n| matches!(&n.op, Op::Parameter { name: p, .. } if p == name))
        {
            out.set_weight(name.clone(), w.clone());
        }
    }
    out.set_input_order(graph.inputs().iter().map(|&i| mapped(&map, i)).collect());
    for o in graph.outputs() {
        out.add_output(o.name.clone(), mapped(&map, o.node));
    }
    // The originals of weights read only quantized drop out.
    let (out, _) = graphc_ir::dce::eliminate_dead_code(&out);
    Ok((out, report))
}

/// A quantized weight in the new graph: its packed data, its scales, its group size.
type Packed = (NodeId, NodeId, usize);

#[derive(Clone, Copy)]
enum Use {
    MatMul,
    MatMulT,
    Gather,
}

/// Quantizes weight `w` (its transpose when `transposed`) into two new parameters in
/// `out` (with the group size), or `None` when it is not worth it or cannot be.
fn quantize_one(
    graph: &Graph,
    w: NodeId,
    transposed: bool,
    mode: WeightQuant,
    bits: usize,
    out: &mut Graph,
    report: &mut QuantReport,
) -> Option<Packed> {
    let (name, tensor) = weight_matrix(graph, w)?;
    let &[rows, cols] = tensor.shape().dims() else {
        return None;
    };
    let k = if transposed { rows } else { cols };
    if k < MIN_K || (bits == 4 && !k.is_multiple_of(2)) {
        return None;
    }
    let group = mode.group(k);
    let dtype = tensor.dtype();
    let key = format!("quantize:{bits}:{group}:{transposed}:{dtype}");
    let run = |t: &Tensor| {
        if transposed {
            quantize_transposed(t, bits, group, dtype)
        } else {
            quantize(t, bits, group, dtype)
        }
        .ok()
    };
    let mut scales = None;
    let q = tensor.memoized_fold(&format!("{key}:q"), |t| {
        let (q, s) = run(t)?;
        scales = Some(s);
        Some(q)
    })?;
    let s = tensor.memoized_fold(&format!("{key}:s"), |t| {
        scales.take().or_else(|| run(t).map(|(_, s)| s))
    })?;
    // What the quantizer makes: `[n, k]` i8 or `[n, k/2]` u8, scales `[n, ceil(k/g)]` in
    // the weight's dtype. A remembered pair that is not (a fold cache entry that is not
    // what its key says) is computed again.
    let n = if transposed { cols } else { rows };
    let (q_dtype, q_cols) = if bits == 4 { (DType::U8, k / 2) } else { (DType::I8, k) };
    let expected = |q: &Tensor, s: &Tensor| {
        q.dtype() == q_dtype
            && q.shape().dims() == [n, q_cols]
            && s.dtype() == dtype
            && s.shape().dims() == [n, k.div_ceil(group)]
    };
    let (q, s) = if expected(&q, &s) {
        (q, s)
    } else {
        run(tensor).filter(|(q, s)| expected(q, s))?
    };
    let suffix = if transposed { ".T" } else { "" };
    let (q_bytes, s_bytes) = (q.ty().size_bytes() as u64, s.ty().size_bytes() as u64);
    report.quantized.push(QuantizedWeight {
        name: name.to_string(),
        shape: vec![rows, cols],
        bits,
        group,
        transposed,
        bytes_before: tensor.ty().size_bytes() as u64,
        bytes_after: q_bytes + s_bytes,
    });
    let qname = fresh_name(graph, out, &format!("{name}{suffix}.int{bits}"));
    let qn = out.add_parameter(&qname, q);
    let sname = fresh_name(graph, out, &format!("{name}{suffix}.scales"));
    let sn = out.add_parameter(&sname, s);
    Some((qn, sn, group))
}

/// `base`, or `base.N` for the first `N` naming no weight of either graph.
fn fresh_name(graph: &Graph, out: &Graph, base: &str) -> String {
    let taken = |n: &str| graph.weight(n).is_some() || out.weight(n).is_some();
    if !taken(base) {
        return base.to_string();
    }
    (1..)
        .map(|i| format!("{base}.{i}"))
        .find(|n| !taken(n))
        .unwrap_or_else(|| base.to_string())
}
