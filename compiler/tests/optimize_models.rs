//! The optimizer on real models: the example transformer block and the ONNX fixtures
//! (GPT-2, BERT, Llama, ViT) optimize to graphs no larger than the original that
//! compute the same outputs on random inputs (bitwise, up to NaN payloads and the sign
//! of zero, see `optimize_equivalence.rs`; within 1e-5 where an inexact rule such as
//! the tanh GELU recognition fired).

use std::collections::HashMap;
use std::path::PathBuf;

use graphc_compiler::optimize::{optimize, OptimizeOptions};
use graphc_ir::{interpret, Graph, Op, Tensor, TensorData};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// Bitwise equality of float data, except NaN == NaN and 0.0 == -0.0.
fn same_bits(a: f64, b: f64) -> bool {
    a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan()) || (a == 0.0 && b == 0.0)
}

fn assert_same(model: &str, name: &str, want: &Tensor, got: &Tensor) {
    assert_eq!(want.ty(), got.ty(), "{model}: output {name} changed type");
    let equal = match (want.data(), got.data()) {
        (TensorData::F32(x), TensorData::F32(y)) => x
            .iter()
            .zip(y)
            .all(|(&p, &q)| p.to_bits() == q.to_bits() || same_bits(p as f64, q as f64)),
        (TensorData::F64(x), TensorData::F64(y)) => x.iter().zip(y).all(|(&p, &q)| same_bits(p, q)),
        (w, g) if w.dtype().is_float() => w.to_f64_vec().iter().zip(g.to_f64_vec()).all(|(&p, q)| same_bits(p, q)),
        (w, g) => w.to_le_bytes() == g.to_le_bytes(),
    };
    if !equal {
        let (w, g) = (want.to_f64_vec(), got.to_f64_vec());
        let i = (0..w.len()).find(|&i| !same_bits(w[i], g[i])).unwrap_or(0);
        panic!(
            "{model}: output {name} differs at element {i}: {} vs {} (optimized)",
            w[i], g[i]
        );
    }
}

/// Optimize `g`; check size and outputs on a few random input sets.
fn check(model: &str, g: &Graph) {
    let (opt, report) = optimize(g, &OptimizeOptions::default()).unwrap_or_else(|e| panic!("{model}: {e}"));
    opt.verify().unwrap();
    eprintln!(
        "{model}: {} -> {} nodes, {} folded, {} iterations, {}; rules {:?}",
        report.nodes_before,
        report.nodes_after,
        report.constants_folded,
        report.iterations,
        report.stop_reason,
        report.rules_fired
    );
    assert!(
        opt.len() <= g.len(),
        "{model}: optimized graph has {} nodes, the original {}",
        opt.len(),
        g.len()
    );
    for seed in 0..2 {
        let inputs: HashMap<String, Tensor> = g
            .inputs()
            .iter()
            .enumerate()
            .map(|(k, &id)| match &g.node(id).op {
                Op::Input { name, ty } => (name.clone(), Tensor::random(ty, 100 * seed + k as u64)),
                _ => unreachable!("inputs are input nodes"),
            })
            .collect();
        let want = interpret(g, &inputs).unwrap_or_else(|e| panic!("{model}: original: {e}"));
        let got = interpret(&opt, &inputs).unwrap_or_else(|e| panic!("{model}: optimized: {e}"));
        assert_eq!(want.len(), got.len());
        let inexact = graphc_compiler::optimize::rules::INEXACT
            .iter()
            .any(|r| report.rules_fired.contains_key(*r));
        for ((name, w), (name2, o)) in want.iter().zip(&got) {
            assert_eq!(name, name2);
            if inexact {
                // A composite op recognized: a few ulps, not bitwise.
                let (a, b) = (w.to_f64_vec(), o.to_f64_vec());
                let num: f64 = a.iter().zip(&b).map(|(x, y)| (x - y) * (x - y)).sum();
                let den: f64 = a.iter().map(|x| x * x).sum();
                let err = (num / den.max(f64::MIN_POSITIVE)).sqrt();
                assert!(err < 1e-5, "{model}: output {name}: relative L2 {err:.3e}");
            } else {
                assert_same(model, name, w, o);
            }
        }
    }
}

#[test]
fn transformer_block_example() {
    let g = graphc_ir::load_gir(root().join("examples/models/transformer_block.gir")).unwrap();
    check("transformer_block.gir", &g);
}

fn onnx(model: &str) {
    let path = root().join(format!("tests/fixtures/onnx/{model}/model.onnx"));
    let g = graphc_ir::onnx::import_onnx(&path, &Default::default()).unwrap_or_else(|e| panic!("{model}: {e}"));
    check(model, &g);
}

#[test]
fn onnx_gpt2() {
    onnx("gpt2");
}

#[test]
fn onnx_bert() {
    onnx("bert");
}

#[test]
fn onnx_llama() {
    onnx("llama");
}

#[test]
fn onnx_vit() {
    onnx("vit");
}
