//! The import driver: model → graph. Binds inputs and initializers, lowers nodes in
//! order (inlining local functions), tracks which IR values are known at import, and
//! finally folds known values into constants and prunes what no output uses.

use std::collections::HashMap;
use std::path::Path;
use std::rc::Rc;

use super::attrs::{self, Attrs};
use super::check::{self, domain_key, is_default_domain, node_error, node_label, Opsets};
use super::functions::{Functions, LocalFunction, MAX_INLINE_DEPTH};
use super::ops::{self, Node};
use super::proto::{
    self, tensor_shape_proto::dimension, type_proto, GraphProto, ModelProto, NodeProto, ValueInfoProto,
};
use super::tensor::{dtype_from_onnx, tensor_from_proto, ExternalData};
use super::{ImportOptions, OnnxError};
use crate::interp::eval_op;
use crate::{DType, Graph, GraphBuilder, NodeId, Op, Tensor, TensorType, Value};

/// Known values larger than this many elements are not kept (they are never shapes).
const MAX_KNOWN_ELEMENTS: usize = 1 << 20;
/// Known values over [`MAX_FOLDED_ELEMENTS`] are kept only while all of them together
/// stay under this many bytes, so the importer's memory does not grow with a dimension's
/// value (small values, which shapes are, are always kept).
const MAX_KNOWN_BYTES: usize = 64 << 20;
/// Known values up to this many elements replace the nodes computing them.
const MAX_FOLDED_ELEMENTS: usize = 1 << 12;

/// Import an `.onnx` file (external data is read relative to its folder).
pub fn import_onnx(path: &Path, opts: &ImportOptions) -> Result<Graph, OnnxError> {
    let bytes = crate::files::read_regular(path)?;
    let model = decode_model(&bytes)?;
    import_model(&model, path.parent(), opts)
}

/// Every symbolic input dimension without a value, in one error: (name, the input and
/// axis where it is first met).
fn unset_dims_error(unset: &[(String, String, usize)]) -> OnnxError {
    match unset {
        [(p, input, axis)] => OnnxError::Model(format!(
            "graph input `{input}`: symbolic dimension `{p}` (axis {axis}) is not set; fix it with --dim {p}=N"
        )),
        _ => {
            let places: Vec<String> = unset
                .iter()
                .map(|(p, input, axis)| format!("`{p}` (graph input `{input}`, axis {axis})"))
                .collect();
            let fix: Vec<String> = unset.iter().map(|(p, _, _)| format!("--dim {p}=N")).collect();
            OnnxError::Model(format!(
                "{} symbolic dimensions are not set: {}; fix them with {}",
                unset.len(),
                places.join(", "),
                fix.join(" ")
            ))
        }
    }
}

fn decode_model(bytes: &[u8]) -> Result<ModelProto, OnnxError> {
    proto::decode::<ModelProto>(bytes).map_err(|e| OnnxError::Model(format!("not a valid ONNX model: {e}")))
}

/// An op graphc does not support, at one node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UnsupportedNode {
    pub node: String,
    pub op_type: String,
    pub domain: String,
    pub opset: i64,
}

/// Every node of a model whose op graphc does not support (after inlining local
/// functions), in graph order.
pub fn list_unsupported(path: &Path) -> Result<Vec<UnsupportedNode>, OnnxError> {
    let bytes = crate::files::read_regular(path)?;
    let model = decode_model(&bytes)?;
    let (graph, opsets, functions) = prepare(&model)?;
    let mut out = Vec::new();
    // The walk is bounded: `prepare` checked the expanded size.
    let mut stack: Vec<(&NodeProto, Option<&LocalFunction>)> = graph.node.iter().rev().map(|n| (n, None)).collect();
    while let Some((n, within)) = stack.pop() {
        if let Some(f) = functions.get(n) {
            stack.extend(f.proto.node.iter().rev().map(|inner| (inner, Some(&**f))));
            continue;
        }
        if !is_default_domain(&n.domain) || (ops::find(&n.op_type).is_none() && !is_sequence_op(&n.op_type)) {
            let empty = Opsets::new();
            let opset = super::functions::node_opset(n, within.map_or(&empty, |f| &f.opsets), &opsets);
            out.push(UnsupportedNode {
                node: node_label(n, out.len()),
                op_type: n.op_type.clone(),
                domain: n.domain.clone(),
                opset,
            });
        }
    }
    Ok(out)
}

/// The checks made before lowering anything: the model has a graph, valid opset imports
/// and local functions, values assigned once, and a bounded size with functions inlined.
fn prepare(model: &ModelProto) -> Result<(&GraphProto, Opsets, Functions), OnnxError> {
    let graph = model
        .graph
        .as_ref()
        .ok_or_else(|| OnnxError::Model("the model has no graph".into()))?;
    let opsets = check::opset_imports(&model.opset_import, "the model")?;
    let functions = Functions::collect(model, &opsets)?;
    check::single_assignment(
        graph.input.iter().map(|i| i.name.as_str()),
        graph.initializer.iter().map(|t| t.name.as_str()),
        &graph.node,
        "the graph",
        |n, i, m| node_error(n, i, opsets.get(domain_key(&n.domain)).copied().unwrap_or(0), m),
    )?;
    functions.check_expansion(&graph.node)?;
    Ok((graph, opsets, functions))
}

/// Ops on ONNX sequences, lowered by the importer itself (sequences are lists of IR
/// values, known in length at import).
fn is_sequence_op(op_type: &str) -> bool {
    matches!(
        op_type,
        "SplitToSequence" | "SequenceAt" | "SequenceConstruct" | "SequenceLength" | "ConcatFromSequence"
    )
}

/// Import a decoded model. `base_dir` is the folder external data paths are relative to.
pub fn import_model(model: &ModelProto, base_dir: Option<&Path>, opts: &ImportOptions) -> Result<Graph, OnnxError> {
    let (graph, opsets, functions) = prepare(model)?;
    // A model importing no default-domain opset can still hold other domains' nodes;
    // they then fail one by one, naming their domain.
    let b = GraphBuilder::new();
    let mut imp = Importer {
        b: &b,
        values: HashMap::new(),
        sequences: HashMap::new(),
        known: HashMap::new(),
        examined: 0,
        known_large_bytes: 0,
        opsets,
        external: ExternalData::new(base_dir),
        functions,
        within: None,
        inline_depth: 0,
    };
    imp.bind_initializers(graph)?;
    imp.bind_inputs(graph, opts)?;
    // Initializer constants are known before the first node asks for them.
    imp.examine_new_nodes();
    for (i, node) in graph.node.iter().enumerate() {
        imp.lower_node(node, i)?;
    }
    for out in &graph.output {
        let v = *imp
            .values
            .get(&out.name)
            .ok_or_else(|| OnnxError::Model(format!("graph output `{}` is not produced by any node", out.name)))?;
        check_declared_type(out, v)?;
        b.output(&out.name, v);
    }
    if let Some(e) = b.take_error() {
        return Err(OnnxError::Model(e.to_string()));
    }
    let known = std::mem::take(&mut imp.known);
    drop(imp);
    let mut g = b
        .finish()
        .map_err(|e| OnnxError::Model(format!("imported graph: {e}")))?;
    for (id, value) in known {
        // Leaves stay; so do broadcasts and iotas, which are cheaper than the tensors
        // they would materialize.
        let keep = matches!(
            g.node(id).op,
            Op::Constant { .. } | Op::Input { .. } | Op::Parameter { .. } | Op::Broadcast { .. } | Op::Iota { .. }
        );
        if !keep && value.numel() <= MAX_FOLDED_ELEMENTS {
            g.replace_with_constant(id, value);
        }
    }
    let (g, _) = crate::dce::eliminate_dead_code(&g);
    g.verify()
        .map_err(|e| OnnxError::Model(format!("imported graph: {e}")))?;
    Ok(g)
}

/// The graph output's declared type, where static, must be what the import computed.
fn check_declared_type(out: &ValueInfoProto, v: Value<'_>) -> Result<(), OnnxError> {
    let Some(type_proto::Value::TensorType(t)) = out.r#type.as_ref().and_then(|t| t.value.as_ref()) else {
        return Ok(());
    };
    let got = v.ty();
    if t.elem_type != 0 {
        let declared =
            dtype_from_onnx(t.elem_type).map_err(|e| OnnxError::Model(format!("output `{}`: {e}", out.name)))?;
        if declared != got.dtype {
            return Err(OnnxError::Model(format!(
                "output `{}` is declared {declared} but computes {}",
                out.name, got.dtype
            )));
        }
    }
    if let Some(shape) = &t.shape {
        let rank_ok = shape.dim.len() == got.shape.rank();
        let dims_ok = rank_ok
            && shape.dim.iter().zip(got.shape.dims()).all(|(d, &g)| match d.value {
                Some(dimension::Value::DimValue(n)) => n == g as i64,
                _ => true,
            });
        if !dims_ok {
            return Err(OnnxError::Model(format!(
                "output `{}` is declared with shape {} but computes {}",
                out.name,
                shape_text(shape),
                got.shape
            )));
        }
    }
    Ok(())
}

fn shape_text(s: &proto::TensorShapeProto) -> String {
    let dims: Vec<String> = s
        .dim
        .iter()
        .map(|d| match &d.value {
            Some(dimension::Value::DimValue(n)) => n.to_string(),
            Some(dimension::Value::DimParam(p)) => p.clone(),
            None => "?".into(),
        })
        .collect();
    format!("[{}]", dims.join(","))
}

/// State of one import. Operator lowerings get it to build nodes and to ask for the
/// compile-time value of an operand.
pub struct Importer<'b> {
    pub b: &'b GraphBuilder,
    /// ONNX value name → IR value.
    values: HashMap<String, Value<'b>>,
    /// ONNX sequence values (of tensors known at import by count), by name.
    sequences: HashMap<String, Vec<Value<'b>>>,
    /// IR nodes whose value is known at import.
    known: HashMap<NodeId, Tensor>,
    /// IR nodes below this index have been examined for known values.
    examined: usize,
    /// Bytes of the known values over [`MAX_FOLDED_ELEMENTS`] elements kept so far.
    known_large_bytes: usize,
    opsets: Opsets,
    /// The model's folder and its mapped external data files.
    external: ExternalData,
    functions: Functions,
    /// The local function whose body is being lowered (`values` is then its scope).
    within: Option<Rc<LocalFunction>>,
    inline_depth: usize,
}

impl<'b> Importer<'b> {
    fn bind_initializers(&mut self, graph: &GraphProto) -> Result<(), OnnxError> {
        for init in &graph.initializer {
            let t = tensor_from_proto(init, Some(&self.external))
                .map_err(|e| OnnxError::Model(format!("initializer `{}`: {e}", init.name)))?;
            let v = if t.dtype().is_float() {
                self.b.param(&init.name, t)
            } else {
                self.b.constant(t)
            };
            self.values.insert(init.name.clone(), v);
        }
        if !graph.sparse_initializer.is_empty() {
            return Err(OnnxError::Model("sparse initializers are not supported".into()));
        }
        Ok(())
    }

    fn bind_inputs(&mut self, graph: &GraphProto, opts: &ImportOptions) -> Result<(), OnnxError> {
        let mut symbols = std::collections::BTreeSet::new();
        // Symbolic dimensions without a value: (name, input, axis) where each is first
        // met; reported together after every input is seen.
        let mut unset: Vec<(String, String, usize)> = Vec::new();
        for input in &graph.input {
            if self.values.contains_key(&input.name) {
                continue; // an initializer listed as an input (IR version < 4)
            }
            let err = |m: String| OnnxError::Model(format!("graph input `{}`: {m}", input.name));
            let t = match input.r#type.as_ref().and_then(|t| t.value.as_ref()) {
                Some(type_proto::Value::TensorType(t)) => t,
                Some(_) => {
                    return Err(err(
                        "sequence, map and optional inputs are not supported (tensors only)".into(),
                    ))
                }
                None => return Err(err("has no type".into())),
            };
            let dtype = dtype_from_onnx(t.elem_type).map_err(err)?;
            let shape = t
                .shape
                .as_ref()
                .ok_or_else(|| err("has no shape (its rank is unknown)".into()))?;
            let mut dims = Vec::with_capacity(shape.dim.len());
            let mut complete = true;
            for (axis, d) in shape.dim.iter().enumerate() {
                dims.push(match &d.value {
                    Some(dimension::Value::DimValue(n)) => {
                        usize::try_from(*n).map_err(|_| err(format!("dimension {axis} is negative ({n})")))?
                    }
                    Some(dimension::Value::DimParam(p)) => match opts.dims.get(p) {
                        Some(&n) => {
                            symbols.insert(p.clone());
                            n
                        }
                        None => {
                            if !unset.iter().any(|(name, _, _)| name == p) {
                                unset.push((p.clone(), input.name.clone(), axis));
                            }
                            complete = false;
                            0
                        }
                    },
                    None => return Err(err(format!("dimension {axis} is unknown and has no name to fix it by"))),
                });
            }
            if !complete {
                continue;
            }
            let ty = TensorType::new(dtype, dims);
            if ty.shape.checked_numel().is_none() {
                return Err(err(format!("type {ty} is too large")));
            }
            let v = self.b.input(&input.name, ty.dtype, ty.shape);
            self.values.insert(input.name.clone(), v);
        }
        if !unset.is_empty() {
            return Err(unset_dims_error(&unset));
        }
        if let Some(unused) = opts.dims.keys().find(|k| !symbols.contains(*k)) {
            let known: Vec<&str> = symbols.iter().map(String::as_str).collect();
            return Err(OnnxError::Model(format!(
                "--dim {unused}: the model has no symbolic input dimension `{unused}` (it has: {})",
                if known.is_empty() {
                    "none".to_string()
                } else {
                    known.join(", ")
                }
            )));
        }
        Ok(())
    }

    /// The opset of `domain` in force: the enclosing function's import, else the model's.
    fn opset(&self, domain: &str) -> Option<i64> {
        let key = domain_key(domain);
        self.within
            .as_ref()
            .and_then(|f| f.opsets.get(key))
            .or_else(|| self.opsets.get(key))
            .copied()
    }

    /// Lower one node (of the graph, or of the function body being inlined).
    fn lower_node(&mut self, node: &NodeProto, index: usize) -> Result<(), OnnxError> {
        let opset = self.opset(&node.domain);
        crate::work::add_len(crate::work::Stage::Import, 1 + node.input.len() + node.output.len());
        let err = |message: String| node_error(node, index, opset.unwrap_or(0), message);
        attrs::validate(node).map_err(&err)?;
        if is_default_domain(&node.domain) && is_sequence_op(&node.op_type) && self.functions.get(node).is_none() {
            let label = if node.name.is_empty() {
                node.op_type.clone()
            } else {
                node.name.clone()
            };
            self.b.scope(&label, || self.lower_sequence_op(node)).map_err(&err)?;
            if let Some(e) = self.b.take_error() {
                return Err(err(e.to_string()));
            }
            self.examine_new_nodes();
            return Ok(());
        }
        let mut inputs = Vec::with_capacity(node.input.len());
        for name in &node.input {
            if name.is_empty() {
                inputs.push(None);
                continue;
            }
            let v = self.values.get(name).copied().ok_or_else(|| {
                err(format!(
                    "operand `{name}` is not defined before this node (no input, initializer or earlier node \
                     produces it: it is undefined, or the nodes are out of order or form a cycle)"
                ))
            })?;
            inputs.push(Some(v));
        }
        if let Some(f) = self.functions.get(node).cloned() {
            let outs = self.inline_function(node, &f, inputs).map_err(|e| match e {
                OnnxError::Model(m) => err(m),
                e => e,
            })?;
            return self.bind_outputs(node, outs).map_err(err);
        }
        if !is_default_domain(&node.domain) {
            return Err(err(
                "unsupported op: graphc supports the default ONNX domain only".into()
            ));
        }
        let lowering = ops::find(&node.op_type).ok_or_else(|| err("unsupported op".into()))?;
        let opset = opset.ok_or_else(|| {
            err(
                "the model imports no opset for the default domain (ai.onnx), so the version of its ops is unknown"
                    .into(),
            )
        })?;
        check::check_op(node, opset).map_err(&err)?;
        let attrs = Attrs::new(node);
        if attrs.has_graph() {
            return Err(err("ops with subgraphs (control flow) are not supported".into()));
        }
        let label = if node.name.is_empty() {
            node.op_type.clone()
        } else {
            node.name.clone()
        };
        let n = Node {
            proto: node,
            inputs,
            attrs,
            opset,
        };
        let outs = self.b.scope(&label, || lowering(self, &n)).map_err(&err)?;
        if let Some(e) = self.b.take_error() {
            return Err(err(e.to_string()));
        }
        self.bind_outputs(node, outs.into_iter().map(Some).collect())
            .map_err(&err)?;
        self.examine_new_nodes();
        Ok(())
    }

    /// The sequence ops, on sequences whose length is known at import (as an exporter
    /// writes them for a split into q, k and v): `SplitToSequence`, `SequenceAt`,
    /// `SequenceConstruct`, `SequenceLength`, `ConcatFromSequence`.
    fn lower_sequence_op(&mut self, node: &NodeProto) -> Result<(), String> {
        let tensor = |imp: &Self, i: usize| -> Result<Value<'b>, String> {
            let name = node
                .input
                .get(i)
                .filter(|n| !n.is_empty())
                .ok_or(format!("operand {i} is required"))?;
            imp.values
                .get(name)
                .copied()
                .ok_or_else(|| format!("operand `{name}` is not a tensor defined before this node"))
        };
        let sequence = |imp: &Self, i: usize| -> Result<Vec<Value<'b>>, String> {
            let name = node
                .input
                .get(i)
                .filter(|n| !n.is_empty())
                .ok_or(format!("operand {i} is required"))?;
            imp.sequences
                .get(name)
                .cloned()
                .ok_or_else(|| format!("operand `{name}` is not a sequence defined before this node"))
        };
        let attrs = Attrs::new(node);
        let out = node
            .output
            .first()
            .filter(|n| !n.is_empty())
            .ok_or("the node has no output")?;
        if node.output.len() != 1 {
            return Err(format!("{} has one output, got {}", node.op_type, node.output.len()));
        }
        let defined = self.values.contains_key(out) || self.sequences.contains_key(out);
        if defined {
            return Err(format!(
                "output `{out}` is already defined (each value must be assigned once)"
            ));
        }
        match node.op_type.as_str() {
            "SplitToSequence" => {
                let x = tensor(self, 0)?;
                let rank = x.rank();
                let axis = crate::shape::normalize_axis(attrs.int("axis", 0)?, rank)
                    .ok_or_else(|| format!("axis out of range for rank {rank}"))?;
                let d = x.shape().dims().get(axis).copied().unwrap_or(0);
                let split = match node.input.get(1).filter(|n| !n.is_empty()) {
                    Some(_) => Some(self.static_ints(tensor(self, 1)?, "split")?),
                    None => None,
                };
                let scalar_split = node
                    .input
                    .get(1)
                    .filter(|n| !n.is_empty())
                    .map(|_| tensor(self, 1).map(|v| v.rank() == 0))
                    .transpose()?
                    .unwrap_or(false);
                let no_split = split.is_none();
                let sizes: Vec<usize> = match split {
                    None => vec![1; d],
                    Some(s) if scalar_split => {
                        let c = usize::try_from(s.first().copied().unwrap_or(0))
                            .ok()
                            .filter(|&c| c > 0)
                            .ok_or("split must be positive")?;
                        (0..d.div_ceil(c)).map(|i| c.min(d - i * c)).collect()
                    }
                    Some(s) => {
                        let sizes: Vec<usize> = s
                            .iter()
                            .map(|&v| usize::try_from(v).map_err(|_| format!("split {s:?} has a negative part")))
                            .collect::<Result<_, _>>()?;
                        if sizes.iter().sum::<usize>() != d {
                            return Err(format!("split {s:?} does not sum to the extent {d} of axis {axis}"));
                        }
                        sizes
                    }
                };
                let squeeze = no_split && attrs.int("keepdims", 1)? == 0;
                let mut parts = Vec::with_capacity(sizes.len());
                let mut at = 0i64;
                for len in sizes {
                    let mut p = x.slice(axis as i64, at, at + len as i64, 1);
                    if squeeze {
                        let mut dims = p.shape().dims().to_vec();
                        dims.remove(axis);
                        p = p.reshape(dims);
                    }
                    parts.push(p);
                    at += len as i64;
                }
                self.sequences.insert(out.clone(), parts);
            }
            "SequenceAt" => {
                let seq = sequence(self, 0)?;
                let pos = self.static_ints(tensor(self, 1)?, "position")?;
                let [p] = pos.as_slice() else {
                    return Err("position must be one integer".into());
                };
                let n = seq.len() as i64;
                let i = if *p < 0 { p + n } else { *p };
                let v = usize::try_from(i)
                    .ok()
                    .and_then(|i| seq.get(i).copied())
                    .ok_or_else(|| format!("position {p} is out of range for a sequence of {n}"))?;
                self.values.insert(out.clone(), v);
            }
            "SequenceConstruct" => {
                let parts = (0..node.input.len())
                    .map(|i| tensor(self, i))
                    .collect::<Result<Vec<_>, _>>()?;
                self.sequences.insert(out.clone(), parts);
            }
            "SequenceLength" => {
                let seq = sequence(self, 0)?;
                let v = self.b.constant(Tensor::scalar(crate::DType::I64, seq.len() as f64));
                self.values.insert(out.clone(), v);
            }
            "ConcatFromSequence" => {
                let seq = sequence(self, 0)?;
                let first = *seq.first().ok_or("concat of an empty sequence")?;
                let new_axis = attrs.int("new_axis", 0)? == 1;
                let rank = first.rank() + usize::from(new_axis);
                let axis = crate::shape::normalize_axis(attrs.int("axis", 0)?, rank)
                    .ok_or_else(|| format!("axis out of range for rank {rank}"))?;
                let parts: Vec<Value<'b>> = if new_axis {
                    seq.iter()
                        .map(|p| {
                            let mut dims = p.shape().dims().to_vec();
                            dims.insert(axis, 1);
                            p.reshape(dims)
                        })
                        .collect()
                } else {
                    seq
                };
                let v = self.b.concat(&parts, axis as i64);
                self.values.insert(out.clone(), v);
            }
            other => return Err(format!("{other} is not a sequence op")),
        }
        Ok(())
    }

    /// Name a node's results (`None`: a function output that is not produced). The
    /// model was checked for single assignment up front; this keeps it so.
    fn bind_outputs(&mut self, node: &NodeProto, outs: Vec<Option<Value<'b>>>) -> Result<(), String> {
        for (name, v) in node.output.iter().zip(outs) {
            if name.is_empty() {
                continue;
            }
            let v = v.ok_or_else(|| format!("output `{name}` is not produced"))?;
            if self.values.insert(name.clone(), v).is_some() {
                return Err(format!(
                    "output `{name}` is already defined (each value must be assigned once)"
                ));
            }
        }
        Ok(())
    }

    /// Lower the body of local function `f` called by `call`, in a scope of its own
    /// (the formal inputs bound to `inputs`); returns its outputs' values.
    fn inline_function(
        &mut self,
        call: &NodeProto,
        f: &Rc<LocalFunction>,
        inputs: Vec<Option<Value<'b>>>,
    ) -> Result<Vec<Option<Value<'b>>>, OnnxError> {
        // Checked up front for the whole model; kept as a bound on the recursion.
        if self.inline_depth >= MAX_INLINE_DEPTH {
            return Err(OnnxError::Model(format!(
                "local function `{}` nests function calls more than {MAX_INLINE_DEPTH} deep",
                f.label
            )));
        }
        if call.output.len() > f.proto.output.len() {
            return Err(OnnxError::Model(format!(
                "the call has {} outputs, but local function `{}` has {}",
                call.output.len(),
                f.label,
                f.proto.output.len()
            )));
        }
        let mut scope = HashMap::with_capacity(f.proto.input.len());
        for (formal, actual) in f.proto.input.iter().zip(inputs) {
            if let Some(v) = actual {
                scope.insert(formal.clone(), v);
            }
        }
        let outer_values = std::mem::replace(&mut self.values, scope);
        let outer_function = self.within.replace(Rc::clone(f));
        self.inline_depth += 1;
        let result = self.lower_body(call, &f.proto);
        self.inline_depth -= 1;
        self.within = outer_function;
        let body_values = std::mem::replace(&mut self.values, outer_values);
        result?;
        f.proto
            .output
            .iter()
            .zip(&call.output)
            .map(|(formal, actual)| match body_values.get(formal) {
                Some(&v) => Ok(Some(v)),
                None if actual.is_empty() => Ok(None),
                None => Err(OnnxError::Model(format!(
                    "local function `{}` does not produce its output `{formal}`",
                    f.label
                ))),
            })
            .collect()
    }

    fn lower_body(&mut self, call: &NodeProto, f: &proto::FunctionProto) -> Result<(), OnnxError> {
        for (i, inner) in f.node.iter().enumerate() {
            if inner.attribute.iter().all(|a| a.ref_attr_name.is_empty()) {
                self.lower_node(inner, i)?;
                continue;
            }
            // Attributes that refer to the call's attributes take their values.
            let mut inner = inner.clone();
            let mut attrs = Vec::with_capacity(inner.attribute.len());
            for a in &inner.attribute {
                if a.ref_attr_name.is_empty() {
                    attrs.push(a.clone());
                } else if let Some(actual) = call.attribute.iter().find(|c| c.name == a.ref_attr_name) {
                    attrs.push(proto::AttributeProto {
                        name: a.name.clone(),
                        ..actual.clone()
                    });
                } else if let Some(default) = f.attribute_proto.iter().find(|d| d.name == a.ref_attr_name) {
                    attrs.push(proto::AttributeProto {
                        name: a.name.clone(),
                        ..default.clone()
                    });
                }
            }
            inner.attribute = attrs;
            self.lower_node(&inner, i)?;
        }
        Ok(())
    }

    /// Evaluate the new IR nodes whose operands are all known.
    fn examine_new_nodes(&mut self) {
        let (start, end) = (self.examined, self.b.with_graph(Graph::len));
        for index in start..end {
            let id = NodeId(index as u32);
            let value = self.b.with_graph(|g| {
                let node = g.node(id);
                let numel = node.ty.numel();
                let large = numel > MAX_FOLDED_ELEMENTS;
                if numel > MAX_KNOWN_ELEMENTS
                    || (large && self.known_large_bytes.saturating_add(node.ty.size_bytes()) > MAX_KNOWN_BYTES)
                {
                    return None;
                }
                match &node.op {
                    Op::Constant { value } => Some(value.clone()),
                    Op::Input { .. } | Op::Parameter { .. } => None,
                    op => {
                        let args: Option<Vec<&Tensor>> = node.inputs.iter().map(|i| self.known.get(i)).collect();
                        eval_op(op, &args?, &node.ty).ok()
                    }
                }
            });
            if let Some(v) = value {
                if v.numel() > MAX_FOLDED_ELEMENTS {
                    self.known_large_bytes = self.known_large_bytes.saturating_add(v.ty().size_bytes());
                }
                self.known.insert(id, v);
            }
        }
        self.examined = end;
    }

    /// The value of `v` if it is known at import (computed from constants only), or a
    /// parameter's data.
    pub fn known(&self, v: Value<'b>) -> Option<Tensor> {
        if let Some(t) = self.known.get(&v.id()) {
            return Some(t.clone());
        }
        self.b.with_graph(|g| match &g.node(v.id()).op {
            Op::Parameter { name, .. } => g.weight(name).cloned(),
            _ => None,
        })
    }

    /// The integers of an operand that must be known at import (a shape, axes, pads).
    pub fn static_ints(&self, v: Value<'b>, what: &str) -> Result<Vec<i64>, String> {
        let t = self.known(v).ok_or_else(|| {
            format!("{what} must be known at compile time, but it is computed from the model's inputs")
        })?;
        if !t.dtype().is_int() {
            return Err(format!("{what} must be integers, got {}", t.dtype()));
        }
        Ok(match t.data() {
            crate::TensorData::I64(v) => v.clone(),
            other => other.to_f64_vec().iter().map(|&x| x as i64).collect(),
        })
    }

    /// The numbers of an operand that must be known at import, as f64.
    pub fn static_f64s(&self, v: Value<'b>, what: &str) -> Result<Vec<f64>, String> {
        self.known(v)
            .map(|t| t.to_f64_vec())
            .ok_or_else(|| format!("{what} must be known at compile time, but it is computed from the model's inputs"))
    }

    /// A constant node (known at import).
    pub fn constant(&self, t: Tensor) -> Value<'b> {
        self.b.constant(t)
    }

    /// A scalar constant of `dtype`.
    pub fn scalar(&self, dtype: DType, x: f64) -> Value<'b> {
        self.b.scalar(dtype, x)
    }
}
