//! The attention kernel on the CPU (tiled online softmax, `src/kernels/attention.rs`)
//! against the interpreter's two-pass definition: one attention kernel per graph, its
//! operands read through strided views (q, k, v sliced and transposed out of one qkv
//! projection, as GPT-2 exports them), masks at their small shapes, causal rows,
//! grouped-query heads, key counts that do and do not fill a tile, every float dtype.
//! Run through the memory plan's arena.

mod planned;

use std::collections::HashMap;

use graphc_compiler::fuse::fuse;
use graphc_compiler::kernel::print_program;
use graphc_ir::compare::relative_l2;
use graphc_ir::{interpret, DType, Graph, GraphBuilder, Tensor};
use planned::run_arena;

/// Fuse `g`, check it has exactly one attention kernel, and compare its arena run with
/// the interpreter (relative L2 within `tol`).
fn check(g: &Graph, tol: f64) {
    let program = fuse(g).unwrap();
    let n = program.kernels.iter().filter(|k| k.kind_name() == "attention").count();
    assert_eq!(n, 1, "{}", print_program(&program));
    let inputs: HashMap<String, Tensor> = g
        .inputs()
        .iter()
        .enumerate()
        .map(|(i, &id)| {
            let name = g.input_name(id).unwrap().to_string();
            (name, Tensor::randn(&g.node(id).ty, 1.0, 70 + i as u64))
        })
        .collect();
    let want = interpret(g, &inputs).unwrap();
    let got = run_arena(&program, g.weights(), &inputs).unwrap();
    for (name, a, b) in graphc_ir::compare::zip_outputs(&got, &want).unwrap() {
        let err = relative_l2(a, b);
        assert!(
            err <= tol,
            "{name}: relative L2 {err:e} > {tol:e}\n{}",
            print_program(&program)
        );
    }
}

/// dtype, [b, hq, hkv, sq, sk, d], mask shape, causal.
type Case = (DType, [usize; 6], Option<[usize; 4]>, bool);

#[test]
fn shapes_masks_and_dtypes() {
    #[rustfmt::skip]
    let cases: [Case; 9] = [
        // dtype, [b, hq, hkv, sq, sk, d], mask, causal
        (DType::F32, [2, 4, 4, 9, 9, 8], None, true),
        (DType::F32, [1, 2, 2, 70, 70, 16], None, true),   // keys over two tiles and a part
        (DType::F32, [2, 3, 3, 7, 33, 8], Some([2, 1, 1, 33]), false),
        (DType::F32, [1, 8, 2, 5, 64, 32], Some([1, 1, 5, 64]), true),
        (DType::F32, [3, 2, 1, 4, 4, 4], Some([3, 2, 4, 4]), false),
        (DType::F64, [1, 2, 2, 6, 40, 8], Some([1, 2, 1, 40]), true),
        (DType::BF16, [1, 4, 4, 16, 16, 64], None, true),
        (DType::F16, [2, 2, 1, 8, 8, 32], Some([2, 1, 8, 8]), false),
        (DType::F32, [1, 1, 1, 3, 1, 8], None, false),    // one key
    ];
    for (dt, [b, hq, hkv, sq, sk, d], mask, causal) in cases {
        let bl = GraphBuilder::new();
        let q = bl.input("q", dt, [b, hq, sq, d]);
        let k = bl.input("k", dt, [b, hkv, sk, d]);
        let v = bl.input("v", dt, [b, hkv, sk, d + 3]);
        let m = mask.map(|m| bl.input("m", dt, m));
        bl.output("y", bl.attention(q, k, v, m, 0.3, causal));
        let g = bl.finish().unwrap();
        let tol = match dt {
            DType::F32 | DType::F64 => 1e-6,
            _ => graphc_ir::compare::tolerance(dt, false),
        };
        check(&g, tol);
    }
}

#[test]
fn operands_read_through_strided_views() {
    // GPT-2's layout: one qkv projection [b, s, 3 * h * d], sliced per q/k/v, reshaped
    // to heads and transposed to [b, h, s, d]; the output transposed back.
    let (b, s, h, d) = (2, 19, 3, 8);
    let bl = GraphBuilder::new();
    let qkv = bl.input("qkv", DType::F32, [b, s, 3 * h * d]);
    let part = |i: i64| {
        qkv.slice(-1, i * (h * d) as i64, (i + 1) * (h * d) as i64, 1)
            .reshape([b, s, h, d])
            .transpose(&[0, 2, 1, 3])
    };
    let y = bl.attention(part(0), part(1), part(2), None, 0.35, true);
    bl.output("y", y.transpose(&[0, 2, 1, 3]).reshape([b, s, h * d]));
    let g = bl.finish().unwrap();
    check(&g, 1e-6);
}

#[test]
fn a_fully_masked_row_is_nan_as_defined() {
    let bl = GraphBuilder::new();
    let q = bl.input("q", DType::F32, [1, 1, 2, 4]);
    let k = bl.input("k", DType::F32, [1, 1, 3, 4]);
    let mask = bl.constant(
        Tensor::from_f64(
            DType::F32,
            vec![1, 1, 2, 3],
            &[
                0.0,
                f64::NEG_INFINITY,
                0.0,
                f64::NEG_INFINITY,
                f64::NEG_INFINITY,
                f64::NEG_INFINITY,
            ],
        )
        .unwrap(),
    );
    bl.output("y", bl.attention(q, k, k, Some(mask), 1.0, false));
    let g = bl.finish().unwrap();
    let program = fuse(&g).unwrap();
    let inputs: HashMap<String, Tensor> = [
        ("q".to_string(), Tensor::randn(&g.node(g.inputs()[0]).ty, 1.0, 1)),
        ("k".to_string(), Tensor::randn(&g.node(g.inputs()[1]).ty, 1.0, 2)),
    ]
    .into();
    let got = run_arena(&program, g.weights(), &inputs).unwrap()[0].1.to_f64_vec();
    let want = interpret(&g, &inputs).unwrap()[0].1.to_f64_vec();
    assert!(got[..4].iter().all(|x| x.is_finite()), "{got:?}");
    assert!(got[4..].iter().all(|x| x.is_nan()), "{got:?}");
    assert!(want[4..].iter().all(|x| x.is_nan()), "{want:?}");
}
