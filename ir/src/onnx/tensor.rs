//! ONNX tensors (`TensorProto`) to graphc tensors: every storage form ONNX uses.

use half::{bf16, f16};
use std::cell::RefCell;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::proto::{data_type as dt, TensorProto};
use crate::{files, DType, MappedFile, Shape, Tensor, TensorData};

/// Where external data comes from: the model's folder, and the data files mapped so
/// far (each mapped once, its tensors views into it).
#[derive(Debug, Default)]
pub struct ExternalData {
    base: Option<PathBuf>,
    maps: RefCell<HashMap<PathBuf, Option<Arc<MappedFile>>>>,
}

impl ExternalData {
    pub fn new(base: Option<&Path>) -> ExternalData {
        ExternalData {
            base: base.map(Path::to_path_buf),
            maps: RefCell::new(HashMap::new()),
        }
    }

    /// The mapping of the regular file at `path` (None when it is empty), and its size.
    fn map(&self, path: &Path) -> Result<(Option<Arc<MappedFile>>, u64), String> {
        if let Some(m) = self.maps.borrow().get(path) {
            return Ok((m.clone(), m.as_ref().map_or(0, |m| m.len() as u64)));
        }
        let file_err = |e: files::FileError| format!("external data {e}");
        let (file, size) = files::open_regular(path).map_err(file_err)?;
        let map = MappedFile::map(&file, path)
            .map_err(|e| format!("external data {}: cannot map it: {e}", path.display()))?;
        self.maps.borrow_mut().insert(path.to_path_buf(), map.clone());
        Ok((map, size))
    }
}

/// The graphc dtype of an ONNX element type, or a message naming it.
pub fn dtype_from_onnx(t: i32) -> Result<DType, String> {
    Ok(match t {
        dt::FLOAT => DType::F32,
        dt::FLOAT16 => DType::F16,
        dt::BFLOAT16 => DType::BF16,
        dt::DOUBLE => DType::F64,
        dt::INT64 => DType::I64,
        dt::INT32 => DType::I32,
        dt::INT8 => DType::I8,
        dt::UINT8 => DType::U8,
        dt::BOOL => DType::Bool,
        other => return Err(format!("element type {} is not supported", onnx_type_name(other))),
    })
}

/// The ONNX element type of a graphc dtype.
pub fn dtype_to_onnx(d: DType) -> i32 {
    match d {
        DType::F32 => dt::FLOAT,
        DType::F16 => dt::FLOAT16,
        DType::BF16 => dt::BFLOAT16,
        DType::F64 => dt::DOUBLE,
        DType::I64 => dt::INT64,
        DType::I32 => dt::INT32,
        DType::I8 => dt::INT8,
        DType::U8 => dt::UINT8,
        DType::Bool => dt::BOOL,
    }
}

/// ONNX's name for an element type number.
pub fn onnx_type_name(t: i32) -> String {
    let name = match t {
        0 => "UNDEFINED",
        dt::FLOAT => "FLOAT",
        dt::UINT8 => "UINT8",
        dt::INT8 => "INT8",
        dt::UINT16 => "UINT16",
        dt::INT16 => "INT16",
        dt::INT32 => "INT32",
        dt::INT64 => "INT64",
        dt::STRING => "STRING",
        dt::BOOL => "BOOL",
        dt::FLOAT16 => "FLOAT16",
        dt::DOUBLE => "DOUBLE",
        dt::UINT32 => "UINT32",
        dt::UINT64 => "UINT64",
        14 => "COMPLEX64",
        15 => "COMPLEX128",
        dt::BFLOAT16 => "BFLOAT16",
        17..=20 | 23 => "FLOAT8",
        21 => "UINT4",
        22 => "INT4",
        _ => return format!("#{t}"),
    };
    name.to_string()
}

/// Convert a `TensorProto`. `base_dir` is the model's folder, for external data.
pub fn tensor_from_proto(t: &TensorProto, external: Option<&ExternalData>) -> Result<Tensor, String> {
    let dtype = dtype_from_onnx(t.data_type)?;
    let mut dims = Vec::with_capacity(t.dims.len());
    for &d in &t.dims {
        dims.push(usize::try_from(d).map_err(|_| format!("negative dimension {d}"))?);
    }
    let shape = Shape::new(dims);
    let n = shape
        .checked_numel()
        .ok_or_else(|| format!("shape {shape} is too large"))?;
    let data = if t.data_location == 1 {
        let needed = (n as u64)
            .checked_mul(dtype.size_bytes() as u64)
            .ok_or_else(|| format!("shape {shape} is too large"))?;
        return map_external(t, external, shape, dtype, needed);
    } else if !t.raw_data.is_empty() || n == 0 {
        TensorData::from_le_bytes(dtype, &t.raw_data, n).ok_or_else(|| {
            format!(
                "raw_data has {} bytes; {dtype}{shape} needs {}",
                t.raw_data.len(),
                n * dtype.size_bytes()
            )
        })?
    } else {
        typed_data(t, dtype, n)?
    };
    Tensor::new(shape, data).map_err(|e| e.to_string())
}

fn typed_data(t: &TensorProto, dtype: DType, n: usize) -> Result<TensorData, String> {
    let check = |len: usize, field: &str| {
        if len == n {
            Ok(())
        } else {
            Err(format!("{field} has {len} values; {dtype} tensor needs {n}"))
        }
    };
    let ints = &t.int32_data;
    Ok(match dtype {
        DType::F32 => {
            check(t.float_data.len(), "float_data")?;
            TensorData::F32(t.float_data.clone())
        }
        DType::F64 => {
            check(t.double_data.len(), "double_data")?;
            TensorData::F64(t.double_data.clone())
        }
        DType::I64 => {
            check(t.int64_data.len(), "int64_data")?;
            TensorData::I64(t.int64_data.clone())
        }
        DType::I32 => {
            check(ints.len(), "int32_data")?;
            TensorData::I32(ints.clone())
        }
        DType::I8 => {
            check(ints.len(), "int32_data")?;
            TensorData::I8(ints.iter().map(|&x| x as i8).collect())
        }
        DType::U8 => {
            check(ints.len(), "int32_data")?;
            TensorData::U8(ints.iter().map(|&x| x as u8).collect())
        }
        DType::Bool => {
            check(ints.len(), "int32_data")?;
            TensorData::Bool(ints.iter().map(|&x| x != 0).collect())
        }
        // 16-bit floats travel as their bit patterns in int32_data.
        DType::F16 => {
            check(ints.len(), "int32_data")?;
            TensorData::F16(ints.iter().map(|&x| f16::from_bits(x as u16)).collect())
        }
        DType::BF16 => {
            check(ints.len(), "int32_data")?;
            TensorData::BF16(ints.iter().map(|&x| bf16::from_bits(x as u16)).collect())
        }
    })
}

/// A tensor's external data (`location`, `offset`, `length`) as a view into its mapped
/// file: a relative path that, with symlinks followed, stays inside the model's folder,
/// and a regular file. The range is checked against the file's size; nothing is read
/// (a `length` must equal the tensor's bytes).
fn map_external(
    t: &TensorProto,
    external: Option<&ExternalData>,
    shape: Shape,
    dtype: DType,
    needed: u64,
) -> Result<Tensor, String> {
    let mut location = None;
    let (mut offset, mut length) = (None, None);
    for e in &t.external_data {
        let slot = match e.key.as_str() {
            "location" => {
                if location.replace(e.value.as_str()).is_some() {
                    return Err("external data names `location` twice".into());
                }
                continue;
            }
            "offset" => &mut offset,
            "length" => &mut length,
            // `checksum` and keys of other tools are not needed to read the data.
            _ => continue,
        };
        let v = e.value.trim();
        let n = v
            .parse::<u64>()
            .map_err(|_| format!("external data `{}` is not a byte count: `{v}`", e.key))?;
        if slot.replace(n).is_some() {
            return Err(format!("external data names `{}` twice", e.key));
        }
    }
    let location = location.ok_or("external data without a `location`")?;
    let base = external
        .and_then(|x| x.base.as_deref())
        .ok_or("external data needs the model's folder (load the model from a file)")?;
    let path = files::resolve_inside(base, location, "external data").map_err(|e| format!("external data {e}"))?;
    let offset = offset.unwrap_or(0);
    if let Some(len) = length {
        if len != needed {
            return Err(format!(
                "external data `length` is {len} bytes but the tensor needs {needed} ({location})"
            ));
        }
    }
    let (map, size) = external.map_or(Ok((None, 0)), |x| x.map(&path))?;
    let end = offset.checked_add(needed).filter(|&e| e <= size).ok_or_else(|| {
        format!(
            "external data {}: bytes {offset}..{} are outside the file ({size} bytes)",
            path.display(),
            offset.saturating_add(needed)
        )
    })?;
    match map {
        Some(map) if end > offset => Tensor::mapped(shape, dtype, map, offset),
        // No bytes needed (an empty tensor): nothing to view.
        _ => Tensor::new(shape, TensorData::decode_le(dtype, &[], 0)?).map_err(|e| e.to_string()),
    }
}
