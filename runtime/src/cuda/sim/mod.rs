//! `--device cuda-sim`: the launch list a GPU would run, with every generated kernel's
//! **own CUDA C** compiled for the host and executed with a fiber per CUDA thread.
//!
//! - The launch list is the GPU's ([`plan_launches`] for a named device: the RTX
//!   4090D's sm_89 limits by default): the same device layout, offsets, grids and block
//!   sizes. GEMMs are computed by cuBLASLt's definition, as the launch emulator
//!   computes them ([`super::emulate`]).
//! - Each distinct kernel source becomes a shared object: `cuda_sim.h` (the CUDA
//!   built-ins given their host meaning) + the source (its `__shared__` arrays made per
//!   block) + a trampoline. Objects and the runner are cached by source, compiler and
//!   flags ([`build`]) and built in parallel.
//! - A separate runner process (`sim_rt.cpp`) loads them and runs each launch with
//!   every CUDA thread as a fiber switched at every barrier and collective, so a
//!   missing `__syncthreads` or a divergent shuffle misbehaves as on a GPU; barriers and collectives that can never
//!   complete are reported, not hung on. Every argument is its own allocation:
//!   guard bytes around it (checked after the launch) or, under
//!   [`Sanitize::Address`], ASan's red zones, so an access past a buffer is caught even
//!   where the arena would put a neighbour; write-only arguments start as NaN bytes,
//!   so an element a kernel fails to write shows; an argument the kernel only reads
//!   must come back unchanged.
//! - [`Sanitize::Address`] builds everything with ASan + UBSan (signed overflow in index
//!   arithmetic is an error), [`Sanitize::Thread`] with TSan (each fiber a TSan
//!   context ordered only by CUDA's barriers; 1024 threads' worth of blocks run at
//!   once, so a race between blocks is seen too). A report becomes an error naming the
//!   kernel, its step and its arguments' buffers.

pub mod build;
pub mod count;
mod runner;
pub mod weights;

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use graphc_compiler::codegen::{self, CudaKernel, ParamAccess, ParamTarget};
use graphc_compiler::kernel::Program;
use graphc_compiler::plan::MemoryPlan;
use graphc_compiler::Compiled;
use graphc_ir::Tensor;

use super::emulate::{check_overlaps, gemm, load_memory, read_outputs, Memory};
use super::launch::{plan_launches, DevAddr, DeviceInfo, KernelLaunch, Launch, LaunchPlan, Region};
use super::CudaError;
use crate::kernels::{kernel_error, KernelError};
use runner::{Failure, Runner, RunnerArg};

/// Which sanitizer the host build carries.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Sanitize {
    #[default]
    None,
    /// AddressSanitizer + UndefinedBehaviorSanitizer.
    Address,
    /// ThreadSanitizer.
    Thread,
    /// Not a sanitizer: the counting build of the performance model. Every memory
    /// access and basic block of a kernel is reported to the runner, which counts
    /// requests, sectors, bank conflicts and work per warp ([`SimSession::count`]).
    Count,
}

impl Sanitize {
    pub fn name(self) -> &'static str {
        match self {
            Sanitize::None => "plain",
            Sanitize::Address => "address",
            Sanitize::Thread => "thread",
            Sanitize::Count => "count",
        }
    }

    /// Threads of one wave of blocks (run at once): one block at a time, except under
    /// TSan, where up to 1024 threads' blocks interleave, so races between blocks are
    /// seen too.
    fn wave_threads(self) -> u32 {
        match self {
            Sanitize::Thread => 1024,
            _ => 1,
        }
    }
}

/// How cuda-sim runs.
#[derive(Clone, Debug)]
pub struct SimOptions {
    /// The GPU whose launch list runs (limits checked; SMs set the grid sizes).
    pub device: DeviceInfo,
    pub sanitize: Sanitize,
    /// Where built objects are cached ([`build::cache_dir`] when `None`).
    pub cache_dir: Option<PathBuf>,
    /// Parallel host compiles (0: one per core).
    pub jobs: usize,
    /// A launch that runs longer is a hang.
    pub launch_timeout: Duration,
}

impl Default for SimOptions {
    fn default() -> Self {
        SimOptions {
            device: DeviceInfo::rtx_4090d(),
            sanitize: Sanitize::None,
            cache_dir: None,
            jobs: 0,
            launch_timeout: Duration::from_secs(300),
        }
    }
}

impl SimOptions {
    /// A launch's shape with this device's shared-memory limits.
    fn shape(&self, grid: u32, block: u32, dyn_smem: u32) -> runner::Shape {
        let d = &self.device;
        runner::Shape {
            grid,
            block,
            dyn_smem,
            smem_limit: d.max_shared_per_block_optin.max(d.max_shared_per_block),
            static_limit: d.max_shared_per_block,
            wave_threads: self.sanitize.wave_threads().max(block),
        }
    }

    fn jobs(&self) -> usize {
        if self.jobs > 0 {
            self.jobs
        } else {
            std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1)
        }
    }
}

/// What can go wrong in cuda-sim.
#[derive(Debug, thiserror::Error)]
pub enum SimError {
    /// No host C++ compiler: cuda-sim cannot run here (the CLI's exit code 3).
    #[error("cuda-sim needs a host C++ compiler: {0} (set CXX or install g++)")]
    NoCompiler(String),
    #[error("cuda-sim: kernel {kernel}: {message}")]
    Source { kernel: String, message: String },
    #[error("cuda-sim: cannot compile {kernel} for the host with {compiler}:\n{log}")]
    Build {
        kernel: String,
        compiler: String,
        log: String,
    },
    /// A launch failed: the runner's check, a sanitizer report, a crash or a hang.
    #[error("cuda-sim: kernel {kernel} (step {step}, {grid} blocks of {block} threads): {message}")]
    Kernel {
        step: usize,
        kernel: String,
        grid: u32,
        block: u32,
        message: String,
    },
    #[error("cuda-sim: {0}")]
    Runner(String),
    #[error(transparent)]
    Exec(#[from] KernelError),
}

impl SimError {
    /// There is no host compiler (not a failure of the model or of graphc).
    pub fn is_unavailable(&self) -> bool {
        matches!(self, SimError::NoCompiler(_))
    }
}

/// A compiled model ready to run through cuda-sim: its launch list, the kernels built
/// for the host and loaded into a runner.
pub struct SimSession {
    program: Program,
    plan: LaunchPlan,
    opts: SimOptions,
    runner: Arc<Mutex<Runner>>,
    /// The kernel object of each [`LaunchPlan::modules`] entry.
    modules: Vec<PathBuf>,
    /// The device memory kept between runs ([`SimSession::run_kept`]), once written.
    kept: Option<Memory>,
}

impl SimSession {
    /// Generate the kernels of `compiled`, plan its launches for `opts.device`, build
    /// them for the host and start the runner.
    pub fn new(compiled: &Compiled, opts: &SimOptions) -> Result<SimSession, CudaError> {
        let kernels = codegen::generate_all(&compiled.program)?;
        SimSession::with_kernels(&compiled.program, &compiled.plan, &kernels, opts)
    }

    /// As [`SimSession::new`], given the generated kernels (e.g. with a bug put in).
    pub fn with_kernels(
        program: &Program,
        plan: &MemoryPlan,
        kernels: &[CudaKernel],
        opts: &SimOptions,
    ) -> Result<SimSession, CudaError> {
        let lp = plan_launches(program, plan, kernels, &opts.device)?;
        let compiler = build::find_compiler()?;
        let dir = build::cache_dir(opts.cache_dir.as_deref());
        let mut sources = Vec::with_capacity(lp.modules.len());
        for m in &lp.modules {
            let k = kernels.get(m.kernel).ok_or_else(|| {
                SimError::Runner(format!(
                    "module {} names kernel {} of {}",
                    m.entry,
                    m.kernel,
                    kernels.len()
                ))
            })?;
            sources.push((k.name.as_str(), k.source.as_str(), k.entry.as_str()));
        }
        let (runner_path, objects) = build::build_all(&compiler, opts.sanitize, &dir, &sources, opts.jobs())?;
        let runner = runner::shared(&runner_path, opts.sanitize, opts.launch_timeout).map_err(SimError::Runner)?;
        // Loaded now, so a kernel the runner cannot load is an error before any run.
        for (o, (name, _, _)) in objects.iter().zip(&sources) {
            let mut r = lock(&runner);
            r.revive().map_err(SimError::Runner)?;
            r.load(o).map_err(|f| {
                SimError::Runner(format!(
                    "cannot load {name}: {}",
                    match f {
                        Failure::Reported(m) | Failure::Died(m) => m,
                    }
                ))
            })?;
        }
        Ok(SimSession {
            program: program.clone(),
            plan: lp,
            opts: opts.clone(),
            runner,
            modules: objects,
            kept: None,
        })
    }

    pub fn launch_plan(&self) -> &LaunchPlan {
        &self.plan
    }

    /// One run: weights and inputs uploaded, every launch in order, the named outputs.
    pub fn run(
        &mut self,
        weights: &BTreeMap<String, Tensor>,
        inputs: &HashMap<String, Tensor>,
    ) -> Result<Vec<(String, Tensor)>, CudaError> {
        let mut mem = load_memory(&self.program, &self.plan, weights, inputs).map_err(SimError::from)?;
        self.launch_all(&mut mem)?;
        Ok(read_outputs(&mem, &self.plan.layout).map_err(SimError::from)?)
    }

    /// Every launch in order on `mem`.
    fn launch_all(&mut self, mem: &mut Memory) -> Result<(), CudaError> {
        for i in 0..self.plan.launches.len() {
            match &self.plan.launches[i] {
                Launch::Gemm(g) => gemm(mem, g).map_err(|m| SimError::from(kernel_error(&self.program, g.step, m)))?,
                Launch::Kernel(k) => {
                    let k = k.clone();
                    self.kernel(mem, &k)?;
                }
            }
        }
        Ok(())
    }

    /// Write the named inputs into the device memory kept between runs (made at the
    /// first write: weights uploaded, every other input zero), as the CUDA session's
    /// `write_inputs`.
    pub fn write_inputs(
        &mut self,
        weights: &BTreeMap<String, Tensor>,
        values: &[(&str, &Tensor)],
    ) -> Result<(), CudaError> {
        let layout = &self.plan.layout;
        let find = |name: &str, t: &Tensor| -> Result<DevAddr, KernelError> {
            let x = layout.input(name)?;
            x.check(t)?;
            Ok(x.addr)
        };
        let mut at = Vec::with_capacity(values.len());
        for (name, t) in values {
            at.push((find(name, t).map_err(SimError::from)?, *t));
        }
        let mut mem = match self.kept.take() {
            Some(m) => m,
            None => {
                let zeros: HashMap<String, Tensor> = layout
                    .inputs
                    .iter()
                    .map(|x| (x.name.clone(), Tensor::zeros(&x.ty)))
                    .collect();
                load_memory(&self.program, &self.plan, weights, &zeros).map_err(SimError::from)?
            }
        };
        for (addr, t) in at {
            mem.write(addr, t.data()).map_err(SimError::from)?;
        }
        self.kept = Some(mem);
        Ok(())
    }

    /// A run on the kept memory, as the CUDA session's `run_kept`: only `batch` is
    /// written; the inputs named in `kept` stay as they are, and each output named like
    /// one is its next value, left over it (a donated output already is; any other is
    /// copied) and not returned. The arena is poisoned again first.
    pub fn run_kept(
        &mut self,
        weights: &BTreeMap<String, Tensor>,
        batch: &HashMap<String, Tensor>,
        kept: &[&str],
    ) -> Result<Vec<(String, Tensor)>, CudaError> {
        let layout = &self.plan.layout;
        if let Some(x) = layout
            .inputs
            .iter()
            .find(|x| !kept.contains(&x.name.as_str()) && !batch.contains_key(&x.name))
        {
            return Err(SimError::from(KernelError::MissingInput(x.name.clone())).into());
        }
        let mut names: Vec<&String> = batch.keys().collect();
        names.sort();
        if let Some(n) = names.iter().find(|n| kept.contains(&n.as_str())) {
            return Err(SimError::from(KernelError::UnknownInput(format!("{n} (kept on the device)"))).into());
        }
        if self.kept.is_none() {
            return Err(SimError::Runner("run_kept before the kept inputs were written".into()).into());
        }
        let values: Vec<(&str, &Tensor)> = names.iter().map(|n| (n.as_str(), &batch[*n])).collect();
        self.write_inputs(weights, &values)?;
        let mut mem = self
            .kept
            .take()
            .ok_or_else(|| SimError::Runner("no kept memory".into()))?;
        mem.poison(Region::Arena);
        let result = self.launch_all(&mut mem).and_then(|()| {
            let layout = &self.plan.layout;
            let mut out = Vec::new();
            for o in &layout.outputs {
                if !kept.contains(&o.name.as_str()) {
                    let t = mem.read(o.addr, &o.ty).map_err(|m| {
                        SimError::from(KernelError::Output {
                            name: o.name.clone(),
                            message: m,
                        })
                    })?;
                    out.push((o.name.clone(), t));
                    continue;
                }
                let Some(x) = layout.inputs.iter().find(|x| x.name == o.name) else {
                    continue;
                };
                if o.addr != x.addr {
                    let bytes = mem.bytes(o.addr, o.bytes).map_err(SimError::Runner)?.to_vec();
                    mem.write_bytes(x.addr, &bytes).map_err(SimError::from)?;
                }
            }
            Ok(out)
        });
        self.kept = Some(mem);
        result
    }

    /// The current values of the named inputs in the kept memory.
    pub fn read_inputs(&self, names: &[&str]) -> Result<Vec<(String, Tensor)>, CudaError> {
        let mem = self
            .kept
            .as_ref()
            .ok_or_else(|| SimError::Runner("no kept memory to read".into()))?;
        let mut out = Vec::with_capacity(names.len());
        for name in names {
            let x = self.plan.layout.input(name).map_err(SimError::from)?;
            let t = mem.read(x.addr, &x.ty).map_err(|m| {
                SimError::from(KernelError::Output {
                    name: x.name.clone(),
                    message: m,
                })
            })?;
            out.push((x.name.clone(), t));
        }
        Ok(out)
    }

    fn kernel(&mut self, mem: &mut Memory, k: &KernelLaunch) -> Result<(), SimError> {
        let fail = |message: String| SimError::Kernel {
            step: k.step,
            kernel: k.kernel.clone(),
            grid: k.grid,
            block: k.block,
            message,
        };
        if k.args.len() != k.params.len() || k.arg_bytes.len() != k.params.len() {
            return Err(fail(format!(
                "{} arguments for {} parameters",
                k.args.len(),
                k.params.len()
            )));
        }
        check_overlaps(k).map_err(fail)?;
        let object = self
            .modules
            .get(k.module)
            .ok_or_else(|| fail(format!("module {} was not built", k.module)))?
            .clone();
        // Arguments at the same address are one allocation in the runner.
        let mut alias = vec![None; k.args.len()];
        for i in 0..k.args.len() {
            alias[i] = (0..i)
                .find(|&j| alias[j].is_none() && k.args[j] == k.args[i])
                .map(|j| j as u32);
        }
        let reads = |i: usize| {
            (0..k.args.len()).any(|j| (j == i || alias[j] == Some(i as u32)) && k.params[j].access == ParamAccess::Read)
        };
        let mut args = Vec::with_capacity(k.args.len());
        for (i, ((&addr, &bytes), p)) in k.args.iter().zip(&k.arg_bytes).zip(&k.params).enumerate() {
            let data = if alias[i].is_none() && reads(i) {
                Some(mem.bytes(addr, bytes).map_err(&fail)?)
            } else {
                None
            };
            args.push(RunnerArg {
                bytes,
                read: p.access == ParamAccess::Read,
                write: p.access == ParamAccess::Write,
                alias: alias[i],
                data,
            });
        }
        let shape = self.opts.shape(k.grid, k.block, k.shared_mem_bytes);
        let result = lock(&self.runner).launch_object(&object, &shape, &args);
        let written = match result {
            Ok(w) => w,
            Err(Failure::Reported(m)) | Err(Failure::Died(m)) => {
                return Err(fail(format!("{m}\n{}", self.describe_args(k))));
            }
        };
        let mut w = written.into_iter();
        for i in 0..k.args.len() {
            let writes = alias[i].is_none()
                && (0..k.args.len())
                    .any(|j| (j == i || alias[j] == Some(i as u32)) && k.params[j].access == ParamAccess::Write);
            if writes {
                let bytes = w
                    .next()
                    .ok_or_else(|| fail("the runner returned too few outputs".into()))?;
                mem.write_bytes(k.args[i], &bytes).map_err(|e| fail(e.to_string()))?;
            }
        }
        Ok(())
    }

    /// `argument i = pN: buffer (read|write, bytes at addr)`, one per line.
    fn describe_args(&self, k: &KernelLaunch) -> String {
        let mut s = String::from("arguments:");
        for (i, (p, a)) in k.params.iter().zip(&k.args).enumerate() {
            let buffer = match p.target {
                ParamTarget::Buffer(b) => match self.program.buffers.get(b.index()).and_then(|x| x.name.as_deref()) {
                    Some(n) => format!("b{} \"{n}\"", b.0),
                    None => format!("b{}", b.0),
                },
                ParamTarget::GemmScratch => "the GEMM's scratch".to_string(),
            };
            let access = if p.access == ParamAccess::Read { "read" } else { "write" };
            s.push_str(&format!(
                "\n  argument {i} = p{i}: {buffer} ({access}, {} {} bytes at {a})",
                p.dtype,
                k.arg_bytes.get(i).copied().unwrap_or(0)
            ));
        }
        s
    }
}

fn lock(r: &Mutex<Runner>) -> std::sync::MutexGuard<'_, Runner> {
    r.lock().unwrap_or_else(|p| p.into_inner())
}

/// Run `compiled` once through cuda-sim.
pub fn run_sim(
    compiled: &Compiled,
    inputs: &HashMap<String, Tensor>,
    opts: &SimOptions,
) -> Result<Vec<(String, Tensor)>, CudaError> {
    SimSession::new(compiled, opts)?.run(compiled.graph.weights(), inputs)
}

/// One argument of [`run_kernel_source`]: its bytes (the initial contents when the
/// kernel reads it; the result when it writes it), or the same allocation as an earlier
/// argument (an in-place pair).
#[derive(Clone, Debug, Default)]
pub struct SimArg {
    pub data: Vec<u8>,
    pub read: bool,
    pub write: bool,
    /// This argument is argument `alias` (which must come earlier and not be an alias).
    pub alias: Option<usize>,
}

impl SimArg {
    pub fn input(data: Vec<u8>) -> SimArg {
        SimArg {
            data,
            read: true,
            ..SimArg::default()
        }
    }

    pub fn output(bytes: usize) -> SimArg {
        SimArg {
            data: vec![0; bytes],
            write: true,
            ..SimArg::default()
        }
    }
}

/// Run one hand-written (or edited) kernel: `source` with `entry`, `grid` x `block`
/// threads, pointer arguments as given; written arguments come back in `args`.
#[allow(clippy::too_many_arguments)]
pub fn run_kernel_source(
    name: &str,
    source: &str,
    entry: &str,
    grid: u32,
    block: u32,
    dyn_smem: u32,
    args: &mut [SimArg],
    opts: &SimOptions,
) -> Result<(), SimError> {
    let compiler = build::find_compiler()?;
    let dir = build::cache_dir(opts.cache_dir.as_deref());
    let (runner_path, objects) =
        build::build_all(&compiler, opts.sanitize, &dir, &[(name, source, entry)], opts.jobs())?;
    let runner = runner::shared(&runner_path, opts.sanitize, opts.launch_timeout).map_err(SimError::Runner)?;
    let mut runner = lock(&runner);
    let fail = |message: String| SimError::Kernel {
        step: 0,
        kernel: name.to_string(),
        grid,
        block,
        message,
    };
    for (i, a) in args.iter().enumerate() {
        if let Some(j) = a.alias {
            if j >= i || args[j].alias.is_some() {
                return Err(fail(format!(
                    "argument {i} aliases argument {j}, which is not an earlier plain one"
                )));
            }
        }
    }
    let group_reads = |i: usize| {
        args.iter()
            .enumerate()
            .any(|(j, b)| (j == i || b.alias == Some(i)) && b.read)
    };
    let group_writes = |i: usize| {
        args.iter()
            .enumerate()
            .any(|(j, b)| (j == i || b.alias == Some(i)) && b.write)
    };
    let rargs: Vec<RunnerArg> = args
        .iter()
        .enumerate()
        .map(|(i, a)| {
            let leader = a.alias.map_or(a, |j| &args[j]);
            RunnerArg {
                bytes: leader.data.len() as u64,
                read: a.read,
                write: a.write,
                alias: a.alias.map(|j| j as u32),
                data: (a.alias.is_none() && group_reads(i)).then_some(a.data.as_slice()),
            }
        })
        .collect();
    let out = runner
        .launch_object(&objects[0], &opts.shape(grid, block, dyn_smem), &rargs)
        .map_err(|f| match f {
            Failure::Reported(m) | Failure::Died(m) => fail(m),
        })?;
    let writes: Vec<bool> = (0..args.len())
        .map(|i| args[i].alias.is_none() && group_writes(i))
        .collect();
    let mut out = out.into_iter();
    for (a, w) in args.iter_mut().zip(writes) {
        if w {
            a.data = out
                .next()
                .ok_or_else(|| fail("the runner returned too few outputs".into()))?;
        }
    }
    Ok(())
}
