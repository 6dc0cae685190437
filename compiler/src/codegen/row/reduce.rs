//! The reductions of a row kernel's stages as C: accumulator types and initial values,
//! the combine step, the reduction across the threads sharing a row (warp shuffles,
//! then shared memory), and the stage's final value.

use graphc_ir::{DType, ReduceOp};

use super::mode::Mode;
use crate::codegen::cuda::{self, Writer};
use crate::codegen::prelude::Helpers;

/// The accumulator C type of a reduction of dtype `d`.
pub(super) fn acc_type(d: DType) -> &'static str {
    match d {
        DType::F64 => "double",
        d if d.is_float() => "float",
        _ => "long long",
    }
}

/// The shared-memory array reductions of accumulator type `at` go through.
pub(super) fn red_array(at: &str) -> String {
    format!("red_{}", at.replace(' ', "_"))
}

/// A float literal in the accumulator precision of float dtype `d`.
fn acc_float_lit(d: DType, x: f64) -> String {
    if d == DType::F64 {
        cuda::f64_lit(x)
    } else {
        cuda::f32_lit(x as f32)
    }
}

pub(super) fn acc_init(op: ReduceOp, d: DType) -> String {
    let float = d.is_float();
    match op {
        ReduceOp::Sum | ReduceOp::Mean => {
            if float {
                acc_float_lit(d, 0.0)
            } else {
                "0LL".to_string()
            }
        }
        ReduceOp::Prod => {
            if float {
                acc_float_lit(d, 1.0)
            } else {
                "1LL".to_string()
            }
        }
        ReduceOp::Max | ReduceOp::Min => {
            let max = op == ReduceOp::Max;
            if float {
                acc_float_lit(d, if max { f64::NEG_INFINITY } else { f64::INFINITY })
            } else {
                let (lo, hi) = match d {
                    DType::I32 => (i32::MIN as i64, i32::MAX as i64),
                    DType::I8 => (i8::MIN as i64, i8::MAX as i64),
                    DType::U8 => (0, u8::MAX as i64),
                    _ => (i64::MIN, i64::MAX),
                };
                cuda::i64_lit(if max { lo } else { hi })
            }
        }
    }
}

/// `acc = combine(acc, x)` as a C statement.
pub(super) fn combine(op: ReduceOp, d: DType, acc: &str, x: &str) -> String {
    let float = d.is_float();
    match op {
        ReduceOp::Sum | ReduceOp::Mean if float => format!("{acc} = {acc} + {x};"),
        ReduceOp::Prod if float => format!("{acc} = {acc} * {x};"),
        ReduceOp::Sum | ReduceOp::Mean => {
            format!("{acc} = (long long)((unsigned long long){acc} + (unsigned long long){x});")
        }
        ReduceOp::Prod => format!("{acc} = (long long)((unsigned long long){acc} * (unsigned long long){x});"),
        ReduceOp::Max if float => format!("if ({x} > {acc} || {x} != {x}) {acc} = {x};"),
        ReduceOp::Min if float => format!("if ({x} < {acc} || {x} != {x}) {acc} = {x};"),
        ReduceOp::Max => format!("if ({x} > {acc}) {acc} = {x};"),
        ReduceOp::Min => format!("if ({x} < {acc}) {acc} = {x};"),
    }
}

/// Combine accumulator `acc` (of a reduction `op` of dtype `d`) over the threads that
/// share its row under `mode`, leaving the row's result in every one of them.
pub(super) fn across_threads(w: &mut Writer, mode: Mode, op: ReduceOp, d: DType, acc: &str) {
    let at = acc_type(d);
    let red = red_array(at);
    match mode {
        Mode::Warp { .. } | Mode::Block(_) => {
            // Across the row's lanes of the warp, then across warps.
            let lanes = match mode {
                Mode::Warp { lanes } => lanes,
                _ => 32,
            };
            w.line("#pragma unroll");
            w.open(format!("for (int off = {}; off > 0; off >>= 1)", lanes / 2));
            w.line(format!("const {at} y = __shfl_xor_sync(0xffffffffu, {acc}, off);"));
            w.line(combine(op, d, acc, "y"));
            w.close();
            if let Mode::Block(b) = mode {
                w.line(format!("if (lane == 0) {red}[warp] = {acc};"));
                w.line("__syncthreads();");
                w.line(format!("{acc} = {red}[0];"));
                w.open(format!("for (int k = 1; k < {}; ++k)", b / 32));
                w.line(format!("const {at} y = {red}[k];"));
                w.line(combine(op, d, acc, "y"));
                w.close();
                w.line("__syncthreads();");
            }
        }
        Mode::Columns { cols, ws } => {
            // Across the lanes of the warp on the row (`lane % cols` alike), then the
            // warps sharing it, in warp order.
            if cols < 32 {
                w.line("#pragma unroll");
                w.open(format!("for (int off = {cols}; off < 32; off <<= 1)"));
                w.line(format!("const {at} y = __shfl_xor_sync(0xffffffffu, {acc}, off);"));
                w.line(combine(op, d, acc, "y"));
                w.close();
            }
            if ws > 1 {
                let col = if cols == 32 {
                    "lane".to_string()
                } else {
                    format!("lane % {cols}")
                };
                if cols == 32 {
                    w.line(format!("{red}[warp * 32 + lane] = {acc};"));
                } else {
                    w.line(format!("if (lane < {cols}) {red}[warp * {cols} + lane] = {acc};"));
                }
                w.line("__syncthreads();");
                w.line(format!("{acc} = {red}[{col}];"));
                w.line("#pragma unroll");
                w.open(format!("for (int k = 1; k < {ws}; ++k)"));
                w.line(format!("const {at} y = {red}[k * {cols} + {col}];"));
                w.line(combine(op, d, acc, "y"));
                w.close();
                w.line("__syncthreads();");
            }
        }
    }
}

/// The C expression of a stage's result from its reduced accumulator `acc`: divided by
/// the row's `n_inner` elements for a mean, and converted to the stage's register type.
pub(super) fn final_value(h: &mut Helpers, op: ReduceOp, d: DType, acc: &str, n_inner: usize) -> String {
    let mut fin = acc.to_string();
    if op == ReduceOp::Mean {
        fin = if d.is_float() {
            format!("({fin} / {})", acc_float_lit(d, n_inner as f64))
        } else if n_inner == 0 {
            "0LL".to_string()
        } else {
            format!("({fin} / {}LL)", n_inner)
        };
    }
    match d {
        DType::F16 | DType::BF16 => cuda::cast_c(h, DType::F32, d, &fin),
        d if d.is_int() => format!("(({}){fin})", cuda::reg_type(d)),
        _ => fin,
    }
}
