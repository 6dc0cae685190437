//! Every op of the IR against hand-written expected values (numpy/Python semantics).

// The expected values are literals on purpose, not library constants.
#![allow(clippy::approx_constant)]

mod common;

use common::{boolt, check, check_exact, f32t, i64t, run, t, try_run};
use graphc_ir::{
    ArgReduceOp, BinaryOp, DType, GraphError, InterpError, Op, PadMode, ReduceOp, Shape, SliceRange, Tensor,
    TensorData, TensorType, UnaryOp,
};

const NAN: f64 = f64::NAN;
const INF: f64 = f64::INFINITY;

fn un(op: UnaryOp, x: &Tensor) -> Tensor {
    run(Op::Unary(op), std::slice::from_ref(x))
}

fn bin(op: BinaryOp, a: &Tensor, b: &Tensor) -> Tensor {
    run(Op::Binary(op), &[a.clone(), b.clone()])
}

fn node_error(e: InterpError) -> (String, String) {
    match e {
        InterpError::Graph(GraphError::Node { op, message, .. }) => (op, message),
        other => panic!("expected a node error, got {other:?}"),
    }
}

// ---------------------------------------------------------------- unary, floats

const XS: [f64; 6] = [-1.5, -0.5, 0.0, 0.5, 1.0, 2.0];

#[test]
fn unary_transcendental_f32_and_f64() {
    let cases: [(UnaryOp, [f64; 6]); 9] = [
        (
            UnaryOp::Exp,
            [
                0.22313016014842982,
                0.6065306597126334,
                1.0,
                1.6487212707001282,
                2.718281828459045,
                7.38905609893065,
            ],
        ),
        (
            UnaryOp::Tanh,
            [
                -0.9051482536448664,
                -0.46211715726000974,
                0.0,
                0.46211715726000974,
                0.7615941559557649,
                0.9640275800758169,
            ],
        ),
        (
            UnaryOp::Sigmoid,
            [
                0.18242552380635635,
                0.3775406687981454,
                0.5,
                0.6224593312018546,
                0.7310585786300049,
                0.8807970779778823,
            ],
        ),
        (
            UnaryOp::Gelu,
            [
                -0.10021080190328713,
                -0.15426876936299344,
                0.0,
                0.34573123063700656,
                0.8413447460685429,
                1.9544997361036416,
            ],
        ),
        (
            UnaryOp::GeluTanh,
            [
                -0.10042842301976707,
                -0.15428599017485606,
                0.0,
                0.34571400982514394,
                0.8411919906082768,
                1.954597694087775,
            ],
        ),
        (
            UnaryOp::Silu,
            [
                -0.2736382857095345,
                -0.1887703343990727,
                0.0,
                0.3112296656009273,
                0.7310585786300049,
                1.7615941559557646,
            ],
        ),
        (
            UnaryOp::Erf,
            [
                -0.9661051464753108,
                -0.5204998778130465,
                0.0,
                0.5204998778130465,
                0.8427007929497149,
                0.9953222650189527,
            ],
        ),
        (
            UnaryOp::Sin,
            [
                -0.9974949866040544,
                -0.479425538604203,
                0.0,
                0.479425538604203,
                0.8414709848078965,
                0.9092974268256817,
            ],
        ),
        (
            UnaryOp::Cos,
            [
                0.0707372016677029,
                0.8775825618903728,
                1.0,
                0.8775825618903728,
                0.5403023058681398,
                -0.4161468365471424,
            ],
        ),
    ];
    for (op, expected) in cases {
        let x32 = f32t(&[6], &XS);
        check(&un(op, &x32), DType::F32, &[6], &expected, 2e-6);
        let x64 = t(DType::F64, &[6], &XS);
        check(&un(op, &x64), DType::F64, &[6], &expected, 1e-14);
    }
}

#[test]
fn unary_log_sqrt_rsqrt_reciprocal() {
    let ps = [0.25, 0.5, 1.0, 2.0, 4.0];
    let cases: [(UnaryOp, [f64; 5]); 4] = [
        (
            UnaryOp::Log,
            [
                -1.3862943611198906,
                -0.6931471805599453,
                0.0,
                0.6931471805599453,
                1.3862943611198906,
            ],
        ),
        (UnaryOp::Sqrt, [0.5, 0.7071067811865476, 1.0, 1.4142135623730951, 2.0]),
        (UnaryOp::Rsqrt, [2.0, 1.414213562373095, 1.0, 0.7071067811865475, 0.5]),
        (UnaryOp::Reciprocal, [4.0, 2.0, 1.0, 0.5, 0.25]),
    ];
    for (op, expected) in cases {
        check(&un(op, &f32t(&[5], &ps)), DType::F32, &[5], &expected, 2e-7);
        check(&un(op, &t(DType::F64, &[5], &ps)), DType::F64, &[5], &expected, 1e-15);
    }
    // Edge values: log 0 = -inf, log -1 = NaN, sqrt -1 = NaN, 1/0 = inf.
    let e = f32t(&[3], &[0.0, -1.0, INF]);
    check(&un(UnaryOp::Log, &e), DType::F32, &[3], &[-INF, NAN, INF], 0.0);
    check(&un(UnaryOp::Sqrt, &e), DType::F32, &[3], &[0.0, NAN, INF], 0.0);
    check(&un(UnaryOp::Rsqrt, &e), DType::F32, &[3], &[INF, NAN, 0.0], 0.0);
    check(&un(UnaryOp::Reciprocal, &e), DType::F32, &[3], &[INF, -1.0, 0.0], 0.0);
}

#[test]
fn unary_piecewise_floats() {
    let x = f32t(&[8], &[-2.5, -1.5, -0.5, 0.0, 0.5, 1.5, 2.5, NAN]);
    let cases: [(UnaryOp, [f64; 8]); 7] = [
        (UnaryOp::Neg, [2.5, 1.5, 0.5, 0.0, -0.5, -1.5, -2.5, NAN]),
        (UnaryOp::Abs, [2.5, 1.5, 0.5, 0.0, 0.5, 1.5, 2.5, NAN]),
        (UnaryOp::Relu, [0.0, 0.0, 0.0, 0.0, 0.5, 1.5, 2.5, NAN]),
        (UnaryOp::Floor, [-3.0, -2.0, -1.0, 0.0, 0.0, 1.0, 2.0, NAN]),
        (UnaryOp::Ceil, [-2.0, -1.0, 0.0, 0.0, 1.0, 2.0, 3.0, NAN]),
        // Half to even.
        (UnaryOp::Round, [-2.0, -2.0, 0.0, 0.0, 0.0, 2.0, 2.0, NAN]),
        (UnaryOp::Sign, [-1.0, -1.0, -1.0, 0.0, 1.0, 1.0, 1.0, NAN]),
    ];
    for (op, expected) in cases {
        check_exact(&un(op, &x), DType::F32, &[8], &expected);
        let x64 = t(DType::F64, &[8], &x.to_f64_vec());
        check_exact(&un(op, &x64), DType::F64, &[8], &expected);
    }
    check_exact(&un(UnaryOp::Sign, &f32t(&[1], &[-0.0])), DType::F32, &[1], &[0.0]);
    check_exact(
        &un(UnaryOp::Sign, &f32t(&[2], &[-INF, INF])),
        DType::F32,
        &[2],
        &[-1.0, 1.0],
    );
}

#[test]
fn unary_isnan_isinf_not() {
    let x = f32t(&[4], &[1.0, NAN, INF, -INF]);
    assert_eq!(un(UnaryOp::IsNan, &x), boolt(&[4], &[false, true, false, false]));
    assert_eq!(un(UnaryOp::IsInf, &x), boolt(&[4], &[false, false, true, true]));
    let h = t(DType::F16, &[2], &[NAN, 70000.0]); // 70000 overflows f16 to inf.
    assert_eq!(un(UnaryOp::IsInf, &h), boolt(&[2], &[false, true]));
    assert_eq!(un(UnaryOp::IsNan, &h), boolt(&[2], &[true, false]));
    let b = boolt(&[2], &[true, false]);
    assert_eq!(un(UnaryOp::Not, &b), boolt(&[2], &[false, true]));
}

#[test]
fn unary_integers_wrap() {
    let x = t(DType::I8, &[5], &[-128.0, -3.0, 0.0, 5.0, 127.0]);
    check_exact(
        &un(UnaryOp::Neg, &x),
        DType::I8,
        &[5],
        &[-128.0, 3.0, 0.0, -5.0, -127.0],
    );
    check_exact(&un(UnaryOp::Abs, &x), DType::I8, &[5], &[-128.0, 3.0, 0.0, 5.0, 127.0]);
    check_exact(&un(UnaryOp::Relu, &x), DType::I8, &[5], &[0.0, 0.0, 0.0, 5.0, 127.0]);
    check_exact(&un(UnaryOp::Sign, &x), DType::I8, &[5], &[-1.0, -1.0, 0.0, 1.0, 1.0]);
    let u = t(DType::U8, &[3], &[0.0, 1.0, 255.0]);
    check_exact(&un(UnaryOp::Neg, &u), DType::U8, &[3], &[0.0, 255.0, 1.0]);
    check_exact(&un(UnaryOp::Abs, &u), DType::U8, &[3], &[0.0, 1.0, 255.0]);
    check_exact(&un(UnaryOp::Relu, &u), DType::U8, &[3], &[0.0, 1.0, 255.0]);
    check_exact(&un(UnaryOp::Sign, &u), DType::U8, &[3], &[0.0, 1.0, 1.0]);
    let big = i64t(&[3], &[i64::MIN, -(1 << 60) - 1, i64::MAX]);
    assert_eq!(
        un(UnaryOp::Neg, &big).data(),
        &TensorData::I64(vec![i64::MIN, (1 << 60) + 1, -i64::MAX])
    );
    assert_eq!(
        un(UnaryOp::Abs, &big).data(),
        &TensorData::I64(vec![i64::MIN, (1 << 60) + 1, i64::MAX])
    );
    let i = t(DType::I32, &[2], &[-7.0, 7.0]);
    check_exact(&un(UnaryOp::Abs, &i), DType::I32, &[2], &[7.0, 7.0]);
}

#[test]
fn unary_half_types_round_at_output() {
    // exp(1) = 2.71828..: nearest f16 and bf16 are both 2.71875.
    let h = t(DType::F16, &[2], &[1.0, 0.0]);
    check_exact(&un(UnaryOp::Exp, &h), DType::F16, &[2], &[2.71875, 1.0]);
    let b = t(DType::BF16, &[2], &[1.0, 0.0]);
    check_exact(&un(UnaryOp::Exp, &b), DType::BF16, &[2], &[2.71875, 1.0]);
    // sqrt(2) = 1.41421..: f16 1.4140625, bf16 1.4140625.
    check_exact(
        &un(UnaryOp::Sqrt, &t(DType::F16, &[1], &[2.0])),
        DType::F16,
        &[1],
        &[1.4140625],
    );
    check_exact(
        &un(UnaryOp::Sqrt, &t(DType::BF16, &[1], &[2.0])),
        DType::BF16,
        &[1],
        &[1.4140625],
    );
}

// ---------------------------------------------------------------- binary

#[test]
fn binary_float_arithmetic() {
    let a = f32t(&[4], &[1.5, -2.0, 8.0, 2.0]);
    let b = f32t(&[4], &[0.5, 4.0, -0.25, 10.0]);
    check_exact(&bin(BinaryOp::Add, &a, &b), DType::F32, &[4], &[2.0, 2.0, 7.75, 12.0]);
    check_exact(&bin(BinaryOp::Sub, &a, &b), DType::F32, &[4], &[1.0, -6.0, 8.25, -8.0]);
    check_exact(&bin(BinaryOp::Mul, &a, &b), DType::F32, &[4], &[0.75, -8.0, -2.0, 20.0]);
    check_exact(
        &bin(BinaryOp::Div, &a, &b),
        DType::F32,
        &[4],
        &[3.0, -0.5, -32.0, 0.2f32 as f64],
    );
    let p = bin(
        BinaryOp::Pow,
        &f32t(&[4], &[2.0, 4.0, 1.5, 8.0]),
        &f32t(&[4], &[10.0, 0.5, 2.5, -1.0]),
    );
    check(&p, DType::F32, &[4], &[1024.0, 2.0, 2.7556759606310752, 0.125], 1e-6);
    // Float division by zero is IEEE, not an error.
    let d = bin(
        BinaryOp::Div,
        &f32t(&[3], &[1.0, -1.0, 0.0]),
        &f32t(&[3], &[0.0, 0.0, 0.0]),
    );
    check(&d, DType::F32, &[3], &[INF, -INF, NAN], 0.0);
    let a64 = t(DType::F64, &[2], &[0.1, 1e308]);
    let b64 = t(DType::F64, &[2], &[0.2, 1e308]);
    check_exact(
        &bin(BinaryOp::Add, &a64, &b64),
        DType::F64,
        &[2],
        &[0.30000000000000004, INF],
    );
}

#[test]
fn binary_max_min_propagate_nan() {
    let a = f32t(&[4], &[1.0, NAN, 3.0, NAN]);
    let b = f32t(&[4], &[2.0, 1.0, NAN, NAN]);
    check_exact(&bin(BinaryOp::Max, &a, &b), DType::F32, &[4], &[2.0, NAN, NAN, NAN]);
    check_exact(&bin(BinaryOp::Min, &a, &b), DType::F32, &[4], &[1.0, NAN, NAN, NAN]);
    let i = t(DType::I32, &[2], &[-5.0, 7.0]);
    let j = t(DType::I32, &[2], &[3.0, -9.0]);
    check_exact(&bin(BinaryOp::Max, &i, &j), DType::I32, &[2], &[3.0, 7.0]);
    check_exact(&bin(BinaryOp::Min, &i, &j), DType::I32, &[2], &[-5.0, -9.0]);
}

#[test]
fn binary_float_mod_fmod_signs() {
    let a = f32t(&[6], &[7.0, -7.0, 7.0, -7.0, 5.5, -5.5]);
    let b = f32t(&[6], &[2.0, 2.0, -2.0, -2.0, 2.0, 2.0]);
    check_exact(
        &bin(BinaryOp::Mod, &a, &b),
        DType::F32,
        &[6],
        &[1.0, 1.0, -1.0, -1.0, 1.5, 0.5],
    );
    check_exact(
        &bin(BinaryOp::Fmod, &a, &b),
        DType::F32,
        &[6],
        &[1.0, -1.0, 1.0, -1.0, 1.5, -1.5],
    );
    let a = t(DType::F64, &[2], &[6.0, -4.0]);
    let b = t(DType::F64, &[2], &[3.0, 2.0]);
    check_exact(&bin(BinaryOp::Mod, &a, &b), DType::F64, &[2], &[0.0, 0.0]);
}

#[test]
fn binary_integer_division_and_modulo_signs() {
    for dtype in [DType::I64, DType::I32, DType::I8] {
        let a = t(dtype, &[4], &[7.0, -7.0, 7.0, -7.0]);
        let b = t(dtype, &[4], &[2.0, 2.0, -2.0, -2.0]);
        check_exact(&bin(BinaryOp::Div, &a, &b), dtype, &[4], &[3.0, -3.0, -3.0, 3.0]);
        check_exact(&bin(BinaryOp::Mod, &a, &b), dtype, &[4], &[1.0, 1.0, -1.0, -1.0]);
        check_exact(&bin(BinaryOp::Fmod, &a, &b), dtype, &[4], &[1.0, -1.0, 1.0, -1.0]);
    }
    let a = t(DType::U8, &[2], &[7.0, 250.0]);
    let b = t(DType::U8, &[2], &[2.0, 7.0]);
    check_exact(&bin(BinaryOp::Div, &a, &b), DType::U8, &[2], &[3.0, 35.0]);
    check_exact(&bin(BinaryOp::Mod, &a, &b), DType::U8, &[2], &[1.0, 5.0]);
    // MIN / -1 wraps.
    let a = t(DType::I8, &[1], &[-128.0]);
    let b = t(DType::I8, &[1], &[-1.0]);
    check_exact(&bin(BinaryOp::Div, &a, &b), DType::I8, &[1], &[-128.0]);
    check_exact(&bin(BinaryOp::Mod, &a, &b), DType::I8, &[1], &[0.0]);
    let a = i64t(&[1], &[i64::MIN]);
    let b = i64t(&[1], &[-1]);
    assert_eq!(bin(BinaryOp::Div, &a, &b).data(), &TensorData::I64(vec![i64::MIN]));
}

#[test]
fn binary_integer_wrapping() {
    let a = t(DType::I8, &[2], &[127.0, -128.0]);
    let b = t(DType::I8, &[2], &[1.0, 1.0]);
    check_exact(&bin(BinaryOp::Add, &a, &b), DType::I8, &[2], &[-128.0, -127.0]);
    check_exact(&bin(BinaryOp::Sub, &a, &b), DType::I8, &[2], &[126.0, 127.0]);
    let u = t(DType::U8, &[2], &[0.0, 200.0]);
    let v = t(DType::U8, &[2], &[1.0, 100.0]);
    check_exact(&bin(BinaryOp::Sub, &u, &v), DType::U8, &[2], &[255.0, 100.0]);
    check_exact(&bin(BinaryOp::Add, &u, &v), DType::U8, &[2], &[1.0, 44.0]);
    check_exact(&bin(BinaryOp::Mul, &u, &v), DType::U8, &[2], &[0.0, 32.0]);
    let x = t(DType::I32, &[2], &[65536.0, 2147483647.0]);
    let y = t(DType::I32, &[2], &[65536.0, 2.0]);
    check_exact(&bin(BinaryOp::Mul, &x, &y), DType::I32, &[2], &[0.0, -2.0]);
    // i64 beyond 2^53 stays exact.
    let p = i64t(&[2], &[(1 << 53) + 1, i64::MAX]);
    let q = i64t(&[2], &[2, 1]);
    assert_eq!(
        bin(BinaryOp::Add, &p, &q).data(),
        &TensorData::I64(vec![(1 << 53) + 3, i64::MIN])
    );
    assert_eq!(
        bin(BinaryOp::Mul, &p, &q).data(),
        &TensorData::I64(vec![(1 << 54) + 2, i64::MAX])
    );
}

#[test]
fn binary_integer_pow() {
    let a = i64t(&[9], &[2, 3, -2, 2, 1, -1, -1, 5, -3]);
    let b = i64t(&[9], &[10, 0, 3, -1, -5, -3, -2, -2, 63]);
    assert_eq!(
        bin(BinaryOp::Pow, &a, &b).data(),
        &TensorData::I64(vec![1024, 1, -8, 0, 1, -1, 1, 0, 3i64.wrapping_pow(63).wrapping_neg()])
    );
    let a = t(DType::I8, &[2], &[2.0, 3.0]);
    let b = t(DType::I8, &[2], &[7.0, 5.0]);
    // 2^7 = 128 wraps to -128; 3^5 = 243 wraps to -13.
    check_exact(&bin(BinaryOp::Pow, &a, &b), DType::I8, &[2], &[-128.0, -13.0]);
    let a = t(DType::U8, &[1], &[2.0]);
    let b = t(DType::U8, &[1], &[8.0]);
    check_exact(&bin(BinaryOp::Pow, &a, &b), DType::U8, &[1], &[0.0]);
    let e = try_run(Op::Binary(BinaryOp::Pow), &[i64t(&[1], &[0]), i64t(&[1], &[-1])]).unwrap_err();
    assert!(node_error(e).1.contains("division by zero"));
}

#[test]
fn binary_comparisons() {
    let a = f32t(&[5], &[1.0, 2.0, 3.0, NAN, NAN]);
    let b = f32t(&[5], &[2.0, 2.0, 2.0, 1.0, NAN]);
    let cases: [(BinaryOp, [bool; 5]); 6] = [
        (BinaryOp::Eq, [false, true, false, false, false]),
        (BinaryOp::Ne, [true, false, true, true, true]),
        (BinaryOp::Lt, [true, false, false, false, false]),
        (BinaryOp::Le, [true, true, false, false, false]),
        (BinaryOp::Gt, [false, false, true, false, false]),
        (BinaryOp::Ge, [false, true, true, false, false]),
    ];
    for (op, expected) in cases {
        assert_eq!(bin(op, &a, &b), boolt(&[5], &expected), "{op:?} f32");
        let a16 = t(DType::BF16, &[5], &a.to_f64_vec());
        let b16 = t(DType::BF16, &[5], &b.to_f64_vec());
        assert_eq!(bin(op, &a16, &b16), boolt(&[5], &expected), "{op:?} bf16");
    }
    // Integers, exactly beyond 2^53.
    let p = i64t(&[3], &[(1 << 53) + 1, -5, 7]);
    let q = i64t(&[3], &[1 << 53, -5, 8]);
    assert_eq!(bin(BinaryOp::Gt, &p, &q), boolt(&[3], &[true, false, false]));
    assert_eq!(bin(BinaryOp::Eq, &p, &q), boolt(&[3], &[false, true, false]));
    let u = t(DType::U8, &[2], &[200.0, 3.0]);
    let v = t(DType::U8, &[2], &[100.0, 3.0]);
    assert_eq!(bin(BinaryOp::Gt, &u, &v), boolt(&[2], &[true, false]));
    // Bools: false < true.
    let x = boolt(&[4], &[false, false, true, true]);
    let y = boolt(&[4], &[false, true, false, true]);
    assert_eq!(bin(BinaryOp::Lt, &x, &y), boolt(&[4], &[false, true, false, false]));
    assert_eq!(bin(BinaryOp::Ge, &x, &y), boolt(&[4], &[true, false, true, true]));
    assert_eq!(bin(BinaryOp::Eq, &x, &y), boolt(&[4], &[true, false, false, true]));
    assert_eq!(bin(BinaryOp::Ne, &x, &y), boolt(&[4], &[false, true, true, false]));
    assert_eq!(bin(BinaryOp::Le, &x, &y), boolt(&[4], &[true, true, false, true]));
    assert_eq!(bin(BinaryOp::Gt, &x, &y), boolt(&[4], &[false, false, true, false]));
}

#[test]
fn binary_logical() {
    let x = boolt(&[4], &[false, false, true, true]);
    let y = boolt(&[4], &[false, true, false, true]);
    assert_eq!(bin(BinaryOp::And, &x, &y), boolt(&[4], &[false, false, false, true]));
    assert_eq!(bin(BinaryOp::Or, &x, &y), boolt(&[4], &[false, true, true, true]));
    assert_eq!(bin(BinaryOp::Xor, &x, &y), boolt(&[4], &[false, true, true, false]));
}

#[test]
fn binary_half_types_round_at_output() {
    // f16 has 11 significant bits: 2048 + 1 = 2049 rounds (tie) to even 2048; 2048 + 3 = 2051
    // rounds (tie) to 2052.
    let a = t(DType::F16, &[2], &[2048.0, 2048.0]);
    let b = t(DType::F16, &[2], &[1.0, 3.0]);
    check_exact(&bin(BinaryOp::Add, &a, &b), DType::F16, &[2], &[2048.0, 2052.0]);
    // bf16 has 8: 1 + 2^-9 stays 1; 1 + 2^-7 is representable.
    let a = t(DType::BF16, &[2], &[1.0, 1.0]);
    let b = t(DType::BF16, &[2], &[1.0 / 512.0, 1.0 / 128.0]);
    check_exact(&bin(BinaryOp::Add, &a, &b), DType::BF16, &[2], &[1.0, 1.0078125]);
    // Each op rounds its output: 60000 * 2 overflows f16.
    let a = t(DType::F16, &[1], &[60000.0]);
    let b = t(DType::F16, &[1], &[2.0]);
    check_exact(&bin(BinaryOp::Mul, &a, &b), DType::F16, &[1], &[INF]);
    // f16 division rounds the f32 quotient once: 1/3 -> 0.333251953125.
    let a = t(DType::F16, &[1], &[1.0]);
    let b = t(DType::F16, &[1], &[3.0]);
    check_exact(&bin(BinaryOp::Div, &a, &b), DType::F16, &[1], &[0.333251953125]);
}

// ---------------------------------------------------------------- select, cast

#[test]
fn select_picks_by_condition() {
    let c = boolt(&[2, 2], &[true, false, false, true]);
    let a = f32t(&[2, 2], &[1.0, 2.0, 3.0, 4.0]);
    let b = f32t(&[2, 2], &[-1.0, -2.0, -3.0, -4.0]);
    check_exact(
        &run(Op::Select, &[c.clone(), a, b]),
        DType::F32,
        &[2, 2],
        &[1.0, -2.0, -3.0, 4.0],
    );
    let a = i64t(&[2, 2], &[i64::MAX, 2, 3, 4]);
    let b = i64t(&[2, 2], &[5, 6, 7, i64::MIN]);
    assert_eq!(
        run(Op::Select, &[c.clone(), a, b]).data(),
        &TensorData::I64(vec![i64::MAX, 6, 7, 4])
    );
    let a = boolt(&[2, 2], &[true, true, true, true]);
    let b = boolt(&[2, 2], &[false, false, false, false]);
    assert_eq!(run(Op::Select, &[c.clone(), a, b]), c);
}

fn cast(x: &Tensor, to: DType) -> Tensor {
    run(Op::Cast { to }, std::slice::from_ref(x))
}

#[test]
fn cast_float_to_int_truncates_and_saturates() {
    let x = f32t(&[6], &[1.9, -1.9, NAN, 1e10, -1e10, -0.5]);
    check_exact(
        &cast(&x, DType::I32),
        DType::I32,
        &[6],
        &[1.0, -1.0, 0.0, 2147483647.0, -2147483648.0, 0.0],
    );
    check_exact(
        &cast(&x, DType::I8),
        DType::I8,
        &[6],
        &[1.0, -1.0, 0.0, 127.0, -128.0, 0.0],
    );
    check_exact(&cast(&x, DType::U8), DType::U8, &[6], &[1.0, 0.0, 0.0, 255.0, 0.0, 0.0]);
    let big = t(DType::F64, &[3], &[1e19, -1e19, 9007199254740993.0]);
    assert_eq!(
        cast(&big, DType::I64).data(),
        &TensorData::I64(vec![i64::MAX, i64::MIN, 9007199254740992])
    );
    let h = t(DType::F16, &[2], &[300.0, -2.75]);
    check_exact(&cast(&h, DType::I8), DType::I8, &[2], &[127.0, -2.0]);
    check_exact(&cast(&h, DType::U8), DType::U8, &[2], &[255.0, 0.0]);
}

#[test]
fn cast_int_to_int_wraps() {
    let x = t(DType::I32, &[4], &[200.0, -129.0, 127.0, 256.0]);
    check_exact(&cast(&x, DType::I8), DType::I8, &[4], &[-56.0, 127.0, 127.0, 0.0]);
    check_exact(&cast(&x, DType::U8), DType::U8, &[4], &[200.0, 127.0, 127.0, 0.0]);
    let big = i64t(&[3], &[(1 << 32) + 5, (1 << 53) + 1, -1]);
    check_exact(&cast(&big, DType::I32), DType::I32, &[3], &[5.0, 1.0, -1.0]);
    check_exact(&cast(&big, DType::U8), DType::U8, &[3], &[5.0, 1.0, 255.0]);
    let u = t(DType::U8, &[2], &[255.0, 128.0]);
    check_exact(&cast(&u, DType::I8), DType::I8, &[2], &[-1.0, -128.0]);
    assert_eq!(cast(&u, DType::I64).data(), &TensorData::I64(vec![255, 128]));
    // i64 -> i64 is the identity, even beyond 2^53.
    assert_eq!(cast(&big, DType::I64), big);
}

#[test]
fn cast_to_and_from_bool() {
    let x = f32t(&[4], &[0.0, -0.0, NAN, 2.0]);
    assert_eq!(cast(&x, DType::Bool), boolt(&[4], &[false, false, true, true]));
    let i = t(DType::I32, &[3], &[0.0, -3.0, 1.0]);
    assert_eq!(cast(&i, DType::Bool), boolt(&[3], &[false, true, true]));
    let b = boolt(&[2], &[true, false]);
    check_exact(&cast(&b, DType::F32), DType::F32, &[2], &[1.0, 0.0]);
    check_exact(&cast(&b, DType::BF16), DType::BF16, &[2], &[1.0, 0.0]);
    check_exact(&cast(&b, DType::U8), DType::U8, &[2], &[1.0, 0.0]);
    assert_eq!(cast(&b, DType::I64).data(), &TensorData::I64(vec![1, 0]));
}

#[test]
fn cast_between_floats_rounds_once() {
    // 1 + 2^-11 + 2^-40 rounds to 1 + 2^-10 in f16; through f32 it would become the tie
    // 1 + 2^-11 and round to 1.
    let x = t(DType::F64, &[1], &[1.0 + 2f64.powi(-11) + 2f64.powi(-40)]);
    check_exact(&cast(&x, DType::F16), DType::F16, &[1], &[1.0009765625]);
    let y = t(DType::F64, &[1], &[1.0 + 2f64.powi(-8) + 2f64.powi(-40)]);
    check_exact(&cast(&y, DType::BF16), DType::BF16, &[1], &[1.0078125]);
    // f32 -> bf16 ties to even: 1 + 2^-8 -> 1, 1 + 3 * 2^-8 -> 1 + 2^-6.
    let z = f32t(&[3], &[1.00390625, 1.01171875, 3.4e38]);
    check_exact(&cast(&z, DType::BF16), DType::BF16, &[3], &[1.0, 1.015625, INF]);
    // f32 -> f16: 65519 rounds to 65504, 65520 overflows.
    let w = f32t(&[3], &[65519.0, 65520.0, 1e-8]);
    check_exact(&cast(&w, DType::F16), DType::F16, &[3], &[65504.0, INF, 0.0]);
    // f16 -> bf16 and back.
    let h = t(DType::F16, &[2], &[1.0009765625, 3.0]);
    check_exact(&cast(&h, DType::BF16), DType::BF16, &[2], &[1.0, 3.0]);
    check_exact(&cast(&h, DType::F32), DType::F32, &[2], &[1.0009765625, 3.0]);
    check_exact(&cast(&h, DType::F64), DType::F64, &[2], &[1.0009765625, 3.0]);
    let d = t(DType::F64, &[2], &[0.1, 1e40]);
    check_exact(&cast(&d, DType::F32), DType::F32, &[2], &[0.1f32 as f64, INF]);
    let n = f32t(&[1], &[NAN]);
    assert!(cast(&n, DType::F16).to_f64_vec()[0].is_nan());
}

#[test]
fn cast_int_to_float() {
    let x = i64t(&[3], &[(1 << 24) + 1, (1 << 53) + 1, -7]);
    check_exact(
        &cast(&x, DType::F32),
        DType::F32,
        &[3],
        &[16777216.0, 9007199254740992.0, -7.0],
    );
    check_exact(
        &cast(&x, DType::F64),
        DType::F64,
        &[3],
        &[16777217.0, 9007199254740992.0, -7.0],
    );
    // 2^60 + 2^52 + 1 is above the bf16 tie 2^60 + 2^52: rounds up (through f64 it would
    // become the tie and round down to 2^60).
    let y = i64t(&[2], &[(1 << 60) + (1 << 52) + 1, 70000]);
    check_exact(
        &cast(&y, DType::BF16),
        DType::BF16,
        &[2],
        &[2f64.powi(60) + 2f64.powi(53), 70144.0],
    );
    check_exact(&cast(&y, DType::F16), DType::F16, &[2], &[INF, INF]);
    let i = t(DType::I8, &[2], &[-128.0, 127.0]);
    check_exact(&cast(&i, DType::F16), DType::F16, &[2], &[-128.0, 127.0]);
    let u = t(DType::U8, &[1], &[255.0]);
    check_exact(&cast(&u, DType::F32), DType::F32, &[1], &[255.0]);
    check_exact(
        &cast(&t(DType::I32, &[1], &[2049.0]), DType::F16),
        DType::F16,
        &[1],
        &[2048.0],
    );
}

// ---------------------------------------------------------------- reductions

fn reduce(op: ReduceOp, x: &Tensor, axes: &[usize], keepdims: bool) -> Tensor {
    run(
        Op::Reduce {
            op,
            axes: axes.to_vec(),
            keepdims,
        },
        std::slice::from_ref(x),
    )
}

#[test]
fn reduce_every_op_2d() {
    let x = f32t(&[2, 3], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
    check_exact(
        &reduce(ReduceOp::Sum, &x, &[0], false),
        DType::F32,
        &[3],
        &[5.0, 7.0, 9.0],
    );
    check_exact(
        &reduce(ReduceOp::Sum, &x, &[1], true),
        DType::F32,
        &[2, 1],
        &[6.0, 15.0],
    );
    check_exact(&reduce(ReduceOp::Sum, &x, &[0, 1], false), DType::F32, &[], &[21.0]);
    check_exact(&reduce(ReduceOp::Sum, &x, &[0, 1], true), DType::F32, &[1, 1], &[21.0]);
    check_exact(
        &reduce(ReduceOp::Sum, &x, &[], false),
        DType::F32,
        &[2, 3],
        &x.to_f64_vec(),
    );
    check_exact(&reduce(ReduceOp::Mean, &x, &[1], false), DType::F32, &[2], &[2.0, 5.0]);
    check_exact(
        &reduce(ReduceOp::Mean, &x, &[0], true),
        DType::F32,
        &[1, 3],
        &[2.5, 3.5, 4.5],
    );
    check_exact(&reduce(ReduceOp::Max, &x, &[1], false), DType::F32, &[2], &[3.0, 6.0]);
    check_exact(&reduce(ReduceOp::Min, &x, &[1], false), DType::F32, &[2], &[1.0, 4.0]);
    check_exact(
        &reduce(ReduceOp::Prod, &x, &[1], false),
        DType::F32,
        &[2],
        &[6.0, 120.0],
    );
    check_exact(
        &reduce(ReduceOp::Prod, &x, &[0], false),
        DType::F32,
        &[3],
        &[4.0, 10.0, 18.0],
    );
    let x64 = t(DType::F64, &[2, 3], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
    check_exact(&reduce(ReduceOp::Mean, &x64, &[0, 1], false), DType::F64, &[], &[3.5]);
}

#[test]
fn reduce_3d_multiple_axes() {
    // x[i, j, k] = 4i + 2j + k.
    let x = f32t(&[2, 2, 2], &[0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0]);
    check_exact(
        &reduce(ReduceOp::Sum, &x, &[0, 2], true),
        DType::F32,
        &[1, 2, 1],
        &[10.0, 18.0],
    );
    check_exact(
        &reduce(ReduceOp::Sum, &x, &[0, 2], false),
        DType::F32,
        &[2],
        &[10.0, 18.0],
    );
    check_exact(
        &reduce(ReduceOp::Max, &x, &[1, 2], false),
        DType::F32,
        &[2],
        &[3.0, 7.0],
    );
    check_exact(
        &reduce(ReduceOp::Min, &x, &[0, 1], true),
        DType::F32,
        &[1, 1, 2],
        &[0.0, 1.0],
    );
    check_exact(
        &reduce(ReduceOp::Mean, &x, &[2], false),
        DType::F32,
        &[2, 2],
        &[0.5, 2.5, 4.5, 6.5],
    );
}

#[test]
fn reduce_max_min_propagate_nan() {
    let x = f32t(&[2, 3], &[1.0, NAN, 3.0, -INF, -1.0, -2.0]);
    check_exact(&reduce(ReduceOp::Max, &x, &[1], false), DType::F32, &[2], &[NAN, -1.0]);
    check_exact(&reduce(ReduceOp::Min, &x, &[1], false), DType::F32, &[2], &[NAN, -INF]);
    check_exact(&reduce(ReduceOp::Sum, &x, &[1], false), DType::F32, &[2], &[NAN, -INF]);
    // NaN in the first position too.
    let y = f32t(&[3], &[NAN, 5.0, 1.0]);
    check_exact(&reduce(ReduceOp::Max, &y, &[0], false), DType::F32, &[], &[NAN]);
    check_exact(&reduce(ReduceOp::Min, &y, &[0], false), DType::F32, &[], &[NAN]);
}

#[test]
fn reduce_integers() {
    let x = t(DType::I32, &[2, 3], &[1.0, 2.0, 4.0, -7.0, 0.0, 0.0]);
    check_exact(&reduce(ReduceOp::Mean, &x, &[1], false), DType::I32, &[2], &[2.0, -2.0]);
    check_exact(&reduce(ReduceOp::Sum, &x, &[1], false), DType::I32, &[2], &[7.0, -7.0]);
    check_exact(
        &reduce(ReduceOp::Max, &x, &[0], false),
        DType::I32,
        &[3],
        &[1.0, 2.0, 4.0],
    );
    check_exact(
        &reduce(ReduceOp::Min, &x, &[0], false),
        DType::I32,
        &[3],
        &[-7.0, 0.0, 0.0],
    );
    check_exact(&reduce(ReduceOp::Prod, &x, &[1], false), DType::I32, &[2], &[8.0, 0.0]);
    // -7 / 2 truncates to -3.
    let y = t(DType::I64, &[2], &[-7.0, 0.0]);
    check_exact(&reduce(ReduceOp::Mean, &y, &[0], false), DType::I64, &[], &[-3.0]);
    // Wrapping in the narrow type.
    let z = t(DType::I8, &[2], &[100.0, 100.0]);
    check_exact(&reduce(ReduceOp::Sum, &z, &[0], false), DType::I8, &[], &[-56.0]);
    let u = t(DType::U8, &[3], &[200.0, 100.0, 3.0]);
    check_exact(&reduce(ReduceOp::Sum, &u, &[0], false), DType::U8, &[], &[47.0]);
    check_exact(&reduce(ReduceOp::Mean, &u, &[0], false), DType::U8, &[], &[101.0]);
    let big = i64t(&[2], &[(1 << 53) + 1, 2]);
    assert_eq!(
        reduce(ReduceOp::Sum, &big, &[0], false).data(),
        &TensorData::I64(vec![(1 << 53) + 3])
    );
}

#[test]
fn reduce_over_zero_elements() {
    let x = f32t(&[2, 0], &[]);
    check_exact(&reduce(ReduceOp::Sum, &x, &[1], false), DType::F32, &[2], &[0.0, 0.0]);
    check_exact(&reduce(ReduceOp::Prod, &x, &[1], false), DType::F32, &[2], &[1.0, 1.0]);
    check_exact(&reduce(ReduceOp::Max, &x, &[1], false), DType::F32, &[2], &[-INF, -INF]);
    check_exact(&reduce(ReduceOp::Min, &x, &[1], true), DType::F32, &[2, 1], &[INF, INF]);
    check_exact(&reduce(ReduceOp::Mean, &x, &[1], false), DType::F32, &[2], &[NAN, NAN]);
    check_exact(&reduce(ReduceOp::Sum, &x, &[0], false), DType::F32, &[0], &[]);
    let i = t(DType::I8, &[0, 2], &[]);
    check_exact(
        &reduce(ReduceOp::Max, &i, &[0], false),
        DType::I8,
        &[2],
        &[-128.0, -128.0],
    );
    check_exact(
        &reduce(ReduceOp::Min, &i, &[0], false),
        DType::I8,
        &[2],
        &[127.0, 127.0],
    );
    check_exact(&reduce(ReduceOp::Sum, &i, &[0], false), DType::I8, &[2], &[0.0, 0.0]);
    check_exact(&reduce(ReduceOp::Prod, &i, &[0], false), DType::I8, &[2], &[1.0, 1.0]);
    let u = t(DType::U8, &[0], &[]);
    check_exact(&reduce(ReduceOp::Min, &u, &[0], false), DType::U8, &[], &[255.0]);
    let e = try_run(
        Op::Reduce {
            op: ReduceOp::Mean,
            axes: vec![0],
            keepdims: false,
        },
        &[i],
    )
    .unwrap_err();
    assert!(node_error(e).1.contains("zero elements"));
}

#[test]
fn reduce_half_types_accumulate_in_f32() {
    // In f16 steps 2048 + 1 + 1 would stay 2048; accumulated in f32 it is 2050.
    let x = t(DType::F16, &[3], &[2048.0, 1.0, 1.0]);
    check_exact(&reduce(ReduceOp::Sum, &x, &[0], false), DType::F16, &[], &[2050.0]);
    // bf16: 256 + 1 + 1 = 258 is representable (bf16 step at 256 is 2).
    let y = t(DType::BF16, &[3], &[256.0, 1.0, 1.0]);
    check_exact(&reduce(ReduceOp::Sum, &y, &[0], false), DType::BF16, &[], &[258.0]);
    check_exact(&reduce(ReduceOp::Mean, &y, &[0], false), DType::BF16, &[], &[86.0]);
}

// ---------------------------------------------------------------- arg reductions

fn arg(op: ArgReduceOp, x: &Tensor, axis: usize, keepdims: bool) -> Tensor {
    run(Op::ArgReduce { op, axis, keepdims }, std::slice::from_ref(x))
}

#[test]
fn argmax_argmin_first_extreme_and_nan() {
    let x = f32t(&[2, 3], &[1.0, 3.0, 3.0, 2.0, NAN, 5.0]);
    assert_eq!(arg(ArgReduceOp::ArgMax, &x, 1, false), i64t(&[2], &[1, 1]));
    assert_eq!(arg(ArgReduceOp::ArgMin, &x, 1, false), i64t(&[2], &[0, 1]));
    assert_eq!(arg(ArgReduceOp::ArgMax, &x, 1, true), i64t(&[2, 1], &[1, 1]));
    assert_eq!(arg(ArgReduceOp::ArgMax, &x, 0, false), i64t(&[3], &[1, 1, 1]));
    assert_eq!(arg(ArgReduceOp::ArgMin, &x, 0, true), i64t(&[1, 3], &[0, 1, 0]));
    // First NaN wins.
    let y = f32t(&[4], &[NAN, 9.0, NAN, -1.0]);
    assert_eq!(arg(ArgReduceOp::ArgMax, &y, 0, false), i64t(&[], &[0]));
    let z = f32t(&[4], &[0.0, 9.0, NAN, NAN]);
    assert_eq!(arg(ArgReduceOp::ArgMin, &z, 0, false), i64t(&[], &[2]));
    let i = t(DType::I32, &[2, 3], &[5.0, -1.0, 5.0, -1.0, -1.0, 0.0]);
    assert_eq!(arg(ArgReduceOp::ArgMax, &i, 1, false), i64t(&[2], &[0, 2]));
    assert_eq!(arg(ArgReduceOp::ArgMin, &i, 1, false), i64t(&[2], &[1, 0]));
    // 3-D, middle axis: x[i, j, k] = values below.
    let w = t(DType::F16, &[2, 2, 2], &[1.0, 8.0, 3.0, 2.0, 0.0, -1.0, 0.0, -2.0]);
    assert_eq!(arg(ArgReduceOp::ArgMax, &w, 1, false), i64t(&[2, 2], &[1, 0, 0, 0]));
    assert_eq!(arg(ArgReduceOp::ArgMin, &w, 1, false), i64t(&[2, 2], &[0, 1, 0, 1]));
}

// ---------------------------------------------------------------- matmul

#[test]
fn matmul_2d() {
    let a = f32t(&[2, 3], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
    let b = f32t(&[3, 2], &[7.0, 8.0, 9.0, 10.0, 11.0, 12.0]);
    check_exact(
        &run(Op::MatMul, &[a, b]),
        DType::F32,
        &[2, 2],
        &[58.0, 64.0, 139.0, 154.0],
    );
    let a = t(DType::F64, &[1, 2], &[0.5, -1.0]);
    let b = t(DType::F64, &[2, 3], &[2.0, 4.0, 6.0, 1.0, 1.0, 1.0]);
    check_exact(&run(Op::MatMul, &[a, b]), DType::F64, &[1, 3], &[0.0, 1.0, 2.0]);
    // K = 0 gives zeros.
    let a = f32t(&[2, 0], &[]);
    let b = f32t(&[0, 2], &[]);
    check_exact(&run(Op::MatMul, &[a, b]), DType::F32, &[2, 2], &[0.0; 4]);
}

#[test]
fn matmul_batched_and_broadcast_batch() {
    let a = f32t(&[2, 2, 2], &[1.0, 2.0, 3.0, 4.0, 0.0, 1.0, 1.0, 0.0]);
    let b = f32t(&[2, 2, 1], &[1.0, 1.0, 2.0, 3.0]);
    check_exact(&run(Op::MatMul, &[a, b]), DType::F32, &[2, 2, 1], &[3.0, 7.0, 3.0, 2.0]);
    // a: [2, 1, 2, 2] (identity, 2 * identity); b: [3, 2, 2] -> [2, 3, 2, 2].
    let a = f32t(&[2, 1, 2, 2], &[1.0, 0.0, 0.0, 1.0, 2.0, 0.0, 0.0, 2.0]);
    let b = f32t(
        &[3, 2, 2],
        &[1.0, 2.0, 3.0, 4.0, 0.0, 1.0, 1.0, 0.0, 5.0, 5.0, 5.0, 5.0],
    );
    check_exact(
        &run(Op::MatMul, &[a, b]),
        DType::F32,
        &[2, 3, 2, 2],
        &[
            1.0, 2.0, 3.0, 4.0, 0.0, 1.0, 1.0, 0.0, 5.0, 5.0, 5.0, 5.0, 2.0, 4.0, 6.0, 8.0, 0.0, 2.0, 2.0, 0.0, 10.0,
            10.0, 10.0, 10.0,
        ],
    );
    // Rank-2 operand against a batched one.
    let a = f32t(&[1, 2], &[1.0, 1.0]);
    let b = f32t(&[2, 2, 1], &[1.0, 2.0, 3.0, 4.0]);
    check_exact(&run(Op::MatMul, &[a, b]), DType::F32, &[2, 1, 1], &[3.0, 7.0]);
}

#[test]
fn matmul_integers_and_half_types() {
    let a = t(DType::I8, &[1, 2], &[100.0, 1.0]);
    let b = t(DType::I8, &[2, 1], &[2.0, 3.0]);
    check_exact(&run(Op::MatMul, &[a, b]), DType::I8, &[1, 1], &[-53.0]);
    let a = i64t(&[1, 2], &[1 << 40, 3]);
    let b = i64t(&[2, 1], &[1 << 20, 1]);
    assert_eq!(run(Op::MatMul, &[a, b]).data(), &TensorData::I64(vec![(1 << 60) + 3]));
    // f16: accumulate in f32, round once: 2048 + 1 + 1 = 2050.
    let a = t(DType::F16, &[1, 3], &[2048.0, 1.0, 1.0]);
    let b = t(DType::F16, &[3, 1], &[1.0, 1.0, 1.0]);
    check_exact(&run(Op::MatMul, &[a, b]), DType::F16, &[1, 1], &[2050.0]);
    let a = t(DType::BF16, &[1, 2], &[1.0, 1.0]);
    let b = t(DType::BF16, &[2, 1], &[1.0, 1.0 / 512.0]);
    check_exact(&run(Op::MatMul, &[a, b]), DType::BF16, &[1, 1], &[1.0]);
}

// ---------------------------------------------------------------- layout ops

#[test]
fn broadcast_right_aligned() {
    let x = f32t(&[3], &[1.0, 2.0, 3.0]);
    let y = run(
        Op::Broadcast {
            shape: Shape::new([2, 3]),
        },
        &[x],
    );
    check_exact(&y, DType::F32, &[2, 3], &[1.0, 2.0, 3.0, 1.0, 2.0, 3.0]);
    let c = t(DType::I32, &[2, 1], &[7.0, 8.0]);
    let y = run(
        Op::Broadcast {
            shape: Shape::new([2, 3]),
        },
        &[c],
    );
    check_exact(&y, DType::I32, &[2, 3], &[7.0, 7.0, 7.0, 8.0, 8.0, 8.0]);
    let s = boolt(&[], &[true]);
    let y = run(
        Op::Broadcast {
            shape: Shape::new([2, 2]),
        },
        &[s],
    );
    assert_eq!(y, boolt(&[2, 2], &[true; 4]));
    let r = f32t(&[1, 3], &[1.0, 2.0, 3.0]);
    let y = run(
        Op::Broadcast {
            shape: Shape::new([2, 2, 3]),
        },
        &[r],
    );
    check_exact(
        &y,
        DType::F32,
        &[2, 2, 3],
        &[1.0, 2.0, 3.0, 1.0, 2.0, 3.0, 1.0, 2.0, 3.0, 1.0, 2.0, 3.0],
    );
}

#[test]
fn reshape_keeps_data() {
    let x = t(DType::BF16, &[2, 3], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
    let y = run(
        Op::Reshape {
            shape: Shape::new([3, 1, 2]),
        },
        &[x],
    );
    check_exact(&y, DType::BF16, &[3, 1, 2], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
}

#[test]
fn transpose_permutes_axes() {
    let x = f32t(&[2, 3], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
    let y = run(Op::Transpose { perm: vec![1, 0] }, &[x]);
    check_exact(&y, DType::F32, &[3, 2], &[1.0, 4.0, 2.0, 5.0, 3.0, 6.0]);
    // x[i, j, k] = 12i + 4j + k; out[k, i, j] = x[i, j, k].
    let x = i64t(&[2, 3, 4], &(0..24).collect::<Vec<_>>());
    let y = run(Op::Transpose { perm: vec![2, 0, 1] }, &[x]);
    assert_eq!(
        y,
        i64t(
            &[4, 2, 3],
            &[0, 4, 8, 12, 16, 20, 1, 5, 9, 13, 17, 21, 2, 6, 10, 14, 18, 22, 3, 7, 11, 15, 19, 23]
        )
    );
}

fn sl(start: i64, end: i64, step: i64) -> SliceRange {
    SliceRange { start, end, step }
}

#[test]
fn slice_steps_negative_indices_and_negative_steps() {
    let x = i64t(&[10], &(0..10).collect::<Vec<_>>());
    let s = |r: SliceRange| run(Op::Slice { ranges: vec![r] }, std::slice::from_ref(&x));
    assert_eq!(s(sl(1, 8, 3)), i64t(&[3], &[1, 4, 7]));
    assert_eq!(s(sl(-3, i64::MAX, 1)), i64t(&[3], &[7, 8, 9]));
    assert_eq!(s(sl(-100, 2, 1)), i64t(&[2], &[0, 1]));
    assert_eq!(s(sl(-1, i64::MIN, -1)), i64t(&[10], &[9, 8, 7, 6, 5, 4, 3, 2, 1, 0]));
    assert_eq!(s(sl(8, 1, -2)), i64t(&[4], &[8, 6, 4, 2]));
    assert_eq!(s(sl(100, -8, -3)), i64t(&[3], &[9, 6, 3]));
    assert_eq!(s(sl(5, 2, 1)), i64t(&[0], &[]));
    assert_eq!(s(sl(2, 5, -1)), i64t(&[0], &[]));
    // 2-D: rows reversed, every other column.
    let m = f32t(&[3, 4], &(0..12).map(|v| v as f64).collect::<Vec<_>>());
    let y = run(
        Op::Slice {
            ranges: vec![sl(-1, i64::MIN, -1), sl(1, i64::MAX, 2)],
        },
        &[m],
    );
    check_exact(&y, DType::F32, &[3, 2], &[9.0, 11.0, 5.0, 7.0, 1.0, 3.0]);
}

#[test]
fn concat_along_axes() {
    let a = f32t(&[2, 2], &[1.0, 2.0, 3.0, 4.0]);
    let b = f32t(&[2, 1], &[5.0, 6.0]);
    let y = run(Op::Concat { axis: 1 }, &[a.clone(), b]);
    check_exact(&y, DType::F32, &[2, 3], &[1.0, 2.0, 5.0, 3.0, 4.0, 6.0]);
    let c = f32t(&[1, 2], &[7.0, 8.0]);
    let y = run(Op::Concat { axis: 0 }, &[a.clone(), c, a.clone()]);
    check_exact(
        &y,
        DType::F32,
        &[5, 2],
        &[1.0, 2.0, 3.0, 4.0, 7.0, 8.0, 1.0, 2.0, 3.0, 4.0],
    );
    let y = run(Op::Concat { axis: 0 }, std::slice::from_ref(&a));
    assert_eq!(y, a);
    let p = i64t(&[1, 2, 1], &[1, 2]);
    let q = i64t(&[1, 2, 2], &[3, 4, 5, 6]);
    assert_eq!(
        run(Op::Concat { axis: 2 }, &[p, q]),
        i64t(&[1, 2, 3], &[1, 3, 4, 2, 5, 6])
    );
}

#[test]
fn gather_onnx_semantics() {
    let data = f32t(&[3, 2], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
    let idx = i64t(&[3], &[2, -1, 0]);
    let y = run(Op::Gather { axis: 0 }, &[data.clone(), idx]);
    check_exact(&y, DType::F32, &[3, 2], &[5.0, 6.0, 5.0, 6.0, 1.0, 2.0]);
    let idx = t(DType::I32, &[2, 2], &[1.0, 0.0, -2.0, 1.0]);
    let y = run(Op::Gather { axis: 1 }, &[data.clone(), idx]);
    check_exact(
        &y,
        DType::F32,
        &[3, 2, 2],
        &[2.0, 1.0, 1.0, 2.0, 4.0, 3.0, 3.0, 4.0, 6.0, 5.0, 5.0, 6.0],
    );
    // Scalar index drops the axis.
    let y = run(Op::Gather { axis: 0 }, &[data.clone(), i64t(&[], &[-3])]);
    check_exact(&y, DType::F32, &[2], &[1.0, 2.0]);
    for bad in [3, -4] {
        let e = try_run(Op::Gather { axis: 0 }, &[data.clone(), i64t(&[1], &[bad])]).unwrap_err();
        let shown = e.to_string();
        let (op, message) = node_error(e);
        assert_eq!(op, "gather");
        assert!(message.contains("out of range"), "{message}");
        assert!(shown.contains(&bad.to_string()), "{shown}");
    }
}

fn pad(x: &Tensor, pads: &[(i64, i64)], mode: PadMode, value: f64) -> Tensor {
    run(
        Op::Pad {
            pads: pads.to_vec(),
            mode,
            value,
        },
        std::slice::from_ref(x),
    )
}

#[test]
fn pad_every_mode() {
    let x = f32t(&[3], &[1.0, 2.0, 3.0]);
    check_exact(
        &pad(&x, &[(2, 1)], PadMode::Constant, 9.0),
        DType::F32,
        &[6],
        &[9.0, 9.0, 1.0, 2.0, 3.0, 9.0],
    );
    check_exact(
        &pad(&x, &[(2, 2)], PadMode::Reflect, 0.0),
        DType::F32,
        &[7],
        &[3.0, 2.0, 1.0, 2.0, 3.0, 2.0, 1.0],
    );
    check_exact(
        &pad(&x, &[(2, 2)], PadMode::Edge, 0.0),
        DType::F32,
        &[7],
        &[1.0, 1.0, 1.0, 2.0, 3.0, 3.0, 3.0],
    );
    // 2-D constant pad.
    let m = t(DType::I32, &[2, 2], &[1.0, 2.0, 3.0, 4.0]);
    check_exact(
        &pad(&m, &[(1, 0), (0, 1)], PadMode::Constant, -1.0),
        DType::I32,
        &[3, 3],
        &[-1.0, -1.0, -1.0, 1.0, 2.0, -1.0, 3.0, 4.0, -1.0],
    );
    // The value is cast to the dtype: 2.7 -> 2 in i32.
    check_exact(
        &pad(&m, &[(0, 0), (1, 0)], PadMode::Constant, 2.7),
        DType::I32,
        &[2, 3],
        &[2.0, 1.0, 2.0, 2.0, 3.0, 4.0],
    );
    check_exact(
        &pad(&m, &[(1, 1), (1, 1)], PadMode::Reflect, 0.0),
        DType::I32,
        &[4, 4],
        &[
            4.0, 3.0, 4.0, 3.0, 2.0, 1.0, 2.0, 1.0, 4.0, 3.0, 4.0, 3.0, 2.0, 1.0, 2.0, 1.0,
        ],
    );
    check_exact(
        &pad(&m, &[(0, 1), (2, 0)], PadMode::Edge, 0.0),
        DType::I32,
        &[3, 4],
        &[1.0, 1.0, 1.0, 2.0, 3.0, 3.0, 3.0, 4.0, 3.0, 3.0, 3.0, 4.0],
    );
}

#[test]
fn pad_negative_crops() {
    let x = f32t(&[4], &[1.0, 2.0, 3.0, 4.0]);
    check_exact(
        &pad(&x, &[(-1, 1)], PadMode::Constant, 0.0),
        DType::F32,
        &[4],
        &[2.0, 3.0, 4.0, 0.0],
    );
    check_exact(&pad(&x, &[(-1, -2)], PadMode::Constant, 0.0), DType::F32, &[1], &[2.0]);
    check_exact(&pad(&x, &[(-4, 0)], PadMode::Edge, 0.0), DType::F32, &[0], &[]);
    check_exact(
        &pad(&x, &[(2, -1)], PadMode::Reflect, 0.0),
        DType::F32,
        &[5],
        &[3.0, 2.0, 1.0, 2.0, 3.0],
    );
    check_exact(
        &pad(&x, &[(-2, 2)], PadMode::Edge, 0.0),
        DType::F32,
        &[4],
        &[3.0, 4.0, 4.0, 4.0],
    );
    check_exact(
        &pad(&x, &[(-2, 2)], PadMode::Reflect, 0.0),
        DType::F32,
        &[4],
        &[3.0, 4.0, 3.0, 2.0],
    );
    let b = boolt(&[2], &[true, true]);
    assert_eq!(pad(&b, &[(1, -1)], PadMode::Constant, 0.0), boolt(&[2], &[false, true]));
}

#[test]
fn iota_counts_along_axis() {
    let op = |dtype, dims: &[usize], axis| Op::Iota {
        ty: TensorType::new(dtype, dims.to_vec()),
        axis,
    };
    assert_eq!(run(op(DType::I64, &[2, 3], 1), &[]), i64t(&[2, 3], &[0, 1, 2, 0, 1, 2]));
    check_exact(
        &run(op(DType::F32, &[2, 3], 0), &[]),
        DType::F32,
        &[2, 3],
        &[0.0, 0.0, 0.0, 1.0, 1.0, 1.0],
    );
    check_exact(
        &run(op(DType::BF16, &[4], 0), &[]),
        DType::BF16,
        &[4],
        &[0.0, 1.0, 2.0, 3.0],
    );
    check_exact(
        &run(op(DType::U8, &[1, 2, 2], 2), &[]),
        DType::U8,
        &[1, 2, 2],
        &[0.0, 1.0, 0.0, 1.0],
    );
    // i8 indices beyond 127 wrap like a cast from i64: 128 -> -128.
    let v = run(op(DType::I8, &[130], 0), &[]).to_f64_vec();
    assert_eq!(&v[126..], &[126.0, 127.0, -128.0, -127.0]);
}

#[test]
fn constant_is_its_value() {
    let value = t(DType::F16, &[2], &[1.5, -0.25]);
    let y = run(Op::Constant { value: value.clone() }, &[]);
    assert_eq!(y, value);
}

#[test]
fn slice_with_huge_steps() {
    let x = i64t(&[2, 10], &(0..20).collect::<Vec<_>>());
    let y = run(
        Op::Slice {
            ranges: vec![sl(0, i64::MAX, i64::MAX), sl(3, i64::MAX, i64::MAX)],
        },
        std::slice::from_ref(&x),
    );
    assert_eq!(y, i64t(&[1, 1], &[3]));
    let y = run(
        Op::Slice {
            ranges: vec![sl(-1, i64::MIN, i64::MIN), sl(-1, i64::MIN, i64::MIN)],
        },
        &[x],
    );
    assert_eq!(y, i64t(&[1, 1], &[19]));
}
