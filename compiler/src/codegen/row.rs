//! Row kernels: stages of reductions over the inner dims of each row, then per-row and
//! per-element stores.
//!
//! A row is handled by one warp when its inner extent is at most [`WARP_ROW_LIMIT`]
//! (8 rows per 256-thread block), else by one block (128..1024 threads, about 8
//! elements per thread). Thread `t` takes inner elements `t, t + T, t + 2T, ..`, so
//! warps read contiguous runs. Each stage reduces in registers, then across the warp
//! with shuffles, then (block per row) across warps through shared memory; the stages
//! run in order. Expressions that depend only on stages and row-level loads are
//! computed once per row. When the row fits in registers (at most 16 elements per
//! thread) the inputs read by more than one pass are loaded once into registers and
//! reused by every stage and the stores; otherwise each pass reads them again.

use graphc_ir::{DType, ReduceOp};

use super::cuda::{self, Writer};
use super::elementwise::{check_store_dtype, index_value};
use super::layout::{self, Ix};
use super::prelude::Helpers;
use super::{finish, CodegenError, Ctx, CudaKernel, GridSize, LaunchConfig, ParamAccess, Params};
use crate::kernel::{Access, Body, Expr, ExprId, Stage, Store};

/// Rows with at most this many inner elements take one warp each.
pub const WARP_ROW_LIMIT: usize = 512;
/// At most this many elements per thread are kept in registers.
const MAX_CACHED_PER_THREAD: usize = 16;
/// And at most this many registers for cached inputs in all.
const MAX_CACHE_REGS: usize = 64;

pub(crate) struct RowKernel<'a> {
    pub outer: &'a [usize],
    pub inner: &'a [usize],
    pub inputs: &'a [Access],
    pub body: &'a Body,
    pub stages: &'a [Stage],
    pub row_stores: &'a [Store],
    pub stores: &'a [Store],
}

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
    let (outer, inner, inputs, body) = (k.outer, k.inner, k.inputs, k.body);
    let ro = outer.len();
    let rank = ro + inner.len();
    cuda::validate(cx, body, inputs.len(), k.stages.len(), rank, false)?;
    let n_exprs = body.exprs.len();
    for (i, a) in inputs.iter().enumerate() {
        if a.strides.len() != rank {
            return Err(cx.malformed(format!("input {i} has rank {} in a rank-{rank} space", a.strides.len())));
        }
    }
    for (i, s) in k.stores.iter().enumerate() {
        if s.access.strides.len() != rank || s.value as usize >= n_exprs {
            return Err(cx.malformed(format!(
                "store {i} has rank {} or a missing value",
                s.access.strides.len()
            )));
        }
    }
    for (i, s) in k.row_stores.iter().enumerate() {
        if s.access.strides.len() != ro || s.value as usize >= n_exprs {
            return Err(cx.malformed(format!(
                "row store {i} has rank {} or a missing value",
                s.access.strides.len()
            )));
        }
    }
    for (i, s) in k.stages.iter().enumerate() {
        if s.value as usize >= n_exprs {
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
            _ => ops.iter().any(|&o| elem[o as usize]),
        };
        stage_dep[i] = match e {
            Expr::Stage(n) => Some(*n as usize),
            _ => ops.iter().filter_map(|&o| stage_dep[o as usize]).max(),
        };
    }
    for (i, s) in k.stages.iter().enumerate() {
        if stage_dep[s.value as usize].is_some_and(|d| d >= i) {
            return Err(cx.malformed(format!("stage {i} uses its own or a later stage's result")));
        }
    }
    for (i, s) in k.row_stores.iter().enumerate() {
        if elem[s.value as usize] {
            return Err(cx.malformed(format!("row store {i} stores a value that varies along the row")));
        }
    }

    // The passes over the row: one per stage, then the element stores.
    let row_level = |id: ExprId| !elem[id as usize];
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
            .filter_map(|&id| match body.exprs[id as usize].0 {
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
    for s in k.row_stores {
        let d = cx.dtype(s.access.buffer)?;
        check_store_dtype(cx, body, s, d)?;
        rs_param.push(params.add(cx, s.access.buffer, ParamAccess::Write)?);
    }
    let mut st_param = Vec::new();
    for s in k.stores {
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

    // Threads.
    let warp_rows = n_inner <= WARP_ROW_LIMIT;
    let (tpr, block) = if warp_rows {
        (32usize, 256usize)
    } else {
        let b = n_inner.div_ceil(8).next_power_of_two().clamp(128, 1024);
        (b, b)
    };
    let rpb = block / tpr;
    let vpt = n_inner.div_ceil(tpr).max(1);
    let multi_pass: Vec<usize> = elem_inputs
        .iter()
        .copied()
        .filter(|&n| passes.iter().filter(|p| loads_of(p).contains(&n)).count() > 1)
        .collect();
    let cache = !multi_pass.is_empty() && vpt <= MAX_CACHED_PER_THREAD && multi_pass.len() * vpt <= MAX_CACHE_REGS;
    let cached = |n: usize| cache && multi_pass.contains(&n);

    let mut h = Helpers::new();
    let mut w = Writer::new();
    w.line(format!(
        "// row kernel: {rows} rows of {n_inner}, {} per row, {vpt} elements per thread{}",
        if warp_rows { "a warp" } else { "a block" },
        if cache { ", inputs cached in registers" } else { "" }
    ));
    w.open(format!(
        "extern \"C\" __global__ void __launch_bounds__({block}) {}({})",
        cuda::ENTRY_PLACEHOLDER,
        params.c_decl()
    ));
    let mut red_types: Vec<&str> = k.stages.iter().map(|s| acc_type(body.dtype(s.value))).collect();
    red_types.sort();
    red_types.dedup();
    if !warp_rows {
        for rt in &red_types {
            w.line(format!("__shared__ {rt} red_{}[32];", rt.replace(' ', "_")));
        }
    }
    w.line("const int lane = threadIdx.x & 31;");
    if warp_rows {
        w.line("const int warp = threadIdx.x >> 5;");
        w.line("const int t = lane;");
        w.open(format!(
            "for ({t} row = ({t})blockIdx.x * {rpb} + warp; row < {}; row += ({t})gridDim.x * {rpb})",
            ix.lit(rows as i64)
        ));
    } else {
        w.line("const int warp = threadIdx.x >> 5;");
        w.line("const int t = threadIdx.x;");
        w.open(format!(
            "for ({t} row = blockIdx.x; row < {}; row += gridDim.x)",
            ix.lit(rows as i64)
        ));
    }
    layout::decompose(&mut w, ix, "row", &oc.dims, "o");
    // Row bases of every access.
    for (pos, &n) in used.iter().enumerate() {
        w.line(format!(
            "const {t} ib{n} = {};",
            layout::address(ix, inputs[n].offset, &oc.strides[pos], "o")
        ));
    }
    let n_used = used.len();
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
        if elem[id as usize] {
            format!("e{id}")
        } else {
            format!("r{id}")
        }
    };
    let inner_pos = |n: usize| elem_inputs.iter().position(|&m| m == n).unwrap_or(0);
    // Row-level expressions, emitted once each when their stages are done.
    let row_exprs: Vec<ExprId> = live.iter().copied().filter(|&id| !elem[id as usize]).collect();
    let emit_row_exprs = |w: &mut Writer, h: &mut Helpers, after: Option<usize>| -> Result<(), CodegenError> {
        let ids: Vec<ExprId> = row_exprs
            .iter()
            .copied()
            .filter(|&id| stage_dep[id as usize] == after)
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

    // One pass over the row's elements: `pass` emits the body given the element `j`.
    let full = n_inner.is_multiple_of(tpr);
    let open_pass = |w: &mut Writer, unrolled: bool| {
        if unrolled {
            w.line("#pragma unroll");
            w.open(format!("for (int v = 0; v < {vpt}; ++v)"));
            w.line(format!("const {t} j = t + v * {tpr};"));
            if !full {
                w.open(format!("if (j < {})", ix.lit(n_inner as i64)));
            }
        } else {
            w.open(format!("for ({t} j = t; j < {}; j += {tpr})", ix.lit(n_inner as i64)));
        }
    };
    let close_pass = |w: &mut Writer, unrolled: bool| {
        if unrolled && !full {
            w.close();
        }
        w.close();
    };
    let inner_addr = |n: usize| {
        let a = layout::address(ix, 0, &ic.strides[inner_pos(n)], "j");
        format!("ib{n} + {a}")
    };

    if cache {
        for &n in &multi_pass {
            let d = cx.dtype(inputs[n].buffer)?;
            w.line(format!("{} c{n}[{vpt}];", cuda::reg_type(d)));
        }
        open_pass(&mut w, true);
        layout::decompose(&mut w, ix, "j", &ic.dims, "j");
        for &n in &multi_pass {
            let d = cx.dtype(inputs[n].buffer)?;
            let raw = format!("p{}[{}]", in_param[n], inner_addr(n));
            w.line(format!("c{n}[v] = {};", cuda::load_conv(&mut h, d, &raw)));
        }
        close_pass(&mut w, true);
    }

    let emit_pass_body = |w: &mut Writer, h: &mut Helpers, ids: &[ExprId]| -> Result<(), CodegenError> {
        layout::decompose(w, ix, "j", &ic.dims, "j");
        let elem_ids: Vec<ExprId> = ids.iter().copied().filter(|&id| elem[id as usize]).collect();
        let mut leaf = |h: &mut Helpers, _id: ExprId, e: &Expr, d: DType| -> Result<String, CodegenError> {
            match e {
                Expr::Load(n) => {
                    let n = *n as usize;
                    if cached(n) {
                        Ok(format!("c{n}[v]"))
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
        emit_pass_body(&mut w, &mut h, &passes[si])?;
        let x = if at == cuda::reg_type(d) {
            name(stage.value)
        } else {
            format!("({at}){}", name(stage.value))
        };
        w.line(combine(stage.op, d, &format!("a{si}"), &x));
        close_pass(&mut w, cache);
        // Across the warp, then across warps.
        w.line("#pragma unroll");
        w.open("for (int off = 16; off > 0; off >>= 1)");
        w.line(format!("const {at} y = __shfl_xor_sync(0xffffffffu, a{si}, off);"));
        w.line(combine(stage.op, d, &format!("a{si}"), "y"));
        w.close();
        if !warp_rows {
            let red = format!("red_{}", at.replace(' ', "_"));
            w.line(format!("if (lane == 0) {red}[warp] = a{si};"));
            w.line("__syncthreads();");
            w.line(format!("a{si} = {red}[0];"));
            w.open(format!("for (int k = 1; k < {}; ++k)", block / 32));
            w.line(format!("const {at} y = {red}[k];"));
            w.line(combine(stage.op, d, &format!("a{si}"), "y"));
            w.close();
            w.line("__syncthreads();");
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
        emit_pass_body(&mut w, &mut h, &ids)?;
        for (i, s) in k.stores.iter().enumerate() {
            let d = cx.dtype(s.access.buffer)?;
            let v = cuda::store_conv(&mut h, d, &name(s.value));
            let a = layout::address(ix, 0, &ic.strides[elem_inputs.len() + i], "j");
            w.line(format!("p{}[sb{i} + {a}] = {v};", st_param[i]));
        }
        close_pass(&mut w, cache);
    }
    w.close();
    w.close();

    let (source, entry) = finish("row", &h, &w.finish());
    let max_blocks = rows.div_ceil(rpb).min(u32::MAX as usize) as u32;
    Ok(CudaKernel {
        name: String::new(),
        source,
        entry,
        params: params.list,
        launch: LaunchConfig {
            block: block as u32,
            grid: GridSize::PerSm {
                blocks_per_sm: (2048 / block).max(1) as u32,
                max_blocks,
            },
            shared_mem_bytes: 0,
        },
        gemm: None,
    })
}
