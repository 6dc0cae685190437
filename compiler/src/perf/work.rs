//! A kernel's ideal work: the unique bytes it must move ([`Program::kernel_traffic`])
//! and the FLOPs of its products, with the unit its dtype should run them on.

use graphc_ir::{AttentionDims, AttentionOperand, DType, Op, TensorType};
use serde::Serialize;

use super::gpu::GpuSpec;
use crate::kernel::{KernelKind, Program};

/// The unit a kernel's products belong on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Unit {
    /// Tensor cores, bf16/f16 inputs (quantized weights are dequantized to these).
    Tensor16,
    /// CUDA cores, f32 (TF32 off: f32 matmuls are exact f32 products).
    CudaF32,
    CudaF64,
}

impl Unit {
    fn of(dtype: DType) -> Unit {
        match dtype {
            DType::BF16 | DType::F16 | DType::I8 | DType::U8 => Unit::Tensor16,
            DType::F64 => Unit::CudaF64,
            _ => Unit::CudaF32,
        }
    }

    /// The unit's peak on `gpu`, FLOP/s.
    pub fn peak(self, gpu: &GpuSpec) -> f64 {
        match self {
            Unit::Tensor16 => gpu.peaks.tensor_16,
            Unit::CudaF32 => gpu.peaks.cuda_f32,
            Unit::CudaF64 => gpu.peaks.cuda_f64,
        }
    }
}

/// What kernel `k` of `program` must do at the least.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct IdealWork {
    /// Unique bytes read and written in global memory.
    pub bytes: u64,
    /// FLOPs of its products (matmuls, attention, convolutions); 0 for kernels whose
    /// arithmetic is a few operations per element (memory-bound by construction).
    pub flops: u64,
    pub unit: Unit,
}

impl IdealWork {
    pub fn of(program: &Program, k: usize) -> IdealWork {
        let (r, w) = program.kernel_traffic(k);
        let dtype = |b| program.buffer(b).ty.dtype;
        let (flops, unit) = match &program.kernels[k].kind {
            KernelKind::MatMul(mm) => {
                let batch: usize = mm.batch.iter().product();
                let flops = 2 * batch as u64 * mm.m as u64 * mm.n as u64 * mm.k as u64;
                let d = if mm.quant.is_some() {
                    DType::BF16
                } else {
                    dtype(mm.a.buffer)
                };
                (flops, Unit::of(d))
            }
            KernelKind::Conv(c) => {
                let out: usize = c.space().iter().product();
                let per: usize = c.w_dims.iter().skip(1).product();
                (2 * out as u64 * per as u64, Unit::of(dtype(c.x.buffer)))
            }
            KernelKind::Op(o) => {
                let types: Vec<&TensorType> = o.inputs.iter().map(|(_, t)| t).collect();
                let f = attention_flops(&o.op, &types, o.siblings.len());
                (f, Unit::of(types.first().map_or(DType::F32, |t| t.dtype)))
            }
            _ => (0, Unit::CudaF32),
        };
        IdealWork {
            bytes: (r as u64).saturating_add(w as u64),
            flops,
            unit,
        }
    }

    /// Its time at the DRAM bandwidth and the unit's peak, whichever is longer.
    pub fn seconds(&self, gpu: &GpuSpec) -> f64 {
        (self.bytes as f64 / gpu.dram_bytes_per_s).max(self.flops as f64 / self.unit.peak(gpu))
    }
}

/// The products of an attention op over operands `types` (q, k, v, ..): `2 b h sq sk d`
/// each (the scores, the value product, and for a gradient its own), halved when causal.
/// With `siblings` (the gradient of v beside that of k) the products both need: the
/// scores, `dp`, dk's and dv's.
fn attention_flops(op: &Op, types: &[&TensorType], siblings: usize) -> u64 {
    let (products, causal) = match op {
        Op::Attention { causal, .. } => (2, *causal),
        Op::AttentionLse { causal, .. } => (1, *causal),
        Op::AttentionGrad { causal, .. } if siblings == 1 => (4, *causal),
        Op::AttentionGrad { wrt, causal, .. } => (if *wrt == AttentionOperand::V { 2 } else { 3 }, *causal),
        _ => return 0,
    };
    let Ok(d) = AttentionDims::of(&types[..types.len().min(3)]) else {
        return 0;
    };
    let b: usize = d.batch.iter().product();
    let f = products * 2 * (b * d.hq * d.sq * d.sk * d.d.max(d.dv)) as u64;
    if causal {
        f / 2
    } else {
        f
    }
}
