//! `.npz` / `.npy` input and output, checked against a graph's signature.
//!
//! bf16 has no numpy dtype: a bf16 input is read from a float32 array (rounded to
//! nearest-even) and a bf16 output is written as float32 (exactly).

use half::f16;
use std::collections::HashMap;
use std::io::{BufReader, BufWriter, Read, Write};
use std::path::Path;

use graphc_ir::{DType, Graph, Shape, Tensor, TensorData, TensorType};
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

/// What the caller expects of one array, checked from its header before its data is
/// read: `Err` refuses the array (a message for the error).
type HeaderCheck<'a> = dyn FnMut(&str, DType, &[usize]) -> Result<(), NpzError> + 'a;

/// The most header bytes an `.npy` array may declare (numpy writes a few hundred).
const MAX_NPY_HEADER: usize = 1 << 20;

/// Read every array of an `.npz` (by array name) or a single `.npy` (named by the file
/// stem). Each array's data is read after its header is checked and fallibly
/// allocated; inflation stops at the bytes its header declares.
pub fn read_arrays(path: &Path) -> Result<Vec<(String, Tensor)>, NpzError> {
    read_arrays_checked(path, &mut |_, _, _| Ok(()))
}

fn read_arrays_checked(path: &Path, check: &mut HeaderCheck<'_>) -> Result<Vec<(String, Tensor)>, NpzError> {
    let (file, _) = graphc_ir::files::open_regular(path).map_err(|e| file_err(path, e.problem))?;
    let array_err = |array: &str, message: String| NpzError::Array {
        path: path.display().to_string(),
        array: array.to_string(),
        message,
    };
    if path.extension().is_some_and(|e| e == "npy") {
        let name = path
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_default();
        let t = read_npy(BufReader::new(file), &name, check).map_err(|m| array_err(&name, m))?;
        return Ok(vec![(name, t?)]);
    }
    let mut zip = zip::ZipArchive::new(BufReader::new(file))
        .map_err(|e| file_err(path, format!("not a valid .npz (zip) file: {e}")))?;
    let mut out = Vec::new();
    for i in 0..zip.len() {
        let entry = zip.by_index(i).map_err(|e| file_err(path, e))?;
        let full = entry.name().to_string();
        let name = full.strip_suffix(".npy").unwrap_or(&full).to_string();
        let t = read_npy(entry, &name, check).map_err(|m| array_err(&name, m))?;
        out.push((name, t?));
    }
    Ok(out)
}

/// The header's declared length, read from the first bytes, so that a header claiming
/// gigabytes is refused before it is allocated. Returns the bytes consumed.
fn npy_prefix(r: &mut impl Read) -> Result<Vec<u8>, String> {
    let mut head = [0u8; 12];
    let mut got = 0;
    while let Some(rest @ [_, ..]) = head.get_mut(got..) {
        match r.read(rest) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(format!("reading the header: {e}")),
        }
    }
    let head = head.get(..got).unwrap_or_default();
    // Magic, version (major, minor), then the header length: 2 bytes in version 1, 4 after.
    let len = match head {
        [0x93, b'N', b'U', b'M', b'P', b'Y', 1, _, a, b, ..] => u16::from_le_bytes([*a, *b]) as usize,
        [0x93, b'N', b'U', b'M', b'P', b'Y', 2 | 3, _, a, b, c, d] => u32::from_le_bytes([*a, *b, *c, *d]) as usize,
        [0x93, b'N', b'U', b'M', b'P', b'Y', v, _, _, _, ..] => {
            return Err(format!("not a valid .npy array: format version {v}"))
        }
        _ => return Err("not a valid .npy array: no NUMPY magic".into()),
    };
    if len > MAX_NPY_HEADER {
        return Err(format!(
            "the header declares {len} bytes (at most {MAX_NPY_HEADER} are read)"
        ));
    }
    Ok(head.to_vec())
}

/// `n` elements of an array's data, into a fallibly allocated vector.
fn read_elems<T: npyz::Deserialize, R: Read>(npy: npyz::NpyFile<R>, n: usize) -> Result<Vec<T>, String> {
    let mut v = Vec::new();
    v.try_reserve_exact(n)
        .map_err(|_| format!("cannot allocate host memory for {n} elements"))?;
    let data = npy.data::<T>().map_err(|e| format!("reading data: {e}"))?;
    for x in data.take(n) {
        v.push(x.map_err(|e| match e.kind() {
            std::io::ErrorKind::UnexpectedEof => format!("the data ends after {} of {n} elements", v.len()),
            _ => format!("reading data: {e}"),
        })?);
    }
    if v.len() != n {
        return Err(format!("the data ends after {} of {n} elements", v.len()));
    }
    Ok(v)
}

/// One array: header, `check` (the outer `Result`'s error is a message for this
/// array; the inner one is the caller's refusal), then the data.
fn read_npy(mut r: impl Read, name: &str, check: &mut HeaderCheck<'_>) -> Result<Result<Tensor, NpzError>, String> {
    let prefix = npy_prefix(&mut r)?;
    let npy = npyz::NpyFile::new(std::io::Cursor::new(prefix).chain(r))
        .map_err(|e| format!("not a valid .npy array: {e}"))?;
    let mut shape = Vec::with_capacity(npy.shape().len());
    for &d in npy.shape() {
        shape.push(usize::try_from(d).map_err(|_| format!("dimension {d} is too large"))?);
    }
    let n = shape
        .iter()
        .try_fold(1usize, |n, &d| n.checked_mul(d))
        .ok_or_else(|| format!("shape {shape:?} is too large"))?;
    let fortran = npy.order() == npyz::Order::Fortran;
    let descr = npy.dtype().descr();
    let code = descr.trim_matches('\'').trim_start_matches(['<', '>', '|', '=']);
    let dtype = match code {
        "f4" => DType::F32,
        "f2" => DType::F16,
        "f8" => DType::F64,
        "i8" => DType::I64,
        "i4" => DType::I32,
        "i1" => DType::I8,
        "u1" => DType::U8,
        "b1" => DType::Bool,
        other => {
            return Err(format!(
                "unsupported numpy dtype `{other}` (graphc reads f4, f2, f8, i8, i4, i1, u1, b1)"
            ))
        }
    };
    if let Err(e) = check(name, dtype, &shape) {
        return Ok(Err(e));
    }
    let data = match dtype {
        DType::F32 => TensorData::F32(read_elems(npy, n)?),
        DType::F16 => TensorData::F16(read_elems::<f16, _>(npy, n)?),
        DType::F64 => TensorData::F64(read_elems(npy, n)?),
        DType::I64 => TensorData::I64(read_elems(npy, n)?),
        DType::I32 => TensorData::I32(read_elems(npy, n)?),
        DType::I8 => TensorData::I8(read_elems(npy, n)?),
        DType::U8 => TensorData::U8(read_elems(npy, n)?),
        DType::Bool => TensorData::Bool(read_elems(npy, n)?),
        DType::BF16 => return Err("bf16 has no numpy dtype".into()),
    };
    if fortran {
        // Fortran order is C order of the reversed shape: reverse the axes back.
        let rev: Vec<usize> = shape.iter().rev().copied().collect();
        let t = Tensor::new(rev.clone(), data).map_err(|e| e.to_string())?;
        let perm: Vec<usize> = (0..rev.len()).rev().collect();
        return Ok(Ok(transpose(&t, &perm)?));
    }
    Ok(Ok(Tensor::new(shape, data).map_err(|e| e.to_string())?))
}

/// `out.dims[i] = in.dims[perm[i]]`; an error when `perm` names an axis `t` lacks.
fn transpose(t: &Tensor, perm: &[usize]) -> Result<Tensor, String> {
    let bad_perm = || {
        format!(
            "internal error: {perm:?} is not a permutation of the axes of {}",
            t.ty()
        )
    };
    let in_dims = t.shape().dims();
    let in_strides = t.shape().strides();
    // (extent, stride in the input) of each output axis.
    let axes: Vec<(usize, usize)> = perm
        .iter()
        .map(|&p| Some((*in_dims.get(p)?, *in_strides.get(p)?)))
        .collect::<Option<_>>()
        .ok_or_else(bad_perm)?;
    let n = t.numel();
    let mut idx = Vec::with_capacity(n);
    let mut pos = vec![0usize; axes.len()];
    for _ in 0..n {
        idx.push(pos.iter().zip(&axes).map(|(&i, &(_, stride))| i * stride).sum());
        for (p, &(extent, _)) in pos.iter_mut().zip(&axes).rev() {
            *p += 1;
            if *p < extent {
                break;
            }
            *p = 0;
        }
    }
    let data = t.data().try_take(&idx).ok_or_else(bad_perm)?;
    let out_dims: Vec<usize> = axes.iter().map(|&(extent, _)| extent).collect();
    Tensor::new(out_dims, data).map_err(|e| format!("internal error: {e}"))
}

/// Read a graph's inputs from an `.npz`, checking names, dtypes and shapes: every
/// input present, no array that is not an input, each of the declared type.
///
/// Every array's name, dtype and shape are checked from its header, before its data is
/// inflated, so an array the model does not take is never read.
pub fn read_inputs(path: &Path, graph: &Graph) -> Result<HashMap<String, Tensor>, NpzError> {
    let mut expected: HashMap<&str, TensorType> = HashMap::new();
    for &id in graph.inputs() {
        if let Some(name) = graph.input_name(id) {
            expected.insert(name, graph.node(id).ty.clone());
        }
    }
    let signature_err = |name: &str| {
        let mut known: Vec<_> = expected.keys().copied().collect();
        known.sort_unstable();
        NpzError::Signature(format!(
            "{}: array \"{name}\" is not an input of the model (inputs: {})",
            path.display(),
            known.join(", ")
        ))
    };
    let mut seen = std::collections::HashSet::new();
    let arrays = read_arrays_checked(path, &mut |name, dtype, shape| {
        let Some(ty) = expected.get(name) else {
            return Err(signature_err(name));
        };
        if !seen.insert(name.to_string()) {
            return Err(NpzError::Signature(format!(
                "{}: input \"{name}\" appears twice",
                path.display()
            )));
        }
        let dtype_ok = dtype == ty.dtype || (ty.dtype == DType::BF16 && dtype == DType::F32);
        if !dtype_ok || shape != ty.shape.dims() {
            return Err(NpzError::Signature(format!(
                "{}: input \"{name}\" must be {ty}, the file has {dtype}{}",
                path.display(),
                Shape::new(shape.to_vec())
            )));
        }
        Ok(())
    })?;
    let mut out = HashMap::new();
    for (name, t) in arrays {
        let Some(ty) = expected.get(name.as_str()) else {
            return Err(signature_err(&name));
        };
        let t = if ty.dtype == DType::BF16 && t.dtype() == DType::F32 {
            Tensor::from_f64(DType::BF16, t.shape().clone(), &t.to_f64_vec())
                .map_err(|e| NpzError::Signature(format!("{}: input \"{name}\": {e}", path.display())))?
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
    let mut missing: Vec<_> = expected.iter().filter(|(k, _)| !out.contains_key(**k)).collect();
    if !missing.is_empty() {
        missing.sort_unstable_by_key(|(k, _)| **k);
        return Err(NpzError::Signature(format!(
            "{}: missing input(s) {}",
            path.display(),
            missing
                .iter()
                .map(|(m, ty)| format!("\"{m}\" ({ty})"))
                .collect::<Vec<_>>()
                .join(", ")
        )));
    }
    Ok(out)
}

/// Write named tensors to an `.npz` (stored, uncompressed), replacing the file only
/// once it is complete.
pub fn write_npz(path: &Path, arrays: &[(String, Tensor)]) -> Result<(), NpzError> {
    graphc_ir::files::write_file_with(path, |file| {
        let mut zip = zip::ZipWriter::new(BufWriter::new(file));
        let opts = zip::write::SimpleFileOptions::default()
            .compression_method(zip::CompressionMethod::Stored)
            .large_file(arrays.iter().any(|(_, t)| t.ty().size_bytes() > u32::MAX as usize / 2));
        for (name, t) in arrays {
            zip.start_file(format!("{name}.npy"), opts)
                .map_err(std::io::Error::other)?;
            write_npy(&mut zip, t).map_err(|e| std::io::Error::other(format!("array \"{name}\": {e}")))?;
        }
        let mut w = zip.finish().map_err(std::io::Error::other)?;
        w.flush()
    })
    .map_err(|e| file_err(path, e.problem))
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A version-1 `.npy` of f32 `data` with `header_dict` (padded as numpy pads it).
    fn npy_v1(header_dict: &str, data: &[f32]) -> Vec<u8> {
        let mut header = header_dict.to_string();
        while !(10 + header.len() + 1).is_multiple_of(64) {
            header.push(' ');
        }
        header.push('\n');
        let mut out = b"\x93NUMPY\x01\x00".to_vec();
        out.extend((header.len() as u16).to_le_bytes());
        out.extend(header.as_bytes());
        for x in data {
            out.extend(x.to_le_bytes());
        }
        out
    }

    fn read(bytes: &[u8]) -> Result<Tensor, String> {
        read_npy(bytes, "a", &mut |_, _, _| Ok(())).map(|r| r.map_err(|e| e.to_string()))?
    }

    #[test]
    fn fortran_order_is_read_back_in_c_order() {
        // [[0, 1, 2], [3, 4, 5]] stored column by column.
        let bytes = npy_v1(
            "{'descr': '<f4', 'fortran_order': True, 'shape': (2, 3), }",
            &[0.0, 3.0, 1.0, 4.0, 2.0, 5.0],
        );
        let t = read(&bytes).unwrap();
        assert_eq!(t.shape().dims(), &[2, 3]);
        assert_eq!(t.to_f64_vec(), vec![0.0, 1.0, 2.0, 3.0, 4.0, 5.0]);
        // Rank 3: element (i, j, k) at i + 2 j + 4 k in the file.
        let file: Vec<f32> = (0..8).map(|f| f as f32).collect();
        let bytes = npy_v1("{'descr': '<f4', 'fortran_order': True, 'shape': (2, 2, 2), }", &file);
        let want: Vec<f64> = (0..8)
            .map(|c| ((c >> 2) + 2 * ((c >> 1) & 1) + 4 * (c & 1)) as f64)
            .collect();
        assert_eq!(read(&bytes).unwrap().to_f64_vec(), want);
    }

    #[test]
    fn bad_prefixes_are_errors() {
        for short in [
            &b""[..],
            b"\x93NUMPY",
            b"\x93NUMPY\x01\x00\x10",
            b"NOTNUMPY\x01\x00\x10\x00",
        ] {
            let e = read(short).unwrap_err();
            assert!(e.contains("no NUMPY magic"), "{e}");
        }
        let e = read(b"\x93NUMPY\x04\x00\x10\x00\x00\x00").unwrap_err();
        assert!(e.contains("format version 4"), "{e}");
        let e = read(b"\x93NUMPY\x02\x00\x10\x00").unwrap_err();
        assert!(e.contains("format version 2"), "{e}");
        let e = read(b"\x93NUMPY\x02\x00\xff\xff\xff\x00").unwrap_err();
        assert!(e.contains("the header declares"), "{e}");
    }
}
