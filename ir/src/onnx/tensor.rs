//! ONNX tensors (`TensorProto`) to graphc tensors: every storage form ONNX uses.

use half::{bf16, f16};
use std::io::{Read, Seek, SeekFrom};
use std::path::{Component, Path};

use super::proto::{data_type as dt, TensorProto};
use crate::{DType, Shape, Tensor, TensorData};

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
pub fn tensor_from_proto(t: &TensorProto, base_dir: Option<&Path>) -> Result<Tensor, String> {
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
        let bytes = read_external(t, base_dir)?;
        TensorData::from_le_bytes(dtype, &bytes, n).ok_or_else(|| {
            format!(
                "external data has {} bytes; {dtype}{shape} needs {}",
                bytes.len(),
                n * dtype.size_bytes()
            )
        })?
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

/// Read a tensor's bytes from its external data file (`location`, `offset`, `length`),
/// which must be a relative path inside the model's folder.
fn read_external(t: &TensorProto, base_dir: Option<&Path>) -> Result<Vec<u8>, String> {
    let entry = |key: &str| t.external_data.iter().find(|e| e.key == key).map(|e| e.value.as_str());
    let location = entry("location").ok_or("external data without a `location`")?;
    let rel = Path::new(location);
    if rel.is_absolute()
        || rel
            .components()
            .any(|c| !matches!(c, Component::Normal(_) | Component::CurDir))
    {
        return Err(format!(
            "external data location `{location}` must be a relative path inside the model's folder"
        ));
    }
    let base = base_dir.ok_or("external data needs the model's folder (load the model from a file)")?;
    let path = base.join(rel);
    let parse = |key: &str| -> Result<Option<u64>, String> {
        entry(key)
            .map(|v| {
                v.parse::<u64>()
                    .map_err(|_| format!("external data `{key}` is not a number: `{v}`"))
            })
            .transpose()
    };
    let offset = parse("offset")?.unwrap_or(0);
    let length = parse("length")?;
    let file_err = |e: std::io::Error| format!("external data file {}: {e}", path.display());
    let mut file = std::fs::File::open(&path).map_err(file_err)?;
    let size = file.metadata().map_err(file_err)?.len();
    let end = match length {
        Some(len) => offset.checked_add(len).ok_or("external data length too large")?,
        None => size,
    };
    if offset > end || end > size {
        return Err(format!(
            "external data {offset}..{end} is outside {} ({size} bytes)",
            path.display()
        ));
    }
    let mut bytes = vec![0u8; (end - offset) as usize];
    file.seek(SeekFrom::Start(offset)).map_err(file_err)?;
    file.read_exact(&mut bytes).map_err(file_err)?;
    Ok(bytes)
}
