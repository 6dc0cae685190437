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

pub fn domain_text(d: &str) -> String {
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

/// The versions of each op graphc lowers, as onnx 1.22 defines them up to opset
/// [`MAX_OPSET`]: the opsets at which the op was (re)defined. At opset `n` an op is its
/// latest version at or before `n`; before its first it does not exist.
const VERSIONS: &[(&str, &[i64])] = &[
    ("Abs", &[1, 6, 13]),
    ("Add", &[1, 6, 7, 13, 14]),
    ("And", &[1, 7]),
    ("ArgMax", &[1, 11, 12, 13]),
    ("ArgMin", &[1, 11, 12, 13]),
    ("Attention", &[23, 24]),
    ("AveragePool", &[1, 7, 10, 11, 19, 22]),
    ("BatchNormalization", &[1, 6, 7, 9, 14, 15]),
    ("Cast", &[1, 6, 9, 13, 19, 21, 23, 24, 25]),
    ("CastLike", &[15, 19, 21, 23, 24, 25]),
    ("Ceil", &[1, 6, 13]),
    ("Celu", &[12]),
    ("Clip", &[1, 6, 11, 12, 13]),
    ("Concat", &[1, 4, 11, 13]),
    ("Constant", &[1, 9, 11, 12, 13, 19, 21, 23, 24, 25]),
    ("ConstantOfShape", &[9, 20, 21, 23, 24, 25]),
    ("Conv", &[1, 11, 22]),
    ("Cos", &[7, 22]),
    ("CumSum", &[11, 14]),
    ("Div", &[1, 6, 7, 13, 14]),
    ("Elu", &[1, 6, 22]),
    ("Equal", &[1, 7, 11, 13, 19]),
    ("Erf", &[9, 13]),
    ("Exp", &[1, 6, 13]),
    ("Expand", &[8, 13]),
    ("Flatten", &[1, 9, 11, 13, 21, 23, 24, 25]),
    ("Floor", &[1, 6, 13]),
    ("Gather", &[1, 11, 13]),
    ("GatherElements", &[11, 13]),
    ("GatherND", &[11, 12, 13]),
    ("Gelu", &[20]),
    ("Gemm", &[1, 6, 7, 9, 11, 13]),
    ("GlobalAveragePool", &[1, 22]),
    ("GlobalMaxPool", &[1, 22]),
    ("Greater", &[1, 7, 9, 13]),
    ("GreaterOrEqual", &[12, 16]),
    ("HardSigmoid", &[1, 6, 22]),
    ("HardSwish", &[14, 22]),
    ("Identity", &[1, 13, 14, 16, 19, 21, 23, 24, 25]),
    ("IsInf", &[10, 20]),
    ("IsNaN", &[9, 13, 20]),
    ("LayerNormalization", &[17]),
    ("LeakyRelu", &[1, 6, 16]),
    ("Less", &[1, 7, 9, 13]),
    ("LessOrEqual", &[12, 16]),
    ("Log", &[1, 6, 13]),
    ("LogSoftmax", &[1, 11, 13]),
    ("MatMul", &[1, 9, 13]),
    ("Max", &[1, 6, 8, 12, 13]),
    ("MaxPool", &[1, 8, 10, 11, 12, 22]),
    ("Mean", &[1, 6, 8, 13]),
    ("Min", &[1, 6, 8, 12, 13]),
    ("Mish", &[18, 22]),
    ("Mod", &[10, 13]),
    ("Mul", &[1, 6, 7, 13, 14]),
    ("Neg", &[1, 6, 13]),
    ("Not", &[1]),
    ("OneHot", &[9, 11]),
    ("Or", &[1, 7]),
    ("PRelu", &[1, 6, 7, 9, 16]),
    ("Pad", &[1, 2, 11, 13, 18, 19, 21, 23, 24, 25]),
    ("Pow", &[1, 7, 12, 13, 15]),
    ("RMSNormalization", &[23]),
    ("Range", &[11, 27]),
    ("Reciprocal", &[1, 6, 13]),
    ("ReduceL1", &[1, 11, 13, 18]),
    ("ReduceL2", &[1, 11, 13, 18]),
    ("ReduceLogSum", &[1, 11, 13, 18]),
    ("ReduceLogSumExp", &[1, 11, 13, 18]),
    ("ReduceMax", &[1, 11, 12, 13, 18, 20]),
    ("ReduceMean", &[1, 11, 13, 18]),
    ("ReduceMin", &[1, 11, 12, 13, 18, 20]),
    ("ReduceProd", &[1, 11, 13, 18]),
    ("ReduceSum", &[1, 11, 13]),
    ("ReduceSumSquare", &[1, 11, 13, 18]),
    ("Relu", &[1, 6, 13, 14]),
    ("Reshape", &[1, 5, 13, 14, 19, 21, 23, 24, 25]),
    ("RotaryEmbedding", &[23]),
    ("Round", &[11, 22]),
    ("Selu", &[1, 6, 22]),
    ("Shape", &[1, 13, 15, 19, 21, 23, 24, 25]),
    ("Sigmoid", &[1, 6, 13]),
    ("Sign", &[9, 13]),
    ("Sin", &[7, 22]),
    ("Size", &[1, 13, 19, 21, 23, 24, 25]),
    ("Slice", &[1, 10, 11, 13]),
    ("Softmax", &[1, 11, 13]),
    ("Softplus", &[1, 22]),
    ("Softsign", &[1, 22]),
    ("Split", &[1, 2, 11, 13, 18]),
    ("Sqrt", &[1, 6, 13]),
    ("Squeeze", &[1, 11, 13, 21, 23, 24, 25]),
    ("Sub", &[1, 6, 7, 13, 14]),
    ("Sum", &[1, 6, 8, 13]),
    ("Tanh", &[1, 6, 13]),
    ("ThresholdedRelu", &[10, 22]),
    ("Tile", &[1, 6, 13]),
    ("Transpose", &[1, 13, 21, 23, 24, 25]),
    ("Trilu", &[14]),
    ("Unsqueeze", &[1, 11, 13, 21, 23, 24, 25]),
    ("Where", &[9, 16]),
    ("Xor", &[1, 7]),
];

/// Why versions of an op before its [`op_since`] are not lowered, when they exist.
const LEGACY_BROADCAST: &str = "before opset 7 it broadcast through the `broadcast` and `axis` attributes";

/// Ops whose first versions graphc does not lower: from which opset it does, and why.
const LOWERED_FROM: &[(&str, i64, &str)] = &[
    ("Add", 7, LEGACY_BROADCAST),
    ("And", 7, LEGACY_BROADCAST),
    ("Cast", 6, "before opset 6 its `to` attribute was a string"),
    ("Concat", 4, "before opset 4 its `axis` was optional (default 1)"),
    ("Div", 7, LEGACY_BROADCAST),
    ("Equal", 7, LEGACY_BROADCAST),
    ("Greater", 7, LEGACY_BROADCAST),
    ("Less", 7, LEGACY_BROADCAST),
    ("Mul", 7, LEGACY_BROADCAST),
    ("Or", 7, LEGACY_BROADCAST),
    ("Pad", 2, "before opset 2 its pads were the attribute `paddings`"),
    ("Pow", 7, LEGACY_BROADCAST),
    ("Split", 2, "before opset 2 its sizes could be operand 1"),
    ("Sub", 7, LEGACY_BROADCAST),
    ("Tile", 6, "before opset 6 it took `tiles` and `axis` operands"),
    ("Xor", 7, LEGACY_BROADCAST),
];

/// The version of default-domain op `op_type` at `opset` (the opset that last
/// redefined it), if graphc lowers the op and it exists at that opset.
pub fn op_version(op_type: &str, opset: i64) -> Option<i64> {
    let (_, versions) = VERSIONS.iter().find(|(name, _)| *name == op_type)?;
    versions.iter().copied().filter(|&v| v <= opset).max()
}

/// The first opset graphc lowers `op_type` at, and why not earlier where the op existed.
pub fn op_since(op_type: &str) -> Option<(i64, &'static str)> {
    if let Some(&(_, from, why)) = LOWERED_FROM.iter().find(|(name, ..)| *name == op_type) {
        return Some((from, why));
    }
    let (_, versions) = VERSIONS.iter().find(|(name, _)| *name == op_type)?;
    Some((versions.first().copied()?, ""))
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
                format!("{op} is not defined before opset {since}; the node is at opset {opset}")
            } else {
                format!("graphc lowers {op} from opset {since} ({why}); the node is at opset {opset}")
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
            assert!(op_since(op).is_some(), "{op} has no entry in VERSIONS");
        }
        for (op, versions) in VERSIONS {
            assert!(super::super::ops::find(op).is_some(), "{op} in VERSIONS is not lowered");
            assert!(versions.windows(2).all(|w| w[0] < w[1]), "{op}: versions in order");
        }
        for (op, from, _) in LOWERED_FROM {
            let first = VERSIONS.iter().find(|v| v.0 == *op).map(|v| v.1[0]);
            assert!(
                first.is_some_and(|f| f < *from),
                "{op} in LOWERED_FROM: not after its first version"
            );
        }
        for (op, ..) in BECAME_OPERANDS {
            assert!(op_since(op).is_some(), "{op} in BECAME_OPERANDS is not lowered");
        }
    }
}
