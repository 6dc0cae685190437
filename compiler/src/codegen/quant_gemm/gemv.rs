//! The weight-only GEMV: a decode step's few rows of `a` (bf16/f16) against an int4 or
//! int8 weight, as TensorRT-LLM's weight-only GEMV and Marlin read it: bandwidth first.
//!
//! A warp owns one output column `n` for every row of `a` (at most [`MAX_ROWS`]); its
//! lanes stride along `k` in 16-byte chunks of the packed weight row (32 int4 or 16
//! int8 values each, one scale: chunks never straddle a group), dequantize in
//! registers (`q * scale` rounded to the product's type, as `dequantize` defines it),
//! multiply by `a`'s values (read 16 bytes at a time, shared by every warp of the block
//! through L1) and accumulate in f32; a shuffle tree sums the lanes, and lane `r` runs
//! the epilogue of row `r`. [`WARPS`] columns a block: 4,096 columns are 512 blocks,
//! several per SM, every weight byte read once.
//!
//! int4 with `a`'s rows fitting [`STAGE_LIMIT`] (a decode step's) takes the packed
//! path, as Marlin and TensorRT-LLM dequantize: the block first stages `a`'s rows in
//! shared memory as f32 (each value converted once for all its warps; a pad value
//! after every 32, so the lanes, 32 values apart, read distinct banks); per 32-bit word of eight
//! weights, the nibbles go two at a time into the mantissas of a pair of halves
//! (`0x4300 | n`: bf16 `128 + n`; `0x6400 | n`: f16 `1024 + n`), one packed FMA takes
//! them to `q` and a second to `q * scale` rounded once to the half type (what
//! `dequantize` gives), and the pair unpacks to f32 for the products.
//!
//! [`STAGE_LIMIT`]: STAGE_LIMIT

use graphc_ir::DType;

use super::super::cuda::{self, Writer};
use super::super::layout;
use super::super::prelude::{Helper, Helpers};
use super::super::{finish, CodegenError, CudaKernel, GridSize, LaunchConfig, Params};
use super::{Epilogue, Gen};
use crate::kernel::{MatMulKernel, QuantB};

/// The most rows of `a` a GEMV takes (a decode step's tokens).
pub(crate) const MAX_ROWS: usize = 16;
/// Warps (output columns) per block.
const WARPS: usize = 8;
/// The most shared memory the packed int4 path stages `a` in, bytes.
const STAGE_LIMIT: usize = 32 * 1024;

/// The shape of one GEMV.
pub(super) struct Plan {
    /// Weight values per 16-byte chunk (32 for int4, 16 for int8).
    per_chunk: usize,
    /// Bytes of one packed weight row.
    row_bytes: usize,
    /// The packed int4 path: `a`'s rows staged in shared memory (f32, `k / 32 * 33`
    /// values a row), `None` otherwise.
    staged: Option<usize>,
}

impl Plan {
    /// The GEMV's plan, or `None` where the tiled kernel serves: more rows than
    /// [`MAX_ROWS`], f32/f64 products, packed rows or groups that are not whole chunks,
    /// or an `a` whose rows are not contiguous 16-byte runs.
    pub(super) fn of(mk: &MatMulKernel, q: &QuantB, d: DType) -> Option<Plan> {
        let per_chunk = match q.bits {
            4 => 32,
            8 => 16,
            _ => return None,
        };
        let row_bytes = mk.k * q.bits / 8;
        let nb = mk.batch.len();
        let a = &mk.a;
        let whole = |x: i64| x.rem_euclid(8) == 0;
        let ok = matches!(d, DType::BF16 | DType::F16)
            && (1..=MAX_ROWS).contains(&mk.m)
            && mk.n > 0
            && mk.k.is_multiple_of(per_chunk)
            && q.group.is_multiple_of(per_chunk)
            && mk.b.offset == 0
            && a.strides[nb + 1] == 1
            && whole(a.offset)
            && a.strides[..=nb].iter().all(|&s| whole(s));
        let pitch = mk.k / 32 * 33;
        let staged = (q.bits == 4 && mk.m * pitch * 4 <= STAGE_LIMIT).then_some(pitch);
        ok.then_some(Plan {
            per_chunk,
            row_bytes,
            staged,
        })
    }
}

/// The GEMV kernel of `g`'s matmul (its epilogue as the tiled kernel's).
pub(super) fn generate(
    g: &Gen,
    plan: &Plan,
    params: &Params,
    ep: &Epilogue,
    batch: usize,
) -> Result<CudaKernel, CodegenError> {
    let (mk, q, d, t) = (g.mk, g.q, g.d, g.t());
    let (m, nb) = (mk.m, mk.batch.len());
    let per_chunk = plan.per_chunk;
    let groups = mk.k.div_ceil(q.group);
    let cols = mk.n.div_ceil(WARPS);
    let tiles = batch.saturating_mul(cols);
    let mut h = Helpers::new();
    h.need(Helper::Vec);
    let mut w = Writer::new();
    w.line(format!(
        "// int{} weight-only GEMV ({d}, groups of {}): {:?} x [{m}, {}] x [{}, {}]; a warp per column, {WARPS} a block, 16-byte chunks of {per_chunk} weights",
        q.bits, q.group, mk.batch, mk.k, mk.k, mk.n
    ));
    w.open(format!(
        "extern \"C\" __global__ void __launch_bounds__({}) {}({})",
        WARPS * 32,
        cuda::ENTRY_PLACEHOLDER,
        params.c_decl()
    ));
    w.line("const int warp = threadIdx.x / 32;");
    w.line("const int lane = threadIdx.x % 32;");
    if plan.staged.is_some() {
        h.need(Helper::Fma2);
        w.line("extern __shared__ __align__(16) unsigned char smem[];");
        w.line("float* const as_ = reinterpret_cast<float*>(smem);");
    }
    w.open(format!(
        "for ({t} tile = blockIdx.x; tile < {}; tile += gridDim.x)",
        g.l(tiles)
    ));
    w.line(format!("const {t} bz = tile / {};", g.l(cols)));
    w.line(format!("const {t} col = (tile % {}) * {WARPS} + warp;", g.l(cols)));
    layout::decompose(&mut w, g.ix, "bz", &mk.batch, "x");
    let abase = layout::address(g.ix, mk.a.offset, &mk.a.strides[..nb], "x");
    w.line(format!("const {t} abase = {abase};"));
    let sm = g.ix.lit(mk.a.strides[nb]);
    if let Some(pitch) = plan.staged {
        // a's rows as f32 in shared memory, a pad value after every 32.
        // Eight values a thread at a time (a's rows are 16-byte runs), within one run of 32.
        w.line("__syncthreads();");
        let per_row = mk.k / 8;
        w.open(format!(
            "for (int e = threadIdx.x; e < {}; e += {})",
            m * per_row,
            WARPS * 32
        ));
        w.line(format!("const int r = e / {per_row}, c = (e % {per_row}) * 8;"));
        w.line(format!(
            "const g_vec16 av = *reinterpret_cast<const g_vec16*>(&p{}[abase + r * {sm} + c]);",
            g.pa
        ));
        w.line(format!("float* const to = &as_[r * {pitch} + c / 32 * 33 + c % 32];"));
        w.line("#pragma unroll");
        w.open("for (int i = 0; i < 8; ++i)");
        let v = cuda::load_conv(&mut h, d, "(unsigned short)(av.w[i >> 1] >> ((i & 1) * 16))");
        w.line(format!("to[i] = {v};"));
        w.close();
        w.close();
        w.line("__syncthreads();");
    }
    w.line(format!("float acc[{m}];"));
    w.line("#pragma unroll");
    w.open(format!("for (int r = 0; r < {m}; ++r)"));
    w.line("acc[r] = 0.0f;");
    w.close();
    w.open(format!("if (col < {})", g.l(mk.n)));
    w.open(format!(
        "for ({t} kk = ({t})lane * {per_chunk}; kk < {}; kk += {})",
        g.l(mk.k),
        32 * per_chunk
    ));
    w.line(format!(
        "const g_vec16 wq = *reinterpret_cast<const g_vec16*>(&p{}[col * {} + kk * {} / 8]);",
        g.pq,
        g.l(plan.row_bytes),
        q.bits
    ));
    if let Some(pitch) = plan.staged {
        packed_chunk(&mut w, &mut h, g, groups, pitch);
    } else {
        let scale = cuda::load_conv(
            &mut h,
            d,
            &format!("p{}[col * {} + kk / {}]", g.ps, g.l(groups), g.l(q.group)),
        );
        w.line(format!("const float sc = {scale};"));
        // The chunk's weights, dequantized and rounded to the product's type.
        w.line(format!("float wv[{per_chunk}];"));
        w.line("#pragma unroll");
        w.open(format!("for (int e = 0; e < {per_chunk}; ++e)"));
        let code = if q.bits == 4 {
            "((int)((wq.w[e >> 3] >> ((e & 7) * 4)) & 15u) ^ 8) - 8"
        } else {
            "(int)(signed char)((wq.w[e >> 2] >> ((e & 3) * 8)) & 255u)"
        };
        let low = cuda::store_conv(&mut h, d, &format!("(float)({code}) * sc"));
        let rounded = cuda::load_conv(&mut h, d, &low);
        w.line(format!("wv[e] = {rounded};"));
        w.close();
        w.line("#pragma unroll");
        w.open(format!("for (int r = 0; r < {m}; ++r)"));
        w.line("float s = 0.0f;");
        w.line("#pragma unroll");
        w.open(format!("for (int v = 0; v < {}; ++v)", per_chunk / 8));
        w.line(format!(
            "const g_vec16 av = *reinterpret_cast<const g_vec16*>(&p{}[abase + r * {sm} + kk + v * 8]);",
            g.pa
        ));
        w.line("#pragma unroll");
        w.open("for (int e = 0; e < 8; ++e)");
        let a_val = cuda::load_conv(
            &mut h,
            d,
            "(unsigned short)((av.w[e >> 1] >> ((e & 1) * 16)) & 0xffffu)",
        );
        w.line(format!("s += {a_val} * wv[v * 8 + e];"));
        w.close();
        w.close();
        w.line("acc[r] += s;");
        w.close();
    }
    w.close();
    w.close();
    // The lanes' partial sums, summed by a shuffle tree; lane r keeps row r's.
    w.line("float mine = 0.0f;");
    w.line("#pragma unroll");
    w.open(format!("for (int r = 0; r < {m}; ++r)"));
    w.line("float v = acc[r];");
    w.line("#pragma unroll");
    w.open("for (int off = 16; off > 0; off >>= 1)");
    w.line("v += __shfl_xor_sync(0xffffffffu, v, off);");
    w.close();
    w.line("if (lane == r) mine = v;");
    w.close();
    w.line(format!("const {t} x{nb} = lane;"));
    w.line(format!("const {t} x{} = col;", nb + 1));
    w.line("const float acc_v = mine;");
    w.open(format!("if (lane < {m} && col < {})", g.l(mk.n)));
    g.element(&mut w, &mut h, ep)?;
    w.close();
    w.close();
    w.close();
    let (source, entry) = finish("qgemv", &h, &w.finish());
    Ok(CudaKernel {
        name: String::new(),
        source,
        entry,
        params: params.list.clone(),
        launch: LaunchConfig {
            block: (WARPS * 32) as u32,
            grid: GridSize::PerSm {
                blocks_per_sm: 8,
                max_blocks: tiles.min(u32::MAX as usize) as u32,
            },
            shared_mem_bytes: plan.staged.map_or(0, |pitch| m * pitch * 4) as u32,
        },
        gemm: None,
    })
}

/// One lane's 16-byte chunk of 32 int4 weights on the packed path (see the module
/// doc), accumulated into `acc[r]` against the staged rows `as_` (row pitch `pitch`).
fn packed_chunk(w: &mut Writer, h: &mut Helpers, g: &Gen, groups: usize, pitch: usize) {
    let (mk, q, d) = (g.mk, g.q, g.d);
    // The pair's magic (128 + n, or 1024 + n), one, and -(magic + 8) and -0 per half.
    let (fma, magic, one, neg) = match d {
        DType::BF16 => ("g_fma_bf16x2", 0x4300_4300u32, 0x3f80_3f80u32, 0xc308_c308u32),
        _ => ("g_fma_f16x2", 0x6400_6400, 0x3c00_3c00, 0xe408_e408),
    };
    let unpack = |h: &mut Helpers, half: &str| match d {
        DType::BF16 if half == "lo" => "__uint_as_float(w2 << 16)".to_string(),
        DType::BF16 => "__uint_as_float(w2 & 0xffff0000u)".to_string(),
        _ => cuda::load_conv(
            h,
            d,
            if half == "lo" {
                "(unsigned short)(w2 & 0xffffu)"
            } else {
                "(unsigned short)(w2 >> 16)"
            },
        ),
    };
    w.line(format!(
        "const unsigned sc2 = (unsigned)p{}[col * {} + kk / {}] * 0x10001u;",
        g.ps,
        g.l(groups),
        g.l(q.group)
    ));
    w.line("const int ab = (int)(kk / 32) * 33;");
    w.line("#pragma unroll");
    w.open("for (int wd = 0; wd < 4; ++wd)");
    // Offset binary: n = q + 8.
    w.line("const unsigned x = wq.w[wd] ^ 0x88888888u;");
    w.line("float wl[4], wh[4];");
    w.line("#pragma unroll");
    w.open("for (int j = 0; j < 4; ++j)");
    w.line(format!(
        "const unsigned q2 = {fma}(((x >> (4 * j)) & 0x000f000fu) | {magic:#x}u, {one:#x}u, {neg:#x}u);"
    ));
    w.line(format!("const unsigned w2 = {fma}(q2, sc2, 0x80008000u);"));
    let (lo, hi) = (unpack(h, "lo"), unpack(h, "hi"));
    w.line(format!("wl[j] = {lo};"));
    w.line(format!("wh[j] = {hi};"));
    w.close();
    w.line("#pragma unroll");
    w.open(format!("for (int r = 0; r < {}; ++r)", mk.m));
    w.line(format!("const float* const ar = &as_[r * {pitch} + ab + wd * 8];"));
    w.line("acc[r] += ar[0] * wl[0] + ar[1] * wl[1] + ar[2] * wl[2] + ar[3] * wl[3] + ar[4] * wh[0] + ar[5] * wh[1] + ar[6] * wh[2] + ar[7] * wh[3];");
    w.close();
    w.close();
}
