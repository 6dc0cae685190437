//! The attention kernel: a flash-attention-style forward that never stores the
//! scores, generated per shape and dtype.
//!
//! A block of [`WARPS`] warps takes `WARPS` consecutive query rows of one (batch,
//! head); warp `w` owns row `i0 + w`, its q row staged in shared memory. Keys are
//! streamed through shared memory in tiles of `kt` (32, or fewer when a head dim over
//! 128 would not fit the 48 KiB of static shared memory): k and v tiles loaded by the
//! whole block, converted to the accumulation type. Per tile, lane `j` computes the
//! score of key `j0 + j` (`q . k * scale + mask`), the warp takes the tile's max and
//! rescales its running sum and output (online softmax), then every lane accumulates
//! `p v` for the output columns it owns (`lane, lane + 32, ..`). With `causal`, tiles
//! wholly after the block's last row are never loaded and keys after a row score
//! `-inf`. Arithmetic is in f32 (f64 for f64), the output rounded once; the CPU
//! executor (`runtime/src/kernels/attention.rs`) computes the same tiles.
//!
//! This is the CUDA-core path, for every float dtype and head dims up to 256. (Tensor
//! cores through the `mma.sync` helpers for bf16/f16 are the next step; see the issue
//! notes.)

use graphc_ir::{AttentionDims, DType, TensorType};

use super::cuda::{self, Writer};
use super::layout::{self, Ix};
use super::prelude::Helpers;
use super::{CodegenError, Ctx, GridSize, LaunchConfig};
use crate::kernel::Access;

/// Query rows (warps) per block.
pub const WARPS: usize = 4;
/// Static shared memory a kernel may use.
const SMEM_LIMIT: usize = 48 * 1024;
/// The largest head dim generated.
pub const MAX_HEAD_DIM: usize = 256;

/// Keys per tile for head dims `d`, `dv` and an accumulator of `size` bytes: 32, or
/// the largest power of two that keeps the k, v and q tiles in static shared memory.
fn key_tile(d: usize, dv: usize, size: usize) -> usize {
    let bytes = |kt: usize| (kt * (d + 1) + kt * dv + WARPS * d) * size;
    let mut kt = 32;
    while kt > 1 && bytes(kt) > SMEM_LIMIT {
        kt /= 2;
    }
    kt
}

pub(crate) struct Args<'a> {
    pub cx: &'a Ctx<'a>,
    pub inputs: &'a [(Access, TensorType)],
    pub in_param: &'a [usize],
    pub out_param: usize,
    pub out: &'a TensorType,
    pub params_decl: String,
    pub scale: f64,
    pub causal: bool,
}

/// Strides of an access over its type, 0 on dims of extent 1 (a broadcast operand's
/// size-1 dims are never stepped, whatever stride fusion gave them).
fn strides(a: &Access, ty: &TensorType) -> Vec<i64> {
    a.strides
        .iter()
        .zip(ty.shape.dims())
        .map(|(&s, &d)| if d == 1 { 0 } else { s })
        .collect()
}

pub(crate) fn generate(g: &Args<'_>) -> Result<(&'static str, (String, Helpers), LaunchConfig), CodegenError> {
    let tys: Vec<&TensorType> = g.inputs.iter().map(|(_, t)| t).collect();
    let dims = AttentionDims::of(&tys).map_err(|m| g.cx.malformed(m))?;
    if dims.out_dims() != g.out.shape.dims() || g.out.dtype != tys[0].dtype {
        return Err(g.cx.malformed(format!(
            "attention gives {:?}, its output is {}",
            dims.out_dims(),
            g.out
        )));
    }
    if dims.d > MAX_HEAD_DIM || dims.dv > MAX_HEAD_DIM {
        return Err(CodegenError::UnsupportedOp {
            kernel: g.cx.kernel.clone(),
            op: format!(
                "attention with head dim {} / {} (at most {MAX_HEAD_DIM})",
                dims.d, dims.dv
            ),
        });
    }
    let d = g.out.dtype;
    let (acc_t, size) = if d == DType::F64 { ("double", 8) } else { ("float", 4) };
    let lit = |x: f64| {
        if d == DType::F64 {
            cuda::f64_lit(x)
        } else {
            cuda::f32_lit(x as f32)
        }
    };
    let (exp, fmax) = if d == DType::F64 {
        ("exp", "fmax")
    } else {
        ("expf", "fmaxf")
    };
    let neg_inf = lit(f64::NEG_INFINITY);
    let AttentionDims {
        batch,
        hq,
        sq,
        sk,
        d: hd,
        dv,
        ..
    } = dims.clone();
    let nb: usize = batch.iter().product();
    let group = dims.group();
    let nbd = batch.len();
    let kt = key_tile(hd, dv, size);
    let qtiles = sq.div_ceil(WARPS);
    let tiles = nb * hq * qtiles;
    let per_lane = dv.div_ceil(32);

    // Index type: wide when any operand's reach or the output passes 2^30 elements.
    let mut wide = g.out.numel() >= 1 << 30 || tiles >= 1 << 30;
    for (a, t) in g.inputs {
        wide |= Ix::for_space(t.shape.dims(), &[(a.offset, &a.strides[..])], 0).wide;
    }
    let ix = Ix { wide };
    let t = ix.ty();
    let l = |x: usize| ix.lit(x as i64);

    let mut h = Helpers::new();
    let mut w = Writer::new();
    w.line(format!(
        "// attention: {nb} x {hq} heads ({} kv), [{sq}, {hd}] x [{sk}, {hd}] -> [{sq}, {dv}], scale {}, {}{}; {WARPS} rows per block, {kt} keys per tile",
        dims.hkv,
        g.scale,
        if g.causal { "causal" } else { "not causal" },
        if dims.masked { ", additive mask" } else { "" },
    ));
    w.open(format!(
        "extern \"C\" __global__ void __launch_bounds__({}) {}({})",
        WARPS * 32,
        cuda::ENTRY_PLACEHOLDER,
        g.params_decl
    ));
    w.line(format!("__shared__ {acc_t} ks[{kt}][{}];", hd + 1));
    w.line(format!("__shared__ {acc_t} vs[{kt}][{dv}];"));
    w.line(format!("__shared__ {acc_t} qs[{WARPS}][{hd}];"));
    w.line("const int warp = threadIdx.x / 32;");
    w.line("const int lane = threadIdx.x % 32;");
    w.open(format!(
        "for ({t} tile = blockIdx.x; tile < {}; tile += gridDim.x)",
        l(tiles)
    ));
    w.line(format!("const {t} b = tile / {};", l(hq * qtiles)));
    w.line(format!("const {t} h = (tile / {}) % {};", l(qtiles), l(hq)));
    w.line(format!("const {t} i0 = (tile % {}) * {WARPS};", l(qtiles)));
    w.line(format!("const {t} g = h / {};", l(group)));
    w.line(format!("const {t} i = i0 + warp;"));
    w.line(format!("const bool row_ok = i < {};", l(sq)));
    layout::decompose(&mut w, ix, "b", &batch, "bb");
    // Base addresses: batch coordinates and head; rows and columns added per use.
    let names = ["q", "k", "v", "m"];
    let mut st: Vec<Vec<i64>> = Vec::new();
    for (n, (a, ty)) in g.inputs.iter().enumerate() {
        let s = strides(a, ty);
        let head = if n == 0 || n == 3 { "h" } else { "g" };
        let mut base = layout::address(ix, a.offset, &s[..nbd], "bb");
        if s[nbd] != 0 {
            base = format!("{base} + {head} * {}", ix.lit(s[nbd]));
        }
        w.line(format!("const {t} {}base = {base};", names[n]));
        st.push(s);
    }
    let p = |n: usize| format!("p{}", g.in_param[n]);
    // The q row, staged per warp.
    w.line("__syncthreads();");
    let lq = cuda::load_conv(
        &mut h,
        d,
        &format!(
            "{}[qbase + i * {} + c * {}]",
            p(0),
            ix.lit(st[0][nbd + 1]),
            ix.lit(st[0][nbd + 2])
        ),
    );
    w.open(format!("for (int c = lane; c < {hd}; c += 32)"));
    w.line(format!("qs[warp][c] = row_ok ? ({acc_t}){lq} : {};", lit(0.0)));
    w.close();
    w.line(format!("{acc_t} m = {neg_inf};"));
    w.line(format!("{acc_t} l = {};", lit(0.0)));
    w.line(format!("{acc_t} o[{per_lane}];"));
    w.line("#pragma unroll");
    w.open(format!("for (int t = 0; t < {per_lane}; ++t)"));
    w.line(format!("o[t] = {};", lit(0.0)));
    w.close();
    let kend = if g.causal {
        format!("min(({t}){}, i0 + {WARPS})", l(sk))
    } else {
        l(sk)
    };
    w.line(format!("const {t} kend = {kend};"));
    w.open(format!("for ({t} j0 = 0; j0 < kend; j0 += {kt})"));
    w.line("__syncthreads();");
    for (n, (tile, width)) in [("ks", hd), ("vs", dv)].into_iter().enumerate() {
        let a = n + 1;
        let ld = cuda::load_conv(
            &mut h,
            d,
            &format!(
                "{}[{}base + (j0 + jj) * {} + c * {}]",
                p(a),
                names[a],
                ix.lit(st[a][nbd + 1]),
                ix.lit(st[a][nbd + 2])
            ),
        );
        w.open(format!(
            "for (int e = threadIdx.x; e < {}; e += {})",
            kt * width,
            WARPS * 32
        ));
        w.line(format!("const int jj = e / {width};"));
        w.line(format!("const int c = e % {width};"));
        w.line(format!(
            "{tile}[jj][c] = (j0 + jj < {}) ? ({acc_t}){ld} : {};",
            l(sk),
            lit(0.0)
        ));
        w.close();
    }
    w.line("__syncthreads();");
    // Lane j scores key j0 + j.
    w.line(format!("{acc_t} s = {neg_inf};"));
    w.line(format!("const {t} j = j0 + lane;"));
    let causal_ok = if g.causal { " && j <= i" } else { "" };
    w.open(format!("if (lane < {kt} && j < {} && row_ok{causal_ok})", l(sk)));
    w.line(format!("{acc_t} dot = {};", lit(0.0)));
    w.line("#pragma unroll 8");
    w.open(format!("for (int c = 0; c < {hd}; ++c)"));
    w.line("dot += qs[warp][c] * ks[lane][c];");
    w.close();
    w.line(format!("s = dot * {};", lit(g.scale)));
    if dims.masked {
        let ms = &st[3];
        let lm = cuda::load_conv(
            &mut h,
            d,
            &format!(
                "{}[mbase + i * {} + j * {}]",
                p(3),
                ix.lit(ms[nbd + 1]),
                ix.lit(ms[nbd + 2])
            ),
        );
        w.line(format!("s += ({acc_t}){lm};"));
    }
    w.close();
    w.line(format!("{acc_t} tmax = s;"));
    w.line("#pragma unroll");
    w.open("for (int off = 16; off > 0; off >>= 1)");
    w.line(format!("tmax = {fmax}(tmax, __shfl_xor_sync(0xffffffffu, tmax, off));"));
    w.close();
    w.line(format!("const {acc_t} mnew = {fmax}(m, tmax);"));
    // Everything so far masked out: nothing to add (warp-uniform).
    w.line(format!("if (mnew == {neg_inf}) continue;"));
    w.line(format!("const {acc_t} corr = {exp}(m - mnew);"));
    w.line(format!("const {acc_t} pj = {exp}(s - mnew);"));
    w.line(format!("{acc_t} psum = pj;"));
    w.line("#pragma unroll");
    w.open("for (int off = 16; off > 0; off >>= 1)");
    w.line("psum += __shfl_xor_sync(0xffffffffu, psum, off);");
    w.close();
    w.line("l = l * corr + psum;");
    w.line("#pragma unroll");
    w.open(format!("for (int t = 0; t < {per_lane}; ++t)"));
    w.line("o[t] *= corr;");
    w.close();
    w.open(format!("for (int jj = 0; jj < {kt}; ++jj)"));
    w.line(format!("const {acc_t} pk = __shfl_sync(0xffffffffu, pj, jj);"));
    w.line("#pragma unroll");
    w.open(format!("for (int t = 0; t < {per_lane}; ++t)"));
    w.line("const int c = lane + 32 * t;");
    w.open(format!("if (c < {dv})"));
    w.line("o[t] += pk * vs[jj][c];");
    w.close();
    w.close();
    w.close();
    w.line("m = mnew;");
    w.close();
    // The row: acc / l (a row with every key masked: 0 / 0 = NaN, as the definition).
    w.open("if (row_ok)");
    w.line("#pragma unroll");
    w.open(format!("for (int t = 0; t < {per_lane}; ++t)"));
    w.line("const int c = lane + 32 * t;");
    w.open(format!("if (c < {dv})"));
    let val = if sk == 0 { lit(0.0) } else { "o[t] / l".to_string() };
    let val = match d {
        DType::F16 | DType::BF16 => cuda::cast_c(&mut h, DType::F32, d, &val),
        _ => val,
    };
    let val = cuda::store_conv(&mut h, d, &val);
    w.line(format!(
        "p{}[((b * {} + h) * {} + i) * {} + c] = {val};",
        g.out_param,
        l(hq),
        l(sq),
        l(dv)
    ));
    w.close();
    w.close();
    w.close();
    w.close();
    w.close();
    Ok((
        "attention",
        (w.finish(), h),
        LaunchConfig {
            block: (WARPS * 32) as u32,
            grid: GridSize::PerSm {
                blocks_per_sm: 8,
                max_blocks: tiles.min(u32::MAX as usize) as u32,
            },
            shared_mem_bytes: 0,
        },
    ))
}
