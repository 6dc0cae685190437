//! The builder: write graphs in Rust with methods and operators.
//!
//! ```
//! use graphc_ir::{DType, GraphBuilder};
//! let b = GraphBuilder::new();
//! let x = b.input("x", DType::F32, [2, 3]);
//! let y = (x * 2.0 + 1.0).relu().sum(&[-1], false);
//! b.output("y", y);
//! let graph = b.finish().unwrap();
//! assert_eq!(graph.node(graph.outputs()[0].node).ty.to_string(), "f32[2]");
//! ```
//!
//! Binary operators broadcast by numpy rules (the builder inserts the explicit
//! [`Op::Broadcast`] nodes) and require one dtype (cast explicitly). A scalar `f64`
//! operand becomes a constant of the other operand's dtype. Axes may be negative.
//!
//! Shape errors do not panic: the builder records the first one and [`GraphBuilder::finish`]
//! returns it, naming the op; the operators can then stay infallible.

use std::cell::RefCell;
use std::ops;

use crate::shape::normalize_axis;
use crate::{
    ArgReduceOp, BinaryOp, DType, Graph, GraphError, NodeId, Op, PadMode, ReduceOp, Shape, SliceRange, Tensor,
    TensorType, UnaryOp,
};

/// Builds a [`Graph`]. Values borrow it, so operators can add nodes.
#[derive(Default)]
pub struct GraphBuilder {
    state: RefCell<State>,
}

#[derive(Default)]
struct State {
    graph: Graph,
    error: Option<GraphError>,
    scope: Vec<String>,
}

/// A value being built: a node of the builder's graph.
#[derive(Clone, Copy)]
pub struct Value<'b> {
    id: NodeId,
    b: &'b GraphBuilder,
}

impl std::fmt::Debug for Value<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.id, self.ty())
    }
}

impl GraphBuilder {
    pub fn new() -> GraphBuilder {
        GraphBuilder::default()
    }

    /// A builder that goes on adding to `graph` (its nodes, inputs, outputs and
    /// weights kept as they are).
    pub fn from_graph(graph: Graph) -> GraphBuilder {
        GraphBuilder {
            state: RefCell::new(State {
                graph,
                error: None,
                scope: Vec::new(),
            }),
        }
    }

    /// The graph built so far, unverified, with the first error met (for a caller that
    /// edits it further before verifying).
    pub fn into_parts(self) -> (Graph, Option<GraphError>) {
        let state = self.state.into_inner();
        (state.graph, state.error)
    }

    /// The graph, verified, or the first error met while building.
    pub fn finish(self) -> Result<Graph, GraphError> {
        let state = self.state.into_inner();
        if let Some(e) = state.error {
            return Err(e);
        }
        state.graph.verify()?;
        Ok(state.graph)
    }

    /// The first error met so far, taken (building goes on without it).
    pub fn take_error(&self) -> Option<GraphError> {
        self.state.borrow_mut().error.take()
    }

    /// Read the graph built so far.
    pub fn with_graph<R>(&self, f: impl FnOnce(&Graph) -> R) -> R {
        f(&self.state.borrow().graph)
    }

    /// A value for an existing node of this builder's graph.
    pub fn value(&self, id: NodeId) -> Option<Value<'_>> {
        (id.index() < self.state.borrow().graph.len()).then_some(Value { id, b: self })
    }

    /// Run `f` with `name/` prefixed to the names of the nodes it adds.
    pub fn scope<R>(&self, name: &str, f: impl FnOnce() -> R) -> R {
        self.state.borrow_mut().scope.push(name.to_string());
        let r = f();
        self.state.borrow_mut().scope.pop();
        r
    }

    /// Any op of the given operands (its type inferred; an error is recorded).
    pub fn add_op<'b>(&'b self, op: Op, operands: &[Value<'b>]) -> Value<'b> {
        let ids: Vec<NodeId> = operands.iter().map(|v| v.id).collect();
        self.add(op, &ids)
    }

    /// Add a node; on a type error, record it and return a stand-in so building goes on.
    fn add(&self, op: Op, inputs: &[NodeId]) -> Value<'_> {
        let mut st = self.state.borrow_mut();
        let name = (!st.scope.is_empty()).then(|| format!("{}/{}", st.scope.join("/"), op.name()));
        let fallback = inputs.first().copied();
        match st.graph.add(op, inputs.to_vec(), name) {
            Ok(id) => Value { id, b: self },
            Err(e) => {
                st.error.get_or_insert(e);
                let id = match fallback {
                    Some(id) => id,
                    None => st.graph.push(crate::Node {
                        op: Op::Constant {
                            value: Tensor::scalar(DType::F32, 0.0),
                        },
                        inputs: vec![],
                        ty: TensorType::new(DType::F32, Shape::scalar()),
                        name: Some("<error>".into()),
                    }),
                };
                Value { id, b: self }
            }
        }
    }

    /// A node of any op on existing values (typed by `infer_type`; a type error is
    /// recorded as the builder's other methods record them).
    pub fn op(&self, op: Op, operands: &[NodeId]) -> Value<'_> {
        self.add(op, operands)
    }

    /// A graph input, bound by `name`.
    pub fn input(&self, name: &str, dtype: DType, shape: impl Into<Shape>) -> Value<'_> {
        let ty = TensorType::new(dtype, shape);
        self.add(
            Op::Input {
                name: name.to_string(),
                ty,
            },
            &[],
        )
    }

    /// A weight with its data.
    pub fn param(&self, name: &str, value: Tensor) -> Value<'_> {
        let mut st = self.state.borrow_mut();
        // Every parameter of a builder has its data: a lookup, not a scan of them all.
        if st.graph.weight(name).is_some() {
            let e = GraphError::Graph(format!("parameter name \"{name}\" is used twice"));
            st.error.get_or_insert(e);
        }
        let id = st.graph.add_parameter(name, value);
        Value { id, b: self }
    }

    pub fn constant(&self, value: Tensor) -> Value<'_> {
        self.add(Op::Constant { value }, &[])
    }

    /// A rank-0 constant.
    pub fn scalar(&self, dtype: DType, value: f64) -> Value<'_> {
        self.constant(Tensor::scalar(dtype, value))
    }

    /// `out[...] = index along axis`.
    pub fn iota(&self, dtype: DType, shape: impl Into<Shape>, axis: i64) -> Value<'_> {
        let shape = shape.into();
        let axis = self.axis(axis, shape.rank());
        self.add(
            Op::Iota {
                ty: TensorType::new(dtype, shape),
                axis,
            },
            &[],
        )
    }

    /// `cond ? a : b`, broadcasting all three.
    pub fn select<'b>(&'b self, cond: Value<'b>, a: Value<'b>, b: Value<'b>) -> Value<'b> {
        let shape = [cond.shape(), a.shape(), b.shape()]
            .iter()
            .try_fold(Shape::scalar(), |acc, s| crate::infer::broadcast_pair(&acc, s));
        let Some(shape) = shape else {
            return self.fail(
                cond,
                format!(
                    "select operands do not broadcast: {}, {}, {}",
                    cond.ty(),
                    a.ty(),
                    b.ty()
                ),
            );
        };
        let (c, a, b) = (
            cond.broadcast_to(&shape),
            a.broadcast_to(&shape),
            b.broadcast_to(&shape),
        );
        self.add(Op::Select, &[c.id, a.id, b.id])
    }

    /// Join along `axis`.
    pub fn concat<'b>(&'b self, parts: &[Value<'b>], axis: i64) -> Value<'b> {
        let Some(first) = parts.first() else {
            return self.fail_new("concat of no operands");
        };
        let axis = self.axis(axis, first.rank());
        let ids: Vec<_> = parts.iter().map(|p| p.id).collect();
        self.add(Op::Concat { axis }, &ids)
    }

    /// Weight-only dequantization ([`Op::Dequantize`]) of `q` with `scales`, groups of
    /// `group` along the last axis.
    pub fn dequantize<'a>(&'a self, q: Value<'a>, scales: Value<'a>, bits: usize, group: usize) -> Value<'a> {
        self.add(Op::Dequantize { bits, group }, &[q.id, scales.id])
    }

    /// Scaled dot-product attention ([`Op::Attention`]) of `q`, `k`, `v` with an
    /// optional additive `mask` (not broadcast here: its dims are 1 or the scores').
    pub fn attention<'b>(
        &'b self,
        q: Value<'b>,
        k: Value<'b>,
        v: Value<'b>,
        mask: Option<Value<'b>>,
        scale: f64,
        causal: bool,
    ) -> Value<'b> {
        let mut ids = vec![q.id, k.id, v.id];
        ids.extend(mask.map(|m| m.id));
        self.add(
            Op::Attention {
                scale,
                causal,
                zero_masked_rows: false,
            },
            &ids,
        )
    }

    /// [`Self::attention`] with every attribute given: the scale, causality, and
    /// whether fully masked rows give 0 (PyTorch's exported `where(isnan(p), 0, p)`).
    pub fn attention_flags<'b>(
        &'b self,
        (q, k, v): (Value<'b>, Value<'b>, Value<'b>),
        mask: Option<Value<'b>>,
        flags: crate::interp::attention::Flags,
    ) -> Value<'b> {
        let mut ids = vec![q.id, k.id, v.id];
        ids.extend(mask.map(|m| m.id));
        self.add(
            Op::Attention {
                scale: flags.scale,
                causal: flags.causal,
                zero_masked_rows: flags.zero_masked_rows,
            },
            &ids,
        )
    }

    /// Mark `v` as the graph output `name`.
    pub fn output(&self, name: &str, v: Value<'_>) {
        self.state.borrow_mut().graph.add_output(name, v.id);
    }

    fn axis(&self, axis: i64, rank: usize) -> usize {
        normalize_axis(axis, rank).unwrap_or_else(|| {
            let e = GraphError::Graph(format!("axis {axis} out of range for rank {rank}"));
            self.state.borrow_mut().error.get_or_insert(e);
            0
        })
    }

    pub(crate) fn fail<'b>(&'b self, at: Value<'b>, message: String) -> Value<'b> {
        let mut st = self.state.borrow_mut();
        let e = GraphError::at(&st.graph, at.id, message);
        st.error.get_or_insert(e);
        at
    }

    fn fail_new(&self, message: &str) -> Value<'_> {
        self.state
            .borrow_mut()
            .error
            .get_or_insert(GraphError::Graph(message.to_string()));
        self.scalar(DType::F32, 0.0)
    }
}

macro_rules! unary_methods {
    ($($(#[$m:meta])* $name:ident => $op:ident),* $(,)?) => {
        $($(#[$m])* pub fn $name(self) -> Value<'b> { self.unary(UnaryOp::$op) })*
    };
}

macro_rules! binary_methods {
    ($($(#[$m:meta])* $name:ident => $op:ident),* $(,)?) => {
        $($(#[$m])* pub fn $name(self, other: impl IntoValue<'b>) -> Value<'b> { self.binary(BinaryOp::$op, other) })*
    };
}

impl<'b> Value<'b> {
    pub fn id(self) -> NodeId {
        self.id
    }

    pub fn builder(self) -> &'b GraphBuilder {
        self.b
    }

    pub fn ty(self) -> TensorType {
        self.b.state.borrow().graph.node(self.id).ty.clone()
    }

    pub fn shape(self) -> Shape {
        self.ty().shape
    }

    pub fn dtype(self) -> DType {
        self.ty().dtype
    }

    pub fn rank(self) -> usize {
        self.shape().rank()
    }

    /// Give the node a name (shown in the text IR and in reports).
    pub fn named(self, name: &str) -> Value<'b> {
        let mut st = self.b.state.borrow_mut();
        let full = if st.scope.is_empty() {
            name.to_string()
        } else {
            format!("{}/{name}", st.scope.join("/"))
        };
        if !matches!(st.graph.node(self.id).op, Op::Input { .. } | Op::Parameter { .. }) {
            st.graph.set_name(self.id, full);
        }
        self
    }

    pub fn unary(self, op: UnaryOp) -> Value<'b> {
        self.b.add(Op::Unary(op), &[self.id])
    }

    /// Broadcast both operands to their common shape, then apply `op`.
    pub fn binary(self, op: BinaryOp, other: impl IntoValue<'b>) -> Value<'b> {
        let other = other.into_value(self);
        let (a, b) = (self.shape(), other.shape());
        let Some(shape) = crate::infer::broadcast_pair(&a, &b) else {
            return self.b.fail(
                self,
                format!(
                    "{} operands do not broadcast: {} and {}",
                    op.name(),
                    self.ty(),
                    other.ty()
                ),
            );
        };
        let (x, y) = (self.broadcast_to(&shape), other.broadcast_to(&shape));
        self.b.add(Op::Binary(op), &[x.id, y.id])
    }

    unary_methods! {
        exp => Exp, log => Log, sqrt => Sqrt, rsqrt => Rsqrt, reciprocal => Reciprocal, tanh => Tanh,
        sigmoid => Sigmoid, relu => Relu,
        /// The primitive erf GELU (see `nn::gelu` for the decomposed form front ends produce).
        gelu => Gelu,
        gelu_tanh => GeluTanh, silu => Silu, erf => Erf, sin => Sin, cos => Cos, floor => Floor,
        ceil => Ceil, round => Round, sign => Sign, abs => Abs, isnan => IsNan, isinf => IsInf,
    }

    binary_methods! {
        pow => Pow, maximum => Max, minimum => Min,
        /// Remainder with the sign of the dividend.
        fmod => Fmod,
        eq => Eq, ne => Ne, lt => Lt, le => Le, gt => Gt, ge => Ge, and => And, or => Or, xor => Xor,
    }

    pub fn cast(self, to: DType) -> Value<'b> {
        if self.dtype() == to {
            return self;
        }
        self.b.add(Op::Cast { to }, &[self.id])
    }

    /// Numpy broadcast to `shape` (no node when the shape already matches).
    pub fn broadcast_to(self, shape: &Shape) -> Value<'b> {
        if &self.shape() == shape {
            return self;
        }
        self.b.add(Op::Broadcast { shape: shape.clone() }, &[self.id])
    }

    fn axes(self, axes: &[i64]) -> Vec<usize> {
        let rank = self.rank();
        let mut out: Vec<usize> = axes.iter().map(|&a| self.b.axis(a, rank)).collect();
        out.sort_unstable();
        out.dedup();
        out
    }

    pub fn reduce(self, op: ReduceOp, axes: &[i64], keepdims: bool) -> Value<'b> {
        let axes = self.axes(axes);
        self.b.add(Op::Reduce { op, axes, keepdims }, &[self.id])
    }

    pub fn sum(self, axes: &[i64], keepdims: bool) -> Value<'b> {
        self.reduce(ReduceOp::Sum, axes, keepdims)
    }

    pub fn mean(self, axes: &[i64], keepdims: bool) -> Value<'b> {
        self.reduce(ReduceOp::Mean, axes, keepdims)
    }

    pub fn reduce_max(self, axes: &[i64], keepdims: bool) -> Value<'b> {
        self.reduce(ReduceOp::Max, axes, keepdims)
    }

    pub fn reduce_min(self, axes: &[i64], keepdims: bool) -> Value<'b> {
        self.reduce(ReduceOp::Min, axes, keepdims)
    }

    pub fn prod(self, axes: &[i64], keepdims: bool) -> Value<'b> {
        self.reduce(ReduceOp::Prod, axes, keepdims)
    }

    pub fn argmax(self, axis: i64, keepdims: bool) -> Value<'b> {
        let axis = self.b.axis(axis, self.rank());
        self.b.add(
            Op::ArgReduce {
                op: ArgReduceOp::ArgMax,
                axis,
                keepdims,
            },
            &[self.id],
        )
    }

    pub fn argmin(self, axis: i64, keepdims: bool) -> Value<'b> {
        let axis = self.b.axis(axis, self.rank());
        self.b.add(
            Op::ArgReduce {
                op: ArgReduceOp::ArgMin,
                axis,
                keepdims,
            },
            &[self.id],
        )
    }

    /// Batched matrix product; batch dims broadcast.
    pub fn matmul(self, other: Value<'b>) -> Value<'b> {
        self.b.add(Op::MatMul, &[self.id, other.id])
    }

    pub fn reshape(self, shape: impl Into<Shape>) -> Value<'b> {
        let shape = shape.into();
        if self.shape() == shape {
            return self;
        }
        self.b.add(Op::Reshape { shape }, &[self.id])
    }

    pub fn transpose(self, perm: &[usize]) -> Value<'b> {
        self.b.add(Op::Transpose { perm: perm.to_vec() }, &[self.id])
    }

    /// Swap the last two axes.
    pub fn t(self) -> Value<'b> {
        let r = self.rank();
        let mut perm: Vec<usize> = (0..r).collect();
        if r >= 2 {
            perm.swap(r - 1, r - 2);
        }
        self.transpose(&perm)
    }

    /// Slice one axis (Python semantics); other axes whole.
    pub fn slice(self, axis: i64, start: i64, end: i64, step: i64) -> Value<'b> {
        let rank = self.rank();
        let axis = self.b.axis(axis, rank);
        let mut ranges = vec![SliceRange::full(); rank];
        // `axis` is in range unless `self.b.axis` recorded an error (rank 0).
        if let Some(r) = ranges.get_mut(axis) {
            *r = SliceRange { start, end, step };
        }
        self.slice_ranges(ranges)
    }

    pub fn slice_ranges(self, ranges: Vec<SliceRange>) -> Value<'b> {
        self.b.add(Op::Slice { ranges }, &[self.id])
    }

    /// `self[.., indices, ..]` along `axis`.
    pub fn gather(self, indices: Value<'b>, axis: i64) -> Value<'b> {
        let axis = self.b.axis(axis, self.rank());
        self.b.add(Op::Gather { axis }, &[self.id, indices.id])
    }

    /// The transpose of [`Value::gather`]: `self` (shaped like a gather's output) summed
    /// into rows `indices` of a zero tensor whose `axis` has extent `size`.
    pub fn scatter_add(self, indices: Value<'b>, axis: i64, size: usize) -> Value<'b> {
        let rank = (self.rank() + 1).saturating_sub(indices.rank());
        let axis = self.b.axis(axis, rank);
        self.b.add(Op::ScatterAdd { axis, size }, &[self.id, indices.id])
    }

    /// Convolution ([`Op::Conv`]) of `self` `[n, c, spatial..]` by `w`.
    pub fn conv(self, w: Value<'b>, window: crate::Window, groups: usize) -> Value<'b> {
        self.b.add(Op::Conv { window, groups }, &[self.id, w.id])
    }

    /// A gradient of a convolution ([`Op::ConvGrad`]): `self` is `dy` (of the input)
    /// or `x` (of the weights), `other` the weights or `dy`; `shape` the gradient's.
    pub fn conv_grad(
        self,
        other: Value<'b>,
        wrt: crate::ConvOperand,
        window: crate::Window,
        groups: usize,
        shape: &[usize],
    ) -> Value<'b> {
        let op = Op::ConvGrad {
            wrt,
            window,
            groups,
            shape: Shape::new(shape.to_vec()),
        };
        self.b.add(op, &[self.id, other.id])
    }

    /// The gradient of a pooling ([`Op::PoolGrad`]) of `self` (its input) given `dy`.
    pub fn pool_grad(self, dy: Value<'b>, pool: &Op) -> Value<'b> {
        match pool {
            Op::Pool {
                op,
                kernel,
                window,
                ceil_mode,
                count_include_pad,
            } => {
                let op = Op::PoolGrad {
                    op: *op,
                    kernel: kernel.clone(),
                    window: window.clone(),
                    ceil_mode: *ceil_mode,
                    count_include_pad: *count_include_pad,
                };
                self.b.add(op, &[self.id, dy.id])
            }
            other => self
                .b
                .fail_new(&format!("pool_grad of a {}, not a pooling", other.name())),
        }
    }

    /// Pooling ([`Op::Pool`]) of `self` `[n, c, spatial..]` over windows of `kernel`.
    pub fn pool(
        self,
        op: crate::PoolOp,
        kernel: &[usize],
        window: crate::Window,
        ceil_mode: bool,
        count_include_pad: bool,
    ) -> Value<'b> {
        let op = Op::Pool {
            op,
            kernel: kernel.to_vec(),
            window,
            ceil_mode,
            count_include_pad,
        };
        self.b.add(op, &[self.id])
    }

    pub fn pad(self, pads: &[(i64, i64)], mode: PadMode, value: f64) -> Value<'b> {
        self.b.add(
            Op::Pad {
                pads: pads.to_vec(),
                mode,
                value,
            },
            &[self.id],
        )
    }
}

/// Operands of binary operators: another value, or a scalar that becomes a constant of
/// the other operand's dtype.
pub trait IntoValue<'b> {
    fn into_value(self, like: Value<'b>) -> Value<'b>;
}

impl<'b> IntoValue<'b> for Value<'b> {
    fn into_value(self, _: Value<'b>) -> Value<'b> {
        self
    }
}

impl<'b> IntoValue<'b> for f64 {
    fn into_value(self, like: Value<'b>) -> Value<'b> {
        like.b.scalar(like.dtype(), self)
    }
}

macro_rules! operator {
    ($trait:ident, $method:ident, $op:ident) => {
        impl<'b, R: IntoValue<'b>> ops::$trait<R> for Value<'b> {
            type Output = Value<'b>;
            fn $method(self, rhs: R) -> Value<'b> {
                self.binary(BinaryOp::$op, rhs)
            }
        }
        impl<'b> ops::$trait<Value<'b>> for f64 {
            type Output = Value<'b>;
            fn $method(self, rhs: Value<'b>) -> Value<'b> {
                rhs.b.scalar(rhs.dtype(), self).binary(BinaryOp::$op, rhs)
            }
        }
    };
}

operator!(Add, add, Add);
operator!(Sub, sub, Sub);
operator!(Mul, mul, Mul);
operator!(Div, div, Div);
// `%` is the remainder with the sign of the divisor (Python's); see `fmod` for C's.
operator!(Rem, rem, Mod);

/// Logical not of a bool value.
impl<'b> ops::Not for Value<'b> {
    type Output = Value<'b>;
    fn not(self) -> Value<'b> {
        self.unary(UnaryOp::Not)
    }
}

impl<'b> ops::Neg for Value<'b> {
    type Output = Value<'b>;
    fn neg(self) -> Value<'b> {
        self.unary(UnaryOp::Neg)
    }
}
