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
//! This is the CUDA-core path: f32 and f64, and bf16/f16 head dims that are not
//! multiples of 16. bf16 and f16 with head dims that are go to the tensor-core kernel
//! in [`mma`].

pub(crate) mod backward;
mod mma;
mod mma_backward;

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
    /// A row whose sum is 0 or NaN (every key masked) stores 0.
    pub zero_masked_rows: bool,
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

/// What every phase of the generated kernel needs: the shapes, the accumulation type
/// and its literals, the index type, and the operands' strides.
struct Gen<'a> {
    g: &'a Args<'a>,
    dims: AttentionDims,
    /// The storage dtype (q, k, v, mask and output).
    d: DType,
    acc_t: &'static str,
    ix: Ix,
    /// Each operand's strides (0 on dims of extent 1).
    st: Vec<Vec<i64>>,
    /// Keys per tile; output columns per lane.
    kt: usize,
    per_lane: usize,
    /// `attention_lse`'s kernel: the same scores and running sums, no v and no `p v`,
    /// each row's log-sum-exp stored (the operands are q, k, k again in v's place,
    /// never read, and the mask).
    lse: bool,
}

const NAMES: [&str; 4] = ["q", "k", "v", "m"];

impl<'a> Gen<'a> {
    /// The generator of `g`'s operands (q, k, v and maybe a mask) of `dims`.
    fn new(g: &'a Args<'a>, dims: AttentionDims) -> Gen<'a> {
        let d = dims.dtype;
        let (acc_t, size) = if d == DType::F64 { ("double", 8) } else { ("float", 4) };
        let nb: usize = dims.batch.iter().product();
        let tiles = nb * dims.hq * dims.sq.div_ceil(WARPS);
        // Index type: wide when any operand's reach or the output passes 2^30 elements.
        let mut wide = g.out.numel() >= 1 << 30 || tiles >= 1 << 30;
        for (a, t) in g.inputs {
            wide |= Ix::for_space(t.shape.dims(), &[(a.offset, &a.strides[..])], 0).wide;
        }
        Gen {
            g,
            d,
            acc_t,
            ix: Ix { wide },
            st: g.inputs.iter().map(|(a, ty)| strides(a, ty)).collect(),
            kt: key_tile(dims.d, dims.dv, size),
            per_lane: dims.dv.div_ceil(32),
            dims,
            lse: false,
        }
    }

    /// `attention_lse` as the forward's kernel without v: on tensor cores where that
    /// kernel takes the dims (`mma::generate` with `lse`), else the CUDA-core forward
    /// ([`cuda_core_kernel`] with `lse`); `g`'s operands are q, k and maybe a mask.
    /// `None` for dims the forward does not take.
    fn lse_kernel(g: &Args<'_>) -> Option<(String, Helpers, LaunchConfig)> {
        let (q, k) = (g.inputs.first()?, g.inputs.get(1)?);
        let mut inputs = vec![q.clone(), k.clone(), k.clone()];
        let mut in_param = vec![g.in_param[0], g.in_param[1], g.in_param[1]];
        if let (Some(m), Some(&pm)) = (g.inputs.get(2), g.in_param.get(2)) {
            inputs.push(m.clone());
            in_param.push(pm);
        }
        let tys: Vec<&TensorType> = inputs.iter().map(|(_, t)| t).collect();
        let dims = AttentionDims::of(&tys).ok()?;
        if dims.d > MAX_HEAD_DIM || dims.sk == 0 {
            return None;
        }
        let args = Args {
            inputs: &inputs,
            in_param: &in_param,
            params_decl: g.params_decl.clone(),
            ..*g
        };
        let nb: usize = dims.batch.iter().product();
        let mut gen = Gen::new(&args, dims);
        gen.lse = true;
        let mut h = Helpers::new();
        if mma::applies(&gen.dims) {
            let (source, launch) = mma::generate(&gen, &mut h, nb, true);
            return Some((source, h, launch));
        }
        let (source, launch) = cuda_core_kernel(&gen, &mut h);
        Some((source, h, launch))
    }
}

impl Gen<'_> {
    fn f64(&self) -> bool {
        self.d == DType::F64
    }

    fn lit(&self, x: f64) -> String {
        if self.f64() {
            cuda::f64_lit(x)
        } else {
            cuda::f32_lit(x as f32)
        }
    }

    fn neg_inf(&self) -> String {
        self.lit(f64::NEG_INFINITY)
    }

    fn l(&self, x: usize) -> String {
        self.ix.lit(x as i64)
    }

    fn p(&self, n: usize) -> String {
        format!("p{}", self.g.in_param[n])
    }

    fn nbd(&self) -> usize {
        self.dims.batch.len()
    }

    /// Operand `n`'s load at row `row` and column `col` from its base, as `acc_t`.
    fn load(&self, h: &mut Helpers, n: usize, row: &str, col: &str) -> String {
        let (nbd, st) = (self.nbd(), &self.st[n]);
        let v = cuda::load_conv(
            h,
            self.d,
            &format!(
                "{}[{}base + {row} * {} + {col} * {}]",
                self.p(n),
                NAMES[n],
                self.ix.lit(st[nbd + 1]),
                self.ix.lit(st[nbd + 2])
            ),
        );
        format!("({}){v}", self.acc_t)
    }

    /// The tile loop's head: which (batch, head, rows) this block takes, the operands'
    /// base addresses, and the warp's q row staged in shared memory.
    fn prologue(&self, w: &mut Writer, h: &mut Helpers, tiles: usize, qtiles: usize) {
        let (t, acc_t) = (self.ix.ty(), self.acc_t);
        let AttentionDims {
            batch, hq, sq, d: hd, ..
        } = &self.dims;
        w.open(format!(
            "for ({t} tile = blockIdx.x; tile < {}; tile += gridDim.x)",
            self.l(tiles)
        ));
        w.line(format!("const {t} b = tile / {};", self.l(hq * qtiles)));
        w.line(format!("const {t} h = (tile / {}) % {};", self.l(qtiles), self.l(*hq)));
        w.line(format!("const {t} i0 = (tile % {}) * {WARPS};", self.l(qtiles)));
        w.line(format!("const {t} g = h / {};", self.l(self.dims.group())));
        w.line(format!("const {t} i = i0 + warp;"));
        w.line(format!("const bool row_ok = i < {};", self.l(*sq)));
        layout::decompose(w, self.ix, "b", batch, "bb");
        // Base addresses: batch coordinates and head; rows and columns added per use.
        let nbd = self.nbd();
        for (n, (a, _)) in self.g.inputs.iter().enumerate() {
            if self.lse && n == 2 {
                continue;
            }
            let s = &self.st[n];
            let head = if n == 0 || n == 3 { "h" } else { "g" };
            let mut base = layout::address(self.ix, a.offset, &s[..nbd], "bb");
            if s[nbd] != 0 {
                base = format!("{base} + {head} * {}", self.ix.lit(s[nbd]));
            }
            w.line(format!("const {t} {}base = {base};", NAMES[n]));
        }
        w.line("__syncthreads();");
        let lq = self.load(h, 0, "i", "c");
        w.open(format!("for (int c = lane; c < {hd}; c += 32)"));
        w.line(format!("qs[warp][c] = row_ok ? {lq} : {};", self.lit(0.0)));
        w.close();
        w.line(format!("{acc_t} m = {};", self.neg_inf()));
        w.line(format!("{acc_t} l = {};", self.lit(0.0)));
        if !self.lse {
            w.line(format!("{acc_t} o[{}];", self.per_lane));
            w.line("#pragma unroll");
            w.open(format!("for (int t = 0; t < {}; ++t)", self.per_lane));
            w.line(format!("o[t] = {};", self.lit(0.0)));
            w.close();
        }
    }

    /// One tile of keys: k and v into shared memory, lane j's score of key j0 + j.
    fn tile_scores(&self, w: &mut Writer, h: &mut Helpers) {
        let (kt, acc_t) = (self.kt, self.acc_t);
        let (hd, dv, sk) = (self.dims.d, self.dims.dv, self.dims.sk);
        w.line("__syncthreads();");
        let tiles: &[(&str, usize)] = if self.lse {
            &[("ks", hd)]
        } else {
            &[("ks", hd), ("vs", dv)]
        };
        for (n, &(tile, width)) in tiles.iter().enumerate() {
            let ld = self.load(h, n + 1, "(j0 + jj)", "c");
            w.open(format!(
                "for (int e = threadIdx.x; e < {}; e += {})",
                kt * width,
                WARPS * 32
            ));
            w.line(format!("const int jj = e / {width};"));
            w.line(format!("const int c = e % {width};"));
            w.line(format!(
                "{tile}[jj][c] = (j0 + jj < {}) ? {ld} : {};",
                self.l(sk),
                self.lit(0.0)
            ));
            w.close();
        }
        w.line("__syncthreads();");
        w.line(format!("{acc_t} s = {};", self.neg_inf()));
        w.line(format!("const {} j = j0 + lane;", self.ix.ty()));
        let causal_ok = if self.g.causal { " && j <= i" } else { "" };
        w.open(format!("if (lane < {kt} && j < {} && row_ok{causal_ok})", self.l(sk)));
        w.line(format!("{acc_t} dot = {};", self.lit(0.0)));
        w.line("#pragma unroll 8");
        w.open(format!("for (int c = 0; c < {hd}; ++c)"));
        w.line("dot += qs[warp][c] * ks[lane][c];");
        w.close();
        w.line(format!("s = dot * {};", self.lit(self.g.scale)));
        if self.dims.masked {
            let lm = self.load(h, 3, "i", "j");
            w.line(format!("s += {lm};"));
        }
        w.close();
    }

    /// The tile's online-softmax update and its `p v` into the lane's columns.
    fn online_softmax(&self, w: &mut Writer) {
        let (acc_t, per_lane, dv, kt) = (self.acc_t, self.per_lane, self.dims.dv, self.kt);
        let (exp, fmax) = if self.f64() { ("exp", "fmax") } else { ("expf", "fmaxf") };
        w.line(format!("{acc_t} tmax = s;"));
        w.line("#pragma unroll");
        w.open("for (int off = 16; off > 0; off >>= 1)");
        w.line(format!("tmax = {fmax}(tmax, __shfl_xor_sync(0xffffffffu, tmax, off));"));
        w.close();
        w.line(format!("const {acc_t} mnew = {fmax}(m, tmax);"));
        // Everything so far masked out: nothing to add (warp-uniform).
        w.line(format!("if (mnew == {}) continue;", self.neg_inf()));
        w.line(format!("const {acc_t} corr = {exp}(m - mnew);"));
        w.line(format!("const {acc_t} pj = {exp}(s - mnew);"));
        w.line(format!("{acc_t} psum = pj;"));
        w.line("#pragma unroll");
        w.open("for (int off = 16; off > 0; off >>= 1)");
        w.line("psum += __shfl_xor_sync(0xffffffffu, psum, off);");
        w.close();
        w.line("l = l * corr + psum;");
        if self.lse {
            w.line("m = mnew;");
            return;
        }
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
    }

    /// The row's log-sum-exp `m + log l` by lane 0 (every key masked: `m = -inf`, as
    /// the reference).
    fn store_lse(&self, w: &mut Writer, h: &mut Helpers) {
        let AttentionDims { hq, sq, .. } = self.dims;
        let log = if self.f64() { "log" } else { "logf" };
        w.open("if (row_ok && lane == 0)");
        let val = format!("(m == {ninf} ? m : m + {log}(l))", ninf = self.neg_inf());
        let val = cuda::store_conv(h, self.g.out.dtype, &format!("({})({val})", self.acc_t));
        w.line(format!(
            "p{}[(b * {} + h) * {} + i] = {val};",
            self.g.out_param,
            self.l(hq),
            self.l(sq)
        ));
        w.close();
    }

    /// The row's output: `o / l` (a row with every key masked: 0 / 0 = NaN, as the
    /// definition, or 0 with `zero_masked_rows`), rounded once to the storage type.
    fn store(&self, w: &mut Writer, h: &mut Helpers) {
        let AttentionDims { hq, sq, sk, dv, .. } = self.dims;
        w.open("if (row_ok)");
        w.line("#pragma unroll");
        w.open(format!("for (int t = 0; t < {}; ++t)", self.per_lane));
        w.line("const int c = lane + 32 * t;");
        w.open(format!("if (c < {dv})"));
        let val = if sk == 0 {
            self.lit(0.0)
        } else if self.g.zero_masked_rows {
            // `l` is 0 when every key is masked, NaN when a score is: such rows give 0.
            format!("(l > {zero} ? o[t] / l : {zero})", zero = self.lit(0.0))
        } else {
            "o[t] / l".to_string()
        };
        let val = match self.d {
            DType::F16 | DType::BF16 => cuda::cast_c(h, DType::F32, self.d, &val),
            _ => val,
        };
        let val = cuda::store_conv(h, self.d, &val);
        w.line(format!(
            "p{}[((b * {} + h) * {} + i) * {} + c] = {val};",
            self.g.out_param,
            self.l(hq),
            self.l(sq),
            self.l(dv)
        ));
        w.close();
        w.close();
        w.close();
    }
}

pub(crate) fn generate(g: &Args<'_>) -> Result<(&'static str, (String, Helpers), LaunchConfig), CodegenError> {
    let tys: Vec<&TensorType> = g.inputs.iter().map(|(_, t)| t).collect();
    let dims = AttentionDims::of(&tys).map_err(|m| g.cx.malformed(m))?;
    if dims.out_dims() != g.out.shape.dims() || g.out.dtype != dims.dtype {
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
    let nb: usize = dims.batch.iter().product();
    let gen = Gen::new(g, dims);
    let mut h = Helpers::new();
    if mma::applies(&gen.dims) {
        let (source, launch) = mma::generate(&gen, &mut h, nb, false);
        return Ok(("attention", (source, h), launch));
    }
    let (source, launch) = cuda_core_kernel(&gen, &mut h);
    Ok(("attention", (source, h), launch))
}

/// The CUDA-core kernel of `gen` (the forward, or with `gen.lse` `attention_lse`'s).
fn cuda_core_kernel(gen: &Gen, h: &mut Helpers) -> (String, LaunchConfig) {
    let g = gen.g;
    let acc_t = gen.acc_t;
    let nb: usize = gen.dims.batch.iter().product();
    let qtiles = gen.dims.sq.div_ceil(WARPS);
    let tiles = nb * gen.dims.hq * qtiles;
    let (kt, hd, dv) = (gen.kt, gen.dims.d, gen.dims.dv);
    let mut w = Writer::new();
    w.line(format!(
        "// {}: {nb} x {} heads ({} kv), [{}, {hd}] x [{}, {hd}] -> [{}, {dv}], scale {}, {}{}{}; {WARPS} rows per block, {kt} keys per tile",
        if gen.lse { "attention_lse" } else { "attention" },
        gen.dims.hq,
        gen.dims.hkv,
        gen.dims.sq,
        gen.dims.sk,
        gen.dims.sq,
        g.scale,
        if g.causal { "causal" } else { "not causal" },
        if gen.dims.masked { ", additive mask" } else { "" },
        if g.zero_masked_rows { ", fully masked rows give 0" } else { "" },
    ));
    w.open(format!(
        "extern \"C\" __global__ void __launch_bounds__({}) {}({})",
        WARPS * 32,
        cuda::ENTRY_PLACEHOLDER,
        g.params_decl
    ));
    w.line(format!("__shared__ {acc_t} ks[{kt}][{}];", hd + 1));
    if !gen.lse {
        w.line(format!("__shared__ {acc_t} vs[{kt}][{dv}];"));
    }
    w.line(format!("__shared__ {acc_t} qs[{WARPS}][{hd}];"));
    w.line("const int warp = threadIdx.x / 32;");
    w.line("const int lane = threadIdx.x % 32;");
    gen.prologue(&mut w, h, tiles, qtiles);
    // Causal: tiles wholly after the block's last row are never loaded.
    let t = gen.ix.ty();
    let kend = if g.causal {
        format!("min(({t}){}, i0 + {WARPS})", gen.l(gen.dims.sk))
    } else {
        gen.l(gen.dims.sk)
    };
    w.line(format!("const {t} kend = {kend};"));
    w.open(format!("for ({t} j0 = 0; j0 < kend; j0 += {kt})"));
    gen.tile_scores(&mut w, h);
    gen.online_softmax(&mut w);
    w.close();
    if gen.lse {
        gen.store_lse(&mut w, h);
    } else {
        gen.store(&mut w, h);
    }
    w.close();
    w.close();
    (
        w.finish(),
        LaunchConfig {
            block: (WARPS * 32) as u32,
            grid: GridSize::PerSm {
                blocks_per_sm: 8,
                max_blocks: tiles.min(u32::MAX as usize) as u32,
            },
            shared_mem_bytes: 0,
        },
    )
}
