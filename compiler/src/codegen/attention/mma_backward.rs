//! Attention's backward on tensor cores: `attention_grad` for bf16 and f16 with head
//! dims that are multiples of 16 (up to [`MAX_HEAD_DIM`]), FlashAttention-2's
//! backward on `mma.sync` m16n8k16 with f32 accumulators. The scores are recomputed
//! tile by tile from q, k and the row's log-sum-exp, never stored.
//!
//! - **dq** (`wrt` q): a block of [`WARPS`] warps takes 64 query rows of one (batch,
//!   head), 16 per warp, their q and dout fragments in registers (over head dim 128:
//!   kept in shared memory, fragments read per tile). Key tiles of `bn` rows (64; 32
//!   over head dim 64; 16 over 128) pass through shared memory (k and v); per tile a
//!   warp computes `s = q kᵀ` and `dp = dout vᵀ` (16 x bn each), `p = exp(s scale +
//!   mask - lse)`, `ds = p (dp - delta) scale`, and accumulates `dq += ds k` with ds
//!   rounded to the storage type as the A operand and k by `ldmatrix.trans`.
//! - **dk / dv** (`wrt` k or v): a block takes 64 key rows of one (batch, kv head), 16
//!   per warp, their k (and for dk v) fragments in registers (for dk over head dim
//!   64 and for both over 128: in shared memory). Query tiles of every
//!   query head of the kv head's group pass through shared memory (q, dout, and the
//!   rows' lse and delta); per tile a warp computes the transposed scores `sᵀ = k qᵀ`,
//!   `pᵀ`, and `dv += pᵀ dout`, or `dpᵀ = v doutᵀ`, `dsᵀ = pᵀ (dpᵀ - delta) scale` and
//!   `dk += dsᵀ q`.
//! - **dk and dv** in one kernel (an `attention_grad` of k with the one of v as its
//!   sibling, head dims up to [`FUSED_HEAD_DIM`]): both, from one `sᵀ` and `pᵀ` per
//!   tile, as FlashAttention-2's backward; key tiles of 32 rows, so that the two
//!   accumulators stay in registers beside the tile's products.
//!
//! Keys past the end, or (causal) after the query, give `p = 0`; a row whose lse is
//! `-inf` (every key masked) gives 0 with `zero_masked_rows`, else NaN as the
//! definition. Tiles are copied 16 bytes a thread where the operand's layout allows
//! (else element by element), with a barrier before and after (no double buffering). The sums
//! run in another order than the reference's and p / ds are rounded to the storage
//! type before their products, as FlashAttention's are: results agree to the storage
//! type's precision.

use graphc_ir::{AttentionDims, AttentionOperand, DType};

use super::super::cuda::{self, Writer};
use super::super::prelude::{Helper, Helpers};
use super::super::{GridSize, LaunchConfig};
use super::{Args, MAX_HEAD_DIM, WARPS};

/// Rows (queries for dq, keys for dk/dv) per block: 16 per warp.
const BLOCK_R: usize = 16 * WARPS;
/// Shared-memory row padding, in elements (16 bytes).
const PAD: usize = 8;
/// Over this head dim the warp's own rows (q and dout for dq, k and v for dk / dv) stay
/// in shared memory: their fragments beside a [16, d] f32 accumulator would spill.
const WIDE_HEAD_DIM: usize = 128;
/// The widest head dim whose dk and dv one kernel computes: two `[16, d]` f32
/// accumulators a warp beside the tile's products (at 128 ptxas spills).
pub(super) const FUSED_HEAD_DIM: usize = 64;

/// Whether the tensor-core backward takes these dims: bf16 or f16 q, k, v and dout of
/// one type, the output of it, head dims multiples of 16 up to [`MAX_HEAD_DIM`].
pub(super) fn applies(dims: &AttentionDims, a: &Args<'_>) -> bool {
    matches!(dims.dtype, DType::BF16 | DType::F16)
        && a.out.dtype == dims.dtype
        && a.inputs.get(3).is_some_and(|(_, t)| t.dtype == dims.dtype)
        && [dims.d, dims.dv]
            .iter()
            .all(|&x| x > 0 && x % 16 == 0 && x <= MAX_HEAD_DIM)
        && dims.sq > 0
        && dims.sk > 0
}

struct B<'a> {
    a: &'a Args<'a>,
    dims: AttentionDims,
    /// Each operand's strides (0 on dims of extent 1), operands in the op's order: q,
    /// k, v, dout, lse, delta, mask.
    st: Vec<Vec<i64>>,
    wrt: AttentionOperand,
    /// Tile rows streamed through shared memory, and the row pitches.
    bn: usize,
    kp: usize,
    vp: usize,
    /// A head dim over [`WIDE_HEAD_DIM`]: the warp's own rows stay in shared memory.
    wide: bool,
    /// dk (`wrt` k) with dv beside it, stored through this parameter.
    also: Option<usize>,
}

const NAMES: [&str; 7] = ["q", "k", "v", "o", "lse", "dl", "m"];

impl B<'_> {
    fn nbd(&self) -> usize {
        self.dims.batch.len()
    }

    fn p(&self, n: usize) -> String {
        format!("p{}", self.a.in_param[n])
    }

    fn mma(&self) -> &'static str {
        if self.dims.dtype == DType::F16 {
            "g_mma_m16n8k16_f16_f32"
        } else {
            "g_mma_m16n8k16_bf16_f32"
        }
    }

    fn pack_operand(&self, lo: &str, hi: &str) -> String {
        let f = if self.dims.dtype == DType::F16 {
            "g_pack_f16x2"
        } else {
            "g_pack_bf16x2"
        };
        format!("{f}({lo}, {hi})")
    }

    /// `const long long {name}base = ...;`: operand `n` at the batch coordinates
    /// `bb..` and head `head`.
    fn base(&self, w: &mut Writer, n: usize, head: &str) {
        let nbd = self.nbd();
        let st = &self.st[n];
        let mut terms = vec![format!("{}LL", self.a.inputs[n].0.offset)];
        for (k, &s) in st.iter().enumerate().take(nbd) {
            if s != 0 {
                terms.push(format!("bb{k} * {s}LL"));
            }
        }
        if st.len() > nbd && st[nbd] != 0 {
            terms.push(format!("{head} * {}LL", st[nbd]));
        }
        w.line(format!("const long long {}base = {};", NAMES[n], terms.join(" + ")));
    }

    /// Operand `n` (lse, delta: `[.., heads, rows]`) at row `row`, as f32.
    fn row_value(&self, h: &mut Helpers, n: usize, row: &str) -> String {
        let s = self.st[n][self.nbd() + 1];
        let v = cuda::load_conv(
            h,
            self.a.inputs[n].1.dtype,
            &format!("{}[{}base + ({row}) * {s}LL]", self.p(n), NAMES[n]),
        );
        format!("(float){v}")
    }

    /// The mask at query `i`, key `j`, as f32.
    fn mask(&self, h: &mut Helpers, i: &str, j: &str) -> String {
        let nbd = self.nbd();
        let (rs, cs) = (self.st[6][nbd + 1], self.st[6][nbd + 2]);
        let v = cuda::load_conv(
            h,
            self.a.inputs[6].1.dtype,
            &format!("{}[mbase + ({i}) * {rs}LL + ({j}) * {cs}LL]", self.p(6)),
        );
        format!("(float){v}")
    }

    /// Copies `rows` rows of operand `n` from row `r0` (rows past `limit` as zeros) into
    /// `dst` with pitch `pitch`, `width` columns: 16 bytes a thread where the operand's
    /// layout allows ([`super::rows_16_bytes`]; `width` and `pitch` multiples of 8),
    /// else element by element.
    #[allow(clippy::too_many_arguments)]
    fn load_tile(
        &self,
        w: &mut Writer,
        n: usize,
        dst: &str,
        pitch: usize,
        rows: usize,
        r0: &str,
        limit: usize,
        width: usize,
    ) {
        let nbd = self.nbd();
        let (rs, cs) = (self.st[n][nbd + 1], self.st[n][nbd + 2]);
        if super::rows_16_bytes(self.a.inputs[n].0.offset, &self.st[n], nbd)
            && width.is_multiple_of(8)
            && pitch.is_multiple_of(8)
        {
            let chunks = width / 8;
            w.open(format!(
                "for (int e = threadIdx.x; e < {}; e += {})",
                rows * chunks,
                WARPS * 32
            ));
            w.line(format!("const int r = e / {chunks}, c = (e % {chunks}) * 8;"));
            w.line(format!("const long long row = ({r0}) + r;"));
            w.line("uint4 v = make_uint4(0u, 0u, 0u, 0u);");
            w.line(format!(
                "if (row < {limit}LL) v = *reinterpret_cast<const uint4*>(&{}[{}base + row * {rs}LL + c]);",
                self.p(n),
                NAMES[n]
            ));
            w.line(format!("*reinterpret_cast<uint4*>(&{dst}[r * {pitch} + c]) = v;"));
            w.close();
            return;
        }
        w.open(format!(
            "for (int e = threadIdx.x; e < {}; e += {})",
            rows * width,
            WARPS * 32
        ));
        w.line(format!("const int r = e / {width}, c = e % {width};"));
        w.line(format!("const long long row = ({r0}) + r;"));
        w.line(format!(
            "{dst}[r * {pitch} + c] = row < {limit}LL ? {}[{}base + row * {rs}LL + c * {cs}LL] : (unsigned short)0;",
            self.p(n),
            NAMES[n]
        ));
        w.close();
    }

    /// A-operand fragments `frag[width / 16][4]` of the warp's 16 rows of the staged
    /// tile `src` (pitch `pitch`).
    fn a_fragments(&self, w: &mut Writer, frag: &str, src: &str, pitch: usize, width: usize) {
        w.line(format!("unsigned {frag}[{}][4];", width / 16));
        w.line("#pragma unroll");
        w.open(format!("for (int kc = 0; kc < {}; ++kc)", width / 16));
        w.line(format!(
            "g_ldmatrix_x4({frag}[kc], {src} + (warp * 16 + (lane & 7) + 8 * ((lane >> 3) & 1)) * {pitch} + kc * 16 + 8 * (lane >> 4));"
        ));
        w.close();
    }

    /// `acc[bn / 8][4] = frag · tileᵀ`: the warp's 16 rows (A fragments over `width`
    /// columns: `frag[kc]` in registers, or `@src/pitch` to load each from the staged
    /// rows in shared memory) times the `bn` rows of `tile` (pitch `pitch`), B
    /// fragments by `ldmatrix`.
    fn products(&self, w: &mut Writer, acc: &str, frag: &str, tile: &str, pitch: usize, width: usize) {
        let bn = self.bn;
        w.line(format!("float {acc}[{}][4];", bn / 8));
        w.line("#pragma unroll");
        w.open(format!("for (int n = 0; n < {}; ++n)", bn / 8));
        w.line(format!("{acc}[n][0] = {acc}[n][1] = {acc}[n][2] = {acc}[n][3] = 0.0f;"));
        w.close();
        // Wide: a rolled loop over the head dim (the accumulators' indices do not
        // depend on it), so its loads are not all in flight beside the [16, d] output.
        w.line(if self.wide {
            "#pragma unroll 1"
        } else {
            "#pragma unroll"
        });
        w.open(format!("for (int kc = 0; kc < {}; ++kc)", width / 16));
        let frag = match frag.strip_prefix('@').and_then(|f| f.split_once('/')) {
            Some((src, fpitch)) => {
                w.line("unsigned fa[4];");
                w.line(format!(
                    "g_ldmatrix_x4(fa, {src} + (warp * 16 + (lane & 7) + 8 * ((lane >> 3) & 1)) * {fpitch} + kc * 16 + 8 * (lane >> 4));"
                ));
                "fa".to_string()
            }
            None => format!("{frag}[kc]"),
        };
        w.line("#pragma unroll");
        w.open(format!("for (int np = 0; np < {}; ++np)", bn / 16));
        w.line("unsigned fb[4];");
        w.line(format!(
            "g_ldmatrix_x4(fb, {tile} + (np * 16 + 8 * (lane >> 4) + (lane & 7)) * {pitch} + kc * 16 + 8 * ((lane >> 3) & 1));"
        ));
        w.line(format!("{}({acc}[2 * np], {frag}, fb, {acc}[2 * np]);", self.mma()));
        w.line(format!(
            "{}({acc}[2 * np + 1], {frag}, fb + 2, {acc}[2 * np + 1]);",
            self.mma()
        ));
        w.close();
        w.close();
    }

    /// `out[width / 8][4] += src · tile`: `src` (16 x bn accumulators, rounded to the
    /// storage type as A fragments) times `tile` (bn rows of `width` columns, pitch
    /// `pitch`), B fragments by `ldmatrix.trans`.
    fn accumulate(&self, w: &mut Writer, out: &str, src: &str, tile: &str, pitch: usize, width: usize) {
        w.line("#pragma unroll");
        w.open(format!("for (int kc = 0; kc < {}; ++kc)", self.bn / 16));
        w.line("unsigned pa[4];");
        w.line(format!(
            "pa[0] = {};",
            self.pack_operand(&format!("{src}[2 * kc][0]"), &format!("{src}[2 * kc][1]"))
        ));
        w.line(format!(
            "pa[1] = {};",
            self.pack_operand(&format!("{src}[2 * kc][2]"), &format!("{src}[2 * kc][3]"))
        ));
        w.line(format!(
            "pa[2] = {};",
            self.pack_operand(&format!("{src}[2 * kc + 1][0]"), &format!("{src}[2 * kc + 1][1]"))
        ));
        w.line(format!(
            "pa[3] = {};",
            self.pack_operand(&format!("{src}[2 * kc + 1][2]"), &format!("{src}[2 * kc + 1][3]"))
        ));
        w.line("#pragma unroll");
        w.open(format!("for (int dp = 0; dp < {}; ++dp)", width / 16));
        w.line("unsigned tb[4];");
        w.line(format!(
            "g_ldmatrix_x4_trans(tb, {tile} + (kc * 16 + 8 * ((lane >> 3) & 1) + (lane & 7)) * {pitch} + dp * 16 + 8 * (lane >> 4));"
        ));
        w.line(format!("{}({out}[2 * dp], pa, tb, {out}[2 * dp]);", self.mma()));
        w.line(format!(
            "{}({out}[2 * dp + 1], pa, tb + 2, {out}[2 * dp + 1]);",
            self.mma()
        ));
        w.close();
        w.close();
    }

    /// `p` (and with `ds`, `ds = p (dp - delta) scale`) of the score `x` in `acc[n][e]`
    /// at query `i`, key `j`, the row's lse and delta in `lse_`, `dl_`.
    fn probability(&self, w: &mut Writer, h: &mut Helpers, x: &str, i: &str, j: &str, dp: Option<&str>) {
        let d = &self.dims;
        let mut s = format!("{x} * {}", cuda::f32_lit(self.a.scale as f32));
        if d.masked {
            s = format!("({s} + {})", self.mask(h, i, j));
        }
        let causal = if self.a.causal {
            format!(" || {j} > {i}")
        } else {
            String::new()
        };
        let e = format!("expf({s} - lse_)");
        let e = if self.a.zero_masked_rows {
            format!("(lse_ > ninf ? {e} : 0.0f)")
        } else {
            e
        };
        w.line(format!(
            "const float p_ = ({i} >= {}LL || {j} >= {}LL{causal}) ? 0.0f : {e};",
            d.sq, d.sk
        ));
        match dp {
            None => w.line(format!("{x} = p_;")),
            Some(dp) => w.line(format!(
                "{x} = p_ * ({dp} - dl_) * {};",
                cuda::f32_lit(self.a.scale as f32)
            )),
        }
    }

    /// Stores the warp's rows `r0`, `r1` of `acc[width / 8][4]` into the contiguous
    /// output `[b.., heads, len, width]` at head `head`.
    #[allow(clippy::too_many_arguments)]
    fn store(
        &self,
        w: &mut Writer,
        h: &mut Helpers,
        acc: &str,
        to: (usize, &str),
        heads: usize,
        len: usize,
        width: usize,
    ) {
        let (param, head) = to;
        let out = format!("p{param}");
        for (r, e) in [("r0", 0), ("r1", 2)] {
            w.open(format!("if ({r} < {len}LL)"));
            w.line(format!(
                "unsigned* const to = reinterpret_cast<unsigned*>(&{out}[((b * {heads}LL + {head}) * {len}LL + {r}) * {width}LL + 2 * tq]);"
            ));
            w.line("#pragma unroll");
            w.open(format!("for (int n = 0; n < {}; ++n)", width / 8));
            let lo = cuda::store_conv(h, self.dims.dtype, &format!("{acc}[n][{e}]"));
            let hi = cuda::store_conv(h, self.dims.dtype, &format!("{acc}[n][{}]", e + 1));
            w.line(format!("to[n * 4] = ((unsigned){lo} | ((unsigned){hi} << 16));"));
            w.close();
            w.close();
        }
    }

    fn head(&self, w: &mut Writer, tiles: usize, what: &str) {
        let d = &self.dims;
        w.line(format!(
            "// attention_grad of {} (tensor cores, {} mma): {} x {} heads ({} kv), sq {}, sk {}, d {}, dv {}, scale {}, {}{}{}; {BLOCK_R} {what} rows per block, {} rows per streamed tile",
            if self.also.is_some() { "k and v" } else { self.wrt.name() },
            d.dtype,
            d.batch.iter().product::<usize>(),
            d.hq,
            d.hkv,
            d.sq,
            d.sk,
            d.d,
            d.dv,
            self.a.scale,
            if self.a.causal { "causal" } else { "not causal" },
            if d.masked { ", additive mask" } else { "" },
            if self.a.zero_masked_rows { ", fully masked rows give 0" } else { "" },
            self.bn,
        ));
        w.open(format!(
            "extern \"C\" __global__ void __launch_bounds__({}, 1) {}({})",
            WARPS * 32,
            cuda::ENTRY_PLACEHOLDER,
            self.a.params_decl
        ));
        w.line("extern __shared__ __align__(16) unsigned char smem[];");
        w.line("const int warp = threadIdx.x / 32;");
        w.line("const int lane = threadIdx.x % 32;");
        w.line("const int gq = lane >> 2, tq = lane & 3;");
        w.line(format!("const float ninf = {};", cuda::f32_lit(f32::NEG_INFINITY)));
        w.open(format!(
            "for (long long tile = blockIdx.x; tile < {tiles}LL; tile += gridDim.x)"
        ));
    }

    /// Batch coordinates `bb..` of flat batch `b`.
    fn batch_coords(&self, w: &mut Writer) {
        super::backward::batch_coords(w, &self.dims.batch);
    }

    /// The dq kernel (see the module doc).
    fn dq(&self, w: &mut Writer, h: &mut Helpers) -> (usize, usize) {
        let d = &self.dims;
        let (bn, kp, vp) = (self.bn, self.kp, self.vp);
        let nb: usize = d.batch.iter().product();
        let rtiles = d.sq.div_ceil(BLOCK_R);
        let tiles = nb * d.hq * rtiles;
        let stage_pitch = kp.max(vp);
        let (ks_at, vs_at, st_at) = (0, bn * kp, bn * kp + bn * vp);
        // Wide: q and dout stay staged (two stages) and give their fragments per tile.
        let stages = if self.wide { 2 } else { 1 };
        let elems = st_at + stages * BLOCK_R * stage_pitch;
        self.head(w, tiles, "query");
        // Heaviest tiles first (causal: the last query rows see the most keys), so the
        // grid-stride loop's last round takes the light ones.
        w.line(format!("const long long bh = tile % {}LL;", nb * d.hq));
        w.line(format!("const long long b = bh / {}LL, h = bh % {}LL;", d.hq, d.hq));
        w.line(format!(
            "const long long i0 = ({} - tile / {}LL) * {BLOCK_R};",
            rtiles - 1,
            nb * d.hq
        ));
        w.line(format!("const long long g = h / {}LL;", d.group()));
        w.line("const long long r0 = i0 + warp * 16 + gq, r1 = r0 + 8;");
        self.batch_coords(w);
        for (n, head) in [(0, "h"), (1, "g"), (2, "g"), (3, "h"), (4, "h"), (5, "h")] {
            self.base(w, n, head);
        }
        if d.masked {
            self.base(w, 6, "h");
        }
        w.line(format!(
            "unsigned short* const ks = reinterpret_cast<unsigned short*>(smem) + {ks_at};"
        ));
        w.line(format!(
            "unsigned short* const vs = reinterpret_cast<unsigned short*>(smem) + {vs_at};"
        ));
        w.line(format!(
            "unsigned short* const stage = reinterpret_cast<unsigned short*>(smem) + {st_at};"
        ));
        // q, then dout, through the stage into registers; wide: both kept staged.
        w.line("__syncthreads();");
        self.load_tile(w, 0, "stage", stage_pitch, BLOCK_R, "i0", d.sq, d.d);
        let (qa, oa) = if self.wide {
            w.line(format!(
                "unsigned short* const stage_o = stage + {};",
                BLOCK_R * stage_pitch
            ));
            self.load_tile(w, 3, "stage_o", stage_pitch, BLOCK_R, "i0", d.sq, d.dv);
            (format!("@stage/{stage_pitch}"), format!("@stage_o/{stage_pitch}"))
        } else {
            w.line("__syncthreads();");
            self.a_fragments(w, "qa", "stage", stage_pitch, d.d);
            w.line("__syncthreads();");
            self.load_tile(w, 3, "stage", stage_pitch, BLOCK_R, "i0", d.sq, d.dv);
            w.line("__syncthreads();");
            self.a_fragments(w, "oa", "stage", stage_pitch, d.dv);
            ("qa".to_string(), "oa".to_string())
        };
        let (l0, l1) = (self.row_value(h, 4, "r0"), self.row_value(h, 4, "r1"));
        let (d0, d1) = (self.row_value(h, 5, "r0"), self.row_value(h, 5, "r1"));
        w.line(format!(
            "const float lse0 = r0 < {sq}LL ? {l0} : 0.0f, lse1 = r1 < {sq}LL ? {l1} : 0.0f;",
            sq = d.sq
        ));
        w.line(format!(
            "const float dl0 = r0 < {sq}LL ? {d0} : 0.0f, dl1 = r1 < {sq}LL ? {d1} : 0.0f;",
            sq = d.sq
        ));
        w.line(format!("float dq[{}][4];", d.d / 8));
        w.line("#pragma unroll");
        w.open(format!("for (int n = 0; n < {}; ++n)", d.d / 8));
        w.line("dq[n][0] = dq[n][1] = dq[n][2] = dq[n][3] = 0.0f;");
        w.close();
        let kend = if self.a.causal {
            format!("min({}LL, i0 + {BLOCK_R})", d.sk)
        } else {
            format!("{}LL", d.sk)
        };
        w.open(format!("for (long long j0 = 0; j0 < {kend}; j0 += {bn})"));
        w.line("__syncthreads();");
        self.load_tile(w, 1, "ks", kp, bn, "j0", d.sk, d.d);
        self.load_tile(w, 2, "vs", vp, bn, "j0", d.sk, d.dv);
        w.line("__syncthreads();");
        self.products(w, "s", &qa, "ks", kp, d.d);
        self.products(w, "dp", &oa, "vs", vp, d.dv);
        w.line("#pragma unroll");
        w.open(format!("for (int n = 0; n < {}; ++n)", bn / 8));
        w.line("#pragma unroll");
        w.open("for (int e = 0; e < 4; ++e)");
        w.line("const long long i = e < 2 ? r0 : r1;");
        w.line("const long long j = j0 + n * 8 + 2 * tq + (e & 1);");
        w.line("const float lse_ = e < 2 ? lse0 : lse1;");
        w.line("const float dl_ = e < 2 ? dl0 : dl1;");
        self.probability(w, h, "s[n][e]", "i", "j", Some("dp[n][e]"));
        w.close();
        w.close();
        self.accumulate(w, "dq", "s", "ks", kp, d.d);
        w.close();
        self.store(w, h, "dq", (self.a.out_param, "h"), d.hq, d.sq, d.d);
        w.close();
        w.close();
        (tiles, elems)
    }

    /// The dk or dv kernel (see the module doc).
    fn dkv(&self, w: &mut Writer, h: &mut Helpers) -> (usize, usize) {
        let d = &self.dims;
        let (bn, kp, vp) = (self.bn, self.kp, self.vp);
        let dk = self.wrt == AttentionOperand::K;
        let nb: usize = d.batch.iter().product();
        let rtiles = d.sk.div_ceil(BLOCK_R);
        let tiles = nb * d.hkv * rtiles;
        let stage_pitch = kp.max(vp);
        // dk over head dim 64: the warp's k and v rows stay in shared memory (two
        // stages) and give their fragments per tile; in registers beside the
        // accumulators they would spill.
        // Wide: k (and for dk v) stay there for dv as well.
        let in_smem = self.wide || (dk && d.d.max(d.dv) > 64);
        let stages = if in_smem && dk { 2 } else { 1 };
        let (qs_at, os_at, st_at) = (0, bn * kp, bn * kp + bn * vp);
        let rows_at = st_at + stages * BLOCK_R * stage_pitch;
        // lse and delta of the tile's query rows, f32, after the 16-bit tiles.
        let elems = rows_at + 2 * bn * 2;
        let od = if dk { d.d } else { d.dv };
        self.head(w, tiles, "key");
        // Heaviest tiles first (causal: the first keys are seen by the most queries).
        w.line(format!("const long long bg = tile % {}LL;", nb * d.hkv));
        w.line(format!("const long long b = bg / {}LL, g = bg % {}LL;", d.hkv, d.hkv));
        w.line(format!("const long long j0 = (tile / {}LL) * {BLOCK_R};", nb * d.hkv));
        w.line("const long long r0 = j0 + warp * 16 + gq, r1 = r0 + 8;");
        self.batch_coords(w);
        self.base(w, 1, "g");
        self.base(w, 2, "g");
        let smem16 = "reinterpret_cast<unsigned short*>(smem)";
        w.line(format!("unsigned short* const qs = {smem16} + {qs_at};"));
        w.line(format!("unsigned short* const os = {smem16} + {os_at};"));
        w.line(format!("unsigned short* const stage = {smem16} + {st_at};"));
        if in_smem && dk {
            w.line(format!(
                "unsigned short* const stage_v = stage + {};",
                BLOCK_R * stage_pitch
            ));
        }
        w.line(format!(
            "float* const lse_s = reinterpret_cast<float*>({smem16} + {rows_at});"
        ));
        w.line(format!("float* const dl_s = lse_s + {bn};"));
        // The warp's k rows (and for dk its v rows) into registers through the stage,
        // or kept there.
        w.line("__syncthreads();");
        self.load_tile(w, 1, "stage", stage_pitch, BLOCK_R, "j0", d.sk, d.d);
        if in_smem && dk {
            self.load_tile(w, 2, "stage_v", stage_pitch, BLOCK_R, "j0", d.sk, d.dv);
        }
        w.line("__syncthreads();");
        if !in_smem {
            self.a_fragments(w, "ka", "stage", stage_pitch, d.d);
            if dk {
                w.line("__syncthreads();");
                self.load_tile(w, 2, "stage", stage_pitch, BLOCK_R, "j0", d.sk, d.dv);
                w.line("__syncthreads();");
                self.a_fragments(w, "va", "stage", stage_pitch, d.dv);
            }
        }
        for (acc, width) in std::iter::once(("acc", od)).chain(self.also.map(|_| ("accv", d.dv))) {
            w.line(format!("float {acc}[{}][4];", width / 8));
            w.line("#pragma unroll");
            w.open(format!("for (int n = 0; n < {}; ++n)", width / 8));
            w.line(format!("{acc}[n][0] = {acc}[n][1] = {acc}[n][2] = {acc}[n][3] = 0.0f;"));
            w.close();
        }
        w.open(format!("for (long long hh = 0; hh < {}LL; ++hh)", d.group()));
        w.line(format!("const long long h = g * {}LL + hh;", d.group()));
        for n in [0, 3, 4, 5] {
            self.base(w, n, "h");
        }
        if d.masked {
            self.base(w, 6, "h");
        }
        // Causal: queries before the block's first key see none of its keys.
        let istart = if self.a.causal {
            format!("(j0 / {bn}) * {bn}")
        } else {
            "0".to_string()
        };
        w.open(format!("for (long long i0 = {istart}; i0 < {}LL; i0 += {bn})", d.sq));
        w.line("__syncthreads();");
        self.load_tile(w, 0, "qs", kp, bn, "i0", d.sq, d.d);
        self.load_tile(w, 3, "os", vp, bn, "i0", d.sq, d.dv);
        w.open(format!("for (int e = threadIdx.x; e < {bn}; e += {})", WARPS * 32));
        w.line("const long long i = i0 + e;");
        let (l, dl) = (self.row_value(h, 4, "i"), self.row_value(h, 5, "i"));
        w.line(format!("lse_s[e] = i < {}LL ? {l} : 0.0f;", d.sq));
        w.line(format!("dl_s[e] = i < {}LL ? {dl} : 0.0f;", d.sq));
        w.close();
        w.line("__syncthreads();");
        // Transposed scores: rows are the warp's keys, columns the tile's queries.
        let (ka, va) = if in_smem {
            (format!("@stage/{stage_pitch}"), format!("@stage_v/{stage_pitch}"))
        } else {
            ("ka".to_string(), "va".to_string())
        };
        self.products(w, "s", &ka, "qs", kp, d.d);
        if dk {
            self.products(w, "dp", &va, "os", vp, d.dv);
        }
        w.line("#pragma unroll");
        w.open(format!("for (int n = 0; n < {}; ++n)", bn / 8));
        w.line("#pragma unroll");
        w.open("for (int e = 0; e < 4; ++e)");
        w.line("const int c = n * 8 + 2 * tq + (e & 1);");
        w.line("const long long i = i0 + c;");
        w.line("const long long j = e < 2 ? r0 : r1;");
        w.line("const float lse_ = lse_s[c];");
        w.line("const float dl_ = dl_s[c];");
        let ds = (dk && self.also.is_none()).then_some("dp[n][e]");
        self.probability(w, h, "s[n][e]", "i", "j", ds);
        w.close();
        w.close();
        if self.also.is_some() {
            // dv from p, then p becomes ds in place (the same f32 products as the dk
            // kernel's `p (dp - delta) scale`).
            self.accumulate(w, "accv", "s", "os", vp, d.dv);
            w.line("#pragma unroll");
            w.open(format!("for (int n = 0; n < {}; ++n)", bn / 8));
            w.line("#pragma unroll");
            w.open("for (int e = 0; e < 4; ++e)");
            w.line(format!(
                "s[n][e] = s[n][e] * (dp[n][e] - dl_s[n * 8 + 2 * tq + (e & 1)]) * {};",
                cuda::f32_lit(self.a.scale as f32)
            ));
            w.close();
            w.close();
        }
        if dk {
            self.accumulate(w, "acc", "s", "qs", kp, d.d);
        } else {
            self.accumulate(w, "acc", "s", "os", vp, d.dv);
        }
        w.close();
        w.close();
        self.store(w, h, "acc", (self.a.out_param, "g"), d.hkv, d.sk, od);
        if let Some(pv) = self.also {
            self.store(w, h, "accv", (pv, "g"), d.hkv, d.sk, d.dv);
        }
        w.close();
        w.close();
        (tiles, elems)
    }
}

/// The tensor-core kernel of `attention_grad` of `wrt` (when [`applies`]).
pub(super) fn generate(
    a: &Args<'_>,
    dims: AttentionDims,
    wrt: AttentionOperand,
    st: Vec<Vec<i64>>,
) -> (String, Helpers, LaunchConfig) {
    // Streamed rows per tile: 64, or 32 over head dim 64 (16 for dk, whose k and v
    // rows then share the 48 KiB of shared memory with the tiles); 16 over head dim
    // 128, where the warps' own rows stay in shared memory (up to 84 KiB at 256,
    // opted into at launch: every target from sm_80 has 99 KiB).
    let widest = dims.d.max(dims.dv);
    let wide = widest > WIDE_HEAD_DIM;
    // dk and dv: 32 over head dim 64 or less (two accumulators in registers).
    let also = a.also.map(|(p, _)| p).filter(|_| wrt == AttentionOperand::K);
    let bn = match (widest <= 64, wrt) {
        _ if wide => 16,
        (true, _) if also.is_some() => 32,
        (true, _) => 64,
        (false, AttentionOperand::K) => 16,
        (false, _) => 32,
    };
    let b = B {
        a,
        wrt,
        st,
        bn,
        kp: dims.d + PAD,
        vp: dims.dv + PAD,
        wide,
        also,
        dims,
    };
    let mut h = Helpers::new();
    h.need(Helper::Mma);
    h.need(Helper::Ldmatrix);
    let mut w = Writer::new();
    let (tiles, elems) = match wrt {
        AttentionOperand::Q => b.dq(&mut w, &mut h),
        _ => b.dkv(&mut w, &mut h),
    };
    let bytes = elems * 2;
    (
        w.finish(),
        h,
        LaunchConfig {
            block: (WARPS * 32) as u32,
            grid: GridSize::PerSm {
                // dk and dv: two accumulators take over 128 registers a thread, so
                // more than two blocks never fit.
                blocks_per_sm: match bytes {
                    0..=24576 if also.is_none() => 4,
                    0..=49152 => 2,
                    _ => 1,
                },
                max_blocks: tiles.clamp(1, u32::MAX as usize) as u32,
            },
            shared_mem_bytes: bytes as u32,
        },
    )
}
