//! Shape families (`graphc_compiler::pipeline::family`): the optimized graph captured
//! once with its integers as polynomials of a dimension, written out at other values,
//! must give what a compile at each value gives — the same graph, program, schedule
//! and plan — and a family that cannot be captured must say where and why.

mod common;

use common::{repo_path, with_budget};
use graphc::fit::ProbeCompiles;
use graphc::{CompileOptions, Compiled};
use graphc_compiler::passes::precision::Precision;
use graphc_compiler::passes::quantize::WeightQuant;
use graphc_compiler::pipeline::family::{FamilyError, ShapeFamily, LOW, MARKER};
use graphc_compiler::plan::MemoryPlan;
use graphc_compiler::Pass;

const DYNAMIC: &str = "tests/fixtures/onnx/gpt2_dynamic/model.onnx";

fn compile(dims: &[(&str, usize)], opts: &CompileOptions) -> Compiled {
    let dims: Vec<(String, usize)> = dims.iter().map(|(n, v)| (n.to_string(), *v)).collect();
    let g = graphc::load_model(&repo_path(DYNAMIC), &dims).unwrap();
    graphc::compile_with(&g, opts).unwrap()
}

/// A plan without the time the planner took.
fn untimed(plan: &MemoryPlan) -> MemoryPlan {
    MemoryPlan {
        time: Default::default(),
        ..plan.clone()
    }
}

fn batch_family(seq: usize, opts: &CompileOptions) -> ShapeFamily {
    let low = compile(&[("batch", LOW), ("seq", seq)], opts);
    let high = compile(&[("batch", MARKER), ("seq", seq)], opts);
    ShapeFamily::capture("batch", low, &high).unwrap()
}

fn options(precision: Precision, weights: WeightQuant) -> CompileOptions {
    CompileOptions {
        precision,
        weights,
        ..Default::default()
    }
}

/// At every value, the family's compile is the direct compile: the optimized graph
/// (printed), the fused and scheduled program, the schedule and the memory plan; with
/// fp32, bf16 and int4 weights.
#[test]
fn a_batch_family_compiles_what_each_value_compiles() {
    let cases = [
        (16, options(Precision::Fp32, WeightQuant::None)),
        (64, options(Precision::Bf16, WeightQuant::None)),
        (16, options(Precision::Fp32, WeightQuant::Int4)),
    ];
    for (seq, opts) in cases {
        let family = batch_family(seq, &opts);
        assert!(family.dependent() > 0, "{family:?}");
        for batch in [3, 5, 8, 17, 100, 827, 4099] {
            let want = compile(&[("batch", batch), ("seq", seq)], &opts);
            let got = family.compile_at(batch, &opts).unwrap();
            let what = format!("seq {seq}, {:?}, batch {batch}", opts.precision);
            assert_eq!(graphc_ir::print(&got.graph), graphc_ir::print(&want.graph), "{what}");
            assert!(got.program == want.program, "{what}: the programs differ");
            assert_eq!(got.schedule.name, want.schedule.name, "{what}");
            assert!(untimed(&got.plan) == untimed(&want.plan), "{what}: the plans differ");
            assert_eq!(got.quantize, want.quantize, "{what}");
            assert_eq!(got.precision.peak_bytes, want.precision.peak_bytes, "{what}");
            let specialized = got.passes.iter().find(|p| p.pass == Pass::Specialize).unwrap();
            assert!(
                specialized.to_string().contains(&format!("batch = {batch} in")),
                "{specialized}"
            );
        }
    }
}

/// The family's own runs agree with the interpreter on the model at that value.
#[test]
fn a_family_compile_runs_like_the_model() {
    let opts = CompileOptions::default();
    let family = batch_family(16, &opts);
    let compiled = family.compile_at(3, &opts).unwrap();
    let graph = graphc::load_model(&repo_path(DYNAMIC), &[("batch".into(), 3), ("seq".into(), 16)]).unwrap();
    let inputs = common::random_inputs(&graph, 7);
    let inputs: std::collections::HashMap<_, _> = inputs
        .into_iter()
        .map(|(n, t)| {
            // Token ids within the vocabulary (128).
            let ids: Vec<f64> = t.to_f64_vec().iter().map(|x| x.abs() % 128.0).collect();
            (
                n,
                graphc_ir::Tensor::from_f64(t.dtype(), t.shape().clone(), &ids).unwrap(),
            )
        })
        .collect();
    let want = graphc_ir::interp::interpret(&graph, &inputs).unwrap();
    let got = graphc::run_cpu(&compiled, inputs).unwrap();
    let (a, b) = (&got[0].1, &want[0].1);
    assert_eq!(a.shape(), b.shape());
    let err = common::rel_l2(&a.to_f64_vec(), &b.to_f64_vec());
    assert!(err < 1e-5, "rel_l2 {err}");
}

/// GPT-2's position embedding rows are folded into a weight at small sequence lengths
/// (a gather of `wpe` at `0..seq`): the sequence family cannot be captured, and the
/// error names the weight.
#[test]
fn a_family_whose_weights_depend_on_the_dim_is_refused_by_name() {
    let opts = CompileOptions::default();
    let low = compile(&[("batch", 1), ("seq", LOW)], &opts);
    let high = compile(&[("batch", 1), ("seq", MARKER)], &opts);
    let e = ShapeFamily::capture("seq", low, &high).unwrap_err();
    assert!(matches!(e, FamilyError::Weight { .. }), "{e}");
    assert!(e.to_string().contains("wpe"), "{e}");
}

/// Two compiles that differ in a constant (another fixed dim) are no family: the error
/// names the node and both values.
#[test]
fn samples_that_differ_in_a_constant_are_refused_naming_the_node() {
    let opts = CompileOptions::default();
    let low = compile(&[("batch", LOW), ("seq", 16)], &opts);
    let high = compile(&[("batch", MARKER), ("seq", 17)], &opts);
    let e = ShapeFamily::capture("batch", low, &high).unwrap_err();
    let text = e.to_string();
    assert!(
        matches!(e, FamilyError::Differs { .. } | FamilyError::Weight { .. }),
        "{text}"
    );
    assert!(text.contains("batch=2") && text.contains("batch=1048583"), "{text}");
}

/// A value the model cannot take (past the IR's element limit) is an error of that
/// value, as a direct compile's is, never a panic; a value whose integers overflow too.
#[test]
fn a_value_too_large_for_the_model_is_an_error() {
    let opts = CompileOptions::default();
    let family = batch_family(16, &opts);
    for batch in [1usize << 50, usize::MAX] {
        let e = family.compile_at(batch, &opts).unwrap_err();
        assert!(e.to_string().contains(&format!("batch={batch}")), "{e}");
    }
}

/// `fit_model` compiles a family once and agrees with `fit` compiling every probe.
#[test]
fn fit_with_a_family_agrees_with_fit_compiling_each_probe() {
    let path = repo_path(DYNAMIC);
    for budget in [40u64 << 20, 300 << 20, 2 << 30] {
        let opts = with_budget(budget);
        let fast = graphc::fit::fit_model(&path, &[("seq".into(), 16)], "batch", &opts, 1 << 20).unwrap();
        assert!(
            matches!(fast.compiles, ProbeCompiles::Family { .. }),
            "{:?}",
            fast.compiles
        );
        let slow = graphc::fit::fit(
            |b| graphc::load_model(&path, &[("batch".into(), b), ("seq".into(), 16)]),
            &opts,
            1 << 20,
        )
        .unwrap();
        assert_eq!(slow.compiles, ProbeCompiles::Each);
        assert_eq!(fast.value, slow.value, "budget {budget}");
        assert!(
            untimed(&fast.compiled.plan) == untimed(&slow.compiled.plan),
            "budget {budget}"
        );
        assert_eq!(fast.probes, slow.probes, "budget {budget}");
    }
    // The sequence dim has no family here: each probe compiles, and the fit says why.
    let opts = with_budget(40 << 20);
    let fit = graphc::fit::fit_model(&path, &[("batch".into(), 1)], "seq", &opts, 64).unwrap();
    match &fit.compiles {
        ProbeCompiles::EachBecause(why) => assert!(why.contains("wpe"), "{why}"),
        other => panic!("{other:?}"),
    }
}

/// Long sequences compile like short ones: GPT-2's causal mask (built from position
/// vectors and a cumulative sum) is proved causal from its structure at every length,
/// so at 8192 and 32768 positions as at 64 every attention is causal with no mask
/// operand, the kernels are the same (at most one small kernel more: past a size the
/// position ids are an `iota` computed by a kernel, not a constant), and no `[seq, seq]` tensor
/// is planned: the arena grows linearly with the length.
#[test]
fn long_sequences_compile_like_short_ones() {
    let opts = CompileOptions::default();
    let at = |seq: usize| compile(&[("batch", 1), ("seq", seq)], &opts);
    let short = at(64);
    let kinds = |c: &Compiled| c.program.kernels.iter().map(|k| k.name.clone()).collect::<Vec<_>>();
    for seq in [8192, 32768] {
        let long = at(seq);
        let attentions: Vec<bool> = long
            .graph
            .nodes()
            .iter()
            .filter_map(|n| match n.op {
                graphc_ir::Op::Attention { causal, .. } => Some(causal && n.inputs.len() == 3),
                _ => None,
            })
            .collect();
        assert_eq!(attentions, vec![true, true], "seq {seq}");
        let (long_kernels, short_kernels) = (kinds(&long), kinds(&short));
        let extra = long_kernels.len().checked_sub(short_kernels.len());
        assert!(matches!(extra, Some(0 | 1)), "seq {seq}: {long_kernels:?}");
        let quadratic = (seq * seq) as u64;
        assert!(
            long.plan.buffers.iter().all(|b| b.bytes < quadratic),
            "seq {seq}: a [seq, seq] buffer is planned"
        );
        // Linear: 64x the length of 64 (or 512x), the same multiple of the arena.
        let ratio = long.plan.arena_bytes as f64 / short.plan.arena_bytes as f64;
        let expected = (seq / 64) as f64;
        assert!(
            (ratio / expected - 1.0).abs() < 0.05,
            "seq {seq}: arena x{ratio} for x{expected}"
        );
    }
}

/// transformers' default (SDPA) attention as exported, every family with symbolic
/// dims: its mask subgraph (positions, cumulative sums, comparisons and `and`s, or a
/// padding mask) must not break the family capture, so `fit` over the batch compiles
/// three times and writes the rest out, and finds what compiling each probe finds.
#[test]
fn sdpa_exports_fit_with_one_shape_family() {
    for (name, fixed) in [
        ("gpt2_dynamic_sdpa", Some(16)),
        ("bert_dynamic_sdpa", Some(16)),
        ("llama_dynamic_sdpa", Some(16)),
        ("vit_dynamic_sdpa", None),
        ("gpt2_dynamic_sdpa_opset23", Some(16)),
    ] {
        let path = repo_path(&format!("tests/fixtures/onnx/{name}/model.onnx"));
        let dims: Vec<(String, usize)> = fixed.map(|s| ("seq".to_string(), s)).into_iter().collect();
        let opts = with_budget(300 << 20);
        let fast =
            graphc::fit::fit_model(&path, &dims, "batch", &opts, 1 << 20).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert!(
            matches!(fast.compiles, ProbeCompiles::Family { .. }),
            "{name}: {:?}",
            fast.compiles
        );
        let slow = graphc::fit::fit(
            |b| {
                let mut d = dims.clone();
                d.push(("batch".into(), b));
                graphc::load_model(&path, &d)
            },
            &opts,
            1 << 20,
        )
        .unwrap();
        assert_eq!(fast.value, slow.value, "{name}");
        assert_eq!(fast.probes, slow.probes, "{name}");
        assert!(untimed(&fast.compiled.plan) == untimed(&slow.compiled.plan), "{name}");
    }
}
