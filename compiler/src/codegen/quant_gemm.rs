//! The weight-only quantized GEMM: `D = A · dequantize(q, scales)ᵀ` with the whole
//! epilogue body, in one generated kernel (cuBLASLt has no int4 weight-only path).
//!
//! A block takes a `bm x bn` tile of the output (grid-stride over the batch's tiles).
//! Per step along `k` it copies `bm x BK` of `a` and `bn x BK` of the packed weight
//! into shared memory, the weight dequantized on the way (`q * scale`, rounded to the
//! product's type, exactly as [`graphc_ir::Op::Dequantize`] defines it), so the
//! weight's bytes are read once per block column from global memory at 1/4 (int8) or
//! 1/8 (int4) of f32's size. Then:
//!
//! - **bf16 / f16 (tensor cores):** 4 warps, each 16·`mt` rows by 8·`nt` columns on
//!   `mma.sync` m16n8k16 with f32 accumulators (`mt` 1, 2 or 4 by `m`: a decode step
//!   of a few tokens wastes no warp on empty rows; `nt` 2, or 1 when fewer than 128 blocks
//!   of 64 columns would leave SMs idle), A fragments by `ldmatrix` from `[bm][BK]`, B fragments by `ldmatrix` from
//!   the dequantized `[bn][BK]` (the weight's own `[n, k]` layout is the `col` operand
//!   the instruction wants). Shared rows are padded by 16 bytes.
//! - **f32 / f64 (CUDA cores):** 16 x 16 threads, each a 4 x 4 block of a 64 x 64 tile,
//!   fused multiply-adds in the product's type.
//!
//! A decode step (at most [`gemv::MAX_ROWS`] rows of bf16/f16 against an int4/int8
//! weight whose rows are whole 16-byte chunks) takes the GEMV kernel instead
//! ([`gemv`]: a warp per output column, 16-byte packed loads, dequantized in registers).
//!
//! Each output element then runs the epilogue body (bias, activation, residual, any
//! elementwise tail) on its accumulator, rounded first to the product's type as the
//! IR's `acc` is, and is stored directly: no GEMM scratch, no second launch.

use graphc_ir::DType;

use super::cuda::{self, Writer};
use super::layout::{self, Ix};
use super::prelude::{Helper, Helpers};
use super::{finish, CodegenError, Ctx, CudaKernel, GridSize, LaunchConfig, ParamAccess, Params};
use crate::kernel::{Expr, ExprId, MatMulKernel, QuantB};

mod gemv;

/// Elements of `k` per shared-memory step (tensor-core path).
const BK: usize = 64;
/// Elements of `k` per step on the CUDA-core path.
const BK_SIMT: usize = 16;
/// Tensor-core warps per block.
const WARPS: usize = 4;
/// Shared-memory row padding of the tensor-core tiles, in elements (16 bytes).
const PAD: usize = 8;

/// The tile shape.
#[derive(Clone, Copy)]
struct Tile {
    tensor: bool,
    /// m16 tiles per block (tensor cores).
    mt: usize,
    /// n8 tiles per warp (tensor cores).
    nt: usize,
    bm: usize,
    bn: usize,
    bk: usize,
    threads: usize,
}

impl Tile {
    fn of(d: DType, m: usize, n: usize, batch: usize) -> Tile {
        if matches!(d, DType::BF16 | DType::F16) {
            let mt = m.div_ceil(16).clamp(1, 4);
            let mt = if mt == 3 { 4 } else { mt };
            let blocks = batch * m.div_ceil(16 * mt) * n.div_ceil(64);
            // Wider warps once the grid fills a wave of SMs anyway.
            let nt = if blocks >= 128 { 2 } else { 1 };
            Tile {
                tensor: true,
                mt,
                nt,
                bm: 16 * mt,
                bn: WARPS * 8 * nt,
                bk: BK,
                threads: WARPS * 32,
            }
        } else {
            Tile {
                tensor: false,
                mt: 0,
                nt: 0,
                bm: 64,
                bn: 64,
                bk: BK_SIMT,
                threads: 256,
            }
        }
    }

    /// Row pitch of the shared tiles, in elements.
    fn pitch(&self) -> usize {
        if self.tensor {
            self.bk + PAD
        } else {
            self.bk + 1
        }
    }
}

/// The CUDA kernel of a matmul kernel whose `b` is quantized.
pub(crate) fn generate(cx: &Ctx, mk: &MatMulKernel, q: &QuantB) -> Result<CudaKernel, CodegenError> {
    let d = cx.dtype(q.scales)?;
    if !d.is_float() {
        return Err(cx.malformed(format!("quantized matmul with {d} scales")));
    }
    let ad = cx.dtype(mk.a.buffer)?;
    if ad != d {
        return Err(cx.malformed(format!("quantized matmul of a {ad} operand with {d} scales")));
    }
    let body = &mk.body;
    if body.exprs.iter().any(|(e, t)| *e == Expr::Acc && *t != d) {
        return Err(cx.malformed("acc expressions of another type than the product"));
    }
    let nb = mk.batch.len();
    let rank = nb + 2;
    if mk.a.strides.len() != rank
        || mk.inputs.iter().any(|a| a.strides.len() != rank)
        || mk.stores.iter().any(|s| s.access.strides.len() != rank)
    {
        return Err(cx.malformed("matmul accesses of the wrong rank"));
    }
    let roots: Vec<ExprId> = mk.stores.iter().map(|s| s.value).collect();
    let live = cuda::closure(body, &roots, &|_| false);
    cuda::check_loads(cx, body, &live, &mk.inputs)?;

    let mut params = Params::new();
    let pa = params.add(cx, mk.a.buffer, ParamAccess::Read)?;
    let pq = params.add(cx, mk.b.buffer, ParamAccess::Read)?;
    let ps = params.add(cx, q.scales, ParamAccess::Read)?;
    // Every input is a parameter (the executors bind each one), used or not.
    let in_param = mk
        .inputs
        .iter()
        .map(|a| params.add(cx, a.buffer, ParamAccess::Read))
        .collect::<Result<Vec<usize>, CodegenError>>()?;
    let mut store_param = Vec::with_capacity(mk.stores.len());
    for s in &mk.stores {
        store_param.push(params.add(cx, s.access.buffer, ParamAccess::Write)?);
    }

    let batch: usize = mk.batch.iter().product();
    let ep = Epilogue {
        live: &live,
        in_param: &in_param,
        store_param: &store_param,
    };
    if let Some(plan) = gemv::Plan::of(mk, q, d) {
        let gen = Gen {
            cx,
            mk,
            q,
            d,
            tile: Tile::of(d, mk.m, mk.n, batch),
            ix: Ix { wide: true },
            pa,
            pq,
            ps,
        };
        return gemv::generate(&gen, &plan, &params, &ep, batch);
    }
    let tile = Tile::of(d, mk.m, mk.n, batch);
    let (mtiles, ntiles) = (mk.m.div_ceil(tile.bm), mk.n.div_ceil(tile.bn));
    let tiles = batch.saturating_mul(mtiles).saturating_mul(ntiles);
    let ix = Ix { wide: true };
    let mut h = Helpers::new();
    if tile.tensor {
        h.need(Helper::Mma);
        h.need(Helper::Ldmatrix);
    }
    let g = Gen {
        cx,
        mk,
        q,
        d,
        tile,
        ix,
        pa,
        pq,
        ps,
    };
    let mut w = Writer::new();
    g.head(&mut w, &params, mtiles, ntiles, tiles);
    w.open(format!("for ({} k0 = 0; k0 < {}; k0 += {})", g.t(), g.l(mk.k), tile.bk));
    w.line("__syncthreads();");
    g.load_a(&mut w, &mut h);
    g.load_b(&mut w, &mut h);
    w.line("__syncthreads();");
    if tile.tensor {
        g.mma_step(&mut w);
    } else {
        g.fma_step(&mut w);
    }
    w.close();
    g.store(&mut w, &mut h, &ep)?;
    w.close();
    w.close();
    let (source, entry) = finish("qmm", &h, &w.finish());
    Ok(CudaKernel {
        name: String::new(),
        source,
        entry,
        params: params.list,
        launch: LaunchConfig {
            block: tile.threads as u32,
            grid: GridSize::PerSm {
                blocks_per_sm: 4,
                max_blocks: tiles.min(u32::MAX as usize) as u32,
            },
            shared_mem_bytes: 0,
        },
        gemm: None,
    })
}

struct Gen<'a> {
    cx: &'a Ctx<'a>,
    mk: &'a MatMulKernel,
    q: &'a QuantB,
    d: DType,
    tile: Tile,
    ix: Ix,
    pa: usize,
    pq: usize,
    ps: usize,
}

/// What the per-element epilogue reads and writes.
struct Epilogue<'a> {
    live: &'a [ExprId],
    in_param: &'a [usize],
    store_param: &'a [usize],
}

impl Gen<'_> {
    fn t(&self) -> &'static str {
        self.ix.ty()
    }

    fn l(&self, x: usize) -> String {
        self.ix.lit(x as i64)
    }

    /// The shared tiles' element type.
    fn smem_type(&self) -> &'static str {
        if self.tile.tensor {
            "unsigned short"
        } else {
            cuda::reg_type(self.d)
        }
    }

    /// The comment, the entry, the shared tiles, the tile loop's head (batch, rows,
    /// columns of this tile; `a`'s base address) and the accumulators.
    fn head(&self, w: &mut Writer, params: &Params, mtiles: usize, ntiles: usize, tiles: usize) {
        let (mk, tl, t) = (self.mk, self.tile, self.t());
        w.line(format!(
            "// int{} weight-only matmul ({}, groups of {}): {:?} x [{}, {}] x [{}, {}]; {} x {} tiles, {} along k, {}",
            self.q.bits,
            self.d,
            self.q.group,
            mk.batch,
            mk.m,
            mk.k,
            mk.k,
            mk.n,
            tl.bm,
            tl.bn,
            tl.bk,
            if tl.tensor {
                format!("mma.sync m16n8k16 ({} x {} per warp)", 16 * tl.mt, 8 * tl.nt)
            } else {
                "CUDA cores (4 x 4 per thread)".to_string()
            }
        ));
        w.open(format!(
            "extern \"C\" __global__ void __launch_bounds__({}) {}({})",
            tl.threads,
            cuda::ENTRY_PLACEHOLDER,
            params.c_decl()
        ));
        let (st, p) = (self.smem_type(), tl.pitch());
        w.line(format!("__shared__ __align__(16) {st} as_[{}];", tl.bm * p));
        w.line(format!("__shared__ __align__(16) {st} bs_[{}];", tl.bn * p));
        if tl.tensor {
            w.line("const int warp = threadIdx.x / 32;");
            w.line("const int lane = threadIdx.x % 32;");
            w.line("const int gq = lane >> 2, tq = lane & 3;");
        } else {
            w.line("const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;");
        }
        w.open(format!(
            "for ({t} tile = blockIdx.x; tile < {}; tile += gridDim.x)",
            self.l(tiles)
        ));
        if !mk.batch.is_empty() {
            w.line(format!("const {t} bz = tile / {};", self.l(mtiles * ntiles)));
        }
        w.line(format!(
            "const {t} m0 = ((tile / {}) % {}) * {};",
            self.l(ntiles),
            self.l(mtiles),
            tl.bm
        ));
        w.line(format!("const {t} n0 = (tile % {}) * {};", self.l(ntiles), tl.bn));
        layout::decompose(w, self.ix, "bz", &mk.batch, "x");
        let nb = mk.batch.len();
        let abase = layout::address(self.ix, mk.a.offset, &mk.a.strides[..nb], "x");
        w.line(format!("const {t} abase = {abase};"));
        let acc = cuda::reg_type(self.d);
        if tl.tensor {
            w.line(format!("float acc[{}][{}][4];", tl.mt, tl.nt));
        } else {
            w.line(format!("{acc} acc[4][4];"));
        }
        let (n_acc, first, zero) = if tl.tensor {
            (tl.mt * tl.nt * 4, "(&acc[0][0][0])", "0.0f".to_string())
        } else {
            (16, "(&acc[0][0])", cuda::lit(self.d, 0.0, None))
        };
        w.line("#pragma unroll");
        w.open(format!("for (int i = 0; i < {n_acc}; ++i)"));
        w.line(format!("{first}[i] = {zero};"));
        w.close();
    }

    /// `bm x bk` of `a` into `as_` (zeros past its end).
    fn load_a(&self, w: &mut Writer, h: &mut Helpers) {
        let (mk, tl, t) = (self.mk, self.tile, self.t());
        let nb = mk.batch.len();
        let (sm, sk) = (self.ix.lit(mk.a.strides[nb]), self.ix.lit(mk.a.strides[nb + 1]));
        w.open(format!(
            "for (int e = threadIdx.x; e < {}; e += {})",
            tl.bm * tl.bk,
            tl.threads
        ));
        w.line(format!("const int r = e / {}, c = e % {};", tl.bk, tl.bk));
        w.line(format!("const {t} row = m0 + r, kk = k0 + c;"));
        w.line(format!(
            "const bool ok = row < {} && kk < {};",
            self.l(mk.m),
            self.l(mk.k)
        ));
        let read = format!("p{}[abase + row * {sm} + kk * {sk}]", self.pa);
        let (val, zero) = if tl.tensor {
            (read, "(unsigned short)0".to_string())
        } else {
            (cuda::load_conv(h, self.d, &read), cuda::lit(self.d, 0.0, None))
        };
        w.line(format!("as_[r * {} + c] = ok ? {val} : {zero};", tl.pitch()));
        w.close();
    }

    /// `bn x bk` of the weight, dequantized, into `bs_` (zeros past its end); two
    /// elements of `k` (one int4 byte) per thread step.
    fn load_b(&self, w: &mut Writer, h: &mut Helpers) {
        let (mk, tl, t, q) = (self.mk, self.tile, self.t(), self.q);
        let half = tl.bk / 2;
        let row_bytes = if q.bits == 4 { mk.k / 2 } else { mk.k };
        let groups = mk.k.div_ceil(q.group.max(1));
        w.open(format!(
            "for (int e = threadIdx.x; e < {}; e += {})",
            tl.bn * half,
            tl.threads
        ));
        w.line(format!("const int r = e / {half}, c = (e % {half}) * 2;"));
        w.line(format!("const {t} col = n0 + r, kk = k0 + c;"));
        let f = cuda::reg_type(self.d);
        let zero = cuda::lit(self.d, 0.0, None);
        w.line(format!("{f} v0 = {zero}, v1 = {zero};"));
        w.open(format!("if (col < {} && kk < {})", self.l(mk.n), self.l(mk.k)));
        let scale = |h: &mut Helpers, kk: &str| {
            cuda::load_conv(
                h,
                self.d,
                &format!("p{}[col * {} + ({kk}) / {}]", self.ps, self.l(groups), self.l(q.group)),
            )
        };
        let (s0, s1) = (scale(h, "kk"), scale(h, "kk + 1"));
        if q.bits == 4 {
            w.line(format!(
                "const unsigned b = p{}[col * {} + (kk >> 1)];",
                self.pq,
                self.l(row_bytes)
            ));
            w.line(format!("v0 = ({f})(((int)(b & 15u) ^ 8) - 8) * {s0};"));
            w.line(format!("v1 = ({f})(((int)(b >> 4) ^ 8) - 8) * {s1};"));
        } else {
            let qat = |kk: &str| format!("p{}[col * {} + {kk}]", self.pq, self.l(row_bytes));
            w.line(format!("v0 = ({f}){} * {s0};", qat("kk")));
            w.open(format!("if (kk + 1 < {})", self.l(mk.k)));
            w.line(format!("v1 = ({f}){} * {s1};", qat("kk + 1")));
            w.close();
        }
        w.close();
        let at = |c: &str| format!("bs_[r * {} + {c}]", tl.pitch());
        let (v0, v1) = if tl.tensor {
            // Rounded once to the product's type, as dequantize defines it.
            (cuda::store_conv(h, self.d, "v0"), cuda::store_conv(h, self.d, "v1"))
        } else {
            ("v0".to_string(), "v1".to_string())
        };
        w.line(format!("{} = {v0};", at("c")));
        w.line(format!("{} = {v1};", at("c + 1")));
        w.close();
    }

    /// One shared tile's products on tensor cores.
    fn mma_step(&self, w: &mut Writer) {
        let tl = self.tile;
        let p = tl.pitch();
        let mma = if self.d == DType::F16 {
            "g_mma_m16n8k16_f16_f32"
        } else {
            "g_mma_m16n8k16_bf16_f32"
        };
        w.line("#pragma unroll");
        w.open(format!("for (int kc = 0; kc < {}; ++kc)", tl.bk / 16));
        w.line(format!("unsigned af[{}][4];", tl.mt));
        w.line("#pragma unroll");
        w.open(format!("for (int mt = 0; mt < {}; ++mt)", tl.mt));
        w.line(format!(
            "g_ldmatrix_x4(af[mt], as_ + (mt * 16 + (lane & 7) + 8 * ((lane >> 3) & 1)) * {p} + kc * 16 + 8 * (lane >> 4));"
        ));
        w.close();
        if tl.nt == 2 {
            w.line("unsigned bf[4];");
            w.line(format!(
                "g_ldmatrix_x4(bf, bs_ + (warp * 16 + 8 * (lane >> 4) + (lane & 7)) * {p} + kc * 16 + 8 * ((lane >> 3) & 1));"
            ));
        } else {
            w.line("unsigned bf[2];");
            w.line(format!(
                "g_ldmatrix_x2(bf, bs_ + (warp * 8 + (lane & 7)) * {p} + kc * 16 + 8 * ((lane >> 3) & 1));"
            ));
        }
        w.line("#pragma unroll");
        w.open(format!("for (int mt = 0; mt < {}; ++mt)", tl.mt));
        for nt in 0..tl.nt {
            w.line(format!("{mma}(acc[mt][{nt}], af[mt], bf + {}, acc[mt][{nt}]);", 2 * nt));
        }
        w.close();
        w.close();
    }

    /// One shared tile's products on CUDA cores.
    fn fma_step(&self, w: &mut Writer) {
        let tl = self.tile;
        let (p, r) = (tl.pitch(), cuda::reg_type(self.d));
        let fma = if self.d == DType::F64 { "fma" } else { "fmaf" };
        w.line("#pragma unroll");
        w.open(format!("for (int c = 0; c < {}; ++c)", tl.bk));
        w.line(format!("{r} av[4], bv[4];"));
        w.line("#pragma unroll");
        w.open("for (int i = 0; i < 4; ++i)");
        w.line(format!("av[i] = as_[(ty * 4 + i) * {p} + c];"));
        w.line(format!("bv[i] = bs_[(tx * 4 + i) * {p} + c];"));
        w.close();
        w.line("#pragma unroll");
        w.open("for (int i = 0; i < 4; ++i)");
        w.line("#pragma unroll");
        w.open("for (int j = 0; j < 4; ++j)");
        w.line(format!("acc[i][j] = {fma}(av[i], bv[j], acc[i][j]);"));
        w.close();
        w.close();
        w.close();
    }

    /// Every accumulator through the epilogue body to the stores.
    fn store(&self, w: &mut Writer, h: &mut Helpers, ep: &Epilogue) -> Result<(), CodegenError> {
        let (mk, tl, t) = (self.mk, self.tile, self.t());
        let nb = mk.batch.len();
        if tl.tensor {
            w.line("#pragma unroll");
            w.open(format!("for (int mt = 0; mt < {}; ++mt)", tl.mt));
            w.line("#pragma unroll");
            w.open(format!("for (int nt = 0; nt < {}; ++nt)", tl.nt));
            w.line("#pragma unroll");
            w.open("for (int e = 0; e < 4; ++e)");
            w.line(format!("const {t} x{nb} = m0 + mt * 16 + gq + ((e >> 1) << 3);"));
            w.line(format!(
                "const {t} x{} = n0 + warp * {} + nt * 8 + 2 * tq + (e & 1);",
                nb + 1,
                8 * tl.nt
            ));
            w.line("const float acc_v = acc[mt][nt][e];");
        } else {
            w.line("#pragma unroll");
            w.open("for (int i = 0; i < 4; ++i)");
            w.line("#pragma unroll");
            w.open("for (int j = 0; j < 4; ++j)");
            w.line(format!("const {t} x{nb} = m0 + ty * 4 + i;"));
            w.line(format!("const {t} x{} = n0 + tx * 4 + j;", nb + 1));
            w.line(format!("const {} acc_v = acc[i][j];", cuda::reg_type(self.d)));
        }
        w.open(format!(
            "if (x{nb} < {} && x{} < {})",
            self.l(mk.m),
            nb + 1,
            self.l(mk.n)
        ));
        self.element(w, h, ep)?;
        w.close();
        w.close();
        w.close();
        if tl.tensor {
            w.close();
        }
        Ok(())
    }

    /// The epilogue of the element at `x0..` (batch dims, row, column) with product
    /// `acc_v`.
    fn element(&self, w: &mut Writer, h: &mut Helpers, ep: &Epilogue) -> Result<(), CodegenError> {
        let (mk, cx, ix, d) = (self.mk, self.cx, self.ix, self.d);
        let body = &mk.body;
        let mut leaf = |h: &mut Helpers, _id: ExprId, e: &Expr, t: DType| -> Result<String, CodegenError> {
            match e {
                Expr::Acc if self.tile.tensor => {
                    let low = cuda::store_conv(h, d, "acc_v");
                    Ok(cuda::load_conv(h, d, &low))
                }
                Expr::Acc => Ok("acc_v".to_string()),
                Expr::Load(n) => {
                    let a = &mk.inputs[n.index()];
                    let addr = layout::address(ix, a.offset, &a.strides, "x");
                    Ok(cuda::load_conv(h, t, &format!("p{}[{addr}]", ep.in_param[n.index()])))
                }
                Expr::Gather {
                    input,
                    index,
                    stride,
                    extent,
                } => {
                    let a = &mk.inputs[input.index()];
                    let addr = layout::address(ix, a.offset, &a.strides, "x");
                    Ok(cuda::gather_c(
                        h,
                        ep.in_param[input.index()],
                        &format!("(long long)({addr})"),
                        &format!("e{index}"),
                        *stride,
                        *extent,
                        t,
                    ))
                }
                Expr::Index(a) => Ok(cuda::cast_c(h, DType::I64, t, &format!("((long long)x{a})"))),
                _ => Err(cx.malformed("a stage in a matmul kernel")),
            }
        };
        let stored: Vec<ExprId> = mk.stores.iter().map(|st| st.value).collect();
        cuda::emit_exprs(
            cx,
            w,
            h,
            body,
            cuda::Exprs {
                ids: ep.live,
                stored: &stored,
            },
            &|id| format!("e{id}"),
            &mut leaf,
        )?;
        for (k, st) in mk.stores.iter().enumerate() {
            let sd = cx.dtype(st.access.buffer)?;
            super::elementwise::check_store_dtype(cx, body, st, sd)?;
            let val = cuda::store_conv(h, sd, &format!("e{}", st.value));
            let addr = layout::address(ix, st.access.offset, &st.access.strides, "x");
            w.line(format!("p{}[{addr}] = {val};", ep.store_param[k]));
        }
        Ok(())
    }
}
