//! The performance model's counts: every generated kernel of a launch list run in
//! cuda-sim's counting build ([`Sanitize::Count`]) over a sample of its blocks, on
//! zeroed arguments; cuBLASLt GEMMs described by their shapes. What the model makes of
//! them is `graphc_compiler::perf`.

use std::collections::HashMap;

use graphc_compiler::codegen::{self, ParamAccess, ParamTarget};
use graphc_compiler::kernel::{KernelKind, Program};
use graphc_compiler::perf::{self, GemmShape, GpuSpec, KernelCounters, LaunchInput, LaunchWork, Resources, Unit};
use graphc_compiler::{nvrtc, Compiled};
use graphc_ir::{DType, Op};

use super::super::launch::{DeviceInfo, GemmLaunch, KernelLaunch, Launch};
use super::super::CudaError;
use super::runner::{Failure, RunnerArg};
use super::{lock, Sanitize, SimOptions, SimSession};

/// How the counted blocks are chosen (for the report).
pub const SAMPLING: &str = "the first, middle and last block of each grid (the grid is homogeneous), \
                            on zeroed arguments but gather and scatter indices, spread over their range; \
                            identical launches counted once";

/// The launch limits of the GPU the model describes.
pub fn device_of(gpu: &GpuSpec) -> DeviceInfo {
    match gpu.name {
        "h200" => DeviceInfo::h200(),
        "rtx4090d" => DeviceInfo::rtx_4090d(),
        _ => DeviceInfo {
            max_shared_per_block_optin: gpu.shared_per_block,
            ..DeviceInfo::reference(gpu.full_name, gpu.arch, gpu.sms, gpu.dram_bytes)
        },
    }
}

/// A GEMM launch as the model's shape.
fn gemm_shape(g: &GemmLaunch) -> GemmShape {
    let lt = &g.lt;
    let unit = match lt.dtype {
        DType::BF16 | DType::F16 => Unit::Tensor16,
        DType::F64 => Unit::CudaF64,
        _ => Unit::CudaF32,
    };
    let elems = lt.m * lt.k + lt.k * lt.n + lt.m * lt.n * (1 + u64::from(lt.c.is_some()));
    GemmShape {
        m: lt.m,
        n: lt.n,
        k: lt.k,
        batch: lt.batch,
        unit,
        bytes: elems * lt.batch.max(1) * lt.dtype.size_bytes() as u64,
    }
}

/// The index operands of a gather or scatter kernel, spread over the extent they
/// index (`(hi, width)` per argument; `(0, 0)`: zeros): with every index 0, one sampled
/// block would get all the work of a data-dependent kernel and the others none.
fn index_fills(program: &Program, k: &KernelLaunch) -> Vec<(u64, u32)> {
    let mut fills = vec![(0, 0); k.params.len()];
    let Some(KernelKind::Op(o)) = program.kernels.get(k.step).map(|x| &x.kind) else {
        return fills;
    };
    let extent = match (&o.op, o.inputs.first()) {
        (Op::ScatterAdd { size, .. }, _) => *size,
        (Op::Gather { axis }, Some((_, table))) => table.shape.dims().get(*axis).copied().unwrap_or(0),
        _ => return fills,
    };
    let Some((index, ty)) = o.inputs.get(1) else {
        return fills;
    };
    let width = match ty.dtype {
        DType::I64 => 8,
        DType::I32 => 4,
        _ => return fills,
    };
    for (f, p) in fills.iter_mut().zip(&k.params) {
        if p.target == ParamTarget::Buffer(index.buffer) {
            *f = (extent as u64, width);
        }
    }
    fills
}

impl SimSession {
    /// Count one generated launch over `sample` (a session built with
    /// [`Sanitize::Count`]).
    fn count_launch(&self, k: &KernelLaunch, sample: &[u32]) -> Result<KernelCounters, String> {
        let object = self
            .modules
            .get(k.module)
            .ok_or_else(|| format!("module {} was not built", k.module))?;
        let mut alias = vec![None; k.args.len()];
        for i in 0..k.args.len() {
            alias[i] = (0..i)
                .find(|&j| alias[j].is_none() && k.args[j] == k.args[i])
                .map(|j| j as u32);
        }
        let args: Vec<RunnerArg> = k
            .params
            .iter()
            .zip(&k.arg_bytes)
            .zip(&alias)
            .map(|((p, &bytes), &alias)| RunnerArg {
                bytes,
                read: p.access == ParamAccess::Read,
                write: p.access == ParamAccess::Write,
                alias,
                data: None,
            })
            .collect();
        let fills = index_fills(&self.program, k);
        let shape = self.opts.shape(k.grid, k.block, k.shared_mem_bytes);
        let mut runner = lock(&self.runner);
        runner.revive()?;
        let raw = runner
            .load(object)
            .and_then(|m| runner.count(m, &shape, &args, sample, &fills))
            .map_err(|f| match f {
                Failure::Reported(m) | Failure::Died(m) => m,
            })?;
        KernelCounters::from_raw(&raw, u64::from(k.grid), k.block, k.shared_mem_bytes)
    }

    /// Every launch of the list as the model's input: GEMMs by shape, generated
    /// kernels counted (identical launches once; one that cannot be counted says why).
    pub fn count_launches(&self, resources: &[Option<Resources>]) -> Vec<LaunchInput> {
        let mut seen: HashMap<(usize, u32, u32, u32, Vec<u64>), LaunchWork> = HashMap::new();
        let mut out = Vec::with_capacity(self.plan.launches.len());
        for l in &self.plan.launches {
            let work = match l {
                Launch::Gemm(g) => LaunchWork::Gemm(gemm_shape(g)),
                Launch::Kernel(k) => {
                    let key = (k.module, k.grid, k.block, k.shared_mem_bytes, k.arg_bytes.clone());
                    if let Some(w) = seen.get(&key) {
                        w.clone()
                    } else {
                        let kernel = self.plan.modules.get(k.module).map_or(usize::MAX, |m| m.kernel);
                        let res = resources.get(kernel).copied().flatten().unwrap_or_default();
                        let w = match self.count_launch(k, &KernelCounters::sample(k.grid)) {
                            Ok(counters) => LaunchWork::Counted {
                                counters,
                                resources: res,
                            },
                            Err(m) => LaunchWork::Uncounted(m.lines().next().unwrap_or("").to_string()),
                        };
                        seen.insert(key, w.clone());
                        w
                    }
                }
            };
            out.push(LaunchInput { step: l.step(), work });
        }
        out
    }
}

/// The modeled time of `compiled` on `gpu`: its kernels generated, planned as that
/// GPU's launch list, counted on cuda-sim (built for counting with `opts`' cache and
/// jobs), their registers from NVRTC when it is available.
pub fn model_step(compiled: &Compiled, gpu: &GpuSpec, opts: &SimOptions) -> Result<perf::StepTime, CudaError> {
    let kernels = codegen::generate_all(&compiled.program)?;
    let (resources, registers) = match nvrtc::resources(&kernels, gpu.arch, nvrtc::cache::default_cache_dir()) {
        Ok(r) => (
            r,
            format!("registers and static shared memory from ptxas for {}", gpu.arch),
        ),
        Err(e) => (
            vec![None; kernels.len()],
            format!(
                "occupancy without registers ({})",
                e.to_string().lines().next().unwrap_or("")
            ),
        ),
    };
    let opts = SimOptions {
        device: device_of(gpu),
        sanitize: Sanitize::Count,
        ..opts.clone()
    };
    let session = SimSession::with_kernels(&compiled.program, &compiled.plan, &kernels, &opts)?;
    let launches = session.count_launches(&resources);
    Ok(perf::step_time(
        &compiled.program,
        &launches,
        gpu,
        &format!("{SAMPLING}; {registers}"),
    ))
}

/// One argument of [`count_kernel_source`]: its bytes, and whether the kernel writes it.
#[derive(Clone, Copy, Debug)]
pub struct CountArg {
    pub bytes: u64,
    pub write: bool,
}

/// Count one hand-written kernel (`source`, `entry`) launched as `grid` x `block` with
/// `dyn_smem` bytes of dynamic shared memory, over the blocks of `sample`, its
/// arguments zeroed (the counting build; `opts.sanitize` is ignored).
#[allow(clippy::too_many_arguments)]
pub fn count_kernel_source(
    name: &str,
    source: &str,
    entry: &str,
    grid: u32,
    block: u32,
    dyn_smem: u32,
    args: &[CountArg],
    sample: &[u32],
    opts: &SimOptions,
) -> Result<KernelCounters, super::SimError> {
    let opts = SimOptions {
        sanitize: Sanitize::Count,
        ..opts.clone()
    };
    let compiler = super::build::find_compiler()?;
    let dir = super::build::cache_dir(opts.cache_dir.as_deref());
    let (runner_path, objects) =
        super::build::build_all(&compiler, Sanitize::Count, &dir, &[(name, source, entry)], opts.jobs())?;
    let runner =
        super::runner::shared(&runner_path, Sanitize::Count, opts.launch_timeout).map_err(super::SimError::Runner)?;
    let mut runner = lock(&runner);
    let fail = |message: String| super::SimError::Kernel {
        step: 0,
        kernel: name.to_string(),
        grid,
        block,
        message,
    };
    let rargs: Vec<RunnerArg> = args
        .iter()
        .map(|a| RunnerArg {
            bytes: a.bytes,
            read: !a.write,
            write: a.write,
            alias: None,
            data: None,
        })
        .collect();
    runner.revive().map_err(fail)?;
    let raw = runner
        .load(&objects[0])
        .and_then(|m| runner.count(m, &opts.shape(grid, block, dyn_smem), &rargs, sample, &[]))
        .map_err(|f| match f {
            Failure::Reported(m) | Failure::Died(m) => fail(m),
        })?;
    KernelCounters::from_raw(&raw, u64::from(grid), block, dyn_smem).map_err(fail)
}
