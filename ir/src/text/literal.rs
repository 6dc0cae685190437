//! Literal decoding: numbers (with `inf`, `nan` and `nan(0x..)` for exact NaN bits) and
//! the flat element lists of constant tensors, for each dtype.

use half::{bf16, f16};

use super::attrs::Attrs;
use super::lex::snippet;
use super::parse::{Val, ValKind};
use super::print::{BF16_NAN, F16_NAN, F32_NAN, F64_NAN};
use super::ParseError;
use crate::{DType, Tensor, TensorData, TensorType};

impl Attrs<'_> {
    /// An f64 value: a number, `inf`, `nan` (each maybe negated) or `nan(0x..)` bits.
    pub(super) fn f64(&self, v: &Val, key: &str) -> Result<f64, ParseError> {
        match float_lit(v)? {
            FloatLit::Num(s) => s.parse::<f64>().map_err(|_| self.bad(v, key, "a number")),
            FloatLit::Inf(neg) => Ok(if neg { f64::NEG_INFINITY } else { f64::INFINITY }),
            FloatLit::Nan(neg) => Ok(f64::from_bits(F64_NAN | if neg { 1 << 63 } else { 0 })),
            FloatLit::NanBits(bits) => nan_bits(v, bits, 64, 11).map(f64::from_bits),
            FloatLit::Other => Err(self.bad(v, key, "a number")),
        }
    }

    /// A constant's elements, flat, for a tensor of type `ty`.
    pub(super) fn tensor(&self, v: &Val, ty: &TensorType) -> Result<Tensor, ParseError> {
        let items = self.list(v, "value", "a flat list of elements like `[1.0, 2.0]`")?;
        if items.len() != ty.numel() {
            return Err(v.pos.err(format!(
                "constant has {} element(s) but its type {ty} has {}",
                items.len(),
                ty.numel()
            )));
        }
        let dt = ty.dtype;
        let data = match dt {
            DType::F32 => TensorData::F32(self.each(items, |x| {
                self.float(x, dt, F32_NAN, (32, 8), |b| f32::from_bits(b as u32))
            })?),
            DType::F64 => TensorData::F64(self.each(items, |x| self.f64(x, "value"))?),
            DType::F16 => TensorData::F16(self.each(items, |x| {
                self.float(x, dt, F16_NAN, (16, 5), |b| f16::from_bits(b as u16))
                    .map(|h: Half<f16>| h.0)
            })?),
            DType::BF16 => TensorData::BF16(self.each(items, |x| {
                self.float(x, dt, BF16_NAN, (16, 8), |b| bf16::from_bits(b as u16))
                    .map(|h: Half<bf16>| h.0)
            })?),
            DType::I64 => TensorData::I64(self.each(items, |x| self.int(x, dt))?),
            DType::I32 => TensorData::I32(self.each(items, |x| self.int(x, dt))?),
            DType::I8 => TensorData::I8(self.each(items, |x| self.int(x, dt))?),
            DType::U8 => TensorData::U8(self.each(items, |x| self.int(x, dt))?),
            DType::Bool => TensorData::Bool(self.each(items, |x| self.bool(x, "value"))?),
        };
        Tensor::new(ty.shape.clone(), data).map_err(|e| v.pos.err(e.to_string()))
    }

    fn each<T>(&self, items: &[Val], f: impl Fn(&Val) -> Result<T, ParseError>) -> Result<Vec<T>, ParseError> {
        items.iter().map(f).collect()
    }

    fn int<T: TryFrom<i128>>(&self, v: &Val, dt: DType) -> Result<T, ParseError> {
        match &v.kind {
            ValKind::Int(s) => s
                .parse::<i128>()
                .ok()
                .and_then(|x| T::try_from(x).ok())
                .ok_or_else(|| v.pos.err(format!("`{}` is out of range for {dt}", self.text(v)))),
            _ => Err(self.bad(v, "value", &format!("an integer ({dt} element)"))),
        }
    }

    /// A float element of dtype `dt` (f32, f16 or bf16): numbers parse as f32 and
    /// convert; NaNs are built from bits `width` wide with `exp` exponent bits.
    fn float<T: FromF32>(
        &self,
        v: &Val,
        dt: DType,
        canonical_nan: u64,
        (width, exp): (u32, u32),
        from_bits: impl Fn(u64) -> T::Raw,
    ) -> Result<T, ParseError> {
        match float_lit(v)? {
            FloatLit::Num(s) => s
                .parse::<f32>()
                .map(T::from_f32)
                .map_err(|_| self.bad(v, "value", &format!("a number ({dt} element)"))),
            FloatLit::Inf(neg) => Ok(T::from_f32(if neg { f32::NEG_INFINITY } else { f32::INFINITY })),
            FloatLit::Nan(neg) => Ok(T::from_raw(from_bits(
                canonical_nan | if neg { 1 << (width - 1) } else { 0 },
            ))),
            FloatLit::NanBits(bits) => nan_bits(v, bits, width, exp).map(|b| T::from_raw(from_bits(b))),
            FloatLit::Other => Err(self.bad(v, "value", &format!("a number ({dt} element)"))),
        }
    }
}

/// Element types a float literal converts to.
trait FromF32: Sized {
    type Raw;
    fn from_f32(x: f32) -> Self;
    fn from_raw(r: Self::Raw) -> Self;
}

impl FromF32 for f32 {
    type Raw = f32;
    fn from_f32(x: f32) -> f32 {
        x
    }
    fn from_raw(r: f32) -> f32 {
        r
    }
}

struct Half<T>(T);

impl FromF32 for Half<f16> {
    type Raw = f16;
    fn from_f32(x: f32) -> Self {
        Half(f16::from_f32(x))
    }
    fn from_raw(r: f16) -> Self {
        Half(r)
    }
}

impl FromF32 for Half<bf16> {
    type Raw = bf16;
    fn from_f32(x: f32) -> Self {
        Half(bf16::from_f32(x))
    }
    fn from_raw(r: bf16) -> Self {
        Half(r)
    }
}

enum FloatLit<'v> {
    Num(&'v str),
    Inf(bool),
    Nan(bool),
    NanBits(&'v str),
    Other,
}

fn float_lit(v: &Val) -> Result<FloatLit<'_>, ParseError> {
    Ok(match &v.kind {
        ValKind::Int(s) | ValKind::Float(s) => FloatLit::Num(s),
        ValKind::Ident(s) if s == "inf" => FloatLit::Inf(false),
        ValKind::NegIdent(s) if s == "inf" => FloatLit::Inf(true),
        ValKind::Ident(s) if s == "nan" => FloatLit::Nan(false),
        ValKind::NegIdent(s) if s == "nan" => FloatLit::Nan(true),
        ValKind::NanBits(b) => FloatLit::NanBits(b),
        _ => FloatLit::Other,
    })
}

/// NaN bits of a float `width` bits wide with `exp` exponent bits; they must fit and
/// be a NaN.
fn nan_bits(v: &Val, hex: &str, width: u32, exp: u32) -> Result<u64, ParseError> {
    let mant = width - 1 - exp;
    let is_nan = |b: u64| {
        let e = (b >> mant) & ((1u64 << exp) - 1);
        let m = b & ((1u64 << mant) - 1);
        (width == 64 || b >> width == 0) && e == (1u64 << exp) - 1 && m != 0
    };
    match u64::from_str_radix(hex, 16) {
        Ok(b) if is_nan(b) => Ok(b),
        _ => Err(v.pos.err(format!("`nan(0x{})` is not a {width}-bit NaN", snippet(hex)))),
    }
}
