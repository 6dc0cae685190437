//! From a compiled model to what the GPU does, without a GPU: where every tensor lives
//! in device memory ([`DeviceLayout`]) and the launches, in plan order, with every
//! argument resolved to a region and a byte offset ([`LaunchPlan`]).
//!
//! The [`Session`](super::Session) only transcribes this into driver and cuBLASLt calls,
//! and [`emulate`](mod@super::emulate) runs the very same launch list on the CPU, so the
//! translation (argument offsets, GEMM layouts and transposes, grid sizes, scratch) is
//! tested on machines without a GPU.
//!
//! Device memory is four allocations: the planned arena (every intermediate at its
//! planned offset), the weights (weights and constants, uploaded once), the I/O block
//! (inputs first, then graph outputs) and the cuBLASLt workspace. Every tensor starts on
//! a [`DEVICE_ALIGN`]-byte boundary of its region, and every region is allocated by the
//! driver (256-byte aligned), so the generated kernels' 16-byte vector accesses and
//! cuBLASLt's alignment assumptions hold.

use std::fmt::Write as _;

use serde::{Deserialize, Serialize};

use graphc_compiler::codegen::{CudaKernel, ParamAccess, ParamDesc, ParamTarget};
use graphc_compiler::kernel::{BufferId, BufferKind, Program};
use graphc_compiler::plan::MemoryPlan;
use graphc_ir::TensorType;

use crate::kernels::{validate_plan, KernelError};

mod lt;

pub(crate) use lt::matrix_span;
use lt::{check_gemm_bounds, lt_matmul};
pub use lt::{LtMatmul, LtMatrix};

/// Alignment of every tensor in device memory (bytes).
pub const DEVICE_ALIGN: u64 = 256;

/// One of the session's device allocations.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Region {
    /// The memory plan's arena: every intermediate, GEMM scratch.
    Arena,
    /// Weights and constants, uploaded once.
    Weights,
    /// Inputs (first), then graph outputs; staged through pinned host memory.
    Io,
    /// The cuBLASLt workspace.
    Workspace,
}

impl Region {
    pub const ALL: [Region; 4] = [Region::Arena, Region::Weights, Region::Io, Region::Workspace];

    pub fn name(self) -> &'static str {
        match self {
            Region::Arena => "arena",
            Region::Weights => "weights",
            Region::Io => "io",
            Region::Workspace => "workspace",
        }
    }
}

/// A device address: a byte offset into one of the session's allocations.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct DevAddr {
    pub region: Region,
    pub offset: u64,
}

impl DevAddr {
    pub fn new(region: Region, offset: u64) -> DevAddr {
        DevAddr { region, offset }
    }

    fn plus(self, bytes: u64) -> DevAddr {
        DevAddr {
            region: self.region,
            offset: self.offset + bytes,
        }
    }
}

impl std::fmt::Display for DevAddr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}+{:#x}", self.region.name(), self.offset)
    }
}

/// What the launch translation needs to know about the GPU.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceInfo {
    pub name: String,
    /// `sm_XX` from the compute capability.
    pub arch: String,
    pub sm_count: u32,
    pub max_threads_per_block: u32,
    /// Dynamic shared memory a block may use without opting in.
    pub max_shared_per_block: u32,
    /// With `CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES` set.
    pub max_shared_per_block_optin: u32,
    pub max_grid_x: u32,
    pub total_memory: u64,
}

impl DeviceInfo {
    /// A device described by its architecture and SM count (for planning launches
    /// without a GPU), with the limits every GPU since Volta has.
    pub fn reference(name: &str, arch: &str, sm_count: u32, total_memory: u64) -> DeviceInfo {
        DeviceInfo {
            name: name.to_string(),
            arch: arch.to_string(),
            sm_count,
            max_threads_per_block: 1024,
            max_shared_per_block: 48 << 10,
            max_shared_per_block_optin: 99 << 10,
            max_grid_x: i32::MAX as u32,
            total_memory,
        }
    }

    /// graphc's default target: an RTX 4090D (sm_89, 114 SMs, 24 GiB).
    pub fn rtx_4090d() -> DeviceInfo {
        DeviceInfo::reference("NVIDIA GeForce RTX 4090 D (reference)", "sm_89", 114, 24 << 30)
    }

    /// The lent benchmark GPU: an H200 (sm_90, 132 SMs, 141 GB; 227 KiB shared memory).
    pub fn h200() -> DeviceInfo {
        DeviceInfo {
            max_shared_per_block_optin: 227 << 10,
            ..DeviceInfo::reference("NVIDIA H200 (reference)", "sm_90", 132, 150_754_820_096)
        }
    }
}

/// A weight or constant in the weights region.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Upload {
    pub buffer: u32,
    pub offset: u64,
    pub bytes: u64,
}

/// An input or output tensor and where it lives on the device.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct IoTensor {
    pub name: String,
    pub buffer: u32,
    pub ty: TensorType,
    pub addr: DevAddr,
    pub bytes: u64,
}

/// Where every tensor of a program lives on the device.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceLayout {
    pub arena_bytes: u64,
    pub weights_bytes: u64,
    pub io_bytes: u64,
    pub workspace_bytes: u64,
    /// Weights and constants, in buffer order.
    pub uploads: Vec<Upload>,
    /// Inputs, in `io` from offset 0 to `inputs_end`, in buffer order.
    pub inputs: Vec<IoTensor>,
    pub inputs_end: u64,
    /// Graph outputs by name, in order (a temp output lives in `io` after the inputs;
    /// an output that is an input, weight or constant is read where that lives).
    pub outputs: Vec<IoTensor>,
    /// The device address of every buffer of the program (None: a temp no kernel uses).
    pub buffers: Vec<Option<DevAddr>>,
}

impl IoTensor {
    /// `t` has this input's exact type.
    pub fn check(&self, t: &graphc_ir::Tensor) -> Result<(), KernelError> {
        if t.ty() == self.ty {
            Ok(())
        } else {
            Err(KernelError::InputType {
                name: self.name.clone(),
                expected: self.ty.clone(),
                got: t.ty(),
            })
        }
    }
}

impl DeviceLayout {
    /// The input named `name`.
    pub fn input(&self, name: &str) -> Result<&IoTensor, KernelError> {
        self.inputs
            .iter()
            .find(|x| x.name == name)
            .ok_or_else(|| KernelError::UnknownInput(name.to_string()))
    }

    /// Bytes of one region.
    pub fn region_bytes(&self, r: Region) -> u64 {
        match r {
            Region::Arena => self.arena_bytes,
            Region::Weights => self.weights_bytes,
            Region::Io => self.io_bytes,
            Region::Workspace => self.workspace_bytes,
        }
    }

    /// Device bytes of all four allocations.
    pub fn total_bytes(&self) -> u64 {
        Region::ALL.iter().map(|&r| self.region_bytes(r)).sum()
    }
}

/// A GEMM of the launch list.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct GemmLaunch {
    /// The plan step (kernel index) it belongs to.
    pub step: usize,
    pub kernel: String,
    pub lt: LtMatmul,
}

/// A generated kernel of the launch list.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct KernelLaunch {
    pub step: usize,
    pub kernel: String,
    pub entry: String,
    /// Index into [`LaunchPlan::modules`].
    pub module: usize,
    pub grid: u32,
    pub block: u32,
    pub shared_mem_bytes: u32,
    /// One pointer argument per parameter.
    pub params: Vec<ParamDesc>,
    pub args: Vec<DevAddr>,
    /// Bytes of the tensor each argument points at.
    pub arg_bytes: Vec<u64>,
}

/// One entry of the launch list.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Launch {
    Gemm(GemmLaunch),
    Kernel(KernelLaunch),
}

impl Launch {
    pub fn step(&self) -> usize {
        match self {
            Launch::Gemm(g) => g.step,
            Launch::Kernel(k) => k.step,
        }
    }

    pub fn kernel(&self) -> &str {
        match self {
            Launch::Gemm(g) => &g.kernel,
            Launch::Kernel(k) => &k.kernel,
        }
    }
}

/// A module to load: one per distinct entry (identical kernels share one).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ModuleRef {
    pub entry: String,
    /// The first kernel (index into the program / the CudaKernel list) with this entry.
    pub kernel: usize,
}

/// Everything the GPU does for one run of a program under a memory plan.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LaunchPlan {
    pub device: DeviceInfo,
    pub layout: DeviceLayout,
    pub modules: Vec<ModuleRef>,
    pub launches: Vec<Launch>,
}

impl LaunchPlan {
    pub fn gemm_count(&self) -> usize {
        self.launches.iter().filter(|l| matches!(l, Launch::Gemm(_))).count()
    }

    pub fn kernel_launch_count(&self) -> usize {
        self.launches.len() - self.gemm_count()
    }

    /// The launch list as text: the device line, the counts (launches: cuBLASLt GEMMs
    /// and generated kernels; modules: distinct compiled sources), then one line per
    /// launch, addresses as `region+offset`.
    pub fn describe(&self) -> String {
        format!(
            "{}\n{} launches ({} cuBLASLt GEMMs + {} generated), {} modules\n{}",
            self.describe_device(),
            self.launches.len(),
            self.gemm_count(),
            self.kernel_launch_count(),
            self.modules.len(),
            self.describe_launches()
        )
    }

    /// The device and the four regions, one line.
    pub fn describe_device(&self) -> String {
        let l = &self.layout;
        format!(
            "device {} ({}, {} SMs); regions: arena {} B, weights {} B, io {} B, workspace {} B",
            self.device.name,
            self.device.arch,
            self.device.sm_count,
            l.arena_bytes,
            l.weights_bytes,
            l.io_bytes,
            l.workspace_bytes
        )
    }

    /// One line per launch, addresses as `region+offset`.
    pub fn describe_launches(&self) -> String {
        let mut s = String::new();
        for launch in &self.launches {
            match launch {
                Launch::Gemm(g) => {
                    let lt = &g.lt;
                    let mat = |x: &LtMatrix| {
                        format!(
                            "{} {}x{} ld {}{}",
                            x.addr,
                            x.rows,
                            x.cols,
                            x.ld,
                            if lt.batch > 1 {
                                format!(" bs {}", x.batch_stride)
                            } else {
                                String::new()
                            }
                        )
                    };
                    let _ = write!(
                        s,
                        "{:>3} {} gemm {} m {} n {} k {} batch {} op {}{} alpha {} beta {} epilogue {:?}; A {}; B {}",
                        g.step,
                        g.kernel,
                        lt.dtype,
                        lt.m,
                        lt.n,
                        lt.k,
                        lt.batch,
                        if lt.transa { 'T' } else { 'N' },
                        if lt.transb { 'T' } else { 'N' },
                        lt.alpha,
                        lt.beta,
                        lt.epilogue,
                        mat(&lt.a),
                        mat(&lt.b)
                    );
                    if let Some(c) = &lt.c {
                        let _ = write!(s, "; C {}", mat(c));
                    }
                    if let Some(b) = &lt.bias {
                        let _ = write!(s, "; bias {b}");
                    }
                    if let Some(x) = &lt.aux {
                        let _ = write!(s, "; aux {}", mat(x));
                    }
                    let _ = writeln!(s, "; D {}", mat(&lt.d));
                }
                Launch::Kernel(k) => {
                    let args: Vec<String> = k
                        .args
                        .iter()
                        .zip(&k.params)
                        .map(|(a, p)| {
                            format!(
                                "{}{a}",
                                match p.access {
                                    ParamAccess::Read => "",
                                    ParamAccess::Write => "out ",
                                }
                            )
                        })
                        .collect();
                    let _ = writeln!(
                        s,
                        "{:>3} {} kernel {} grid {} block {} smem {}; {}",
                        k.step,
                        k.kernel,
                        k.entry,
                        k.grid,
                        k.block,
                        k.shared_mem_bytes,
                        args.join(", ")
                    );
                }
            }
        }
        s
    }
}

/// Round `x` up to a multiple of [`DEVICE_ALIGN`].
fn align_up(x: u64) -> u64 {
    x.div_ceil(DEVICE_ALIGN) * DEVICE_ALIGN
}

fn buffer_bytes(program: &Program, id: BufferId) -> Result<u64, KernelError> {
    let buf = program
        .buffers
        .get(id.index())
        .ok_or_else(|| KernelError::Program(format!("buffer b{} does not exist", id.0)))?;
    buf.ty
        .shape
        .checked_numel()
        .and_then(|n| n.checked_mul(buf.ty.dtype.size_bytes()))
        .map(|b| b as u64)
        .ok_or_else(|| KernelError::Program(format!("buffer b{}: {} is too large", id.0, buf.ty)))
}

/// Where every tensor of `program` lives on the device under `plan` (which is checked
/// against the program first, as the CPU executor checks it).
pub fn device_layout(program: &Program, plan: &MemoryPlan) -> Result<DeviceLayout, KernelError> {
    let places = validate_plan(program, plan)?;
    let n = program.buffers.len();
    let mut buffers: Vec<Option<DevAddr>> = vec![None; n];
    for (i, p) in places.iter().enumerate() {
        if let Some(p) = p {
            buffers[i] = Some(DevAddr::new(Region::Arena, p.offset as u64));
        }
    }
    let mut uploads = Vec::new();
    let mut weights_bytes = 0u64;
    let mut inputs = Vec::new();
    let mut io_bytes = 0u64;
    for (i, buf) in program.buffers.iter().enumerate() {
        let id = BufferId(i as u32);
        match &buf.kind {
            BufferKind::Weight { .. } | BufferKind::Constant { .. } => {
                let bytes = buffer_bytes(program, id)?;
                let offset = align_up(weights_bytes);
                weights_bytes = offset + bytes;
                uploads.push(Upload {
                    buffer: i as u32,
                    offset,
                    bytes,
                });
                buffers[i] = Some(DevAddr::new(Region::Weights, offset));
            }
            BufferKind::Input { name } => {
                let bytes = buffer_bytes(program, id)?;
                let offset = align_up(io_bytes);
                io_bytes = offset + bytes;
                let addr = DevAddr::new(Region::Io, offset);
                inputs.push(IoTensor {
                    name: name.clone(),
                    buffer: i as u32,
                    ty: buf.ty.clone(),
                    addr,
                    bytes,
                });
                buffers[i] = Some(addr);
            }
            BufferKind::Temp => {}
        }
    }
    let inputs_end = io_bytes;
    let mut outputs = Vec::new();
    for (name, id) in &program.outputs {
        let buf = program.buffers.get(id.index()).ok_or_else(|| KernelError::Output {
            name: name.clone(),
            message: format!("buffer b{} does not exist", id.0),
        })?;
        let bytes = buffer_bytes(program, *id)?;
        let donated_to = program
            .donated
            .iter()
            .find(|d| d.output == *id)
            .and_then(|d| buffers.get(d.input.index()).copied().flatten());
        let addr = match (buffers[id.index()], donated_to) {
            (Some(a), _) => a,
            // Written over its input's storage (a training step's state).
            (None, Some(a)) => {
                buffers[id.index()] = Some(a);
                a
            }
            (None, None) => {
                let offset = align_up(io_bytes);
                io_bytes = offset + bytes;
                let a = DevAddr::new(Region::Io, offset);
                buffers[id.index()] = Some(a);
                a
            }
        };
        outputs.push(IoTensor {
            name: name.clone(),
            buffer: id.0,
            ty: buf.ty.clone(),
            addr,
            bytes,
        });
    }
    Ok(DeviceLayout {
        arena_bytes: plan.arena_bytes,
        weights_bytes: align_up(weights_bytes),
        io_bytes: align_up(io_bytes),
        workspace_bytes: plan.workspace_bytes,
        uploads,
        inputs,
        inputs_end,
        outputs,
        buffers,
    })
}

/// The launch list of `program` under `plan` on `device`, with `kernels` its generated
/// CUDA kernels (`codegen::generate_all`). Checks, naming the kernel: every argument has
/// a device address and lies inside its region; kernels write only the arena and the
/// outputs; launch shapes are within the device's limits; GEMM matrices lie inside
/// their regions; GEMM scratch is planned with room for it.
pub fn plan_launches(
    program: &Program,
    plan: &MemoryPlan,
    kernels: &[CudaKernel],
    device: &DeviceInfo,
) -> Result<LaunchPlan, KernelError> {
    if kernels.len() != program.kernels.len() {
        return Err(KernelError::Program(format!(
            "{} CUDA kernels for a program of {} kernels",
            kernels.len(),
            program.kernels.len()
        )));
    }
    let layout = device_layout(program, plan)?;
    let mut modules: Vec<ModuleRef> = Vec::new();
    let mut launches = Vec::new();
    for (step, ck) in kernels.iter().enumerate() {
        let name = &program.kernels[step].name;
        let err = |m: String| KernelError::Kernel {
            index: step,
            name: name.clone(),
            message: m,
        };
        let scratch = match plan.steps.get(step).and_then(|s| s.scratch) {
            Some(off) => {
                let bytes = plan
                    .scratch
                    .iter()
                    .find(|s| s.step as usize == step)
                    .map(|s| s.bytes)
                    .unwrap_or(0);
                Some((DevAddr::new(Region::Arena, off), bytes))
            }
            None => None,
        };
        if let Some(g) = &ck.gemm {
            if g.m > 0 && g.n > 0 && g.batch > 0 {
                let lt = lt_matmul(program, &layout, g, scratch).map_err(err)?;
                check_gemm_bounds(&layout, &lt).map_err(err)?;
                launches.push(Launch::Gemm(GemmLaunch {
                    step,
                    kernel: name.clone(),
                    lt,
                }));
            }
        }
        if !ck.has_source() {
            continue;
        }
        let grid = ck.launch.grid.blocks(device.sm_count);
        if grid == 0 {
            continue; // no work
        }
        let block = ck.launch.block;
        if block == 0 || block > device.max_threads_per_block || block % 32 != 0 {
            return Err(err(format!(
                "block of {block} threads (the device allows 32..={} in warps of 32)",
                device.max_threads_per_block
            )));
        }
        if grid > device.max_grid_x {
            return Err(err(format!(
                "grid of {grid} blocks (the device allows {})",
                device.max_grid_x
            )));
        }
        if ck.launch.shared_mem_bytes > device.max_shared_per_block_optin {
            return Err(err(format!(
                "{} bytes of dynamic shared memory (the device allows {})",
                ck.launch.shared_mem_bytes, device.max_shared_per_block_optin
            )));
        }
        let mut args = Vec::with_capacity(ck.params.len());
        let mut arg_bytes = Vec::with_capacity(ck.params.len());
        for (i, p) in ck.params.iter().enumerate() {
            let (addr, bytes) = match p.target {
                ParamTarget::Buffer(b) => {
                    let addr = layout.buffers.get(b.index()).copied().flatten().ok_or_else(|| {
                        err(format!(
                            "parameter {i} is buffer b{}, which has no device address (not planned, not an input, weight or output)",
                            b.0
                        ))
                    })?;
                    (addr, buffer_bytes(program, b)?)
                }
                ParamTarget::GemmScratch => {
                    let (addr, bytes) = scratch.ok_or_else(|| {
                        err(format!(
                            "parameter {i} is the GEMM scratch, but the plan gives step {step} none"
                        ))
                    })?;
                    (addr, bytes)
                }
            };
            let end = addr.offset.checked_add(bytes);
            let region = layout.region_bytes(addr.region);
            if end.is_none_or(|e| e > region) {
                return Err(err(format!(
                    "parameter {i} at {addr} with {bytes} bytes lies past the end of the {region}-byte {} region",
                    addr.region.name()
                )));
            }
            if p.access == ParamAccess::Write {
                let output_area = addr.region == Region::Io && addr.offset >= layout.inputs_end;
                let donated =
                    matches!(p.target, ParamTarget::Buffer(b) if program.donated.iter().any(|d| d.output == b));
                if addr.region != Region::Arena && !output_area && !donated {
                    return Err(err(format!(
                        "parameter {i} writes {addr}, which holds an input, weight or constant"
                    )));
                }
            }
            args.push(addr);
            arg_bytes.push(bytes);
        }
        let module = match modules.iter().position(|m| m.entry == ck.entry) {
            Some(m) => m,
            None => {
                modules.push(ModuleRef {
                    entry: ck.entry.clone(),
                    kernel: step,
                });
                modules.len() - 1
            }
        };
        launches.push(Launch::Kernel(KernelLaunch {
            step,
            kernel: name.clone(),
            entry: ck.entry.clone(),
            module,
            grid,
            block,
            shared_mem_bytes: ck.launch.shared_mem_bytes,
            params: ck.params.clone(),
            args,
            arg_bytes,
        }));
    }
    Ok(LaunchPlan {
        device: device.clone(),
        layout,
        modules,
        launches,
    })
}
