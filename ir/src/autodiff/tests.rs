//! Every VJP rule against central finite differences, in f64, on random inputs.
//!
//! Each case builds `y = f(inputs)` in f64; the loss is `sum(y * r)` for a fixed
//! random `r` (so every output element's gradient is exercised with a different
//! weight); the analytical gradient of each input (through [`gradients`] and the
//! interpreter) must equal `(L(x + h e_i) - L(x - h e_i)) / 2h` for every element.

use std::collections::HashMap;

use super::gradients;
use crate::nn::{gelu, layer_norm, log_softmax, rms_norm, softmax, GeluApprox};
use crate::op::SliceRange;
use crate::{interpret, DType, GraphBuilder, Op, PadMode, Shape, Tensor, TensorData, TensorType, Value};

/// An input: name, shape, and how to draw its values (`None`: uniform in [-1, 1)).
struct In {
    name: &'static str,
    dims: Vec<usize>,
    values: Option<Vec<f64>>,
}

fn inp(name: &'static str, dims: &[usize]) -> In {
    In {
        name,
        dims: dims.to_vec(),
        values: None,
    }
}

/// Values in (lo, hi), deterministic.
fn inp_in(name: &'static str, dims: &[usize], lo: f64, hi: f64, seed: u64) -> In {
    let n: usize = dims.iter().product();
    let mut rng = crate::Rng::new(seed);
    In {
        name,
        dims: dims.to_vec(),
        values: Some((0..n).map(|_| rng.uniform(lo, hi)).collect()),
    }
}

fn check(label: &str, ins: Vec<In>, f: impl for<'b> Fn(&'b GraphBuilder, &[Value<'b>]) -> Value<'b>) {
    check_with(label, ins, 1e-6, f)
}

fn check_with(label: &str, ins: Vec<In>, rtol: f64, f: impl for<'b> Fn(&'b GraphBuilder, &[Value<'b>]) -> Value<'b>) {
    let b = GraphBuilder::new();
    let xs: Vec<Value> = ins
        .iter()
        .map(|i| b.input(i.name, DType::F64, i.dims.clone()))
        .collect();
    let y = f(&b, &xs);
    let r = b.constant(Tensor::random(&TensorType::new(DType::F64, y.shape()), 99));
    let loss = (y * r).sum(&(0..y.rank() as i64).collect::<Vec<_>>(), false);
    b.output("loss", loss);
    let wrt: Vec<_> = xs.iter().map(|x| x.id()).collect();
    let grads = gradients(&b, loss.id(), &wrt).unwrap_or_else(|e| panic!("{label}: {e}"));
    for (i, g) in grads.grads.iter().enumerate() {
        let v = b.value(*g).unwrap();
        b.output(&format!("d_{}", ins[i].name), v);
    }
    let graph = b.finish().unwrap_or_else(|e| panic!("{label}: {e}"));

    let mut values: HashMap<String, Tensor> = HashMap::new();
    for (k, i) in ins.iter().enumerate() {
        let ty = TensorType::new(DType::F64, i.dims.clone());
        let t = match &i.values {
            Some(v) => Tensor::from_f64(DType::F64, i.dims.clone(), v).unwrap(),
            None => Tensor::random(&ty, 1 + k as u64),
        };
        values.insert(i.name.to_string(), t);
    }
    let out = interpret(&graph, &values).unwrap_or_else(|e| panic!("{label}: {e}"));
    let loss_of = |vals: &HashMap<String, Tensor>| -> f64 {
        let o = interpret(&graph, vals).unwrap();
        o[0].1.to_f64_vec()[0]
    };
    let h = 1e-6;
    for (k, i) in ins.iter().enumerate() {
        let analytic = out[1 + k].1.to_f64_vec();
        let base = values[i.name].to_f64_vec();
        let mut numeric = Vec::with_capacity(base.len());
        for e in 0..base.len() {
            let mut vals = values.clone();
            let mut plus = base.clone();
            plus[e] += h;
            vals.insert(
                i.name.into(),
                Tensor::from_f64(DType::F64, i.dims.clone(), &plus).unwrap(),
            );
            let lp = loss_of(&vals);
            let mut minus = base.clone();
            minus[e] -= h;
            vals.insert(
                i.name.into(),
                Tensor::from_f64(DType::F64, i.dims.clone(), &minus).unwrap(),
            );
            let lm = loss_of(&vals);
            numeric.push((lp - lm) / (2.0 * h));
        }
        let scale = numeric.iter().fold(1.0f64, |m, v| m.max(v.abs()));
        for (e, (a, n)) in analytic.iter().zip(&numeric).enumerate() {
            assert!(
                (a - n).abs() <= rtol * scale,
                "{label}: d{}[{e}] analytic {a} vs numeric {n}\nanalytic {analytic:?}\nnumeric {numeric:?}",
                i.name
            );
        }
    }
}

#[test]
fn unary_ops() {
    use crate::UnaryOp as U;
    let any = [
        U::Neg,
        U::Exp,
        U::Tanh,
        U::Sigmoid,
        U::Gelu,
        U::GeluTanh,
        U::Silu,
        U::Erf,
        U::Sin,
        U::Cos,
    ];
    for u in any {
        check(u.name(), vec![inp("x", &[3, 5])], |_, x| x[0].unary(u));
    }
    for u in [U::Log, U::Sqrt, U::Rsqrt, U::Reciprocal] {
        check(u.name(), vec![inp_in("x", &[3, 5], 0.3, 2.0, 7)], |_, x| x[0].unary(u));
    }
    // Kinks at 0 kept away from the finite-difference step.
    let away: Vec<f64> = (0..15)
        .map(|i| {
            if i % 2 == 0 {
                0.1 + i as f64 * 0.07
            } else {
                -0.2 - i as f64 * 0.05
            }
        })
        .collect();
    for u in [U::Abs, U::Relu] {
        check(
            u.name(),
            vec![In {
                name: "x",
                dims: vec![3, 5],
                values: Some(away.clone()),
            }],
            |_, x| x[0].unary(u),
        );
    }
    // Piecewise constant: zero gradient.
    for u in [U::Floor, U::Ceil, U::Round, U::Sign] {
        check(u.name(), vec![inp_in("x", &[4], 0.1, 0.4, 3)], |_, x| {
            x[0].unary(u) + x[0] * 0.0
        });
    }
}

#[test]
fn binary_ops() {
    use crate::BinaryOp as B;
    for op in [B::Add, B::Sub, B::Mul, B::Max, B::Min] {
        check(op.name(), vec![inp("a", &[4, 3]), inp("b", &[4, 3])], |_, x| {
            x[0].binary(op, x[1])
        });
    }
    check(
        "div",
        vec![inp("a", &[4, 3]), inp_in("b", &[4, 3], 0.5, 2.0, 5)],
        |_, x| x[0] / x[1],
    );
    check(
        "pow",
        vec![inp_in("a", &[4, 3], 0.5, 2.0, 3), inp("b", &[4, 3])],
        |_, x| x[0].pow(x[1]),
    );
    check(
        "mod, fmod",
        vec![inp_in("a", &[6], -3.0, 3.0, 11), inp_in("b", &[6], 0.7, 1.3, 12)],
        |_, x| x[0].binary(crate::BinaryOp::Mod, x[1]) + x[0].fmod(x[1]) * 0.5,
    );
    // Ties split the gradient evenly (as torch.maximum); x against itself.
    check("max tie", vec![inp("a", &[5])], |_, x| x[0].maximum(x[0]));
    check("a read twice", vec![inp("a", &[5])], |_, x| x[0] * x[0] + x[0]);
}

#[test]
fn select_cast_broadcast_reduce() {
    check("select", vec![inp("a", &[3, 4]), inp("b", &[3, 4])], |b, x| {
        b.select(x[0].gt(x[1]), x[0] * 2.0, x[1] * x[1])
    });
    check("cast to f64 and back", vec![inp("a", &[3])], |_, x| {
        x[0].cast(DType::F64) * 3.0
    });
    check("broadcast", vec![inp("a", &[3, 1]), inp("b", &[4])], |_, x| {
        x[0].broadcast_to(&Shape::from([2, 3, 4])) * x[1].broadcast_to(&Shape::from([2, 3, 4]))
    });
    for keep in [false, true] {
        check("sum", vec![inp("a", &[2, 3, 4])], |_, x| x[0].sum(&[0, 2], keep));
        check("mean", vec![inp("a", &[2, 3, 4])], |_, x| x[0].mean(&[1], keep));
        check("max", vec![inp("a", &[2, 3, 4])], |_, x| x[0].reduce_max(&[2], keep));
        check("min", vec![inp("a", &[2, 3, 4])], |_, x| x[0].reduce_min(&[0, 1], keep));
        check("prod", vec![inp_in("a", &[2, 3], 0.5, 1.5, 4)], |_, x| {
            x[0].prod(&[1], keep)
        });
    }
}

#[test]
fn matmul_forms() {
    check("matmul 2-d", vec![inp("a", &[3, 4]), inp("b", &[4, 5])], |_, x| {
        x[0].matmul(x[1])
    });
    check(
        "linear: batched x @ w",
        vec![inp("a", &[2, 3, 4]), inp("b", &[4, 5])],
        |_, x| x[0].matmul(x[1]),
    );
    check(
        "batched, broadcast batch",
        vec![inp("a", &[2, 1, 3, 4]), inp("b", &[3, 4, 2])],
        |_, x| x[0].matmul(x[1]),
    );
}

#[test]
fn layout_ops() {
    check("reshape + transpose", vec![inp("a", &[2, 3, 4])], |_, x| {
        x[0].transpose(&[2, 0, 1]).reshape([4, 6])
    });
    check("slice unit step", vec![inp("a", &[5, 6])], |_, x| {
        x[0].slice(1, 1, 4, 1).slice(0, -3, 100, 1)
    });
    check("slice strided and reversed", vec![inp("a", &[5, 7])], |_, x| {
        x[0].slice_ranges(vec![
            SliceRange {
                start: 4,
                end: -100,
                step: -2,
            },
            SliceRange {
                start: 1,
                end: 7,
                step: 3,
            },
        ])
    });
    check("concat", vec![inp("a", &[2, 3]), inp("b", &[2, 2])], |b, x| {
        b.concat(&[x[0], x[1], x[0]], 1)
    });
    check("pad and crop", vec![inp("a", &[3, 4])], |_, x| {
        x[0].pad(&[(1, 2), (-1, 1)], PadMode::Constant, 0.5)
    });
    check("gather, repeated and negative rows", vec![inp("a", &[5, 3])], |b, x| {
        let idx = b.constant(Tensor::new([2, 3], TensorData::I64(vec![0, 4, 0, -1, 2, 0])).unwrap());
        x[0].gather(idx, 0)
    });
    check("scatter_add", vec![inp("u", &[2, 4, 3])], |b, x| {
        let idx = b.constant(Tensor::new([4], TensorData::I64(vec![1, 1, 0, 3])).unwrap());
        x[0].scatter_add(idx, 1, 5)
    });
}

/// A value read in parts (slices of adjacent ranges along one axis, a chunked MLP's
/// input) and whole: the parts' gradients are joined by one `concat` (padded where the
/// ranges leave the ends), not summed as full-size pads, and the gradient is right.
#[test]
fn a_value_read_in_parts_gets_its_parts_gradients_joined() {
    fn parts(x: Value<'_>) -> Value<'_> {
        let a = x.slice(0, 1, 3, 1).tanh();
        let b = x.slice(0, 3, 4, 1) * x.slice(0, 3, 4, 1);
        let c = x.slice(0, 4, 6, 1).exp();
        let whole = x.sigmoid();
        let joined = x.builder().concat(&[a, b, c], 0);
        joined.sum(&[0, 1], false) + whole.sum(&[0, 1], false)
    }
    check("parts of rows 1..6 and the whole", vec![inp("a", &[6, 3])], |_, x| {
        parts(x[0])
    });
    // The gradient graph: one concat of the parts' gradients; pads: the one that pads
    // the run (rows 1..6) to the whole, and the second read of rows 3..4 (summed).
    let b = GraphBuilder::new();
    let x = b.input("x", DType::F64, [6, 3]);
    let loss = parts(x);
    b.output("loss", loss);
    let grads = gradients(&b, loss.id(), &[x.id()]).unwrap();
    b.output("dx", b.value(grads.grads[0]).unwrap());
    let g = b.finish().unwrap();
    // The nodes dx reads (the per-part pads the builder made first are left unread).
    let mut live = vec![false; g.len()];
    let mut stack = vec![g.outputs()[1].node];
    while let Some(id) = stack.pop() {
        if !std::mem::replace(&mut live[id.index()], true) {
            stack.extend(g.node(id).inputs.iter().copied());
        }
    }
    let count = |f: fn(&Op) -> bool| {
        g.nodes()
            .iter()
            .enumerate()
            .filter(|(i, n)| live[*i] && n.name.as_deref().is_some_and(|s| s.starts_with("backward")) && f(&n.op))
            .count()
    };
    assert_eq!(count(|op| matches!(op, Op::Pad { .. })), 2, "{g:?}");
    assert!(count(|op| matches!(op, Op::Concat { .. })) >= 1, "{g:?}");
}

#[test]
fn composites() {
    check("softmax", vec![inp("a", &[3, 5])], |_, x| softmax(x[0], -1));
    check("log_softmax", vec![inp("a", &[3, 5])], |_, x| log_softmax(x[0], -1));
    check(
        "layer_norm",
        vec![inp("a", &[3, 6]), inp("g", &[6]), inp("b", &[6])],
        |_, x| layer_norm(x[0], Some(x[1]), Some(x[2]), 1e-5),
    );
    check("rms_norm", vec![inp("a", &[3, 6]), inp("g", &[6])], |_, x| {
        rms_norm(x[0], Some(x[1]), 1e-6)
    });
    check("gelu erf spelled out", vec![inp("a", &[7])], |_, x| {
        gelu(x[0], GeluApprox::Erf)
    });
    check("gelu tanh spelled out", vec![inp("a", &[7])], |_, x| {
        gelu(x[0], GeluApprox::Tanh)
    });
    check("silu spelled out", vec![inp("a", &[7])], |_, x| x[0] * x[0].sigmoid());
}

#[test]
fn attention_op() {
    let flags = |causal, zero| crate::interp::attention::Flags {
        scale: 0.4,
        causal,
        zero_masked_rows: zero,
    };
    for causal in [false, true] {
        check(
            "attention",
            vec![
                inp("q", &[2, 2, 3, 4]),
                inp("k", &[2, 2, 5, 4]),
                inp("v", &[2, 2, 5, 3]),
            ],
            |b, x| b.attention_flags((x[0], x[1], x[2]), None, flags(causal, false)),
        );
    }
    // Grouped-query heads and an additive mask at its small shape.
    check(
        "attention gqa + mask",
        vec![
            inp("q", &[1, 4, 3, 2]),
            inp("k", &[1, 2, 4, 2]),
            inp("v", &[1, 2, 4, 3]),
            inp("m", &[1, 1, 1, 4]),
        ],
        |b, x| b.attention_flags((x[0], x[1], x[2]), Some(x[3]), flags(false, false)),
    );
    // The same through the fused backward (a mask that needs no gradient).
    check(
        "attention gqa + constant mask, fused backward",
        vec![
            inp("q", &[2, 4, 3, 2]),
            inp("k", &[2, 2, 4, 2]),
            inp("v", &[2, 2, 4, 3]),
        ],
        |b, x| {
            let m = b.constant(Tensor::random(&TensorType::new(DType::F64, [2, 1, 1, 4]), 5));
            b.attention_flags((x[0], x[1], x[2]), Some(m), flags(true, false))
        },
    );
    // A fully masked row gives 0 and no gradient.
    check(
        "attention zero_masked_rows",
        vec![
            inp("q", &[1, 1, 3, 2]),
            inp("k", &[1, 1, 3, 2]),
            inp("v", &[1, 1, 3, 2]),
        ],
        |b, x| {
            let mut m = vec![0.0; 9];
            m[3..6].fill(f64::NEG_INFINITY);
            let m = b.constant(Tensor::from_f64(DType::F64, [1, 1, 3, 3], &m).unwrap());
            b.attention_flags((x[0], x[1], x[2]), Some(m), flags(false, true))
        },
    );
}

#[test]
fn unreached_and_integer_values() {
    // A parameter the loss does not read gets a zero gradient; an integer path none.
    let b = GraphBuilder::new();
    let x = b.input("x", DType::F32, [3]);
    let w = b.input("w", DType::F32, [3]);
    let loss = (x * x).sum(&[0], false) + x.argmax(0, false).cast(DType::F32);
    let g = gradients(&b, loss.id(), &[x.id(), w.id()]).unwrap();
    b.output("dx", b.value(g.grads[0]).unwrap());
    b.output("dw", b.value(g.grads[1]).unwrap());
    assert_eq!(g.saved, vec![x.id()]);
    let graph = b.finish().unwrap();
    let xv = Tensor::from_f32([3], vec![1.0, -2.0, 3.0]).unwrap();
    let out = interpret(&graph, &[("x".into(), xv.clone()), ("w".into(), xv)].into()).unwrap();
    assert_eq!(out[0].1.to_f64_vec(), vec![2.0, -4.0, 6.0]);
    assert_eq!(out[1].1.to_f64_vec(), vec![0.0; 3]);

    let b = GraphBuilder::new();
    let ids = b.input("ids", DType::I64, [3]);
    let loss = ids.cast(DType::F32).sum(&[0], false);
    let err = gradients(&b, loss.id(), &[ids.id()]).unwrap_err();
    assert!(err.to_string().contains("only float values have gradients"), "{err}");
}

/// Convolution (data and weights) and pooling (max, both averages) against finite
/// differences: strides, uneven pads, dilation, groups, 1-D, ceil mode.
#[test]
fn convolution_and_pooling() {
    use crate::{PoolOp, Window};
    let win = |s: &[usize], p: &[(usize, usize)], d: &[usize]| Window {
        strides: s.to_vec(),
        pads: p.to_vec(),
        dilations: d.to_vec(),
    };
    check(
        "conv 2-D, stride 2, dilation, 2 groups",
        vec![inp("x", &[2, 4, 7, 6]), inp("w", &[6, 2, 3, 2])],
        |_, x| x[0].conv(x[1], win(&[2, 1], &[(1, 0), (2, 1)], &[1, 2]), 2),
    );
    check(
        "conv 1-D depthwise",
        vec![inp("x", &[2, 3, 9]), inp("w", &[3, 1, 3])],
        |_, x| x[0].conv(x[1], win(&[2], &[(1, 1)], &[1]), 3),
    );
    // Distinct values, so no two taps of a window tie for the maximum.
    let n = 2 * 2 * 7 * 8;
    let perm: Vec<f64> = (0..n).map(|i| ((i * 37) % n) as f64 / n as f64 - 0.5).collect();
    for (name, op, ceil, count) in [
        ("max pool 3x3 / 2, ceil", PoolOp::Max, true, false),
        ("avg pool, the pad counted", PoolOp::Avg, true, true),
        ("avg pool, the pad not counted", PoolOp::Avg, false, false),
    ] {
        let x = In {
            name: "x",
            dims: vec![2, 2, 7, 8],
            values: Some(perm.clone()),
        };
        check(name, vec![x], |_, x| {
            x[0].pool(op, &[3, 3], win(&[2, 2], &[(1, 1), (1, 0)], &[1, 1]), ceil, count)
        });
    }
}

/// The maximum a softmax or log-softmax subtracts gets no gradient (exactly zero): the
/// backward has no `x == max` mask. Where the shifted value is also read otherwise, the
/// maximum keeps its gradient (checked against finite differences).
#[test]
fn softmax_maximum_gets_no_gradient() {
    let masks = |f: &dyn for<'b> Fn(&'b GraphBuilder, Value<'b>) -> Value<'b>| {
        let b = GraphBuilder::new();
        let x = b.input("x", DType::F32, [3, 5]);
        let loss = f(&b, x).sum(&[0, 1], false);
        b.output("loss", loss);
        gradients(&b, loss.id(), &[x.id()]).unwrap();
        b.with_graph(|g| {
            g.nodes()
                .iter()
                .filter(|n| n.name.as_deref().is_some_and(|s| s.starts_with("backward")))
                .filter(|n| matches!(n.op, Op::Binary(crate::BinaryOp::Eq)))
                .count()
        })
    };
    fn r<'b>(b: &'b GraphBuilder, x: Value<'b>) -> Value<'b> {
        b.constant(Tensor::random(&TensorType::new(DType::F32, x.shape()), 3))
    }
    assert_eq!(masks(&|b, x| log_softmax(x, -1) * r(b, x)), 0);
    assert_eq!(masks(&|b, x| softmax(x, -1) * r(b, x)), 0);
    assert_eq!(masks(&|b, x| softmax(x, 1) * r(b, x) + log_softmax(x, -1)), 0);
    // Not shift-invariant: the shifted value read as it is, or the normalizer reused.
    assert_eq!(
        masks(&|b, x| log_softmax(x, -1) + (x - x.reduce_max(&[-1], true)) * r(b, x)),
        1
    );
    assert_eq!(
        masks(&|b, x| {
            let s = x - x.reduce_max(&[-1], true);
            let z = s.exp().sum(&[-1], true);
            (s - z.log()) * r(b, x) + z
        }),
        1
    );
    check("shifted and read", vec![inp("a", &[3, 5])], |_, x| {
        let s = x[0] - x[0].reduce_max(&[-1], true);
        (s - s.exp().sum(&[-1], true).log()) + s * 0.5
    });
    check("normalizer reused", vec![inp("a", &[3, 5])], |_, x| {
        let s = x[0] - x[0].reduce_max(&[-1], true);
        let z = s.exp().sum(&[-1], true);
        (s - z.log()) * z
    });
}

/// Cross-entropy as the loss builder spells it (a one-hot of the labels over the
/// classes selecting the log-probabilities): the backward sums no row over the classes
/// (the one-hot's sum is the label's element, the maximum gets no gradient), and the
/// gradient is right, an ignored label (-100) included.
#[test]
fn a_one_hot_pick_has_a_backward_without_class_sums() {
    fn picked<'b>(b: &'b GraphBuilder, x: Value<'b>) -> Value<'b> {
        let d = x.shape();
        let labels = Tensor::from_f64(DType::I64, [3, 1], &[1.0, -100.0, 4.0]).unwrap();
        let hit = b
            .iota(DType::I64, [5], 0)
            .broadcast_to(&d)
            .eq(b.constant(labels).broadcast_to(&d));
        let zero = b.scalar(x.dtype(), 0.0).broadcast_to(&d);
        b.select(hit, log_softmax(x, -1), zero).sum(&[-1], false)
    }
    check("cross-entropy picked by a one-hot", vec![inp("a", &[3, 5])], |b, x| {
        picked(b, x[0])
    });
    let b = GraphBuilder::new();
    let x = b.input("x", DType::F32, [3, 5]);
    let loss = picked(&b, x).sum(&[0], false);
    b.output("loss", loss);
    gradients(&b, loss.id(), &[x.id()]).unwrap();
    let sums = b.with_graph(|g| {
        g.nodes()
            .iter()
            .filter(|n| n.name.as_deref().is_some_and(|s| s.starts_with("backward")))
            .filter(|n| matches!(n.op, Op::Reduce { .. }))
            .count()
    });
    assert_eq!(sums, 0);
}

/// A fused projection split along its last axis into heads (`[b, s, 3 h d]` into q, k,
/// v as `[b, h, s, d]`): the three gradients joined by one concat along the heads of
/// their `[b, s, h, d]` forms, without a pad or a sum of them.
#[test]
fn a_split_along_the_last_axis_gets_one_concat() {
    fn heads<'b>(x: Value<'b>) -> Value<'b> {
        let part = |k: i64| {
            x.slice(2, 4 * k, 4 * k + 4, 1)
                .reshape([2, 3, 2, 2])
                .transpose(&[0, 2, 1, 3])
        };
        (part(0) * part(1)).sin() + part(2) * 3.0
    }
    check("q, k, v split", vec![inp("x", &[2, 3, 12])], |_, x| heads(x[0]));
    let b = GraphBuilder::new();
    let x = b.input("x", DType::F64, [2, 3, 12]);
    let loss = heads(x).sum(&[0, 1, 2, 3], false);
    b.output("loss", loss);
    let grads = gradients(&b, loss.id(), &[x.id()]).unwrap();
    b.output("dx", b.value(grads.grads[0]).unwrap());
    let g = b.finish().unwrap();
    let dx = g.node(g.outputs()[1].node);
    assert!(matches!(dx.op, Op::Reshape { .. }), "{dx:?}");
    assert!(matches!(g.node(dx.inputs[0]).op, Op::Concat { axis: 2 }), "{g:?}");
}
