//! Exact conversions between element types: `cast`, and the views the arithmetic
//! kernels compute in (f32 for f32/f16/bf16, f64, wrapping i64, bool).

use std::borrow::Cow;

use half::{bf16, f16};

use crate::{DType, TensorData};

/// Round an f64 to the nearest f32 with round-to-odd: exact values stay, inexact ones
/// become whichever neighbour has an odd last bit. A second rounding of the result to
/// a format at least two bits narrower (f16, bf16) is then correctly rounded.
fn f64_to_f32_odd(x: f64) -> f32 {
    let y = x as f32;
    if y.is_nan() || y as f64 == x {
        return y;
    }
    // Truncate toward zero, then set the last bit.
    let t = if (y as f64).abs() > x.abs() {
        f32::from_bits(y.to_bits() - 1)
    } else {
        y
    };
    f32::from_bits(t.to_bits() | 1)
}

/// f64 to f16, correctly rounded to nearest-even (half's own conversion may round
/// twice, through f32).
pub fn f16_from_f64(x: f64) -> f16 {
    f16::from_f32(f64_to_f32_odd(x))
}

/// f64 to bf16, correctly rounded to nearest-even.
pub fn bf16_from_f64(x: f64) -> bf16 {
    bf16::from_f32(f64_to_f32_odd(x))
}

/// i64 to f64 rounded to odd (exact below 2^53), for a second exact rounding to a
/// narrower float.
fn i64_to_f64_odd(x: i64) -> f64 {
    let m = x.unsigned_abs();
    if m < (1u64 << 53) {
        return x as f64;
    }
    let shift = (64 - m.leading_zeros()) - 53;
    let mut t = m >> shift;
    if m & ((1u64 << shift) - 1) != 0 {
        t |= 1;
    }
    let v = t as f64 * (1u64 << shift) as f64;
    if x < 0 {
        -v
    } else {
        v
    }
}

/// Integer values (wrapping i64 results) into an integer or float dtype, with cast
/// semantics: integers wrap, floats round to nearest once; bool is `x != 0`.
pub(crate) fn from_i64(dtype: DType, v: &[i64]) -> TensorData {
    match dtype {
        DType::I64 => TensorData::I64(v.to_vec()),
        DType::I32 => TensorData::I32(v.iter().map(|&x| x as i32).collect()),
        DType::I8 => TensorData::I8(v.iter().map(|&x| x as i8).collect()),
        DType::U8 => TensorData::U8(v.iter().map(|&x| x as u8).collect()),
        DType::Bool => TensorData::Bool(v.iter().map(|&x| x != 0).collect()),
        DType::F64 => TensorData::F64(v.iter().map(|&x| x as f64).collect()),
        DType::F32 => TensorData::F32(v.iter().map(|&x| x as f32).collect()),
        DType::F16 => TensorData::F16(v.iter().map(|&x| f16_from_f64(i64_to_f64_odd(x))).collect()),
        DType::BF16 => TensorData::BF16(v.iter().map(|&x| bf16_from_f64(i64_to_f64_odd(x))).collect()),
    }
}

/// f64 values into any dtype with cast semantics: floats round to nearest once,
/// integers truncate toward zero and saturate (NaN to 0), bool is `x != 0`.
/// ([`TensorData::from_f64`] rounds f16/bf16 with [`f16_from_f64`]/[`bf16_from_f64`].)
pub(crate) fn from_f64(dtype: DType, v: &[f64]) -> TensorData {
    TensorData::from_f64(dtype, v)
}

/// f32 results into f32, f16 or bf16, rounding to nearest-even once.
pub(crate) fn from_f32(dtype: DType, v: Vec<f32>) -> TensorData {
    match dtype {
        DType::F16 => TensorData::F16(v.into_iter().map(f16::from_f32).collect()),
        DType::BF16 => TensorData::BF16(v.into_iter().map(bf16::from_f32).collect()),
        _ => TensorData::F32(v),
    }
}

/// The values of a tensor in the type its arithmetic is computed in.
pub(crate) enum Vals<'a> {
    /// f32, f16, bf16 (exactly widened).
    F32(Cow<'a, [f32]>),
    F64(&'a [f64]),
    /// Every integer dtype, exactly widened.
    Int(Cow<'a, [i64]>),
    Bool(&'a [bool]),
}

pub(crate) fn vals(d: &TensorData) -> Vals<'_> {
    match d {
        TensorData::F32(v) => Vals::F32(Cow::Borrowed(v)),
        TensorData::F16(v) => Vals::F32(Cow::Owned(v.iter().map(|x| x.to_f32()).collect())),
        TensorData::BF16(v) => Vals::F32(Cow::Owned(v.iter().map(|x| x.to_f32()).collect())),
        TensorData::F64(v) => Vals::F64(v),
        TensorData::I64(v) => Vals::Int(Cow::Borrowed(v)),
        TensorData::I32(v) => Vals::Int(Cow::Owned(v.iter().map(|&x| x as i64).collect())),
        TensorData::I8(v) => Vals::Int(Cow::Owned(v.iter().map(|&x| x as i64).collect())),
        TensorData::U8(v) => Vals::Int(Cow::Owned(v.iter().map(|&x| x as i64).collect())),
        TensorData::Bool(v) => Vals::Bool(v),
    }
}

/// Convert element type (see [`crate::Op::Cast`]): floats to integers truncate toward
/// zero, saturating, NaN to 0; integers to integers wrap; to bool is `x != 0` (NaN is
/// true); bool to numbers is 0/1; to floats rounds to nearest-even, once.
pub(crate) fn cast(d: &TensorData, to: DType) -> TensorData {
    if d.dtype() == to {
        return d.clone();
    }
    match vals(d) {
        Vals::Bool(v) => from_i64(to, &v.iter().map(|&b| b as i64).collect::<Vec<_>>()),
        Vals::Int(v) => from_i64(to, &v),
        // f32, f16 and bf16 widen to f64 exactly.
        Vals::F32(v) => match to {
            DType::F16 => TensorData::F16(v.iter().map(|&x| f16::from_f32(x)).collect()),
            DType::BF16 => TensorData::BF16(v.iter().map(|&x| bf16::from_f32(x)).collect()),
            DType::F32 => TensorData::F32(v.into_owned()),
            _ => from_f64(to, &v.iter().map(|&x| x as f64).collect::<Vec<_>>()),
        },
        Vals::F64(v) => from_f64(to, v),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn f64_to_half_rounds_once() {
        // 1 + 2^-11 + 2^-40: just above the f16 tie between 1 and 1 + 2^-10. Through
        // f32 it becomes the tie exactly and rounds down to even.
        let x = 1.0 + 2f64.powi(-11) + 2f64.powi(-40);
        assert_eq!(f16_from_f64(x).to_f64(), 1.0 + 2f64.powi(-10));
        assert_eq!(f16::from_f32(x as f32).to_f64(), 1.0);
        let y = 1.0 + 2f64.powi(-8) + 2f64.powi(-40);
        assert_eq!(bf16_from_f64(y).to_f64(), 1.0 + 2f64.powi(-7));
        assert_eq!(bf16_from_f64(1.0 + 2f64.powi(-8)).to_f64(), 1.0);
        assert_eq!(bf16_from_f64(1.0 + 3.0 * 2f64.powi(-8)).to_f64(), 1.0 + 2f64.powi(-6));
        assert_eq!(f16_from_f64(1e10).to_f64(), f64::INFINITY);
        assert_eq!(bf16_from_f64(1e300).to_f64(), f64::INFINITY);
        assert_eq!(bf16_from_f64(-1e-300).to_bits(), 0x8000);
        assert!(f16_from_f64(f64::NAN).is_nan());
        assert_eq!(f16_from_f64(65504.0).to_f64(), 65504.0);
    }

    #[test]
    fn i64_to_narrow_float_rounds_once() {
        // 2^60 + 2^52 + 1: above the bf16 tie 2^60 + 2^52 between 2^60 and 2^60 + 2^53.
        let x = (1i64 << 60) + (1i64 << 52) + 1;
        let TensorData::BF16(v) = from_i64(DType::BF16, &[x, -x, 1 << 60]) else {
            panic!()
        };
        assert_eq!(v[0].to_f64(), 2f64.powi(60) + 2f64.powi(53));
        assert_eq!(v[1].to_f64(), -(2f64.powi(60) + 2f64.powi(53)));
        assert_eq!(v[2].to_f64(), 2f64.powi(60));
        assert_eq!(i64_to_f64_odd(i64::MIN), -(2f64.powi(63)));
    }
}
