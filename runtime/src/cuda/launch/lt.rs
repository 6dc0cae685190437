//! GEMMs in cuBLASLt's terms: the matrices and call of one `cublasLtMatmul`
//! ([`LtMatrix`], [`LtMatmul`]), their translation from the generated row-major
//! [`GemmDesc`] (`D^T = B^T A^T`, operands resolved to device addresses), and the
//! check that every matrix lies inside its region.

use serde::{Deserialize, Serialize};

use graphc_compiler::codegen::{GemmCompute, GemmDesc, GemmEpilogue, GemmOperand, GemmOutput};
use graphc_compiler::kernel::Program;
use graphc_ir::DType;

use super::{DevAddr, DeviceLayout, Region};

/// One matrix of a cuBLASLt call, column-major as cuBLASLt sees it: element
/// `(i, j)` of batch `b` is element `b * batch_stride + i + j * ld` from `addr`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LtMatrix {
    pub addr: DevAddr,
    pub rows: u64,
    pub cols: u64,
    pub ld: i64,
    pub batch_stride: i64,
}

/// One `cublasLtMatmul`, in cuBLASLt's own (column-major) terms:
/// `D = epilogue(alpha * op(A) op(B) + beta * C + bias)`, `op(A)` is `m x k`, `op(B)`
/// `k x n`, `D` `m x n`, `batch` times. Built from a row-major [`GemmDesc`] by computing
/// `D^T = B^T A^T` (see [`GemmOperand`]).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LtMatmul {
    /// Type of A, B, C, D and the bias.
    pub dtype: DType,
    pub compute: GemmCompute,
    pub transa: bool,
    pub transb: bool,
    pub m: u64,
    pub n: u64,
    pub k: u64,
    pub batch: u64,
    pub a: LtMatrix,
    pub b: LtMatrix,
    /// None: `beta = 0` (cuBLASLt is then given D as C).
    pub c: Option<LtMatrix>,
    pub d: LtMatrix,
    pub alpha: f64,
    pub beta: f64,
    pub epilogue: GemmEpilogue,
    /// `m` elements (along cuBLASLt's rows), broadcast over columns and batches.
    pub bias: Option<DevAddr>,
    /// `DGELU`'s aux matrix (the pre-activation), `m x n` like D.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub aux: Option<LtMatrix>,
}

/// The cuBLASLt call of a row-major [`GemmDesc`]: `D^T = B^T A^T`.
pub(super) fn lt_matmul(
    program: &Program,
    layout: &DeviceLayout,
    g: &GemmDesc,
    scratch: Option<(DevAddr, u64)>,
) -> Result<LtMatmul, String> {
    let elem = g.d_dtype.size_bytes() as u64;
    let addr = |op: &GemmOperand, what: &str| -> Result<DevAddr, String> {
        if op.dtype != g.d_dtype {
            return Err(format!("GEMM operand {what} is {} but D is {}", op.dtype, g.d_dtype));
        }
        let base = layout
            .buffers
            .get(op.buffer.index())
            .copied()
            .flatten()
            .ok_or_else(|| {
                format!(
                    "GEMM operand {what} is buffer b{}, which has no device address",
                    op.buffer.0
                )
            })?;
        let off = u64::try_from(op.offset).map_err(|_| format!("GEMM operand {what} has offset {}", op.offset))?;
        Ok(base.plus(off * elem))
    };
    let (m, n, k) = (g.m, g.n, g.k);
    let b = &g.b;
    let a = &g.a;
    let lt_a = LtMatrix {
        addr: addr(b, "b")?,
        rows: if b.trans { k } else { n },
        cols: if b.trans { n } else { k },
        ld: b.ld,
        batch_stride: b.batch_stride,
    };
    let lt_b = LtMatrix {
        addr: addr(a, "a")?,
        rows: if a.trans { m } else { k },
        cols: if a.trans { k } else { m },
        ld: a.ld,
        batch_stride: a.batch_stride,
    };
    let c = match &g.beta_c {
        Some(c) => {
            if c.trans {
                return Err("GEMM addend C is transposed".to_string());
            }
            Some(LtMatrix {
                addr: addr(c, "c")?,
                rows: n,
                cols: m,
                ld: c.ld,
                batch_stride: c.batch_stride,
            })
        }
        None => None,
    };
    let d_off = u64::try_from(g.d_offset).map_err(|_| format!("GEMM output has offset {}", g.d_offset))? * elem;
    let d_addr = match g.d {
        GemmOutput::Buffer(id) => {
            let base = layout
                .buffers
                .get(id.index())
                .copied()
                .flatten()
                .ok_or_else(|| format!("GEMM output is buffer b{}, which has no device address", id.0))?;
            let dt = program.buffers.get(id.index()).map(|b| b.ty.dtype);
            if dt != Some(g.d_dtype) {
                return Err(format!("GEMM output buffer b{} is not {}", id.0, g.d_dtype));
            }
            base.plus(d_off)
        }
        GemmOutput::Scratch => {
            let (a, bytes) =
                scratch.ok_or_else(|| "the GEMM writes scratch, but the plan gives it none".to_string())?;
            if bytes < g.scratch_bytes {
                return Err(format!(
                    "the GEMM needs {} bytes of scratch, the plan gives {bytes}",
                    g.scratch_bytes
                ));
            }
            a.plus(d_off)
        }
    };
    if !writable(layout, d_addr) {
        return Err(format!(
            "the GEMM writes {d_addr}, which holds an input, weight or constant"
        ));
    }
    let bias = match &g.bias {
        Some(bias) => Some(addr(bias, "bias")?),
        None => None,
    };
    let aux = match &g.aux {
        Some(x) if !x.trans => Some(LtMatrix {
            addr: addr(x, "aux")?,
            rows: n,
            cols: m,
            ld: x.ld,
            batch_stride: x.batch_stride,
        }),
        Some(_) => return Err("GEMM aux matrix is transposed".to_string()),
        None => None,
    };
    if (g.epilogue == GemmEpilogue::DGelu) != aux.is_some() {
        return Err(format!(
            "GEMM epilogue {:?} with{} an aux matrix",
            g.epilogue,
            if aux.is_some() { "" } else { "out" }
        ));
    }
    Ok(LtMatmul {
        dtype: g.d_dtype,
        compute: g.compute,
        transa: b.trans,
        transb: a.trans,
        m: n,
        n: m,
        k,
        batch: g.batch,
        a: lt_a,
        b: lt_b,
        c,
        d: LtMatrix {
            addr: d_addr,
            rows: n,
            cols: m,
            ld: n as i64,
            batch_stride: (m * n) as i64,
        },
        alpha: g.alpha,
        beta: if g.beta_c.is_some() { g.beta } else { 0.0 },
        epilogue: g.epilogue,
        bias,
        aux,
    })
}

/// Whether a GEMM may write `a`: the arena, or the outputs' part of the I/O region.
fn writable(layout: &DeviceLayout, a: DevAddr) -> bool {
    a.region == Region::Arena || (a.region == Region::Io && a.offset >= layout.inputs_end)
}

/// The byte range `[lo, hi)` a matrix of `batch` batches touches (None: negative
/// strides or overflow).
pub(crate) fn matrix_span(x: &LtMatrix, batch: u64, elem: u64) -> Option<(u64, u64)> {
    if x.rows == 0 || x.cols == 0 || batch == 0 {
        return Some((x.addr.offset, x.addr.offset));
    }
    let ld = u64::try_from(x.ld).ok()?;
    let bs = u64::try_from(x.batch_stride).ok()?;
    let last = (batch - 1)
        .checked_mul(bs)?
        .checked_add((x.cols - 1).checked_mul(ld)?)?
        .checked_add(x.rows - 1)?;
    let hi = x.addr.offset.checked_add(last.checked_add(1)?.checked_mul(elem)?)?;
    Some((x.addr.offset, hi))
}

pub(super) fn check_gemm_bounds(layout: &DeviceLayout, lt: &LtMatmul) -> Result<(), String> {
    let elem = lt.dtype.size_bytes() as u64;
    let mut mats: Vec<(&str, &LtMatrix)> = vec![("A", &lt.a), ("B", &lt.b), ("D", &lt.d)];
    if let Some(c) = &lt.c {
        mats.push(("C", c));
    }
    if let Some(x) = &lt.aux {
        mats.push(("aux", x));
    }
    for (what, x) in mats {
        if x.ld < x.rows.max(1) as i64 {
            return Err(format!(
                "GEMM matrix {what} ({}x{}) has leading dimension {} < its rows",
                x.rows, x.cols, x.ld
            ));
        }
        let region = layout.region_bytes(x.addr.region);
        match matrix_span(x, lt.batch, elem) {
            Some((_, hi)) if hi <= region => {}
            _ => {
                return Err(format!(
                    "GEMM matrix {what} at {} ({}x{}, ld {}, batch {} x stride {}) lies outside the {region}-byte {} region",
                    x.addr,
                    x.rows,
                    x.cols,
                    x.ld,
                    lt.batch,
                    x.batch_stride,
                    x.addr.region.name()
                ))
            }
        }
    }
    if let Some(b) = lt.bias {
        // BGRADB writes n values (op(B)'s columns); every other bias has m.
        let len = if lt.epilogue == GemmEpilogue::BGradB {
            lt.n
        } else {
            lt.m
        };
        if b.offset + len * elem > layout.region_bytes(b.region) {
            return Err(format!("GEMM bias at {b} lies outside its region"));
        }
        if lt.epilogue.writes_bias() && !writable(layout, b) {
            return Err(format!(
                "the GEMM writes its bias gradient at {b}, which holds an input, weight or constant"
            ));
        }
    }
    Ok(())
}
