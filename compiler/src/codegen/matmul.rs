//! Matmul kernels: a cuBLASLt GEMM ([`GemmDesc`]), with as much of the body as
//! cuBLASLt does natively folded into it, and the rest as a generated elementwise
//! epilogue kernel over the output.
//!
//! Native: `act(acc [+ C] [+ bias])` where `act` is nothing, relu or the tanh GELU
//! (cuBLASLt's GELU is the tanh approximation: the erf GELU is not native), `C` is a
//! same-shaped tensor (`D = alpha*AB + beta*C`, beta = 1) and `bias` a load along `n`
//! broadcast over `m` and the batch. The chain must be the only use of the product.
//!
//! In the backward: `gelu_tanh_grad(alpha acc, x)` with `x` the forward's pre-activation
//! (a 16-bit `[m, n]` input laid out as D) is `DGELU`, `x` its aux matrix.

use serde::{Deserialize, Serialize};

use graphc_ir::{BinaryOp, DType, UnaryOp};

use super::{elementwise, CodegenError, Ctx, CudaKernel, LaunchConfig, SCRATCH};
use crate::kernel::{contiguous_strides, Access, Body, BufferId, Expr, ExprId, InputId, Store};

/// The accumulation of a GEMM.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum GemmCompute {
    /// f32 accumulation (`CUBLAS_COMPUTE_32F`): f32, f16 and bf16 operands. The IR
    /// accumulates in f32; TF32 (`CUBLAS_COMPUTE_32F_FAST_TF32`) is a runtime choice.
    F32,
    /// f64 (`CUBLAS_COMPUTE_64F`).
    F64,
}

/// The epilogue cuBLASLt applies (`CUBLASLT_EPILOGUE_*`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum GemmEpilogue {
    /// `DEFAULT`.
    None,
    /// `BIAS`.
    Bias,
    /// `RELU`.
    Relu,
    /// `GELU` (the tanh approximation).
    Gelu,
    /// `RELU_BIAS`.
    BiasRelu,
    /// `GELU_BIAS`.
    BiasGelu,
    /// `DGELU`: `D = (alpha A B) * gelu_tanh'(aux)`, the tanh GELU's backward of the
    /// product at the pre-activation [`GemmDesc::aux`] (`EPILOGUE_AUX_POINTER`).
    #[serde(rename = "dgelu")]
    DGelu,
    /// `BGRADA`: D is the bare product, and the bias buffer is *written* with cuBLASLt's
    /// A (our `b`) summed over `k`: `n` values (a [`crate::kernel::BiasGrad`] of `b`).
    #[serde(rename = "bgrada")]
    BGradA,
    /// `BGRADB`: as [`GemmEpilogue::BGradA`] for cuBLASLt's B (our `a`): `m` values.
    #[serde(rename = "bgradb")]
    BGradB,
}

impl GemmEpilogue {
    /// `BGradA` / `BGradB`: the bias pointer is an output (a bias gradient).
    pub fn writes_bias(self) -> bool {
        matches!(self, GemmEpilogue::BGradA | GemmEpilogue::BGradB)
    }
}

/// One matrix operand, in row-major terms.
///
/// Element `(i, j)` of batch `b` of the logical `rows x cols` matrix is at element
/// `offset + b * batch_stride + (if trans { j * ld + i } else { i * ld + j })` of the
/// buffer. `trans == false`: stored row-major (`ld` = row stride, `>= cols`);
/// `trans == true`: stored column-major, i.e. as the row-major transpose (`ld >= rows`).
/// `batch_stride == 0` broadcasts one matrix over the batch.
///
/// cuBLASLt is column-major: a row-major `rows x cols` matrix with `ld` is a
/// column-major `cols x rows` one with the same `ld`. So compute `D^T = B^T A^T`: pass
/// `b` as cuBLASLt's A (layout `n x k` when `!b.trans`, else `k x n`, with `b.ld`,
/// `CUBLASLT_MATMUL_DESC_TRANSA` = `b.trans`), `a` as cuBLASLt's B (layout `k x m` when
/// `!a.trans`, else `m x k`, `TRANSB` = `a.trans`), and C/D as `n x m` with their `ld`.
/// The bias (a vector along `n`) is then along cuBLASLt's rows, as it expects.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct GemmOperand {
    pub buffer: BufferId,
    pub dtype: DType,
    pub offset: i64,
    pub trans: bool,
    pub ld: i64,
    pub batch_stride: i64,
}

/// Where the GEMM writes `D`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum GemmOutput {
    /// Into this buffer: the store of the native part of the body, or (in place) the
    /// buffer of a store of D's type that the generated epilogue reads D from and then
    /// overwrites, element by element.
    Buffer(BufferId),
    /// Into a scratch buffer of `GemmDesc::scratch_bytes` that the epilogue kernel reads
    /// (its [`super::ParamTarget::GemmScratch`] parameter), when no store can take D.
    Scratch,
}

/// One cuBLASLt matmul: `D = epilogue(alpha * A B [+ beta * C] [+ bias])`, batched.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct GemmDesc {
    pub m: u64,
    pub n: u64,
    pub k: u64,
    /// Number of matrices (product of the batch dims; 1 without batch dims).
    pub batch: u64,
    /// `[m, k]` operand.
    pub a: GemmOperand,
    /// `[k, n]` operand.
    pub b: GemmOperand,
    /// A same-shaped `[m, n]` addend (never transposed), with `beta`.
    pub beta_c: Option<GemmOperand>,
    pub d: GemmOutput,
    /// `D` is row-major `[batch, m, n]`, contiguous: `ld = n`, batch stride `m * n`.
    pub d_dtype: DType,
    /// Element offset of `D` in its buffer.
    pub d_offset: i64,
    pub alpha: f64,
    pub beta: f64,
    pub epilogue: GemmEpilogue,
    /// The bias vector (`n` elements, contiguous) for `Bias*` epilogues; for `BGrad*`
    /// the bias gradient the GEMM writes (`n` elements for `BGradA`, `m` for `BGradB`).
    pub bias: Option<GemmOperand>,
    /// The aux matrix of [`GemmEpilogue::DGelu`]: `[m, n]` row-major like D (never
    /// transposed, `ld` a multiple of 8, 16-byte aligned), of D's type.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub aux: Option<GemmOperand>,
    pub compute: GemmCompute,
    /// Bytes of scratch for [`GemmOutput::Scratch`] (0 otherwise).
    pub scratch_bytes: u64,
}

pub(crate) use crate::kernel::MatMulKernel;

/// A `rows x cols` operand (last two dims of `a`) with its batch dims collapsed.
fn operand(
    cx: &Ctx,
    name: &str,
    a: &Access,
    batch: &[usize],
    rows: usize,
    cols: usize,
    allow_trans: bool,
) -> Result<GemmOperand, CodegenError> {
    let err = |why: String| CodegenError::OperandLayout {
        kernel: cx.kernel.clone(),
        operand: name.to_string(),
        why,
    };
    let r = batch.len();
    if a.strides.len() != r + 2 {
        return Err(cx.malformed(format!(
            "matmul operand {name} has rank {}, expected {}",
            a.strides.len(),
            r + 2
        )));
    }
    if a.offset < 0 {
        return Err(err(format!("negative offset {}", a.offset)));
    }
    let (sr, sc) = (a.strides[r], a.strides[r + 1]);
    let (ri, ci) = (rows as i64, cols as i64);
    let (trans, ld) = if (cols == 1 || sc == 1) && (rows == 1 || sr >= ci) {
        (false, if rows == 1 { ci.max(1) } else { sr })
    } else if allow_trans && (rows == 1 || sr == 1) && (cols == 1 || sc >= ri) {
        (true, if cols == 1 { ri.max(1) } else { sc })
    } else {
        return Err(err(format!(
            "its last two dims [{rows}, {cols}] have strides [{sr}, {sc}], contiguous in neither order"
        )));
    };
    // Batch dims: one uniform stride (nested contiguously), or all broadcast.
    let live: Vec<(usize, i64)> = batch
        .iter()
        .zip(&a.strides[..r])
        .filter(|(&d, _)| d > 1)
        .map(|(&d, &s)| (d, s))
        .collect();
    let batch_stride = if live.iter().all(|&(_, s)| s == 0) {
        0
    } else {
        if live.iter().any(|&(_, s)| s <= 0) {
            return Err(err(format!(
                "its batch strides {:?} mix broadcast (or negative) and strided dims",
                &a.strides[..r]
            )));
        }
        for w in live.windows(2) {
            if w[0].1 != w[1].1 * w[1].0 as i64 {
                return Err(err(format!(
                    "its batch dims {batch:?} with strides {:?} do not collapse to one batch stride",
                    &a.strides[..r]
                )));
            }
        }
        live.last().map(|&(_, s)| s).unwrap_or(0)
    };
    Ok(GemmOperand {
        buffer: a.buffer,
        dtype: cx.dtype(a.buffer)?,
        offset: a.offset,
        trans,
        ld,
        batch_stride,
    })
}

/// The single user of each expression (None: unused or used more than once, stores
/// counting as users).
fn single_users(body: &Body, stores: &[Store]) -> Vec<Option<ExprId>> {
    let n = body.exprs.len();
    let mut count = vec![0usize; n];
    let mut user = vec![None; n];
    for (i, (e, _)) in body.exprs.iter().enumerate() {
        for o in super::cuda::operands(e) {
            count[o.index()] += 1;
            user[o.index()] = Some(ExprId(i as u32));
        }
    }
    for s in stores {
        if let Some(c) = count.get_mut(s.value.index()) {
            *c += 1;
        }
    }
    (0..n).map(|i| if count[i] == 1 { user[i] } else { None }).collect()
}

/// The elementwise kernel of a matmul's generated epilogue: the body over the output
/// space, with the GEMM's `D` read back through the last input (the scratch buffer
/// [`SCRATCH`] or `D`'s own buffer).
pub(crate) struct EpilogueParts {
    pub space: Vec<usize>,
    pub inputs: Vec<Access>,
    pub body: Body,
    pub stores: Vec<Store>,
}

pub(crate) fn generate(cx: &Ctx, mk: &MatMulKernel) -> Result<CudaKernel, CodegenError> {
    if let Some(q) = &mk.quant {
        return super::quant_gemm::generate(cx, mk, q);
    }
    let (gemm, parts) = split(cx, mk)?;
    let Some(p) = parts else {
        return Ok(CudaKernel {
            name: String::new(),
            source: String::new(),
            entry: String::new(),
            params: Vec::new(),
            launch: LaunchConfig::none(),
            gemm: Some(gemm),
        });
    };
    let ecx = Ctx {
        program: cx.program,
        kernel: cx.kernel.clone(),
        scratch: Some(gemm.d_dtype),
        in_place: match gemm.d {
            GemmOutput::Buffer(b) => Some(b),
            GemmOutput::Scratch => None,
        },
    };
    let mut ker = elementwise::generate(&ecx, &p.space, &p.inputs, &p.body, &p.stores)?;
    ker.gemm = Some(gemm);
    Ok(ker)
}

/// The fields of a matmul kernel [`split`] reads, borrowed (built once there: once
/// `KernelKind::MatMul` holds a struct, this can be that struct, borrowed).
#[derive(Clone, Copy)]
struct MatMulFields<'a> {
    batch: &'a [usize],
    m: usize,
    n: usize,
    k: usize,
    a: &'a Access,
    b: &'a Access,
    inputs: &'a [Access],
    body: &'a Body,
    stores: &'a [Store],
}

/// The GEMM of a matmul kernel and the generated epilogue's elementwise kernel (None
/// when cuBLASLt computes the whole body).
pub(crate) fn split(cx: &Ctx, mk: &MatMulKernel) -> Result<(GemmDesc, Option<EpilogueParts>), CodegenError> {
    if mk.quant.is_some() {
        return Err(cx.malformed("a quantized matmul has no cuBLASLt GEMM"));
    }
    let mm = MatMulFields {
        batch: &mk.batch,
        m: mk.m,
        n: mk.n,
        k: mk.k,
        a: &mk.a,
        b: &mk.b,
        inputs: &mk.inputs,
        body: &mk.body,
        stores: &mk.stores,
    };
    let (m, n, k) = (mm.m, mm.n, mm.k);
    let (acc_ids, dtype, compute) = product_type(cx, mm)?;
    let a = operand(cx, "a", mm.a, mm.batch, m, k, true)?;
    let b = operand(cx, "b", mm.b, mm.batch, k, n, true)?;
    let batch: usize = mm.batch.iter().product();
    let space: Vec<usize> = mm.batch.iter().copied().chain([m, n]).collect();
    let mut chain = native_chain(cx, mm, &acc_ids, dtype)?;
    // A bias gradient: the bare product (fusion merges it only into such a kernel).
    if let Some(g) = &mk.bias_grad {
        if chain.bias.is_some() || chain.beta_c.is_some() || chain.act.is_some() || chain.aux.is_some() {
            return Err(cx.malformed("a bias gradient beside a GEMM epilogue"));
        }
        if dtype == DType::F64 || batch_count(mm.batch) != 1 {
            return Err(cx.unsupported(format!("a bias gradient of a {dtype} GEMM of batch {:?}", mm.batch)));
        }
        let st = &g.store;
        if st.offset < 0 || st.strides.as_slice() != [1] || cx.dtype(st.buffer)? != dtype {
            return Err(cx.malformed("a bias gradient not stored contiguously in the product's type"));
        }
        chain.bias = Some(GemmOperand {
            buffer: st.buffer,
            dtype,
            offset: st.offset,
            trans: false,
            ld: g.len(mk) as i64,
            batch_stride: 0,
        });
    }
    // BGRADA takes cuBLASLt's A (our b) non-transposed, BGRADB its B (our a) transposed.
    let reduced_trans = match mk.bias_grad.as_ref().map(|g| g.operand) {
        Some(crate::kernel::Operand::B) => Some(b.trans),
        Some(crate::kernel::Operand::A) => Some(!a.trans),
        None => None,
    };
    if reduced_trans == Some(true) && m > 1 && n > 1 {
        return Err(cx.unsupported("a bias gradient of an operand not contiguous along the bias"));
    }
    let epilogue = match (chain.bias.is_some(), chain.act) {
        _ if chain.aux.is_some() => GemmEpilogue::DGelu,
        _ if mk.bias_grad.is_some() => match mk.bias_grad.as_ref().map(|g| g.operand) {
            Some(crate::kernel::Operand::B) => GemmEpilogue::BGradA,
            _ => GemmEpilogue::BGradB,
        },
        (false, None) => GemmEpilogue::None,
        (true, None) => GemmEpilogue::Bias,
        (false, Some(UnaryOp::Relu)) => GemmEpilogue::Relu,
        (true, Some(UnaryOp::Relu)) => GemmEpilogue::BiasRelu,
        (false, Some(_)) => GemmEpilogue::Gelu,
        (true, Some(_)) => GemmEpilogue::BiasGelu,
    };

    // Where D goes: the store of the native value if it is a plain contiguous write.
    let contiguous = contiguous_strides(&space);
    let direct = chain.cur.and_then(|c| {
        mm.stores.iter().position(|s| {
            s.value == c
                && s.access.offset >= 0
                && crate::kernel::strides_equal(&s.access.strides, &contiguous, &space)
                && cx.dtype(s.access.buffer).ok() == Some(dtype)
        })
    });
    // Else in place: D into a store's buffer of D's type (contiguous, read by no input)
    // that the epilogue then overwrites, each element read and written by one thread
    // (matmul outputs never share storage with its inputs), so no scratch is needed.
    // One store only: its value is computed from D's element before it is written.
    let in_place = match direct {
        Some(_) => None,
        None if mm.stores.len() != 1 => None,
        None => mm.stores.iter().position(|s| {
            s.access.offset >= 0
                && crate::kernel::strides_equal(&s.access.strides, &contiguous, &space)
                && cx.dtype(s.access.buffer).ok() == Some(dtype)
                && ![mm.a, mm.b]
                    .into_iter()
                    .chain(mm.inputs)
                    .any(|a| a.buffer == s.access.buffer)
        }),
    };
    let (d, d_offset) = match direct.or(in_place) {
        Some(i) => (
            GemmOutput::Buffer(mm.stores[i].access.buffer),
            mm.stores[i].access.offset,
        ),
        None => (GemmOutput::Scratch, 0),
    };
    let scratch_bytes = if d == GemmOutput::Scratch {
        (batch * m * n * dtype.size_bytes()) as u64
    } else {
        0
    };
    let gemm = GemmDesc {
        m: m as u64,
        n: n as u64,
        k: k as u64,
        batch: batch as u64,
        a,
        b,
        beta: if chain.beta_c.is_some() { 1.0 } else { 0.0 },
        beta_c: chain.beta_c,
        d,
        d_dtype: dtype,
        d_offset,
        alpha: chain.alpha,
        epilogue,
        bias: chain.bias,
        aux: chain.aux,
        compute,
        scratch_bytes,
    };

    // The epilogue: the other stores, with the native value read back from D.
    let rest: Vec<Store> = mm
        .stores
        .iter()
        .enumerate()
        .filter(|&(i, _)| Some(i) != direct)
        .map(|(_, s)| s.clone())
        .collect();
    if rest.is_empty() {
        return Ok((gemm, None));
    }
    let d_access = Access {
        buffer: match d {
            GemmOutput::Buffer(b) => b,
            GemmOutput::Scratch => SCRATCH,
        },
        offset: d_offset,
        strides: contiguous,
    };
    let (inputs, body) = read_back(mm, d_access, &acc_ids, chain.cur);
    Ok((
        gemm,
        Some(EpilogueParts {
            space,
            inputs,
            body,
            stores: rest,
        }),
    ))
}

/// The `acc` expressions of the body, the product's dtype (that of the operands) and
/// the GEMM's accumulation for it.
fn product_type(cx: &Ctx, mm: MatMulFields) -> Result<(Vec<ExprId>, DType, GemmCompute), CodegenError> {
    let body = mm.body;
    let acc_ids: Vec<ExprId> = body.ids().filter(|i| body.exprs[i.index()].0 == Expr::Acc).collect();
    let dtype = match acc_ids.first() {
        Some(&i) => body.dtype(i),
        None => cx.dtype(mm.a.buffer)?,
    };
    let compute = match dtype {
        DType::F32 | DType::F16 | DType::BF16 => GemmCompute::F32,
        DType::F64 => GemmCompute::F64,
        d => {
            return Err(cx.unsupported(format!(
                "a {d} matmul cannot run on cuBLASLt (integer matmuls are op kernels)"
            )))
        }
    };
    if acc_ids.iter().any(|&i| body.dtype(i) != dtype) {
        return Err(cx.malformed("acc expressions of different types"));
    }
    for (nm, acc) in [("a", mm.a), ("b", mm.b)] {
        let d = cx.dtype(acc.buffer)?;
        if d != dtype {
            return Err(cx.malformed(format!("matmul operand {nm} is {d}, the product {dtype}")));
        }
    }
    Ok((acc_ids, dtype, compute))
}

/// The part of the body cuBLASLt computes: `act(alpha acc [+ C] [+ bias])`.
struct Chain {
    /// The chain's last expression (None: the body has no `acc`).
    cur: Option<ExprId>,
    bias: Option<GemmOperand>,
    beta_c: Option<GemmOperand>,
    act: Option<UnaryOp>,
    /// `DGELU`'s pre-activation (the chain then ends).
    aux: Option<GemmOperand>,
    alpha: f64,
}

/// The native chain from the (single) `acc`: acc [* alpha] [+ C] [+ bias] [relu |
/// gelu_tanh], each step the only user of the one before.
fn native_chain(cx: &Ctx, mm: MatMulFields, acc_ids: &[ExprId], dtype: DType) -> Result<Chain, CodegenError> {
    let (body, m, n) = (mm.body, mm.m, mm.n);
    let users = single_users(body, mm.stores);
    let mut ch = Chain {
        cur: acc_ids.first().copied(),
        bias: None,
        beta_c: None,
        act: None,
        aux: None,
        alpha: 1.0,
    };
    let bias_shaped = |x: &Access| {
        let r = mm.batch.len();
        x.strides[..r].iter().zip(mm.batch).all(|(&s, &d)| s == 0 || d == 1)
            && (m == 1 || x.strides[r] == 0)
            && (n == 1 || x.strides[r + 1] == 1)
            && x.offset >= 0
    };
    let native_ok = acc_ids.len() == 1;
    while let (true, Some(c)) = (native_ok, ch.cur) {
        let Some(u) = users[c.index()] else { break };
        match &body.exprs[u.index()].0 {
            Expr::Binary(BinaryOp::Add, x, y) if ch.act.is_none() => {
                let other = if *x == c { *y } else { *x };
                let Expr::Load(ni) = body.exprs[other.index()].0 else {
                    break;
                };
                let input = &mm.inputs[ni.index()];
                if cx.dtype(input.buffer)? != dtype {
                    break;
                }
                if ch.bias.is_none() && dtype != DType::F64 && bias_shaped(input) {
                    ch.bias = Some(GemmOperand {
                        buffer: input.buffer,
                        dtype,
                        offset: input.offset,
                        trans: false,
                        ld: n as i64,
                        batch_stride: 0,
                    });
                } else if ch.beta_c.is_none() {
                    // D = act(alpha AB + beta C + bias): C and bias both add before
                    // the activation, in either order.
                    match operand(cx, "c", input, mm.batch, m, n, false) {
                        Ok(op) => ch.beta_c = Some(op),
                        Err(_) => break,
                    }
                } else {
                    break;
                }
                ch.cur = Some(u);
            }
            // A scale of the product before anything is added: cuBLASLt's alpha.
            Expr::Binary(BinaryOp::Mul, x, y) if ch.bias.is_none() && ch.beta_c.is_none() && ch.act.is_none() => {
                let other = if *x == c { *y } else { *x };
                let Expr::Const(t) = &body.exprs[other.index()].0 else {
                    break;
                };
                match t.to_f64_vec().first() {
                    Some(v) if v.is_finite() => ch.alpha *= v,
                    _ => break,
                }
                ch.cur = Some(u);
            }
            Expr::Unary(op @ (UnaryOp::Relu | UnaryOp::GeluTanh), _) if ch.act.is_none() && dtype != DType::F64 => {
                ch.act = Some(*op);
                ch.cur = Some(u);
                break;
            }
            // The product is the gradient (left), a same-shaped 16-bit load the
            // pre-activation: DGELU (nothing added: cuBLASLt's DGELU adds no bias).
            Expr::Binary(BinaryOp::GeluTanhGrad, x, y)
                if *x == c
                    && ch.bias.is_none()
                    && ch.beta_c.is_none()
                    && ch.act.is_none()
                    && matches!(dtype, DType::F16 | DType::BF16) =>
            {
                let Expr::Load(ni) = body.exprs[y.index()].0 else {
                    break;
                };
                let input = &mm.inputs[ni.index()];
                if cx.dtype(input.buffer)? != dtype {
                    break;
                }
                match operand(cx, "aux", input, mm.batch, m, n, false) {
                    Ok(op) if dgelu_aux_ok(&op, m, n, mm.batch.iter().product()) => ch.aux = Some(op),
                    _ => break,
                }
                ch.cur = Some(u);
                break;
            }
            _ => break,
        }
    }
    Ok(ch)
}

fn batch_count(batch: &[usize]) -> usize {
    batch.iter().product()
}

/// Whether cuBLASLt takes `aux` as DGELU's aux matrix: laid out as D (row stride `n`,
/// a multiple of 8 elements; 16-byte aligned; batches contiguous after each other).
fn dgelu_aux_ok(aux: &GemmOperand, m: usize, n: usize, batch: usize) -> bool {
    let ld = n as i64;
    !aux.trans
        && (aux.ld == ld || m == 1)
        && ld % 8 == 0
        && aux.offset % 8 == 0
        && (batch == 1 || aux.batch_stride == (m * n) as i64)
}

/// The epilogue's inputs and body: `D` read through a new last input, by every `acc`
/// (those inside the native chain are dead) and by the chain's last expression.
fn read_back(mm: MatMulFields, d: Access, acc_ids: &[ExprId], cur: Option<ExprId>) -> (Vec<Access>, Body) {
    let mut inputs = mm.inputs.to_vec();
    inputs.push(d);
    let load = Expr::Load(InputId((inputs.len() - 1) as u32));
    let mut ebody = mm.body.clone();
    for &i in acc_ids {
        ebody.exprs[i.index()].0 = load.clone();
    }
    if let Some(c) = cur {
        ebody.exprs[c.index()].0 = load;
    }
    (inputs, ebody)
}
