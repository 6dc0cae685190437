//! Matmul kernels: `[batch.., m, k] x [batch.., k, n]` through the interpreter's matmul,
//! then the epilogue body over `batch ++ [m, n]`.

use graphc_compiler::kernel::{Access, BiasGrad, BufferId, Expr, Operand};
use graphc_ir::interp::eval_op;
use graphc_ir::{DType, Op, ReduceOp, Tensor, TensorType};

use super::access::{gather_strided, scatter};
use super::body::{self, Leaves};
use super::Ctx;

pub(crate) use graphc_compiler::kernel::MatMulKernel;

struct MatMulLeaves<'c, 'p, 'r> {
    ctx: &'c Ctx<'p, 'r>,
    mm: &'c MatMulKernel,
    space: &'c [usize],
    /// The product, kept when the body uses it more than once.
    product: Option<Tensor>,
    keep: bool,
}

/// Gather a matmul operand; batch dims in `shrink` (which it broadcasts, stride 0) stay
/// of extent 1, which the matmul broadcasts back: the same products without copying.
fn operand(t: &Tensor, acc: &Access, dims: &[usize], shrink: &[bool]) -> Result<Tensor, String> {
    let dims: Vec<usize> = dims
        .iter()
        .enumerate()
        .map(|(i, &d)| if shrink.get(i).copied().unwrap_or(false) { 1 } else { d })
        .collect();
    gather_strided(t, acc.offset, &acc.strides, &dims)
}

impl MatMulLeaves<'_, '_, '_> {
    fn compute(&self, dtype: DType) -> Result<Tensor, String> {
        let mm = self.mm;
        let nb = mm.batch.len();
        let mut a_dims = mm.batch.to_vec();
        a_dims.extend([mm.m, mm.k]);
        let mut b_dims = mm.batch.to_vec();
        b_dims.extend([mm.k, mm.n]);
        // A batch dim both operands broadcast stays full in `a`, so the product keeps it.
        let zero = |acc: &Access, i: usize| acc.strides.get(i) == Some(&0);
        let shrink_a: Vec<bool> = (0..nb).map(|i| zero(&mm.a, i) && !zero(&mm.b, i)).collect();
        let shrink_b: Vec<bool> = (0..nb).map(|i| zero(&mm.b, i)).collect();
        let a = operand(self.ctx.value(mm.a.buffer)?, &mm.a, &a_dims, &shrink_a)?;
        let b = match &mm.quant {
            None => operand(self.ctx.value(mm.b.buffer)?, &mm.b, &b_dims, &shrink_b)?,
            // The interpreter's dequantize of the whole `[n, k]`, read transposed.
            Some(q) => {
                let (data, scales) = (self.ctx.value(mm.b.buffer)?, self.ctx.value(q.scales)?);
                let ty = TensorType::new(scales.dtype(), vec![mm.n, mm.k]);
                let op = Op::Dequantize {
                    bits: q.bits,
                    group: q.group,
                };
                let w = eval_op(&op, &[data, scales], &ty).map_err(|m| format!("dequantize: {m}"))?;
                operand(&w, &mm.b, &b_dims, &shrink_b)?
            }
        };
        eval_op(&Op::MatMul, &[&a, &b], &TensorType::new(dtype, self.space.to_vec()))
            .map_err(|m| format!("matmul: {m}"))
    }
}

impl Leaves for MatMulLeaves<'_, '_, '_> {
    fn load(&mut self, n: u32) -> Result<Tensor, String> {
        body::load(self.ctx, &self.mm.inputs, n, self.space)
    }

    fn gather(&mut self, n: u32, index: &Tensor, stride: i64, extent: u64) -> Result<Tensor, String> {
        body::gather_load(self.ctx, &self.mm.inputs, n, self.space, index, stride, extent)
    }

    fn special(&mut self, e: &Expr, dtype: DType, _: &[Option<Tensor>]) -> Result<Tensor, String> {
        if !matches!(e, Expr::Acc) {
            return Err("internal error: not a matmul-kernel expression".into());
        }
        if let Some(p) = &self.product {
            return Ok(p.clone());
        }
        let p = self.compute(dtype)?;
        if self.keep {
            self.product = Some(p.clone());
        }
        Ok(p)
    }
}

pub(super) fn run(ctx: &Ctx, mm: &MatMulKernel) -> Result<Vec<(BufferId, Tensor)>, String> {
    let space = mm.space();
    ctx.value(mm.a.buffer)?;
    ctx.value(mm.b.buffer)?;
    if let Some(q) = &mm.quant {
        ctx.value(q.scales)?;
    }
    body::check_bound(ctx, &mm.inputs)?;

    let roots: Vec<_> = mm.stores.iter().map(|s| s.value).collect();
    let uses = mm.body.exprs.iter().filter(|(e, _)| matches!(e, Expr::Acc)).count();
    let mut leaves = MatMulLeaves {
        ctx,
        mm,
        space: &space,
        product: None,
        keep: uses > 1,
    };
    let mut values = body::evaluate(&mm.body, &space, &roots, &[], &mut leaves)?;
    let mut out = Vec::with_capacity(mm.stores.len() + 1);
    body::write_stores(ctx, &mm.stores, &mut values, &mut out)?;
    if let Some(g) = &mm.bias_grad {
        out.push(bias_grad(ctx, mm, g).map_err(|m| format!("bias gradient: {m}"))?);
    }
    Ok(out)
}

/// The bias gradient: the operand summed over `k` by the interpreter's reduce (the row
/// kernel it replaces computed the same sum), stored through its access.
fn bias_grad(ctx: &Ctx, mm: &MatMulKernel, g: &BiasGrad) -> Result<(BufferId, Tensor), String> {
    let nb = mm.batch.len();
    let (acc, rows, cols, axis) = match g.operand {
        Operand::A => (&mm.a, mm.m, mm.k, nb + 1),
        Operand::B => (&mm.b, mm.k, mm.n, nb),
    };
    let dims: Vec<usize> = mm.batch.iter().copied().chain([rows, cols]).collect();
    let x = gather_strided(ctx.value(acc.buffer)?, acc.offset, &acc.strides, &dims)?;
    let len = g.len(mm);
    let axes: Vec<usize> = (0..nb).chain([axis]).collect();
    let op = Op::Reduce {
        op: ReduceOp::Sum,
        axes,
        keepdims: false,
    };
    let sum = eval_op(&op, &[&x], &TensorType::new(x.dtype(), vec![len])).map_err(|m| format!("sum: {m}"))?;
    let buf = ctx.writable(g.store.buffer)?;
    Ok((g.store.buffer, scatter(sum, &g.store, &buf.ty)?))
}
