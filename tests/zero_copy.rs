//! Weights are views into their mapped files from import to plan: a model loaded from
//! ONNX external data or a `.gir` with safetensors compiles without decoding (copying)
//! a weight that folding does not read, every compiled weight shares its data with the
//! loaded one, and running still gives the interpreter's results.

mod common;

use common::{random_inputs, repo_path, temp_dir};

/// The GPT-2 fixture's weights live in `model.onnx.data`: mapped at import, and still
/// undecoded views of the same data after the whole pipeline.
#[test]
fn onnx_external_data_stays_mapped_through_compile() {
    let g = graphc::load_model(&repo_path("tests/fixtures/onnx/gpt2/model.onnx"), &[]).unwrap();
    let mapped: Vec<&String> = g
        .weights()
        .iter()
        .filter(|(_, t)| t.is_mapped())
        .map(|(n, _)| n)
        .collect();
    assert!(mapped.len() > 10, "{} weights mapped", mapped.len());
    assert!(g.weights().values().filter(|t| t.is_mapped()).all(|t| !t.is_decoded()));
    let c = graphc::compile(&g).unwrap();
    let mut shared = 0;
    for (name, t) in c.graph.weights() {
        let Some(src) = g.weight(name) else { continue };
        assert!(t.shares_data(src), "{name}: the compiled graph holds a copy");
        shared += usize::from(src.is_mapped());
    }
    assert!(shared > 10, "{shared}");
    // Only what folding reads is decoded (GPT-2: sliced biases, the position
    // embedding gather, the mask): small tensors; the rest are never decoded.
    for (name, t) in g.weights().iter().filter(|(_, t)| t.is_mapped()) {
        if t.is_decoded() {
            assert!(t.ty().size_bytes() <= 64 << 10, "{name} ({}) was decoded", t.ty());
        }
    }
    let untouched = g
        .weights()
        .values()
        .filter(|t| t.is_mapped() && !t.is_decoded())
        .count();
    assert!(untouched >= 8, "{untouched} weights never decoded");
    // Running decodes what it reads, once, and agrees with the interpreter.
    let inputs = random_inputs(&g, 3);
    let got = graphc::run_cpu(&c, inputs.clone()).unwrap();
    let want = graphc::ir::interp::interpret(&g, &inputs).unwrap();
    for (name, t) in &got {
        let w = want.iter().find(|(n, _)| n == name).map(|(_, t)| t).unwrap();
        let rel = common::rel_l2(&t.to_f64_vec(), &w.to_f64_vec());
        assert!(rel < 1e-5, "{name}: {rel}");
    }
}

/// A `.gir` model's safetensors file is mapped as well: the loaded weights are views,
/// equal to the saved ones, decoded only when read.
#[test]
fn safetensors_weights_are_mapped() {
    let g = graphc::models::gpt(&graphc::models::GptConfig::default()).unwrap();
    let dir = temp_dir("zero-copy-gir");
    let path = dir.join("block.gir");
    graphc::ir::save_gir(&g, &path).unwrap();
    let loaded = graphc::ir::load_gir(&path).unwrap();
    assert_eq!(loaded.weights().len(), g.weights().len());
    for (name, t) in loaded.weights() {
        assert!(t.is_mapped() && !t.is_decoded(), "{name}");
        assert_eq!(t, g.weight(name).unwrap(), "{name}");
    }
    let c = graphc::compile(&loaded).unwrap();
    let inputs = random_inputs(&g, 4);
    let got = graphc::run_cpu(&c, inputs.clone()).unwrap();
    let want = graphc::run_cpu(&graphc::compile(&g).unwrap(), inputs).unwrap();
    assert_eq!(got, want);
}

/// At bf16 the weights fold into bf16 copies, read through transient decoded copies
/// (the mapped f32 weights are never decoded in place), and a second import of the same
/// file (a fit's next probe) gets the same folded data instead of casting again.
#[test]
fn folded_casts_read_mapped_weights_once() {
    let path = repo_path("tests/fixtures/onnx/gpt2/model.onnx");
    let opts = graphc::CompileOptions {
        precision: graphc_compiler::passes::precision::Precision::Bf16,
        ..Default::default()
    };
    let g1 = graphc::load_model(&path, &[]).unwrap();
    let c1 = graphc::compile_with(&g1, &opts).unwrap();
    let big = |g: &graphc::ir::Graph| {
        g.weights()
            .iter()
            .filter(|(_, t)| t.is_mapped() && t.ty().size_bytes() >= 16 << 10)
            .map(|(n, _)| n.clone())
            .collect::<Vec<_>>()
    };
    let mapped = big(&g1);
    assert!(mapped.len() >= 8, "{mapped:?}");
    for n in &mapped {
        assert!(!g1.weight(n).unwrap().is_decoded(), "{n} was decoded in place");
    }
    let low: Vec<(&String, &graphc::ir::Tensor)> = c1
        .graph
        .weights()
        .iter()
        .filter(|(_, t)| t.dtype() == graphc::ir::DType::BF16 && t.ty().size_bytes() >= 8 << 10)
        .collect();
    assert!(low.len() >= 8, "{} bf16 weights", low.len());
    let g2 = graphc::load_model(&path, &[]).unwrap();
    let c2 = graphc::compile_with(&g2, &opts).unwrap();
    for (name, t) in &low {
        let again = c2.graph.weight(name).unwrap();
        assert!(again.shares_data(t), "{name} was cast again");
    }
}
