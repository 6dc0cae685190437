//! Weight-only quantization: the meaning of [`crate::Op::Dequantize`] and the
//! round-to-nearest quantizer that produces its operands.
//!
//! A quantized tensor `[.., k]` is stored as integers along its last axis in groups of
//! `group` consecutive elements, each group with one scale: 8 bits as `i8 [.., k]`,
//! 4 bits as `u8 [.., k/2]` (element `2j` in the low nibble of byte `j`, `2j+1` in the
//! high one, two's complement -8..=7), scales `[.., ceil(k/group)]`. Dequantizing is
//! `q * scale`, computed in f32 (f64 for f64 scales) and rounded once to the scales'
//! dtype.

use crate::{DType, Tensor, TensorData};

/// The 4-bit value `0..16` as a signed integer `-8..=7`.
#[inline]
pub fn nibble(v: u8) -> i32 {
    ((v & 0xF) as i32 ^ 8) - 8
}

/// Element `i` of a row of `bits`-bit data (`row` the row's bytes).
#[inline]
fn element(row: &[u8], bits: usize, i: usize) -> i32 {
    if bits == 8 {
        row.get(i).map_or(0, |&b| b as i8 as i32)
    } else {
        row.get(i / 2)
            .map_or(0, |&b| nibble(if i.is_multiple_of(2) { b } else { b >> 4 }))
    }
}

/// The raw bytes of `i8` or `u8` data.
fn bytes(d: &TensorData) -> Option<std::borrow::Cow<'_, [u8]>> {
    match d {
        TensorData::U8(v) => Some(std::borrow::Cow::Borrowed(v)),
        TensorData::I8(v) => Some(std::borrow::Cow::Owned(v.iter().map(|&x| x as u8).collect())),
        _ => None,
    }
}

/// [`crate::Op::Dequantize`] of `q` with `scales` (types already checked by
/// `infer_type`): the unpacked data of the scales' dtype.
pub fn dequantize(q: &Tensor, scales: &Tensor, bits: usize, group: usize) -> Result<TensorData, String> {
    let data = bytes(q.data()).ok_or_else(|| format!("dequantize needs i8 or u8 data, got {}", q.dtype()))?;
    let row_bytes = q.shape().dims().last().copied().unwrap_or(1);
    let k = if bits == 4 { row_bytes * 2 } else { row_bytes };
    let groups = k.div_ceil(group.max(1));
    let rows = data.len().checked_div(row_bytes).unwrap_or(0);
    let s = scales.data().to_f64_vec();
    if s.len() != rows * groups {
        return Err(format!(
            "dequantize: {} scales for {rows} rows of {groups} groups",
            s.len()
        ));
    }
    let dtype = scales.dtype();
    let mut out = Vec::with_capacity(rows * k);
    for r in 0..rows {
        let row = data.get(r * row_bytes..(r + 1) * row_bytes).unwrap_or(&[]);
        for i in 0..k {
            let scale = s.get(r * groups + i / group.max(1)).copied().unwrap_or(0.0);
            let v = element(row, bits, i) as f64;
            // f32 products of an integer below 2^7 and an f32 scale round once, as
            // the f64 product rounded to f32 does; f64 scales compute in f64.
            out.push(if dtype == DType::F64 {
                v * scale
            } else {
                (v as f32 * scale as f32) as f64
            });
        }
    }
    Ok(TensorData::from_f64(dtype, &out))
}

/// The largest positive `bits`-bit value (127 or 7; the range is -qmax-1..=qmax).
pub fn qmax(bits: usize) -> f64 {
    if bits == 8 {
        127.0
    } else {
        7.0
    }
}

/// Round-to-nearest quantization of float `w` `[.., k]` along its last axis in groups
/// of `group`: the `(q, scales)` that [`dequantize`] reads, scales of `scale_dtype`.
/// At 8 bits a group's scale is its largest magnitude over 127 (symmetric); at 4 bits
/// it is the value of largest magnitude over -8, so that value is exactly -8 steps and
/// the others round into -8..=7 (the scale may be negative). Scales are rounded to
/// `scale_dtype` and the integers computed from the rounded scale; an all-zero group
/// has scale 0. Errors for a scalar, a non-float tensor, bits other than 4 and 8,
/// or an odd `k` at 4 bits. A mapped `w` is read through a transient copy.
pub fn quantize(w: &Tensor, bits: usize, group: usize, scale_dtype: DType) -> Result<(Tensor, Tensor), String> {
    let dims = w.shape().dims();
    let Some((&k, outer)) = dims.split_last() else {
        return Err("quantize needs a tensor of rank 1 or more".into());
    };
    let rows: usize = outer.iter().product();
    quantize_matrix(w, rows, k, false, bits, group, scale_dtype, outer)
}

/// [`quantize`] of the transpose of a matrix `w` `[k, n]`: `q` `[n, k]` (or
/// `[n, k/2]`), scales `[n, ceil(k/group)]`, without materializing the transpose.
pub fn quantize_transposed(
    w: &Tensor,
    bits: usize,
    group: usize,
    scale_dtype: DType,
) -> Result<(Tensor, Tensor), String> {
    let &[k, n] = w.shape().dims() else {
        return Err(format!("quantize_transposed needs a matrix, got {}", w.ty()));
    };
    quantize_matrix(w, n, k, true, bits, group, scale_dtype, &[n])
}

/// Quantizes `rows` rows of `k` elements: row `r`'s element `i` is `w[r * k + i]`, or
/// `w[i * rows + r]` when `transposed`.
#[allow(clippy::too_many_arguments)]
fn quantize_matrix(
    w: &Tensor,
    rows: usize,
    k: usize,
    transposed: bool,
    bits: usize,
    group: usize,
    scale_dtype: DType,
    outer: &[usize],
) -> Result<(Tensor, Tensor), String> {
    if !w.dtype().is_float() || !scale_dtype.is_float() {
        return Err(format!(
            "quantize needs float data and scales, got {} and {scale_dtype}",
            w.dtype()
        ));
    }
    if bits != 4 && bits != 8 {
        return Err(format!("quantize takes bits 4 or 8, got {bits}"));
    }
    if bits == 4 && !k.is_multiple_of(2) {
        return Err(format!(
            "4-bit quantization packs pairs along the quantized axis, which has {k} elements"
        ));
    }
    let group = group.clamp(1, k.max(1));
    let at = |r: usize, i: usize| if transposed { i * rows + r } else { r * k + i };
    let d = w.detached();
    let (q, scales) = match d.data() {
        TensorData::F32(v) => rtn(rows, k, bits, group, scale_dtype, |r, i| {
            v.get(at(r, i)).map_or(0.0, |&x| x as f64)
        }),
        TensorData::F16(v) => rtn(rows, k, bits, group, scale_dtype, |r, i| {
            v.get(at(r, i)).map_or(0.0, |x| x.to_f64())
        }),
        TensorData::BF16(v) => rtn(rows, k, bits, group, scale_dtype, |r, i| {
            v.get(at(r, i)).map_or(0.0, |x| x.to_f64())
        }),
        TensorData::F64(v) => rtn(rows, k, bits, group, scale_dtype, |r, i| {
            v.get(at(r, i)).copied().unwrap_or(0.0)
        }),
        other => return Err(format!("quantize needs float data, got {}", other.dtype())),
    };
    let mut qdims = outer.to_vec();
    qdims.push(if bits == 8 { k } else { k / 2 });
    let mut sdims = outer.to_vec();
    sdims.push(k.div_ceil(group));
    let q = Tensor::new(qdims, q).map_err(|e| e.to_string())?;
    let scales = Tensor::new(sdims, scales).map_err(|e| e.to_string())?;
    Ok((q, scales))
}

/// `x / s` rounded to nearest (ties to even) and clamped to `-qm-1..=qm`; 0 for a zero
/// or non-finite scale.
fn round_to(x: f64, s: f64, qm: f64) -> f64 {
    if s != 0.0 && s.is_finite() {
        (x / s).round_ties_even().clamp(-qm - 1.0, qm)
    } else {
        0.0
    }
}

/// The scale of one group, as stored (rounded to `dtype`). First the range's: at 8 bits
/// the largest magnitude over 127 (symmetric); at 4 bits the value of largest magnitude
/// over -8, so it is exactly -8 steps and all 16 levels are used (as llama.cpp's Q4_0).
/// Then up to two least-squares refinements (`s = Σ x q / Σ q²` for the integers `q`
/// of the current scale), keeping whichever stored scale gives the smallest squared
/// error: still round-to-nearest, with the step that fits the group best.
fn group_scale(chunk: &[f64], bits: usize, dtype: DType) -> f64 {
    let qm = qmax(bits);
    let stored = |s: f64| {
        TensorData::from_f64(dtype, &[s])
            .to_f64_vec()
            .first()
            .copied()
            .unwrap_or(0.0)
    };
    let err = |s: f64| chunk.iter().map(|&x| (x - s * round_to(x, s, qm)).powi(2)).sum::<f64>();
    let ext = chunk.iter().fold(0.0f64, |m, &x| if x.abs() > m.abs() { x } else { m });
    let first = stored(if bits == 8 { ext.abs() / qm } else { ext / -(qm + 1.0) });
    if first == 0.0 || !first.is_finite() {
        return first;
    }
    let (mut best, mut best_err) = (first, err(first));
    let mut s = first;
    for _ in 0..2 {
        let (num, den) = chunk.iter().fold((0.0, 0.0), |(n, d), &x| {
            let q = round_to(x, s, qm);
            (n + x * q, d + q * q)
        });
        if den == 0.0 {
            break;
        }
        s = stored(num / den);
        if s == 0.0 || !s.is_finite() {
            break;
        }
        let e = err(s);
        if e < best_err {
            (best, best_err) = (s, e);
        }
    }
    best
}

/// Round-to-nearest of `rows` rows of `k` elements `get(row, i)`.
fn rtn(
    rows: usize,
    k: usize,
    bits: usize,
    group: usize,
    scale_dtype: DType,
    get: impl Fn(usize, usize) -> f64,
) -> (TensorData, TensorData) {
    let qm = qmax(bits);
    let groups = k.div_ceil(group);
    let mut scales = Vec::with_capacity(rows * groups);
    let mut packed: Vec<u8> = Vec::with_capacity(rows * if bits == 8 { k } else { k / 2 });
    let mut row = vec![0.0f64; k];
    for r in 0..rows {
        for (i, x) in row.iter_mut().enumerate() {
            *x = get(r, i);
        }
        let mut pending: Option<u8> = None;
        for chunk in row.chunks(group) {
            let s = group_scale(chunk, bits, scale_dtype);
            scales.push(s);
            for &x in chunk {
                let q = round_to(x, s, qm) as i32;
                if bits == 8 {
                    packed.push(q as i8 as u8);
                } else if let Some(lo) = pending.take() {
                    packed.push(lo | ((q as u8 & 0xF) << 4));
                } else {
                    pending = Some(q as u8 & 0xF);
                }
            }
        }
    }
    let q = if bits == 8 {
        TensorData::I8(packed.into_iter().map(|b| b as i8).collect())
    } else {
        TensorData::U8(packed)
    };
    (q, TensorData::from_f64(scale_dtype, &scales))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nibbles_are_signed() {
        assert_eq!(nibble(0x0), 0);
        assert_eq!(nibble(0x7), 7);
        assert_eq!(nibble(0x8), -8);
        assert_eq!(nibble(0xF), -1);
        assert_eq!(nibble(0xF3), 3);
    }

    #[test]
    fn quantize_then_dequantize_errs_by_a_fraction_of_a_step() {
        for bits in [8, 4] {
            let w = Tensor::randn(&crate::TensorType::new(DType::F32, vec![3, 10]), 1.0, 7);
            let (q, s) = quantize(&w, bits, 4, DType::F32).unwrap();
            assert_eq!(s.shape().dims(), &[3, 3]);
            let back = dequantize(&q, &s, bits, 4).unwrap().to_f64_vec();
            let orig = w.data().to_f64_vec();
            let sv = s.data().to_f64_vec();
            // Rounding errs by half a step at most, up to two where a value clamps
            // (the side opposite the largest magnitude at 4 bits, or a least-squares
            // step smaller than the range's); on average about step / sqrt(12).
            let (mut sq, mut steps) = (0.0, 0.0);
            for (i, (a, b)) in orig.iter().zip(&back).enumerate() {
                let step = sv[(i / 10) * 3 + (i % 10) / 4].abs();
                assert!(
                    (a - b).abs() <= step * 2.0 + 1e-6,
                    "bits {bits} element {i}: {a} vs {b}"
                );
                sq += (a - b).powi(2);
                steps += step * step;
            }
            assert!(
                sq <= 0.15 * steps,
                "bits {bits}: mean square error {sq} for steps {steps}"
            );
        }
    }

    #[test]
    fn packing_puts_even_elements_in_the_low_nibble() {
        // The largest magnitude, 8, is -8 steps of -1: 8 -> -8, -7 -> 7, 1 -> -1, 0.
        let w = Tensor::from_f32(vec![1, 4], vec![8.0, -7.0, 1.0, 0.0]).unwrap();
        let (q, s) = quantize(&w, 4, 4, DType::F32).unwrap();
        assert_eq!(s.data(), &TensorData::F32(vec![-1.0]));
        assert_eq!(q.data(), &TensorData::U8(vec![0x78, 0x0F]));
        let back = dequantize(&q, &s, 4, 4).unwrap();
        assert_eq!(back.to_f64_vec(), [8.0, -7.0, 1.0, 0.0]);
    }

    #[test]
    fn the_transposed_quantization_is_the_quantization_of_the_transpose() {
        let w = Tensor::randn(&crate::TensorType::new(DType::F32, vec![6, 4]), 1.0, 3);
        let t = crate::interp::eval_op(
            &crate::Op::Transpose { perm: vec![1, 0] },
            &[&w],
            &crate::TensorType::new(DType::F32, vec![4, 6]),
        )
        .unwrap();
        for bits in [4, 8] {
            assert_eq!(
                quantize_transposed(&w, bits, 4, DType::BF16).unwrap(),
                quantize(&t, bits, 4, DType::BF16).unwrap()
            );
        }
    }

    #[test]
    fn odd_rows_at_four_bits_are_an_error() {
        let w = Tensor::from_f32(vec![1, 3], vec![1.0, 2.0, 3.0]).unwrap();
        assert!(quantize(&w, 4, 2, DType::F32).unwrap_err().contains("pairs"));
    }
}
