//! Row kernels: stages reduce over the inner dims of `outer ++ inner`, computed in order
//! when first referenced and broadcast back over the row; row stores write per-row
//! values (the value at inner index 0), stores write per-element values.

use graphc_compiler::kernel::verify::stage_op;
use graphc_compiler::kernel::{contiguous_strides, BufferId, Expr};
use graphc_ir::interp::eval_op;
use graphc_ir::{DType, Op, Shape, Tensor, TensorType};

use super::access::{gather_strided, scatter};
use super::body::{self, Leaves};
use super::Ctx;

pub(crate) use graphc_compiler::kernel::RowKernel;

struct RowLeaves<'c, 'p, 'r> {
    ctx: &'c Ctx<'p, 'r>,
    k: &'c RowKernel,
    space: &'c [usize],
    /// Each stage's per-row result (shape `outer ++ [1; inner]`), once computed.
    reduced: Vec<Option<Tensor>>,
}

impl Leaves for RowLeaves<'_, '_, '_> {
    fn load(&mut self, n: u32) -> Result<Tensor, String> {
        body::load(self.ctx, &self.k.inputs, n, self.space)
    }

    fn special(&mut self, e: &Expr, dtype: DType, values: &[Option<Tensor>]) -> Result<Tensor, String> {
        let Expr::Stage(n) = e else {
            return Err("internal error: not a row-kernel expression".into());
        };
        let n = n.index();
        let stage = self
            .k
            .stages
            .get(n)
            .ok_or_else(|| format!("stage {n} does not exist"))?;
        let full = Shape::new(self.space);
        if self.reduced.get(n).is_some_and(|r| r.is_none()) {
            let v = values
                .get(stage.value.index())
                .and_then(|v| v.as_ref())
                .ok_or_else(|| format!("internal error: stage {n}'s value e{} has no value", stage.value))?;
            let mut dims = self.k.outer.to_vec();
            dims.extend(self.k.inner.iter().map(|_| 1));
            let op = stage_op(stage.op, self.k.outer.len(), self.space.len());
            let r = eval_op(&op, &[v], &TensorType::new(dtype, dims)).map_err(|m| format!("stage {n}: {m}"))?;
            self.reduced[n] = Some(r);
        }
        let r = self.reduced[n]
            .as_ref()
            .ok_or_else(|| format!("internal error: stage {n} was not computed"))?;
        eval_op(
            &Op::Broadcast { shape: full.clone() },
            &[r],
            &TensorType::new(dtype, full),
        )
    }
}

pub(super) fn run(ctx: &Ctx, k: &RowKernel) -> Result<Vec<(BufferId, Tensor)>, String> {
    let r = k.outer.len();
    if !k.row_stores.is_empty() && k.inner.contains(&0) && !k.outer.contains(&0) {
        return Err(
            "row stores of empty rows: the inner dims hold no element (fusion makes a reduction \
                    over no elements a kernel of its own)"
                .to_string(),
        );
    }
    let space: Vec<usize> = k.outer.iter().chain(&k.inner).copied().collect();
    body::check_bound(ctx, &k.inputs)?;

    let roots: Vec<_> = k.row_stores.iter().chain(&k.stores).map(|s| s.value).collect();
    let mut leaves = RowLeaves {
        ctx,
        k,
        space: &space,
        reduced: vec![None; k.stages.len()],
    };
    let mut values = body::evaluate(&k.body, &space, &roots, &k.stages, &mut leaves)?;

    let mut out = Vec::with_capacity(k.row_stores.len() + k.stores.len());
    // Row stores: the value at inner index 0 of each row.
    let row_strides = &contiguous_strides(&space)[..r];
    for (j, st) in k.row_stores.iter().enumerate() {
        let v = values
            .get(st.value.index())
            .and_then(|v| v.as_ref())
            .ok_or_else(|| format!("row store {j}: internal error: e{} has no value", st.value))?;
        let row = gather_strided(v, 0, row_strides, &k.outer)?;
        let buf = ctx.writable(st.access.buffer)?;
        out.push((
            st.access.buffer,
            scatter(row, &st.access, &buf.ty).map_err(|m| format!("row store {j}: {m}"))?,
        ));
    }
    body::write_stores(ctx, &k.stores, &mut values, &mut out)?;
    Ok(out)
}
