//! Training steps that trade compute for memory give the step's values: layers
//! recomputed (`--remat full|auto`), gradients accumulated over microbatches
//! (`--accumulate`), the loss computed in parts (`--chunk-tokens` on a step).

use std::collections::HashMap;

use graphc::ir::compare::relative_l2;
use graphc::ir::Tensor;
use graphc::train::{AdamW, Loss, LossKind, Optimizer, Sgd, TrainOptions};

use super::{load, options, rel};

/// `--remat full` (gradient checkpointing): every layer's forward values but its input
/// are made again in the backward, so the step's peak holds fewer saved activations,
/// and 3 AdamW steps give the same losses and parameters as without, bit for bit, on
/// the CPU executor (each recomputed op computes what it computed the first time).
#[test]
fn full_recomputation_keeps_layer_inputs_only_and_changes_no_value() {
    use graphc_compiler::plan::{report::TrainBytes, Device};
    for name in ["gpt2", "gpt2_sdpa", "bert", "llama"] {
        let f = load(name);
        let mut opts = options(&f, "adamw");
        opts.remat = graphc::train::Remat::Off;
        let off = graphc::train::compile_step(&f.graph, opts.clone(), &Default::default()).unwrap();
        opts.remat = graphc::train::Remat::Full;
        let full = graphc::train::compile_step(&f.graph, opts, &Default::default()).unwrap();
        let r = full.train.as_ref().unwrap().report.recomputed_layers.unwrap();
        assert_eq!(r.layers, 2, "{name}: {r:?}");
        // Layer 0 reads the embeddings, which are kept anyway: one input per later layer.
        assert!(r.recomputed > 20 && r.checkpoints >= 1, "{name}: {r:?}");
        let saved = |c: &graphc::Compiled| {
            TrainBytes::of(&c.program, &c.plan, &c.train.as_ref().unwrap().state, Device::Cuda).saved_activations
        };
        assert!(
            saved(&full) < saved(&off),
            "{name}: saved {} vs {}",
            saved(&full),
            saved(&off)
        );
        let mut a = graphc::train::cpu_session(&off).unwrap();
        let mut b = graphc::train::cpu_session(&full).unwrap();
        for step in 1..=3 {
            let la = graphc::train::step_once(&mut a, &f.batch).unwrap().loss;
            let lb = graphc::train::step_once(&mut b, &f.batch).unwrap().loss;
            assert_eq!(la.to_bits(), lb.to_bits(), "{name} step {step}: loss {la} vs {lb}");
        }
        let pa = graphc::train::parameters(&off, &mut a).unwrap();
        let pb = graphc::train::parameters(&full, &mut b).unwrap();
        assert_eq!(pa.len(), pb.len());
        for ((n, x), (_, y)) in pa.iter().zip(&pb) {
            assert_eq!(x.to_f64_vec(), y.to_f64_vec(), "{name}: {n}");
        }
        // `--remat auto` a byte under the plan without recomputation: the fewest
        // layers that fit (the first; the plan with none does not), or per tensor the
        // fewest GEMM and attention outputs, whichever adds fewer FLOPs (no more than
        // `full`), and the same values bit for bit.
        let mut opts = options(&f, "adamw");
        opts.remat = graphc::train::Remat::Auto;
        let mut budget = graphc::CompileOptions::default();
        budget.memory.budget_bytes = off.plan.total_bytes - 1;
        // The loss whole (unset, auto would compute it in parts first).
        budget.token_chunks = 1;
        let auto = graphc::train::compile_step(&f.graph, opts, &budget).unwrap();
        let r = auto.train.as_ref().unwrap().report.recomputed_layers.unwrap();
        assert!(auto.plan.fits(), "{name}: {r:?}");
        match r.tensors {
            // The first layers (one is enough for GPT-2 and Llama; BERT's peak holds
            // both layers' values).
            None => {
                assert!(r.chosen >= 1 && r.range == Some((0, r.chosen - 1)), "{name}: {r:?}");
                if name != "bert" {
                    assert_eq!(r.chosen, 1, "{name}: {r:?}");
                }
            }
            // Per tensor, when that costs fewer FLOPs: every layer's GEMM-free values
            // and some of the GEMM and attention outputs, not all (that is `full`).
            Some((k, of)) => assert!(r.chosen == r.layers && k < of, "{name}: {r:?}"),
        }
        assert_eq!(r.bytes_off, Some(off.plan.total_bytes), "{name}");
        assert!(
            r.extra_flops
                <= full
                    .train
                    .as_ref()
                    .unwrap()
                    .report
                    .recomputed_layers
                    .unwrap()
                    .extra_flops
        );
        let mut c = graphc::train::cpu_session(&auto).unwrap();
        let mut a = graphc::train::cpu_session(&off).unwrap();
        for step in 1..=3 {
            let la = graphc::train::step_once(&mut a, &f.batch).unwrap().loss;
            let lc = graphc::train::step_once(&mut c, &f.batch).unwrap().loss;
            assert_eq!(la.to_bits(), lc.to_bits(), "{name} auto step {step}: loss {la} vs {lc}");
        }
        let pc = graphc::train::parameters(&auto, &mut c).unwrap();
        let pa = graphc::train::parameters(&off, &mut a).unwrap();
        for ((n, x), (_, y)) in pa.iter().zip(&pc) {
            assert_eq!(x.to_f64_vec(), y.to_f64_vec(), "{name} auto: {n}");
        }
    }
}

/// Rows `from..to` of four random `x [4, 16]` and `y [4, 8]` (the microbatch tests'
/// batch), by input name.
fn four_rows() -> impl Fn(usize, usize) -> HashMap<String, Tensor> {
    use graphc::ir::{DType, TensorType};
    let x = Tensor::random(&TensorType::new(DType::F32, [4, 16]), 7);
    let y = Tensor::random(&TensorType::new(DType::F32, [4, 8]), 8);
    move |from, to| {
        let rows = |t: &Tensor| {
            let cols = t.shape().dims()[1];
            let v = t.to_f64_vec();
            Tensor::from_f64(DType::F32, [to - from, cols], &v[from * cols..to * cols]).unwrap()
        };
        [("x".to_string(), rows(&x)), ("y".to_string(), rows(&y))].into()
    }
}

/// `--accumulate 2`: two calls on two rows each sum their gradients (each halved) and
/// the second updates, as one step on the four rows does (a mean loss over equal
/// microbatches is the mean of theirs); the calls between keep every parameter and
/// moment; the plan counts the gradients' sums as a class of their own.
#[test]
fn accumulated_microbatches_update_as_the_whole_batch_does() {
    use graphc::ir::{DType, GraphBuilder, TensorType};
    use graphc_compiler::plan::{report::TrainBytes, Device};
    let mlp = |rows: usize| {
        let b = GraphBuilder::new();
        let x = b.input("x", DType::F32, [rows, 16]);
        let w1 = b.param("w1", Tensor::randn(&TensorType::new(DType::F32, [16, 32]), 0.3, 1));
        let b1 = b.param("b1", Tensor::randn(&TensorType::new(DType::F32, [32]), 0.1, 2));
        let w2 = b.param("w2", Tensor::randn(&TensorType::new(DType::F32, [32, 8]), 0.3, 3));
        let h = (x.matmul(w1) + b1).relu();
        b.output("y", h.matmul(w2));
        b.finish().unwrap()
    };
    let batch = four_rows();
    for optimizer in [
        Optimizer::Sgd(Sgd {
            lr: 0.05,
            momentum: 0.9,
            dampening: 0.1,
            weight_decay: 0.01,
            nesterov: false,
        }),
        Optimizer::AdamW(AdamW {
            lr: 1e-3,
            betas: (0.9, 0.999),
            eps: 1e-8,
            weight_decay: 0.01,
        }),
    ] {
        let opts = |rows: usize, accumulate: usize| TrainOptions {
            loss: Loss {
                kind: LossKind::Mse,
                target: "y".into(),
                ignore_index: -100,
                shift_labels: false,
            },
            optimizer: optimizer.clone(),
            freeze: None,
            target: TensorType::new(DType::F32, [rows, 8]),
            output: None,
            loss_scale: None,
            remat: Default::default(),
            accumulate,
        };
        let whole = graphc::train::compile_step(&mlp(4), opts(4, 1), &Default::default()).unwrap();
        let acc = graphc::train::compile_step(&mlp(2), opts(2, 2), &Default::default()).unwrap();
        let state = &acc.train.as_ref().unwrap().state;
        let t = TrainBytes::of(&acc.program, &acc.plan, state, Device::Cuda);
        assert_eq!(t.accumulated, 4 * (16 * 32 + 32 + 32 * 8) + 8, "{}", t.text());
        assert!(t.text().contains("accumulated gradients"), "{}", t.text());
        let mut a = graphc::train::cpu_session(&whole).unwrap();
        let mut b = graphc::train::cpu_session(&acc).unwrap();
        for step in 1..=3 {
            let la = graphc::train::step_once(&mut a, &batch(0, 4)).unwrap().loss;
            let l0 = graphc::train::step_once(&mut b, &batch(0, 2)).unwrap().loss;
            if step == 1 {
                // Between the calls nothing is updated yet.
                let p0 = graphc::train::parameters(&acc, &mut b).unwrap();
                for (n, p) in &p0 {
                    let init = &acc.train.as_ref().unwrap().state.get(n).unwrap().init.tensor().unwrap();
                    assert_eq!(p.to_f64_vec(), init.to_f64_vec(), "{n} after the first microbatch");
                }
            }
            let l1 = graphc::train::step_once(&mut b, &batch(2, 4)).unwrap().loss;
            let lb = (l0 + l1) / 2.0;
            assert!(rel(lb, la) < 1e-6, "{} step {step}: {lb} vs {la}", optimizer.name());
        }
        let pa = graphc::train::parameters(&whole, &mut a).unwrap();
        let pb = graphc::train::parameters(&acc, &mut b).unwrap();
        assert_eq!(pa.len(), 3);
        // The accumulating step's CUDA C, run on the host, does the same.
        if graphc::cuda::sim::build::find_compiler().is_ok() {
            let mut s = graphc::train::sim_session(&acc, &Default::default()).unwrap();
            for _ in 1..=3 {
                graphc::train::step_once(&mut s, &batch(0, 2)).unwrap();
                graphc::train::step_once(&mut s, &batch(2, 4)).unwrap();
            }
            let ps = graphc::train::parameters(&acc, &mut s).unwrap();
            for ((n, p), (_, q)) in pb.iter().zip(&ps) {
                let e = relative_l2(q, p);
                assert!(e < 1e-6, "cuda-sim {} {n}: {e}", optimizer.name());
            }
        }
        for ((n, p), (_, q)) in pa.iter().zip(&pb) {
            let e = relative_l2(q, p);
            assert!(e < 1e-6, "{} {n}: {e}", optimizer.name());
        }
    }
}

/// `--accumulate 2` under dynamic loss scaling (GradScaler with accumulation): the
/// scaled gradients are summed, the second call checks and unscales the sums and
/// updates, as one unscaled step on the four rows does (the scale is a power of two:
/// the same sums); the first call keeps the scale and is not a skipped step. A scale
/// that overflows the gradients skips the update on the second call only, halving the
/// scale there, and keeps every parameter; the sums start again from zero.
#[test]
fn accumulated_microbatches_under_loss_scaling_update_once_and_skip_on_overflow() {
    use graphc::ir::{DType, GraphBuilder, TensorType};
    use graphc::train::LossScaling;
    let mlp = |rows: usize| {
        let b = GraphBuilder::new();
        let x = b.input("x", DType::F32, [rows, 16]);
        let w1 = b.param("w1", Tensor::randn(&TensorType::new(DType::F32, [16, 8]), 0.3, 1));
        b.output("y", x.matmul(w1).relu());
        b.finish().unwrap()
    };
    let batch = four_rows();
    let opts = |rows: usize, accumulate: usize, scale: Option<f64>| TrainOptions {
        loss: Loss::new(LossKind::Mse, "y"),
        optimizer: Optimizer::AdamW(AdamW::default()),
        freeze: None,
        target: TensorType::new(DType::F32, [rows, 8]),
        output: None,
        loss_scale: scale.map(|s| LossScaling {
            init_scale: s,
            ..LossScaling::default()
        }),
        remat: Default::default(),
        accumulate,
    };
    let whole = graphc::train::compile_step(&mlp(4), opts(4, 1, None), &Default::default()).unwrap();
    let acc = graphc::train::compile_step(&mlp(2), opts(2, 2, Some(1024.0)), &Default::default()).unwrap();
    let mut a = graphc::train::cpu_session(&whole).unwrap();
    let mut b = graphc::train::cpu_session(&acc).unwrap();
    for step in 1..=3 {
        let la = graphc::train::step_once(&mut a, &batch(0, 4)).unwrap().loss;
        let o0 = graphc::train::step_once(&mut b, &batch(0, 2)).unwrap();
        let o1 = graphc::train::step_once(&mut b, &batch(2, 4)).unwrap();
        assert_eq!((o0.loss_scale, o0.skipped), (Some(1024.0), false), "step {step}");
        assert_eq!((o1.loss_scale, o1.skipped), (Some(1024.0), false), "step {step}");
        let lb = (o0.loss + o1.loss) / 2.0;
        assert!(rel(lb, la) < 1e-6, "step {step}: {lb} vs {la}");
    }
    let pa = graphc::train::parameters(&whole, &mut a).unwrap();
    let pb = graphc::train::parameters(&acc, &mut b).unwrap();
    for ((n, p), (_, q)) in pa.iter().zip(&pb) {
        let e = relative_l2(q, p);
        assert!(e < 1e-6, "{n}: {e}");
    }
    // 2^127 and targets far off: the scaled gradients overflow f32.
    let big = 2f64.powi(127);
    let far = |from: usize, to: usize| -> HashMap<String, Tensor> {
        let mut m = batch(from, to);
        let t = &m["y"];
        let v: Vec<f64> = t.to_f64_vec().iter().map(|y| y * 1e4).collect();
        m.insert("y".into(), Tensor::from_f64(DType::F32, t.shape().clone(), &v).unwrap());
        m
    };
    let over = graphc::train::compile_step(&mlp(2), opts(2, 2, Some(big)), &Default::default()).unwrap();
    let mut c = graphc::train::cpu_session(&over).unwrap();
    let before = graphc::train::parameters(&over, &mut c).unwrap();
    let o0 = graphc::train::step_once(&mut c, &far(0, 2)).unwrap();
    let o1 = graphc::train::step_once(&mut c, &far(2, 4)).unwrap();
    assert_eq!((o0.loss_scale, o0.skipped), (Some(big), false));
    assert_eq!((o1.loss_scale, o1.skipped), (Some(big), true));
    let after = graphc::train::parameters(&over, &mut c).unwrap();
    for ((n, p), (_, q)) in before.iter().zip(&after) {
        assert_eq!(p.to_f64_vec(), q.to_f64_vec(), "{n}: a skipped update");
    }
    // The next pair runs at half the scale, from zeroed sums.
    let o2 = graphc::train::step_once(&mut c, &batch(0, 2)).unwrap();
    assert_eq!(o2.loss_scale, Some(big / 2.0));
}

/// `--chunk-tokens 2` on a training step: the LM head and the cross-entropy over two
/// parts of the tokens, each part's logits made again in its backward; 3 SGD steps
/// give the losses and parameters of the whole loss (the parts' sums are added in
/// another order: to 1e-6; SGD, whose update is linear in the gradient, where AdamW
/// would turn the rounding noise of gradients that are zero in exact arithmetic, as
/// the attention key's bias has, into steps of lr), on the CPU executor and as CUDA C
/// on cuda-sim.
#[test]
fn a_loss_in_parts_trains_as_the_whole_loss() {
    for name in ["gpt2", "gpt2_sdpa", "bert", "llama"] {
        let f = load(name);
        let mut opts = options(&f, "sgd");
        opts.remat = graphc::train::Remat::Off;
        let whole = graphc::train::compile_step(&f.graph, opts.clone(), &Default::default()).unwrap();
        let base = graphc::CompileOptions {
            token_chunks: 2,
            ..Default::default()
        };
        let parts = graphc::train::compile_step(&f.graph, opts, &base).unwrap();
        let t = &parts.train.as_ref().unwrap().report;
        assert_eq!(
            (t.loss_parts, t.recomputed_logits.map(|r| r.parts)),
            (2, Some(2)),
            "{name}"
        );
        let mut a = graphc::train::cpu_session(&whole).unwrap();
        let mut b = graphc::train::cpu_session(&parts).unwrap();
        for step in 1..=3 {
            let la = graphc::train::step_once(&mut a, &f.batch).unwrap().loss;
            let lb = graphc::train::step_once(&mut b, &f.batch).unwrap().loss;
            assert!(rel(lb, la) < 1e-6, "{name} step {step}: {lb} vs {la}");
        }
        let pa = graphc::train::parameters(&whole, &mut a).unwrap();
        let pb = graphc::train::parameters(&parts, &mut b).unwrap();
        for ((n, x), (_, y)) in pa.iter().zip(&pb) {
            let e = relative_l2(y, x);
            assert!(e < 1e-6, "{name} {n}: {e}");
        }
        if name == "gpt2" && graphc::cuda::sim::build::find_compiler().is_ok() {
            let mut s = graphc::train::sim_session(&parts, &Default::default()).unwrap();
            for _ in 1..=3 {
                graphc::train::step_once(&mut s, &f.batch).unwrap();
            }
            let ps = graphc::train::parameters(&parts, &mut s).unwrap();
            for ((n, x), (_, y)) in pb.iter().zip(&ps) {
                let e = relative_l2(y, x);
                assert!(e < 1e-5, "cuda-sim {name} {n}: {e}");
            }
        }
    }
}

/// Per tensor on a small graph: Llama's 12 saved GEMM and attention outputs, under a
/// budget a tenth of the way from `--remat full`'s total to the plan without: auto
/// plans the subsets that cost fewer FLOPs than the greedy prefix, fewest first, and
/// takes the first that fits (here, a subset no prefix is); it fits, costs fewer FLOPs
/// than every layer made again, and 3 AdamW steps give the values without
/// recomputation bit for bit.
#[test]
fn the_exact_per_tensor_choice_fits_for_fewer_flops_with_the_same_values() {
    let f = load("llama");
    let opts = options(&f, "adamw");
    let whole = graphc::CompileOptions {
        token_chunks: 1,
        ..Default::default()
    };
    let plan = |remat, budget: Option<u64>| {
        let mut o = opts.clone();
        o.remat = remat;
        let mut c = whole.clone();
        if let Some(b) = budget {
            c.memory.budget_bytes = b;
        }
        graphc::train::compile_step(&f.graph, o, &c).unwrap()
    };
    let off = plan(graphc::train::Remat::Off, None);
    let full = plan(graphc::train::Remat::Full, None);
    let (o, u) = (off.plan.total_bytes, full.plan.total_bytes);
    let auto = plan(graphc::train::Remat::Auto, Some(u + (o - u) / 10));
    assert!(auto.plan.fits());
    let r = auto.train.as_ref().unwrap().report.recomputed_layers.unwrap();
    let all = full.train.as_ref().unwrap().report.recomputed_layers.unwrap();
    assert!(r.exact, "{r:?}");
    let (k, of) = r.tensors.unwrap();
    assert!(k > 0 && k < of && of == 12, "{r:?}");
    assert!(r.extra_flops < all.extra_flops, "{r:?} vs {all:?}");
    let mut a = graphc::train::cpu_session(&off).unwrap();
    let mut b = graphc::train::cpu_session(&auto).unwrap();
    for step in 1..=3 {
        let la = graphc::train::step_once(&mut a, &f.batch).unwrap().loss;
        let lb = graphc::train::step_once(&mut b, &f.batch).unwrap().loss;
        assert_eq!(la.to_bits(), lb.to_bits(), "step {step}: {la} vs {lb}");
    }
    let pa = graphc::train::parameters(&off, &mut a).unwrap();
    let pb = graphc::train::parameters(&auto, &mut b).unwrap();
    for ((n, x), (_, y)) in pa.iter().zip(&pb) {
        assert_eq!(x.to_f64_vec(), y.to_f64_vec(), "{n}");
    }
}
