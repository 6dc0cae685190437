//! [`TensorData`]: the elements of a tensor, one vector per dtype, and the byte
//! encodings they are read from and written to.

use half::{bf16, f16};

use crate::DType;

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
        fn bits<T, B: PartialEq>(a: &[T], b: &[T], f: impl Fn(&T) -> B) -> bool {
            a.len() == b.len() && a.iter().zip(b).all(|(x, y)| f(x) == f(y))
        }
        match (self, other) {
            (TensorData::F32(a), TensorData::F32(b)) => bits(a, b, |x| x.to_bits()),
            (TensorData::F16(a), TensorData::F16(b)) => bits(a, b, |x| x.to_bits()),
            (TensorData::BF16(a), TensorData::BF16(b)) => bits(a, b, |x| x.to_bits()),
            (TensorData::F64(a), TensorData::F64(b)) => bits(a, b, |x| x.to_bits()),
            (TensorData::I64(a), TensorData::I64(b)) => a == b,
            (TensorData::I32(a), TensorData::I32(b)) => a == b,
            (TensorData::I8(a), TensorData::I8(b)) => a == b,
            (TensorData::U8(a), TensorData::U8(b)) => a == b,
            (TensorData::Bool(a), TensorData::Bool(b)) => a == b,
            _ => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
