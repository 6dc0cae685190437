//! Tier (c): MatMul (numpy semantics, 1-D operands included) and Gemm.

use super::{Lowering, Node};
use crate::onnx::import::Importer;
use crate::Value;

pub const OPS: &[(&str, Lowering)] = &[("MatMul", matmul), ("Gemm", gemm)];

type Out<'b> = Result<Vec<Value<'b>>, String>;

/// numpy `matmul`: a 1-D left operand is a row (its dim removed after), a 1-D right
/// operand a column (likewise); batch dims broadcast.
fn matmul<'b>(_: &mut Importer<'b>, n: &Node<'_, 'b>) -> Out<'b> {
    let (a, b) = (n.input(0)?, n.input(1)?);
    let (a2, b2) = match (a.shape().dims(), b.shape().dims()) {
        ([], _) | (_, []) => return Err("MatMul operands must have rank >= 1".into()),
        (&[m], &[k]) => (a.reshape([1, m]), b.reshape([k, 1])),
        (&[m], _) => (a.reshape([1, m]), b),
        (_, &[k]) => (a, b.reshape([k, 1])),
        _ => (a, b),
    };
    let y = a2.matmul(b2);
    let mut dims = y.shape().0;
    if b.rank() == 1 {
        dims.pop();
    }
    if a.rank() == 1 {
        // The row a 1-D left operand became: last but one, or last once the column is gone.
        let row = dims.len().checked_sub(1 + usize::from(b.rank() != 1));
        match row {
            Some(i) if i < dims.len() => {
                dims.remove(i);
            }
            _ => return Err(format!("MatMul of {} and {} has no row axis to remove", a.ty(), b.ty())),
        }
    }
    Ok(vec![y.reshape(dims)])
}

/// `alpha * A' * B' + beta * C`, with `A' = transA ? A^T : A` (2-D operands).
fn gemm<'b>(_: &mut Importer<'b>, n: &Node<'_, 'b>) -> Out<'b> {
    let (mut a, mut b) = (n.input(0)?, n.input(1)?);
    if a.rank() != 2 || b.rank() != 2 {
        return Err(format!("Gemm needs 2-D operands, got {} and {}", a.ty(), b.ty()));
    }
    if n.attrs.int("transA", 0)? != 0 {
        a = a.t();
    }
    if n.attrs.int("transB", 0)? != 0 {
        b = b.t();
    }
    let alpha = n.attrs.float("alpha", 1.0)? as f64;
    let beta = n.attrs.float("beta", 1.0)? as f64;
    let mut y = a.matmul(b);
    if alpha != 1.0 {
        y = y * alpha;
    }
    if let Some(c) = n.opt_input(2) {
        y = if beta == 1.0 { y + c } else { y + c * beta };
    }
    Ok(vec![y])
}
