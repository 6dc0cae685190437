//! The row kernels' cases: a warp per row, a block per row, long rows (softmax, layer
//! and RMS norms, sums and maxima over an axis, cross-entropy's forward).

use graphc_ir::nn::{layer_norm, rms_norm, softmax};
use graphc_ir::{DType, GraphError, Tensor, TensorType};

use super::Cases;

pub(super) fn cases(c: &mut Cases) -> Result<(), GraphError> {
    // Row kernels: a warp per row, a block per row, long rows.
    for cols in [100usize, 1000, 4096, 20000] {
        c.add(format!("row softmax f32 [64,{cols}]"), 0, &|b| {
            let x = b.input("x", DType::F32, [64, cols]);
            b.output("y", softmax(x, -1));
        })?;
    }
    c.add("row softmax bf16 with causal mask [4,128,128]".into(), 0, &|b| {
        let x = b.input("x", DType::BF16, [4, 128, 128]);
        let i = b.iota(DType::I32, [128, 128], 0);
        let j = b.iota(DType::I32, [128, 128], 1);
        let masked = b.select(j.gt(i), b.scalar(DType::BF16, f64::NEG_INFINITY), x);
        b.output("y", softmax(masked, -1));
    })?;
    // Cross-entropy's forward over rows too long for the register cache (in 16-byte
    // chunks, and of an odd length, element by element): the shifted logits (a
    // product's, read by another: stored in place of the logits) stored in the sum's
    // pass, the label's log-probability read at its index before that pass.
    for n in [20000usize, 20001] {
        c.add(
            format!("row cross-entropy bf16 [8,{n}]: shifted logits stored in the sum's pass, the label's picked"),
            n as i64,
            &|b| {
                let a = b.input("a", DType::BF16, [8, 16]);
                let w = b.input("w", DType::BF16, [16, n]);
                let v = b.input("v", DType::BF16, [n, 4]);
                let label = b.input("label", DType::I64, [8, 1]);
                let x = a.matmul(w);
                let shifted = x - x.reduce_max(&[-1], true);
                let logp = shifted - shifted.exp().sum(&[-1], true).log();
                let hit = b.iota(DType::I64, [8, n], 1).eq(label);
                let picked = b.select(hit, logp, b.scalar(DType::BF16, 0.0)).sum(&[-1], false);
                b.output("proj", shifted.matmul(v));
                b.output("logp", picked);
            },
        )?;
    }
    c.add("row layernorm bf16 [64,1024]".into(), 0, &|b| {
        let x = b.input("x", DType::BF16, [64, 1024]);
        let g = b.param("g", Tensor::randn(&TensorType::new(DType::BF16, [1024]), 1.0, 5));
        let be = b.param("b", Tensor::randn(&TensorType::new(DType::BF16, [1024]), 1.0, 6));
        b.output("y", layer_norm(x, Some(g), Some(be), 1e-5));
    })?;
    c.add("row rmsnorm f16 [32,4096]".into(), 0, &|b| {
        let x = b.input("x", DType::F16, [32, 4096]);
        let g = b.param("g", Tensor::randn(&TensorType::new(DType::F16, [4096]), 1.0, 7));
        b.output("y", rms_norm(x, Some(g), 1e-6));
    })?;
    c.add(
        "row reductions: sum over the last axis, max over a middle axis".into(),
        0,
        &|b| {
            let x = b.input("x", DType::F32, [8, 100, 16]);
            b.output("sum", x.sum(&[-1], true));
            b.output("max", x.reduce_max(&[1], false));
        },
    )?;
    c.add(
        "row reductions: short rows sharing a warp, sums over few columns".into(),
        0,
        &|b| {
            // 16 f32 a row: 4 lanes per row, 8 rows a warp.
            let x = b.input("x", DType::F32, [64, 16]);
            b.output("rows", x.sum(&[-1], false));
            // 64 and 96 columns summed over their rows: too few for 32 a block, so 8
            // (f32) and 16 (bf16) a block, several lanes of a warp on each.
            let y = b.input("y", DType::F32, [512, 64]);
            b.output("cols", y.sum(&[0], false));
            let z = b.input("z", DType::BF16, [300, 96]);
            b.output("cols16", z.sum(&[0], true));
        },
    )?;
    Ok(())
}
