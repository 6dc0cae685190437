//! Attention recognition (`rules/attention.rs`): the spelled-out scaled dot-product
//! attention of exports and the builder becomes one `attention` op, in each form the
//! front ends produce (scale by multiply or divide or folded into q; additive masks
//! kept at their small shape, `select` masks, known causal masks, none; grouped-query
//! heads repeated by expand/reshape; PyTorch's exported scaled_dot_product_attention,
//! with the scale split over q and kᵀ and the `where(isnan(p), 0, p)` guard); the result agrees with the spelled-out graph
//! within 1e-5 (f32) on random inputs; near misses are left alone.

use std::collections::HashMap;

use graphc_compiler::optimize::{optimize, OptimizeReport};
use graphc_ir::nn::softmax;
use graphc_ir::{interpret, DType, Graph, GraphBuilder, Op, Shape, Tensor, TensorType, Value};

const B: usize = 2;
const H: usize = 4;
const S: usize = 12;
const D: usize = 16;

/// q, k, v inputs `[B, H, S, D]` (k and v with `hkv` heads).
fn qkv(b: &GraphBuilder, dtype: DType, hkv: usize) -> (Value<'_>, Value<'_>, Value<'_>) {
    (
        b.input("q", dtype, [B, H, S, D]),
        b.input("k", dtype, [B, hkv, S, D]),
        b.input("v", dtype, [B, hkv, S, D]),
    )
}

fn graph(f: impl for<'b> Fn(&'b GraphBuilder) -> Value<'b>) -> Graph {
    let b = GraphBuilder::new();
    let y = f(&b);
    b.output("y", y);
    b.finish().unwrap()
}

/// Optimize; outputs agree with the spelled-out graph within `tol` (relative L2) on
/// random inputs.
fn check(g: &Graph, tol: f64) -> (Graph, OptimizeReport) {
    let (opt, report) = optimize(g, &Default::default()).unwrap();
    opt.verify().unwrap();
    for seed in 0..3 {
        let mut inputs = HashMap::new();
        for (i, &id) in g.inputs().iter().enumerate() {
            let ty = g.node(id).ty.clone();
            let t = if ty.dtype == DType::Bool {
                Tensor::random(&ty, seed * 10 + i as u64)
            } else {
                Tensor::randn(&ty, 1.0, seed * 10 + i as u64)
            };
            inputs.insert(g.input_name(id).unwrap().to_string(), t);
        }
        let want = interpret(g, &inputs).unwrap();
        let got = interpret(&opt, &inputs).unwrap();
        let err = graphc_ir::compare::relative_l2(&got[0].1, &want[0].1);
        assert!(err <= tol, "relative L2 {err:e}\n{}", graphc_ir::print(&opt));
    }
    (opt, report)
}

/// The attention ops of a graph: `(scale, causal, operand count)`.
fn attentions(g: &Graph) -> Vec<(f64, bool, usize)> {
    g.nodes()
        .iter()
        .filter_map(|n| match n.op {
            Op::Attention { scale, causal, .. } => Some((scale, causal, n.inputs.len())),
            _ => None,
        })
        .collect()
}

fn no_scores_left(g: &Graph) {
    assert!(
        !g.nodes().iter().any(|n| matches!(n.op, Op::Reduce { .. } | Op::MatMul)),
        "a reduction or matmul is left:\n{}",
        graphc_ir::print(g)
    );
}

#[test]
fn scale_forms_multiply_divide_and_folded_into_q() {
    let scale = 1.0 / (D as f64).sqrt();
    let forms: Vec<(Graph, f64)> = vec![
        (
            graph(|b| {
                let (q, k, v) = qkv(b, DType::F32, H);
                softmax(q.matmul(k.t()) * scale, -1).matmul(v)
            }),
            scale,
        ),
        (
            graph(|b| {
                let (q, k, v) = qkv(b, DType::F32, H);
                softmax(q.matmul(k.t()) / (D as f64).sqrt(), -1).matmul(v)
            }),
            1.0 / (D as f64).sqrt(),
        ),
        (
            graph(|b| {
                let (q, k, v) = qkv(b, DType::F32, H);
                softmax((q * scale).matmul(k.t()), -1).matmul(v)
            }),
            scale,
        ),
        (
            // k already transposed: [B, H, D, S].
            graph(|b| {
                let q = b.input("q", DType::F32, [B, H, S, D]);
                let kt = b.input("kt", DType::F32, [B, H, D, S]);
                let v = b.input("v", DType::F32, [B, H, S, D]);
                softmax(scale * q.matmul(kt), -1).matmul(v)
            }),
            scale,
        ),
    ];
    for (g, want_scale) in &forms {
        let (opt, r) = check(g, 1e-5);
        assert_eq!(r.rules_fired.get("attention").copied(), Some(1), "{r:?}");
        let a = attentions(&opt);
        assert_eq!(a.len(), 1, "{}", graphc_ir::print(&opt));
        assert!((a[0].0 - want_scale).abs() <= 1e-7 * want_scale, "{a:?}");
        assert_eq!((a[0].1, a[0].2), (false, 3));
        no_scores_left(&opt);
    }
}

#[test]
fn additive_masks_stay_at_their_small_shape() {
    // A BERT-style padding mask [B, 1, 1, S] and a full-rank [S, S] bias (rank 2,
    // reshaped to [1, 1, S, S]), either side of the addition.
    for (shape, left) in [(vec![B, 1, 1, S], false), (vec![S, S], true)] {
        let g = graph(|b| {
            let (q, k, v) = qkv(b, DType::F32, H);
            let m = b.input("m", DType::F32, Shape::new(&shape[..]));
            let s = q.matmul(k.t()) * 0.25;
            let s = if left { m + s } else { s + m };
            softmax(s, -1).matmul(v)
        });
        let (opt, _) = check(&g, 1e-5);
        assert_eq!(attentions(&opt), vec![(0.25, false, 4)], "{}", graphc_ir::print(&opt));
        let att = opt
            .nodes()
            .iter()
            .find(|n| matches!(n.op, Op::Attention { .. }))
            .unwrap();
        let mask_ty = &opt.node(att.inputs[3]).ty;
        assert_eq!(mask_ty.numel(), shape.iter().product::<usize>(), "mask {mask_ty}");
        no_scores_left(&opt);
    }
}

#[test]
fn select_masks_and_causal_masks() {
    // The builder's causal attention: select(iota-built causal mask, s, -inf): a known
    // mask with the causal pattern, so causal=true and no mask operand.
    let g = graph(|b| {
        let (q, k, v) = qkv(b, DType::F32, H);
        let s = q.matmul(k.t()) * 0.25;
        let row = b.iota(DType::I64, [S, S], 0);
        let col = b.iota(DType::I64, [S, S], 1);
        softmax(b.select(col.le(row), s, b.scalar(DType::F32, f64::NEG_INFINITY)), -1).matmul(v)
    });
    let (opt, _) = check(&g, 1e-5);
    assert_eq!(attentions(&opt), vec![(0.25, true, 3)], "{}", graphc_ir::print(&opt));
    no_scores_left(&opt);

    // transformers' form: the dtype's lowest, not -inf, and a padding mask from an input
    // (bool [B, 1, 1, S]): an additive select(cond, 0, lowest) at the small shape.
    let g = graph(|b| {
        let (q, k, v) = qkv(b, DType::F32, H);
        let s = q.matmul(k.t()) * 0.25;
        let keep = b.input("keep", DType::Bool, [B, 1, 1, S]);
        softmax(b.select(keep, s, b.scalar(DType::F32, f32::MIN as f64)), -1).matmul(v)
    });
    let (opt, _) = check(&g, 1e-5);
    assert_eq!(attentions(&opt), vec![(0.25, false, 4)], "{}", graphc_ir::print(&opt));

    // Both: a known causal additive mask plus an input's padding mask.
    let g = graph(|b| {
        let (q, k, v) = qkv(b, DType::F32, H);
        let s = q.matmul(k.t()) * 0.25;
        let row = b.iota(DType::I64, [S, S], 0);
        let col = b.iota(DType::I64, [S, S], 1);
        let causal = b.select(
            col.le(row),
            b.scalar(DType::F32, 0.0),
            b.scalar(DType::F32, f32::MIN as f64),
        );
        let pad = b.input("pad", DType::F32, [B, 1, 1, S]);
        softmax((s + causal) + pad, -1).matmul(v)
    });
    let (opt, _) = check(&g, 1e-5);
    assert_eq!(attentions(&opt), vec![(0.25, true, 4)], "{}", graphc_ir::print(&opt));
}

/// k/v heads repeated to the query heads, as Llama exports do.
fn repeat(x: Value<'_>, hkv: usize) -> Value<'_> {
    x.reshape([B, hkv, 1, S, D])
        .broadcast_to(&Shape::new([B, hkv, H / hkv, S, D]))
        .reshape([B, H, S, D])
}

#[test]
fn grouped_query_heads_are_read_from_the_kv_heads() {
    let hkv = 2;
    let g = graph(|b| {
        let (q, k, v) = qkv(b, DType::F32, hkv);
        softmax(q.matmul(repeat(k, hkv).t()) * 0.25, -1).matmul(repeat(v, hkv))
    });
    let (opt, _) = check(&g, 1e-5);
    let att = opt
        .nodes()
        .iter()
        .find(|n| matches!(n.op, Op::Attention { .. }))
        .unwrap();
    for &kv in &att.inputs[1..3] {
        assert_eq!(
            opt.node(kv).ty.shape.dims(),
            [B, hkv, S, D],
            "{}",
            graphc_ir::print(&opt)
        );
    }
    assert!(!opt.nodes().iter().any(|n| matches!(n.op, Op::Broadcast { .. })));
}

#[test]
fn bf16_attention_is_recognized() {
    let g = graph(|b| {
        let (q, k, v) = qkv(b, DType::BF16, H);
        softmax(q.matmul(k.t()) * 0.25, -1).matmul(v)
    });
    let (opt, _) = check(&g, 3e-2);
    assert_eq!(attentions(&opt).len(), 1);
}

#[test]
fn near_misses_are_left_alone() {
    let misses: Vec<Graph> = vec![
        // Softmax over the query axis, not the keys.
        graph(|b| {
            let (q, k, v) = qkv(b, DType::F32, H);
            softmax(q.matmul(k.t()) * 0.25, -2).matmul(v)
        }),
        // A scale that is a tensor, not a scalar, applied after the mask.
        graph(|b| {
            let (q, k, v) = qkv(b, DType::F32, H);
            let m = b.input("m", DType::F32, [B, 1, 1, S]);
            let w = b.input("w", DType::F32, [B, H, S, S]);
            softmax((q.matmul(k.t()) + m) * w, -1).matmul(v)
        }),
        // A select whose fill is not a mask value (-1, not -inf / lowest).
        graph(|b| {
            let (q, k, v) = qkv(b, DType::F32, H);
            let keep = b.input("keep", DType::Bool, [B, 1, 1, S]);
            softmax(b.select(keep, q.matmul(k.t()), b.scalar(DType::F32, -1.0)), -1).matmul(v)
        }),
        // Rank 3: no batch dim.
        graph(|b| {
            let q = b.input("q", DType::F32, [H, S, D]);
            let k = b.input("k", DType::F32, [H, S, D]);
            let v = b.input("v", DType::F32, [H, S, D]);
            softmax(q.matmul(k.t()), -1).matmul(v)
        }),
    ];
    for g in &misses {
        let (opt, r) = check(g, 1e-5);
        assert_eq!(r.rules_fired.get("attention"), None, "{}", graphc_ir::print(&opt));
        assert!(attentions(&opt).is_empty());
    }
}

#[test]
fn a_large_known_mask_is_never_folded_into_the_score_matrix() {
    // A weight mask [1, 1, S, S] that is not causal stays a 4-operand attention over the
    // weight (small), never a folded [B, H, S, S] tensor.
    let b = GraphBuilder::new();
    let (q, k, v) = qkv(&b, DType::F32, H);
    let bias = b.param(
        "bias",
        Tensor::randn(&TensorType::new(DType::F32, [1, 1, S, S]), 1.0, 5),
    );
    b.output("y", softmax(q.matmul(k.t()) * 0.25 + bias, -1).matmul(v));
    let g = b.finish().unwrap();
    let (opt, _) = check(&g, 1e-5);
    assert_eq!(attentions(&opt), vec![(0.25, false, 4)]);
    let att = opt
        .nodes()
        .iter()
        .find(|n| matches!(n.op, Op::Attention { .. }))
        .unwrap();
    assert_eq!(opt.node(att.inputs[3]).ty.shape.dims(), [1, 1, S, S]);
}

/// Attention over `[1, 2, n, 16]` q, k, v masked by `select(mask(b, n), s, lowest)`.
fn position_masked(n: usize, mask: for<'b> fn(&'b GraphBuilder, usize) -> Value<'b>) -> Graph {
    let b = GraphBuilder::new();
    let x = |name: &str| b.input(name, DType::F32, [1, 2, n, 16]);
    let (q, k, v) = (x("q"), x("k"), x("v"));
    let s = q.matmul(k.t()) * 0.25;
    let m = mask(&b, n);
    b.output(
        "y",
        softmax(b.select(m, s, b.scalar(DType::F32, f32::MIN as f64)), -1).matmul(v),
    );
    b.finish().unwrap()
}

/// Position indices along the queries (`[1, 1, n, 1]`) and the keys (`[1, 1, 1, n]`),
/// as exports build them from a `Range`.
fn positions(b: &GraphBuilder, n: usize) -> (Value<'_>, Value<'_>) {
    let p = b.iota(DType::I64, [n], 0);
    (p.reshape([1, 1, n, 1]), p.reshape([1, 1, 1, n]))
}

/// Masks built from position vectors are proved causal (or not) from their structure
/// (`rules/causal.rs`), the same way at 12 positions (checked against the spelled-out
/// graph) as at 8192 (whose `[n, n]` mask is too large to evaluate): the forms exports
/// use are causal; strict, upper, banded and reversed ones are not.
#[test]
fn position_masks_are_proved_causal_at_any_length() {
    type Mask = for<'b> fn(&'b GraphBuilder, usize) -> Value<'b>;
    let cases: [(&str, bool, Mask); 11] = [
        ("the builder's iotas over [n, n]", true, |b, n| {
            let row = b.iota(DType::I64, [n, n], 0);
            let col = b.iota(DType::I64, [n, n], 1);
            col.le(row)
        }),
        ("the builder's iotas, transposed", false, |b, n| {
            let row = b.iota(DType::I64, [n, n], 0);
            let col = b.iota(DType::I64, [n, n], 1);
            row.le(col)
        }),
        ("k[j] <= q[i]", true, |b, n| {
            let (i, j) = positions(b, n);
            j.le(i)
        }),
        ("q[i] >= k[j]", true, |b, n| {
            let (i, j) = positions(b, n);
            i.ge(j)
        }),
        ("k[j] < q[i] + 1", true, |b, n| {
            let (i, j) = positions(b, n);
            j.lt(i + 1.0)
        }),
        ("and a padding of ones and equal document ids", true, |b, n| {
            let (i, j) = positions(b, n);
            let ones = b.iota(DType::I64, [1, 1, 1, n], 3).ge(b.scalar(DType::I64, 0.0));
            let (di, dj) = (i * 0.0, j * 0.0);
            ones.and(j.le(i)).and(di.eq(dj))
        }),
        ("k[j] < q[i]: the diagonal masked", false, |b, n| {
            let (i, j) = positions(b, n);
            j.lt(i)
        }),
        ("q[i] <= k[j]: upper", false, |b, n| {
            let (i, j) = positions(b, n);
            i.le(j)
        }),
        ("a window of 4", false, |b, n| {
            let (i, j) = positions(b, n);
            j.le(i).and(j.gt(i - 4.0))
        }),
        ("reversed keys", false, |b, n| {
            let (i, j) = positions(b, n);
            (b.scalar(DType::I64, (n - 1) as f64) - j).le(i)
        }),
        ("a key position past the queries", false, |b, n| {
            let (i, j) = positions(b, n);
            j.le(i + 1.0)
        }),
    ];
    for n in [12, 8192] {
        for (name, causal, mask) in &cases {
            let g = position_masked(n, *mask);
            let opt = if n <= 64 {
                check(&g, 1e-5).0
            } else {
                optimize(&g, &Default::default()).unwrap().0
            };
            let found = attentions(&opt);
            assert_eq!(found.len(), 1, "{name} at {n}: {found:?}");
            assert_eq!(found[0].1, *causal, "{name} at {n}");
            // A causal mask leaves no mask operand; any other keeps one.
            assert_eq!(found[0].2, if *causal { 3 } else { 4 }, "{name} at {n}");
        }
    }
}

/// PyTorch's export of `scaled_dot_product_attention`: q and kᵀ each times √scale, kᵀ
/// as `reshape(transpose(reshape(k, [B*H, S, D]), [0, 2, 1]), [B, H, D, S])`, the
/// mask, the softmax, then `where(isnan(p), 0, p)`.
fn sdpa<'b>(b: &'b GraphBuilder, mask: impl Fn(Value<'b>) -> Value<'b>) -> Value<'b> {
    let (q, k, v) = qkv(b, DType::F32, H);
    let root = (1.0 / (D as f64).sqrt()).sqrt();
    let kt = k.reshape([B * H, S, D]).transpose(&[0, 2, 1]).reshape([B, H, D, S]);
    let s = (q * root).matmul(kt * root);
    let p = softmax(mask(s), -1);
    let zero = b.scalar(DType::F32, 0.0).broadcast_to(&Shape::new([B, H, S, S]));
    b.select(p.unary(graphc_ir::UnaryOp::IsNan), zero, p).matmul(v)
}

/// The graph's attention op: `(scale, causal, zero_masked_rows, operand count)`.
fn guarded(g: &Graph) -> Vec<(f64, bool, bool, usize)> {
    g.nodes()
        .iter()
        .filter_map(|n| match n.op {
            Op::Attention {
                scale,
                causal,
                zero_masked_rows,
            } => Some((scale, causal, zero_masked_rows, n.inputs.len())),
            _ => None,
        })
        .collect()
}

#[test]
fn pytorch_sdpa_exports_are_one_op_that_zeroes_fully_masked_rows() {
    let ninf = f64::NEG_INFINITY;
    let bss = Shape::new([B, H, S, S]);
    // A boolean padding mask made additive (`where(m, 0, -inf)` at [B, 1, 1, S]), the
    // same mask as a `where` over the scores, and no mask.
    let padded = graph(|b| {
        sdpa(b, |s| {
            let m = b.input("m", DType::Bool, [B, 1, 1, S]);
            let zero = b.scalar(DType::F32, 0.0).broadcast_to(&Shape::new([B, 1, 1, S]));
            let fill = b.scalar(DType::F32, ninf).broadcast_to(&Shape::new([B, 1, 1, S]));
            s + b.select(m, zero, fill).broadcast_to(&bss)
        })
    });
    let selected = graph(|b| {
        sdpa(b, |s| {
            let m = b.input("m", DType::Bool, [B, 1, 1, S]);
            let fill = b.scalar(DType::F32, ninf).broadcast_to(&bss);
            b.select(m.broadcast_to(&bss), s, fill)
        })
    });
    let plain = graph(|b| sdpa(b, |s| s));
    let scale = 1.0 / (D as f64).sqrt();
    for (g, operands) in [(&padded, 4), (&selected, 4), (&plain, 3)] {
        let (opt, _) = check(g, 1e-5);
        let a = guarded(&opt);
        assert_eq!(a.len(), 1, "{}", graphc_ir::print(&opt));
        assert!((a[0].0 - scale).abs() <= 1e-7, "{a:?}");
        assert_eq!((a[0].1, a[0].2, a[0].3), (false, true, operands), "{a:?}");
        no_scores_left(&opt);
        // The mask operand stays at [B, 1, 1, S]: no [.., S, S] value is left.
        assert!(
            !opt.nodes()
                .iter()
                .any(|n| n.ty.shape.dims().ends_with(&[S, S]) && !matches!(n.op, Op::Broadcast { .. })),
            "{}",
            graphc_ir::print(&opt)
        );
    }
    // A padding-only sequence (batch 1 masked whole): 0, in the spelled-out graph and
    // the op alike; never NaN.
    for g in [&padded, &selected] {
        let (opt, _) = optimize(g, &Default::default()).unwrap();
        let mut inputs = HashMap::new();
        for (i, n) in ["q", "k", "v"].into_iter().enumerate() {
            let ty = TensorType::new(DType::F32, [B, H, S, D]);
            inputs.insert(n.to_string(), Tensor::randn(&ty, 1.0, 70 + i as u64));
        }
        let keep: Vec<f64> = (0..B * S).map(|i| if i < S - 3 { 1.0 } else { 0.0 }).collect();
        inputs.insert(
            "m".into(),
            Tensor::from_f64(DType::Bool, vec![B, 1, 1, S], &keep).unwrap(),
        );
        let want = interpret(g, &inputs).unwrap()[0].1.to_f64_vec();
        let got = interpret(&opt, &inputs).unwrap()[0].1.to_f64_vec();
        assert!(got.iter().all(|x| x.is_finite()));
        let half = want.len() / B;
        assert!(want[half..].iter().chain(&got[half..]).all(|&x| x == 0.0));
        let err = want.iter().zip(&got).map(|(a, b)| (a - b).abs()).fold(0.0, f64::max);
        assert!(err < 1e-5, "{err:e}");
    }
}

#[test]
fn a_constant_causal_mask_of_a_static_export_becomes_causal() {
    // The exporter folds a static-shape causal mask into a [B, 1, S, S] float
    // initializer (0 on and below the diagonal, the dtype's lowest above).
    let lowest = f32::MIN as f64;
    let mut mv = Vec::with_capacity(B * S * S);
    for _ in 0..B {
        for i in 0..S {
            for j in 0..S {
                mv.push(if j <= i { 0.0 } else { lowest });
            }
        }
    }
    let mask = Tensor::from_f64(DType::F32, vec![B, 1, S, S], &mv).unwrap();
    let g = graph(|b| {
        sdpa(b, |s| {
            let m = b.constant(mask.clone());
            s + m.broadcast_to(&Shape::new([B, H, S, S]))
        })
    });
    let (opt, _) = check(&g, 1e-5);
    let scale = 1.0 / (D as f64).sqrt();
    let a = guarded(&opt);
    assert_eq!(a.len(), 1, "{}", graphc_ir::print(&opt));
    assert!((a[0].0 - scale).abs() <= 1e-7, "{a:?}");
    assert_eq!((a[0].1, a[0].2, a[0].3), (true, true, 3), "{a:?}");
    no_scores_left(&opt);
}

/// `attention-causal-mask`: an attention op given the causal pattern as a mask (ONNX's
/// Attention op of a static export, its mask folded to a constant) becomes the causal
/// op without the mask; any other mask stays.
#[test]
fn an_attention_op_with_a_causal_mask_operand_becomes_causal() {
    let lowest = f32::MIN as f64;
    let mask = |causal: bool| {
        let v: Vec<f64> = (0..S * S)
            .map(|e| {
                let (i, j) = (e / S, e % S);
                let masked = if causal { j > i } else { j == (i + 1) % S };
                if masked {
                    lowest
                } else {
                    0.0
                }
            })
            .collect();
        Tensor::from_f64(DType::F32, vec![1, 1, S, S], &v).unwrap()
    };
    for causal in [true, false] {
        let g = graph(|b| {
            let (q, k, v) = qkv(b, DType::F32, H);
            let m = b.constant(mask(causal)).broadcast_to(&Shape::new([B, H, S, S]));
            let flags = graphc_ir::interp::attention::Flags {
                scale: 0.25,
                causal: false,
                zero_masked_rows: true,
            };
            b.attention_flags((q, k, v), Some(m), flags)
        });
        let (opt, _) = check(&g, 1e-6);
        let want = if causal {
            (0.25, true, true, 3)
        } else {
            (0.25, false, true, 4)
        };
        assert_eq!(guarded(&opt), vec![want], "{}", graphc_ir::print(&opt));
    }
}
