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
