//! Convolution kernels: the convolution by the interpreter's own kernel (direct loops
//! over tap tables, `graphc_ir::interp`), then the epilogue body over `[n, o, out..]`.

use graphc_compiler::kernel::{BufferId, ConvKernel, Expr};
use graphc_ir::interp::eval_op;
use graphc_ir::{DType, Tensor, TensorType};

use super::access::gather_strided;
use super::body::{self, Leaves};
use super::Ctx;

struct ConvLeaves<'c, 'p, 'r> {
    ctx: &'c Ctx<'p, 'r>,
    c: &'c ConvKernel,
    space: &'c [usize],
    /// The convolution, computed once.
    value: Option<Tensor>,
}

impl Leaves for ConvLeaves<'_, '_, '_> {
    fn load(&mut self, n: u32) -> Result<Tensor, String> {
        body::load(self.ctx, &self.c.inputs, n, self.space)
    }

    fn gather(&mut self, n: u32, index: &Tensor, stride: i64, extent: u64) -> Result<Tensor, String> {
        body::gather_load(self.ctx, &self.c.inputs, n, self.space, index, stride, extent)
    }

    fn special(&mut self, e: &Expr, dtype: DType, _: &[Option<Tensor>]) -> Result<Tensor, String> {
        if !matches!(e, Expr::Acc) {
            return Err("internal error: not a convolution-kernel expression".into());
        }
        if let Some(v) = &self.value {
            return Ok(v.clone());
        }
        let c = self.c;
        let x = gather_strided(self.ctx.value(c.x.buffer)?, c.x.offset, &c.x.strides, &c.x_dims)?;
        let w = gather_strided(self.ctx.value(c.w.buffer)?, c.w.offset, &c.w.strides, &c.w_dims)?;
        let v = eval_op(&c.op(), &[&x, &w], &TensorType::new(dtype, self.space.to_vec()))
            .map_err(|m| format!("conv: {m}"))?;
        self.value = Some(v.clone());
        Ok(v)
    }
}

pub(super) fn run(ctx: &Ctx, c: &ConvKernel) -> Result<Vec<(BufferId, Tensor)>, String> {
    let space = c.space();
    ctx.value(c.x.buffer)?;
    ctx.value(c.w.buffer)?;
    body::check_bound(ctx, &c.inputs)?;
    let roots: Vec<_> = c.stores.iter().map(|s| s.value).collect();
    let mut leaves = ConvLeaves {
        ctx,
        c,
        space: &space,
        value: None,
    };
    let mut values = body::evaluate(&c.body, &space, &roots, &[], &mut leaves)?;
    let mut out = Vec::with_capacity(c.stores.len());
    body::write_stores(ctx, &c.stores, &mut values, &mut out)?;
    Ok(out)
}
