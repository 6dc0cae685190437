//! Device discovery: whether the driver loads, opening a device (with clear
//! [`CudaError::NoDriver`] / [`CudaError::NoDevice`] errors), its [`DeviceInfo`] from
//! the driver's properties, and the check of a layout against its free memory
//! ([`DeviceMemoryReport`] says where the memory went).

use std::panic::catch_unwind;
use std::sync::Arc;

use cudarc::driver::result as drv;
use cudarc::driver::sys;
use cudarc::driver::CudaContext;
use serde::{Deserialize, Serialize};

use super::driver::{code, driver};
use super::launch::{DeviceInfo, DeviceLayout};
use super::CudaError;

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

/// The device's properties.
pub(super) fn device_info(ctx: &Arc<CudaContext>) -> Result<DeviceInfo, CudaError> {
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
pub(super) fn open_device(ordinal: usize) -> Result<Arc<CudaContext>, CudaError> {
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

/// Open device `ordinal` and read its properties (what [`graphc_compiler::build`]
/// needs to target it: `arch`). Errors as [`super::Session::new`]'s when there is no
/// driver or no such GPU.
pub fn discover(ordinal: usize) -> Result<DeviceInfo, CudaError> {
    device_info(&open_device(ordinal)?)
}
