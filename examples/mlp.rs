//! Embedded use: build an MLP with the builder, print its IR, compile it and run it on
//! the CPU. `cargo run --release --example mlp`
//!
//! The model itself is `graphc::models::mlp` (src/models.rs), written with the builder.

use std::time::Instant;

use graphc::ir::{print, DType, Tensor, TensorType};
use graphc::models::{mlp, MlpConfig};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let cfg = MlpConfig {
        batch: 4,
        widths: vec![16, 32, 8],
        ..MlpConfig::default()
    };
    let graph = mlp(&cfg)?;
    print!("{}", print(&graph));

    let compiled = graphc::compile(&graph)?;
    let x = Tensor::random(&TensorType::new(DType::F32, [cfg.batch, cfg.widths[0]]), 7);
    let start = Instant::now();
    let outputs = graphc::run_cpu(&compiled, [("x".to_string(), x)].into())?;
    let elapsed = start.elapsed();
    for (name, t) in &outputs {
        println!("# {name} = {t}");
    }
    println!(
        "# ran in {:.3} ms on the reference interpreter",
        elapsed.as_secs_f64() * 1e3
    );
    Ok(())
}
