//! Kernel bodies: evaluation of the expressions a kernel needs, each as a whole tensor
//! over the iteration space, through the interpreter's `eval_op`. The static checks are
//! the kernel IR's verifier ([`graphc_compiler::kernel::verify`]).

use graphc_compiler::kernel::verify::expr_name;
use graphc_compiler::kernel::{Access, Body, BufferId, Expr, ExprId, Stage, Store};
use graphc_ir::interp::eval_op;
use graphc_ir::{DType, Op, Shape, Tensor, TensorType};

use super::access::{gather, scatter};
use super::Ctx;

/// Check that every input of a kernel is readable now (bound, or written by an earlier
/// kernel, with its declared type).
pub(crate) fn check_bound(ctx: &Ctx, inputs: &[Access]) -> Result<(), String> {
    inputs.iter().try_for_each(|acc| ctx.value(acc.buffer).map(|_| ()))
}

/// Gather kernel input `n` over `space`.
pub(crate) fn load(ctx: &Ctx, inputs: &[Access], n: u32, space: &[usize]) -> Result<Tensor, String> {
    let acc = inputs
        .get(n as usize)
        .ok_or_else(|| format!("load of input {n}, which does not exist"))?;
    gather(ctx.value(acc.buffer)?, acc, space)
}

/// An indexed read of kernel input `n` over `space`.
pub(crate) fn gather_load(
    ctx: &Ctx,
    inputs: &[Access],
    n: u32,
    space: &[usize],
    index: &Tensor,
    stride: i64,
    extent: u64,
) -> Result<Tensor, String> {
    let acc = inputs
        .get(n as usize)
        .ok_or_else(|| format!("gather from input {n}, which does not exist"))?;
    super::access::gather_indexed(ctx.value(acc.buffer)?, acc, space, index, stride, extent)
}

/// How to compute the expressions that are not plain ops: loads, stages, the product.
pub(crate) trait Leaves {
    fn load(&mut self, n: u32) -> Result<Tensor, String>;
    /// An indexed read ([`Expr::Gather`]); by default not allowed.
    fn gather(&mut self, _n: u32, _index: &Tensor, _stride: i64, _extent: u64) -> Result<Tensor, String> {
        Err("gather reads are not supported in this kind of kernel".into())
    }
    /// A stage or the product, given the values computed so far.
    fn special(&mut self, e: &Expr, dtype: DType, values: &[Option<Tensor>]) -> Result<Tensor, String>;
}

/// Evaluate the expressions `roots` need over `space`, each as a whole tensor; values
/// not needed by a root or a later expression are dropped as soon as possible.
/// The kernel must have been verified.
pub(crate) fn evaluate(
    body: &Body,
    space: &[usize],
    roots: &[ExprId],
    stages: &[Stage],
    leaves: &mut dyn Leaves,
) -> Result<Vec<Option<Tensor>>, String> {
    let n = body.exprs.len();
    // Needed expressions and the last user of each (usize::MAX for roots).
    let mut needed = vec![false; n];
    let mut last_use = vec![0usize; n];
    for &r in roots {
        if let Some(x) = needed.get_mut(r.index()) {
            *x = true;
            last_use[r.index()] = usize::MAX;
        }
    }
    for i in (0..n).rev() {
        if !needed[i] {
            continue;
        }
        let e = &body.exprs[i].0;
        let mut deps = e.operands();
        if let Expr::Stage(s) = e {
            if let Some(st) = stages.get(s.index()) {
                deps.push(st.value);
            }
        }
        for d in deps {
            if let Some(x) = needed.get_mut(d.index()) {
                *x = true;
                last_use[d.index()] = last_use[d.index()].max(i);
            }
        }
    }

    let mut values: Vec<Option<Tensor>> = vec![None; n];
    for i in 0..n {
        if !needed[i] {
            continue;
        }
        let (e, dt) = &body.exprs[i];
        let ty = TensorType::new(*dt, Shape::new(space));
        let at = |m: String| format!("e{i} ({}): {m}", expr_name(e));
        let arg = |id: ExprId| {
            values
                .get(id.index())
                .and_then(|v| v.as_ref())
                .ok_or_else(|| at(format!("internal error: operand e{id} has no value")))
        };
        let v = match e {
            Expr::Load(k) => leaves.load(k.0).map_err(at)?,
            Expr::Const(t) => eval_op(
                &Op::Broadcast {
                    shape: ty.shape.clone(),
                },
                &[t],
                &ty,
            )
            .map_err(at)?,
            Expr::Index(a) => eval_op(
                &Op::Iota {
                    ty: ty.clone(),
                    axis: *a as usize,
                },
                &[],
                &ty,
            )
            .map_err(at)?,
            Expr::Unary(u, a) => eval_op(&Op::Unary(*u), &[arg(*a)?], &ty).map_err(at)?,
            Expr::Binary(b, x, y) => eval_op(&Op::Binary(*b), &[arg(*x)?, arg(*y)?], &ty).map_err(at)?,
            Expr::Select(c, x, y) => eval_op(&Op::Select, &[arg(*c)?, arg(*x)?, arg(*y)?], &ty).map_err(at)?,
            Expr::Cast(a) => eval_op(&Op::Cast { to: *dt }, &[arg(*a)?], &ty).map_err(at)?,
            Expr::Stage(_) | Expr::Acc => leaves.special(e, *dt, &values).map_err(at)?,
            Expr::Gather {
                input,
                index,
                stride,
                extent,
            } => leaves.gather(input.0, arg(*index)?, *stride, *extent).map_err(at)?,
        };
        if v.ty() != ty {
            return Err(at(format!("internal error: computed {} for {ty}", v.ty())));
        }
        values[i] = Some(v);
        let mut deps = e.operands();
        if let Expr::Stage(s) = e {
            if let Some(st) = stages.get(s.index()) {
                deps.push(st.value);
            }
        }
        for d in deps {
            if last_use[d.index()] == i {
                values[d.index()] = None;
            }
        }
    }
    Ok(values)
}

/// Scatter each store's value into its buffer; values used by one store only are moved.
pub(crate) fn write_stores(
    ctx: &Ctx,
    stores: &[Store],
    values: &mut [Option<Tensor>],
    out: &mut Vec<(BufferId, Tensor)>,
) -> Result<(), String> {
    for (j, st) in stores.iter().enumerate() {
        let later = stores[j + 1..].iter().any(|s| s.value == st.value);
        let slot = values
            .get_mut(st.value.index())
            .ok_or_else(|| format!("store {j}: value e{} does not exist", st.value))?;
        let v = if later { slot.clone() } else { slot.take() };
        let v = v.ok_or_else(|| format!("store {j}: internal error: e{} has no value", st.value))?;
        let buf = ctx.writable(st.access.buffer)?;
        out.push((
            st.access.buffer,
            scatter(v, &st.access, &buf.ty).map_err(|m| format!("store {j}: {m}"))?,
        ));
    }
    Ok(())
}
