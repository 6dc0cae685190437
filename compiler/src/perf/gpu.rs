//! The device figures the performance model divides by: one table, each GPU with the
//! sources of its numbers. Peaks are the vendor's dense figures (no sparsity) with f32
//! accumulation where the type allows two rates; an estimate is marked as one.

use serde::Serialize;

/// Peak arithmetic rates of one GPU, in FLOP/s (integer ops for `int8`).
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Peaks {
    /// Tensor cores, bf16 and f16 inputs with f32 accumulation.
    pub tensor_16: f64,
    /// Tensor cores, TF32 inputs (f32 matmuls when TF32 is allowed).
    pub tensor_tf32: f64,
    /// Tensor cores, int8 inputs with int32 accumulation.
    pub tensor_int8: f64,
    /// CUDA cores, f32 fused multiply-adds.
    pub cuda_f32: f64,
    /// CUDA cores, f64 fused multiply-adds.
    pub cuda_f64: f64,
}

/// One GPU as the model sees it.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct GpuSpec {
    /// The name `--gpu` takes.
    pub name: &'static str,
    pub full_name: &'static str,
    /// The architecture its kernels are compiled for (registers come from ptxas for it).
    pub arch: &'static str,
    pub sms: u32,
    /// Boost clock, Hz (instruction issue, shared memory and L1 rates per SM scale by it).
    pub clock_hz: f64,
    pub dram_bytes_per_s: f64,
    pub dram_bytes: u64,
    pub l2_bytes_per_s: f64,
    pub l2_bytes: u64,
    pub peaks: Peaks,
    /// Shared memory an SM has for blocks, and one block may take (opt-in).
    pub shared_per_sm: u32,
    pub shared_per_block: u32,
    pub registers_per_sm: u32,
    pub max_threads_per_sm: u32,
    pub max_blocks_per_sm: u32,
    /// Where each figure comes from.
    pub sources: &'static [&'static str],
}

const GB: f64 = 1e9;
const TB: f64 = 1e12;
const GIB: u64 = 1 << 30;
const MIB: u64 = 1 << 20;
const KIB: u32 = 1 << 10;

/// The GPUs `--gpu` names: the documents' card first (the default).
pub const GPUS: &[GpuSpec] = &[
    GpuSpec {
        name: "rtx4090d",
        full_name: "NVIDIA GeForce RTX 4090 D (AD102, sm_89)",
        arch: "sm_89",
        sms: 114,
        clock_hz: 2.52e9,
        dram_bytes_per_s: 1008.0 * GB,
        dram_bytes: 24 * GIB,
        l2_bytes_per_s: 5.0 * TB,
        l2_bytes: 72 * MIB,
        peaks: Peaks {
            // The RTX 4090's whitepaper figures (128 SMs at 2.52 GHz) times 114/128.
            tensor_16: 147.1 * TB,
            tensor_tf32: 73.5 * TB,
            tensor_int8: 588.4 * TB,
            cuda_f32: 73.5 * TB,
            cuda_f64: 1.15 * TB,
        },
        shared_per_sm: 100 * KIB,
        shared_per_block: 99 * KIB,
        registers_per_sm: 65536,
        max_threads_per_sm: 1536,
        max_blocks_per_sm: 24,
        sources: &[
            "SMs, clock, memory: NVIDIA's RTX 4090 D specifications (14,592 CUDA cores = 114 SMs, 2.52 GHz boost, \
             24 GB GDDR6X at 21 Gbps on 384 bits = 1,008 GB/s)",
            "tensor and CUDA-core peaks: NVIDIA Ada GPU Architecture whitepaper, RTX 4090 (FP16/BF16 with FP32 \
             accumulate 165.2 TFLOPS dense, TF32 82.6, INT8 660.6 TOPS, FP32 82.6, FP64 1.3) scaled by 114/128 SMs",
            "L2 72 MB: the whitepaper's AD102; L2 bandwidth 5 TB/s: an estimate (not published), to be calibrated",
            "shared memory, registers, threads and blocks per SM: CUDA C++ Programming Guide, compute capability 8.9",
        ],
    },
    GpuSpec {
        name: "h200",
        full_name: "NVIDIA H200 SXM (GH100, sm_90)",
        arch: "sm_90",
        sms: 132,
        clock_hz: 1.98e9,
        dram_bytes_per_s: 4.8 * TB,
        dram_bytes: 141_000_000_000,
        l2_bytes_per_s: 7.0 * TB,
        l2_bytes: 50 * MIB,
        peaks: Peaks {
            tensor_16: 989.4 * TB,
            tensor_tf32: 494.7 * TB,
            tensor_int8: 1978.9 * TB,
            cuda_f32: 66.9 * TB,
            cuda_f64: 33.5 * TB,
        },
        shared_per_sm: 228 * KIB,
        shared_per_block: 227 * KIB,
        registers_per_sm: 65536,
        max_threads_per_sm: 2048,
        max_blocks_per_sm: 32,
        sources: &[
            "memory and peaks: NVIDIA H200 Tensor Core GPU datasheet, SXM (141 GB HBM3e at 4.8 TB/s; BF16/FP16 \
             989.4 TFLOPS dense, TF32 494.7, INT8 1,978.9 TOPS, FP32 66.9, FP64 33.5)",
            "SMs, clock, L2: NVIDIA Hopper architecture whitepaper, H100 SXM5 (132 SMs, 1.98 GHz boost, 50 MB L2); \
             L2 bandwidth 7 TB/s: an estimate (not published), to be calibrated",
            "shared memory, registers, threads and blocks per SM: CUDA C++ Programming Guide, compute capability 9.0",
        ],
    },
];

impl GpuSpec {
    /// The GPU `--gpu NAME` names (case and `-`/`_` ignored), or an error listing them.
    pub fn by_name(name: &str) -> Result<&'static GpuSpec, String> {
        let norm = |s: &str| s.to_ascii_lowercase().replace(['-', '_', ' '], "");
        GPUS.iter().find(|g| norm(g.name) == norm(name)).ok_or_else(|| {
            format!(
                "unknown GPU `{name}`: the performance model knows {}",
                GPUS.iter().map(|g| g.name).collect::<Vec<_>>().join(", ")
            )
        })
    }

    /// The default: the documents' card.
    pub fn default_gpu() -> &'static GpuSpec {
        &GPUS[0]
    }

    /// The device table as text: one line per figure, then the sources.
    pub fn describe(&self) -> String {
        let p = &self.peaks;
        let mut s = format!(
            "gpu            {} ({}): {} SMs at {:.2} GHz; DRAM {:.0} GB/s, L2 {} MiB at {:.1} TB/s; \
             tensor bf16/f16 {:.0}, tf32 {:.0}, int8 {:.0} T/s; CUDA cores f32 {:.1} TFLOP/s; \
             {} KiB shared memory and {} registers per SM\n",
            self.name,
            self.full_name,
            self.sms,
            self.clock_hz / 1e9,
            self.dram_bytes_per_s / GB,
            self.l2_bytes / MIB,
            self.l2_bytes_per_s / TB,
            p.tensor_16 / TB,
            p.tensor_tf32 / TB,
            p.tensor_int8 / TB,
            p.cuda_f32 / TB,
            self.shared_per_sm / KIB,
            self.registers_per_sm,
        );
        for src in self.sources {
            s.push_str(&format!("               source: {src}\n"));
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gpus_are_found_by_name_and_their_peaks_agree_with_their_units() {
        assert_eq!(GpuSpec::by_name("H200").unwrap().sms, 132);
        assert_eq!(GpuSpec::by_name("rtx-4090d").unwrap().arch, "sm_89");
        assert!(GpuSpec::by_name("a100").unwrap_err().contains("rtx4090d, h200"));
        for g in GPUS {
            // CUDA-core f32: 128 lanes per SM, an FMA (2 FLOPs) per clock.
            let cuda = f64::from(g.sms) * 128.0 * 2.0 * g.clock_hz;
            assert!((g.peaks.cuda_f32 / cuda - 1.0).abs() < 0.2, "{}: {cuda}", g.name);
            assert!(g.peaks.tensor_16 > g.peaks.tensor_tf32 && g.peaks.tensor_int8 > g.peaks.tensor_16);
        }
    }
}
