//! [`Session`]: a compiled model loaded onto a CUDA device and run there. Loading
//! takes the backend stages' outputs ([`Kernels`], [`Binary`]; built through
//! `graphc_compiler::pipeline` for the device's own architecture when not given),
//! plans the launches, allocates and fills device memory and prepares every GEMM;
//! running uploads the inputs, enqueues the launches (or replays their CUDA graph) and
//! downloads the outputs. Driver resources are in [`super::driver`], device discovery
//! in [`super::device`], GEMM preparation in [`super::gemm`], benchmarking in
//! [`super::bench`].

use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::Arc;
use std::time::Instant;

use cudarc::cublaslt::result as lt;
use cudarc::cublaslt::sys as lts;
use cudarc::driver::result as drv;
use cudarc::driver::sys;
use cudarc::driver::{CudaContext, CudaFunction, CudaGraph, CudaModule, CudaStream};

use graphc_compiler::kernel::{BufferKind, Program};
use graphc_compiler::nvrtc::{NvrtcOptions, OutputKind};
use graphc_compiler::passes::precision::Precision;
use graphc_compiler::plan::MemoryPlan;
use graphc_compiler::{pipeline, Binary, Compiled, Kernels};
use graphc_ir::{Tensor, TensorData};

use super::device::{check_device_memory, device_info, open_device, DeviceMemoryReport};
use super::driver::{code, driver, load_modules, output_staging, Event, Pinned, Regions};
use super::gemm::{cublaslt_available, prepare_gemm, LtHandle, PreparedGemm};
use super::launch::{plan_launches, DeviceInfo, DeviceLayout, Launch, LaunchPlan, Region};
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

/// A compiled model loaded onto a CUDA device. Fields drop in order: the graph and
/// cuBLASLt state before the modules, the memory, the stream and the context.
pub struct Session {
    graph: Option<CudaGraph>,
    graph_error: Option<String>,
    prepared: Vec<Prepared>,
    lt: Option<LtHandle>,
    functions: Vec<CudaFunction>,
    _modules: Vec<Arc<CudaModule>>,
    pub(super) launch_plan: LaunchPlan,
    program: Program,
    memory: DeviceMemoryReport,
    pub(super) options: SessionOptions,
    /// Pinned host staging of the inputs (the io region's first `inputs_end` bytes).
    pinned_in: Pinned,
    /// Pinned host staging of the outputs, each at its offset here.
    pinned_out: Pinned,
    out_offsets: Vec<usize>,
    /// The arena, weights, io and workspace allocations (dropped in that order).
    regions: Regions,
    compile_ms: f64,
    load_ms: f64,
    pub(super) stream: Arc<CudaStream>,
    ctx: Arc<CudaContext>,
}

impl Session {
    /// Load `model` onto the GPU: generate and compile its kernels for the device's
    /// architecture (the pipeline's codegen and build stages), allocate the arena,
    /// weights, I/O and workspace (after checking they fit in free memory), upload the
    /// weights and prepare every GEMM.
    pub fn new(model: &Compiled, options: SessionOptions) -> Result<Session, CudaError> {
        Session::load(model, &model.plan, None, options)
    }

    /// [`Session::new`] with another memory plan of `model.program`.
    pub fn with_plan(model: &Compiled, plan: &MemoryPlan, options: SessionOptions) -> Result<Session, CudaError> {
        Session::load(model, plan, None, options)
    }

    /// [`Session::new`] with the kernels already generated
    /// ([`graphc_compiler::generate_kernels`]) and built
    /// ([`graphc_compiler::build`]: a cubin for the device's architecture, see
    /// [`super::discover`]): the session only loads and runs them.
    pub fn with_binary(
        model: &Compiled,
        kernels: &Kernels,
        binary: &Binary,
        options: SessionOptions,
    ) -> Result<Session, CudaError> {
        Session::load(model, &model.plan, Some((kernels, binary)), options)
    }

    /// Open the device, plan the launches, check memory, then load the kernels (built
    /// here when `built` is `None`), allocate, upload and prepare.
    fn load(
        model: &Compiled,
        plan: &MemoryPlan,
        built: Option<(&Kernels, &Binary)>,
        options: SessionOptions,
    ) -> Result<Session, CudaError> {
        let start = Instant::now();
        let ctx = open_device(options.device)?;
        let info = device_info(&ctx)?;
        let program = &model.program;
        let generated;
        let kernels = match built {
            Some((kernels, _)) => kernels,
            None => {
                generated = pipeline::generate_kernels(model)?;
                &generated
            }
        };
        let launch_plan = plan_launches(program, plan, kernels, &info)?;
        let layout = &launch_plan.layout;

        let (free, total) = ctx.mem_get_info().map_err(driver("cuMemGetInfo"))?;
        check_device_memory(layout, free as u64, total as u64, &info.name)?;
        if launch_plan.gemm_count() > 0 && !cublaslt_available() {
            return Err(CudaError::NoCublasLt("libcublasLt.so cannot be loaded".to_string()));
        }

        // Kernels: a cubin for this device's architecture, one per distinct entry.
        let built_here;
        let binary = match built {
            Some((_, binary)) => binary,
            None => {
                let nv = NvrtcOptions {
                    arch: info.arch.clone(),
                    output: OutputKind::Cubin,
                    ..options.nvrtc.clone()
                };
                built_here = pipeline::build(kernels, &nv)?;
                &built_here
            }
        };
        let compile_ms = binary.time.as_secs_f64() * 1e3;
        let (modules, functions) = load_modules(&ctx, program, &launch_plan, kernels, binary, &info)?;

        let stream = ctx.new_stream().map_err(driver("cuStreamCreate"))?;
        let regions = Regions::new(&ctx, layout)?;
        let pinned_in = Pinned::new(&ctx, layout.inputs_end as usize, "input staging")?;
        let (pinned_out, out_offsets) = output_staging(&ctx, layout)?;
        upload_weights(model, layout, &regions)?;

        // cuBLASLt: one handle; each GEMM's descriptors and algorithm chosen now.
        let lt_handle = if launch_plan.gemm_count() > 0 {
            Some(LtHandle::new()?)
        } else {
            None
        };
        let tf32 = options.tf32 || model.precision.precision == Precision::Tf32;
        let prepared = prepare_launches(&launch_plan, lt_handle.as_ref(), tf32, &regions)?;
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
            regions,
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

    /// Milliseconds the build stage took (NVRTC or the cache: at load, or ahead of
    /// it for [`Session::with_binary`]), and the whole load.
    pub fn load_times_ms(&self) -> (f64, f64) {
        (self.compile_ms, self.load_ms)
    }

    /// Whether runs replay a CUDA graph (false with `cuda_graph: false`, or after a
    /// capture failed: see [`Session::graph_error`]).
    pub fn uses_graph(&self) -> bool {
        self.options.cuda_graph
    }

    /// Run on named inputs (each with its input's exact type); returns the named
    /// outputs in order. The first run with CUDA graphs on runs the launches plainly,
    /// then captures them (without running them again); every later run replays the
    /// graph.
    pub fn run(&mut self, inputs: &HashMap<String, Tensor>) -> Result<Vec<(String, Tensor)>, CudaError> {
        self.upload_inputs(inputs)?;
        self.forward()?;
        self.download_outputs(&|_| false)
    }

    /// Run with the inputs named in `kept` left as they are on the device (written by
    /// [`Session::write_inputs`] or by the previous run) and only `batch` uploaded: a
    /// training step's state stays on the GPU between steps. An output named like a
    /// kept input is that input's next value: written over it (a donated output
    /// already is; any other is copied on the device after the run) and not
    /// downloaded. Returns the other outputs, in order.
    pub fn run_kept(
        &mut self,
        batch: &HashMap<String, Tensor>,
        kept: &[&str],
    ) -> Result<Vec<(String, Tensor)>, CudaError> {
        self.ctx.bind_to_thread().map_err(driver("cuCtxSetCurrent"))?;
        let layout = &self.launch_plan.layout;
        let is_kept = |n: &str| kept.contains(&n);
        for k in kept {
            layout.input(k)?;
        }
        let mut names: Vec<&String> = batch.keys().collect();
        names.sort();
        if let Some(n) = names.iter().find(|n| is_kept(n)) {
            return Err(KernelError::UnknownInput(format!("{n} (kept on the device)")).into());
        }
        let uploads: Vec<(&str, &Tensor)> = layout
            .inputs
            .iter()
            .filter(|x| !is_kept(&x.name))
            .map(|x| {
                batch
                    .get(&x.name)
                    .map(|t| (x.name.as_str(), t))
                    .ok_or_else(|| KernelError::MissingInput(x.name.clone()))
            })
            .collect::<Result<_, _>>()?;
        if let Some(n) = names.iter().find(|n| !layout.inputs.iter().any(|x| &x.name == **n)) {
            return Err(KernelError::UnknownInput((*n).clone()).into());
        }
        let uploads: Vec<(String, Tensor)> = uploads.into_iter().map(|(n, t)| (n.to_string(), t.clone())).collect();
        let refs: Vec<(&str, &Tensor)> = uploads.iter().map(|(n, t)| (n.as_str(), t)).collect();
        self.copy_inputs_in(&refs)?;
        self.forward()?;
        // State outputs not written in place: copied over their inputs on the stream.
        let layout = &self.launch_plan.layout;
        for o in layout.outputs.iter().filter(|o| is_kept(&o.name)) {
            let Some(x) = layout.inputs.iter().find(|x| x.name == o.name) else {
                continue;
            };
            if o.addr == x.addr || o.bytes == 0 {
                continue;
            }
            let (dst, src) = (
                self.regions.base(x.addr.region) + x.addr.offset,
                self.regions.base(o.addr.region) + o.addr.offset,
            );
            // SAFETY: two device ranges of `bytes` inside their allocations.
            unsafe { drv::memcpy_dtod_async(dst, src, o.bytes as usize, self.stream.cu_stream()) }
                .map_err(driver("cuMemcpyDtoDAsync (state)"))?;
        }
        self.download_outputs(&|n| is_kept(n))
    }

    /// Upload the named inputs' values (each of its input's exact type), for
    /// [`Session::run_kept`].
    pub fn write_inputs(&mut self, values: &[(&str, &Tensor)]) -> Result<(), CudaError> {
        self.ctx.bind_to_thread().map_err(driver("cuCtxSetCurrent"))?;
        self.copy_inputs_in(values)?;
        self.stream.synchronize().map_err(|e| CudaError::Async {
            at: "writing inputs".to_string(),
            code: code(e),
        })
    }

    /// The current values of the named inputs on the device (a kept state's).
    pub fn read_inputs(&mut self, names: &[&str]) -> Result<Vec<(String, Tensor)>, CudaError> {
        self.ctx.bind_to_thread().map_err(driver("cuCtxSetCurrent"))?;
        let layout = &self.launch_plan.layout;
        let mut out = Vec::with_capacity(names.len());
        for name in names {
            let x = layout.input(name)?;
            let mut bytes = vec![0u8; x.bytes as usize];
            if !bytes.is_empty() {
                let src = self.regions.base(x.addr.region) + x.addr.offset;
                // SAFETY: a host destination of exactly the tensor's bytes; synchronized below.
                unsafe { drv::memcpy_dtoh_async(&mut bytes[..], src, self.stream.cu_stream()) }
                    .map_err(driver("cuMemcpyDtoHAsync (inputs)"))?;
                self.stream.synchronize().map_err(|e| CudaError::Async {
                    at: format!("reading input {name}"),
                    code: code(e),
                })?;
            }
            out.push((x.name.clone(), decode_tensor(&x.name, &x.ty, &bytes)?));
        }
        Ok(out)
    }

    /// Copy these inputs (checked: known, of their input's type) through their place in
    /// the pinned staging to the device, each its own range (asynchronously).
    fn copy_inputs_in(&mut self, values: &[(&str, &Tensor)]) -> Result<(), CudaError> {
        let layout = &self.launch_plan.layout;
        let mut at = Vec::with_capacity(values.len());
        for (name, t) in values {
            let x = layout.input(name)?;
            x.check(t)?;
            at.push((x.addr, x.bytes as usize, *t));
        }
        // The previous run's copies out of staging are complete (runs synchronize).
        let io = self.regions.io.ptr;
        for (addr, bytes, t) in at {
            let lo = addr.offset as usize;
            let staging = self.pinned_in.slice_mut();
            encode(t.data(), &mut staging[lo..lo + bytes]);
            if bytes == 0 {
                continue;
            }
            // SAFETY: pinned source of the input's bytes, inside the io allocation.
            unsafe {
                drv::memcpy_htod_async(
                    io + addr.offset,
                    &self.pinned_in.slice()[lo..lo + bytes],
                    self.stream.cu_stream(),
                )
            }
            .map_err(driver("cuMemcpyHtoDAsync (inputs)"))?;
        }
        Ok(())
    }

    /// Copy inputs into pinned staging and on to the device (asynchronously).
    pub(super) fn upload_inputs(&mut self, inputs: &HashMap<String, Tensor>) -> Result<(), CudaError> {
        self.ctx.bind_to_thread().map_err(driver("cuCtxSetCurrent"))?;
        let layout = &self.launch_plan.layout;
        for x in &layout.inputs {
            let t = inputs
                .get(&x.name)
                .ok_or_else(|| KernelError::MissingInput(x.name.clone()))?;
            x.check(t)?;
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
            unsafe { drv::memcpy_htod_async(self.regions.io.ptr, self.pinned_in.slice(), self.stream.cu_stream()) }
                .map_err(driver("cuMemcpyHtoDAsync (inputs)"))?;
        }
        Ok(())
    }

    /// Copy outputs back through pinned staging, wait, decode (all but those `skip`
    /// names).
    fn download_outputs(&mut self, skip: &dyn Fn(&str) -> bool) -> Result<Vec<(String, Tensor)>, CudaError> {
        let layout = &self.launch_plan.layout;
        let base = |r: Region| self.regions.base(r);
        let out = self.pinned_out.slice_mut();
        for (o, &off) in layout.outputs.iter().zip(&self.out_offsets) {
            if o.bytes == 0 || skip(&o.name) {
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
            if skip(&o.name) {
                continue;
            }
            let t = decode_tensor(&o.name, &o.ty, &out[off..off + o.bytes as usize])?;
            result.push((o.name.clone(), t));
        }
        Ok(result)
    }

    /// Enqueue one run of the model on the stream (inputs already on the device).
    pub(super) fn forward(&mut self) -> Result<(), CudaError> {
        if !self.options.cuda_graph {
            return self.enqueue(None);
        }
        if self.graph.is_none() {
            // The first run is a plain run: lazy initialization (module loading,
            // cuBLASLt kernels) happens outside the capture, and errors name their
            // kernel. It is this run's work: capture records the launches without
            // running them, and the graph first runs on the next call. (Running it now
            // too would run a training step twice: its state is updated in place.)
            self.enqueue(None)?;
            self.stream.synchronize().map_err(|e| CudaError::Async {
                at: "the run before CUDA graph capture".to_string(),
                code: code(e),
            })?;
            match self.capture() {
                Ok(g) => self.graph = g,
                Err(e) => {
                    // Capture is an optimization: later runs go without it; say why.
                    self.graph_error = Some(e.to_string());
                    self.options.cuda_graph = false;
                }
            }
            return Ok(());
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
    pub(super) fn enqueue(&self, events: Option<&[Event]>) -> Result<(), CudaError> {
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
                            self.regions.workspace.ptr as *mut c_void,
                            self.regions.workspace.bytes as usize,
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

    /// The program this session runs.
    pub fn program(&self) -> &Program {
        &self.program
    }
}

/// Poison the arena (NaN bytes) so a read of unwritten memory shows, then upload
/// weights and constants once.
/// A tensor of type `ty` from its little-endian bytes (a downloaded output or input).
fn decode_tensor(name: &str, ty: &graphc_ir::TensorType, bytes: &[u8]) -> Result<Tensor, KernelError> {
    TensorData::from_le_bytes(ty.dtype, bytes, ty.numel())
        .and_then(|d| Tensor::new(ty.shape.clone(), d).ok())
        .ok_or_else(|| KernelError::Output {
            name: name.to_string(),
            message: format!("cannot decode {ty}"),
        })
}

fn upload_weights(model: &Compiled, layout: &DeviceLayout, regions: &Regions) -> Result<(), CudaError> {
    let (arena, weights) = (&regions.arena, &regions.weights);
    let program = &model.program;
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
        // Borrowed from the mapped weights file when the weight is a view into one.
        let bytes = t.le_bytes();
        // SAFETY: `bytes.len() == u.bytes` lies inside the weights allocation.
        unsafe { drv::memcpy_htod_sync(weights.ptr + u.offset, &bytes) }.map_err(driver("cuMemcpyHtoD (weights)"))?;
    }
    Ok(())
}

/// What every launch needs at run time: kernel arguments as device pointers, each
/// GEMM's descriptors and algorithm.
fn prepare_launches(
    launch_plan: &LaunchPlan,
    lt_handle: Option<&LtHandle>,
    tf32: bool,
    regions: &Regions,
) -> Result<Vec<Prepared>, CudaError> {
    let base = |r: Region| regions.base(r);
    let workspace_bytes = launch_plan.layout.workspace_bytes;
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
                let handle = lt_handle.map(|h| h.0).unwrap_or(std::ptr::null_mut());
                let p = prepare_gemm(handle, &g.lt, tf32, workspace_bytes, &base).map_err(|(call, e)| {
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
    Ok(prepared)
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

#[cfg(test)]
mod tests {
    use graphc_compiler::{compile, generate_kernels, CompileOptions};
    use graphc_ir::{DType, GraphBuilder};

    use super::super::launch::{plan_launches, DeviceInfo};

    /// The session loads `binary.images[m.kernel]` for every module of the launch
    /// plan: the build stage compiles exactly those kernels.
    #[test]
    fn the_build_stage_compiles_the_launch_plans_modules() {
        let b = GraphBuilder::new();
        let x = b.input("x", DType::F32, [16, 32]);
        let w = b.input("w", DType::F32, [32, 24]);
        let y = x.matmul(w);
        let s = y.sum(&[1], true);
        b.output("y", y.reduce_max(&[1], true));
        b.output("s", s.transpose(&[1, 0]).reshape([16, 1]));
        let c = compile(&b.finish().unwrap(), &CompileOptions::default()).unwrap();
        let kernels = generate_kernels(&c).unwrap();
        let lp = plan_launches(&c.program, &c.plan, &kernels, &DeviceInfo::h200()).unwrap();
        assert!(!lp.modules.is_empty());
        let modules: Vec<usize> = lp.modules.iter().map(|m| m.kernel).collect();
        assert_eq!(kernels.launched(), modules);
    }
}
