//! Where a tensor's elements live: owned, or a view into a mapped file.

use std::sync::{Arc, OnceLock};

use super::{MappedFile, TensorData};
use crate::DType;

/// A tensor's elements: owned, or little-endian bytes in a mapped file, decoded into an
/// owned copy only when something reads the elements themselves (the interpreter,
/// the CPU executor, constant folding). Its bytes are always at hand without a copy
/// ([`super::Tensor::le_bytes`]: hashing, uploads, writing safetensors).
#[derive(Debug)]
pub(super) enum Storage {
    Owned(TensorData),
    Mapped {
        file: Arc<MappedFile>,
        offset: usize,
        dtype: DType,
        len: usize,
        decoded: OnceLock<TensorData>,
    },
}

impl Storage {
    pub(super) fn dtype(&self) -> DType {
        match self {
            Storage::Owned(d) => d.dtype(),
            Storage::Mapped { dtype, .. } => *dtype,
        }
    }

    pub(super) fn len(&self) -> usize {
        match self {
            Storage::Owned(d) => d.len(),
            Storage::Mapped { len, .. } => *len,
        }
    }

    /// A mapped tensor's bytes (the range was checked against the mapping when it was
    /// made, so `get` always succeeds for one).
    pub(super) fn mapped_bytes(&self) -> Option<&[u8]> {
        match self {
            Storage::Owned(_) => None,
            Storage::Mapped {
                file,
                offset,
                dtype,
                len,
                ..
            } => file.as_bytes().get(*offset..*offset + len * dtype.size_bytes()),
        }
    }

    pub(super) fn data(&self) -> &TensorData {
        match self {
            Storage::Owned(d) => d,
            Storage::Mapped {
                dtype, len, decoded, ..
            } => decoded.get_or_init(|| {
                let bytes = self.mapped_bytes().unwrap_or_default();
                // The range was checked against the mapping when the tensor was made;
                // only running out of host memory fails here, as a Vec would.
                TensorData::decode_le(*dtype, bytes, *len).unwrap_or_else(|e| panic!("decoding a mapped tensor: {e}"))
            }),
        }
    }
}
