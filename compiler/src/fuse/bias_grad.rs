//! Bias gradients into the weight-gradient GEMM that reads the same gradient.
//!
//! A linear layer's backward computes `dW = xᵀ dy` (a GEMM whose `k` runs over the
//! tokens) and `db = Σ_tokens dy` (a row kernel summing `dy` over the tokens). Both read
//! all of `dy`; cuBLASLt's `BGRADA` / `BGRADB` epilogues compute the sum of an operand
//! over `k` inside the GEMM. [`merge`] finds each row kernel that is exactly such a sum
//! of a 16-bit GEMM operand over `k`, and makes it that matmul kernel's
//! [`BiasGrad`]: one launch and one pass over `dy` fewer per bias.
//!
//! The merged kernel runs where the matmul ran; the sum's readers (the bias's optimizer
//! update) move after it. The program is put back in a valid order by a stable
//! topological sort ([`crate::plan::stable_order`]): every other kernel keeps its
//! relative order.

use std::collections::HashSet;

use graphc_ir::{DType, ReduceOp};

use crate::kernel::{
    contiguous_strides, strides_equal, Access, BiasGrad, Expr, KernelKind, MatMulKernel, Operand, Program, RowKernel,
};

/// What [`merge`] found: the row kernel (and the operand it sums) each matmul kernel
/// takes, as `(row kernel, matmul kernel, bias gradient)`.
fn merges(program: &Program) -> Vec<(usize, usize, BiasGrad)> {
    let mut taken: HashSet<usize> = HashSet::new();
    let mut out = Vec::new();
    for (r, kernel) in program.kernels.iter().enumerate() {
        let KernelKind::Row(rk) = &kernel.kind else {
            continue;
        };
        let Some((input, store, dtype)) = plain_sum(program, rk) else {
            continue;
        };
        let found = program.kernels.iter().enumerate().find_map(|(m, k)| match &k.kind {
            KernelKind::MatMul(mm) if !taken.contains(&m) && plain_product(program, mm, dtype) => {
                [Operand::B, Operand::A]
                    .into_iter()
                    .find(|&op| sums_operand(rk, input, mm, op))
                    .map(|op| (m, op))
            }
            _ => None,
        });
        if let Some((m, operand)) = found {
            taken.insert(m);
            out.push((r, m, BiasGrad { operand, store }));
        }
    }
    out
}

/// The bias gradients of `program` merged into their weight-gradient GEMMs (see the
/// module doc); a program without any is returned as it is.
pub(crate) fn merge(program: Program) -> Program {
    let found = merges(&program);
    if found.is_empty() {
        return program;
    }
    let mut p = program;
    let mut removed = HashSet::new();
    for (r, m, g) in found {
        let nodes = std::mem::take(&mut p.kernels[r].nodes);
        let kernel = &mut p.kernels[m];
        if let KernelKind::MatMul(mm) = &mut kernel.kind {
            mm.bias_grad = Some(g);
        }
        kernel.nodes.extend(nodes);
        kernel.nodes.sort_unstable();
        removed.insert(r);
    }
    drop_merged(p, &removed)
}

/// `p` without the kernels `removed` (merged into others): the rest keep their order,
/// named by their new places, then the program is put back in a valid order (a reader
/// of a merged kernel's output moves after the kernel it was merged into).
pub(super) fn drop_merged(mut p: Program, removed: &HashSet<usize>) -> Program {
    let kernels = std::mem::take(&mut p.kernels);
    p.kernels = kernels
        .into_iter()
        .enumerate()
        .filter(|(i, _)| !removed.contains(i))
        .enumerate()
        .map(|(pos, (i, mut kernel))| {
            kernel.name = crate::plan::rename_kernel(&kernel.name, i, pos);
            kernel
        })
        .collect();
    let order = crate::plan::stable_order(&p);
    crate::plan::apply_schedule(&p, &order)
}

/// A row kernel that only sums its one 16-bit input over the inner dims and stores the
/// sums contiguously over the whole output: the input, that store as a rank-1 access,
/// and the type.
fn plain_sum<'p>(program: &Program, rk: &'p RowKernel) -> Option<(&'p Access, Access, DType)> {
    let ([input], [stage], [store], []) = (&rk.inputs[..], &rk.stages[..], &rk.row_stores[..], &rk.stores[..]) else {
        return None;
    };
    if stage.op != ReduceOp::Sum || rk.body.exprs.len() != 2 {
        return None;
    }
    let (load, dtype) = rk.body.exprs.get(stage.value.index())?;
    let (result, rdtype) = rk.body.exprs.get(store.value.index())?;
    if !matches!(load, Expr::Load(i) if i.index() == 0)
        || !matches!(result, Expr::Stage(s) if s.index() == 0)
        || rdtype != dtype
        || !matches!(dtype, DType::F16 | DType::BF16)
    {
        return None;
    }
    let len: usize = rk.outer.iter().product();
    let out = program.buffers.get(store.access.buffer.index())?;
    let whole = store.access.offset == 0
        && strides_equal(&store.access.strides, &contiguous_strides(&rk.outer), &rk.outer)
        && out.ty.numel() == len
        && out.ty.dtype == *dtype;
    let in_type = program.buffers.get(input.buffer.index())?.ty.dtype;
    (whole && in_type == *dtype).then(|| {
        (
            input,
            Access {
                buffer: store.access.buffer,
                offset: 0,
                strides: vec![1],
            },
            *dtype,
        )
    })
}

/// A matmul kernel cuBLASLt can run with a bias-gradient epilogue: the bare product of
/// `dtype` operands stored once, no batch, not quantized, no bias gradient yet.
fn plain_product(program: &Program, mm: &MatMulKernel, dtype: DType) -> bool {
    let ty = |a: &Access| program.buffers.get(a.buffer.index()).map(|b| b.ty.dtype);
    mm.quant.is_none()
        && mm.bias_grad.is_none()
        && mm.batch.iter().all(|&d| d == 1)
        && mm.inputs.is_empty()
        && matches!(&mm.body.exprs[..], [(Expr::Acc, d)] if *d == dtype)
        && mm.stores.len() == 1
        && ty(&mm.a) == Some(dtype)
        && ty(&mm.b) == Some(dtype)
}

/// Whether the row kernel's input, walked over `outer ++ inner`, is `operand` of `mm`
/// with `outer` flattening to its bias axis (`m` for a, `n` for b) and `inner` to `k`,
/// and the operand is contiguous along that axis: cuBLASLt's `BGRADA` takes only a
/// non-transposed A (our `b` row-major), `BGRADB` only a transposed B (our `a` stored
/// column-major), as cuBLASMp's tests of the epilogues state.
fn sums_operand(rk: &RowKernel, input: &Access, mm: &MatMulKernel, operand: Operand) -> bool {
    let nb = mm.batch.len();
    let (acc, len_axis, k_axis, len) = match operand {
        Operand::A => (&mm.a, nb, nb + 1, mm.m),
        Operand::B => (&mm.b, nb + 1, nb, mm.n),
    };
    let (Some(&s_len), Some(&s_k)) = (acc.strides.get(len_axis), acc.strides.get(k_axis)) else {
        return false;
    };
    let r = rk.outer.len();
    (s_len == 1 || len == 1)
        && input.buffer == acc.buffer
        && input.offset == acc.offset
        && input.strides.len() == r + rk.inner.len()
        && rk.outer.iter().product::<usize>() == len
        && rk.inner.iter().product::<usize>() == mm.k
        && flattens(&rk.outer, &input.strides[..r], s_len)
        && flattens(&rk.inner, &input.strides[r..], s_k)
}

/// Whether dims `dims` with `strides` walk one axis of stride `step` row-major (dims of
/// extent 1 take any stride).
fn flattens(dims: &[usize], strides: &[i64], step: i64) -> bool {
    let mut c = step;
    for (&d, &s) in dims.iter().zip(strides).rev() {
        if d == 1 {
            continue;
        }
        if s != c {
            return false;
        }
        c = c.saturating_mul(d as i64);
    }
    true
}
