//! Real models exported from PyTorch (transformers, torch.onnx.export with the dynamo
//! exporter; see scripts/export_models.py): import, compile (optimize and fuse), run the
//! kernels on the CPU and compare with PyTorch's outputs.

mod common;

use common::repo_path;
use graphc::ir::compare::{relative_l2, zip_outputs};
use graphc::ir::interpret;

fn check_fixture(name: &str) {
    check_fixture_at(name, &[]);
}

fn check_fixture_at(name: &str, dims: &[(String, usize)]) {
    let dir = repo_path(&format!("tests/fixtures/onnx/{name}"));
    let graph = graphc::load_model(&dir.join("model.onnx"), dims).unwrap_or_else(|e| panic!("{name}: {e}"));
    let inputs = graphc::npz::read_inputs(&dir.join("inputs.npz"), &graph).unwrap();
    let expected = graphc::npz::read_arrays(&dir.join("outputs.npz")).unwrap();
    let compiled = graphc::compile(&graph).unwrap();
    let got = graphc::run_cpu(&compiled, inputs.clone()).unwrap_or_else(|e| panic!("{name}: {e}"));
    // The fused kernels compute what the interpreter computes for the imported graph.
    let reference = interpret(&graph, &inputs).unwrap();
    for (n, a, b) in zip_outputs(&got, &reference).unwrap_or_else(|e| panic!("{name}: {e}")) {
        let err = relative_l2(a, b);
        assert!(
            err < 1e-5,
            "{name}/{n}: fused vs interpreter relative L2 error {err:.3e}"
        );
    }
    for (gname, g, e) in zip_outputs(&got, &expected).unwrap_or_else(|e| panic!("{name} vs PyTorch: {e}")) {
        let err = relative_l2(g, e);
        println!("{name}/{gname}: relative L2 error vs PyTorch {err:.2e}");
        assert!(err < 1e-4, "{name}/{gname}: relative L2 error {err:.3e}");
    }
}

#[test]
fn gpt2_matches_pytorch() {
    check_fixture("gpt2");
}

#[test]
fn llama_matches_pytorch() {
    check_fixture("llama");
}

#[test]
fn bert_matches_pytorch() {
    check_fixture("bert");
}

#[test]
fn vit_matches_pytorch() {
    check_fixture("vit");
}

/// A small CNN (torch.onnx's default export, BatchNorm folded into the convolutions by
/// the exporter): every convolution is one kernel with its bias, activation and
/// residual add.
#[test]
fn cnn_matches_pytorch_with_one_kernel_per_convolution() {
    let dims = [("batch".to_string(), 2)];
    check_fixture_at("cnn", &dims);
    let graph = graphc::load_model(&repo_path("tests/fixtures/onnx/cnn/model.onnx"), &dims).unwrap();
    let compiled = graphc::compile(&graph).unwrap();
    let kinds: Vec<&str> = compiled.program.kernels.iter().map(|k| k.kind_name()).collect();
    // 7 convolutions (one a 1x1 as a GEMM), 3 pools, the pools' sum, the mean, the head.
    assert_eq!(kinds.iter().filter(|k| **k == "conv").count(), 6, "{kinds:?}");
    assert_eq!(kinds.len(), 13, "{kinds:?}");
}

#[test]
fn snapshot_imported_gpt2_ir() {
    let graph = graphc::load_model(&repo_path("tests/fixtures/onnx/gpt2/model.onnx"), &[]).unwrap();
    insta::assert_snapshot!("gpt2_imported", graphc::ir::print(&graph));
}

/// After optimization, no node computes from constants and weights alone, except
/// broadcasts (which the size rule keeps, rather than materializing their result).
#[test]
fn optimized_fixtures_have_no_shape_arithmetic_or_constant_only_subgraphs() {
    use graphc::ir::Op;
    for name in ["gpt2", "llama", "bert", "vit"] {
        let graph = graphc::load_model(&repo_path(&format!("tests/fixtures/onnx/{name}/model.onnx")), &[]).unwrap();
        let g = graphc::compile(&graph).unwrap().graph;
        let mut constant = vec![false; g.len()];
        for id in g.topo_order().unwrap() {
            let node = g.node(id);
            let leaf = matches!(node.op, Op::Constant { .. } | Op::Parameter { .. } | Op::Iota { .. });
            let from_constants = !node.inputs.is_empty() && node.inputs.iter().all(|i| constant[i.index()]);
            constant[id.index()] = leaf || from_constants;
            if from_constants {
                assert!(
                    matches!(node.op, Op::Broadcast { .. }),
                    "{name}: {id} ({}) computes from constants only",
                    node.op.name()
                );
            }
        }
    }
}

#[test]
fn snapshot_optimized_fixture_ir() {
    for name in ["gpt2", "llama"] {
        let graph = graphc::load_model(&repo_path(&format!("tests/fixtures/onnx/{name}/model.onnx")), &[]).unwrap();
        let compiled = graphc::compile(&graph).unwrap();
        insta::assert_snapshot!(format!("{name}_optimized"), graphc::ir::print(&compiled.graph));
    }
}

/// Every layer norm and RMS norm of the exported models is one row kernel, and every
/// attention (scores, mask, softmax, product with v) one attention kernel: each
/// fixture has two layers, so 2 norms per layer plus the final norm, and 2 attention
/// kernels; no other kernel reduces, and no matmul is left over scores.
#[test]
fn fixture_norms_are_one_kernel_each_and_attention_one_kernel_per_layer() {
    use graphc_compiler::kernel::{print_program, KernelKind, OpKernel, RowKernel};
    for name in ["gpt2", "llama", "bert", "vit"] {
        let graph = graphc::load_model(&repo_path(&format!("tests/fixtures/onnx/{name}/model.onnx")), &[]).unwrap();
        let p = graphc::compile(&graph).unwrap().program;
        let rows: Vec<usize> = p
            .kernels
            .iter()
            .filter_map(|k| match &k.kind {
                KernelKind::Row(RowKernel { stages, .. }) => Some(stages.len()),
                _ => None,
            })
            .collect();
        assert_eq!(rows.len(), 5, "{name}: {rows:?}\n{}", print_program(&p));
        let attention = p.kernels.iter().filter(|k| k.kind_name() == "attention").count();
        assert_eq!(attention, 2, "{name}: attention kernels\n{}", print_program(&p));
        // The only matmuls left are the projections, MLPs and head: none is batched
        // over heads (a score or probability product would be rank 4).
        for k in &p.kernels {
            if let KernelKind::MatMul(mm) = &k.kind {
                assert!(
                    mm.batch.len() < 2,
                    "{name}: {} is a batched matmul {:?}",
                    k.name,
                    mm.batch
                );
            }
        }
        assert!(
            p.kernels.iter().all(|k| !matches!(
                &k.kind,
                KernelKind::Op(OpKernel {
                    op: graphc::ir::Op::Reduce { .. },
                    ..
                })
            )),
            "{name}"
        );
        println!("{name}: {} kernels, row kernels with {rows:?} stages", p.kernels.len());
    }
}
