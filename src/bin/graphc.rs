//! The `graphc` command line: see `graphc --help` and DESIGN.md's CLI contract.

#![cfg_attr(not(test), warn(clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing))]

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use clap::{Parser, Subcommand, ValueEnum};

use graphc::ir::{self, Graph, Tensor};
use graphc_compiler::kernel;
use graphc_compiler::plan::report;

#[derive(Parser)]
#[command(name = "graphc", version, about = "A tensor computation-graph compiler")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Print the imported graph in text IR (.gir).
    Ir(IrArgs),
    /// Print the optimized graph in text IR, then a summary of what the optimizer did.
    Opt(OptArgs),
    /// Plan memory: every intermediate at an offset in one arena; what the run needs.
    ///
    /// Prints the memory summary (where the bytes go, arena vs lower bound, the peak
    /// step and the tensors live there, total vs budget); `--picture` adds the arena
    /// over time as text. Over the budget it fails (exit 1) saying by how much, what is
    /// live at the peak and what would help.
    Plan(PlanArgs),
    /// The largest value of a symbolic dimension whose memory plan fits the budget.
    Fit(FitArgs),
    /// Print the generated CUDA C of every kernel (and the GEMM each matmul runs).
    Cuda(CudaArgs),
    /// Compile every kernel with NVRTC and print the PTX (or, with --cubin, write cubins).
    Ptx(PtxArgs),
    /// Run the model on inputs from an .npz file (or random ones), on the CPU or a GPU.
    ///
    /// Exit codes: 0 success; 1 an error (the message names the place); 3 `--device
    /// cuda` on a machine without a CUDA driver or GPU.
    Run(RunArgs),
    /// Time the model: warm-up runs, then the median of timed runs (CUDA events on the
    /// GPU, inputs already on the device; wall clock on the CPU).
    Bench(BenchArgs),
    /// Run small graphs that exercise every kind of launch (GEMMs of every dtype and
    /// epilogue, elementwise, row and op kernels, attention, two models) on a device and
    /// compare each with the CPU executor. `emulate` runs the launch lists on the CPU.
    Selftest(SelftestArgs),
    /// Print the launch list a GPU would run: device memory regions, every kernel launch
    /// (grid, block, arguments as region+offset) and cuBLASLt call, in plan order.
    Launches(LaunchesArgs),
    /// Write random inputs for a model to an .npz file (deterministic for a seed).
    RandomInputs(RandomInputsArgs),
}

#[derive(clap::Args)]
struct IrArgs {
    model: PathBuf,
    /// Fix a symbolic dimension: NAME=N (repeatable).
    #[arg(long = "dim", value_parser = parse_dim)]
    dims: Vec<(String, usize)>,
    /// Print the graph as JSON instead.
    #[arg(long)]
    json: bool,
    /// List every node whose op graphc does not support (ONNX models), then stop.
    #[arg(long)]
    list_unsupported: bool,
}

#[derive(clap::Args)]
struct OptArgs {
    model: PathBuf,
    #[arg(long = "dim", value_parser = parse_dim)]
    dims: Vec<(String, usize)>,
}

#[derive(clap::Args)]
struct PlanArgs {
    model: PathBuf,
    #[arg(long = "dim", value_parser = parse_dim)]
    dims: Vec<(String, usize)>,
    /// Print the plan as JSON (nothing on stdout when it does not fit).
    #[arg(long)]
    json: bool,
    /// Memory budget: bytes, or with a unit (KiB, MiB, GiB; KB, MB, GB).
    #[arg(long, default_value = "24GiB", value_parser = parse_bytes)]
    budget: u64,
    /// Compute precision: fp32, tf32 (f32 GEMMs on TF32 tensor cores), bf16 or fp16
    /// (mixed: low-precision storage and compute, f32 where it matters).
    #[arg(long, default_value = "fp32")]
    precision: graphc_compiler::passes::precision::Precision,
    /// Also print the arena over time (kernel steps x offsets) as text.
    #[arg(long)]
    picture: bool,
    /// Write the arena over time as an SVG file (only when the plan fits).
    #[arg(long, value_name = "FILE")]
    svg: Option<PathBuf>,
}

#[derive(clap::Args)]
struct FitArgs {
    model: PathBuf,
    /// The dimension to search: NAME; other symbolic dimensions fixed: NAME=N.
    #[arg(long = "dim", value_parser = parse_dim_spec, required = true)]
    dims: Vec<(String, Option<usize>)>,
    /// Memory budget: bytes, or with a unit (KiB, MiB, GiB; KB, MB, GB).
    #[arg(long, default_value = "24GiB", value_parser = parse_bytes)]
    budget: u64,
    /// Compute precision: fp32, tf32 (f32 GEMMs on TF32 tensor cores), bf16 or fp16
    /// (mixed: low-precision storage and compute, f32 where it matters).
    #[arg(long, default_value = "fp32")]
    precision: graphc_compiler::passes::precision::Precision,
    /// Search no higher than this.
    #[arg(long, default_value_t = 1 << 20)]
    max: usize,
}

#[derive(clap::Args)]
struct CudaArgs {
    model: PathBuf,
    #[arg(long = "dim", value_parser = parse_dim)]
    dims: Vec<(String, usize)>,
    /// Only this kernel (its index, as `graphc opt` numbers them).
    #[arg(long)]
    kernel: Option<usize>,
}

#[derive(clap::Args)]
struct PtxArgs {
    model: PathBuf,
    #[arg(long = "dim", value_parser = parse_dim)]
    dims: Vec<(String, usize)>,
    /// Target architecture.
    #[arg(long, default_value = "sm_89")]
    arch: String,
    /// Compile to cubin and write `<entry>.cubin` files into this folder.
    #[arg(long)]
    cubin: Option<PathBuf>,
    /// Neither read nor write the on-disk kernel cache.
    #[arg(long)]
    no_cache: bool,
    /// Kernel cache folder (default $GRAPHC_CACHE_DIR, else ~/.cache/graphc/nvrtc).
    #[arg(long)]
    cache_dir: Option<PathBuf>,
}

#[derive(clap::Args)]
struct RunArgs {
    model: PathBuf,
    #[arg(long = "dim", value_parser = parse_dim)]
    dims: Vec<(String, usize)>,
    /// Inputs, one array per model input, by name (default: random, seed 0).
    #[arg(long)]
    inputs: Option<PathBuf>,
    /// Write the outputs here (.npz).
    #[arg(long)]
    output: Option<PathBuf>,
    /// `auto`: the GPU when one is usable (driver, GPU, cuBLASLt), else the CPU.
    #[arg(long, value_enum, default_value_t = Device::Auto)]
    device: Device,
    /// Memory budget the plan must fit (the run fails before starting otherwise).
    #[arg(long, default_value = "24GiB", value_parser = parse_bytes)]
    budget: u64,
    /// Compute precision: fp32, tf32 (f32 GEMMs on TF32 tensor cores), bf16 or fp16
    /// (mixed: low-precision storage and compute, f32 where it matters).
    #[arg(long, default_value = "fp32")]
    precision: graphc_compiler::passes::precision::Precision,
    #[command(flatten)]
    gpu: GpuArgs,
    /// With --device cuda: also run the CPU executor on the same inputs and compare
    /// (relative L2 per output: 1e-5 for f32/f64, 1e-2 for f16 and for f32 with
    /// --tf32, 3e-2 for bf16); exit 1 if any output is off.
    #[arg(long)]
    check: bool,
}

#[derive(clap::Args)]
struct BenchArgs {
    model: PathBuf,
    #[arg(long = "dim", value_parser = parse_dim)]
    dims: Vec<(String, usize)>,
    /// Inputs (.npz; default: random, seed 0).
    #[arg(long)]
    inputs: Option<PathBuf>,
    #[arg(long, value_enum, default_value_t = Device::Cuda)]
    device: Device,
    #[arg(long, default_value = "24GiB", value_parser = parse_bytes)]
    budget: u64,
    /// Compute precision: fp32, tf32 (f32 GEMMs on TF32 tensor cores), bf16 or fp16
    /// (mixed: low-precision storage and compute, f32 where it matters).
    #[arg(long, default_value = "fp32")]
    precision: graphc_compiler::passes::precision::Precision,
    #[arg(long, default_value_t = 10)]
    warmup: usize,
    #[arg(long, default_value_t = 50)]
    iters: usize,
    /// Also time every launch (GPU; without the CUDA graph).
    #[arg(long)]
    per_kernel: bool,
    /// Print one JSON object instead of text.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    gpu: GpuArgs,
}

#[derive(clap::Args)]
struct SelftestArgs {
    #[arg(long, value_enum, default_value_t = SelftestDevice::Cuda)]
    device: SelftestDevice,
    /// Only the cases whose name contains this.
    #[arg(long)]
    filter: Option<String>,
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    gpu: GpuArgs,
}

#[derive(clap::Args)]
struct LaunchesArgs {
    model: PathBuf,
    #[arg(long = "dim", value_parser = parse_dim)]
    dims: Vec<(String, usize)>,
    /// The device to plan for (a reference description; no GPU is used).
    #[arg(long, value_enum, default_value_t = Gpu::Rtx4090d)]
    gpu: Gpu,
    #[arg(long)]
    json: bool,
}

#[derive(clap::Args)]
struct RandomInputsArgs {
    model: PathBuf,
    #[arg(long = "dim", value_parser = parse_dim)]
    dims: Vec<(String, usize)>,
    #[arg(long, short)]
    output: PathBuf,
    #[arg(long, default_value_t = 0)]
    seed: u64,
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Device {
    Cpu,
    Cuda,
    /// The GPU when one is usable here, else the CPU.
    Auto,
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum SelftestDevice {
    /// The GPU (exit code 3 without one).
    Cuda,
    /// The launch lists for an H200, run on the CPU by the launch emulator.
    Emulate,
}

#[derive(Clone, Copy, ValueEnum)]
enum Gpu {
    /// RTX 4090D: sm_89, 114 SMs (graphc's default target).
    Rtx4090d,
    /// H200: sm_90, 132 SMs.
    H200,
}

/// Options of the CUDA executor.
#[derive(clap::Args, Clone, Copy)]
struct GpuArgs {
    /// Launch kernels one by one instead of replaying a CUDA graph.
    #[arg(long)]
    no_graph: bool,
    /// Let f32 GEMMs use TF32 tensor cores (faster; ~1e-3 relative error).
    #[arg(long)]
    tf32: bool,
    /// Synchronize after every launch, so a failing kernel is named (slow).
    #[arg(long)]
    sync_launches: bool,
    /// CUDA device ordinal.
    #[arg(long, default_value_t = 0)]
    gpu_index: usize,
}

impl GpuArgs {
    fn options(&self) -> graphc::cuda::SessionOptions {
        graphc::cuda::SessionOptions {
            device: self.gpu_index,
            cuda_graph: !self.no_graph,
            tf32: self.tf32,
            sync_each_launch: self.sync_launches,
            ..Default::default()
        }
    }
}

fn parse_dim(s: &str) -> Result<(String, usize), String> {
    let (name, n) = s.split_once('=').ok_or_else(|| format!("expected NAME=N, got `{s}`"))?;
    let n = n
        .parse()
        .map_err(|_| format!("`{n}` is not a dimension size in `{s}`"))?;
    Ok((name.to_string(), n))
}

/// `NAME` (the dimension `fit` searches) or `NAME=N` (a fixed one).
fn parse_dim_spec(s: &str) -> Result<(String, Option<usize>), String> {
    if s.contains('=') {
        parse_dim(s).map(|(n, v)| (n, Some(v)))
    } else if s.is_empty() {
        Err("expected NAME or NAME=N".into())
    } else {
        Ok((s.to_string(), None))
    }
}

/// `24GiB` -> 25769803776; plain numbers are bytes.
fn parse_bytes(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let split = t.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let scale: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "kib" | "k" => 1 << 10,
        "mib" | "m" => 1 << 20,
        "gib" | "g" => 1 << 30,
        "tib" | "t" => 1 << 40,
        "kb" => 1_000,
        "mb" => 1_000_000,
        "gb" => 1_000_000_000,
        "tb" => 1_000_000_000_000,
        u => {
            return Err(format!(
                "unknown unit `{u}` in `{s}` (use B, KiB, MiB, GiB, TiB, KB, MB, GB, TB)"
            ))
        }
    };
    let value: f64 = num.parse().map_err(|_| format!("`{s}` is not a size, e.g. 24GiB"))?;
    let bytes = value * scale as f64;
    if !bytes.is_finite() || bytes < 0.0 || bytes > u64::MAX as f64 {
        return Err(format!("`{s}` is out of range"));
    }
    Ok(bytes as u64)
}

/// Exit code of `--device cuda` on a machine without a CUDA driver or GPU.
const EXIT_NO_GPU: u8 = 3;

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
            let unavailable = e.chain().any(|c| {
                c.downcast_ref::<graphc::cuda::CudaError>()
                    .is_some_and(|c| c.is_unavailable())
            });
            if unavailable {
                ExitCode::from(EXIT_NO_GPU)
            } else {
                ExitCode::FAILURE
            }
        }
    }
}

fn run(cli: Cli) -> Result<()> {
    match cli.command {
        Command::Ir(args) => cmd_ir(args),
        Command::Opt(args) => cmd_opt(args),
        Command::Plan(args) => cmd_plan(args),
        Command::Fit(args) => cmd_fit(args),
        Command::Cuda(args) => cmd_cuda(args),
        Command::Ptx(args) => cmd_ptx(args),
        Command::Run(args) => cmd_run(args),
        Command::Bench(args) => cmd_bench(args),
        Command::Selftest(args) => cmd_selftest(args),
        Command::Launches(args) => cmd_launches(args),
        Command::RandomInputs(args) => cmd_random_inputs(args),
    }
}

/// `graphc ir`.
fn cmd_ir(args: IrArgs) -> Result<()> {
    let IrArgs {
        model,
        dims,
        json,
        list_unsupported,
    } = args;
    if list_unsupported {
        let nodes = graph_ir_unsupported(&model)?;
        for n in &nodes {
            let domain = if n.domain.is_empty() { "ai.onnx" } else { &n.domain };
            println!("node {}: {} (domain {domain}, opset {})", n.node, n.op_type, n.opset);
        }
        println!("{} unsupported node(s)", nodes.len());
        return Ok(());
    }
    let graph = graphc::load_model(&model, &dims)?;
    if json {
        println!("{}", graph.to_json());
    } else {
        print!("{}", ir::print(&graph));
    }
    Ok(())
}

/// `graphc opt`.
fn cmd_opt(args: OptArgs) -> Result<()> {
    let OptArgs { model, dims } = args;
    let graph = graphc::load_model(&model, &dims)?;
    let compiled = graphc::compile(&graph)?;
    let program = &compiled.program;
    print!("{}", kernel::annotate_ir(&ir::print(&compiled.graph), program));
    for line in kernel::print_program(program).lines() {
        println!("# {line}");
    }
    let r = &compiled.optimize;
    println!(
        "# optimized {} in {:.2} ms",
        model.display(),
        r.time.as_secs_f64() * 1e3
    );
    println!("# nodes: {} -> {}", graph.len(), compiled.graph.len());
    println!("# constants folded: {}", r.constants_folded);
    let f = &compiled.fusion;
    println!(
        "# kernels: {} ({} launches with generated GEMM epilogues; unfused {}); global memory traffic: {} \
             (unfused {})",
        f.kernels,
        f.launches,
        f.unfused_kernels,
        human_bytes(f.bytes),
        human_bytes(f.unfused_bytes)
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

/// `graphc plan`.
fn cmd_plan(args: PlanArgs) -> Result<()> {
    let PlanArgs {
        model,
        dims,
        json,
        budget,
        precision,
        picture,
        svg,
    } = args;
    let graph = graphc::load_model(&model, &dims)?;
    let compiled = graphc::compile_with(&graph, &budget_options(budget, precision))?;
    let (program, plan) = (&compiled.program, &compiled.plan);
    let symbolic: Vec<String> = dims.iter().map(|(name, _)| name.clone()).collect();
    let print_summary = || {
        println!("model          {}", model.display());
        print!("{}", report::summary(program, plan));
        if precision.low_type().is_some() {
            println!("\nprecision      {}", compiled.precision.summary());
        }
        if picture {
            println!();
            print!("{}", report::picture(plan, 64, 16));
        }
    };
    if let Err(over) = graphc::check_budget(&compiled, &symbolic) {
        // The summary (text mode only), then the diagnosis; no SVG is written.
        if !json {
            print_summary();
        }
        return Err(over.into());
    }
    if let Some(path) = &svg {
        ir::files::write_file(path, report::svg(program, plan).as_bytes()).context("writing the SVG")?;
    }
    if json {
        println!("{}", serde_json::to_string_pretty(plan)?);
    } else {
        print_summary();
        if let Some(path) = &svg {
            println!("wrote          {}", path.display());
        }
    }
    Ok(())
}

/// `graphc fit`.
fn cmd_fit(args: FitArgs) -> Result<()> {
    let FitArgs {
        model,
        dims,
        budget,
        precision,
        max,
    } = args;
    let searched: Vec<&str> = dims
        .iter()
        .filter(|(_, v)| v.is_none())
        .map(|(n, _)| n.as_str())
        .collect();
    let [dim] = searched[..] else {
        bail!(
            "give exactly one --dim NAME to search (and NAME=N for the others); got {}",
            if searched.is_empty() {
                "none".to_string()
            } else {
                searched.join(", ")
            }
        );
    };
    let fixed: Vec<(String, usize)> = dims.iter().filter_map(|(n, v)| v.map(|v| (n.clone(), v))).collect();
    let opts = graphc::CompileOptions {
        precision,
        memory: graphc_compiler::plan::MemoryOptions {
            budget_bytes: budget,
            ..Default::default()
        },
        ..Default::default()
    };
    let start = Instant::now();
    let fit = graphc::fit::fit_model(&model, &fixed, dim, &opts, max)?;
    let plan = &fit.compiled.plan;
    let over = match fit.first_over() {
        Some(p) => match (p.total_bytes, &p.error) {
            (Some(t), _) => format!(
                "; {dim}={} needs {} (over by {})",
                p.value,
                human_bytes(t as usize),
                human_bytes(t.saturating_sub(budget) as usize)
            ),
            (None, Some(e)) => format!("; {dim}={} cannot be planned: {e}", p.value),
            _ => String::new(),
        },
        None if fit.capped => format!("; stopped at --max {max}"),
        None => String::new(),
    };
    let over = if fit.exhausted {
        format!(
            "{over}; the search stopped after {} probes, so the largest is at least that{}",
            fit.probes.len(),
            fit.first_over()
                .map(|p| format!(" and below {}", p.value))
                .unwrap_or_default()
        )
    } else {
        over
    };
    println!(
        "fit          {dim} = {} is the largest that fits {}{over}",
        fit.value,
        human_bytes(budget as usize)
    );
    let tried: Vec<String> = fit
        .probes
        .iter()
        .map(|p| match p.total_bytes {
            Some(t) => format!(
                "{}: {}{}",
                p.value,
                human_bytes(t as usize),
                if p.fits { "" } else { " (over)" }
            ),
            None => format!("{}: error", p.value),
        })
        .collect();
    println!(
        "probes       {} in {:.0} ms: {}",
        fit.probes.len(),
        start.elapsed().as_secs_f64() * 1e3,
        tried.join(", ")
    );
    println!();
    print!("{}", report::summary(&fit.compiled.program, plan));
    Ok(())
}

/// `graphc cuda`.
fn cmd_cuda(args: CudaArgs) -> Result<()> {
    let CudaArgs { model, dims, kernel } = args;
    let graph = graphc::load_model(&model, &dims)?;
    let compiled = graphc::compile(&graph)?;
    let program = &compiled.program;
    let indices: Vec<usize> = match kernel {
        Some(k) if k >= program.kernels.len() => {
            bail!("--kernel {k}: the program has {} kernels", program.kernels.len())
        }
        Some(k) => vec![k],
        None => (0..program.kernels.len()).collect(),
    };
    let mut first_with: std::collections::HashMap<String, String> = Default::default();
    for k in indices {
        let ir_kernel = program
            .kernels
            .get(k)
            .with_context(|| format!("--kernel {k}: the program has {} kernels", program.kernels.len()))?;
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
    Ok(())
}

/// `graphc ptx`.
fn cmd_ptx(args: PtxArgs) -> Result<()> {
    let PtxArgs {
        model,
        dims,
        arch,
        cubin,
        no_cache,
        cache_dir,
    } = args;
    use graphc_compiler::nvrtc::{self, NvrtcOptions, OutputKind};
    if !arch
        .strip_prefix("sm_")
        .is_some_and(|v| v.len() >= 2 && v.chars().all(|c| c.is_ascii_digit()))
    {
        bail!("--arch {arch}: expected sm_XX, e.g. sm_89 or sm_90");
    }
    let graph = graphc::load_model(&model, &dims)?;
    let compiled = graphc::compile(&graph)?;
    let kernels = graphc_compiler::codegen::generate_all(&compiled.program)?;
    let mut opts = NvrtcOptions {
        arch: arch.clone(),
        output: if cubin.is_some() {
            OutputKind::Cubin
        } else {
            OutputKind::Ptx
        },
        use_cache: !no_cache,
        ..NvrtcOptions::default()
    };
    if let Some(dir) = cache_dir {
        opts.cache_dir = Some(dir);
    }
    let start = Instant::now();
    let out = nvrtc::compile(&kernels, &opts)?;
    let ms = start.elapsed().as_secs_f64() * 1e3;
    let with_source: Vec<_> = out.iter().filter(|c| !c.image.is_empty()).collect();
    let mut entries: Vec<&str> = with_source.iter().map(|c| c.entry.as_str()).collect();
    entries.sort_unstable();
    entries.dedup();
    let cached = with_source.iter().filter(|c| c.cached).count();
    match &cubin {
        Some(dir) => {
            ir::files::create_output_dir(dir).context("--cubin")?;
            for c in &with_source {
                let path = dir.join(format!("{}.cubin", c.entry));
                ir::files::write_file(&path, &c.image)?;
                println!("{} -> {} ({} bytes)", c.name, path.display(), c.image.len());
            }
        }
        None => {
            let mut printed = std::collections::HashSet::new();
            for c in &with_source {
                println!("// ==== {} (entry {})", c.name, c.entry);
                if printed.insert(c.entry.clone()) {
                    println!("{}", c.ptx().unwrap_or_default());
                } else {
                    println!("// same PTX as above\n");
                }
            }
        }
    }
    eprintln!(
        "{} kernels ({} with CUDA C, {} distinct), {} from the cache, for {arch}, in {ms:.0} ms{}",
        out.len(),
        with_source.len(),
        entries.len(),
        cached,
        match nvrtc::version() {
            Some((a, b)) => format!(" (NVRTC {a}.{b})"),
            None => String::new(),
        }
    );
    Ok(())
}

/// `graphc run`.
fn cmd_run(args: RunArgs) -> Result<()> {
    let RunArgs {
        model,
        dims,
        inputs,
        output,
        device,
        budget,
        precision,
        gpu,
        check,
    } = args;
    if check && device == Device::Cpu {
        bail!("--check compares the GPU with the CPU executor: use it with --device cuda");
    }
    let graph = graphc::load_model(&model, &dims)?;
    println!("model    {}: {}", model.display(), describe(&graph));
    // Plan and budget first: nothing sized by the model is allocated before the
    // plan says it fits.
    let compiled = graphc::compile_with(&graph, &budget_options(budget, precision))?;
    let symbolic: Vec<String> = dims.iter().map(|(name, _)| name.clone()).collect();
    graphc::check_budget(&compiled, &symbolic)?;
    let input_path = inputs;
    for p in &compiled.passes {
        println!("pass     {p}");
    }
    let plan = &compiled.plan;
    if precision.low_type().is_some() {
        println!("precision {}", compiled.precision.summary());
    }
    println!("plan     the static memory plan (`graphc plan MODEL --picture` draws it):");
    for line in report::summary(&compiled.program, plan).lines() {
        if line.is_empty() {
            println!();
        } else {
            println!("         {line}");
        }
    }
    let session = match device {
        Device::Cpu => None,
        Device::Cuda => Some(graphc::cuda::Session::new(&compiled, gpu.options())?),
        Device::Auto => match graphc::cuda::Session::new(&compiled, gpu.options()) {
            Ok(s) => Some(s),
            Err(e) if e.is_unavailable() => {
                println!("device   no usable GPU here, so the CPU: {e}");
                if check {
                    return Err(anyhow::Error::new(e).context("--check needs a GPU"));
                }
                None
            }
            Err(e) => return Err(e.into()),
        },
    };
    if session.is_none() {
        graphc::check_host_memory(&compiled)?;
    }
    let inputs = load_inputs(input_path.as_deref(), &graph)?;
    let outputs = match session {
        None => {
            let start = Instant::now();
            let outputs = graphc::run_cpu(&compiled, inputs)?;
            println!(
                    "run      cpu, {} kernels (kernel-IR executor) through a {} arena ({} intermediates at planned offsets): {:.2} ms",
                    compiled.program.kernels.len(),
                    human_bytes(plan.arena_bytes as usize),
                    plan.buffers.len(),
                    start.elapsed().as_secs_f64() * 1e3
                );
            outputs
        }
        Some(mut session) => {
            print_session(&session);
            let start = Instant::now();
            let outputs = session.run(&inputs)?;
            let lp = session.launch_plan();
            println!(
                    "run      cuda, {} kernel launches + {} cuBLASLt GEMMs{}: {:.2} ms (first run, wall clock, with copies{})",
                    lp.kernel_launch_count(),
                    lp.gemm_count(),
                    if session.uses_graph() { " in a CUDA graph" } else { "" },
                    start.elapsed().as_secs_f64() * 1e3,
                    if session.uses_graph() { " and graph capture" } else { "" }
                );
            if let Some(e) = session.graph_error() {
                println!("note     CUDA graph capture failed ({e}); the kernels were launched one by one");
            }
            if check {
                let want = graphc::run_cpu(&compiled, inputs)?;
                check_outputs(&outputs, &want, gpu.tf32)?;
            }
            outputs
        }
    };
    for (name, t) in &outputs {
        println!("output   {name}: {}", summarize(t));
    }
    if let Some(path) = output {
        graphc::npz::write_npz(&path, &outputs)?;
        println!("wrote    {}", path.display());
    }
    Ok(())
}

/// `graphc bench`.
fn cmd_bench(args: BenchArgs) -> Result<()> {
    let BenchArgs {
        model,
        dims,
        inputs,
        device,
        budget,
        precision,
        warmup,
        iters,
        per_kernel,
        json,
        gpu,
    } = args;
    let graph = graphc::load_model(&model, &dims)?;
    let compiled = graphc::compile_with(&graph, &budget_options(budget, precision))?;
    let symbolic: Vec<String> = dims.iter().map(|(name, _)| name.clone()).collect();
    graphc::check_budget(&compiled, &symbolic)?;
    if device == Device::Cpu {
        graphc::check_host_memory(&compiled)?;
    }
    let inputs = load_inputs(inputs.as_deref(), &graph)?;
    let plan = &compiled.plan;
    let plan_json = serde_json::json!({
        "arena_bytes": plan.arena_bytes,
        "weights_bytes": plan.weights_bytes,
        "inputs_bytes": plan.inputs_bytes,
        "outputs_bytes": plan.outputs_bytes,
        "workspace_bytes": plan.workspace_bytes,
        "total_bytes": plan.total_bytes,
    });
    let kernels = compiled.program.kernels.len();
    match device {
        Device::Auto => bail!("bench: choose --device cuda or --device cpu"),
        Device::Cpu => {
            if per_kernel {
                bail!("--per-kernel times GPU launches: use it with --device cuda");
            }
            for _ in 0..warmup {
                graphc::run_cpu(&compiled, inputs.clone())?;
            }
            let mut times = Vec::with_capacity(iters.max(1));
            for _ in 0..iters.max(1) {
                let start = Instant::now();
                graphc::run_cpu(&compiled, inputs.clone())?;
                times.push(start.elapsed().as_secs_f64() * 1e3);
            }
            times.sort_by(|a, b| a.total_cmp(b));
            let med = median_sorted(&times);
            let (min, max) = min_max_sorted(&times);
            if json {
                println!(
                    "{}",
                    serde_json::json!({
                        "model": model.display().to_string(), "device": "cpu", "gpu": null, "arch": null,
                        "precision": precision.name(),
                        "graph": false, "tf32": false, "warmup": warmup, "iters": times.len(),
                        "median_ms": med, "min_ms": min, "max_ms": max,
                        "kernels": kernels, "launches": kernels, "plan": plan_json,
                        "device_bytes": null, "free_bytes_at_load": null, "per_kernel": [],
                    })
                );
            } else {
                println!("model    {}: {}", model.display(), describe(&graph));
                println!(
                        "bench    cpu (kernel-IR executor), {kernels} kernels: median {med:.3} ms over {} runs (min {:.3}, max {:.3}) after {warmup} warm-up",
                        times.len(),
                        min,
                        max
                    );
            }
        }
        Device::Cuda => {
            let mut session = graphc::cuda::Session::new(&compiled, gpu.options())?;
            if !json {
                println!("model    {}: {}", model.display(), describe(&graph));
                print_session(&session);
            }
            let r = session.bench(
                &inputs,
                graphc::cuda::BenchOptions {
                    warmup,
                    iters,
                    per_kernel,
                },
            )?;
            let lp = session.launch_plan();
            let mem = session.memory();
            if json {
                println!(
                    "{}",
                    serde_json::json!({
                        "model": model.display().to_string(), "device": "cuda",
                        "precision": precision.name(),
                        "gpu": session.device().name, "arch": session.device().arch,
                        "graph": r.graph, "tf32": gpu.tf32, "warmup": warmup, "iters": r.times_ms.len(),
                        "median_ms": r.median_ms, "min_ms": r.min_ms, "max_ms": r.max_ms,
                        "kernels": kernels, "launches": lp.launches.len(), "plan": plan_json,
                        "device_bytes": mem.device_bytes, "free_bytes_at_load": mem.free_at_load,
                        "per_kernel": r.per_kernel, "graph_error": session.graph_error(),
                    })
                );
            } else {
                println!(
                        "bench    cuda, {} launches ({} kernels, {} GEMMs){}: median {:.4} ms over {} runs (min {:.4}, max {:.4}) after {warmup} warm-up",
                        lp.launches.len(),
                        lp.kernel_launch_count(),
                        lp.gemm_count(),
                        if r.graph { " in a CUDA graph" } else { "" },
                        r.median_ms,
                        r.times_ms.len(),
                        r.min_ms,
                        r.max_ms
                    );
                if let Some(e) = session.graph_error() {
                    println!("note     CUDA graph capture failed ({e}); the kernels were launched one by one");
                }
                let traffic = compiled.fusion.bytes as f64;
                println!(
                    "         {} of global memory traffic (fusion's estimate): {:.0} GB/s",
                    human_bytes(compiled.fusion.bytes),
                    traffic / (r.median_ms * 1e-3) / 1e9
                );
                if !r.per_kernel.is_empty() {
                    let total: f64 = r.per_kernel.iter().map(|k| k.median_ms).sum();
                    println!("per kernel (median ms, without the graph; sum {total:.4} ms):");
                    for k in &r.per_kernel {
                        println!(
                            "  {:>4} {:<28} {:<6} {:>9.4} {:>5.1}%",
                            k.step,
                            k.name,
                            k.kind,
                            k.median_ms,
                            100.0 * k.median_ms / total.max(1e-12)
                        );
                    }
                }
            }
        }
    }
    Ok(())
}

/// `graphc selftest`.
fn cmd_selftest(args: SelftestArgs) -> Result<()> {
    let SelftestArgs {
        device,
        filter,
        json,
        gpu,
    } = args;
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
    let mut runner = |c: &graphc::Compiled,
                      inputs: &std::collections::HashMap<String, Tensor>|
     -> Result<Vec<(String, Tensor)>, graphc::Error> {
        match device {
            SelftestDevice::Cuda => graphc::run_cuda(c, inputs.clone(), opts.clone()),
            SelftestDevice::Emulate => {
                let kernels =
                    graphc_compiler::codegen::generate_all(&c.program).map_err(|e| graphc::Error::Cuda(e.into()))?;
                let lp = graphc::cuda::plan_launches(&c.program, &c.plan, &kernels, &graphc::cuda::DeviceInfo::h200())
                    .map_err(|e| graphc::Error::Cuda(e.into()))?;
                graphc::cuda::emulate(&c.program, &lp, c.graph.weights(), inputs)
                    .map_err(|e| graphc::Error::Cuda(e.into()))
            }
        }
    };
    let mut results = Vec::new();
    let start = Instant::now();
    for case in &cases {
        let t = Instant::now();
        let r = graphc::selftest::run_case(case, gpu.tf32, &mut runner);
        if !json {
            println!(
                "{:<4} {:<62} {:>3} kernels  {}  {:>6.0} ms",
                if r.pass { "ok" } else { "FAIL" },
                r.name,
                r.kernels,
                match &r.error {
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
                },
                t.elapsed().as_secs_f64() * 1e3
            );
        }
        if let Some(e) = &r.error {
            // No GPU at all: stop at once with exit code 3.
            if e.starts_with("no CUDA") {
                return Err(graphc::cuda::CudaError::NoDevice(e.clone()).into());
            }
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
            },
            start.elapsed().as_secs_f64()
        );
    }
    if !failed.is_empty() {
        bail!("selftest: {} case(s) failed: {}", failed.len(), failed.join("; "));
    }
    Ok(())
}

/// `graphc launches`.
fn cmd_launches(args: LaunchesArgs) -> Result<()> {
    let LaunchesArgs { model, dims, gpu, json } = args;
    let graph = graphc::load_model(&model, &dims)?;
    let compiled = graphc::compile(&graph)?;
    let device = match gpu {
        Gpu::Rtx4090d => graphc::cuda::DeviceInfo::rtx_4090d(),
        Gpu::H200 => graphc::cuda::DeviceInfo::h200(),
    };
    let kernels = graphc_compiler::codegen::generate_all(&compiled.program)?;
    let lp = graphc::cuda::plan_launches(&compiled.program, &compiled.plan, &kernels, &device)?;
    if json {
        println!("{}", serde_json::to_string_pretty(&lp)?);
    } else {
        print!("{}", lp.describe());
    }
    Ok(())
}

/// `graphc random-inputs`.
fn cmd_random_inputs(args: RandomInputsArgs) -> Result<()> {
    let RandomInputsArgs {
        model,
        dims,
        output,
        seed,
    } = args;
    let graph = graphc::load_model(&model, &dims)?;
    let arrays = graphc::try_random_input_list(&graph, seed)?;
    graphc::npz::write_npz(&output, &arrays).with_context(|| "writing random inputs")?;
    println!("wrote    {} ({} arrays)", output.display(), arrays.len());
    Ok(())
}

/// Inputs from an .npz file, or random ones (seed 0) for every model input.
fn load_inputs(path: Option<&std::path::Path>, graph: &Graph) -> Result<std::collections::HashMap<String, Tensor>> {
    Ok(match path {
        Some(p) => graphc::npz::read_inputs(p, graph)?,
        None => graphc::try_random_input_list(graph, 0)?.into_iter().collect(),
    })
}

fn print_session(session: &graphc::cuda::Session) {
    let (compile_ms, load_ms) = session.load_times_ms();
    let lp = session.launch_plan();
    println!(
        "device   {}; {} distinct kernels compiled for {} (NVRTC or cache) in {compile_ms:.0} ms; loaded in {load_ms:.0} ms",
        session.memory().summary(),
        lp.modules.len(),
        session.device().arch
    );
}

/// The median of sorted `v`; NaN when it is empty.
fn median_sorted(v: &[f64]) -> f64 {
    let mid = v.len() / 2;
    let upper = v.get(mid).copied().unwrap_or(f64::NAN);
    if v.len() % 2 == 1 {
        upper
    } else {
        mid.checked_sub(1)
            .and_then(|i| v.get(i))
            .map_or(f64::NAN, |&lower| (lower + upper) / 2.0)
    }
}

/// The least and greatest of sorted `v`; NaN when it is empty.
fn min_max_sorted(v: &[f64]) -> (f64, f64) {
    (
        v.first().copied().unwrap_or(f64::NAN),
        v.last().copied().unwrap_or(f64::NAN),
    )
}

/// The GPU's outputs against the CPU executor's: relative L2 per output.
fn check_outputs(got: &[(String, Tensor)], want: &[(String, Tensor)], tf32: bool) -> Result<()> {
    let mut failed = Vec::new();
    for ((name, g), (_, w)) in got.iter().zip(want) {
        let tol = graphc::selftest::tolerance(w.ty().dtype, tf32);
        let err = graphc::selftest::output_error(g, w);
        let ok = err <= tol;
        println!(
            "check    {name} rel_l2 {err:.3e} (tol {tol:.0e}) {}",
            if ok { "ok" } else { "FAIL" }
        );
        if !ok {
            failed.push(name.clone());
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

fn graph_ir_unsupported(model: &std::path::Path) -> Result<Vec<ir::onnx::UnsupportedNode>> {
    if model.extension().is_none_or(|e| e != "onnx") {
        bail!("--list-unsupported applies to .onnx models");
    }
    ir::onnx::list_unsupported(model).with_context(|| model.display().to_string())
}

fn describe(g: &Graph) -> String {
    format!(
        "{} nodes, {} input(s), {} output(s), {} weights ({} bytes)",
        g.len(),
        g.inputs().len(),
        g.outputs().len(),
        g.weights().len(),
        g.weights_bytes()
    )
}

fn summarize(t: &Tensor) -> String {
    let v = t.to_f64_vec();
    let (mut lo, mut hi, mut sum) = (f64::INFINITY, f64::NEG_INFINITY, 0.0);
    for &x in &v {
        lo = lo.min(x);
        hi = hi.max(x);
        sum += x;
    }
    let mean = if v.is_empty() { f64::NAN } else { sum / v.len() as f64 };
    let head: Vec<String> = v.iter().take(4).map(|x| format!("{x:.5}")).collect();
    format!(
        "{}  min {lo:.5}  max {hi:.5}  mean {mean:.5}  first [{}{}]",
        t.ty(),
        head.join(", "),
        if v.len() > 4 { ", ..." } else { "" }
    )
}

/// `1536` -> `1.50 KiB`.
fn human_bytes(b: usize) -> String {
    report::human_bytes(b as u64)
}

/// Default compile options with this memory budget.
fn budget_options(budget: u64, precision: graphc_compiler::passes::precision::Precision) -> graphc::CompileOptions {
    graphc::CompileOptions {
        precision,
        memory: graphc::MemoryOptions {
            budget_bytes: budget,
            ..Default::default()
        },
        ..Default::default()
    }
}
