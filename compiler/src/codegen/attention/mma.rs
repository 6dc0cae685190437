//! The tensor-core attention kernel, for bf16 and f16 with head dims that are
//! multiples of 16: a flash-attention-2-style forward on `mma.sync` m16n8k16 with f32
//! accumulators.
//!
//! A block of [`WARPS`] warps takes [`BLOCK_M`] query rows of one (batch, head), each
//! warp 16 of them. Keys stream through shared memory in tiles of `bn` (64, or 32 when
//! a head dim is over 128): one k tile and one v tile, rows padded by 8 elements so the
//! `ldmatrix` rows of a warp fall in distinct banks. The copies are `cp.async` when
//! every row starts on 16 bytes (q, k and v read straight from a fused qkv projection
//! qualify), element loads otherwise. The next k tile is in flight while a warp does
//! the softmax and `p v` of this one, and the next v tile while it scores the next k
//! tile (one buffer each, the scheme of FlashAttention-2's forward).
//!
//! Per tile a warp computes its 16 x `bn` scores `q kᵀ` (q fragments kept in registers
//! for head dims up to 128, read from shared memory per tile above that; k fragments
//! by `ldmatrix`), scales them and adds the mask in the log2 domain, keys past the end
//! or (causal) after the row scoring `-inf`, takes each row's max over the four lanes
//! that hold it, rescales its running sum and output, and accumulates `p v` with p
//! rounded to the storage type as the A operand and v fragments by `ldmatrix.trans`.
//! The output `o / l` is rounded once. A row whose every key is masked gives 0 / 0 =
//! NaN, as the definition does (0 with `zero_masked_rows`). Causal blocks stop at
//! their last row's key.

use graphc_ir::{AttentionDims, DType};

use super::super::cuda::{self, Writer};
use super::super::layout;
use super::super::prelude::{Helper, Helpers};
use super::super::{GridSize, LaunchConfig};
use super::{Gen, MAX_HEAD_DIM, WARPS};

/// Query rows per block: 16 per warp.
pub const BLOCK_M: usize = 16 * WARPS;
/// Shared-memory row padding, in elements (16 bytes).
const PAD: usize = 8;
/// Head dims up to this keep the q fragments in registers.
const Q_IN_REGS: usize = 128;

/// Whether the tensor-core kernel takes these dims: bf16 or f16, head dims multiples of
/// 16 up to [`MAX_HEAD_DIM`], at least one key.
pub(super) fn applies(dims: &AttentionDims) -> bool {
    matches!(dims.dtype, DType::BF16 | DType::F16)
        && [dims.d, dims.dv]
            .iter()
            .all(|&x| x > 0 && x % 16 == 0 && x <= MAX_HEAD_DIM)
        && dims.sk > 0
}

/// The tile sizes and shared-memory layout, in elements.
struct Tiles {
    /// Keys per tile.
    bn: usize,
    /// Row pitches of the q/k and the v tiles.
    kp: usize,
    vp: usize,
    /// The q fragments live in registers (q staged through the v buffer first).
    q_regs: bool,
    /// Element offsets of the v and q buffers in shared memory, and its total size.
    v_at: usize,
    q_at: usize,
    elems: usize,
}

impl Tiles {
    fn of(dims: &AttentionDims) -> Tiles {
        let bn = if dims.d.max(dims.dv) <= 128 { 64 } else { 32 };
        let bn = bn.min(dims.sk.next_multiple_of(16));
        let (kp, vp) = (dims.d + PAD, dims.dv + PAD);
        let q_regs = dims.d <= Q_IN_REGS;
        let v_at = bn * kp;
        let (q_at, elems) = if q_regs {
            (v_at, v_at + (bn * vp).max(BLOCK_M * kp))
        } else {
            (v_at + bn * vp, v_at + bn * vp + BLOCK_M * kp)
        };
        Tiles {
            bn,
            kp,
            vp,
            q_regs,
            v_at,
            q_at,
            elems,
        }
    }
}

/// The kernel's source and launch; `h` gets the helpers it uses. With `lse`, the
/// kernel of `attention_lse` instead: the same scores and running sums, no v tiles and
/// no `p v`, each row's log-sum-exp stored (`gen`'s operands are then q, k, k again in
/// v's place, never read, and the mask).
pub(super) fn generate(gen: &Gen, h: &mut Helpers, nb: usize, lse: bool) -> (String, LaunchConfig) {
    let dims = &gen.dims;
    let mut tl = Tiles::of(dims);
    if lse && tl.q_regs {
        // No v tiles: q is staged alone behind k.
        tl.elems = tl.v_at + BLOCK_M * tl.kp;
    } else if lse {
        tl.q_at = tl.v_at;
        tl.elems = tl.v_at + BLOCK_M * tl.kp;
    }
    let qtiles = dims.sq.div_ceil(BLOCK_M);
    let tiles = nb * dims.hq * qtiles;
    let asynchronous =
        (0..if lse { 2 } else { 3 }).all(|n| super::rows_16_bytes(gen.g.inputs[n].0.offset, &gen.st[n], gen.nbd()));
    h.need(Helper::Mma);
    h.need(Helper::Ldmatrix);
    if asynchronous {
        h.need(Helper::CpAsync);
    }
    let k = Kernel {
        gen,
        tl,
        asynchronous,
        t: gen.ix.ty(),
        lse,
    };
    let mut w = Writer::new();
    k.head(&mut w, nb, tiles, qtiles);
    k.tile_loop(&mut w, h);
    k.row_sums(&mut w);
    if lse {
        k.store_lse(&mut w, h, (gen.g.out_param, gen.g.out.dtype));
    } else {
        k.store(&mut w, h);
        // The rows' log-sum-exp beside the output (an `attention_lse` sibling).
        if let Some(also) = gen.g.also {
            k.store_lse(&mut w, h, also);
        }
    }
    w.close();
    w.close();
    let bytes = k.tl.elems * 2;
    (
        w.finish(),
        LaunchConfig {
            block: (WARPS * 32) as u32,
            grid: GridSize::PerSm {
                blocks_per_sm: if bytes <= 48 * 1024 { 4 } else { 2 },
                max_blocks: tiles.min(u32::MAX as usize) as u32,
            },
            shared_mem_bytes: bytes as u32,
        },
    )
}

struct Kernel<'a> {
    gen: &'a Gen<'a>,
    tl: Tiles,
    asynchronous: bool,
    /// The index type.
    t: &'static str,
    /// `attention_lse`'s kernel: no v, the rows' log-sum-exp stored.
    lse: bool,
}

impl Kernel<'_> {
    fn l(&self, x: usize) -> String {
        self.gen.l(x)
    }

    fn mma(&self) -> &'static str {
        if self.gen.d == DType::F16 {
            "g_mma_m16n8k16_f16_f32"
        } else {
            "g_mma_m16n8k16_bf16_f32"
        }
    }

    /// Two f32 values packed into one 32-bit register of the storage type, low first, as
    /// the output stores them (NaN payloads kept, as every other kernel stores).
    fn pack(&self, h: &mut Helpers, lo: &str, hi: &str) -> String {
        let (a, b) = (cuda::store_conv(h, self.gen.d, lo), cuda::store_conv(h, self.gen.d, hi));
        format!("((unsigned){a} | ((unsigned){b} << 16))")
    }

    /// Two f32 values as an mma operand register (one `cvt` on the GPU).
    fn pack_operand(&self, lo: &str, hi: &str) -> String {
        let f = if self.gen.d == DType::F16 {
            "g_pack_f16x2"
        } else {
            "g_pack_bf16x2"
        };
        format!("{f}({lo}, {hi})")
    }

    /// The comment, the entry, the shared buffers, and the tile loop's head: which
    /// (batch, head, rows) this block takes and the operands' base addresses.
    fn head(&self, w: &mut Writer, nb: usize, tiles: usize, qtiles: usize) {
        let (gen, tl, t) = (self.gen, &self.tl, self.t);
        let d = &gen.dims;
        w.line(format!(
            "// {} (tensor cores, {} mma): {nb} x {} heads ({} kv), [{}, {}] x [{}, {}] -> [{}, {}], scale {}, {}{}{}; {BLOCK_M} rows per block, {} keys per tile, {} copies, q fragments in {}",
            if self.lse { "attention_lse" } else { "attention" },
            gen.d,
            d.hq,
            d.hkv,
            d.sq,
            d.d,
            d.sk,
            d.d,
            d.sq,
            d.dv,
            gen.g.scale,
            if gen.g.causal { "causal" } else { "not causal" },
            if d.masked { ", additive mask" } else { "" },
            if gen.g.zero_masked_rows { ", fully masked rows give 0" } else { "" },
            tl.bn,
            if self.asynchronous { "cp.async" } else { "element" },
            if tl.q_regs { "registers" } else { "shared memory" },
        ));
        w.open(format!(
            "extern \"C\" __global__ void __launch_bounds__({}, 1) {}({})",
            WARPS * 32,
            cuda::ENTRY_PLACEHOLDER,
            gen.g.params_decl
        ));
        w.line("extern __shared__ __align__(16) unsigned char smem[];");
        w.line("unsigned short* const ks = reinterpret_cast<unsigned short*>(smem);");
        if !self.lse {
            w.line(format!("unsigned short* const vs = ks + {};", tl.v_at));
        }
        w.line(format!("unsigned short* const qs = ks + {};", tl.q_at));
        w.line("const int warp = threadIdx.x / 32;");
        w.line("const int lane = threadIdx.x % 32;");
        w.line("const int gq = lane >> 2, tq = lane & 3;");
        w.line(format!("const float ninf = {};", cuda::f32_lit(f32::NEG_INFINITY)));
        w.open(format!(
            "for ({t} tile = blockIdx.x; tile < {}; tile += gridDim.x)",
            self.l(tiles)
        ));
        w.line(format!("const {t} b = tile / {};", self.l(d.hq * qtiles)));
        w.line(format!("const {t} h = (tile / {}) % {};", self.l(qtiles), self.l(d.hq)));
        w.line(format!("const {t} i0 = (tile % {}) * {BLOCK_M};", self.l(qtiles)));
        w.line(format!("const {t} g = h / {};", self.l(d.group())));
        w.line(format!("const {t} r0 = i0 + warp * 16 + gq, r1 = r0 + 8;"));
        layout::decompose(w, gen.ix, "b", &d.batch, "bb");
        let nbd = gen.nbd();
        for (n, (a, _)) in gen.g.inputs.iter().enumerate() {
            if self.lse && n == 2 {
                continue;
            }
            let s = &gen.st[n];
            let head = if n == 0 || n == 3 { "h" } else { "g" };
            let mut base = layout::address(gen.ix, a.offset, &s[..nbd], "bb");
            if s[nbd] != 0 {
                base = format!("{base} + {head} * {}", gen.ix.lit(s[nbd]));
            }
            w.line(format!("const {t} {}base = {base};", super::NAMES[n]));
        }
        let kend = if gen.g.causal {
            format!("min(({t}){}, i0 + {BLOCK_M})", self.l(d.sk))
        } else {
            self.l(d.sk)
        };
        w.line(format!("const {t} kend = {kend};"));
    }

    /// Copies the tile of operand `n` (q, k or v) from row `r0` into its buffer, 8
    /// elements per step; rows past the operand's end as zeros.
    fn load_tile(&self, w: &mut Writer, n: usize, r0: &str) {
        let (gen, t, tl) = (self.gen, self.t, &self.tl);
        let d = &gen.dims;
        let (dst, rows, limit, width) = match n {
            0 => ("qs", BLOCK_M, d.sq, d.d),
            1 => ("ks", tl.bn, d.sk, d.d),
            _ => ("vs", tl.bn, d.sk, d.dv),
        };
        let nbd = gen.nbd();
        let (rs, cs) = (gen.ix.lit(gen.st[n][nbd + 1]), gen.ix.lit(gen.st[n][nbd + 2]));
        let (p, name) = (gen.p(n), super::NAMES[n]);
        let chunks = width / 8;
        w.open(format!(
            "for (int e = threadIdx.x; e < {}; e += {})",
            rows * chunks,
            WARPS * 32
        ));
        w.line(format!("const int r = e / {chunks}, c = (e % {chunks}) * 8;"));
        w.line(format!("const {t} row = {r0} + r;"));
        w.line(format!("const bool ok = row < {};", self.l(limit)));
        let pitch = if n == 2 { tl.vp } else { tl.kp };
        w.line(format!("unsigned short* const to = {dst} + r * {pitch} + c;"));
        if self.asynchronous {
            w.line(format!(
                "g_cp_async_16_zfill(to, &{p}[{name}base + (ok ? row : 0) * {rs} + c], ok ? 16u : 0u);"
            ));
        } else {
            w.line("#pragma unroll");
            w.open("for (int u = 0; u < 8; ++u)");
            w.line(format!(
                "to[u] = ok ? {p}[{name}base + row * {rs} + (c + u) * {cs}] : (unsigned short)0;"
            ));
            w.close();
        }
        w.close();
    }

    fn commit(&self, w: &mut Writer) {
        if self.asynchronous {
            w.line("g_cp_async_commit();");
        }
    }

    /// Waits until all but the `n` most recent copy groups are done, then a barrier.
    fn wait(&self, w: &mut Writer, n: usize) {
        if self.asynchronous {
            w.line(format!("g_cp_async_wait<{n}>();"));
        }
        w.line("__syncthreads();");
    }

    /// The warp's q fragment for key-dim chunk `kc` into `qa` from the staged q tile.
    fn q_fragment(&self, w: &mut Writer, qa: &str, kc: &str) {
        w.line(format!(
            "g_ldmatrix_x4({qa}, qs + (warp * 16 + (lane & 7) + 8 * ((lane >> 3) & 1)) * {} + {kc} * 16 + 8 * (lane >> 4));",
            self.tl.kp
        ));
    }

    /// The loads of q and the first tiles, then the loop over key tiles.
    fn tile_loop(&self, w: &mut Writer, h: &mut Helpers) {
        let (gen, tl, t) = (self.gen, &self.tl, self.t);
        let d = &gen.dims;
        let (kc_n, st_n, ov_n) = (d.d / 16, tl.bn / 8, d.dv / 8);
        // The previous tile's readers are done with every buffer.
        w.line("__syncthreads();");
        self.load_tile(w, 0, "i0");
        self.load_tile(w, 1, "0");
        self.commit(w);
        if tl.q_regs {
            // q is staged in the v buffer: into registers before the first v tile.
            self.wait(w, 0);
            w.line(format!("unsigned qa[{kc_n}][4];"));
            w.line("#pragma unroll");
            w.open(format!("for (int kc = 0; kc < {kc_n}; ++kc)"));
            self.q_fragment(w, "qa[kc]", "kc");
            w.close();
            w.line("__syncthreads();");
        }
        if !self.lse {
            self.load_tile(w, 2, "0");
            self.commit(w);
            w.line(format!("float o[{ov_n}][4];"));
            w.line("#pragma unroll");
            w.open(format!("for (int n = 0; n < {ov_n}; ++n)"));
            w.line("o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;");
            w.close();
        }
        w.line("float m0 = ninf, m1 = ninf, l0 = 0.0f, l1 = 0.0f;");
        w.open(format!("for ({t} j0 = 0; j0 < kend; j0 += {})", tl.bn));
        // The k tile (and, with v, all but the v tile in flight).
        self.wait(w, usize::from(!self.lse));
        // Scores: s = q kᵀ, 16 rows x bn keys per warp.
        w.line(format!("float s[{st_n}][4];"));
        w.line("#pragma unroll");
        w.open(format!("for (int n = 0; n < {st_n}; ++n)"));
        w.line("s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;");
        w.close();
        w.line("#pragma unroll");
        w.open(format!("for (int kc = 0; kc < {kc_n}; ++kc)"));
        let qa = if tl.q_regs {
            "qa[kc]"
        } else {
            w.line("unsigned qf[4];");
            self.q_fragment(w, "qf", "kc");
            "qf"
        };
        w.line("#pragma unroll");
        w.open(format!("for (int np = 0; np < {}; ++np)", tl.bn / 16));
        w.line("unsigned kb[4];");
        w.line(format!(
            "g_ldmatrix_x4(kb, ks + (np * 16 + 8 * (lane >> 4) + (lane & 7)) * {} + kc * 16 + 8 * ((lane >> 3) & 1));",
            tl.kp
        ));
        w.line(format!("{}(s[2 * np], {qa}, kb, s[2 * np]);", self.mma()));
        w.line(format!("{}(s[2 * np + 1], {qa}, kb + 2, s[2 * np + 1]);", self.mma()));
        w.close();
        w.close();
        // Every warp is done with the k tile: the next one streams in during the softmax.
        w.line("__syncthreads();");
        w.open(format!("if (j0 + {} < kend)", tl.bn));
        self.load_tile(w, 1, &format!("(j0 + {})", tl.bn));
        w.close();
        self.commit(w);
        self.softmax(w, h);
        if !self.lse {
            self.wait(w, 1);
            self.pv(w);
            // Every warp is done with the v tile: the next one streams in during the scores.
            w.line("__syncthreads();");
            w.open(format!("if (j0 + {} < kend)", tl.bn));
            self.load_tile(w, 2, &format!("(j0 + {})", tl.bn));
            w.close();
            self.commit(w);
        }
        w.close();
        if self.asynchronous {
            w.line("g_cp_async_wait_all();");
        }
    }

    /// Scale, mask and bounds in the log2 domain, the rows' running max and sum, and
    /// `s` replaced by `p = 2^(s - max)`.
    fn softmax(&self, w: &mut Writer, h: &mut Helpers) {
        let gen = self.gen;
        let d = &gen.dims;
        let st_n = self.tl.bn / 8;
        let log2e = std::f64::consts::LOG2_E;
        w.line("#pragma unroll");
        w.open(format!("for (int n = 0; n < {st_n}; ++n)"));
        w.line("#pragma unroll");
        w.open("for (int e = 0; e < 4; ++e)");
        w.line(format!("const {} j = j0 + n * 8 + 2 * tq + (e & 1);", self.t));
        if d.masked || gen.g.causal {
            w.line(format!("const {} i = e < 2 ? r0 : r1;", self.t));
        }
        let mut x = format!("s[n][e] * {}", cuda::f32_lit(gen.g.scale as f32));
        if d.masked {
            let lm = gen.load(h, 3, "i", "j");
            x = format!("({x} + (j < {} && i < {} ? {lm} : 0.0f))", self.l(d.sk), self.l(d.sq));
        }
        let causal = if gen.g.causal { " || j > i" } else { "" };
        if d.masked {
            // A mask of f32's lowest (transformers' fill) times log2(e) would overflow to
            // -inf and mask a row the definition keeps: a finite score stays finite
            // (saturated), so a row whose keys all hold that fill is uniform, as in f32.
            w.line(format!("const float x_ = {x};"));
            w.line(format!("const float y_ = x_ * {};", cuda::f32_lit(log2e as f32)));
            w.line(format!(
                "s[n][e] = (j >= {}{causal}) ? ninf : (isinf(y_) && !isinf(x_)) ? copysignf({}, y_) : y_;",
                self.l(d.sk),
                cuda::f32_lit(f32::MAX)
            ));
        } else {
            w.line(format!(
                "s[n][e] = (j >= {}{causal}) ? ninf : {x} * {};",
                self.l(d.sk),
                cuda::f32_lit(log2e as f32)
            ));
        }
        w.close();
        w.close();
        w.line("float x0 = m0, x1 = m1;");
        w.line("#pragma unroll");
        w.open(format!("for (int n = 0; n < {st_n}; ++n)"));
        w.line("x0 = fmaxf(x0, fmaxf(s[n][0], s[n][1]));");
        w.line("x1 = fmaxf(x1, fmaxf(s[n][2], s[n][3]));");
        w.close();
        w.line("x0 = fmaxf(x0, __shfl_xor_sync(0xffffffffu, x0, 1));");
        w.line("x0 = fmaxf(x0, __shfl_xor_sync(0xffffffffu, x0, 2));");
        w.line("x1 = fmaxf(x1, __shfl_xor_sync(0xffffffffu, x1, 1));");
        w.line("x1 = fmaxf(x1, __shfl_xor_sync(0xffffffffu, x1, 2));");
        // A row with nothing unmasked yet subtracts 0: its p are 0, its sum stays 0.
        w.line("const float z0 = x0 == ninf ? 0.0f : x0, z1 = x1 == ninf ? 0.0f : x1;");
        w.line("const float c0 = exp2f(m0 - z0), c1 = exp2f(m1 - z1);");
        w.line("l0 *= c0;");
        w.line("l1 *= c1;");
        if !self.lse {
            w.line("#pragma unroll");
            w.open(format!("for (int n = 0; n < {}; ++n)", d.dv / 8));
            w.line("o[n][0] *= c0;");
            w.line("o[n][1] *= c0;");
            w.line("o[n][2] *= c1;");
            w.line("o[n][3] *= c1;");
            w.close();
        }
        w.line("#pragma unroll");
        w.open(format!("for (int n = 0; n < {st_n}; ++n)"));
        w.line("s[n][0] = exp2f(s[n][0] - z0);");
        w.line("s[n][1] = exp2f(s[n][1] - z0);");
        w.line("s[n][2] = exp2f(s[n][2] - z1);");
        w.line("s[n][3] = exp2f(s[n][3] - z1);");
        w.line("l0 += s[n][0] + s[n][1];");
        w.line("l1 += s[n][2] + s[n][3];");
        w.close();
        w.line("m0 = x0;");
        w.line("m1 = x1;");
    }

    /// `o += p v`: p (the scores' accumulator layout is the A fragment's, two n-tiles
    /// per k chunk) rounded to the storage type, v fragments by `ldmatrix.trans`.
    fn pv(&self, w: &mut Writer) {
        let tl = &self.tl;
        let dv = self.gen.dims.dv;
        w.line("#pragma unroll");
        w.open(format!("for (int kc = 0; kc < {}; ++kc)", tl.bn / 16));
        w.line("unsigned pa[4];");
        w.line(format!(
            "pa[0] = {};",
            self.pack_operand("s[2 * kc][0]", "s[2 * kc][1]")
        ));
        w.line(format!(
            "pa[1] = {};",
            self.pack_operand("s[2 * kc][2]", "s[2 * kc][3]")
        ));
        w.line(format!(
            "pa[2] = {};",
            self.pack_operand("s[2 * kc + 1][0]", "s[2 * kc + 1][1]")
        ));
        w.line(format!(
            "pa[3] = {};",
            self.pack_operand("s[2 * kc + 1][2]", "s[2 * kc + 1][3]")
        ));
        w.line("#pragma unroll");
        w.open(format!("for (int dp = 0; dp < {}; ++dp)", dv / 16));
        w.line("unsigned vb[4];");
        w.line(format!(
            "g_ldmatrix_x4_trans(vb, vs + (kc * 16 + 8 * ((lane >> 3) & 1) + (lane & 7)) * {} + dp * 16 + 8 * (lane >> 4));",
            tl.vp
        ));
        w.line(format!("{}(o[2 * dp], pa, vb, o[2 * dp]);", self.mma()));
        w.line(format!("{}(o[2 * dp + 1], pa, vb + 2, o[2 * dp + 1]);", self.mma()));
        w.close();
        w.close();
    }

    /// The rows' sums over the four lanes that hold each row.
    fn row_sums(&self, w: &mut Writer) {
        w.line("l0 += __shfl_xor_sync(0xffffffffu, l0, 1);");
        w.line("l0 += __shfl_xor_sync(0xffffffffu, l0, 2);");
        w.line("l1 += __shfl_xor_sync(0xffffffffu, l1, 1);");
        w.line("l1 += __shfl_xor_sync(0xffffffffu, l1, 2);");
    }

    /// Each row's log-sum-exp in the natural log, `(m + log2 l) ln 2` (the scores were
    /// taken to the log2 domain), by the first of the row's four lanes, into the output
    /// `to` (its parameter and type); a row with every key masked has `m = -inf`,
    /// `l = 0`: `-inf`, as the reference.
    fn store_lse(&self, w: &mut Writer, h: &mut Helpers, to: (usize, DType)) {
        let gen = self.gen;
        let d = &gen.dims;
        let out = format!("p{}", to.0);
        let ln2 = cuda::f32_lit(std::f32::consts::LN_2);
        for (r, m, l) in [("r0", "m0", "l0"), ("r1", "m1", "l1")] {
            w.open(format!("if (tq == 0 && {r} < {})", self.l(d.sq)));
            let v = cuda::store_conv(h, to.1, &format!("({m} == ninf ? ninf : ({m} + log2f({l})) * {ln2})"));
            w.line(format!(
                "{out}[(b * {} + h) * {} + {r}] = {v};",
                self.l(d.hq),
                self.l(d.sq)
            ));
            w.close();
        }
    }

    /// `o / l` rounded once (the rows' sums taken over their four lanes), two columns
    /// per 32-bit store.
    fn store(&self, w: &mut Writer, h: &mut Helpers) {
        let d = &self.gen.dims;
        let out = format!("p{}", self.gen.g.out_param);
        for (r, l, e) in [("r0", "l0", 0), ("r1", "l1", 2)] {
            w.open(format!("if ({r} < {})", self.l(d.sq)));
            w.line(format!(
                "unsigned* const to = reinterpret_cast<unsigned*>(&{out}[((b * {} + h) * {} + {r}) * {} + 2 * tq]);",
                self.l(d.hq),
                self.l(d.sq),
                self.l(d.dv)
            ));
            w.line("#pragma unroll");
            w.open(format!("for (int n = 0; n < {}; ++n)", d.dv / 8));
            // `l` is 0 when every key is masked: NaN as the definition, or 0 with
            // `zero_masked_rows`.
            let div = |c: usize| {
                if self.gen.g.zero_masked_rows {
                    format!("({l} > 0.0f ? o[n][{c}] / {l} : 0.0f)")
                } else {
                    format!("o[n][{c}] / {l}")
                }
            };
            let v = self.pack(h, &div(e), &div(e + 1));
            w.line(format!("to[n * 4] = {v};"));
            w.close();
            w.close();
        }
    }
}
