//! `graphc run`: compile, print the passes and the memory plan, run on the CPU or a
//! GPU (`--check`: the GPU against the CPU executor), print and write the outputs.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{bail, Result};
use graphc::ir::Tensor;
use graphc::Compiled;
use graphc_compiler::plan::report;

use crate::args::{BudgetArgs, Device, DeviceArgs, ModelArgs};
use crate::common::{
    human_bytes, load_inputs, open_device, print_graph_error, print_session, print_sim, summarize, Target,
};
use crate::counts::Counts;

#[derive(clap::Args)]
pub struct RunArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Inputs, one array per model input, by name (default: random, seed 0).
    #[arg(long, value_name = "IN.npz")]
    pub inputs: Option<PathBuf>,
    /// Write the outputs here (.npz).
    #[arg(long, value_name = "OUT.npz")]
    pub output: Option<PathBuf>,
    #[command(flatten)]
    pub device: DeviceArgs,
    #[command(flatten)]
    pub budget: BudgetArgs,
    /// With --device cuda or cuda-sim (or auto on a GPU machine): also run the CPU
    /// executor on the same inputs and compare
    /// (relative L2 per output: 1e-5 for f32/f64, 1e-2 for f16 and for f32 with
    /// --tf32, 3e-2 for bf16; integers and bool exactly); exit 1 if any output is off.
    #[arg(long)]
    pub check: bool,
}

pub fn run(args: RunArgs) -> Result<()> {
    let RunArgs {
        model,
        inputs,
        output,
        device,
        budget,
        check,
    } = args;
    if check && device.device == Device::Cpu {
        let cmd = crate::hint::command_line().with("--device", Some("cuda-sim"));
        bail!(
            "--check compares a run on the GPU (--device cuda) or on cuda-sim with the CPU executor, which \
             --device cpu already is: `{cmd}` compares the generated CUDA C, run on this CPU, with it"
        );
    }
    device.check()?;
    let graph = model.load()?;
    println!(
        "model    {}: {}",
        model.model.display(),
        crate::common::describe(&graph)
    );
    // Plan and budget first: nothing sized by the model is allocated before the
    // plan says it fits.
    let progress = crate::common::Progress::new("compiling");
    let compiled = graphc::compile_with(&graph, &budget.options())?;
    drop(progress);
    graphc::check_budget_on(&compiled, &model.rerun(&budget), device.device.planned_for())?;
    print_passes(&compiled);
    if budget.precision.low_type().is_some() {
        println!("precision {}", compiled.precision.summary());
    }
    if !compiled.quantize.quantized.is_empty() {
        println!("weights   {}", compiled.quantize.summary());
    }
    let target = open_device(&compiled, device)?;
    // The totals of the device that runs it (the CPU has no cuBLASLt workspace).
    let planned = match target {
        Target::Cpu(_) => graphc_compiler::plan::Device::Cpu,
        Target::Gpu(_) | Target::Sim(_) => graphc_compiler::plan::Device::Cuda,
    };
    let picture = graphc::CommandLine::new(
        std::iter::once("plan".to_string())
            .chain(model.words())
            .chain(budget.words())
            .chain(["--picture".to_string()]),
    );
    println!("plan     the static memory plan (`{picture}` draws it):");
    for line in report::summary_for(&compiled.program, &compiled.plan, planned).lines() {
        if line.is_empty() {
            println!();
        } else {
            println!("         {line}");
        }
    }
    let session = match target {
        Target::Sim(sim) => return run_sim(&compiled, *sim, &graph, inputs.as_deref(), output, check, device),
        Target::Gpu(s) => Some(s),
        Target::Cpu(why) => {
            if let Some(e) = why {
                println!("device   no usable GPU here, so the CPU: {e}");
                if check {
                    return Err(anyhow::Error::new(e).context("--check needs a GPU"));
                }
            }
            None
        }
    };
    if session.is_none() {
        graphc::check_host_memory(&compiled)?;
    }
    let inputs = load_inputs(inputs.as_deref(), &graph)?;
    let outputs = match session {
        None => run_cpu(&compiled, inputs)?,
        Some(mut session) => {
            let outputs = run_cuda(&compiled, &mut session, &inputs)?;
            if check {
                let want = graphc::run_cpu(&compiled, inputs)?;
                check_outputs(&outputs, &want, device.gpu.tf32)?;
            }
            outputs
        }
    };
    finish(&outputs, output)
}

/// The run on cuda-sim (with `check`, compared with the CPU executor).
fn run_sim(
    compiled: &Compiled,
    mut sim: graphc::cuda::sim::SimSession,
    graph: &graphc::ir::Graph,
    inputs: Option<&std::path::Path>,
    output: Option<PathBuf>,
    check: bool,
    device: crate::args::DeviceArgs,
) -> Result<()> {
    graphc::check_host_memory(compiled)?;
    let inputs = load_inputs(inputs, graph)?;
    print_sim(&sim, device.sim.describe());
    let start = Instant::now();
    let outputs = sim.run(compiled.graph.weights(), &inputs)?;
    println!(
        "run      cuda-sim, {}: {:.2} ms (wall clock on the host)",
        Counts::gpu(&compiled.program, sim.launch_plan()),
        start.elapsed().as_secs_f64() * 1e3
    );
    if check {
        let want = graphc::run_cpu(compiled, inputs)?;
        check_outputs(&outputs, &want, false)?;
    }
    finish(&outputs, output)
}

/// Print the outputs and write them where asked.
fn finish(outputs: &[(String, Tensor)], output: Option<PathBuf>) -> Result<()> {
    for (name, t) in outputs {
        println!("output   {name}: {}", summarize(t));
    }
    if let Some(path) = output {
        graphc::npz::write_npz(&path, outputs)?;
        println!("wrote    {}", path.display());
    }
    Ok(())
}

/// One `pass` line per compiler pass: what it took in and gave out, its time, what
/// it did (the pipeline's typed report, rendered by its `Display`).
fn print_passes(compiled: &Compiled) {
    for p in &compiled.passes {
        println!("pass     {p}");
    }
}

fn run_cpu(compiled: &Compiled, inputs: std::collections::HashMap<String, Tensor>) -> Result<Vec<(String, Tensor)>> {
    let plan = &compiled.plan;
    let start = Instant::now();
    let outputs = graphc::run_cpu(compiled, inputs)?;
    println!(
        "run      cpu (kernel-IR executor), {}, through a {} arena ({} intermediates at planned offsets): {:.2} ms",
        Counts::cpu(&compiled.program),
        human_bytes(plan.arena_bytes),
        plan.buffers.len(),
        start.elapsed().as_secs_f64() * 1e3
    );
    Ok(outputs)
}

fn run_cuda(
    compiled: &Compiled,
    session: &mut graphc::cuda::Session,
    inputs: &std::collections::HashMap<String, Tensor>,
) -> Result<Vec<(String, Tensor)>> {
    let counts = Counts::gpu(&compiled.program, session.launch_plan());
    print_session(session, &counts);
    let start = Instant::now();
    let outputs = session.run(inputs)?;
    println!(
        "run      cuda, {counts}{}: {:.2} ms (first run, wall clock, with copies{})",
        if session.uses_graph() { " in a CUDA graph" } else { "" },
        start.elapsed().as_secs_f64() * 1e3,
        if session.uses_graph() { " and graph capture" } else { "" }
    );
    print_graph_error(session);
    Ok(outputs)
}

/// The GPU's outputs against the CPU executor's: one `check` line per output (relative
/// L2 against its tolerance); an error when the lists differ or any output is off.
fn check_outputs(got: &[(String, Tensor)], want: &[(String, Tensor)], tf32: bool) -> Result<()> {
    let checks = graphc::selftest::compare_outputs(got, want, tf32)
        .map_err(|e| anyhow::anyhow!("--check: the GPU's outputs are not the CPU executor's: {e}"))?;
    let mut failed = Vec::new();
    for c in &checks {
        println!(
            "check    {} rel_l2 {:.3e} (tol {:.0e}) {}",
            c.name,
            c.rel_l2,
            c.tolerance,
            if c.pass { "ok" } else { "FAIL" }
        );
        if !c.pass {
            failed.push(c.name.as_str());
        }
    }
    if !failed.is_empty() {
        bail!(
            "--check: the GPU's outputs differ from the CPU executor's: {}",
            failed.join(", ")
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use graphc::ir::DType;

    fn t(dtype: DType, v: &[f64]) -> Tensor {
        Tensor::from_f64(dtype, vec![v.len()], v).unwrap()
    }

    #[test]
    fn check_compares_names_counts_and_integers() {
        let y = ("y".to_string(), t(DType::F32, &[1.0, 2.0]));
        let arg = ("arg".to_string(), t(DType::I64, &[0.0, 1.0]));
        let want = vec![y.clone(), arg.clone()];
        assert!(check_outputs(&want, &want, false).is_ok());
        let e = check_outputs(std::slice::from_ref(&y), &want, false)
            .unwrap_err()
            .to_string();
        assert_eq!(
            e,
            "--check: the GPU's outputs are not the CPU executor's: 1 outputs, expected 2"
        );
        let swapped = vec![arg.clone(), y.clone()];
        assert!(check_outputs(&swapped, &want, false).is_err());
        let off = vec![y, ("arg".to_string(), t(DType::I64, &[0.0, 2.0]))];
        let e = check_outputs(&off, &want, true).unwrap_err().to_string();
        assert!(e.ends_with("differ from the CPU executor's: arg"), "{e}");
    }
}
