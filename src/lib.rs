//! # graphc
//!
//! A tensor computation-graph compiler. This facade loads models, compiles them with
//! [`graphc_compiler`] and runs them with [`graphc_runtime`]; the `graphc` binary is a
//! thin CLI over it. See README.md and ARCHITECTURE.md.
//!
//! ```
//! use graphc::models::{mlp, MlpConfig};
//! use graphc_ir::{Tensor, TensorType, DType};
//! let graph = mlp(&MlpConfig::default()).unwrap();
//! let compiled = graphc::compile(&graph).unwrap();
//! let x = Tensor::random(&TensorType::new(DType::F32, [8, 64]), 1);
//! let out = graphc::run_cpu(&compiled, [("x".to_string(), x)].into()).unwrap();
//! assert_eq!(out[0].1.shape().dims(), &[8, 64]);
//! ```

#![cfg_attr(not(test), warn(clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing))]

pub mod fit;
pub mod models;
pub mod npz;
pub mod selftest;
pub mod train;

use std::collections::HashMap;
use std::path::Path;

pub use graphc_compiler::perf;
pub use graphc_compiler::plan::report::{CommandLine, Rerun};
pub use graphc_compiler::plan::MemoryOptions;
pub use graphc_compiler::{Binary, CompileOptions, Compiled, Kernels};
pub use graphc_ir as ir;
use graphc_ir::{Graph, Tensor, TensorType};
pub use graphc_runtime::cuda;
use graphc_runtime::{cpu::CpuExecutor, Executor};

/// Everything that can go wrong between a model file and its outputs.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{path}: {message}")]
    Model { path: String, message: String },
    #[error(transparent)]
    Gir(#[from] graphc_ir::weights::LoadError),
    #[error(transparent)]
    Npz(#[from] npz::NpzError),
    /// A graph built in Rust (the builder) is malformed.
    #[error("graph: {0}")]
    Graph(#[from] graphc_ir::GraphError),
    #[error(transparent)]
    Compile(#[from] graphc_compiler::CompileError),
    /// A shape family could not be captured, or written out at a value
    /// ([`graphc_compiler::pipeline::family`]).
    #[error(transparent)]
    Family(#[from] graphc_compiler::pipeline::family::FamilyError),
    #[error(transparent)]
    Run(#[from] graphc_runtime::RunError),
    /// The GPU path: no driver or GPU ([`cuda::CudaError::is_unavailable`]), too little
    /// device memory, a failing kernel (named).
    #[error(transparent)]
    Cuda(#[from] cuda::CudaError),
    /// Even the smallest value of the dimension searched by [`fit::fit`] does not fit
    /// (`diagnosis`: why the plan at that value does not, and what would help; its
    /// `Display` writes commands for a library caller, `MODEL` for the model: a command
    /// line renders it with [`Diagnosis::text`](graphc_compiler::plan::Diagnosis::text)).
    #[error("even {value} does not fit: {}", diagnosis.to_string().trim_end())]
    DoesNotFit {
        value: usize,
        plan: Box<graphc_compiler::plan::MemoryPlan>,
        diagnosis: Box<graphc_compiler::plan::Diagnosis>,
    },
    /// A training step that cannot run as asked (its state, its batch).
    #[error("training: {0}")]
    Train(String),
    /// The host has too little memory for what was asked (named).
    #[error("host memory: {0}")]
    HostMemory(String),
    /// A file graphc refuses to read or write, or cannot.
    #[error(transparent)]
    File(#[from] graphc_ir::files::FileError),
    /// The memory plan does not fit its budget (the diagnosis says why and what would help).
    #[error(transparent)]
    OverBudget(#[from] graphc_compiler::plan::OverBudget),
    /// A GPU the performance model does not know (the message lists those it does).
    #[error("{0}")]
    UnknownGpu(String),
}

/// Load a model: an `.onnx` file (with its external data), a `.gir` text IR file (with
/// its weights file) or a `.json` graph. `dims` fixes symbolic dimensions of ONNX
/// models; a `.gir` has none.
pub fn load_model(path: &Path, dims: &[(String, usize)]) -> Result<Graph, Error> {
    let model_err = |message: String| Error::Model {
        path: path.display().to_string(),
        message,
    };
    let ext = path.extension().and_then(|e| e.to_str()).unwrap_or("");
    let graph = match ext {
        "gir" => graphc_ir::weights::load_gir(path)?,
        "json" => {
            let text = graphc_ir::files::read_regular_text(path)?;
            Graph::from_json(&text).map_err(|e| model_err(e.to_string()))?
        }
        "onnx" => {
            let opts = graphc_ir::onnx::ImportOptions {
                dims: dims.iter().cloned().collect(),
            };
            return graphc_ir::onnx::import_onnx(path, &opts).map_err(|e| onnx_error(path, e));
        }
        _ => {
            return Err(model_err(format!(
                "unknown model format `.{ext}` (expected .gir, .json or .onnx)"
            )))
        }
    };
    if let Some((name, _)) = dims.first() {
        return Err(model_err(format!(
            "the model has only static dimensions; there is no symbolic dimension `{name}` to fix"
        )));
    }
    Ok(graph)
}

/// Every node of an ONNX model whose op graphc does not support
/// ([`graphc_ir::onnx::list_unsupported`]), errors naming the file once.
pub fn list_unsupported(path: &Path) -> Result<Vec<graphc_ir::onnx::UnsupportedNode>, Error> {
    graphc_ir::onnx::list_unsupported(path).map_err(|e| onnx_error(path, e))
}

/// An import error of the ONNX model at `path`: a file error names the file itself;
/// the others get the path in front.
fn onnx_error(path: &Path, e: graphc_ir::onnx::OnnxError) -> Error {
    match e {
        graphc_ir::onnx::OnnxError::File(f) => Error::File(f),
        e => Error::Model {
            path: path.display().to_string(),
            message: e.to_string(),
        },
    }
}

/// The modeled time of a compiled model's kernels on `gpu` (a name of
/// [`perf::GPUS`]), before anything runs: each generated kernel's own CUDA C counted
/// on cuda-sim over sampled blocks (built for counting with `sim`'s cache and jobs),
/// cuBLASLt GEMMs by tiles and waves ([`perf`]). Needs a host C++ compiler.
pub fn model_time(model: &Compiled, gpu: &str, sim: &cuda::sim::SimOptions) -> Result<perf::StepTime, Error> {
    let spec = perf::GpuSpec::by_name(gpu).map_err(Error::UnknownGpu)?;
    Ok(cuda::sim::count::model_step(model, spec, sim)?)
}

/// Compile with default options.
pub fn compile(graph: &Graph) -> Result<Compiled, Error> {
    compile_with(graph, &CompileOptions::default())
}

/// Compile with these options (e.g. a memory budget in `opts.memory.budget_bytes`).
/// The result carries its memory plan whether or not it fits; check it with
/// [`check_budget`].
pub fn compile_with(graph: &Graph, opts: &CompileOptions) -> Result<Compiled, Error> {
    Ok(graphc_compiler::compile(graph, opts)?)
}

/// [`Error::OverBudget`] (with the full diagnosis) when the compiled model's memory plan
/// exceeds its budget. `rerun` names the model's symbolic dimensions (the ONNX `--dim`
/// names), which the diagnosis offers as remedies, and the command line its remedies
/// are written against ([`Rerun::default`] for none).
pub fn check_budget(model: &Compiled, rerun: &Rerun) -> Result<(), Error> {
    check_budget_on(model, rerun, graphc_compiler::plan::Device::Cuda)
}

/// [`check_budget`] for a run on `device`: on the CPU the cuBLASLt workspace does not
/// count ([`MemoryPlan::total_bytes_for`](graphc_compiler::plan::MemoryPlan::total_bytes_for)),
/// in the check or in the diagnosis.
pub fn check_budget_on(model: &Compiled, rerun: &Rerun, device: graphc_compiler::plan::Device) -> Result<(), Error> {
    match &model.train {
        // A training step: its state is fixed, and freezing is a remedy.
        Some(t) => Ok(graphc_compiler::plan::check_training_budget_for(
            &model.program,
            &model.plan,
            &t.state,
            t.report.recomputed_layers.map_or((0, 0), |r| (r.layers, r.chosen)),
            rerun,
            device,
        )?),
        None => Ok(graphc_compiler::plan::check_budget_for(
            &model.program,
            &model.plan,
            rerun,
            device,
        )?),
    }
}

/// Host bytes the CPU executor allocates to run `model`: its arena, inputs and outputs
/// (the weights are already in memory, in the graph).
pub fn cpu_run_bytes(model: &Compiled) -> u64 {
    let p = &model.plan;
    p.arena_bytes
        .saturating_add(p.inputs_bytes)
        .saturating_add(p.outputs_bytes)
}

/// [`Error::HostMemory`] when this host cannot give the CPU executor what
/// [`cpu_run_bytes`] says it needs: more than the memory available (`MemAvailable`), or
/// than the process's address-space limit leaves. Checked before any input is made, so
/// a model too big for the host is an error, never an abort.
pub fn check_host_memory(model: &Compiled) -> Result<(), Error> {
    let h = graphc_compiler::plan::report::human_bytes;
    let p = &model.plan;
    check_host_bytes(
        cpu_run_bytes(model),
        &format!(
            "the CPU executor (arena {}, inputs {}, outputs {})",
            h(p.arena_bytes),
            h(p.inputs_bytes),
            h(p.outputs_bytes)
        ),
    )
}

/// [`Error::HostMemory`] when `what` needs `need` bytes and this host cannot give them
/// (more than `MemAvailable`, or than the address-space limit leaves): checked before
/// they are allocated, not left to the allocator (which may hand out address space it
/// cannot back, and the writes then fail far from here).
pub fn check_host_bytes(need: u64, what: &str) -> Result<(), Error> {
    match host_memory_available() {
        Some((avail, limit)) if need > avail => {
            let h = graphc_compiler::plan::report::human_bytes;
            Err(Error::HostMemory(format!(
                "{what} needs {} but {} is available ({limit})",
                h(need),
                h(avail)
            )))
        }
        _ => Ok(()),
    }
}

/// The host memory this process can still allocate, and where the limit comes from.
fn host_memory_available() -> Option<(u64, &'static str)> {
    let kib = |text: &str, key: &str| -> Option<u64> {
        let line = text.lines().find(|l| l.starts_with(key))?;
        let n: u64 = line
            .trim_start_matches(key)
            .trim()
            .trim_end_matches("kB")
            .trim()
            .parse()
            .ok()?;
        n.checked_mul(1024)
    };
    let meminfo = std::fs::read_to_string("/proc/meminfo").ok();
    let mut best = meminfo
        .as_deref()
        .and_then(|m| kib(m, "MemAvailable:"))
        .map(|b| (b, "MemAvailable"));
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes into the struct it is given.
    if unsafe { libc::getrlimit(libc::RLIMIT_AS, &mut lim) } == 0 && lim.rlim_cur != libc::RLIM_INFINITY {
        let used = std::fs::read_to_string("/proc/self/status")
            .ok()
            .and_then(|s| kib(&s, "VmSize:"))
            .unwrap_or(0);
        // reason: `rlim_t` is u64 here but narrower on some targets.
        #[allow(clippy::unnecessary_cast)]
        let left = (lim.rlim_cur as u64).saturating_sub(used);
        if best.is_none_or(|(b, _)| left < b) {
            best = Some((left, "the address-space limit, ulimit -v"));
        }
    }
    best
}

/// Run a compiled model on the CPU: its kernels, with every intermediate in one host
/// arena at the offsets of its memory plan.
pub fn run_cpu(model: &Compiled, inputs: HashMap<String, Tensor>) -> Result<Vec<(String, Tensor)>, Error> {
    Ok(CpuExecutor.run(model, &inputs)?)
}

/// [`run_cpu`] through a given plan of `model` (checked before anything runs).
pub fn run_cpu_planned(
    model: &Compiled,
    plan: &graphc_compiler::plan::MemoryPlan,
    inputs: HashMap<String, Tensor>,
) -> Result<Vec<(String, Tensor)>, Error> {
    Ok(CpuExecutor.run_with_plan(model, plan, &inputs)?)
}

/// Run a compiled model on a CUDA GPU: load it ([`cuda::Session`]: kernels generated
/// and compiled for the device by the compiler's backend stages, one arena and one
/// weights allocation, cuBLASLt, a CUDA graph) and run it once. To run many times, keep
/// a [`cuda::Session`]; to build the kernels ahead, see [`cuda::Session::with_binary`].
pub fn run_cuda(
    model: &Compiled,
    inputs: HashMap<String, Tensor>,
    options: cuda::SessionOptions,
) -> Result<Vec<(String, Tensor)>, Error> {
    let mut session = cuda::Session::new(model, options)?;
    Ok(session.run(&inputs)?)
}

/// Every input of `graph` in input order: its name, type and the seed of its random
/// values (`seed + i` for input `i`).
fn input_seeds(graph: &Graph, seed: u64) -> impl Iterator<Item = (String, &TensorType, u64)> {
    graph.inputs().iter().enumerate().map(move |(i, &id)| {
        let name = graph.input_name(id).unwrap_or_default().to_string();
        (name, &graph.node(id).ty, seed.wrapping_add(i as u64))
    })
}

/// Random inputs for every input of `graph`, in input order (`Tensor::random`, seed
/// `seed + i` for input `i`).
pub fn random_input_list(graph: &Graph, seed: u64) -> Vec<(String, Tensor)> {
    input_seeds(graph, seed)
        .map(|(name, ty, s)| (name, Tensor::random(ty, s)))
        .collect()
}

/// [`random_input_list`] with every tensor allocated fallibly: [`Error::HostMemory`]
/// names the input the host cannot hold, instead of an abort.
pub fn try_random_input_list(graph: &Graph, seed: u64) -> Result<Vec<(String, Tensor)>, Error> {
    input_seeds(graph, seed)
        .map(|(name, ty, s)| {
            let t =
                Tensor::try_random(ty, s).map_err(|e| Error::HostMemory(format!("random input \"{name}\": {e}")))?;
            Ok((name, t))
        })
        .collect()
}

/// [`random_input_list`] by name.
pub fn random_inputs(graph: &Graph, seed: u64) -> HashMap<String, Tensor> {
    random_input_list(graph, seed).into_iter().collect()
}
