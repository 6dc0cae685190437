//! Op kernels: one unfused IR op on operands gathered through their accesses.

use graphc_compiler::kernel::{Access, BufferId};
use graphc_ir::interp::eval_op;
use graphc_ir::{infer_type, Op, Tensor, TensorType};

use super::access::{check_read, gather};
use super::{describe, Ctx};

pub(super) fn run(
    ctx: &Ctx,
    op: &Op,
    inputs: &[(Access, TensorType)],
    output: BufferId,
) -> Result<Vec<(BufferId, Tensor)>, String> {
    for (n, (acc, ty)) in inputs.iter().enumerate() {
        let buf = ctx.buffer(acc.buffer)?;
        if buf.ty.dtype != ty.dtype {
            return Err(format!(
                "input {n}: declared {ty} but buffer {} is {}",
                describe(acc.buffer, buf),
                buf.ty
            ));
        }
        check_read(acc, ty.shape.dims(), buf, &format!("input {n}"))?;
        ctx.value(acc.buffer)?;
    }
    let out = ctx.writable(output)?;
    let tys: Vec<&TensorType> = inputs.iter().map(|(_, t)| t).collect();
    let ty = infer_type(op, &tys)?;
    if ty != out.ty {
        return Err(format!(
            "{} gives {ty} but its output {} is {}",
            op.name(),
            describe(output, out),
            out.ty
        ));
    }

    let mut args = Vec::with_capacity(inputs.len());
    for (acc, ty) in inputs {
        args.push(gather(ctx.value(acc.buffer)?, acc, ty.shape.dims())?);
    }
    let refs: Vec<&Tensor> = args.iter().collect();
    let value = eval_op(op, &refs, &out.ty).map_err(|m| format!("{}: {m}", op.name()))?;
    Ok(vec![(output, value)])
}
