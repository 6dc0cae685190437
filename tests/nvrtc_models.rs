//! Every kernel of every example model, ONNX fixture and training step compiles with NVRTC for sm_89
//! and sm_90 with no error and no warning, and (where ptxas is available) spills no
//! registers on sm_89.
//!
//! Without libnvrtc this test says it skipped (`graphc_testkit::skip`), unless
//! `GRAPHC_REQUIRE` lists nvrtc (ptxas for the spill check),
//! when it fails. `.ci/run` installs the NVRTC wheel and sets both variables; locally:
//! `pip install -r scripts/requirements-cuda.txt` into a venv and point LD_LIBRARY_PATH
//! at its `nvidia/cuda_nvrtc/lib` (GRAPHC_PTXAS at `nvidia/cuda_nvcc/bin/ptxas`).

mod common;

use std::path::PathBuf;

use common::{repo_path, temp_dir};
use graphc::ir::{DType, Graph};
use graphc::models::{gpt, mlp, GptConfig, MlpConfig};
use graphc_compiler::codegen::{generate_all, CudaKernel};
use graphc_compiler::nvrtc::{self, NvrtcOptions, OutputKind};
use graphc_compiler::passes::precision::Precision;
use graphc_compiler::passes::quantize::WeightQuant;

use graphc_testkit::{skip, Need};

fn models() -> Vec<(String, Graph)> {
    let mut v = vec![
        ("mlp".to_string(), mlp(&MlpConfig::default()).unwrap()),
        ("transformer_block".to_string(), gpt(&GptConfig::default()).unwrap()),
    ];
    for dtype in [DType::BF16, DType::F16] {
        let cfg = GptConfig {
            layers: 2,
            dtype,
            ..GptConfig::default()
        };
        v.push((format!("gpt_2_layers_{dtype}"), gpt(&cfg).unwrap()));
    }
    for (name, g) in graphc::models::kernel_bench::all().unwrap() {
        v.push((name.to_string(), g));
    }
    // The attention kernel at every shape the self-test runs (dtypes, head dims to 256,
    // masks, grouped-query heads).
    for case in graphc::selftest::cases().unwrap() {
        if case.name.starts_with("attention")
            || case.name.starts_with("qgemm")
            || case.name.starts_with("dequantize")
            || case.name.starts_with("op scatter_add")
        {
            v.push((format!("selftest {}", case.name), case.graph));
        }
    }
    for name in ["gpt2", "bert", "llama", "vit"] {
        let path = repo_path(&format!("tests/fixtures/onnx/{name}/model.onnx"));
        v.push((name.to_string(), graphc::load_model(&path, &[]).unwrap()));
    }
    v
}

fn kernels() -> Vec<CudaKernel> {
    let mut all = Vec::new();
    let mut compiled_models = Vec::new();
    for (name, g) in models() {
        let compiled = graphc::compile(&g).unwrap_or_else(|e| panic!("{name}: {e}"));
        compiled_models.push((name.clone(), compiled));
        // The fixtures with int4 weights (the quantized GEMMs at their real shapes), at
        // fp32 (CUDA cores) and bf16 (tensor cores).
        if ["gpt2", "llama"].contains(&name.as_str()) {
            for precision in [Precision::Fp32, Precision::Bf16] {
                let opts = graphc::CompileOptions {
                    weights: WeightQuant::Int4,
                    precision,
                    ..Default::default()
                };
                let c = graphc::compile_with(&g, &opts).unwrap_or_else(|e| panic!("{name}: {e}"));
                compiled_models.push((format!("{name} int4 {precision}"), c));
            }
        }
    }
    // Training steps (forward, backward with attention's, AdamW updates) of two of the
    // PyTorch references, in f32, in bf16 and in fp16 with loss scaling (the
    // tensor-core attention backward, the scaler's checks).
    for (name, precision) in [
        ("gpt2_sdpa", Precision::Fp32),
        ("llama", Precision::Fp32),
        ("gpt2_sdpa", Precision::Bf16),
        ("llama", Precision::Fp16),
    ] {
        let dir = repo_path(&format!("tests/fixtures/train/{name}"));
        let g = graphc::load_model(&dir.join("model.onnx"), &[]).unwrap();
        let labels = graphc::npz::read_arrays(&dir.join("inputs.npz"))
            .unwrap()
            .into_iter()
            .find(|(n, _)| n == "labels")
            .unwrap()
            .1;
        let opts = graphc::train::TrainOptions {
            loss: graphc::train::Loss {
                shift_labels: true,
                ..graphc::train::Loss::new(graphc::train::LossKind::CrossEntropy, "labels")
            },
            optimizer: graphc::train::Optimizer::AdamW(Default::default()),
            freeze: None,
            target: labels.ty(),
            output: None,
            loss_scale: (precision == Precision::Fp16).then(graphc::train::LossScaling::default),
            remat: Default::default(),
            accumulate: 1,
        };
        let base = graphc::CompileOptions {
            precision,
            ..Default::default()
        };
        let step = graphc::train::compile_step(&g, opts, &base).unwrap_or_else(|e| panic!("{name}: {e}"));
        compiled_models.push((format!("{name} {precision} training step"), step));
    }
    for (name, compiled) in compiled_models {
        let ks = generate_all(&compiled.program).unwrap_or_else(|e| panic!("{name}: {e}"));
        all.extend(ks.into_iter().filter(|k| k.has_source()).map(|mut k| {
            k.name = format!("{name}/{}", k.name);
            k
        }));
    }
    all
}

fn find_ptxas() -> Option<PathBuf> {
    std::env::var_os("GRAPHC_PTXAS")
        .map(PathBuf::from)
        .filter(|p| p.is_file())
}

#[test]
fn every_model_kernel_compiles_cleanly_for_sm89_and_sm90() {
    if !nvrtc::available() {
        skip(Need::Nvrtc, "libnvrtc cannot be loaded (set LD_LIBRARY_PATH)");
        return;
    }
    let ks = kernels();
    let mut distinct: Vec<&str> = ks.iter().map(|k| k.entry.as_str()).collect();
    distinct.sort_unstable();
    distinct.dedup();
    for arch in ["sm_89", "sm_90"] {
        let opts = NvrtcOptions {
            arch: arch.to_string(),
            output: OutputKind::Cubin,
            use_cache: false,
            cache_dir: None,
            ..NvrtcOptions::default()
        };
        let out = nvrtc::compile(&ks, &opts).unwrap_or_else(|e| panic!("{arch}: {e}"));
        let bad: Vec<String> = out
            .iter()
            .zip(&ks)
            .filter(|(c, _)| c.has_warnings() || c.image.is_empty())
            .map(|(c, k)| format!("{} ({arch}):\n{}\n{}", k.name, c.log, k.source))
            .collect();
        assert!(bad.is_empty(), "NVRTC warnings or empty images:\n{}", bad.join("\n\n"));
    }
    println!(
        "{} kernels ({} distinct sources) compiled cleanly for sm_89 and sm_90",
        ks.len(),
        distinct.len()
    );

    let Some(ptxas) = find_ptxas() else {
        skip(
            Need::Ptxas,
            "GRAPHC_PTXAS does not name a ptxas: the spill check did not run",
        );
        return;
    };
    let opts = NvrtcOptions {
        output: OutputKind::Ptx,
        use_cache: false,
        cache_dir: None,
        ..NvrtcOptions::default()
    };
    let out = nvrtc::compile(&ks, &opts).unwrap();
    let dir = temp_dir("ptxas-models");
    let mut spills = Vec::new();
    let mut seen = std::collections::HashSet::new();
    for (c, k) in out.iter().zip(&ks) {
        if !seen.insert(k.entry.clone()) {
            continue;
        }
        let ptx = dir.join(format!("{}.ptx", k.entry));
        std::fs::write(&ptx, &c.image).unwrap();
        let r = std::process::Command::new(&ptxas)
            .args(["-v", "--gpu-name", "sm_89", "-o"])
            .arg(dir.join(format!("{}.cubin", k.entry)))
            .arg(&ptx)
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&r.stderr).into_owned() + &String::from_utf8_lossy(&r.stdout);
        assert!(r.status.success(), "ptxas failed on {}:\n{text}", k.name);
        for line in text.lines().filter(|l| l.contains("spill stores")) {
            let stores = line
                .split(',')
                .find(|p| p.contains("spill stores"))
                .and_then(|p| p.split_whitespace().next())
                .and_then(|n| n.parse::<u64>().ok());
            if stores != Some(0) {
                spills.push(format!("{}: {line}", k.name));
            }
        }
    }
    assert!(spills.is_empty(), "register spills:\n{}", spills.join("\n"));
    println!("ptxas: no spills in {} distinct kernels", seen.len());
}
