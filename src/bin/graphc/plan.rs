//! `graphc plan`: the static memory plan (summary, picture, SVG, JSON); over the budget
//! an error with the diagnosis.

use std::path::PathBuf;

use anyhow::{Context, Result};
use graphc_compiler::plan::report;

use crate::args::{BudgetArgs, ModelArgs};

#[derive(clap::Args)]
pub struct PlanArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Print the plan as JSON: every step and buffer, the summary's numbers and, when
    /// it does not fit, the diagnosis as data (the command then fails).
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub budget: BudgetArgs,
    /// Also print the arena over time (kernel steps x offsets) as text.
    #[arg(long)]
    pub picture: bool,
    /// Write the arena over time as an SVG file (only when the plan fits).
    #[arg(long, value_name = "FILE")]
    pub svg: Option<PathBuf>,
    /// Plan a whole training step (forward, loss, backward, optimizer update) and give
    /// its bytes by class: parameters, gradients, optimizer state, saved activations,
    /// temporaries.
    #[arg(long)]
    pub train: bool,
    #[command(flatten)]
    pub train_opts: crate::train::TrainArgs,
    /// Also model the time of every kernel on a GPU (`--gpu`), before anything runs:
    /// its ideal time (unique bytes at DRAM bandwidth, FLOPs at its unit's peak) and its
    /// modeled time from what its own CUDA C executes on cuda-sim (needs a host C++
    /// compiler); the kernels that lose the most are listed.
    #[arg(long)]
    pub time: bool,
    /// The GPU `--time` models: rtx4090d (the default) or h200.
    #[arg(long, value_name = "NAME", default_value = "rtx4090d", requires = "time")]
    pub gpu: String,
    /// With `--time`, how many kernels the report lists (by time lost).
    #[arg(long, value_name = "N", default_value_t = 12, requires = "time")]
    pub top: usize,
}

pub fn run(args: PlanArgs) -> Result<()> {
    if args.time {
        graphc::perf::GpuSpec::by_name(&args.gpu).map_err(|e| anyhow::anyhow!(e))?;
    }
    let graph = args.model.load()?;
    let progress = crate::common::Progress::new("compiling");
    let compiled = if args.train {
        let opts = args.train_opts.options_for(&graph, args.budget.precision)?;
        graphc::train::compile_step(&graph, opts, &args.budget.options())?
    } else {
        graphc::compile_with(&graph, &args.budget.options())?
    };
    drop(progress);
    let train_bytes = compiled.train.as_ref().map(|t| {
        report::TrainBytes::of(
            &compiled.program,
            &compiled.plan,
            &t.state,
            graphc_compiler::plan::Device::Cuda,
        )
    });
    let (program, plan) = (&compiled.program, &compiled.plan);
    let time = if args.time {
        let progress = crate::common::Progress::new("counting kernels on cuda-sim");
        let t = graphc::model_time(&compiled, &args.gpu, &graphc::cuda::sim::SimOptions::default())?;
        drop(progress);
        Some(t)
    } else {
        None
    };
    let print_summary = || {
        println!("model          {}", args.model.model.display());
        print!("{}", report::summary(program, plan));
        if args.budget.precision.low_type().is_some() {
            println!("\nprecision      {}", compiled.precision.summary());
        }
        if !compiled.quantize.quantized.is_empty() {
            println!("weights        {}", compiled.quantize.summary());
        }
        if compiled.chunks.any() {
            println!("chunks         {}", compiled.chunks.summary());
        }
        if let Some(t) = &train_bytes {
            println!();
            print!("{}", t.text());
        }
        if let Some(r) = compiled.train.as_ref().and_then(|t| t.report.recomputed_layers) {
            println!("remat          {}", r.text());
        }
        if let Some(p) = compiled.train.as_ref().and_then(|t| t.report.recomputed_logits) {
            println!("loss           {}", p.text());
        }
        if let Some(m) = compiled.train.as_ref().map(|t| t.report.mlp_parts).filter(|m| m.any()) {
            println!("mlps           {}, in the forward and the backward", m.summary());
        }
        if let Some(t) = &time {
            println!();
            print!("{}", t.text(args.top));
        }
        if args.picture {
            println!();
            print!("{}", report::picture(plan, 64, 16));
        }
    };
    let mut rerun = args.model.rerun(&args.budget);
    if args.train {
        rerun.fit_options.extend(args.train_opts.words());
    }
    let json = || {
        let planned = graphc_compiler::plan::Device::Cuda;
        let mut v = serde_json::to_value(report::PlanJson::new(program, plan, planned, &rerun))?;
        if let (Some(t), Some(obj)) = (&train_bytes, v.as_object_mut()) {
            obj.insert("train".into(), serde_json::to_value(t)?);
        }
        if let (Some(t), Some(obj)) = (&time, v.as_object_mut()) {
            obj.insert("time".into(), serde_json::to_value(t)?);
        }
        serde_json::to_string_pretty(&v)
    };
    if let Err(over) = graphc::check_budget(&compiled, &rerun) {
        // The summary (or the JSON, with the diagnosis as data), then the diagnosis
        // as the error; no SVG is written.
        if args.json {
            println!("{}", json()?);
        } else {
            print_summary();
        }
        // An inference plan not run in parts yet: the fewest parts that fit, planned.
        if !args.train && args.budget.chunk_tokens.is_none() {
            let progress = crate::common::Progress::new("planning in parts");
            let parts = in_parts(&graph, &args.budget, &rerun);
            drop(progress);
            if let Some(line) = parts {
                return Err(anyhow::anyhow!("{}\n{line}", over.to_string().trim_end()));
            }
        }
        return Err(over.into());
    }
    if let Some(path) = &args.svg {
        graphc::ir::files::write_file(path, report::svg(program, plan).as_bytes()).context("writing the SVG")?;
    }
    if args.json {
        println!("{}", json()?);
    } else {
        print_summary();
        if let Some(path) = &args.svg {
            println!("wrote          {}", path.display());
        }
    }
    Ok(())
}

/// The remedy of running every layer in parts (`--chunk-tokens N`): the fewest of 2,
/// 4, .., 64 parts whose plan fits, planned exactly, as a line of the diagnosis (or the
/// most parts' total, when none fits); None when the model has nothing to run in parts.
fn in_parts(graph: &graphc::ir::Graph, budget: &crate::args::BudgetArgs, rerun: &graphc::Rerun) -> Option<String> {
    use graphc_compiler::plan::report::human_bytes;
    let mut last = None;
    for n in [2usize, 4, 8, 16, 32, 64] {
        let opts = graphc::CompileOptions {
            token_chunks: n,
            ..budget.options()
        };
        let c = graphc::compile_with(graph, &opts).ok()?;
        if !c.chunks.any() {
            return None;
        }
        let command = rerun.with("--chunk-tokens", &n.to_string());
        let what = c.chunks.summary();
        if c.plan.fits() {
            return Some(format!(
                "  - every layer in {n} parts (`{command}`, the same values: {what}): planned, total {}: fits",
                human_bytes(c.plan.total_bytes)
            ));
        }
        last = Some(format!(
            "  - every layer in parts: with {n} (`{command}`: {what}) the plan's total is {}, still over by {}",
            human_bytes(c.plan.total_bytes),
            human_bytes(c.plan.total_bytes.saturating_sub(c.plan.budget_bytes))
        ));
    }
    last
}
