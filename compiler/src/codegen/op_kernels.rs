//! Kernels for single unfused ops: concat, pad, gather, dequantize, argmax/argmin, matmuls that
//! cuBLASLt does not take (integers), and attention (`attention.rs`). Each is a grid-stride loop over the contiguous
//! output; operands are read through their accesses.
//!
//! Gather: an index outside `[-extent, extent)` writes 0 (the CPU side reports it as an
//! error; a kernel cannot).

use graphc_ir::{ArgReduceOp, DType, Op, PadMode, TensorData, TensorType};

use super::cuda::{self, Writer};
use super::layout::{self, Ix};
use super::prelude::{Helper, Helpers};
use super::{
    finish, CodegenError, Ctx, CudaKernel, GridSize, LaunchConfig, ParamAccess, Params, BLOCKS_PER_SM,
    ELEMENTWISE_BLOCK,
};
use crate::kernel::{Access, BufferId, OpKernel, Sibling};

mod concat;
mod conv;
mod scatter;

/// Matmul tile edge of the simple tiled kernel.
const TILE: usize = 16;

/// The shapes of a tiled matmul: `[.., m, k] x [.., k, n]` of dtype `d` over the
/// output's `batch` dims, the operands' strides over them, and the index type.
struct TiledShapes {
    m: usize,
    k: usize,
    n: usize,
    d: DType,
    batch: Vec<usize>,
    sa: Vec<i64>,
    sb: Vec<i64>,
    ix: Ix,
}

pub(crate) fn generate(cx: &Ctx, o: &OpKernel) -> Result<CudaKernel, CodegenError> {
    let (op, inputs, output) = (&o.op, &o.inputs[..], o.output);
    let buffer_ty = |b: BufferId| {
        cx.program
            .buffers
            .get(b.index())
            .map(|b| b.ty.clone())
            .ok_or_else(|| cx.malformed(format!("output buffer b{} does not exist", b.0)))
    };
    let out_ty = buffer_ty(output)?;
    for (i, (a, ty)) in inputs.iter().enumerate() {
        if a.strides.len() != ty.shape.rank() {
            return Err(cx.malformed(format!(
                "operand {i} access has rank {}, its type {}",
                a.strides.len(),
                ty.shape.rank()
            )));
        }
        if cx.dtype(a.buffer)? != ty.dtype {
            return Err(cx.malformed(format!("operand {i} is typed {} but its buffer is not", ty.dtype)));
        }
    }
    let mut params = Params::new();
    let mut in_param = Vec::new();
    for (a, _) in inputs {
        in_param.push(params.add(cx, a.buffer, ParamAccess::Read)?);
    }
    let out_param = params.add(cx, output, ParamAccess::Write)?;
    let mut siblings = Vec::new();
    for s in &o.siblings {
        siblings.push((s, params.add(cx, s.output, ParamAccess::Write)?, buffer_ty(s.output)?));
    }
    let g = Gen {
        cx,
        inputs,
        in_param,
        out_param,
        out: &out_ty,
        siblings: &siblings,
    };
    if !siblings.is_empty() && !super::attention::fuses_siblings(op, o) {
        return Err(cx.malformed(format!(
            "{} computes no sibling ops beside its own in one kernel",
            op.name()
        )));
    }
    let arity = |n: usize| -> Result<(), CodegenError> {
        if inputs.len() != n {
            return Err(cx.malformed(format!("{} takes {n} operands, got {}", op.name(), inputs.len())));
        }
        Ok(())
    };
    let (kind, body, launch) = match op {
        Op::Concat { axis } => {
            if inputs.is_empty() {
                return Err(cx.malformed("concat of no operands"));
            }
            let vw = g.concat_width(*axis);
            g.elementwise_by(vw, |w, h, ix| g.concat(w, h, ix, *axis, vw))?
        }
        Op::Pad { pads, mode, value } => {
            arity(1)?;
            g.elementwise(|w, h, ix| g.pad(w, h, ix, pads, *mode, *value))?
        }
        Op::Gather { axis } => {
            arity(2)?;
            g.elementwise(|w, h, ix| g.gather(w, h, ix, *axis))?
        }
        Op::ScatterAdd { axis, size } => {
            arity(2)?;
            match g.scatter_add_rows(*axis, *size)? {
                Some(rows) => rows,
                None => g.elementwise(|w, h, ix| g.scatter_add(w, h, ix, *axis, *size))?,
            }
        }
        Op::Dequantize { bits, group } => {
            arity(2)?;
            g.elementwise(|w, h, ix| g.dequantize(w, h, ix, *bits, *group))?
        }
        Op::ArgReduce { op, axis, keepdims } => {
            arity(1)?;
            g.elementwise(|w, h, ix| g.arg_reduce(w, h, ix, *op, *axis, *keepdims))?
        }
        Op::MatMul => {
            arity(2)?;
            g.matmul()?
        }
        Op::Conv { .. } | Op::ConvGrad { .. } => {
            arity(2)?;
            g.elementwise(|w, h, ix| g.conv(w, h, ix, op))?
        }
        Op::Pool { .. } => {
            arity(1)?;
            g.elementwise(|w, h, ix| g.pool(w, h, ix, op))?
        }
        Op::PoolGrad { .. } => {
            arity(2)?;
            g.elementwise(|w, h, ix| g.pool(w, h, ix, op))?
        }
        Op::Attention {
            scale,
            causal,
            zero_masked_rows,
        } => super::attention::generate(&g.attention_args(*scale, *causal, *zero_masked_rows))?,
        Op::AttentionLse { scale, causal } => {
            super::attention::backward::generate(&g.attention_args(*scale, *causal, false), None)?
        }
        Op::AttentionGrad {
            wrt,
            scale,
            causal,
            zero_masked_rows,
        } => super::attention::backward::generate(&g.attention_args(*scale, *causal, *zero_masked_rows), Some(*wrt))?,
        other => {
            return Err(CodegenError::UnsupportedOp {
                kernel: cx.kernel.clone(),
                op: other.name().to_string(),
            })
        }
    };
    let (source, entry) = finish(kind, &body.1, &body.0);
    Ok(CudaKernel {
        name: String::new(),
        source,
        entry,
        params: params.list,
        launch,
        gemm: None,
    })
}

struct Gen<'a> {
    cx: &'a Ctx<'a>,
    inputs: &'a [(Access, TensorType)],
    in_param: Vec<usize>,
    out_param: usize,
    out: &'a TensorType,
    /// The kernel's sibling ops, with their output's parameter and type.
    siblings: &'a [(&'a Sibling, usize, TensorType)],
}

type Emitted = (&'static str, (String, Helpers), LaunchConfig);

impl Gen<'_> {
    fn out_dims(&self) -> &[usize] {
        self.out.shape.dims()
    }

    fn ix(&self) -> Ix {
        let accs: Vec<(i64, &[i64])> = self.inputs.iter().map(|(a, _)| (a.offset, &a.strides[..])).collect();
        let mut wide = Ix::for_space(self.out_dims(), &[], 0).wide;
        for ((a, ty), acc) in self.inputs.iter().zip(&accs) {
            wide |= Ix::for_space(ty.shape.dims(), &[*acc], 0).wide || a.offset.unsigned_abs() >= 1 << 30;
        }
        Ix { wide }
    }

    /// A grid-stride loop over the output, coordinates `o0..`, with `f` writing the
    /// body that stores `p<out>[i]`.
    fn elementwise(
        &self,
        f: impl FnOnce(&mut Writer, &mut Helpers, Ix) -> Result<&'static str, CodegenError>,
    ) -> Result<Emitted, CodegenError> {
        self.elementwise_by(1, f)
    }

    /// A loop over the output's elements, `vw` consecutive ones a step (`i` the first,
    /// `o<k>` its coordinates; `vw` divides the last dim).
    fn elementwise_by(
        &self,
        vw: usize,
        f: impl FnOnce(&mut Writer, &mut Helpers, Ix) -> Result<&'static str, CodegenError>,
    ) -> Result<Emitted, CodegenError> {
        let ix = self.ix();
        let t = ix.ty();
        let numel = self.out.numel();
        let mut h = Helpers::new();
        let mut w = Writer::new();
        w.open(format!(
            "extern \"C\" __global__ void __launch_bounds__({ELEMENTWISE_BLOCK}) {}({})",
            cuda::ENTRY_PLACEHOLDER,
            self.params_decl()
        ));
        w.line(format!("const {t} tid = ({t})blockIdx.x * blockDim.x + threadIdx.x;"));
        w.line(format!("const {t} nthreads = ({t})gridDim.x * blockDim.x;"));
        let steps = numel / vw.max(1);
        if vw > 1 {
            h.need(Helper::Vec);
            w.open(format!(
                "for ({t} v = tid; v < {}; v += nthreads)",
                ix.lit(steps as i64)
            ));
            w.line(format!("const {t} i = v * {};", ix.lit(vw as i64)));
        } else {
            w.open(format!(
                "for ({t} i = tid; i < {}; i += nthreads)",
                ix.lit(numel as i64)
            ));
        }
        layout::decompose(&mut w, ix, "i", self.out_dims(), "o");
        let kind = f(&mut w, &mut h, ix)?;
        w.close();
        w.close();
        let blocks = steps.div_ceil(ELEMENTWISE_BLOCK as usize).min(u32::MAX as usize) as u32;
        Ok((
            kind,
            (w.finish(), h),
            LaunchConfig {
                block: ELEMENTWISE_BLOCK,
                grid: GridSize::PerSm {
                    blocks_per_sm: BLOCKS_PER_SM,
                    max_blocks: blocks,
                },
                shared_mem_bytes: 0,
            },
        ))
    }

    /// The arguments of the attention kernels (forward and backward) for this op.
    fn attention_args(&self, scale: f64, causal: bool, zero_masked_rows: bool) -> super::attention::Args<'_> {
        super::attention::Args {
            cx: self.cx,
            inputs: self.inputs,
            in_param: &self.in_param,
            out_param: self.out_param,
            out: self.out,
            also: self.siblings.first().map(|s| (s.1, s.2.dtype)),
            params_decl: self.params_decl(),
            scale,
            causal,
            zero_masked_rows,
        }
    }

    fn params_decl(&self) -> String {
        let mut v: Vec<String> = self
            .inputs
            .iter()
            .zip(&self.in_param)
            .map(|((_, ty), &p)| (p, format!("const {}* __restrict__ p{p}", cuda::storage_type(ty.dtype))))
            .collect::<std::collections::BTreeMap<usize, String>>()
            .into_values()
            .collect();
        v.push(format!(
            "{}* __restrict__ p{}",
            cuda::storage_type(self.out.dtype),
            self.out_param
        ));
        for (_, p, ty) in self.siblings {
            v.push(format!("{}* __restrict__ p{p}", cuda::storage_type(ty.dtype)));
        }
        v.join(", ")
    }

    /// `out[.., c] = q[.., c] * scales[.., c / group]` (see [`Op::Dequantize`]), the
    /// product in f32 (f64 for f64) rounded once at the store.
    fn dequantize(
        &self,
        w: &mut Writer,
        h: &mut Helpers,
        ix: Ix,
        bits: usize,
        group: usize,
    ) -> Result<&'static str, CodegenError> {
        let r = self.out_dims().len();
        let ((qa, qt), (sa, st)) = (&self.inputs[0], &self.inputs[1]);
        self.check_rank("dequantize data", qt.shape.rank(), r)?;
        self.check_rank("dequantize scales", st.shape.rank(), r)?;
        if r == 0 || group == 0 || !matches!(bits, 4 | 8) || st.dtype != self.out.dtype {
            return Err(self.cx.malformed("dequantize of the wrong shape or types"));
        }
        let last = r - 1;
        let address = |a: &Access, inner: &str| {
            let mut terms = vec![ix.lit(a.offset)];
            for (k, &s) in a.strides.iter().enumerate() {
                let coord = if k == last { inner.to_string() } else { format!("o{k}") };
                if s != 0 {
                    terms.push(format!("{coord} * {}", ix.lit(s)));
                }
            }
            terms.join(" + ")
        };
        let qi = if bits == 4 {
            format!("(o{last} >> 1)")
        } else {
            format!("o{last}")
        };
        let qread = format!("p{}[{}]", self.in_param[0], address(qa, &qi));
        let value = if bits == 4 {
            format!("((((int)({qread} >> ((o{last} & 1) * 4)) & 15) ^ 8) - 8)")
        } else {
            format!("(int){qread}")
        };
        let sread = cuda::load_conv(
            h,
            st.dtype,
            &format!(
                "p{}[{}]",
                self.in_param[1],
                address(sa, &format!("(o{last} / {})", ix.lit(group as i64)))
            ),
        );
        let f = cuda::reg_type(self.out.dtype);
        let v = cuda::store_conv(h, self.out.dtype, &format!("(({f}){value} * {sread})"));
        w.line(format!("p{}[i] = {v};", self.out_param));
        Ok("dequantize")
    }

    fn check_rank(&self, what: &str, got: usize, want: usize) -> Result<(), CodegenError> {
        if got != want {
            return Err(self.cx.malformed(format!("{what} has rank {got}, expected {want}")));
        }
        Ok(())
    }

    fn pad(
        &self,
        w: &mut Writer,
        h: &mut Helpers,
        ix: Ix,
        pads: &[(i64, i64)],
        mode: PadMode,
        value: f64,
    ) -> Result<&'static str, CodegenError> {
        let (a, ty) = &self.inputs[0];
        let dims = ty.shape.dims();
        let r = dims.len();
        self.check_rank("pad output", self.out_dims().len(), r)?;
        if pads.len() != r {
            return Err(self.cx.malformed(format!("{} pads for rank {r}", pads.len())));
        }
        let t = ix.ty();
        let mut conds = Vec::new();
        for (k, (&(lo, hi), &d)) in pads.iter().zip(dims).enumerate() {
            let di = d as i64;
            let out_d = di + lo + hi;
            if out_d < 0 || out_d as usize != self.out_dims()[k] {
                return Err(self
                    .cx
                    .malformed(format!("pad ({lo}, {hi}) of axis {k} does not give the output extent")));
            }
            if a.strides[k] == 0 && mode != PadMode::Constant {
                continue;
            }
            w.line(format!("{t} c{k} = o{k} - {};", ix.lit(lo)));
            match mode {
                PadMode::Constant => conds.push(format!("c{k} >= 0 && c{k} < {}", ix.lit(di))),
                PadMode::Reflect => {
                    if out_d > 0 && (di < 1 || lo.max(0) > di - 1 || hi.max(0) > di - 1) {
                        return Err(self.cx.unsupported(format!(
                            "reflect pad ({lo}, {hi}) of axis {k} needs pads smaller than its extent {d}"
                        )));
                    }
                    w.line(format!("if (c{k} < 0) c{k} = -c{k};"));
                    w.line(format!(
                        "if (c{k} >= {}) c{k} = {} - c{k};",
                        ix.lit(di),
                        ix.lit(2 * (di - 1))
                    ));
                }
                PadMode::Edge => {
                    if out_d > 0 && di == 0 {
                        return Err(self.cx.unsupported(format!("edge pad of empty axis {k}")));
                    }
                    w.line(format!(
                        "c{k} = c{k} < 0 ? 0 : (c{k} > {} ? {} : c{k});",
                        ix.lit(di - 1),
                        ix.lit(di - 1)
                    ));
                }
            }
        }
        let addr = layout::address(ix, a.offset, &a.strides, "c");
        let read = format!("p{}[{addr}]", self.in_param[0]);
        if conds.is_empty() || mode != PadMode::Constant {
            w.line(format!("p{}[i] = {read};", self.out_param));
        } else {
            let d = self.out.dtype;
            let fill = TensorData::from_f64(d, &[value]);
            let lit = cuda::tensor_lit(self.cx, &fill)?;
            let fill = cuda::store_conv(h, d, &lit);
            w.line(format!(
                "p{}[i] = ({}) ? {read} : ({})({fill});",
                self.out_param,
                conds.join(" && "),
                cuda::storage_type(d)
            ));
        }
        Ok("pad")
    }

    fn gather(&self, w: &mut Writer, _h: &mut Helpers, ix: Ix, axis: usize) -> Result<&'static str, CodegenError> {
        let (da, dty) = &self.inputs[0];
        let (ia, ity) = &self.inputs[1];
        let dd = dty.shape.dims();
        let q = ity.shape.rank();
        let r = dd.len();
        if axis >= r {
            return Err(self.cx.malformed(format!("gather axis {axis} of rank {r}")));
        }
        self.check_rank("gather output", self.out_dims().len(), r + q - 1)?;
        if !matches!(ity.dtype, DType::I64 | DType::I32) {
            return Err(self
                .cx
                .malformed(format!("gather indices must be i64 or i32, got {}", ity.dtype)));
        }
        let t = ix.ty();
        let mut iterms = vec![ix.lit(ia.offset)];
        for (k, &s) in ia.strides.iter().enumerate() {
            if s != 0 {
                iterms.push(format!("o{} * {}", axis + k, ix.lit(s)));
            }
        }
        let extent = dd[axis] as i64;
        w.line(format!(
            "long long g = (long long)p{}[{}];",
            self.in_param[1],
            iterms.join(" + ")
        ));
        w.line(format!("if (g < 0) g += {extent}LL;"));
        let mut dterms = vec![ix.lit(da.offset)];
        for (k, &s) in da.strides.iter().enumerate() {
            if s == 0 {
                continue;
            }
            if k < axis {
                dterms.push(format!("o{k} * {}", ix.lit(s)));
            } else if k == axis {
                dterms.push(format!("({t})g * {}", ix.lit(s)));
            } else {
                dterms.push(format!("o{} * {}", k + q - 1, ix.lit(s)));
            }
        }
        w.line("// out of range: write 0 (the CPU side reports an error)");
        w.line(format!(
            "p{}[i] = (g >= 0 && g < {extent}LL) ? p{}[{}] : ({})0;",
            self.out_param,
            self.in_param[0],
            dterms.join(" + "),
            cuda::storage_type(self.out.dtype)
        ));
        Ok("gather")
    }

    fn arg_reduce(
        &self,
        w: &mut Writer,
        h: &mut Helpers,
        ix: Ix,
        op: ArgReduceOp,
        axis: usize,
        keepdims: bool,
    ) -> Result<&'static str, CodegenError> {
        let (a, ty) = &self.inputs[0];
        let dims = ty.shape.dims();
        let r = dims.len();
        if axis >= r {
            return Err(self.cx.malformed(format!("{} axis {axis} of rank {r}", op.name())));
        }
        self.check_rank(op.name(), self.out_dims().len(), if keepdims { r } else { r - 1 })?;
        if self.out.dtype != DType::I64 || ty.dtype == DType::Bool {
            return Err(self
                .cx
                .malformed(format!("{} of {} into {}", op.name(), ty.dtype, self.out.dtype)));
        }
        let len = dims[axis];
        if len == 0 && self.out.numel() > 0 {
            return Err(self.cx.unsupported(format!("{} over an empty axis {axis}", op.name())));
        }
        let t = ix.ty();
        let mut terms = vec![ix.lit(a.offset)];
        for (k, &s) in a.strides.iter().enumerate() {
            if s == 0 || k == axis {
                continue;
            }
            let ok = if keepdims || k < axis { k } else { k - 1 };
            terms.push(format!("o{ok} * {}", ix.lit(s)));
        }
        w.line(format!("const {t} base = {};", terms.join(" + ")));
        let sa = ix.lit(a.strides[axis]);
        let d = ty.dtype;
        let rt = cuda::reg_type(d);
        let p = self.in_param[0];
        let cmp = if op == ArgReduceOp::ArgMax { ">" } else { "<" };
        w.line("long long best = 0;");
        w.line(format!("{rt} bv = {};", cuda::load_conv(h, d, &format!("p{p}[base]"))));
        let float = d.is_float();
        if float {
            w.line("// the first NaN counts as the extreme");
            w.open("if (!(bv != bv))");
        } else {
            w.open("");
        }
        w.open(format!("for ({t} k = 1; k < {}; ++k)", ix.lit(len as i64)));
        w.line(format!(
            "const {rt} x = {};",
            cuda::load_conv(h, d, &format!("p{p}[base + k * {sa}]"))
        ));
        if float {
            w.open("if (x != x)");
            w.line("best = k;");
            w.line("break;");
            w.close();
        }
        w.open(format!("if (x {cmp} bv)"));
        w.line("best = k;");
        w.line("bv = x;");
        w.close();
        w.close();
        w.close();
        w.line(format!("p{}[i] = best;", self.out_param));
        Ok("argreduce")
    }

    /// The shapes of a tiled matmul, checked, with the operands' strides over the
    /// output's batch dims.
    fn matmul_shapes(&self) -> Result<TiledShapes, CodegenError> {
        let (aa, aty) = &self.inputs[0];
        let (ba, bty) = &self.inputs[1];
        let od = self.out_dims();
        let (ar, br, or) = (aty.shape.rank(), bty.shape.rank(), od.len());
        if ar < 2 || br < 2 || or < 2 {
            return Err(self.cx.malformed("matmul needs operands of rank >= 2"));
        }
        let (m, k, n) = (
            aty.shape.dims()[ar - 2],
            aty.shape.dims()[ar - 1],
            bty.shape.dims()[br - 1],
        );
        if bty.shape.dims()[br - 2] != k || od[or - 2] != m || od[or - 1] != n {
            return Err(self.cx.malformed("matmul shapes do not agree"));
        }
        let d = self.out.dtype;
        if aty.dtype != d || bty.dtype != d || d == DType::Bool {
            return Err(self
                .cx
                .malformed(format!("matmul of {} and {} into {d}", aty.dtype, bty.dtype)));
        }
        let batch = &od[..or - 2];
        let nb: usize = batch.iter().product();
        // Per operand: strides over the output's batch dims (right-aligned, 1 -> 0).
        let bstrides = |acc: &Access, dims: &[usize]| -> Vec<i64> {
            let ob = dims.len() - 2;
            (0..batch.len())
                .map(|j| {
                    let lead = batch.len() as i64 - ob as i64;
                    let jj = j as i64 - lead;
                    if jj < 0 || dims[jj as usize] == 1 {
                        0
                    } else {
                        acc.strides[jj as usize]
                    }
                })
                .collect()
        };
        let sa = bstrides(aa, aty.shape.dims());
        let sb = bstrides(ba, bty.shape.dims());
        let ix = Ix {
            wide: self.ix().wide || Ix::for_space(batch, &[(0, &sa), (0, &sb)], nb * m.max(1) * n.max(1) * 2).wide,
        };
        Ok(TiledShapes {
            m,
            k,
            n,
            d,
            batch: batch.to_vec(),
            sa,
            sb,
            ix,
        })
    }

    /// `[.., M, K] x [.., K, N]` with 16x16 shared-memory tiles, batch dims broadcast
    /// through the operands' strides. Integers accumulate in wrapping i64.
    fn matmul(&self) -> Result<Emitted, CodegenError> {
        let TiledShapes {
            m,
            k,
            n,
            d,
            batch,
            sa,
            sb,
            ix,
        } = self.matmul_shapes()?;
        let (aa, aty) = &self.inputs[0];
        let (ba, bty) = &self.inputs[1];
        let (ar, br) = (aty.shape.rank(), bty.shape.rank());
        let nb: usize = batch.iter().product();
        let t = ix.ty();
        let (tm, tn) = (m.div_ceil(TILE), n.div_ceil(TILE));
        let tiles = nb * tm * tn;
        let (acc_t, zero) = match d {
            DType::F64 => ("double", "0.0"),
            d if d.is_float() => ("float", "0.0f"),
            _ => ("long long", "0LL"),
        };
        let mut h = Helpers::new();
        let mut w = Writer::new();
        w.line(format!(
            "// matmul: {nb} x [{m}, {k}] x [{k}, {n}], {TILE}x{TILE} tiles"
        ));
        w.open(format!(
            "extern \"C\" __global__ void __launch_bounds__({}) {}({})",
            TILE * TILE,
            cuda::ENTRY_PLACEHOLDER,
            self.params_decl()
        ));
        w.line(format!("__shared__ {acc_t} as_[{TILE}][{}];", TILE + 1));
        w.line(format!("__shared__ {acc_t} bs_[{TILE}][{}];", TILE + 1));
        w.line(format!("const int tx = threadIdx.x % {TILE};"));
        w.line(format!("const int ty = threadIdx.x / {TILE};"));
        w.open(format!(
            "for ({t} tile = blockIdx.x; tile < {}; tile += gridDim.x)",
            ix.lit(tiles as i64)
        ));
        w.line(format!("const {t} bt = tile / {};", ix.lit((tm * tn) as i64)));
        w.line(format!("const {t} tr = tile % {};", ix.lit((tm * tn) as i64)));
        w.line(format!("const {t} row = (tr / {}) * {TILE} + ty;", ix.lit(tn as i64)));
        w.line(format!("const {t} col = (tr % {}) * {TILE} + tx;", ix.lit(tn as i64)));
        layout::decompose(&mut w, ix, "bt", &batch, "b");
        w.line(format!(
            "const {t} abase = {};",
            layout::address(ix, aa.offset, &sa, "b")
        ));
        w.line(format!(
            "const {t} bbase = {};",
            layout::address(ix, ba.offset, &sb, "b")
        ));
        let (sam, sak) = (aa.strides[ar - 2], aa.strides[ar - 1]);
        let (sbk, sbn) = (ba.strides[br - 2], ba.strides[br - 1]);
        w.line(format!("{acc_t} acc = {zero};"));
        w.open(format!("for ({t} k0 = 0; k0 < {}; k0 += {TILE})", ix.lit(k as i64)));
        let la = cuda::load_conv(
            &mut h,
            d,
            &format!(
                "p{}[abase + row * {} + (k0 + tx) * {}]",
                self.in_param[0],
                ix.lit(sam),
                ix.lit(sak)
            ),
        );
        let lb = cuda::load_conv(
            &mut h,
            d,
            &format!(
                "p{}[bbase + (k0 + ty) * {} + col * {}]",
                self.in_param[1],
                ix.lit(sbk),
                ix.lit(sbn)
            ),
        );
        let (km, mm, nn) = (ix.lit(k as i64), ix.lit(m as i64), ix.lit(n as i64));
        w.line(format!(
            "as_[ty][tx] = (row < {mm} && k0 + tx < {km}) ? ({acc_t}){la} : {zero};"
        ));
        w.line(format!(
            "bs_[ty][tx] = (k0 + ty < {km} && col < {nn}) ? ({acc_t}){lb} : {zero};"
        ));
        w.line("__syncthreads();");
        w.line("#pragma unroll");
        w.open(format!("for (int kk = 0; kk < {TILE}; ++kk)"));
        if d.is_float() {
            w.line("acc = acc + as_[ty][kk] * bs_[kk][tx];");
        } else {
            w.line(
                "acc = (long long)((unsigned long long)acc + (unsigned long long)as_[ty][kk] * (unsigned long long)bs_[kk][tx]);",
            );
        }
        w.close();
        w.line("__syncthreads();");
        w.close();
        let val = match d {
            DType::F32 | DType::F64 => "acc".to_string(),
            DType::F16 | DType::BF16 => cuda::cast_c(&mut h, DType::F32, d, "acc"),
            _ => format!("({})acc", cuda::reg_type(d)),
        };
        let val = cuda::store_conv(&mut h, d, &val);
        w.open(format!("if (row < {mm} && col < {nn})"));
        w.line(format!(
            "p{}[bt * {} + row * {nn} + col] = {val};",
            self.out_param,
            ix.lit((m * n) as i64)
        ));
        w.close();
        w.close();
        w.close();
        Ok((
            "matmul_tiled",
            (w.finish(), h),
            LaunchConfig {
                block: (TILE * TILE) as u32,
                grid: GridSize::PerSm {
                    blocks_per_sm: 4,
                    max_blocks: tiles.min(u32::MAX as usize) as u32,
                },
                shared_mem_bytes: 0,
            },
        ))
    }
}
