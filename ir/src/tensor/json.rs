//! The JSON form of a tensor.

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::sync::Arc;

use super::storage::Storage;
use super::{Tensor, TensorData};
use crate::{DType, Shape};

/// JSON form: `{"dtype": "f32", "shape": [2], "hex": "0000803f..."}`, little-endian
/// bytes in hex: exact for every value, NaN and infinities included.
#[derive(Serialize, Deserialize)]
struct TensorRepr {
    dtype: DType,
    shape: Shape,
    hex: String,
}

impl Serialize for Tensor {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let bytes = self.le_bytes();
        let mut hex = String::with_capacity(bytes.len() * 2);
        for b in bytes.iter() {
            hex.push_str(&format!("{b:02x}"));
        }
        TensorRepr {
            dtype: self.dtype(),
            shape: self.shape.clone(),
            hex,
        }
        .serialize(s)
    }
}

impl<'de> Deserialize<'de> for Tensor {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Tensor, D::Error> {
        use serde::de::Error;
        let r = TensorRepr::deserialize(d)?;
        if r.hex.len() % 2 != 0 || !r.hex.is_ascii() {
            return Err(D::Error::custom(
                "tensor hex data has odd length or non-ascii characters",
            ));
        }
        let bytes = r
            .hex
            .as_bytes()
            .chunks_exact(2)
            .map(|pair| {
                let pair = std::str::from_utf8(pair).map_err(|e| e.to_string())?;
                u8::from_str_radix(pair, 16).map_err(|e| e.to_string())
            })
            .collect::<Result<Vec<u8>, String>>()
            .map_err(|e| D::Error::custom(format!("tensor hex data: {e}")))?;
        let n = r.shape.numel();
        let data = TensorData::from_le_bytes(r.dtype, &bytes, n).ok_or_else(|| {
            D::Error::custom(format!(
                "tensor {}{} needs {} bytes, got {}",
                r.dtype,
                r.shape,
                n.saturating_mul(r.dtype.size_bytes()),
                bytes.len()
            ))
        })?;
        Ok(Tensor {
            shape: r.shape,
            data: Arc::new(Storage::Owned(data)),
            hash: Default::default(),
        })
    }
}
