//! A pre-LN GPT block built with the builder (graphc::models::gpt, src/models.rs):
//! prints a summary, runs it through the reference interpreter and through its fused
//! kernels on the CPU (the kernel-IR executor) and times both, also for a 2-layer d=256
//! stack.
//!
//! `cargo run --release --example transformer_block` runs it;
//! `cargo run --release --example transformer_block -- --save` also (re)writes
//! examples/models/transformer_block.gir with its weights and a sample input file.

use std::time::Instant;

use graphc::ir::{interpret, weights::save_gir, Graph, Tensor};
use graphc::models::{gpt, GptConfig};

fn random_inputs(graph: &Graph, seed: u64) -> Vec<(String, Tensor)> {
    graph
        .inputs()
        .iter()
        .map(|&id| {
            let name = graph.input_name(id).unwrap_or_default().to_string();
            (name, Tensor::random(&graph.node(id).ty, seed))
        })
        .collect()
}

fn time_interpreter(label: &str, graph: &Graph) -> Result<(), Box<dyn std::error::Error>> {
    let inputs = random_inputs(graph, 1).into_iter().collect();
    interpret(graph, &inputs)?; // warm up
    let runs = 5;
    let mut times = Vec::new();
    for _ in 0..runs {
        let start = Instant::now();
        interpret(graph, &inputs)?;
        times.push(start.elapsed().as_secs_f64() * 1e3);
    }
    times.sort_by(f64::total_cmp);
    let compiled = graphc::compile(graph)?;
    let mut fused = Vec::new();
    for _ in 0..runs {
        let start = Instant::now();
        graphc::run_cpu(&compiled, inputs.clone())?;
        fused.push(start.elapsed().as_secs_f64() * 1e3);
    }
    fused.sort_by(f64::total_cmp);
    println!(
        "{label}: {} nodes, {} weight bytes; interpreter median {:.2} ms, {} fused kernels on the CPU {:.2} ms \
         (medians of {runs} runs)",
        graph.len(),
        graph.weights_bytes(),
        times[runs / 2],
        compiled.program.kernels.len(),
        fused[runs / 2]
    );

    // The CPU run is planning + the kernels through the arena; the unplanned executor
    // (one allocation per buffer) for comparison.
    let reps = 21;
    let median = |f: &dyn Fn() -> Result<(), Box<dyn std::error::Error>>| -> Result<f64, Box<dyn std::error::Error>> {
        f()?; // warm up
        let mut t = Vec::new();
        for _ in 0..reps {
            let start = Instant::now();
            f()?;
            t.push(start.elapsed().as_secs_f64() * 1e3);
        }
        t.sort_by(f64::total_cmp);
        Ok(t[reps / 2])
    };
    let plan = compiled.plan.clone();
    let planning = median(&|| {
        let s = graphc_compiler::plan::schedule(&compiled.program);
        let p = graphc_compiler::plan::apply_schedule(&compiled.program, &s.order);
        graphc_compiler::plan::plan_memory(&p, &Default::default())?;
        Ok(())
    })?;
    let arena = median(&|| {
        graphc::run_cpu_planned(&compiled, &plan, inputs.clone())?;
        Ok(())
    })?;
    let unplanned = median(&|| {
        graphc_runtime::kernels::run_program(&compiled.program, compiled.graph.weights(), &inputs)?;
        Ok(())
    })?;
    println!(
        "  of which: memory plan {planning:.2} ms ({} arena, {} intermediates), kernels through the arena \
         {arena:.2} ms; unplanned (one allocation per buffer) {unplanned:.2} ms (medians of {reps})",
        plan.arena_bytes,
        plan.buffers.len()
    );
    Ok(())
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let block = gpt(&GptConfig::default())?;
    time_interpreter("transformer block (batch 2, seq 16, d 128, 4 heads)", &block)?;
    let two_layers = gpt(&GptConfig {
        d_model: 256,
        layers: 2,
        ..GptConfig::default()
    })?;
    time_interpreter("2-layer GPT (batch 2, seq 16, d 256, 4 heads)", &two_layers)?;

    if std::env::args().any(|a| a == "--save") {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/models");
        let gir = dir.join("transformer_block.gir");
        save_gir(&block, &gir)?;
        graphc::npz::write_npz(&dir.join("transformer_block_inputs.npz"), &random_inputs(&block, 1))?;
        println!("wrote {} and its weights and inputs", gir.display());
    }
    Ok(())
}
