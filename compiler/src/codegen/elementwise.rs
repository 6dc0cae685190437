//! Elementwise kernels: a grid-stride loop over the space.
//!
//! Fast path: when every store is a contiguous write and every load reads either the
//! same element (a scalar, hoisted out of the loop) or a contiguous block repeated
//! along the leading dims (identity, or a row broadcast such as a bias), each thread
//! handles `V` consecutive elements per step with one 16-byte (or narrower, for narrow
//! types mixed with wide ones) load or store per access; a scalar loop does the tail.
//! Otherwise each element's addresses come from its multi-index over the space with
//! dims collapsed where every access steps through them as one; when every access
//! walks the last collapsed dim contiguously (or not at all) and starts each of its rows
//! 16-byte aligned (a transpose of attention's heads, `[b, h, s, d]` as `[b, s, h, d]`),
//! by `V` elements along it a step, each access one vector (or one scalar) a step.

use graphc_ir::DType;

use super::cuda::{self, Writer};
use super::layout::{self, Ix};
use super::prelude::{Helper, Helpers};
use super::{
    finish, CodegenError, Ctx, CudaKernel, GridSize, LaunchConfig, ParamAccess, Params, BLOCKS_PER_SM,
    ELEMENTWISE_BLOCK,
};
use crate::kernel::{Access, Body, Expr, ExprId, Store};

/// How the fast path reads one input.
#[derive(Clone, Copy, Debug, PartialEq)]
enum FastRead {
    /// One element for the whole space, loaded once.
    Scalar,
    /// `offset + i % period` (`period == numel` for identity reads).
    Period(usize),
}

/// The vector width of the fast path (16 bytes of the widest type), if every store and
/// every non-scalar load starts at a multiple of it.
fn fast_width(cx: &Ctx, inputs: &[(usize, &Access)], stores: &[Store]) -> Result<Option<usize>, CodegenError> {
    let mut max_size = 1;
    for (_, a) in inputs {
        max_size = max_size.max(cx.dtype(a.buffer)?.size_bytes());
    }
    for s in stores {
        max_size = max_size.max(cx.dtype(s.access.buffer)?.size_bytes());
    }
    let v = 16 / max_size;
    let aligned = |off: i64| off.rem_euclid(v as i64) == 0;
    let ok = stores.iter().all(|s| aligned(s.access.offset))
        && inputs
            .iter()
            .all(|(_, a)| aligned(a.offset) || a.strides.iter().all(|&s| s == 0));
    Ok(ok.then_some(v))
}

/// An elementwise kernel checked, with what both paths share: the expressions the
/// stores need, the inputs they read, the parameters and the index type.
struct Setup<'a> {
    space: &'a [usize],
    inputs: &'a [Access],
    body: &'a Body,
    stores: &'a [Store],
    live: Vec<ExprId>,
    /// The inputs read (loads and gathers), sorted.
    used: Vec<usize>,
    gathers: bool,
    in_param: Vec<usize>,
    store_param: Vec<usize>,
    numel: usize,
    ix: Ix,
}

impl<'a> Setup<'a> {
    /// The kernel's buffers are added to `params` (shared by the parts of a
    /// multi-tensor kernel).
    fn new(
        cx: &Ctx,
        space: &'a [usize],
        inputs: &'a [Access],
        body: &'a Body,
        stores: &'a [Store],
        params: &mut Params,
    ) -> Result<Setup<'a>, CodegenError> {
        let rank = space.len();
        for (i, a) in inputs.iter().enumerate() {
            if a.strides.len() != rank {
                return Err(cx.malformed(format!("input {i} has rank {} in a rank-{rank} space", a.strides.len())));
            }
        }
        for (i, s) in stores.iter().enumerate() {
            if s.access.strides.len() != rank {
                return Err(cx.malformed(format!(
                    "store {i} has rank {} in a rank-{rank} space",
                    s.access.strides.len()
                )));
            }
            if s.value.index() >= body.exprs.len() {
                return Err(cx.malformed(format!("store {i} of missing expression {}", s.value)));
            }
        }
        let roots: Vec<ExprId> = stores.iter().map(|s| s.value).collect();
        let live = cuda::closure(body, &roots, &|_| false);
        cuda::check_loads(cx, body, &live, inputs)?;
        let mut used: Vec<usize> = live
            .iter()
            .filter_map(|&id| match body.exprs[id.index()].0 {
                Expr::Load(n) | Expr::Gather { input: n, .. } => Some(n.index()),
                _ => None,
            })
            .collect();
        used.sort();
        used.dedup();
        let gathers = live
            .iter()
            .any(|&id| matches!(body.exprs[id.index()].0, Expr::Gather { .. }));

        let mut in_param = vec![usize::MAX; inputs.len()];
        for &n in &used {
            in_param[n] = params.add(cx, inputs[n].buffer, ParamAccess::Read)?;
        }
        let mut store_param = Vec::new();
        for s in stores {
            store_param.push(params.add(cx, s.access.buffer, ParamAccess::Write)?);
        }

        let numel: usize = space.iter().product();
        let mut all: Vec<(i64, &[i64])> = used
            .iter()
            .map(|&n| (inputs[n].offset, &inputs[n].strides[..]))
            .collect();
        all.extend(stores.iter().map(|s| (s.access.offset, &s.access.strides[..])));
        let ix = Ix::for_space(space, &all, 0);
        Ok(Setup {
            space,
            inputs,
            body,
            stores,
            live,
            used,
            gathers,
            in_param,
            store_param,
            numel,
            ix,
        })
    }

    /// `offset + ` as C (empty for offset 0).
    fn offset_plus(&self, offset: i64) -> String {
        if offset != 0 {
            format!("{} + ", self.ix.lit(offset))
        } else {
            String::new()
        }
    }

    /// The position in a block repeated every `period` elements of element `i`.
    fn period_index(&self, period: usize) -> String {
        if period == self.numel {
            "i".to_string()
        } else {
            format!("i % {}", self.ix.lit(period as i64))
        }
    }

    /// The fast path's reads and vector width, when it applies.
    fn fast_plan(&self, cx: &Ctx) -> Result<Option<FastPlan>, CodegenError> {
        let (space, numel) = (self.space, self.numel);
        // Each access is a scalar or a repeated contiguous block.
        let reads: Option<Vec<(usize, FastRead)>> = self
            .used
            .iter()
            .map(|&n| {
                let a = &self.inputs[n];
                if a.strides.iter().zip(space).all(|(&s, &d)| s == 0 || d == 1) {
                    return Some((n, FastRead::Scalar));
                }
                let c = layout::collapse(space, &[&a.strides]);
                layout::broadcast_period(&c.dims, &c.strides[0]).map(|p| (n, FastRead::Period(p)))
            })
            .collect();
        let stores_contig = self
            .stores
            .iter()
            .all(|s| layout::is_contiguous(space, &s.access.strides));
        let used_acc: Vec<(usize, &Access)> = self.used.iter().map(|&n| (n, &self.inputs[n])).collect();
        let width = fast_width(cx, &used_acc, self.stores)?;
        // A gather reads through a computed index: the general path only.
        let reads = reads.filter(|_| !self.gathers);
        Ok(match (reads, width) {
            (Some(r), Some(v))
                if stores_contig
                    && numel >= v
                    && r.iter().all(|(_, fr)| match fr {
                        FastRead::Scalar => true,
                        FastRead::Period(p) => *p == numel || p % v == 0,
                    }) =>
            {
                Some(FastPlan { reads: r, v })
            }
            _ => None,
        })
    }
}

/// The fast path: how each input is read, and the elements per vector step.
struct FastPlan {
    reads: Vec<(usize, FastRead)>,
    v: usize,
}

/// The name of the register holding a scalar input.
fn scalar_name(n: usize) -> String {
    format!("s{n}")
}

/// The body's expressions (`e<id>`, leaves from `leaf`), then each store's value as
/// its storage type, written by the line `store(k, store, value)`.
fn body_and_stores(
    cx: &Ctx,
    s: &Setup,
    w: &mut Writer,
    h: &mut Helpers,
    leaf: &mut cuda::Leaf,
    store: impl Fn(usize, &Store, String) -> String,
) -> Result<(), CodegenError> {
    let stored: Vec<ExprId> = s.stores.iter().map(|st| st.value).collect();
    cuda::emit_exprs(
        cx,
        w,
        h,
        s.body,
        cuda::Exprs {
            ids: &s.live,
            stored: &stored,
        },
        &|id| format!("e{id}"),
        leaf,
    )?;
    for (k, st) in s.stores.iter().enumerate() {
        let d = cx.dtype(st.access.buffer)?;
        check_store_dtype(cx, s.body, st, d)?;
        let val = cuda::store_conv(h, d, &format!("e{}", st.value));
        w.line(store(k, st, val));
    }
    Ok(())
}

/// The fast path's loop body (`w` inside the kernel): the hoisted scalars, the vector
/// loop and the scalar tail. Returns the work items (vector steps).
fn fast_path(cx: &Ctx, s: &Setup, f: &FastPlan, w: &mut Writer, h: &mut Helpers) -> Result<usize, CodegenError> {
    let (ix, t, v, numel, inputs) = (s.ix, s.ix.ty(), f.v, s.numel, s.inputs);
    h.need(Helper::Vec);
    let nvec = numel / v;
    w.line(format!(
        "// vectorized: {v} elements per step, 16-byte aligned accesses"
    ));
    for &(n, fr) in &f.reads {
        if fr == FastRead::Scalar {
            let d = cx.dtype(inputs[n].buffer)?;
            let raw = format!("p{}[{}]", s.in_param[n], ix.lit(inputs[n].offset));
            w.line(format!(
                "const {} {} = {};",
                cuda::reg_type(d),
                scalar_name(n),
                cuda::load_conv(h, d, &raw)
            ));
        }
    }
    w.open(format!("for ({t} v = tid; v < {}; v += nthreads)", ix.lit(nvec as i64)));
    w.line(format!("const {t} i = v * {};", ix.lit(v as i64)));
    for &(n, fr) in &f.reads {
        if let FastRead::Period(p) = fr {
            let d = cx.dtype(inputs[n].buffer)?;
            let vt = vec_type(v * d.size_bytes());
            let (off, idx) = (s.offset_plus(inputs[n].offset), s.period_index(p));
            w.line(format!("alignas(16) {} a{n}[{v}];", cuda::storage_type(d)));
            w.line(format!(
                "*({vt}*)a{n} = *(const {vt}*)(p{} + {off}{idx});",
                s.in_param[n]
            ));
        }
    }
    for (k, st) in s.stores.iter().enumerate() {
        let d = cx.dtype(st.access.buffer)?;
        w.line(format!("alignas(16) {} o{k}[{v}];", cuda::storage_type(d)));
    }
    w.line("#pragma unroll");
    w.open(format!("for (int u = 0; u < {v}; ++u)"));
    let is_scalar = |n: usize| f.reads.iter().any(|&(m, fr)| m == n && fr == FastRead::Scalar);
    let mut leaf = |h: &mut Helpers, _id: ExprId, e: &Expr, d: DType| -> Result<String, CodegenError> {
        match e {
            Expr::Load(n) => {
                let n = n.index();
                if is_scalar(n) {
                    Ok(scalar_name(n))
                } else {
                    Ok(cuda::load_conv(h, d, &format!("a{n}[u]")))
                }
            }
            Expr::Index(a) => Ok(index_value(h, ix, "(i + u)", s.space, *a as usize, d)),
            _ => Err(cx.malformed("stage or acc in an elementwise kernel")),
        }
    };
    body_and_stores(cx, s, w, h, &mut leaf, |k, _, val| format!("o{k}[u] = {val};"))?;
    w.close();
    for (k, st) in s.stores.iter().enumerate() {
        let d = cx.dtype(st.access.buffer)?;
        let vt = vec_type(v * d.size_bytes());
        let off = s.offset_plus(st.access.offset);
        w.line(format!(
            "*({vt}*)(p{} + {off}i) = *(const {vt}*)o{k};",
            s.store_param[k]
        ));
    }
    w.close();
    if !numel.is_multiple_of(v) {
        fast_tail(cx, s, f, w, h)?;
    }
    Ok(nvec.max(1))
}

/// The fast path's tail: the last `numel % V` elements, one at a time.
fn fast_tail(cx: &Ctx, s: &Setup, f: &FastPlan, w: &mut Writer, h: &mut Helpers) -> Result<(), CodegenError> {
    let (ix, t, numel) = (s.ix, s.ix.ty(), s.numel);
    w.open(format!(
        "for ({t} i = {} + tid; i < {}; i += nthreads)",
        ix.lit((numel / f.v * f.v) as i64),
        ix.lit(numel as i64)
    ));
    let mut leaf = |h: &mut Helpers, _id: ExprId, e: &Expr, d: DType| -> Result<String, CodegenError> {
        match e {
            Expr::Load(n) => {
                let n = n.index();
                match f.reads.iter().find(|&&(m, _)| m == n).map(|&(_, fr)| fr) {
                    Some(FastRead::Period(p)) => {
                        let (off, idx) = (s.offset_plus(s.inputs[n].offset), s.period_index(p));
                        Ok(cuda::load_conv(h, d, &format!("p{}[{off}{idx}]", s.in_param[n])))
                    }
                    _ => Ok(scalar_name(n)),
                }
            }
            Expr::Index(a) => Ok(index_value(h, ix, "i", s.space, *a as usize, d)),
            _ => Err(cx.malformed("stage or acc in an elementwise kernel")),
        }
    };
    body_and_stores(cx, s, w, h, &mut leaf, |k, st, val| {
        format!("p{}[{}i] = {val};", s.store_param[k], s.offset_plus(st.access.offset))
    })?;
    w.close();
    Ok(())
}

/// The general path's loop body: every address from the element's multi-index over
/// the collapsed space. Returns the work items (elements).
fn general_path(cx: &Ctx, s: &Setup, w: &mut Writer, h: &mut Helpers) -> Result<usize, CodegenError> {
    let (ix, t, numel, inputs, used) = (s.ix, s.ix.ty(), s.numel, s.inputs, &s.used);
    let mut strides: Vec<&[i64]> = used.iter().map(|&n| &inputs[n].strides[..]).collect();
    strides.extend(s.stores.iter().map(|st| &st.access.strides[..]));
    let c = layout::collapse(s.space, &strides);
    w.line(format!("// general: collapsed space {:?}", c.dims));
    // Long rows (a vocabulary's): a block's threads along a row, blocks over the rows,
    // so an element's coordinates need no division (the last one is the loop's).
    let r = c.dims.len();
    let inner = c.dims.last().copied().unwrap_or(1);
    let by_rows = r >= 2 && inner >= ROW_SPLIT_MIN;
    let block = ix.lit(ELEMENTWISE_BLOCK as i64);
    let work = if by_rows {
        let rows = numel / inner;
        w.open(format!(
            "for ({t} row = tid / {block}; row < {}; row += nthreads / {block})",
            ix.lit(rows as i64)
        ));
        layout::decompose(w, ix, "row", &c.dims[..r - 1], "i");
        w.open(format!(
            "for ({t} i{} = tid % {block}; i{} < {}; i{} += {block})",
            r - 1,
            r - 1,
            ix.lit(inner as i64),
            r - 1
        ));
        w.line(format!("const {t} i = row * {} + i{};", ix.lit(inner as i64), r - 1));
        rows * ELEMENTWISE_BLOCK as usize
    } else {
        w.open(format!(
            "for ({t} i = tid; i < {}; i += nthreads)",
            ix.lit(numel as i64)
        ));
        layout::decompose(w, ix, "i", &c.dims, "i");
        numel
    };
    // The index along the space's last axis, where it is the collapsed last one.
    let last_axis = (s.space.last() == Some(&inner)).then(|| s.space.len() - 1);
    let used_pos = |n: usize| used.iter().position(|&m| m == n).unwrap_or(0);
    let mut leaf = |h: &mut Helpers, _id: ExprId, e: &Expr, d: DType| -> Result<String, CodegenError> {
        match e {
            Expr::Load(n) => {
                let n = n.index();
                let addr = layout::address(ix, inputs[n].offset, &c.strides[used_pos(n)], "i");
                Ok(cuda::load_conv(h, d, &format!("p{}[{addr}]", s.in_param[n])))
            }
            Expr::Gather {
                input,
                index,
                stride,
                extent,
            } => {
                let n = input.index();
                let addr = layout::address(ix, inputs[n].offset, &c.strides[used_pos(n)], "i");
                Ok(cuda::gather_c(
                    h,
                    s.in_param[n],
                    &format!("(long long){addr}"),
                    &format!("e{index}"),
                    *stride,
                    *extent,
                    d,
                ))
            }
            Expr::Index(a) if by_rows && last_axis == Some(*a as usize) => {
                Ok(cuda::cast_c(h, DType::I64, d, &format!("((long long)i{})", r - 1)))
            }
            Expr::Index(a) => Ok(index_value(h, ix, "i", s.space, *a as usize, d)),
            _ => Err(cx.malformed("stage or acc in an elementwise kernel")),
        }
    };
    body_and_stores(cx, s, w, h, &mut leaf, |k, st, val| {
        let addr = layout::address(ix, st.access.offset, &c.strides[used.len() + k], "i");
        format!("p{}[{addr}] = {val};", s.store_param[k])
    })?;
    w.close();
    if by_rows {
        w.close();
    }
    Ok(work)
}

/// The general path runs rows of at least this many elements a block's threads along
/// each row.
const ROW_SPLIT_MIN: usize = 4096;

pub(crate) fn generate(
    cx: &Ctx,
    space: &[usize],
    inputs: &[Access],
    body: &Body,
    stores: &[Store],
) -> Result<CudaKernel, CodegenError> {
    let mut params = Params::new();
    let s = Setup::new(cx, space, inputs, body, stores, &mut params)?;
    let mut h = Helpers::new();
    let mut w = Writer::new();
    let t = s.ix.ty();
    open_kernel(&mut w, &params);
    let mut inner = Writer::new();
    inner.line(format!("const {t} tid = ({t})blockIdx.x * blockDim.x + threadIdx.x;"));
    inner.line(format!("const {t} nthreads = ({t})gridDim.x * blockDim.x;"));
    let work = loops(cx, &s, &mut inner, &mut h)?;
    for l in inner.finish().lines() {
        w.line(format!("  {l}"));
    }
    w.line("}");
    let (source, entry) = finish("ew", &h, &w.finish());
    let numel = s.numel;
    let blocks = work.div_ceil(ELEMENTWISE_BLOCK as usize).min(u32::MAX as usize) as u32;
    let grid = GridSize::PerSm {
        blocks_per_sm: BLOCKS_PER_SM,
        max_blocks: if numel == 0 { 0 } else { blocks },
    };
    Ok(block_kernel(source, entry, params, grid))
}

/// The opening line of an elementwise kernel taking `params`.
fn open_kernel(w: &mut Writer, params: &Params) {
    w.line(format!(
        "extern \"C\" __global__ void __launch_bounds__({ELEMENTWISE_BLOCK}) {}({}) {{",
        cuda::ENTRY_PLACEHOLDER,
        params.c_decl()
    ));
}

/// A kernel of [`ELEMENTWISE_BLOCK`]-thread blocks, no shared memory.
fn block_kernel(source: String, entry: String, params: Params, grid: GridSize) -> CudaKernel {
    CudaKernel {
        name: String::new(),
        source,
        entry,
        params: params.list,
        launch: LaunchConfig {
            block: ELEMENTWISE_BLOCK,
            grid,
            shared_mem_bytes: 0,
        },
        gemm: None,
    }
}

/// The loops of one elementwise kernel over `tid` and `nthreads` (declared by the
/// caller): the fast path when it applies, else the general path. Returns the work
/// items (vector steps or elements).
fn loops(cx: &Ctx, s: &Setup, w: &mut Writer, h: &mut Helpers) -> Result<usize, CodegenError> {
    if let Some(f) = s.fast_plan(cx)? {
        return fast_path(cx, s, &f, w, h);
    }
    match strided_width(cx, s)? {
        Some((c, v)) => strided_path(cx, s, &c, v, w, h),
        None => general_path(cx, s, w, h),
    }
}

/// The collapsed space and the vector width of the strided vector path, when it applies:
/// no gathers, two or more collapsed dims, the last a multiple of `V` (16 bytes of the
/// widest type) long, every access through it with stride 1 (stores) or 0 or 1 (loads),
/// and every access that steps along it at a multiple of `V` (offset and other strides).
fn strided_width(cx: &Ctx, s: &Setup) -> Result<Option<(layout::Collapsed, usize)>, CodegenError> {
    if s.gathers {
        return Ok(None);
    }
    let mut strides: Vec<&[i64]> = s.used.iter().map(|&n| &s.inputs[n].strides[..]).collect();
    strides.extend(s.stores.iter().map(|st| &st.access.strides[..]));
    let c = layout::collapse(s.space, &strides);
    let mut max_size = 1;
    for &n in &s.used {
        max_size = max_size.max(cx.dtype(s.inputs[n].buffer)?.size_bytes());
    }
    for st in s.stores {
        max_size = max_size.max(cx.dtype(st.access.buffer)?.size_bytes());
    }
    let v = 16 / max_size;
    let r = c.dims.len();
    let offsets = s
        .used
        .iter()
        .map(|&n| s.inputs[n].offset)
        .chain(s.stores.iter().map(|st| st.access.offset));
    let ok = v > 1
        && r >= 2
        && c.dims[r - 1].is_multiple_of(v)
        && c.strides.iter().zip(offsets).enumerate().all(|(k, (st, off))| {
            let last = st[r - 1];
            let store = k >= s.used.len();
            (last == 1 || (last == 0 && !store))
                && (last == 0
                    || (off.rem_euclid(v as i64) == 0 && st[..r - 1].iter().all(|x| x.rem_euclid(v as i64) == 0)))
        });
    Ok(ok.then_some((c, v)))
}

/// The strided vector path: `V` elements along the last collapsed dim a step, from the
/// step's multi-index; an access stepping along it reads or writes one aligned vector,
/// one that does not one element. Returns the work items (vector steps).
fn strided_path(
    cx: &Ctx,
    s: &Setup,
    c: &layout::Collapsed,
    v: usize,
    w: &mut Writer,
    h: &mut Helpers,
) -> Result<usize, CodegenError> {
    let (ix, t, inputs, used) = (s.ix, s.ix.ty(), s.inputs, &s.used);
    h.need(Helper::Vec);
    let steps = s.numel / v;
    w.line(format!(
        "// strided vectors: collapsed space {:?}, {v} elements along the last dim a step",
        c.dims
    ));
    w.open(format!(
        "for ({t} cv = tid; cv < {}; cv += nthreads)",
        ix.lit(steps as i64)
    ));
    w.line(format!("const {t} i = cv * {};", ix.lit(v as i64)));
    layout::decompose(w, ix, "i", &c.dims, "i");
    let r = c.dims.len();
    let used_pos = |n: usize| used.iter().position(|&m| m == n).unwrap_or(0);
    for &n in used {
        let d = cx.dtype(inputs[n].buffer)?;
        let addr = layout::address(ix, inputs[n].offset, &c.strides[used_pos(n)], "i");
        if c.strides[used_pos(n)][r - 1] == 1 {
            let vt = vec_type(v * d.size_bytes());
            w.line(format!("alignas(16) {} a{n}[{v}];", cuda::storage_type(d)));
            w.line(format!("*({vt}*)a{n} = *(const {vt}*)(p{} + {addr});", s.in_param[n]));
        } else {
            let raw = format!("p{}[{addr}]", s.in_param[n]);
            w.line(format!(
                "const {} {} = {};",
                cuda::reg_type(d),
                scalar_name(n),
                cuda::load_conv(h, d, &raw)
            ));
        }
    }
    for (k, st) in s.stores.iter().enumerate() {
        let d = cx.dtype(st.access.buffer)?;
        w.line(format!("alignas(16) {} o{k}[{v}];", cuda::storage_type(d)));
    }
    w.line("#pragma unroll");
    w.open(format!("for (int u = 0; u < {v}; ++u)"));
    let vector = |n: usize| c.strides[used_pos(n)][r - 1] == 1;
    let mut leaf = |h: &mut Helpers, _id: ExprId, e: &Expr, d: DType| -> Result<String, CodegenError> {
        match e {
            Expr::Load(n) if vector(n.index()) => Ok(cuda::load_conv(h, d, &format!("a{}[u]", n.index()))),
            Expr::Load(n) => Ok(scalar_name(n.index())),
            Expr::Index(a) => Ok(index_value(h, ix, "(i + u)", s.space, *a as usize, d)),
            _ => Err(cx.malformed("stage or acc in an elementwise kernel")),
        }
    };
    body_and_stores(cx, s, w, h, &mut leaf, |k, _, val| format!("o{k}[u] = {val};"))?;
    w.close();
    for (k, st) in s.stores.iter().enumerate() {
        let d = cx.dtype(st.access.buffer)?;
        let vt = vec_type(v * d.size_bytes());
        let addr = layout::address(ix, st.access.offset, &c.strides[used.len() + k], "i");
        w.line(format!(
            "*({vt}*)(p{} + {addr}) = *(const {vt}*)o{k};",
            s.store_param[k]
        ));
    }
    w.close();
    Ok(steps.max(1))
}

/// The most blocks one part of a multi-tensor kernel gets (a bigger part loops).
pub(crate) const MULTI_PART_MAX_BLOCKS: usize = 1024;

/// A multi-tensor kernel ([`crate::kernel::MultiTensorKernel`]): one launch whose
/// blocks are split among the parts, each part a range of blocks running that part's
/// elementwise loops (the same code its own kernel would run) over its own buffers.
/// The grid is the sum of the parts' blocks, each part's
/// `min(ceil(work / block), MULTI_PART_MAX_BLOCKS)`.
pub(crate) fn generate_multi(cx: &Ctx, parts: &[crate::kernel::ElementwiseKernel]) -> Result<CudaKernel, CodegenError> {
    let mut params = Params::new();
    let mut setups = Vec::with_capacity(parts.len());
    for p in parts {
        setups.push(Setup::new(cx, &p.space, &p.inputs, &p.body, &p.stores, &mut params)?);
    }
    let mut h = Helpers::new();
    let mut w = Writer::new();
    open_kernel(&mut w, &params);
    let mut first = 0usize;
    for (i, s) in setups.iter().enumerate() {
        if s.numel == 0 {
            continue;
        }
        let t = s.ix.ty();
        let mut inner = Writer::new();
        let work = loops(cx, s, &mut inner, &mut h)?;
        let blocks = work
            .div_ceil(ELEMENTWISE_BLOCK as usize)
            .clamp(1, MULTI_PART_MAX_BLOCKS);
        let end = first + blocks;
        if end > u32::MAX as usize {
            return Err(cx.unsupported(format!("{end} blocks in one multi-tensor launch")));
        }
        let branch = if first == 0 { "if" } else { "} else if" };
        w.line(format!(
            "  {branch} (blockIdx.x < {end}u) {{  // part {i}: {:?}",
            s.space
        ));
        w.line(format!(
            "    const {t} tid = ({t})(blockIdx.x - {first}u) * blockDim.x + threadIdx.x;"
        ));
        w.line(format!("    const {t} nthreads = ({t}){blocks} * blockDim.x;"));
        for l in inner.finish().lines() {
            w.line(format!("    {l}"));
        }
        first = end;
    }
    if first > 0 {
        w.line("  }");
    }
    w.line("}");
    let (source, entry) = finish("multi", &h, &w.finish());
    Ok(block_kernel(
        source,
        entry,
        params,
        GridSize::Fixed { blocks: first as u32 },
    ))
}

/// The vector type moving `bytes` bytes at once.
pub(crate) fn vec_type(bytes: usize) -> &'static str {
    match bytes {
        16 => "g_vec16",
        8 => "g_vec8",
        4 => "g_vec4",
        _ => "g_vec2",
    }
}

/// An `Index` expression's value: the coordinate, converted like a cast from i64.
pub(crate) fn index_value(h: &mut Helpers, ix: Ix, flat: &str, dims: &[usize], axis: usize, d: DType) -> String {
    let c = layout::axis_coord(ix, flat, dims, axis);
    cuda::cast_c(h, DType::I64, d, &format!("((long long){c})"))
}

pub(crate) fn check_store_dtype(cx: &Ctx, body: &Body, s: &Store, d: DType) -> Result<(), CodegenError> {
    let vd = body.dtype(s.value);
    if vd != d {
        return Err(cx.malformed(format!("store of a {vd} expression into a {d} buffer")));
    }
    Ok(())
}
