//! Weights on disk: safetensors files beside `.gir` files.
//!
//! Parameter data always lives in a safetensors side file, never in the text: the
//! format stores exact little-endian bytes after a JSON header, can be memory-mapped,
//! and is read directly by PyTorch (`safetensors.torch.load_file`) and numpy. All nine
//! dtypes map one to one (`F32`, `F16`, `BF16`, `F64`, `I64`, `I32`, `I8`, `U8`,
//! `BOOL`, the latter one byte 0/1). Constants, in contrast, are inline in the `.gir`
//! text; they are small by construction.
//!
//! [`save_gir`] writes `model.gir` and, when the graph has weight data,
//! `model.safetensors` beside it, named in the text by a relative
//! `weights "model.safetensors"` line. [`load_gir`] reads both back; it checks that
//! every parameter has data of its dtype and shape (a parameter missing from the file
//! is an error naming it) and ignores tensors in the file that no parameter uses.
//! A graph whose text has no `weights` line loads without weight data.
//!
//! Every file is written to a temporary file in the same folder and renamed into
//! place, so a failure never leaves a partial output. Errors are values naming the
//! file (and the tensor or parameter).

use std::collections::BTreeMap;
use std::io;
use std::path::{Path, PathBuf};

use safetensors::tensor::{Dtype, SafeTensors, TensorView};

use crate::text::{parse_module, print_with_weights, ParseError};
use crate::{DType, Graph, Tensor, TensorData};

/// An error reading or writing a safetensors file.
#[derive(Debug, thiserror::Error)]
pub enum WeightsError {
    #[error("{}: {error}", path.display())]
    Io { path: PathBuf, error: io::Error },
    #[error("{}: not a valid safetensors file: {message}", path.display())]
    Format { path: PathBuf, message: String },
    #[error("{}: tensor \"{name}\": {message}", path.display())]
    Tensor {
        path: PathBuf,
        name: String,
        message: String,
    },
}

/// An error loading a `.gir` file and its weights.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("{}: {error}", path.display())]
    Io { path: PathBuf, error: io::Error },
    #[error("{}:{error}", path.display())]
    Parse { path: PathBuf, error: ParseError },
    #[error(transparent)]
    Weights(#[from] WeightsError),
    #[error("{}: parameter \"{name}\": {message}", path.display())]
    Parameter {
        path: PathBuf,
        name: String,
        message: String,
    },
}

pub(crate) fn st_dtype(d: DType) -> Dtype {
    match d {
        DType::F32 => Dtype::F32,
        DType::F16 => Dtype::F16,
        DType::BF16 => Dtype::BF16,
        DType::F64 => Dtype::F64,
        DType::I64 => Dtype::I64,
        DType::I32 => Dtype::I32,
        DType::I8 => Dtype::I8,
        DType::U8 => Dtype::U8,
        DType::Bool => Dtype::BOOL,
    }
}

fn from_st_dtype(d: Dtype) -> Option<DType> {
    Some(match d {
        Dtype::F32 => DType::F32,
        Dtype::F16 => DType::F16,
        Dtype::BF16 => DType::BF16,
        Dtype::F64 => DType::F64,
        Dtype::I64 => DType::I64,
        Dtype::I32 => DType::I32,
        Dtype::I8 => DType::I8,
        Dtype::U8 => DType::U8,
        Dtype::BOOL => DType::Bool,
        _ => return None,
    })
}

/// Write `bytes` to `path` atomically, replacing only a regular file ([`crate::files`]).
fn write_atomic(path: &Path, bytes: &[u8]) -> io::Result<()> {
    crate::files::write_file(path, bytes).map_err(|e| io::Error::other(e.problem))
}

/// Serialize weights to safetensors bytes.
fn safetensors_bytes(weights: &BTreeMap<String, Tensor>, path: &Path) -> Result<Vec<u8>, WeightsError> {
    let bytes: Vec<(&String, &Tensor, Vec<u8>)> = weights.iter().map(|(n, t)| (n, t, t.data().to_le_bytes())).collect();
    let mut views = Vec::with_capacity(bytes.len());
    for (name, t, b) in &bytes {
        let view =
            TensorView::new(st_dtype(t.dtype()), t.shape().dims().to_vec(), b).map_err(|e| WeightsError::Tensor {
                path: path.to_path_buf(),
                name: name.to_string(),
                message: e.to_string(),
            })?;
        views.push((name.as_str(), view));
    }
    safetensors::serialize(views, None).map_err(|e| WeightsError::Format {
        path: path.to_path_buf(),
        message: e.to_string(),
    })
}

/// Write weights to a safetensors file (exact bytes, every dtype).
pub fn save_safetensors(weights: &BTreeMap<String, Tensor>, path: impl AsRef<Path>) -> Result<(), WeightsError> {
    let path = path.as_ref();
    let bytes = safetensors_bytes(weights, path)?;
    write_atomic(path, &bytes).map_err(|error| WeightsError::Io {
        path: path.to_path_buf(),
        error,
    })
}

/// Read every tensor of a safetensors file (a regular file; see [`crate::files`]).
pub fn load_safetensors(path: impl AsRef<Path>) -> Result<BTreeMap<String, Tensor>, WeightsError> {
    load_safetensors_named(path.as_ref(), None)
}

/// [`load_safetensors`], the mapping's identity given (`Some`: a fold cache entry is
/// named by its key, not by where its file happens to be) or the file's own (`None`).
pub(crate) fn load_safetensors_named(
    path: &Path,
    identity: Option<String>,
) -> Result<BTreeMap<String, Tensor>, WeightsError> {
    let (mut file, size) = crate::files::open_regular(path).map_err(|e| file_error(path, e))?;
    check_header(&mut file, path, size, None)?;
    map_safetensors(&file, path, identity)
}

/// Every tensor of an opened (and header-checked) safetensors file, as views into the
/// file mapped read-only: nothing is read until a tensor's elements are used.
fn map_safetensors(
    file: &std::fs::File,
    path: &Path,
    identity: Option<String>,
) -> Result<BTreeMap<String, Tensor>, WeightsError> {
    let map = crate::MappedFile::map_named(file, path, identity)
        .map_err(|error| WeightsError::Io {
            path: path.to_path_buf(),
            error,
        })?
        .ok_or_else(|| WeightsError::Format {
            path: path.to_path_buf(),
            message: "the file is empty".to_string(),
        })?;
    let base = map.as_bytes().as_ptr() as usize;
    let st = SafeTensors::deserialize(map.as_bytes()).map_err(|e| WeightsError::Format {
        path: path.to_path_buf(),
        message: e.to_string(),
    })?;
    let mut out = BTreeMap::new();
    for (name, view) in st.iter() {
        let bad = |message: String| WeightsError::Tensor {
            path: path.to_path_buf(),
            name: name.to_string(),
            message,
        };
        let dtype = from_st_dtype(view.dtype()).ok_or_else(|| bad(format!("unsupported dtype {}", view.dtype())))?;
        // The view's bytes lie inside the mapping (safetensors checked the offsets).
        let offset = view.data().as_ptr() as usize - base;
        let t = Tensor::mapped(view.shape().to_vec(), dtype, map.clone(), offset as u64).map_err(bad)?;
        if t.numel() * dtype.size_bytes() != view.data().len() {
            return Err(bad(format!(
                "{} bytes do not hold {} {dtype} elements",
                view.data().len(),
                t.numel()
            )));
        }
        out.insert(name.to_string(), t);
    }
    Ok(out)
}

fn file_error(path: &Path, e: crate::files::FileError) -> WeightsError {
    WeightsError::Io {
        path: path.to_path_buf(),
        error: io::Error::other(e.problem),
    }
}

/// The most header bytes a safetensors file may declare (the format's own limit).
const MAX_HEADER_BYTES: u64 = 100_000_000;

/// Check a safetensors file from its header alone, before its data is read: the header
/// length fits the file, every tensor's byte range lies in the file and holds its
/// dtype and shape, and (with `params`) every parameter is there with its type.
fn check_header(
    file: &mut std::fs::File,
    path: &Path,
    size: u64,
    params: Option<&[(String, crate::TensorType)]>,
) -> Result<(), WeightsError> {
    let format = |message: String| WeightsError::Format {
        path: path.to_path_buf(),
        message,
    };
    let read = |file: &mut std::fs::File, offset, len| {
        crate::files::read_range(file, path, offset, len, size).map_err(|e| file_error(path, e))
    };
    let len_bytes: [u8; 8] = read(file, 0, 8.min(size))?
        .try_into()
        .map_err(|_| format(format!("{size} bytes: too short for a safetensors header")))?;
    let n = u64::from_le_bytes(len_bytes);
    if n > MAX_HEADER_BYTES || n > size - 8 {
        return Err(format(format!(
            "the header declares {n} bytes but the file has {} after the length",
            size - 8
        )));
    }
    let header = read(file, 8, n)?;
    let meta: BTreeMap<String, serde_json::Value> =
        serde_json::from_slice(&header).map_err(|e| format(format!("header: {e}")))?;
    let data_bytes = size - 8 - n;
    let mut found: BTreeMap<&str, crate::TensorType> = BTreeMap::new();
    for (name, entry) in &meta {
        if name == "__metadata__" {
            continue;
        }
        let bad = |message: String| WeightsError::Tensor {
            path: path.to_path_buf(),
            name: name.clone(),
            message,
        };
        let info: safetensors::tensor::TensorInfo =
            serde_json::from_value(entry.clone()).map_err(|e| bad(format!("header entry: {e}")))?;
        let [begin, end] = [info.data_offsets.0 as u64, info.data_offsets.1 as u64];
        if begin > end || end > data_bytes {
            return Err(bad(format!(
                "data {begin}..{end} is outside the file's {data_bytes} data bytes"
            )));
        }
        let dtype = from_st_dtype(info.dtype).ok_or_else(|| bad(format!("unsupported dtype {}", info.dtype)))?;
        let want = info
            .shape
            .iter()
            .try_fold(dtype.size_bytes() as u64, |n, &d| n.checked_mul(d as u64))
            .ok_or_else(|| bad(format!("shape {:?} is too large", info.shape)))?;
        if want != end - begin {
            return Err(bad(format!(
                "{dtype}{:?} needs {want} bytes but its data is {} bytes",
                info.shape,
                end - begin
            )));
        }
        found.insert(name, crate::TensorType::new(dtype, info.shape.clone()));
    }
    for (name, ty) in params.unwrap_or_default() {
        let got = found.get(name.as_str()).ok_or_else(|| WeightsError::Tensor {
            path: path.to_path_buf(),
            name: name.clone(),
            message: "no tensor of this name in the weights file (a parameter of the model)".to_string(),
        })?;
        if got != ty {
            return Err(WeightsError::Tensor {
                path: path.to_path_buf(),
                name: name.clone(),
                message: format!("the parameter is {ty} but the weights file has {got}"),
            });
        }
    }
    Ok(())
}

/// Tensors from safetensors bytes; `path` names the file in errors.
pub fn parse_safetensors(bytes: &[u8], path: &Path) -> Result<BTreeMap<String, Tensor>, WeightsError> {
    let st = SafeTensors::deserialize(bytes).map_err(|e| WeightsError::Format {
        path: path.to_path_buf(),
        message: e.to_string(),
    })?;
    let mut out = BTreeMap::new();
    for (name, view) in st.iter() {
        let bad = |message: String| WeightsError::Tensor {
            path: path.to_path_buf(),
            name: name.to_string(),
            message,
        };
        let dtype = from_st_dtype(view.dtype()).ok_or_else(|| bad(format!("unsupported dtype {}", view.dtype())))?;
        let shape = view.shape().to_vec();
        let n = shape
            .iter()
            .try_fold(1usize, |n, &d| n.checked_mul(d))
            .ok_or_else(|| bad(format!("shape {shape:?} is too large")))?;
        let data = TensorData::from_le_bytes(dtype, view.data(), n)
            .ok_or_else(|| bad(format!("{} bytes do not hold {n} {dtype} elements", view.data().len())))?;
        let t = Tensor::new(shape, data).map_err(|e| bad(e.to_string()))?;
        out.insert(name.to_string(), t);
    }
    Ok(out)
}

/// Write `graph` as `.gir` text to `path` and, when it has weight data, its weights to
/// `<stem>.safetensors` in the same folder, named by a relative `weights` line.
pub fn save_gir(graph: &Graph, path: impl AsRef<Path>) -> Result<(), WeightsError> {
    let path = path.as_ref();
    let mut weights_file = None;
    if !graph.weights().is_empty() {
        let stem = path
            .file_stem()
            .and_then(|s| s.to_str())
            .ok_or_else(|| WeightsError::Io {
                path: path.to_path_buf(),
                error: io::Error::new(io::ErrorKind::InvalidInput, "the file name is not valid UTF-8"),
            })?;
        let file = format!("{stem}.safetensors");
        save_safetensors(graph.weights(), path.with_file_name(&file))?;
        weights_file = Some(file);
    }
    let text = print_with_weights(graph, weights_file.as_deref());
    write_atomic(path, text.as_bytes()).map_err(|error| WeightsError::Io {
        path: path.to_path_buf(),
        error,
    })
}

/// Read a `.gir` file and the weights file it names (relative to its folder). Every
/// parameter must have data of its type there; other tensors in the file are ignored.
pub fn load_gir(path: impl AsRef<Path>) -> Result<Graph, LoadError> {
    let path = path.as_ref();
    let text = crate::files::read_regular_text(path).map_err(|e| LoadError::Io {
        path: path.to_path_buf(),
        error: io::Error::other(e.problem),
    })?;
    let (mut graph, weights_file) = parse_module(&text).map_err(|error| LoadError::Parse {
        path: path.to_path_buf(),
        error,
    })?;
    let Some(file) = weights_file else {
        return Ok(graph);
    };
    let dir = path.parent().unwrap_or(Path::new(""));
    let wpath = crate::files::resolve_inside(dir, &file, "weights file").map_err(|e| LoadError::Io {
        path: path.to_path_buf(),
        error: io::Error::other(e.to_string()),
    })?;
    let params: Vec<(String, crate::TensorType)> = graph
        .parameters()
        .map(|(_, name, ty)| (name.to_string(), ty.clone()))
        .collect();
    let (mut f, size) = crate::files::open_regular(&wpath).map_err(|e| file_error(&wpath, e))?;
    // Sizes and the parameters' types from the header, before the data is read.
    check_header(&mut f, &wpath, size, Some(&params))?;
    let mut weights = map_safetensors(&f, &wpath, None)?;
    for (name, ty) in params {
        let t = weights.remove(&name).ok_or_else(|| LoadError::Parameter {
            path: wpath.clone(),
            name: name.clone(),
            message: "no tensor of this name in the weights file".to_string(),
        })?;
        if t.ty() != ty {
            return Err(LoadError::Parameter {
                path: wpath,
                name,
                message: format!("the parameter is {ty} but the weights file has {}", t.ty()),
            });
        }
        graph.set_weight(name, t);
    }
    Ok(graph)
}
