//! Model validity as the ONNX checker and onnxruntime see it, checked before (opset
//! imports, single assignment of values) or while (per node) lowering: a model they
//! reject is an error here too, naming the place and the rule, rather than a graph
//! built from whichever reading of it the importer happened to take.

use std::collections::HashMap;

use super::proto::{NodeProto, OperatorSetIdProto};
use super::OnnxError;

/// The default-domain opsets graphc knows: up to the newest that onnx 1.22 defines.
/// Per op, [`op_since`] gives the first opset graphc lowers it at.
pub const MIN_OPSET: i64 = 1;
pub const MAX_OPSET: i64 = 27;

/// Opset versions by domain (the default domain under `""`).
pub type Opsets = HashMap<String, i64>;

pub fn is_default_domain(d: &str) -> bool {
    d.is_empty() || d == "ai.onnx"
}

/// The key of a domain in [`Opsets`]: `ai.onnx` is the default domain.
pub fn domain_key(d: &str) -> &str {
    if is_default_domain(d) {
        ""
    } else {
        d
    }
}

fn domain_text(d: &str) -> String {
    if is_default_domain(d) {
        "the default domain (ai.onnx)".into()
    } else {
        format!("domain `{d}`")
    }
}

/// The opset imports of the model or of a local function (`whose` names it): each
/// domain once, versions from 1, the default domain within what graphc knows.
pub fn opset_imports(imports: &[OperatorSetIdProto], whose: &str) -> Result<Opsets, OnnxError> {
    let mut out = Opsets::with_capacity(imports.len());
    for o in imports {
        let err = |m: String| OnnxError::Model(format!("{whose}: opset import of {}: {m}", domain_text(&o.domain)));
        if let Some(earlier) = out.insert(domain_key(&o.domain).to_string(), o.version) {
            return Err(err(format!(
                "the domain is imported more than once (versions {earlier} and {})",
                o.version
            )));
        }
        if o.version < 1 {
            return Err(err(format!("version {} is not valid (versions start at 1)", o.version)));
        }
        if is_default_domain(&o.domain) && o.version > MAX_OPSET {
            return Err(err(format!(
                "version {} is outside the opsets graphc supports ({MIN_OPSET} to {MAX_OPSET})",
                o.version
            )));
        }
    }
    Ok(out)
}

/// Why versions of an op before its [`op_since`] are not lowered, when they exist.
const LEGACY_BROADCAST: &str = "before opset 7 it broadcast through the `broadcast` and `axis` attributes";

/// The first default-domain opset at which graphc lowers each op it supports: the opset
/// that defined the op, or later where graphc does not implement the earlier versions
/// (with the reason).
const SINCE: &[(&str, i64, &str)] = &[
    ("Abs", 1, ""),
    ("Add", 7, LEGACY_BROADCAST),
    ("And", 7, LEGACY_BROADCAST),
    ("ArgMax", 1, ""),
    ("ArgMin", 1, ""),
    ("Cast", 6, "before opset 6 its `to` attribute was a string"),
    ("CastLike", 15, ""),
    ("Ceil", 1, ""),
    ("Celu", 12, ""),
    ("Clip", 1, ""),
    ("Concat", 4, "before opset 4 its `axis` was optional (default 1)"),
    ("Constant", 1, ""),
    ("ConstantOfShape", 9, ""),
    ("Conv", 1, ""),
    ("Cos", 7, ""),
    ("CumSum", 11, ""),
    ("Div", 7, LEGACY_BROADCAST),
    ("Elu", 1, ""),
    ("Equal", 7, LEGACY_BROADCAST),
    ("Erf", 9, ""),
    ("Exp", 1, ""),
    ("Expand", 8, ""),
    ("Flatten", 1, ""),
    ("Floor", 1, ""),
    ("Gather", 1, ""),
    ("GatherElements", 11, ""),
    ("GatherND", 11, ""),
    ("Gelu", 20, ""),
    ("Gemm", 1, ""),
    ("Greater", 7, LEGACY_BROADCAST),
    ("GreaterOrEqual", 12, ""),
    ("HardSigmoid", 1, ""),
    ("HardSwish", 14, ""),
    ("Identity", 1, ""),
    ("IsInf", 10, ""),
    ("IsNaN", 9, ""),
    ("LayerNormalization", 17, ""),
    ("LeakyRelu", 1, ""),
    ("Less", 7, LEGACY_BROADCAST),
    ("LessOrEqual", 12, ""),
    ("Log", 1, ""),
    ("LogSoftmax", 1, ""),
    ("MatMul", 1, ""),
    ("Max", 1, ""),
    ("Mean", 1, ""),
    ("Min", 1, ""),
    ("Mish", 18, ""),
    ("Mod", 10, ""),
    ("Mul", 7, LEGACY_BROADCAST),
    ("Neg", 1, ""),
    ("Not", 1, ""),
    ("OneHot", 9, ""),
    ("Or", 7, LEGACY_BROADCAST),
    ("PRelu", 1, ""),
    ("Pad", 2, "before opset 2 its pads were the attribute `paddings`"),
    ("Pow", 7, LEGACY_BROADCAST),
    ("RMSNormalization", 23, ""),
    ("Range", 11, ""),
    ("Reciprocal", 1, ""),
    ("ReduceL1", 1, ""),
    ("ReduceL2", 1, ""),
    ("ReduceLogSum", 1, ""),
    ("ReduceLogSumExp", 1, ""),
    ("ReduceMax", 1, ""),
    ("ReduceMean", 1, ""),
    ("ReduceMin", 1, ""),
    ("ReduceProd", 1, ""),
    ("ReduceSum", 1, ""),
    ("ReduceSumSquare", 1, ""),
    ("Relu", 1, ""),
    ("Reshape", 1, ""),
    ("Round", 11, ""),
    ("Selu", 1, ""),
    ("Shape", 1, ""),
    ("Sigmoid", 1, ""),
    ("Sign", 9, ""),
    ("Sin", 7, ""),
    ("Size", 1, ""),
    ("Slice", 1, ""),
    ("Softmax", 1, ""),
    ("Softplus", 1, ""),
    ("Softsign", 1, ""),
    ("Split", 2, "before opset 2 its sizes could be operand 1"),
    ("Sqrt", 1, ""),
    ("Squeeze", 1, ""),
    ("Sub", 7, LEGACY_BROADCAST),
    ("Sum", 1, ""),
    ("Tanh", 1, ""),
    ("ThresholdedRelu", 10, ""),
    ("Tile", 6, "before opset 6 it took `tiles` and `axis` operands"),
    ("Transpose", 1, ""),
    ("Trilu", 14, ""),
    ("Unsqueeze", 1, ""),
    ("Where", 9, ""),
    ("Xor", 7, LEGACY_BROADCAST),
];

/// The first opset graphc lowers `op_type` at, and why not earlier where the op existed.
pub fn op_since(op_type: &str) -> Option<(i64, &'static str)> {
    SINCE
        .iter()
        .find(|(name, _, _)| *name == op_type)
        .map(|&(_, since, why)| (since, why))
}

/// Attributes that became operands: from opset `since`, `op`'s `attribute` is operand
/// `operand` instead.
const BECAME_OPERANDS: &[(&str, &str, usize, i64)] = &[
    ("ReduceSum", "axes", 1, 13),
    ("ReduceMean", "axes", 1, 18),
    ("ReduceMax", "axes", 1, 18),
    ("ReduceMin", "axes", 1, 18),
    ("ReduceProd", "axes", 1, 18),
    ("ReduceL1", "axes", 1, 18),
    ("ReduceL2", "axes", 1, 18),
    ("ReduceLogSum", "axes", 1, 18),
    ("ReduceLogSumExp", "axes", 1, 18),
    ("ReduceSumSquare", "axes", 1, 18),
    ("Squeeze", "axes", 1, 13),
    ("Unsqueeze", "axes", 1, 13),
    ("Split", "split", 1, 13),
    ("Slice", "starts", 1, 10),
    ("Slice", "ends", 2, 10),
    ("Slice", "axes", 3, 10),
    ("Pad", "pads", 1, 11),
    ("Pad", "value", 2, 11),
    ("Clip", "min", 1, 11),
    ("Clip", "max", 2, 11),
    ("Reshape", "shape", 1, 5),
];

/// The op-specific rules of a default-domain node at `opset`: the op exists (as graphc
/// lowers it) at that opset, and values that are operands at that opset are not given
/// as attributes, nor the other way round.
pub fn check_op(node: &NodeProto, opset: i64) -> Result<(), String> {
    let op = node.op_type.as_str();
    if let Some((since, why)) = op_since(op) {
        if opset < since {
            return Err(if why.is_empty() {
                format!("{op} is not defined before opset {since}; the model imports opset {opset}")
            } else {
                format!("graphc lowers {op} from opset {since} ({why}); the model imports opset {opset}")
            });
        }
    }
    for &(_, attr, operand, since) in BECAME_OPERANDS.iter().filter(|(o, ..)| *o == op) {
        let has_attr = node.attribute.iter().any(|a| a.name == attr);
        let has_operand = node.input.get(operand).is_some_and(|n| !n.is_empty());
        if opset >= since && has_attr {
            return Err(format!(
                "attribute `{attr}` is not an attribute of {op} at opset {opset}: from opset {since} \
                 `{attr}` is operand {operand}"
            ));
        }
        if opset < since && has_operand {
            return Err(format!(
                "{op} has no operand {operand} at opset {opset}: before opset {since} `{attr}` is an attribute"
            ));
        }
    }
    Ok(())
}

/// Where a value name was first assigned.
enum Writer {
    Input,
    Initializer,
    Node(usize),
}

/// Single static assignment, as the ONNX checker requires of a graph (`inputs` are the
/// graph's inputs, `initializers` its initializers) or of a function body (`inputs` its
/// formal inputs): each name is written once, by one input, initializer or node output;
/// an initializer may also be listed as an input (IR version < 4). A node output that
/// is already written is an error of that node, made by `node_err`.
pub fn single_assignment<'a>(
    inputs: impl IntoIterator<Item = &'a str>,
    initializers: impl IntoIterator<Item = &'a str>,
    nodes: &'a [NodeProto],
    what: &str,
    node_err: impl Fn(&NodeProto, usize, String) -> OnnxError,
) -> Result<(), OnnxError> {
    let mut writers: HashMap<&str, Writer> = HashMap::new();
    for name in inputs {
        if writers.insert(name, Writer::Input).is_some() {
            return Err(OnnxError::Model(format!("{what}: input `{name}` is listed twice")));
        }
    }
    for name in initializers {
        if let Some(Writer::Initializer) = writers.insert(name, Writer::Initializer) {
            return Err(OnnxError::Model(format!(
                "{what}: initializer `{name}` is defined twice"
            )));
        }
    }
    for (i, n) in nodes.iter().enumerate() {
        for name in n.output.iter().filter(|o| !o.is_empty()) {
            let Some(earlier) = writers.insert(name, Writer::Node(i)) else {
                continue;
            };
            let by = match earlier {
                Writer::Input => "is an input".to_string(),
                Writer::Initializer => "is an initializer".to_string(),
                Writer::Node(j) if j == i => "is written twice by this node".to_string(),
                Writer::Node(j) => format!(
                    "is already written by node {}",
                    nodes.get(j).map_or_else(|| format!("#{j}"), |m| node_label(m, j))
                ),
            };
            return Err(node_err(
                n,
                i,
                format!("output `{name}` {by} in {what} (each value must be assigned exactly once)"),
            ));
        }
    }
    Ok(())
}

/// An error of node `n` (the `index`-th of its graph or function body) at `opset`.
pub fn node_error(n: &NodeProto, index: usize, opset: i64, message: String) -> OnnxError {
    OnnxError::Node {
        node: node_label(n, index),
        op_type: n.op_type.clone(),
        domain: if is_default_domain(&n.domain) {
            String::new()
        } else {
            format!(" in domain {}", n.domain)
        },
        opset,
        message,
    }
}

/// How errors name a node: its name, else its index and first output.
pub fn node_label(n: &NodeProto, index: usize) -> String {
    if n.name.is_empty() {
        format!("#{index} ({})", n.output.first().map(String::as_str).unwrap_or("?"))
    } else {
        format!("`{}`", n.name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_lowered_op_has_a_first_opset() {
        for op in super::super::ops::op_types() {
            assert!(op_since(op).is_some(), "{op} has no entry in SINCE");
        }
        for (op, ..) in SINCE {
            assert!(super::super::ops::find(op).is_some(), "{op} in SINCE is not lowered");
        }
        for (op, ..) in BECAME_OPERANDS {
            assert!(op_since(op).is_some(), "{op} in BECAME_OPERANDS is not lowered");
        }
    }
}
