//! `graphc bench`: warm-up runs, then the median of timed runs, on a GPU (CUDA events,
//! inputs already on the device) or the CPU (wall clock); text or one JSON object.

use std::collections::HashMap;
use std::path::PathBuf;
use std::time::Instant;

use anyhow::{bail, Result};
use graphc::cuda::KernelTiming;
use graphc::ir::Tensor;
use graphc::Compiled;
use serde::Serialize;

use crate::args::{BudgetArgs, Device, DeviceArgs, ModelArgs};
use crate::common::{describe, human_bytes, load_inputs, open_device, print_graph_error, print_session, Target};
use crate::counts::Counts;

#[derive(clap::Args)]
pub struct BenchArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Inputs, one array per model input, by name (default: random, seed 0).
    #[arg(long, value_name = "IN.npz")]
    pub inputs: Option<PathBuf>,
    #[command(flatten)]
    pub device: DeviceArgs,
    #[command(flatten)]
    pub budget: BudgetArgs,
    /// Untimed runs before the timed ones.
    #[arg(long, default_value_t = 10)]
    pub warmup: usize,
    /// Timed runs (at least 1); the median, least and greatest are reported.
    #[arg(long, default_value_t = 50)]
    pub iters: usize,
    /// Also time every launch (GPU; without the CUDA graph).
    #[arg(long)]
    pub per_kernel: bool,
    /// Print one JSON object instead of text.
    #[arg(long)]
    pub json: bool,
}

/// `graphc bench --json`.
#[derive(Serialize)]
struct BenchReport<'a> {
    model: String,
    /// `cpu`, `cuda` or `cuda-sim`.
    device: &'static str,
    gpu: Option<&'a str>,
    arch: Option<&'a str>,
    precision: &'a str,
    /// Whether the timed runs replayed a CUDA graph.
    graph: bool,
    tf32: bool,
    warmup: usize,
    iters: usize,
    median_ms: f64,
    min_ms: f64,
    max_ms: f64,
    /// Kernels of the fused program.
    kernels: usize,
    /// What one run puts on the stream (on the CPU: kernel runs).
    launches: usize,
    /// cuBLASLt GEMM calls among the launches (0 on the CPU).
    gemms: Option<usize>,
    /// Distinct compiled CUDA C sources (null on the CPU).
    modules: Option<usize>,
    plan: PlanBytes,
    device_bytes: Option<u64>,
    free_bytes_at_load: Option<u64>,
    per_kernel: &'a [KernelTiming],
    graph_error: Option<&'a str>,
}

/// The memory plan's byte counts.
#[derive(Serialize)]
struct PlanBytes {
    arena_bytes: u64,
    weights_bytes: u64,
    inputs_bytes: u64,
    outputs_bytes: u64,
    workspace_bytes: u64,
    total_bytes: u64,
}

impl PlanBytes {
    fn of(compiled: &Compiled, device: graphc_compiler::plan::Device) -> PlanBytes {
        let p = &compiled.plan;
        let cpu = device == graphc_compiler::plan::Device::Cpu;
        PlanBytes {
            arena_bytes: p.arena_bytes,
            weights_bytes: p.weights_bytes,
            inputs_bytes: p.inputs_bytes,
            outputs_bytes: p.outputs_bytes,
            workspace_bytes: if cpu { 0 } else { p.workspace_bytes },
            total_bytes: p.total_bytes_for(device),
        }
    }
}

/// Run times in milliseconds.
struct Times {
    median_ms: f64,
    min_ms: f64,
    max_ms: f64,
    iters: usize,
}

pub fn run(args: BenchArgs) -> Result<()> {
    let graph = args.model.load()?;
    let progress = crate::common::Progress::new("compiling");
    let compiled = graphc::compile_with(&graph, &args.budget.options())?;
    drop(progress);
    graphc::check_budget_on(
        &compiled,
        &args.model.rerun(&args.budget),
        args.device.device.planned_for(),
    )?;
    if args.device.device == Device::Cpu {
        graphc::check_host_memory(&compiled)?;
    }
    let inputs = load_inputs(args.inputs.as_deref(), &graph)?;
    let target = open_device(&compiled, args.device)?;
    if !args.json {
        println!("model    {}: {}", args.model.model.display(), describe(&graph));
    }
    match target {
        Target::Cpu(why) => {
            if let Some(e) = why {
                // stdout is JSON only with --json.
                let note = format!("device   no usable GPU here, so the CPU: {e}");
                if args.json {
                    eprintln!("{note}");
                } else {
                    println!("{note}");
                }
                graphc::check_host_memory(&compiled)?;
            }
            if args.per_kernel {
                bail!("{}", crate::hint::per_kernel_needs_a_gpu());
            }
            let times = time_cpu(&compiled, &inputs, args.warmup, args.iters)?;
            report_host(&args, &compiled, HostRun::Cpu, &times)
        }
        Target::Sim(mut sim) => {
            graphc::check_host_memory(&compiled)?;
            if args.per_kernel {
                bail!("{}", crate::hint::per_kernel_needs_a_gpu());
            }
            if !args.json {
                crate::common::print_sim(&sim, args.device.sim.describe());
            }
            let mut run = || -> Result<()> {
                sim.run(compiled.graph.weights(), &inputs)?;
                Ok(())
            };
            let times = time_runs(&mut run, args.warmup, args.iters)?;
            report_host(&args, &compiled, HostRun::Sim(&sim), &times)
        }
        Target::Gpu(mut session) => {
            if !args.json {
                print_session(&session, &Counts::gpu(&compiled.program, session.launch_plan()));
            }
            let opts = graphc::cuda::BenchOptions {
                warmup: args.warmup,
                iters: args.iters,
                per_kernel: args.per_kernel,
            };
            let r = session.bench(&inputs, opts)?;
            report_cuda(&args, &compiled, &session, &r)
        }
    }
}

/// `warmup` untimed runs, then `iters` (at least 1) timed by the wall clock.
fn time_cpu(compiled: &Compiled, inputs: &HashMap<String, Tensor>, warmup: usize, iters: usize) -> Result<Times> {
    let mut run = || -> Result<()> {
        graphc::run_cpu(compiled, inputs.clone())?;
        Ok(())
    };
    time_runs(&mut run, warmup, iters)
}

/// `warmup` untimed calls of `run`, then `iters` (at least 1) timed by the wall clock.
fn time_runs(run: &mut dyn FnMut() -> Result<()>, warmup: usize, iters: usize) -> Result<Times> {
    for _ in 0..warmup {
        run()?;
    }
    let mut times = Vec::with_capacity(iters.max(1));
    for _ in 0..iters.max(1) {
        let start = Instant::now();
        run()?;
        times.push(start.elapsed().as_secs_f64() * 1e3);
    }
    let median_ms = graphc::ir::compare::median(&mut times);
    let (min_ms, max_ms) = min_max_sorted(&times);
    Ok(Times {
        median_ms,
        min_ms,
        max_ms,
        iters: times.len(),
    })
}

/// Where wall-clock runs ran: the CPU executor, or cuda-sim for a named GPU.
enum HostRun<'a> {
    Cpu,
    Sim(&'a graphc::cuda::sim::SimSession),
}

/// The report of runs timed by the wall clock (the CPU executor, cuda-sim).
fn report_host(args: &BenchArgs, compiled: &Compiled, on: HostRun, t: &Times) -> Result<()> {
    let (counts, device, gpu, what, planned) = match on {
        HostRun::Cpu => (
            Counts::cpu(&compiled.program),
            "cpu",
            None,
            "cpu (kernel-IR executor)",
            graphc_compiler::plan::Device::Cpu,
        ),
        HostRun::Sim(sim) => (
            Counts::gpu(&compiled.program, sim.launch_plan()),
            "cuda-sim",
            Some(&sim.launch_plan().device),
            "cuda-sim (on the host, not GPU time)",
            graphc_compiler::plan::Device::Cuda,
        ),
    };
    if args.json {
        let report = BenchReport {
            model: args.model.model.display().to_string(),
            device,
            gpu: gpu.map(|d| d.name.as_str()),
            arch: gpu.map(|d| d.arch.as_str()),
            precision: args.budget.precision.name(),
            graph: false,
            tf32: false,
            warmup: args.warmup,
            iters: t.iters,
            median_ms: t.median_ms,
            min_ms: t.min_ms,
            max_ms: t.max_ms,
            kernels: counts.kernels,
            launches: counts.launches,
            gemms: counts.gemms(),
            modules: counts.modules(),
            plan: PlanBytes::of(compiled, planned),
            device_bytes: None,
            free_bytes_at_load: None,
            per_kernel: &[],
            graph_error: None,
        };
        println!("{}", serde_json::to_string(&report)?);
    } else {
        println!(
            "bench    {what}, {counts}: median {:.3} ms over {} runs (min {:.3}, max {:.3}) after {} warm-up",
            t.median_ms, t.iters, t.min_ms, t.max_ms, args.warmup
        );
    }
    Ok(())
}

fn report_cuda(
    args: &BenchArgs,
    compiled: &Compiled,
    session: &graphc::cuda::Session,
    r: &graphc::cuda::BenchResult,
) -> Result<()> {
    let counts = Counts::gpu(&compiled.program, session.launch_plan());
    if args.json {
        let mem = session.memory();
        let report = BenchReport {
            model: args.model.model.display().to_string(),
            device: "cuda",
            gpu: Some(&session.device().name),
            arch: Some(&session.device().arch),
            precision: args.budget.precision.name(),
            graph: r.graph,
            tf32: args.device.gpu.tf32,
            warmup: args.warmup,
            iters: r.times_ms.len(),
            median_ms: r.median_ms,
            min_ms: r.min_ms,
            max_ms: r.max_ms,
            kernels: counts.kernels,
            launches: counts.launches,
            gemms: counts.gemms(),
            modules: counts.modules(),
            plan: PlanBytes::of(compiled, graphc_compiler::plan::Device::Cuda),
            device_bytes: Some(mem.device_bytes),
            free_bytes_at_load: Some(mem.free_at_load),
            per_kernel: &r.per_kernel,
            graph_error: session.graph_error(),
        };
        println!("{}", serde_json::to_string(&report)?);
        return Ok(());
    }
    println!(
        "bench    cuda, {counts}{}: median {:.4} ms over {} runs (min {:.4}, max {:.4}) after {} warm-up",
        if r.graph { " in a CUDA graph" } else { "" },
        r.median_ms,
        r.times_ms.len(),
        r.min_ms,
        r.max_ms,
        args.warmup
    );
    print_graph_error(session);
    let traffic = compiled.fusion.bytes as f64;
    println!(
        "         {} of global memory traffic (fusion's estimate): {:.0} GB/s",
        human_bytes(compiled.fusion.bytes as u64),
        traffic / (r.median_ms * 1e-3) / 1e9
    );
    if !r.per_kernel.is_empty() {
        let total: f64 = r.per_kernel.iter().map(|k| k.median_ms).sum();
        println!("per launch (median ms, without the graph; sum {total:.4} ms):");
        for k in &r.per_kernel {
            println!("  {}", launch_line(k, total));
        }
    }
    Ok(())
}

/// The least and greatest of sorted `v` (`compare::median` sorts); NaN when it is
/// empty.
fn min_max_sorted(v: &[f64]) -> (f64, f64) {
    (
        v.first().copied().unwrap_or(f64::NAN),
        v.last().copied().unwrap_or(f64::NAN),
    )
}

/// One timed launch: its step, kernel, kind, median and share of `total` ms.
pub fn launch_line(k: &KernelTiming, total: f64) -> String {
    format!(
        "{:>5} {:<32} {:<6} {:>9.4} ms {:>5.1}%",
        k.step,
        k.name,
        k.kind,
        k.median_ms,
        100.0 * k.median_ms / total.max(1e-12)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn range() {
        assert_eq!(min_max_sorted(&[1.0, 5.0]), (1.0, 5.0));
        assert!(min_max_sorted(&[]).0.is_nan());
    }
}
