//! The weight-only quantized self-tests: the GEMM of int8 and int4 weights on every
//! path (tensor cores, CUDA cores, the decode GEMV and its packed int4 path) and the
//! unfused dequantize of gathered rows.

use graphc_ir::{DType, GraphBuilder, GraphError, Tensor, TensorType, Value};

use super::{wp, Cases};

/// A weight-only quantized `[n, k]` weight with scales of `dt`: the packed data and
/// the scales (what `--weights` makes of a weight).
fn quantized(
    dt: DType,
    (n, k): (usize, usize),
    (bits, group): (usize, usize),
    seed: u64,
) -> Result<(Tensor, Tensor), GraphError> {
    let w = Tensor::randn(&TensorType::new(DType::F32, vec![n, k]), 0.2, seed);
    graphc_ir::quant::quantize(&w, bits, group, dt).map_err(GraphError::Graph)
}

/// The dequantized weight read transposed, `[k, n]`, as a matmul's right operand.
fn qweight<'b>(b: &'b GraphBuilder, name: &str, (q, s): &(Tensor, Tensor), bits: usize, group: usize) -> Value<'b> {
    let (q, s) = (
        b.param(&format!("{name}.q"), q.clone()),
        b.param(&format!("{name}.s"), s.clone()),
    );
    b.dequantize(q, s, bits, group).transpose(&[1, 0])
}

/// The weight-only quantized GEMM (one generated kernel with its epilogue): both
/// widths, the tensor-core path (bf16, f16: one and four m16 tiles per block, one and
/// two n8 tiles per warp), the GEMV of a few rows, and the CUDA-core path (f32, f64), k not a multiple of the
/// step or odd, partial groups, a batch that does not fold into m; and the unfused
/// dequantize of gathered embedding rows.
pub(super) fn cases(c: &mut Cases) -> Result<(), GraphError> {
    let w = quantized(DType::F32, (56, 40), (8, 40), 1)?;
    c.add("qgemm f32 int8 relu(x@W+bias), per channel".into(), 0, &|b| {
        let x = b.input("x", DType::F32, [24, 40]);
        let y = x.matmul(qweight(b, "w", &w, 8, 40)) + wp(b, DType::F32, "bias", &[56], 2);
        b.output("y", y.relu());
    })?;
    let w = quantized(DType::BF16, (56, 96), (4, 32), 3)?;
    c.add(
        "qgemm bf16 int4 g32 gelu_erf, batch not folded [3,20,96]".into(),
        0,
        &|b| {
            let x = b.input("x", DType::BF16, [20, 3, 96]).transpose(&[1, 0, 2]);
            b.output("y", x.matmul(qweight(b, "w", &w, 4, 32)).gelu());
        },
    )?;
    let w = quantized(DType::F16, (72, 41), (8, 41), 4)?;
    c.add("qgemm f16 int8 odd k 41, m 9, +residual".into(), 0, &|b| {
        let x = b.input("x", DType::F16, [9, 41]);
        let r = b.input("r", DType::F16, [9, 72]);
        b.output("y", x.matmul(qweight(b, "w", &w, 8, 41)) + r);
    })?;
    let w = quantized(DType::BF16, (1024, 64), (4, 32), 5)?;
    c.add(
        "qgemm bf16 int4 g32 [8,2,64] unfolded (two n8 tiles per warp)".into(),
        0,
        &|b| {
            let x = b.input("x", DType::BF16, [2, 8, 64]).transpose(&[1, 0, 2]);
            b.output("y", x.matmul(qweight(b, "w", &w, 4, 32)));
        },
    )?;
    let w = quantized(DType::BF16, (24, 80), (4, 48), 6)?;
    c.add("qgemm bf16 int4 m 40 (four m16 tiles), partial group".into(), 0, &|b| {
        let x = b.input("x", DType::BF16, [40, 80]);
        b.output("y", x.matmul(qweight(b, "w", &w, 4, 48)) * 0.5);
    })?;
    // Decode-sized: the GEMV kernel (a warp per column, 16-byte chunks), int8 with a
    // bias and ReLU over 3 rows, int4 (the packed path) over one row with a k that is
    // not a multiple of the warp's 1,024-value stride.
    let w = quantized(DType::BF16, (40, 1024), (8, 128), 9)?;
    c.add("qgemm GEMV bf16 int8 g128 m 3 relu(x@W+bias)".into(), 0, &|b| {
        let x = b.input("x", DType::BF16, [3, 1024]);
        let y = x.matmul(qweight(b, "w", &w, 8, 128)) + wp(b, DType::BF16, "bias", &[40], 10);
        b.output("y", y.relu());
    })?;
    let w = quantized(DType::F16, (24, 1088), (4, 64), 11)?;
    c.add("qgemm GEMV f16 int4 g64 m 1, k 1088".into(), 0, &|b| {
        let x = b.input("x", DType::F16, [1, 1088]);
        b.output("y", x.matmul(qweight(b, "w", &w, 4, 64)));
    })?;
    // bf16 int4 on the packed path: two rows staged, two chunks a lane, groups of 128
    // (four lanes a scale), the GELU epilogue.
    let w = quantized(DType::BF16, (48, 2048), (4, 128), 12)?;
    c.add("qgemm GEMV bf16 int4 g128 m 2 gelu(x@W)".into(), 0, &|b| {
        let x = b.input("x", DType::BF16, [2, 2048]);
        b.output("y", x.matmul(qweight(b, "w", &w, 4, 128)).gelu());
    })?;
    let w = quantized(DType::F64, (10, 48), (4, 16), 7)?;
    c.add("qgemm f64 int4 g16".into(), 0, &|b| {
        let x = b.input("x", DType::F64, [5, 48]);
        b.output("y", x.matmul(qweight(b, "w", &w, 4, 16)));
    })?;
    let (q, s) = quantized(DType::F32, (50, 64), (4, 32), 8)?;
    c.add("dequantize of gathered int4 embedding rows".into(), 50, &|b| {
        let ids = b.input("ids", DType::I64, [2, 7]);
        let (q, s) = (b.param("emb.q", q.clone()), b.param("emb.s", s.clone()));
        b.output("y", b.dequantize(q.gather(ids, 0), s.gather(ids, 0), 4, 32) * 2.0);
    })?;
    Ok(())
}
