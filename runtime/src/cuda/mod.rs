//! The CUDA executor: a compiled model's memory plan run on an NVIDIA GPU through
//! cudarc (the driver API, NVRTC and cuBLASLt, all loaded at run time: graphc builds
//! and runs its CPU paths on machines without CUDA).
//!
//! Three layers, the first two testable without a GPU:
//!
//! - [`launch`]: the translation of (program, memory plan, generated kernels, device)
//!   into a [`LaunchPlan`]: the device memory layout (arena, weights, I/O, cuBLASLt
//!   workspace) and every launch with its arguments as region + byte offset, GEMMs as
//!   cuBLASLt calls in cuBLASLt's own column-major terms.
//! - [`emulate`](mod@emulate): that launch list run on the CPU (GEMMs by cuBLASLt's definition,
//!   kernels by the kernel IR they were generated from), compared with the CPU executor
//!   in the tests.
//! - [`Session`] (`session.rs`): the launch list on a real device. It loads what the
//!   compiler's backend stages produced (`graphc_compiler::generate_kernels`, and
//!   `graphc_compiler::build`: cubins for the device's own architecture through the
//!   on-disk cache, run for it when not given), allocates one region each, uploads the
//!   weights once, prepares the cuBLASLt descriptors and algorithms at load
//!   (`gemm.rs`), runs the launches in plan order on one stream with inputs and
//!   outputs through pinned host buffers, and captures a CUDA graph on the first run to
//!   replay after (unless disabled). Its driver resources (allocations, pinned
//!   staging, events, modules) are in `driver.rs`, opening the device and reading its
//!   properties in `device.rs`, timing runs in `bench.rs`.

mod bench;
mod device;
mod driver;
pub mod emulate;
mod gemm;
pub mod launch;
mod session;
pub mod sim;

pub use bench::{median, BenchOptions, BenchResult, KernelTiming};
pub use device::{check_device_memory, discover, driver_available, DeviceMemoryReport};
pub use emulate::emulate;
pub use launch::{
    device_layout, plan_launches, DevAddr, DeviceInfo, DeviceLayout, Launch, LaunchPlan, LtMatmul, Region,
};
pub use session::{CudaExecutor, Session, SessionOptions};

use graphc_compiler::codegen::CodegenError;
use graphc_compiler::nvrtc::NvrtcError;

use crate::kernels::KernelError;

/// Everything that can go wrong on the GPU path. [`CudaError::is_unavailable`] tells
/// "there is no usable GPU here" (the CLI's exit code 3) from real failures.
#[derive(Debug, thiserror::Error)]
pub enum CudaError {
    /// cuda-sim: the generated CUDA C run on the host.
    #[error(transparent)]
    Sim(#[from] sim::SimError),
    /// libcuda cannot be loaded: no NVIDIA driver on this machine.
    #[error("no CUDA driver: {0}")]
    NoDriver(String),
    /// The driver is there but has no (such) GPU.
    #[error("no CUDA device: {0}")]
    NoDevice(String),
    /// cuBLASLt cannot be loaded (needed for matmuls).
    #[error("cuBLASLt is not available: {0} (put libcublasLt's folder on LD_LIBRARY_PATH)")]
    NoCublasLt(String),
    /// The device has too little free memory for the plan.
    #[error(
        "device memory too small on {gpu}: the plan needs {asked} bytes ({detail}) but only {free} of {total} bytes are free"
    )]
    OutOfMemory {
        gpu: String,
        asked: u64,
        free: u64,
        total: u64,
        detail: String,
    },
    #[error("code generation: {0}")]
    Codegen(#[from] CodegenError),
    #[error("{0}")]
    Compile(#[from] NvrtcError),
    /// Prebuilt kernels that this device cannot load (`Session::with_binary`).
    #[error("the kernels were built as {built}, but the device needs a cubin for {device}")]
    BinaryMismatch { built: String, device: String },
    /// The plan, the program, the inputs or the launch list are inconsistent.
    #[error("{0}")]
    Plan(#[from] KernelError),
    /// A driver call outside any kernel failed.
    #[error("CUDA {call} failed: {code}")]
    Driver { call: String, code: String },
    /// A driver or cuBLASLt call for one kernel failed (or, with synchronous launches,
    /// the kernel itself).
    #[error("kernel {step} ({kernel}): {call} failed: {code}")]
    Kernel {
        step: usize,
        kernel: String,
        call: String,
        code: String,
    },
    /// An asynchronous failure found at a synchronization point.
    #[error("CUDA error during the run ({code}) at {at}; rerun with synchronous launches (--sync-launches / SessionOptions::sync_each_launch) to name the kernel")]
    Async { at: String, code: String },
}

impl CudaError {
    /// No driver, no GPU or no cuBLASLt: the GPU path cannot run on this machine at all.
    pub fn is_unavailable(&self) -> bool {
        matches!(
            self,
            CudaError::NoDriver(_) | CudaError::NoDevice(_) | CudaError::NoCublasLt(_)
        ) || matches!(self, CudaError::Sim(e) if e.is_unavailable())
    }
}
