//! Local functions (`ModelProto.functions`): collected and checked, and the size of
//! the graph with every call inlined computed before anything is lowered. Inlining
//! multiplies: 20 functions that each call the next twice are a 2 KB file that inlines
//! to millions of nodes, so the expanded size (memoized per function over the call
//! graph) is bounded up front, and a function that calls itself is an error.

use std::collections::HashMap;
use std::rc::Rc;

use prost::Message;

use super::check::{
    domain_key, domain_text, is_default_domain, node_error, node_label, op_version, opset_imports, single_assignment,
    Opsets,
};
use super::proto::{FunctionProto, ModelProto, NodeProto};
use super::OnnxError;

/// At most this many ONNX nodes are lowered for a model: its graph's nodes, plus for
/// each call of a local function the nodes of its body, expanded in turn.
pub const MAX_LOWERED_NODES: u64 = 1_000_000;
/// Local function calls nest at most this deep.
pub const MAX_INLINE_DEPTH: usize = 32;
/// Inlining copies at most this many bytes of function bodies (encoded): a large
/// Constant in a function called many times is as costly as many nodes.
pub const MAX_INLINED_BYTES: u64 = 256 << 20;

/// One local function, with the opsets its body's nodes are at.
pub struct LocalFunction {
    pub proto: FunctionProto,
    /// The function's own opset imports (the model's apply to domains it does not import).
    pub opsets: Opsets,
    /// `domain::name`, for messages.
    pub label: String,
    index: usize,
}

/// The local functions of a model, by domain and name.
#[derive(Default)]
pub struct Functions {
    by_id: HashMap<String, HashMap<String, usize>>,
    list: Vec<Rc<LocalFunction>>,
    /// Per function of `list`.
    expansions: Vec<Expansion>,
}

/// The inlined size of a function: ONNX nodes lowered per call (its body, a call
/// counting as itself and its function's expansion), the bytes of body copied per call
/// (likewise), and the nesting depth of calls.
#[derive(Clone, Copy)]
struct Expansion {
    nodes: u64,
    bytes: u64,
    depth: usize,
}

impl Expansion {
    const ZERO: Expansion = Expansion {
        nodes: 0,
        bytes: 0,
        depth: 0,
    };
}

#[derive(Clone, Copy)]
enum Visit {
    New,
    Open,
    Done(Expansion),
}

/// Marks `f` open in `visit` when it is new there; false when it was seen already.
fn open(visit: &mut [Visit], f: &LocalFunction) -> bool {
    match visit.get_mut(f.index) {
        Some(v @ Visit::New) => {
            *v = Visit::Open;
            true
        }
        _ => false,
    }
}

impl Functions {
    /// The model's local functions: each id (domain, name) once, valid opset imports,
    /// single assignment in each body, and no function calling itself (directly or
    /// through others). `model_opsets` are used for the body nodes' error messages.
    pub fn collect(model: &ModelProto, model_opsets: &Opsets) -> Result<Functions, OnnxError> {
        let mut fs = Functions::default();
        for f in &model.functions {
            let label = format!("{}::{}", f.domain, f.name);
            let opsets = opset_imports(&f.opset_import, &format!("local function `{label}`"))?;
            let scope = format!("local function `{label}`");
            single_assignment(f.input.iter().map(String::as_str), [], &f.node, &scope, |n, i, m| {
                node_error(n, i, node_opset(n, &opsets, model_opsets), m)
            })?;
            if let Some((i, n)) = f
                .node
                .iter()
                .enumerate()
                .find(|(_, n)| !opsets.contains_key(domain_key(&n.domain)))
            {
                return Err(node_error(
                    n,
                    i,
                    node_opset(n, &opsets, model_opsets),
                    format!(
                        "local function `{label}` does not import an opset of {} (a function's opset imports cover \
                         the domains of its nodes)",
                        domain_text(&n.domain)
                    ),
                ));
            }
            opsets_agree(f, &label, &opsets, model_opsets)?;
            let index = fs.list.len();
            let names = fs.by_id.entry(f.domain.clone()).or_default();
            if names.insert(f.name.clone(), index).is_some() {
                return Err(OnnxError::Model(format!(
                    "the model defines the local function `{label}` more than once"
                )));
            }
            fs.list.push(Rc::new(LocalFunction {
                proto: f.clone(),
                opsets,
                label,
                index,
            }));
        }
        fs.expansions = fs.expansions()?;
        Ok(fs)
    }

    /// The local function a node calls, if it calls one.
    pub fn get(&self, node: &NodeProto) -> Option<&Rc<LocalFunction>> {
        let index = *self.by_id.get(&node.domain)?.get(&node.op_type)?;
        self.list.get(index)
    }

    /// The expansion of every function, in `list` order; errors on a cycle of calls.
    /// An iterative depth-first walk over the call graph, each function expanded once.
    fn expansions(&self) -> Result<Vec<Expansion>, OnnxError> {
        // `visit[f.index]` for each function `f` of `list` (`index` is its place there).
        let mut visit = vec![Visit::New; self.list.len()];
        for root in &self.list {
            if !open(&mut visit, root) {
                continue;
            }
            // (function, index of the next body node to look at)
            let mut stack: Vec<(&LocalFunction, usize)> = vec![(root, 0)];
            while let Some(top) = stack.last_mut() {
                let (f, next) = (top.0, top.1);
                let body = &f.proto.node;
                if let Some(node) = body.get(next) {
                    top.1 += 1;
                    if let Some(g) = self.get(node) {
                        if matches!(visit.get(g.index), Some(Visit::Open)) {
                            return Err(self.cycle(&stack, g));
                        }
                        if open(&mut visit, g) {
                            stack.push((g, 0));
                        }
                    }
                    continue;
                }
                let inner = self.expand_nodes(body, &visit);
                if let Some(v) = visit.get_mut(f.index) {
                    *v = Visit::Done(Expansion {
                        depth: inner.depth + 1,
                        ..inner
                    });
                }
                stack.pop();
            }
        }
        Ok(visit
            .into_iter()
            .map(|v| match v {
                Visit::Done(e) => e,
                _ => Expansion::ZERO,
            })
            .collect())
    }

    /// The expansion of a list of nodes whose callees are expanded already.
    fn expand_nodes(&self, nodes: &[NodeProto], visit: &[Visit]) -> Expansion {
        let mut total = Expansion::ZERO;
        crate::work::add_len(crate::work::Stage::Import, nodes.len());
        for n in nodes {
            total.nodes = total.nodes.saturating_add(1);
            total.bytes = total.bytes.saturating_add(n.encoded_len() as u64);
            if let Some(Visit::Done(e)) = self.get(n).and_then(|g| visit.get(g.index)) {
                total.nodes = total.nodes.saturating_add(e.nodes);
                total.bytes = total.bytes.saturating_add(e.bytes);
                total.depth = total.depth.max(e.depth);
            }
        }
        total
    }

    fn cycle(&self, stack: &[(&LocalFunction, usize)], again: &LocalFunction) -> OnnxError {
        let start = stack.iter().position(|&(f, _)| f.index == again.index).unwrap_or(0);
        let mut path: Vec<&str> = stack.iter().skip(start).map(|&(f, _)| f.label.as_str()).collect();
        path.push(again.label.as_str());
        OnnxError::Model(format!(
            "local function `{}` calls itself ({}); recursive functions cannot be inlined",
            again.label,
            path.join(" -> ")
        ))
    }

    /// The number of ONNX nodes lowering `nodes` (a graph's) takes with every call
    /// inlined; an error, naming the function and the numbers, when calls nest deeper
    /// than [`MAX_INLINE_DEPTH`], the count is over [`MAX_LOWERED_NODES`] or the bytes
    /// of function bodies copied over [`MAX_INLINED_BYTES`].
    pub fn check_expansion(&self, nodes: &[NodeProto]) -> Result<u64, OnnxError> {
        let mut total = Expansion::ZERO;
        // The calls with the most nodes and the most bytes: (node index, function, its expansion).
        let mut most_nodes: Option<(usize, &LocalFunction, Expansion)> = None;
        let mut most_bytes = most_nodes;
        crate::work::add_len(crate::work::Stage::Import, nodes.len());
        for (i, n) in nodes.iter().enumerate() {
            total.nodes = total.nodes.saturating_add(1);
            let Some(f) = self.get(n) else { continue };
            let Some(&e) = self.expansions.get(f.index) else {
                continue;
            };
            if e.depth > MAX_INLINE_DEPTH {
                return Err(OnnxError::Model(format!(
                    "local function `{}` (called by node {}) nests function calls {} deep; graphc inlines at most \
                     {MAX_INLINE_DEPTH} levels",
                    f.label,
                    node_label(n, i),
                    e.depth
                )));
            }
            total.nodes = total.nodes.saturating_add(e.nodes);
            total.bytes = total.bytes.saturating_add(e.bytes);
            if !matches!(most_nodes, Some((_, _, l)) if l.nodes >= e.nodes) {
                most_nodes = Some((i, f, e));
            }
            if !matches!(most_bytes, Some((_, _, l)) if l.bytes >= e.bytes) {
                most_bytes = Some((i, f, e));
            }
        }
        let culprit = |call: Option<(usize, &LocalFunction, Expansion)>, what: fn(Expansion) -> String| {
            call.map_or_else(String::new, |(i, f, e)| {
                format!(
                    ": local function `{}` expands to {} at each call (node {} calls it)",
                    f.label,
                    what(e),
                    nodes.get(i).map_or_else(|| format!("#{i}"), |n| node_label(n, i))
                )
            })
        };
        if total.nodes > MAX_LOWERED_NODES {
            return Err(OnnxError::Model(format!(
                "the model would lower {} ONNX nodes with its local functions inlined, more than graphc's limit of \
                 {MAX_LOWERED_NODES}{}",
                count(total.nodes),
                culprit(most_nodes, |e| format!("{} nodes", count(e.nodes)))
            )));
        }
        if total.bytes > MAX_INLINED_BYTES {
            return Err(OnnxError::Model(format!(
                "inlining the model's local functions would copy {} bytes of function bodies, more than graphc's \
                 limit of {MAX_INLINED_BYTES}{}",
                count(total.bytes),
                culprit(most_bytes, |e| format!("{} bytes", count(e.bytes)))
            )));
        }
        Ok(total.nodes)
    }
}

/// As the ONNX checker has it: where a function imports the default domain at another
/// opset than the model, each default-domain op of its body must be the same version
/// at both (ops graphc does not lower are not checked: their versions are unknown here).
fn opsets_agree(f: &FunctionProto, label: &str, opsets: &Opsets, model: &Opsets) -> Result<(), OnnxError> {
    let (Some(&at_function), Some(&at_model)) = (opsets.get(""), model.get("")) else {
        return Ok(());
    };
    if at_function == at_model {
        return Ok(());
    }
    let version = |v: Option<i64>| v.map_or_else(|| "not defined".to_string(), |v| format!("version {v}"));
    for (i, n) in f.node.iter().enumerate() {
        if !is_default_domain(&n.domain) {
            continue;
        }
        let (a, b) = (op_version(&n.op_type, at_function), op_version(&n.op_type, at_model));
        if a != b {
            return Err(node_error(
                n,
                i,
                at_function,
                format!(
                    "local function `{label}` imports the default domain at opset {at_function}, where {} is {}, but \
                     the model imports opset {at_model}, where it is {}; a function's ops must be the versions of the \
                     model's opsets",
                    n.op_type,
                    version(a),
                    version(b)
                ),
            ));
        }
    }
    Ok(())
}

/// A node count, which saturates at `u64::MAX`.
fn count(n: u64) -> String {
    if n == u64::MAX {
        format!("at least {n}")
    } else {
        n.to_string()
    }
}

/// The opset of a node in a function body: the function's import of its domain, else
/// the model's (0 when neither imports it).
pub fn node_opset(n: &NodeProto, function: &Opsets, model: &Opsets) -> i64 {
    let key = domain_key(&n.domain);
    function.get(key).or_else(|| model.get(key)).copied().unwrap_or(0)
}
