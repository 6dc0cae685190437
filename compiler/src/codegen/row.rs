//! Row kernels: stages of reductions over the inner dims of each row, then per-row and
//! per-element stores.
//!
//! Thread mapping ([`Mode`]), chosen at codegen time from the static shapes:
//! - A row is handled by one warp when its inner extent is at most [`WARP_ROW_LIMIT`]
//!   (8 rows per 256-thread block), else by one block of 64..1024 threads (whole warps,
//!   about [`BLOCK_PER_THREAD`] elements per thread, evenly split where possible).
//! - When the reduced axis is strided but neighbouring rows are adjacent in memory
//!   (softmax over the channels of `[B, C, HW]`), the lanes of a warp take 32 adjacent
//!   rows and the warps of the block split each row, so every warp access is coalesced.
//!
//! Thread `t` takes chunks `t, t + T, t + 2T, ..` of the row, so warps read contiguous
//! runs. A chunk is one element, or (the vector path, see [`vector_width`]) 16 bytes of
//! elements moved by one vector load or store when every access varying along the row
//! is contiguous along it, 16-byte aligned at every row start, and the row is whole
//! vectors. Each stage reduces in registers, then across the warp with shuffles, then
//! (block per row, or split rows) across warps through shared memory; the stages run in
//! order. Expressions that depend only on stages and row-level loads are computed once
//! per row. When the row fits in registers (at most [`MAX_CACHED_PER_THREAD`] elements
//! per thread, and a quarter of the registers `__launch_bounds__` leaves a thread) the inputs
//! read by more than one pass are loaded once into registers and reused by every stage
//! and the stores; otherwise each pass reads them again.

use graphc_ir::{DType, ReduceOp};

use super::cuda::{self, Writer};
use super::elementwise::{check_store_dtype, index_value, vec_type};
use super::layout::{self, Ix};
use super::prelude::{Helper, Helpers};
use super::{finish, CodegenError, Ctx, CudaKernel, GridSize, LaunchConfig, ParamAccess, Params};
use crate::kernel::{Access, Expr, ExprId};

/// Rows with at most this many inner elements take one warp each.
pub const WARP_ROW_LIMIT: usize = 512;
/// Block-per-row kernels size the block for about this many elements per thread.
const BLOCK_PER_THREAD: usize = 16;
/// Split rows ([`Mode::Columns`]): about this many elements per thread along a row.
const COLUMN_PER_THREAD: usize = 16;
/// At most this many elements per thread are kept in registers.
const MAX_CACHED_PER_THREAD: usize = 32;
/// And at most this many registers for cached inputs in all.
const MAX_CACHE_REGS: usize = 64;

pub(crate) use crate::kernel::RowKernel;

/// The accumulator C type of a reduction of dtype `d`.
fn acc_type(d: DType) -> &'static str {
    match d {
        DType::F64 => "double",
        d if d.is_float() => "float",
        _ => "long long",
    }
}

fn acc_init(op: ReduceOp, d: DType) -> String {
    let float = d.is_float();
    let f = |x: f64| {
        if d == DType::F64 {
            cuda::f64_lit(x)
        } else {
            cuda::f32_lit(x as f32)
        }
    };
    match op {
        ReduceOp::Sum | ReduceOp::Mean => {
            if float {
                f(0.0)
            } else {
                "0LL".to_string()
            }
        }
        ReduceOp::Prod => {
            if float {
                f(1.0)
            } else {
                "1LL".to_string()
            }
        }
        ReduceOp::Max | ReduceOp::Min => {
            let max = op == ReduceOp::Max;
            if float {
                f(if max { f64::NEG_INFINITY } else { f64::INFINITY })
            } else {
                let (lo, hi) = match d {
                    DType::I32 => (i32::MIN as i64, i32::MAX as i64),
                    DType::I8 => (i8::MIN as i64, i8::MAX as i64),
                    DType::U8 => (0, u8::MAX as i64),
                    _ => (i64::MIN, i64::MAX),
                };
                cuda::i64_lit(if max { lo } else { hi })
            }
        }
    }
}

/// `acc = combine(acc, x)` as a C statement.
fn combine(op: ReduceOp, d: DType, acc: &str, x: &str) -> String {
    let float = d.is_float();
    match op {
        ReduceOp::Sum | ReduceOp::Mean if float => format!("{acc} = {acc} + {x};"),
        ReduceOp::Prod if float => format!("{acc} = {acc} * {x};"),
        ReduceOp::Sum | ReduceOp::Mean => {
            format!("{acc} = (long long)((unsigned long long){acc} + (unsigned long long){x});")
        }
        ReduceOp::Prod => format!("{acc} = (long long)((unsigned long long){acc} * (unsigned long long){x});"),
        ReduceOp::Max if float => format!("if ({x} > {acc} || {x} != {x}) {acc} = {x};"),
        ReduceOp::Min if float => format!("if ({x} < {acc} || {x} != {x}) {acc} = {x};"),
        ReduceOp::Max => format!("if ({x} > {acc}) {acc} = {x};"),
        ReduceOp::Min => format!("if ({x} < {acc}) {acc} = {x};"),
    }
}

pub(crate) fn generate(cx: &Ctx, k: &RowKernel) -> Result<CudaKernel, CodegenError> {
    let (outer, inner, inputs, body) = (&k.outer[..], &k.inner[..], &k.inputs[..], &k.body);
    let ro = outer.len();
    let rank = ro + inner.len();
    let n_exprs = body.exprs.len();
    for (i, a) in inputs.iter().enumerate() {
        if a.strides.len() != rank {
            return Err(cx.malformed(format!("input {i} has rank {} in a rank-{rank} space", a.strides.len())));
        }
    }
    for (i, s) in k.stores.iter().enumerate() {
        if s.access.strides.len() != rank || s.value.index() >= n_exprs {
            return Err(cx.malformed(format!(
                "store {i} has rank {} or a missing value",
                s.access.strides.len()
            )));
        }
    }
    for (i, s) in k.row_stores.iter().enumerate() {
        if s.access.strides.len() != ro || s.value.index() >= n_exprs {
            return Err(cx.malformed(format!(
                "row store {i} has rank {} or a missing value",
                s.access.strides.len()
            )));
        }
    }
    for (i, s) in k.stages.iter().enumerate() {
        if s.value.index() >= n_exprs {
            return Err(cx.malformed(format!("stage {i} of a missing expression")));
        }
        if body.dtype(s.value) == DType::Bool {
            return Err(cx.malformed(format!("stage {i} reduces bool")));
        }
    }

    // Per expression: whether it varies along the row, and the last stage it needs.
    let inner_varies = |a: &Access| a.strides[ro..].iter().zip(inner).any(|(&s, &d)| s != 0 && d > 1);
    let mut elem = vec![false; n_exprs];
    let mut stage_dep: Vec<Option<usize>> = vec![None; n_exprs];
    for (i, (e, _)) in body.exprs.iter().enumerate() {
        let ops = cuda::operands(e);
        elem[i] = match e {
            Expr::Load(n) => inner_varies(&inputs[*n as usize]),
            Expr::Index(a) => *a as usize >= ro,
            _ => ops.iter().any(|&o| elem[o.index()]),
        };
        stage_dep[i] = match e {
            Expr::Stage(n) => Some(*n as usize),
            _ => ops.iter().filter_map(|&o| stage_dep[o.index()]).max(),
        };
    }
    for (i, s) in k.stages.iter().enumerate() {
        if stage_dep[s.value.index()].is_some_and(|d| d >= i) {
            return Err(cx.malformed(format!("stage {i} uses its own or a later stage's result")));
        }
    }
    for (i, s) in k.row_stores.iter().enumerate() {
        if elem[s.value.index()] {
            return Err(cx.malformed(format!("row store {i} stores a value that varies along the row")));
        }
    }

    // The passes over the row: one per stage, then the element stores.
    let row_level = |id: ExprId| !elem[id.index()];
    let mut passes: Vec<Vec<ExprId>> = k
        .stages
        .iter()
        .map(|s| cuda::closure(body, &[s.value], &row_level))
        .collect();
    let store_roots: Vec<ExprId> = k.stores.iter().map(|s| s.value).collect();
    if !k.stores.is_empty() {
        passes.push(cuda::closure(body, &store_roots, &row_level));
    }
    let mut all_roots: Vec<ExprId> = k.stages.iter().map(|s| s.value).collect();
    all_roots.extend(k.row_stores.iter().map(|s| s.value));
    all_roots.extend(&store_roots);
    let live = cuda::closure(body, &all_roots, &|_| false);
    cuda::check_loads(cx, body, &live, inputs)?;
    let loads_of = |ids: &[ExprId]| -> Vec<usize> {
        let mut v: Vec<usize> = ids
            .iter()
            .filter_map(|&id| match body.exprs[id.index()].0 {
                Expr::Load(n) => Some(n as usize),
                _ => None,
            })
            .collect();
        v.sort();
        v.dedup();
        v
    };
    let used = loads_of(&live);
    let elem_inputs: Vec<usize> = used.iter().copied().filter(|&n| inner_varies(&inputs[n])).collect();

    // Parameters.
    let mut params = Params::new();
    let mut in_param = vec![usize::MAX; inputs.len()];
    for &n in &used {
        in_param[n] = params.add(cx, inputs[n].buffer, ParamAccess::Read)?;
    }
    let mut rs_param = Vec::new();
    for s in &k.row_stores {
        let d = cx.dtype(s.access.buffer)?;
        check_store_dtype(cx, body, s, d)?;
        rs_param.push(params.add(cx, s.access.buffer, ParamAccess::Write)?);
    }
    let mut st_param = Vec::new();
    for s in &k.stores {
        let d = cx.dtype(s.access.buffer)?;
        check_store_dtype(cx, body, s, d)?;
        st_param.push(params.add(cx, s.access.buffer, ParamAccess::Write)?);
    }

    // Layout: outer dims collapsed over every access, inner over the element accesses.
    let rows: usize = outer.iter().product();
    let n_inner: usize = inner.iter().product();
    let mut outer_strides: Vec<&[i64]> = used.iter().map(|&n| &inputs[n].strides[..ro]).collect();
    outer_strides.extend(k.stores.iter().map(|s| &s.access.strides[..ro]));
    outer_strides.extend(k.row_stores.iter().map(|s| &s.access.strides[..]));
    let oc = layout::collapse(outer, &outer_strides);
    let mut inner_strides: Vec<&[i64]> = elem_inputs.iter().map(|&n| &inputs[n].strides[ro..]).collect();
    inner_strides.extend(k.stores.iter().map(|s| &s.access.strides[ro..]));
    let ic = layout::collapse(inner, &inner_strides);
    let space: Vec<usize> = outer.iter().chain(inner).copied().collect();
    let mut accs: Vec<(i64, &[i64])> = used
        .iter()
        .map(|&n| (inputs[n].offset, &inputs[n].strides[..]))
        .collect();
    accs.extend(k.stores.iter().map(|s| (s.access.offset, &s.access.strides[..])));
    let ix = Ix::for_space(&space, &accs, 0);
    let ix = Ix {
        wide: ix.wide
            || Ix::for_space(
                outer,
                &k.row_stores
                    .iter()
                    .map(|s| (s.access.offset, &s.access.strides[..]))
                    .collect::<Vec<_>>(),
                0,
            )
            .wide,
    };
    let t = ix.ty();

    // Every access that varies along the row: (dtype, offset, position among the
    // collapsed outer strides, position among the collapsed inner strides).
    let n_used = used.len();
    let mut elem_accs: Vec<(DType, i64, usize, usize)> = Vec::new();
    for (pi, &n) in elem_inputs.iter().enumerate() {
        let po = used.iter().position(|&m| m == n).unwrap_or(0);
        elem_accs.push((cx.dtype(inputs[n].buffer)?, inputs[n].offset, po, pi));
    }
    for (i, s) in k.stores.iter().enumerate() {
        elem_accs.push((
            cx.dtype(s.access.buffer)?,
            s.access.offset,
            n_used + i,
            elem_inputs.len() + i,
        ));
    }
    let vw = vector_width(&elem_accs, n_inner, &oc.strides, &ic);
    let mode = choose_mode(rows, n_inner, vw, &elem_accs, &oc, &ic);
    let (tpr, block, rpb) = match mode {
        Mode::Warp => (32usize, 256usize, 8usize),
        Mode::Block(b) => (b, b, 1),
        Mode::Columns(ws) => (ws, ws * 32, 32),
    };

    // Threads: each takes chunks of `vw` consecutive elements, chunk `t + v * tpr`.
    let n_chunks = n_inner / vw;
    let cpt = n_chunks.div_ceil(tpr).max(1);
    let vpt = cpt * vw;
    let multi_pass: Vec<usize> = elem_inputs
        .iter()
        .copied()
        .filter(|&n| passes.iter().filter(|p| loads_of(p).contains(&n)).count() > 1)
        .collect();
    // A quarter of the registers a thread may have under `__launch_bounds__(block)` at
    // most (1024 threads: 16 per thread, so rows past 16K elements are read per pass).
    let budget = MAX_CACHE_REGS.min((65536 / block).min(255) / 4);
    let cache = !multi_pass.is_empty() && vpt <= MAX_CACHED_PER_THREAD && multi_pass.len() * vpt <= budget;
    let cached = |n: usize| cache && multi_pass.contains(&n);

    let mut h = Helpers::new();
    if vw > 1 {
        h.need(Helper::Vec);
    }
    let mut w = Writer::new();
    w.line(format!(
        "// row kernel: {rows} rows of {n_inner}, {}, {vpt} elements per thread{}{}",
        match mode {
            Mode::Warp => "a warp per row".to_string(),
            Mode::Block(_) => "a block per row".to_string(),
            Mode::Columns(ws) => format!(
                "32 adjacent rows per block, {ws} thread{} along each row",
                if ws == 1 { "" } else { "s" }
            ),
        },
        if cache { ", inputs cached in registers" } else { "" },
        if vw > 1 {
            format!(", vector accesses of {vw} elements")
        } else {
            String::new()
        }
    ));
    w.open(format!(
        "extern \"C\" __global__ void __launch_bounds__({block}) {}({})",
        cuda::ENTRY_PLACEHOLDER,
        params.c_decl()
    ));
    let mut red_types: Vec<&str> = k.stages.iter().map(|s| acc_type(body.dtype(s.value))).collect();
    red_types.sort();
    red_types.dedup();
    let red_len = match mode {
        Mode::Warp | Mode::Columns(1) => 0,
        Mode::Block(_) => 32,
        Mode::Columns(ws) => ws * 32,
    };
    if red_len > 0 {
        for rt in &red_types {
            w.line(format!("__shared__ {rt} red_{}[{red_len}];", rt.replace(' ', "_")));
        }
    }
    w.line("const int lane = threadIdx.x & 31;");
    w.line("const int warp = threadIdx.x >> 5;");
    match mode {
        Mode::Warp => {
            w.line("const int t = lane;");
            w.open(format!(
                "for ({t} row = ({t})blockIdx.x * {rpb} + warp; row < {}; row += ({t})gridDim.x * {rpb})",
                ix.lit(rows as i64)
            ));
        }
        Mode::Block(_) => {
            w.line("const int t = threadIdx.x;");
            w.open(format!(
                "for ({t} row = blockIdx.x; row < {}; row += gridDim.x)",
                ix.lit(rows as i64)
            ));
        }
        Mode::Columns(_) => {
            // Lanes take adjacent rows (contiguous in memory), warps split each row.
            w.line("const int t = warp;");
            w.open(format!(
                "for ({t} row = ({t})blockIdx.x * {rpb} + lane; row < {}; row += ({t})gridDim.x * {rpb})",
                ix.lit(rows as i64)
            ));
        }
    }
    layout::decompose(&mut w, ix, "row", &oc.dims, "o");
    // Row bases of every access.
    for (pos, &n) in used.iter().enumerate() {
        w.line(format!(
            "const {t} ib{n} = {};",
            layout::address(ix, inputs[n].offset, &oc.strides[pos], "o")
        ));
    }
    for (i, s) in k.stores.iter().enumerate() {
        w.line(format!(
            "const {t} sb{i} = {};",
            layout::address(ix, s.access.offset, &oc.strides[n_used + i], "o")
        ));
    }
    for (i, s) in k.row_stores.iter().enumerate() {
        w.line(format!(
            "const {t} rb{i} = {};",
            layout::address(ix, s.access.offset, &oc.strides[n_used + k.stores.len() + i], "o")
        ));
    }

    let name = |id: ExprId| {
        if elem[id.index()] {
            format!("e{id}")
        } else {
            format!("r{id}")
        }
    };
    let inner_pos = |n: usize| elem_inputs.iter().position(|&m| m == n).unwrap_or(0);
    // Row-level expressions, emitted once each when their stages are done.
    let row_exprs: Vec<ExprId> = live.iter().copied().filter(|&id| !elem[id.index()]).collect();
    let emit_row_exprs = |w: &mut Writer, h: &mut Helpers, after: Option<usize>| -> Result<(), CodegenError> {
        let ids: Vec<ExprId> = row_exprs
            .iter()
            .copied()
            .filter(|&id| stage_dep[id.index()] == after)
            .collect();
        let mut leaf = |h: &mut Helpers, _id: ExprId, e: &Expr, d: DType| -> Result<String, CodegenError> {
            match e {
                Expr::Load(n) => Ok(cuda::load_conv(h, d, &format!("p{}[ib{n}]", in_param[*n as usize]))),
                Expr::Index(a) => Ok(index_value(h, ix, "row", outer, *a as usize, d)),
                Expr::Stage(n) => Ok(format!("st{n}")),
                _ => Err(cx.malformed("acc in a row kernel")),
            }
        };
        cuda::emit_exprs(cx, w, h, body, &ids, &name, &mut leaf)
    };
    emit_row_exprs(&mut w, &mut h, None)?;

    // One pass over the row's chunks. Scalar (`vw == 1`): chunk `j` is element `j`.
    // Vector: chunk `ci` is elements `ci * vw + u`, `u < vw`, moved by one access each.
    let full = n_chunks.is_multiple_of(tpr);
    let chunk = if vw == 1 { "j" } else { "ci" };
    let open_pass = |w: &mut Writer, unrolled: bool| {
        if unrolled {
            w.line("#pragma unroll");
            w.open(format!("for (int v = 0; v < {cpt}; ++v)"));
            w.line(format!("const {t} {chunk} = t + v * {tpr};"));
            if !full {
                w.open(format!("if ({chunk} < {})", ix.lit(n_chunks as i64)));
            }
        } else {
            w.open(format!(
                "for ({t} {chunk} = t; {chunk} < {}; {chunk} += {tpr})",
                ix.lit(n_chunks as i64)
            ));
        }
    };
    let close_pass = |w: &mut Writer, unrolled: bool| {
        if unrolled && !full {
            w.close();
        }
        w.close();
    };
    // Vector mode: the elements of a chunk.
    let open_elems = |w: &mut Writer| {
        if vw > 1 {
            w.line("#pragma unroll");
            w.open(format!("for (int u = 0; u < {vw}; ++u)"));
            w.line(format!("const {t} j = ci * {} + u;", ix.lit(vw as i64)));
        }
    };
    let close_elems = |w: &mut Writer| {
        if vw > 1 {
            w.close();
        }
    };
    let inner_addr = |n: usize| {
        let a = layout::address(ix, 0, &ic.strides[inner_pos(n)], "j");
        format!("ib{n} + {a}")
    };
    let chunk_addr = |base: &str| format!("{base} + ci * {}", ix.lit(vw as i64));
    // Vector mode: `alignas(16) T vx{n}[vw]` loaded with one access.
    let vector_load = |w: &mut Writer, n: usize| -> Result<(), CodegenError> {
        let d = cx.dtype(inputs[n].buffer)?;
        let vt = vec_type(vw * d.size_bytes());
        w.line(format!("alignas(16) {} vx{n}[{vw}];", cuda::storage_type(d)));
        w.line(format!(
            "*({vt}*)vx{n} = *(const {vt}*)(p{} + {});",
            in_param[n],
            chunk_addr(&format!("ib{n}"))
        ));
        Ok(())
    };
    let cache_slot = if vw == 1 {
        "v".to_string()
    } else {
        format!("v * {vw} + u")
    };

    if cache {
        for &n in &multi_pass {
            let d = cx.dtype(inputs[n].buffer)?;
            w.line(format!("{} c{n}[{vpt}];", cuda::reg_type(d)));
        }
        open_pass(&mut w, true);
        if vw > 1 {
            for &n in &multi_pass {
                vector_load(&mut w, n)?;
            }
            w.line("#pragma unroll");
            w.open(format!("for (int u = 0; u < {vw}; ++u)"));
            for &n in &multi_pass {
                let d = cx.dtype(inputs[n].buffer)?;
                w.line(format!(
                    "c{n}[{cache_slot}] = {};",
                    cuda::load_conv(&mut h, d, &format!("vx{n}[u]"))
                ));
            }
            w.close();
        } else {
            layout::decompose(&mut w, ix, "j", &ic.dims, "j");
            for &n in &multi_pass {
                let d = cx.dtype(inputs[n].buffer)?;
                let raw = format!("p{}[{}]", in_param[n], inner_addr(n));
                w.line(format!("c{n}[v] = {};", cuda::load_conv(&mut h, d, &raw)));
            }
        }
        close_pass(&mut w, true);
    }

    // The vector loads of a pass: its element inputs not in registers.
    let pass_vector_loads = |w: &mut Writer, ids: &[ExprId]| -> Result<(), CodegenError> {
        if vw > 1 {
            for n in loads_of(ids) {
                if elem_inputs.contains(&n) && !cached(n) {
                    vector_load(w, n)?;
                }
            }
        }
        Ok(())
    };
    let emit_pass_body = |w: &mut Writer, h: &mut Helpers, ids: &[ExprId]| -> Result<(), CodegenError> {
        layout::decompose(w, ix, "j", &ic.dims, "j");
        let elem_ids: Vec<ExprId> = ids.iter().copied().filter(|&id| elem[id.index()]).collect();
        let mut leaf = |h: &mut Helpers, _id: ExprId, e: &Expr, d: DType| -> Result<String, CodegenError> {
            match e {
                Expr::Load(n) => {
                    let n = *n as usize;
                    if cached(n) {
                        Ok(format!("c{n}[{cache_slot}]"))
                    } else if vw > 1 {
                        Ok(cuda::load_conv(h, d, &format!("vx{n}[u]")))
                    } else {
                        Ok(cuda::load_conv(h, d, &format!("p{}[{}]", in_param[n], inner_addr(n))))
                    }
                }
                Expr::Index(a) => {
                    let a = *a as usize;
                    Ok(index_value(h, ix, "j", inner, a - ro, d))
                }
                _ => Err(cx.malformed("stage or acc varying along a row")),
            }
        };
        cuda::emit_exprs(cx, w, h, body, &elem_ids, &name, &mut leaf)
    };

    for (si, stage) in k.stages.iter().enumerate() {
        let d = body.dtype(stage.value);
        let at = acc_type(d);
        w.line(format!("// stage {si}: {} over the row", stage.op.name()));
        w.line(format!("{at} a{si} = {};", acc_init(stage.op, d)));
        open_pass(&mut w, cache);
        pass_vector_loads(&mut w, &passes[si])?;
        open_elems(&mut w);
        emit_pass_body(&mut w, &mut h, &passes[si])?;
        let x = if at == cuda::reg_type(d) {
            name(stage.value)
        } else {
            format!("({at}){}", name(stage.value))
        };
        w.line(combine(stage.op, d, &format!("a{si}"), &x));
        close_elems(&mut w);
        close_pass(&mut w, cache);
        let red = format!("red_{}", at.replace(' ', "_"));
        match mode {
            Mode::Warp | Mode::Block(_) => {
                // Across the warp, then across warps.
                w.line("#pragma unroll");
                w.open("for (int off = 16; off > 0; off >>= 1)");
                w.line(format!("const {at} y = __shfl_xor_sync(0xffffffffu, a{si}, off);"));
                w.line(combine(stage.op, d, &format!("a{si}"), "y"));
                w.close();
                if let Mode::Block(b) = mode {
                    w.line(format!("if (lane == 0) {red}[warp] = a{si};"));
                    w.line("__syncthreads();");
                    w.line(format!("a{si} = {red}[0];"));
                    w.open(format!("for (int k = 1; k < {}; ++k)", b / 32));
                    w.line(format!("const {at} y = {red}[k];"));
                    w.line(combine(stage.op, d, &format!("a{si}"), "y"));
                    w.close();
                    w.line("__syncthreads();");
                }
            }
            Mode::Columns(1) => {}
            Mode::Columns(ws) => {
                // Across the warps sharing the row (same lane), in warp order.
                w.line(format!("{red}[warp * 32 + lane] = a{si};"));
                w.line("__syncthreads();");
                w.line(format!("a{si} = {red}[lane];"));
                w.line("#pragma unroll");
                w.open(format!("for (int k = 1; k < {ws}; ++k)"));
                w.line(format!("const {at} y = {red}[k * 32 + lane];"));
                w.line(combine(stage.op, d, &format!("a{si}"), "y"));
                w.close();
                w.line("__syncthreads();");
            }
        }
        let mut fin = format!("a{si}");
        if stage.op == ReduceOp::Mean {
            fin = if d.is_float() {
                let n = if d == DType::F64 {
                    cuda::f64_lit(n_inner as f64)
                } else {
                    cuda::f32_lit(n_inner as f32)
                };
                format!("({fin} / {n})")
            } else if n_inner == 0 {
                "0LL".to_string()
            } else {
                format!("({fin} / {}LL)", n_inner)
            };
        }
        let fin = match d {
            DType::F16 | DType::BF16 => cuda::cast_c(&mut h, DType::F32, d, &fin),
            d if d.is_int() => format!("(({}){fin})", cuda::reg_type(d)),
            _ => fin,
        };
        w.line(format!("const {} st{si} = {fin};", cuda::reg_type(d)));
        emit_row_exprs(&mut w, &mut h, Some(si))?;
    }

    if !k.row_stores.is_empty() {
        w.open("if (t == 0)");
        for (i, s) in k.row_stores.iter().enumerate() {
            let d = cx.dtype(s.access.buffer)?;
            let v = cuda::store_conv(&mut h, d, &name(s.value));
            w.line(format!("p{}[rb{i}] = {v};", rs_param[i]));
        }
        w.close();
    }
    if !k.stores.is_empty() {
        w.line("// stores");
        open_pass(&mut w, cache);
        let ids = passes.last().cloned().unwrap_or_default();
        pass_vector_loads(&mut w, &ids)?;
        if vw > 1 {
            for (i, s) in k.stores.iter().enumerate() {
                let d = cx.dtype(s.access.buffer)?;
                w.line(format!("alignas(16) {} vo{i}[{vw}];", cuda::storage_type(d)));
            }
        }
        open_elems(&mut w);
        emit_pass_body(&mut w, &mut h, &ids)?;
        for (i, s) in k.stores.iter().enumerate() {
            let d = cx.dtype(s.access.buffer)?;
            let v = cuda::store_conv(&mut h, d, &name(s.value));
            if vw > 1 {
                w.line(format!("vo{i}[u] = {v};"));
            } else {
                let a = layout::address(ix, 0, &ic.strides[elem_inputs.len() + i], "j");
                w.line(format!("p{}[sb{i} + {a}] = {v};", st_param[i]));
            }
        }
        close_elems(&mut w);
        if vw > 1 {
            for (i, s) in k.stores.iter().enumerate() {
                let d = cx.dtype(s.access.buffer)?;
                let vt = vec_type(vw * d.size_bytes());
                w.line(format!(
                    "*({vt}*)(p{} + {}) = *(const {vt}*)vo{i};",
                    st_param[i],
                    chunk_addr(&format!("sb{i}"))
                ));
            }
        }
        close_pass(&mut w, cache);
    }
    w.close();
    w.close();

    let (source, entry) = finish("row", &h, &w.finish());
    // A block per row (group of rows), not a grid that fits the device: how many blocks
    // an SM holds depends on the registers ptxas gives the kernel, and a grid-stride
    // loop over a grid larger than what is resident leaves a tail running on part of the
    // device. `blocks_per_sm = max_blocks` gives `max_blocks` blocks on any device (the
    // loop still strides, for grids past the launch limit).
    let max_blocks = rows.div_ceil(rpb).min(i32::MAX as usize) as u32;
    Ok(CudaKernel {
        name: String::new(),
        source,
        entry,
        params: params.list,
        launch: LaunchConfig {
            block: block as u32,
            grid: GridSize::PerSm {
                blocks_per_sm: max_blocks.max(1),
                max_blocks,
            },
            shared_mem_bytes: 0,
        },
        gemm: None,
    })
}

/// How threads map to rows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    /// A warp per row, 8 rows per 256-thread block.
    Warp,
    /// A block of this many threads (a multiple of 32) per row.
    Block(usize),
    /// 32 adjacent rows per block, one per lane, and this many warps splitting each row
    /// (the reduced axis is strided, the rows' elements adjacent: coalesced).
    Columns(usize),
}

/// The thread mapping for `rows` rows of `n_inner` elements moved `vw` at a time
/// ([`vector_width`]; the split-row mode is never vectorized). `elem` lists the accesses
/// varying along the row as `(dtype, offset, outer position, inner position)`.
fn choose_mode(
    rows: usize,
    n_inner: usize,
    vw: usize,
    elem: &[(DType, i64, usize, usize)],
    oc: &layout::Collapsed,
    ic: &layout::Collapsed,
) -> Mode {
    // Columns: the innermost outer dim steps every access by 0 or 1 element (some
    // varying access by 1), while no varying access is contiguous along the row.
    let columns = match oc.dims.len().checked_sub(1) {
        Some(l) if rows.is_multiple_of(32) && n_inner > 1 && oc.dims[l] >= 32 && !elem.is_empty() => {
            oc.strides.iter().all(|s| s[l] == 0 || s[l] == 1)
                && elem.iter().any(|&(_, _, po, _)| oc.strides[po][l] == 1)
                && elem
                    .iter()
                    .all(|&(_, _, _, pi)| ic.strides[pi].last().is_some_and(|s| s.unsigned_abs() != 1))
        }
        _ => false,
    };
    if columns {
        Mode::Columns(n_inner.div_ceil(COLUMN_PER_THREAD).next_power_of_two().clamp(1, 16))
    } else if n_inner <= WARP_ROW_LIMIT {
        Mode::Warp
    } else {
        // About BLOCK_PER_THREAD elements per thread, then as few threads as give each
        // the same number of chunks (in whole warps), so few threads idle.
        let n_chunks = n_inner / vw;
        let target = (BLOCK_PER_THREAD / vw).max(1);
        let threads = n_chunks.div_ceil(target).next_multiple_of(32).clamp(64, 1024);
        let cpt = n_chunks.div_ceil(threads);
        Mode::Block(n_chunks.div_ceil(cpt).next_multiple_of(32).clamp(64, 1024))
    }
}

/// Elements per vector access (16 bytes of the widest type), or 1: every access varying
/// along the row must read it as one contiguous run (stride 1), start every row at a
/// multiple of the width (offset and outer strides), and the row must be whole vectors.
fn vector_width(
    elem: &[(DType, i64, usize, usize)],
    n_inner: usize,
    outer: &[Vec<i64>],
    ic: &layout::Collapsed,
) -> usize {
    let Some(max_size) = elem.iter().map(|e| e.0.size_bytes()).max() else {
        return 1;
    };
    let v = 16 / max_size.clamp(1, 16);
    let ok = v > 1
        && ic.dims.len() == 1
        && n_inner >= v
        && n_inner.is_multiple_of(v)
        && elem.iter().all(|&(_, off, po, pi)| {
            ic.strides[pi] == [1]
                && off.rem_euclid(v as i64) == 0
                && outer[po].iter().all(|s| s.rem_euclid(v as i64) == 0)
        });
    if ok {
        v
    } else {
        1
    }
}
