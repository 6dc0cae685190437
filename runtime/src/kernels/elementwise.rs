//! Elementwise kernels: the body over `space`, then each store.

use graphc_compiler::kernel::{Access, Body, BufferId, Expr, Store};
use graphc_ir::{DType, Tensor};

use super::body::{self, Leaves};
use super::Ctx;

struct Loads<'c, 'p, 'r> {
    ctx: &'c Ctx<'p, 'r>,
    inputs: &'c [Access],
    space: &'c [usize],
}

impl Leaves for Loads<'_, '_, '_> {
    fn load(&mut self, n: u32) -> Result<Tensor, String> {
        body::load(self.ctx, self.inputs, n, self.space)
    }

    fn gather(&mut self, n: u32, index: &Tensor, stride: i64, extent: u64) -> Result<Tensor, String> {
        body::gather_load(self.ctx, self.inputs, n, self.space, index, stride, extent)
    }

    fn special(&mut self, _: &Expr, _: DType, _: &[Option<Tensor>]) -> Result<Tensor, String> {
        Err("internal error: not an elementwise expression".into())
    }
}

pub(super) fn run(
    ctx: &Ctx,
    space: &[usize],
    inputs: &[Access],
    body: &Body,
    stores: &[Store],
) -> Result<Vec<(BufferId, Tensor)>, String> {
    body::check_bound(ctx, inputs)?;

    let roots: Vec<_> = stores.iter().map(|s| s.value).collect();
    let mut values = body::evaluate(body, space, &roots, &[], &mut Loads { ctx, inputs, space })?;
    let mut out = Vec::with_capacity(stores.len());
    body::write_stores(ctx, stores, &mut values, &mut out)?;
    Ok(out)
}
