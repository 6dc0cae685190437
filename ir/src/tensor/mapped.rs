//! Tensors that view a mapped file: [`MappedFile`], and the [`Tensor`] methods for
//! views (made over a range, a decoded copy that is not kept, pages given back, folds
//! remembered per process and on disk, views compared by range).

use std::fmt;
use std::sync::Arc;

use super::storage::Storage;
use super::{Tensor, TensorData};
use crate::{DType, Shape};

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

impl Tensor {
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
}
