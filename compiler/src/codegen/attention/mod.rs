//! The attention kernels: flash-attention-style, never storing the scores, generated
//! per shape and dtype.
//!
//! - The forward (and `attention_lse`, the forward without v) on tensor cores for bf16
//!   and f16 with head dims multiples of 16 ([`mma`]); else on CUDA cores ([`tiled`]:
//!   f32, f64 and the other head dims), 64 query rows a block of 256 threads, key
//!   tiles streamed through shared memory, each row's online softmax (running max and
//!   sum, the output rescaled when the max grows) over the 16 threads that share it.
//! - The backward ([`backward`]): `attention_grad` on tensor cores ([`mma_backward`]) or
//!   CUDA cores ([`tiled`]), `attention_lse` as above.
//!
//! Arithmetic is in f32 (f64 for f64), the output rounded once. The CPU executor
//! (`runtime/src/kernels/attention.rs`) computes the same online softmax over its own
//! key tiles; both agree with the interpreter's two-pass definition to rounding.

pub(crate) mod backward;
mod mma;
mod mma_backward;
mod tiled;

use graphc_ir::{AttentionDims, AttentionOperand, DType, Op, TensorType};

use super::cuda;
use super::layout::Ix;
use super::prelude::Helpers;
use super::{CodegenError, Ctx, LaunchConfig};
use crate::kernel::Access;

/// Query rows (warps) per block.
pub const WARPS: usize = 4;
/// The largest head dim generated.
pub const MAX_HEAD_DIM: usize = 256;

pub(crate) struct Args<'a> {
    pub cx: &'a Ctx<'a>,
    pub inputs: &'a [(Access, TensorType)],
    pub in_param: &'a [usize],
    pub out_param: usize,
    pub out: &'a TensorType,
    /// The parameter and type of a sibling's output ([`fuses_siblings`]): the gradient
    /// of v beside that of k, the rows' log-sum-exp beside the forward's output.
    pub also: Option<(usize, DType)>,
    pub params_decl: String,
    pub scale: f64,
    pub causal: bool,
    /// A row whose sum is 0 or NaN (every key masked) stores 0.
    pub zero_masked_rows: bool,
}

/// Whether `attention_grad` of k over operands of types `tys` (q, k, v, dout, lse,
/// delta and maybe a mask) computes the gradient of v in the same kernel: on tensor
/// cores (bf16 or f16, head dims multiples of 16) up to head dim
/// [`mma_backward::FUSED_HEAD_DIM`].
fn fuses_dkdv(tys: &[&TensorType]) -> bool {
    let Some(att) = tys.get(..3) else {
        return false;
    };
    let Ok(dims) = AttentionDims::of(att) else {
        return false;
    };
    matches!(dims.dtype, DType::BF16 | DType::F16)
        && tys.get(3).is_some_and(|t| t.dtype == dims.dtype)
        && (6..=7).contains(&tys.len())
        && [dims.d, dims.dv]
            .iter()
            .all(|&x| x > 0 && x % 16 == 0 && x <= mma_backward::FUSED_HEAD_DIM)
        && dims.sq > 0
        && dims.sk > 0
}

/// Whether the forward over operands of types `tys` (q, k, v and maybe a mask) stores
/// the rows' log-sum-exp beside its output: on tensor cores ([`mma::applies`]).
fn fuses_lse(tys: &[&TensorType]) -> bool {
    (3..=4).contains(&tys.len()) && AttentionDims::of(tys).is_ok_and(|d| mma::applies(&d) && d.sk > 0)
}

/// The sibling the kernel of `op` over operands of types `tys` computes beside its own
/// output, as the op and the kernel's operands it reads: the `attention_grad` of v
/// with the same flags over the same operands beside the `attention_grad` of k, where
/// [`fuses_dkdv`]; the `attention_lse` of its q, k (and mask) with its scale and
/// causality beside the forward, where [`fuses_lse`]. `crate::fuse::siblings` pairs
/// kernels by it; the CUDA backend generates no other pair.
pub(crate) fn sibling_of(op: &Op, tys: &[&TensorType]) -> Option<(Op, Vec<usize>)> {
    match op {
        Op::AttentionGrad {
            wrt: AttentionOperand::K,
            scale,
            causal,
            zero_masked_rows,
        } if fuses_dkdv(tys) => {
            let v = Op::AttentionGrad {
                wrt: AttentionOperand::V,
                scale: *scale,
                causal: *causal,
                zero_masked_rows: *zero_masked_rows,
            };
            Some((v, (0..tys.len()).collect()))
        }
        Op::Attention { scale, causal, .. } if fuses_lse(tys) => {
            let lse = Op::AttentionLse {
                scale: *scale,
                causal: *causal,
            };
            Some((lse, [0, 1].into_iter().chain((tys.len() == 4).then_some(3)).collect()))
        }
        _ => None,
    }
}

/// Whether op kernel `o` (of `op`) is generated as one kernel with its siblings: its one
/// sibling is [`sibling_of`] its op and operands.
pub(crate) fn fuses_siblings(op: &Op, o: &crate::kernel::OpKernel) -> bool {
    let tys: Vec<&TensorType> = o.inputs.iter().map(|(_, t)| t).collect();
    match (&o.siblings[..], sibling_of(op, &tys)) {
        ([s], Some((want, inputs))) => s.op == want && s.inputs == inputs,
        _ => false,
    }
}

/// Whether an operand's rows (offset `offset`, strides `st` over `nbd` batch dims, its
/// head, rows and columns) can be copied 16 bytes at a time from a 16-byte aligned
/// buffer of 2-byte values: columns contiguous, the offset and every other stride
/// multiples of 8 elements.
fn rows_16_bytes(offset: i64, st: &[i64], nbd: usize) -> bool {
    st.get(nbd + 2) == Some(&1) && offset % 8 == 0 && st[..nbd + 2].iter().all(|s| s % 8 == 0)
}

/// Strides of an access over its type, 0 on dims of extent 1 (a broadcast operand's
/// size-1 dims are never stepped, whatever stride fusion gave them).
fn strides(a: &Access, ty: &TensorType) -> Vec<i64> {
    a.strides
        .iter()
        .zip(ty.shape.dims())
        .map(|(&s, &d)| if d == 1 { 0 } else { s })
        .collect()
}

/// What every phase of the generated kernel needs: the shapes, the accumulation type
/// and its literals, the index type, and the operands' strides.
struct Gen<'a> {
    g: &'a Args<'a>,
    dims: AttentionDims,
    /// The storage dtype (q, k, v, mask and output).
    d: DType,
    acc_t: &'static str,
    ix: Ix,
    /// Each operand's strides (0 on dims of extent 1).
    st: Vec<Vec<i64>>,
}

const NAMES: [&str; 4] = ["q", "k", "v", "m"];

impl<'a> Gen<'a> {
    /// The generator of `g`'s operands (q, k, v and maybe a mask) of `dims`.
    fn new(g: &'a Args<'a>, dims: AttentionDims) -> Gen<'a> {
        let d = dims.dtype;
        let acc_t = if d == DType::F64 { "double" } else { "float" };
        let nb: usize = dims.batch.iter().product();
        let tiles = nb * dims.hq * dims.sq.div_ceil(WARPS);
        // Index type: wide when any operand's reach or the output passes 2^30 elements.
        let mut wide = g.out.numel() >= 1 << 30 || tiles >= 1 << 30;
        for (a, t) in g.inputs {
            wide |= Ix::for_space(t.shape.dims(), &[(a.offset, &a.strides[..])], 0).wide;
        }
        Gen {
            g,
            d,
            acc_t,
            ix: Ix { wide },
            st: g.inputs.iter().map(|(a, ty)| strides(a, ty)).collect(),
            dims,
        }
    }

    /// `attention_lse` as the forward's kernel without v: on tensor cores where that
    /// kernel takes the dims (`mma::generate` with `lse`), else the CUDA-core tiled
    /// kernel's ([`tiled::Kernel::Lse`]); `g`'s operands are q, k and maybe a mask.
    /// `None` for dims the forward does not take.
    fn lse_kernel(g: &Args<'_>) -> Option<(String, Helpers, LaunchConfig)> {
        let (q, k) = (g.inputs.first()?, g.inputs.get(1)?);
        let mut inputs = vec![q.clone(), k.clone(), k.clone()];
        let mut in_param = vec![g.in_param[0], g.in_param[1], g.in_param[1]];
        if let (Some(m), Some(&pm)) = (g.inputs.get(2), g.in_param.get(2)) {
            inputs.push(m.clone());
            in_param.push(pm);
        }
        let tys: Vec<&TensorType> = inputs.iter().map(|(_, t)| t).collect();
        let dims = AttentionDims::of(&tys).ok()?;
        if dims.d > MAX_HEAD_DIM || dims.sk == 0 {
            return None;
        }
        let args = Args {
            inputs: &inputs,
            in_param: &in_param,
            params_decl: g.params_decl.clone(),
            ..*g
        };
        let nb: usize = dims.batch.iter().product();
        if mma::applies(&dims) {
            let gen = Gen::new(&args, dims);
            let mut h = Helpers::new();
            let (source, launch) = mma::generate(&gen, &mut h, nb, true);
            return Some((source, h, launch));
        }
        Some(tiled::generate(
            &backward::Gen::new(&args, dims, forward_roles(args.inputs.len())),
            tiled::Kernel::Lse,
        ))
    }
}

impl Gen<'_> {
    fn l(&self, x: usize) -> String {
        self.ix.lit(x as i64)
    }

    fn p(&self, n: usize) -> String {
        format!("p{}", self.g.in_param[n])
    }

    fn nbd(&self) -> usize {
        self.dims.batch.len()
    }

    /// Operand `n`'s load at row `row` and column `col` from its base, as `acc_t`.
    fn load(&self, h: &mut Helpers, n: usize, row: &str, col: &str) -> String {
        let (nbd, st) = (self.nbd(), &self.st[n]);
        let v = cuda::load_conv(
            h,
            self.d,
            &format!(
                "{}[{}base + {row} * {} + {col} * {}]",
                self.p(n),
                NAMES[n],
                self.ix.lit(st[nbd + 1]),
                self.ix.lit(st[nbd + 2])
            ),
        );
        format!("({}){v}", self.acc_t)
    }
}

pub(crate) fn generate(g: &Args<'_>) -> Result<(&'static str, (String, Helpers), LaunchConfig), CodegenError> {
    let tys: Vec<&TensorType> = g.inputs.iter().map(|(_, t)| t).collect();
    let dims = AttentionDims::of(&tys).map_err(|m| g.cx.malformed(m))?;
    if dims.out_dims() != g.out.shape.dims() || g.out.dtype != dims.dtype {
        return Err(g.cx.malformed(format!(
            "attention gives {:?}, its output is {}",
            dims.out_dims(),
            g.out
        )));
    }
    if dims.d > MAX_HEAD_DIM || dims.dv > MAX_HEAD_DIM {
        return Err(CodegenError::UnsupportedOp {
            kernel: g.cx.kernel.clone(),
            op: format!(
                "attention with head dim {} / {} (at most {MAX_HEAD_DIM})",
                dims.d, dims.dv
            ),
        });
    }
    let nb: usize = dims.batch.iter().product();
    if mma::applies(&dims) {
        let gen = Gen::new(g, dims);
        let mut h = Helpers::new();
        let (source, launch) = mma::generate(&gen, &mut h, nb, false);
        return Ok(("attention", (source, h), launch));
    }
    if g.also.is_some() {
        return Err(g.cx.malformed("the CUDA-core attention stores no log-sum-exp"));
    }
    let gen = backward::Gen::new(g, dims, forward_roles(g.inputs.len()));
    let (source, h, launch) = tiled::generate(&gen, tiled::Kernel::Forward);
    Ok(("attention", (source, h), launch))
}

/// The roles of the forward's `n` operands: q, k, v and maybe a mask.
fn forward_roles(n: usize) -> Vec<(backward::Role, usize)> {
    use backward::Role;
    let mut roles = vec![(Role::Q, 0), (Role::K, 1), (Role::V, 2)];
    if n > 3 {
        roles.push((Role::Mask, 3));
    }
    roles
}
