//! `graphc cuda`: the generated CUDA C of every kernel (or one), with the cuBLASLt GEMM
//! each matmul runs and its launch shape.

use std::collections::HashMap;

use anyhow::{bail, Context, Result};

use crate::args::ModelArgs;
use crate::counts::Counts;

#[derive(clap::Args)]
pub struct CudaArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Only this kernel (its index, as `graphc opt` numbers them).
    #[arg(long)]
    pub kernel: Option<usize>,
    #[command(flatten)]
    pub step: crate::train::StepArgs,
}

pub fn run(args: CudaArgs) -> Result<()> {
    let graph = args.model.load()?;
    let compiled = args.step.compile(&graph)?;
    let program = &compiled.program;
    let count = program.kernels.len();
    let indices: Vec<usize> = match args.kernel {
        Some(k) if k >= count => bail!("--kernel {k}: the program has {count} kernels"),
        Some(k) => vec![k],
        None => (0..count).collect(),
    };
    let mut first_with: HashMap<String, String> = HashMap::new();
    for k in indices {
        let ir_kernel = program
            .kernels
            .get(k)
            .with_context(|| format!("--kernel {k}: the program has {count} kernels"))?;
        let ck = graphc_compiler::codegen::generate(program, k)?;
        let nodes: Vec<String> = ir_kernel.nodes.iter().map(|n| format!("%{n}")).collect();
        println!(
            "// ==== {} ({}): nodes {}",
            ck.name,
            ir_kernel.kind_name(),
            nodes.join(" ")
        );
        if let Some(g) = &ck.gemm {
            println!("// cuBLASLt: {}", serde_json::to_string(g)?);
        }
        if !ck.has_source() {
            println!("// (no CUDA C: cuBLASLt computes the whole kernel)\n");
            continue;
        }
        println!(
            "// launch: block {}, grid {}, dynamic shared memory {} B",
            ck.launch.block,
            serde_json::to_string(&ck.launch.grid)?,
            ck.launch.shared_mem_bytes
        );
        if let Some(same) = first_with.get(&ck.entry) {
            println!("// same source as {same} (entry {})\n", ck.entry);
            continue;
        }
        first_with.insert(ck.entry.clone(), ck.name.clone());
        println!("{}", ck.source);
    }
    if args.kernel.is_none() {
        println!("// {}", Counts::planned(&compiled, None));
    }
    Ok(())
}
