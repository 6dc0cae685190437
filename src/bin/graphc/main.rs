//! The `graphc` command line: see `graphc --help` and DESIGN.md's CLI contract.
//!
//! This file holds the command tree, `main` and the exit codes; each subcommand lives
//! in a module of its own, the argument groups they share in [`args`], the counting
//! vocabulary (kernels, launches, modules) in [`counts`], and output helpers in
//! [`common`].

#![cfg_attr(not(test), warn(clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing))]

mod alloc;
mod args;
mod bench;
mod common;
mod counts;
mod cuda;
mod fit;
mod hint;
mod ir;
mod launches;
mod opt;
mod plan;
mod ptx;
mod random_inputs;
mod run;
mod selftest;
mod train;

use std::process::ExitCode;

use anyhow::Result;
use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "graphc", version, about = "A tensor computation-graph compiler")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Print the imported graph in text IR (.gir).
    Ir(ir::IrArgs),
    /// Print the optimized graph in text IR, then a summary of what the optimizer did.
    Opt(opt::OptArgs),
    /// Plan memory: every intermediate at an offset in one arena; what the run needs.
    ///
    /// Prints the memory summary (where the bytes go, arena vs lower bound, the peak
    /// step and the tensors live there, total vs budget); `--picture` adds the arena
    /// over time as text. Over the budget it fails (exit 1) saying by how much, what is
    /// live at the peak and what would help.
    Plan(plan::PlanArgs),
    /// The largest value of a symbolic dimension whose memory plan fits the budget.
    Fit(fit::FitArgs),
    /// Print the generated CUDA C of every kernel (and the GEMM each matmul runs).
    Cuda(cuda::CudaArgs),
    /// Compile every kernel with NVRTC and print the PTX (or, with --cubin, write cubins).
    Ptx(ptx::PtxArgs),
    /// Run the model on inputs from an .npz file (or random ones), on the CPU or a GPU.
    ///
    /// Exit codes: 0 success; 1 an error (the message names the place); 3 `--device
    /// cuda` on a machine without a CUDA driver or GPU.
    Run(run::RunArgs),
    /// Train: compile the whole training step (loss, backward, optimizer update) and
    /// run it on one batch, printing `step N loss X`; write the trained parameters.
    Train(train::TrainCmdArgs),
    /// Time the model: warm-up runs, then the median of timed runs (CUDA events on the
    /// GPU, inputs already on the device; wall clock on the CPU).
    Bench(bench::BenchArgs),
    /// Run small graphs that exercise every kind of launch (GEMMs of every dtype and
    /// epilogue, elementwise, row and op kernels, attention, two models) on a device and
    /// compare each with the CPU executor. `emulate` runs the launch lists on the CPU.
    Selftest(selftest::SelftestArgs),
    /// Print the launch list a GPU would run: device memory regions, every kernel launch
    /// (grid, block, arguments as region+offset) and cuBLASLt call, in plan order.
    Launches(launches::LaunchesArgs),
    /// Write random inputs for a model to an .npz file (deterministic for a seed).
    RandomInputs(random_inputs::RandomInputsArgs),
}

/// Exit code of `--device cuda` on a machine without a CUDA driver or GPU.
const EXIT_NO_GPU: u8 = 3;

#[global_allocator]
static ALLOCATOR: alloc::Allocator = alloc::Allocator;

fn main() -> ExitCode {
    // Like other Unix tools, end quietly when the reader of stdout goes away
    // (`graphc ir MODEL | head`) instead of panicking on a failed print.
    #[cfg(unix)]
    // SAFETY: restores the default action for SIGPIPE, before any thread starts.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
    match run(Cli::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            match unavailable(&e) {
                Some(sim) => {
                    if let Some(h) = hint::for_unavailable(&hint::command_line(), sim) {
                        eprintln!("hint: {h}");
                    }
                    ExitCode::from(EXIT_NO_GPU)
                }
                None => ExitCode::FAILURE,
            }
        }
    }
}

/// Whether `e` says there is no usable GPU here (exit code 3): `Some(true)` when what
/// is missing is cuda-sim's C++ compiler, `Some(false)` the driver, GPU or cuBLASLt.
fn unavailable(e: &anyhow::Error) -> Option<bool> {
    e.chain().find_map(|c| {
        let cuda = c
            .downcast_ref::<graphc::cuda::CudaError>()
            .or_else(|| match c.downcast_ref::<graphc::Error>() {
                Some(graphc::Error::Cuda(cuda)) => Some(cuda),
                _ => None,
            })?;
        cuda.is_unavailable()
            .then_some(matches!(cuda, graphc::cuda::CudaError::Sim(_)))
    })
}

fn run(cli: Cli) -> Result<()> {
    match cli.command {
        Command::Ir(args) => ir::run(args),
        Command::Opt(args) => opt::run(args),
        Command::Plan(args) => plan::run(args),
        Command::Fit(args) => fit::run(args),
        Command::Cuda(args) => cuda::run(args),
        Command::Ptx(args) => ptx::run(args),
        Command::Run(args) => run::run(args),
        Command::Train(args) => train::run(args),
        Command::Bench(args) => bench::run(args),
        Command::Selftest(args) => selftest::run(args),
        Command::Launches(args) => launches::run(args),
        Command::RandomInputs(args) => random_inputs::run(args),
    }
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    /// Every argument of every subcommand, positional included, says what it is.
    #[test]
    fn every_argument_has_help() {
        fn walk(cmd: &clap::Command, path: &str, missing: &mut Vec<String>) {
            let path = format!("{path} {}", cmd.get_name());
            for arg in cmd.get_arguments() {
                let id = arg.get_id().as_str();
                if id == "help" || id == "version" {
                    continue;
                }
                let help = arg.get_help().map(|h| h.to_string()).unwrap_or_default();
                if help.trim().is_empty() {
                    missing.push(format!("{path}: {id}"));
                }
            }
            // clap's own `help` subcommand is not ours to document.
            for sub in cmd.get_subcommands().filter(|s| s.get_name() != "help") {
                walk(sub, &path, missing);
            }
        }
        let mut cli = super::Cli::command();
        cli.build();
        assert!(cli.get_subcommands().count() > 11, "the walk sees every subcommand");
        let mut missing = Vec::new();
        walk(&cli, "", &mut missing);
        assert!(missing.is_empty(), "arguments without help: {missing:#?}");
    }
}
