//! Writing a row kernel's C from its [`Plan`], stage by stage: the entry and the loop
//! over rows with each access's row base, the row-level expressions, the passes over a
//! row's chunks (the register cache, one pass per stage with its reduction, the element
//! stores) and the row stores.

use graphc_ir::DType;

use super::mode::Mode;
use super::plan::Plan;
use super::reduce::{acc_init, acc_type, across_threads, combine, final_value, red_array};
use crate::codegen::cuda::{self, Writer};
use crate::codegen::elementwise::{index_value, vec_type};
use crate::codegen::layout;
use crate::codegen::prelude::{Helper, Helpers};
use crate::codegen::{CodegenError, Ctx};
use crate::kernel::{Expr, ExprId};

/// How [`Emit::elem_body`] reads a row's values.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Reads {
    /// A pass over the row: inputs and kept values from registers where cached.
    Pass,
    /// One element (a picked stage): every input from memory at `j`.
    Direct,
    /// Computing the kept values where the cache is loaded.
    Fill,
    /// A picked stage's one element, its inputs read before the pass the stores ride
    /// along ([`super::ride`]): `pf<stage>_<input>`.
    Prefetched(usize),
}

/// The kernel being written: its plan, the C so far and the helpers it needs.
pub(super) struct Emit<'p, 'a> {
    cx: &'p Ctx<'p>,
    p: &'p Plan<'a>,
    pub w: Writer,
    pub h: Helpers,
}

impl<'p, 'a> Emit<'p, 'a> {
    pub fn new(cx: &'p Ctx<'p>, p: &'p Plan<'a>) -> Emit<'p, 'a> {
        let mut h = Helpers::new();
        if p.vw > 1 {
            h.need(Helper::Vec);
        }
        Emit {
            cx,
            p,
            w: Writer::new(),
            h,
        }
    }

    /// The comment, the entry, the shared reduction arrays, and the loop over the rows
    /// (left open) with the row base of every access.
    pub fn header(&mut self) {
        let p = self.p;
        let (w, t, ix) = (&mut self.w, p.ix.ty(), p.ix);
        let (rows, n_inner, vpt, vw) = (p.rows, p.n_inner, p.vpt, p.vw);
        w.line(format!(
            "// row kernel: {rows} rows of {n_inner}, {}, {vpt} elements per thread{}{}",
            match p.mode {
                Mode::Warp { lanes: 32 } => "a warp per row".to_string(),
                Mode::Warp { lanes } => format!("{lanes} lanes per row"),
                Mode::Block(_) => "a block per row".to_string(),
                Mode::Columns { cols, .. } => format!(
                    "{cols} adjacent rows per block, {} thread{} along each row",
                    p.tpr,
                    if p.tpr == 1 { "" } else { "s" }
                ),
            },
            if p.cache { ", inputs cached in registers" } else { "" },
            if vw > 1 {
                format!(", vector accesses of {vw} elements")
            } else {
                String::new()
            }
        ));
        w.open(format!(
            "extern \"C\" __global__ void __launch_bounds__({}) {}({})",
            p.block,
            cuda::ENTRY_PLACEHOLDER,
            p.params.c_decl()
        ));
        let mut red_types: Vec<&str> = p.k.stages.iter().map(|s| acc_type(p.k.body.dtype(s.value))).collect();
        red_types.sort();
        red_types.dedup();
        let red_len = match p.mode {
            Mode::Warp { .. } | Mode::Columns { ws: 1, .. } => 0,
            Mode::Block(_) => 32,
            Mode::Columns { cols, ws } => ws * cols,
        };
        if red_len > 0 {
            for rt in &red_types {
                w.line(format!("__shared__ {rt} {}[{red_len}];", red_array(rt)));
            }
        }
        w.line("const int lane = threadIdx.x & 31;");
        w.line("const int warp = threadIdx.x >> 5;");
        let rpb = p.rpb;
        match p.mode {
            Mode::Warp { lanes } => {
                if lanes == 32 {
                    w.line("const int t = lane;");
                    w.open(format!(
                        "for ({t} row = ({t})blockIdx.x * {rpb} + warp; row < {}; row += ({t})gridDim.x * {rpb})",
                        ix.lit(rows as i64)
                    ));
                } else {
                    w.line(format!("const int t = lane % {lanes};"));
                    w.open(format!(
                        "for ({t} row = ({t})blockIdx.x * {rpb} + warp * {} + lane / {lanes}; row < {}; row += ({t})gridDim.x * {rpb})",
                        32 / lanes,
                        ix.lit(rows as i64)
                    ));
                }
            }
            Mode::Block(_) => {
                w.line("const int t = threadIdx.x;");
                w.open(format!(
                    "for ({t} row = blockIdx.x; row < {}; row += gridDim.x)",
                    ix.lit(rows as i64)
                ));
            }
            Mode::Columns { cols, .. } => {
                // Lanes take adjacent rows (contiguous in memory), the lanes of a warp on
                // one row and the warps split each row.
                if cols == 32 {
                    w.line("const int t = warp;");
                } else {
                    w.line(format!("const int t = warp * {} + lane / {cols};", 32 / cols));
                }
                w.open(format!(
                    "for ({t} row = ({t})blockIdx.x * {rpb} + {}; row < {}; row += ({t})gridDim.x * {rpb})",
                    if cols == 32 {
                        "lane".to_string()
                    } else {
                        format!("lane % {cols}")
                    },
                    ix.lit(rows as i64)
                ));
            }
        }
        layout::decompose(w, ix, "row", &p.oc.dims, "o");
        // Row bases of every access.
        let (inputs, n_used) = (p.k.inputs, p.used.len());
        for (pos, &n) in p.used.iter().enumerate() {
            w.line(format!(
                "const {t} ib{n} = {};",
                layout::address(ix, inputs[n].offset, &p.oc.strides[pos], "o")
            ));
        }
        for (i, s) in p.k.stores.iter().enumerate() {
            w.line(format!(
                "const {t} sb{i} = {};",
                layout::address(ix, s.access.offset, &p.oc.strides[n_used + i], "o")
            ));
        }
        for (i, s) in p.k.row_stores.iter().enumerate() {
            w.line(format!(
                "const {t} rb{i} = {};",
                layout::address(ix, s.access.offset, &p.oc.strides[n_used + p.k.stores.len() + i], "o")
            ));
        }
        if p.shift {
            // Every access is as far past a vector boundary at this row: its vectors
            // start h_ elements in.
            let base = match p.elem_inputs.first() {
                Some(n) => format!("ib{n}"),
                None => "sb0".to_string(),
            };
            w.line(format!("const int h_ = (int)(({vw} - {base} % {vw}) % {vw});"));
            w.line(format!("const int nv_ = ({n_inner} - h_) / {vw};"));
        }
    }

    /// The row-level expressions that need exactly the stages up to `after` (None: no
    /// stage), emitted once each when those stages are done.
    pub fn row_exprs(&mut self, after: Option<usize>) -> Result<(), CodegenError> {
        let (p, cx) = (self.p, self.cx);
        let ids: Vec<ExprId> = p
            .live
            .iter()
            .copied()
            .filter(|&id| !p.elem[id.index()] && p.stage_dep[id.index()] == after)
            .collect();
        let mut leaf = |h: &mut Helpers, _id: ExprId, e: &Expr, d: DType| -> Result<String, CodegenError> {
            match e {
                Expr::Load(n) => Ok(cuda::load_conv(h, d, &format!("p{}[ib{n}]", p.in_param[n.index()]))),
                Expr::Index(a) => Ok(index_value(h, p.ix, "row", p.k.outer, *a as usize, d)),
                Expr::Stage(n) => Ok(format!("st{n}")),
                _ => Err(cx.malformed("acc in a row kernel")),
            }
        };
        cuda::emit_exprs(
            cx,
            &mut self.w,
            &mut self.h,
            p.k.body,
            cuda::Exprs {
                ids: &ids,
                stored: &p.stored,
            },
            &|id| p.name(id),
            &mut leaf,
        )
    }

    /// The C name of the chunk index: scalar (`vw == 1`), chunk `j` is element `j`;
    /// vector, chunk `ci` is elements `ci * vw + u`, `u < vw`, moved by one access each.
    fn chunk(&self) -> &'static str {
        if self.p.vw == 1 {
            "j"
        } else {
            "ci"
        }
    }

    /// Open one pass over the row's chunks: unrolled (`cpt` chunks per thread, for the
    /// register cache) or a strided loop.
    fn open_pass(&mut self, unrolled: bool) {
        let p = self.p;
        let (t, chunk, tpr) = (p.ix.ty(), self.chunk(), p.tpr);
        let w = &mut self.w;
        if unrolled {
            w.line("#pragma unroll");
            w.open(format!("for (int v = 0; v < {}; ++v)", p.cpt));
            w.line(format!("const {t} {chunk} = t + v * {tpr};"));
            if !p.n_chunks.is_multiple_of(tpr) {
                w.open(format!("if ({chunk} < {})", p.ix.lit(p.n_chunks as i64)));
            }
        } else {
            let end = if p.shift {
                format!("({t})nv_")
            } else {
                p.ix.lit(p.n_chunks as i64)
            };
            w.open(format!("for ({t} {chunk} = t; {chunk} < {end}; {chunk} += {tpr})"));
        }
    }

    /// Shifted rows: open the loop over a row's elements outside its vectors (the `h_`
    /// before them and those after), element `j`, each read and written by its thread.
    fn open_leftovers(&mut self) {
        let p = self.p;
        let t = p.ix.ty();
        self.w.open(format!(
            "for (int e = t; e < {} - nv_ * {}; e += {})",
            p.n_inner, p.vw, p.tpr
        ));
        self.w
            .line(format!("const {t} j = e < h_ ? ({t})e : ({t})e + ({t})nv_ * {};", p.vw));
    }

    fn close_pass(&mut self, unrolled: bool) {
        if unrolled && !self.p.n_chunks.is_multiple_of(self.p.tpr) {
            self.w.close();
        }
        self.w.close();
    }

    /// Vector mode: open the loop over the elements of a chunk.
    fn open_elems(&mut self) {
        let vw = self.p.vw;
        if vw > 1 {
            self.w.line("#pragma unroll");
            self.w.open(format!("for (int u = 0; u < {vw}; ++u)"));
            self.w.line(format!(
                "const {} j = {}ci * {} + u;",
                self.p.ix.ty(),
                if self.p.shift { "h_ + " } else { "" },
                self.p.ix.lit(vw as i64)
            ));
        }
    }

    fn close_elems(&mut self) {
        if self.p.vw > 1 {
            self.w.close();
        }
    }

    /// Vector mode: `alignas(16) T vx{n}[vw]` loaded with one access.
    fn vector_load(&mut self, n: usize) -> Result<(), CodegenError> {
        let p = self.p;
        let d = self.cx.dtype(p.k.inputs[n].buffer)?;
        let vt = vec_type(p.vw * d.size_bytes());
        let addr = self.p.chunk_addr(&format!("ib{n}"));
        self.w
            .line(format!("alignas(16) {} vx{n}[{}];", cuda::storage_type(d), p.vw));
        self.w
            .line(format!("*({vt}*)vx{n} = *(const {vt}*)(p{} + {addr});", p.in_param[n]));
        Ok(())
    }

    /// The register-cache slot of the current element.
    fn cache_slot(&self) -> String {
        if self.p.vw == 1 {
            "v".to_string()
        } else {
            format!("v * {} + u", self.p.vw)
        }
    }

    /// With the register cache: declare it and load every multi-pass input into it.
    pub fn load_cache(&mut self) -> Result<(), CodegenError> {
        let p = self.p;
        if !p.cache {
            return Ok(());
        }
        for &n in &p.multi_pass {
            let d = self.cx.dtype(p.k.inputs[n].buffer)?;
            self.w.line(format!("{} c{n}[{}];", cuda::reg_type(d), p.vpt));
        }
        for &e in &p.kept.exprs {
            let d = p.k.body.dtype(e);
            self.w.line(format!("{} x{e}[{}];", cuda::reg_type(d), p.vpt));
        }
        // The kept values and everything they are computed from, in order.
        let kept_ids: Vec<ExprId> =
            p.k.body
                .ids()
                .filter(|&i| p.kept.is_inner(i) || p.kept.exprs.contains(&i))
                .collect();
        self.open_pass(true);
        if p.vw > 1 {
            let mut loads: Vec<usize> = p.multi_pass.clone();
            for n in p.k.loads_of(&kept_ids) {
                if p.elem_inputs.contains(&n) && !loads.contains(&n) {
                    loads.push(n);
                }
            }
            for &n in &loads {
                self.vector_load(n)?;
            }
            self.open_elems();
            let slot = self.cache_slot();
            for &n in &p.multi_pass {
                let d = self.cx.dtype(p.k.inputs[n].buffer)?;
                let v = cuda::load_conv(&mut self.h, d, &format!("vx{n}[u]"));
                self.w.line(format!("c{n}[{slot}] = {v};"));
            }
            self.fill_kept(&kept_ids, &slot)?;
            self.close_elems();
        } else {
            layout::decompose(&mut self.w, p.ix, "j", &p.ic.dims, "j");
            for &n in &p.multi_pass {
                let d = self.cx.dtype(p.k.inputs[n].buffer)?;
                let raw = format!("p{}[{}]", p.in_param[n], self.p.inner_addr(n));
                let v = cuda::load_conv(&mut self.h, d, &raw);
                self.w.line(format!("c{n}[v] = {v};"));
            }
            self.fill_kept(&kept_ids, "v")?;
        }
        self.close_pass(true);
        Ok(())
    }

    /// The kept values of the current element, computed (`ids`: them and their
    /// operands) into their slots.
    fn fill_kept(&mut self, ids: &[ExprId], slot: &str) -> Result<(), CodegenError> {
        if self.p.kept.exprs.is_empty() {
            return Ok(());
        }
        self.elem_body(ids, Reads::Fill)?;
        for &e in &self.p.kept.exprs {
            self.w.line(format!("x{e}[{slot}] = {};", self.p.name(e)));
        }
        Ok(())
    }

    /// The vector loads of a pass: its element inputs not in registers.
    fn pass_vector_loads(&mut self, ids: &[ExprId]) -> Result<(), CodegenError> {
        let p = self.p;
        if p.vw > 1 {
            let outside: Vec<ExprId> = ids.iter().copied().filter(|&i| !p.kept.is_inner(i)).collect();
            for n in p.k.loads_of(&outside) {
                if p.elem_inputs.contains(&n) && !p.cached(n) {
                    self.vector_load(n)?;
                }
            }
        }
        Ok(())
    }

    /// The expressions of a pass that vary along the row, for element `j` (`direct`:
    /// every input read from memory at `j`, neither cached nor in a vector chunk).
    fn pass_body(&mut self, ids: &[ExprId], reads: Reads) -> Result<(), CodegenError> {
        layout::decompose(&mut self.w, self.p.ix, "j", &self.p.ic.dims, "j");
        self.elem_body(ids, reads)
    }

    /// The expressions of `ids` that vary along the row, for element `j` (its
    /// coordinates decomposed), reading as `reads` says.
    fn elem_body(&mut self, ids: &[ExprId], reads: Reads) -> Result<(), CodegenError> {
        let (p, cx) = (self.p, self.cx);
        let direct = matches!(reads, Reads::Direct | Reads::Prefetched(_));
        let slot = self.cache_slot();
        let mut elem_ids: Vec<ExprId> = ids.iter().copied().filter(|&id| p.elem[id.index()]).collect();
        if reads == Reads::Pass {
            // Kept values from their registers; what they are made of is not needed.
            elem_ids.retain(|&i| !p.kept.is_inner(i));
            for &e in &p.kept.exprs {
                if elem_ids.contains(&e) {
                    let d = p.k.body.dtype(e);
                    self.w
                        .line(format!("const {} {} = x{e}[{slot}];", cuda::reg_type(d), p.name(e)));
                }
            }
            elem_ids.retain(|i| !p.kept.exprs.contains(i));
        }
        let mut leaf = |h: &mut Helpers, _id: ExprId, e: &Expr, d: DType| -> Result<String, CodegenError> {
            match e {
                Expr::Load(n) => {
                    let n = n.index();
                    if let Reads::Prefetched(q) = reads {
                        Ok(format!("pf{q}_{n}"))
                    } else if p.cached(n) && !direct {
                        Ok(format!("c{n}[{slot}]"))
                    } else if p.vw > 1 && !direct {
                        Ok(cuda::load_conv(h, d, &format!("vx{n}[u]")))
                    } else {
                        Ok(cuda::load_conv(
                            h,
                            d,
                            &format!("p{}[{}]", p.in_param[n], p.inner_addr(n)),
                        ))
                    }
                }
                Expr::Index(a) => Ok(index_value(h, p.ix, "j", p.k.inner, *a as usize - p.ro, d)),
                _ => Err(cx.malformed("stage or acc varying along a row")),
            }
        };
        cuda::emit_exprs(
            cx,
            &mut self.w,
            &mut self.h,
            p.k.body,
            cuda::Exprs {
                ids: &elem_ids,
                stored: &p.stored,
            },
            &|id| p.name(id),
            &mut leaf,
        )
    }

    /// Stage `si`: its pass over the row, the reduction across threads, its result
    /// `st<si>` and the row-level expressions that were waiting for it.
    pub fn stage(&mut self, si: usize) -> Result<(), CodegenError> {
        let p = self.p;
        let Some(stage) = p.k.stages.get(si) else {
            return Ok(());
        };
        let ids = p.passes.get(si).map(Vec::as_slice).unwrap_or_default();
        let d = p.k.body.dtype(stage.value);
        let at = acc_type(d);
        let acc = format!("a{si}");
        let x = if at == cuda::reg_type(d) {
            p.name(stage.value)
        } else {
            format!("({at}){}", p.name(stage.value))
        };
        if let Some(r) = p.picked.get(si).copied().flatten() {
            // One element: `j == r` where the row has it, else the sum is 0.
            let r = p.name(r);
            self.w.line(format!(
                "// stage {si}: {} over the row, one element (j == {r})",
                stage.op.name()
            ));
            self.w.line(format!("{at} {acc} = {};", acc_init(stage.op, d)));
            self.w.open(format!("if ({r} >= 0 && {r} < {})", p.n_inner));
            self.w.line(format!("const {} j = ({}){r};", p.ix.ty(), p.ix.ty()));
            let reads = match &p.ride {
                Some(ride) if ride.prefetch.contains(&si) => Reads::Prefetched(si),
                _ => Reads::Direct,
            };
            self.pass_body(ids, reads)?;
            self.w.line(format!("{acc} = {x};"));
            self.w.close();
            // Every thread of the row has read it before any stores over it (a store
            // may be in place of an input), as a reduction's exchange would order.
            self.row_barrier();
            let fin = final_value(&mut self.h, stage.op, d, &acc, p.n_inner);
            self.w.line(format!("const {} st{si} = {fin};", cuda::reg_type(d)));
            return self.row_exprs(Some(si));
        }
        let rides = p.ride.as_ref().filter(|r| r.pass == si);
        let mut ids = ids.to_vec();
        if let Some(ride) = rides {
            for &q in &ride.prefetch {
                self.prefetch(q)?;
            }
            if !ride.prefetch.is_empty() {
                // Every thread has read before any writes over it (a store may be in place).
                self.row_barrier();
            }
            ids.extend(p.passes.last().map(Vec::as_slice).unwrap_or_default());
            ids.sort();
            ids.dedup();
        }
        self.w.line(format!(
            "// stage {si}: {} over the row{}",
            stage.op.name(),
            if rides.is_some() { ", and the stores" } else { "" }
        ));
        self.w.line(format!("{at} {acc} = {};", acc_init(stage.op, d)));
        self.open_pass(p.cache);
        self.pass_vector_loads(&ids)?;
        if rides.is_some() {
            self.store_chunks()?;
        }
        self.open_elems();
        self.pass_body(&ids, Reads::Pass)?;
        self.w.line(combine(stage.op, d, &acc, &x));
        if rides.is_some() {
            self.store_elems(false)?;
        }
        self.close_elems();
        if rides.is_some() {
            self.write_chunks()?;
        }
        self.close_pass(p.cache);
        if p.shift {
            self.open_leftovers();
            self.pass_body(&ids, Reads::Direct)?;
            self.w.line(combine(stage.op, d, &acc, &x));
            if rides.is_some() {
                self.store_elems(true)?;
            }
            self.w.close();
        }
        across_threads(&mut self.w, p.mode, stage.op, d, &acc);
        let fin = final_value(&mut self.h, stage.op, d, &acc, p.n_inner);
        self.w.line(format!("const {} st{si} = {fin};", cuda::reg_type(d)));
        self.row_exprs(Some(si))
    }

    /// The row stores, by the row's first thread.
    pub fn row_stores(&mut self) -> Result<(), CodegenError> {
        let p = self.p;
        if p.k.row_stores.is_empty() {
            return Ok(());
        }
        self.w.open("if (t == 0)");
        for (i, s) in p.k.row_stores.iter().enumerate() {
            let d = self.cx.dtype(s.access.buffer)?;
            let v = cuda::store_conv(&mut self.h, d, &p.name(s.value));
            self.w.line(format!("p{}[rb{i}] = {v};", p.rs_param[i]));
        }
        self.w.close();
        Ok(())
    }

    /// A barrier over the threads that share a row: the warp's, or the block's.
    fn row_barrier(&mut self) {
        self.w.line(match self.p.mode {
            Mode::Warp { .. } => "__syncwarp();",
            Mode::Block(_) | Mode::Columns { .. } => "__syncthreads();",
        });
    }

    /// Picked stage `q`'s element inputs at its index, read before the pass the stores
    /// ride along into `pf<q>_<input>` (0 where the row has no such element).
    fn prefetch(&mut self, q: usize) -> Result<(), CodegenError> {
        let p = self.p;
        let (Some(Some(r)), Some(ids)) = (p.picked.get(q), p.passes.get(q)) else {
            return Ok(());
        };
        let loads: Vec<usize> =
            p.k.loads_of(ids)
                .into_iter()
                .filter(|n| p.elem_inputs.contains(n))
                .collect();
        let r = p.name(*r);
        for &n in &loads {
            let d = self.cx.dtype(p.k.inputs[n].buffer)?;
            self.w.line(format!("{} pf{q}_{n} = 0;", cuda::reg_type(d)));
        }
        self.w.open(format!("if ({r} >= 0 && {r} < {})", p.n_inner));
        self.w.line(format!("const {} j = ({}){r};", p.ix.ty(), p.ix.ty()));
        layout::decompose(&mut self.w, p.ix, "j", &p.ic.dims, "j");
        for &n in &loads {
            let d = self.cx.dtype(p.k.inputs[n].buffer)?;
            let v = cuda::load_conv(&mut self.h, d, &format!("p{}[{}]", p.in_param[n], p.inner_addr(n)));
            self.w.line(format!("pf{q}_{n} = {v};"));
        }
        self.w.close();
        Ok(())
    }

    /// Vector mode: the chunk arrays `vo<i>` the element stores gather into.
    fn store_chunks(&mut self) -> Result<(), CodegenError> {
        let p = self.p;
        if p.vw > 1 {
            for (i, s) in p.k.stores.iter().enumerate() {
                let d = self.cx.dtype(s.access.buffer)?;
                self.w
                    .line(format!("alignas(16) {} vo{i}[{}];", cuda::storage_type(d), p.vw));
            }
        }
        Ok(())
    }

    /// The last pass: the element stores (vector mode: gathered in `vo<i>` and written
    /// with one access per chunk), unless they ride along a stage's pass.
    pub fn stores(&mut self) -> Result<(), CodegenError> {
        let p = self.p;
        if p.k.stores.is_empty() || p.ride.is_some() {
            return Ok(());
        }
        self.w.line("// stores");
        self.open_pass(p.cache);
        let ids = p.passes.last().map(Vec::as_slice).unwrap_or_default();
        self.pass_vector_loads(ids)?;
        self.store_chunks()?;
        self.open_elems();
        self.pass_body(ids, Reads::Pass)?;
        self.store_elems(false)?;
        self.close_elems();
        self.write_chunks()?;
        self.close_pass(p.cache);
        if p.shift {
            self.open_leftovers();
            self.pass_body(ids, Reads::Direct)?;
            self.store_elems(true)?;
            self.w.close();
        }
        Ok(())
    }

    /// The current element's stores (vector mode, unless `scalar`: into the chunk
    /// arrays).
    fn store_elems(&mut self, scalar: bool) -> Result<(), CodegenError> {
        let p = self.p;
        let vw = if scalar { 1 } else { p.vw };
        for (i, s) in p.k.stores.iter().enumerate() {
            let d = self.cx.dtype(s.access.buffer)?;
            let v = cuda::store_conv(&mut self.h, d, &p.name(s.value));
            if vw > 1 {
                self.w.line(format!("vo{i}[u] = {v};"));
            } else {
                let a = layout::address(p.ix, 0, &p.ic.strides[p.elem_inputs.len() + i], "j");
                self.w.line(format!("p{}[sb{i} + {a}] = {v};", p.st_param[i]));
            }
        }
        Ok(())
    }

    /// Vector mode: the chunk arrays written, one access each.
    fn write_chunks(&mut self) -> Result<(), CodegenError> {
        let p = self.p;
        let vw = p.vw;
        if vw > 1 {
            for (i, s) in p.k.stores.iter().enumerate() {
                let d = self.cx.dtype(s.access.buffer)?;
                let vt = vec_type(vw * d.size_bytes());
                let addr = self.p.chunk_addr(&format!("sb{i}"));
                self.w
                    .line(format!("*({vt}*)(p{} + {addr}) = *(const {vt}*)vo{i};", p.st_param[i]));
            }
        }
        Ok(())
    }
}
