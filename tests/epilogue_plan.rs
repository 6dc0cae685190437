//! `codegen::epilogue_plan` agrees with full code generation for every kernel of the
//! example models and the self-test graphs (native and generated matmul epilogues,
//! scratch outputs, quantized GEMMs).

use graphc::models::{gpt, kernel_bench, mlp, transformer_block, GptConfig, MlpConfig};
use graphc_compiler::codegen::{epilogue_plan, generate};
use graphc_compiler::kernel::KernelKind;

#[test]
fn models_and_selftest_graphs_agree() {
    let mut graphs = vec![
        ("mlp".to_string(), mlp(&MlpConfig::default()).unwrap()),
        ("gpt".to_string(), gpt(&GptConfig::default()).unwrap()),
        (
            "transformer_block".to_string(),
            transformer_block(&GptConfig::default()).unwrap(),
        ),
    ];
    graphs.extend(
        kernel_bench::all()
            .unwrap()
            .into_iter()
            .map(|(n, g)| (n.to_string(), g)),
    );
    graphs.extend(
        graphc::selftest::cases()
            .unwrap()
            .into_iter()
            .map(|c| (c.name, c.graph)),
    );
    let (mut matmuls, mut with_kernel, mut with_scratch, mut quantized) = (0, 0, 0, 0);
    for (name, g) in &graphs {
        let compiled = graphc_compiler::compile(g, &Default::default()).unwrap();
        let p = &compiled.program;
        for k in 0..p.kernels.len() {
            let plan = epilogue_plan(p, k).unwrap_or_else(|e| panic!("{name} k{k}: {e}"));
            let generated = generate(p, k);
            let Some(plan) = plan else {
                assert!(!matches!(p.kernels[k].kind, KernelKind::MatMul(_)), "{name} k{k}");
                continue;
            };
            let g = generated.unwrap_or_else(|e| panic!("{name} k{k}: {e}"));
            if matches!(&p.kernels[k].kind, KernelKind::MatMul(m) if m.quant.is_some()) {
                // A quantized GEMM is one generated kernel, epilogue inside: no second
                // launch, no scratch, no cuBLASLt.
                assert!(g.has_source() && g.gemm.is_none(), "{name} k{k}");
                assert!(!plan.needs_kernel() && plan.scratch_bytes() == 0, "{name} k{k}");
                quantized += 1;
                continue;
            }
            assert_eq!(plan.needs_kernel(), g.has_source(), "{name} k{k}");
            assert_eq!(
                plan.scratch_bytes(),
                g.gemm.as_ref().unwrap().scratch_bytes,
                "{name} k{k}"
            );
            matmuls += 1;
            with_kernel += usize::from(plan.needs_kernel());
            with_scratch += usize::from(plan.scratch_bytes() > 0);
        }
    }
    assert!(
        matmuls > 10 && with_kernel > 0 && with_scratch > 0 && quantized >= 6,
        "{matmuls} {with_kernel} {with_scratch} {quantized}"
    );
}
