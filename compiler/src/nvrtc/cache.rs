//! The on-disk cache of NVRTC outputs, keyed by a stable hash.
//!
//! An entry is two files in the cache folder: `<key>.log` (the compile log) and
//! `<key>.ptx` or `<key>.cubin` (the image). Both are written to a temporary name and
//! renamed into place, log first, so a present image means a complete entry. The cache
//! is best effort: a folder that cannot be read or written only costs a compile.

use graphc_ir::files;
use std::path::Path;

/// FNV-1a, 128-bit: a hash that is the same on every run and platform (unlike std's
/// `DefaultHasher`).
pub fn fnv1a_128(bytes: &[u8]) -> u128 {
    let mut h = Fnv128::new();
    h.write(bytes);
    h.finish()
}

/// An incremental FNV-1a 128 hasher.
#[derive(Clone, Copy, Debug)]
pub struct Fnv128(u128);

impl Fnv128 {
    const OFFSET: u128 = 0x6c62272e07bb014262b821756295c58d;
    const PRIME: u128 = 0x0000000001000000000000000000013b;

    pub fn new() -> Fnv128 {
        Fnv128(Self::OFFSET)
    }

    pub fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 ^= b as u128;
            self.0 = self.0.wrapping_mul(Self::PRIME);
        }
    }

    /// A field: its length first, so fields never run into each other.
    pub fn field(&mut self, bytes: &[u8]) {
        self.write(&(bytes.len() as u64).to_le_bytes());
        self.write(bytes);
    }

    pub fn finish(&self) -> u128 {
        self.0
    }
}

impl Default for Fnv128 {
    fn default() -> Self {
        Fnv128::new()
    }
}

/// The cache key of one compile: source, arch, options, output kind, NVRTC version.
pub fn cache_key(source: &str, arch: &str, options: &[String], output: &str, version: (i32, i32)) -> String {
    let mut h = Fnv128::new();
    h.field(b"graphc-nvrtc-v1");
    h.field(source.as_bytes());
    h.field(arch.as_bytes());
    h.field(&(options.len() as u64).to_le_bytes());
    for o in options {
        h.field(o.as_bytes());
    }
    h.field(output.as_bytes());
    h.field(&version.0.to_le_bytes());
    h.field(&version.1.to_le_bytes());
    format!("{:032x}", h.finish())
}

pub use graphc_ir::files::default_cache_dir;

/// A cached image and log, if complete (regular files only: a FIFO or device planted
/// in the cache folder is a miss, never a hang).
pub fn read(dir: &Path, key: &str, ext: &str) -> Option<(Vec<u8>, String)> {
    let image = files::read_regular(&dir.join(format!("{key}.{ext}"))).ok()?;
    let log = files::read_regular_text(&dir.join(format!("{key}.log"))).ok()?;
    Some((image, log))
}

/// Store an entry (log first, then the image), each written beside its name and renamed
/// over it only where that is missing or a regular file. Errors are returned for
/// reporting; the caller may ignore them.
pub fn write(dir: &Path, key: &str, ext: &str, image: &[u8], log: &str) -> std::io::Result<()> {
    let io = |e: files::FileError| std::io::Error::other(e.to_string());
    files::create_output_dir(dir).map_err(io)?;
    files::write_file(&dir.join(format!("{key}.log")), log.as_bytes()).map_err(io)?;
    files::write_file(&dir.join(format!("{key}.{ext}")), image).map_err(io)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fnv_known_values() {
        // FNV-1a 128 of "" is the offset basis; of "a" a published test vector.
        assert_eq!(fnv1a_128(b""), 0x6c62272e07bb014262b821756295c58d);
        assert_eq!(fnv1a_128(b"a"), 0xd228cb696f1a8caf78912b704e4a8964);
    }

    #[test]
    fn keys_differ_by_every_field() {
        let o = vec!["--fmad=false".to_string()];
        let k = cache_key("s", "sm_89", &o, "cubin", (12, 9));
        assert_ne!(k, cache_key("t", "sm_89", &o, "cubin", (12, 9)));
        assert_ne!(k, cache_key("s", "sm_90", &o, "cubin", (12, 9)));
        assert_ne!(k, cache_key("s", "sm_89", &[], "cubin", (12, 9)));
        assert_ne!(k, cache_key("s", "sm_89", &o, "ptx", (12, 9)));
        assert_ne!(k, cache_key("s", "sm_89", &o, "cubin", (12, 8)));
        assert_eq!(k.len(), 32);
    }
}
