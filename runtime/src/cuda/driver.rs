//! Driver resources of a session, each freed on drop: device allocations (the four
//! regions of the launch plan's layout), page-locked host staging, CUDA events, and
//! the modules and functions loaded from a built [`Binary`]; and the text of driver
//! errors.

use std::ffi::c_void;
use std::sync::Arc;

use cudarc::driver::result as drv;
use cudarc::driver::sys;
use cudarc::driver::{CudaContext, CudaFunction, CudaModule, CudaStream, DriverError};
use cudarc::nvrtc::Ptx;

use graphc_compiler::kernel::Program;
use graphc_compiler::nvrtc::OutputKind;
use graphc_compiler::{Binary, Kernels};

use super::launch::{DeviceInfo, DeviceLayout, LaunchPlan, Region};
use super::CudaError;

pub(super) fn code(e: DriverError) -> String {
    match (e.error_name(), e.error_string()) {
        (Ok(n), Ok(s)) => format!("{} ({})", n.to_string_lossy(), s.to_string_lossy()),
        _ => format!("{e:?}"),
    }
}

pub(super) fn driver(call: &str) -> impl Fn(DriverError) -> CudaError + '_ {
    move |e| CudaError::Driver {
        call: call.to_string(),
        code: code(e),
    }
}

/// One device allocation, freed on drop.
pub(super) struct DeviceBuffer {
    pub(super) ptr: sys::CUdeviceptr,
    pub(super) bytes: u64,
    ctx: Arc<CudaContext>,
}

impl DeviceBuffer {
    pub(super) fn new(ctx: &Arc<CudaContext>, bytes: u64, what: &str) -> Result<DeviceBuffer, CudaError> {
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

/// The four device allocations of a launch plan's layout.
pub(super) struct Regions {
    pub(super) arena: DeviceBuffer,
    pub(super) weights: DeviceBuffer,
    pub(super) io: DeviceBuffer,
    pub(super) workspace: DeviceBuffer,
}

impl Regions {
    pub(super) fn new(ctx: &Arc<CudaContext>, layout: &DeviceLayout) -> Result<Regions, CudaError> {
        let arena = DeviceBuffer::new(ctx, layout.arena_bytes, "arena")?;
        let weights = DeviceBuffer::new(ctx, layout.weights_bytes, "weights")?;
        let io = DeviceBuffer::new(ctx, layout.io_bytes, "inputs and outputs")?;
        let workspace = DeviceBuffer::new(ctx, layout.workspace_bytes, "cuBLASLt workspace")?;
        Ok(Regions {
            arena,
            weights,
            io,
            workspace,
        })
    }

    /// The device address where region `r` starts.
    pub(super) fn base(&self, r: Region) -> u64 {
        match r {
            Region::Arena => self.arena.ptr,
            Region::Weights => self.weights.ptr,
            Region::Io => self.io.ptr,
            Region::Workspace => self.workspace.ptr,
        }
    }
}

/// Page-locked host memory, freed on drop.
pub(super) struct Pinned {
    ptr: *mut u8,
    pub(super) len: usize,
    ctx: Arc<CudaContext>,
}

impl Pinned {
    pub(super) fn new(ctx: &Arc<CudaContext>, len: usize, what: &str) -> Result<Pinned, CudaError> {
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

    pub(super) fn slice(&self) -> &[u8] {
        if self.len == 0 {
            return &[];
        }
        // SAFETY: `len` bytes allocated in `new`, alive until drop.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }

    pub(super) fn slice_mut(&mut self) -> &mut [u8] {
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
pub(super) struct Event(sys::CUevent);

impl Event {
    pub(super) fn new() -> Result<Event, CudaError> {
        drv::event::create(sys::CUevent_flags::CU_EVENT_DEFAULT)
            .map(Event)
            .map_err(driver("cuEventCreate"))
    }

    pub(super) fn record(&self, stream: &CudaStream) -> Result<(), CudaError> {
        // SAFETY: both handles are live.
        unsafe { drv::event::record(self.0, stream.cu_stream()) }.map_err(driver("cuEventRecord"))
    }

    pub(super) fn ms_since(&self, start: &Event) -> Result<f32, CudaError> {
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

/// Pinned staging of the outputs, each at its offset (64-byte aligned) in it.
pub(super) fn output_staging(ctx: &Arc<CudaContext>, layout: &DeviceLayout) -> Result<(Pinned, Vec<usize>), CudaError> {
    let mut out_offsets = Vec::with_capacity(layout.outputs.len());
    let mut out_len = 0usize;
    for o in &layout.outputs {
        out_offsets.push(out_len);
        out_len += (o.bytes as usize).div_ceil(64) * 64;
    }
    Ok((Pinned::new(ctx, out_len, "output staging")?, out_offsets))
}

/// Load every module of `launch_plan` from `binary` (a cubin for this device's
/// architecture) and get its function, with room for the dynamic shared memory its
/// kernel asks for.
pub(super) fn load_modules(
    ctx: &Arc<CudaContext>,
    program: &Program,
    launch_plan: &LaunchPlan,
    kernels: &Kernels,
    binary: &Binary,
    info: &DeviceInfo,
) -> Result<(Vec<Arc<CudaModule>>, Vec<CudaFunction>), CudaError> {
    if !launch_plan.modules.is_empty() && (binary.output != OutputKind::Cubin || binary.arch != info.arch) {
        return Err(CudaError::BinaryMismatch {
            built: format!("{} for {}", binary.output.extension(), binary.arch),
            device: info.arch.clone(),
        });
    }
    let mut modules = Vec::with_capacity(launch_plan.modules.len());
    let mut functions = Vec::with_capacity(launch_plan.modules.len());
    for m in &launch_plan.modules {
        let name = program
            .kernels
            .get(m.kernel)
            .map(|k| k.name.clone())
            .unwrap_or_default();
        let err = |call: &str, e: DriverError| CudaError::Kernel {
            step: m.kernel,
            kernel: name.clone(),
            call: format!("{call} ({})", m.entry),
            code: code(e),
        };
        let (Some(Some(img)), Some(kernel)) = (binary.images.get(m.kernel), kernels.get(m.kernel)) else {
            return Err(CudaError::Kernel {
                step: m.kernel,
                kernel: name.clone(),
                call: format!("loading the module ({})", m.entry),
                code: "the built binary has no image for this kernel".to_string(),
            });
        };
        let module = ctx
            .load_module(Ptx::from_binary(img.image.clone()))
            .map_err(|e| err("cuModuleLoadData", e))?;
        let f = module
            .load_function(&m.entry)
            .map_err(|e| err("cuModuleGetFunction", e))?;
        let smem = kernel.launch.shared_mem_bytes;
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
    Ok((modules, functions))
}
