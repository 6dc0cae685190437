//! The performance model: how long a program's kernels take on a named GPU, before
//! anything runs, from what the generated code executes.
//!
//! Pure data and formulas; the counts come from below (the runtime's counting build of
//! cuda-sim runs each kernel's own CUDA C over a sample of its blocks and fills
//! [`KernelCounters`]), the registers from ptxas through NVRTC. Per kernel:
//!
//! - the **ideal** time ([`IdealWork`]): its unique bytes at the DRAM bandwidth or its
//!   FLOPs at the peak of the unit its dtype should use, whichever is longer;
//! - the **modeled** time ([`estimate_kernel`], [`estimate_gemm`]): a roofline over
//!   the counted work (sectors, wavefronts, MMAs, instructions) at the rates the
//!   launch's grid and occupancy reach, plus the last wave's tail and a launch's cost.
//!
//! [`GPUS`] is the one table of device figures, with sources. The model's constants
//! are calibrated only from GPU measurements (`bench/gpu_check.sh`).

mod counters;
mod estimate;
mod gpu;
mod report;
mod work;

pub use counters::KernelCounters;
pub use estimate::{
    estimate_gemm, estimate_kernel, occupancy, Estimate, GemmShape, Occupancy, Resources, GEMM_EFFICIENCY,
    ISSUE_PER_BASIC_BLOCK, LAUNCH_S, WARPS_TO_HIDE_LATENCY,
};
pub use gpu::{GpuSpec, Peaks, GPUS};
pub use report::{step_time, KernelTime, LaunchInput, LaunchWork, StepTime};
pub use work::{IdealWork, Unit};
