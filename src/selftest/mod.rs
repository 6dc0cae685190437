//! `graphc selftest`: small graphs that exercise every kind of launch the CUDA executor
//! makes, each run on a device and compared with the CPU executor.
//!
//! The cases cover cuBLASLt GEMMs in every dtype with every epilogue (bias, ReLU,
//! tanh GELU, a generated erf-GELU epilogue through scratch, alpha, a residual `C`),
//! transposed operands, batched and broadcast batches; elementwise kernels on the
//! vectorized and the general path, casts, integers, selects; row kernels with a warp
//! and with a block per row, rows sharing a warp, column sums over few columns, norms,
//! reductions over an inner and a middle axis; op kernels (concat, also by 16-byte
//! copies, pad, gather, scatter-add, argmax); the weight-only quantized GEMMs (int8 and int4,
//! tensor cores and CUDA cores) and the dequantize of gathered rows; a small attention and the example
//! transformer block. On a GPU this is the first thing the GPU check runs, so a failure
//! names the feature, not just a model; without a GPU the same cases run through the
//! launch emulator (a test does that in CI).

use std::collections::HashMap;

pub use graphc_ir::compare::tolerance;
use graphc_ir::compare::{relative_l2, zip_outputs, CompareError};
use graphc_ir::nn::softmax;
use graphc_ir::{DType, Graph, GraphBuilder, GraphError, PadMode, Tensor, TensorData, TensorType, Value};

use crate::Compiled;

mod attention;
mod backward;
mod conv;
mod quant;
mod rows;

/// One self-test: a graph and its inputs.
pub struct Case {
    pub name: String,
    pub graph: Graph,
    pub inputs: HashMap<String, Tensor>,
    /// A training step of `graph` (its inputs then include the state), compiled with
    /// [`crate::train::compile_step`].
    pub train: Option<crate::train::TrainOptions>,
    /// The precision a training step compiles in (mixed precision: bf16, or fp16 with
    /// loss scaling).
    pub precision: graphc_compiler::passes::precision::Precision,
}

/// The outcome of one case.
#[derive(Debug, serde::Serialize)]
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
    /// Set when the device is not there at all (no CUDA driver, no GPU): no case can
    /// run, so the caller stops (the CLI with exit code 3).
    #[serde(skip)]
    pub no_device: Option<crate::cuda::CudaError>,
}

/// Relative L2 error of `got` against `want` ([`relative_l2`]: floats 0 when equal,
/// NaNs equal NaNs, infinite when non-finite values disagree or the types differ);
/// integers and bool exactly, bit for bit (0 when every element is equal, else
/// infinite), also i64 values past 2^53 that f64 cannot tell apart.
pub fn output_error(got: &Tensor, want: &Tensor) -> f64 {
    relative_l2(got, want)
}

/// One output of a device run against the CPU executor's.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct OutputCheck {
    pub name: String,
    /// [`output_error`].
    pub rel_l2: f64,
    /// [`tolerance`] of the output's type: exact for integers and bool, whatever the
    /// graph computes them from (GEMMs included, TF32 or not).
    pub tolerance: f64,
    pub pass: bool,
}

/// Compare a device's named outputs with the CPU executor's: both lists must name the
/// same outputs in the same order with the same types ([`zip_outputs`], else the
/// error says how they differ); then every output is checked, none skipped
/// ([`output_error`] within [`tolerance`]).
pub fn compare_outputs(
    got: &[(String, Tensor)],
    want: &[(String, Tensor)],
    tf32: bool,
) -> Result<Vec<OutputCheck>, CompareError> {
    Ok(zip_outputs(got, want)?
        .into_iter()
        .map(|(name, g, w)| {
            let rel_l2 = output_error(g, w);
            let tolerance = tolerance(w.ty().dtype, tf32);
            OutputCheck {
                name: name.to_string(),
                rel_l2,
                tolerance,
                pass: rel_l2 <= tolerance,
            }
        })
        .collect())
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
        no_device: None,
    };
    let compiled = match &case.train {
        Some(t) => crate::train::compile_step(
            &case.graph,
            t.clone(),
            &crate::CompileOptions {
                precision: case.precision,
                ..Default::default()
            },
        ),
        None => crate::compile(&case.graph),
    };
    let compiled = match compiled {
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
        Err(crate::Error::Cuda(
            e @ (crate::cuda::CudaError::NoDriver(_)
            | crate::cuda::CudaError::NoDevice(_)
            | crate::cuda::CudaError::Sim(crate::cuda::sim::SimError::NoCompiler(_))),
        )) => {
            r.error = Some(e.to_string());
            r.no_device = Some(e);
            return r;
        }
        Err(e) => {
            r.error = Some(e.to_string());
            return r;
        }
    };
    let checks = match compare_outputs(&got, &want, tf32) {
        // A mixed-precision step's f32 outputs (the state) are computed from bf16/fp16
        // values, rounded where the two devices accumulate in different orders: they
        // get the low type's tolerance.
        Ok(c) => match case.precision.low_type() {
            Some(low) => c
                .into_iter()
                .map(|mut c| {
                    if c.tolerance > 0.0 {
                        c.tolerance = c.tolerance.max(graphc_ir::compare::tolerance(low, false));
                        c.pass = c.rel_l2 <= c.tolerance;
                    }
                    c
                })
                .collect(),
            None => c,
        },
        Err(e) => {
            r.error = Some(format!("the outputs differ from the CPU executor's: {e}"));
            return r;
        }
    };
    let mut worst = -1.0f64;
    r.pass = true;
    for c in checks {
        let score = if c.rel_l2 == 0.0 {
            0.0
        } else if c.tolerance == 0.0 {
            f64::INFINITY
        } else {
            c.rel_l2 / c.tolerance
        };
        if score > worst {
            worst = score;
            r.worst_output = c.name;
            r.rel_l2 = c.rel_l2;
            r.tolerance = c.tolerance;
        }
        r.pass &= c.pass;
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
        self.0.push(Case {
            name,
            graph,
            inputs,
            train: None,
            precision: Default::default(),
        });
        Ok(())
    }
}

/// Every case, with deterministic weights and inputs.
pub fn cases() -> Result<Vec<Case>, GraphError> {
    let mut c = Cases(Vec::new());
    gemm_cases(&mut c)?;
    quant::cases(&mut c)?;
    kernel_cases(&mut c)?;
    model_cases(&mut c)?;
    train_cases(&mut c)?;
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
        c.add(
            format!("gemm {dt} gelu_erf(x@w) (generated epilogue, in place)"),
            0,
            &|b| {
                let x = b.input("x", dt, [m, k]);
                b.output("y", x.matmul(wp(b, dt, "w", &[k, n], 1)).gelu());
            },
        )?;
        c.add(
            format!("gemm {dt} gelu_erf, exp of x@w (generated epilogue, scratch)"),
            0,
            &|b| {
                let x = b.input("x", dt, [m, k]);
                let z = x.matmul(wp(b, dt, "w", &[k, n], 1));
                b.output("g", z.gelu());
                b.output("e", (z * 0.25).exp());
            },
        )?;
        backward::gemm_cases(c, dt, (m, k, n))?;
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
    // Integer outputs of a GEMM (exact: small integers in f32), compared exactly.
    c.add(
        "gemm f32 of small integers, exact, with an i32 output".into(),
        5,
        &|b| {
            let x = b.input("x", DType::I32, [m, k]).cast(DType::F32);
            let y = b.input("y", DType::I32, [k, n]).cast(DType::F32);
            let z = x.matmul(y);
            b.output("z", z);
            b.output("zi", (z + 1.0).cast(DType::I32));
        },
    )?;
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
    c.add(
        "elementwise f16/bf16 casts (from bool too) and broadcasts".into(),
        0,
        &|b| {
            let x = b.input("x", DType::F16, [64, 100]);
            let r = b.input("r", DType::BF16, [100]);
            let c = b.input("c", DType::F32, [64, 1]);
            let y = x.cast(DType::F32) * r.cast(DType::F32) + c;
            b.output("y16", y.cast(DType::F16));
            b.output("ybf16", y.exp().cast(DType::BF16));
            // bool to half types (through f32: exact there).
            let m = y.gt(c);
            b.output("m16", m.cast(DType::F16) * y.cast(DType::F16));
            b.output("mbf16", m.cast(DType::BF16));
        },
    )?;
    c.add("elementwise i32 and select".into(), 50, &|b| {
        let p = b.input("p", DType::I32, [33, 17]);
        let q = b.input("q", DType::I32, [33, 17]);
        let s = p * q + 7.0;
        b.output("s", s.maximum(q));
        let x = p.cast(DType::F32);
        b.output("sel", b.select(p.gt(q), x, -x));
    })?;
    rows::cases(c)?;
    // Elementwise by vectors along a strided space's last dim: attention's heads
    // `[b, h, s, d]` read as `[b, s, h, d]`, scaled per (b, s, h) (a scalar a vector
    // step) and by a position (the index of each element), stored as f32.
    c.add(
        "elementwise bf16 heads transposed, 4 along the head dim a step, a per-row scale".into(),
        0,
        &|b| {
            let x = b.input("x", DType::BF16, [2, 4, 6, 16]);
            let sc = b.input("sc", DType::F32, [2, 6, 4, 1]);
            let pos = b.iota(DType::F32, [2, 6, 4, 16], 3);
            b.output("y", x.transpose(&[0, 2, 1, 3]).cast(DType::F32) * sc + pos);
        },
    )?;
    // Op kernels.
    c.add("op concat, 16-byte copies through transposed views".into(), 0, &|b| {
        // Heads' gradients [b, h, s, d] as [b, s, h, d], joined along the heads.
        let x = b.input("x", DType::BF16, [2, 3, 4, 8]);
        let y = b.input("y", DType::BF16, [2, 3, 4, 8]);
        let z = b.input("z", DType::BF16, [2, 3, 4, 8]);
        let p = [0, 2, 1, 3];
        b.output("c", b.concat(&[x.transpose(&p), y.transpose(&p), z.transpose(&p)], 2));
        let u = b.input("u", DType::F32, [6, 3, 4]);
        let w = b.input("w", DType::F32, [6, 5, 4]);
        b.output("d", b.concat(&[u, w], 1));
    })?;
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
    // Along axis 0 (the embedding gradient) the row-block kernel: 2,100 positions are
    // 2 rounds of its index scan (the second partial), 300 rows of 96 are 5 blocks of 64 rows (the last of 44); the bf16
    // updates are read through a transposed view. Along axis 1, the element kernel.
    c.add(
        "op scatter_add (embedding gradient, repeated rows) f32 + bf16".into(),
        300,
        &|b| {
            let ids = b.input("ids", DType::I64, [3, 700]);
            let g = b.input("g", DType::F32, [3, 700, 96]);
            b.output("d", g.scatter_add(ids, 0, 300));
            let gt = b.input("gt", DType::BF16, [96, 3, 700]);
            b.output("dt", gt.transpose(&[1, 2, 0]).scatter_add(ids, 0, 300));
            let few = b.input("few", DType::I64, [4, 7]);
            let h = b.input("h", DType::BF16, [3, 4, 7, 5]);
            b.output("dh", h.scatter_add(few, 1, 300));
        },
    )?;
    // Attention, small: softmax(q k^T / 8) v over [2, 4 heads, 32, 16].
    c.add("attention bf16 [2,4,32,16]".into(), 0, &|b| {
        let q = b.input("q", DType::BF16, [2, 4, 32, 16]);
        let kk = b.input("k", DType::BF16, [2, 4, 32, 16]);
        let v = b.input("v", DType::BF16, [2, 4, 32, 16]);
        let s: Value = q.matmul(kk.transpose(&[0, 1, 3, 2])) * 0.25;
        b.output("o", softmax(s, -1).matmul(v));
    })?;
    conv::cases(c)?;
    attention::cases(c)
}

/// Whole models.
fn model_cases(c: &mut Cases) -> Result<(), GraphError> {
    let block = crate::models::gpt(&crate::models::GptConfig::default())?;
    let inputs = crate::random_inputs(&block, 77);
    c.0.push(Case {
        name: "model: transformer block f32".into(),
        graph: block,
        inputs,
        train: None,
        precision: Default::default(),
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
        train: None,
        precision: Default::default(),
    });
    Ok(())
}

/// Whole training steps of an MLP (odd widths: vector loops with tails): the loss,
/// the backward and every parameter's update, the updates run by multi-tensor
/// launches, each parameter and moment written over its input (donated). The
/// moments start non-zero (AdamW's second moment non-negative) and the step counter
/// at 3, so every term of the update counts.
fn train_cases(c: &mut Cases) -> Result<(), GraphError> {
    use crate::train::{AdamW, Loss, LossKind, Optimizer, Sgd, StateClass, TrainOptions};
    let cfg = crate::models::MlpConfig {
        batch: 8,
        widths: vec![13, 40, 6],
        ..Default::default()
    };
    let optimizers = [
        (
            "adamw",
            Optimizer::AdamW(AdamW {
                lr: 1e-2,
                weight_decay: 0.1,
                ..AdamW::default()
            }),
        ),
        (
            "sgd nesterov",
            Optimizer::Sgd(Sgd {
                lr: 0.1,
                momentum: 0.9,
                dampening: 0.0,
                weight_decay: 0.01,
                nesterov: true,
            }),
        ),
    ];
    use graphc_compiler::passes::precision::Precision;
    // AdamW in f32, SGD in f32, AdamW in bf16, AdamW in fp16 with loss scaling.
    // And AdamW in bf16, and in fp16 with loss scaling, accumulating 2 microbatches
    // (the call that updates: the counter at 1, the sums random). Then a
    // cross-entropy over the 6 outputs as classes in bf16 (labels with an ignored
    // one): the label's log-probability read at its index, its gradient a one-hot.
    let runs = [
        (optimizers[0].clone(), Precision::Fp32, None, 1, LossKind::Mse),
        (optimizers[1].clone(), Precision::Fp32, None, 1, LossKind::Mse),
        (optimizers[0].clone(), Precision::Bf16, None, 1, LossKind::Mse),
        (
            optimizers[0].clone(),
            Precision::Fp16,
            Some(crate::train::LossScaling::default()),
            1,
            LossKind::Mse,
        ),
        (optimizers[0].clone(), Precision::Bf16, None, 2, LossKind::Mse),
        (
            optimizers[0].clone(),
            Precision::Fp16,
            Some(crate::train::LossScaling::default()),
            2,
            LossKind::Mse,
        ),
        (optimizers[0].clone(), Precision::Bf16, None, 1, LossKind::CrossEntropy),
    ];
    for (i, ((label, optimizer), precision, loss_scale, accumulate, kind)) in runs.into_iter().enumerate() {
        let mut label = match precision {
            Precision::Fp32 => label.to_string(),
            Precision::Fp16 => format!("{label} fp16 loss-scaled"),
            p => format!("{label} {p}"),
        };
        if accumulate > 1 {
            label = format!("{label} accumulating {accumulate}");
        }
        if kind == LossKind::CrossEntropy {
            label = format!("{label} cross-entropy");
        }
        let graph = crate::models::mlp(&cfg)?;
        let seed = 5000 + 16 * i as u64;
        let x = random(TensorType::new(DType::F32, [cfg.batch, 13]), seed);
        let y = match kind {
            LossKind::CrossEntropy => {
                let labels: Vec<f64> = (0..cfg.batch)
                    .map(|k| if k == 3 { -100.0 } else { ((k * 5 + 1) % 6) as f64 })
                    .collect();
                Tensor::new([cfg.batch], TensorData::from_f64(DType::I64, &labels))
                    .map_err(|e| GraphError::Graph(format!("training step {label}: labels: {e}")))?
            }
            _ => random(TensorType::new(DType::F32, [cfg.batch, 6]), seed + 1),
        };
        let opts = TrainOptions {
            loss: Loss::new(kind, "y"),
            optimizer,
            freeze: None,
            target: y.ty(),
            output: None,
            loss_scale,
            remat: Default::default(),
            accumulate,
        };
        let copts = crate::CompileOptions {
            precision,
            ..Default::default()
        };
        let step = crate::train::compile_step(&graph, opts.clone(), &copts)
            .map_err(|e| GraphError::Graph(format!("training step {label}: {e}")))?;
        let Some(training) = &step.train else {
            return Err(GraphError::Graph(format!("training step {label}: no state")));
        };
        let mut inputs: HashMap<String, Tensor> = [("x".to_string(), x), ("y".to_string(), y)].into();
        for (k, slot) in training.state.slots.iter().enumerate() {
            let t = match slot.class {
                StateClass::OptimizerState => {
                    let r = random(slot.init.ty(), seed + 2 + k as u64).to_f64_vec();
                    let v: Vec<f64> = r.iter().map(|x| 0.01 * x.abs()).collect();
                    Tensor::new(slot.init.ty().shape, TensorData::from_f64(slot.init.ty().dtype, &v))
                        .map_err(|e| e.to_string())
                }
                StateClass::Step => {
                    let ty = slot.init.ty();
                    Tensor::new(ty.shape.clone(), TensorData::from_f64(ty.dtype, &vec![3.0; ty.numel()]))
                        .map_err(|e| e.to_string())
                }
                StateClass::Accumulator if slot.init.ty().dtype == DType::I64 => {
                    let ty = slot.init.ty();
                    Tensor::new(
                        ty.shape.clone(),
                        TensorData::from_f64(ty.dtype, &vec![accumulate as f64 - 1.0; ty.numel()]),
                    )
                    .map_err(|e| e.to_string())
                }
                StateClass::Accumulator => {
                    let r = random(slot.init.ty(), seed + 2 + k as u64).to_f64_vec();
                    let v: Vec<f64> = r.iter().map(|x| 0.1 * x).collect();
                    Tensor::new(slot.init.ty().shape, TensorData::from_f64(slot.init.ty().dtype, &v))
                        .map_err(|e| e.to_string())
                }
                StateClass::Parameter | StateClass::LossScale | StateClass::Statistics => slot.init.tensor(),
            }
            .map_err(|e| GraphError::Graph(format!("training step {label}: state {}: {e}", slot.name)))?;
            inputs.insert(slot.name.clone(), t);
        }
        c.0.push(Case {
            name: format!("training step {label}: mlp, multi-tensor update"),
            graph,
            inputs,
            train: Some(opts),
            precision,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(dtype: DType, v: &[f64]) -> Tensor {
        Tensor::new([v.len()], TensorData::from_f64(dtype, v)).unwrap()
    }

    #[test]
    fn integer_outputs_are_exact() {
        let a = t(DType::I32, &[1.0, 2.0, 3.0]);
        let b = t(DType::I32, &[1.0, 2.0, 4.0]);
        assert_eq!(output_error(&a, &a), 0.0);
        assert_eq!(output_error(&a, &b), f64::INFINITY);
        assert_eq!(tolerance(DType::I32, true), 0.0, "TF32 GEMMs do not loosen integers");
        // i64 values f64 cannot tell apart are still told apart.
        let big = 1i64 << 60;
        let x = Tensor::new([1], TensorData::I64(vec![big])).unwrap();
        let y = Tensor::new([1], TensorData::I64(vec![big + 1])).unwrap();
        assert_eq!(x.to_f64_vec(), y.to_f64_vec());
        assert_eq!(output_error(&x, &y), f64::INFINITY);
        let p = t(DType::Bool, &[1.0, 0.0]);
        let q = t(DType::Bool, &[1.0, 1.0]);
        assert_eq!(output_error(&p, &q), f64::INFINITY);
    }

    #[test]
    fn compare_outputs_checks_names_and_counts_then_every_output() {
        let f = t(DType::F32, &[1.0, 2.0]);
        let i = t(DType::I64, &[3.0, 4.0]);
        let want = vec![("y".to_string(), f.clone()), ("arg".to_string(), i.clone())];
        let checks = compare_outputs(&want, &want, false).unwrap();
        assert_eq!(checks.len(), 2);
        assert!(checks.iter().all(|c| c.pass && c.rel_l2 == 0.0));

        let short = vec![("y".to_string(), f.clone())];
        let e = compare_outputs(&short, &want, false).unwrap_err();
        assert_eq!(e, CompareError::Count { got: 1, want: 2 });
        let renamed = vec![("y".to_string(), f.clone()), ("idx".to_string(), i.clone())];
        let e = compare_outputs(&renamed, &want, false).unwrap_err();
        assert!(matches!(e, CompareError::Name { index: 1, .. }), "{e}");

        let off = vec![("y".to_string(), f), ("arg".to_string(), t(DType::I64, &[3.0, 5.0]))];
        let checks = compare_outputs(&off, &want, true).unwrap();
        assert!(checks[0].pass);
        assert!(
            !checks[1].pass,
            "an integer output is compared, not skipped: {checks:?}"
        );
    }

    /// The training cases run the parameters' updates in one multi-tensor launch.
    #[test]
    fn training_cases_run_their_updates_as_one_multi_tensor_kernel() {
        let cases: Vec<Case> = cases().unwrap().into_iter().filter(|c| c.train.is_some()).collect();
        assert_eq!(cases.len(), 7);
        for case in cases {
            let opts = crate::CompileOptions {
                precision: case.precision,
                ..Default::default()
            };
            let step = crate::train::compile_step(&case.graph, case.train.clone().unwrap(), &opts).unwrap();
            let multi = step.program.multi_tensor_parts();
            // The schedule runs each update as soon as its gradient is there
            // (`program:hoist`) and merging must not raise the peak, so some updates of
            // this small model run alone; the others share a launch.
            assert!(
                !multi.is_empty() && multi.iter().sum::<usize>() >= 2,
                "{}: two or more of the 4 parameters' updates in one launch: {multi:?}",
                case.name
            );
            assert_eq!(step.program.donated.len(), step.train.unwrap().state.slots.len());
        }
    }

    #[test]
    fn a_missing_device_is_kept_typed() {
        let case = Case {
            name: "relu".into(),
            graph: {
                let b = GraphBuilder::new();
                let x = b.input("x", DType::F32, [4]);
                b.output("y", x.relu());
                b.finish().unwrap()
            },
            inputs: [("x".to_string(), random(TensorType::new(DType::F32, [4]), 1))].into(),
            train: None,
            precision: Default::default(),
        };
        let mut no_gpu = |_: &Compiled, _: &HashMap<String, Tensor>| -> Outputs {
            Err(crate::Error::Cuda(crate::cuda::CudaError::NoDevice("no GPU".into())))
        };
        let r = run_case(&case, false, &mut no_gpu);
        assert!(!r.pass);
        assert!(matches!(r.no_device, Some(crate::cuda::CudaError::NoDevice(_))));
        let mut broken = |_: &Compiled, _: &HashMap<String, Tensor>| -> Outputs {
            Err(crate::Error::Cuda(crate::cuda::CudaError::NoCublasLt(
                "no cuBLASLt".into(),
            )))
        };
        let r = run_case(&case, false, &mut broken);
        assert!(r.no_device.is_none() && r.error.is_some());
        let mut cpu = |c: &Compiled, i: &HashMap<String, Tensor>| crate::run_cpu(c, i.clone());
        let r = run_case(&case, false, &mut cpu);
        assert!(r.pass, "{r:?}");
    }
}
