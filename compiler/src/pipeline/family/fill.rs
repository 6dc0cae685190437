//! Writing a family's graph out at a value without copying its template: a serde
//! `Deserializer` over the template (`&Value`) that hands every integer the derived
//! `Deserialize` of [`Graph`](graphc_ir::Graph) asks for through the family's
//! polynomial at the value, in the order the template's walk meets them (arrays in
//! order, objects in their key order: the order the derived visitors consume them in).
//!
//! `GraphFamily::graph_at` used to clone the template, write the integers into the
//! clone and deserialize it: the clone and the walk were most of a probe's write-out
//! (20 and 10 ms of 55–80 on a 17k-node training step). The caller checks that every
//! integer was met exactly once ([`Filler::met`]) and otherwise writes the graph out
//! the old way, which also names the place of an integer out of range.

use std::cell::Cell;

use serde::de::value::BorrowedStrDeserializer;
use serde::de::{self, DeserializeSeed, EnumAccess, MapAccess, SeqAccess, VariantAccess, Visitor};
use serde::forward_to_deserialize_any;
use serde_json::{Error, Number, Value};

use super::DimPoly;

/// The state of one write-out: the polynomials, the value, how many integers were met.
pub(super) struct Filler<'a> {
    integers: &'a [Option<DimPoly>],
    value: i128,
    next: Cell<usize>,
    /// Set when an integer's value did not fit an `i64`/`u64` (the caller reports it).
    out_of_range: Cell<bool>,
}

impl<'a> Filler<'a> {
    pub(super) fn new(integers: &'a [Option<DimPoly>], value: usize) -> Filler<'a> {
        Filler {
            integers,
            value: i128::try_from(value).unwrap_or(i128::MAX),
            next: Cell::new(0),
            out_of_range: Cell::new(false),
        }
    }

    /// A deserializer of `template` that writes this filler's integers.
    pub(super) fn at<'t>(&'t self, template: &'t Value) -> At<'t> {
        At { v: template, f: self }
    }

    /// Whether every integer was met once and each had a value.
    pub(super) fn met(&self) -> bool {
        self.next.get() == self.integers.len() && !self.out_of_range.get()
    }

    /// The next integer, `n` in the template: its polynomial's value, or `n`.
    fn integer(&self, n: &Number) -> Result<Number, Error> {
        let i = self.next.get();
        self.next.set(i + 1);
        let Some(Some(poly)) = self.integers.get(i) else {
            return Ok(n.clone());
        };
        let number = poly.eval(self.value).and_then(|x| match u64::try_from(x) {
            Ok(u) => Some(Number::from(u)),
            Err(_) => i64::try_from(x).ok().map(Number::from),
        });
        number.ok_or_else(|| {
            self.out_of_range.set(true);
            de::Error::custom("an integer of the family is out of range at this value")
        })
    }
}

/// The deserializer of one template value.
pub(super) struct At<'t> {
    v: &'t Value,
    f: &'t Filler<'t>,
}

impl<'de> de::Deserializer<'de> for At<'de> {
    type Error = Error;

    fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        match self.v {
            Value::Null => visitor.visit_unit(),
            Value::Bool(b) => visitor.visit_bool(*b),
            Value::Number(n) if super::integer(n).is_some() => self.f.integer(n)?.deserialize_any(visitor),
            Value::Number(n) => n.deserialize_any(visitor),
            Value::String(s) => visitor.visit_borrowed_str(s),
            Value::Array(items) => {
                let mut seq = Seq {
                    items: items.iter(),
                    f: self.f,
                };
                let out = visitor.visit_seq(&mut seq)?;
                match seq.items.len() {
                    0 => Ok(out),
                    _ => Err(de::Error::invalid_length(items.len(), &"fewer elements in the array")),
                }
            }
            Value::Object(fields) => visitor.visit_map(Fields {
                fields: fields.iter(),
                value: None,
                f: self.f,
            }),
        }
    }

    fn deserialize_option<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        match self.v {
            Value::Null => visitor.visit_none(),
            _ => visitor.visit_some(self),
        }
    }

    fn deserialize_newtype_struct<V: Visitor<'de>>(self, _name: &'static str, visitor: V) -> Result<V::Value, Error> {
        visitor.visit_newtype_struct(self)
    }

    fn deserialize_enum<V: Visitor<'de>>(
        self,
        _name: &'static str,
        _variants: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, Error> {
        match self.v {
            // A unit variant.
            Value::String(s) => visitor.visit_enum(BorrowedStrDeserializer::<Error>::new(s)),
            // `{"Variant": content}`.
            Value::Object(fields) if fields.len() == 1 => {
                let Some((variant, content)) = fields.iter().next() else {
                    return Err(de::Error::custom("an empty enum object"));
                };
                visitor.visit_enum(Variant {
                    variant,
                    content,
                    f: self.f,
                })
            }
            other => Err(de::Error::invalid_type(unexpected(other), &"an enum")),
        }
    }

    forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string
        bytes byte_buf unit unit_struct seq tuple tuple_struct map struct
        identifier ignored_any
    }
}

fn unexpected(v: &Value) -> de::Unexpected<'_> {
    match v {
        Value::Null => de::Unexpected::Unit,
        Value::Bool(b) => de::Unexpected::Bool(*b),
        Value::Number(_) => de::Unexpected::Other("a number"),
        Value::String(s) => de::Unexpected::Str(s),
        Value::Array(_) => de::Unexpected::Seq,
        Value::Object(_) => de::Unexpected::Map,
    }
}

struct Seq<'t> {
    items: std::slice::Iter<'t, Value>,
    f: &'t Filler<'t>,
}

impl<'de> SeqAccess<'de> for Seq<'de> {
    type Error = Error;

    fn next_element_seed<T: DeserializeSeed<'de>>(&mut self, seed: T) -> Result<Option<T::Value>, Error> {
        match self.items.next() {
            Some(v) => seed.deserialize(At { v, f: self.f }).map(Some),
            None => Ok(None),
        }
    }

    fn size_hint(&self) -> Option<usize> {
        Some(self.items.len())
    }
}

struct Fields<'t> {
    fields: serde_json::map::Iter<'t>,
    value: Option<&'t Value>,
    f: &'t Filler<'t>,
}

impl<'de> MapAccess<'de> for Fields<'de> {
    type Error = Error;

    fn next_key_seed<K: DeserializeSeed<'de>>(&mut self, seed: K) -> Result<Option<K::Value>, Error> {
        match self.fields.next() {
            Some((k, v)) => {
                self.value = Some(v);
                seed.deserialize(BorrowedStrDeserializer::<Error>::new(k)).map(Some)
            }
            None => Ok(None),
        }
    }

    fn next_value_seed<V: DeserializeSeed<'de>>(&mut self, seed: V) -> Result<V::Value, Error> {
        match self.value.take() {
            Some(v) => seed.deserialize(At { v, f: self.f }),
            None => Err(de::Error::custom("a map value asked for before its key")),
        }
    }

    fn size_hint(&self) -> Option<usize> {
        Some(self.fields.len())
    }
}

struct Variant<'t> {
    variant: &'t str,
    content: &'t Value,
    f: &'t Filler<'t>,
}

impl<'de> EnumAccess<'de> for Variant<'de> {
    type Error = Error;
    type Variant = Self;

    fn variant_seed<V: DeserializeSeed<'de>>(self, seed: V) -> Result<(V::Value, Self), Error> {
        let variant = seed.deserialize(BorrowedStrDeserializer::<Error>::new(self.variant))?;
        Ok((variant, self))
    }
}

impl<'de> VariantAccess<'de> for Variant<'de> {
    type Error = Error;

    fn unit_variant(self) -> Result<(), Error> {
        match self.content {
            Value::Null => Ok(()),
            other => Err(de::Error::invalid_type(unexpected(other), &"a unit variant")),
        }
    }

    fn newtype_variant_seed<T: DeserializeSeed<'de>>(self, seed: T) -> Result<T::Value, Error> {
        seed.deserialize(At {
            v: self.content,
            f: self.f,
        })
    }

    fn tuple_variant<V: Visitor<'de>>(self, _len: usize, visitor: V) -> Result<V::Value, Error> {
        de::Deserializer::deserialize_any(
            At {
                v: self.content,
                f: self.f,
            },
            visitor,
        )
    }

    fn struct_variant<V: Visitor<'de>>(self, _fields: &'static [&'static str], visitor: V) -> Result<V::Value, Error> {
        de::Deserializer::deserialize_any(
            At {
                v: self.content,
                f: self.f,
            },
            visitor,
        )
    }
}
