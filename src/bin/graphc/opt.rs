//! `graphc opt`: the optimized graph, each node tagged with its kernel, the kernels,
//! then what the optimizer and fusion did.

use anyhow::Result;
use graphc_compiler::kernel;

use crate::args::ModelArgs;
use crate::common::human_bytes;
use crate::counts::Counts;

#[derive(clap::Args)]
pub struct OptArgs {
    #[command(flatten)]
    pub model: ModelArgs,
}

pub fn run(args: OptArgs) -> Result<()> {
    let graph = args.model.load()?;
    let compiled = graphc::compile(&graph)?;
    let program = &compiled.program;
    print!("{}", kernel::annotate_ir(&graphc::ir::print(&compiled.graph), program));
    for line in kernel::print_program(program).lines() {
        println!("# {line}");
    }
    let r = &compiled.optimize;
    println!(
        "# optimized {} in {:.2} ms",
        args.model.model.display(),
        r.time.as_secs_f64() * 1e3
    );
    println!("# nodes: {} -> {}", graph.len(), compiled.graph.len());
    println!("# constants folded: {}", r.constants_folded);
    let f = &compiled.fusion;
    println!(
        "# fusion: {}; unfused {} launches (one per op); global memory traffic: {} (unfused {})",
        Counts::planned(&compiled, None),
        f.unfused_kernels,
        human_bytes(f.bytes as u64),
        human_bytes(f.unfused_bytes as u64)
    );
    println!(
        "# weights: {} -> {} bytes{}",
        r.weight_bytes_before,
        r.weight_bytes_after,
        if r.weights_added.is_empty() {
            String::new()
        } else {
            format!(" (folded: {})", r.weights_added.join(", "))
        }
    );
    println!(
        "# e-graph: {} nodes in {} classes after {} iterations; stopped: {}",
        r.egraph_nodes, r.egraph_classes, r.iterations, r.stop_reason
    );
    if !r.weights_dropped.is_empty() {
        println!("# weights no longer used: {}", r.weights_dropped.join(", "));
    }
    let fired: Vec<String> = r.rules_fired.iter().map(|(k, v)| format!("{k} {v}")).collect();
    println!(
        "# rules fired: {}",
        if fired.is_empty() {
            "none".to_string()
        } else {
            fired.join(", ")
        }
    );
    Ok(())
}
