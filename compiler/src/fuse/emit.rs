//! From groups to kernels: buffers for every value read across a kernel boundary, one
//! kernel per group in a topological order of groups, bodies built member by member.

use std::cmp::Reverse;
use std::collections::{BTreeSet, BinaryHeap, HashMap};

use graphc_ir::work;
use graphc_ir::{Graph, Op, TensorType};

use super::group::{row_shapes, Groups, Level, Space};
use super::layout::Layout;
use super::nodes::{matmul_operand_strides, FKind, FNode, Nodes, Operand};
use crate::kernel::{
    contiguous_strides, Access, Body, BufferId, BufferKind, ConvKernel, ElementwiseKernel, Expr, ExprId, InputId,
    Kernel, KernelKind, MatMulKernel, OpKernel, Program, QuantB, RowKernel, Stage, StageId, Store,
};

pub fn emit(graph: &Graph, nodes: &Nodes, groups: &mut Groups) -> Program {
    let fnodes = &nodes.nodes;
    let mut e = Emitter {
        graph,
        nodes: fnodes,
        program: Program::default(),
        buffer_of: HashMap::new(),
    };
    // Graph inputs first, in call order.
    for &id in graph.inputs() {
        if let Some(v) = &nodes.value_of[id.index()] {
            let b = e.buffer(v.root);
            e.program.inputs.push(b);
        }
    }
    let n = fnodes.len();
    let group_of: Vec<usize> = (0..n).map(|i| groups.find(i)).collect();
    let mut stored = vec![false; n];
    for (i, node) in fnodes.iter().enumerate() {
        work::add_len(work::Stage::Fuse, 1 + groups.consumers[i].len());
        if node.is_compute() {
            stored[i] = groups.consumers[i].iter().any(|&(c, _)| group_of[c] != group_of[i]);
        }
    }
    for (_, o) in &nodes.outputs {
        stored[o.root] = true;
    }
    for order in group_order(fnodes, &group_of) {
        let kernel = e.kernel(groups, &group_of, &stored, order);
        e.program.kernels.push(kernel);
    }
    for (name, o) in &nodes.outputs {
        let b = e.buffer(o.root);
        e.program.outputs.push((name.clone(), b));
    }
    e.program
}

/// Groups in a topological order; ties go to the group with the earliest member.
fn group_order(nodes: &[FNode], group_of: &[usize]) -> Vec<usize> {
    let mut succ: HashMap<usize, BTreeSet<usize>> = HashMap::new();
    let mut indeg: HashMap<usize, usize> = HashMap::new();
    let mut first: HashMap<usize, usize> = HashMap::new();
    for (i, node) in nodes.iter().enumerate() {
        if !node.is_compute() {
            continue;
        }
        let g = group_of[i];
        first.entry(g).or_insert(i);
        indeg.entry(g).or_insert(0);
        work::add_len(work::Stage::Fuse, 1 + node.operands.len());
        for o in &node.operands {
            if nodes[o.root].is_compute() {
                let h = group_of[o.root];
                if h != g && succ.entry(h).or_default().insert(g) {
                    *indeg.entry(g).or_insert(0) += 1;
                }
            }
        }
    }
    let mut ready: BinaryHeap<Reverse<(usize, usize)>> = indeg
        .iter()
        .filter(|(_, d)| **d == 0)
        .map(|(g, _)| Reverse((first[g], *g)))
        .collect();
    let mut out = Vec::with_capacity(indeg.len());
    while let Some(Reverse((_, g))) = ready.pop() {
        out.push(g);
        for &h in succ.get(&g).into_iter().flatten() {
            let d = indeg.get_mut(&h).expect("every group has an in-degree");
            *d -= 1;
            if *d == 0 {
                ready.push(Reverse((first[&h], h)));
            }
        }
    }
    debug_assert_eq!(out.len(), indeg.len(), "the group graph is acyclic");
    out
}

struct Emitter<'a> {
    graph: &'a Graph,
    nodes: &'a [FNode],
    program: Program,
    buffer_of: HashMap<usize, BufferId>,
}

/// How a group's space maps onto kernel accesses.
struct Frame {
    space: Space,
    /// Row kernels: full-space axis order (kept axes, then reduced axes).
    perm: Vec<usize>,
}

impl Frame {
    /// The access over the kernel's space of an operand read at `level`.
    fn strides(&self, o: &Operand, level: Level) -> Vec<i64> {
        match (&self.space, level) {
            (Space::Row(full, _), Level::Full) => {
                debug_assert_eq!(&o.dims, full);
                self.perm.iter().map(|&k| o.layout.strides[k]).collect()
            }
            (Space::Row(full, axes), Level::Row) => {
                let mut s: Vec<i64> = if o.dims.len() == full.len() {
                    (0..full.len())
                        .filter(|k| !axes.contains(k))
                        .map(|k| o.layout.strides[k])
                        .collect()
                } else {
                    o.layout.strides.clone()
                };
                s.extend(std::iter::repeat_n(0, axes.len()));
                s
            }
            // A matmul epilogue over a reshape of the product reads in the product's
            // shape (grouping checked that every layout reshapes).
            (Space::MatMul(out), _) if o.dims != *out => o
                .layout
                .reshape(&o.dims, out)
                .map(|l| l.strides)
                .unwrap_or_else(|| o.layout.strides.clone()),
            _ => o.layout.strides.clone(),
        }
    }
}

impl Emitter<'_> {
    /// The buffer holding node `i`'s value (created on first use).
    fn buffer(&mut self, i: usize) -> BufferId {
        if let Some(&b) = self.buffer_of.get(&i) {
            return b;
        }
        let node = &self.nodes[i];
        let kind = match (&node.kind, node.ir.map(|id| &self.graph.node(id).op)) {
            (_, Some(Op::Input { name, .. })) => BufferKind::Input { name: name.clone() },
            (_, Some(Op::Parameter { name, .. })) => BufferKind::Weight { name: name.clone() },
            (_, Some(Op::Constant { value })) => BufferKind::Constant { value: value.clone() },
            _ => BufferKind::Temp,
        };
        let b = self.program.add_buffer(node.ty.clone(), kind, node.name.clone());
        self.buffer_of.insert(i, b);
        b
    }

    fn kernel(&mut self, groups: &Groups, group_of: &[usize], stored: &[bool], g: usize) -> Kernel {
        // Members in topological order (groups keep them unsorted while merging).
        let mut members = groups.members[g].clone();
        members.sort_unstable();
        let members = &members;
        let space = groups.space[g].clone();
        let perm: Vec<usize> = match &space {
            Space::Row(full, axes) => (0..full.len())
                .filter(|k| !axes.contains(k))
                .chain(axes.iter().copied())
                .collect(),
            _ => Vec::new(),
        };
        let frame = Frame { space, perm };
        let idx = self.program.kernels.len();
        let mut canon: Vec<u32> = members.iter().filter_map(|&m| self.nodes[m].canon).collect();
        canon.sort_unstable();

        if let [single] = members.as_slice() {
            if let FKind::Single(op) = &self.nodes[*single].kind {
                let inputs = self.nodes[*single]
                    .operands
                    .iter()
                    .map(|o| {
                        let ty = TensorType::new(self.nodes[o.root].ty.dtype, o.dims.clone());
                        (self.access(o, o.layout.strides.clone()), ty)
                    })
                    .collect();
                let output = self.buffer(*single);
                return Kernel {
                    name: format!("k{idx}_{}", op.name()),
                    kind: KernelKind::Op(OpKernel {
                        op: op.clone(),
                        inputs,
                        output,
                        siblings: Vec::new(),
                    }),
                    nodes: canon,
                };
            }
        }

        let mut body = Body::default();
        let mut inputs = Loads::default();
        let mut expr_of: HashMap<usize, ExprId> = HashMap::new();
        let mut stages = Vec::new();
        let mut stage_ops = Vec::new();
        let mut mm = None;
        for &m in members {
            let node = &self.nodes[m];
            // A reduction reads its operand per element; its own value is per row.
            let level = match node.kind {
                FKind::Reduce { .. } => Level::Full,
                _ => groups.level[m],
            };
            let mut arg = |this: &mut Self, body: &mut Body, o: &Operand| -> ExprId {
                if group_of[o.root] == g {
                    return expr_of[&o.root];
                }
                if let FKind::Scalar(t) = &this.nodes[o.root].kind {
                    return body.push(Expr::Const(t.clone()), t.dtype());
                }
                let acc = this.access(o, frame.strides(o, level));
                body.push(Expr::Load(InputId(inputs.intern(acc))), this.nodes[o.root].ty.dtype)
            };
            let dt = node.ty.dtype;
            let e = match &node.kind {
                FKind::Ew(op) => {
                    let a: Vec<ExprId> = node.operands.iter().map(|o| arg(self, &mut body, o)).collect();
                    let ex = match op {
                        Op::Unary(u) => Expr::Unary(*u, a[0]),
                        Op::Binary(b) => Expr::Binary(*b, a[0], a[1]),
                        Op::Select => Expr::Select(a[0], a[1], a[2]),
                        _ => Expr::Cast(a[0]),
                    };
                    body.push(ex, dt)
                }
                FKind::Copy => arg(self, &mut body, &node.operands[0]),
                FKind::Gather { axis } => {
                    let (data, idx) = (&node.operands[0], &node.operands[1]);
                    let (axis, r) = (*axis, idx.dims.len());
                    let tail = data.dims.len() - axis - 1;
                    let over_out = |root: usize, offset: i64, strides: Vec<i64>| Operand {
                        root,
                        layout: Layout { offset, strides },
                        dims: node.dims().to_vec(),
                        via: None,
                    };
                    let mut ds = data.layout.strides[..axis].to_vec();
                    ds.extend(std::iter::repeat_n(0, r));
                    ds.extend_from_slice(&data.layout.strides[axis + 1..]);
                    let mut is = vec![0i64; axis];
                    is.extend_from_slice(&idx.layout.strides);
                    is.extend(std::iter::repeat_n(0, tail));
                    let index = arg(self, &mut body, &over_out(idx.root, idx.layout.offset, is));
                    let acc = self.access(
                        &over_out(data.root, data.layout.offset, ds.clone()),
                        frame.strides(&over_out(data.root, data.layout.offset, ds), level),
                    );
                    body.push(
                        Expr::Gather {
                            input: InputId(inputs.intern(acc)),
                            index,
                            stride: data.layout.strides[axis],
                            extent: data.dims[axis] as u64,
                        },
                        dt,
                    )
                }
                FKind::Iota { axis } => {
                    let ax = frame.perm.iter().position(|k| k == axis).unwrap_or(*axis);
                    body.push(Expr::Index(ax as u32), dt)
                }
                FKind::Reduce { op, .. } => {
                    let value = arg(self, &mut body, &node.operands[0]);
                    stages.push(Stage { op: *op, value });
                    stage_ops.push(op.name().trim_start_matches("reduce_"));
                    body.push(Expr::Stage(StageId((stages.len() - 1) as u32)), dt)
                }
                FKind::MatMul | FKind::Conv { .. } => {
                    mm = Some(m);
                    body.push(Expr::Acc, dt)
                }
                FKind::Source | FKind::Scalar(_) | FKind::View | FKind::QuantWeight { .. } | FKind::Single(_) => {
                    unreachable!("only compute nodes are grouped")
                }
            };
            expr_of.insert(m, e);
        }

        let inputs = inputs.list;
        let (stores, row_stores) = self.stores(groups, stored, members, &frame, &expr_of);

        let parts = Parts {
            inputs,
            body,
            stages,
            stage_ops,
            stores,
            row_stores,
            mm,
        };
        let (name, kind) = self.kind(&frame, parts);
        Kernel {
            name: format!("k{idx}_{name}"),
            kind,
            nodes: canon,
        }
    }

    /// The stores of a group's members read outside it: per row (row kernels' row
    /// values) and per element.
    fn stores(
        &mut self,
        groups: &Groups,
        stored: &[bool],
        members: &[usize],
        frame: &Frame,
        expr_of: &HashMap<usize, ExprId>,
    ) -> (Vec<Store>, Vec<Store>) {
        let mut stores = Vec::new();
        let mut row_stores = Vec::new();
        for &m in members {
            if !stored[m] {
                continue;
            }
            let buf = self.buffer(m);
            let value = expr_of[&m];
            match (&frame.space, groups.level[m]) {
                (Space::Row(full, axes), Level::Row) => {
                    let (outer, _) = row_shapes(full, axes);
                    row_stores.push(Store {
                        value,
                        access: Access::contiguous(buf, &outer),
                    });
                }
                (Space::Row(full, _), Level::Full) => {
                    let cs = contiguous_strides(full);
                    stores.push(Store {
                        value,
                        access: Access {
                            buffer: buf,
                            offset: 0,
                            strides: frame.perm.iter().map(|&k| cs[k]).collect(),
                        },
                    });
                }
                (Space::MatMul(out), _) => stores.push(Store {
                    value,
                    access: Access::contiguous(buf, out),
                }),
                _ => stores.push(Store {
                    value,
                    access: Access::contiguous(buf, self.nodes[m].dims()),
                }),
            }
        }
        (stores, row_stores)
    }

    /// The kernel's name suffix and kind for its iteration space.
    fn kind(&mut self, frame: &Frame, parts: Parts) -> (String, KernelKind) {
        let Parts {
            inputs,
            body,
            stages,
            stage_ops,
            stores,
            row_stores,
            mm,
        } = parts;
        match &frame.space {
            Space::Elementwise(space) => (
                "ew".to_string(),
                KernelKind::Elementwise(ElementwiseKernel {
                    space: space.clone(),
                    inputs,
                    body,
                    stores,
                }),
            ),
            Space::Row(full, axes) => {
                let (outer, _) = row_shapes(full, axes);
                let inner = axes.iter().map(|&k| full[k]).collect();
                (
                    format!("row_{}", stage_ops.join("_")),
                    KernelKind::Row(RowKernel {
                        outer,
                        inner,
                        inputs,
                        body,
                        stages,
                        row_stores,
                        stores,
                    }),
                )
            }
            Space::MatMul(out) => {
                let m = mm.expect("a matmul group holds its matmul");
                let node = &self.nodes[m];
                let batch = out[..out.len() - 2].to_vec();
                let (a_op, b_op) = (&node.operands[0], &node.operands[1]);
                let a_dims = &a_op.dims;
                let (mm_m, kk) = (a_dims[a_dims.len() - 2], a_dims[a_dims.len() - 1]);
                let nn = out[out.len() - 1];
                let a = self.access(a_op, matmul_operand_strides(&a_op.layout, &a_op.dims, &batch));
                let b_strides = matmul_operand_strides(&b_op.layout, &b_op.dims, &batch);
                let (b, quant) = match &self.nodes[b_op.root].kind {
                    // The packed data read through the dequantized value's layout.
                    FKind::QuantWeight { bits, group } => {
                        let qnode = &self.nodes[b_op.root];
                        let (data, scales) = (qnode.operands[0].root, qnode.operands[1].root);
                        let quant = QuantB {
                            bits: *bits,
                            group: *group,
                            scales: self.buffer(scales),
                        };
                        let b = Access {
                            buffer: self.buffer(data),
                            offset: b_op.layout.offset,
                            strides: b_strides,
                        };
                        (b, Some(quant))
                    }
                    _ => (self.access(b_op, b_strides), None),
                };
                let (batch2, mm_m, a, inputs, stores) =
                    fold_batch_into_m(batch.clone(), mm_m, kk, nn, a, &b, inputs, stores);
                let b = Access {
                    strides: b.strides[batch.len() - batch2.len()..].to_vec(),
                    ..b
                };
                let batch = batch2;
                (
                    "mm".to_string(),
                    KernelKind::MatMul(MatMulKernel {
                        batch,
                        m: mm_m,
                        n: nn,
                        k: kk,
                        a,
                        b,
                        inputs,
                        body,
                        stores,
                        quant,
                        bias_grad: None,
                    }),
                )
            }
            Space::Conv(_) => {
                let m = mm.expect("a convolution group holds its convolution");
                let node = &self.nodes[m];
                let FKind::Conv { window, groups } = &node.kind else {
                    unreachable!("a convolution group's accumulator is a convolution")
                };
                let (xo, wo) = (&node.operands[0], &node.operands[1]);
                (
                    "conv".to_string(),
                    KernelKind::Conv(ConvKernel {
                        window: window.clone(),
                        groups: *groups,
                        x: self.access(xo, xo.layout.strides.clone()),
                        x_dims: xo.dims.clone(),
                        w: self.access(wo, wo.layout.strides.clone()),
                        w_dims: wo.dims.clone(),
                        inputs,
                        body,
                        stores,
                    }),
                )
            }
            Space::Single => unreachable!("single-op groups are handled above"),
        }
    }

    fn access(&mut self, o: &Operand, strides: Vec<i64>) -> Access {
        Access {
            buffer: self.buffer(o.root),
            offset: o.layout.offset,
            strides,
        }
    }
}

/// What a group's members compiled to, for [`Emitter::kind`].
struct Parts {
    inputs: Vec<Access>,
    body: Body,
    stages: Vec<Stage>,
    stage_ops: Vec<&'static str>,
    stores: Vec<Store>,
    row_stores: Vec<Store>,
    mm: Option<usize>,
}

/// A kernel's input accesses, each listed once (a hash index: a kernel may read
/// 100k distinct inputs).
#[derive(Default)]
struct Loads {
    list: Vec<Access>,
    index: HashMap<Access, u32>,
}

impl Loads {
    /// The position of `acc` in the list, added if new.
    fn intern(&mut self, acc: Access) -> u32 {
        work::add(work::Stage::Fuse, 1);
        if let Some(&k) = self.index.get(&acc) {
            return k;
        }
        let k = self.list.len() as u32;
        self.list.push(acc.clone());
        self.index.insert(acc, k);
        k
    }
}

/// A matmul whose right operand is the same matrix for every batch (a linear layer on a
/// batch of sequences) is one GEMM of `batch * m` rows, when the left operand, the
/// epilogue's inputs and the stores all view the batch dims and `m` as one dim.
#[allow(clippy::too_many_arguments)]
fn fold_batch_into_m(
    batch: Vec<usize>,
    m: usize,
    k: usize,
    n: usize,
    a: Access,
    b: &Access,
    inputs: Vec<Access>,
    stores: Vec<Store>,
) -> (Vec<usize>, usize, Access, Vec<Access>, Vec<Store>) {
    let nb = batch.len();
    if nb == 0 || b.strides[..nb].iter().zip(&batch).any(|(&s, &d)| s != 0 && d != 1) {
        return (batch, m, a, inputs, stores);
    }
    let rows: usize = batch.iter().product::<usize>() * m;
    let fold = |acc: &Access, last: usize| -> Option<Access> {
        let mut dims = batch.clone();
        dims.extend([m, last]);
        let l = Layout {
            offset: acc.offset,
            strides: acc.strides.clone(),
        }
        .reshape(&dims, &[rows, last])?;
        Some(Access {
            buffer: acc.buffer,
            offset: l.offset,
            strides: l.strides,
        })
    };
    let folded = (|| {
        let a2 = fold(&a, k)?;
        let in2 = inputs.iter().map(|x| fold(x, n)).collect::<Option<Vec<_>>>()?;
        let st2 = stores
            .iter()
            .map(|s| {
                Some(Store {
                    value: s.value,
                    access: fold(&s.access, n)?,
                })
            })
            .collect::<Option<Vec<_>>>()?;
        Some((a2, in2, st2))
    })();
    match folded {
        Some((a2, in2, st2)) => (Vec::new(), rows, a2, in2, st2),
        None => (batch, m, a, inputs, stores),
    }
}
