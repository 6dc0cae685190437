//! A convolution kernel with its epilogue ([`ConvKernel`]): the direct form, one thread
//! per output element `(b, j, q..)` summing `w[j, i, t..] x[b, grp (c / groups) + i,
//! tap..]` over `i`, then the taps, in the interpreter's order (f32 accumulation, f64
//! for f64), the sum rounded to the convolution's dtype, then the body (bias,
//! activation, residual add) and its stores, all in registers.
//!
//! This is the CUDA-core kernel every convolution can run; an implicit-GEMM kernel on
//! tensor cores for the large ones is future work (see ARCHITECTURE.md).

use graphc_ir::{ConvGeom, DType};

use super::cuda::{self, Writer};
use super::layout::{self, Ix};
use super::prelude::Helpers;
use super::ELEMENTWISE_BLOCK;
use super::{finish, CodegenError, Ctx, CudaKernel, GridSize, LaunchConfig, ParamAccess, Params, BLOCKS_PER_SM};
use crate::kernel::{ConvKernel, Expr, ExprId};

/// The convolution's sum at output `(o0, o1, o2..)` added into `acc` (declared by the
/// caller, of type `acc_t`): over the group's channels `ci`, then the taps `t..`, a tap
/// outside the input skipped. `read(h, "x")` and `read(h, "w")` give the loads at the
/// coordinates `x0..` and `w0..` declared here.
pub(super) fn emit_sum(
    w: &mut Writer,
    h: &mut Helpers,
    ix: Ix,
    g: &ConvGeom,
    acc_t: &str,
    read: &dyn Fn(&mut Helpers, &str) -> String,
) {
    let t = ix.ty();
    let lit = |n: usize| ix.lit(n as i64);
    let (cg, og) = (g.c / g.groups, g.o / g.groups);
    w.line(format!("const {t} grp = o1 / {};", lit(og)));
    w.open(format!("for ({t} ci = 0; ci < {}; ++ci)", lit(cg)));
    for (k, a) in g.axes.iter().enumerate() {
        w.open(format!("for ({t} t{k} = 0; t{k} < {}; ++t{k})", lit(a.kernel)));
        w.line(format!(
            "const {t} ip{k} = o{} * {} + t{k} * {} - {};",
            k + 2,
            lit(a.stride),
            lit(a.dilation),
            lit(a.pad_lo)
        ));
        w.line(format!("if (ip{k} < 0 || ip{k} >= {}) continue;", lit(a.len)));
    }
    let r = g.axes.len();
    let coords = |lead: [String; 2], spatial: &str, name: &str| {
        let mut parts = vec![format!("{name}0 = {}", lead[0]), format!("{name}1 = {}", lead[1])];
        parts.extend((0..r).map(|k| format!("{name}{} = {spatial}{k}", k + 2)));
        format!("const {t} {};", parts.join(", "))
    };
    w.line(coords(["o0".into(), format!("grp * {} + ci", lit(cg))], "ip", "x"));
    w.line(coords(["o1".into(), "ci".into()], "t", "w"));
    let (xv, wv) = (read(h, "x"), read(h, "w"));
    w.line(format!("acc += ({acc_t}){wv} * ({acc_t}){xv};"));
    for _ in 0..=r {
        w.close();
    }
}

pub(crate) fn generate(cx: &Ctx, c: &ConvKernel) -> Result<CudaKernel, CodegenError> {
    let g = c.geom().map_err(|m| cx.malformed(m))?;
    let space = g.out_dims();
    let d = cx.dtype(c.x.buffer)?;
    if cx.dtype(c.w.buffer)? != d || !d.is_float() {
        return Err(cx.malformed("a convolution of operands of two dtypes or not float"));
    }
    let mut params = Params::new();
    let xp = params.add(cx, c.x.buffer, ParamAccess::Read)?;
    let wp = params.add(cx, c.w.buffer, ParamAccess::Read)?;
    let roots: Vec<ExprId> = c.stores.iter().map(|s| s.value).collect();
    let live = cuda::closure(&c.body, &roots, &|_| false);
    cuda::check_loads(cx, &c.body, &live, &c.inputs)?;
    let mut in_param = vec![usize::MAX; c.inputs.len()];
    for &id in &live {
        if let Expr::Load(n) | Expr::Gather { input: n, .. } = c.body.exprs[id.index()].0 {
            in_param[n.index()] = params.add(cx, c.inputs[n.index()].buffer, ParamAccess::Read)?;
        }
    }
    let store_param: Vec<usize> = c
        .stores
        .iter()
        .map(|s| params.add(cx, s.access.buffer, ParamAccess::Write))
        .collect::<Result<_, _>>()?;
    let mut accs: Vec<(i64, &[i64])> = c.inputs.iter().map(|a| (a.offset, &a.strides[..])).collect();
    accs.extend(c.stores.iter().map(|s| (s.access.offset, &s.access.strides[..])));
    let wide = Ix::for_space(&space, &accs, 0).wide
        || Ix::for_space(&c.x_dims, &[(c.x.offset, &c.x.strides[..])], 0).wide
        || Ix::for_space(&c.w_dims, &[(c.w.offset, &c.w.strides[..])], 0).wide;
    let ix = Ix { wide };
    let t = ix.ty();
    let lit = |n: usize| ix.lit(n as i64);
    let acc_t = if d == DType::F64 { "double" } else { "float" };
    let numel: usize = space.iter().product();

    let mut h = Helpers::new();
    let mut w = Writer::new();
    w.open(format!(
        "extern \"C\" __global__ void __launch_bounds__({ELEMENTWISE_BLOCK}) {}({})",
        cuda::ENTRY_PLACEHOLDER,
        params.c_decl()
    ));
    w.line(format!("const {t} tid = ({t})blockIdx.x * blockDim.x + threadIdx.x;"));
    w.line(format!("const {t} nthreads = ({t})gridDim.x * blockDim.x;"));
    w.open(format!("for ({t} i = tid; i < {}; i += nthreads)", lit(numel)));
    layout::decompose(&mut w, ix, "i", &space, "o");
    w.line(format!("{acc_t} acc = 0;"));
    let read = |h: &mut Helpers, operand: &str| {
        let (p, a) = if operand == "x" { (xp, &c.x) } else { (wp, &c.w) };
        cuda::load_conv(
            h,
            d,
            &format!("p{p}[{}]", layout::address(ix, a.offset, &a.strides, operand)),
        )
    };
    emit_sum(&mut w, &mut h, ix, &g, acc_t, &read);
    // The convolution's value as its dtype gives it (rounded once).
    let rounded = cuda::store_conv(&mut h, d, "acc");
    let acc_v = cuda::load_conv(&mut h, d, &rounded);
    w.line(format!("const {} acc_v = {acc_v};", cuda::reg_type(d)));
    let mut leaf = |h: &mut Helpers, _id: ExprId, e: &Expr, ty: DType| -> Result<String, CodegenError> {
        match e {
            Expr::Acc => Ok("acc_v".to_string()),
            Expr::Load(n) => {
                let a = &c.inputs[n.index()];
                let addr = layout::address(ix, a.offset, &a.strides, "o");
                Ok(cuda::load_conv(h, ty, &format!("p{}[{addr}]", in_param[n.index()])))
            }
            Expr::Gather {
                input,
                index,
                stride,
                extent,
            } => {
                let a = &c.inputs[input.index()];
                let addr = layout::address(ix, a.offset, &a.strides, "o");
                Ok(cuda::gather_c(
                    h,
                    in_param[input.index()],
                    &format!("(long long)({addr})"),
                    &format!("e{index}"),
                    *stride,
                    *extent,
                    ty,
                ))
            }
            Expr::Index(a) => Ok(cuda::cast_c(h, DType::I64, ty, &format!("((long long)o{a})"))),
            _ => Err(cx.malformed("a stage in a convolution kernel")),
        }
    };
    cuda::emit_exprs(
        cx,
        &mut w,
        &mut h,
        &c.body,
        cuda::Exprs {
            ids: &live,
            stored: &roots,
        },
        &|id| format!("e{id}"),
        &mut leaf,
    )?;
    for (k, st) in c.stores.iter().enumerate() {
        let sd = cx.dtype(st.access.buffer)?;
        super::elementwise::check_store_dtype(cx, &c.body, st, sd)?;
        let val = cuda::store_conv(&mut h, sd, &format!("e{}", st.value));
        let addr = layout::address(ix, st.access.offset, &st.access.strides, "o");
        w.line(format!("p{}[{addr}] = {val};", store_param[k]));
    }
    w.close();
    w.close();
    let (source, entry) = finish("conv", &h, &w.finish());
    let blocks = numel.div_ceil(ELEMENTWISE_BLOCK as usize).min(u32::MAX as usize) as u32;
    Ok(CudaKernel {
        name: String::new(),
        source,
        entry,
        params: params.list,
        launch: LaunchConfig {
            block: ELEMENTWISE_BLOCK,
            grid: GridSize::PerSm {
                blocks_per_sm: BLOCKS_PER_SM,
                max_blocks: if numel == 0 { 0 } else { blocks },
            },
            shared_mem_bytes: 0,
        },
        gemm: None,
    })
}
