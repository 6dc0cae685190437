//! The errors of the kernel IR verifier, and how they name kernels, expressions and
//! buffers.

use std::fmt;

use graphc_ir::{DType, TensorType};

use crate::kernel::{Buffer, BufferId, BufferKind, ExprId};

/// A kernel, as errors name it: `kernel 3 (k3_row_max_sum)`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KernelAt {
    pub index: usize,
    pub name: String,
}

impl fmt::Display for KernelAt {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "kernel {} ({})", self.index, self.name)
    }
}

/// An expression of a kernel body, as errors name it: `e2 (add)`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExprAt {
    pub id: ExprId,
    pub name: String,
}

impl fmt::Display for ExprAt {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "e{} ({})", self.id, self.name)
    }
}

/// Why a kernel of a program is malformed. `what` fields name the access or store
/// (`input 0`, `operand a`, `row store 1`, ..); buffers are described as
/// `b3 (temp "name")`.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum KernelVerifyError {
    #[error("kernel index {index} out of range (the program has {count} kernels)")]
    NoSuchKernel { index: usize, count: usize },
    #[error("{kernel}: {what}: buffer b{buffer} does not exist ({count} buffers)")]
    MissingBuffer {
        kernel: KernelAt,
        what: String,
        buffer: u32,
        count: usize,
    },
    #[error("{kernel}: {what}: access of b{buffer} has {strides} strides for a space of rank {rank}")]
    AccessRank {
        kernel: KernelAt,
        what: String,
        buffer: u32,
        strides: usize,
        rank: usize,
    },
    #[error("{kernel}: {what}: space {space:?} has too many elements")]
    SpaceTooLarge {
        kernel: KernelAt,
        what: String,
        space: Vec<usize>,
    },
    #[error("{kernel}: {what}: access of b{buffer} reaches elements {lo}..={hi}, out of bounds of its {len} elements")]
    OutOfBounds {
        kernel: KernelAt,
        what: String,
        buffer: u32,
        lo: i128,
        hi: i128,
        len: usize,
    },
    #[error("{kernel}: {what}: writes buffer {buffer}, which is not a temp")]
    StoreNotTemp {
        kernel: KernelAt,
        what: String,
        buffer: String,
    },
    #[error("{kernel}: {what}: value e{value} does not exist ({count} expressions)")]
    MissingValue {
        kernel: KernelAt,
        what: String,
        value: ExprId,
        count: usize,
    },
    #[error("{kernel}: {what}: stores e{value} of {dtype} into {buffer}, which is {ty}")]
    StoreDtype {
        kernel: KernelAt,
        what: String,
        value: ExprId,
        dtype: DType,
        buffer: String,
        ty: TensorType,
    },
    #[error("{kernel}: {what}: buffer {buffer} is stored twice")]
    StoredTwice {
        kernel: KernelAt,
        what: String,
        buffer: String,
    },
    #[error("{kernel}: {what}: stores {elements} elements into {buffer}, which has {buffer_elements} ({ty})")]
    StoreSize {
        kernel: KernelAt,
        what: String,
        elements: usize,
        buffer: String,
        buffer_elements: usize,
        ty: TensorType,
    },
    #[error("{kernel}: {what}: access of b{buffer} (offset {offset}, strides {strides:?} over {space:?}) does not write every element exactly once")]
    StoreCoverage {
        kernel: KernelAt,
        what: String,
        buffer: u32,
        offset: i64,
        strides: Vec<i64>,
        space: Vec<usize>,
    },
    #[error("{kernel}: {expr}: operand e{operand} does not precede it")]
    OperandOrder {
        kernel: KernelAt,
        expr: ExprAt,
        operand: ExprId,
    },
    #[error("{kernel}: {expr}: the kernel has {inputs} inputs")]
    MissingInput {
        kernel: KernelAt,
        expr: ExprAt,
        inputs: usize,
    },
    #[error("{kernel}: {expr}: the kernel has {stages} stages")]
    MissingStage {
        kernel: KernelAt,
        expr: ExprAt,
        stages: usize,
    },
    #[error("{kernel}: {expr}: {what} are only allowed in {kind} kernels")]
    NotAllowed {
        kernel: KernelAt,
        expr: ExprAt,
        what: &'static str,
        kind: &'static str,
    },
    #[error("{kernel}: {expr}: constant is {ty}, not a scalar")]
    NotScalar {
        kernel: KernelAt,
        expr: ExprAt,
        ty: TensorType,
    },
    #[error("{kernel}: {expr}: index e{index} is {dtype}")]
    GatherIndex {
        kernel: KernelAt,
        expr: ExprAt,
        index: ExprId,
        dtype: DType,
    },
    #[error("{kernel}: {expr}: the stage's value e{value} does not precede it")]
    StageValueOrder {
        kernel: KernelAt,
        expr: ExprAt,
        value: ExprId,
    },
    /// The op of an expression rejects its operands (or its index axis).
    #[error("{kernel}: {expr}: {message}")]
    ExprType {
        kernel: KernelAt,
        expr: ExprAt,
        message: String,
    },
    #[error("{kernel}: {expr}: declared {declared} but computes {computed}")]
    DeclaredType {
        kernel: KernelAt,
        expr: ExprAt,
        declared: DType,
        computed: DType,
    },
    #[error("{kernel}: stage {stage}: value e{value} does not exist ({count} expressions)")]
    MissingStageValue {
        kernel: KernelAt,
        stage: usize,
        value: ExprId,
        count: usize,
    },
    #[error("{kernel}: stage {stage}: its value e{value} uses stage {uses}, not an earlier one")]
    StageOrder {
        kernel: KernelAt,
        stage: usize,
        value: ExprId,
        uses: u32,
    },
    #[error("{kernel}: stage {stage}: {message}")]
    StageType {
        kernel: KernelAt,
        stage: usize,
        message: String,
    },
    #[error(
        "{kernel}: row store {store}: value e{value} varies along the inner dims; a row store needs a per-row value"
    )]
    RowStoreVaries {
        kernel: KernelAt,
        store: usize,
        value: ExprId,
    },
    #[error("{kernel}: matmul: {message}")]
    MatMulShape { kernel: KernelAt, message: String },
    #[error("{kernel}: input {input}: declared {declared} but buffer {buffer} is {ty}")]
    OpOperandType {
        kernel: KernelAt,
        input: usize,
        declared: TensorType,
        buffer: String,
        ty: TensorType,
    },
    #[error("{kernel}: {op}: {message}")]
    OpType {
        kernel: KernelAt,
        op: String,
        message: String,
    },
    #[error("{kernel}: {op} gives {ty} but its output {buffer} is {out}")]
    OpOutput {
        kernel: KernelAt,
        op: String,
        ty: TensorType,
        buffer: String,
        out: TensorType,
    },
    #[error("{kernel}: part {part} {what} {buffer}, which part {other} writes (the parts of a multi-tensor kernel are independent)")]
    PartConflict {
        kernel: KernelAt,
        part: usize,
        what: &'static str,
        buffer: String,
        other: usize,
    },
}

impl KernelVerifyError {
    /// The index of the kernel at fault.
    pub fn kernel_index(&self) -> usize {
        use KernelVerifyError as E;
        match self {
            E::NoSuchKernel { index, .. } => *index,
            E::MissingBuffer { kernel, .. }
            | E::AccessRank { kernel, .. }
            | E::SpaceTooLarge { kernel, .. }
            | E::OutOfBounds { kernel, .. }
            | E::StoreNotTemp { kernel, .. }
            | E::MissingValue { kernel, .. }
            | E::StoreDtype { kernel, .. }
            | E::StoredTwice { kernel, .. }
            | E::StoreSize { kernel, .. }
            | E::StoreCoverage { kernel, .. }
            | E::OperandOrder { kernel, .. }
            | E::MissingInput { kernel, .. }
            | E::MissingStage { kernel, .. }
            | E::NotAllowed { kernel, .. }
            | E::NotScalar { kernel, .. }
            | E::GatherIndex { kernel, .. }
            | E::StageValueOrder { kernel, .. }
            | E::ExprType { kernel, .. }
            | E::DeclaredType { kernel, .. }
            | E::MissingStageValue { kernel, .. }
            | E::StageOrder { kernel, .. }
            | E::StageType { kernel, .. }
            | E::RowStoreVaries { kernel, .. }
            | E::MatMulShape { kernel, .. }
            | E::OpOperandType { kernel, .. }
            | E::OpType { kernel, .. }
            | E::OpOutput { kernel, .. }
            | E::PartConflict { kernel, .. } => kernel.index,
        }
    }
}

/// `b3 (temp "name")`, `b0 (input "x")`, ... for messages.
pub fn describe_buffer(id: BufferId, buf: &Buffer) -> String {
    let (kind, name) = match &buf.kind {
        BufferKind::Input { name } => ("input", Some(name.as_str())),
        BufferKind::Weight { name } => ("weight", Some(name.as_str())),
        BufferKind::Constant { .. } => ("constant", buf.name.as_deref()),
        BufferKind::Temp => ("temp", buf.name.as_deref()),
    };
    match name {
        Some(n) => format!("b{} ({kind} \"{n}\")", id.0),
        None => format!("b{} ({kind})", id.0),
    }
}
