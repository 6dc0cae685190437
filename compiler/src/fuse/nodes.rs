//! The fusion view of a graph: views resolved into layouts of their roots, so every
//! operand of a compute node is `(root, affine layout)`; copies inserted where a layout
//! is not affine, where a GEMM cannot read an operand, and for outputs that are views.

use graphc_ir::{DType, Graph, NodeId, Op, ReduceOp, Tensor, TensorType};

use super::layout::Layout;

/// What a fusion node is.
#[derive(Clone, Debug)]
pub enum FKind {
    /// A graph input, weight or (non-scalar) constant: memory, not computed.
    Source,
    /// A one-element constant: inlined into kernel bodies where it is read.
    Scalar(Tensor),
    /// Resolved away: consumers read its root through a layout.
    View,
    /// Unary, binary, select or cast.
    Ew(Op),
    Iota {
        axis: usize,
    },
    /// A gather: its data and indices are read from memory by whichever kernel it joins
    /// (an embedding lookup folded into its consumer's indexing).
    Gather {
        axis: usize,
    },
    /// Materializes its operand densely (same shape).
    Copy,
    Reduce {
        op: ReduceOp,
        axes: Vec<usize>,
    },
    MatMul,
    /// A convolution ([`Op::Conv`]), which takes elementwise epilogues as a matmul does.
    Conv {
        window: graphc_ir::Window,
        groups: usize,
    },
    /// A weight-only quantized weight `[n, k]` ([`Op::Dequantize`] of a packed weight
    /// and its scales, operands 0 and 1), read only transposed as matmuls' right
    /// operands, which dequantize it as they read it: memory, not computed.
    QuantWeight {
        bits: usize,
        group: usize,
    },
    /// Not fused: one kernel of its own.
    Single(Op),
}

/// An operand as read by its consumer: `root`'s dense memory through `layout`, giving a
/// value of shape `dims`.
#[derive(Clone, Debug)]
pub struct Operand {
    pub root: usize,
    pub layout: Layout,
    pub dims: Vec<usize>,
    /// The view node that gave this layout (canonical number), if any.
    pub via: Option<u32>,
}

#[derive(Clone, Debug)]
pub struct FNode {
    pub kind: FKind,
    pub ty: TensorType,
    pub operands: Vec<Operand>,
    /// The IR node, when it is one (copies are not).
    pub ir: Option<NodeId>,
    /// Canonical number of the IR node, for reports.
    pub canon: Option<u32>,
    pub name: Option<String>,
}

impl FNode {
    pub fn is_compute(&self) -> bool {
        !matches!(
            self.kind,
            FKind::Source | FKind::Scalar(_) | FKind::View | FKind::QuantWeight { .. }
        )
    }

    pub fn dims(&self) -> &[usize] {
        self.ty.shape.dims()
    }
}

/// The fusion nodes of a graph, in a topological order, plus the output operands.
pub struct Nodes {
    pub nodes: Vec<FNode>,
    pub outputs: Vec<(String, Operand)>,
    /// For each IR node: its resolved operand form (root and layout of its value).
    pub value_of: Vec<Option<Operand>>,
}

/// The [`Op::Dequantize`] nodes a matmul reads as a quantized right operand: of rank 2
/// over weights or constants, every use a transpose `[1, 0]` whose every use is a
/// float matmul's right operand (and not its left).
fn quant_weights(graph: &Graph) -> Vec<bool> {
    let users = graph.users();
    let is_memory = |id: NodeId| {
        matches!(
            graph.node(id).op,
            Op::Parameter { .. } | Op::Constant { .. } | Op::Input { .. }
        )
    };
    let rhs_only = |id: NodeId| {
        users.get(id.index()).is_some_and(|us| {
            !us.is_empty()
                && us.iter().all(|&u| {
                    let n = graph.node(u);
                    matches!(n.op, Op::MatMul)
                        && is_gemm_dtype(n.ty.dtype)
                        && n.inputs.get(1) == Some(&id)
                        && n.inputs.first() != Some(&id)
                })
        })
    };
    graph
        .ids()
        .map(|id| {
            let n = graph.node(id);
            matches!(n.op, Op::Dequantize { .. })
                && n.ty.shape.rank() == 2
                && n.inputs.iter().all(|&i| is_memory(i))
                && users.get(id.index()).is_some_and(|us| {
                    !us.is_empty()
                        && us.iter().all(|&u| {
                            matches!(&graph.node(u).op, Op::Transpose { perm } if perm == &[1, 0]) && rhs_only(u)
                        })
                })
        })
        .collect()
}

/// The axis of the iota a broadcast of an iota is (`broadcast(iota(s, a), S)` is
/// `iota(S, a + lead)` when the iota's axis is not broadcast), so kernels compute the
/// index instead of reading a materialized row of it (cross-entropy's class index).
fn broadcast_iota_axis(graph: &Graph, id: NodeId) -> Option<usize> {
    let node = graph.node(id);
    let Op::Broadcast { shape } = &node.op else { return None };
    let src = graph.node(*node.inputs.first()?);
    let Op::Iota { axis, .. } = src.op else { return None };
    let from = src.ty.shape.dims();
    let lead = shape.rank().checked_sub(from.len())?;
    (shape.dims().get(axis + lead) == from.get(axis)).then_some(axis + lead)
}

/// Iotas read only through broadcasts that become iotas of their own
/// ([`broadcast_iota_axis`]), and not outputs: nothing reads them, so they are not
/// computed.
fn iotas_only_broadcast(graph: &Graph) -> Vec<bool> {
    let users = graph.users();
    let outputs: Vec<NodeId> = graph.outputs().iter().map(|o| o.node).collect();
    graph
        .ids()
        .map(|id| {
            matches!(graph.node(id).op, Op::Iota { .. })
                && !outputs.contains(&id)
                && users
                    .get(id.index())
                    .is_some_and(|us| !us.is_empty() && us.iter().all(|&u| broadcast_iota_axis(graph, u).is_some()))
        })
        .collect()
}

fn is_gemm_dtype(d: DType) -> bool {
    matches!(d, DType::F32 | DType::F16 | DType::BF16 | DType::F64)
}

/// Whether a GEMM library can read an operand through this access over `[batch.., r, c]`:
/// one of the two matrix dims is unit-stride and the batch dims collapse into one
/// uniform stride (or are all broadcast).
pub fn gemm_readable(strides: &[i64], dims: &[usize]) -> bool {
    let n = dims.len();
    if n < 2 || strides.len() != n {
        return false;
    }
    let (r, c) = (dims[n - 2], dims[n - 1]);
    let (sr, sc) = (strides[n - 2], strides[n - 1]);
    let row_major = (c == 1 || sc == 1) && (r == 1 || sr >= c as i64);
    let col_major = (r == 1 || sr == 1) && (c == 1 || sc >= r as i64);
    if !(row_major || col_major) {
        return false;
    }
    let batch: Vec<(usize, i64)> = (0..n - 2)
        .filter(|&i| dims[i] > 1)
        .map(|i| (dims[i], strides[i]))
        .collect();
    if batch.iter().all(|&(_, s)| s == 0) {
        return true;
    }
    if batch.iter().any(|&(_, s)| s <= 0) {
        return false;
    }
    batch.windows(2).all(|w| w[0].1 == w[1].1 * w[1].0 as i64)
}

/// The access of a matmul operand of shape `dims` (through `layout`) over
/// `[out_batch.., rows, cols]`, broadcasting missing or unit batch dims.
pub fn matmul_operand_strides(layout: &Layout, dims: &[usize], out_batch: &[usize]) -> Vec<i64> {
    let r = dims.len();
    let nb = out_batch.len();
    let lead = nb - (r - 2);
    let mut s: Vec<i64> = (0..nb)
        .map(|i| {
            if i < lead || dims[i - lead] == 1 {
                0
            } else {
                layout.strides[i - lead]
            }
        })
        .collect();
    s.push(layout.strides[r - 2]);
    s.push(layout.strides[r - 1]);
    s
}

impl Nodes {
    pub fn build(graph: &Graph) -> Nodes {
        let order = graph.canonical_order();
        let mut canon = vec![None; graph.len()];
        for (i, id) in order.iter().enumerate() {
            canon[id.index()] = Some(i as u32);
        }
        let mut b = Nodes {
            nodes: Vec::with_capacity(graph.len()),
            outputs: Vec::new(),
            value_of: vec![None; graph.len()],
        };
        // Only what an output reaches is computed (inputs are always bound).
        let mut live = vec![false; graph.len()];
        let mut stack: Vec<NodeId> = graph
            .outputs()
            .iter()
            .map(|o| o.node)
            .chain(graph.inputs().iter().copied())
            .collect();
        while let Some(id) = stack.pop() {
            if !std::mem::replace(&mut live[id.index()], true) {
                stack.extend(graph.node(id).inputs.iter().copied());
            }
        }
        let quant = quant_weights(graph);
        let unread_iota = iotas_only_broadcast(graph);
        // The name of the view node (by canonical number) a dense copy materializes.
        let view_name = |via: Option<u32>| {
            via.and_then(|c| order.get(c as usize))
                .and_then(|&id| graph.node(id).name.clone())
        };
        for &id in order.iter().filter(|id| live[id.index()]) {
            let node = graph.node(id);
            let operands: Vec<Operand> = node
                .inputs
                .iter()
                .map(|i| b.value_of[i.index()].clone().expect("canonical order is topological"))
                .collect();
            let dims = node.ty.shape.dims().to_vec();
            let mk = |kind: FKind, operands: Vec<Operand>| FNode {
                kind,
                ty: node.ty.clone(),
                operands,
                ir: Some(id),
                canon: canon[id.index()],
                name: node.name.clone(),
            };
            let iota_axis = broadcast_iota_axis(graph, id);
            let value = match &node.op {
                Op::Input { .. } | Op::Parameter { .. } => b.push(mk(FKind::Source, vec![])),
                Op::Constant { value } if value.numel() == 1 => {
                    let scalar = value
                        .clone()
                        .reshape(Vec::<usize>::new())
                        .unwrap_or_else(|_| value.clone());
                    b.push(mk(FKind::Scalar(scalar), vec![]))
                }
                Op::Constant { .. } => b.push(mk(FKind::Source, vec![])),
                Op::Dequantize { bits, group } if quant.get(id.index()) == Some(&true) => b.push(mk(
                    FKind::QuantWeight {
                        bits: *bits,
                        group: *group,
                    },
                    operands,
                )),
                Op::Broadcast { .. } if iota_axis.is_some() => b.push(mk(
                    FKind::Iota {
                        axis: iota_axis.unwrap_or_default(),
                    },
                    vec![],
                )),
                Op::Iota { .. } if unread_iota.get(id.index()) == Some(&true) => {
                    // Never read (its broadcasts compute their own index): a view of
                    // nothing, so no kernel computes it.
                    b.nodes.push(mk(FKind::View, vec![]));
                    b.value_of[id.index()] = Some(Operand {
                        root: b.nodes.len() - 1,
                        layout: Layout::contiguous(&dims),
                        dims: dims.clone(),
                        via: None,
                    });
                    continue;
                }
                Op::Reshape { .. } | Op::Transpose { .. } | Op::Slice { .. } | Op::Broadcast { .. } => {
                    let src = &operands[0];
                    let layout = match &node.op {
                        Op::Transpose { perm } => Some(src.layout.transpose(perm)),
                        Op::Slice { ranges } => Some(src.layout.slice(&src.dims, ranges)),
                        Op::Broadcast { shape } => Some(src.layout.broadcast(&src.dims, shape.dims())),
                        _ => src.layout.reshape(&src.dims, &dims),
                    };
                    let (root, layout) = match layout {
                        Some(l) => (src.root, l),
                        None => {
                            // Not affine: materialize the operand, then reshape the copy.
                            let copy = b.copy_of(src.clone(), node.ty.dtype, node.name.clone());
                            (copy, Layout::contiguous(&dims))
                        }
                    };
                    b.nodes.push(mk(FKind::View, vec![]));
                    b.value_of[id.index()] = Some(Operand {
                        root,
                        layout,
                        dims: dims.clone(),
                        via: canon[id.index()],
                    });
                    continue;
                }
                Op::Unary(_) | Op::Binary(_) | Op::Select | Op::Cast { .. } => {
                    b.push(mk(FKind::Ew(node.op.clone()), operands))
                }
                Op::Iota { axis, .. } => b.push(mk(FKind::Iota { axis: *axis }, vec![])),
                Op::Gather { axis } if matches!(graph.node(node.inputs[1]).ty.dtype, DType::I64 | DType::I32) => {
                    b.push(mk(FKind::Gather { axis: *axis }, operands))
                }
                Op::Reduce { op, axes, .. } if !axes.is_empty() && axes.iter().all(|&a| operands[0].dims[a] > 0) => b
                    .push(mk(
                        FKind::Reduce {
                            op: *op,
                            axes: axes.clone(),
                        },
                        operands,
                    )),
                Op::MatMul if is_gemm_dtype(node.ty.dtype) => {
                    let ops = b.gemm_operands(operands, &dims[..dims.len() - 2], &view_name);
                    b.push(mk(FKind::MatMul, ops))
                }
                Op::Conv { window, groups } if !operands.iter().any(|o| b.is_scalar(o.root)) => b.push(mk(
                    FKind::Conv {
                        window: window.clone(),
                        groups: *groups,
                    },
                    operands,
                )),
                op => b.push(mk(FKind::Single(op.clone()), operands)),
            };
            b.value_of[id.index()] = Some(Operand {
                root: value,
                layout: Layout::contiguous(&dims),
                dims,
                via: None,
            });
        }
        for out in graph.outputs() {
            let v = b.value_of[out.node.index()]
                .clone()
                .expect("outputs are in canonical order");
            let root = &b.nodes[v.root];
            let direct = root.is_compute() && root.dims() == v.dims.as_slice() && v.layout.is_contiguous(&v.dims);
            let v = if direct {
                v
            } else {
                let dt = graph.node(out.node).ty.dtype;
                let d = v.dims.clone();
                let name = view_name(v.via).or_else(|| graph.node(out.node).name.clone());
                Operand {
                    root: b.copy_of(v, dt, name),
                    layout: Layout::contiguous(&d),
                    dims: d,
                    via: None,
                }
            };
            b.outputs.push((out.name.clone(), v));
        }
        b
    }

    /// Launches and bytes with one kernel per compute op: each reads the elements of
    /// its operands it touches and writes its output.
    pub fn unfused_cost(&self) -> (usize, usize) {
        let mut kernels = 0;
        let mut bytes = 0;
        for n in self.nodes.iter().filter(|n| n.is_compute() && n.ir.is_some()) {
            kernels += 1;
            // Saturating: a model at a huge dim can pass 2^64 bytes in all.
            bytes = n.ty.size_bytes().saturating_add(bytes);
            for o in &n.operands {
                let root = &self.nodes[o.root];
                if matches!(root.kind, FKind::Scalar(_)) {
                    continue;
                }
                let touched: usize = o
                    .dims
                    .iter()
                    .zip(&o.layout.strides)
                    .filter(|(_, s)| **s != 0)
                    .map(|(d, _)| *d)
                    .fold(1usize, usize::saturating_mul);
                bytes = bytes.saturating_add(touched.min(root.ty.numel()).saturating_mul(root.ty.dtype.size_bytes()));
            }
        }
        (kernels, bytes)
    }

    /// A matmul's operands as a GEMM reads them: copied densely where it cannot stride
    /// through one (or it is a scalar).
    /// `view_name`: the name of a view node by canonical number (the copy's name).
    fn gemm_operands(
        &mut self,
        operands: Vec<Operand>,
        out_batch: &[usize],
        view_name: &dyn Fn(Option<u32>) -> Option<String>,
    ) -> Vec<Operand> {
        let mut ops = Vec::new();
        for o in operands {
            let s = matmul_operand_strides(&o.layout, &o.dims, out_batch);
            let mut full = out_batch.to_vec();
            full.extend_from_slice(&o.dims[o.dims.len() - 2..]);
            let o = if self.is_scalar(o.root) || !gemm_readable(&s, &full) {
                let dt = self.nodes[o.root].ty.dtype;
                let d = o.dims.clone();
                let name = view_name(o.via).or_else(|| self.nodes[o.root].name.clone());
                Operand {
                    root: self.copy_of(o, dt, name),
                    layout: Layout::contiguous(&d),
                    dims: d,
                    via: None,
                }
            } else {
                o
            };
            ops.push(o);
        }
        ops
    }

    fn push(&mut self, n: FNode) -> usize {
        self.nodes.push(n);
        self.nodes.len() - 1
    }

    fn is_scalar(&self, i: usize) -> bool {
        matches!(self.nodes[i].kind, FKind::Scalar(_))
    }

    /// A node copying `src` densely, named after the view it materializes (`name`).
    fn copy_of(&mut self, src: Operand, dtype: DType, name: Option<String>) -> usize {
        let canon = src.via;
        let ty = TensorType::new(dtype, src.dims.clone());
        self.push(FNode {
            kind: FKind::Copy,
            ty,
            operands: vec![src],
            ir: None,
            canon,
            name,
        })
    }
}
