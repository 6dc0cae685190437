//! Helpers shared by the integration tests.
#![allow(dead_code)]

use std::collections::HashMap;
use std::path::PathBuf;

use graphc::ir::{DType, Graph, Tensor};
use graphc::models::{gpt, kernel_bench, mlp, GptConfig, MlpConfig};

/// A fresh, empty temporary folder for one test.
pub fn temp_dir(test: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("graphc-{}-{test}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("temp dir");
    dir
}

/// Random inputs for every graph input, deterministic for a seed.
pub fn random_inputs(graph: &Graph, seed: u64) -> HashMap<String, Tensor> {
    graphc::random_inputs(graph, seed * 1000)
}

pub fn repo_path(rel: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(rel)
}

/// Relative L2 error ||got - want|| / ||want|| (infinite when the lengths differ or
/// non-finite values disagree).
pub fn rel_l2(got: &[f64], want: &[f64]) -> f64 {
    graphc::ir::compare::relative_l2_values(got, want)
}

/// The examples every device path is checked on: the MLP, the transformer block (built
/// and as saved), kernel benchmarks, 2-layer GPTs in f32/f16/bf16, a bf16 MLP.
pub fn example_models() -> Vec<(String, Graph)> {
    let mut v: Vec<(String, Graph)> = vec![
        (
            "mlp".into(),
            graphc::models::mlp(&graphc::models::MlpConfig::default()).unwrap(),
        ),
        (
            "block".into(),
            graphc::models::gpt(&graphc::models::GptConfig::default()).unwrap(),
        ),
        (
            "saved block".into(),
            graphc::load_model(&repo_path("examples/models/transformer_block.gir"), &[]).unwrap(),
        ),
        (
            "gelu_sigmoid".into(),
            graphc::models::kernel_bench::gelu_sigmoid(5000).unwrap(),
        ),
        (
            "layernorm_gelu bf16".into(),
            graphc::models::kernel_bench::layernorm_gelu(16, 256, graphc::ir::DType::BF16).unwrap(),
        ),
        (
            "softmax".into(),
            graphc::models::kernel_bench::softmax(8, 1000).unwrap(),
        ),
    ];
    for dtype in [graphc::ir::DType::F32, graphc::ir::DType::F16, graphc::ir::DType::BF16] {
        v.push((
            format!("2-layer gpt {dtype}"),
            graphc::models::gpt(&graphc::models::GptConfig {
                layers: 2,
                d_model: 64,
                dtype,
                ..graphc::models::GptConfig::default()
            })
            .unwrap(),
        ));
    }
    v.push((
        "mlp bf16".into(),
        graphc::models::mlp(&graphc::models::MlpConfig {
            widths: vec![64, 256, 64],
            dtype: graphc::ir::DType::BF16,
            ..graphc::models::MlpConfig::default()
        })
        .unwrap(),
    ));
    v
}

/// The exported ONNX fixtures (GPT-2, BERT, Llama, ViT, GPT-2 with symbolic dims
/// fixed, and two SDPA exports), each with the dims it is loaded with.
pub fn fixtures() -> Vec<(&'static str, Vec<(String, usize)>)> {
    vec![
        ("gpt2", vec![]),
        ("bert", vec![]),
        ("llama", vec![]),
        ("vit", vec![]),
        ("gpt2_dynamic", vec![("batch".to_string(), 2), ("seq".to_string(), 8)]),
        // transformers' default (SDPA) attention as exported: the isnan guard.
        ("bert_sdpa", vec![]),
        (
            "llama_dynamic_sdpa",
            vec![("batch".to_string(), 2), ("seq".to_string(), 12)],
        ),
        // A small CNN: convolutions (strided, dilated, grouped, depthwise, 1-D) with
        // their epilogues, pooling (max with ceil mode, both averages).
        ("cnn", vec![("batch".to_string(), 2)]),
    ]
}

/// A norm, then a GEMM whose product two stores read (an erf GELU and an exp, neither
/// cuBLASLt's epilogue): the product goes to GEMM scratch, live at the plan's peak with
/// the norm's output; then a GEMM reads each result.
pub fn scratch_epilogue_model() -> Graph {
    use graphc::ir::nn::{self, GeluApprox};
    use graphc::ir::{DType, GraphBuilder, TensorType};
    let (n, d, h) = (64, 32, 256);
    let b = GraphBuilder::new();
    let x = b.input("x", DType::F32, [n, d]);
    let w = |name: &str, r: usize, c: usize, seed: u64| {
        b.param(name, Tensor::randn(&TensorType::new(DType::F32, [r, c]), 0.2, seed))
    };
    let xn = nn::layer_norm(x, None, None, 1e-5);
    let z = xn.matmul(w("up", d, h, 4));
    let g = nn::gelu(z, GeluApprox::Erf);
    let e = (z * 0.25).exp();
    b.output("y", g.matmul(w("down", h, d, 5)) + e.matmul(w("side", h, d, 6)) + xn);
    b.finish().unwrap()
}

/// The examples and real fixtures with their inputs (the fixtures' own), for the tests
/// that compare a compile option's outputs with the f32 interpreter's.
pub fn models() -> Vec<(String, Graph, std::collections::HashMap<String, graphc::ir::Tensor>)> {
    let mut v = Vec::new();
    for (name, g) in [
        ("mlp", mlp(&MlpConfig::default()).unwrap()),
        ("block", gpt(&GptConfig::default()).unwrap()),
        (
            "2-layer gpt",
            gpt(&GptConfig {
                layers: 2,
                d_model: 64,
                ..GptConfig::default()
            })
            .unwrap(),
        ),
        ("gelu_sigmoid", kernel_bench::gelu_sigmoid(4096).unwrap()),
        ("softmax", kernel_bench::softmax(16, 300).unwrap()),
        (
            "saved block",
            graphc::load_model(&repo_path("examples/models/transformer_block.gir"), &[]).unwrap(),
        ),
    ] {
        let inputs = random_inputs(&g, 4);
        v.push((name.to_string(), g, inputs));
    }
    for name in ["gpt2", "bert", "llama", "vit"] {
        let dir = repo_path(&format!("tests/fixtures/onnx/{name}"));
        let g = graphc::load_model(&dir.join("model.onnx"), &[]).unwrap();
        let inputs = graphc::npz::read_inputs(&dir.join("inputs.npz"), &g).unwrap();
        v.push((name.to_string(), g, inputs));
    }
    // Symbolic dims fixed; token ids in range.
    let dir = repo_path("tests/fixtures/onnx/gpt2_dynamic");
    let dims = [("batch".to_string(), 2), ("seq".to_string(), 16)];
    let g = graphc::load_model(&dir.join("model.onnx"), &dims).unwrap();
    let inputs = graphc::npz::read_inputs(&repo_path("tests/fixtures/onnx/gpt2/inputs.npz"), &g).unwrap();
    v.push(("gpt2_dynamic".to_string(), g, inputs));
    v
}

/// Outputs given in the low type where the f32 reference has f32, widened to f32
/// exactly (a low-type value is an f32 value); every other output as it is.
pub fn widened(
    got: Vec<(String, graphc::ir::Tensor)>,
    want: &[(String, graphc::ir::Tensor)],
    precision: graphc_compiler::passes::precision::Precision,
) -> Vec<(String, graphc::ir::Tensor)> {
    got.into_iter()
        .zip(want)
        .map(|((n, t), (_, w))| {
            if w.dtype() == DType::F32 && Some(t.dtype()) == precision.low_type() {
                let f = graphc::ir::Tensor::from_f64(DType::F32, t.shape().clone(), &t.to_f64_vec()).unwrap();
                (n, f)
            } else {
                (n, t)
            }
        })
        .collect()
}

/// Compile options with this memory budget.
pub fn with_budget(budget_bytes: u64) -> graphc::CompileOptions {
    graphc::CompileOptions {
        memory: graphc_compiler::plan::MemoryOptions {
            budget_bytes,
            ..Default::default()
        },
        ..Default::default()
    }
}
