//! Batch-size fitting (`graphc::fit`, `graphc fit`): the largest value of a dimension
//! whose memory plan fits, checked by replanning on both sides of the answer.

mod common;

use common::{random_inputs, repo_path, with_budget};
use graphc::ir::compare::{relative_l2, zip_outputs};
use graphc::models::{mlp, MlpConfig};
use graphc::Error;

const DYNAMIC: &str = "tests/fixtures/onnx/gpt2_dynamic/model.onnx";

fn total_at(batch: usize, seq: usize) -> u64 {
    let g = graphc::load_model(&repo_path(DYNAMIC), &[("batch".into(), batch), ("seq".into(), seq)]).unwrap();
    graphc::compile(&g).unwrap().plan.total_bytes
}

#[test]
fn fit_finds_the_largest_batch_of_an_onnx_model() {
    let budget = 40 << 20;
    let opts = with_budget(budget);
    let fit = graphc::fit::fit_model(&repo_path(DYNAMIC), &[("seq".into(), 16)], "batch", &opts, 1 << 20).unwrap();
    assert!(!fit.capped);
    assert!(fit.value > 1);
    assert!(fit.compiled.plan.fits());
    // Replanning on both sides of the answer agrees.
    assert!(total_at(fit.value, 16) <= budget);
    assert!(total_at(fit.value + 1, 16) > budget);
    assert_eq!(fit.first_over().map(|p| p.value), Some(fit.value + 1));
    // Growing then closing in: a logarithmic number of probes at most.
    assert!(fit.probes.len() < 2 * 22, "{} probes", fit.probes.len());
    assert!(!fit.exhausted);
}

/// `--max 2^62` (it printed nothing in 240 s): at most 64 probes, each cheap even where
/// shapes are too large to index (those cannot be planned, so they do not fit), and the
/// answer is the one a small `--max` gives, checked on both sides.
#[test]
fn fit_with_a_huge_max_takes_at_most_64_cheap_probes() {
    let opts = with_budget(1 << 30);
    let seq = [("seq".to_string(), 64)];
    let t = std::time::Instant::now();
    let fit = graphc::fit::fit_model(&repo_path(DYNAMIC), &seq, "batch", &opts, 1 << 62).unwrap();
    let took = t.elapsed();
    eprintln!("{} probes in {took:?}: batch {}", fit.probes.len(), fit.value);
    assert!(
        fit.probes.len() <= graphc::fit::MAX_PROBES,
        "{} probes",
        fit.probes.len()
    );
    assert!(took < std::time::Duration::from_secs(60), "{took:?}");
    assert!(!fit.capped && !fit.exhausted);
    assert!(total_at(fit.value, 64) <= 1 << 30 && total_at(fit.value + 1, 64) > 1 << 30);
    assert_eq!(fit.first_over().map(|p| p.value), Some(fit.value + 1));
    let small = graphc::fit::fit_model(&repo_path(DYNAMIC), &seq, "batch", &opts, 1 << 20).unwrap();
    assert_eq!(small.value, fit.value);

    // A budget nothing reaches: the search ends where shapes stop being plannable
    // (2^56 elements), still within 64 probes, and says why the next value fails.
    let fit = graphc::fit::fit_model(&repo_path(DYNAMIC), &seq, "batch", &with_budget(u64::MAX), usize::MAX).unwrap();
    assert!(
        fit.probes.len() <= graphc::fit::MAX_PROBES,
        "{} probes",
        fit.probes.len()
    );
    assert!(fit.value > 1 << 30, "{}", fit.value);
    let next = fit.first_over().unwrap();
    assert!(
        next.error.is_some() || next.total_bytes > Some(u64::MAX - 1),
        "{next:?}"
    );
    assert!(fit.exhausted || next.value == fit.value + 1);
}

/// The probe budget holds for any monotone build, even one that always fits: the
/// values saturate at `max` instead of overflowing, and a search cut short says so.
#[test]
fn fit_never_overflows_and_never_exceeds_the_probe_budget() {
    let build = |batch: usize| -> Result<graphc::ir::Graph, Error> {
        Ok(mlp(&MlpConfig {
            batch,
            widths: vec![4, 4],
            ..Default::default()
        })?)
    };
    for max in [usize::MAX, 1 << 62, (1 << 40) + 12345, 3] {
        let fit = graphc::fit::fit(build, &with_budget(u64::MAX), max).unwrap();
        assert!(
            fit.probes.len() <= graphc::fit::MAX_PROBES,
            "max {max}: {} probes",
            fit.probes.len()
        );
        assert!(fit.value <= max && fit.compiled.plan.fits());
        // Whatever stopped it is stated: the cap, an exact bracket, or the budget.
        let exact = fit.first_over().is_some_and(|p| p.value == fit.value + 1);
        assert!(
            fit.capped || exact || fit.exhausted,
            "max {max}: {:?}",
            fit.probes.last()
        );
    }
}

#[test]
fn fit_through_a_builder_and_at_the_cap() {
    let build = |batch: usize| -> Result<graphc::ir::Graph, Error> {
        Ok(mlp(&MlpConfig {
            batch,
            widths: vec![64, 1024, 64],
            ..Default::default()
        })?)
    };
    // Activations of [batch, 1024] f32: 4 KiB a row, plus the weights and the 32 MiB
    // GEMM workspace.
    let budget = 36 << 20;
    let fit = graphc::fit::fit(build, &with_budget(budget), 1 << 16).unwrap();
    let at = |b: usize| graphc::compile(&build(b).unwrap()).unwrap().plan.total_bytes;
    assert!(at(fit.value) <= budget && at(fit.value + 1) > budget, "{}", fit.value);
    // A cap below the answer stops the search there, and says so.
    let capped = graphc::fit::fit(build, &with_budget(budget), 10).unwrap();
    assert_eq!((capped.value, capped.capped), (10, true));
}

#[test]
fn fit_says_when_nothing_fits() {
    let e = graphc::fit::fit_model(
        &repo_path(DYNAMIC),
        &[("seq".into(), 16)],
        "batch",
        &with_budget(1 << 20),
        1 << 20,
    )
    .unwrap_err();
    match &e {
        Error::DoesNotFit { value: 1, plan, .. } => assert!(!plan.fits()),
        other => panic!("{other}"),
    }
    assert!(e.to_string().contains("even 1 does not fit"), "{e}");
    assert!(e.to_string().contains("over by"), "{e}");
    // A static model has no dimension to search.
    let e = graphc::fit::fit_model(
        &repo_path("examples/models/transformer_block.gir"),
        &[],
        "batch",
        &with_budget(1 << 30),
        8,
    )
    .unwrap_err();
    assert!(e.to_string().contains("only static dimensions"), "{e}");
}

/// The dynamic export computes what PyTorch computed at the shape it was traced with,
/// and what the interpreter computes at other shapes.
#[test]
fn dynamic_gpt2_runs_at_any_batch_and_sequence() {
    let dir = repo_path("tests/fixtures/onnx/gpt2_dynamic");
    let g = graphc::load_model(&dir.join("model.onnx"), &[("batch".into(), 2), ("seq".into(), 16)]).unwrap();
    let inputs = graphc::npz::read_inputs(&dir.join("inputs.npz"), &g).unwrap();
    let expected = graphc::npz::read_arrays(&dir.join("outputs.npz")).unwrap();
    let got = graphc::run_cpu(&graphc::compile(&g).unwrap(), inputs).unwrap();
    let pairs = zip_outputs(&got, &expected).unwrap();
    let err = relative_l2(pairs[0].1, pairs[0].2);
    assert!(err < 1e-4, "vs PyTorch: {err:.2e}");
    for (batch, seq) in [(1, 5), (3, 9)] {
        let g = graphc::load_model(&dir.join("model.onnx"), &[("batch".into(), batch), ("seq".into(), seq)]).unwrap();
        // Token ids must be valid indices: random i64 in [0, 128).
        let inputs: std::collections::HashMap<_, _> = random_inputs(&g, 5)
            .into_iter()
            .map(|(n, t)| {
                let v: Vec<f64> = t
                    .to_f64_vec()
                    .iter()
                    .map(|x| x.abs().rem_euclid(128.0).floor())
                    .collect();
                (
                    n,
                    graphc::ir::Tensor::from_f64(t.dtype(), t.shape().clone(), &v).unwrap(),
                )
            })
            .collect();
        let want = graphc::ir::interpret(&g, &inputs).unwrap();
        let got = graphc::run_cpu(&graphc::compile(&g).unwrap(), inputs).unwrap();
        let pairs = zip_outputs(&got, &want).unwrap();
        assert_eq!(pairs[0].1.shape().dims(), &[batch, seq, 128]);
        let err = relative_l2(pairs[0].1, pairs[0].2);
        assert!(err < 1e-5, "batch {batch} seq {seq}: {err:.2e}");
    }
}

/// `--weights int4` in a fit: the packed weights and no cuBLASLt workspace (every GEMM
/// is a generated quantized one) leave room for a larger batch, and the answer is the
/// plan of the quantized model at that batch.
#[test]
fn int4_weights_fit_a_larger_batch() {
    let seq = [("seq".to_string(), 16)];
    let mut opts = with_budget(40 << 20);
    let plain = graphc::fit::fit_model(&repo_path(DYNAMIC), &seq, "batch", &opts, 1 << 20).unwrap();
    opts.weights = graphc_compiler::passes::quantize::WeightQuant::Int4;
    let q = graphc::fit::fit_model(&repo_path(DYNAMIC), &seq, "batch", &opts, 1 << 20).unwrap();
    assert!(q.value > plain.value, "int4 {} vs f32 {}", q.value, plain.value);
    assert!(q.compiled.plan.fits() && !q.compiled.quantize.quantized.is_empty());
    assert_eq!(q.compiled.plan.workspace_bytes, 0);
    assert!(q.compiled.plan.weights_bytes * 4 < plain.compiled.plan.weights_bytes);
}

/// `--chunk-tokens 4` in a fit: GPT-2's attention blocks and MLPs run over 4 parts of
/// the batch, so a larger batch fits; chunked plans of batches that 4 does not divide
/// (MLPs in parts of the tokens of 3 sequences; sub-blocks in parts of 6 sequences)
/// give the unchunked plan's outputs bit for bit on the CPU executor and on cuda-sim
/// when a host compiler is there.
#[test]
fn chunked_mlps_fit_a_larger_batch_with_the_same_values() {
    let seq = [("seq".to_string(), 16)];
    let mut opts = with_budget(40 << 20);
    let plain = graphc::fit::fit_model(&repo_path(DYNAMIC), &seq, "batch", &opts, 1 << 20).unwrap();
    opts.token_chunks = 4;
    let chunked = graphc::fit::fit_model(&repo_path(DYNAMIC), &seq, "batch", &opts, 1 << 20).unwrap();
    assert!(
        chunked.value > plain.value,
        "chunked {} vs whole {}",
        chunked.value,
        plain.value
    );
    let c = chunked.compiled.chunks;
    assert_eq!((c.attention_blocks, c.batch_mlps, c.batch_parts), (2, 2, 4), "{c:?}");
    assert!(chunked.compiled.plan.fits());

    // 3 sequences: the MLPs in 4 parts of their 15 tokens; 6: every sub-block in parts
    // of 2, 2, 1 and 1 sequences.
    for (batch, token_regions, attention_blocks) in [(3, 2, 0), (6, 0, 2)] {
        same_values_in_parts(batch, token_regions, attention_blocks);
    }
}

fn same_values_in_parts(batch: usize, token_regions: usize, attention_blocks: usize) {
    let g = graphc::load_model(&repo_path(DYNAMIC), &[("batch".into(), batch), ("seq".into(), 5)]).unwrap();
    let inputs: std::collections::HashMap<_, _> = random_inputs(&g, 9)
        .into_iter()
        .map(|(n, t)| {
            let v: Vec<f64> = t
                .to_f64_vec()
                .iter()
                .map(|x| x.abs().rem_euclid(128.0).floor())
                .collect();
            (
                n,
                graphc::ir::Tensor::from_f64(t.dtype(), t.shape().clone(), &v).unwrap(),
            )
        })
        .collect();
    let whole = graphc::compile(&g).unwrap();
    let parts = graphc::compile_with(
        &g,
        &graphc::CompileOptions {
            token_chunks: 4,
            ..Default::default()
        },
    )
    .unwrap();
    assert_eq!(
        (parts.chunks.regions, parts.chunks.attention_blocks),
        (token_regions, attention_blocks)
    );
    let want = graphc::run_cpu(&whole, inputs.clone()).unwrap();
    let got = graphc::run_cpu(&parts, inputs.clone()).unwrap();
    for (name, a, b) in zip_outputs(&got, &want).unwrap() {
        assert_eq!(a.to_f64_vec(), b.to_f64_vec(), "{name}");
    }
    if graphc::cuda::sim::build::find_compiler().is_ok() {
        let sim = graphc::cuda::sim::run_sim(&parts, &inputs, &Default::default()).unwrap();
        for (name, a, b) in zip_outputs(&sim, &want).unwrap() {
            let err = relative_l2(a, b);
            assert!(err < 1e-5, "{name}: cuda-sim {err:.2e}");
        }
    }
}

/// Next-token cross-entropy and AdamW on the GPT-2 fixture's logits, with `remat`.
fn lm_step(remat: graphc::train::Remat) -> graphc::train::TrainOptions {
    use graphc::train::{Loss, LossKind, TrainOptions};
    TrainOptions {
        loss: Loss {
            kind: LossKind::CrossEntropy,
            target: "labels".into(),
            ignore_index: -100,
            shift_labels: true,
        },
        optimizer: graphc::train::Optimizer::AdamW(graphc::train::AdamW {
            lr: 1e-3,
            betas: (0.9, 0.999),
            eps: 1e-8,
            weight_decay: 0.01,
        }),
        freeze: None,
        target: graphc::ir::TensorType::new(graphc::ir::DType::I64, vec![]),
        output: None,
        loss_scale: None,
        remat,
        accumulate: 1,
    }
}

/// `fit --train` with `--remat auto` (the default) against `off`: a larger batch, whose
/// plan recomputes layers only because the batch needs it; the next batch does not fit
/// even with every layer recomputed, nor the batch after `off`'s answer without.
#[test]
fn training_fit_with_auto_recomputation_beats_none() {
    use graphc::train::Remat;
    let path = repo_path(DYNAMIC);
    let train = lm_step;
    let opts = |remat: Remat| graphc::CompileOptions {
        train: Some(train(remat)),
        ..with_budget(48 << 20)
    };
    let fixed = [("seq".to_string(), 64)];
    let off = graphc::fit::fit_model(&path, &fixed, "batch", &opts(Remat::Off), 4096).unwrap();
    let auto = graphc::fit::fit_model(&path, &fixed, "batch", &opts(Remat::Auto), 4096).unwrap();
    assert!(auto.value > off.value, "auto {} vs off {}", auto.value, off.value);
    // Both searches probe from one shape family of the step; auto's also says off's.
    for f in [&off, &auto] {
        assert!(
            matches!(f.compiles, graphc::fit::ProbeCompiles::Family { integers } if integers > 0),
            "{:?}",
            f.compiles
        );
    }
    assert!(
        matches!(auto.without, Some(Ok(v)) if v == off.value),
        "{:?}",
        auto.without
    );
    let r = auto.compiled.train.as_ref().unwrap().report.recomputed_layers.unwrap();
    assert!(auto.compiled.plan.fits() && r.chosen >= 1, "{r:?}");
    let plan_at = |batch: usize, remat: Remat| {
        let g = graphc::load_model(&path, &[("batch".into(), batch), ("seq".into(), 64)]).unwrap();
        let mut o = opts(remat);
        let t = o.train.as_mut().unwrap();
        t.target = graphc::train::expected_target(&g, t).unwrap();
        graphc::compile_with(&g, &o).unwrap()
    };
    assert!(!plan_at(auto.value + 1, Remat::Full).plan.fits());
    assert!(!plan_at(off.value + 1, Remat::Off).plan.fits());
    // Where the step fits without, auto recomputes nothing.
    let at_off = plan_at(off.value, Remat::Auto);
    assert!(at_off.plan.fits());
    assert!(at_off.train.as_ref().unwrap().report.recomputed_layers.is_none());
}

/// A training step's shape family (`StepFamily`) compiles at each value what a compile
/// there gives: the same program and plan, whole and with its loss in parts, with
/// nothing, every layer, or auto's choice made again.
#[test]
fn a_step_family_compiles_what_each_value_compiles() {
    use graphc::train::{Remat, TrainOptions};
    use graphc_compiler::pipeline::family::{StepFamily, LOW, MARKER};
    let path = repo_path(DYNAMIC);
    let train = lm_step;
    let model = |batch: usize| {
        let g = graphc::load_model(&path, &[("batch".into(), batch), ("seq".into(), 16)]).unwrap();
        let t = graphc::train::expected_target(&g, &train(Remat::Off)).unwrap();
        (g, t)
    };
    use graphc_compiler::passes::precision::Precision;
    let mut f32_family = StepFamily::new("batch", model(LOW), model(MARKER));
    let mut fp16_family = StepFamily::new("batch", model(LOW), model(MARKER));
    let cases = [
        (Remat::Off, 0, Precision::Fp32, 1),
        (Remat::FullProbe, 4, Precision::Fp32, 1),
        (Remat::Auto, 4, Precision::Fp32, 1),
        (Remat::Off, 4, Precision::Fp32, 1),
        // Mixed precision with loss scaling, accumulating: a family of its own
        // options, the same agreement.
        (Remat::Auto, 4, Precision::Fp16, 2),
    ];
    for (remat, chunks, precision, accumulate) in cases {
        let family = if precision == Precision::Fp16 {
            &mut fp16_family
        } else {
            &mut f32_family
        };
        for batch in [3, 6, 13] {
            let (g, target) = model(batch);
            let opts = graphc::CompileOptions {
                train: Some(TrainOptions {
                    target,
                    accumulate,
                    loss_scale: (precision == Precision::Fp16).then(Default::default),
                    ..train(remat)
                }),
                token_chunks: chunks,
                precision,
                ..with_budget(8 << 20)
            };
            let want = graphc::compile_with(&g, &opts).unwrap();
            let got = family.compile_at(batch, &opts).unwrap();
            let what = format!("{remat:?}, {chunks} parts, batch {batch}");
            assert!(got.program == want.program, "{what}: the programs differ");
            assert_eq!(got.plan.total_bytes, want.plan.total_bytes, "{what}");
            let (a, b) = (got.train.unwrap().report, want.train.clone().unwrap().report);
            assert_eq!(a.recomputed_layers, b.recomputed_layers, "{what}");
            assert_eq!(a.loss_parts, b.loss_parts, "{what}");
            if remat == Remat::Auto {
                // Given the plan with every layer made again, auto plans the same.
                let full = graphc::CompileOptions {
                    train: Some(TrainOptions {
                        remat: Remat::FullProbe,
                        ..opts.train.clone().unwrap()
                    }),
                    ..opts.clone()
                };
                let full = family.compile_at(batch, &full).unwrap();
                let again = family.auto_at(batch, &opts, full).unwrap();
                assert!(again.program == want.program, "{what}: auto given full");
                assert_eq!(again.plan.total_bytes, want.plan.total_bytes, "{what}");
                let r = again.train.unwrap().report.recomputed_layers;
                assert_eq!(r, want.train.as_ref().unwrap().report.recomputed_layers, "{what}");
            }
        }
    }
    assert!(f32_family.dependent() > 0, "{f32_family:?}");
    assert!(fp16_family.dependent() > 0, "{fp16_family:?}");
}
