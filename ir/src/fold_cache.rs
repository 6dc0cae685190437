//! The on-disk tier of [`Tensor::memoized_fold`]: what folding makes of a mapped weight
//! (a cast to bf16, an int8/int4 quantization), when it is large, is written once as a
//! safetensors file, and the next compile of the same model with the same options maps
//! it instead of computing it again. A bf16 or int4 plan of a multi-GB model then reads
//! its folded weights as it reads the model's own: mapped, zero-copy.
//!
//! An entry is keyed by a 128-bit hash of the source file's identity as the mapping saw
//! it ([`MappedFile::identity`]: canonical path, size, modification time, device,
//! inode), the weight's range and dtype in it, and the fold (`op`: the operation with
//! its attributes, which carry the compile options it depends on — the target type,
//! the bits and group of a quantization). The identity stands in for a hash of the
//! contents: hashing a weights file of several GB costs seconds, which is what the
//! cache saves, and a file rewritten in place gets a new modification time, so new keys.
//!
//! The folder is `$GRAPHC_FOLD_CACHE` (`off` turns the cache off), else `folds/` in
//! graphc's cache folder ([`crate::files::default_cache_dir`], where compiled kernels
//! go). Only folds of weights of at least [`MIN_BYTES`] are stored: small ones cost
//! less to recompute than a file. The cache never fails a compile: an entry that is missing,
//! not a regular file, or unreadable is a miss (the fold is computed), and a store that
//! fails (a read-only or full disk) is skipped. Entries are written beside their name
//! and renamed over it ([`crate::files::write_file_with`]), so a reader never maps half
//! a file; nothing evicts them (`rm -r` the folder to reclaim the space).

use std::hash::{Hash, Hasher};
use std::io::Write;
use std::path::PathBuf;

use crate::tensor::MappedFile;
use crate::{DType, Tensor};

/// The smallest weight whose folds are worth a file: 1 MiB (a fold costs about what
/// reading its source costs; the scales of a quantization are small but need the
/// whole quantization to compute).
pub const MIN_BYTES: usize = 1 << 20;

/// Bumped when what a key names changes (the file layout or a fold's meaning).
const FORMAT: u32 = 1;

/// The name of the one tensor in an entry's file.
const TENSOR: &str = "fold";

/// The cache folder, or `None` when the cache is off.
pub fn dir() -> Option<PathBuf> {
    match std::env::var_os("GRAPHC_FOLD_CACHE") {
        Some(v) if v == "off" => None,
        Some(v) if !v.is_empty() => Some(PathBuf::from(v)),
        _ => crate::files::default_cache_dir().map(|d| d.join("folds")),
    }
}

/// One fold of one mapped weight: where its file is (or would be).
#[derive(Debug)]
pub struct Entry {
    /// The key, which is also the identity of the entry's contents once mapped: a fold
    /// of a fold (the quantization of a cast) is keyed by what it was made from, not by
    /// where the entry's file lies.
    key: String,
    path: PathBuf,
    /// The bytes of the weight folded: what computing the fold again reads.
    source_bytes: usize,
}

impl Entry {
    /// The entry of `op` applied to the `len` elements of `dtype` at `offset` in `file`;
    /// `None` when the cache is off or the file has no identity.
    pub fn new(file: &MappedFile, offset: usize, len: usize, dtype: DType, op: &str) -> Option<Entry> {
        let identity = file.identity()?;
        let half = |salt: u8| {
            let mut h = std::hash::DefaultHasher::new();
            (salt, FORMAT, identity, offset, len, dtype, op).hash(&mut h);
            h.finish()
        };
        let key = (u128::from(half(1)) << 64) | u128::from(half(2));
        let key = format!("{key:032x}");
        Some(Entry {
            path: dir()?.join(format!("{key}.safetensors")),
            key: format!("fold-cache\0{key}"),
            source_bytes: len.saturating_mul(dtype.size_bytes()),
        })
    }

    /// The stored fold, mapped; `None` on a miss.
    pub fn load(&self) -> Option<Tensor> {
        if !self.path.exists() {
            return None;
        }
        let mut tensors = crate::weights::load_safetensors_named(&self.path, Some(self.key.clone())).ok()?;
        tensors.remove(TENSOR)
    }

    /// Store `t` when its source is large enough, and give it back mapped from its entry, so
    /// that its owned copy can go and a fold of it is itself a fold of a mapped tensor
    /// (a quantization of a cast). Best effort: `None` when not stored.
    pub fn store(&self, t: &Tensor) -> Option<Tensor> {
        if self.source_bytes < MIN_BYTES {
            return None;
        }
        crate::files::create_output_dir(self.path.parent()?).ok()?;
        crate::files::write_file_with(&self.path, |f| write_safetensors(f, t)).ok()?;
        self.load().filter(|back| back.ty() == t.ty())
    }
}

/// One tensor as a safetensors file, its bytes streamed after the header (no
/// serialized copy of a tensor of hundreds of MB).
fn write_safetensors(out: &mut impl Write, t: &Tensor) -> std::io::Result<()> {
    let bytes = t.le_bytes();
    let dtype = crate::weights::st_dtype(t.dtype()).to_string();
    let header = serde_json::json!({
        TENSOR: { "dtype": dtype, "shape": t.shape().dims(), "data_offsets": [0, bytes.len()] }
    })
    .to_string();
    // The header is padded with spaces to a multiple of 8 bytes, as the format asks.
    let padded = header.len().next_multiple_of(8);
    out.write_all(&(padded as u64).to_le_bytes())?;
    out.write_all(header.as_bytes())?;
    out.write_all(&b" ".repeat(padded - header.len()))?;
    out.write_all(&bytes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Shape, TensorType};

    #[test]
    fn an_entry_round_trips_every_dtype() {
        let dir = std::env::temp_dir().join(format!("graphc-fold-cache-{}", std::process::id()));
        for (i, dtype) in [DType::F32, DType::BF16, DType::I8, DType::U8, DType::Bool, DType::F64]
            .into_iter()
            .enumerate()
        {
            let t = Tensor::random(&TensorType::new(dtype, Shape::new([3, 1 << 19])), i as u64);
            let entry = Entry {
                key: format!("test{i}"),
                path: dir.join(format!("{i}.safetensors")),
                source_bytes: MIN_BYTES,
            };
            assert!(entry.load().is_none());
            let stored = entry.store(&t).unwrap();
            let back = entry.load().unwrap();
            assert!(stored.is_mapped() && stored == t);
            assert!(back.is_mapped());
            assert_eq!(back, t);
        }
        let small = Entry {
            key: "small".to_string(),
            path: dir.join("small.safetensors"),
            source_bytes: MIN_BYTES - 1,
        };
        assert!(small.store(&Tensor::scalar(DType::F32, 1.0)).is_none());
        assert!(
            small.load().is_none(),
            "folds of weights under MIN_BYTES are not stored"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}
