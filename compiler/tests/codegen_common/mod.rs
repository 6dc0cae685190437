//! Hand-built kernel programs shared by the codegen and NVRTC tests.
#![allow(dead_code)]

use graphc_compiler::kernel::{
    contiguous_strides, Access, Body, BufferId, BufferKind, ElementwiseKernel, Expr, ExprId, InputId, Kernel,
    KernelKind, MatMulKernel, OpKernel, Program, RowKernel, Stage, StageId, Store,
};
use graphc_ir::{ArgReduceOp, BinaryOp, DType, Op, PadMode, ReduceOp, Tensor, TensorType, UnaryOp};

mod multi;
pub use multi::multi_tensor;

/// A one-kernel program under construction.
pub struct P {
    pub p: Program,
}

impl P {
    pub fn new() -> P {
        P { p: Program::default() }
    }

    pub fn input(&mut self, name: &str, d: DType, dims: &[usize]) -> BufferId {
        let id = self.p.add_buffer(
            TensorType::new(d, dims.to_vec()),
            BufferKind::Input { name: name.to_string() },
            None,
        );
        self.p.inputs.push(id);
        id
    }

    pub fn temp(&mut self, d: DType, dims: &[usize]) -> BufferId {
        let id = self
            .p
            .add_buffer(TensorType::new(d, dims.to_vec()), BufferKind::Temp, None);
        self.p.outputs.push((format!("out{}", id.0), id));
        id
    }

    pub fn ty(&self, b: BufferId) -> TensorType {
        self.p.buffer(b).ty.clone()
    }

    pub fn kernel(mut self, name: &str, kind: KernelKind) -> Program {
        self.p.kernels.push(Kernel {
            name: name.to_string(),
            kind,
            nodes: vec![],
        });
        self.p
    }
}

pub fn acc(b: BufferId, offset: i64, strides: &[i64]) -> Access {
    Access {
        buffer: b,
        offset,
        strides: strides.to_vec(),
    }
}

pub fn contig(b: BufferId, dims: &[usize]) -> Access {
    Access::contiguous(b, dims)
}

pub fn store(value: ExprId, b: BufferId, dims: &[usize]) -> Store {
    Store {
        value,
        access: contig(b, dims),
    }
}

/// A small body builder.
pub struct B {
    pub b: Body,
}

impl B {
    pub fn new() -> B {
        B { b: Body::default() }
    }
    pub fn load(&mut self, n: u32, d: DType) -> ExprId {
        self.b.push(Expr::Load(InputId(n)), d)
    }
    pub fn c(&mut self, d: DType, v: f64) -> ExprId {
        self.b.push(Expr::Const(Tensor::scalar(d, v)), d)
    }
    pub fn un(&mut self, op: UnaryOp, a: ExprId) -> ExprId {
        let d = op.output_dtype(self.b.dtype(a));
        self.b.push(Expr::Unary(op, a), d)
    }
    pub fn bin(&mut self, op: BinaryOp, a: ExprId, c: ExprId) -> ExprId {
        let d = op.output_dtype(self.b.dtype(a));
        self.b.push(Expr::Binary(op, a, c), d)
    }
    pub fn cast(&mut self, a: ExprId, d: DType) -> ExprId {
        self.b.push(Expr::Cast(a), d)
    }
    pub fn select(&mut self, c: ExprId, a: ExprId, e: ExprId) -> ExprId {
        let d = self.b.dtype(a);
        self.b.push(Expr::Select(c, a, e), d)
    }
    pub fn index(&mut self, axis: u32, d: DType) -> ExprId {
        self.b.push(Expr::Index(axis), d)
    }
    pub fn stage(&mut self, n: u32, d: DType) -> ExprId {
        self.b.push(Expr::Stage(StageId(n)), d)
    }
    pub fn acc(&mut self, d: DType) -> ExprId {
        self.b.push(Expr::Acc, d)
    }
}

/// `relu(x * y + bias)` over `[64, 256]` f32, the bias broadcast along rows: the
/// vectorized fast path.
pub fn ew_contiguous_f32() -> Program {
    let dims = [64, 256];
    let mut p = P::new();
    let x = p.input("x", DType::F32, &dims);
    let y = p.input("y", DType::F32, &dims);
    let bias = p.input("bias", DType::F32, &[256]);
    let out = p.temp(DType::F32, &dims);
    let mut b = B::new();
    let lx = b.load(0, DType::F32);
    let ly = b.load(1, DType::F32);
    let lb = b.load(2, DType::F32);
    let m = b.bin(BinaryOp::Mul, lx, ly);
    let a = b.bin(BinaryOp::Add, m, lb);
    let r = b.un(UnaryOp::Relu, a);
    p.kernel(
        "fused_relu",
        KernelKind::Elementwise(ElementwiseKernel {
            space: dims.to_vec(),
            inputs: vec![contig(x, &dims), contig(y, &dims), acc(bias, 0, &[0, 1])],
            body: b.b,
            stores: vec![store(r, out, &dims)],
        }),
    )
}

/// A transposed read, a column broadcast and a strided slice: the general path.
pub fn ew_general() -> Program {
    let dims = [64, 96];
    let mut p = P::new();
    let xt = p.input("xt", DType::F32, &[96, 64]);
    let col = p.input("col", DType::F32, &[64, 1]);
    let wide = p.input("wide", DType::F32, &[64, 200]);
    let out = p.temp(DType::F32, &dims);
    let mut b = B::new();
    let a = b.load(0, DType::F32);
    let c = b.load(1, DType::F32);
    let s = b.load(2, DType::F32);
    let t = b.bin(BinaryOp::Sub, a, c);
    let u = b.bin(BinaryOp::Max, t, s);
    p.kernel(
        "transpose_sub",
        KernelKind::Elementwise(ElementwiseKernel {
            space: dims.to_vec(),
            inputs: vec![acc(xt, 0, &[1, 64]), acc(col, 0, &[1, 0]), acc(wide, 3, &[200, 2])],
            body: b.b,
            stores: vec![store(u, out, &dims)],
        }),
    )
}

/// f16 in, gelu (erf) in f32-computed f16, stored as f16 and as f32.
pub fn ew_f16() -> Program {
    let dims = [8, 1000];
    let mut p = P::new();
    let x = p.input("x", DType::F16, &dims);
    let o16 = p.temp(DType::F16, &dims);
    let o32 = p.temp(DType::F32, &dims);
    let mut b = B::new();
    let l = b.load(0, DType::F16);
    let g = b.un(UnaryOp::Gelu, l);
    let h = b.c(DType::F16, 0.5);
    let m = b.bin(BinaryOp::Mul, g, h);
    let f = b.cast(m, DType::F32);
    p.kernel(
        "gelu_f16",
        KernelKind::Elementwise(ElementwiseKernel {
            space: dims.to_vec(),
            inputs: vec![contig(x, &dims)],
            body: b.b,
            stores: vec![store(m, o16, &dims), store(f, o32, &dims)],
        }),
    )
}

/// bf16 `exp(x) * y` with `y` a scalar.
pub fn ew_bf16() -> Program {
    let dims = [4, 4096];
    let mut p = P::new();
    let x = p.input("x", DType::BF16, &dims);
    let y = p.input("y", DType::BF16, &[]);
    let out = p.temp(DType::BF16, &dims);
    let mut b = B::new();
    let l = b.load(0, DType::BF16);
    let s = b.load(1, DType::BF16);
    let e = b.un(UnaryOp::Exp, l);
    let m = b.bin(BinaryOp::Mul, e, s);
    p.kernel(
        "exp_scale_bf16",
        KernelKind::Elementwise(ElementwiseKernel {
            space: dims.to_vec(),
            inputs: vec![contig(x, &dims), acc(y, 0, &[0, 0])],
            body: b.b,
            stores: vec![store(m, out, &dims)],
        }),
    )
}

/// Every unary and binary op on f32 and f64, integer arithmetic on every integer type,
/// casts between every pair of dtypes, select, index and comparisons.
pub fn ew_all_ops() -> Program {
    let dims = [5, 7];
    let mut p = P::new();
    let xf = p.input("xf", DType::F32, &dims);
    let xd = p.input("xd", DType::F64, &dims);
    let xi = p.input("xi", DType::I32, &dims);
    let xb = p.input("xb", DType::Bool, &dims);
    let mut b = B::new();
    let mut stores = Vec::new();
    let lf = b.load(0, DType::F32);
    let ld = b.load(1, DType::F64);
    let li = b.load(2, DType::I32);
    let lb = b.load(3, DType::Bool);
    for (l, d) in [(lf, DType::F32), (ld, DType::F64)] {
        let mut accv = l;
        for op in UnaryOp::ALL {
            if op.accepts(d) && op.output_dtype(d) == d {
                let u = b.un(op, l);
                accv = b.bin(BinaryOp::Add, accv, u);
            }
        }
        for op in BinaryOp::ALL {
            if op.accepts(d) && !op.is_comparison() {
                let u = b.bin(op, l, accv);
                accv = b.bin(BinaryOp::Add, accv, u);
            }
        }
        let nan = b.un(UnaryOp::IsNan, accv);
        let inf = b.un(UnaryOp::IsInf, accv);
        let either = b.bin(BinaryOp::Or, nan, inf);
        let lt = b.bin(BinaryOp::Lt, l, accv);
        let both = b.bin(BinaryOp::Xor, either, lt);
        let z = b.c(d, 0.0);
        let sel = b.select(both, z, accv);
        let out = p.temp(d, &dims);
        stores.push(store(sel, out, &dims));
    }
    // Integers: every dtype, every op.
    for d in [DType::I64, DType::I32, DType::I8, DType::U8] {
        let mut v = b.cast(li, d);
        let idx = b.index(1, d);
        for op in BinaryOp::ALL {
            if op.accepts(d) && !op.is_comparison() {
                let u = b.bin(op, v, idx);
                v = b.bin(BinaryOp::Add, v, u);
            }
        }
        for op in [UnaryOp::Neg, UnaryOp::Abs, UnaryOp::Relu, UnaryOp::Sign] {
            let u = b.un(op, v);
            v = b.bin(BinaryOp::Sub, v, u);
        }
        let out = p.temp(d, &dims);
        stores.push(store(v, out, &dims));
    }
    // Casts between every pair.
    let srcs = [(lf, DType::F32), (ld, DType::F64), (li, DType::I32), (lb, DType::Bool)];
    for to in DType::ALL {
        let mut sum: Option<ExprId> = None;
        for &(s, _) in &srcs {
            let mut all_from = vec![s];
            for mid in DType::ALL {
                all_from.push(b.cast(s, mid));
            }
            for f in all_from {
                let c = b.cast(f, to);
                sum = Some(match sum {
                    None => c,
                    Some(a) if to == DType::Bool => b.bin(BinaryOp::Or, a, c),
                    Some(a) => b.bin(BinaryOp::Add, a, c),
                });
            }
        }
        if let Some(v) = sum {
            let out = p.temp(to, &dims);
            stores.push(store(v, out, &dims));
        }
    }
    let nb = b.un(UnaryOp::Not, lb);
    let out = p.temp(DType::Bool, &dims);
    stores.push(store(nb, out, &dims));
    let inputs = vec![
        contig(xf, &dims),
        contig(xd, &dims),
        contig(xi, &dims),
        contig(xb, &dims),
    ];
    p.kernel(
        "all_ops",
        KernelKind::Elementwise(ElementwiseKernel {
            space: dims.to_vec(),
            inputs,
            body: b.b,
            stores,
        }),
    )
}

/// Softmax over rows of `inner` elements of dtype `d`.
pub fn row_softmax(rows: usize, inner: usize, d: DType) -> Program {
    let dims = [rows, inner];
    let mut p = P::new();
    let x = p.input("x", d, &dims);
    let out = p.temp(d, &dims);
    let mut b = B::new();
    let l = b.load(0, d);
    let m = b.stage(0, d);
    let xm = b.bin(BinaryOp::Sub, l, m);
    let e = b.un(UnaryOp::Exp, xm);
    let s = b.stage(1, d);
    let y = b.bin(BinaryOp::Div, e, s);
    p.kernel(
        "softmax",
        KernelKind::Row(RowKernel {
            outer: vec![rows],
            inner: vec![inner],
            inputs: vec![contig(x, &dims)],
            body: b.b,
            stages: vec![
                Stage {
                    op: ReduceOp::Max,
                    value: l,
                },
                Stage {
                    op: ReduceOp::Sum,
                    value: e,
                },
            ],
            row_stores: vec![],
            stores: vec![store(y, out, &dims)],
        }),
    )
}

/// Layer norm over 768 with gamma and beta, also storing each row's mean and rstd.
pub fn row_layernorm() -> Program {
    let (rows, n) = (64, 768);
    let dims = [rows, n];
    let mut p = P::new();
    let x = p.input("x", DType::F32, &dims);
    let g = p.input("gamma", DType::F32, &[n]);
    let be = p.input("beta", DType::F32, &[n]);
    let out = p.temp(DType::F32, &dims);
    let mean_out = p.temp(DType::F32, &[rows]);
    let rstd_out = p.temp(DType::F32, &[rows]);
    let mut b = B::new();
    let l = b.load(0, DType::F32);
    let lg = b.load(1, DType::F32);
    let lb = b.load(2, DType::F32);
    let mean = b.stage(0, DType::F32);
    let xc = b.bin(BinaryOp::Sub, l, mean);
    let sq = b.bin(BinaryOp::Mul, xc, xc);
    let var = b.stage(1, DType::F32);
    let eps = b.c(DType::F32, 1e-5);
    let ve = b.bin(BinaryOp::Add, var, eps);
    let rstd = b.un(UnaryOp::Rsqrt, ve);
    let y = b.bin(BinaryOp::Mul, xc, rstd);
    let yg = b.bin(BinaryOp::Mul, y, lg);
    let yb = b.bin(BinaryOp::Add, yg, lb);
    p.kernel(
        "layernorm",
        KernelKind::Row(RowKernel {
            outer: vec![rows],
            inner: vec![n],
            inputs: vec![contig(x, &dims), acc(g, 0, &[0, 1]), acc(be, 0, &[0, 1])],
            body: b.b,
            stages: vec![
                Stage {
                    op: ReduceOp::Mean,
                    value: l,
                },
                Stage {
                    op: ReduceOp::Mean,
                    value: sq,
                },
            ],
            row_stores: vec![store(mean, mean_out, &[rows]), store(rstd, rstd_out, &[rows])],
            stores: vec![store(yb, out, &dims)],
        }),
    )
}

/// Softmax over rows of `inner` elements of dtype `d`, the input read from element
/// `offset` of a larger buffer (a slice: rows start `offset` elements in).
pub fn row_softmax_offset(rows: usize, inner: usize, d: DType, offset: usize) -> Program {
    let mut p = row_softmax(rows, inner, d);
    p.buffers[0].ty = TensorType::new(d, vec![rows * inner + offset]);
    if let KernelKind::Row(RowKernel { inputs, .. }) = &mut p.kernels[0].kind {
        inputs[0].offset = offset as i64;
    }
    p
}

/// `gelu(layer_norm(x) * gamma + beta)` over rows of `n` elements of dtype `d`.
pub fn row_layernorm_gelu(rows: usize, n: usize, d: DType) -> Program {
    let dims = [rows, n];
    let mut p = P::new();
    let x = p.input("x", d, &dims);
    let g = p.input("gamma", d, &[n]);
    let be = p.input("beta", d, &[n]);
    let out = p.temp(d, &dims);
    let mut b = B::new();
    let l = b.load(0, d);
    let lg = b.load(1, d);
    let lb = b.load(2, d);
    let mean = b.stage(0, d);
    let xc = b.bin(BinaryOp::Sub, l, mean);
    let sq = b.bin(BinaryOp::Mul, xc, xc);
    let var = b.stage(1, d);
    let eps = b.c(d, 1e-5);
    let ve = b.bin(BinaryOp::Add, var, eps);
    let rstd = b.un(UnaryOp::Rsqrt, ve);
    let y = b.bin(BinaryOp::Mul, xc, rstd);
    let yg = b.bin(BinaryOp::Mul, y, lg);
    let yb = b.bin(BinaryOp::Add, yg, lb);
    let ge = b.un(UnaryOp::Gelu, yb);
    p.kernel(
        "layernorm_gelu",
        KernelKind::Row(RowKernel {
            outer: vec![rows],
            inner: vec![n],
            inputs: vec![contig(x, &dims), acc(g, 0, &[0, 1]), acc(be, 0, &[0, 1])],
            body: b.b,
            stages: vec![
                Stage {
                    op: ReduceOp::Mean,
                    value: l,
                },
                Stage {
                    op: ReduceOp::Mean,
                    value: sq,
                },
            ],
            row_stores: vec![],
            stores: vec![store(ge, out, &dims)],
        }),
    )
}

/// Softmax over axis 1 of `[b, c, hw]` (dtype `d`): the reduced axis has stride `hw`,
/// neighbouring rows are adjacent.
pub fn row_softmax_channels(bn: usize, c: usize, hw: usize, d: DType) -> Program {
    let dims = [bn, c, hw];
    let mut p = P::new();
    let x = p.input("x", d, &dims);
    let out = p.temp(d, &dims);
    let mut b = B::new();
    let l = b.load(0, d);
    let m = b.stage(0, d);
    let xm = b.bin(BinaryOp::Sub, l, m);
    let e = b.un(UnaryOp::Exp, xm);
    let s = b.stage(1, d);
    let y = b.bin(BinaryOp::Div, e, s);
    // Space [b, hw, c]: outer [b, hw], inner [c].
    let st = [(c * hw) as i64, 1, hw as i64];
    p.kernel(
        "softmax_channels",
        KernelKind::Row(RowKernel {
            outer: vec![bn, hw],
            inner: vec![c],
            inputs: vec![acc(x, 0, &st)],
            body: b.b,
            stages: vec![
                Stage {
                    op: ReduceOp::Max,
                    value: l,
                },
                Stage {
                    op: ReduceOp::Sum,
                    value: e,
                },
            ],
            row_stores: vec![],
            stores: vec![Store {
                value: y,
                access: acc(out, 0, &st),
            }],
        }),
    )
}

/// Sum and max over axis 0 of a `[512, 64]` tensor: rows along the strided axis.
pub fn row_axis0() -> Program {
    let mut p = P::new();
    let x = p.input("x", DType::F32, &[512, 64]);
    let s = p.temp(DType::F32, &[64]);
    let mx = p.temp(DType::F32, &[64]);
    let mut b = B::new();
    let l = b.load(0, DType::F32);
    let s0 = b.stage(0, DType::F32);
    let s1 = b.stage(1, DType::F32);
    p.kernel(
        "reduce_axis0",
        KernelKind::Row(RowKernel {
            outer: vec![64],
            inner: vec![512],
            inputs: vec![acc(x, 0, &[1, 64])],
            body: b.b,
            stages: vec![
                Stage {
                    op: ReduceOp::Sum,
                    value: l,
                },
                Stage {
                    op: ReduceOp::Max,
                    value: l,
                },
            ],
            row_stores: vec![store(s0, s, &[64]), store(s1, mx, &[64])],
            stores: vec![],
        }),
    )
}

/// A matmul program: `[batch.., m, k] x [batch.., k, n]` with inputs `extra` and a body
/// built by `f(body, acc)` returning the stored value.
pub fn matmul(
    d: DType,
    (m, n, k): (usize, usize, usize),
    a_strides: Option<Vec<i64>>,
    b_strides: Option<Vec<i64>>,
    f: impl FnOnce(&mut P, &mut B, ExprId, &mut Vec<Access>) -> ExprId,
) -> Program {
    let mut p = P::new();
    let a = p.input("a", d, &[m, k]);
    let b_dims = if b_strides.is_some() { [n, k] } else { [k, n] };
    let bb = p.input("b", d, &b_dims);
    let mut body = B::new();
    let accv = body.acc(d);
    let mut inputs = Vec::new();
    let v = f(&mut p, &mut body, accv, &mut inputs);
    let dv = body.b.dtype(v);
    let out = p.temp(dv, &[m, n]);
    p.kernel(
        "matmul",
        KernelKind::MatMul(MatMulKernel {
            batch: vec![],
            m,
            n,
            k,
            a: acc(a, 0, &a_strides.unwrap_or(contiguous_strides(&[m, k]))),
            b: acc(bb, 0, &b_strides.unwrap_or(contiguous_strides(&[k, n]))),
            inputs,
            body: body.b,
            stores: vec![store(v, out, &[m, n])],
            quant: None,
            bias_grad: None,
        }),
    )
}

pub fn matmul_bias_relu() -> Program {
    matmul(DType::F16, (128, 256, 64), None, None, |p, b, a, inputs| {
        let bias = p.input("bias", DType::F16, &[256]);
        inputs.push(acc(bias, 0, &[0, 1]));
        let l = b.load(0, DType::F16);
        let s = b.bin(BinaryOp::Add, a, l);
        b.un(UnaryOp::Relu, s)
    })
}

pub fn matmul_bias_gelu_erf() -> Program {
    matmul(DType::F32, (128, 256, 64), None, None, |p, b, a, inputs| {
        let bias = p.input("bias", DType::F32, &[256]);
        inputs.push(acc(bias, 0, &[0, 1]));
        let l = b.load(0, DType::F32);
        let s = b.bin(BinaryOp::Add, l, a);
        b.un(UnaryOp::Gelu, s)
    })
}

pub fn matmul_gelu_tanh() -> Program {
    matmul(DType::BF16, (64, 128, 32), None, None, |_, b, a, _| {
        b.un(UnaryOp::GeluTanh, a)
    })
}

/// `gelu_tanh_grad(a @ b, x)`, `x` an `[m, n]` input stored with row stride `ld`:
/// the tanh GELU's backward after a GEMM.
pub fn matmul_dgelu(d: DType, n: usize, ld: usize) -> Program {
    matmul(d, (64, n, 32), None, None, |p, b, a, inputs| {
        let x = p.input("x", d, &[64, ld]);
        inputs.push(acc(x, 0, &[ld as i64, 1]));
        let l = b.load(0, d);
        b.bin(BinaryOp::GeluTanhGrad, a, l)
    })
}

pub fn matmul_residual() -> Program {
    matmul(DType::F32, (128, 256, 64), None, None, |p, b, a, inputs| {
        let c = p.input("c", DType::F32, &[128, 256]);
        inputs.push(contig(c, &[128, 256]));
        let l = b.load(0, DType::F32);
        b.bin(BinaryOp::Add, a, l)
    })
}

/// `x @ w^T` with `w` stored `[n, k]`.
pub fn matmul_transb() -> Program {
    let (m, n, k) = (32, 48, 64);
    matmul(DType::F32, (m, n, k), None, Some(vec![1, k as i64]), |_, _, a, _| a)
}

/// Batched `[4, m, k] x [k, n]` (b broadcast over the batch), output then scaled by 2
/// (an epilogue kernel reading D in place... from scratch).
pub fn matmul_batched_scaled() -> Program {
    let (bt, m, n, k) = (4usize, 16usize, 32usize, 8usize);
    let mut p = P::new();
    let a = p.input("a", DType::F32, &[bt, m, k]);
    let bb = p.input("b", DType::F32, &[k, n]);
    let out = p.temp(DType::F32, &[bt, m, n]);
    let mut body = B::new();
    let accv = body.acc(DType::F32);
    let two = body.c(DType::F32, 2.0);
    let v = body.bin(BinaryOp::Mul, accv, two);
    p.kernel(
        "matmul_batched",
        KernelKind::MatMul(MatMulKernel {
            batch: vec![bt],
            m,
            n,
            k,
            a: contig(a, &[bt, m, k]),
            b: acc(bb, 0, &[0, n as i64, 1]),
            inputs: vec![],
            body: body.b,
            stores: vec![store(v, out, &[bt, m, n])],
            quant: None,
            bias_grad: None,
        }),
    )
}

/// An op kernel over `inputs` (accesses contiguous over their own types).
pub fn op_program(op: Op, ins: &[(DType, Vec<usize>)], out: (DType, Vec<usize>)) -> Program {
    let mut p = P::new();
    let mut inputs = Vec::new();
    for (i, (d, dims)) in ins.iter().enumerate() {
        let b = p.input(&format!("in{i}"), *d, dims);
        inputs.push((contig(b, dims), p.ty(b)));
    }
    let o = p.temp(out.0, &out.1);
    let name = op.name().to_string();
    p.kernel(
        &name,
        KernelKind::Op(OpKernel {
            op,
            inputs,
            output: o,
            siblings: Vec::new(),
        }),
    )
}

pub fn op_concat() -> Program {
    op_program(
        Op::Concat { axis: 1 },
        &[
            (DType::F16, vec![4, 3, 5]),
            (DType::F16, vec![4, 1, 5]),
            (DType::F16, vec![4, 6, 5]),
        ],
        (DType::F16, vec![4, 10, 5]),
    )
}

pub fn op_pad(mode: PadMode) -> Program {
    op_program(
        Op::Pad {
            pads: vec![(1, 2), (2, -1)],
            mode,
            value: -1.5,
        },
        &[(DType::F32, vec![6, 8])],
        (DType::F32, vec![9, 9]),
    )
}

pub fn op_gather(axis: usize) -> Program {
    let out = if axis == 0 { vec![2, 3, 16] } else { vec![10, 2, 3] };
    op_program(
        Op::Gather { axis },
        &[(DType::BF16, vec![10, 16]), (DType::I64, vec![2, 3])],
        (DType::BF16, out),
    )
}

pub fn op_argmax() -> Program {
    op_program(
        Op::ArgReduce {
            op: ArgReduceOp::ArgMax,
            axis: 1,
            keepdims: false,
        },
        &[(DType::F32, vec![8, 100, 3])],
        (DType::I64, vec![8, 3]),
    )
}

pub fn op_argmin_int() -> Program {
    op_program(
        Op::ArgReduce {
            op: ArgReduceOp::ArgMin,
            axis: 0,
            keepdims: true,
        },
        &[(DType::I32, vec![7, 5])],
        (DType::I64, vec![1, 5]),
    )
}

pub fn op_int_matmul() -> Program {
    op_program(
        Op::MatMul,
        &[(DType::I32, vec![3, 20, 30]), (DType::I32, vec![30, 17])],
        (DType::I32, vec![3, 20, 17]),
    )
}

/// `x + 1` over a space of `dims` (rank 0, or with a zero extent).
pub fn ew_tiny(dims: &[usize]) -> Program {
    let mut p = P::new();
    let x = p.input("x", DType::F32, dims);
    let out = p.temp(DType::F32, dims);
    let mut b = B::new();
    let l = b.load(0, DType::F32);
    let one = b.c(DType::F32, 1.0);
    let a = b.bin(BinaryOp::Add, l, one);
    p.kernel(
        "tiny",
        KernelKind::Elementwise(ElementwiseKernel {
            space: dims.to_vec(),
            inputs: vec![contig(x, dims)],
            body: b.b,
            stores: vec![store(a, out, dims)],
        }),
    )
}

/// Every fixture, named.
pub fn all() -> Vec<(&'static str, Program)> {
    vec![
        ("ew_contiguous_f32", ew_contiguous_f32()),
        ("multi_tensor", multi_tensor()),
        ("ew_general", ew_general()),
        ("ew_f16", ew_f16()),
        ("ew_bf16", ew_bf16()),
        ("ew_all_ops", ew_all_ops()),
        ("ew_scalar", ew_tiny(&[])),
        ("ew_empty", ew_tiny(&[0, 5])),
        ("row_softmax_small", row_softmax(256, 200, DType::F32)),
        ("row_softmax_f16_wide", row_softmax(32, 4096, DType::F16)),
        ("row_softmax_huge", row_softmax(4, 100_000, DType::F32)),
        ("row_layernorm", row_layernorm()),
        ("row_axis0", row_axis0()),
        ("row_softmax_vec_f32", row_softmax(64, 1024, DType::F32)),
        ("row_softmax_odd_f16", row_softmax(64, 1001, DType::F16)),
        ("row_softmax_misaligned", row_softmax_offset(64, 1024, DType::F32, 2)),
        ("row_softmax_8192_f32", row_softmax(8192, 8192, DType::F32)),
        ("row_softmax_32k_f32", row_softmax(8, 32768, DType::F32)),
        ("row_layernorm_gelu_768_bf16", row_layernorm_gelu(64, 768, DType::BF16)),
        (
            "row_layernorm_gelu_4096_bf16",
            row_layernorm_gelu(8192, 4096, DType::BF16),
        ),
        ("row_layernorm_gelu_8192_f32", row_layernorm_gelu(64, 8192, DType::F32)),
        (
            "row_layernorm_gelu_16k_bf16",
            row_layernorm_gelu(16, 16384, DType::BF16),
        ),
        ("row_softmax_channels", row_softmax_channels(8, 64, 1024, DType::F32)),
        ("row_softmax_channels_f16", row_softmax_channels(2, 384, 48, DType::F16)),
        ("row_softmax_channels_thin", row_softmax_channels(1, 8, 64, DType::F32)),
        ("matmul_bias_relu", matmul_bias_relu()),
        ("matmul_bias_gelu_erf", matmul_bias_gelu_erf()),
        ("matmul_gelu_tanh", matmul_gelu_tanh()),
        ("matmul_dgelu", matmul_dgelu(DType::BF16, 128, 128)),
        ("matmul_residual", matmul_residual()),
        ("matmul_transb", matmul_transb()),
        ("matmul_batched_scaled", matmul_batched_scaled()),
        ("op_concat", op_concat()),
        ("op_pad_constant", op_pad(PadMode::Constant)),
        ("op_pad_reflect", op_pad(PadMode::Reflect)),
        ("op_pad_edge", op_pad(PadMode::Edge)),
        ("op_gather_axis0", op_gather(0)),
        ("op_gather_axis1", op_gather(1)),
        ("op_argmax", op_argmax()),
        ("op_argmin_int", op_argmin_int()),
        ("op_int_matmul", op_int_matmul()),
    ]
}
