//! Ops over the same operands computed by one kernel: the gradients of k and v in
//! attention's backward, and the rows' log-sum-exp beside attention's forward.
//!
//! Attention's backward has one `attention_grad` op per operand (q, k, v), each
//! recomputing the scores and probabilities from q, k and the rows' log-sum-exp. The
//! gradients of k and v walk the same tiles (a block of keys, every query), and
//! FlashAttention-2 computes both from one pass: [`merge`] makes each `attention_grad`
//! of v the [`Sibling`] of the `attention_grad` of k with the same operands and flags,
//! where the CUDA backend generates the pair as one kernel
//! ([`crate::codegen::attention::sibling_of`]): the scores and probabilities computed
//! once, k, v, q and the output gradient read once. The backward's `attention_lse` of
//! q and k (its own pass over every key) is what the forward's running max and sum
//! already give: it becomes the sibling of the forward over the same q, k (and mask)
//! with the same scale and causality, where the tensor-core forward runs
//! ([`crate::codegen::attention::sibling_of`]), and is stored beside the output.
//!
//! The merged kernel runs where the first of the pair ran; the readers of the other's
//! output move after it, as [`super::bias_grad`] leaves them.

use std::collections::HashSet;

use graphc_ir::{Op, TensorType};

use crate::kernel::{KernelKind, OpKernel, Program, Sibling};

/// The sibling kernel `o` would take ([`crate::codegen::attention::sibling_of`]): the op
/// and the kernel's operands it reads. None for a kernel that takes none.
fn wanted(o: &OpKernel) -> Option<(Op, Vec<usize>)> {
    if !o.siblings.is_empty() {
        return None;
    }
    let tys: Vec<&TensorType> = o.inputs.iter().map(|(_, t)| t).collect();
    crate::codegen::attention::sibling_of(&o.op, &tys)
}

/// The pairs `(kernel, its sibling's kernel, the sibling's operand indices)` [`merge`]
/// joins.
fn pairs(program: &Program) -> Vec<(usize, usize, Vec<usize>)> {
    let mut taken = HashSet::new();
    let mut out = Vec::new();
    for (k, kernel) in program.kernels.iter().enumerate() {
        let KernelKind::Op(ok) = &kernel.kind else {
            continue;
        };
        if taken.contains(&k) {
            continue;
        }
        let Some((want, idx)) = wanted(ok) else {
            continue;
        };
        let inputs: Vec<_> = idx.iter().map(|&i| ok.inputs[i].clone()).collect();
        let found = program.kernels.iter().enumerate().position(|(v, x)| {
            v != k
                && !taken.contains(&v)
                && matches!(&x.kind, KernelKind::Op(ov) if ov.op == want && ov.siblings.is_empty() && ov.inputs == inputs)
        });
        if let Some(v) = found {
            taken.insert(k);
            taken.insert(v);
            out.push((k, v, idx));
        }
    }
    out
}

/// Each `attention_grad` of v made the sibling of the `attention_grad` of k over the
/// same operands, each `attention_lse` that of its forward (see the module doc); a
/// program without such pairs is returned as it is.
pub(crate) fn merge(program: Program) -> Program {
    let found = pairs(&program);
    if found.is_empty() {
        return program;
    }
    let mut p = program;
    let mut removed = HashSet::new();
    for (k, v, inputs) in found {
        let nodes = std::mem::take(&mut p.kernels[v].nodes);
        let (op, output) = match &p.kernels[v].kind {
            KernelKind::Op(ov) => (ov.op.clone(), ov.output),
            _ => continue,
        };
        let kernel = &mut p.kernels[k];
        if let KernelKind::Op(ok) = &mut kernel.kind {
            ok.siblings.push(Sibling { op, inputs, output });
        }
        kernel.nodes.extend(nodes);
        kernel.nodes.sort_unstable();
        removed.insert(v);
    }
    super::bias_grad::drop_merged(p, &removed)
}
