//! The device helpers a kernel uses, emitted before it (only those it needs, in a
//! fixed order, so sources are deterministic and NVRTC sees no unused functions).
//!
//! A helper that uses inline PTX has the form `#ifdef __CUDA_ARCH__` (the PTX) `#else`
//! (plain C++ with the same results, for the host build of `--device cuda-sim`)
//! `#endif`; those bodies are in `ptx.rs`.

use std::collections::BTreeSet;

use super::cuda::{f32_lit, f64_lit};
use super::ptx;

/// One helper (or group of helpers). Order is emission order: dependencies first.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Helper {
    /// 16- and 8-byte vector types for vectorized loads and stores.
    Vec,
    /// f16 <-> f32 (inline PTX, a CPU body in bit arithmetic; NaN payloads kept as the
    /// `half` crate keeps them).
    F16,
    /// bf16 <-> f32 (bit arithmetic, round to nearest even).
    Bf16,
    /// f64 -> f32 rounded to odd, then f16/bf16: one correct rounding.
    F64ToHalf,
    I64ToF64Odd,
    /// Saturating float -> integer conversions (NaN -> 0).
    FloatToInt,
    SigmoidF32,
    SigmoidF64,
    GeluF32,
    GeluF64,
    GeluTanhF32,
    GeluTanhF64,
    GeluTanhGradF32,
    GeluTanhGradF64,
    SignF32,
    SignF64,
    PowF32,
    PowF64,
    MaxF32,
    MaxF64,
    MinF32,
    MinF64,
    ModF32,
    ModF64,
    IntDiv,
    IntMod,
    IntFmod,
    IntPow,
    /// `g_mma_m16n8k16_bf16_f32` and `g_mma_m16n8k16_f16_f32` (`mma.sync`, f32
    /// accumulators).
    Mma,
    /// `g_ldmatrix_x{1,2,4}[_trans]` (`ldmatrix` of 8x8 b16 matrices from shared memory).
    Ldmatrix,
    /// `g_cp_async_{4,8,16}[_zfill]`, `g_cp_async_commit`, `g_cp_async_wait<N>`,
    /// `g_cp_async_wait_all` (`cp.async` global to shared, with groups).
    CpAsync,
    /// `g_fma_bf16x2` and `g_fma_f16x2` (`fma.rn.{bf16x2,f16x2}`: two fused
    /// multiply-adds on packed halves, each rounded once).
    Fma2,
}

impl Helper {
    /// Every helper, in emission order.
    pub const ALL: &'static [Helper] = &[
        Helper::Vec,
        Helper::F16,
        Helper::Bf16,
        Helper::F64ToHalf,
        Helper::I64ToF64Odd,
        Helper::FloatToInt,
        Helper::SigmoidF32,
        Helper::SigmoidF64,
        Helper::GeluF32,
        Helper::GeluF64,
        Helper::GeluTanhF32,
        Helper::GeluTanhF64,
        Helper::GeluTanhGradF32,
        Helper::GeluTanhGradF64,
        Helper::SignF32,
        Helper::SignF64,
        Helper::PowF32,
        Helper::PowF64,
        Helper::MaxF32,
        Helper::MaxF64,
        Helper::MinF32,
        Helper::MinF64,
        Helper::ModF32,
        Helper::ModF64,
        Helper::IntDiv,
        Helper::IntMod,
        Helper::IntFmod,
        Helper::IntPow,
        Helper::Mma,
        Helper::Ldmatrix,
        Helper::CpAsync,
        Helper::Fma2,
    ];

    fn deps(self) -> &'static [Helper] {
        match self {
            Helper::F64ToHalf | Helper::Mma | Helper::Fma2 => &[Helper::F16, Helper::Bf16],
            _ => &[],
        }
    }

    fn source(self) -> String {
        // Not `static`: NVRTC warns (#177) about an unused static function, and a kernel may
        // use only part of a group (a bf16 copy never rounds).
        let f = "__device__ __forceinline__";
        match self {
            Helper::Vec | Helper::F16 | Helper::Bf16 | Helper::F64ToHalf | Helper::I64ToF64Odd | Helper::FloatToInt => {
                conversion_source(self, f)
            }
            Helper::SigmoidF32
            | Helper::SigmoidF64
            | Helper::GeluF32
            | Helper::GeluF64
            | Helper::GeluTanhF32
            | Helper::GeluTanhF64
            | Helper::GeluTanhGradF32
            | Helper::GeluTanhGradF64
            | Helper::SignF32
            | Helper::SignF64
            | Helper::PowF32
            | Helper::PowF64
            | Helper::MaxF32
            | Helper::MaxF64
            | Helper::MinF32
            | Helper::MinF64
            | Helper::ModF32
            | Helper::ModF64 => float_source(self, f),
            Helper::IntDiv | Helper::IntMod | Helper::IntFmod | Helper::IntPow => int_source(self, f),
            Helper::Mma => ptx::MMA.to_string(),
            Helper::Ldmatrix => ptx::LDMATRIX.to_string(),
            Helper::CpAsync => ptx::CP_ASYNC.to_string(),
            Helper::Fma2 => ptx::FMA2.to_string(),
        }
    }
}

/// The vector types and the conversions between storage and register types, `f` the function qualifiers (empty for the other helpers).
fn conversion_source(h: Helper, f: &str) -> String {
    match h {
        Helper::Vec => "struct alignas(16) g_vec16 { unsigned int w[4]; };\n\
             struct alignas(8) g_vec8 { unsigned int w[2]; };\n\
             struct alignas(4) g_vec4 { unsigned int w[1]; };\n\
             struct alignas(2) g_vec2 { unsigned short w[1]; };\n"
            .to_string(),
        Helper::F16 => format!(
            "#ifdef __CUDA_ARCH__\n\
             {f} float g_f16_to_f32(unsigned short h) {{\n\
             \x20 float x;\n\
             \x20 asm(\"cvt.f32.f16 %0, %1;\" : \"=f\"(x) : \"h\"(h));\n\
             \x20 if ((h & 0x7c00u) == 0x7c00u && (h & 0x3ffu) != 0u)\n\
             \x20   x = __uint_as_float(((unsigned int)(h & 0x8000u) << 16) | 0x7fc00000u | ((unsigned int)(h & 0x3ffu) << 13));\n\
             \x20 return x;\n\
             }}\n\
             {f} unsigned short g_f32_to_f16(float x) {{\n\
             \x20 unsigned short h;\n\
             \x20 asm(\"cvt.rn.f16.f32 %0, %1;\" : \"=h\"(h) : \"f\"(x));\n\
             \x20 if (x != x) {{\n\
             \x20   const unsigned int u = __float_as_uint(x);\n\
             \x20   h = (unsigned short)(((u >> 16) & 0x8000u) | 0x7e00u | ((u & 0x7fffffu) >> 13));\n\
             \x20 }}\n\
             \x20 return h;\n\
             }}\n\
             #else\n\
             {cpu}\
             #endif\n\
             {f} float g_rnd_f16(float x) {{ return g_f16_to_f32(g_f32_to_f16(x)); }}\n",
            cpu = ptx::F16_CPU
        ),
        Helper::Bf16 => format!(
            "{f} float g_bf16_to_f32(unsigned short h) {{\n\
             \x20 const unsigned int u = (h & 0x7fffu) > 0x7f80u ? (unsigned int)(h | 0x40u) : (unsigned int)h;\n\
             \x20 return __uint_as_float(u << 16);\n\
             }}\n\
             {f} unsigned short g_f32_to_bf16(float x) {{\n\
             \x20 const unsigned int u = __float_as_uint(x);\n\
             \x20 if ((u & 0x7fffffffu) > 0x7f800000u) return (unsigned short)((u >> 16) | 0x40u);\n\
             \x20 return (unsigned short)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);\n\
             }}\n\
             {f} float g_rnd_bf16(float x) {{ return g_bf16_to_f32(g_f32_to_bf16(x)); }}\n"
        ),
        Helper::F64ToHalf => format!(
            "{f} float g_f64_to_f32_odd(double x) {{\n\
             \x20 const float y = (float)x;\n\
             \x20 if (y != y || (double)y == x) return y;\n\
             \x20 unsigned int b = __float_as_uint(y);\n\
             \x20 if (fabs((double)y) > fabs(x)) b -= 1u;\n\
             \x20 return __uint_as_float(b | 1u);\n\
             }}\n\
             {f} float g_f64_to_f16r(double x) {{ return g_rnd_f16(g_f64_to_f32_odd(x)); }}\n\
             {f} float g_f64_to_bf16r(double x) {{ return g_rnd_bf16(g_f64_to_f32_odd(x)); }}\n"
        ),
        Helper::I64ToF64Odd => format!(
            "{f} double g_i64_to_f64_odd(long long x) {{\n\
             \x20 const unsigned long long m = x < 0 ? 0ULL - (unsigned long long)x : (unsigned long long)x;\n\
             \x20 if (m < (1ULL << 53)) return (double)x;\n\
             \x20 const int shift = (64 - __clzll((long long)m)) - 53;\n\
             \x20 unsigned long long t = m >> shift;\n\
             \x20 if ((m & ((1ULL << shift) - 1ULL)) != 0ULL) t |= 1ULL;\n\
             \x20 const double v = (double)t * (double)(1ULL << shift);\n\
             \x20 return x < 0 ? -v : v;\n\
             }}\n"
        ),
        Helper::FloatToInt => format!(
            "{f} long long g_f64_to_i64(double x) {{\n\
             \x20 if (x != x) return 0;\n\
             \x20 if (x >= 9223372036854775808.0) return 9223372036854775807LL;\n\
             \x20 if (x <= -9223372036854775808.0) return -9223372036854775807LL - 1;\n\
             \x20 return (long long)x;\n\
             }}\n\
             {f} int g_f64_to_i32(double x) {{\n\
             \x20 if (x != x) return 0;\n\
             \x20 if (x >= 2147483647.0) return 2147483647;\n\
             \x20 if (x <= -2147483648.0) return -2147483647 - 1;\n\
             \x20 return (int)x;\n\
             }}\n\
             {f} signed char g_f64_to_i8(double x) {{\n\
             \x20 if (x != x) return 0;\n\
             \x20 if (x >= 127.0) return 127;\n\
             \x20 if (x <= -128.0) return -128;\n\
             \x20 return (signed char)(int)x;\n\
             }}\n\
             {f} unsigned char g_f64_to_u8(double x) {{\n\
             \x20 if (x != x) return 0;\n\
             \x20 if (x >= 255.0) return 255;\n\
             \x20 if (x <= 0.0) return 0;\n\
             \x20 return (unsigned char)(int)x;\n\
             }}\n"
        ),
        _ => String::new(),
    }
}

/// The float math helpers, `f` the function qualifiers (empty for the other helpers).
fn float_source(h: Helper, f: &str) -> String {
    match h {
        Helper::SigmoidF32 => format!("{f} float g_sigmoid_f32(float x) {{ return 1.0f / (1.0f + expf(-x)); }}\n"),
        Helper::SigmoidF64 => format!("{f} double g_sigmoid_f64(double x) {{ return 1.0 / (1.0 + exp(-x)); }}\n"),
        Helper::GeluF32 => format!(
            "{f} float g_gelu_f32(float x) {{ return 0.5f * x * (1.0f + erff(x / {})); }}\n",
            f32_lit(std::f64::consts::SQRT_2 as f32)
        ),
        Helper::GeluF64 => format!(
            "{f} double g_gelu_f64(double x) {{ return 0.5 * x * (1.0 + erf(x / {})); }}\n",
            f64_lit(std::f64::consts::SQRT_2)
        ),
        Helper::GeluTanhF32 => format!(
            "{f} float g_gelu_tanh_f32(float x) {{\n\
             \x20 return 0.5f * x * (1.0f + tanhf({} * (x + {} * x * x * x)));\n\
             }}\n",
            f32_lit((2.0 / std::f64::consts::PI).sqrt() as f32),
            f32_lit(0.044715f64 as f32)
        ),
        Helper::GeluTanhF64 => format!(
            "{f} double g_gelu_tanh_f64(double x) {{\n\
             \x20 return 0.5 * x * (1.0 + tanh({} * (x + {} * x * x * x)));\n\
             }}\n",
            f64_lit((2.0 / std::f64::consts::PI).sqrt()),
            f64_lit(0.044715)
        ),
        Helper::GeluTanhGradF32 => format!(
            "{f} float g_gelu_tanh_grad_f32(float g, float x) {{\n\
             \x20 const float x2 = x * x;\n\
             \x20 const float t = tanhf({k} * (x + {c} * x2 * x));\n\
             \x20 return g * (0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * ({k} * (1.0f + 3.0f * {c} * x2)));\n\
             }}\n",
            k = f32_lit((2.0 / std::f64::consts::PI).sqrt() as f32),
            c = f32_lit(0.044715f64 as f32)
        ),
        Helper::GeluTanhGradF64 => format!(
            "{f} double g_gelu_tanh_grad_f64(double g, double x) {{\n\
             \x20 const double x2 = x * x;\n\
             \x20 const double t = tanh({k} * (x + {c} * x2 * x));\n\
             \x20 return g * (0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * ({k} * (1.0 + 3.0 * {c} * x2)));\n\
             }}\n",
            k = f64_lit((2.0 / std::f64::consts::PI).sqrt()),
            c = f64_lit(0.044715)
        ),
        Helper::SignF32 => format!(
            "{f} float g_sign_f32(float x) {{ return x > 0.0f ? 1.0f : (x < 0.0f ? -1.0f : (x != x ? x : 0.0f)); }}\n"
        ),
        Helper::SignF64 => format!(
            "{f} double g_sign_f64(double x) {{ return x > 0.0 ? 1.0 : (x < 0.0 ? -1.0 : (x != x ? x : 0.0)); }}\n"
        ),
        Helper::PowF32 => format!("{f} float g_pow_f32(float a, float b) {{ return b == 2.0f ? a * a : powf(a, b); }}\n"),
        Helper::PowF64 => format!("{f} double g_pow_f64(double a, double b) {{ return b == 2.0 ? a * a : pow(a, b); }}\n"),
        Helper::MaxF32 => format!(
            "{f} float g_max_f32(float a, float b) {{ return (a != a || b != b) ? __uint_as_float(0x7fc00000u) : (b > a ? b : a); }}\n"
        ),
        Helper::MaxF64 => format!(
            "{f} double g_max_f64(double a, double b) {{\n\
             \x20 return (a != a || b != b) ? __longlong_as_double(0x7ff8000000000000LL) : (b > a ? b : a);\n\
             }}\n"
        ),
        Helper::MinF32 => format!(
            "{f} float g_min_f32(float a, float b) {{ return (a != a || b != b) ? __uint_as_float(0x7fc00000u) : (b < a ? b : a); }}\n"
        ),
        Helper::MinF64 => format!(
            "{f} double g_min_f64(double a, double b) {{\n\
             \x20 return (a != a || b != b) ? __longlong_as_double(0x7ff8000000000000LL) : (b < a ? b : a);\n\
             }}\n"
        ),
        Helper::ModF32 => format!(
            "{f} float g_mod_f32(float a, float b) {{\n\
             \x20 float r = fmodf(a, b);\n\
             \x20 if (r != 0.0f && ((r < 0.0f) != (b < 0.0f))) r = r + b;\n\
             \x20 return r;\n\
             }}\n"
        ),
        Helper::ModF64 => format!(
            "{f} double g_mod_f64(double a, double b) {{\n\
             \x20 double r = fmod(a, b);\n\
             \x20 if (r != 0.0 && ((r < 0.0) != (b < 0.0))) r = r + b;\n\
             \x20 return r;\n\
             }}\n"
        ),
        _ => String::new(),
    }
}

/// The integer helpers that define division and powers by zero, `f` the function qualifiers (empty for the other helpers).
fn int_source(h: Helper, f: &str) -> String {
    match h {
        Helper::IntDiv => format!(
            "// Integer division by zero gives 0 (the interpreter reports an error).\n\
             {f} long long g_idiv(long long a, long long b) {{\n\
             \x20 if (b == 0) return 0;\n\
             \x20 if (b == -1) return (long long)(0ULL - (unsigned long long)a);\n\
             \x20 return a / b;\n\
             }}\n"
        ),
        Helper::IntMod => format!(
            "// Remainder with the sign of the divisor; by zero gives 0.\n\
             {f} long long g_imod(long long a, long long b) {{\n\
             \x20 if (b == 0 || b == -1) return 0;\n\
             \x20 long long r = a % b;\n\
             \x20 if (r != 0 && ((r < 0) != (b < 0))) r += b;\n\
             \x20 return r;\n\
             }}\n"
        ),
        Helper::IntFmod => format!(
            "// Remainder with the sign of the dividend; by zero gives 0.\n\
             {f} long long g_ifmod(long long a, long long b) {{\n\
             \x20 if (b == 0 || b == -1) return 0;\n\
             \x20 return a % b;\n\
             }}\n"
        ),
        Helper::IntPow => format!(
            "// Wrapping integer power; 0 to a negative power gives 0.\n\
             {f} long long g_ipow(long long a, long long e) {{\n\
             \x20 if (e < 0) return a == 1 ? 1 : (a == -1 ? ((e & 1) ? -1 : 1) : 0);\n\
             \x20 unsigned long long acc = 1ULL, b = (unsigned long long)a, k = (unsigned long long)e;\n\
             \x20 while (k > 0ULL) {{\n\
             \x20   if (k & 1ULL) acc *= b;\n\
             \x20   b *= b;\n\
             \x20   k >>= 1;\n\
             \x20 }}\n\
             \x20 return (long long)acc;\n\
             }}\n"
        ),
        _ => String::new(),
    }
}

/// The source of `helpers` and their dependencies, in emission order (what a kernel that
/// needs them starts with).
pub fn prelude_source(helpers: &[Helper]) -> String {
    let mut h = Helpers::new();
    for &x in helpers {
        h.need(x);
    }
    h.source()
}

/// The set of helpers a kernel needs.
#[derive(Default)]
pub(crate) struct Helpers {
    set: BTreeSet<Helper>,
}

impl Helpers {
    pub fn new() -> Helpers {
        Helpers::default()
    }

    pub fn need(&mut self, h: Helper) {
        if self.set.insert(h) {
            for &d in h.deps() {
                self.need(d);
            }
        }
    }

    /// The helpers' C source, in a fixed order.
    pub fn source(&self) -> String {
        self.set.iter().map(|h| h.source()).collect()
    }
}
