//! `graphc random-inputs`: random inputs for a model, written to an .npz file.
//!
//! Inputs are made for a run, so the model is planned first: a model whose run cannot
//! fit the budget (on the CPU, the least it can take) is an error naming by how much,
//! before gigabytes of inputs are generated and written.

use std::path::PathBuf;

use anyhow::{Context, Result};

use crate::args::{BudgetArgs, ModelArgs};

#[derive(clap::Args)]
pub struct RandomInputsArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// The .npz file to write (one array per model input, by name).
    #[arg(long, short, value_name = "IN.npz")]
    pub output: PathBuf,
    /// Seed of the random values (input i gets seed + i).
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    #[command(flatten)]
    pub budget: BudgetArgs,
}

pub fn run(args: RandomInputsArgs) -> Result<()> {
    let graph = args.model.load()?;
    let compiled = graphc::compile_with(&graph, &args.budget.options())?;
    graphc::check_budget_on(
        &compiled,
        &args.model.rerun(&args.budget),
        graphc_compiler::plan::Device::Cpu,
    )?;
    graphc::check_host_bytes(compiled.plan.inputs_bytes, "making the inputs")?;
    let arrays = graphc::try_random_input_list(&graph, args.seed)?;
    graphc::npz::write_npz(&args.output, &arrays).with_context(|| "writing random inputs")?;
    println!("wrote    {} ({} arrays)", args.output.display(), arrays.len());
    Ok(())
}
