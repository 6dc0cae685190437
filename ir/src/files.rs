//! Files as a hostile model author could shape them: what graphc reads stays inside
//! the model's folder and is a regular file; what it writes replaces only regular files.
//!
//! Reading:
//! - [`open_regular`] opens a path that must be a regular file. It opens without
//!   blocking (`O_NONBLOCK`), so a FIFO never hangs the open, then checks the opened
//!   file itself (`fstat`): a FIFO, a device, a socket or a directory is refused, and
//!   so is a file on procfs or sysfs (whose sizes are not their contents).
//! - [`resolve_inside`] resolves a path named inside a model (ONNX external data, a
//!   `.gir` `weights` line) against the model's folder: relative, and once symlinks are
//!   followed (the canonical path) still inside the folder's canonical path. A link
//!   inside the folder that points out of it is refused, as onnxruntime refuses it.
//! - [`read_range`] reads `offset..offset + len` of an opened file after checking the
//!   range against the file's size, into a buffer allocated fallibly: only the bytes a
//!   tensor needs are read, and too little host memory is an error, not an abort.
//!
//! Writing: [`write_file`] / [`write_file_with`] write a temporary file beside the
//! target (created exclusively, so no planted link is followed) and rename it over the
//! target only when the target is missing or a regular file; a symlink is followed to
//! its target, which must itself be missing or a regular file. Anything else (a
//! device node, a FIFO, a directory) is an error and is left untouched; a failed
//! write leaves no partial output.
//!
//! Every error names the file and the rule it broke.

use std::fs::{File, Metadata, OpenOptions};
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::path::{Component, Path, PathBuf};

/// A file graphc refused or could not read or write: the path and the problem.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{}: {problem}", path.display())]
pub struct FileError {
    pub path: PathBuf,
    pub problem: String,
}

impl FileError {
    pub fn new(path: &Path, problem: impl Into<String>) -> FileError {
        FileError {
            path: path.to_path_buf(),
            problem: problem.into(),
        }
    }

    fn io(path: &Path, e: io::Error) -> FileError {
        FileError::new(path, e.to_string())
    }
}

/// What kind of file this is, for messages.
fn kind(meta: &Metadata) -> &'static str {
    use std::os::unix::fs::FileTypeExt;
    let t = meta.file_type();
    if t.is_dir() {
        "a directory"
    } else if t.is_fifo() {
        "a FIFO"
    } else if t.is_socket() {
        "a socket"
    } else if t.is_block_device() {
        "a block device"
    } else if t.is_char_device() {
        "a character device"
    } else if t.is_symlink() {
        "a symbolic link"
    } else {
        "a regular file"
    }
}

/// Whether the open file lives on a pseudo file system (procfs, sysfs), whose
/// "regular files" are generated on read and report sizes that are not their contents.
fn on_pseudo_fs(file: &File) -> bool {
    use std::os::fd::AsRawFd;
    const PROC_SUPER_MAGIC: i64 = 0x9fa0;
    const SYSFS_MAGIC: i64 = 0x6265_6572;
    const DEBUGFS_MAGIC: i64 = 0x6462_6720;
    let mut st = std::mem::MaybeUninit::<libc::statfs>::zeroed();
    // SAFETY: `st` is a properly sized out-parameter and the descriptor is open.
    let rc = unsafe { libc::fstatfs(file.as_raw_fd(), st.as_mut_ptr()) };
    if rc != 0 {
        return false;
    }
    // SAFETY: fstatfs succeeded, so it filled the struct.
    // reason: `f_type`'s integer type differs between targets (i64 here, i32 or u32 on
    // others); the cast is a no-op only on some.
    #[allow(clippy::unnecessary_cast)]
    let magic = unsafe { st.assume_init() }.f_type as i64;
    matches!(magic, PROC_SUPER_MAGIC | SYSFS_MAGIC | DEBUGFS_MAGIC)
}

/// Open `path` for reading; it must be a regular file (symlinks followed). Returns the
/// file and its size.
pub fn open_regular(path: &Path) -> Result<(File, u64), FileError> {
    use std::os::unix::fs::OpenOptionsExt;
    let file = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY)
        .open(path)
        .map_err(|e| FileError::io(path, e))?;
    let meta = file.metadata().map_err(|e| FileError::io(path, e))?;
    if !meta.is_file() {
        return Err(FileError::new(
            path,
            format!("is {}; graphc reads only regular files", kind(&meta)),
        ));
    }
    if on_pseudo_fs(&file) {
        return Err(FileError::new(
            path,
            "is on procfs or sysfs; graphc reads only regular files on a real file system",
        ));
    }
    Ok((file, meta.len()))
}

/// Read all of a regular file (at most the size it had when opened).
pub fn read_regular(path: &Path) -> Result<Vec<u8>, FileError> {
    let (mut file, size) = open_regular(path)?;
    read_range(&mut file, path, 0, size, size)
}

/// Read a regular file as UTF-8 text.
pub fn read_regular_text(path: &Path) -> Result<String, FileError> {
    String::from_utf8(read_regular(path)?).map_err(|e| FileError::new(path, format!("is not UTF-8 text: {e}")))
}

/// A zeroed byte buffer of `len`, or an error when the host cannot provide it.
pub fn try_alloc_bytes(len: u64, path: &Path) -> Result<Vec<u8>, FileError> {
    let n = usize::try_from(len).map_err(|_| FileError::new(path, format!("{len} bytes do not fit in memory")))?;
    let mut buf = Vec::new();
    buf.try_reserve_exact(n)
        .map_err(|_| FileError::new(path, format!("cannot allocate {n} bytes of host memory to read it")))?;
    buf.resize(n, 0);
    Ok(buf)
}

/// Read `offset..offset + len` of `file` (of `size` bytes, as opened), checked against
/// the size before anything is allocated or read.
pub fn read_range(file: &mut File, path: &Path, offset: u64, len: u64, size: u64) -> Result<Vec<u8>, FileError> {
    let end = offset
        .checked_add(len)
        .ok_or_else(|| FileError::new(path, format!("range {offset} + {len} overflows")))?;
    if end > size {
        return Err(FileError::new(
            path,
            format!("bytes {offset}..{end} are outside the file ({size} bytes)"),
        ));
    }
    let mut buf = try_alloc_bytes(len, path)?;
    file.seek(SeekFrom::Start(offset)).map_err(|e| FileError::io(path, e))?;
    file.read_exact(&mut buf).map_err(|e| {
        FileError::new(
            path,
            format!("reading bytes {offset}..{end}: {e} (did the file shrink?)"),
        )
    })?;
    Ok(buf)
}

/// `rel`, a path named inside a model in `base` (the model's folder), resolved with
/// every symlink followed; it must be relative and its canonical path must lie inside
/// `base`'s. `what` names the reference in errors (`external data`, `weights file`).
pub fn resolve_inside(base: &Path, rel: &str, what: &str) -> Result<PathBuf, FileError> {
    let rel_path = Path::new(rel);
    let lexical_ok = !rel.is_empty()
        && !rel.contains('\0')
        && rel_path
            .components()
            .all(|c| matches!(c, Component::Normal(_) | Component::CurDir));
    if !lexical_ok {
        return Err(FileError::new(
            rel_path,
            format!("{what} path must be relative and inside the model's folder (no `..`, not absolute)"),
        ));
    }
    let base_dir = if base.as_os_str().is_empty() {
        Path::new(".")
    } else {
        base
    };
    let joined = base_dir.join(rel_path);
    let canon_base = base_dir.canonicalize().map_err(|e| FileError::io(base_dir, e))?;
    let canon = joined.canonicalize().map_err(|e| FileError::io(&joined, e))?;
    if !canon.starts_with(&canon_base) {
        return Err(FileError::new(
            &joined,
            format!(
                "{what} resolves to {}, outside the model's folder {} (a symbolic link out of the folder)",
                canon.display(),
                canon_base.display()
            ),
        ));
    }
    Ok(canon)
}

/// Where a write to `path` lands: `path` itself when it is missing or a regular file,
/// the final target of a symlink chain when that is missing or a regular file.
fn output_target(path: &Path) -> Result<PathBuf, FileError> {
    let mut p = path.to_path_buf();
    for _ in 0..40 {
        match std::fs::symlink_metadata(&p) {
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(p),
            Err(e) => return Err(FileError::io(&p, e)),
            Ok(m) if m.file_type().is_symlink() => {
                let target = std::fs::read_link(&p).map_err(|e| FileError::io(&p, e))?;
                p = match p.parent() {
                    Some(dir) if target.is_relative() => dir.join(target),
                    _ => target,
                };
            }
            Ok(m) if m.is_file() => return Ok(p),
            Ok(m) => {
                return Err(FileError::new(
                    &p,
                    format!(
                        "is {}; graphc replaces only regular files (or writes a new one), so it is left untouched",
                        kind(&m)
                    ),
                ))
            }
        }
    }
    Err(FileError::new(path, "too many levels of symbolic links"))
}

/// Write a file through `write`, atomically: a temporary file beside the target,
/// renamed over it when complete (see the module doc for which targets are allowed).
pub fn write_file_with(path: &Path, write: impl FnOnce(&mut File) -> io::Result<()>) -> Result<(), FileError> {
    use std::sync::atomic::{AtomicU64, Ordering};
    static SEQ: AtomicU64 = AtomicU64::new(0);
    let target = output_target(path)?;
    let name = target
        .file_name()
        .ok_or_else(|| FileError::new(path, "names no file"))?
        .to_os_string();
    let mut tmp = None;
    for _ in 0..16 {
        let mut tmp_name = std::ffi::OsString::from(".");
        tmp_name.push(&name);
        tmp_name.push(format!(
            ".{}.{}.tmp",
            std::process::id(),
            SEQ.fetch_add(1, Ordering::Relaxed)
        ));
        let candidate = target.with_file_name(tmp_name);
        match OpenOptions::new().write(true).create_new(true).open(&candidate) {
            Ok(f) => {
                tmp = Some((candidate, f));
                break;
            }
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(FileError::new(path, format!("cannot create a file there: {e}"))),
        }
    }
    let (tmp_path, mut file) = tmp.ok_or_else(|| FileError::new(path, "cannot create a temporary file beside it"))?;
    let result = write(&mut file)
        .and_then(|()| file.flush())
        .map_err(|e| FileError::io(path, e))
        .and_then(|()| {
            drop(file);
            // The target may have changed kind since it was checked; check again.
            output_target(&target)?;
            std::fs::rename(&tmp_path, &target).map_err(|e| FileError::io(&target, e))
        });
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp_path);
    }
    result
}

/// [`write_file_with`] for bytes in memory.
pub fn write_file(path: &Path, bytes: &[u8]) -> Result<(), FileError> {
    write_file_with(path, |f| f.write_all(bytes))
}

/// Create `dir` (and its parents) for outputs; it must end up a directory.
pub fn create_output_dir(dir: &Path) -> Result<(), FileError> {
    std::fs::create_dir_all(dir).map_err(|e| FileError::io(dir, e))?;
    let meta = std::fs::metadata(dir).map_err(|e| FileError::io(dir, e))?;
    if !meta.is_dir() {
        return Err(FileError::new(dir, format!("is {}, not a directory", kind(&meta))));
    }
    Ok(())
}

/// graphc's cache folder (compiled kernels, cuda-sim builds, folded weights):
/// `$GRAPHC_CACHE_DIR`, else `$XDG_CACHE_HOME/graphc/nvrtc`, else
/// `~/.cache/graphc/nvrtc`.
pub fn default_cache_dir() -> Option<PathBuf> {
    let nonempty = |k: &str| std::env::var_os(k).filter(|v| !v.is_empty()).map(PathBuf::from);
    if let Some(d) = nonempty("GRAPHC_CACHE_DIR") {
        return Some(d);
    }
    if let Some(d) = nonempty("XDG_CACHE_HOME") {
        return Some(d.join("graphc").join("nvrtc"));
    }
    nonempty("HOME").map(|h| h.join(".cache").join("graphc").join("nvrtc"))
}
