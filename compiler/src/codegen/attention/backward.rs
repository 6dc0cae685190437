//! Attention's backward kernels ([`Op::AttentionLse`](graphc_ir::Op::AttentionLse),
//! [`Op::AttentionGrad`](graphc_ir::Op::AttentionGrad)): FlashAttention-2's
//! decomposition, never storing a `[sq, sk]` tensor.
//!
//! - `attention_lse`: the forward's kernel without v where it takes the dims
//!   ([`super::Gen::lse_kernel`]), else one thread per query row, in one pass over its
//!   keys (the running max and the sum of exponentials rescaled when it grows).
//! - `attention_grad`: on tensor cores for bf16 and f16 with head dims multiples of 16
//!   ([`super::mma_backward`]), else on CUDA cores, tiled ([`super::tiled`]): f32, f64, and the
//!   other head dims, up to [`super::MAX_HEAD_DIM`].

use graphc_ir::{AttentionDims, AttentionOperand, DType, TensorType};

use super::super::cuda::{self, Writer};
use super::super::prelude::Helpers;
use super::super::{CodegenError, GridSize, LaunchConfig, BLOCKS_PER_SM};
use super::{strides, Args, MAX_HEAD_DIM};

const BLOCK: u32 = 128;

/// Operand roles, in the op's operand order.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Role {
    Q,
    K,
    V,
    Dout,
    Lse,
    Delta,
    Mask,
}

/// What the CUDA-core kernels (these and [`super::tiled`]'s) need of an op: its
/// operands by role, their strides, the dims and the accumulation type.
pub(super) struct Gen<'a> {
    pub a: &'a Args<'a>,
    pub dims: AttentionDims,
    pub d: DType,
    pub acc_t: &'static str,
    /// Operand index of each role present.
    roles: Vec<(Role, usize)>,
    st: Vec<Vec<i64>>,
}

impl<'a> Gen<'a> {
    /// The generator of `a`'s operands in `roles` (their indices), of `dims`.
    pub fn new(a: &'a Args<'a>, dims: AttentionDims, roles: Vec<(Role, usize)>) -> Gen<'a> {
        let d = dims.dtype;
        Gen {
            a,
            d,
            acc_t: if d == DType::F64 { "double" } else { "float" },
            roles,
            st: a.inputs.iter().map(|(acc, ty)| strides(acc, ty)).collect(),
            dims,
        }
    }
}

impl Gen<'_> {
    pub fn lit(&self, x: f64) -> String {
        if self.d == DType::F64 {
            cuda::f64_lit(x)
        } else {
            cuda::f32_lit(x as f32)
        }
    }

    pub fn idx(&self, r: Role) -> Option<usize> {
        self.roles.iter().find(|(x, _)| *x == r).map(|(_, i)| *i)
    }

    /// The address of an element of operand `n` at batch `b` (flat), head `head`,
    /// and the trailing coordinates `tail` (row, column: as many as the operand has
    /// after its head dim).
    fn addr(&self, n: usize, head: &str, tail: &[&str]) -> String {
        let nbd = self.dims.batch.len();
        let st = &self.st[n];
        let mut terms = vec![format!("{}LL", self.a.inputs[n].0.offset)];
        for (k, &s) in st.iter().enumerate().take(nbd) {
            if s != 0 {
                terms.push(format!("bb{k} * {s}LL"));
            }
        }
        if st[nbd] != 0 {
            terms.push(format!("{head} * {}LL", st[nbd]));
        }
        for (t, c) in tail.iter().enumerate() {
            let s = st[nbd + 1 + t];
            if s != 0 {
                terms.push(format!("({c}) * {}LL", s));
            }
        }
        terms.join(" + ")
    }

    /// A load of operand `n` as the accumulation type.
    pub fn load(&self, h: &mut Helpers, n: usize, head: &str, tail: &[&str]) -> String {
        let dt = self.a.inputs[n].1.dtype;
        let v = cuda::load_conv(h, dt, &format!("p{}[{}]", self.a.in_param[n], self.addr(n, head, tail)));
        format!("({}){v}", self.acc_t)
    }

    /// `s = q[i] . k[j] * scale (+ mask)`, `-inf` for a causal `j > i`; query head `hq_`
    /// of kv head `kvh`.
    fn score(&self, w: &mut Writer, h: &mut Helpers, hq_: &str, kvh: &str) {
        let acc_t = self.acc_t;
        w.line(format!("{acc_t} s = {};", self.lit(0.0)));
        w.open(format!("for (long long c = 0; c < {}LL; ++c)", self.dims.d));
        let q = self.load(h, 0, hq_, &["i", "c"]);
        let k = self.load(h, 1, kvh, &["j", "c"]);
        w.line(format!("s += {q} * {k};"));
        w.close();
        w.line(format!("s = s * {};", self.lit(self.a.scale)));
        if let Some(m) = self.idx(Role::Mask) {
            let lm = self.load(h, m, hq_, &["i", "j"]);
            w.line(format!("s = s + {lm};"));
        }
        if self.a.causal {
            w.line(format!("if (j > i) s = {};", self.lit(f64::NEG_INFINITY)));
        }
    }
}

/// The kernel of `attention_lse` (`wrt` None) or of `attention_grad` of `wrt`, with
/// `a`'s operands, scale and flags (`zero_masked_rows` unused by the former).
pub(crate) fn generate(
    a: &Args<'_>,
    wrt: Option<AttentionOperand>,
) -> Result<(&'static str, (String, Helpers), LaunchConfig), CodegenError> {
    let tys: Vec<&TensorType> = a.inputs.iter().map(|(_, t)| t).collect();
    let (att, roles): (Vec<&TensorType>, Vec<(Role, usize)>) = match wrt {
        None => {
            let mut att = vec![tys[0], tys[1], tys[1]];
            let mut roles = vec![(Role::Q, 0), (Role::K, 1)];
            if let Some(m) = tys.get(2) {
                att.push(m);
                roles.push((Role::Mask, 2));
            }
            (att, roles)
        }
        Some(_) => {
            if tys.len() < 6 {
                return Err(a.cx.malformed("attention_grad takes 6 or 7 operands"));
            }
            let mut att = vec![tys[0], tys[1], tys[2]];
            let mut roles = vec![
                (Role::Q, 0),
                (Role::K, 1),
                (Role::V, 2),
                (Role::Dout, 3),
                (Role::Lse, 4),
                (Role::Delta, 5),
            ];
            if let Some(m) = tys.get(6) {
                att.push(m);
                roles.push((Role::Mask, 6));
            }
            (att, roles)
        }
    };
    let dims = AttentionDims::of(&att).map_err(|m| a.cx.malformed(m))?;
    if dims.d > MAX_HEAD_DIM || dims.dv > MAX_HEAD_DIM {
        return Err(a.cx.unsupported(format!(
            "attention's backward with head dim {} / {} (at most {MAX_HEAD_DIM})",
            dims.d, dims.dv
        )));
    }
    // bf16 / f16 with head dims multiples of 16: on tensor cores.
    if wrt.is_none() {
        if let Some((source, h, launch)) = super::Gen::lse_kernel(a) {
            return Ok(("attention_lse", (source, h), launch));
        }
    }
    if let Some(wrt) = wrt {
        if super::mma_backward::applies(&dims, a) {
            let st = a.inputs.iter().map(|(acc, ty)| strides(acc, ty)).collect();
            let (source, h, launch) = super::mma_backward::generate(a, dims, wrt, st);
            return Ok(("attention_grad", (source, h), launch));
        }
    }
    let g = Gen::new(a, dims, roles);
    match wrt {
        Some(wrt) => {
            let (source, h, launch) = super::tiled::generate(&g, super::tiled::Kernel::Grad(wrt));
            Ok(("attention_grad", (source, h), launch))
        }
        None => Ok(("attention_lse", lse_rows(&g), lse_launch(&g))),
    }
}

/// The launch of [`lse_rows`]: one thread per query row.
fn lse_launch(g: &Gen<'_>) -> LaunchConfig {
    let dims = &g.dims;
    let rows = dims.batch.iter().product::<usize>() * dims.hq * dims.sq;
    let blocks = rows.div_ceil(BLOCK as usize).clamp(1, u32::MAX as usize) as u32;
    LaunchConfig {
        block: BLOCK,
        grid: GridSize::PerSm {
            blocks_per_sm: BLOCKS_PER_SM,
            max_blocks: blocks,
        },
        shared_mem_bytes: 0,
    }
}

/// `attention_lse` for dims the forward's kernel does not take: one thread per query
/// row, each score computed once, the running max (NaN-propagating) and the sum of
/// exponentials rescaled when it grows.
fn lse_rows(g: &Gen<'_>) -> (String, Helpers) {
    let (a, dims, d, acc_t) = (g.a, &g.dims, g.d, g.acc_t);
    let nb: usize = dims.batch.iter().product();
    let (rows, heads, len) = (nb * dims.hq * dims.sq, dims.hq, dims.sq);
    let mut h = Helpers::new();
    let mut w = Writer::new();
    w.line(format!(
        "// attention_lse: {nb} x {} heads ({} kv), sq {}, sk {}, d {}, scale {}, {}{}; one thread per query row",
        dims.hq,
        dims.hkv,
        dims.sq,
        dims.sk,
        dims.d,
        a.scale,
        if a.causal { "causal" } else { "not causal" },
        if dims.masked { ", additive mask" } else { "" },
    ));
    w.open(format!(
        "extern \"C\" __global__ void __launch_bounds__({BLOCK}) {}({})",
        cuda::ENTRY_PLACEHOLDER,
        a.params_decl
    ));
    w.open(format!(
        "for (long long t = (long long)blockIdx.x * blockDim.x + threadIdx.x; t < {rows}LL; t += (long long)gridDim.x * blockDim.x)"
    ));
    w.line(format!("const long long b = t / {}LL;", heads * len));
    w.line(format!("const long long hd = (t / {len}LL) % {heads}LL;"));
    w.line(format!("const long long i = t % {len}LL;"));
    batch_coords(&mut w, &dims.batch);
    let (exp, log) = if d == DType::F64 {
        ("exp", "log")
    } else {
        ("expf", "logf")
    };
    let neg_inf = g.lit(f64::NEG_INFINITY);
    w.line(format!("const long long kvh = hd / {}LL;", dims.group()));
    w.line(format!("{acc_t} mx = {neg_inf};"));
    w.line(format!("{acc_t} sum = {};", g.lit(0.0)));
    w.open(format!("for (long long j = 0; j < {}LL; ++j)", dims.sk));
    g.score(&mut w, &mut h, "hd", "kvh");
    w.open("if (s != s || mx != mx)");
    w.line("mx = s + mx;");
    w.close();
    w.open("else if (s > mx)");
    w.line(format!("sum = sum * {exp}(mx - s) + {};", g.lit(1.0)));
    w.line("mx = s;");
    w.close();
    w.open(format!("else if (s != {neg_inf})"));
    w.line(format!("sum += {exp}(s - mx);"));
    w.close();
    w.close();
    let val = format!("(mx == {neg_inf}) ? mx : mx + {log}(sum)");
    w.line(format!(
        "p{}[(b * {}LL + hd) * {}LL + i] = {};",
        a.out_param,
        dims.hq,
        dims.sq,
        cuda::store_conv(&mut h, a.out.dtype, &format!("({acc_t})({val})"))
    ));
    w.close();
    w.close();
    (w.finish(), h)
}

/// `bb0..`: the batch coordinates of the flat batch index `b` over `batch` (what
/// [`Gen`]'s addresses read).
pub(super) fn batch_coords(w: &mut Writer, batch: &[usize]) {
    let mut rem = "b".to_string();
    for k in (0..batch.len()).rev() {
        w.line(format!("const long long bb{k} = {rem} % {}LL;", batch[k]));
        if k > 0 {
            w.line(format!("const long long b{k} = {rem} / {}LL;", batch[k]));
            rem = format!("b{k}");
        }
    }
}
