//! The primitive operations. Everything a front end produces lowers to these.

use serde::{Deserialize, Serialize};
use std::fmt;

use crate::window::{ConvOperand, PoolOp, Window};
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
    /// `a * gelu_tanh'(b)`: the tanh GELU's backward (PyTorch's `gelu_backward` with
    /// `approximate='tanh'`) of the gradient `a` at the input `b`, computed in one
    /// step (f32 for the 16-bit types, rounded once). Floats only.
    GeluTanhGrad,
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
        // i128: no bound or step can overflow the arithmetic.
        let d = d as i128;
        let norm = |x: i64| if x < 0 { x as i128 + d } else { x as i128 };
        let step = self.step as i128;
        let (s, len) = if step > 0 {
            let s = norm(self.start).clamp(0, d);
            let e = norm(self.end).clamp(0, d);
            (s, if e > s { (e - s + step - 1) / step } else { 0 })
        } else {
            let s = norm(self.start).clamp(-1, d - 1);
            let e = norm(self.end).clamp(-1, d - 1);
            (s, if s > e { (s - e - step - 1) / -step } else { 0 })
        };
        (s as i64, len as usize)
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
    /// The transpose of [`Op::Gather`] (its gradient): `scatter_add(updates, indices)`
    /// along `axis` into a zero tensor whose `axis` has extent `size`. `updates` is
    /// `before ++ indices.shape ++ after` (a gather's output); the result is
    /// `before ++ [size] ++ after`, and `out[.., indices[j..], ..] += updates[.., j.., ..]`
    /// in row-major order of `j` (so a repeated index sums deterministically). Negative
    /// indices count from the end; an index out of range is an error.
    ScatterAdd {
        axis: usize,
        size: usize,
    },
    /// `pads[i] = (before, after)` per dimension; negative values crop.
    Pad {
        pads: Vec<(i64, i64)>,
        mode: PadMode,
        /// In JSON a number, or a string (`"inf"`, `"-inf"`, `"nan(0x<bits>)"`) when
        /// not finite, which JSON numbers cannot hold.
        #[serde(with = "exact_f64")]
        value: f64,
    },
    /// Scaled dot-product attention of `q` `[b.., hq, sq, d]`, `k` `[b.., hkv, sk, d]`,
    /// `v` `[b.., hkv, sk, dv]` and an optional fourth operand, an additive `mask` of
    /// the scores' rank whose every dim is 1 or the scores' `[b.., hq, sq, sk]` (so a
    /// padding mask stays `[b, 1, 1, sk]`). Float operands of one dtype, equal batch
    /// dims `b..` (at least one), `hq` a multiple of `hkv`: query head `h` reads kv head
    /// `h / (hq / hkv)` (grouped-query attention).
    ///
    /// Per query row `i`: `s[j] = (q[i] . k[j]) * scale + mask[i, j]`, and with `causal`
    /// `s[j] = -inf` where `j > i` (top-left aligned, as PyTorch's `is_causal`);
    /// `p = softmax(s)` (`exp(s[j] - max s) / sum`); `out[i] = sum_j p[j] v[j]`, of
    /// shape `[b.., hq, sq, dv]`. Computed in f32 (f64 for f64) and rounded once; a row
    /// whose scores are all `-inf` gives NaN, as the spelled-out softmax does.
    ///
    /// With `zero_masked_rows`, a row whose softmax is NaN (every score `-inf`: a
    /// query whose keys are all masked, as in a padding-only sequence; or a NaN or
    /// `+inf` score) gives 0 instead: PyTorch's exported scaled-dot-product attention
    /// guards its softmax with `where(isnan(p), 0, p)`, and that guard is this flag.
    Attention {
        #[serde(with = "exact_f64")]
        scale: f64,
        causal: bool,
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        zero_masked_rows: bool,
    },
    /// The log-sum-exp of every row of attention's scores, for its backward pass
    /// (FlashAttention-2's saved statistic): operands `q`, `k` and an optional mask as
    /// for [`Op::Attention`]; `lse[b.., h, i] = log sum_j exp(s[i, j])` with the scores
    /// `s` exactly as attention computes them (`-inf` for a row whose every score is
    /// `-inf`). Shape `[b.., hq, sq]`, in f32 (f64 for f64 operands).
    AttentionLse {
        #[serde(with = "exact_f64")]
        scale: f64,
        causal: bool,
    },
    /// One gradient of [`Op::Attention`] (of `q`, `k` or `v`: `wrt`), from its
    /// definition without any `[sq, sk]` tensor: operands `q`, `k`, `v`, `dout` (the
    /// output's gradient), `lse` ([`Op::AttentionLse`]), `delta` (`sum(dout * out)`
    /// over the last axis, `[b.., hq, sq]`, of `lse`'s type) and the optional mask.
    /// Per row, `p[i, j] = exp(s[i, j] - lse[i])` (0 on a row whose `lse` is `-inf` with
    /// `zero_masked_rows`), `ds = p (dout[i] . v[j] - delta[i])`;
    /// `dq[i] = scale sum_j ds[i, j] k[j]`, `dk[j] = scale sum_i ds[i, j] q[i]`,
    /// `dv[j] = sum_i p[i, j] dout[i]`, the sums over `i` also over the query heads of a
    /// kv head's group. The output has the type of the operand `wrt` names.
    AttentionGrad {
        wrt: AttentionOperand,
        #[serde(with = "exact_f64")]
        scale: f64,
        causal: bool,
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        zero_masked_rows: bool,
    },
    /// Convolution of `x` `[n, c, spatial..]` (1 to 3 spatial axes) by `w`
    /// `[o, c / groups, kernel..]`, float operands of one dtype: output channel `j` of
    /// group `g = j / (o / groups)` is
    /// `out[b, j, p..] = sum_{i, t..} w[j, i, t..] x[b, g (c / groups) + i, tap(p, t)..]`,
    /// the taps and output extents as [`Window`] defines them (padding reads 0).
    /// Shape `[n, o, out..]`; accumulated as [`Op::MatMul`] (f32 for f32/f16/bf16, f64
    /// for f64), in increasing `(i, t..)` order, and rounded once. A bias is a separate add.
    Conv {
        window: Window,
        groups: usize,
    },
    /// One gradient of [`Op::Conv`] (of the data or the weights: `wrt`), of type
    /// `shape` (the operand's shape, which the output's does not determine when a stride
    /// exceeds 1) in the operands' dtype. `wrt` input: operands `dy` and `w`,
    /// `dx[b, c, p..] = sum dy[b, j, q..] w[j, i, t..]` over the `(j, q, t)` whose tap
    /// reads `p`; `wrt` weight: operands `x` and `dy`,
    /// `dw[j, i, t..] = sum_{b, q..} dy[b, j, q..] x[b, g (c / groups) + i, tap(q, t)..]`.
    /// Accumulated as the convolution is.
    ConvGrad {
        wrt: ConvOperand,
        window: Window,
        groups: usize,
        shape: Shape,
    },
    /// Pooling of `x` `[n, c, spatial..]` (float) over windows of extent `kernel`:
    /// [`PoolOp`] over each window's taps ([`Window`]; with `ceil_mode` the output
    /// extents round up). Shape `[n, c, out..]`; computed in f32 (f64 for f64).
    Pool {
        op: PoolOp,
        kernel: Vec<usize>,
        window: Window,
        ceil_mode: bool,
        count_include_pad: bool,
    },
    /// The gradient of [`Op::Pool`] with its attributes: operands `x` and `dy`, the
    /// result of `x`'s type. Max: each window's `dy` goes to its first largest tap inside
    /// the input (row-major tap order; PyTorch's indices); avg: `dy / count` to each tap
    /// inside the input. Summed where windows overlap, in f32 (f64 for f64).
    PoolGrad {
        op: PoolOp,
        kernel: Vec<usize>,
        window: Window,
        ceil_mode: bool,
        count_include_pad: bool,
    },
    /// Batch normalization as inference computes it, over axis 1 of `x` `[n, c, ..]`:
    /// operands `x`, `scale`, `bias`, `mean`, `var` (the last four `[c]`), all of one
    /// float dtype; `y = (x - mean) / sqrt(var + epsilon) * scale + bias`, in f32 (f64
    /// for f64). A training step computes it from the batch's statistics instead and
    /// updates `mean` and `var` as ONNX's `momentum` says
    /// (`running = running * momentum + batch * (1 - momentum)`; PyTorch's momentum is
    /// `1 - momentum`): see `graphc_compiler::passes::batch_norm`.
    BatchNorm {
        #[serde(with = "exact_f64")]
        epsilon: f64,
        #[serde(with = "exact_f64")]
        momentum: f64,
    },
    /// Weight-only dequantization of `q` with `scales`, groups along the last axis.
    /// The output is `[.., k]` of the scales' (float) dtype. With `bits` 8, `q` is
    /// `i8 [.., k]`; with `bits` 4, `q` is `u8 [.., k/2]` (`k` even) holding two signed
    /// 4-bit values per byte, element `2j` in the low nibble of byte `j` and `2j+1` in
    /// the high one (two's complement, -8..=7). `scales` is `[.., ceil(k/group)]`:
    /// `out[.., i] = q[.., i] * scales[.., i / group]`, computed in f32 and rounded once.
    Dequantize {
        bits: usize,
        group: usize,
    },
}

/// Which operand of attention an [`Op::AttentionGrad`] is the gradient of.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AttentionOperand {
    Q,
    K,
    V,
}

impl AttentionOperand {
    pub fn name(self) -> &'static str {
        match self {
            AttentionOperand::Q => "q",
            AttentionOperand::K => "k",
            AttentionOperand::V => "v",
        }
    }

    /// Its index among attention's operands.
    pub fn index(self) -> usize {
        match self {
            AttentionOperand::Q => 0,
            AttentionOperand::K => 1,
            AttentionOperand::V => 2,
        }
    }
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
    pub const ALL: [BinaryOp; 19] = [
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
        BinaryOp::GeluTanhGrad,
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
            BinaryOp::GeluTanhGrad => "gelu_tanh_grad",
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
        } else if self == BinaryOp::GeluTanhGrad {
            d.is_float()
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
    pub const ALL: [ArgReduceOp; 2] = [ArgReduceOp::ArgMax, ArgReduceOp::ArgMin];

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

/// What an [`Op`] is without its attributes: the one table of op names, which the
/// printer writes ([`Op::name`]) and the parser reads back ([`OpKind::from_name`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum OpKind {
    Input,
    Parameter,
    Constant,
    Iota,
    Unary(UnaryOp),
    Binary(BinaryOp),
    Select,
    Cast,
    Broadcast,
    Reduce(ReduceOp),
    ArgReduce(ArgReduceOp),
    MatMul,
    Reshape,
    Transpose,
    Slice,
    Concat,
    Gather,
    ScatterAdd,
    Pad,
    Attention,
    AttentionLse,
    AttentionGrad,
    Dequantize,
    Conv,
    ConvGrad,
    Pool(PoolOp),
    PoolGrad(PoolOp),
    BatchNorm,
}

impl OpKind {
    /// The kinds that take no sub-op.
    const PLAIN: [OpKind; 22] = [
        OpKind::Input,
        OpKind::Parameter,
        OpKind::Constant,
        OpKind::Iota,
        OpKind::Select,
        OpKind::Cast,
        OpKind::Broadcast,
        OpKind::MatMul,
        OpKind::Reshape,
        OpKind::Transpose,
        OpKind::Slice,
        OpKind::Concat,
        OpKind::Gather,
        OpKind::ScatterAdd,
        OpKind::Pad,
        OpKind::Attention,
        OpKind::AttentionLse,
        OpKind::AttentionGrad,
        OpKind::Dequantize,
        OpKind::Conv,
        OpKind::ConvGrad,
        OpKind::BatchNorm,
    ];

    /// Every kind: the plain ones, then the unary, binary, reduction and arg-reduction
    /// ops.
    pub fn all() -> impl Iterator<Item = OpKind> {
        OpKind::PLAIN
            .into_iter()
            .chain(ArgReduceOp::ALL.map(OpKind::ArgReduce))
            .chain(UnaryOp::ALL.map(OpKind::Unary))
            .chain(BinaryOp::ALL.map(OpKind::Binary))
            .chain(ReduceOp::ALL.map(OpKind::Reduce))
            .chain(PoolOp::ALL.map(OpKind::Pool))
            .chain(PoolOp::ALL.map(OpKind::PoolGrad))
    }

    /// The name of ops of this kind.
    pub fn name(self) -> &'static str {
        match self {
            OpKind::Input => "input",
            OpKind::Parameter => "param",
            OpKind::Constant => "constant",
            OpKind::Iota => "iota",
            OpKind::Unary(u) => u.name(),
            OpKind::Binary(b) => b.name(),
            OpKind::Select => "select",
            OpKind::Cast => "cast",
            OpKind::Broadcast => "broadcast",
            OpKind::Reduce(op) => op.name(),
            OpKind::ArgReduce(op) => op.name(),
            OpKind::MatMul => "matmul",
            OpKind::Reshape => "reshape",
            OpKind::Transpose => "transpose",
            OpKind::Slice => "slice",
            OpKind::Concat => "concat",
            OpKind::Gather => "gather",
            OpKind::ScatterAdd => "scatter_add",
            OpKind::Pad => "pad",
            OpKind::Attention => "attention",
            OpKind::AttentionLse => "attention_lse",
            OpKind::AttentionGrad => "attention_grad",
            OpKind::Dequantize => "dequantize",
            OpKind::Conv => "conv",
            OpKind::ConvGrad => "conv_grad",
            OpKind::Pool(p) => p.name(),
            OpKind::PoolGrad(PoolOp::Max) => "max_pool_grad",
            OpKind::PoolGrad(PoolOp::Avg) => "avg_pool_grad",
            OpKind::BatchNorm => "batch_norm",
        }
    }

    /// The kind named `name` (the inverse of [`OpKind::name`]).
    pub fn from_name(name: &str) -> Option<OpKind> {
        OpKind::all().find(|k| k.name() == name)
    }
}

impl Op {
    /// The op's name in the text format and in reports: the name of its [`OpKind`].
    pub fn name(&self) -> &'static str {
        self.kind().name()
    }

    /// The op without its attributes.
    pub fn kind(&self) -> OpKind {
        match self {
            Op::Input { .. } => OpKind::Input,
            Op::Parameter { .. } => OpKind::Parameter,
            Op::Constant { .. } => OpKind::Constant,
            Op::Iota { .. } => OpKind::Iota,
            Op::Unary(u) => OpKind::Unary(*u),
            Op::Binary(b) => OpKind::Binary(*b),
            Op::Select => OpKind::Select,
            Op::Cast { .. } => OpKind::Cast,
            Op::Broadcast { .. } => OpKind::Broadcast,
            Op::Reduce { op, .. } => OpKind::Reduce(*op),
            Op::ArgReduce { op, .. } => OpKind::ArgReduce(*op),
            Op::MatMul => OpKind::MatMul,
            Op::Reshape { .. } => OpKind::Reshape,
            Op::Transpose { .. } => OpKind::Transpose,
            Op::Slice { .. } => OpKind::Slice,
            Op::Concat { .. } => OpKind::Concat,
            Op::Gather { .. } => OpKind::Gather,
            Op::ScatterAdd { .. } => OpKind::ScatterAdd,
            Op::Pad { .. } => OpKind::Pad,
            Op::Attention { .. } => OpKind::Attention,
            Op::AttentionLse { .. } => OpKind::AttentionLse,
            Op::AttentionGrad { .. } => OpKind::AttentionGrad,
            Op::Dequantize { .. } => OpKind::Dequantize,
            Op::Conv { .. } => OpKind::Conv,
            Op::ConvGrad { .. } => OpKind::ConvGrad,
            Op::Pool { op, .. } => OpKind::Pool(*op),
            Op::PoolGrad { op, .. } => OpKind::PoolGrad(*op),
            Op::BatchNorm { .. } => OpKind::BatchNorm,
        }
    }

    /// Number of operands, or `None` for variadic ops (concat takes one or more,
    /// attention three or four).
    pub fn arity(&self) -> Option<usize> {
        Some(match self {
            Op::Input { .. } | Op::Parameter { .. } | Op::Constant { .. } | Op::Iota { .. } => 0,
            Op::Binary(_)
            | Op::MatMul
            | Op::Gather { .. }
            | Op::ScatterAdd { .. }
            | Op::Dequantize { .. }
            | Op::Conv { .. }
            | Op::ConvGrad { .. }
            | Op::PoolGrad { .. } => 2,
            Op::Select => 3,
            Op::BatchNorm { .. } => 5,
            Op::Concat { .. } | Op::Attention { .. } | Op::AttentionLse { .. } | Op::AttentionGrad { .. } => {
                return None
            }
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

mod exact_f64;

#[cfg(test)]
mod tests;
