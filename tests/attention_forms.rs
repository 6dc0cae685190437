//! Attention as users export it: every transformer fixture in both of transformers'
//! forms (`attn_implementation` "eager" and "sdpa", the default), with static shapes
//! (the exporter folds the causal mask of a static export into a constant) and
//! symbolic ones (the mask computed from positions), each family (GPT-2, BERT, Llama
//! with grouped-query heads, ViT).
//!
//! - Each layer's attention is one attention kernel, whatever the form and the dims,
//!   and no tensor of the score matrix's `[.., s, s]` shape is left in the plan: masks
//!   stay at their small shape (a padding mask `[b, 1, 1, s]`) or become `causal`.
//! - Outputs agree with PyTorch's (the fixtures' `outputs.npz`, f32 on the CPU) within
//!   1e-4 relative L2 through the reference interpreter on the imported graph, the CPU
//!   executor on the compiled plan and, with a host C++ compiler, cuda-sim; compiled
//!   for bf16, within 3e-2 on the CPU executor and cuda-sim.
//!
//! `bert_sdpa` has a third sequence that is padding only. At opset 20 the exported graph
//! masks with the dtype's lowest (finite), so that sequence attends uniformly to its
//! padded keys, as eager attention does (ONNX Runtime agrees); PyTorch's SDPA gives
//! such a row 0 (its fully masked rows are 0). For such rows the reference is what the
//! exported graph defines: the eager model's output (`outputs_eager.npz`). At opset 23
//! the export is ONNX's Attention op with a boolean mask, which gives that row 0 as
//! PyTorch does (and ONNX Runtime).

mod common;

use std::collections::HashMap;
use std::path::Path;

use common::repo_path;
use graphc::ir::compare::relative_l2;
use graphc::ir::{interpret, Graph, Op, Tensor, TensorData};
use graphc::CompileOptions;
use graphc_compiler::kernel::{KernelKind, OpKernel, Program};
use graphc_compiler::passes::precision::Precision;

/// Every transformer fixture: the eager and sdpa exports, static and dynamic.
const FIXTURES: [&str; 19] = [
    "gpt2",
    "gpt2_sdpa",
    "bert",
    "bert_sdpa",
    "llama",
    "llama_sdpa",
    "vit",
    "vit_sdpa",
    "gpt2_dynamic",
    "gpt2_dynamic_sdpa",
    "bert_dynamic",
    "bert_dynamic_sdpa",
    "llama_dynamic",
    "llama_dynamic_sdpa",
    "vit_dynamic",
    "vit_dynamic_sdpa",
    // Exported at opset 23, where torch.onnx spells SDPA as ONNX's Attention op.
    "llama_sdpa_opset23",
    "bert_sdpa_opset23",
    "gpt2_dynamic_sdpa_opset23",
];

/// The fixture's `meta.json`.
fn meta(dir: &Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(dir.join("meta.json")).unwrap()).unwrap()
}

/// The fixture's symbolic dims at its reference inputs.
fn reference_dims(meta: &serde_json::Value) -> Vec<(String, usize)> {
    let mut dims: Vec<(String, usize)> = meta["symbolic_dims"]
        .as_object()
        .unwrap()
        .iter()
        .map(|(k, v)| (k.clone(), v.as_u64().unwrap() as usize))
        .collect();
    dims.sort();
    dims
}

/// The model, its reference inputs, and the output the exported graph defines:
/// PyTorch's, except in batch rows where ONNX Runtime (running the exported graph)
/// disagrees with PyTorch (`meta.json`); those rows are the eager model's
/// (`outputs_eager.npz`), which ONNX Runtime then agrees with.
fn load(name: &str) -> (Graph, HashMap<String, Tensor>, Tensor) {
    let dir = repo_path(&format!("tests/fixtures/onnx/{name}"));
    let meta = meta(&dir);
    let g =
        graphc::load_model(&dir.join("model.onnx"), &reference_dims(&meta)).unwrap_or_else(|e| panic!("{name}: {e}"));
    let inputs = graphc::npz::read_inputs(&dir.join("inputs.npz"), &g).unwrap();
    let mut want = graphc::npz::read_arrays(&dir.join("outputs.npz")).unwrap().remove(0).1;
    let ort = &meta["onnxruntime_vs_pytorch"];
    let rows: Vec<usize> = ort["max_abs_per_batch_row"]
        .as_array()
        .map(|r| {
            r.iter()
                .enumerate()
                .filter(|(_, d)| d.as_f64().unwrap() > 1e-4)
                .map(|(b, _)| b)
                .collect()
        })
        .unwrap_or_default();
    if !rows.is_empty() {
        assert!(
            ort["vs_eager"]["max_abs"].as_f64().unwrap() < 1e-4,
            "{name}: ONNX Runtime agrees with neither PyTorch nor the eager model"
        );
        let eager = graphc::npz::read_arrays(&dir.join("outputs_eager.npz"))
            .unwrap()
            .remove(0)
            .1
            .to_f64_vec();
        let mut w = want.to_f64_vec();
        let per_row = w.len() / want.shape().dims()[0];
        for b in rows {
            w[b * per_row..(b + 1) * per_row].copy_from_slice(&eager[b * per_row..(b + 1) * per_row]);
        }
        want = Tensor::new(want.shape().clone(), TensorData::from_f64(want.dtype(), &w)).unwrap();
    }
    (g, inputs, want)
}

/// `got` (any float dtype) against `want` (f32) within `tol` relative L2, no NaN.
fn close(what: &str, got: &[(String, Tensor)], want: &Tensor, tol: f64) {
    let got = &got[0].1;
    let g: Vec<f64> = got.to_f64_vec();
    assert!(g.iter().all(|x| x.is_finite()), "{what}: non-finite outputs");
    let w = Tensor::new(got.shape().clone(), TensorData::from_f64(want.dtype(), &g)).unwrap();
    let err = relative_l2(&w, want);
    println!("{what}: relative L2 vs PyTorch {err:.2e}");
    assert!(
        err < tol,
        "{what}: relative L2 vs PyTorch {err:.3e} (tolerance {tol:.0e})"
    );
}

fn have_cxx() -> bool {
    graphc::cuda::sim::build::find_compiler().is_ok()
}

fn sim(c: &graphc::Compiled, inputs: &HashMap<String, Tensor>) -> Vec<(String, Tensor)> {
    let opts = graphc::cuda::sim::SimOptions::default();
    let mut s = graphc::cuda::sim::SimSession::new(c, &opts).unwrap();
    s.run(c.graph.weights(), inputs).unwrap()
}

#[test]
fn every_fixture_matches_pytorch_through_the_interpreter_the_cpu_executor_and_cuda_sim() {
    let cxx = have_cxx();
    if !cxx {
        graphc_testkit::skip(graphc_testkit::Need::Cxx, "no host C++ compiler: cuda-sim not run");
    }
    for name in FIXTURES {
        let (g, inputs, want) = load(name);
        close(
            &format!("{name} interpreter"),
            &interpret(&g, &inputs).unwrap(),
            &want,
            1e-4,
        );
        for (precision, tol) in [(Precision::Fp32, 1e-4), (Precision::Bf16, 3e-2)] {
            let opts = CompileOptions {
                precision,
                ..Default::default()
            };
            let c = graphc::compile_with(&g, &opts).unwrap_or_else(|e| panic!("{name}: {e}"));
            let cpu = graphc::run_cpu(&c, inputs.clone()).unwrap_or_else(|e| panic!("{name} {precision}: {e}"));
            close(&format!("{name} {precision} cpu"), &cpu, &want, tol);
            if cxx {
                close(&format!("{name} {precision} cuda-sim"), &sim(&c, &inputs), &want, tol);
            }
        }
    }
}

/// The attention kernels of a program: their operand types.
fn attention_kernels(p: &Program) -> Vec<&OpKernel> {
    p.kernels
        .iter()
        .filter_map(|k| match &k.kind {
            KernelKind::Op(
                o @ OpKernel {
                    op: Op::Attention { .. },
                    ..
                },
            ) => Some(o),
            _ => None,
        })
        .collect()
}

/// Two layers, two attention kernels, no batched matmul (a score or probability
/// product), masks at their small shape, and, where the sequence length differs from
/// the head dim (16) so that shapes tell them apart, no buffer of `[.., s, s]`.
fn check_plan(what: &str, c: &graphc::Compiled, sdpa: bool) {
    let p = &c.program;
    let attention = attention_kernels(p);
    assert_eq!(
        attention.len(),
        2,
        "{what}: attention kernels\n{}",
        graphc_compiler::kernel::print_program(p)
    );
    let mut seq = 0;
    for a in &attention {
        let Op::Attention { zero_masked_rows, .. } = a.op else {
            unreachable!()
        };
        assert_eq!(
            zero_masked_rows, sdpa,
            "{what}: the isnan guard is the flag, and only there"
        );
        let tys: Vec<_> = a.inputs.iter().map(|(_, t)| t).collect();
        let dims = graphc::ir::AttentionDims::of(&tys).unwrap();
        if let Some((acc, _)) = a.inputs.get(3) {
            // The operand is typed as the scores' shape; the buffer behind it is the
            // mask at its own (small) shape, read with zero strides.
            let m = &p.buffer(acc.buffer).ty;
            let md = m.shape.dims();
            let r = md.len();
            assert!(
                r < 2 || md[r - 2] == 1 || md[r - 1] == 1,
                "{what}: a mask buffer {m} is a matrix per query; a padding mask is [b, 1, 1, s]"
            );
        }
        seq = dims.sk;
    }
    for k in &p.kernels {
        if let KernelKind::MatMul(mm) = &k.kind {
            assert!(
                mm.batch.len() < 2,
                "{what}: {} is a batched matmul {:?}",
                k.name,
                mm.batch
            );
        }
    }
    if seq != 16 {
        for b in &p.buffers {
            assert!(
                !b.ty.shape.dims().ends_with(&[seq, seq]),
                "{what}: a buffer {} ({:?}) of the score matrix's shape",
                b.ty,
                b.name
            );
        }
    }
}

#[test]
fn every_fixture_has_one_attention_kernel_per_layer_and_no_score_sized_tensor() {
    for name in FIXTURES {
        let dir = repo_path(&format!("tests/fixtures/onnx/{name}"));
        let sdpa = name.contains("_sdpa");
        let mut all_dims = vec![reference_dims(&meta(&dir))];
        if name.contains("dynamic") {
            // Other dims than the export's: a short sequence (so that no dim is 16) and
            // a longer one with a larger batch (dims no weight has); ViT's dims are its batch only.
            let at = |b: usize, s: usize| {
                let mut d = vec![("batch".to_string(), b)];
                if !name.starts_with("vit") {
                    d.push(("seq".to_string(), s));
                }
                d
            };
            all_dims.push(at(3, 12));
            all_dims.push(at(48, 40));
        }
        for dims in all_dims {
            let what = format!("{name} {dims:?}");
            let g = graphc::load_model(&dir.join("model.onnx"), &dims).unwrap_or_else(|e| panic!("{what}: {e}"));
            for precision in [Precision::Fp32, Precision::Bf16] {
                let opts = CompileOptions {
                    precision,
                    ..Default::default()
                };
                let c = graphc::compile_with(&g, &opts).unwrap_or_else(|e| panic!("{what}: {e}"));
                check_plan(&format!("{what} {precision}"), &c, sdpa);
            }
        }
    }
}

/// `--chunk-tokens 2` on every fixture (batches of 2 and 3 sequences): each layer's
/// attention block and MLP runs in 2 parts of the batch, whatever the form (eager or
/// SDPA, static or symbolic dims, grouped-query heads, padding masks, ONNX's Attention
/// op), with one attention kernel per part, and gives the whole plan's outputs bit for
/// bit on the CPU executor.
#[test]
fn every_fixture_runs_its_layers_in_parts_of_the_batch_bit_for_bit() {
    for name in FIXTURES {
        let (g, inputs, _) = load(name);
        let whole = graphc::compile(&g).unwrap();
        // One attention kernel per layer (`each_layer_is_one_attention_kernel`).
        let layers = attention_kernels(&whole.program).len();
        assert!(layers >= 2, "{name}");
        let opts = CompileOptions {
            token_chunks: 2,
            ..Default::default()
        };
        let parts = graphc::compile_with(&g, &opts).unwrap_or_else(|e| panic!("{name}: {e}"));
        let c = parts.chunks;
        assert_eq!(
            (c.attention_blocks, c.batch_mlps, c.batch_parts),
            (layers, layers, 2),
            "{name}: {c:?}"
        );
        assert_eq!(attention_kernels(&parts.program).len(), 2 * layers, "{name}");
        let want = graphc::run_cpu(&whole, inputs.clone()).unwrap();
        let got = graphc::run_cpu(&parts, inputs).unwrap();
        for ((n, a), (_, b)) in got.iter().zip(&want) {
            assert_eq!(a.to_f64_vec(), b.to_f64_vec(), "{name} {n}");
        }
    }
}

/// `masked_fill(mask, -inf)` (nanoGPT's and many hand-written models' form) exports
/// to `select(mask, fill, scores)`: masked *where the condition holds*, the other way
/// round from `torch.where(keep, scores, fill)`. A causal `triu(1)` buffer becomes a
/// causal attention, a padding condition an additive mask; the values are the
/// spelled-out graph's.
#[test]
fn masked_fill_attention_is_one_attention_kernel() {
    use graphc::ir::builder::GraphBuilder;
    use graphc::ir::{DType, Shape};
    let (b, h, s, d) = (2usize, 3usize, 9usize, 8usize);
    for padding in [false, true] {
        let g = GraphBuilder::new();
        let ty = |n: &str| g.input(n, DType::F32, [b, h, s, d]);
        let (q, k, v) = (ty("q"), ty("k"), ty("v"));
        let scores = q.matmul(k.transpose(&[0, 1, 3, 2])) * g.scalar(DType::F32, 1.0 / (d as f64).sqrt());
        let full = Shape::from([b, h, s, s]);
        let mask = if padding {
            // True where the key is padding.
            g.input("pad", DType::Bool, [b, 1, 1, s])
        } else {
            let above: Vec<bool> = (0..s * s).map(|x| x % s > x / s).collect();
            g.constant(Tensor::new([s, s], TensorData::Bool(above)).unwrap())
        };
        let fill = g.scalar(DType::F32, f64::NEG_INFINITY).broadcast_to(&full);
        let masked = g.select(mask.broadcast_to(&full), fill, scores);
        let y = graphc::ir::nn::softmax(masked, -1).matmul(v);
        g.output("y", y);
        let graph = g.finish().unwrap();
        let c = graphc::compile(&graph).unwrap();
        let att = attention_kernels(&c.program);
        assert_eq!(att.len(), 1, "padding {padding}: one attention kernel");
        let Op::Attention { causal, .. } = &att[0].op else {
            unreachable!()
        };
        assert_eq!(*causal, !padding, "padding {padding}");
        let mut inputs = graphc::random_inputs(&graph, 11);
        if padding {
            // The last two keys of the second sequence are padding.
            let pad: Vec<bool> = (0..b * s).map(|i| i / s == 1 && i % s >= s - 2).collect();
            inputs.insert("pad".into(), Tensor::new([b, 1, 1, s], TensorData::Bool(pad)).unwrap());
        }
        let want = interpret(&graph, &inputs).unwrap();
        // The attention kernel's CUDA C too, where there is a C++ compiler.
        if have_cxx() {
            let got = sim(&c, &inputs);
            let err = relative_l2(&got[0].1, &want[0].1);
            assert!(err < 1e-5, "padding {padding}, cuda-sim: {err:.2e}");
        }
        let got = graphc::run_cpu(&c, inputs).unwrap();
        let err = relative_l2(&got[0].1, &want[0].1);
        assert!(err < 1e-5, "padding {padding}: {err:.2e}");
    }
}
