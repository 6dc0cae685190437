//! The primitive operations. Everything a front end produces lowers to these.

use serde::{Deserialize, Serialize};
use std::fmt;

use crate::{DType, Shape, Tensor, TensorType};

/// Elementwise operations of one operand. The output has the operand's type, except
/// `IsNan`/`IsInf`, which give bool.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum UnaryOp {
    Neg,
    Abs,
    Exp,
    Log,
    Sqrt,
    Rsqrt,
    Reciprocal,
    Tanh,
    Sigmoid,
    Relu,
    /// `0.5 x (1 + erf(x / sqrt 2))`.
    Gelu,
    /// `0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))`.
    GeluTanh,
    /// `x sigmoid(x)`.
    Silu,
    Erf,
    Sin,
    Cos,
    Floor,
    Ceil,
    /// Round half to even.
    Round,
    /// -1, 0 or 1 (NaN stays NaN).
    Sign,
    /// Logical not, on bool.
    Not,
    IsNan,
    IsInf,
}

/// Elementwise operations of two operands of identical type (broadcasts are explicit
/// [`Op::Broadcast`] nodes). Comparisons give bool.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BinaryOp {
    Add,
    Sub,
    Mul,
    /// Integers truncate toward zero; division by zero is an error.
    Div,
    Pow,
    /// NaN-propagating.
    Max,
    /// NaN-propagating.
    Min,
    /// Remainder with the sign of the divisor (Python `%`, ONNX `Mod` with fmod=0).
    Mod,
    /// Remainder with the sign of the dividend (C `fmod`, ONNX `Mod` with fmod=1).
    Fmod,
    Eq,
    Ne,
    Lt,
    Le,
    Gt,
    Ge,
    /// Logical, on bool.
    And,
    Or,
    Xor,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ReduceOp {
    Sum,
    /// Integers: the sum divided with truncation.
    Mean,
    Max,
    Min,
    Prod,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ArgReduceOp {
    ArgMax,
    ArgMin,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PadMode {
    /// Fill with the pad value.
    Constant,
    /// Mirror without repeating the edge (numpy `reflect`).
    Reflect,
    /// Repeat the edge element.
    Edge,
}

/// One dimension of a slice, with Python/ONNX semantics: negative `start`/`end` count
/// from the end, out-of-range bounds clamp, `step` is non-zero and may be negative.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct SliceRange {
    pub start: i64,
    pub end: i64,
    pub step: i64,
}

impl SliceRange {
    /// The whole dimension.
    pub fn full() -> SliceRange {
        SliceRange {
            start: 0,
            end: i64::MAX,
            step: 1,
        }
    }

    /// The first index taken and the number of elements, for a dimension of extent `d`.
    /// `step` must be non-zero.
    pub fn resolve(&self, d: usize) -> (i64, usize) {
        let d = d as i64;
        let norm = |x: i64| if x < 0 { x.saturating_add(d) } else { x };
        if self.step > 0 {
            let s = norm(self.start).clamp(0, d);
            let e = norm(self.end).clamp(0, d);
            let len = if e > s { (e - s - 1) / self.step + 1 } else { 0 };
            (s, len as usize)
        } else {
            let s = norm(self.start).clamp(-1, d - 1);
            let e = norm(self.end).clamp(-1, d - 1);
            let step = self.step.saturating_neg();
            let len = if s > e { (s - e - 1) / step + 1 } else { 0 };
            (s, len as usize)
        }
    }
}

/// A primitive operation with its attributes. Each node computes exactly one value.
///
/// Axes in attributes are normalized (non-negative, `< rank`); the builder and front
/// ends accept negative axes and normalize them.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Op {
    /// A caller-supplied tensor, bound by name.
    Input {
        name: String,
        ty: TensorType,
    },
    /// A weight, bound by name to the graph's weight data.
    Parameter {
        name: String,
        ty: TensorType,
    },
    /// A literal tensor, stored in the node.
    Constant {
        value: Tensor,
    },
    /// `out[i0, .., in] = i_axis`, in `dtype`.
    Iota {
        ty: TensorType,
        axis: usize,
    },
    Unary(UnaryOp),
    Binary(BinaryOp),
    /// `select(cond, a, b)`: `a` where `cond` is true, else `b`; all of one shape.
    Select,
    /// Convert element type: floats to integers truncate toward zero (saturating,
    /// NaN to 0), to bool is `x != 0`, integers to integers wrap.
    Cast {
        to: DType,
    },
    /// Numpy broadcast to `shape`: the operand is right-aligned; each of its dims
    /// equals the target's or is 1.
    Broadcast {
        shape: Shape,
    },
    /// Reduce over `axes` (sorted, unique); `keepdims` keeps them as size 1.
    Reduce {
        op: ReduceOp,
        axes: Vec<usize>,
        keepdims: bool,
    },
    /// Index (i64) of the first maximum/minimum along `axis`; NaN counts as the extreme.
    ArgReduce {
        op: ArgReduceOp,
        axis: usize,
        keepdims: bool,
    },
    /// `[.., M, K] x [.., K, N] -> [.., M, N]`, batch dims broadcast. Accumulates in
    /// f32 for f32/f16/bf16, f64 for f64, wrapping i64 for integers.
    MatMul,
    /// Same elements, row-major order, new shape of equal element count.
    Reshape {
        shape: Shape,
    },
    /// `out.dims[i] = in.dims[perm[i]]`.
    Transpose {
        perm: Vec<usize>,
    },
    /// One range per dimension of the operand.
    Slice {
        ranges: Vec<SliceRange>,
    },
    /// Join operands along `axis`; other dims equal.
    Concat {
        axis: usize,
    },
    /// `gather(data, indices)` along `axis` (ONNX Gather): out shape is
    /// `data[..axis] ++ indices ++ data[axis+1..]`; negative indices count from the end.
    Gather {
        axis: usize,
    },
    /// `pads[i] = (before, after)` per dimension; negative values crop.
    Pad {
        pads: Vec<(i64, i64)>,
        mode: PadMode,
        value: f64,
    },
}

impl UnaryOp {
    pub const ALL: [UnaryOp; 23] = [
        UnaryOp::Neg,
        UnaryOp::Abs,
        UnaryOp::Exp,
        UnaryOp::Log,
        UnaryOp::Sqrt,
        UnaryOp::Rsqrt,
        UnaryOp::Reciprocal,
        UnaryOp::Tanh,
        UnaryOp::Sigmoid,
        UnaryOp::Relu,
        UnaryOp::Gelu,
        UnaryOp::GeluTanh,
        UnaryOp::Silu,
        UnaryOp::Erf,
        UnaryOp::Sin,
        UnaryOp::Cos,
        UnaryOp::Floor,
        UnaryOp::Ceil,
        UnaryOp::Round,
        UnaryOp::Sign,
        UnaryOp::Not,
        UnaryOp::IsNan,
        UnaryOp::IsInf,
    ];

    pub fn name(self) -> &'static str {
        match self {
            UnaryOp::Neg => "neg",
            UnaryOp::Abs => "abs",
            UnaryOp::Exp => "exp",
            UnaryOp::Log => "log",
            UnaryOp::Sqrt => "sqrt",
            UnaryOp::Rsqrt => "rsqrt",
            UnaryOp::Reciprocal => "reciprocal",
            UnaryOp::Tanh => "tanh",
            UnaryOp::Sigmoid => "sigmoid",
            UnaryOp::Relu => "relu",
            UnaryOp::Gelu => "gelu",
            UnaryOp::GeluTanh => "gelu_tanh",
            UnaryOp::Silu => "silu",
            UnaryOp::Erf => "erf",
            UnaryOp::Sin => "sin",
            UnaryOp::Cos => "cos",
            UnaryOp::Floor => "floor",
            UnaryOp::Ceil => "ceil",
            UnaryOp::Round => "round",
            UnaryOp::Sign => "sign",
            UnaryOp::Not => "not",
            UnaryOp::IsNan => "isnan",
            UnaryOp::IsInf => "isinf",
        }
    }

    /// Which operand dtypes the op accepts.
    pub fn accepts(self, d: DType) -> bool {
        match self {
            UnaryOp::Not => d == DType::Bool,
            UnaryOp::Neg | UnaryOp::Abs | UnaryOp::Sign | UnaryOp::Relu => d.is_numeric(),
            _ => d.is_float(),
        }
    }

    pub fn output_dtype(self, d: DType) -> DType {
        match self {
            UnaryOp::IsNan | UnaryOp::IsInf => DType::Bool,
            _ => d,
        }
    }
}

impl BinaryOp {
    pub const ALL: [BinaryOp; 18] = [
        BinaryOp::Add,
        BinaryOp::Sub,
        BinaryOp::Mul,
        BinaryOp::Div,
        BinaryOp::Pow,
        BinaryOp::Max,
        BinaryOp::Min,
        BinaryOp::Mod,
        BinaryOp::Fmod,
        BinaryOp::Eq,
        BinaryOp::Ne,
        BinaryOp::Lt,
        BinaryOp::Le,
        BinaryOp::Gt,
        BinaryOp::Ge,
        BinaryOp::And,
        BinaryOp::Or,
        BinaryOp::Xor,
    ];

    pub fn name(self) -> &'static str {
        match self {
            BinaryOp::Add => "add",
            BinaryOp::Sub => "sub",
            BinaryOp::Mul => "mul",
            BinaryOp::Div => "div",
            BinaryOp::Pow => "pow",
            BinaryOp::Max => "max",
            BinaryOp::Min => "min",
            BinaryOp::Mod => "mod",
            BinaryOp::Fmod => "fmod",
            BinaryOp::Eq => "eq",
            BinaryOp::Ne => "ne",
            BinaryOp::Lt => "lt",
            BinaryOp::Le => "le",
            BinaryOp::Gt => "gt",
            BinaryOp::Ge => "ge",
            BinaryOp::And => "and",
            BinaryOp::Or => "or",
            BinaryOp::Xor => "xor",
        }
    }

    pub fn is_comparison(self) -> bool {
        matches!(
            self,
            BinaryOp::Eq | BinaryOp::Ne | BinaryOp::Lt | BinaryOp::Le | BinaryOp::Gt | BinaryOp::Ge
        )
    }

    pub fn is_logical(self) -> bool {
        matches!(self, BinaryOp::And | BinaryOp::Or | BinaryOp::Xor)
    }

    pub fn accepts(self, d: DType) -> bool {
        if self.is_comparison() {
            true
        } else if self.is_logical() {
            d == DType::Bool
        } else {
            d.is_numeric()
        }
    }

    pub fn output_dtype(self, d: DType) -> DType {
        if self.is_comparison() {
            DType::Bool
        } else {
            d
        }
    }
}

impl ReduceOp {
    pub const ALL: [ReduceOp; 5] = [
        ReduceOp::Sum,
        ReduceOp::Mean,
        ReduceOp::Max,
        ReduceOp::Min,
        ReduceOp::Prod,
    ];

    pub fn name(self) -> &'static str {
        match self {
            ReduceOp::Sum => "reduce_sum",
            ReduceOp::Mean => "reduce_mean",
            ReduceOp::Max => "reduce_max",
            ReduceOp::Min => "reduce_min",
            ReduceOp::Prod => "reduce_prod",
        }
    }
}

impl ArgReduceOp {
    pub fn name(self) -> &'static str {
        match self {
            ArgReduceOp::ArgMax => "argmax",
            ArgReduceOp::ArgMin => "argmin",
        }
    }
}

impl PadMode {
    pub fn name(self) -> &'static str {
        match self {
            PadMode::Constant => "constant",
            PadMode::Reflect => "reflect",
            PadMode::Edge => "edge",
        }
    }
}

impl Op {
    /// The op's name in the text IR.
    pub fn name(&self) -> &'static str {
        match self {
            Op::Input { .. } => "input",
            Op::Parameter { .. } => "param",
            Op::Constant { .. } => "constant",
            Op::Iota { .. } => "iota",
            Op::Unary(u) => u.name(),
            Op::Binary(b) => b.name(),
            Op::Select => "select",
            Op::Cast { .. } => "cast",
            Op::Broadcast { .. } => "broadcast",
            Op::Reduce { op, .. } => op.name(),
            Op::ArgReduce { op, .. } => op.name(),
            Op::MatMul => "matmul",
            Op::Reshape { .. } => "reshape",
            Op::Transpose { .. } => "transpose",
            Op::Slice { .. } => "slice",
            Op::Concat { .. } => "concat",
            Op::Gather { .. } => "gather",
            Op::Pad { .. } => "pad",
        }
    }

    /// Number of operands, or `None` for variadic ops (concat takes one or more).
    pub fn arity(&self) -> Option<usize> {
        Some(match self {
            Op::Input { .. } | Op::Parameter { .. } | Op::Constant { .. } | Op::Iota { .. } => 0,
            Op::Binary(_) | Op::MatMul | Op::Gather { .. } => 2,
            Op::Select => 3,
            Op::Concat { .. } => return None,
            _ => 1,
        })
    }

    /// Elementwise ops: output element i depends only on element i of each operand.
    pub fn is_elementwise(&self) -> bool {
        matches!(self, Op::Unary(_) | Op::Binary(_) | Op::Select | Op::Cast { .. })
    }
}

impl fmt::Display for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}
