//! Emitting C: an indenting writer, C types and literals, and the body's expressions.

use std::fmt::Write as _;

use graphc_ir::{BinaryOp, DType, TensorData, UnaryOp};

use super::prelude::{Helper, Helpers};
use super::{CodegenError, Ctx};
use crate::kernel::{Body, Expr, ExprId};

/// Stands for the entry name until the source is complete (see [`super::finish`]).
pub(crate) const ENTRY_PLACEHOLDER: &str = "__GRAPHC_ENTRY__";

/// A small indenting writer: `line` writes one line at the current depth.
#[derive(Default)]
pub(crate) struct Writer {
    out: String,
    depth: usize,
}

impl Writer {
    pub fn new() -> Writer {
        Writer::default()
    }

    pub fn line(&mut self, s: impl AsRef<str>) {
        let s = s.as_ref();
        if s.is_empty() {
            self.out.push('\n');
            return;
        }
        for _ in 0..self.depth {
            self.out.push_str("  ");
        }
        self.out.push_str(s);
        self.out.push('\n');
    }

    /// `head {` and one level deeper.
    pub fn open(&mut self, head: impl AsRef<str>) {
        let head = head.as_ref();
        if head.is_empty() {
            self.line("{");
        } else {
            self.line(format!("{head} {{"));
        }
        self.depth += 1;
    }

    /// `}` (plus `tail`, e.g. `;`) one level up.
    pub fn close(&mut self) {
        self.close_with("");
    }

    pub fn close_with(&mut self, tail: &str) {
        self.depth = self.depth.saturating_sub(1);
        self.line(format!("}}{tail}"));
    }

    pub fn finish(self) -> String {
        self.out
    }
}

/// A C identifier made of `s` (other characters become `_`).
pub(crate) fn c_ident(s: &str) -> String {
    let mut r: String = s
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() || c == '_' { c } else { '_' })
        .collect();
    if r.is_empty() || r.starts_with(|c: char| c.is_ascii_digit()) {
        r.insert(0, '_');
    }
    r
}

/// The C type values of `d` are computed in (f16/bf16 in f32).
pub(crate) fn reg_type(d: DType) -> &'static str {
    match d {
        DType::F32 | DType::F16 | DType::BF16 => "float",
        DType::F64 => "double",
        DType::I64 => "long long",
        DType::I32 => "int",
        DType::I8 => "signed char",
        DType::U8 | DType::Bool => "unsigned char",
    }
}

/// The C type `d` is stored as in memory.
pub(crate) fn storage_type(d: DType) -> &'static str {
    match d {
        DType::F16 | DType::BF16 => "unsigned short",
        _ => reg_type(d),
    }
}

/// A loaded storage value (C expression `s` of [`storage_type`]) as a register value.
pub(crate) fn load_conv(h: &mut Helpers, d: DType, s: &str) -> String {
    match d {
        DType::F16 => {
            h.need(Helper::F16);
            format!("g_f16_to_f32({s})")
        }
        DType::BF16 => {
            h.need(Helper::Bf16);
            format!("g_bf16_to_f32({s})")
        }
        _ => s.to_string(),
    }
}

/// A register value as a storage value.
pub(crate) fn store_conv(h: &mut Helpers, d: DType, s: &str) -> String {
    match d {
        DType::F16 => {
            h.need(Helper::F16);
            format!("g_f32_to_f16({s})")
        }
        DType::BF16 => {
            h.need(Helper::Bf16);
            format!("g_f32_to_bf16({s})")
        }
        _ => s.to_string(),
    }
}

/// Whether f16/bf16 arithmetic rounds after every op (as the reference interpreter
/// does) rather than staying in f32 until a store or an explicit cast (as TorchInductor
/// computes fused half-precision kernels). Off: one rounding per stored value is both
/// more accurate and cheaper (no conversion pair per op); results then differ from the
/// interpreter's by the intermediate roundings, within half-precision tolerance.
pub const ROUND_EVERY_HALF_OP: bool = false;

/// The result of an f16/bf16 op, rounded per [`ROUND_EVERY_HALF_OP`].
fn round_op(h: &mut Helpers, d: DType, s: String) -> String {
    if ROUND_EVERY_HALF_OP {
        round_to(h, d, s)
    } else {
        s
    }
}

/// Round an f32 register value to `d` (f16/bf16), identity otherwise.
fn round_to(h: &mut Helpers, d: DType, s: String) -> String {
    match d {
        DType::F16 => {
            h.need(Helper::F16);
            format!("g_rnd_f16({s})")
        }
        DType::BF16 => {
            h.need(Helper::Bf16);
            format!("g_rnd_bf16({s})")
        }
        _ => s,
    }
}

/// How one float type's literals are written: the bit-cast intrinsic and the bit
/// patterns of its infinities (for NaN, infinities), and the suffix of finite literals.
struct FloatLit {
    /// `__uint_as_float` / `__longlong_as_double`.
    from_bits: &'static str,
    /// The NaN argument of `from_bits` for these bits.
    nan_bits: fn(u64) -> String,
    pos_inf: &'static str,
    neg_inf: &'static str,
    suffix: &'static str,
}

/// A C literal of a float: finite values in Rust's shortest round-trip form (with a
/// `.0` when it has no point or exponent, parenthesized when negative), NaN and the
/// infinities as bit casts (keeping a NaN's payload).
fn float_lit(f: &FloatLit, debug: String, bits: u64, nan: bool, inf: bool, negative: bool) -> String {
    if nan {
        format!("{}({})", f.from_bits, (f.nan_bits)(bits))
    } else if inf {
        let b = if negative { f.neg_inf } else { f.pos_inf };
        format!("{}({b})", f.from_bits)
    } else {
        let s = if debug.contains(['.', 'e', 'E']) {
            debug
        } else {
            format!("{debug}.0")
        };
        if negative {
            format!("({s}{})", f.suffix)
        } else {
            format!("{s}{}", f.suffix)
        }
    }
}

const F32_LIT: FloatLit = FloatLit {
    from_bits: "__uint_as_float",
    nan_bits: |b| format!("0x{b:08x}u"),
    pos_inf: "0x7f800000u",
    neg_inf: "0xff800000u",
    suffix: "f",
};

const F64_LIT: FloatLit = FloatLit {
    from_bits: "__longlong_as_double",
    nan_bits: |b| format!("0x{b:016x}LL"),
    pos_inf: "0x7ff0000000000000LL",
    neg_inf: "(long long)0xfff0000000000000ULL",
    suffix: "",
};

pub(crate) fn f32_lit(x: f32) -> String {
    float_lit(
        &F32_LIT,
        format!("{x:?}"),
        x.to_bits().into(),
        x.is_nan(),
        x.is_infinite(),
        x.is_sign_negative(),
    )
}

pub(crate) fn f64_lit(x: f64) -> String {
    float_lit(
        &F64_LIT,
        format!("{x:?}"),
        x.to_bits(),
        x.is_nan(),
        x.is_infinite(),
        x.is_sign_negative(),
    )
}

pub(crate) fn i64_lit(x: i64) -> String {
    if x == i64::MIN {
        "(-9223372036854775807LL - 1)".to_string()
    } else if x < 0 {
        format!("({x}LL)")
    } else {
        format!("{x}LL")
    }
}

/// A literal of dtype `d` as a register value; `x` is the value as f64 (exact for all
/// but large i64, which `exact_i64` carries).
pub(crate) fn lit(d: DType, x: f64, exact_i64: Option<i64>) -> String {
    match d {
        DType::F32 | DType::F16 | DType::BF16 => f32_lit(x as f32),
        DType::F64 => f64_lit(x),
        DType::I64 => i64_lit(exact_i64.unwrap_or(x as i64)),
        DType::I32 => format!("((int){})", i64_lit(exact_i64.unwrap_or(x as i64))),
        DType::I8 => format!("((signed char){})", exact_i64.unwrap_or(x as i64)),
        DType::U8 => format!("((unsigned char){})", exact_i64.unwrap_or(x as i64)),
        DType::Bool => format!("((unsigned char){})", (x != 0.0) as u8),
    }
}

/// The literal of a 0-d constant tensor (its first element).
pub(crate) fn tensor_lit(cx: &Ctx, data: &TensorData) -> Result<String, CodegenError> {
    if data.len() != 1 {
        return Err(cx.malformed(format!("a constant expression holds {} elements, not one", data.len())));
    }
    let d = data.dtype();
    Ok(match data {
        TensorData::F32(v) => f32_lit(v[0]),
        TensorData::F16(v) => f32_lit(v[0].to_f32()),
        TensorData::BF16(v) => f32_lit(v[0].to_f32()),
        TensorData::I64(v) => lit(d, 0.0, Some(v[0])),
        _ => lit(d, data.to_f64_vec()[0], None),
    })
}

/// The operands of an expression.
pub(crate) fn operands(e: &Expr) -> Vec<ExprId> {
    e.operands()
}

/// Check that every load among `ids` has the type of the buffer it reads.
pub(crate) fn check_loads(
    cx: &Ctx,
    body: &Body,
    ids: &[ExprId],
    inputs: &[crate::kernel::Access],
) -> Result<(), CodegenError> {
    for &id in ids {
        if let (Expr::Load(n) | Expr::Gather { input: n, .. }, d) = &body.exprs[id.index()] {
            let bd = cx.dtype(inputs[n.index()].buffer)?;
            if bd != *d {
                return Err(cx.malformed(format!("expression {id} loads a {bd} buffer as {d}")));
            }
        }
    }
    Ok(())
}

/// The expressions `roots` depend on (themselves included), in SSA order, not looking
/// through those where `stop` holds (they are included, their operands are not).
pub(crate) fn closure(body: &Body, roots: &[ExprId], stop: &dyn Fn(ExprId) -> bool) -> Vec<ExprId> {
    let mut seen = vec![false; body.exprs.len()];
    let mut stack: Vec<ExprId> = roots.to_vec();
    while let Some(id) = stack.pop() {
        let Some(s) = seen.get_mut(id.index()) else { continue };
        if std::mem::replace(s, true) {
            continue;
        }
        if !stop(id) {
            stack.extend(operands(&body.exprs[id.index()].0));
        }
    }
    body.ids().filter(|i| seen[i.index()]).collect()
}

/// Gives the C expression of a leaf (Load/Index/Stage/Acc) of a given type.
pub(crate) type Leaf<'a> = dyn FnMut(&mut Helpers, ExprId, &Expr, DType) -> Result<String, CodegenError> + 'a;

/// The C expression of one body expression. `name(id)` names the variables holding
/// operands; `leaf` gives Load/Index/Stage/Acc (already as register values).
pub(crate) fn expr_c(
    cx: &Ctx,
    h: &mut Helpers,
    body: &Body,
    id: ExprId,
    name: &dyn Fn(ExprId) -> String,
    leaf: &mut Leaf,
) -> Result<String, CodegenError> {
    let (e, d) = &body.exprs[id.index()];
    let d = *d;
    match e {
        Expr::Const(t) => tensor_lit(cx, t.data()),
        Expr::Unary(op, a) => Ok(unary_c(h, *op, body.dtype(*a), &name(*a))),
        Expr::Binary(op, a, b) => Ok(binary_c(h, *op, body.dtype(*a), &name(*a), &name(*b))),
        Expr::Select(c, a, b) => Ok(format!("({} ? {} : {})", name(*c), name(*a), name(*b))),
        Expr::Cast(a) => Ok(cast_c(h, body.dtype(*a), d, &name(*a))),
        Expr::Load(_) | Expr::Index(_) | Expr::Stage(_) | Expr::Acc | Expr::Gather { .. } => leaf(h, id, e, d),
    }
}

/// The C expression of a gather read: `base` (the access's address, without the indexed
/// term) plus the normalized index times the stride; an index out of range reads 0.
pub(crate) fn gather_c(
    h: &mut Helpers,
    param: usize,
    base: &str,
    index: &str,
    stride: i64,
    extent: u64,
    d: DType,
) -> String {
    let k = format!("((long long){index} + ((long long){index} < 0LL ? {extent}LL : 0LL))");
    let read = load_conv(h, d, &format!("p{param}[{base} + {k} * {}]", i64_lit(stride)));
    format!(
        "((unsigned long long){k} < {extent}ULL ? {read} : {})",
        lit(d, 0.0, None)
    )
}

/// Which expressions [`emit_exprs`] writes, and the values the kernel stores.
#[derive(Clone, Copy)]
pub(crate) struct Exprs<'a> {
    pub ids: &'a [ExprId],
    pub stored: &'a [ExprId],
}

/// Emit `const T name = expr;` for each of `ids` (in order).
///
/// `stored` holds the values the kernel stores. An f16/bf16 one that other expressions
/// of the body also read is rounded where it is defined, not only at its store: every
/// reader, in this kernel or in any kernel that loads the stored tensor (a value
/// recomputed in the backward from it), then sees the same value. Otherwise a fused
/// kernel's readers would see the f32 value before rounding ([`ROUND_EVERY_HALF_OP`]),
/// and a recomputation from the stored tensor would not give the forward's bits (a
/// recomputed row's maximum could then equal none of its elements).
pub(crate) fn emit_exprs(
    cx: &Ctx,
    w: &mut Writer,
    h: &mut Helpers,
    body: &Body,
    Exprs { ids, stored }: Exprs,
    name: &dyn Fn(ExprId) -> String,
    leaf: &mut Leaf,
) -> Result<(), CodegenError> {
    let read_here = |id: ExprId| body.exprs.iter().any(|(e, _)| operands(e).contains(&id));
    for &id in ids {
        let mut c = expr_c(cx, h, body, id, name, leaf)?;
        let d = body.dtype(id);
        if !ROUND_EVERY_HALF_OP
            && matches!(d, DType::F16 | DType::BF16)
            && matches!(body.exprs[id.index()].0, Expr::Unary(..) | Expr::Binary(..))
            && stored.contains(&id)
            && read_here(id)
        {
            c = round_to(h, d, c);
        }
        w.line(format!("const {} {} = {c};", reg_type(d), name(id)));
    }
    Ok(())
}

/// The C type suffix of float helpers: `f32` for f32/f16/bf16, `f64`.
fn fsuf(d: DType) -> &'static str {
    if d == DType::F64 {
        "f64"
    } else {
        "f32"
    }
}

fn fhelper(h: &mut Helpers, d: DType, f32h: Helper, f64h: Helper) {
    h.need(if d == DType::F64 { f64h } else { f32h });
}

/// Math function names of the float type of `d`.
fn math(d: DType, name: &str) -> String {
    if d == DType::F64 {
        name.to_string()
    } else {
        format!("{name}f")
    }
}

pub(crate) fn unary_c(h: &mut Helpers, op: UnaryOp, d: DType, x: &str) -> String {
    if d.is_float() {
        let one = if d == DType::F64 { "1.0" } else { "1.0f" };
        let zero = if d == DType::F64 { "0.0" } else { "0.0f" };
        let s = fsuf(d);
        let r = match op {
            UnaryOp::IsNan => return format!("((unsigned char)({x} != {x}))"),
            UnaryOp::IsInf => return format!("((unsigned char)({}({x}) == {}))", math(d, "fabs"), inf_lit(d)),
            UnaryOp::Neg => format!("(-{x})"),
            UnaryOp::Abs => format!("{}({x})", math(d, "fabs")),
            UnaryOp::Exp => format!("{}({x})", math(d, "exp")),
            UnaryOp::Log => format!("{}({x})", math(d, "log")),
            UnaryOp::Sqrt => format!("{}({x})", math(d, "sqrt")),
            UnaryOp::Rsqrt => format!("({one} / {}({x}))", math(d, "sqrt")),
            UnaryOp::Reciprocal => format!("({one} / {x})"),
            UnaryOp::Tanh => format!("{}({x})", math(d, "tanh")),
            UnaryOp::Sigmoid => {
                fhelper(h, d, Helper::SigmoidF32, Helper::SigmoidF64);
                format!("g_sigmoid_{s}({x})")
            }
            UnaryOp::Relu => format!("({x} < {zero} ? {zero} : {x})"),
            UnaryOp::Gelu => {
                fhelper(h, d, Helper::GeluF32, Helper::GeluF64);
                format!("g_gelu_{s}({x})")
            }
            UnaryOp::GeluTanh => {
                fhelper(h, d, Helper::GeluTanhF32, Helper::GeluTanhF64);
                format!("g_gelu_tanh_{s}({x})")
            }
            UnaryOp::Silu => {
                fhelper(h, d, Helper::SigmoidF32, Helper::SigmoidF64);
                format!("({x} * g_sigmoid_{s}({x}))")
            }
            UnaryOp::Erf => format!("{}({x})", math(d, "erf")),
            UnaryOp::Sin => format!("{}({x})", math(d, "sin")),
            UnaryOp::Cos => format!("{}({x})", math(d, "cos")),
            UnaryOp::Floor => format!("{}({x})", math(d, "floor")),
            UnaryOp::Ceil => format!("{}({x})", math(d, "ceil")),
            UnaryOp::Round => format!("{}({x})", math(d, "rint")),
            UnaryOp::Sign => {
                fhelper(h, d, Helper::SignF32, Helper::SignF64);
                format!("g_sign_{s}({x})")
            }
            UnaryOp::Not => format!("((unsigned char)!{x})"),
        };
        return round_op(h, d, r);
    }
    let t = reg_type(d);
    if d == DType::U8 {
        // Unsigned: no comparisons with zero (NVRTC warns about them).
        return match op {
            UnaryOp::Not => format!("((unsigned char)!{x})"),
            UnaryOp::Neg => format!("(({t})(0ULL - (unsigned long long){x}))"),
            UnaryOp::Sign => format!("(({t})({x} != 0))"),
            _ => x.to_string(),
        };
    }
    match op {
        UnaryOp::Not => format!("((unsigned char)!{x})"),
        UnaryOp::Neg => format!("(({t})(0ULL - (unsigned long long){x}))"),
        UnaryOp::Abs => format!("(({t})({x} < 0 ? 0ULL - (unsigned long long){x} : (unsigned long long){x}))"),
        UnaryOp::Relu => format!("({x} < 0 ? ({t})0 : {x})"),
        UnaryOp::Sign => format!("(({t})(({x} > 0) - ({x} < 0)))"),
        // Float-only ops never reach here on integers (validated).
        _ => format!("(({t})0)"),
    }
}

fn inf_lit(d: DType) -> String {
    if d == DType::F64 {
        f64_lit(f64::INFINITY)
    } else {
        f32_lit(f32::INFINITY)
    }
}

pub(crate) fn binary_c(h: &mut Helpers, op: BinaryOp, d: DType, a: &str, b: &str) -> String {
    let cmp = |o: &str| format!("((unsigned char)({a} {o} {b}))");
    match op {
        BinaryOp::Eq => return cmp("=="),
        BinaryOp::Ne => return cmp("!="),
        BinaryOp::Lt => return cmp("<"),
        BinaryOp::Le => return cmp("<="),
        BinaryOp::Gt => return cmp(">"),
        BinaryOp::Ge => return cmp(">="),
        BinaryOp::And => return format!("((unsigned char)({a} & {b}))"),
        BinaryOp::Or => return format!("((unsigned char)({a} | {b}))"),
        BinaryOp::Xor => return format!("((unsigned char)({a} ^ {b}))"),
        _ => {}
    }
    if d.is_float() {
        let s = fsuf(d);
        let r = match op {
            BinaryOp::Add => format!("({a} + {b})"),
            BinaryOp::Sub => format!("({a} - {b})"),
            BinaryOp::Mul => format!("({a} * {b})"),
            BinaryOp::Div => format!("({a} / {b})"),
            BinaryOp::Pow => {
                fhelper(h, d, Helper::PowF32, Helper::PowF64);
                format!("g_pow_{s}({a}, {b})")
            }
            BinaryOp::Max => {
                fhelper(h, d, Helper::MaxF32, Helper::MaxF64);
                format!("g_max_{s}({a}, {b})")
            }
            BinaryOp::Min => {
                fhelper(h, d, Helper::MinF32, Helper::MinF64);
                format!("g_min_{s}({a}, {b})")
            }
            BinaryOp::Mod => {
                fhelper(h, d, Helper::ModF32, Helper::ModF64);
                format!("g_mod_{s}({a}, {b})")
            }
            BinaryOp::GeluTanhGrad => {
                fhelper(h, d, Helper::GeluTanhGradF32, Helper::GeluTanhGradF64);
                format!("g_gelu_tanh_grad_{s}({a}, {b})")
            }
            _ => format!("{}({a}, {b})", math(d, "fmod")),
        };
        return round_op(h, d, r);
    }
    let t = reg_type(d);
    let u = |o: &str| format!("(({t})((unsigned long long){a} {o} (unsigned long long){b}))");
    match op {
        BinaryOp::Add => u("+"),
        BinaryOp::Sub => u("-"),
        BinaryOp::Mul => u("*"),
        BinaryOp::Max => format!("({b} > {a} ? {b} : {a})"),
        BinaryOp::Min => format!("({b} < {a} ? {b} : {a})"),
        BinaryOp::Div | BinaryOp::Mod | BinaryOp::Fmod | BinaryOp::Pow => {
            let (helper, f) = match op {
                BinaryOp::Div => (Helper::IntDiv, "g_idiv"),
                BinaryOp::Mod => (Helper::IntMod, "g_imod"),
                BinaryOp::Fmod => (Helper::IntFmod, "g_ifmod"),
                _ => (Helper::IntPow, "g_ipow"),
            };
            h.need(helper);
            format!("(({t}){f}((long long){a}, (long long){b}))")
        }
        _ => format!("(({t})0)"),
    }
}

/// Convert a register value of dtype `from` to a register value of `to` (cast semantics).
pub(crate) fn cast_c(h: &mut Helpers, from: DType, to: DType, x: &str) -> String {
    if from == to {
        return x.to_string();
    }
    let is_f32ish = |d: DType| matches!(d, DType::F32 | DType::F16 | DType::BF16);
    if to == DType::Bool {
        return format!("((unsigned char)({x} != 0))");
    }
    match (from, to) {
        // Between f32-computed floats: the value is exact in f32; round to the target.
        (f, t) if is_f32ish(f) && is_f32ish(t) => round_to(h, t, x.to_string()),
        (f, DType::F64) if f.is_float() => format!("((double){x})"),
        (DType::F64, DType::F32) => format!("((float){x})"),
        (DType::F64, t @ (DType::F16 | DType::BF16)) => {
            h.need(Helper::F64ToHalf);
            let f = if t == DType::F16 {
                "g_f64_to_f16r"
            } else {
                "g_f64_to_bf16r"
            };
            format!("{f}({x})")
        }
        (f, t) if f.is_float() && t.is_int() => {
            h.need(Helper::FloatToInt);
            let fun = match t {
                DType::I64 => "g_f64_to_i64",
                DType::I32 => "g_f64_to_i32",
                DType::I8 => "g_f64_to_i8",
                _ => "g_f64_to_u8",
            };
            format!("{fun}((double){x})")
        }
        // From integers or bool.
        (_, DType::F64) => format!("((double){x})"),
        (_, DType::F32) => format!("((float){x})"),
        // Exact in f32 (8-bit integers and bool): one rounding from there.
        (DType::Bool | DType::U8 | DType::I8, t @ (DType::F16 | DType::BF16)) => {
            round_to(h, t, format!("((float){x})"))
        }
        (f, t @ (DType::F16 | DType::BF16)) => {
            h.need(Helper::F64ToHalf);
            let fun = if t == DType::F16 {
                "g_f64_to_f16r"
            } else {
                "g_f64_to_bf16r"
            };
            if f == DType::I64 {
                h.need(Helper::I64ToF64Odd);
                format!("{fun}(g_i64_to_f64_odd({x}))")
            } else {
                format!("{fun}((double){x})")
            }
        }
        // Integers to integers wrap.
        (_, t) => format!("(({}){x})", reg_type(t)),
    }
}

fn is_ident_char(c: u8) -> bool {
    c.is_ascii_alphanumeric() || c == b'_'
}

/// Whether `word` occurs in `s` as a whole identifier.
fn has_word(s: &str, word: &str) -> bool {
    let b = s.as_bytes();
    let mut from = 0;
    while let Some(p) = s[from..].find(word) {
        let start = from + p;
        let end = start + word.len();
        let before = start == 0 || !is_ident_char(b[start - 1]);
        let after = end >= b.len() || !is_ident_char(b[end]);
        if before && after {
            return true;
        }
        from = start + 1;
    }
    false
}

/// The name declared by a line `const T name = ...;`, if it is one.
fn declared_name(line: &str) -> Option<&str> {
    let l = line.trim_start();
    if !l.starts_with("const ") || !l.ends_with(';') {
        return None;
    }
    let eq = l.find(" = ")?;
    let name = l[..eq].rsplit(' ').next()?;
    (!name.is_empty() && name.bytes().all(is_ident_char)).then_some(name)
}

/// Drop `const` local declarations that nothing in their block uses (every generated
/// initializer is free of side effects), until none is left: NVRTC warns about them.
pub(crate) fn prune_unused(src: &str) -> String {
    let mut lines: Vec<&str> = src.lines().collect();
    loop {
        let mut removed = false;
        let mut i = 0;
        while i < lines.len() {
            if let Some(name) = declared_name(lines[i]) {
                // Scan the rest of the enclosing block.
                let mut depth = 0i64;
                let mut used = false;
                for l in &lines[i + 1..] {
                    if has_word(l, name) {
                        used = true;
                        break;
                    }
                    depth += l.matches('{').count() as i64 - l.matches('}').count() as i64;
                    if depth < 0 {
                        break;
                    }
                }
                if !used {
                    lines.remove(i);
                    removed = true;
                    continue;
                }
            }
            i += 1;
        }
        if !removed {
            break;
        }
    }
    let mut out = String::with_capacity(src.len());
    for l in lines {
        let _ = writeln!(out, "{l}");
    }
    out
}
