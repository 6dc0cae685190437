//! CUDA C generation from the kernel IR ([`crate::kernel`]).
//!
//! [`generate`] turns one kernel of a [`Program`] into a [`CudaKernel`]: a complete,
//! header-free CUDA C translation unit with one `extern "C" __global__` entry, the
//! buffers its pointer parameters are bound to, and how to launch it. Matmul kernels
//! also carry a [`GemmDesc`] (the cuBLASLt call); the source is then the epilogue that
//! cuBLASLt cannot do natively, or empty.
//!
//! Numerics follow the reference interpreter (`graphc_ir::interp`), except where a
//! fused kernel is allowed to be more precise:
//! - f16/bf16 are stored as `unsigned short` and computed in f32; a fused chain stays in
//!   f32 and rounds at stores and explicit casts (see `cuda::ROUND_EVERY_HALF_OP`).
//!   Conversions are inline PTX (`cvt.f32.f16`, `cvt.rn.f16.f32`) and bit arithmetic
//!   for bf16 (round to nearest even, NaN kept quiet with its payload).
//! - Every PTX-only construct is a prelude helper ([`Helper`]) with an inline-PTX body
//!   for the GPU (`__CUDA_ARCH__`) and a CPU body with the ISA's results for the host
//!   build of `--device cuda-sim`; [`prelude_source`] gives their text.
//! - f64 is computed in `double`; integers wrap (add/sub/mul go through unsigned
//!   arithmetic); bool is an `unsigned char` 0/1.
//! - Integer division, `mod` and `fmod` by zero, and an integer `pow` of 0 to a negative
//!   power, give 0 (the interpreter reports an error; a kernel cannot).
//! - Float `max`/`min` propagate NaN (as the canonical quiet NaN), `round` is half to
//!   even (`rintf`), `mod` has the sign of the divisor, `fmod` is C's.
//! - Casts: floats to integers truncate, saturate, NaN to 0; integers wrap; to bool is
//!   `x != 0`; to f16/bf16 from f64 or i64 rounds once (through round-to-odd).
//! - Reductions accumulate f16/bf16 in f32, max/min start at -inf/+inf and propagate
//!   NaN; integer reductions wrap. Summation order differs from the interpreter's.
//!
//! Entry names are `g_<kind>_<hash>`, a hash of the kernel's source, so identical
//! kernels (the same layer repeated) have identical sources and NVRTC compiles them once.
//! Sources never mention buffer ids (parameters are positional), for the same reason.

pub(crate) mod attention;
mod conv;
mod cuda;
mod elementwise;
mod layout;
mod matmul;
mod op_kernels;
mod prelude;
mod ptx;
mod quant_gemm;
mod row;

use serde::{Deserialize, Serialize};

use graphc_ir::DType;

use crate::kernel::{BufferId, ElementwiseKernel, KernelKind, MatMulKernel, Program};

pub use matmul::{GemmCompute, GemmDesc, GemmEpilogue, GemmOperand, GemmOutput};
pub use prelude::{prelude_source, Helper};

/// Threads per block of elementwise-like kernels.
pub const ELEMENTWISE_BLOCK: u32 = 256;
/// Blocks per SM of grid-stride kernels (grid = SMs x this, at most what the work needs).
pub const BLOCKS_PER_SM: u32 = 8;

/// A generated CUDA kernel, ready for NVRTC and a launch.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CudaKernel {
    /// `k<index>_<kind>`: a C identifier naming the kernel in reports.
    pub name: String,
    /// The whole translation unit (no `#include`). Empty for a matmul that cuBLASLt
    /// does entirely (then `entry` is empty and `params` too).
    pub source: String,
    /// The `extern "C" __global__` function to launch.
    pub entry: String,
    /// The kernel's parameters, in order.
    pub params: Vec<ParamDesc>,
    pub launch: LaunchConfig,
    /// For matmul kernels: the GEMM to run before this kernel's source (if any).
    pub gemm: Option<GemmDesc>,
}

impl CudaKernel {
    /// Whether there is a CUDA C kernel to compile and launch.
    pub fn has_source(&self) -> bool {
        !self.source.is_empty()
    }
}

/// What a pointer parameter points at.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ParamTarget {
    /// A buffer of the program (the pointer is its base; accesses add their offsets).
    Buffer(BufferId),
    /// The scratch output of this kernel's GEMM ([`GemmOutput::Scratch`]).
    GemmScratch,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ParamAccess {
    Read,
    Write,
}

/// One kernel parameter. Today every parameter is a pointer; scalars may come later.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ParamDesc {
    pub target: ParamTarget,
    pub access: ParamAccess,
    /// Element type the kernel reads or writes through the pointer.
    pub dtype: DType,
}

/// The grid of a launch.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum GridSize {
    /// Exactly this many blocks.
    Fixed { blocks: u32 },
    /// Grid-stride kernels: `min(sm_count * blocks_per_sm, max_blocks)` blocks, computed
    /// at launch from the device's SM count. `max_blocks == 0` means there is no work:
    /// do not launch.
    PerSm { blocks_per_sm: u32, max_blocks: u32 },
}

impl GridSize {
    /// The number of blocks for a device with `sm_count` SMs.
    pub fn blocks(&self, sm_count: u32) -> u32 {
        match *self {
            GridSize::Fixed { blocks } => blocks,
            GridSize::PerSm {
                blocks_per_sm,
                max_blocks,
            } => sm_count.max(1).saturating_mul(blocks_per_sm).min(max_blocks),
        }
    }
}

/// How to launch a kernel (1-D blocks and grid).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LaunchConfig {
    pub block: u32,
    pub grid: GridSize,
    /// Dynamic shared memory (static shared memory is declared in the source).
    pub shared_mem_bytes: u32,
}

impl LaunchConfig {
    pub(crate) fn none() -> LaunchConfig {
        LaunchConfig {
            block: 0,
            grid: GridSize::Fixed { blocks: 0 },
            shared_mem_bytes: 0,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CodegenError {
    #[error("kernel index {0} out of range (the program has {1} kernels)")]
    NoSuchKernel(usize, usize),
    #[error("kernel {kernel}: {op} kernels are not supported by the CUDA backend")]
    UnsupportedOp { kernel: String, op: String },
    #[error("kernel {kernel}: matmul operand {operand} must be materialized: {why}")]
    OperandLayout {
        kernel: String,
        operand: String,
        why: String,
    },
    #[error("kernel {kernel}: {msg}")]
    Malformed { kernel: String, msg: String },
    /// The kernel is not well-formed kernel IR ([`crate::kernel::verify`]).
    #[error(transparent)]
    Verify(#[from] Box<crate::kernel::KernelVerifyError>),
    #[error("kernel {kernel}: {msg}")]
    Unsupported { kernel: String, msg: String },
}

impl CodegenError {
    /// Whether the kernel is well-formed but beyond what the CUDA backend does (an op
    /// it has no kernel for, a matmul operand cuBLASLt cannot stride through, a dtype
    /// it cannot compute in): such a kernel runs on the CPU only, so it has no GPU
    /// epilogue launch and no GEMM scratch. Other errors are malformed programs.
    pub fn is_backend_limit(&self) -> bool {
        matches!(
            self,
            CodegenError::UnsupportedOp { .. } | CodegenError::OperandLayout { .. } | CodegenError::Unsupported { .. }
        )
    }
}

/// The CUDA kernel of `program.kernels[kernel_index]`.
pub fn generate(program: &Program, kernel_index: usize) -> Result<CudaKernel, CodegenError> {
    let kernel = program
        .kernels
        .get(kernel_index)
        .ok_or(CodegenError::NoSuchKernel(kernel_index, program.kernels.len()))?;
    crate::kernel::verify_kernel(program, kernel_index).map_err(Box::new)?;
    let name = format!("k{kernel_index}_{}", cuda::c_ident(kernel.kind_name()));
    let cx = Ctx {
        program,
        kernel: name.clone(),
        scratch: None,
        in_place: None,
    };
    let mut out = match &kernel.kind {
        KernelKind::Elementwise(e) => elementwise::generate(&cx, &e.space, &e.inputs, &e.body, &e.stores)?,
        KernelKind::Row(r) => row::generate(&cx, r)?,
        KernelKind::MatMul(mm) => matmul::generate(&cx, mm)?,
        KernelKind::Op(o) => op_kernels::generate(&cx, o)?,
        KernelKind::MultiTensor(m) => elementwise::generate_multi(&cx, &m.parts)?,
        KernelKind::Conv(c) => conv::generate(&cx, c)?,
    };
    out.name = name;
    Ok(out)
}

/// How a matmul kernel runs on the GPU: the cuBLASLt GEMM, and, when cuBLASLt cannot
/// compute the whole body, the elementwise kernel its generated epilogue computes (the
/// CUDA C of [`generate`] is exactly this kernel). That kernel reads the GEMM's `D`
/// through its last input: the buffer `D` was written to, or [`SCRATCH_BUFFER`] for the
/// scratch output ([`GemmOutput::Scratch`]), which is not a buffer of the program.
#[derive(Clone, Debug, PartialEq)]
pub struct MatMulSplit {
    pub gemm: GemmDesc,
    /// A [`KernelKind::Elementwise`].
    pub epilogue: Option<KernelKind>,
}

/// The buffer id that stands for a GEMM's scratch output in [`MatMulSplit::epilogue`].
pub const SCRATCH_BUFFER: BufferId = SCRATCH;

/// How a matmul kernel's body runs, decided by the same function as [`generate`] and
/// [`matmul_split`] but without generating CUDA C: whether a generated epilogue
/// kernel follows the GEMM, and the scratch bytes the GEMM writes for it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EpiloguePlan {
    needs_kernel: bool,
    scratch_bytes: u64,
}

impl EpiloguePlan {
    /// Whether the GEMM library cannot apply the whole body: a generated epilogue
    /// kernel runs after the GEMM (one more launch; [`CudaKernel::has_source`]).
    pub fn needs_kernel(&self) -> bool {
        self.needs_kernel
    }

    /// Bytes of GEMM scratch output the epilogue kernel reads back
    /// ([`GemmDesc::scratch_bytes`]; 0 when the GEMM writes a buffer of the program).
    pub fn scratch_bytes(&self) -> u64 {
        self.scratch_bytes
    }
}

/// The [`EpiloguePlan`] of kernel `kernel_index`, or None when it is not a matmul.
/// A matmul the CUDA backend cannot run is an error for which
/// [`CodegenError::is_backend_limit`] holds (as [`generate`] reports it).
pub fn epilogue_plan(program: &Program, kernel_index: usize) -> Result<Option<EpiloguePlan>, CodegenError> {
    let Some((cx, mm)) = matmul_kernel(program, kernel_index)? else {
        return Ok(None);
    };
    if mm.quant.is_some() {
        // One generated kernel with the epilogue inside, writing the outputs.
        return Ok(Some(EpiloguePlan {
            needs_kernel: false,
            scratch_bytes: 0,
        }));
    }
    let (gemm, parts) = matmul::split(&cx, mm)?;
    Ok(Some(EpiloguePlan {
        needs_kernel: parts.is_some(),
        scratch_bytes: gemm.scratch_bytes,
    }))
}

/// Kernel `kernel_index` when it is a matmul (verified), with its generator context.
fn matmul_kernel(program: &Program, kernel_index: usize) -> Result<Option<(Ctx<'_>, &MatMulKernel)>, CodegenError> {
    let kernel = program
        .kernels
        .get(kernel_index)
        .ok_or(CodegenError::NoSuchKernel(kernel_index, program.kernels.len()))?;
    let KernelKind::MatMul(mm) = &kernel.kind else {
        return Ok(None);
    };
    crate::kernel::verify_kernel(program, kernel_index).map_err(Box::new)?;
    let cx = Ctx {
        program,
        kernel: format!("k{kernel_index}_{}", cuda::c_ident(kernel.kind_name())),
        scratch: None,
        in_place: None,
    };
    Ok(Some((cx, mm)))
}

/// The [`MatMulSplit`] of kernel `kernel_index`, or None when it is not a matmul or a
/// quantized one (one generated kernel, no cuBLASLt GEMM).
pub fn matmul_split(program: &Program, kernel_index: usize) -> Result<Option<MatMulSplit>, CodegenError> {
    let Some((cx, mm)) = matmul_kernel(program, kernel_index)? else {
        return Ok(None);
    };
    if mm.quant.is_some() {
        return Ok(None);
    }
    let (gemm, parts) = matmul::split(&cx, mm)?;
    Ok(Some(MatMulSplit {
        gemm,
        epilogue: parts.map(|p| {
            KernelKind::Elementwise(ElementwiseKernel {
                space: p.space,
                inputs: p.inputs,
                body: p.body,
                stores: p.stores,
            })
        }),
    }))
}

/// The CUDA kernels of every kernel of `program`, in order.
pub fn generate_all(program: &Program) -> Result<Vec<CudaKernel>, CodegenError> {
    (0..program.kernels.len()).map(|i| generate(program, i)).collect()
}

/// What generators need to know besides the kernel itself.
pub(crate) struct Ctx<'a> {
    pub program: &'a Program,
    /// The kernel's report name, for errors.
    pub kernel: String,
    /// Matmul epilogues: the dtype of the GEMM scratch output ([`SCRATCH`]).
    pub scratch: Option<DType>,
    /// Matmul epilogues: the buffer the GEMM wrote its product into, which the epilogue
    /// may read and then overwrite in place (a read and a write parameter both).
    pub in_place: Option<BufferId>,
}

/// The buffer id standing for the GEMM scratch output inside generators.
pub(crate) const SCRATCH: BufferId = BufferId(u32::MAX);

impl Ctx<'_> {
    pub fn malformed(&self, msg: impl Into<String>) -> CodegenError {
        CodegenError::Malformed {
            kernel: self.kernel.clone(),
            msg: msg.into(),
        }
    }

    pub fn unsupported(&self, msg: impl Into<String>) -> CodegenError {
        CodegenError::Unsupported {
            kernel: self.kernel.clone(),
            msg: msg.into(),
        }
    }

    /// The element type of a buffer (or of the GEMM scratch).
    pub fn dtype(&self, b: BufferId) -> Result<DType, CodegenError> {
        if b == SCRATCH {
            return self
                .scratch
                .ok_or_else(|| self.malformed("scratch buffer outside a matmul"));
        }
        self.program
            .buffers
            .get(b.index())
            .map(|x| x.ty.dtype)
            .ok_or_else(|| self.malformed(format!("buffer b{} does not exist", b.0)))
    }
}

/// The pointer parameters of a kernel: each read buffer once (in order of first use),
/// then each written buffer once.
pub(crate) struct Params {
    pub list: Vec<ParamDesc>,
}

impl Params {
    pub fn new() -> Params {
        Params { list: Vec::new() }
    }

    /// Index of the parameter for `buffer`, adding it if new.
    pub fn add(&mut self, cx: &Ctx, buffer: BufferId, access: ParamAccess) -> Result<usize, CodegenError> {
        let target = if buffer == SCRATCH {
            ParamTarget::GemmScratch
        } else {
            ParamTarget::Buffer(buffer)
        };
        if let Some(i) = self.list.iter().position(|p| p.target == target) {
            if let Some(j) = self.list.iter().position(|p| p.target == target && p.access == access) {
                return Ok(j);
            }
            if self.list[i].access != access && cx.in_place != Some(buffer) {
                return Err(cx.unsupported(format!(
                    "buffer {} is both read and written by one kernel",
                    match target {
                        ParamTarget::Buffer(b) => format!("b{}", b.0),
                        ParamTarget::GemmScratch => "scratch".to_string(),
                    }
                )));
            }
        }
        let dtype = cx.dtype(buffer)?;
        self.list.push(ParamDesc { target, access, dtype });
        Ok(self.list.len() - 1)
    }

    /// The C parameter list: `const float* __restrict__ p0, ...`.
    pub fn c_decl(&self) -> String {
        self.list
            .iter()
            .enumerate()
            .map(|(i, p)| {
                let t = cuda::storage_type(p.dtype);
                match p.access {
                    ParamAccess::Read => format!("const {t}* __restrict__ p{i}"),
                    ParamAccess::Write => format!("{t}* __restrict__ p{i}"),
                }
            })
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// Finish a kernel: prelude + body, with the entry name a hash of the whole source.
pub(crate) fn finish(kind: &str, helpers: &prelude::Helpers, body: &str) -> (String, String) {
    let mut src = String::new();
    src.push_str("// Generated by graphc. Header-free CUDA C.\n");
    src.push_str(&helpers.source());
    src.push_str(&cuda::prune_unused(body));
    let hash = crate::nvrtc::cache::fnv1a_128(src.as_bytes());
    let entry = format!("g_{kind}_{:016x}", (hash >> 64) as u64);
    (src.replace(cuda::ENTRY_PLACEHOLDER, &entry), entry)
}
