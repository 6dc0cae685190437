//! Serde for an f64 that survives JSON exactly: finite values as numbers, others as
//! strings (`"inf"`, `"-inf"`, `"nan(0x<bits>)"`).

use serde::{de::Error, Deserialize, Deserializer, Serializer};

pub fn serialize<S: Serializer>(x: &f64, s: S) -> Result<S::Ok, S::Error> {
    if x.is_finite() {
        s.serialize_f64(*x)
    } else if x.is_nan() {
        s.serialize_str(&format!("nan(0x{:x})", x.to_bits()))
    } else if *x > 0.0 {
        s.serialize_str("inf")
    } else {
        s.serialize_str("-inf")
    }
}

#[derive(Deserialize)]
#[serde(untagged)]
enum Repr {
    Num(f64),
    Str(String),
}

pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<f64, D::Error> {
    match Repr::deserialize(d)? {
        Repr::Num(x) => Ok(x),
        Repr::Str(s) => match s.as_str() {
            "inf" => Ok(f64::INFINITY),
            "-inf" => Ok(f64::NEG_INFINITY),
            _ => s
                .strip_prefix("nan(0x")
                .and_then(|h| h.strip_suffix(')'))
                .and_then(|h| u64::from_str_radix(h, 16).ok())
                .map(f64::from_bits)
                .filter(|x| x.is_nan())
                .ok_or_else(|| {
                    D::Error::custom(format!(
                        "expected a number, \"inf\", \"-inf\" or \"nan(0x..)\", got {s:?}"
                    ))
                }),
        },
    }
}
