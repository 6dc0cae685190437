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
    if bits == 4 && group < k && !group.is_multiple_of(2) {
        return Err(format!(
            "4-bit groups pack pairs: a group of {group} of {k} elements is odd"
        ));
    }
    let (q, scales) = quantize_data(w, (rows, k, transposed), bits, group, scale_dtype)?;
    let mut qdims = outer.to_vec();
    qdims.push(if bits == 8 { k } else { k / 2 });
    let mut sdims = outer.to_vec();
    sdims.push(k.div_ceil(group));
    let q = Tensor::new(qdims, q).map_err(|e| e.to_string())?;
    let scales = Tensor::new(sdims, scales).map_err(|e| e.to_string())?;
    Ok((q, scales))
}

/// `x / s` (as `x * inv`, `inv = 1 / s`) rounded to nearest, ties to even, and clamped
/// to `-qm-1..=qm`; 0 for a zero or non-finite scale (`inv` 0).
#[inline]
fn round_to(x: f64, inv: f64, qm: f64) -> f64 {
    // Clamped first (the bounds are integers, so rounding stays inside them), then
    // rounded by adding and subtracting 1.5 * 2^52: the default rounding mode's ties to
    // even, without a libm call per element.
    const MAGIC: f64 = 6_755_399_441_055_744.0;
    // Compare-and-select, not `f64::max`/`min`: one `maxsd`/`minsd` each (NaN-aware
    // `max` costs several instructions per element on x86).
    let v = x * inv;
    let v = if v < -qm - 1.0 { -qm - 1.0 } else { v };
    let v = if v > qm { qm } else { v };
    (v + MAGIC) - MAGIC
}

/// `1 / s`, or 0 for a zero or non-finite scale (whose integers are all 0).
#[inline]
fn inverse(s: f64) -> f64 {
    if s != 0.0 && s.is_finite() {
        1.0 / s
    } else {
        0.0
    }
}

/// `s` rounded to `dtype` (the scales' storage).
fn stored(s: f64, dtype: DType) -> f64 {
    match dtype {
        DType::F32 => s as f32 as f64,
        DType::F16 => crate::interp::f16_from_f64(s).to_f64(),
        DType::BF16 => crate::interp::bf16_from_f64(s).to_f64(),
        _ => s,
    }
}

// reason: `l` runs over 0..4, the length of the lane arrays and of `chunks_exact(4)`'s
// chunks.
#[allow(clippy::indexing_slicing)]
/// The integers of `chunk` at scale `s`: `Σ x q`, `Σ q²` and the squared error
/// `Σ (x - s q)²`, in one pass.
fn moments(chunk: &[f64], s: f64, qm: f64) -> (f64, f64, f64) {
    let inv = inverse(s);
    // Four independent sums, so the loop pipelines (and vectorizes).
    let (mut n, mut d, mut e) = ([0.0f64; 4], [0.0f64; 4], [0.0f64; 4]);
    let mut lanes = chunk.chunks_exact(4);
    for c in &mut lanes {
        for l in 0..4 {
            let x = c[l];
            let q = round_to(x, inv, qm);
            n[l] += x * q;
            d[l] += q * q;
            e[l] += (x - s * q) * (x - s * q);
        }
    }
    for &x in lanes.remainder() {
        let q = round_to(x, inv, qm);
        n[0] += x * q;
        d[0] += q * q;
        e[0] += (x - s * q) * (x - s * q);
    }
    let sum = |v: [f64; 4]| (v[0] + v[1]) + (v[2] + v[3]);
    (sum(n), sum(d), sum(e))
}

// reason: `l` runs over 0..4, the length of the lane arrays and of `chunks_exact(4)`'s
// chunks.
#[allow(clippy::indexing_slicing)]
/// The scale of one group, as stored (rounded to `dtype`). First the range's: at 8 bits
/// the largest magnitude over 127 (symmetric); at 4 bits the value of largest magnitude
/// over -8, so it is exactly -8 steps and all 16 levels are used (as llama.cpp's Q4_0).
/// Then one least-squares refinement (`s = Σ x q / Σ q²` for the integers `q` of the
/// current scale), keeping whichever stored scale gives the smallest squared error:
/// still round-to-nearest, with the step that fits the group best.
fn group_scale(chunk: &[f64], bits: usize, dtype: DType) -> f64 {
    let qm = qmax(bits);
    // The extremes lane by lane (vectorizes), then the one of larger magnitude.
    let (mut hi, mut lo) = ([0.0f64; 4], [0.0f64; 4]);
    let mut lanes = chunk.chunks_exact(4);
    for c in &mut lanes {
        for l in 0..4 {
            hi[l] = if c[l] > hi[l] { c[l] } else { hi[l] };
            lo[l] = if c[l] < lo[l] { c[l] } else { lo[l] };
        }
    }
    for &x in lanes.remainder() {
        hi[0] = if x > hi[0] { x } else { hi[0] };
        lo[0] = if x < lo[0] { x } else { lo[0] };
    }
    let (hi, lo) = (
        hi.iter().fold(0.0f64, |a, &b| a.max(b)),
        lo.iter().fold(0.0f64, |a, &b| a.min(b)),
    );
    let ext = if hi >= -lo { hi } else { lo };
    let mut s = stored(if bits == 8 { ext.abs() / qm } else { ext / -(qm + 1.0) }, dtype);
    if s == 0.0 || !s.is_finite() {
        return s;
    }
    let (mut best, mut best_err) = (s, f64::INFINITY);
    for step in 0..2 {
        let (num, den, err) = moments(chunk, s, qm);
        if err < best_err {
            (best, best_err) = (s, err);
        }
        if step == 1 || den == 0.0 {
            break;
        }
        s = stored(num / den, dtype);
        if s == 0.0 || !s.is_finite() {
            break;
        }
    }
    best
}

/// Row block `r0..r0 + n` into `buf` (`n * k`, row-major) from element `at(i)` of the
/// matrix: a transposed one is read 64 columns at a time, each of its rows once per
/// block (whole cache lines, a page visited once per 64 elements, not per element).
fn fill(
    at: impl Fn(usize) -> f64 + Sync,
    rows: usize,
    k: usize,
    transposed: bool,
) -> impl Fn(usize, usize, &mut [f64]) + Sync {
    move |r0: usize, n: usize, buf: &mut [f64]| {
        if transposed {
            for i in 0..k {
                for (r, row) in buf.chunks_exact_mut(k).take(n).enumerate() {
                    if let Some(slot) = row.get_mut(i) {
                        *slot = at(i * rows + r0 + r);
                    }
                }
            }
        } else {
            for (j, slot) in buf.iter_mut().take(n * k).enumerate() {
                *slot = at(r0 * k + j);
            }
        }
    }
}

/// The packed integers and scales of `w` (see [`quantize_matrix`]).
fn quantize_data(
    w: &Tensor,
    (rows, k, transposed): (usize, usize, bool),
    bits: usize,
    group: usize,
    scale_dtype: DType,
) -> Result<(TensorData, TensorData), String> {
    // A mapped weight is read from the mapping as it is quantized (no decoded copy),
    // and its pages are given back after.
    let mapped = w.is_mapped() && !w.is_decoded();
    let out = if mapped {
        let bytes = w.le_bytes();
        let b: &[u8] = &bytes;
        let r = match w.dtype() {
            DType::F32 => rtn(
                rows,
                k,
                bits,
                group,
                scale_dtype,
                &fill(
                    |i| le::<4>(b, i).map_or(0.0, |a| f32::from_le_bytes(a) as f64),
                    rows,
                    k,
                    transposed,
                ),
            ),
            DType::F16 => rtn(
                rows,
                k,
                bits,
                group,
                scale_dtype,
                &fill(
                    |i| le::<2>(b, i).map_or(0.0, |a| half::f16::from_le_bytes(a).to_f64()),
                    rows,
                    k,
                    transposed,
                ),
            ),
            DType::BF16 => rtn(
                rows,
                k,
                bits,
                group,
                scale_dtype,
                &fill(
                    |i| le::<2>(b, i).map_or(0.0, |a| half::bf16::from_le_bytes(a).to_f64()),
                    rows,
                    k,
                    transposed,
                ),
            ),
            DType::F64 => rtn(
                rows,
                k,
                bits,
                group,
                scale_dtype,
                &fill(|i| le::<8>(b, i).map_or(0.0, f64::from_le_bytes), rows, k, transposed),
            ),
            other => return Err(format!("quantize needs float data, got {other}")),
        };
        drop(bytes);
        w.release_pages();
        r
    } else {
        match w.data() {
            TensorData::F32(v) => rtn(
                rows,
                k,
                bits,
                group,
                scale_dtype,
                &fill(|i| v.get(i).map_or(0.0, |&x| x as f64), rows, k, transposed),
            ),
            TensorData::F16(v) => rtn(
                rows,
                k,
                bits,
                group,
                scale_dtype,
                &fill(|i| v.get(i).map_or(0.0, |x| x.to_f64()), rows, k, transposed),
            ),
            TensorData::BF16(v) => rtn(
                rows,
                k,
                bits,
                group,
                scale_dtype,
                &fill(|i| v.get(i).map_or(0.0, |x| x.to_f64()), rows, k, transposed),
            ),
            TensorData::F64(v) => rtn(
                rows,
                k,
                bits,
                group,
                scale_dtype,
                &fill(|i| v.get(i).copied().unwrap_or(0.0), rows, k, transposed),
            ),
            other => return Err(format!("quantize needs float data, got {}", other.dtype())),
        }
    };
    Ok(out)
}

/// Element `i` of little-endian data of `N`-byte elements.
#[inline]
fn le<const N: usize>(bytes: &[u8], i: usize) -> Option<[u8; N]> {
    bytes.get(i * N..i * N + N).and_then(|b| <[u8; N]>::try_from(b).ok())
}

/// One row `x` of `k` elements quantized into its packed bytes and its group scales.
fn quantize_row(x: &[f64], bits: usize, group: usize, dtype: DType, packed: &mut [u8], scales: &mut [f64]) {
    let qm = qmax(bits);
    for (g, chunk) in x.chunks(group).enumerate() {
        let s = group_scale(chunk, bits, dtype);
        if let Some(slot) = scales.get_mut(g) {
            *slot = s;
        }
        let inv = inverse(s);
        let start = g * group;
        if bits == 8 {
            let out = packed.get_mut(start..start + chunk.len()).unwrap_or(&mut []);
            for (b, &v) in out.iter_mut().zip(chunk) {
                *b = round_to(v, inv, qm) as i32 as i8 as u8;
            }
        } else {
            // Groups start on even elements (k and the group are even or the group is
            // all of k), so pairs never straddle two groups but at the row's end.
            for (j, pair) in chunk.chunks(2).enumerate() {
                let lo = pair.first().map_or(0, |&v| round_to(v, inv, qm) as i32 as u8 & 0xF);
                let hi = pair.get(1).map_or(0, |&v| round_to(v, inv, qm) as i32 as u8 & 0xF);
                if let Some(b) = packed.get_mut(start / 2 + j) {
                    *b = lo | (hi << 4);
                }
            }
        }
    }
}

/// Round-to-nearest of `rows` rows of `k` elements, `fill(r0, n, buf)` giving rows
/// `r0..r0 + n`; rows in blocks of 64, the blocks split over the host's threads.
fn rtn(
    rows: usize,
    k: usize,
    bits: usize,
    group: usize,
    scale_dtype: DType,
    fill: &(dyn Fn(usize, usize, &mut [f64]) + Sync),
) -> (TensorData, TensorData) {
    const BLOCK: usize = 64;
    let row_bytes = if bits == 8 { k } else { k / 2 };
    let groups = k.div_ceil(group);
    let mut packed = vec![0u8; rows * row_bytes];
    let mut scales = vec![0f64; rows * groups];
    if rows > 0 && row_bytes > 0 {
        let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
        let per = rows
            .div_ceil(threads.clamp(1, rows.div_ceil(BLOCK)))
            .next_multiple_of(BLOCK);
        std::thread::scope(|sc| {
            for (t, (pk, ss)) in packed
                .chunks_mut(per * row_bytes)
                .zip(scales.chunks_mut(per * groups))
                .enumerate()
            {
                sc.spawn(move || {
                    let mut buf = vec![0f64; BLOCK * k];
                    let blocks = pk.chunks_mut(BLOCK * row_bytes).zip(ss.chunks_mut(BLOCK * groups));
                    for (b, (pb, sb)) in blocks.enumerate() {
                        let nb = pb.len() / row_bytes;
                        let Some(view) = buf.get_mut(..nb * k) else { continue };
                        fill(t * per + b * BLOCK, nb, view);
                        let rows = view.chunks(k).zip(pb.chunks_mut(row_bytes)).zip(sb.chunks_mut(groups));
                        for ((row, p), s) in rows {
                            quantize_row(row, bits, group, scale_dtype, p, s);
                        }
                    }
                });
            }
        });
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
    fn rounding_is_to_nearest_ties_to_even_and_clamped() {
        for (x, want) in [
            (0.5, 0.0),
            (1.5, 2.0),
            (2.5, 2.0),
            (-0.5, -0.0),
            (-1.5, -2.0),
            (6.7, 7.0),
            (7.6, 7.0),
            (-9.0, -8.0),
            (-7.5, -8.0),
            (3.49, 3.0),
        ] {
            assert_eq!(round_to(x, 1.0, 7.0), want, "{x}");
        }
        assert_eq!(round_to(1000.0, 1.0, 127.0), 127.0);
        assert_eq!(round_to(-127.5, 1.0, 127.0), -128.0);
    }

    #[test]
    fn odd_rows_at_four_bits_are_an_error() {
        let w = Tensor::from_f32(vec![1, 3], vec![1.0, 2.0, 3.0]).unwrap();
        assert!(quantize(&w, 4, 2, DType::F32).unwrap_err().contains("pairs"));
    }
}
