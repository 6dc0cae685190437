//! Elementwise ops: unary, binary, select.

use std::ops::{Add, Div, Mul, Neg, Rem, Sub};

use super::convert::{from_f32, from_i64, vals, Vals};
use crate::{BinaryOp, TensorData, UnaryOp};

/// The float arithmetic of f32 and f64, each in its own precision.
pub(crate) trait Float:
    Copy
    + PartialOrd
    + Add<Output = Self>
    + Sub<Output = Self>
    + Mul<Output = Self>
    + Div<Output = Self>
    + Rem<Output = Self>
    + Neg<Output = Self>
{
    const ZERO: Self;
    const ONE: Self;
    const NAN: Self;
    const INFINITY: Self;
    fn c(x: f64) -> Self;
    fn is_nan(self) -> bool;
    fn abs(self) -> Self;
    fn exp(self) -> Self;
    fn ln(self) -> Self;
    fn sqrt(self) -> Self;
    fn tanh(self) -> Self;
    fn erf(self) -> Self;
    fn sin(self) -> Self;
    fn cos(self) -> Self;
    fn floor(self) -> Self;
    fn ceil(self) -> Self;
    fn round_even(self) -> Self;
    fn powf(self, e: Self) -> Self;
}

macro_rules! impl_float {
    ($t:ty, $erf:path) => {
        impl Float for $t {
            const ZERO: Self = 0.0;
            const ONE: Self = 1.0;
            const NAN: Self = <$t>::NAN;
            const INFINITY: Self = <$t>::INFINITY;
            fn c(x: f64) -> Self {
                x as $t
            }
            fn is_nan(self) -> bool {
                <$t>::is_nan(self)
            }
            fn abs(self) -> Self {
                <$t>::abs(self)
            }
            fn exp(self) -> Self {
                <$t>::exp(self)
            }
            fn ln(self) -> Self {
                <$t>::ln(self)
            }
            fn sqrt(self) -> Self {
                <$t>::sqrt(self)
            }
            fn tanh(self) -> Self {
                <$t>::tanh(self)
            }
            fn erf(self) -> Self {
                $erf(self)
            }
            fn sin(self) -> Self {
                <$t>::sin(self)
            }
            fn cos(self) -> Self {
                <$t>::cos(self)
            }
            fn floor(self) -> Self {
                <$t>::floor(self)
            }
            fn ceil(self) -> Self {
                <$t>::ceil(self)
            }
            fn round_even(self) -> Self {
                <$t>::round_ties_even(self)
            }
            fn powf(self, e: Self) -> Self {
                <$t>::powf(self, e)
            }
        }
    };
}

impl_float!(f32, libm::erff);
impl_float!(f64, libm::erf);

fn sigmoid<F: Float>(x: F) -> F {
    F::ONE / (F::ONE + (-x).exp())
}

fn unary_float<F: Float>(op: UnaryOp, x: F) -> F {
    let half = F::c(0.5);
    match op {
        UnaryOp::Neg => -x,
        UnaryOp::Abs => x.abs(),
        UnaryOp::Exp => x.exp(),
        UnaryOp::Log => x.ln(),
        UnaryOp::Sqrt => x.sqrt(),
        UnaryOp::Rsqrt => F::ONE / x.sqrt(),
        UnaryOp::Reciprocal => F::ONE / x,
        UnaryOp::Tanh => x.tanh(),
        UnaryOp::Sigmoid => sigmoid(x),
        UnaryOp::Relu => {
            if x < F::ZERO {
                F::ZERO
            } else {
                x
            }
        }
        UnaryOp::Gelu => half * x * (F::ONE + (x / F::c(std::f64::consts::SQRT_2)).erf()),
        UnaryOp::GeluTanh => {
            let k = F::c((2.0 / std::f64::consts::PI).sqrt());
            half * x * (F::ONE + (k * (x + F::c(0.044715) * x * x * x)).tanh())
        }
        UnaryOp::Silu => x * sigmoid(x),
        UnaryOp::Erf => x.erf(),
        UnaryOp::Sin => x.sin(),
        UnaryOp::Cos => x.cos(),
        UnaryOp::Floor => x.floor(),
        UnaryOp::Ceil => x.ceil(),
        UnaryOp::Round => x.round_even(),
        UnaryOp::Sign => {
            if x > F::ZERO {
                F::ONE
            } else if x < F::ZERO {
                -F::ONE
            } else if x.is_nan() {
                x
            } else {
                F::ZERO
            }
        }
        // Not, IsNan and IsInf never reach here.
        UnaryOp::Not | UnaryOp::IsNan | UnaryOp::IsInf => F::NAN,
    }
}

fn unary_int(op: UnaryOp, x: i64) -> Result<i64, String> {
    Ok(match op {
        UnaryOp::Neg => x.wrapping_neg(),
        UnaryOp::Abs => x.wrapping_abs(),
        UnaryOp::Relu => x.max(0),
        UnaryOp::Sign => x.signum(),
        _ => return Err(format!("{} does not accept integers", op.name())),
    })
}

pub(crate) fn unary(op: UnaryOp, d: &TensorData) -> Result<TensorData, String> {
    let dtype = d.dtype();
    if !op.accepts(dtype) {
        return Err(format!("{} does not accept {dtype}", op.name()));
    }
    Ok(match (op, vals(d)) {
        (UnaryOp::Not, Vals::Bool(v)) => TensorData::Bool(v.iter().map(|&b| !b).collect()),
        (UnaryOp::IsNan, Vals::F32(v)) => TensorData::Bool(v.iter().map(|x| x.is_nan()).collect()),
        (UnaryOp::IsNan, Vals::F64(v)) => TensorData::Bool(v.iter().map(|x| x.is_nan()).collect()),
        (UnaryOp::IsInf, Vals::F32(v)) => TensorData::Bool(v.iter().map(|x| x.is_infinite()).collect()),
        (UnaryOp::IsInf, Vals::F64(v)) => TensorData::Bool(v.iter().map(|x| x.is_infinite()).collect()),
        (_, Vals::F32(v)) => from_f32(dtype, v.iter().map(|&x| unary_float(op, x)).collect()),
        (_, Vals::F64(v)) => TensorData::F64(v.iter().map(|&x| unary_float(op, x)).collect()),
        (_, Vals::Int(v)) => {
            let r = v.iter().map(|&x| unary_int(op, x)).collect::<Result<Vec<_>, _>>()?;
            from_i64(dtype, &r)
        }
        (_, Vals::Bool(_)) => return Err(format!("{} does not accept bool", op.name())),
    })
}

/// `d/dx` of the tanh GELU, as PyTorch's `gelu_backward` (approximate='tanh') writes
/// it: `0.5 (1 + t) + 0.5 x (1 - t²) k (1 + 3c x²)`, `t = tanh(k (x + c x³))`.
pub(crate) fn gelu_tanh_derivative<F: Float>(x: F) -> F {
    let half = F::c(0.5);
    let k = F::c((2.0 / std::f64::consts::PI).sqrt());
    let c = F::c(0.044715);
    let x2 = x * x;
    let t = (k * (x + c * x2 * x)).tanh();
    half * (F::ONE + t) + half * x * (F::ONE - t * t) * (k * (F::ONE + F::c(3.0) * c * x2))
}

fn binary_float<F: Float>(op: BinaryOp, a: F, b: F) -> F {
    match op {
        BinaryOp::Add => a + b,
        BinaryOp::Sub => a - b,
        BinaryOp::Mul => a * b,
        BinaryOp::Div => a / b,
        // A square is exactly `a * a`, not the platform's `pow` (glibc's is off by an
        // ulp on some inputs): the reference must not depend on the C library.
        BinaryOp::Pow if b == F::ONE + F::ONE => a * a,
        BinaryOp::Pow => a.powf(b),
        BinaryOp::Max => {
            if a.is_nan() || b.is_nan() {
                F::NAN
            } else if b > a {
                b
            } else {
                a
            }
        }
        BinaryOp::Min => {
            if a.is_nan() || b.is_nan() {
                F::NAN
            } else if b < a {
                b
            } else {
                a
            }
        }
        BinaryOp::Mod => {
            let mut r = a % b;
            if r != F::ZERO && (r < F::ZERO) != (b < F::ZERO) {
                r = r + b;
            }
            r
        }
        BinaryOp::Fmod => a % b,
        BinaryOp::GeluTanhGrad => a * gelu_tanh_derivative(b),
        // Comparisons and logical ops never reach here.
        _ => F::NAN,
    }
}

const DIV_ZERO: &str = "integer division by zero";

fn int_pow(base: i64, exp: i64) -> Result<i64, String> {
    if exp < 0 {
        return match base {
            0 => Err(DIV_ZERO.to_string()),
            1 => Ok(1),
            -1 => Ok(if exp % 2 == 0 { 1 } else { -1 }),
            _ => Ok(0),
        };
    }
    let (mut acc, mut b, mut e) = (1i64, base, exp as u64);
    while e > 0 {
        if e & 1 == 1 {
            acc = acc.wrapping_mul(b);
        }
        b = b.wrapping_mul(b);
        e >>= 1;
    }
    Ok(acc)
}

fn binary_int(op: BinaryOp, a: i64, b: i64) -> Result<i64, String> {
    Ok(match op {
        BinaryOp::Add => a.wrapping_add(b),
        BinaryOp::Sub => a.wrapping_sub(b),
        BinaryOp::Mul => a.wrapping_mul(b),
        BinaryOp::Div => {
            if b == 0 {
                return Err(DIV_ZERO.to_string());
            }
            a.wrapping_div(b)
        }
        BinaryOp::Pow => int_pow(a, b)?,
        BinaryOp::Max => a.max(b),
        BinaryOp::Min => a.min(b),
        BinaryOp::Mod => {
            if b == 0 {
                return Err(DIV_ZERO.to_string());
            }
            let r = a.wrapping_rem(b);
            if r != 0 && (r < 0) != (b < 0) {
                r.wrapping_add(b)
            } else {
                r
            }
        }
        BinaryOp::Fmod => {
            if b == 0 {
                return Err(DIV_ZERO.to_string());
            }
            a.wrapping_rem(b)
        }
        _ => return Err(format!("{} does not accept integers", op.name())),
    })
}

fn compare<T: PartialOrd>(op: BinaryOp, a: &[T], b: &[T]) -> TensorData {
    let f: fn(&T, &T) -> bool = match op {
        BinaryOp::Eq => |x, y| x == y,
        BinaryOp::Ne => |x, y| x != y,
        BinaryOp::Lt => |x, y| x < y,
        BinaryOp::Le => |x, y| x <= y,
        BinaryOp::Gt => |x, y| x > y,
        _ => |x, y| x >= y,
    };
    TensorData::Bool(a.iter().zip(b).map(|(x, y)| f(x, y)).collect())
}

pub(crate) fn binary(op: BinaryOp, a: &TensorData, b: &TensorData) -> Result<TensorData, String> {
    let dtype = a.dtype();
    if b.dtype() != dtype || a.len() != b.len() {
        return Err(format!(
            "{} needs operands of one type, got {dtype} x{} and {} x{}",
            op.name(),
            a.len(),
            b.dtype(),
            b.len()
        ));
    }
    if !op.accepts(dtype) {
        return Err(format!("{} does not accept {dtype}", op.name()));
    }
    let (va, vb) = (vals(a), vals(b));
    if op.is_comparison() {
        return Ok(match (&va, &vb) {
            (Vals::F32(x), Vals::F32(y)) => compare(op, x, y),
            (Vals::F64(x), Vals::F64(y)) => compare(op, x, y),
            (Vals::Int(x), Vals::Int(y)) => compare(op, x, y),
            (Vals::Bool(x), Vals::Bool(y)) => compare(op, x, y),
            _ => return Err("operands of different kinds".to_string()),
        });
    }
    Ok(match (va, vb) {
        (Vals::Bool(x), Vals::Bool(y)) => {
            let f: fn(bool, bool) -> bool = match op {
                BinaryOp::And => |p, q| p & q,
                BinaryOp::Or => |p, q| p | q,
                _ => |p, q| p ^ q,
            };
            TensorData::Bool(x.iter().zip(y).map(|(&p, &q)| f(p, q)).collect())
        }
        (Vals::F32(x), Vals::F32(y)) => from_f32(
            dtype,
            x.iter().zip(y.iter()).map(|(&p, &q)| binary_float(op, p, q)).collect(),
        ),
        (Vals::F64(x), Vals::F64(y)) => {
            TensorData::F64(x.iter().zip(y).map(|(&p, &q)| binary_float(op, p, q)).collect())
        }
        (Vals::Int(x), Vals::Int(y)) => {
            let r = x
                .iter()
                .zip(y.iter())
                .map(|(&p, &q)| binary_int(op, p, q))
                .collect::<Result<Vec<_>, _>>()?;
            from_i64(dtype, &r)
        }
        _ => return Err("operands of different kinds".to_string()),
    })
}

/// `a` where `cond`, else `b`.
pub(crate) fn select(cond: &TensorData, a: &TensorData, b: &TensorData) -> Result<TensorData, String> {
    let TensorData::Bool(c) = cond else {
        return Err(format!("select needs a bool condition, got {}", cond.dtype()));
    };
    if a.dtype() != b.dtype() || a.len() != c.len() || b.len() != c.len() {
        return Err("select needs operands of one shape and the two values of one type".to_string());
    }
    fn pick<T: Copy>(c: &[bool], a: &[T], b: &[T]) -> Vec<T> {
        c.iter()
            .zip(a.iter().zip(b))
            .map(|(&c, (&x, &y))| if c { x } else { y })
            .collect()
    }
    Ok(match (a, b) {
        (TensorData::F32(x), TensorData::F32(y)) => TensorData::F32(pick(c, x, y)),
        (TensorData::F16(x), TensorData::F16(y)) => TensorData::F16(pick(c, x, y)),
        (TensorData::BF16(x), TensorData::BF16(y)) => TensorData::BF16(pick(c, x, y)),
        (TensorData::F64(x), TensorData::F64(y)) => TensorData::F64(pick(c, x, y)),
        (TensorData::I64(x), TensorData::I64(y)) => TensorData::I64(pick(c, x, y)),
        (TensorData::I32(x), TensorData::I32(y)) => TensorData::I32(pick(c, x, y)),
        (TensorData::I8(x), TensorData::I8(y)) => TensorData::I8(pick(c, x, y)),
        (TensorData::U8(x), TensorData::U8(y)) => TensorData::U8(pick(c, x, y)),
        (TensorData::Bool(x), TensorData::Bool(y)) => TensorData::Bool(pick(c, x, y)),
        _ => return Err("select values differ in dtype".to_string()),
    })
}
