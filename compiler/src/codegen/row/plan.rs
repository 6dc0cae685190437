//! What a row kernel's code is generated from: the kernel checked, each expression
//! classified (row-level or varying along the row, the last stage it needs), the passes
//! over the row, the parameters, the collapsed layout, and the thread mapping, vector
//! width and register cache chosen for it.

use graphc_ir::DType;

use super::mode::{choose_mode, shifted_width, vector_width, Mode};
use super::pick::picked_index;
use super::ride::{store_pass, Classified, Ride};
use super::xcache::{kept_exprs, Kept};
use super::{RowFields, MAX_CACHED_PER_THREAD, MAX_CACHE_REGS};
use crate::codegen::elementwise::check_store_dtype;
use crate::codegen::layout::{self, Collapsed, Ix};
use crate::codegen::{cuda, CodegenError, Ctx, ParamAccess, Params};
use crate::kernel::{Access, Expr, ExprId};

/// A checked row kernel with every decision its code depends on.
pub(super) struct Plan<'a> {
    pub k: RowFields<'a>,
    /// The number of outer (row) dims.
    pub ro: usize,
    /// Per expression: whether it varies along the row.
    pub elem: Vec<bool>,
    /// Per expression: the last stage it needs, if any.
    pub stage_dep: Vec<Option<usize>>,
    /// The expressions of each pass over the row: one per stage, then the element stores.
    pub passes: Vec<Vec<ExprId>>,
    /// Every expression a stage or store needs.
    pub live: Vec<ExprId>,
    /// The values of the element and row stores.
    pub stored: Vec<ExprId>,
    /// The inputs read, and of them those that vary along the row.
    pub used: Vec<usize>,
    pub elem_inputs: Vec<usize>,
    pub params: Params,
    /// The parameter of each input (of those used), row store and store.
    pub in_param: Vec<usize>,
    pub rs_param: Vec<usize>,
    pub st_param: Vec<usize>,
    pub rows: usize,
    pub n_inner: usize,
    /// Outer dims collapsed over every access (used inputs, stores, row stores), inner
    /// dims over the element accesses (element inputs, stores).
    pub oc: Collapsed,
    pub ic: Collapsed,
    pub ix: Ix,
    pub mode: Mode,
    /// Threads per row, threads per block, rows per block.
    pub tpr: usize,
    pub block: usize,
    pub rpb: usize,
    /// Elements per chunk (vector width), chunks per row, chunks and elements per thread.
    pub vw: usize,
    /// Rows start anywhere ([`shifted_width`]): the vectors of a row begin at its
    /// `h_`-th element (the first at a multiple of `vw`), `nv_` of them; the `h_` before
    /// and the rest after go element by element.
    pub shift: bool,
    pub n_chunks: usize,
    pub cpt: usize,
    pub vpt: usize,
    /// The element inputs read by more than one pass, and whether they are kept in
    /// registers.
    pub multi_pass: Vec<usize>,
    pub cache: bool,
    /// Per stage: the row-level index of the one element it sums, when it picks one
    /// ([`super::pick`]): no pass over the row.
    pub picked: Vec<Option<ExprId>>,
    /// Values kept in registers across the passes ([`super::xcache`]), with the cache.
    pub kept: Kept,
    /// The stage whose pass writes the element stores, when not a pass of their own
    /// ([`super::ride`]).
    pub ride: Option<Ride>,
}

impl<'a> Plan<'a> {
    pub fn new(cx: &Ctx, k: RowFields<'a>) -> Result<Plan<'a>, CodegenError> {
        check_ranks(cx, k)?;
        let ro = k.outer.len();
        let (elem, stage_dep) = classify(cx, k)?;

        let row_level = |id: ExprId| !elem[id.index()];
        let mut passes: Vec<Vec<ExprId>> = k
            .stages
            .iter()
            .map(|s| cuda::closure(k.body, &[s.value], &row_level))
            .collect();
        let store_roots: Vec<ExprId> = k.stores.iter().map(|s| s.value).collect();
        if !k.stores.is_empty() {
            passes.push(cuda::closure(k.body, &store_roots, &row_level));
        }
        let mut all_roots: Vec<ExprId> = k.stages.iter().map(|s| s.value).collect();
        all_roots.extend(k.row_stores.iter().map(|s| s.value));
        all_roots.extend(&store_roots);
        let live = cuda::closure(k.body, &all_roots, &|_| false);
        cuda::check_loads(cx, k.body, &live, k.inputs)?;
        let used = k.loads_of(&live);
        let elem_inputs: Vec<usize> = used.iter().copied().filter(|&n| k.inner_varies(&k.inputs[n])).collect();

        let mut params = Params::new();
        let mut in_param = vec![usize::MAX; k.inputs.len()];
        for &n in &used {
            in_param[n] = params.add(cx, k.inputs[n].buffer, ParamAccess::Read)?;
        }
        let mut rs_param = Vec::new();
        for s in k.row_stores {
            check_store_dtype(cx, k.body, s, cx.dtype(s.access.buffer)?)?;
            rs_param.push(params.add(cx, s.access.buffer, ParamAccess::Write)?);
        }
        let mut st_param = Vec::new();
        for s in k.stores {
            check_store_dtype(cx, k.body, s, cx.dtype(s.access.buffer)?)?;
            st_param.push(params.add(cx, s.access.buffer, ParamAccess::Write)?);
        }

        let (oc, ic, ix) = collapse(k, &used, &elem_inputs);
        let rows: usize = k.outer.iter().product();
        let n_inner: usize = k.inner.iter().product();

        // Every access that varies along the row: (dtype, offset, position among the
        // collapsed outer strides, position among the collapsed inner strides).
        let n_used = used.len();
        let mut elem_accs: Vec<(DType, i64, usize, usize)> = Vec::new();
        for (pi, &n) in elem_inputs.iter().enumerate() {
            let po = used.iter().position(|&m| m == n).unwrap_or(0);
            elem_accs.push((cx.dtype(k.inputs[n].buffer)?, k.inputs[n].offset, po, pi));
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
        let (tpr, block, rpb) = mode.shape();

        // Threads: each takes chunks of `vw` consecutive elements, chunk `t + v * tpr`.
        let n_chunks = n_inner / vw;
        let cpt = n_chunks.div_ceil(tpr).max(1);
        let vpt = cpt * vw;
        let picked: Vec<Option<ExprId>> = k.stages.iter().map(|s| picked_index(k, &elem, s)).collect();
        // Passes over the row (a picked stage reads one element).
        let counted: Vec<bool> = (0..passes.len())
            .map(|i| picked.get(i).is_none_or(Option::is_none))
            .collect();
        let stored: Vec<ExprId> = k.stores.iter().chain(k.row_stores).map(|s| s.value).collect();
        // The inputs two or more passes load (not counting loads inside kept values).
        let multi = |inner: &[bool]| -> Vec<usize> {
            elem_inputs
                .iter()
                .copied()
                .filter(|&n| {
                    let reads = |(p, &c): &(&Vec<ExprId>, &bool)| {
                        let outside: Vec<ExprId> = p
                            .iter()
                            .copied()
                            .filter(|x| !inner.get(x.index()).copied().unwrap_or(false))
                            .collect();
                        c && k.loads_of(&outside).contains(&n)
                    };
                    passes.iter().zip(&counted).filter(reads).count() > 1
                })
                .collect()
        };
        // A quarter of the registers a thread may have under `__launch_bounds__(block)` at
        // most (1024 threads: 16 per thread, so rows past 16K elements are read per pass).
        let budget = MAX_CACHE_REGS.min((65536 / block).min(255) / 4);
        let fits = |m: usize| m > 0 && vpt <= MAX_CACHED_PER_THREAD && m * vpt <= budget;
        let kept = kept_exprs(k, &elem, &stage_dep, &passes, &counted, &stored);
        let with_kept = multi(&kept.inner);
        let (multi_pass, kept) = if !kept.exprs.is_empty() && fits(with_kept.len() + kept.exprs.len()) {
            (with_kept, kept)
        } else {
            (multi(&[]), Kept::none(k.body.exprs.len()))
        };
        let cache = fits(multi_pass.len() + kept.exprs.len());
        let kept = if cache { kept } else { Kept::none(k.body.exprs.len()) };
        // Rows read per pass, not vector-aligned (an odd vocabulary): shifted vectors.
        let shifted = (vw == 1 && !cache).then(|| shifted_width(&elem_accs, n_inner, &oc.strides, &ic));
        let (vw, shift) = shifted.filter(|&v| v > 1).map_or((vw, false), |v| (v, true));
        let n_chunks = n_inner / vw;
        // With the register cache a pass reads registers: the stores keep their own.
        let c = Classified {
            stage_dep: &stage_dep,
            passes: &passes,
            picked: &picked,
        };
        let ride = if cache { None } else { store_pass(cx, k, &c)? };
        Ok(Plan {
            k,
            ro,
            elem,
            stage_dep,
            passes,
            live,
            stored,
            used,
            elem_inputs,
            params,
            in_param,
            rs_param,
            st_param,
            rows,
            n_inner,
            oc,
            ic,
            ix,
            mode,
            tpr,
            block,
            rpb,
            vw,
            shift,
            n_chunks,
            cpt,
            vpt,
            multi_pass,
            cache,
            picked,
            kept,
            ride,
        })
    }

    /// Whether element input `n` is kept in registers.
    pub fn cached(&self, n: usize) -> bool {
        self.cache && self.multi_pass.contains(&n)
    }

    /// The position of element input `n` among the collapsed inner strides.
    fn inner_pos(&self, n: usize) -> usize {
        self.elem_inputs.iter().position(|&m| m == n).unwrap_or(0)
    }

    /// The address of element `j` of element input `n`.
    pub fn inner_addr(&self, n: usize) -> String {
        let a = layout::address(self.ix, 0, &self.ic.strides[self.inner_pos(n)], "j");
        format!("ib{n} + {a}")
    }

    /// The address of chunk `ci` from a row base.
    pub fn chunk_addr(&self, base: &str) -> String {
        let shift = if self.shift { " + h_" } else { "" };
        format!("{base}{shift} + ci * {}", self.ix.lit(self.vw as i64))
    }

    /// The C name of an expression's value: `e<id>` varying along the row, `r<id>` not.
    pub fn name(&self, id: ExprId) -> String {
        if self.elem[id.index()] {
            format!("e{id}")
        } else {
            format!("r{id}")
        }
    }
}

impl RowFields<'_> {
    /// Whether an access varies along the row.
    fn inner_varies(&self, a: &Access) -> bool {
        let ro = self.outer.len();
        a.strides[ro..].iter().zip(self.inner).any(|(&s, &d)| s != 0 && d > 1)
    }

    /// The inputs loaded by the expressions `ids`, sorted, each once.
    pub(super) fn loads_of(&self, ids: &[ExprId]) -> Vec<usize> {
        let mut v: Vec<usize> = ids
            .iter()
            .filter_map(|&id| match self.body.exprs[id.index()].0 {
                Expr::Load(n) => Some(n.index()),
                _ => None,
            })
            .collect();
        v.sort();
        v.dedup();
        v
    }
}

/// Check the body, and that every access has the rank of its space and every store and
/// stage a value of the body (stages of something else than bool).
fn check_ranks(cx: &Ctx, k: RowFields) -> Result<(), CodegenError> {
    let ro = k.outer.len();
    let rank = ro + k.inner.len();
    let n_exprs = k.body.exprs.len();
    for (i, a) in k.inputs.iter().enumerate() {
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
        if k.body.dtype(s.value) == DType::Bool {
            return Err(cx.malformed(format!("stage {i} reduces bool")));
        }
    }
    Ok(())
}

/// Per expression: whether it varies along the row, and the last stage it needs. Stages
/// may only use earlier stages, row stores only row-level values.
type Classes = (Vec<bool>, Vec<Option<usize>>);

fn classify(cx: &Ctx, k: RowFields) -> Result<Classes, CodegenError> {
    let ro = k.outer.len();
    let n_exprs = k.body.exprs.len();
    let mut elem = vec![false; n_exprs];
    let mut stage_dep: Vec<Option<usize>> = vec![None; n_exprs];
    for (i, (e, _)) in k.body.exprs.iter().enumerate() {
        let ops = cuda::operands(e);
        elem[i] = match e {
            Expr::Load(n) => k.inner_varies(&k.inputs[n.index()]),
            Expr::Index(a) => *a as usize >= ro,
            _ => ops.iter().any(|&o| elem[o.index()]),
        };
        stage_dep[i] = match e {
            Expr::Stage(n) => Some(n.index()),
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
    Ok((elem, stage_dep))
}

/// The collapsed outer and inner layouts, and the index type of every access (row
/// stores over the outer dims).
fn collapse(k: RowFields, used: &[usize], elem_inputs: &[usize]) -> (Collapsed, Collapsed, Ix) {
    let (ro, outer, inner, inputs) = (k.outer.len(), k.outer, k.inner, k.inputs);
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
    let row_accs: Vec<(i64, &[i64])> = k
        .row_stores
        .iter()
        .map(|s| (s.access.offset, &s.access.strides[..]))
        .collect();
    let ix = Ix {
        wide: ix.wide || Ix::for_space(outer, &row_accs, 0).wide,
    };
    (oc, ic, ix)
}
