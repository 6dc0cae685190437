//! `graphc launches`: the launch list a GPU would run (planned for a reference device;
//! no GPU is used), as text or JSON.

use anyhow::Result;
use clap::ValueEnum;

use crate::args::ModelArgs;
use crate::counts::Counts;

#[derive(clap::Args)]
pub struct LaunchesArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// The device to plan for (a reference description; no GPU is used).
    #[arg(long, value_enum, default_value_t = Gpu::Rtx4090d)]
    pub gpu: Gpu,
    /// Print the launch list as JSON instead of text.
    #[arg(long)]
    pub json: bool,
}

#[derive(Clone, Copy, ValueEnum)]
pub enum Gpu {
    /// RTX 4090D: sm_89, 114 SMs (graphc's default target).
    Rtx4090d,
    /// H200: sm_90, 132 SMs.
    H200,
}

pub fn run(args: LaunchesArgs) -> Result<()> {
    let graph = args.model.load()?;
    let compiled = graphc::compile(&graph)?;
    let device = match args.gpu {
        Gpu::Rtx4090d => graphc::cuda::DeviceInfo::rtx_4090d(),
        Gpu::H200 => graphc::cuda::DeviceInfo::h200(),
    };
    let kernels = graphc_compiler::codegen::generate_all(&compiled.program)?;
    let lp = graphc::cuda::plan_launches(&compiled.program, &compiled.plan, &kernels, &device)?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&lp)?);
        return Ok(());
    }
    // The device line, the counts in the CLI's vocabulary, one line per launch.
    println!("{}", lp.describe_device());
    println!("{}", Counts::gpu(&compiled.program, &lp));
    print!("{}", lp.describe_launches());
    Ok(())
}
