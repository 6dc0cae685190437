//! The CPU executor of kernel-IR programs against the reference interpreter: hand-built
//! programs (what fusion would produce) must compute exactly what the interpreter
//! computes for the equivalent unfused graph.

use std::collections::{BTreeMap, HashMap};

use graphc_compiler::kernel::{
    Access, Body, BufferId, BufferKind, ElementwiseKernel, Expr, ExprId, InputId, Kernel, KernelKind, MatMulKernel,
    OpKernel, Program, RowKernel, Stage, StageId, Store,
};
use graphc_ir::{
    interpret, nn, BinaryOp, DType, Graph, GraphBuilder, Op, PadMode, ReduceOp, Tensor, TensorType, UnaryOp,
};
use graphc_runtime::kernels::{constant_slots, run_kernel, run_program};

// ---- helpers ----------------------------------------------------------------------

fn input(p: &mut Program, name: &str, dtype: DType, dims: &[usize]) -> BufferId {
    let id = p.add_buffer(
        TensorType::new(dtype, dims.to_vec()),
        BufferKind::Input { name: name.into() },
        None,
    );
    p.inputs.push(id);
    id
}

fn weight(p: &mut Program, name: &str, dtype: DType, dims: &[usize]) -> BufferId {
    p.add_buffer(
        TensorType::new(dtype, dims.to_vec()),
        BufferKind::Weight { name: name.into() },
        None,
    )
}

fn temp(p: &mut Program, dtype: DType, dims: &[usize]) -> BufferId {
    p.add_buffer(TensorType::new(dtype, dims.to_vec()), BufferKind::Temp, None)
}

fn acc(buffer: BufferId, offset: i64, strides: &[i64]) -> Access {
    Access {
        buffer,
        offset,
        strides: strides.to_vec(),
    }
}

fn contig(buffer: BufferId, dims: &[usize]) -> Access {
    Access::contiguous(buffer, dims)
}

fn kernel(name: &str, kind: KernelKind) -> Kernel {
    Kernel {
        name: name.into(),
        kind,
        nodes: vec![],
    }
}

fn store(value: ExprId, access: Access) -> Store {
    Store { value, access }
}

fn inputs_of(pairs: Vec<(&str, Tensor)>) -> HashMap<String, Tensor> {
    pairs.into_iter().map(|(n, t)| (n.to_string(), t)).collect()
}

/// Run the program and the graph on the same inputs; outputs must match bitwise.
fn check_bitwise(p: &Program, g: &Graph, inputs: &HashMap<String, Tensor>) {
    let got = run_program(p, g.weights(), inputs).unwrap();
    let want = interpret(g, inputs).unwrap();
    assert_eq!(got.len(), want.len());
    for ((gn, gt), (wn, wt)) in got.iter().zip(&want) {
        assert_eq!(gn, wn);
        assert_eq!(gt.ty(), wt.ty(), "output {gn}");
        assert!(gt == wt, "output {gn} differs:\n got  {gt}\n want {wt}");
    }
}

fn rand(dtype: DType, dims: &[usize], seed: u64) -> Tensor {
    Tensor::random(&TensorType::new(dtype, dims.to_vec()), seed)
}

// ---- elementwise ------------------------------------------------------------------

/// `select(j < i, (x + y) * z^T - w[:, 11::-2], 0)` over [4, 6]: a broadcast row, a
/// transposed and a reversed, strided slice; three outputs (the f32 value, its f16 cast,
/// and its transpose through a transposed store).
#[test]
fn elementwise_broadcast_transpose_slice_multi_output() {
    let (m, n) = (4usize, 6usize);
    let b = GraphBuilder::new();
    let x = b.input("x", DType::F32, [m, n]);
    let y = b.input("y", DType::F32, [n]);
    let z = b.input("z", DType::F32, [n, m]);
    let w = b.input("w", DType::F32, [m, 2 * n]);
    let v = (x + y) * z.t() - w.slice(1, 11, -13, -2);
    let i = b.iota(DType::I64, [m, n], 0);
    let j = b.iota(DType::I64, [m, n], 1);
    let zero = b.scalar(DType::F32, 0.0);
    let r = b.select(j.lt(i), v, zero);
    b.output("r", r);
    b.output("r16", r.cast(DType::F16));
    b.output("rt", r.t());
    let g = b.finish().unwrap();

    let mut p = Program::default();
    let bx = input(&mut p, "x", DType::F32, &[m, n]);
    let by = input(&mut p, "y", DType::F32, &[n]);
    let bz = input(&mut p, "z", DType::F32, &[n, m]);
    let bw = input(&mut p, "w", DType::F32, &[m, 2 * n]);
    let out = temp(&mut p, DType::F32, &[m, n]);
    let out16 = temp(&mut p, DType::F16, &[m, n]);
    let out_t = temp(&mut p, DType::F32, &[n, m]);
    let mut body = Body::default();
    let l0 = body.push(Expr::Load(InputId(0)), DType::F32);
    let l1 = body.push(Expr::Load(InputId(1)), DType::F32);
    let l2 = body.push(Expr::Load(InputId(2)), DType::F32);
    let l3 = body.push(Expr::Load(InputId(3)), DType::F32);
    let s = body.push(Expr::Binary(BinaryOp::Add, l0, l1), DType::F32);
    let s = body.push(Expr::Binary(BinaryOp::Mul, s, l2), DType::F32);
    let v = body.push(Expr::Binary(BinaryOp::Sub, s, l3), DType::F32);
    let i = body.push(Expr::Index(0), DType::I64);
    let j = body.push(Expr::Index(1), DType::I64);
    let c = body.push(Expr::Binary(BinaryOp::Lt, j, i), DType::Bool);
    let zero = body.push(Expr::Const(Tensor::scalar(DType::F32, 0.0)), DType::F32);
    let r = body.push(Expr::Select(c, v, zero), DType::F32);
    let r16 = body.push(Expr::Cast(r), DType::F16);
    p.kernels.push(kernel(
        "fused",
        KernelKind::Elementwise(ElementwiseKernel {
            space: vec![m, n],
            inputs: vec![
                contig(bx, &[m, n]),
                acc(by, 0, &[0, 1]),
                acc(bz, 0, &[1, m as i64]),
                acc(bw, 11, &[2 * n as i64, -2]),
            ],
            body,
            stores: vec![
                store(r, contig(out, &[m, n])),
                store(r16, contig(out16, &[m, n])),
                store(r, acc(out_t, 0, &[1, m as i64])),
            ],
        }),
    ));
    p.outputs = vec![("r".into(), out), ("r16".into(), out16), ("rt".into(), out_t)];

    let ins = inputs_of(vec![
        ("x", rand(DType::F32, &[m, n], 1)),
        ("y", rand(DType::F32, &[n], 2)),
        ("z", rand(DType::F32, &[n, m], 3)),
        ("w", rand(DType::F32, &[m, 2 * n], 4)),
    ]);
    check_bitwise(&p, &g, &ins);
}

/// f16 and bf16 bodies: `exp(x) * y + cast(z)` in f16 and `silu(a) - a` in bf16, each
/// op rounded as the interpreter rounds it.
#[test]
fn elementwise_f16_bf16_bodies() {
    let dims = [3usize, 37];
    let b = GraphBuilder::new();
    let x = b.input("x", DType::F16, dims);
    let y = b.input("y", DType::F16, dims);
    let z = b.input("z", DType::F32, dims);
    let a = b.input("a", DType::BF16, dims);
    b.output("h", x.exp() * y + z.cast(DType::F16));
    b.output("bf", a.silu() - a);
    let g = b.finish().unwrap();

    let mut p = Program::default();
    let bx = input(&mut p, "x", DType::F16, &dims);
    let by = input(&mut p, "y", DType::F16, &dims);
    let bz = input(&mut p, "z", DType::F32, &dims);
    let ba = input(&mut p, "a", DType::BF16, &dims);
    let oh = temp(&mut p, DType::F16, &dims);
    let ob = temp(&mut p, DType::BF16, &dims);
    let mut body = Body::default();
    let x = body.push(Expr::Load(InputId(0)), DType::F16);
    let y = body.push(Expr::Load(InputId(1)), DType::F16);
    let z = body.push(Expr::Load(InputId(2)), DType::F32);
    let a = body.push(Expr::Load(InputId(3)), DType::BF16);
    let e = body.push(Expr::Unary(UnaryOp::Exp, x), DType::F16);
    let e = body.push(Expr::Binary(BinaryOp::Mul, e, y), DType::F16);
    let zc = body.push(Expr::Cast(z), DType::F16);
    let h = body.push(Expr::Binary(BinaryOp::Add, e, zc), DType::F16);
    let s = body.push(Expr::Unary(UnaryOp::Silu, a), DType::BF16);
    let bf = body.push(Expr::Binary(BinaryOp::Sub, s, a), DType::BF16);
    p.kernels.push(kernel(
        "half",
        KernelKind::Elementwise(ElementwiseKernel {
            space: dims.to_vec(),
            inputs: [bx, by, bz, ba].iter().map(|&id| contig(id, &dims)).collect(),
            body,
            stores: vec![store(h, contig(oh, &dims)), store(bf, contig(ob, &dims))],
        }),
    ));
    p.outputs = vec![("h".into(), oh), ("bf".into(), ob)];
    let ins = inputs_of(vec![
        ("x", rand(DType::F16, &dims, 5)),
        ("y", rand(DType::F16, &dims, 6)),
        ("z", rand(DType::F32, &dims, 7)),
        ("a", rand(DType::BF16, &dims, 8)),
    ]);
    check_bitwise(&p, &g, &ins);
}

// ---- row kernels ------------------------------------------------------------------

/// Softmax as one row kernel: stage 0 = max(x), stage 1 = sum(exp(x - max)), store
/// exp(x - max) / sum. `x_access` and `out_access` read and write `x` over `outer ++ inner`.
fn softmax_program(
    dtype: DType,
    x_dims: &[usize],
    outer: &[usize],
    inner: &[usize],
    x_access: (i64, Vec<i64>),
    out_access: (i64, Vec<i64>),
) -> Program {
    let mut p = Program::default();
    let bx = input(&mut p, "x", dtype, x_dims);
    let out = temp(&mut p, dtype, x_dims);
    let mut body = Body::default();
    let x = body.push(Expr::Load(InputId(0)), dtype);
    let mx = body.push(Expr::Stage(StageId(0)), dtype);
    let d = body.push(Expr::Binary(BinaryOp::Sub, x, mx), dtype);
    let e = body.push(Expr::Unary(UnaryOp::Exp, d), dtype);
    let s = body.push(Expr::Stage(StageId(1)), dtype);
    let y = body.push(Expr::Binary(BinaryOp::Div, e, s), dtype);
    p.kernels.push(kernel(
        "softmax",
        KernelKind::Row(RowKernel {
            outer: outer.to_vec(),
            inner: inner.to_vec(),
            inputs: vec![acc(bx, x_access.0, &x_access.1)],
            body,
            stages: vec![
                Stage {
                    op: ReduceOp::Max,
                    value: x,
                },
                Stage {
                    op: ReduceOp::Sum,
                    value: e,
                },
            ],
            row_stores: vec![],
            stores: vec![store(y, acc(out, out_access.0, &out_access.1))],
        }),
    ));
    p.outputs = vec![("y".into(), out)];
    p
}

fn softmax_graph(dtype: DType, dims: &[usize], axis: i64) -> Graph {
    let b = GraphBuilder::new();
    let x = b.input("x", dtype, dims.to_vec());
    b.output("y", nn::softmax(x, axis));
    b.finish().unwrap()
}

#[test]
fn row_softmax_last_axis() {
    let dims = [8usize, 33];
    let p = softmax_program(DType::F32, &dims, &[8], &[33], (0, vec![33, 1]), (0, vec![33, 1]));
    let g = softmax_graph(DType::F32, &dims, -1);
    check_bitwise(&p, &g, &inputs_of(vec![("x", rand(DType::F32, &dims, 11))]));
}

/// Softmax over axis 1 of [3, 5, 7]: outer [3, 7], inner [5]; the input and the store
/// are strided (the row is not innermost).
#[test]
fn row_softmax_middle_axis() {
    let dims = [3usize, 5, 7];
    let strides = vec![35, 1, 7];
    let p = softmax_program(
        DType::F32,
        &dims,
        &[3, 7],
        &[5],
        (0, strides.clone()),
        (0, strides.clone()),
    );
    let g = softmax_graph(DType::F32, &dims, 1);
    check_bitwise(&p, &g, &inputs_of(vec![("x", rand(DType::F32, &dims, 12))]));
}

#[test]
fn row_softmax_bf16_and_f16() {
    for dtype in [DType::BF16, DType::F16] {
        let dims = [4usize, 50];
        let p = softmax_program(dtype, &dims, &[4], &[50], (0, vec![50, 1]), (0, vec![50, 1]));
        let g = softmax_graph(dtype, &dims, -1);
        check_bitwise(
            &p,
            &g,
            &inputs_of(vec![(
                "x",
                Tensor::randn(&TensorType::new(dtype, dims.to_vec()), 3.0, 13),
            )]),
        );
    }
}

/// Layer norm as one row kernel, also storing the mean and the reciprocal standard
/// deviation of each row through row stores; gamma and beta are weights read with a
/// zero stride over the rows.
#[test]
fn row_layer_norm_with_row_stores() {
    let (rows, d) = (6usize, 32usize);
    let eps = 1e-5;
    let gamma = Tensor::randn(&TensorType::new(DType::F32, [d]), 1.0, 21);
    let beta = Tensor::randn(&TensorType::new(DType::F32, [d]), 1.0, 22);

    let b = GraphBuilder::new();
    let x = b.input("x", DType::F32, [rows, d]);
    let g_ = b.param("gamma", gamma.clone());
    let b_ = b.param("beta", beta.clone());
    let mean = x.mean(&[-1], true);
    let centered = x - mean;
    let var = (centered * centered).mean(&[-1], true);
    let rstd = (var + eps).rsqrt();
    let y = centered * rstd * g_ + b_;
    b.output("y", y);
    b.output("mean", mean.reshape([rows]));
    b.output("rstd", rstd.reshape([rows]));
    let g = b.finish().unwrap();

    let mut p = Program::default();
    let bx = input(&mut p, "x", DType::F32, &[rows, d]);
    let bg = weight(&mut p, "gamma", DType::F32, &[d]);
    let bb = weight(&mut p, "beta", DType::F32, &[d]);
    let oy = temp(&mut p, DType::F32, &[rows, d]);
    let om = temp(&mut p, DType::F32, &[rows]);
    let or = temp(&mut p, DType::F32, &[rows]);
    let mut body = Body::default();
    let x = body.push(Expr::Load(InputId(0)), DType::F32);
    let mean = body.push(Expr::Stage(StageId(0)), DType::F32);
    let c = body.push(Expr::Binary(BinaryOp::Sub, x, mean), DType::F32);
    let sq = body.push(Expr::Binary(BinaryOp::Mul, c, c), DType::F32);
    let var = body.push(Expr::Stage(StageId(1)), DType::F32);
    let e = body.push(Expr::Const(Tensor::scalar(DType::F32, eps)), DType::F32);
    let ve = body.push(Expr::Binary(BinaryOp::Add, var, e), DType::F32);
    let rstd = body.push(Expr::Unary(UnaryOp::Rsqrt, ve), DType::F32);
    let n = body.push(Expr::Binary(BinaryOp::Mul, c, rstd), DType::F32);
    let gl = body.push(Expr::Load(InputId(1)), DType::F32);
    let n = body.push(Expr::Binary(BinaryOp::Mul, n, gl), DType::F32);
    let bl = body.push(Expr::Load(InputId(2)), DType::F32);
    let y = body.push(Expr::Binary(BinaryOp::Add, n, bl), DType::F32);
    p.kernels.push(kernel(
        "layer_norm",
        KernelKind::Row(RowKernel {
            outer: vec![rows],
            inner: vec![d],
            inputs: vec![contig(bx, &[rows, d]), acc(bg, 0, &[0, 1]), acc(bb, 0, &[0, 1])],
            body,
            stages: vec![
                Stage {
                    op: ReduceOp::Mean,
                    value: x,
                },
                Stage {
                    op: ReduceOp::Mean,
                    value: sq,
                },
            ],
            row_stores: vec![store(mean, contig(om, &[rows])), store(rstd, contig(or, &[rows]))],
            stores: vec![store(y, contig(oy, &[rows, d]))],
        }),
    ));
    p.outputs = vec![("y".into(), oy), ("mean".into(), om), ("rstd".into(), or)];
    check_bitwise(&p, &g, &inputs_of(vec![("x", rand(DType::F32, &[rows, d], 23))]));
}

// ---- matmul -----------------------------------------------------------------------

/// `gelu(x @ w^T + bias) + residual` with x [2, 3, 5, 8] and a weight w [16, 8] shared
/// by every batch: B is read transposed (strides swapped) and broadcast (stride 0).
#[test]
fn matmul_transposed_broadcast_b_with_epilogue() {
    let (b0, b1, m, k, n) = (2usize, 3usize, 5usize, 8usize, 16usize);
    let w = Tensor::randn(&TensorType::new(DType::F32, [n, k]), 0.5, 31);
    let bias = Tensor::randn(&TensorType::new(DType::F32, [n]), 0.5, 32);

    let gb = GraphBuilder::new();
    let x = gb.input("x", DType::F32, [b0, b1, m, k]);
    let r = gb.input("r", DType::F32, [b0, b1, m, n]);
    let wv = gb.param("w", w.clone());
    let bv = gb.param("bias", bias.clone());
    let y = (x.matmul(wv.t()) + bv).gelu() + r;
    gb.output("y", y);
    let g = gb.finish().unwrap();

    let mut p = Program::default();
    let bx = input(&mut p, "x", DType::F32, &[b0, b1, m, k]);
    let br = input(&mut p, "r", DType::F32, &[b0, b1, m, n]);
    let bw = weight(&mut p, "w", DType::F32, &[n, k]);
    let bbias = weight(&mut p, "bias", DType::F32, &[n]);
    let out = temp(&mut p, DType::F32, &[b0, b1, m, n]);
    let mut body = Body::default();
    let a = body.push(Expr::Acc, DType::F32);
    let bl = body.push(Expr::Load(InputId(0)), DType::F32);
    let s = body.push(Expr::Binary(BinaryOp::Add, a, bl), DType::F32);
    let ge = body.push(Expr::Unary(UnaryOp::Gelu, s), DType::F32);
    let rl = body.push(Expr::Load(InputId(1)), DType::F32);
    let y = body.push(Expr::Binary(BinaryOp::Add, ge, rl), DType::F32);
    p.kernels.push(kernel(
        "linear_gelu",
        KernelKind::MatMul(MatMulKernel {
            batch: vec![b0, b1],
            m,
            n,
            k,
            a: contig(bx, &[b0, b1, m, k]),
            b: acc(bw, 0, &[0, 0, 1, k as i64]),
            inputs: vec![acc(bbias, 0, &[0, 0, 0, 1]), contig(br, &[b0, b1, m, n])],
            body,
            stores: vec![store(y, contig(out, &[b0, b1, m, n]))],
            quant: None,
            bias_grad: None,
        }),
    ));
    p.outputs = vec![("y".into(), out)];
    check_bitwise(
        &p,
        &g,
        &inputs_of(vec![
            ("x", rand(DType::F32, &[b0, b1, m, k], 33)),
            ("r", rand(DType::F32, &[b0, b1, m, n], 34)),
        ]),
    );
}

/// A transposed A (`x^T @ y` with x [k, m]) in bf16, batch-broadcast over a batch both
/// operands share by stride 0 (the product is still per batch element).
#[test]
fn matmul_transposed_a_bf16_and_shared_batch() {
    let (bt, m, k, n) = (3usize, 4usize, 6usize, 5usize);
    let gb = GraphBuilder::new();
    let x = gb.input("x", DType::BF16, [k, m]);
    let y = gb.input("y", DType::BF16, [k, n]);
    let prod = x.t().matmul(y);
    gb.output("p", prod.broadcast_to(&[bt, m, n].into()));
    let g = gb.finish().unwrap();

    let mut p = Program::default();
    let bx = input(&mut p, "x", DType::BF16, &[k, m]);
    let by = input(&mut p, "y", DType::BF16, &[k, n]);
    let out = temp(&mut p, DType::BF16, &[bt, m, n]);
    let mut body = Body::default();
    let a = body.push(Expr::Acc, DType::BF16);
    p.kernels.push(kernel(
        "mm",
        KernelKind::MatMul(MatMulKernel {
            batch: vec![bt],
            m,
            n,
            k,
            a: acc(bx, 0, &[0, 1, m as i64]),
            b: acc(by, 0, &[0, n as i64, 1]),
            inputs: vec![],
            body,
            stores: vec![store(a, contig(out, &[bt, m, n]))],
            quant: None,
            bias_grad: None,
        }),
    ));
    p.outputs = vec![("p".into(), out)];
    check_bitwise(
        &p,
        &g,
        &inputs_of(vec![
            ("x", rand(DType::BF16, &[k, m], 35)),
            ("y", rand(DType::BF16, &[k, n], 36)),
        ]),
    );
}

// ---- op kernels and multi-kernel programs -----------------------------------------

/// `t = 2x` (elementwise), `c = concat(t, y^T)` (y read transposed), `q = pad(c)`,
/// `argmax(q, 1)` and `gather(q, idx, 0)`: five kernels through temps.
#[test]
fn op_kernels_concat_pad_gather_argmax() {
    let (r, c1, c2) = (4usize, 3usize, 5usize);
    let pads = vec![(1i64, 2i64), (2, 0)];
    let gb = GraphBuilder::new();
    let x = gb.input("x", DType::F32, [r, c1]);
    let y = gb.input("y", DType::F32, [c2, r]);
    let idx = gb.input("idx", DType::I64, [2, 3]);
    let t = x * 2.0;
    let c = gb.concat(&[t, y.t()], 1);
    let q = c.pad(&pads, PadMode::Reflect, 0.0);
    gb.output("am", q.argmax(1, false));
    gb.output("ga", q.gather(idx, 0));
    let g = gb.finish().unwrap();

    let mut p = Program::default();
    let bx = input(&mut p, "x", DType::F32, &[r, c1]);
    let by = input(&mut p, "y", DType::F32, &[c2, r]);
    let bi = input(&mut p, "idx", DType::I64, &[2, 3]);
    let two = p.add_buffer(
        TensorType::new(DType::F32, [1usize]),
        BufferKind::Constant {
            value: Tensor::from_f32([1usize], vec![2.0]).unwrap(),
        },
        Some("two".into()),
    );
    let bt = temp(&mut p, DType::F32, &[r, c1]);
    let bc = temp(&mut p, DType::F32, &[r, c1 + c2]);
    let qd = [r + 3, c1 + c2 + 2];
    let bq = temp(&mut p, DType::F32, &qd);
    let bam = temp(&mut p, DType::I64, &[qd[0]]);
    let bga = temp(&mut p, DType::F32, &[2, 3, qd[1]]);
    let mut body = Body::default();
    let l = body.push(Expr::Load(InputId(0)), DType::F32);
    let tw = body.push(Expr::Load(InputId(1)), DType::F32);
    let v = body.push(Expr::Binary(BinaryOp::Mul, l, tw), DType::F32);
    p.kernels.push(kernel(
        "scale",
        KernelKind::Elementwise(ElementwiseKernel {
            space: vec![r, c1],
            inputs: vec![contig(bx, &[r, c1]), acc(two, 0, &[0, 0])],
            body,
            stores: vec![store(v, contig(bt, &[r, c1]))],
        }),
    ));
    p.kernels.push(kernel(
        "concat",
        KernelKind::Op(OpKernel {
            op: Op::Concat { axis: 1 },
            inputs: vec![
                (contig(bt, &[r, c1]), TensorType::new(DType::F32, [r, c1])),
                (acc(by, 0, &[1, r as i64]), TensorType::new(DType::F32, [r, c2])),
            ],
            output: bc,
            siblings: Vec::new(),
        }),
    ));
    p.kernels.push(kernel(
        "pad",
        KernelKind::Op(OpKernel {
            op: Op::Pad {
                pads,
                mode: PadMode::Reflect,
                value: 0.0,
            },
            inputs: vec![(contig(bc, &[r, c1 + c2]), TensorType::new(DType::F32, [r, c1 + c2]))],
            output: bq,
            siblings: Vec::new(),
        }),
    ));
    p.kernels.push(kernel(
        "argmax",
        KernelKind::Op(OpKernel {
            op: Op::ArgReduce {
                op: graphc_ir::ArgReduceOp::ArgMax,
                axis: 1,
                keepdims: false,
            },
            inputs: vec![(contig(bq, &qd), TensorType::new(DType::F32, qd))],
            output: bam,
            siblings: Vec::new(),
        }),
    ));
    p.kernels.push(kernel(
        "gather",
        KernelKind::Op(OpKernel {
            op: Op::Gather { axis: 0 },
            inputs: vec![
                (contig(bq, &qd), TensorType::new(DType::F32, qd)),
                (contig(bi, &[2, 3]), TensorType::new(DType::I64, [2, 3])),
            ],
            output: bga,
            siblings: Vec::new(),
        }),
    ));
    p.outputs = vec![("am".into(), bam), ("ga".into(), bga)];
    let idx = Tensor::new([2usize, 3], graphc_ir::TensorData::I64(vec![0, -1, 3, 6, 2, -7])).unwrap();
    let ins = inputs_of(vec![
        ("x", rand(DType::F32, &[r, c1], 41)),
        ("y", rand(DType::F32, &[c2, r], 42)),
        ("idx", idx),
    ]);
    check_bitwise(&p, &g, &ins);

    // Kernel by kernel, with the slots the caller manages.
    let mut slots = constant_slots(&p);
    for (name, id) in [("x", bx), ("y", by), ("idx", bi)] {
        slots[id.index()] = Some(ins[name].clone());
    }
    for k in 0..p.kernels.len() {
        run_kernel(&p, k, &mut slots).unwrap();
    }
    let want = interpret(&g, &ins).unwrap();
    assert!(slots[bam.index()].as_ref() == Some(&want[0].1));
    assert!(slots[bga.index()].as_ref() == Some(&want[1].1));
}

// ---- size -------------------------------------------------------------------------

/// A 512 x 1024 softmax over the middle-axis layout and a transposed elementwise kernel:
/// large enough that a per-element slow path would show; checked against the interpreter.
#[test]
fn large_row_and_strided_elementwise() {
    let dims = [512usize, 1024];
    // Softmax over axis 0 (rows of the transpose): outer [1024], inner [512].
    let p = softmax_program(
        DType::F32,
        &dims,
        &[1024],
        &[512],
        (0, vec![1, 1024]),
        (0, vec![1, 1024]),
    );
    let g = softmax_graph(DType::F32, &dims, 0);
    let ins = inputs_of(vec![("x", rand(DType::F32, &dims, 51))]);
    let t = std::time::Instant::now();
    let got = run_program(&p, &BTreeMap::new(), &ins).unwrap();
    let took = t.elapsed();
    let want = interpret(&g, &ins).unwrap();
    assert!(got[0].1 == want[0].1);
    eprintln!("512x1024 softmax (strided) in {took:?}");

    // y = x^T + 1 over [1024, 512] with x read transposed.
    let mut p = Program::default();
    let bx = input(&mut p, "x", DType::F32, &dims);
    let out = temp(&mut p, DType::F32, &[1024, 512]);
    let mut body = Body::default();
    let l = body.push(Expr::Load(InputId(0)), DType::F32);
    let one = body.push(Expr::Const(Tensor::scalar(DType::F32, 1.0)), DType::F32);
    let y = body.push(Expr::Binary(BinaryOp::Add, l, one), DType::F32);
    p.kernels.push(kernel(
        "t_add",
        KernelKind::Elementwise(ElementwiseKernel {
            space: vec![1024, 512],
            inputs: vec![acc(bx, 0, &[1, 1024])],
            body,
            stores: vec![store(y, contig(out, &[1024, 512]))],
        }),
    ));
    p.outputs = vec![("y".into(), out)];
    let b = GraphBuilder::new();
    let x = b.input("x", DType::F32, dims);
    b.output("y", x.t() + 1.0);
    let g = b.finish().unwrap();
    check_bitwise(&p, &g, &ins);
}

/// A row kernel reducing over two inner dims, with an index expression: `w = x * j`
/// (j the index along the last axis), `y = w - sum(w)` per [3, 4] block, and the block
/// sums through a row store.
#[test]
fn row_two_inner_dims_with_index() {
    let dims = [2usize, 3, 4];
    let gb = GraphBuilder::new();
    let x = gb.input("x", DType::F32, dims);
    let j = gb.iota(DType::I64, dims, 2).cast(DType::F32);
    let w = x * j;
    let s = w.sum(&[1, 2], true);
    gb.output("y", w - s);
    gb.output("s", s.reshape([2usize]));
    let g = gb.finish().unwrap();

    let mut p = Program::default();
    let bx = input(&mut p, "x", DType::F32, &dims);
    let oy = temp(&mut p, DType::F32, &dims);
    let os = temp(&mut p, DType::F32, &[2]);
    let mut body = Body::default();
    let x = body.push(Expr::Load(InputId(0)), DType::F32);
    let j = body.push(Expr::Index(2), DType::I64);
    let jf = body.push(Expr::Cast(j), DType::F32);
    let w = body.push(Expr::Binary(BinaryOp::Mul, x, jf), DType::F32);
    let s = body.push(Expr::Stage(StageId(0)), DType::F32);
    let y = body.push(Expr::Binary(BinaryOp::Sub, w, s), DType::F32);
    p.kernels.push(kernel(
        "block_sum",
        KernelKind::Row(RowKernel {
            outer: vec![2],
            inner: vec![3, 4],
            inputs: vec![contig(bx, &dims)],
            body,
            stages: vec![Stage {
                op: ReduceOp::Sum,
                value: w,
            }],
            row_stores: vec![store(s, contig(os, &[2]))],
            stores: vec![store(y, contig(oy, &dims))],
        }),
    ));
    p.outputs = vec![("y".into(), oy), ("s".into(), os)];
    check_bitwise(&p, &g, &inputs_of(vec![("x", rand(DType::F32, &dims, 61))]));
}
