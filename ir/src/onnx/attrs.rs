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
            // Type 0 (UNDEFINED) appears in hand-made models: trust the field.
            Some(a) if a.r#type == ty || a.r#type == 0 => Ok(Some(a)),
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
        self.attrs.iter().any(|a| a.r#type == at::GRAPH || a.g.is_some())
    }
}
