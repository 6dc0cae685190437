//! Tensors with data: constants, weights, interpreter values.
//!
//! `data.rs`: [`TensorData`], the elements by dtype and their byte encodings;
//! `storage.rs`: owned elements or a view into a mapped file; `mapped.rs`:
//! [`MappedFile`] and what a tensor does without decoding its view; `json.rs`: the JSON
//! form (hex bytes, exact).

mod data;
mod json;
mod mapped;
mod storage;

use std::fmt;
use std::sync::Arc;

pub use data::TensorData;
pub use mapped::MappedFile;
use storage::Storage;

use crate::{DType, Rng, Shape, TensorType};

/// A tensor value: a shape and dense row-major data whose length matches it.
///
/// The data is shared: a clone is a new handle to the same elements (weights pass
/// through import, optimization, fusion and planning without a copy), and it may be
/// a view into a mapped file ([`Tensor::mapped`]).
#[derive(Clone, Debug)]
pub struct Tensor {
    shape: Shape,
    data: Arc<Storage>,
    /// [`Tensor::content_hash`], computed once per shared data.
    hash: Arc<std::sync::OnceLock<u128>>,
}

impl PartialEq for Tensor {
    fn eq(&self, other: &Tensor) -> bool {
        if self.shape != other.shape || self.dtype() != other.dtype() {
            return false;
        }
        if Arc::ptr_eq(&self.data, &other.data) {
            return true;
        }
        match (self.data.mapped_bytes(), other.data.mapped_bytes()) {
            (Some(a), Some(b)) => a == b,
            _ => self.data() == other.data(),
        }
    }
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
        Ok(Tensor {
            shape,
            data: Arc::new(Storage::Owned(data)),
            hash: Default::default(),
        })
    }

    /// A tensor of `ty` with every element equal to `value` (cast as [`TensorData::from_f64`]).
    pub fn full(ty: &TensorType, value: f64) -> Tensor {
        Tensor {
            shape: ty.shape.clone(),
            data: Arc::new(Storage::Owned(TensorData::from_f64(ty.dtype, &vec![value; ty.numel()]))),
            hash: Default::default(),
        }
    }

    pub fn zeros(ty: &TensorType) -> Tensor {
        Tensor::full(ty, 0.0)
    }

    /// [`Tensor::zeros`], allocated fallibly and without an f64 copy: an error naming
    /// the bytes when the host cannot provide them.
    pub fn try_zeros(ty: &TensorType) -> Result<Tensor, String> {
        let data = TensorData::try_from_f64_fn(ty.dtype, ty.numel(), || 0.0).ok_or_else(|| {
            format!(
                "cannot allocate {} bytes of host memory for a {ty} tensor",
                ty.size_bytes()
            )
        })?;
        Ok(Tensor {
            shape: ty.shape.clone(),
            data: Arc::new(Storage::Owned(data)),
            hash: Default::default(),
        })
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
            data: Arc::new(Storage::Owned(data)),
            hash: Default::default(),
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
            data: Arc::new(Storage::Owned(data)),
            hash: Default::default(),
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
            data: Arc::new(Storage::Owned(TensorData::from_f64(ty.dtype, &v))),
            hash: Default::default(),
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

    /// The elements (a mapped tensor decodes them once, on first use).
    pub fn data(&self) -> &TensorData {
        self.data.data()
    }

    /// The data, moved out when this is its only handle and owned, else copied.
    pub fn into_data(self) -> TensorData {
        match Arc::try_unwrap(self.data) {
            Ok(Storage::Owned(d)) => d,
            Ok(m) => m.data().clone(),
            Err(shared) => shared.data().clone(),
        }
    }

    /// A 128-bit hash of the dtype, shape and element bytes, computed once per tensor
    /// data (clones share it): the key the e-graph gives a constant instead of its
    /// bytes. Two SipHash-1-3 passes with distinct prefixes; a collision between two
    /// different tensors of one graph has a probability near 2^-128 per pair.
    pub fn content_hash(&self) -> u128 {
        use std::hash::{Hash, Hasher};
        *self.hash.get_or_init(|| {
            let bytes = self.le_bytes();
            let half = |salt: u8| {
                let mut h = std::hash::DefaultHasher::new();
                salt.hash(&mut h);
                self.dtype().hash(&mut h);
                self.shape.dims().hash(&mut h);
                h.write(&bytes);
                h.finish()
            };
            (u128::from(half(1)) << 64) | u128::from(half(2))
        })
    }

    /// The elements as little-endian bytes: borrowed from the mapping for a mapped
    /// tensor (no copy, nothing decoded), encoded for an owned one.
    pub fn le_bytes(&self) -> std::borrow::Cow<'_, [u8]> {
        match self.data.mapped_bytes() {
            Some(b) => std::borrow::Cow::Borrowed(b),
            None => std::borrow::Cow::Owned(self.data().to_le_bytes()),
        }
    }

    /// Whether two tensors share one copy of their data.
    pub fn shares_data(&self, other: &Tensor) -> bool {
        Arc::ptr_eq(&self.data, &other.data)
    }

    pub fn to_f64_vec(&self) -> Vec<f64> {
        self.data().to_f64_vec()
    }

    /// The same data viewed with another shape of equal element count.
    pub fn reshape(self, shape: impl Into<Shape>) -> Result<Tensor, TensorSizeError> {
        let shape = shape.into();
        if shape.numel() != self.data.len() {
            return Err(TensorSizeError {
                expected: shape.numel(),
                got: self.data.len(),
                shape,
            });
        }
        // The hash covers the shape: a new one for the new shape.
        Ok(Tensor {
            shape,
            data: self.data,
            hash: Default::default(),
        })
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
}
