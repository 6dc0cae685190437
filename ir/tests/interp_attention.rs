//! `attention`: its definition by hand, against the spelled-out softmax graph on random
//! inputs (masks, causal, grouped-query heads, every float dtype), its typing rules,
//! and its text form.

mod common;

use std::collections::HashMap;

use common::{check, f32t, run};
use graphc_ir::compare::relative_l2;
use graphc_ir::nn::softmax;
use graphc_ir::{interpret, parse, print, DType, GraphBuilder, Op, Tensor, TensorType};

const INF: f64 = f64::INFINITY;

#[test]
fn one_row_by_hand() {
    // q . k = [1, 0] -> scaled by 2: [2, 0]; softmax: [e^2, 1] / (e^2 + 1).
    let q = f32t(&[1, 1, 1, 2], &[1.0, 0.0]);
    let k = f32t(&[1, 1, 2, 2], &[1.0, 0.0, 0.0, 1.0]);
    let v = f32t(&[1, 1, 2, 1], &[10.0, 20.0]);
    let e2 = 2f64.exp();
    let want = (10.0 * e2 + 20.0) / (e2 + 1.0);
    let op = Op::Attention {
        scale: 2.0,
        causal: false,
        zero_masked_rows: false,
    };
    check(
        &run(op.clone(), &[q.clone(), k.clone(), v.clone()]),
        DType::F32,
        &[1, 1, 1, 1],
        &[want],
        1e-6,
    );
    // An additive mask of -inf on the first key leaves only the second.
    let mask = f32t(&[1, 1, 1, 2], &[-INF, 0.0]);
    check(
        &run(op.clone(), &[q.clone(), k.clone(), v.clone(), mask]),
        DType::F32,
        &[1, 1, 1, 1],
        &[20.0],
        0.0,
    );
    // Every key masked: NaN, as the spelled-out softmax gives.
    let all = f32t(&[1, 1, 1, 1], &[-INF]);
    let got = run(op, &[q, k, v, all]);
    assert!(got.to_f64_vec()[0].is_nan());
}

#[test]
fn causal_rows_see_only_earlier_keys() {
    // Row i averages v[0..=i] with equal weights (q . k = 0 everywhere).
    let q = Tensor::from_f64(DType::F32, vec![1, 1, 3, 2], &[0.0; 6]).unwrap();
    let k = q.clone();
    let v = f32t(&[1, 1, 3, 1], &[3.0, 6.0, 9.0]);
    let got = run(
        Op::Attention {
            scale: 1.0,
            causal: true,
            zero_masked_rows: false,
        },
        &[q, k, v],
    );
    check(&got, DType::F32, &[1, 1, 3, 1], &[3.0, 4.5, 6.0], 1e-6);
}

struct Case {
    dtype: DType,
    batch: usize,
    hq: usize,
    hkv: usize,
    sq: usize,
    sk: usize,
    d: usize,
    dv: usize,
    /// The mask's shape (over `[batch, hq, sq, sk]`), if any.
    mask: Option<[usize; 4]>,
    causal: bool,
}

/// The same attention built twice: spelled out (matmul, scale, mask, softmax as the
/// builder decomposes it, matmul; k/v heads repeated for grouped-query attention) and
/// as the op; both interpreted on one random input.
fn compare(c: &Case, seed: u64) -> f64 {
    let scale = 1.0 / (c.d as f64).sqrt();
    let ty = |h: usize, s: usize, d: usize| TensorType::new(c.dtype, [c.batch, h, s, d]);
    let (tq, tk, tv) = (ty(c.hq, c.sq, c.d), ty(c.hkv, c.sk, c.d), ty(c.hkv, c.sk, c.dv));
    let tm = c.mask.map(|m| TensorType::new(c.dtype, m));
    let mut inputs = HashMap::new();
    inputs.insert("q".to_string(), Tensor::random(&tq, seed));
    inputs.insert("k".to_string(), Tensor::random(&tk, seed + 1));
    inputs.insert("v".to_string(), Tensor::random(&tv, seed + 2));
    if let Some(t) = &tm {
        inputs.insert("m".to_string(), Tensor::random(t, seed + 3));
    }

    let spelled = {
        let b = GraphBuilder::new();
        let (q, k, v) = (
            b.input("q", c.dtype, tq.shape.clone()),
            b.input("k", c.dtype, tk.shape.clone()),
            b.input("v", c.dtype, tv.shape.clone()),
        );
        let g = c.hq / c.hkv;
        fn repeat_heads<'b>(x: graphc_ir::Value<'b>, c: &Case, g: usize, d: usize) -> graphc_ir::Value<'b> {
            x.reshape([c.batch, c.hkv, 1, c.sk, d])
                .broadcast_to(&graphc_ir::Shape::new([c.batch, c.hkv, g, c.sk, d]))
                .reshape([c.batch, c.hq, c.sk, d])
        }
        let (k, v) = if g > 1 {
            (repeat_heads(k, c, g, c.d), repeat_heads(v, c, g, c.dv))
        } else {
            (k, v)
        };
        let mut s = q.matmul(k.t()) * scale;
        if let Some(t) = &tm {
            s = s + b.input("m", c.dtype, t.shape.clone());
        }
        if c.causal {
            let row = b.iota(DType::I64, [c.sq, c.sk], 0);
            let col = b.iota(DType::I64, [c.sq, c.sk], 1);
            s = b.select(col.le(row), s, b.scalar(c.dtype, f64::NEG_INFINITY));
        }
        b.output("y", softmax(s, -1).matmul(v));
        b.finish().unwrap()
    };
    let fused = {
        let b = GraphBuilder::new();
        let (q, k, v) = (
            b.input("q", c.dtype, tq.shape.clone()),
            b.input("k", c.dtype, tk.shape.clone()),
            b.input("v", c.dtype, tv.shape.clone()),
        );
        let m = tm.as_ref().map(|t| b.input("m", c.dtype, t.shape.clone()));
        b.output("y", b.attention(q, k, v, m, scale, c.causal));
        b.finish().unwrap()
    };
    let want = interpret(&spelled, &inputs).unwrap();
    let got = interpret(&fused, &inputs).unwrap();
    assert_eq!(got[0].1.ty(), want[0].1.ty());
    relative_l2(&got[0].1, &want[0].1)
}

#[test]
fn agrees_with_the_spelled_out_softmax() {
    let cases = [
        // GPT-style: causal, no mask.
        (DType::F32, 2, 4, 4, 9, 9, 8, 8, None, true),
        // BERT-style padding mask [b, 1, 1, sk].
        (DType::F32, 2, 3, 3, 7, 7, 16, 16, Some([2, 1, 1, 7]), false),
        // A full mask, and a mask broadcast over the batch only.
        (DType::F32, 1, 2, 2, 5, 6, 4, 3, Some([1, 2, 5, 6]), false),
        (DType::F32, 3, 2, 2, 5, 6, 4, 4, Some([1, 1, 5, 6]), true),
        // Grouped-query attention: 8 query heads over 2 kv heads.
        (DType::F32, 2, 8, 2, 6, 6, 8, 8, Some([2, 1, 6, 6]), true),
        // Cross attention: sq != sk; ViT: no mask.
        (DType::F32, 1, 2, 2, 3, 11, 8, 8, None, false),
        (DType::F64, 2, 2, 1, 5, 5, 4, 4, Some([2, 1, 1, 5]), true),
        (DType::BF16, 1, 4, 4, 8, 8, 16, 16, None, true),
        (DType::F16, 1, 4, 2, 8, 8, 16, 16, Some([1, 1, 8, 8]), false),
    ];
    for (i, &(dtype, batch, hq, hkv, sq, sk, d, dv, mask, causal)) in cases.iter().enumerate() {
        let c = Case {
            dtype,
            batch,
            hq,
            hkv,
            sq,
            sk,
            d,
            dv,
            mask,
            causal,
        };
        let err = compare(&c, 100 + i as u64 * 10);
        // f32 and f64 follow the spelled-out order of operations; f16/bf16 round
        // once instead of at every op.
        let tol = match dtype {
            DType::F32 | DType::F64 => 1e-6,
            _ => graphc_ir::compare::tolerance(dtype, false),
        };
        assert!(err <= tol, "case {i} ({dtype}): relative L2 {err:e} > {tol:e}");
    }
}

#[test]
fn types_are_checked() {
    let t = |dt: DType, d: &[usize]| Tensor::random(&TensorType::new(dt, d.to_vec()), 1);
    let op = Op::Attention {
        scale: 1.0,
        causal: false,
        zero_masked_rows: false,
    };
    let q = t(DType::F32, &[1, 4, 3, 8]);
    let cases: Vec<(Vec<Tensor>, &str)> = vec![
        (vec![q.clone(), q.clone()], "3 or 4 operands"),
        (
            vec![q.clone(), t(DType::F16, &[1, 4, 3, 8]), q.clone()],
            "float operands of one dtype",
        ),
        (
            vec![
                t(DType::I64, &[1, 4, 3, 8]),
                t(DType::I64, &[1, 4, 3, 8]),
                t(DType::I64, &[1, 4, 3, 8]),
            ],
            "float operands",
        ),
        (vec![t(DType::F32, &[4, 3, 8]); 3], "rank >= 4"),
        (
            vec![q.clone(), t(DType::F32, &[2, 4, 3, 8]), q.clone()],
            "batch dims differ",
        ),
        (vec![q.clone(), t(DType::F32, &[1, 4, 3, 7]), q.clone()], "agreeing"),
        (
            vec![q.clone(), t(DType::F32, &[1, 3, 3, 8]), t(DType::F32, &[1, 3, 3, 8])],
            "multiple",
        ),
        (
            vec![q.clone(), q.clone(), q.clone(), t(DType::F32, &[1, 4, 3])],
            "does not broadcast",
        ),
        (
            vec![q.clone(), q.clone(), q.clone(), t(DType::F32, &[1, 2, 3, 3])],
            "does not broadcast",
        ),
    ];
    for (args, want) in cases {
        let tys: Vec<TensorType> = args.iter().map(|a| a.ty()).collect();
        let refs: Vec<&TensorType> = tys.iter().collect();
        let err = graphc_ir::infer_type(&op, &refs).unwrap_err();
        assert!(err.contains(want), "{err:?} should say {want:?}");
    }
    // A GQA shape and a small mask are fine.
    let k = t(DType::F32, &[1, 2, 5, 8]);
    let v = t(DType::F32, &[1, 2, 5, 6]);
    let m = t(DType::F32, &[1, 1, 1, 5]);
    assert_eq!(run(op, &[q, k, v, m]).ty(), TensorType::new(DType::F32, [1, 4, 3, 6]));
}

#[test]
fn text_form_round_trips() {
    let b = GraphBuilder::new();
    let q = b.input("q", DType::BF16, [2, 4, 3, 8]);
    let k = b.input("k", DType::BF16, [2, 2, 5, 8]);
    let m = b.input("m", DType::BF16, [2, 1, 1, 5]);
    b.output("y", b.attention(q, k, k, Some(m), 0.125, true));
    let g = b.finish().unwrap();
    let text = print(&g);
    assert!(
        text.contains("attention(%0, %1, %1, %2) {scale=0.125, causal=true} : bf16[2,4,3,8]"),
        "{text}"
    );
    let back = parse(&text).unwrap();
    assert_eq!(back, g.canonicalize());
    let bad = text.replace("causal=true", "causal=1");
    assert!(parse(&bad)
        .unwrap_err()
        .to_string()
        .contains("`causal` expects `true` or `false`"));
    let missing = text.replace(", causal=true", "");
    assert!(parse(&missing)
        .unwrap_err()
        .to_string()
        .contains("needs the attribute `causal`"));
}

/// PyTorch's exported attention, spelled out: `where(isnan(p), 0, p)` after the
/// softmax, so a row whose keys are all `-inf` gives 0.
fn spelled_guarded(dtype: DType, mask: &Tensor) -> graphc_ir::Graph {
    let b = GraphBuilder::new();
    let q = b.input("q", dtype, [2, 2, 4, 8]);
    let k = b.input("k", dtype, [2, 2, 6, 8]);
    let v = b.input("v", dtype, [2, 2, 6, 8]);
    let m = b.constant(mask.clone());
    let s = q.matmul(k.t()) * 0.5 + m.broadcast_to(&graphc_ir::Shape::new([2, 2, 4, 6]));
    let p = softmax(s, -1);
    let zero = b.scalar(dtype, 0.0).broadcast_to(&graphc_ir::Shape::new([2, 2, 4, 6]));
    let p = b.select(p.unary(graphc_ir::UnaryOp::IsNan), zero, p);
    b.output("y", p.matmul(v));
    b.finish().unwrap()
}

/// The `zero_masked_rows` attention of the same operands.
fn fused_guarded(dtype: DType, mask: &Tensor, zero: bool) -> graphc_ir::Graph {
    let b = GraphBuilder::new();
    let q = b.input("q", dtype, [2, 2, 4, 8]);
    let k = b.input("k", dtype, [2, 2, 6, 8]);
    let v = b.input("v", dtype, [2, 2, 6, 8]);
    let m = b.constant(mask.clone());
    let flags = graphc_ir::interp::attention::Flags {
        scale: 0.5,
        causal: false,
        zero_masked_rows: zero,
    };
    b.output("y", b.attention_flags((q, k, v), Some(m), flags));
    b.finish().unwrap()
}

#[test]
fn fully_masked_rows_give_zero_with_the_guard_and_nan_without() {
    // [2, 1, 4, 6]: batch 1 row 2 and every row of batch 0's key 0..3 window masked;
    // batch 0 row 0 masked whole.
    let mut mv = vec![0.0; 2 * 4 * 6];
    for j in 0..6 {
        mv[j] = -INF; // batch 0, row 0
        mv[24 + 2 * 6 + j] = -INF; // batch 1, row 2
    }
    mv[24 + 5] = -INF; // batch 1, row 0, key 5: partly masked only
    for dtype in [DType::F32, DType::F64, DType::BF16] {
        let mask = Tensor::from_f64(dtype, vec![2, 1, 4, 6], &mv).unwrap();
        let mut inputs = HashMap::new();
        for (i, (n, d)) in [("q", 4), ("k", 6), ("v", 6)].into_iter().enumerate() {
            let ty = TensorType::new(dtype, [2, 2, d, 8]);
            inputs.insert(n.to_string(), Tensor::randn(&ty, 1.0, 40 + i as u64));
        }
        let want = interpret(&spelled_guarded(dtype, &mask), &inputs).unwrap();
        let got = interpret(&fused_guarded(dtype, &mask, true), &inputs).unwrap();
        let (w, g) = (want[0].1.to_f64_vec(), got[0].1.to_f64_vec());
        assert!(g.iter().all(|x| x.is_finite()), "{dtype}: {g:?}");
        let err = relative_l2(&got[0].1, &want[0].1);
        assert!(err < if dtype == DType::BF16 { 1e-2 } else { 1e-6 }, "{dtype}: {err:e}");
        // Rows (b, h, i) = (0, h, 0) and (1, h, 2) are 0 exactly, in both graphs.
        for h in 0..2 {
            for (b, i) in [(0, 0), (1, 2)] {
                let row = ((b * 2 + h) * 4 + i) * 8;
                assert!(g[row..row + 8].iter().all(|&x| x == 0.0), "{dtype} ({b},{h},{i})");
                assert!(w[row..row + 8].iter().all(|&x| x == 0.0), "{dtype} ({b},{h},{i})");
            }
        }
        // Without the flag those rows are NaN (the softmax of all -inf), the rest equal.
        let plain = interpret(&fused_guarded(dtype, &mask, false), &inputs).unwrap()[0]
            .1
            .to_f64_vec();
        for (n, (p, x)) in plain.iter().zip(&g).enumerate() {
            let row = n / 8;
            let (b, i) = (row / 8, row % 4);
            if (b, i) == (0, 0) || (b, i) == (1, 2) {
                assert!(p.is_nan(), "{dtype} element {n}");
            } else {
                assert_eq!(p, x, "{dtype} element {n}");
            }
        }
    }
}

#[test]
fn zero_masked_rows_text_form() {
    let mask = Tensor::from_f64(DType::F32, vec![2, 1, 4, 6], &[0.0; 48]).unwrap();
    let g = fused_guarded(DType::F32, &mask, true);
    let text = print(&g);
    assert!(
        text.contains("{scale=0.5, causal=false, zero_masked_rows=true} : f32[2,2,4,8]"),
        "{text}"
    );
    assert_eq!(parse(&text).unwrap(), g.canonicalize());
    // Absent means false; printed only when true.
    let off = text.replace(", zero_masked_rows=true", "");
    let back = parse(&off).unwrap();
    assert_eq!(back, fused_guarded(DType::F32, &mask, false).canonicalize());
    assert!(!print(&back).contains("zero_masked_rows"));
    let bad = text.replace("zero_masked_rows=true", "zero_masked_rows=2");
    assert!(parse(&bad)
        .unwrap_err()
        .to_string()
        .contains("`zero_masked_rows` expects `true` or `false`"));
}
