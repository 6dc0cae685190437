//! From counts to seconds: a roofline per launch over the rates the counted work
//! needs, with the parallelism its grid and occupancy allow.
//!
//! A generated kernel's time is the longest of these terms (each unit works in
//! parallel with the others), stretched by the last partial wave, plus a launch's
//! fixed cost:
//!
//! - DRAM: its unique bytes ([`IdealWork::bytes`]); when those exceed the L2 cache,
//!   every block's own distinct sectors (what other blocks also read comes from DRAM
//!   again);
//! - L2: every block's distinct sectors (each block fetches its own data at least once);
//! - L1: every request's sectors (an SM's L1 returns 4 sectors, 128 bytes, a clock),
//!   which is where uncoalesced access costs;
//! - shared memory: wavefronts, bank conflicts included (one a clock per SM);
//! - tensor cores: `mma.sync` m16n8k16 at the bf16/f16 peak;
//! - issue: each warp's instructions (the kernel's own host instructions in each basic
//!   block it runs, [`SASS_PER_HOST_INSTRUCTION`] each; without the blocks' weights,
//!   its basic blocks times [`ISSUE_PER_BASIC_BLOCK`]), 4 warp schedulers an SM issuing
//!   one a clock each.
//!
//! The rates are scaled by the share of the GPU the launch occupies: the SMs its grid
//! reaches, and the warps resident on each against [`WARPS_TO_HIDE_LATENCY`].
//!
//! A cuBLASLt GEMM is modeled by tiles and waves: 128x128 output tiles (smaller for a
//! smaller product), one an SM at a time, each at [`GEMM_EFFICIENCY`] of the SM's share
//! of its unit's peak, k split over idle SMs when the tiles are fewer than the SMs; or
//! its bytes at the DRAM bandwidth, whichever is longer.
//!
//! The constants below are assumptions until a GPU measurement calibrates them
//! (`bench/gpu_check.sh`); they are never tuned to flatter one kernel.

use serde::Serialize;

use super::counters::KernelCounters;
use super::gpu::GpuSpec;
use super::work::{IdealWork, Unit};

/// A launch boundary inside a CUDA graph: launch, ramp-up and drain, seconds.
pub const LAUNCH_S: f64 = 2e-6;
/// Machine instructions (SASS) per basic block of the host build: the issue term's
/// conversion where the blocks have no weights (no `objdump`), uncalibrated.
pub const ISSUE_PER_BASIC_BLOCK: f64 = 6.0;
/// SASS instructions per counted host instruction (instrumentation, spills and the
/// frame not counted; see `runtime/src/cuda/sim/weights.rs`), uncalibrated.
pub const SASS_PER_HOST_INSTRUCTION: f64 = 1.0;
/// Resident warps an SM needs to reach its rates (latency hidden); fewer scale them.
pub const WARPS_TO_HIDE_LATENCY: f64 = 16.0;
/// An SM draws at most this many times its even share of the DRAM and L2 bandwidth.
pub const SM_BANDWIDTH_SHARE: f64 = 2.0;
/// cuBLASLt's fraction of the peak on a full wave of tiles.
pub const GEMM_EFFICIENCY: f64 = 0.8;
const GEMM_TILE: u64 = 128;
const GEMM_MIN_SPLIT_K: u64 = 256;
const L1_SECTORS_PER_CLOCK: f64 = 4.0;
const SCHEDULERS_PER_SM: f64 = 4.0;
const MMA_FLOPS: f64 = 4096.0;
/// Registers are allocated to warps in units of 256.
const REGISTER_UNIT: u32 = 256;

/// What ptxas gave a kernel (registers per thread, static shared memory).
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct Resources {
    /// None where NVRTC is not available: occupancy then ignores registers.
    pub registers: Option<u32>,
    pub static_shared: u32,
    pub spilled_bytes: u32,
}

/// Blocks of a launch resident on one SM, and what limits them.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Occupancy {
    pub blocks_per_sm: u32,
    pub warps_per_sm: u32,
    pub limiter: &'static str,
}

pub fn occupancy(gpu: &GpuSpec, block_threads: u32, res: &Resources, dynamic_shared: u32) -> Occupancy {
    let warps = block_threads.div_ceil(32).max(1);
    let mut limits = vec![
        (gpu.max_blocks_per_sm, "blocks"),
        (gpu.max_threads_per_sm / (warps * 32), "threads"),
    ];
    if let Some(r) = res.registers {
        let per_warp = (r.max(1) * 32).div_ceil(REGISTER_UNIT) * REGISTER_UNIT;
        limits.push((gpu.registers_per_sm / (per_warp * warps), "registers"));
    }
    let shared = res.static_shared + dynamic_shared;
    if shared > 0 {
        // 1 KiB of each block's shared memory is reserved by the system.
        limits.push((gpu.shared_per_sm / (shared + 1024), "shared memory"));
    }
    let (blocks, limiter) = limits.into_iter().min_by_key(|l| l.0).unwrap_or((1, "blocks"));
    let blocks = blocks.max(1);
    Occupancy {
        blocks_per_sm: blocks,
        warps_per_sm: blocks * warps,
        limiter,
    }
}

/// A modeled launch (or a sum of launches): seconds, the term that bounds it, the terms.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Estimate {
    pub seconds: f64,
    pub bound: &'static str,
    /// Each term's seconds (`dram`, `l2`, `l1`, `shared`, `tensor`, `issue`, ...).
    pub terms: Vec<(&'static str, f64)>,
    /// Blocks (tiles) over those the GPU holds at once.
    pub waves: f64,
    pub occupancy: Option<Occupancy>,
}

/// The parallel share of the GPU a grid gets (SMs reached times latency hidden), the
/// stretch of its last partial wave, and its waves.
fn share(gpu: &GpuSpec, grid: u64, block_threads: u32, occ: &Occupancy) -> (f64, f64, f64) {
    let sms = f64::from(gpu.sms);
    let used = (grid as f64).min(sms).max(1.0);
    let per_sm_blocks = (grid as f64 / used).min(f64::from(occ.blocks_per_sm)).max(1.0);
    let warps = per_sm_blocks * f64::from(block_threads.div_ceil(32).max(1));
    let hidden = (warps / WARPS_TO_HIDE_LATENCY).min(1.0);
    let concurrent = f64::from(occ.blocks_per_sm) * sms;
    let full = grid as f64 / concurrent;
    let waves = full.ceil().max(1.0);
    // Past one wave, the last partial wave runs with the GPU part idle.
    let tail = if full > 1.0 { waves / full } else { 1.0 };
    ((used / sms) * hidden, tail, full)
}

/// A generated kernel's modeled time from its counts.
pub fn estimate_kernel(c: &KernelCounters, res: &Resources, ideal: &IdealWork, gpu: &GpuSpec) -> Estimate {
    let occ = occupancy(gpu, c.block_threads, res, c.dynamic_shared);
    let (p, tail, waves) = share(gpu, c.grid, c.block_threads, &occ);
    let s = c.scale();
    let sms = f64::from(gpu.sms);
    let bw_share = (p * SM_BANDWIDTH_SHARE).min(1.0);
    let block_bytes = c.block_distinct_sectors as f64 * 32.0 * s;
    let dram_bytes = if ideal.bytes > gpu.l2_bytes {
        block_bytes.max(ideal.bytes as f64)
    } else {
        ideal.bytes as f64
    };
    let clock = gpu.clock_hz * sms * p;
    let terms = vec![
        ("dram", dram_bytes / (gpu.dram_bytes_per_s * bw_share)),
        ("l2", block_bytes / (gpu.l2_bytes_per_s * bw_share)),
        (
            "l1",
            (c.load_sectors + c.store_sectors) as f64 * s / (L1_SECTORS_PER_CLOCK * clock),
        ),
        ("shared", c.shared_wavefronts as f64 * s / clock),
        ("tensor", c.mmas as f64 * s * MMA_FLOPS / (gpu.peaks.tensor_16 * p)),
        ("issue", issued(c) * s / (SCHEDULERS_PER_SM * clock)),
    ];
    finish(terms, tail, waves, Some(occ))
}

/// The SASS instructions the sampled warps issue: their weighed instructions, or
/// without weights their basic blocks.
fn issued(c: &KernelCounters) -> f64 {
    if c.warp_instructions > 0 {
        c.warp_instructions as f64 * SASS_PER_HOST_INSTRUCTION
    } else {
        c.warp_basic_blocks as f64 * ISSUE_PER_BASIC_BLOCK
    }
}

/// The longest term, stretched by `tail`, plus the launch.
fn finish(terms: Vec<(&'static str, f64)>, tail: f64, waves: f64, occupancy: Option<Occupancy>) -> Estimate {
    let (bound, t) = terms
        .iter()
        .copied()
        .fold(("launch", 0.0), |a, b| if b.1 > a.1 { b } else { a });
    Estimate {
        seconds: t * tail + LAUNCH_S,
        bound,
        terms,
        waves,
        occupancy,
    }
}

/// A cuBLASLt GEMM: `batch` products of `m x k` by `k x n`, operands of `unit`'s type,
/// `bytes` its operands' and result's bytes.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct GemmShape {
    pub m: u64,
    pub n: u64,
    pub k: u64,
    pub batch: u64,
    pub unit: Unit,
    pub bytes: u64,
}

impl GemmShape {
    pub fn flops(&self) -> f64 {
        2.0 * self.m as f64 * self.n as f64 * self.k as f64 * self.batch as f64
    }
}

pub fn estimate_gemm(g: &GemmShape, gpu: &GpuSpec) -> Estimate {
    let sms = u64::from(gpu.sms);
    let (tm, tn) = (g.m.clamp(1, GEMM_TILE), g.n.clamp(1, GEMM_TILE));
    let tiles = g.m.div_ceil(GEMM_TILE) * g.n.div_ceil(GEMM_TILE) * g.batch.max(1);
    // Fewer tiles than SMs: the k dimension is split over the idle SMs (split-K), in
    // slices of at least GEMM_MIN_SPLIT_K.
    let split = if tiles < sms {
        (sms / tiles).min(g.k / GEMM_MIN_SPLIT_K).max(1)
    } else {
        1
    };
    let waves = (tiles * split).div_ceil(sms).max(1) as f64;
    let per_sm = g.unit.peak(gpu) / f64::from(gpu.sms) * GEMM_EFFICIENCY;
    let tile_s = 2.0 * (tm * tn) as f64 * g.k.div_ceil(split) as f64 / per_sm;
    let terms = vec![
        ("dram", g.bytes as f64 / gpu.dram_bytes_per_s),
        ("tiles", waves * tile_s),
    ];
    finish(terms, 1.0, (tiles * split) as f64 / f64::from(gpu.sms), None)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::perf::gpu::GpuSpec;

    fn h200() -> &'static GpuSpec {
        GpuSpec::by_name("h200").unwrap()
    }

    #[test]
    fn occupancy_is_limited_by_the_scarcest_resource() {
        let g = h200();
        let free = Resources::default();
        assert_eq!(occupancy(g, 256, &free, 0).blocks_per_sm, 8); // 2048 threads
        let regs = Resources {
            registers: Some(255),
            ..free
        };
        let o = occupancy(g, 256, &regs, 0);
        assert_eq!((o.blocks_per_sm, o.limiter), (1, "registers"));
        let o = occupancy(g, 128, &free, 100 * 1024);
        assert_eq!((o.blocks_per_sm, o.limiter), (2, "shared memory"));
        assert_eq!(occupancy(g, 32, &free, 0).limiter, "blocks");
    }

    #[test]
    fn a_gemm_is_compute_bound_when_large_and_wave_quantized_when_small() {
        let g = h200();
        let big = GemmShape {
            m: 4096,
            n: 4096,
            k: 4096,
            batch: 1,
            unit: Unit::Tensor16,
            bytes: 3 * 4096 * 4096 * 2,
        };
        let e = estimate_gemm(&big, g);
        assert_eq!(e.bound, "tiles");
        let ideal = big.flops() / g.peaks.tensor_16;
        assert!(e.seconds > ideal && e.seconds < 1.5 * ideal, "{} vs {ideal}", e.seconds);
        // 133 tiles on 132 SMs: two waves, the second nearly empty.
        let odd = GemmShape {
            m: 128 * 133,
            n: 128,
            k: 4096,
            bytes: 0,
            ..big
        };
        let one = GemmShape { m: 128 * 132, ..odd };
        let (a, b) = (estimate_gemm(&odd, g).seconds, estimate_gemm(&one, g).seconds);
        assert!(a > 1.9 * (b - LAUNCH_S), "{a} vs {b}");
    }

    #[test]
    fn uncoalesced_loads_cost_eight_times_the_l1_time_of_coalesced_ones() {
        let g = h200();
        let ideal = IdealWork {
            bytes: 0,
            flops: 0,
            unit: Unit::CudaF32,
        };
        let mk = |sectors: u64| KernelCounters {
            grid: 132 * 8,
            block_threads: 256,
            sampled_blocks: 1,
            load_requests: 1000,
            load_sectors: 1000 * sectors,
            ..KernelCounters::default()
        };
        let l1 = |e: &Estimate| e.terms.iter().find(|t| t.0 == "l1").unwrap().1;
        let (a, b) = (
            estimate_kernel(&mk(4), &Resources::default(), &ideal, g),
            estimate_kernel(&mk(32), &Resources::default(), &ideal, g),
        );
        assert!((l1(&b) / l1(&a) - 8.0).abs() < 1e-9);
        assert_eq!(b.bound, "l1");
    }
}
