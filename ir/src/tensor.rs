//! Tensors with data: constants, weights, interpreter values.

use half::{bf16, f16};
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::fmt;

use crate::{DType, Rng, Shape, TensorType};

/// Dense row-major element storage, one variant per [`DType`].
#[derive(Clone, Debug)]
pub enum TensorData {
    F32(Vec<f32>),
    F16(Vec<f16>),
    BF16(Vec<bf16>),
    F64(Vec<f64>),
    I64(Vec<i64>),
    I32(Vec<i32>),
    I8(Vec<i8>),
    U8(Vec<u8>),
    Bool(Vec<bool>),
}

/// Apply `$body` to the vector inside a [`TensorData`], whatever its element type.
#[macro_export]
macro_rules! with_data {
    ($data:expr, $v:ident => $body:expr) => {
        match $data {
            $crate::TensorData::F32($v) => $body,
            $crate::TensorData::F16($v) => $body,
            $crate::TensorData::BF16($v) => $body,
            $crate::TensorData::F64($v) => $body,
            $crate::TensorData::I64($v) => $body,
            $crate::TensorData::I32($v) => $body,
            $crate::TensorData::I8($v) => $body,
            $crate::TensorData::U8($v) => $body,
            $crate::TensorData::Bool($v) => $body,
        }
    };
}

/// Like [`with_data!`], rebuilding the same variant from the body's vector.
#[macro_export]
macro_rules! map_data {
    ($data:expr, $v:ident => $body:expr) => {
        match $data {
            $crate::TensorData::F32($v) => $crate::TensorData::F32($body),
            $crate::TensorData::F16($v) => $crate::TensorData::F16($body),
            $crate::TensorData::BF16($v) => $crate::TensorData::BF16($body),
            $crate::TensorData::F64($v) => $crate::TensorData::F64($body),
            $crate::TensorData::I64($v) => $crate::TensorData::I64($body),
            $crate::TensorData::I32($v) => $crate::TensorData::I32($body),
            $crate::TensorData::I8($v) => $crate::TensorData::I8($body),
            $crate::TensorData::U8($v) => $crate::TensorData::U8($body),
            $crate::TensorData::Bool($v) => $crate::TensorData::Bool($body),
        }
    };
}

impl TensorData {
    pub fn dtype(&self) -> DType {
        match self {
            TensorData::F32(_) => DType::F32,
            TensorData::F16(_) => DType::F16,
            TensorData::BF16(_) => DType::BF16,
            TensorData::F64(_) => DType::F64,
            TensorData::I64(_) => DType::I64,
            TensorData::I32(_) => DType::I32,
            TensorData::I8(_) => DType::I8,
            TensorData::U8(_) => DType::U8,
            TensorData::Bool(_) => DType::Bool,
        }
    }

    pub fn len(&self) -> usize {
        with_data!(self, v => v.len())
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Gather elements by flat index: `out[i] = self[idx[i]]`.
    ///
    /// # Panics
    ///
    /// When an index is out of range, as slice indexing does; [`TensorData::try_take`]
    /// is the checked form, for indices not computed from this data's own shape.
    // reason: a panicking accessor like `[]`; its callers compute every index from the
    // shape of the tensor the data belongs to (strides, broadcasts, splats).
    #[allow(clippy::indexing_slicing)]
    pub fn take(&self, idx: &[usize]) -> TensorData {
        map_data!(self, v => idx.iter().map(|&i| v[i]).collect())
    }

    /// Gather elements by flat index, or `None` when an index is out of range.
    pub fn try_take(&self, idx: &[usize]) -> Option<TensorData> {
        Some(map_data!(self, v => idx.iter().map(|&i| v.get(i).copied()).collect::<Option<Vec<_>>>()?))
    }

    /// Gather elements by flat index, `None` giving `fill` (of this dtype, its first
    /// element used); `None` when `fill` is empty or of another dtype, or an index is out
    /// of range.
    pub fn take_or(&self, idx: &[Option<usize>], fill: &TensorData) -> Option<TensorData> {
        Some(match (self, fill) {
            (TensorData::F32(v), TensorData::F32(f)) => TensorData::F32(take_fill(v, idx, f)?),
            (TensorData::F16(v), TensorData::F16(f)) => TensorData::F16(take_fill(v, idx, f)?),
            (TensorData::BF16(v), TensorData::BF16(f)) => TensorData::BF16(take_fill(v, idx, f)?),
            (TensorData::F64(v), TensorData::F64(f)) => TensorData::F64(take_fill(v, idx, f)?),
            (TensorData::I64(v), TensorData::I64(f)) => TensorData::I64(take_fill(v, idx, f)?),
            (TensorData::I32(v), TensorData::I32(f)) => TensorData::I32(take_fill(v, idx, f)?),
            (TensorData::I8(v), TensorData::I8(f)) => TensorData::I8(take_fill(v, idx, f)?),
            (TensorData::U8(v), TensorData::U8(f)) => TensorData::U8(take_fill(v, idx, f)?),
            (TensorData::Bool(v), TensorData::Bool(f)) => TensorData::Bool(take_fill(v, idx, f)?),
            _ => return None,
        })
    }

    /// Concatenate several vectors of the same dtype.
    pub fn concat(parts: &[&TensorData]) -> Option<TensorData> {
        let first = parts.first()?;
        let dtype = first.dtype();
        if parts.iter().any(|p| p.dtype() != dtype) {
            return None;
        }
        // Through the little-endian bytes: exact for every dtype.
        let mut all = Vec::new();
        for p in parts {
            all.extend_from_slice(&p.to_le_bytes());
        }
        let n = all.len() / dtype.size_bytes();
        TensorData::from_le_bytes(dtype, &all, n)
    }

    /// Every element as f64 (bool as 0/1). Exact for all dtypes but large i64.
    pub fn to_f64_vec(&self) -> Vec<f64> {
        match self {
            TensorData::F32(v) => v.iter().map(|&x| x as f64).collect(),
            TensorData::F16(v) => v.iter().map(|&x| x.to_f64()).collect(),
            TensorData::BF16(v) => v.iter().map(|&x| x.to_f64()).collect(),
            TensorData::F64(v) => v.clone(),
            TensorData::I64(v) => v.iter().map(|&x| x as f64).collect(),
            TensorData::I32(v) => v.iter().map(|&x| x as f64).collect(),
            TensorData::I8(v) => v.iter().map(|&x| x as f64).collect(),
            TensorData::U8(v) => v.iter().map(|&x| x as f64).collect(),
            TensorData::Bool(v) => v.iter().map(|&x| x as u8 as f64).collect(),
        }
    }

    /// Build from f64 values with cast semantics: floats round to nearest, integers
    /// truncate toward zero and saturate (NaN to 0), bool is `x != 0`.
    pub fn from_f64(dtype: DType, v: &[f64]) -> TensorData {
        match dtype {
            DType::F32 => TensorData::F32(v.iter().map(|&x| x as f32).collect()),
            DType::F16 => TensorData::F16(v.iter().map(|&x| crate::interp::f16_from_f64(x)).collect()),
            DType::BF16 => TensorData::BF16(v.iter().map(|&x| crate::interp::bf16_from_f64(x)).collect()),
            DType::F64 => TensorData::F64(v.to_vec()),
            DType::I64 => TensorData::I64(v.iter().map(|&x| x as i64).collect()),
            DType::I32 => TensorData::I32(v.iter().map(|&x| x as i32).collect()),
            DType::I8 => TensorData::I8(v.iter().map(|&x| x as i8).collect()),
            DType::U8 => TensorData::U8(v.iter().map(|&x| x as u8).collect()),
            DType::Bool => TensorData::Bool(v.iter().map(|&x| x != 0.0).collect()),
        }
    }

    /// Little-endian bytes (bool as one byte 0/1), the layout of safetensors and npy.
    pub fn to_le_bytes(&self) -> Vec<u8> {
        match self {
            TensorData::F32(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
            TensorData::F16(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
            TensorData::BF16(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
            TensorData::F64(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
            TensorData::I64(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
            TensorData::I32(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
            TensorData::I8(v) => v.iter().map(|&x| x as u8).collect(),
            TensorData::U8(v) => v.clone(),
            TensorData::Bool(v) => v.iter().map(|&x| x as u8).collect(),
        }
    }

    /// Parse `n` little-endian elements; `None` when the byte count is wrong or the
    /// host cannot allocate them ([`TensorData::decode_le`] says which).
    pub fn from_le_bytes(dtype: DType, bytes: &[u8], n: usize) -> Option<TensorData> {
        TensorData::decode_le(dtype, bytes, n).ok()
    }

    /// Parse `n` little-endian elements, allocating fallibly: a wrong byte count or too
    /// little host memory is an error saying which.
    pub fn decode_le(dtype: DType, bytes: &[u8], n: usize) -> Result<TensorData, String> {
        let needed = n.checked_mul(dtype.size_bytes());
        if needed != Some(bytes.len()) {
            return Err(format!(
                "{} bytes do not hold {n} {dtype} elements ({} bytes)",
                bytes.len(),
                needed.map_or_else(|| "too many".to_string(), |b| b.to_string())
            ));
        }
        fn chunks<const N: usize, T>(b: &[u8], f: impl Fn([u8; N]) -> T) -> Option<Vec<T>> {
            try_collect(
                b.len() / N,
                b.chunks_exact(N).map(|c| {
                    let mut a = [0u8; N];
                    a.copy_from_slice(c);
                    f(a)
                }),
            )
        }
        let data = match dtype {
            DType::F32 => chunks(bytes, f32::from_le_bytes).map(TensorData::F32),
            DType::F16 => chunks(bytes, f16::from_le_bytes).map(TensorData::F16),
            DType::BF16 => chunks(bytes, bf16::from_le_bytes).map(TensorData::BF16),
            DType::F64 => chunks(bytes, f64::from_le_bytes).map(TensorData::F64),
            DType::I64 => chunks(bytes, i64::from_le_bytes).map(TensorData::I64),
            DType::I32 => chunks(bytes, i32::from_le_bytes).map(TensorData::I32),
            DType::I8 => try_collect(n, bytes.iter().map(|&b| b as i8)).map(TensorData::I8),
            DType::U8 => try_collect(n, bytes.iter().copied()).map(TensorData::U8),
            DType::Bool => try_collect(n, bytes.iter().map(|&b| b != 0)).map(TensorData::Bool),
        };
        data.ok_or_else(|| {
            format!(
                "cannot allocate {} bytes of host memory for {n} {dtype} elements",
                bytes.len()
            )
        })
    }

    /// `n` elements of `dtype` from f64 values (cast semantics, as [`TensorData::from_f64`]),
    /// allocated fallibly: `None` when the host cannot provide them.
    pub fn try_from_f64_fn(dtype: DType, n: usize, mut f: impl FnMut() -> f64) -> Option<TensorData> {
        let it = std::iter::from_fn(|| Some(f()));
        let take = |n| it.take(n);
        Some(match dtype {
            DType::F32 => TensorData::F32(try_collect(n, take(n).map(|x| x as f32))?),
            DType::F16 => TensorData::F16(try_collect(n, take(n).map(crate::interp::f16_from_f64))?),
            DType::BF16 => TensorData::BF16(try_collect(n, take(n).map(crate::interp::bf16_from_f64))?),
            DType::F64 => TensorData::F64(try_collect(n, take(n))?),
            DType::I64 => TensorData::I64(try_collect(n, take(n).map(|x| x as i64))?),
            DType::I32 => TensorData::I32(try_collect(n, take(n).map(|x| x as i32))?),
            DType::I8 => TensorData::I8(try_collect(n, take(n).map(|x| x as i8))?),
            DType::U8 => TensorData::U8(try_collect(n, take(n).map(|x| x as u8))?),
            DType::Bool => TensorData::Bool(try_collect(n, take(n).map(|x| x != 0.0))?),
        })
    }
}

/// Collect `n` items into a vector reserved fallibly; `None` when the host cannot
/// provide the memory.
fn try_collect<T>(n: usize, items: impl Iterator<Item = T>) -> Option<Vec<T>> {
    let mut v = Vec::new();
    v.try_reserve_exact(n).ok()?;
    v.extend(items.take(n));
    Some(v)
}

fn take_fill<T: Copy>(v: &[T], idx: &[Option<usize>], fill: &[T]) -> Option<Vec<T>> {
    let &fill = fill.first()?;
    idx.iter()
        .map(|i| i.map_or(Some(fill), |i| v.get(i).copied()))
        .collect()
}

/// Bitwise equality: NaN equals NaN with the same bits, -0.0 differs from 0.0.
/// That is the equality a round trip must preserve.
impl PartialEq for TensorData {
    fn eq(&self, other: &TensorData) -> bool {
        self.dtype() == other.dtype() && self.to_le_bytes() == other.to_le_bytes()
    }
}

/// A tensor value: a shape and dense row-major data whose length matches it.
#[derive(Clone, Debug, PartialEq)]
pub struct Tensor {
    shape: Shape,
    data: TensorData,
}

/// Error building a tensor whose data does not match its shape.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("tensor of shape {shape} needs {expected} elements, got {got}")]
pub struct TensorSizeError {
    pub shape: Shape,
    pub expected: usize,
    pub got: usize,
}

impl Tensor {
    pub fn new(shape: impl Into<Shape>, data: TensorData) -> Result<Tensor, TensorSizeError> {
        let shape = shape.into();
        if shape.numel() != data.len() {
            return Err(TensorSizeError {
                expected: shape.numel(),
                got: data.len(),
                shape,
            });
        }
        Ok(Tensor { shape, data })
    }

    /// A tensor of `ty` with every element equal to `value` (cast as [`TensorData::from_f64`]).
    pub fn full(ty: &TensorType, value: f64) -> Tensor {
        Tensor {
            shape: ty.shape.clone(),
            data: TensorData::from_f64(ty.dtype, &vec![value; ty.numel()]),
        }
    }

    pub fn zeros(ty: &TensorType) -> Tensor {
        Tensor::full(ty, 0.0)
    }

    /// A rank-0 tensor.
    pub fn scalar(dtype: DType, value: f64) -> Tensor {
        Tensor::full(&TensorType::new(dtype, Shape::scalar()), value)
    }

    pub fn from_f32(shape: impl Into<Shape>, v: Vec<f32>) -> Result<Tensor, TensorSizeError> {
        Tensor::new(shape, TensorData::F32(v))
    }

    /// Values from f64 with cast semantics into `dtype`.
    pub fn from_f64(dtype: DType, shape: impl Into<Shape>, v: &[f64]) -> Result<Tensor, TensorSizeError> {
        Tensor::new(shape, TensorData::from_f64(dtype, v))
    }

    /// Deterministic random values: floats uniform in [-1, 1), signed integers in [-8, 8),
    /// u8 in [0, 16), bools fair.
    pub fn random(ty: &TensorType, seed: u64) -> Tensor {
        let mut rng = Rng::new(seed);
        let n = ty.numel();
        let data = match ty.dtype {
            DType::Bool => TensorData::Bool((0..n).map(|_| rng.bool()).collect()),
            DType::U8 => TensorData::U8((0..n).map(|_| rng.below(16) as u8).collect()),
            d if d.is_int() => TensorData::from_f64(d, &(0..n).map(|_| rng.below(16) as f64 - 8.0).collect::<Vec<_>>()),
            d => TensorData::from_f64(d, &(0..n).map(|_| rng.uniform(-1.0, 1.0)).collect::<Vec<_>>()),
        };
        Tensor {
            shape: ty.shape.clone(),
            data,
        }
    }

    /// [`Tensor::random`] (the same values), allocated fallibly: an error naming the
    /// bytes when the host cannot provide them.
    pub fn try_random(ty: &TensorType, seed: u64) -> Result<Tensor, String> {
        let mut rng = Rng::new(seed);
        let dtype = ty.dtype;
        let data = TensorData::try_from_f64_fn(dtype, ty.numel(), || match dtype {
            DType::Bool => rng.bool() as u8 as f64,
            DType::U8 => rng.below(16) as f64,
            d if d.is_int() => rng.below(16) as f64 - 8.0,
            _ => rng.uniform(-1.0, 1.0),
        })
        .ok_or_else(|| {
            format!(
                "cannot allocate {} bytes of host memory for a {ty} tensor",
                ty.size_bytes()
            )
        })?;
        Ok(Tensor {
            shape: ty.shape.clone(),
            data,
        })
    }

    /// Deterministic normal values with standard deviation `std` (floats only; other
    /// dtypes get [`Tensor::random`]).
    pub fn randn(ty: &TensorType, std: f64, seed: u64) -> Tensor {
        if !ty.dtype.is_float() {
            return Tensor::random(ty, seed);
        }
        let mut rng = Rng::new(seed);
        let v: Vec<f64> = (0..ty.numel()).map(|_| rng.normal() * std).collect();
        Tensor {
            shape: ty.shape.clone(),
            data: TensorData::from_f64(ty.dtype, &v),
        }
    }

    pub fn shape(&self) -> &Shape {
        &self.shape
    }

    pub fn dtype(&self) -> DType {
        self.data.dtype()
    }

    pub fn ty(&self) -> TensorType {
        TensorType::new(self.dtype(), self.shape.clone())
    }

    pub fn numel(&self) -> usize {
        self.data.len()
    }

    pub fn data(&self) -> &TensorData {
        &self.data
    }

    pub fn into_data(self) -> TensorData {
        self.data
    }

    pub fn to_f64_vec(&self) -> Vec<f64> {
        self.data.to_f64_vec()
    }

    /// The same data viewed with another shape of equal element count.
    pub fn reshape(self, shape: impl Into<Shape>) -> Result<Tensor, TensorSizeError> {
        Tensor::new(shape, self.data)
    }
}

impl fmt::Display for Tensor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}{} ", self.dtype(), self.shape)?;
        let v = self.to_f64_vec();
        let shown = v.len().min(8);
        f.write_str("[")?;
        for (i, x) in v.iter().take(shown).enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            write!(f, "{x}")?;
        }
        if v.len() > shown {
            write!(f, ", ... ({} more)", v.len() - shown)?;
        }
        f.write_str("]")
    }
}

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
        let bytes = self.data.to_le_bytes();
        let mut hex = String::with_capacity(bytes.len() * 2);
        for b in bytes {
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
        Ok(Tensor { shape: r.shape, data })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn try_random_gives_the_values_of_random() {
        for dtype in DType::ALL {
            let ty = TensorType::new(dtype, [3, 7]);
            assert_eq!(Tensor::try_random(&ty, 11).unwrap(), Tensor::random(&ty, 11), "{dtype}");
        }
    }

    #[test]
    fn decode_le_checks_the_byte_count() {
        assert!(TensorData::decode_le(DType::F32, &[0; 7], 2).is_err());
        assert!(TensorData::decode_le(DType::F32, &[0; 8], usize::MAX).is_err());
        assert_eq!(
            TensorData::decode_le(DType::I32, &[1, 0, 0, 0, 2, 0, 0, 0], 2).unwrap(),
            TensorData::I32(vec![1, 2])
        );
    }
}
