//! The kernel IR: a fused program as a list of kernels over buffers.
//!
//! Fusion ([`crate::fuse`]) turns an optimized [`graphc_ir::Graph`] into a [`Program`].
//! Every kernel reads whole buffers through affine [`Access`]es (views are folded into
//! indexing) and writes whole, contiguous buffers. The per-element computation of a
//! kernel is a small SSA expression list ([`Body`]). The same IR is printed to CUDA C
//! (`crate::codegen`) and executed by the CPU executor in `graphc-runtime`; the CPU
//! execution is what tests fused semantics without a GPU.
//!
//! Iteration spaces are row-major: index `i` of a space with dims `d` is the
//! multi-index `(i_0, .., i_{r-1})`, and an access reads element
//! `offset + sum_k i_k * strides[k]` of its buffer (strides in elements; 0 broadcasts,
//! negative strides walk a reversed slice).

mod print;
pub mod verify;

use serde::{Deserialize, Serialize};

use graphc_ir::{BinaryOp, ConvGeom, DType, Op, ReduceOp, Tensor, TensorType, UnaryOp, Window};

pub use print::{annotate_ir, print_program};
pub use verify::{describe_buffer, verify, verify_kernel, KernelVerifyError};

/// Index of a buffer in [`Program::buffers`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct BufferId(pub u32);

impl BufferId {
    pub fn index(self) -> usize {
        self.0 as usize
    }
}

/// Where a buffer's bytes come from.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BufferKind {
    /// A graph input, bound by name.
    Input { name: String },
    /// A weight, bound by name to the graph's weights.
    Weight { name: String },
    /// A literal tensor (too large to inline into a kernel body).
    Constant { value: Tensor },
    /// Written by exactly one kernel; an intermediate or a graph output.
    Temp,
}

/// A dense, row-major tensor in memory.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Buffer {
    pub ty: TensorType,
    pub kind: BufferKind,
    /// The name of the IR node that defined it, if any (for reports).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
}

/// An affine read (or write) of a buffer from an iteration space: the element at
/// multi-index `i` is `offset + sum_k i[k] * strides[k]` (in elements).
/// `strides.len()` equals the rank of the space it is used in.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Access {
    pub buffer: BufferId,
    pub offset: i64,
    pub strides: Vec<i64>,
}

impl Access {
    /// The contiguous row-major access of a buffer of shape `dims` (identity indexing).
    pub fn contiguous(buffer: BufferId, dims: &[usize]) -> Access {
        Access {
            buffer,
            offset: 0,
            strides: contiguous_strides(dims),
        }
    }

    /// Whether this access reads a space of shape `dims` in plain row-major order.
    pub fn is_contiguous(&self, dims: &[usize]) -> bool {
        self.offset == 0 && strides_equal(&self.strides, &contiguous_strides(dims), dims)
    }
}

/// Row-major strides of `dims`, in elements.
pub fn contiguous_strides(dims: &[usize]) -> Vec<i64> {
    let mut s = vec![0i64; dims.len()];
    let mut acc = 1i64;
    for k in (0..dims.len()).rev() {
        s[k] = acc;
        acc = acc.saturating_mul(dims[k] as i64);
    }
    s
}

/// Stride vectors equal where it matters (dims of extent 1 are never stepped).
pub fn strides_equal(a: &[i64], b: &[i64], dims: &[usize]) -> bool {
    a.len() == b.len() && dims.len() == a.len() && (0..a.len()).all(|k| dims[k] == 1 || a[k] == b[k])
}

/// Defines a `u32` index newtype into one table of the kernel IR: serialized as the
/// bare number, displayed as it, `index()` for indexing.
macro_rules! index_newtype {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
        #[serde(transparent)]
        pub struct $name(pub u32);

        impl $name {
            pub fn index(self) -> usize {
                self.0 as usize
            }
        }

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                self.0.fmt(f)
            }
        }
    };
}

index_newtype!(
    /// Index of an expression in [`Body::exprs`].
    ExprId
);
index_newtype!(
    /// Index of an input in a kernel's `inputs` (what [`Expr::Load`] and
    /// [`Expr::Gather`] read).
    InputId
);
index_newtype!(
    /// Index of a stage in a row kernel's `stages` (what [`Expr::Stage`] reads).
    StageId
);

/// One SSA expression of a kernel body, computed per element of its space.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Expr {
    /// Element of kernel input `n` (an index into the kernel's `inputs`).
    Load(InputId),
    /// A literal scalar (a 0-d tensor of the expression's dtype).
    Const(Tensor),
    /// The index along axis `n` of the iteration space (as `Iota` gives it).
    Index(u32),
    Unary(UnaryOp, ExprId),
    Binary(BinaryOp, ExprId, ExprId),
    Select(ExprId, ExprId, ExprId),
    Cast(ExprId),
    /// Row kernels: the result of stage `n` for the current row.
    Stage(StageId),
    /// An indexed read (a gather folded into its consumer): element
    /// `access(i) + k * stride` of kernel input `input`'s buffer, where `k` is the value
    /// of the integer expression `index`, counted from the end when negative (as
    /// [`Op::Gather`] does). `k` outside `-extent..extent` is an error on the CPU; a GPU
    /// kernel reads 0.
    Gather {
        input: InputId,
        index: ExprId,
        stride: i64,
        extent: u64,
    },
    /// Matmul kernels: the product for the current output element, in the matmul's
    /// output dtype (accumulated as [`Op::MatMul`] defines), before the epilogue.
    Acc,
}

impl Expr {
    /// The expressions this one reads (a stage's value and the product are not
    /// operands: they come from the kernel, not the body).
    pub fn operands(&self) -> Vec<ExprId> {
        match self {
            Expr::Unary(_, a) | Expr::Cast(a) => vec![*a],
            Expr::Binary(_, a, b) => vec![*a, *b],
            Expr::Select(c, a, b) => vec![*c, *a, *b],
            Expr::Gather { index, .. } => vec![*index],
            Expr::Load(_) | Expr::Const(_) | Expr::Index(_) | Expr::Stage(_) | Expr::Acc => vec![],
        }
    }
}

/// A typed expression list in SSA order: operands precede their users.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Body {
    pub exprs: Vec<(Expr, DType)>,
}

impl Body {
    pub fn push(&mut self, e: Expr, dtype: DType) -> ExprId {
        self.exprs.push((e, dtype));
        ExprId((self.exprs.len() - 1) as u32)
    }

    pub fn dtype(&self, id: ExprId) -> DType {
        self.exprs[id.index()].1
    }

    /// The expression ids of the body, in order.
    pub fn ids(&self) -> impl Iterator<Item = ExprId> {
        (0..self.exprs.len() as u32).map(ExprId)
    }
}

/// A store of an expression to a whole output buffer.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Store {
    pub value: ExprId,
    /// Where element `i` of the store's space goes; covers the buffer exactly once.
    pub access: Access,
}

/// One reduction of a row kernel: `op` over the inner dims of `value` (an expression of
/// the full space), giving one value per row.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Stage {
    pub op: ReduceOp,
    pub value: ExprId,
}

/// Per element of `space`: `body` over `inputs` (accesses of rank `space.len()`),
/// stored by `stores` (each an access of rank `space.len()`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ElementwiseKernel {
    pub space: Vec<usize>,
    pub inputs: Vec<Access>,
    pub body: Body,
    pub stores: Vec<Store>,
}

/// Independent elementwise kernels run by one launch, each over its own space and
/// buffers (a training step's optimizer update over many parameters, as PyTorch's
/// multi-tensor `foreach` kernels): no part reads a buffer another part writes, so the
/// parts may run in any order or at once.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct MultiTensorKernel {
    pub parts: Vec<ElementwiseKernel>,
}

/// A row kernel over `outer ++ inner`: `stages` reduce over `inner` in order (a stage
/// may use earlier stages' results through [`Expr::Stage`]), then `row_stores`
/// write per-row values (space `outer`; they use stages and row-level loads only)
/// and `stores` write per-element values (space `outer ++ inner`).
///
/// `inputs` are accesses of rank `outer.len() + inner.len()`; a load used in a
/// row-level expression has zero strides over `inner`. Row-store accesses have rank
/// `outer.len()`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RowKernel {
    pub outer: Vec<usize>,
    pub inner: Vec<usize>,
    pub inputs: Vec<Access>,
    pub body: Body,
    pub stages: Vec<Stage>,
    pub row_stores: Vec<Store>,
    pub stores: Vec<Store>,
}

/// `[batch.., m, k] x [batch.., k, n]` through a GEMM library, then `body` per
/// output element (space `batch ++ [m, n]`, using [`Expr::Acc`] and loads of
/// `inputs`) stored by `stores`. `a` and `b` are accesses of rank `batch.len() + 2`
/// over `[batch.., m, k]` and `[batch.., k, n]`; a transposed operand has its last
/// two strides swapped in order.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct MatMulKernel {
    pub batch: Vec<usize>,
    pub m: usize,
    pub n: usize,
    pub k: usize,
    pub a: Access,
    pub b: Access,
    pub inputs: Vec<Access>,
    pub body: Body,
    pub stores: Vec<Store>,
    /// `b` is a weight-only quantized matrix, dequantized as it is read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quant: Option<QuantB>,
    /// A bias gradient computed beside the product (cuBLASLt's `BGRADA` / `BGRADB`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bias_grad: Option<BiasGrad>,
}

/// One of a matmul's two operands.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Operand {
    A,
    B,
}

/// A bias gradient a matmul kernel computes beside its product: operand `a` summed over
/// `k` (one value per row: `[m]`) or operand `b` summed over `k` (one per column: `[n]`),
/// as [`ReduceOp::Sum`] in the operand's type, stored by `store` (rank 1, over the whole
/// buffer). The kernel has no batch (every batch dim of extent 1). Made from the row
/// kernel that summed the operand (`crate::fuse::bias_grad`): the weight-gradient GEMM
/// `dW = xᵀ dy` and the bias gradient `Σ_tokens dy` read `dy` once.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct BiasGrad {
    pub operand: Operand,
    pub store: Access,
}

impl BiasGrad {
    /// The bias length: `m` (operand a) or `n` (operand b).
    pub fn len(&self, mm: &MatMulKernel) -> usize {
        match self.operand {
            Operand::A => mm.m,
            Operand::B => mm.n,
        }
    }
}

/// A matmul's right operand stored weight-only quantized ([`Op::Dequantize`] of a
/// weight, read transposed): `b` reads the packed buffer, `i8 [n, k]` at 8 bits or
/// `u8 [n, k/2]` at 4, as the logical `[k, n]` (offset 0, strides 0 over the batch,
/// then `[1, k]` in unpacked elements), and `B[k][n] = q[n][k] * scales[n][k / group]`
/// rounded to the scales' dtype, which is the product's.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct QuantB {
    pub bits: usize,
    pub group: usize,
    /// `[n, ceil(k / group)]`, float.
    pub scales: BufferId,
}

impl MatMulKernel {
    /// The output space `batch ++ [m, n]`.
    pub fn space(&self) -> Vec<usize> {
        self.batch.iter().copied().chain([self.m, self.n]).collect()
    }
}

impl RowKernel {
    /// The full space `outer ++ inner`.
    pub fn space(&self) -> Vec<usize> {
        self.outer.iter().chain(&self.inner).copied().collect()
    }
}

/// One IR op that is not fused (concat, pad, gather, arg-reduce, integer matmul),
/// with operands read through accesses of their own shapes. The output is written
/// contiguously. `siblings` are other ops over (some of) the same operands the same
/// launch computes, each writing its own output contiguously: the gradient of v beside
/// that of k in attention's backward (FlashAttention-2's dK/dV kernel, made by
/// `crate::fuse::siblings`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct OpKernel {
    pub op: Op,
    pub inputs: Vec<(Access, TensorType)>,
    pub output: BufferId,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub siblings: Vec<Sibling>,
}

/// An op an [`OpKernel`] computes beside its own: `op` of the kernel's operands
/// `inputs` (indices into the kernel's `inputs`, in the op's order), written to
/// `output`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Sibling {
    pub op: Op,
    pub inputs: Vec<usize>,
    pub output: BufferId,
}

impl OpKernel {
    /// Sibling `s`'s operands, as the kernel reads them (None for an index past the
    /// kernel's operands).
    pub fn sibling_inputs(&self, s: &Sibling) -> Option<Vec<(Access, TensorType)>> {
        s.inputs.iter().map(|&i| self.inputs.get(i).cloned()).collect()
    }
}

/// A convolution ([`Op::Conv`] of `x` by `w`, read through their accesses of ranks
/// `x_dims.len()` and `w_dims.len()`), then `body` per output element (space
/// [`ConvKernel::space`], `[n, o, out..]`, using [`Expr::Acc`] for the convolution's
/// value and loads of `inputs`), stored by `stores`: the bias, activation and residual
/// add of a CNN block in one kernel.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ConvKernel {
    pub window: Window,
    pub groups: usize,
    pub x: Access,
    pub x_dims: Vec<usize>,
    pub w: Access,
    pub w_dims: Vec<usize>,
    pub inputs: Vec<Access>,
    pub body: Body,
    pub stores: Vec<Store>,
}

impl ConvKernel {
    /// The convolution's geometry (an error for a malformed kernel).
    pub fn geom(&self) -> Result<ConvGeom, String> {
        ConvGeom::new(&self.window, self.groups, &self.x_dims, &self.w_dims)
    }

    /// The output space `[n, o, out..]` (empty for a malformed kernel).
    pub fn space(&self) -> Vec<usize> {
        self.geom().map(|g| g.out_dims()).unwrap_or_default()
    }

    /// The convolution as the IR op.
    pub fn op(&self) -> Op {
        Op::Conv {
            window: self.window.clone(),
            groups: self.groups,
        }
    }
}

/// What a kernel computes. (The JSON form is externally tagged:
/// `{"elementwise": {"space": .., ..}}`.)
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum KernelKind {
    Elementwise(ElementwiseKernel),
    Row(RowKernel),
    MatMul(MatMulKernel),
    Op(OpKernel),
    MultiTensor(MultiTensorKernel),
    Conv(ConvKernel),
}

/// One kernel: what it computes, plus which IR nodes it came from (for reports).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Kernel {
    pub name: String,
    pub kind: KernelKind,
    /// Canonical numbers (as `graphc ir` prints them) of the IR nodes fused into it.
    pub nodes: Vec<u32>,
}

impl Kernel {
    /// The buffers this kernel reads.
    pub fn reads(&self) -> Vec<BufferId> {
        let mut v: Vec<BufferId> = match &self.kind {
            KernelKind::Elementwise(ElementwiseKernel { inputs, .. }) | KernelKind::Row(RowKernel { inputs, .. }) => {
                inputs.iter().map(|a| a.buffer).collect()
            }
            KernelKind::MatMul(MatMulKernel {
                a, b, inputs, quant, ..
            }) => [a.buffer, b.buffer]
                .into_iter()
                .chain(quant.iter().map(|q| q.scales))
                .chain(inputs.iter().map(|x| x.buffer))
                .collect(),
            KernelKind::Op(OpKernel { inputs, .. }) => inputs.iter().map(|(a, _)| a.buffer).collect(),
            KernelKind::MultiTensor(m) => m.parts.iter().flat_map(|p| p.inputs.iter().map(|a| a.buffer)).collect(),
            KernelKind::Conv(c) => [c.x.buffer, c.w.buffer]
                .into_iter()
                .chain(c.inputs.iter().map(|a| a.buffer))
                .collect(),
        };
        v.sort();
        v.dedup();
        v
    }

    /// The buffers this kernel writes.
    pub fn writes(&self) -> Vec<BufferId> {
        match &self.kind {
            KernelKind::Elementwise(ElementwiseKernel { stores, .. }) => {
                stores.iter().map(|s| s.access.buffer).collect()
            }
            KernelKind::MatMul(MatMulKernel { stores, bias_grad, .. }) => stores
                .iter()
                .map(|s| s.access.buffer)
                .chain(bias_grad.iter().map(|g| g.store.buffer))
                .collect(),
            KernelKind::Row(RowKernel { row_stores, stores, .. }) => {
                row_stores.iter().chain(stores).map(|s| s.access.buffer).collect()
            }
            KernelKind::Op(OpKernel { output, siblings, .. }) => std::iter::once(*output)
                .chain(siblings.iter().map(|s| s.output))
                .collect(),
            KernelKind::Conv(c) => c.stores.iter().map(|s| s.access.buffer).collect(),
            KernelKind::MultiTensor(m) => m
                .parts
                .iter()
                .flat_map(|p| p.stores.iter().map(|s| s.access.buffer))
                .collect(),
        }
    }

    /// A short word for the kind: `elementwise`, `row`, `matmul`, or the op's name.
    pub fn kind_name(&self) -> &str {
        match &self.kind {
            KernelKind::Elementwise(_) => "elementwise",
            KernelKind::Row(_) => "row",
            KernelKind::MatMul(_) => "matmul",
            KernelKind::Op(o) => o.op.name(),
            KernelKind::MultiTensor(_) => "multi_tensor",
            KernelKind::Conv(_) => "conv",
        }
    }
}

/// Elements of a buffer an access over `dims` touches (dims it steps through).
fn touched(access: &Access, dims: &[usize], buffer_numel: usize) -> usize {
    let n: usize = dims
        .iter()
        .zip(&access.strides)
        .filter(|(_, s)| **s != 0)
        .map(|(d, _)| *d)
        .product();
    n.min(buffer_numel)
}

/// A fused program: buffers, kernels in a valid execution order, named outputs.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Program {
    pub buffers: Vec<Buffer>,
    pub kernels: Vec<Kernel>,
    /// Graph inputs in call order.
    pub inputs: Vec<BufferId>,
    /// Named graph outputs, in order; several names may share a buffer.
    pub outputs: Vec<(String, BufferId)>,
    /// Outputs written over an input's storage (a training step's state: parameters,
    /// optimizer moments; XLA's input/output aliasing). The kernel writing `output`
    /// runs after every other reader of `input` and reads `input` only at the element
    /// it writes, so the input's storage can take the output.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub donated: Vec<Donation>,
}

/// An output that takes over an input's storage ([`Program::donated`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Donation {
    pub output: BufferId,
    pub input: BufferId,
}

impl Program {
    pub fn buffer(&self, id: BufferId) -> &Buffer {
        &self.buffers[id.index()]
    }

    /// Bytes kernel `k` reads and writes in global memory (each buffer element a load
    /// touches counted once per access; broadcast dims not counted).
    pub fn kernel_traffic(&self, k: usize) -> (usize, usize) {
        let kernel = &self.kernels[k];
        let size = |a: &Access| self.buffer(a.buffer).ty.dtype.size_bytes();
        let numel = |a: &Access| self.buffer(a.buffer).ty.numel();
        let mut reads: Vec<(&Access, Vec<usize>)> = Vec::new();
        let mut scale_bytes = 0usize;
        match &kernel.kind {
            KernelKind::Elementwise(e) => reads.extend(e.inputs.iter().map(|a| (a, e.space.clone()))),
            KernelKind::Row(r) => {
                let full = r.space();
                reads.extend(r.inputs.iter().map(|a| (a, full.clone())));
            }
            KernelKind::MatMul(mm) => {
                let dims = |x: usize, y: usize| mm.batch.iter().copied().chain([x, y]).collect::<Vec<usize>>();
                reads.push((&mm.a, dims(mm.m, mm.k)));
                reads.push((&mm.b, dims(mm.k, mm.n)));
                reads.extend(mm.inputs.iter().map(|x| (x, dims(mm.m, mm.n))));
            }
            KernelKind::Op(o) => reads.extend(o.inputs.iter().map(|(a, t)| (a, t.shape.dims().to_vec()))),
            KernelKind::Conv(c) => {
                reads.push((&c.x, c.x_dims.clone()));
                reads.push((&c.w, c.w_dims.clone()));
                let space = c.space();
                reads.extend(c.inputs.iter().map(|a| (a, space.clone())));
            }
            KernelKind::MultiTensor(m) => {
                for p in &m.parts {
                    reads.extend(p.inputs.iter().map(|a| (a, p.space.clone())));
                }
            }
        }
        if let KernelKind::MatMul(MatMulKernel { quant: Some(q), .. }) = &kernel.kind {
            // The scales are read once each; `b` counts the packed bytes (the logical
            // elements it touches, capped at the buffer's).
            scale_bytes = self.buffer(q.scales).ty.size_bytes();
        }
        let read = reads
            .iter()
            .map(|(a, d)| touched(a, d, numel(a)).saturating_mul(size(a)))
            .fold(scale_bytes, usize::saturating_add);
        let written = kernel
            .writes()
            .iter()
            .map(|b| self.buffer(*b).ty.size_bytes())
            .fold(0, usize::saturating_add);
        (read, written)
    }

    /// The number of parts of each multi-tensor kernel, in kernel order.
    pub fn multi_tensor_parts(&self) -> Vec<usize> {
        self.kernels
            .iter()
            .filter_map(|k| match &k.kind {
                KernelKind::MultiTensor(m) => Some(m.parts.len()),
                _ => None,
            })
            .collect()
    }

    /// Bytes all kernels read and write in global memory.
    pub fn traffic(&self) -> usize {
        (0..self.kernels.len())
            .map(|k| {
                let (r, w) = self.kernel_traffic(k);
                r.saturating_add(w)
            })
            .fold(0, usize::saturating_add)
    }

    pub fn add_buffer(&mut self, ty: TensorType, kind: BufferKind, name: Option<String>) -> BufferId {
        self.buffers.push(Buffer { ty, kind, name });
        BufferId((self.buffers.len() - 1) as u32)
    }
}
