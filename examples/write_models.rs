//! Writes the builder models of src/models.rs as `.gir` files (weights beside each, as
//! `.safetensors`) for the GPU check (bench/gpu_check.sh): the default MLP, the default
//! transformer block, and 2-layer GPT stacks in f32, f16 and bf16.
//!
//! `cargo run --release --example write_models -- OUT_DIR`

use graphc::ir::{weights::save_gir, DType, Graph};
use graphc::models::{self, GptConfig, MlpConfig};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = std::path::PathBuf::from(std::env::args().nth(1).unwrap_or_else(|| "target/models".into()));
    std::fs::create_dir_all(&dir)?;
    let gpt2l = |dtype| {
        models::gpt(&GptConfig {
            layers: 2,
            dtype,
            ..Default::default()
        })
    };
    let all: Vec<(&str, Graph)> = vec![
        ("mlp", models::mlp(&MlpConfig::default())?),
        ("transformer_block", models::transformer_block(&GptConfig::default())?),
        ("gpt2l_f32", gpt2l(DType::F32)?),
        ("gpt2l_f16", gpt2l(DType::F16)?),
        ("gpt2l_bf16", gpt2l(DType::BF16)?),
    ];
    for (name, g) in all {
        let path = dir.join(format!("{name}.gir"));
        save_gir(&g, &path)?;
        println!(
            "{name}: {} nodes, {} inputs, {} outputs -> {}",
            g.len(),
            g.inputs().len(),
            g.outputs().len(),
            path.display()
        );
    }
    Ok(())
}
