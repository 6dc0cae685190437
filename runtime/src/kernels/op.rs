//! Op kernels: one unfused IR op on operands gathered through their accesses (by the
//! interpreter's `eval_op`; attention by the tiled kernel of `attention.rs`).

use graphc_compiler::kernel::{Access, BufferId};
use graphc_ir::interp::eval_op;
use graphc_ir::{Op, Tensor, TensorType};

use super::access::gather;
use super::Ctx;

pub(super) fn run(
    ctx: &Ctx,
    op: &Op,
    inputs: &[(Access, TensorType)],
    output: BufferId,
) -> Result<Vec<(BufferId, Tensor)>, String> {
    if let Op::Attention {
        scale,
        causal,
        zero_masked_rows,
    } = op
    {
        let flags = graphc_ir::interp::attention::Flags {
            scale: *scale,
            causal: *causal,
            zero_masked_rows: *zero_masked_rows,
        };
        return super::attention::run(ctx, flags, inputs, output);
    }
    let out = ctx.writable(output)?;

    let mut args = Vec::with_capacity(inputs.len());
    for (acc, ty) in inputs {
        args.push(gather(ctx.value(acc.buffer)?, acc, ty.shape.dims())?);
    }
    let refs: Vec<&Tensor> = args.iter().collect();
    let value = eval_op(op, &refs, &out.ty).map_err(|m| format!("{}: {m}", op.name()))?;
    Ok(vec![(output, value)])
}
