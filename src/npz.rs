//! `.npz` / `.npy` input and output, checked against a graph's signature.
//!
//! bf16 has no numpy dtype: a bf16 input is read from a float32 array (rounded to
//! nearest-even) and a bf16 output is written as float32 (exactly).

use half::f16;
use std::collections::HashMap;
use std::fs::File;
use std::io::{BufReader, BufWriter, Read, Write};
use std::path::Path;

use graphc_ir::{DType, Graph, Tensor, TensorData, TensorType};
use npyz::WriterBuilder;

/// An `.npz`/`.npy` problem, naming the file and the array.
#[derive(Debug, thiserror::Error)]
pub enum NpzError {
    #[error("{path}: {message}")]
    File { path: String, message: String },
    #[error("{path}: array \"{array}\": {message}")]
    Array {
        path: String,
        array: String,
        message: String,
    },
    #[error("inputs: {0}")]
    Signature(String),
}

fn file_err(path: &Path, message: impl ToString) -> NpzError {
    NpzError::File {
        path: path.display().to_string(),
        message: message.to_string(),
    }
}

/// Read every array of an `.npz` (by array name) or a single `.npy` (named by the file stem).
pub fn read_arrays(path: &Path) -> Result<Vec<(String, Tensor)>, NpzError> {
    let file = File::open(path).map_err(|e| file_err(path, e))?;
    if path.extension().is_some_and(|e| e == "npy") {
        let name = path
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_default();
        let t = read_npy(BufReader::new(file)).map_err(|m| NpzError::Array {
            path: path.display().to_string(),
            array: name.clone(),
            message: m,
        })?;
        return Ok(vec![(name, t)]);
    }
    let mut zip = zip::ZipArchive::new(BufReader::new(file))
        .map_err(|e| file_err(path, format!("not a valid .npz (zip) file: {e}")))?;
    let mut out = Vec::new();
    for i in 0..zip.len() {
        let entry = zip.by_index(i).map_err(|e| file_err(path, e))?;
        let full = entry.name().to_string();
        let name = full.strip_suffix(".npy").unwrap_or(&full).to_string();
        let t = read_npy(entry).map_err(|m| NpzError::Array {
            path: path.display().to_string(),
            array: name.clone(),
            message: m,
        })?;
        out.push((name, t));
    }
    Ok(out)
}

fn read_npy(r: impl Read) -> Result<Tensor, String> {
    let npy = npyz::NpyFile::new(r).map_err(|e| format!("not a valid .npy array: {e}"))?;
    let shape: Vec<usize> = npy.shape().iter().map(|&d| d as usize).collect();
    let fortran = npy.order() == npyz::Order::Fortran;
    let descr = npy.dtype().descr();
    let code = descr.trim_matches('\'').trim_start_matches(['<', '>', '|', '=']);
    let io = |e: std::io::Error| format!("reading data: {e}");
    let data = match code {
        "f4" => TensorData::F32(npy.into_vec().map_err(io)?),
        "f2" => TensorData::F16(npy.into_vec::<f16>().map_err(io)?),
        "f8" => TensorData::F64(npy.into_vec().map_err(io)?),
        "i8" => TensorData::I64(npy.into_vec().map_err(io)?),
        "i4" => TensorData::I32(npy.into_vec().map_err(io)?),
        "i1" => TensorData::I8(npy.into_vec().map_err(io)?),
        "u1" => TensorData::U8(npy.into_vec().map_err(io)?),
        "b1" => TensorData::Bool(npy.into_vec().map_err(io)?),
        other => {
            return Err(format!(
                "unsupported numpy dtype `{other}` (graphc reads f4, f2, f8, i8, i4, i1, u1, b1)"
            ))
        }
    };
    if fortran {
        // Fortran order is C order of the reversed shape: reverse the axes back.
        let rev: Vec<usize> = shape.iter().rev().copied().collect();
        let t = Tensor::new(rev.clone(), data).map_err(|e| e.to_string())?;
        let perm: Vec<usize> = (0..rev.len()).rev().collect();
        return Ok(transpose(&t, &perm));
    }
    Tensor::new(shape, data).map_err(|e| e.to_string())
}

/// `out.dims[i] = in.dims[perm[i]]`.
fn transpose(t: &Tensor, perm: &[usize]) -> Tensor {
    let in_dims = t.shape().dims();
    let in_strides = t.shape().strides();
    let out_dims: Vec<usize> = perm.iter().map(|&p| in_dims[p]).collect();
    let n = t.numel();
    let mut idx = Vec::with_capacity(n);
    let mut pos = vec![0usize; out_dims.len()];
    for _ in 0..n {
        idx.push(pos.iter().zip(perm).map(|(&i, &p)| i * in_strides[p]).sum());
        for a in (0..pos.len()).rev() {
            pos[a] += 1;
            if pos[a] < out_dims[a] {
                break;
            }
            pos[a] = 0;
        }
    }
    Tensor::new(out_dims, t.data().take(&idx)).expect("a permutation keeps the element count")
}

/// Read a graph's inputs from an `.npz`, checking names, dtypes and shapes: every
/// input present, no array that is not an input, each of the declared type.
pub fn read_inputs(path: &Path, graph: &Graph) -> Result<HashMap<String, Tensor>, NpzError> {
    let arrays = read_arrays(path)?;
    let mut expected: HashMap<&str, TensorType> = HashMap::new();
    for &id in graph.inputs() {
        if let Some(name) = graph.input_name(id) {
            expected.insert(name, graph.node(id).ty.clone());
        }
    }
    let mut out = HashMap::new();
    for (name, t) in arrays {
        let Some(ty) = expected.get(name.as_str()) else {
            let mut known: Vec<_> = expected.keys().copied().collect();
            known.sort_unstable();
            return Err(NpzError::Signature(format!(
                "{}: array \"{name}\" is not an input of the model (inputs: {})",
                path.display(),
                known.join(", ")
            )));
        };
        let t = if ty.dtype == DType::BF16 && t.dtype() == DType::F32 {
            Tensor::from_f64(DType::BF16, t.shape().clone(), &t.to_f64_vec()).expect("same element count")
        } else {
            t
        };
        if &t.ty() != ty {
            return Err(NpzError::Signature(format!(
                "{}: input \"{name}\" must be {ty}, the file has {}",
                path.display(),
                t.ty()
            )));
        }
        out.insert(name, t);
    }
    let mut missing: Vec<_> = expected.keys().filter(|k| !out.contains_key(**k)).copied().collect();
    if !missing.is_empty() {
        missing.sort_unstable();
        return Err(NpzError::Signature(format!(
            "{}: missing input(s) {}",
            path.display(),
            missing
                .iter()
                .map(|m| format!("\"{m}\" ({})", expected[m]))
                .collect::<Vec<_>>()
                .join(", ")
        )));
    }
    Ok(out)
}

/// Write named tensors to an `.npz` (stored, uncompressed), replacing the file only
/// once it is complete.
pub fn write_npz(path: &Path, arrays: &[(String, Tensor)]) -> Result<(), NpzError> {
    let tmp = path.with_extension("npz.partial");
    let result = (|| -> Result<(), NpzError> {
        let file = File::create(&tmp).map_err(|e| file_err(&tmp, e))?;
        let mut zip = zip::ZipWriter::new(BufWriter::new(file));
        let opts = zip::write::SimpleFileOptions::default()
            .compression_method(zip::CompressionMethod::Stored)
            .large_file(arrays.iter().any(|(_, t)| t.ty().size_bytes() > u32::MAX as usize / 2));
        for (name, t) in arrays {
            zip.start_file(format!("{name}.npy"), opts)
                .map_err(|e| file_err(path, e))?;
            write_npy(&mut zip, t).map_err(|e| NpzError::Array {
                path: path.display().to_string(),
                array: name.clone(),
                message: e.to_string(),
            })?;
        }
        let mut w = zip.finish().map_err(|e| file_err(path, e))?;
        w.flush().map_err(|e| file_err(path, e))
    })();
    match result {
        Ok(()) => std::fs::rename(&tmp, path).map_err(|e| file_err(path, e)),
        Err(e) => {
            let _ = std::fs::remove_file(&tmp);
            Err(e)
        }
    }
}

fn write_npy<W: Write>(w: &mut W, t: &Tensor) -> std::io::Result<()> {
    let shape: Vec<u64> = t.shape().dims().iter().map(|&d| d as u64).collect();
    macro_rules! put {
        ($v:expr, $ty:ty) => {{
            let mut wr = npyz::WriteOptions::<$ty>::new()
                .default_dtype()
                .shape(&shape)
                .writer(&mut *w)
                .begin_nd()?;
            wr.extend($v.iter().copied())?;
            wr.finish()
        }};
    }
    match t.data() {
        TensorData::F32(v) => put!(v, f32),
        TensorData::F16(v) => put!(v, f16),
        TensorData::BF16(v) => put!(v.iter().map(|x| x.to_f32()).collect::<Vec<_>>(), f32),
        TensorData::F64(v) => put!(v, f64),
        TensorData::I64(v) => put!(v, i64),
        TensorData::I32(v) => put!(v, i32),
        TensorData::I8(v) => put!(v, i8),
        TensorData::U8(v) => put!(v, u8),
        TensorData::Bool(v) => put!(v, bool),
    }
}
