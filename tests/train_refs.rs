//! Training steps against PyTorch (`scripts/train_refs.py`, fixtures in
//! `tests/fixtures/train`): an MLP with MSE, a 2-layer GPT-2 LM exported with eager and
//! with SDPA attention, a small BERT with cross-entropy over masked tokens (labels
//! -100 elsewhere) and a tiny Llama (RMSNorm, rotary embeddings, grouped-query heads,
//! SiLU), and a small CNN with BatchNorm in training mode (batch statistics; its running
//! statistics, updated as state, checked too). Each is trained 3 steps with SGD (momentum, dampening, weight decay) and 3
//! with AdamW on one batch, on the CPU executor and on cuda-sim (every forward and
//! backward kernel's CUDA C run on the host): each step's loss and every parameter
//! after the third must equal PyTorch's to relative error 1e-4.

use std::collections::HashMap;
use std::path::PathBuf;

use graphc::ir::compare::relative_l2;
use graphc::ir::{Tensor, TensorData};
use graphc::train::{AdamW, Loss, LossKind, Optimizer, Sgd, StepRunner, TrainOptions};
use graphc::Compiled;
use serde_json::Value;

#[path = "train_refs/memory.rs"]
mod memory;

const MODELS: [&str; 6] = ["mlp", "cnn", "gpt2", "gpt2_sdpa", "bert", "llama"];

fn dir(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/train")
        .join(name)
}

fn arrays(path: PathBuf) -> HashMap<String, Tensor> {
    graphc::npz::read_arrays(&path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .into_iter()
        .collect()
}

struct Fixture {
    name: &'static str,
    graph: graphc::ir::Graph,
    batch: HashMap<String, Tensor>,
    meta: Value,
}

fn load(name: &'static str) -> Fixture {
    let d = dir(name);
    let graph = graphc::load_model(&d.join("model.onnx"), &[]).unwrap_or_else(|e| panic!("{name}: {e}"));
    let meta: Value = serde_json::from_str(&std::fs::read_to_string(d.join("meta.json")).unwrap()).unwrap();
    Fixture {
        name,
        graph,
        batch: arrays(d.join("inputs.npz")),
        meta,
    }
}

fn options(f: &Fixture, optimizer: &str) -> TrainOptions {
    let m = &f.meta;
    let target = m["target"].as_str().unwrap().to_string();
    let kind = match m["loss"].as_str().unwrap() {
        "mse" => LossKind::Mse,
        _ => LossKind::CrossEntropy,
    };
    let o = &m["optimizers"][optimizer];
    let num = |k: &str| o[k].as_f64().unwrap();
    let optimizer = match optimizer {
        "sgd" => Optimizer::Sgd(Sgd {
            lr: num("lr"),
            momentum: num("momentum"),
            dampening: num("dampening"),
            weight_decay: num("weight_decay"),
            nesterov: false,
        }),
        _ => Optimizer::AdamW(AdamW {
            lr: num("lr"),
            betas: (o["betas"][0].as_f64().unwrap(), o["betas"][1].as_f64().unwrap()),
            eps: num("eps"),
            weight_decay: num("weight_decay"),
        }),
    };
    TrainOptions {
        loss: Loss {
            kind,
            target: target.clone(),
            ignore_index: -100,
            shift_labels: m["shift"].as_bool().unwrap(),
        },
        optimizer,
        freeze: None,
        target: f.batch[&target].ty(),
        output: None,
        loss_scale: None,
        remat: Default::default(),
        accumulate: 1,
    }
}

fn rel(a: f64, b: f64) -> f64 {
    (a - b).abs() / b.abs().max(1e-12)
}

/// The relative L2 error of parameter `got` against PyTorch's `want`, with the
/// elements whose first-step gradient (`grad.NAME` of `grads`) is at most 1e-6 of
/// `top` left out, after checking they are within `bound` of PyTorch's; and how many
/// were left out.
fn rel_l2_without_noise(
    what: &str,
    name: &str,
    got: &Tensor,
    want: &Tensor,
    noise: Option<(&HashMap<String, Tensor>, f64, f64)>,
) -> (f64, usize) {
    let (mut gv, mut wv) = (got.to_f64_vec(), want.to_f64_vec());
    let mut left_out = 0;
    if let Some((grads, top, bound)) = noise {
        if let Some(grad) = grads.get(&format!("grad.{name}")) {
            for (i, gr) in grad.to_f64_vec().into_iter().enumerate() {
                if gr.abs() <= 1e-6 * top {
                    assert!(
                        (gv[i] - wv[i]).abs() <= bound,
                        "{what}: {name}[{i}] {} vs PyTorch {}: more than AdamW's steps apart",
                        gv[i],
                        wv[i]
                    );
                    gv[i] = 0.0;
                    wv[i] = 0.0;
                    left_out += 1;
                }
            }
        }
    }
    let w = Tensor::new(want.shape().clone(), TensorData::from_f64(want.dtype(), &wv)).unwrap();
    let g = Tensor::new(got.shape().clone(), TensorData::from_f64(want.dtype(), &gv)).unwrap();
    (relative_l2(&g, &w), left_out)
}

/// Three steps on `runner`, checked against `want` (losses and parameters).
fn check<R: StepRunner>(
    what: &str,
    step: &Compiled,
    mut s: graphc::train::Stateful<R>,
    f: &Fixture,
    want: &HashMap<String, Tensor>,
) {
    let adamw_lr = what
        .contains("adamw")
        .then(|| f.meta["optimizers"]["adamw"]["lr"].as_f64().unwrap());
    let losses = want["losses"].to_f64_vec();
    for (i, &w) in losses.iter().enumerate() {
        let got = graphc::train::step_loss(&mut s, &f.batch).unwrap_or_else(|e| panic!("{what}: {e}"));
        assert!(
            rel(got, w) <= 1e-4,
            "{what}: step {} loss {got} vs PyTorch {w} (relative {:.2e})",
            i + 1,
            rel(got, w)
        );
    }
    let params = graphc::train::parameters(step, &mut s).unwrap();
    let names: Vec<&str> = f.meta["parameters"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    // BatchNorm's running statistics come back beside the parameters; PyTorch's are
    // `running.NAME`.
    let stats = params
        .iter()
        .filter(|(n, _)| want.contains_key(&format!("running.{n}")))
        .count();
    assert_eq!(
        params.len() - stats,
        names.len(),
        "{what}: trained {} parameters, PyTorch {}",
        params.len() - stats,
        names.len()
    );
    let mut worst = 0.0f64;
    let mut noise = 0;
    let grad_top = want
        .iter()
        .filter(|(k, _)| k.starts_with("grad."))
        .flat_map(|(_, t)| t.to_f64_vec())
        .fold(0.0f64, |m, x| m.max(x.abs()));
    for (name, got) in &params {
        let w = want
            .get(name)
            .or_else(|| want.get(&format!("running.{name}")))
            .unwrap_or_else(|| panic!("{what}: PyTorch has no parameter {name}"));
        // AdamW divides by the gradient's own size, so where the gradient is 0 in exact
        // arithmetic (attention's key bias: softmax ignores a shift of its row) rounding
        // noise becomes a full step of about lr, different in every implementation.
        // Those elements (first-step |grad| below 1e-6 of the model's largest) must
        // stay within 1.5 lr per step of PyTorch's, and are left out of the L2 check.
        let noise_rule = adamw_lr.map(|lr| (want, grad_top, 1.5 * lr * losses.len() as f64));
        let (err, n) = rel_l2_without_noise(what, name, got, w, noise_rule);
        noise += n;
        worst = worst.max(err);
        assert!(err <= 1e-4, "{what}: parameter {name} relative L2 {err:.2e} vs PyTorch");
    }
    println!(
        "{what}: losses match, {} parameters and {stats} running statistics within {worst:.1e} ({noise} elements \
         of zero gradient)",
        params.len() - stats
    );
}

#[test]
fn three_sgd_and_three_adamw_steps_match_pytorch_on_the_cpu_and_cuda_sim() {
    let cxx = graphc::cuda::sim::build::find_compiler().is_ok();
    if !cxx {
        graphc_testkit::skip(graphc_testkit::Need::Cxx, "no host C++ compiler: cuda-sim not run");
    }
    for name in MODELS {
        let f = load(name);
        for opt in ["sgd", "adamw"] {
            let want = arrays(dir(name).join(format!("{opt}.npz")));
            let step = graphc::train::compile_step(&f.graph, options(&f, opt), &Default::default())
                .unwrap_or_else(|e| panic!("{name} {opt}: {e}"));
            check(
                &format!("{name} {opt} cpu"),
                &step,
                graphc::train::cpu_session(&step).unwrap(),
                &f,
                &want,
            );
            if cxx {
                let s = graphc::train::sim_session(&step, &Default::default()).unwrap();
                check(&format!("{name} {opt} cuda-sim"), &step, s, &f, &want);
            }
            // The causal LMs' MLPs in 2 parts of their tokens, every layer made again in
            // its backward (the parts' forward recomputed there): the same losses and
            // parameters (the weights' gradients summed over the parts).
            if matches!(name, "gpt2" | "llama") && opt == "adamw" {
                let label = format!("{name} {opt} mlps in 2 parts, remat full");
                let mut o = options(&f, opt);
                o.remat = graphc::train::Remat::Full;
                let base = graphc::CompileOptions {
                    mlp_chunks: 2,
                    ..Default::default()
                };
                let step = graphc::train::compile_step(&f.graph, o, &base).unwrap_or_else(|e| panic!("{label}: {e}"));
                let report = &step.train.as_ref().unwrap().report;
                assert_eq!(report.mlp_parts.chunks, 2, "{label}: {:?}", report.mlp_parts);
                assert!(report.mlp_parts.regions >= 1, "{label}: {:?}", report.mlp_parts);
                assert!(report.recomputed_layers.is_some(), "{label}");
                let s = graphc::train::cpu_session(&step).unwrap();
                check(&format!("{label} cpu"), &step, s, &f, &want);
                if cxx {
                    let s = graphc::train::sim_session(&step, &Default::default()).unwrap();
                    check(&format!("{label} cuda-sim"), &step, s, &f, &want);
                }
            }
        }
    }
}

/// Mixed precision against PyTorch's autocast (`scripts/train_refs.py`,
/// `mixed_precision`): bf16 (no scaling) and fp16 with GradScaler's dynamic loss
/// scaling, 3 AdamW steps each with f32 master parameters: every loss and every
/// parameter after the third within 2e-2 (relative) of PyTorch's; the scale of each
/// fp16 step equal to GradScaler's. And from an initial scale that overflows (with a
/// growth interval of 2), graphc skips exactly the steps PyTorch skips and ends with
/// its scale.
fn check_amp<R: StepRunner>(
    what: &str,
    step: &Compiled,
    mut s: graphc::train::Stateful<R>,
    f: &Fixture,
    want: &HashMap<String, Tensor>,
    params: bool,
) -> (f64, f64) {
    let losses = want["losses"].to_f64_vec();
    let scales = want.get("scales").map(|t| t.to_f64_vec());
    let skipped: Option<Vec<bool>> = want.get("skipped").map(|t| match t.data() {
        TensorData::Bool(v) => v.clone(),
        other => panic!("{what}: skipped is {}", other.dtype()),
    });
    let mut worst_loss = 0.0f64;
    for (i, &w) in losses.iter().enumerate() {
        let out = graphc::train::step_once(&mut s, &f.batch).unwrap_or_else(|e| panic!("{what}: {e}"));
        let r = rel(out.loss, w);
        worst_loss = worst_loss.max(r);
        assert!(
            r <= 2e-2,
            "{what}: step {} loss {} vs PyTorch {w} (relative {r:.2e})",
            i + 1,
            out.loss
        );
        if let (Some(sc), Some(sk)) = (&scales, &skipped) {
            assert_eq!(
                out.loss_scale.map(|x| x as f32),
                Some(sc[i] as f32),
                "{what}: step {} scale",
                i + 1
            );
            assert_eq!(out.skipped, sk[i], "{what}: step {} skipped", i + 1);
        } else {
            assert_eq!(out.loss_scale, None, "{what}: no loss scaling");
        }
    }
    if let Some(fin) = want.get("final_scale") {
        let state = s.state().unwrap();
        let got = state[graphc_compiler::train::scale::SCALE].to_f64_vec()[0];
        assert_eq!(
            got as f32,
            fin.to_f64_vec()[0] as f32,
            "{what}: the scale after the last step"
        );
    }
    let mut worst = 0.0f64;
    if params {
        // Elements whose gradient is 0 in exact arithmetic (attention's key bias) take
        // AdamW steps of about lr from rounding noise, different in every
        // implementation: they must stay within two such steps per step and are
        // left out of the L2 figure (the f32 reference's first-step gradients tell
        // them).
        let fp32 = arrays(dir(f.name).join("adamw.npz"));
        let lr = f.meta["optimizers"]["adamw"]["lr"].as_f64().unwrap();
        let grad_top = fp32
            .iter()
            .filter(|(k, _)| k.starts_with("grad."))
            .flat_map(|(_, t)| t.to_f64_vec())
            .fold(0.0f64, |m, x| m.max(x.abs()));
        let got = graphc::train::parameters(step, &mut s).unwrap();
        for (name, g) in &got {
            let w = want
                .get(name)
                .unwrap_or_else(|| panic!("{what}: PyTorch has no parameter {name}"));
            // Each side's step is at most about lr, of either sign.
            let (err, _) = rel_l2_without_noise(
                what,
                name,
                g,
                w,
                Some((&fp32, grad_top, 2.1 * lr * losses.len() as f64)),
            );
            worst = worst.max(err);
            assert!(err <= 2e-2, "{what}: parameter {name} relative L2 {err:.2e} vs PyTorch");
        }
    }
    let p = if params {
        format!("parameters within {worst:.1e}")
    } else {
        "parameters not compared".into()
    };
    println!("{what}: losses within {worst_loss:.1e}, {p} of PyTorch autocast");
    (worst_loss, worst)
}

#[test]
fn bf16_and_fp16_steps_match_pytorch_autocast_and_grad_scaler() {
    use graphc::train::LossScaling;
    use graphc_compiler::passes::precision::Precision;
    let cxx = graphc::cuda::sim::build::find_compiler().is_ok();
    // Not the CNN: autocast keeps BatchNorm's batch statistics in f32, where graphc's
    // precision pass stores every value between kernels in the low type (its first
    // BatchNorm's bias ends 3% from PyTorch's in bf16; see ARCHITECTURE.md).
    for name in MODELS.into_iter().filter(|&n| n != "cnn") {
        let f = load(name);
        let amp = &f.meta["amp"];
        let cases = [
            ("bf16", Precision::Bf16, None, 3),
            ("fp16", Precision::Fp16, Some(LossScaling::default()), 3),
            (
                "fp16 overflow",
                Precision::Fp16,
                Some(LossScaling {
                    init_scale: amp["overflow_init_scale"].as_f64().unwrap(),
                    growth_interval: amp["overflow_growth_interval"].as_u64().unwrap() as u32,
                    ..LossScaling::default()
                }),
                6,
            ),
        ];
        for (label, precision, scaling, _) in cases {
            let file = match label {
                "bf16" => "bf16_adamw.npz",
                "fp16" => "fp16_adamw.npz",
                _ => "fp16_overflow.npz",
            };
            let want = arrays(dir(name).join(file));
            let mut opts = options(&f, "adamw");
            opts.loss_scale = scaling;
            // Also with the LM head and the loss in two parts of the tokens, each part's
            // logits made again in its backward (GPT-2 and Llama: the causal LMs).
            let parts: &[usize] = if matches!(name, "gpt2" | "llama") && label != "fp16 overflow" {
                &[0, 2]
            } else {
                &[0]
            };
            for &chunks in parts {
                let base = graphc::CompileOptions {
                    precision,
                    token_chunks: chunks,
                    ..Default::default()
                };
                let label = if chunks > 0 {
                    format!("{label} loss in {chunks} parts")
                } else {
                    label.to_string()
                };
                let step = graphc::train::compile_step(&f.graph, opts.clone(), &base)
                    .unwrap_or_else(|e| panic!("{name} {label}: {e}"));
                if chunks > 0 {
                    let r = step.train.as_ref().unwrap().report.recomputed_logits;
                    assert_eq!(r.map(|r| r.parts), Some(chunks), "{name} {label}");
                }
                let params = !label.starts_with("fp16 overflow");
                let s = graphc::train::cpu_session(&step).unwrap();
                check_amp(&format!("{name} {label} cpu"), &step, s, &f, &want, params);
                // cuda-sim runs the low-precision kernels' CUDA C (the other models' are
                // the same kernels at other shapes).
                if cxx && name == "gpt2" {
                    let s = graphc::train::sim_session(&step, &Default::default()).unwrap();
                    check_amp(&format!("{name} {label} cuda-sim"), &step, s, &f, &want, params);
                }
            }
        }
    }
}

/// The step's state: trainable parameters (buffers such as Llama's rotary inverse
/// frequencies excluded), moments, one step counter; `freeze` keeps weights frozen
/// (and folded), and a frozen weight is not updated.
#[test]
fn state_classes_freeze_and_buffers() {
    let f = load("llama");
    let mut opts = options(&f, "adamw");
    let step = graphc::train::compile_step(&f.graph, opts.clone(), &Default::default()).unwrap();
    let t = step.train.as_ref().unwrap();
    assert_eq!(t.report.buffers, vec!["m.model.rotary_emb.inv_freq".to_string()]);
    let params = t.state.parameters().count();
    assert_eq!(params, 21);
    // Two moments per parameter and one step counter.
    assert_eq!(t.state.slots.len(), 3 * params + 1);
    let by = t.state.bytes_by_class();
    assert_eq!(
        by[&graphc::train::StateClass::OptimizerState],
        2 * by[&graphc::train::StateClass::Parameter]
    );

    opts.freeze = Some("embed_tokens|layers\\.0\\.".into());
    let step = graphc::train::compile_step(&f.graph, opts.clone(), &Default::default()).unwrap();
    let t = step.train.as_ref().unwrap();
    assert!(t.report.frozen.iter().any(|n| n.contains("embed_tokens")));
    assert!(t
        .state
        .parameters()
        .all(|s| !s.name.contains("layers.0.") && !s.name.contains("embed_tokens")));
    let mut s = graphc::train::cpu_session(&step).unwrap();
    let l1 = graphc::train::step_loss(&mut s, &f.batch).unwrap();
    let l2 = graphc::train::step_loss(&mut s, &f.batch).unwrap();
    assert!(l2 < l1, "training the unfrozen layers lowers the loss: {l1} -> {l2}");

    opts.freeze = Some(".".into());
    let err = graphc::train::compile_step(&f.graph, opts.clone(), &Default::default()).unwrap_err();
    assert!(err.to_string().contains("nothing to train"), "{err}");
    opts.freeze = Some("(".into());
    let err = graphc::train::compile_step(&f.graph, opts, &Default::default()).unwrap_err();
    assert!(err.to_string().contains("--freeze"), "{err}");
}

/// The training plans of the transformer references: no `[.., s, s]` buffer (attention
/// forward and backward fused), every state slot updated in place (and the plan's
/// donation check holds), and the bytes by class add up to the plan's total.
#[test]
fn training_plans_have_no_score_matrices_and_add_up_by_class() {
    use graphc_compiler::passes::precision::Precision;
    use graphc_compiler::plan::{report::TrainBytes, Device};
    for (name, precision) in ["gpt2", "gpt2_sdpa", "bert", "llama"]
        .into_iter()
        .flat_map(|n| [Precision::Fp32, Precision::Bf16, Precision::Fp16].map(|p| (n, p)))
    {
        let f = load(name);
        let seq = f.batch["input_ids"].shape().dims()[1];
        let mut opts = options(&f, "adamw");
        if precision == Precision::Fp16 {
            opts.loss_scale = Some(graphc::train::LossScaling::default());
        }
        let base = graphc::CompileOptions {
            precision,
            ..Default::default()
        };
        let step = graphc::train::compile_step(&f.graph, opts, &base).unwrap();
        let name = format!("{name} {precision}");
        // With mixed precision: no f32 [tokens, classes] tensor (the loss reads the
        // low-type logits and writes their gradient over them), and the parameters'
        // low-precision copies are no saved activation.
        let classes = step.train.as_ref().unwrap().report.classes.unwrap();
        let tokens = f.batch["input_ids"].ty().numel();
        if precision != Precision::Fp32 {
            let outputs: Vec<usize> = step.program.outputs.iter().map(|(_, b)| b.index()).collect();
            let f32_logits: Vec<String> = step
                .program
                .buffers
                .iter()
                .enumerate()
                .filter(|(i, _)| !outputs.contains(i))
                .map(|(_, b)| b)
                .filter(|b| {
                    matches!(b.kind, graphc_compiler::kernel::BufferKind::Temp)
                        && b.ty.dtype.size_bytes() >= 4
                        && b.ty
                            .shape
                            .dims()
                            .split_last()
                            .is_some_and(|(&c, lead)| c == classes && lead.iter().product::<usize>() == tokens)
                })
                .map(|b| format!("{} {}", b.name.clone().unwrap_or_default(), b.ty))
                .collect();
            assert!(
                f32_logits.is_empty(),
                "{name}: f32 [tokens, classes] buffers: {f32_logits:?}"
            );
        }
        let scores: Vec<String> = step
            .program
            .buffers
            .iter()
            .filter(|b| {
                let d = b.ty.shape.dims();
                d.len() >= 3 && d[d.len() - 1] == seq && d[d.len() - 2] == seq
            })
            .map(|b| format!("{} {}", b.name.clone().unwrap_or_default(), b.ty))
            .collect();
        assert!(
            scores.is_empty(),
            "{name}: [.., s, s] buffers in the training plan: {scores:?}"
        );
        // Attention's backward: the gradients of k and v of one layer are one kernel
        // (where the tensor-core kernel's head dims take it), the gradient of q another.
        let grads: Vec<(graphc_ir::AttentionOperand, usize)> = step
            .program
            .kernels
            .iter()
            .filter_map(|k| match &k.kind {
                graphc_compiler::kernel::KernelKind::Op(o) => match o.op {
                    graphc_ir::Op::AttentionGrad { wrt, .. } => Some((wrt, o.siblings.len())),
                    _ => None,
                },
                _ => None,
            })
            .collect();
        if name.starts_with("gpt2_sdpa") {
            use graphc_ir::AttentionOperand::{K, Q};
            let want = if precision == Precision::Fp32 { 3 } else { 2 };
            assert!(
                !grads.is_empty() && grads.len().is_multiple_of(want),
                "{name}: {grads:?}"
            );
            assert!(
                grads.iter().all(|&(wrt, s)| match (want, wrt) {
                    (3, _) | (_, Q) => s == 0,
                    _ => wrt == K && s == 1,
                }),
                "{name}: {grads:?}"
            );
        }
        let t = step.train.as_ref().unwrap();
        assert_eq!(
            step.program.donated.len(),
            t.state.slots.len(),
            "{name}: every slot in place"
        );
        graphc_compiler::train::donate::check(&step.program).unwrap();
        graphc_compiler::plan::verify_plan(&step.program, &step.plan).unwrap();
        let by = TrainBytes::of(&step.program, &step.plan, &t.state, Device::Cuda);
        assert_eq!(by.total, step.plan.total_bytes_for(Device::Cuda), "{name}: {by:?}");
        assert_eq!(
            by.saved_activations + by.gradients + by.temporaries + by.gemm_scratch,
            step.plan.lower_bound_bytes,
            "{name}: the arena's classes at its peak are its lower bound"
        );
        let scaler = if precision == Precision::Fp16 { 8 } else { 0 };
        assert_eq!(
            by.outputs,
            4 + scaler,
            "{name}: only the loss (and the scaler's report) is written beside its input"
        );
        let params: u64 = t.state.parameters().map(|s| s.init.ty().size_bytes() as u64).sum();
        assert_eq!(by.parameters, params, "{name}: f32 master parameters");
        assert_eq!(
            by.optimizer_state,
            2 * params + 8,
            "{name}: two f32 moments and an i64 step"
        );
        assert_eq!(by.loss_scale, scaler, "{name}: an f32 scale and an i32 tracker");
        assert_eq!(
            by.saved_by_layer.iter().map(|(_, b)| b).sum::<u64>(),
            by.saved_activations,
            "{name}: the layers' saved bytes add up"
        );
        assert!(by.saved_activations_all > 0 && by.gradients_all > 0);
        // The updates run as a few multi-tensor launches, which keep the peak the
        // schedule chose (holding gradients only where the live bytes are below it).
        let live = graphc_compiler::plan::live_bytes(&step.program);
        assert_eq!(
            live.iter().copied().max(),
            Some(step.schedule.peak),
            "{name}: merging the updates keeps the schedule's peak"
        );
        let parts: usize = step.program.multi_tensor_parts().iter().sum();
        let n = t.state.parameters().count();
        assert!(
            parts >= n / 2 && by.update_kernels <= n / 4,
            "{name}: {n} parameters, {parts} updates in multi-tensor launches, {} update kernels",
            by.update_kernels
        );
    }
}

/// A multi-tensor launch whose parts are not independent is rejected by the kernel
/// verifier, and a part reading another part's donated input by the donation check.
#[test]
fn dependent_parts_of_a_multi_tensor_launch_are_rejected() {
    use graphc_compiler::kernel::{verify, KernelKind, KernelVerifyError};
    let f = load("mlp");
    let step = graphc::train::compile_step(&f.graph, options(&f, "adamw"), &Default::default()).unwrap();
    let k = step
        .program
        .kernels
        .iter()
        .position(|k| matches!(k.kind, KernelKind::MultiTensor(_)))
        .expect("the MLP's updates in one launch");
    let mut p = step.program.clone();
    let KernelKind::MultiTensor(m) = &mut p.kernels[k].kind else {
        unreachable!()
    };
    let written = m.parts[0].stores[0].access.buffer;
    let donated_input = step.program.donated.iter().find(|d| d.output == written).unwrap().input;
    // Part 1 reads what part 0 writes.
    let mut bad = m.clone();
    let rank = bad.parts[1].space.len();
    bad.parts[1].inputs.push(graphc_compiler::kernel::Access {
        buffer: written,
        offset: 0,
        strides: vec![0; rank],
    });
    let mut q = step.program.clone();
    q.kernels[k].kind = KernelKind::MultiTensor(bad);
    let err = verify(&q).unwrap_err();
    assert!(
        matches!(err, KernelVerifyError::PartConflict { part: 1, other: 0, .. }),
        "{err}"
    );
    // Part 1 reads the input part 0 overwrites in place (same type: a valid kernel).
    let rank = m.parts[1].space.len();
    m.parts[1].inputs.push(graphc_compiler::kernel::Access {
        buffer: donated_input,
        offset: 0,
        strides: vec![0; rank],
    });
    verify(&p).unwrap();
    let err = graphc_compiler::train::donate::check(&p).unwrap_err();
    assert!(err.contains("only at the elements it stores"), "{err}");
}

/// A donation the schedule breaks is caught: the update moved before a reader of the
/// parameter it overwrites.
#[test]
fn a_broken_donation_is_reported() {
    let f = load("mlp");
    let step = graphc::train::compile_step(&f.graph, options(&f, "sgd"), &Default::default()).unwrap();
    let mut p = step.program.clone();
    let d = p.donated[0];
    let w = p.kernels.iter().position(|k| k.writes().contains(&d.output)).unwrap();
    let r = p.kernels.iter().position(|k| k.reads().contains(&d.input)).unwrap();
    assert!(r < w, "the first reader runs before the update");
    p.kernels.swap(r, w);
    let err = graphc_compiler::train::donate::check(&p).unwrap_err();
    assert!(err.contains("after kernel"), "{err}");
}
