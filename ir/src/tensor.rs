//! Tensors with data: constants, weights, interpreter values.

use half::{bf16, f16};
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::fmt;
use std::sync::Arc;

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

/// A file mapped read-only into memory, shared by the tensors that view it (ONNX
/// external data, safetensors): its pages are read from the page cache when touched,
/// never copied into owned buffers.
pub struct MappedFile {
    map: memmap2::Mmap,
    path: std::path::PathBuf,
    /// What names this file's contents as mapped (`crate::fold_cache`): its canonical
    /// path, size, modification time, device and inode, from the mapped descriptor.
    identity: Option<String>,
}

impl MappedFile {
    /// Map `file` (opened from `path`, a regular file) read-only; None for an empty file.
    pub fn map(file: &std::fs::File, path: &std::path::Path) -> std::io::Result<Option<Arc<MappedFile>>> {
        MappedFile::map_named(file, path, None)
    }

    /// [`MappedFile::map`] with the identity given (`None`: the file's own).
    pub(crate) fn map_named(
        file: &std::fs::File,
        path: &std::path::Path,
        identity: Option<String>,
    ) -> std::io::Result<Option<Arc<MappedFile>>> {
        if file.metadata()?.len() == 0 {
            return Ok(None);
        }
        // SAFETY: the mapping is read-only and lives as long as the tensors that view
        // it. As with every loader that maps model files (safetensors, llama.cpp), a
        // file truncated or rewritten by another process while mapped is outside what
        // this can guard against.
        let map = unsafe { memmap2::Mmap::map(file)? };
        Ok(Some(Arc::new(MappedFile {
            map,
            path: path.to_path_buf(),
            identity: identity.or_else(|| file_identity(file, path)),
        })))
    }

    /// The identity of the mapped contents (`None` where the system does not say):
    /// a file rewritten in place gets a new modification time, so a new identity.
    pub fn identity(&self) -> Option<&str> {
        self.identity.as_deref()
    }

    pub fn len(&self) -> usize {
        self.map.len()
    }

    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    pub fn path(&self) -> &std::path::Path {
        &self.path
    }

    /// The file's bytes.
    pub fn as_bytes(&self) -> &[u8] {
        &self.map
    }

    /// Give the pages of `offset..offset + len` back (best effort): they leave this
    /// process's resident memory and are read from the page cache again if touched.
    /// For a weight read once by a fold, so that its pages do not stay resident.
    pub fn release(&self, offset: usize, len: usize) {
        if offset.checked_add(len).is_none_or(|end| end > self.map.len()) || len == 0 {
            return;
        }
        // SAFETY: the mapping is private and read-only, so nothing in it differs from the
        // file: after MADV_DONTNEED a later read faults the same bytes back in, and
        // references into the range stay valid. Failure only means the pages stay.
        let _ = unsafe {
            self.map
                .unchecked_advise_range(memmap2::UncheckedAdvice::DontNeed, offset, len)
        };
    }
}

#[cfg(unix)]
fn file_identity(file: &std::fs::File, path: &std::path::Path) -> Option<String> {
    use std::os::unix::fs::MetadataExt;
    let meta = file.metadata().ok()?;
    let path = std::fs::canonicalize(path).ok()?;
    Some(format!(
        "{}\0{}\0{}.{}\0{}:{}",
        path.display(),
        meta.len(),
        meta.mtime(),
        meta.mtime_nsec(),
        meta.dev(),
        meta.ino()
    ))
}

#[cfg(not(unix))]
fn file_identity(_: &std::fs::File, _: &std::path::Path) -> Option<String> {
    None
}

impl fmt::Debug for MappedFile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "MappedFile({}, {} bytes)", self.path.display(), self.map.len())
    }
}

/// A tensor's elements: owned, or little-endian bytes in a mapped file, decoded into an
/// owned copy only when something reads the elements themselves (the interpreter,
/// the CPU executor, constant folding). Its bytes are always at hand without a copy
/// ([`Tensor::le_bytes`]: hashing, uploads, writing safetensors).
#[derive(Debug)]
enum Storage {
    Owned(TensorData),
    Mapped {
        file: Arc<MappedFile>,
        offset: usize,
        dtype: DType,
        len: usize,
        decoded: std::sync::OnceLock<TensorData>,
    },
}

impl Storage {
    fn dtype(&self) -> DType {
        match self {
            Storage::Owned(d) => d.dtype(),
            Storage::Mapped { dtype, .. } => *dtype,
        }
    }

    fn len(&self) -> usize {
        match self {
            Storage::Owned(d) => d.len(),
            Storage::Mapped { len, .. } => *len,
        }
    }

    /// A mapped tensor's bytes (the range was checked against the mapping when it was
    /// made, so `get` always succeeds for one).
    fn mapped_bytes(&self) -> Option<&[u8]> {
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

    fn data(&self) -> &TensorData {
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

    /// A view of `len` elements of `dtype`, little-endian, at byte `offset` of a mapped
    /// file; an error when they do not lie inside it.
    pub fn mapped(shape: impl Into<Shape>, dtype: DType, file: Arc<MappedFile>, offset: u64) -> Result<Tensor, String> {
        let shape = shape.into();
        let len = shape
            .checked_numel()
            .ok_or_else(|| format!("shape {shape} is too large"))?;
        (len as u64)
            .checked_mul(dtype.size_bytes() as u64)
            .and_then(|b| b.checked_add(offset))
            .filter(|&e| e <= file.len() as u64)
            .ok_or_else(|| {
                format!(
                    "{dtype}{shape} at byte {offset} does not lie inside {} ({} bytes)",
                    file.path().display(),
                    file.len()
                )
            })?;
        Ok(Tensor {
            shape,
            data: Arc::new(Storage::Mapped {
                file,
                offset: offset as usize,
                dtype,
                len,
                decoded: std::sync::OnceLock::new(),
            }),
            hash: Default::default(),
        })
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

    /// The same elements as a tensor of its own: for a mapped tensor not yet decoded, a
    /// decoded copy that is not kept on the mapped one (the transient input of a fold
    /// that reads a weight once, such as a cast); otherwise a handle to the same data.
    pub fn detached(&self) -> Tensor {
        match &*self.data {
            Storage::Mapped {
                dtype, len, decoded, ..
            } if decoded.get().is_none() => {
                let bytes = self.data.mapped_bytes().unwrap_or_default();
                let decoded = TensorData::decode_le(*dtype, bytes, *len);
                if let Storage::Mapped { file, offset, .. } = &*self.data {
                    file.release(*offset, bytes.len());
                }
                match decoded {
                    Ok(d) => Tensor {
                        shape: self.shape.clone(),
                        data: Arc::new(Storage::Owned(d)),
                        hash: self.hash.clone(),
                    },
                    Err(_) => self.clone(),
                }
            }
            _ => self.clone(),
        }
    }

    /// Gives the pages of a mapped tensor that is not decoded back to the system
    /// (`MappedFile::release`): after a fold that read it once straight from the
    /// mapping. Nothing for other tensors.
    pub fn release_pages(&self) {
        if let Storage::Mapped {
            file, offset, decoded, ..
        } = &*self.data
        {
            if decoded.get().is_none() {
                let n = self.data.mapped_bytes().map_or(0, <[u8]>::len);
                file.release(*offset, n);
            }
        }
    }

    /// `f(self)` for a mapped tensor, remembered for the process while any result is
    /// alive: the same mapped bytes (file, size, range, dtype) under the same `op` key
    /// give the earlier result's data without computing it again (a cast of a weight
    /// that each probe of a fit re-imports); and, for a large result, across processes
    /// by the on-disk fold cache (`crate::fold_cache`: the next compile of the model
    /// maps it). Other tensors just compute `f(self)`.
    pub fn memoized_fold(&self, op: &str, f: impl FnOnce(&Tensor) -> Option<Tensor>) -> Option<Tensor> {
        use std::collections::HashMap;
        use std::sync::{Mutex, OnceLock, Weak};
        type Key = (std::path::PathBuf, usize, usize, usize, DType, String);
        type Memo = Mutex<HashMap<Key, (Shape, Weak<Storage>)>>;
        static MEMO: OnceLock<Memo> = OnceLock::new();
        let Storage::Mapped {
            file,
            offset,
            dtype,
            len,
            ..
        } = &*self.data
        else {
            return f(self);
        };
        let key = (
            file.path().to_path_buf(),
            file.len(),
            *offset,
            *len,
            *dtype,
            op.to_string(),
        );
        let memo = MEMO.get_or_init(Default::default);
        if let Ok(m) = memo.lock() {
            if let Some((shape, data)) = m.get(&key).and_then(|(s, w)| Some((s.clone(), w.upgrade()?))) {
                return Some(Tensor {
                    shape,
                    data,
                    hash: Default::default(),
                });
            }
        }
        // The next tier: a fold an earlier process stored on disk.
        let entry = crate::fold_cache::Entry::new(file, *offset, *len, *dtype, op);
        let out = match entry.as_ref().and_then(crate::fold_cache::Entry::load) {
            Some(t) => t,
            None => {
                let out = f(self)?;
                entry.and_then(|e| e.store(&out)).unwrap_or(out)
            }
        };
        if let Ok(mut m) = memo.lock() {
            m.retain(|_, (_, w)| w.strong_count() > 0);
            m.insert(key, (out.shape.clone(), Arc::downgrade(&out.data)));
        }
        Some(out)
    }

    /// Whether the elements are a view into a mapped file, and whether they have been
    /// decoded into an owned copy.
    pub fn is_mapped(&self) -> bool {
        matches!(*self.data, Storage::Mapped { .. })
    }

    pub fn is_decoded(&self) -> bool {
        match &*self.data {
            Storage::Owned(_) => true,
            Storage::Mapped { decoded, .. } => decoded.get().is_some(),
        }
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

    /// Whether two tensors are equal without reading a mapped one: shared data, or
    /// views of the same range of the same file (two imports of one model), or else
    /// equal elements. Mapped views of different ranges are compared byte for byte.
    pub fn same_as(&self, other: &Tensor) -> bool {
        if self.shape != other.shape || self.dtype() != other.dtype() {
            return false;
        }
        match (&*self.data, &*other.data) {
            (
                Storage::Mapped {
                    file: f,
                    offset: o,
                    len: n,
                    ..
                },
                Storage::Mapped {
                    file: g,
                    offset: p,
                    len: m,
                    ..
                },
            ) if f.path() == g.path() && f.len() == g.len() && o == p && n == m => true,
            _ => self == other,
        }
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
