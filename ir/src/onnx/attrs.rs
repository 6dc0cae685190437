//! Typed access to a node's attributes, with errors naming the attribute.

use super::proto::{attribute_type as at, AttributeProto, NodeProto, TensorProto};

pub struct Attrs<'a> {
    attrs: &'a [AttributeProto],
}

impl<'a> Attrs<'a> {
    pub fn new(node: &'a NodeProto) -> Attrs<'a> {
        Attrs { attrs: &node.attribute }
    }

    pub fn has(&self, name: &str) -> bool {
        self.get(name).is_some()
    }

    fn get(&self, name: &str) -> Option<&'a AttributeProto> {
        self.attrs.iter().find(|a| a.name == name)
    }

    fn typed(&self, name: &str, ty: i32, what: &str) -> Result<Option<&'a AttributeProto>, String> {
        match self.get(name) {
            None => Ok(None),
            Some(a) if a.r#type == ty => Ok(Some(a)),
            Some(a) => Err(format!(
                "attribute `{name}` must be {what}, found attribute type {}",
                a.r#type
            )),
        }
    }

    pub fn int_opt(&self, name: &str) -> Result<Option<i64>, String> {
        Ok(self.typed(name, at::INT, "an int")?.map(|a| a.i))
    }

    pub fn int(&self, name: &str, default: i64) -> Result<i64, String> {
        Ok(self.int_opt(name)?.unwrap_or(default))
    }

    pub fn float_opt(&self, name: &str) -> Result<Option<f32>, String> {
        Ok(self.typed(name, at::FLOAT, "a float")?.map(|a| a.f))
    }

    pub fn float(&self, name: &str, default: f32) -> Result<f32, String> {
        Ok(self.float_opt(name)?.unwrap_or(default))
    }

    pub fn ints(&self, name: &str) -> Result<Option<Vec<i64>>, String> {
        Ok(self.typed(name, at::INTS, "a list of ints")?.map(|a| a.ints.clone()))
    }

    pub fn floats(&self, name: &str) -> Result<Option<Vec<f32>>, String> {
        Ok(self
            .typed(name, at::FLOATS, "a list of floats")?
            .map(|a| a.floats.clone()))
    }

    pub fn string(&self, name: &str, default: &str) -> Result<String, String> {
        match self.typed(name, at::STRING, "a string")? {
            Some(a) => String::from_utf8(a.s.clone()).map_err(|_| format!("attribute `{name}` is not UTF-8")),
            None => Ok(default.to_string()),
        }
    }

    pub fn tensor(&self, name: &str) -> Result<Option<&'a TensorProto>, String> {
        match self.typed(name, at::TENSOR, "a tensor")? {
            Some(a) => {
                a.t.as_ref()
                    .map(Some)
                    .ok_or_else(|| format!("attribute `{name}` has no tensor"))
            }
            None => Ok(None),
        }
    }

    /// Whether any attribute is a subgraph (If/Loop/Scan bodies).
    pub fn has_graph(&self) -> bool {
        self.attrs
            .iter()
            .any(|a| a.r#type == at::GRAPH || a.r#type == at::GRAPHS || a.g.is_some() || !a.graphs.is_empty())
    }
}

/// The name of attribute type `ty` (`AttributeProto.AttributeType`).
fn type_name(ty: i32) -> Option<&'static str> {
    Some(match ty {
        at::FLOAT => "FLOAT",
        at::INT => "INT",
        at::STRING => "STRING",
        at::TENSOR => "TENSOR",
        at::GRAPH => "GRAPH",
        at::FLOATS => "FLOATS",
        at::INTS => "INTS",
        at::STRINGS => "STRINGS",
        at::TENSORS => "TENSORS",
        at::GRAPHS => "GRAPHS",
        at::SPARSE_TENSOR => "SPARSE_TENSOR",
        at::SPARSE_TENSORS => "SPARSE_TENSORS",
        at::TYPE_PROTO => "TYPE_PROTO",
        at::TYPE_PROTOS => "TYPE_PROTOS",
        _ => return None,
    })
}

/// The value fields an attribute sets, with the type each belongs to. A scalar field
/// holding its default (0, empty) cannot be told from an unset one and is not listed.
fn set_fields(a: &AttributeProto) -> Vec<(&'static str, i32)> {
    let fields = [
        ("f", at::FLOAT, a.f.to_bits() != 0),
        ("i", at::INT, a.i != 0),
        ("s", at::STRING, !a.s.is_empty()),
        ("t", at::TENSOR, a.t.is_some()),
        ("g", at::GRAPH, a.g.is_some()),
        ("floats", at::FLOATS, !a.floats.is_empty()),
        ("ints", at::INTS, !a.ints.is_empty()),
        ("strings", at::STRINGS, !a.strings.is_empty()),
        ("tensors", at::TENSORS, !a.tensors.is_empty()),
        ("graphs", at::GRAPHS, !a.graphs.is_empty()),
        ("sparse_tensor", at::SPARSE_TENSOR, a.sparse_tensor.is_some()),
        ("sparse_tensors", at::SPARSE_TENSORS, !a.sparse_tensors.is_empty()),
        ("tp", at::TYPE_PROTO, a.tp.is_some()),
        ("type_protos", at::TYPE_PROTOS, !a.type_protos.is_empty()),
    ];
    fields
        .into_iter()
        .filter(|&(_, _, set)| set)
        .map(|(name, ty, _)| (name, ty))
        .collect()
}

/// The ONNX checker's rules for a node's attributes: each has a name, appears once, has
/// a defined type, and sets only the value field of that type (a message-valued type
/// must set its field). `ref_attr_name` (a reference to an attribute of the enclosing
/// function) is resolved by inlining, so none may be left here.
pub fn validate(node: &NodeProto) -> Result<(), String> {
    let mut seen = std::collections::HashSet::with_capacity(node.attribute.len());
    for (k, a) in node.attribute.iter().enumerate() {
        let name = &a.name;
        if name.is_empty() {
            return Err(format!("attribute {k} has no name"));
        }
        if !seen.insert(name.as_str()) {
            return Err(format!("attribute `{name}` appears more than once"));
        }
        if !a.ref_attr_name.is_empty() {
            return Err(format!(
                "attribute `{name}` refers to the function attribute `{}`, but the node is not in a function body",
                a.ref_attr_name
            ));
        }
        if a.r#type == 0 {
            return Err(format!(
                "attribute `{name}` has type UNDEFINED (0); its type must be set"
            ));
        }
        let declared =
            type_name(a.r#type).ok_or_else(|| format!("attribute `{name}` has an unknown type {}", a.r#type))?;
        if let Some((field, ty)) = set_fields(a).into_iter().find(|&(_, ty)| ty != a.r#type) {
            return Err(format!(
                "attribute `{name}` is declared {declared} (type {}) but sets the field `{field}` of a {} attribute",
                a.r#type,
                type_name(ty).unwrap_or("?")
            ));
        }
        let message_field = match a.r#type {
            at::TENSOR => Some(("t", a.t.is_some())),
            at::GRAPH => Some(("g", a.g.is_some())),
            at::SPARSE_TENSOR => Some(("sparse_tensor", a.sparse_tensor.is_some())),
            at::TYPE_PROTO => Some(("tp", a.tp.is_some())),
            _ => None,
        };
        if let Some((field, false)) = message_field {
            return Err(format!(
                "attribute `{name}` is declared {declared} but has no value (its field `{field}` is unset)"
            ));
        }
    }
    Ok(())
}
