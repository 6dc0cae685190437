//! Mixed precision (`--precision bf16|fp16`, `compiler/src/passes/precision.rs`): every
//! example and real fixture computes within tolerance of the f32 interpreter (bf16
//! relative L2 <= 1e-2, fp16 <= 5e-3), float outputs come in the low type unless the
//! declared types are asked for, weights are stored in the low type, the arena halves,
//! and the kernels are fp32's.

mod common;

use common::{models, repo_path, widened};
use graphc::ir::compare::{relative_l2, zip_outputs};
use graphc::ir::{interpret, DType, Graph};
use graphc::models::{gpt, GptConfig};
use graphc::CompileOptions;
use graphc_compiler::passes::precision::Precision;

fn compile(g: &Graph, precision: Precision) -> graphc::Compiled {
    graphc::compile_with(
        g,
        &CompileOptions {
            precision,
            ..Default::default()
        },
    )
    .unwrap_or_else(|e| panic!("{precision}: {e}"))
}

/// By default a bf16 model's f32 outputs are bf16 (PyTorch's bf16 model returns bf16:
/// half the output bytes); `Outputs::Declared` (`--f32-outputs`) keeps them f32.
#[test]
fn float_outputs_are_low_unless_declared_types_are_asked_for() {
    use graphc_compiler::passes::precision::Outputs;
    let g = gpt(&GptConfig::default()).unwrap();
    let out_types = |outputs: Outputs| -> Vec<DType> {
        let c = graphc::compile_with(
            &g,
            &CompileOptions {
                precision: Precision::Bf16,
                outputs,
                ..Default::default()
            },
        )
        .unwrap();
        c.graph
            .outputs()
            .iter()
            .map(|o| c.graph.node(o.node).ty.dtype)
            .collect()
    };
    assert_eq!(out_types(Outputs::Low), vec![DType::BF16]);
    assert_eq!(out_types(Outputs::Declared), vec![DType::F32]);
    // fp32 leaves them alone whatever is asked.
    let c = compile(&g, Precision::Fp32);
    assert_eq!(c.graph.node(c.graph.outputs()[0].node).ty.dtype, DType::F32);
}

#[test]
fn examples_and_fixtures_within_tolerance_of_f32() {
    for (name, g, inputs) in models() {
        let want = interpret(&g, &inputs).unwrap();
        for (precision, tol) in [(Precision::Bf16, 1e-2), (Precision::Fp16, 5e-3)] {
            let c = compile(&g, precision);
            let has_matmul = g.nodes().iter().any(|n| n.op == graphc::ir::Op::MatMul);
            assert!(
                !has_matmul || c.precision.low_nodes > 0,
                "{name} {precision}: nothing lowered"
            );
            let got = graphc::run_cpu(&c, inputs.clone()).unwrap_or_else(|e| panic!("{name} {precision}: {e}"));
            // Float outputs come in the low type (as PyTorch's converted model gives
            // them): the same names and shapes, compared in f32.
            let got = widened(got, &want, precision);
            let pairs = zip_outputs(&got, &want)
                .unwrap_or_else(|e| panic!("{name} {precision}: the interface keeps its outputs: {e}"));
            for (n, a, b) in pairs {
                let err = relative_l2(a, b);
                println!("{name}/{n} {precision}: relative L2 vs f32 {err:.2e}");
                assert!(err <= tol, "{name}/{n} {precision}: relative L2 {err:.3e} > {tol:.0e}");
            }
        }
    }
}

#[test]
fn weights_are_stored_low_and_the_arena_halves() {
    let g = gpt(&GptConfig::default()).unwrap();
    let f32 = compile(&g, Precision::Fp32);
    let bf16 = compile(&g, Precision::Bf16);
    let low_weights = bf16
        .graph
        .weights()
        .values()
        .filter(|w| w.dtype() == DType::BF16)
        .count();
    assert!(low_weights >= 4, "the four matmul weights are bf16: {low_weights}");
    assert!(bf16.plan.weights_bytes * 100 <= f32.plan.weights_bytes * 51);
    assert!(
        bf16.plan.arena_bytes * 100 <= f32.plan.arena_bytes * 51,
        "arena {} vs {}",
        bf16.plan.arena_bytes,
        f32.plan.arena_bytes
    );
    // Casts are fused into kernels: no standalone cast kernel.
    assert_eq!(bf16.program.kernels.len(), f32.program.kernels.len());
    let dir = repo_path("tests/fixtures/onnx/llama");
    let llama = graphc::load_model(&dir.join("model.onnx"), &[]).unwrap();
    assert_eq!(
        compile(&llama, Precision::Bf16).program.kernels.len(),
        compile(&llama, Precision::Fp32).program.kernels.len()
    );
    // fp32 and tf32 leave the graph alone.
    let tf32 = compile(&g, Precision::Tf32);
    assert_eq!(graphc::ir::print(&tf32.graph), graphc::ir::print(&f32.graph));
    assert_eq!(tf32.plan.arena_bytes, f32.plan.arena_bytes);
}

#[test]
fn snapshot_bf16_transformer_block() {
    let c = compile(&gpt(&GptConfig::default()).unwrap(), Precision::Bf16);
    insta::assert_snapshot!(graphc::ir::print(&c.graph));
}

/// The 12-layer GPT (d 1024, 16 heads, batch 8, seq 1024): at bf16 its arena is at most
/// 0.51 of its f32 arena.
#[test]
fn gpt12_bf16_arena_is_half_the_f32_arena() {
    let g = gpt(&GptConfig {
        batch: 8,
        seq: 1024,
        d_model: 1024,
        heads: 16,
        layers: 12,
        dtype: DType::F32,
        seed: 0,
    })
    .unwrap();
    let f32 = compile(&g, Precision::Fp32);
    let bf16 = compile(&g, Precision::Bf16);
    let ratio = bf16.plan.arena_bytes as f64 / f32.plan.arena_bytes as f64;
    println!(
        "gpt12: arena f32 {} MiB, bf16 {} MiB ({ratio:.3}x); weights {} -> {} MiB; {}",
        f32.plan.arena_bytes >> 20,
        bf16.plan.arena_bytes >> 20,
        f32.plan.weights_bytes >> 20,
        bf16.plan.weights_bytes >> 20,
        bf16.precision.summary()
    );
    assert!(ratio <= 0.51, "bf16 arena / f32 arena = {ratio:.3}");
}

/// f16 overflows above 65504: the attention logits (q k^T, feeding softmax's exp) must
/// not be f16. Attention is recognized before the precision pass, and its kernel
/// computes the scores, the softmax and the sums in f32 at every precision: at fp16
/// and bf16 the attention op and every matmul take and give the low type.
#[test]
fn attention_computes_its_logits_in_f32_inside_the_kernel() {
    let g = gpt(&GptConfig::default()).unwrap();
    for (p, low) in [(Precision::Fp16, DType::F16), (Precision::Bf16, DType::BF16)] {
        let c = compile(&g, p);
        let types = |want: fn(&graphc::ir::Op) -> bool| -> Vec<DType> {
            c.graph
                .nodes()
                .iter()
                .filter(|n| want(&n.op))
                .map(|n| n.ty.dtype)
                .collect()
        };
        let attention = types(|o| matches!(o, graphc::ir::Op::Attention { .. }));
        assert_eq!(attention, vec![low], "{p}");
        let matmuls = types(|o| *o == graphc::ir::Op::MatMul);
        assert!(
            matmuls.len() >= 4 && matmuls.iter().all(|&d| d == low),
            "{p}: {matmuls:?}"
        );
    }
}

/// `graphc fit` (the API) takes the precision: bf16 fits a larger batch.
#[test]
fn fit_takes_the_precision() {
    let path = repo_path("tests/fixtures/onnx/gpt2_dynamic/model.onnx");
    let fit = |precision| {
        let opts = CompileOptions {
            precision,
            memory: graphc::MemoryOptions {
                budget_bytes: 256 << 20,
                ..Default::default()
            },
            ..Default::default()
        };
        graphc::fit::fit_model(&path, &[("seq".to_string(), 64)], "batch", &opts, 1 << 16)
            .unwrap()
            .value
    };
    let (f32, bf16) = (fit(Precision::Fp32), fit(Precision::Bf16));
    println!("gpt2_dynamic seq=64 in 256 MiB: batch {f32} at fp32, {bf16} at bf16");
    assert!(bf16 > f32 * 5 / 4, "{bf16} vs {f32}");
}
