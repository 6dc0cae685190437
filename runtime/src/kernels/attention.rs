//! The attention kernel on the CPU: what the generated CUDA kernels compute (their
//! own key tiles are 64 keys on CUDA cores, 16 to 64 on tensor cores: the sums differ
//! by rounding). Per query row, keys are visited in tiles of [`KEY_TILE`]; each tile's
//! scores raise the running max `m` (the accumulated sum `l` and output `acc` are
//! rescaled by `exp(m_old - m)`), its exponentials are added to `l` and its `p v` to
//! `acc`; the row is `acc / l` at the end (online softmax, f32 throughout, f64 for f64).
//! With `causal`, tiles wholly above the diagonal are skipped. The score matrix is
//! never formed.
//!
//! The interpreter (`graphc_ir::interp`) computes attention by its two-pass definition;
//! the two agree to rounding (`runtime/tests/attention_exec.rs`).

use graphc_compiler::kernel::{Access, BufferId};
use graphc_ir::interp::attention::{flat_batch_mask, nan_max, Flags, Real};
use graphc_ir::{AttentionDims, DType, Tensor, TensorData, TensorType};

use super::access::gather;
use super::Ctx;

/// Keys per tile.
pub const KEY_TILE: usize = 32;

/// One attention's operands as flat slices (`mask` with its strides over
/// `[batch (flat), hq, sq, sk]`).
struct Rows<'a, T> {
    q: &'a [T],
    k: &'a [T],
    v: &'a [T],
    mask: Option<(&'a [T], [usize; 4])>,
}

fn tiled<T: Real>(dims: &AttentionDims, x: &Rows<'_, T>, flags: Flags) -> Vec<T> {
    let Flags {
        scale,
        causal,
        zero_masked_rows,
    } = flags;
    let nb: usize = dims.batch.iter().product();
    let (hq, hkv, sq, sk, d, dv) = (dims.hq, dims.hkv, dims.sq, dims.sk, dims.d, dims.dv);
    let group = dims.group();
    let scale = T::from_f64(scale);
    let mut out = vec![T::ZERO; nb * hq * sq * dv];
    let mut s = [T::ZERO; KEY_TILE];
    let mut acc = vec![T::ZERO; dv];
    for b in 0..nb {
        for h in 0..hq {
            let kv = (b * hkv + h / group) * sk;
            for i in 0..sq {
                let qrow = &x.q[((b * hq + h) * sq + i) * d..][..d];
                let (mut m, mut l) = (T::NEG_INF, T::ZERO);
                acc.fill(T::ZERO);
                // Causal: keys after row i are masked; their tiles are never read.
                let end = if causal { sk.min(i + 1) } else { sk };
                for j0 in (0..end).step_by(KEY_TILE) {
                    let n = KEY_TILE.min(end - j0);
                    let mut tile_max = T::NEG_INF;
                    for (t, st) in s.iter_mut().enumerate().take(n) {
                        let j = j0 + t;
                        let krow = &x.k[(kv + j) * d..][..d];
                        let mut dot = T::ZERO;
                        for (a, c) in qrow.iter().zip(krow) {
                            dot = dot + *a * *c;
                        }
                        let mut v = dot * scale;
                        if let Some((mk, ms)) = &x.mask {
                            v = v + mk[b * ms[0] + h * ms[1] + i * ms[2] + j * ms[3]];
                        }
                        *st = v;
                        tile_max = nan_max(tile_max, v);
                    }
                    let m_new = nan_max(m, tile_max);
                    if m_new == T::NEG_INF {
                        // Everything so far is masked out: nothing to add.
                        continue;
                    }
                    let corr = (m - m_new).exp();
                    l = l * corr;
                    for a in acc.iter_mut() {
                        *a = *a * corr;
                    }
                    for (t, st) in s.iter().enumerate().take(n) {
                        let p = (*st - m_new).exp();
                        l = l + p;
                        let vrow = &x.v[(kv + j0 + t) * dv..][..dv];
                        for (a, c) in acc.iter_mut().zip(vrow) {
                            *a = *a + p * *c;
                        }
                    }
                    m = m_new;
                }
                let orow = &mut out[((b * hq + h) * sq + i) * dv..][..dv];
                // `l` is 0 when every key is masked and NaN when a score is NaN or
                // `+inf`: the rows `zero_masked_rows` gives as 0.
                if zero_masked_rows && l.partial_cmp(&T::ZERO) != Some(std::cmp::Ordering::Greater) {
                    continue;
                }
                for (o, a) in orow.iter_mut().zip(&acc) {
                    // A row with every key masked: l = 0, so 0 / 0 = NaN.
                    *o = *a / l;
                }
            }
        }
    }
    out
}

/// [`tiled`] over dense operands (q, k, v, and a mask with its strides), in the
/// arithmetic `T` (f32 for f32/f16/bf16: their values widen exactly).
fn tiled_of<T: Real>(dims: &AttentionDims, args: &[Tensor], mask_strides: Option<[usize; 4]>, flags: Flags) -> Vec<T> {
    let f = |t: &Tensor| t.to_f64_vec().into_iter().map(T::from_f64).collect::<Vec<T>>();
    let (q, k, v) = (f(&args[0]), f(&args[1]), f(&args[2]));
    let m = args.get(3).map(f);
    let rows = Rows {
        q: &q,
        k: &k,
        v: &v,
        mask: m.as_deref().zip(mask_strides),
    };
    tiled(dims, &rows, flags)
}

/// Run an attention op kernel: operands gathered through their accesses (a mask at
/// its own small shape), the tiled online softmax, the output rounded once.
pub(super) fn run(
    ctx: &Ctx,
    flags: Flags,
    inputs: &[(Access, TensorType)],
    output: BufferId,
) -> Result<Vec<(BufferId, Tensor)>, String> {
    let out = ctx.writable(output)?;
    let tys: Vec<&TensorType> = inputs.iter().map(|(_, t)| t).collect();
    let dims = AttentionDims::of(&tys)?;
    if dims.out_dims() != out.ty.shape.dims() || out.ty.dtype != tys[0].dtype {
        return Err(format!(
            "attention gives {:?}, its output is {}",
            dims.out_dims(),
            out.ty
        ));
    }
    let mut args = Vec::with_capacity(inputs.len());
    for (acc, ty) in inputs {
        args.push(gather(ctx.value(acc.buffer)?, acc, ty.shape.dims())?);
    }
    // The mask at its small shape, expanded over the batch only where one stride
    // cannot walk it (the interpreter's own rule).
    let strides = match args.get_mut(3) {
        Some(m) => {
            let (t, st) = flat_batch_mask(&dims, m)?;
            *m = t;
            Some(st)
        }
        None => None,
    };
    let values = if out.ty.dtype == DType::F64 {
        TensorData::F64(tiled_of::<f64>(&dims, &args, strides, flags))
    } else {
        let o = tiled_of::<f32>(&dims, &args, strides, flags);
        TensorData::from_f64(out.ty.dtype, &o.into_iter().map(f64::from).collect::<Vec<f64>>())
    };
    let t = Tensor::new(out.ty.shape.clone(), values).map_err(|e| format!("internal error: {e}"))?;
    Ok(vec![(output, t)])
}
