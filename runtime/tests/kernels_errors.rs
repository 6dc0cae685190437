//! Malformed programs and failing kernels give errors naming what is wrong, never a panic.

use std::collections::{BTreeMap, HashMap};

use graphc_compiler::kernel::{
    Access, Body, BufferId, BufferKind, ElementwiseKernel, Expr, ExprId, InputId, Kernel, KernelKind, MatMulKernel,
    OpKernel, Program, RowKernel, Stage, StageId, Store,
};
use graphc_ir::{BinaryOp, DType, Op, ReduceOp, Tensor, TensorData, TensorType, UnaryOp};
use graphc_runtime::kernels::{run_kernel, run_program, KernelError};

fn input(p: &mut Program, name: &str, dtype: DType, dims: &[usize]) -> BufferId {
    let id = p.add_buffer(
        TensorType::new(dtype, dims.to_vec()),
        BufferKind::Input { name: name.into() },
        None,
    );
    p.inputs.push(id);
    id
}

fn temp(p: &mut Program, dtype: DType, dims: &[usize]) -> BufferId {
    p.add_buffer(
        TensorType::new(dtype, dims.to_vec()),
        BufferKind::Temp,
        Some("t".into()),
    )
}

fn acc(buffer: BufferId, offset: i64, strides: &[i64]) -> Access {
    Access {
        buffer,
        offset,
        strides: strides.to_vec(),
    }
}

fn elementwise(name: &str, space: &[usize], inputs: Vec<Access>, body: Body, stores: Vec<Store>) -> Kernel {
    Kernel {
        name: name.into(),
        kind: KernelKind::Elementwise(ElementwiseKernel {
            space: space.to_vec(),
            inputs,
            body,
            stores,
        }),
        nodes: vec![],
    }
}

/// `out = neg(x)` over [4, 6] with the given input access, store access and body.
fn neg_program(x_access: (i64, Vec<i64>), store_access: (i64, Vec<i64>), body: Option<Body>) -> Program {
    let mut p = Program::default();
    let bx = input(&mut p, "x", DType::F32, &[4, 6]);
    let out = temp(&mut p, DType::F32, &[4, 6]);
    let body = body.unwrap_or_else(|| {
        let mut b = Body::default();
        let l = b.push(Expr::Load(InputId(0)), DType::F32);
        b.push(Expr::Unary(UnaryOp::Neg, l), DType::F32);
        b
    });
    p.kernels.push(elementwise(
        "neg",
        &[4, 6],
        vec![acc(bx, x_access.0, &x_access.1)],
        body,
        vec![Store {
            value: ExprId(1),
            access: acc(out, store_access.0, &store_access.1),
        }],
    ));
    p.outputs = vec![("y".into(), out)];
    p
}

fn x_inputs() -> HashMap<String, Tensor> {
    let x = Tensor::random(&TensorType::new(DType::F32, [4usize, 6]), 1);
    [("x".to_string(), x)].into_iter().collect()
}

fn run_err(p: &Program, inputs: &HashMap<String, Tensor>) -> String {
    match run_program(p, &BTreeMap::new(), inputs) {
        Ok(_) => panic!("expected an error"),
        Err(e) => e.to_string(),
    }
}

fn contains(msg: &str, parts: &[&str]) {
    for part in parts {
        assert!(msg.contains(part), "{msg:?} should contain {part:?}");
    }
}

#[test]
fn the_neg_program_itself_runs() {
    let p = neg_program((0, vec![6, 1]), (0, vec![6, 1]), None);
    let out = run_program(&p, &BTreeMap::new(), &x_inputs()).unwrap();
    assert_eq!(out[0].1.ty(), TensorType::new(DType::F32, [4usize, 6]));
}

#[test]
fn out_of_bounds_accesses() {
    // One past the end.
    let p = neg_program((1, vec![6, 1]), (0, vec![6, 1]), None);
    contains(
        &run_err(&p, &x_inputs()),
        &["kernel 0 (neg)", "input 0", "b0", "out of bounds"],
    );
    // A negative stride walking below element 0.
    let p = neg_program((4, vec![6, -1]), (0, vec![6, 1]), None);
    contains(&run_err(&p, &x_inputs()), &["kernel 0 (neg)", "-1..=", "out of bounds"]);
    // Huge strides do not overflow the check.
    let p = neg_program((0, vec![i64::MAX, i64::MIN]), (0, vec![6, 1]), None);
    contains(&run_err(&p, &x_inputs()), &["out of bounds"]);
    // Wrong rank.
    let p = neg_program((0, vec![1]), (0, vec![6, 1]), None);
    contains(&run_err(&p, &x_inputs()), &["1 strides for a space of rank 2"]);
}

#[test]
fn stores_must_cover_their_buffer_once() {
    for (offset, strides) in [(0, vec![6, 0]), (0, vec![1, 1]), (1, vec![6, 1]), (0, vec![6, 2])] {
        let p = neg_program((0, vec![6, 1]), (offset, strides), None);
        contains(&run_err(&p, &x_inputs()), &["kernel 0 (neg)", "store 0"]);
    }
    // A reversed store is a permutation: fine.
    let p = neg_program((0, vec![6, 1]), (23, vec![-6, -1]), None);
    let out = run_program(&p, &BTreeMap::new(), &x_inputs()).unwrap();
    let x = x_inputs()["x"].to_f64_vec();
    let y = out[0].1.to_f64_vec();
    assert_eq!(y[0], -x[23]);
}

#[test]
fn read_before_write() {
    // Kernel 0 reads t1, which kernel 1 writes.
    let mut p = Program::default();
    let bx = input(&mut p, "x", DType::F32, &[4]);
    let t1 = temp(&mut p, DType::F32, &[4]);
    let t2 = temp(&mut p, DType::F32, &[4]);
    let mut body = Body::default();
    let l = body.push(Expr::Load(InputId(0)), DType::F32);
    body.push(Expr::Unary(UnaryOp::Neg, l), DType::F32);
    let st = |b| Store {
        value: ExprId(1),
        access: Access::contiguous(b, &[4]),
    };
    p.kernels.push(elementwise(
        "second",
        &[4],
        vec![Access::contiguous(t1, &[4])],
        body.clone(),
        vec![st(t2)],
    ));
    p.kernels.push(elementwise(
        "first",
        &[4],
        vec![Access::contiguous(bx, &[4])],
        body,
        vec![st(t1)],
    ));
    p.outputs = vec![("y".into(), t2)];
    let x = Tensor::random(&TensorType::new(DType::F32, [4usize]), 2);
    let msg = run_err(&p, &[("x".to_string(), x)].into_iter().collect());
    contains(
        &msg,
        &["kernel 0 (second)", "b1 (temp \"t\")", "before any kernel wrote it"],
    );

    // The same through run_kernel.
    let mut slots = vec![None; p.buffers.len()];
    let e = run_kernel(&p, 0, &mut slots).unwrap_err();
    contains(&e.to_string(), &["kernel 0 (second)", "before any kernel wrote it"]);
    // Kernel index out of range, wrong slot count.
    assert!(run_kernel(&p, 7, &mut slots).is_err());
    assert!(run_kernel(&p, 0, &mut slots[..1]).is_err());
}

#[test]
fn bad_expressions() {
    let cases: Vec<(Vec<(Expr, DType)>, &str)> = vec![
        // Operand does not precede its user.
        (
            vec![
                (Expr::Unary(UnaryOp::Neg, ExprId(1)), DType::F32),
                (Expr::Load(InputId(0)), DType::F32),
            ],
            "operand e1 does not precede it",
        ),
        // Operand past the end.
        (
            vec![
                (Expr::Load(InputId(0)), DType::F32),
                (Expr::Unary(UnaryOp::Neg, ExprId(9)), DType::F32),
            ],
            "operand e9",
        ),
        // Load of a missing input.
        (
            vec![
                (Expr::Load(InputId(0)), DType::F32),
                (Expr::Load(InputId(3)), DType::F32),
            ],
            "the kernel has 1 inputs",
        ),
        // Declared dtype disagrees.
        (
            vec![
                (Expr::Load(InputId(0)), DType::F32),
                (Expr::Unary(UnaryOp::Neg, ExprId(0)), DType::F16),
            ],
            "declared f16 but computes f32",
        ),
        (
            vec![
                (Expr::Load(InputId(0)), DType::I32),
                (Expr::Unary(UnaryOp::Neg, ExprId(0)), DType::I32),
            ],
            "declared i32 but computes f32",
        ),
        // Mixed operand dtypes.
        (
            vec![
                (Expr::Load(InputId(0)), DType::F32),
                (Expr::Const(Tensor::scalar(DType::F16, 1.0)), DType::F16),
                (Expr::Binary(BinaryOp::Add, ExprId(0), ExprId(1)), DType::F32),
            ],
            "e2 (add)",
        ),
        // A non-scalar constant.
        (
            vec![
                (Expr::Load(InputId(0)), DType::F32),
                (
                    Expr::Const(Tensor::from_f32([2usize], vec![1.0, 2.0]).unwrap()),
                    DType::F32,
                ),
            ],
            "not a scalar",
        ),
        // Index axis out of range.
        (
            vec![(Expr::Load(InputId(0)), DType::F32), (Expr::Index(5), DType::I64)],
            "e1 (index 5)",
        ),
        // Stage and Acc outside their kernels.
        (
            vec![
                (Expr::Load(InputId(0)), DType::F32),
                (Expr::Stage(StageId(0)), DType::F32),
            ],
            "only allowed in row kernels",
        ),
        (
            vec![(Expr::Load(InputId(0)), DType::F32), (Expr::Acc, DType::F32)],
            "only allowed in matmul kernels",
        ),
    ];
    for (exprs, want) in cases {
        let p = neg_program((0, vec![6, 1]), (0, vec![6, 1]), Some(Body { exprs }));
        let msg = run_err(&p, &x_inputs());
        contains(&msg, &["kernel 0 (neg)", want]);
    }
    // A store of a missing expression.
    let mut body = Body::default();
    body.push(Expr::Load(InputId(0)), DType::F32);
    let p = neg_program((0, vec![6, 1]), (0, vec![6, 1]), Some(body));
    contains(&run_err(&p, &x_inputs()), &["store 0: value e1 does not exist"]);
}

#[test]
fn inputs_and_weights() {
    let p = neg_program((0, vec![6, 1]), (0, vec![6, 1]), None);
    let e = run_program(&p, &BTreeMap::new(), &HashMap::new()).unwrap_err();
    assert_eq!(e, KernelError::MissingInput("x".into()));
    assert_eq!(e.to_string(), "input \"x\" is missing");

    let wrong: HashMap<String, Tensor> = [("x".to_string(), Tensor::scalar(DType::F32, 1.0))]
        .into_iter()
        .collect();
    contains(&run_err(&p, &wrong), &["input \"x\" should be f32[4,6], got f32[]"]);

    let mut extra = x_inputs();
    extra.insert("z".into(), Tensor::scalar(DType::F32, 1.0));
    contains(&run_err(&p, &extra), &["\"z\" is not an input"]);

    let mut p = neg_program((0, vec![6, 1]), (0, vec![6, 1]), None);
    p.buffers[0].kind = BufferKind::Weight { name: "w".into() };
    p.inputs.clear();
    contains(&run_err(&p, &HashMap::new()), &["weight \"w\" (buffer b0) is missing"]);

    // A store into an input buffer; an output buffer that does not exist.
    let mut p = neg_program((0, vec![6, 1]), (0, vec![6, 1]), None);
    if let KernelKind::Elementwise(ElementwiseKernel { stores, .. }) = &mut p.kernels[0].kind {
        stores[0].access.buffer = BufferId(0);
    }
    contains(&run_err(&p, &x_inputs()), &["b0 (input \"x\")", "not a temp"]);
    let mut p = neg_program((0, vec![6, 1]), (0, vec![6, 1]), None);
    p.outputs.push(("ghost".into(), BufferId(9)));
    contains(&run_err(&p, &x_inputs()), &["output \"ghost\"", "b9 does not exist"]);
    // An access of a buffer that does not exist.
    let p = neg_program((0, vec![6, 1]), (0, vec![6, 1]), None);
    let mut q = p.clone();
    if let KernelKind::Elementwise(ElementwiseKernel { inputs, .. }) = &mut q.kernels[0].kind {
        inputs[0].buffer = BufferId(42);
    }
    contains(&run_err(&q, &x_inputs()), &["buffer b42 does not exist"]);
}

#[test]
fn runtime_failures_of_ops() {
    // Integer division by zero inside an elementwise body.
    let mut p = Program::default();
    let bx = input(&mut p, "x", DType::I32, &[3]);
    let out = temp(&mut p, DType::I32, &[3]);
    let mut body = Body::default();
    let l = body.push(Expr::Load(InputId(0)), DType::I32);
    let z = body.push(Expr::Const(Tensor::scalar(DType::I32, 0.0)), DType::I32);
    let d = body.push(Expr::Binary(BinaryOp::Div, l, z), DType::I32);
    p.kernels.push(elementwise(
        "div",
        &[3],
        vec![Access::contiguous(bx, &[3])],
        body,
        vec![Store {
            value: d,
            access: Access::contiguous(out, &[3]),
        }],
    ));
    p.outputs = vec![("y".into(), out)];
    let x = Tensor::new([3usize], TensorData::I32(vec![1, 2, 3])).unwrap();
    let msg = run_err(&p, &[("x".to_string(), x)].into_iter().collect());
    contains(&msg, &["kernel 0 (div)", "e2 (div)", "zero"]);

    // Gather index out of range.
    let mut p = Program::default();
    let bd = input(&mut p, "d", DType::F32, &[3]);
    let bi = input(&mut p, "i", DType::I64, &[2]);
    let out = temp(&mut p, DType::F32, &[2]);
    p.kernels.push(Kernel {
        name: "g".into(),
        kind: KernelKind::Op(OpKernel {
            op: Op::Gather { axis: 0 },
            inputs: vec![
                (Access::contiguous(bd, &[3]), TensorType::new(DType::F32, [3usize])),
                (Access::contiguous(bi, &[2]), TensorType::new(DType::I64, [2usize])),
            ],
            output: out,
            siblings: Vec::new(),
        }),
        nodes: vec![],
    });
    p.outputs = vec![("y".into(), out)];
    let ins: HashMap<String, Tensor> = [
        (
            "d".to_string(),
            Tensor::from_f32([3usize], vec![1.0, 2.0, 3.0]).unwrap(),
        ),
        (
            "i".to_string(),
            Tensor::new([2usize], TensorData::I64(vec![0, 7])).unwrap(),
        ),
    ]
    .into_iter()
    .collect();
    contains(&run_err(&p, &ins), &["kernel 0 (g)", "gather"]);

    // An op kernel whose output buffer has the wrong type.
    let mut q = p.clone();
    q.buffers[out.index()].ty = TensorType::new(DType::F32, [5usize]);
    contains(&run_err(&q, &ins), &["kernel 0 (g)", "gives f32[2]"]);
}

/// A row kernel over x [4, 6] with one row store into [4].
fn row_program(exprs: Vec<(Expr, DType)>, stages: Vec<Stage>, row_value: ExprId) -> Program {
    let mut p = Program::default();
    let bx = input(&mut p, "x", DType::F32, &[4, 6]);
    let om = temp(&mut p, DType::F32, &[4]);
    p.kernels.push(Kernel {
        name: "row".into(),
        kind: KernelKind::Row(RowKernel {
            outer: vec![4],
            inner: vec![6],
            inputs: vec![Access::contiguous(bx, &[4, 6])],
            body: Body { exprs },
            stages,
            row_stores: vec![Store {
                value: row_value,
                access: Access::contiguous(om, &[4]),
            }],
            stores: vec![],
        }),
        nodes: vec![],
    });
    p.outputs = vec![("m".into(), om)];
    p
}

fn stage(op: ReduceOp, value: ExprId) -> Stage {
    Stage { op, value }
}

/// Row kernels: stages must come in order, row stores need per-row values, stage
/// references must exist.
#[test]
fn bad_row_kernels() {
    let load = (Expr::Load(InputId(0)), DType::F32);
    let sum_body = vec![load.clone(), (Expr::Stage(StageId(0)), DType::F32)];
    // Fine: the row sum.
    let ok = row_program(sum_body.clone(), vec![stage(ReduceOp::Sum, ExprId(0))], ExprId(1));
    let out = run_program(&ok, &BTreeMap::new(), &x_inputs()).unwrap();
    let x = x_inputs()["x"].clone();
    let want = graphc_ir::interp::eval_op(
        &Op::Reduce {
            op: ReduceOp::Sum,
            axes: vec![1],
            keepdims: false,
        },
        &[&x],
        &TensorType::new(DType::F32, [4usize]),
    )
    .unwrap();
    assert!(out[0].1 == want);

    // Row store of a per-element value.
    contains(
        &run_err(
            &row_program(sum_body.clone(), vec![stage(ReduceOp::Sum, ExprId(0))], ExprId(0)),
            &x_inputs(),
        ),
        &["kernel 0 (row)", "row store 0", "varies along the inner dims"],
    );
    // Reference to a missing stage.
    contains(
        &run_err(&row_program(sum_body.clone(), vec![], ExprId(1)), &x_inputs()),
        &["the kernel has 0 stages"],
    );
    // A stage whose value does not precede the reference.
    let body = vec![
        load.clone(),
        (Expr::Stage(StageId(0)), DType::F32),
        (Expr::Unary(UnaryOp::Neg, ExprId(0)), DType::F32),
    ];
    contains(
        &run_err(
            &row_program(body, vec![stage(ReduceOp::Sum, ExprId(2))], ExprId(1)),
            &x_inputs(),
        ),
        &["does not precede it"],
    );
    // Stage 0 using stage 1, which is not earlier.
    let body = vec![
        load.clone(),
        (Expr::Stage(StageId(1)), DType::F32),
        (Expr::Binary(BinaryOp::Add, ExprId(0), ExprId(1)), DType::F32),
        (Expr::Stage(StageId(0)), DType::F32),
    ];
    let p = row_program(
        body,
        vec![stage(ReduceOp::Max, ExprId(2)), stage(ReduceOp::Sum, ExprId(0))],
        ExprId(3),
    );
    contains(
        &run_err(&p, &x_inputs()),
        &["stage 0", "uses stage 1, not an earlier one"],
    );
    // A stage of a bool value.
    let body = vec![
        load,
        (Expr::Unary(UnaryOp::IsNan, ExprId(0)), DType::Bool),
        (Expr::Stage(StageId(0)), DType::Bool),
    ];
    let p = row_program(body, vec![stage(ReduceOp::Sum, ExprId(1))], ExprId(2));
    contains(&run_err(&p, &x_inputs()), &["kernel 0 (row)", "bool"]);
}

#[test]
fn bad_matmul_kernels() {
    let mut p = Program::default();
    let ba = input(&mut p, "a", DType::F32, &[2, 3]);
    let bb = input(&mut p, "b", DType::I64, &[3, 4]);
    let out = temp(&mut p, DType::F32, &[2, 4]);
    let mut body = Body::default();
    let a = body.push(Expr::Acc, DType::F32);
    p.kernels.push(Kernel {
        name: "mm".into(),
        kind: KernelKind::MatMul(MatMulKernel {
            batch: vec![],
            m: 2,
            n: 4,
            k: 3,
            a: Access::contiguous(ba, &[2, 3]),
            b: Access::contiguous(bb, &[3, 4]),
            inputs: vec![],
            body,
            stores: vec![Store {
                value: a,
                access: Access::contiguous(out, &[2, 4]),
            }],
            quant: None,
            bias_grad: None,
        }),
        nodes: vec![],
    });
    p.outputs = vec![("y".into(), out)];
    let ins: HashMap<String, Tensor> = [
        (
            "a".to_string(),
            Tensor::random(&TensorType::new(DType::F32, [2usize, 3]), 1),
        ),
        (
            "b".to_string(),
            Tensor::random(&TensorType::new(DType::I64, [3usize, 4]), 2),
        ),
    ]
    .into_iter()
    .collect();
    contains(&run_err(&p, &ins), &["kernel 0 (mm)", "matmul"]);

    // k larger than the operand: out of bounds.
    let mut q = p.clone();
    q.buffers[bb.index()].ty.dtype = DType::F32;
    let ins_f: HashMap<String, Tensor> = [
        (
            "a".to_string(),
            Tensor::random(&TensorType::new(DType::F32, [2usize, 3]), 1),
        ),
        (
            "b".to_string(),
            Tensor::random(&TensorType::new(DType::F32, [3usize, 4]), 2),
        ),
    ]
    .into_iter()
    .collect();
    assert!(run_program(&q, &BTreeMap::new(), &ins_f).is_ok());
    if let KernelKind::MatMul(MatMulKernel { k, a, .. }) = &mut q.kernels[0].kind {
        *k = 4;
        a.strides = vec![4, 1];
    }
    contains(&run_err(&q, &ins_f), &["kernel 0 (mm)", "operand a", "out of bounds"]);
}
