//! `graphc selftest`: the cases of `graphc::selftest` (every kind of launch) on the GPU
//! or the launch emulator, each compared with the CPU executor.

use std::collections::HashMap;
use std::time::Instant;

use anyhow::{bail, Result};
use clap::ValueEnum;
use graphc::ir::Tensor;
use graphc::selftest::CaseResult;

use crate::args::{GpuArgs, SimArgs};

#[derive(clap::Args)]
pub struct SelftestArgs {
    /// Where the cases run: `cuda` (the GPU), `emulate` (the launch lists for an H200,
    /// run on the CPU) or `cuda-sim` (the generated CUDA C run on the host).
    #[arg(long, value_enum, default_value_t = SelftestDevice::Cuda)]
    pub device: SelftestDevice,
    /// Only the cases whose name contains this.
    #[arg(long)]
    pub filter: Option<String>,
    /// Print the results as JSON (one object per case) instead of text.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub gpu: GpuArgs,
    #[command(flatten)]
    pub sim: SimArgs,
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum SelftestDevice {
    /// The GPU (exit code 3 without one).
    Cuda,
    /// The launch lists for an H200, run on the CPU by the launch emulator.
    Emulate,
    /// The launch lists (RTX 4090D by default) with every kernel's own CUDA C built
    /// for the host and run with a fiber per CUDA thread.
    CudaSim,
}

pub fn run(args: SelftestArgs) -> Result<()> {
    let SelftestArgs {
        device,
        filter,
        json,
        gpu,
        sim,
    } = args;
    if device != SelftestDevice::CudaSim && (sim.sanitize.is_some() || sim.sim_gpu.is_some()) {
        bail!("{}", crate::hint::sim_options_only());
    }
    let sim_opts = sim.options();
    let cases: Vec<_> = graphc::selftest::cases()?
        .into_iter()
        .filter(|c| filter.as_deref().is_none_or(|f| c.name.contains(f)))
        .collect();
    if device == SelftestDevice::Cuda && !graphc::cuda::driver_available() {
        return Err(graphc::cuda::CudaError::NoDriver(
            "libcuda.so cannot be loaded (no NVIDIA driver on this machine)".to_string(),
        )
        .into());
    }
    let opts = gpu.options();
    let mut runner = |c: &graphc::Compiled, inputs: &HashMap<String, Tensor>| match device {
        SelftestDevice::Cuda => graphc::run_cuda(c, inputs.clone(), opts.clone()),
        SelftestDevice::Emulate => emulate(c, inputs),
        SelftestDevice::CudaSim => graphc::cuda::sim::run_sim(c, inputs, &sim_opts).map_err(graphc::Error::Cuda),
    };
    let mut results = Vec::new();
    let start = Instant::now();
    for case in &cases {
        let t = Instant::now();
        let mut r = graphc::selftest::run_case(case, gpu.tf32, &mut runner);
        if !json {
            print_case(&r, t.elapsed().as_secs_f64() * 1e3);
        }
        // No GPU at all: stop at once with exit code 3.
        if let Some(e) = r.no_device.take() {
            return Err(e.into());
        }
        results.push(r);
    }
    let failed: Vec<&str> = results.iter().filter(|r| !r.pass).map(|r| r.name.as_str()).collect();
    if json {
        println!("{}", serde_json::to_string_pretty(&results)?);
    } else {
        println!(
            "{} of {} cases pass on {} in {:.1} s",
            results.len() - failed.len(),
            results.len(),
            match device {
                SelftestDevice::Cuda => "the GPU",
                SelftestDevice::Emulate => "the launch emulator (H200 launch lists)",
                SelftestDevice::CudaSim => match sim.sanitize {
                    None => "cuda-sim",
                    Some(crate::args::SanitizeArg::Address) => "cuda-sim under AddressSanitizer + UBSan",
                    Some(crate::args::SanitizeArg::Thread) => "cuda-sim under ThreadSanitizer",
                },
            },
            start.elapsed().as_secs_f64()
        );
    }
    if !failed.is_empty() {
        bail!("selftest: {} case(s) failed: {}", failed.len(), failed.join("; "));
    }
    Ok(())
}

/// The H200 launch list of `c`, run by the launch emulator.
fn emulate(c: &graphc::Compiled, inputs: &HashMap<String, Tensor>) -> graphc::selftest::Outputs {
    let cuda = |e: graphc::cuda::CudaError| graphc::Error::Cuda(e);
    let kernels = graphc_compiler::codegen::generate_all(&c.program).map_err(|e| cuda(e.into()))?;
    let lp = graphc::cuda::plan_launches(&c.program, &c.plan, &kernels, &graphc::cuda::DeviceInfo::h200())
        .map_err(|e| cuda(e.into()))?;
    graphc::cuda::emulate(&c.program, &lp, c.graph.weights(), inputs).map_err(|e| cuda(e.into()))
}

/// One line per case: ok or FAIL, the name, its kernels, the worst output or the
/// error, the time.
fn print_case(r: &CaseResult, ms: f64) {
    let outcome = match &r.error {
        Some(e) => format!("error: {}", e.replace('\n', " ")),
        None => format!(
            "worst {} rel_l2 {:.2e} (tol {:.0e})",
            if r.worst_output.is_empty() {
                "-"
            } else {
                &r.worst_output
            },
            r.rel_l2,
            r.tolerance
        ),
    };
    println!(
        "{:<4} {:<62} {:>3} kernels  {outcome}  {ms:>6.0} ms",
        if r.pass { "ok" } else { "FAIL" },
        r.name,
        r.kernels,
    );
}
