//! The CUDA executor as a library: compile a model, load it onto the GPU once
//! (`graphc::cuda::Session`), run it many times, time it, and compare with the CPU
//! executor. Without a GPU it says so and runs on the CPU instead.
//!
//! `cargo run --release --example cuda_session`

use graphc::cuda::{BenchOptions, Session, SessionOptions};
use graphc::models::{gpt, GptConfig};
use graphc::selftest::{output_error, tolerance};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let graph = gpt(&GptConfig {
        layers: 2,
        d_model: 256,
        ..GptConfig::default()
    })?;
    let compiled = graphc::compile(&graph)?;
    let inputs = graphc::random_inputs(&graph, 1);
    let want = graphc::run_cpu(&compiled, inputs.clone())?;

    let mut session = match Session::new(&compiled, SessionOptions::default()) {
        Ok(s) => s,
        Err(e) if e.is_unavailable() => {
            println!("no GPU here ({e}); the CPU executor gave:");
            for (name, t) in &want {
                println!("  {name}: {}", t.ty());
            }
            return Ok(());
        }
        Err(e) => return Err(e.into()),
    };
    println!("loaded: {}", session.memory().summary());
    let got = session.run(&inputs)?;
    for ((name, g), (_, w)) in got.iter().zip(&want) {
        let err = output_error(g, w);
        println!(
            "  {name}: relative L2 vs the CPU executor {err:.2e} (tolerance {:.0e})",
            tolerance(w.ty().dtype, false)
        );
    }
    let r = session.bench(
        &inputs,
        BenchOptions {
            warmup: 10,
            iters: 100,
            per_kernel: false,
        },
    )?;
    println!(
        "{} launches{}: median {:.4} ms (min {:.4}, max {:.4})",
        session.launch_plan().launches.len(),
        if r.graph { " in a CUDA graph" } else { "" },
        r.median_ms,
        r.min_ms,
        r.max_ms
    );
    Ok(())
}
