//! [`Session`]: a compiled model loaded onto a CUDA device.

use std::collections::HashMap;
use std::ffi::c_void;
use std::panic::catch_unwind;
use std::sync::Arc;
use std::time::Instant;

use cudarc::cublaslt::result as lt;
use cudarc::cublaslt::sys as lts;
use cudarc::driver::result as drv;
use cudarc::driver::sys;
use cudarc::driver::{CudaContext, CudaFunction, CudaGraph, CudaModule, CudaStream, DriverError};
use cudarc::nvrtc::Ptx;
use serde::{Deserialize, Serialize};

use graphc_compiler::codegen::{self, GemmCompute, GemmEpilogue};
use graphc_compiler::kernel::{BufferKind, Program};
use graphc_compiler::nvrtc::{self, NvrtcOptions, OutputKind};
use graphc_compiler::passes::precision::Precision;
use graphc_compiler::plan::MemoryPlan;
use graphc_compiler::Compiled;
use graphc_ir::{DType, Tensor, TensorData};

use super::launch::{plan_launches, DeviceInfo, DeviceLayout, Launch, LaunchPlan, LtMatmul, LtMatrix, Region};
use super::CudaError;
use crate::kernels::{encode, KernelError};
use crate::{Executor, RunError};

/// How a [`Session`] runs.
#[derive(Clone, Debug)]
pub struct SessionOptions {
    /// CUDA device ordinal.
    pub device: usize,
    /// Capture the launches into a CUDA graph on the first run and replay it after.
    pub cuda_graph: bool,
    /// Let f32 GEMMs use TF32 tensor cores (`CUBLAS_COMPUTE_32F_FAST_TF32`): faster,
    /// about 1e-3 relative error instead of f32's.
    pub tf32: bool,
    /// Synchronize after every launch so a failing kernel is named (slow; for debugging).
    pub sync_each_launch: bool,
    /// NVRTC options (the architecture is replaced by the device's own).
    pub nvrtc: NvrtcOptions,
}

impl Default for SessionOptions {
    fn default() -> Self {
        SessionOptions {
            device: 0,
            cuda_graph: true,
            tf32: false,
            sync_each_launch: false,
            nvrtc: NvrtcOptions::default(),
        }
    }
}

/// Where the device memory goes, checked against the plan at load.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceMemoryReport {
    pub gpu: String,
    pub arch: String,
    pub total_memory: u64,
    /// Free device memory before the session allocated anything.
    pub free_at_load: u64,
    pub arena_bytes: u64,
    pub weights_bytes: u64,
    pub io_bytes: u64,
    pub workspace_bytes: u64,
    /// The four allocations together.
    pub device_bytes: u64,
    /// Pinned host staging for inputs and outputs.
    pub pinned_host_bytes: u64,
    /// What the memory plan said the run needs (weights + inputs + outputs + arena +
    /// workspace, unaligned).
    pub plan_total_bytes: u64,
}

impl DeviceMemoryReport {
    pub fn summary(&self) -> String {
        use graphc_compiler::plan::report::human_bytes as h;
        format!(
            "{} ({}): arena {} + weights {} + io {} + workspace {} = {} on the device (plan: {}), {} free of {} at load; {} pinned host",
            self.gpu,
            self.arch,
            h(self.arena_bytes),
            h(self.weights_bytes),
            h(self.io_bytes),
            h(self.workspace_bytes),
            h(self.device_bytes),
            h(self.plan_total_bytes),
            h(self.free_at_load),
            h(self.total_memory),
            h(self.pinned_host_bytes)
        )
    }
}

/// Whether libcuda can be loaded (without it nothing here can run; never panics).
pub fn driver_available() -> bool {
    // SAFETY: only tries to open the library.
    catch_unwind(|| unsafe { sys::is_culib_present() }).unwrap_or(false)
}

fn cublaslt_available() -> bool {
    // SAFETY: only tries to open the library.
    catch_unwind(|| unsafe { lts::is_culib_present() }).unwrap_or(false)
}

/// Check that `layout` fits in `free` bytes of device memory.
pub fn check_device_memory(layout: &DeviceLayout, free: u64, total: u64, gpu: &str) -> Result<(), CudaError> {
    let asked = layout.total_bytes();
    if asked <= free {
        return Ok(());
    }
    Err(CudaError::OutOfMemory {
        gpu: gpu.to_string(),
        asked,
        free,
        total,
        detail: format!(
            "arena {} + weights {} + io {} + workspace {}",
            layout.arena_bytes, layout.weights_bytes, layout.io_bytes, layout.workspace_bytes
        ),
    })
}

fn code(e: DriverError) -> String {
    match (e.error_name(), e.error_string()) {
        (Ok(n), Ok(s)) => format!("{} ({})", n.to_string_lossy(), s.to_string_lossy()),
        _ => format!("{e:?}"),
    }
}

fn driver(call: &str) -> impl Fn(DriverError) -> CudaError + '_ {
    move |e| CudaError::Driver {
        call: call.to_string(),
        code: code(e),
    }
}

/// One device allocation, freed on drop.
struct DeviceBuffer {
    ptr: sys::CUdeviceptr,
    bytes: u64,
    ctx: Arc<CudaContext>,
}

impl DeviceBuffer {
    fn new(ctx: &Arc<CudaContext>, bytes: u64, what: &str) -> Result<DeviceBuffer, CudaError> {
        let ptr = if bytes == 0 {
            0
        } else {
            let len = usize::try_from(bytes).map_err(|_| CudaError::Driver {
                call: format!("cuMemAlloc ({what})"),
                code: format!("{bytes} bytes do not fit this machine's address space"),
            })?;
            // SAFETY: a plain allocation; its contents are written before they are read.
            unsafe { drv::malloc_sync(len) }.map_err(|e| CudaError::Driver {
                call: format!("cuMemAlloc of {bytes} bytes for the {what}"),
                code: code(e),
            })?
        };
        Ok(DeviceBuffer {
            ptr,
            bytes,
            ctx: ctx.clone(),
        })
    }
}

impl Drop for DeviceBuffer {
    fn drop(&mut self) {
        if self.ptr != 0 {
            let _ = self.ctx.bind_to_thread();
            // SAFETY: allocated by cuMemAlloc in `new`, freed once.
            let _ = unsafe { drv::free_sync(self.ptr) };
        }
    }
}

/// Page-locked host memory, freed on drop.
struct Pinned {
    ptr: *mut u8,
    len: usize,
    ctx: Arc<CudaContext>,
}

impl Pinned {
    fn new(ctx: &Arc<CudaContext>, len: usize, what: &str) -> Result<Pinned, CudaError> {
        let ptr = if len == 0 {
            std::ptr::null_mut()
        } else {
            // SAFETY: a plain page-locked allocation, written before it is read.
            unsafe { drv::malloc_host(len, 0) }.map_err(|e| CudaError::Driver {
                call: format!("cuMemHostAlloc of {len} bytes for the {what}"),
                code: code(e),
            })? as *mut u8
        };
        Ok(Pinned {
            ptr,
            len,
            ctx: ctx.clone(),
        })
    }

    fn slice(&self) -> &[u8] {
        if self.len == 0 {
            return &[];
        }
        // SAFETY: `len` bytes allocated in `new`, alive until drop.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }

    fn slice_mut(&mut self) -> &mut [u8] {
        if self.len == 0 {
            return &mut [];
        }
        // SAFETY: as above; `&mut self` makes this the only reference.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }
}

impl Drop for Pinned {
    fn drop(&mut self) {
        if !self.ptr.is_null() {
            let _ = self.ctx.bind_to_thread();
            // SAFETY: allocated by cuMemHostAlloc in `new`, freed once.
            let _ = unsafe { drv::free_host(self.ptr as *mut c_void) };
        }
    }
}

/// A CUDA event, destroyed on drop.
struct Event(sys::CUevent);

impl Event {
    fn new() -> Result<Event, CudaError> {
        drv::event::create(sys::CUevent_flags::CU_EVENT_DEFAULT)
            .map(Event)
            .map_err(driver("cuEventCreate"))
    }

    fn record(&self, stream: &CudaStream) -> Result<(), CudaError> {
        // SAFETY: both handles are live.
        unsafe { drv::event::record(self.0, stream.cu_stream()) }.map_err(driver("cuEventRecord"))
    }

    fn ms_since(&self, start: &Event) -> Result<f32, CudaError> {
        // SAFETY: both events are live and recorded.
        unsafe { drv::event::elapsed(start.0, self.0) }.map_err(|e| CudaError::Async {
            at: "cuEventElapsedTime".to_string(),
            code: code(e),
        })
    }
}

impl Drop for Event {
    fn drop(&mut self) {
        // SAFETY: created in `new`, destroyed once.
        let _ = unsafe { drv::event::destroy(self.0) };
    }
}

/// The cuBLASLt handle.
struct LtHandle(lts::cublasLtHandle_t);

impl Drop for LtHandle {
    fn drop(&mut self) {
        // SAFETY: created by cublasLtCreate, destroyed once, after every descriptor.
        let _ = unsafe { lt::destroy_handle(self.0) };
    }
}

/// One GEMM's descriptors and algorithm, chosen at load.
struct PreparedGemm {
    desc: lts::cublasLtMatmulDesc_t,
    layouts: [lts::cublasLtMatrixLayout_t; 4],
    algo: lts::cublasLtMatmulAlgo_t,
    a: u64,
    b: u64,
    c: u64,
    d: u64,
    /// alpha and beta, as f32 or f64 (the scale type).
    alpha: [u8; 8],
    beta: [u8; 8],
}

impl Drop for PreparedGemm {
    fn drop(&mut self) {
        // SAFETY: created in `prepare_gemm`, destroyed once.
        unsafe {
            for l in self.layouts {
                if !l.is_null() {
                    let _ = lt::destroy_matrix_layout(l);
                }
            }
            if !self.desc.is_null() {
                let _ = lt::destroy_matmul_desc(self.desc);
            }
        }
    }
}

/// What one launch needs at run time.
enum Prepared {
    Kernel {
        function: usize,
        grid: u32,
        block: u32,
        smem: u32,
        args: Vec<u64>,
    },
    Gemm(Box<PreparedGemm>),
}

/// Options of [`Session::bench`].
#[derive(Clone, Copy, Debug)]
pub struct BenchOptions {
    pub warmup: usize,
    pub iters: usize,
    /// Also time every launch (without the CUDA graph: events between launches).
    pub per_kernel: bool,
}

/// One launch's median time.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct KernelTiming {
    pub step: usize,
    pub name: String,
    /// `gemm` or `kernel`.
    pub kind: String,
    pub median_ms: f64,
}

/// Timings of [`Session::bench`]: CUDA-event times of whole runs (inputs already on
/// the device), in milliseconds.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct BenchResult {
    pub times_ms: Vec<f64>,
    pub median_ms: f64,
    pub min_ms: f64,
    pub max_ms: f64,
    pub graph: bool,
    pub per_kernel: Vec<KernelTiming>,
}

fn median(v: &mut [f64]) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(|a, b| a.total_cmp(b));
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// A compiled model loaded onto a CUDA device. Fields drop in order: the graph and
/// cuBLASLt state before the modules, the memory, the stream and the context.
pub struct Session {
    graph: Option<CudaGraph>,
    graph_error: Option<String>,
    prepared: Vec<Prepared>,
    lt: Option<LtHandle>,
    functions: Vec<CudaFunction>,
    _modules: Vec<Arc<CudaModule>>,
    launch_plan: LaunchPlan,
    program: Program,
    memory: DeviceMemoryReport,
    options: SessionOptions,
    /// Pinned host staging of the inputs (the io region's first `inputs_end` bytes).
    pinned_in: Pinned,
    /// Pinned host staging of the outputs, each at its offset here.
    pinned_out: Pinned,
    out_offsets: Vec<usize>,
    arena: DeviceBuffer,
    weights: DeviceBuffer,
    io: DeviceBuffer,
    workspace: DeviceBuffer,
    compile_ms: f64,
    load_ms: f64,
    stream: Arc<CudaStream>,
    ctx: Arc<CudaContext>,
}

/// The device's properties.
fn device_info(ctx: &Arc<CudaContext>) -> Result<DeviceInfo, CudaError> {
    use sys::CUdevice_attribute as A;
    let attr = |a: A, what: &str| -> Result<u32, CudaError> {
        ctx.attribute(a)
            .map(|v| v.max(0) as u32)
            .map_err(|e| CudaError::Driver {
                call: format!("cuDeviceGetAttribute({what})"),
                code: code(e),
            })
    };
    let (major, minor) = ctx
        .compute_capability()
        .map_err(driver("cuDeviceGetAttribute(compute capability)"))?;
    Ok(DeviceInfo {
        name: ctx.name().map_err(driver("cuDeviceGetName"))?,
        arch: format!("sm_{major}{minor}"),
        sm_count: attr(A::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, "SM count")?,
        max_threads_per_block: attr(A::CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK, "max threads per block")?,
        max_shared_per_block: attr(
            A::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK,
            "shared memory per block",
        )?,
        max_shared_per_block_optin: attr(
            A::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN,
            "opt-in shared memory per block",
        )?,
        max_grid_x: attr(A::CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X, "max grid x")?,
        total_memory: ctx.total_mem().map_err(driver("cuDeviceTotalMem"))? as u64,
    })
}

/// Open device `ordinal`: a clear error when there is no driver or no such GPU.
fn open_device(ordinal: usize) -> Result<Arc<CudaContext>, CudaError> {
    if !driver_available() {
        return Err(CudaError::NoDriver(
            "libcuda.so cannot be loaded (no NVIDIA driver on this machine)".to_string(),
        ));
    }
    let r = catch_unwind(|| -> Result<Arc<CudaContext>, CudaError> {
        if let Err(e) = drv::init() {
            return Err(if e.0 == sys::cudaError_enum::CUDA_ERROR_NO_DEVICE {
                CudaError::NoDevice("the driver reports no CUDA-capable GPU".to_string())
            } else {
                CudaError::NoDevice(format!("cuInit failed: {}", code(e)))
            });
        }
        let count = CudaContext::device_count().map_err(driver("cuDeviceGetCount"))?;
        if count <= 0 {
            return Err(CudaError::NoDevice(
                "the driver reports no CUDA-capable GPU".to_string(),
            ));
        }
        if ordinal >= count as usize {
            return Err(CudaError::NoDevice(format!(
                "device {ordinal} was asked for, but there {} {count}",
                if count == 1 { "is" } else { "are" }
            )));
        }
        CudaContext::new(ordinal).map_err(driver("creating the context (cuDevicePrimaryCtxRetain)"))
    });
    r.unwrap_or_else(|_| {
        Err(CudaError::NoDriver(
            "libcuda lacks a function graphc needs (driver too old?)".to_string(),
        ))
    })
}

fn lt_dtype(d: DType) -> Result<lts::cudaDataType, String> {
    Ok(match d {
        DType::F32 => lts::cudaDataType::CUDA_R_32F,
        DType::F16 => lts::cudaDataType::CUDA_R_16F,
        DType::BF16 => lts::cudaDataType::CUDA_R_16BF,
        DType::F64 => lts::cudaDataType::CUDA_R_64F,
        other => return Err(format!("cuBLASLt GEMM of {other}")),
    })
}

/// Largest power of two (up to 256) dividing `addr`.
fn alignment(addr: u64) -> u32 {
    if addr == 0 {
        256
    } else {
        (1u64 << addr.trailing_zeros().min(8)) as u32
    }
}

impl Session {
    /// Load `model` onto the GPU: generate and compile its kernels for the device's
    /// architecture, allocate the arena, weights, I/O and workspace (after checking
    /// they fit in free memory), upload the weights and prepare every GEMM.
    pub fn new(model: &Compiled, options: SessionOptions) -> Result<Session, CudaError> {
        Session::with_plan(model, &model.plan, options)
    }

    /// [`Session::new`] with another memory plan of `model.program`.
    pub fn with_plan(model: &Compiled, plan: &MemoryPlan, options: SessionOptions) -> Result<Session, CudaError> {
        let start = Instant::now();
        let ctx = open_device(options.device)?;
        let info = device_info(&ctx)?;
        let program = &model.program;
        let kernels = codegen::generate_all(program)?;
        let launch_plan = plan_launches(program, plan, &kernels, &info)?;
        let layout = &launch_plan.layout;

        let (free, total) = ctx.mem_get_info().map_err(driver("cuMemGetInfo"))?;
        check_device_memory(layout, free as u64, total as u64, &info.name)?;
        if launch_plan.gemm_count() > 0 && !cublaslt_available() {
            return Err(CudaError::NoCublasLt("libcublasLt.so cannot be loaded".to_string()));
        }

        // Kernels: a cubin for this device's architecture, one per distinct entry.
        let compile_start = Instant::now();
        let nv = NvrtcOptions {
            arch: info.arch.clone(),
            output: OutputKind::Cubin,
            ..options.nvrtc.clone()
        };
        let to_compile: Vec<_> = launch_plan.modules.iter().map(|m| kernels[m.kernel].clone()).collect();
        let images = nvrtc::compile(&to_compile, &nv)?;
        let compile_ms = compile_start.elapsed().as_secs_f64() * 1e3;
        let mut modules = Vec::with_capacity(images.len());
        let mut functions = Vec::with_capacity(images.len());
        for (m, img) in launch_plan.modules.iter().zip(images) {
            let err = |call: &str, e: DriverError| CudaError::Kernel {
                step: m.kernel,
                kernel: program.kernels[m.kernel].name.clone(),
                call: format!("{call} ({})", m.entry),
                code: code(e),
            };
            let module = ctx
                .load_module(Ptx::from_binary(img.image))
                .map_err(|e| err("cuModuleLoadData", e))?;
            let f = module
                .load_function(&m.entry)
                .map_err(|e| err("cuModuleGetFunction", e))?;
            let smem = kernels[m.kernel].launch.shared_mem_bytes;
            if smem > info.max_shared_per_block {
                f.set_attribute(
                    sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                    smem as i32,
                )
                .map_err(|e| err("cuFuncSetAttribute(max dynamic shared memory)", e))?;
            }
            modules.push(module);
            functions.push(f);
        }

        let stream = ctx.new_stream().map_err(driver("cuStreamCreate"))?;
        let arena = DeviceBuffer::new(&ctx, layout.arena_bytes, "arena")?;
        let weights = DeviceBuffer::new(&ctx, layout.weights_bytes, "weights")?;
        let io = DeviceBuffer::new(&ctx, layout.io_bytes, "inputs and outputs")?;
        let workspace = DeviceBuffer::new(&ctx, layout.workspace_bytes, "cuBLASLt workspace")?;
        let pinned_in = Pinned::new(&ctx, layout.inputs_end as usize, "input staging")?;
        let mut out_offsets = Vec::with_capacity(layout.outputs.len());
        let mut out_len = 0usize;
        for o in &layout.outputs {
            out_offsets.push(out_len);
            out_len += (o.bytes as usize).div_ceil(64) * 64;
        }
        let pinned_out = Pinned::new(&ctx, out_len, "output staging")?;

        let base = |r: Region| match r {
            Region::Arena => arena.ptr,
            Region::Weights => weights.ptr,
            Region::Io => io.ptr,
            Region::Workspace => workspace.ptr,
        };

        // Poison the arena (NaN bytes) so a read of unwritten memory shows, then
        // upload weights and constants once.
        if arena.bytes > 0 {
            // SAFETY: the whole allocation.
            unsafe { drv::memset_d8_sync(arena.ptr, 0xFF, arena.bytes as usize) }.map_err(driver("cuMemsetD8"))?;
        }
        let named = model.graph.weights();
        for u in &layout.uploads {
            let buf = &program.buffers[u.buffer as usize];
            let t = match &buf.kind {
                BufferKind::Weight { name } => named.get(name).ok_or_else(|| KernelError::MissingWeight {
                    name: name.clone(),
                    buffer: u.buffer,
                })?,
                BufferKind::Constant { value } => value,
                _ => continue,
            };
            if t.ty() != buf.ty {
                return Err(KernelError::Buffer {
                    buffer: u.buffer,
                    message: format!("the weight is {} but the buffer is {}", t.ty(), buf.ty),
                }
                .into());
            }
            let bytes = t.data().to_le_bytes();
            // SAFETY: `bytes.len() == u.bytes` lies inside the weights allocation.
            unsafe { drv::memcpy_htod_sync(weights.ptr + u.offset, &bytes) }
                .map_err(driver("cuMemcpyHtoD (weights)"))?;
        }

        // cuBLASLt: one handle; each GEMM's descriptors and algorithm chosen now.
        let lt_handle = if launch_plan.gemm_count() > 0 {
            Some(LtHandle(
                lt::create_handle().map_err(|e| CudaError::NoCublasLt(format!("cublasLtCreate: {e}")))?,
            ))
        } else {
            None
        };
        let mut prepared = Vec::with_capacity(launch_plan.launches.len());
        for l in &launch_plan.launches {
            prepared.push(match l {
                Launch::Kernel(k) => Prepared::Kernel {
                    function: k.module,
                    grid: k.grid,
                    block: k.block,
                    smem: k.shared_mem_bytes,
                    args: k.args.iter().map(|a| base(a.region) + a.offset).collect(),
                },
                Launch::Gemm(g) => {
                    let handle = lt_handle.as_ref().map(|h| h.0).unwrap_or(std::ptr::null_mut());
                    let tf32 = options.tf32 || model.precision.precision == Precision::Tf32;
                    let p = prepare_gemm(handle, &g.lt, tf32, layout.workspace_bytes, &base).map_err(|(call, e)| {
                        CudaError::Kernel {
                            step: g.step,
                            kernel: g.kernel.clone(),
                            call,
                            code: e,
                        }
                    })?;
                    Prepared::Gemm(Box::new(p))
                }
            });
        }
        ctx.synchronize().map_err(|e| CudaError::Async {
            at: "loading the model".to_string(),
            code: code(e),
        })?;

        let memory = DeviceMemoryReport {
            gpu: info.name.clone(),
            arch: info.arch.clone(),
            total_memory: total as u64,
            free_at_load: free as u64,
            arena_bytes: layout.arena_bytes,
            weights_bytes: layout.weights_bytes,
            io_bytes: layout.io_bytes,
            workspace_bytes: layout.workspace_bytes,
            device_bytes: layout.total_bytes(),
            pinned_host_bytes: (pinned_in.len + pinned_out.len) as u64,
            plan_total_bytes: plan.total_bytes,
        };
        Ok(Session {
            graph: None,
            graph_error: None,
            prepared,
            lt: lt_handle,
            functions,
            _modules: modules,
            program: program.clone(),
            memory,
            options,
            pinned_in,
            pinned_out,
            out_offsets,
            arena,
            weights,
            io,
            workspace,
            compile_ms,
            load_ms: start.elapsed().as_secs_f64() * 1e3,
            launch_plan,
            stream,
            ctx,
        })
    }

    pub fn device(&self) -> &DeviceInfo {
        &self.launch_plan.device
    }

    pub fn launch_plan(&self) -> &LaunchPlan {
        &self.launch_plan
    }

    pub fn memory(&self) -> &DeviceMemoryReport {
        &self.memory
    }

    /// Milliseconds NVRTC took (or the cache) at load, and the whole load.
    pub fn load_times_ms(&self) -> (f64, f64) {
        (self.compile_ms, self.load_ms)
    }

    /// Whether runs replay a CUDA graph (false with `cuda_graph: false`, or after a
    /// capture failed: see [`Session::graph_error`]).
    pub fn uses_graph(&self) -> bool {
        self.options.cuda_graph
    }

    /// Run on named inputs (each with its input's exact type); returns the named
    /// outputs in order. The first run with CUDA graphs on runs the launches once, then
    /// captures them; this and every later run replays the graph.
    pub fn run(&mut self, inputs: &HashMap<String, Tensor>) -> Result<Vec<(String, Tensor)>, CudaError> {
        self.upload_inputs(inputs)?;
        self.forward()?;
        self.download_outputs()
    }

    /// Copy inputs into pinned staging and on to the device (asynchronously).
    fn upload_inputs(&mut self, inputs: &HashMap<String, Tensor>) -> Result<(), CudaError> {
        self.ctx.bind_to_thread().map_err(driver("cuCtxSetCurrent"))?;
        let layout = &self.launch_plan.layout;
        for x in &layout.inputs {
            let t = inputs
                .get(&x.name)
                .ok_or_else(|| KernelError::MissingInput(x.name.clone()))?;
            if t.ty() != x.ty {
                return Err(KernelError::InputType {
                    name: x.name.clone(),
                    expected: x.ty.clone(),
                    got: t.ty(),
                }
                .into());
            }
        }
        let mut extra: Vec<&String> = inputs
            .keys()
            .filter(|k| !layout.inputs.iter().any(|x| &x.name == *k))
            .collect();
        extra.sort();
        if let Some(name) = extra.first() {
            return Err(KernelError::UnknownInput((*name).clone()).into());
        }
        // The previous run's copies out of staging are complete (run() synchronizes).
        let staging = self.pinned_in.slice_mut();
        for x in &layout.inputs {
            let t = &inputs[&x.name];
            let lo = x.addr.offset as usize;
            encode(t.data(), &mut staging[lo..lo + x.bytes as usize]);
        }
        if !staging.is_empty() {
            // SAFETY: pinned source of `inputs_end` bytes; the io allocation is larger.
            unsafe { drv::memcpy_htod_async(self.io.ptr, self.pinned_in.slice(), self.stream.cu_stream()) }
                .map_err(driver("cuMemcpyHtoDAsync (inputs)"))?;
        }
        Ok(())
    }

    /// Copy outputs back through pinned staging, wait, decode.
    fn download_outputs(&mut self) -> Result<Vec<(String, Tensor)>, CudaError> {
        let layout = &self.launch_plan.layout;
        let base = |r: Region| match r {
            Region::Arena => self.arena.ptr,
            Region::Weights => self.weights.ptr,
            Region::Io => self.io.ptr,
            Region::Workspace => self.workspace.ptr,
        };
        let out = self.pinned_out.slice_mut();
        for (o, &off) in layout.outputs.iter().zip(&self.out_offsets) {
            if o.bytes == 0 {
                continue;
            }
            let dst = &mut out[off..off + o.bytes as usize];
            // SAFETY: pinned destination of exactly the tensor's bytes.
            unsafe { drv::memcpy_dtoh_async(dst, base(o.addr.region) + o.addr.offset, self.stream.cu_stream()) }
                .map_err(driver("cuMemcpyDtoHAsync (outputs)"))?;
        }
        self.stream.synchronize().map_err(|e| CudaError::Async {
            at: "the end of the run".to_string(),
            code: code(e),
        })?;
        let out = self.pinned_out.slice();
        let mut result = Vec::with_capacity(layout.outputs.len());
        for (o, &off) in layout.outputs.iter().zip(&self.out_offsets) {
            let n = o.ty.numel();
            let t = TensorData::from_le_bytes(o.ty.dtype, &out[off..off + o.bytes as usize], n)
                .and_then(|d| Tensor::new(o.ty.shape.clone(), d).ok())
                .ok_or_else(|| KernelError::Output {
                    name: o.name.clone(),
                    message: format!("cannot decode {}", o.ty),
                })?;
            result.push((o.name.clone(), t));
        }
        Ok(result)
    }

    /// Enqueue one run of the model on the stream (inputs already on the device).
    fn forward(&mut self) -> Result<(), CudaError> {
        if !self.options.cuda_graph {
            return self.enqueue(None);
        }
        if self.graph.is_none() {
            // One plain run first: lazy initialization (module loading, cuBLASLt
            // kernels) happens outside the capture, and errors name their kernel.
            self.enqueue(None)?;
            self.stream.synchronize().map_err(|e| CudaError::Async {
                at: "the run before CUDA graph capture".to_string(),
                code: code(e),
            })?;
            match self.capture() {
                Ok(g) => self.graph = g,
                Err(e) => {
                    // Capture is an optimization: run without it, and say why.
                    self.graph_error = Some(e.to_string());
                    self.options.cuda_graph = false;
                    return self.enqueue(None);
                }
            }
        }
        match &self.graph {
            Some(g) => g.launch().map_err(driver("cuGraphLaunch")),
            None => self.enqueue(None), // nothing was captured (no launches)
        }
    }

    /// Capture the launches into a CUDA graph, instantiate and upload it.
    fn capture(&mut self) -> Result<Option<CudaGraph>, CudaError> {
        self.stream
            .begin_capture(sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
            .map_err(driver("cuStreamBeginCapture"))?;
        let enq = self.enqueue(None);
        let graph = self.stream.end_capture(sys::CUgraphInstantiate_flags(0));
        enq?;
        let graph = graph.map_err(driver("cuStreamEndCapture / cuGraphInstantiate"))?;
        if let Some(g) = &graph {
            g.upload().map_err(driver("cuGraphUpload"))?;
        }
        Ok(graph)
    }

    /// Why CUDA graph capture failed, if it did (the session then launches kernels one
    /// by one).
    pub fn graph_error(&self) -> Option<&str> {
        self.graph_error.as_deref()
    }

    /// Enqueue every launch in order; with `events`, record `events[i]` before launch
    /// `i` and the last one after the last launch.
    fn enqueue(&self, events: Option<&[Event]>) -> Result<(), CudaError> {
        let stream = self.stream.cu_stream();
        for (i, (l, p)) in self.launch_plan.launches.iter().zip(&self.prepared).enumerate() {
            if let Some(ev) = events {
                ev[i].record(&self.stream)?;
            }
            let fail = |call: &str, code: String| CudaError::Kernel {
                step: l.step(),
                kernel: l.kernel().to_string(),
                call: call.to_string(),
                code,
            };
            match p {
                Prepared::Kernel {
                    function,
                    grid,
                    block,
                    smem,
                    args,
                } => {
                    let mut vals = args.clone();
                    let mut params: Vec<*mut c_void> = vals.iter_mut().map(|v| v as *mut u64 as *mut c_void).collect();
                    // SAFETY: the function comes from a loaded module; every parameter
                    // is a device pointer into this session's allocations, with the
                    // extent the launch plan checked.
                    unsafe {
                        drv::launch_kernel(
                            self.functions[*function].cu_function(),
                            (*grid, 1, 1),
                            (*block, 1, 1),
                            *smem,
                            stream,
                            &mut params,
                        )
                    }
                    .map_err(|e| fail("cuLaunchKernel", code(e)))?;
                }
                Prepared::Gemm(g) => {
                    let handle = self.lt.as_ref().map(|h| h.0).unwrap_or(std::ptr::null_mut());
                    // SAFETY: descriptors prepared for these pointers at load; the
                    // workspace is this session's.
                    unsafe {
                        lt::matmul(
                            handle,
                            g.desc,
                            g.alpha.as_ptr() as *const c_void,
                            g.beta.as_ptr() as *const c_void,
                            g.a as *const c_void,
                            g.layouts[0],
                            g.b as *const c_void,
                            g.layouts[1],
                            g.c as *const c_void,
                            g.layouts[2],
                            g.d as *mut c_void,
                            g.layouts[3],
                            &g.algo,
                            self.workspace.ptr as *mut c_void,
                            self.workspace.bytes as usize,
                            stream as lts::cudaStream_t,
                        )
                    }
                    .map_err(|e| fail("cublasLtMatmul", format!("{:?}", e.0)))?;
                }
            }
            if self.options.sync_each_launch {
                self.stream
                    .synchronize()
                    .map_err(|e| fail("the kernel (synchronous launch)", code(e)))?;
            }
        }
        if let Some(ev) = events {
            ev[self.launch_plan.launches.len()].record(&self.stream)?;
        }
        Ok(())
    }

    /// Time whole runs on `inputs` (uploaded once): `warmup` runs, then the median of
    /// `iters` CUDA-event timings; with `per_kernel`, also every launch's median over
    /// `iters` runs without the graph.
    pub fn bench(&mut self, inputs: &HashMap<String, Tensor>, opts: BenchOptions) -> Result<BenchResult, CudaError> {
        self.upload_inputs(inputs)?;
        for _ in 0..opts.warmup.max(1) {
            self.forward()?;
        }
        let sync = |s: &Session, at: &str| {
            s.stream.synchronize().map_err(|e| CudaError::Async {
                at: at.to_string(),
                code: code(e),
            })
        };
        sync(self, "the warm-up runs")?;
        let (start, end) = (Event::new()?, Event::new()?);
        let mut times = Vec::with_capacity(opts.iters);
        for _ in 0..opts.iters.max(1) {
            start.record(&self.stream)?;
            self.forward()?;
            end.record(&self.stream)?;
            sync(self, "a timed run")?;
            times.push(end.ms_since(&start)? as f64);
        }
        let mut per_kernel = Vec::new();
        if opts.per_kernel {
            let n = self.launch_plan.launches.len();
            let events: Vec<Event> = (0..=n).map(|_| Event::new()).collect::<Result<_, _>>()?;
            let mut per: Vec<Vec<f64>> = vec![Vec::new(); n];
            for _ in 0..opts.iters.max(1) {
                self.enqueue(Some(&events))?;
                sync(self, "a per-kernel timed run")?;
                for (i, p) in per.iter_mut().enumerate() {
                    p.push(events[i + 1].ms_since(&events[i])? as f64);
                }
            }
            for (l, mut t) in self.launch_plan.launches.iter().zip(per) {
                per_kernel.push(KernelTiming {
                    step: l.step(),
                    name: l.kernel().to_string(),
                    kind: match l {
                        Launch::Gemm(_) => "gemm".to_string(),
                        Launch::Kernel(_) => "kernel".to_string(),
                    },
                    median_ms: median(&mut t),
                });
            }
        }
        let mut sorted = times.clone();
        let med = median(&mut sorted);
        Ok(BenchResult {
            median_ms: med,
            min_ms: sorted.first().copied().unwrap_or(f64::NAN),
            max_ms: sorted.last().copied().unwrap_or(f64::NAN),
            times_ms: times,
            graph: self.options.cuda_graph,
            per_kernel,
        })
    }

    /// The program this session runs.
    pub fn program(&self) -> &Program {
        &self.program
    }
}

/// Create one GEMM's cuBLASLt descriptors and pick its algorithm. Errors: (call, code).
fn prepare_gemm(
    handle: lts::cublasLtHandle_t,
    g: &LtMatmul,
    tf32: bool,
    workspace_bytes: u64,
    base: &dyn Fn(Region) -> u64,
) -> Result<PreparedGemm, (String, String)> {
    fn e(call: &'static str) -> impl Fn(lt::CublasError) -> (String, String) {
        move |x| (call.to_string(), format!("{:?}", x.0))
    }
    let dt = lt_dtype(g.dtype).map_err(|m| ("cuBLASLt type".to_string(), m))?;
    let (compute, scale) = match g.compute {
        GemmCompute::F64 => (
            lts::cublasComputeType_t::CUBLAS_COMPUTE_64F,
            lts::cudaDataType::CUDA_R_64F,
        ),
        GemmCompute::F32 if tf32 && g.dtype == DType::F32 => (
            lts::cublasComputeType_t::CUBLAS_COMPUTE_32F_FAST_TF32,
            lts::cudaDataType::CUDA_R_32F,
        ),
        GemmCompute::F32 => (
            lts::cublasComputeType_t::CUBLAS_COMPUTE_32F,
            lts::cudaDataType::CUDA_R_32F,
        ),
    };
    let addr = |m: &LtMatrix| base(m.addr.region) + m.addr.offset;
    let mut p = PreparedGemm {
        desc: std::ptr::null_mut(),
        layouts: [std::ptr::null_mut(); 4],
        // SAFETY: a plain-data struct; overwritten by the heuristic below.
        algo: unsafe { std::mem::zeroed() },
        a: addr(&g.a),
        b: addr(&g.b),
        c: g.c.as_ref().map(addr).unwrap_or(addr(&g.d)),
        d: addr(&g.d),
        alpha: [0; 8],
        beta: [0; 8],
    };
    if g.compute == GemmCompute::F64 {
        p.alpha = g.alpha.to_le_bytes();
        p.beta = g.beta.to_le_bytes();
    } else {
        p.alpha[..4].copy_from_slice(&(g.alpha as f32).to_le_bytes());
        p.beta[..4].copy_from_slice(&(g.beta as f32).to_le_bytes());
    }
    p.desc = lt::create_matmul_desc(compute, scale).map_err(e("cublasLtMatmulDescCreate"))?;
    use lts::cublasLtMatmulDescAttributes_t as D;
    // SAFETY: every attribute buffer is a live local of the size passed.
    unsafe {
        let set = |attr: D, ptr: *const c_void, size: usize| {
            lt::set_matmul_desc_attribute(p.desc, attr, ptr, size).map_err(e("cublasLtMatmulDescSetAttribute"))
        };
        let ta: i32 = g.transa as i32;
        let tb: i32 = g.transb as i32;
        set(D::CUBLASLT_MATMUL_DESC_TRANSA, &ta as *const i32 as *const c_void, 4)?;
        set(D::CUBLASLT_MATMUL_DESC_TRANSB, &tb as *const i32 as *const c_void, 4)?;
        let epi = match g.epilogue {
            GemmEpilogue::None => lts::cublasLtEpilogue_t::CUBLASLT_EPILOGUE_DEFAULT,
            GemmEpilogue::Bias => lts::cublasLtEpilogue_t::CUBLASLT_EPILOGUE_BIAS,
            GemmEpilogue::Relu => lts::cublasLtEpilogue_t::CUBLASLT_EPILOGUE_RELU,
            GemmEpilogue::Gelu => lts::cublasLtEpilogue_t::CUBLASLT_EPILOGUE_GELU,
            GemmEpilogue::BiasRelu => lts::cublasLtEpilogue_t::CUBLASLT_EPILOGUE_RELU_BIAS,
            GemmEpilogue::BiasGelu => lts::cublasLtEpilogue_t::CUBLASLT_EPILOGUE_GELU_BIAS,
        };
        set(
            D::CUBLASLT_MATMUL_DESC_EPILOGUE,
            &epi as *const lts::cublasLtEpilogue_t as *const c_void,
            std::mem::size_of::<lts::cublasLtEpilogue_t>(),
        )?;
        if let Some(b) = g.bias {
            let ptr: u64 = base(b.region) + b.offset;
            set(
                D::CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                &ptr as *const u64 as *const c_void,
                8,
            )?;
        }
    }
    let c = g.c.as_ref().unwrap_or(&g.d);
    for (i, m) in [&g.a, &g.b, c, &g.d].into_iter().enumerate() {
        p.layouts[i] = lt::create_matrix_layout(dt, m.rows, m.cols, m.ld).map_err(e("cublasLtMatrixLayoutCreate"))?;
        if g.batch > 1 {
            let count =
                i32::try_from(g.batch).map_err(|_| ("batch count".to_string(), format!("{} batches", g.batch)))?;
            let stride: i64 = m.batch_stride;
            use lts::cublasLtMatrixLayoutAttribute_t as L;
            // SAFETY: live locals of the sizes passed.
            unsafe {
                lt::set_matrix_layout_attribute(
                    p.layouts[i],
                    L::CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT,
                    &count as *const i32 as *const c_void,
                    4,
                )
                .map_err(e("cublasLtMatrixLayoutSetAttribute(batch count)"))?;
                lt::set_matrix_layout_attribute(
                    p.layouts[i],
                    L::CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET,
                    &stride as *const i64 as *const c_void,
                    8,
                )
                .map_err(e("cublasLtMatrixLayoutSetAttribute(batch stride)"))?;
            }
        }
    }
    let pref = lt::create_matmul_pref().map_err(e("cublasLtMatmulPreferenceCreate"))?;
    struct Pref(lts::cublasLtMatmulPreference_t);
    impl Drop for Pref {
        fn drop(&mut self) {
            // SAFETY: created above, destroyed once.
            let _ = unsafe { lt::destroy_matmul_pref(self.0) };
        }
    }
    let pref = Pref(pref);
    use lts::cublasLtMatmulPreferenceAttributes_t as P;
    let ws: u64 = workspace_bytes;
    let aligns = [alignment(p.a), alignment(p.b), alignment(p.c), alignment(p.d)];
    // SAFETY: live locals of the sizes passed.
    unsafe {
        lt::set_matmul_pref_attribute(
            pref.0,
            P::CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
            &ws as *const u64 as *const c_void,
            8,
        )
        .map_err(e("cublasLtMatmulPreferenceSetAttribute(workspace)"))?;
        for (attr, v) in [
            P::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES,
            P::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
            P::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES,
            P::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES,
        ]
        .into_iter()
        .zip(aligns)
        {
            lt::set_matmul_pref_attribute(pref.0, attr, &v as *const u32 as *const c_void, 4)
                .map_err(e("cublasLtMatmulPreferenceSetAttribute(alignment)"))?;
        }
        let h = lt::get_matmul_algo_heuristic(
            handle,
            p.desc,
            p.layouts[0],
            p.layouts[1],
            p.layouts[2],
            p.layouts[3],
            pref.0,
        )
        .map_err(e("cublasLtMatmulAlgoGetHeuristic (no algorithm for this GEMM)"))?;
        p.algo = h.algo;
    }
    Ok(p)
}

/// The [`Executor`] over a [`Session`]: loads the model for each call (use a
/// `Session` directly to run many times).
#[derive(Clone, Debug, Default)]
pub struct CudaExecutor {
    pub options: SessionOptions,
}

impl Executor for CudaExecutor {
    fn run(&self, model: &Compiled, inputs: &HashMap<String, Tensor>) -> Result<Vec<(String, Tensor)>, RunError> {
        let mut s = Session::new(model, self.options.clone())?;
        Ok(s.run(inputs)?)
    }
}
