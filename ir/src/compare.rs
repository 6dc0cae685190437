//! Comparing results: one tensor against another (relative L2 error, the tolerance a
//! dtype allows) and one list of named outputs against another, checked for length,
//! names and types before any value is compared, so a missing output is a mismatch
//! rather than a shorter comparison. `graphc run --check`, `graphc selftest` and the
//! tests compare through here.

use crate::{DType, Tensor};

/// Why two output lists are not the same outputs (before any value is compared).
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum CompareError {
    #[error("{got} outputs, expected {want}")]
    Count { got: usize, want: usize },
    #[error("output {index} is \"{got}\", expected \"{want}\"")]
    Name { index: usize, got: String, want: String },
    #[error("output \"{name}\" is {got}, expected {want}")]
    Type { name: String, got: String, want: String },
}

/// Pairs `got` with `want` by position after checking that both list the same outputs
/// (count, names in order, types): `(name, got, want)` for each.
pub fn zip_outputs<'a>(
    got: &'a [(String, Tensor)],
    want: &'a [(String, Tensor)],
) -> Result<Vec<(&'a str, &'a Tensor, &'a Tensor)>, CompareError> {
    if got.len() != want.len() {
        return Err(CompareError::Count {
            got: got.len(),
            want: want.len(),
        });
    }
    let mut pairs = Vec::with_capacity(got.len());
    for (index, ((gn, g), (wn, w))) in got.iter().zip(want).enumerate() {
        if gn != wn {
            return Err(CompareError::Name {
                index,
                got: gn.clone(),
                want: wn.clone(),
            });
        }
        if g.ty() != w.ty() {
            return Err(CompareError::Type {
                name: gn.clone(),
                got: g.ty().to_string(),
                want: w.ty().to_string(),
            });
        }
        pairs.push((gn.as_str(), g, w));
    }
    Ok(pairs)
}

/// Equal bit for bit, except that any NaN equals any NaN (the interpreter and an
/// executor that compute the same thing agree this way; -0.0 and 0.0 differ).
pub fn bitwise_equal(a: &Tensor, b: &Tensor) -> bool {
    if a.ty() != b.ty() {
        return false;
    }
    if a.dtype().is_float() {
        a.to_f64_vec()
            .iter()
            .zip(b.to_f64_vec())
            .all(|(x, y)| x.to_bits() == y.to_bits() || (x.is_nan() && y.is_nan()))
    } else {
        a == b
    }
}

/// Relative L2 error of `got` against `want`: `||got - want|| / ||want||`, 0 when
/// equal. NaN equals NaN and an infinity equals itself; a non-finite value anywhere
/// else, different types or different lengths give infinity. Integers and bools are
/// compared exactly, bit for bit: 0 when equal, else infinity (also i64 values past
/// 2^53, which f64 cannot tell apart).
pub fn relative_l2(got: &Tensor, want: &Tensor) -> f64 {
    if got.ty() != want.ty() {
        return f64::INFINITY;
    }
    if !want.dtype().is_float() {
        return if got == want { 0.0 } else { f64::INFINITY };
    }
    relative_l2_values(&got.to_f64_vec(), &want.to_f64_vec())
}

/// [`relative_l2`] of two value lists (infinity when their lengths differ).
pub fn relative_l2_values(got: &[f64], want: &[f64]) -> f64 {
    if got.len() != want.len() {
        return f64::INFINITY;
    }
    let (mut num, mut den) = (0.0, 0.0);
    for (x, y) in got.iter().zip(want) {
        if !x.is_finite() || !y.is_finite() {
            if !(x == y || (x.is_nan() && y.is_nan())) {
                return f64::INFINITY;
            }
            continue;
        }
        num += (x - y) * (x - y);
        den += y * y;
    }
    if num == 0.0 {
        0.0
    } else {
        (num / f64::max(den, f64::MIN_POSITIVE)).sqrt()
    }
}

/// The relative L2 error a result computed another way (a GPU, another precision of
/// accumulation) may have against the CPU executor: 1e-5 for f32 and f64 (1e-2 for
/// f32 with TF32 GEMMs), 1e-2 for f16, 3e-2 for bf16 (8 significant bits: the CPU
/// rounds every GEMM product before its epilogue, cuBLASLt after it, and a few layers
/// compound that), exact (0) for integers and bool.
pub fn tolerance(dtype: DType, tf32: bool) -> f64 {
    match dtype {
        DType::BF16 => 3e-2,
        DType::F16 => 1e-2,
        DType::F32 if tf32 => 1e-2,
        DType::F32 | DType::F64 => 1e-5,
        _ => 0.0,
    }
}

/// One output's comparison.
#[derive(Clone, Debug, PartialEq)]
pub struct OutputError {
    pub name: String,
    pub dtype: DType,
    pub rel_l2: f64,
    pub tolerance: f64,
}

impl OutputError {
    /// Within tolerance (an integer or bool output only when equal).
    pub fn ok(&self) -> bool {
        self.rel_l2 <= self.tolerance
    }
}

/// Compares every output of `got` with `want` after [`zip_outputs`]' checks, each
/// against `tolerance(dtype)`.
pub fn compare_outputs(
    got: &[(String, Tensor)],
    want: &[(String, Tensor)],
    tolerance: impl Fn(DType) -> f64,
) -> Result<Vec<OutputError>, CompareError> {
    Ok(zip_outputs(got, want)?
        .into_iter()
        .map(|(name, g, w)| OutputError {
            name: name.to_string(),
            dtype: w.dtype(),
            rel_l2: relative_l2(g, w),
            tolerance: tolerance(w.dtype()),
        })
        .collect())
}

/// The median of measurements (NaN when there are none); sorts `values`.
pub fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    let n = values.len();
    match (values.get(n / 2), n.checked_sub(1).and_then(|m| values.get(m / 2))) {
        (Some(hi), Some(lo)) if n.is_multiple_of(2) => (hi + lo) / 2.0,
        (Some(mid), _) => *mid,
        _ => f64::NAN,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Shape, TensorType};

    fn t(v: &[f32]) -> Tensor {
        Tensor::from_f32([v.len()], v.to_vec()).unwrap()
    }

    #[test]
    fn a_missing_output_is_a_mismatch_not_a_shorter_comparison() {
        let a = vec![("x".to_string(), t(&[1.0])), ("y".to_string(), t(&[2.0]))];
        let b = vec![("x".to_string(), t(&[1.0]))];
        assert_eq!(
            zip_outputs(&a, &b).unwrap_err(),
            CompareError::Count { got: 2, want: 1 }
        );
        assert_eq!(
            zip_outputs(&b, &a).unwrap_err(),
            CompareError::Count { got: 1, want: 2 }
        );
        let c = vec![("x".to_string(), t(&[1.0])), ("z".to_string(), t(&[2.0]))];
        assert!(matches!(zip_outputs(&a, &c), Err(CompareError::Name { index: 1, .. })));
        let d = vec![("x".to_string(), t(&[1.0])), ("y".to_string(), t(&[2.0, 3.0]))];
        assert!(matches!(zip_outputs(&a, &d), Err(CompareError::Type { .. })));
        assert_eq!(zip_outputs(&a, &a).unwrap().len(), 2);
    }

    #[test]
    fn integers_must_be_equal_and_floats_within_tolerance() {
        let ty = TensorType::new(DType::I64, Shape::new([3]));
        let a = Tensor::from_f64(ty.dtype, ty.shape.dims().to_vec(), &[1.0, 2.0, 3.0]).unwrap();
        let b = Tensor::from_f64(ty.dtype, ty.shape.dims().to_vec(), &[1.0, 2.0, 4.0]).unwrap();
        let got = vec![("i".to_string(), a.clone())];
        let want = vec![("i".to_string(), b)];
        let e = compare_outputs(&got, &want, |d| tolerance(d, false)).unwrap();
        assert!(!e[0].ok(), "{e:?}");
        let same = compare_outputs(&got, &[("i".to_string(), a)], |d| tolerance(d, false)).unwrap();
        assert!(same[0].ok());
        assert!(relative_l2(&t(&[1.0, 2.0]), &t(&[1.0, 2.000001])) < 1e-5);
        assert_eq!(relative_l2(&t(&[f32::NAN]), &t(&[f32::NAN])), 0.0);
        assert_eq!(relative_l2(&t(&[f32::NAN]), &t(&[1.0])), f64::INFINITY);
        assert_eq!(relative_l2_values(&[1.0], &[1.0, 2.0]), f64::INFINITY);
        let big = |v: i64| Tensor::new([1], crate::TensorData::I64(vec![v])).unwrap();
        assert_eq!(relative_l2(&big(1 << 60), &big((1 << 60) + 1)), f64::INFINITY);
    }

    #[test]
    fn median_of_odd_even_and_no_measurements() {
        assert_eq!(median(&mut [3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&mut [4.0, 1.0, 3.0, 2.0]), 2.5);
        assert!(median(&mut []).is_nan());
    }
}
