//! `graphc selftest`: small graphs that exercise every kind of launch the CUDA executor
//! makes, each run on a device and compared with the CPU executor.
//!
//! The cases cover cuBLASLt GEMMs in every dtype with every epilogue (bias, ReLU,
//! tanh GELU, a generated erf-GELU epilogue through scratch, alpha, a residual `C`),
//! transposed operands, batched and broadcast batches; elementwise kernels on the
//! vectorized and the general path, casts, integers, selects; row kernels with a warp
//! and with a block per row, norms, reductions over an inner and a middle axis; op
//! kernels (concat, pad, gather, argmax); a small attention and the example
//! transformer block. On a GPU this is the first thing the GPU check runs, so a failure
//! names the feature, not just a model; without a GPU the same cases run through the
//! launch emulator (a test does that in CI).

use std::collections::HashMap;

use graphc_ir::nn::{layer_norm, rms_norm, softmax};
use graphc_ir::{DType, Graph, GraphBuilder, GraphError, PadMode, Tensor, TensorData, TensorType, Value};

use crate::Compiled;

/// One self-test: a graph and its inputs.
pub struct Case {
    pub name: String,
    pub graph: Graph,
    pub inputs: HashMap<String, Tensor>,
}

/// The outcome of one case.
#[derive(Clone, Debug, serde::Serialize)]
pub struct CaseResult {
    pub name: String,
    pub kernels: usize,
    /// The output with the largest error relative to its tolerance, and that error.
    pub worst_output: String,
    pub rel_l2: f64,
    pub tolerance: f64,
    /// Set when the case did not run.
    pub error: Option<String>,
    pub pass: bool,
}

/// Relative L2 error of `got` against `want` (0 when equal, NaNs equal NaNs, infinite
/// when the types differ or non-finite values disagree).
pub fn output_error(got: &Tensor, want: &Tensor) -> f64 {
    if got.ty() != want.ty() {
        return f64::INFINITY;
    }
    let (a, b) = (got.to_f64_vec(), want.to_f64_vec());
    let (mut num, mut den) = (0.0, 0.0);
    for (x, y) in a.iter().zip(&b) {
        if !x.is_finite() || !y.is_finite() {
            if !(x == y || (x.is_nan() && y.is_nan())) {
                return f64::INFINITY;
            }
            continue;
        }
        num += (x - y) * (x - y);
        den += y * y;
    }
    if num == 0.0 {
        0.0
    } else {
        (num / f64::max(den, f64::MIN_POSITIVE)).sqrt()
    }
}

/// The relative L2 a GPU output may differ from the CPU executor's by: 1e-5 for f32
/// and f64 (1e-2 for f32 with TF32 GEMMs), 1e-2 for f16, 3e-2 for bf16 (8 significant
/// bits: the CPU rounds every GEMM product before its epilogue, cuBLASLt after it, and
/// a few layers compound that), exact for integers and bool.
pub fn tolerance(dtype: DType, tf32: bool) -> f64 {
    match dtype {
        DType::BF16 => 3e-2,
        DType::F16 => 1e-2,
        DType::F32 if tf32 => 1e-2,
        DType::F32 | DType::F64 => 1e-5,
        _ => 0.0,
    }
}

/// Named outputs, or the error that stopped the run.
pub type Outputs = Result<Vec<(String, Tensor)>, crate::Error>;

/// Run `case` with `run` (a device) and the CPU executor, and compare.
pub fn run_case(
    case: &Case,
    tf32: bool,
    run: &mut dyn FnMut(&Compiled, &HashMap<String, Tensor>) -> Outputs,
) -> CaseResult {
    let mut r = CaseResult {
        name: case.name.clone(),
        kernels: 0,
        worst_output: String::new(),
        rel_l2: 0.0,
        tolerance: 0.0,
        error: None,
        pass: false,
    };
    let compiled = match crate::compile(&case.graph) {
        Ok(c) => c,
        Err(e) => {
            r.error = Some(format!("compile: {e}"));
            return r;
        }
    };
    r.kernels = compiled.program.kernels.len();
    let want = match crate::run_cpu(&compiled, case.inputs.clone()) {
        Ok(w) => w,
        Err(e) => {
            r.error = Some(format!("CPU executor: {e}"));
            return r;
        }
    };
    let got = match run(&compiled, &case.inputs) {
        Ok(g) => g,
        Err(e) => {
            r.error = Some(e.to_string());
            return r;
        }
    };
    let mut worst = -1.0f64;
    r.pass = got.len() == want.len();
    for ((name, g), (_, w)) in got.iter().zip(&want) {
        let err = output_error(g, w);
        let tol = tolerance(w.ty().dtype, tf32);
        let score = if err == 0.0 {
            0.0
        } else if tol == 0.0 {
            f64::INFINITY
        } else {
            err / tol
        };
        if score > worst {
            worst = score;
            r.worst_output = name.clone();
            r.rel_l2 = err;
            r.tolerance = tol;
        }
        r.pass &= err <= tol;
    }
    r
}

/// A weight of `shape`, normal with standard deviation 0.2.
fn wp<'b>(b: &'b GraphBuilder, dt: DType, name: &str, shape: &[usize], seed: u64) -> Value<'b> {
    b.param(name, Tensor::randn(&TensorType::new(dt, shape.to_vec()), 0.2, seed))
}

fn random(ty: TensorType, seed: u64) -> Tensor {
    Tensor::randn(&ty, 1.0, seed)
}

/// The cases being collected, in order (an input's seed depends on its case's place).
struct Cases(Vec<Case>);

impl Cases {
    /// Build a graph; its float inputs get standard-normal values, integer inputs
    /// values in 0..int_range.
    fn add(&mut self, name: String, int_range: i64, f: &dyn Fn(&GraphBuilder)) -> Result<(), GraphError> {
        let b = GraphBuilder::new();
        f(&b);
        let graph = b.finish()?;
        let mut inputs = HashMap::new();
        for (i, &id) in graph.inputs().iter().enumerate() {
            let name = graph.input_name(id).unwrap_or_default().to_string();
            let ty = graph.node(id).ty.clone();
            let seed = 1000 + self.0.len() as u64 * 16 + i as u64;
            let t = if ty.dtype.is_int() {
                let n = ty.numel();
                let v: Vec<f64> = (0..n as u64)
                    .map(|k| ((k.wrapping_mul(2654435761).wrapping_add(seed * 97)) % int_range as u64) as f64)
                    .collect();
                Tensor::new(ty.shape.clone(), TensorData::from_f64(ty.dtype, &v))
                    .map_err(|e| GraphError::Graph(format!("input \"{name}\": {e}")))?
            } else if ty.dtype == DType::Bool {
                Tensor::random(&ty, seed)
            } else {
                random(ty, seed)
            };
            inputs.insert(name, t);
        }
        self.0.push(Case { name, graph, inputs });
        Ok(())
    }
}

/// Every case, with deterministic weights and inputs.
pub fn cases() -> Result<Vec<Case>, GraphError> {
    let mut c = Cases(Vec::new());
    gemm_cases(&mut c)?;
    kernel_cases(&mut c)?;
    model_cases(&mut c)?;
    Ok(c.0)
}

/// GEMMs of every dtype and epilogue, transposed and batched.
fn gemm_cases(c: &mut Cases) -> Result<(), GraphError> {
    let (m, k, n) = (24usize, 40usize, 56usize);
    for dt in [DType::F32, DType::F16, DType::BF16, DType::F64] {
        c.add(format!("gemm {dt} x@w"), 0, &|b| {
            let x = b.input("x", dt, [m, k]);
            b.output("y", x.matmul(wp(b, dt, "w", &[k, n], 1)));
        })?;
        c.add(format!("gemm {dt} x@w+bias"), 0, &|b| {
            let x = b.input("x", dt, [m, k]);
            b.output("y", x.matmul(wp(b, dt, "w", &[k, n], 1)) + wp(b, dt, "bias", &[n], 2));
        })?;
        c.add(format!("gemm {dt} relu(x@w+bias)"), 0, &|b| {
            let x = b.input("x", dt, [m, k]);
            b.output(
                "y",
                (x.matmul(wp(b, dt, "w", &[k, n], 1)) + wp(b, dt, "bias", &[n], 2)).relu(),
            );
        })?;
        c.add(format!("gemm {dt} gelu_tanh(x@w+bias)"), 0, &|b| {
            let x = b.input("x", dt, [m, k]);
            b.output(
                "y",
                (x.matmul(wp(b, dt, "w", &[k, n], 1)) + wp(b, dt, "bias", &[n], 2)).gelu_tanh(),
            );
        })?;
        c.add(format!("gemm {dt} gelu_erf(x@w) (generated epilogue)"), 0, &|b| {
            let x = b.input("x", dt, [m, k]);
            b.output("y", x.matmul(wp(b, dt, "w", &[k, n], 1)).gelu());
        })?;
        c.add(format!("gemm {dt} 0.5*(x@w)+r (alpha, C)"), 0, &|b| {
            let x = b.input("x", dt, [m, k]);
            let r = b.input("r", dt, [m, n]);
            b.output("y", 0.5 * x.matmul(wp(b, dt, "w", &[k, n], 1)) + r);
        })?;
        c.add(format!("gemm {dt} x@y^T"), 0, &|b| {
            let x = b.input("x", dt, [m, k]);
            let y = b.input("y", dt, [n, k]);
            b.output("z", x.matmul(y.transpose(&[1, 0])));
        })?;
        c.add(format!("gemm {dt} x^T@y"), 0, &|b| {
            let x = b.input("x", dt, [k, m]);
            let y = b.input("y", dt, [k, n]);
            b.output("z", x.transpose(&[1, 0]).matmul(y));
        })?;
        c.add(format!("gemm {dt} batched [3,m,k]@[3,k,n]"), 0, &|b| {
            let x = b.input("x", dt, [3, m, k]);
            let y = b.input("y", dt, [3, k, n]);
            b.output("z", x.matmul(y));
        })?;
        c.add(format!("gemm {dt} batch-broadcast rhs [3,m,k]@w"), 0, &|b| {
            let x = b.input("x", dt, [3, m, k]);
            b.output("z", x.matmul(wp(b, dt, "w", &[k, n], 1)));
        })?;
        c.add(format!("gemm {dt} batch-broadcast lhs w@[3,k,n]"), 0, &|b| {
            let y = b.input("y", dt, [3, k, n]);
            let a = wp(b, dt, "a", &[m, k], 3);
            b.output("z", a.broadcast_to(&[3, m, k].into()).matmul(y));
        })?;
    }
    Ok(())
}

/// Elementwise, row and op kernels, and attention.
fn kernel_cases(c: &mut Cases) -> Result<(), GraphError> {
    // Elementwise.
    c.add("elementwise f32 vectorized".into(), 0, &|b| {
        let x = b.input("x", DType::F32, [1000, 64]);
        b.output("y", (x * 1.5 + 0.25).gelu() * x.sigmoid());
    })?;
    c.add("elementwise f32 strided (transposed input)".into(), 0, &|b| {
        let x = b.input("x", DType::F32, [96, 130]);
        let y = b.input("y", DType::F32, [130, 96]);
        b.output("z", x.transpose(&[1, 0]) * y + 1.0);
    })?;
    c.add("elementwise f16/bf16 casts and broadcasts".into(), 0, &|b| {
        let x = b.input("x", DType::F16, [64, 100]);
        let r = b.input("r", DType::BF16, [100]);
        let c = b.input("c", DType::F32, [64, 1]);
        let y = x.cast(DType::F32) * r.cast(DType::F32) + c;
        b.output("y16", y.cast(DType::F16));
        b.output("ybf16", y.exp().cast(DType::BF16));
    })?;
    c.add("elementwise i32 and select".into(), 50, &|b| {
        let p = b.input("p", DType::I32, [33, 17]);
        let q = b.input("q", DType::I32, [33, 17]);
        let s = p * q + 7.0;
        b.output("s", s.maximum(q));
        let x = p.cast(DType::F32);
        b.output("sel", b.select(p.gt(q), x, -x));
    })?;
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
    // Op kernels.
    c.add("op concat + pad".into(), 0, &|b| {
        let x = b.input("x", DType::F32, [16, 10]);
        let y = b.input("y", DType::F32, [16, 6]);
        let c = b.concat(&[x, y], 1);
        b.output("c", c.pad(&[(1, 2), (0, 3)], PadMode::Constant, 0.5) * 2.0);
    })?;
    c.add("op embedding gather + argmax".into(), 100, &|b| {
        let ids = b.input("ids", DType::I64, [4, 7]);
        let table = b.param("table", Tensor::randn(&TensorType::new(DType::F32, [100, 32]), 1.0, 9));
        let e = table.gather(ids, 0);
        b.output("e", e * 3.0);
        b.output("arg", e.argmax(-1, false));
    })?;
    // Attention, small: softmax(q k^T / 8) v over [2, 4 heads, 32, 16].
    c.add("attention bf16 [2,4,32,16]".into(), 0, &|b| {
        let q = b.input("q", DType::BF16, [2, 4, 32, 16]);
        let kk = b.input("k", DType::BF16, [2, 4, 32, 16]);
        let v = b.input("v", DType::BF16, [2, 4, 32, 16]);
        let s: Value = q.matmul(kk.transpose(&[0, 1, 3, 2])) * 0.25;
        b.output("o", softmax(s, -1).matmul(v));
    })?;
    Ok(())
}

/// Whole models.
fn model_cases(c: &mut Cases) -> Result<(), GraphError> {
    let block = crate::models::gpt(&crate::models::GptConfig::default())?;
    let inputs = crate::random_inputs(&block, 77);
    c.0.push(Case {
        name: "model: transformer block f32".into(),
        graph: block,
        inputs,
    });
    let g = crate::models::gpt(&crate::models::GptConfig {
        layers: 2,
        dtype: DType::BF16,
        ..Default::default()
    })?;
    let inputs = crate::random_inputs(&g, 78);
    c.0.push(Case {
        name: "model: 2-layer GPT bf16".into(),
        graph: g,
        inputs,
    });
    Ok(())
}
