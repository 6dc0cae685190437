//! Self-test cases of the backward GEMMs: the tanh GELU's backward as cuBLASLt's
//! DGELU epilogue, and a linear layer's bias gradient as BGRADA / BGRADB.

use graphc_ir::{BinaryOp, DType, GraphError};

use super::{wp, Cases};

/// The cases of `dt` at `m x k` by `k x n`.
pub(super) fn gemm_cases(c: &mut Cases, dt: DType, (m, k, n): (usize, usize, usize)) -> Result<(), GraphError> {
    // The tanh GELU's backward after a GEMM: cuBLASLt's DGELU in f16 / bf16 (the
    // pre-activation as its aux matrix; batched: the aux batch stride), a
    // generated epilogue in f32 / f64.
    c.add(format!("gemm {dt} gelu_tanh_grad(dy@w, x) (DGELU)"), 0, &|b| {
        let dy = b.input("dy", dt, [m, k]);
        let x = b.input("x", dt, [m, n]);
        b.output(
            "dx",
            dy.matmul(wp(b, dt, "w", &[k, n], 1)).binary(BinaryOp::GeluTanhGrad, x),
        );
    })?;
    c.add(
        format!("gemm {dt} gelu_tanh_grad(0.5*(dy@y), x) batched [3,m,k]@[3,k,n] (DGELU)"),
        0,
        &|b| {
            let dy = b.input("dy", dt, [3, m, k]);
            let y = b.input("y", dt, [3, k, n]);
            let x = b.input("x", dt, [3, m, n]);
            b.output("dx", (dy.matmul(y) * 0.5).binary(BinaryOp::GeluTanhGrad, x));
        },
    )?;
    // A linear layer's weight and bias gradients: one GEMM with cuBLASLt's BGRADA
    // (weight [in, out]: the sum of its b over k) or BGRADB (weight [out, in]: of
    // its a) in f16 / bf16; a GEMM and a row kernel in f32 / f64.
    c.add(
        format!("gemm {dt} x^T@dy and sum(dy) over [2,12] tokens (BGRADA)"),
        0,
        &|b| {
            let x = b.input("x", dt, [2, m / 2, k]).reshape([m, k]);
            let dy = b.input("dy", dt, [2, m / 2, n]);
            b.output("dw", x.transpose(&[1, 0]).matmul(dy.reshape([m, n])));
            b.output("db", dy.sum(&[0, 1], false));
        },
    )?;
    c.add(format!("gemm {dt} dy^T@x and sum(dy) over tokens (BGRADB)"), 0, &|b| {
        let x = b.input("x", dt, [m, k]);
        let dy = b.input("dy", dt, [m, n]);
        b.output("dw", dy.transpose(&[1, 0]).matmul(x));
        b.output("db", dy.sum(&[0], false));
    })?;
    Ok(())
}
