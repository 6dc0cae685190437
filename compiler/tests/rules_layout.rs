//! Layout rules of the e-graph optimizer: each rewrite fires where it should, leaves the
//! expected structure, and keeps outputs bit-identical; tricky cases are left alone.

use std::collections::HashMap;

use graphc_compiler::optimize::{optimize, OptimizeReport};
use graphc_ir::{interpret, DType, Graph, GraphBuilder, Op, Shape, SliceRange, Tensor, TensorType, Value};

/// Optimize `g`, check outputs are bit-identical on random inputs, return the result.
fn run(g: &Graph) -> (Graph, OptimizeReport) {
    let (out, report) = optimize(g, &Default::default()).unwrap();
    out.verify().unwrap();
    for seed in 0..4 {
        let inputs: HashMap<String, Tensor> = g
            .inputs()
            .iter()
            .map(|&id| {
                let node = g.node(id);
                let name = g.input_name(id).unwrap().to_string();
                (name, Tensor::random(&node.ty, seed * 31 + id.0 as u64))
            })
            .collect();
        let want = interpret(g, &inputs).unwrap();
        let got = interpret(&out, &inputs).unwrap();
        assert_eq!(want.len(), got.len());
        for ((wn, w), (gn, o)) in want.iter().zip(&got) {
            assert_eq!(wn, gn);
            assert_eq!(w.ty(), o.ty(), "output {wn}");
            let (wb, ob): (Vec<u64>, Vec<u64>) = (
                w.to_f64_vec().iter().map(|x| x.to_bits()).collect(),
                o.to_f64_vec().iter().map(|x| x.to_bits()).collect(),
            );
            assert_eq!(wb, ob, "output {wn} differs");
        }
    }
    (out, report)
}

fn count(g: &Graph, pred: impl Fn(&Op) -> bool) -> usize {
    g.nodes().iter().filter(|n| pred(&n.op)).count()
}

fn ops<'g>(g: &'g Graph, pred: impl Fn(&Op) -> bool + 'g) -> impl Iterator<Item = &'g Op> + 'g {
    g.nodes().iter().map(|n| &n.op).filter(move |o| pred(o))
}

fn fired(report: &OptimizeReport, rule: &str) -> bool {
    report.rules_fired.get(rule).copied().unwrap_or(0) > 0
}

fn is_transpose(o: &Op) -> bool {
    matches!(o, Op::Transpose { .. })
}
fn is_reshape(o: &Op) -> bool {
    matches!(o, Op::Reshape { .. })
}
fn is_broadcast(o: &Op) -> bool {
    matches!(o, Op::Broadcast { .. })
}
fn is_slice(o: &Op) -> bool {
    matches!(o, Op::Slice { .. })
}
fn is_concat(o: &Op) -> bool {
    matches!(o, Op::Concat { .. })
}

fn the_slice(g: &Graph) -> Vec<SliceRange> {
    let slices: Vec<&Op> = ops(g, is_slice).collect();
    assert_eq!(slices.len(), 1, "exactly one slice");
    match slices[0] {
        Op::Slice { ranges } => ranges.clone(),
        _ => unreachable!(),
    }
}

fn r(start: i64, end: i64, step: i64) -> SliceRange {
    SliceRange { start, end, step }
}

/// The output of `g` is an input, untouched (only the input node is left).
fn output_is_input(g: &Graph) {
    assert_eq!(g.len(), 1, "only the input remains");
    assert!(matches!(g.node(g.outputs()[0].node).op, Op::Input { .. }));
}

fn input<'b>(b: &'b GraphBuilder, dims: &[usize]) -> Value<'b> {
    b.input("x", DType::F32, dims.to_vec())
}

#[test]
fn transpose_transpose_cancels() {
    let b = GraphBuilder::new();
    let x = input(&b, &[3, 4]);
    b.output("y", x.transpose(&[1, 0]).transpose(&[1, 0]));
    let (out, report) = run(&b.finish().unwrap());
    assert!(fired(&report, "transpose-transpose"));
    assert_eq!(count(&out, is_transpose), 0);
    output_is_input(&out);
}

#[test]
fn transpose_transpose_composes() {
    let b = GraphBuilder::new();
    let x = input(&b, &[2, 3, 4]);
    let p = [1, 2, 0];
    let q = [2, 0, 1];
    let q2 = [0, 2, 1];
    b.output("y", x.transpose(&p).transpose(&q2));
    b.output("z", x.transpose(&q).transpose(&q).transpose(&q));
    let (out, report) = run(&b.finish().unwrap());
    assert!(fired(&report, "transpose-transpose"));
    // y: one transpose by p∘q2 = [p[0], p[2], p[1]]; z: q three times is the identity.
    let perms: Vec<&Op> = ops(&out, is_transpose).collect();
    assert_eq!(perms, [&Op::Transpose { perm: vec![1, 0, 2] }]);
    assert!(matches!(out.node(out.outputs()[1].node).op, Op::Input { .. }));
}

#[test]
fn transpose_identity_removed() {
    let b = GraphBuilder::new();
    let x = input(&b, &[2, 3]);
    b.output("y", x.transpose(&[0, 1]).exp());
    let (out, report) = run(&b.finish().unwrap());
    assert!(fired(&report, "transpose-identity"));
    assert_eq!(count(&out, is_transpose), 0);
}

#[test]
fn reshape_reshape_collapses() {
    let b = GraphBuilder::new();
    let x = input(&b, &[2, 3, 4]);
    b.output("y", x.reshape([6, 4]).reshape([4, 6]).exp());
    b.output("z", x.reshape([24]).reshape([2, 12]).reshape([2, 3, 4]));
    let (out, report) = run(&b.finish().unwrap());
    assert!(fired(&report, "reshape-reshape"));
    let reshapes: Vec<&Op> = ops(&out, is_reshape).collect();
    assert_eq!(
        reshapes,
        [&Op::Reshape {
            shape: Shape::new([4, 6])
        }]
    );
    assert!(matches!(out.node(out.outputs()[1].node).op, Op::Input { .. }));
}

#[test]
fn reshape_identity_removed() {
    let mut g = Graph::new();
    let ty = TensorType::new(DType::F32, [2, 3]);
    let x = g
        .add(
            Op::Input {
                name: "x".into(),
                ty: ty.clone(),
            },
            vec![],
            None,
        )
        .unwrap();
    let y = g
        .add(
            Op::Reshape {
                shape: Shape::new([2, 3]),
            },
            vec![x],
            None,
        )
        .unwrap();
    g.add_output("y", y);
    g.verify().unwrap();
    let (out, report) = run(&g);
    assert!(fired(&report, "reshape-identity"));
    output_is_input(&out);
}

#[test]
fn broadcast_identity_removed() {
    let mut g = Graph::new();
    let ty = TensorType::new(DType::F32, [2, 3]);
    let x = g.add(Op::Input { name: "x".into(), ty }, vec![], None).unwrap();
    let y = g
        .add(
            Op::Broadcast {
                shape: Shape::new([2, 3]),
            },
            vec![x],
            None,
        )
        .unwrap();
    g.add_output("y", y);
    let (out, report) = run(&g);
    assert!(fired(&report, "broadcast-identity"));
    output_is_input(&out);
}

#[test]
fn broadcast_broadcast_collapses() {
    let b = GraphBuilder::new();
    let x = input(&b, &[3, 1]);
    let y = x
        .broadcast_to(&Shape::new([1, 3, 4]))
        .broadcast_to(&Shape::new([2, 5, 3, 4]));
    b.output("y", y.exp());
    let (out, report) = run(&b.finish().unwrap());
    assert!(fired(&report, "broadcast-broadcast"));
    let bcasts: Vec<&Op> = ops(&out, is_broadcast).collect();
    assert_eq!(
        bcasts,
        [&Op::Broadcast {
            shape: Shape::new([2, 5, 3, 4])
        }]
    );
}

#[test]
fn slice_identity_removed() {
    let b = GraphBuilder::new();
    let x = input(&b, &[4, 1, 3]);
    // Full, explicit-bounds full, and a strided range over an extent of 1.
    let y = x.slice_ranges(vec![SliceRange::full(), r(0, 5, 7), r(-3, 3, 1)]);
    b.output("y", y.exp());
    let (out, report) = run(&b.finish().unwrap());
    assert!(fired(&report, "slice-identity"));
    assert_eq!(count(&out, is_slice), 0);
}

#[test]
fn slice_not_identity_kept() {
    let b = GraphBuilder::new();
    let x = input(&b, &[4, 3]);
    b.output("rev", x.slice(0, -1, -5, -1).exp());
    b.output("strided", x.slice(1, 0, 3, 2).exp());
    let (out, report) = run(&b.finish().unwrap());
    assert!(!fired(&report, "slice-identity"));
    assert_eq!(count(&out, is_slice), 2);
}

#[test]
fn slice_slice_composes() {
    let b = GraphBuilder::new();
    let x = input(&b, &[20, 6]);
    // Axis 0: [2:18:2] takes 2,4,..,16; then [1:7:3] takes positions 1,4 -> 4,10.
    // Axis 1: [1:] then [:-1] -> [1:5].
    let y = x.slice_ranges(vec![r(2, 18, 2), r(1, i64::MAX, 1)]);
    let y = y.slice_ranges(vec![r(1, 7, 3), r(0, -1, 1)]);
    b.output("y", y);
    let (out, report) = run(&b.finish().unwrap());
    assert!(fired(&report, "slice-slice"));
    assert_eq!(the_slice(&out), [r(4, 11, 6), r(1, 5, 1)]);
}

#[test]
fn slice_slice_to_identity_and_reversals() {
    let b = GraphBuilder::new();
    let x = input(&b, &[5]);
    // Reversing twice is the identity.
    b.output("twice", x.slice(0, -1, i64::MIN, -1).slice(0, -1, i64::MIN, -1));
    // [1:] then [:3] -> [1:4].
    b.output("inner", x.slice(0, 1, 5, 1).slice(0, 0, 3, 1));
    let (out, report) = run(&b.finish().unwrap());
    assert!(fired(&report, "slice-slice"));
    assert!(matches!(out.node(out.outputs()[0].node).op, Op::Input { .. }));
    assert_eq!(the_slice(&out), [r(1, 4, 1)]);
}

#[test]
fn slice_slice_negative_down_to_zero_not_composed() {
    let b = GraphBuilder::new();
    let x = input(&b, &[4]);
    // x[::-1][1:] takes 2,1,0: the composed range would need end -1.
    b.output("y", x.slice(0, -1, i64::MIN, -1).slice(0, 1, 4, 1));
    // x[::-1][:2] takes 3,2: expressible as [3:1:-1].
    b.output("z", x.slice(0, -1, i64::MIN, -1).slice(0, 0, 2, 1).exp());
    let (out, _) = run(&b.finish().unwrap());
    let y = out.node(out.outputs()[0].node);
    assert!(is_slice(&y.op));
    assert!(is_slice(&out.node(y.inputs[0]).op), "y keeps two slices");
    let z = out.node(out.node(out.outputs()[1].node).inputs[0]);
    assert_eq!(
        z.op,
        Op::Slice {
            ranges: vec![r(3, 1, -1)]
        }
    );
}

#[test]
fn slice_of_concat_inside_one_operand() {
    let b = GraphBuilder::new();
    let a = b.input("a", DType::F32, [2, 3]);
    let c = b.input("c", DType::F32, [4, 3]);
    let d = b.input("d", DType::F32, [1, 3]);
    let cat = b.concat(&[a, c, d], 0);
    // Rows 3..5 lie in c (rows 2..6), columns 1: sliced too.
    b.output("y", cat.slice_ranges(vec![r(3, 5, 1), r(1, 3, 1)]));
    // Exactly c.
    b.output("z", cat.slice(0, 2, 6, 1).exp());
    // Exactly d, with a negative start.
    b.output("w", cat.slice(0, -1, 7, 1).exp());
    let (out, report) = run(&b.finish().unwrap());
    assert!(fired(&report, "slice-of-concat"));
    assert_eq!(count(&out, is_concat), 0);
    assert_eq!(the_slice(&out), [r(1, 3, 1), r(1, 3, 1)]);
    let y = out.node(out.outputs()[0].node);
    assert_eq!(out.input_name(y.inputs[0]), Some("c"));
    let z = out.node(out.outputs()[1].node);
    assert_eq!(out.input_name(z.inputs[0]), Some("c"));
    let w = out.node(out.outputs()[2].node);
    assert_eq!(out.input_name(w.inputs[0]), Some("d"));
}

#[test]
fn slice_of_concat_straddling_not_rewritten() {
    let b = GraphBuilder::new();
    let a = b.input("a", DType::F32, [2, 3]);
    let c = b.input("c", DType::F32, [4, 3]);
    let cat = b.concat(&[a, c], 0);
    b.output("y", cat.slice(0, 1, 4, 1));
    let (out, report) = run(&b.finish().unwrap());
    assert!(!fired(&report, "slice-of-concat"));
    assert_eq!(count(&out, is_concat), 1);
    assert_eq!(count(&out, is_slice), 1);
}

#[test]
fn concat_of_slices_merges() {
    let b = GraphBuilder::new();
    let x = input(&b, &[3, 10]);
    let parts: Vec<Value> = [(1, 3), (3, 4), (4, 8)]
        .iter()
        .map(|&(s, e)| x.slice(1, s, e, 1))
        .collect();
    b.output("y", b.concat(&parts, 1));
    let (out, report) = run(&b.finish().unwrap());
    assert!(fired(&report, "concat-of-slices"));
    assert_eq!(count(&out, is_concat), 0);
    assert_eq!(the_slice(&out), [SliceRange::full(), r(1, 8, 1)]);
}

#[test]
fn concat_of_slices_covering_all_is_the_value() {
    let b = GraphBuilder::new();
    let x = input(&b, &[6, 2]);
    let parts = [x.slice(0, 0, 2, 1), x.slice(0, 2, 3, 1), x.slice(0, 3, 6, 1)];
    b.output("y", b.concat(&parts, 0));
    let (out, report) = run(&b.finish().unwrap());
    assert!(fired(&report, "concat-of-slices"));
    output_is_input(&out);
}

#[test]
fn concat_of_slices_merges_a_run_among_others() {
    let b = GraphBuilder::new();
    let x = input(&b, &[8]);
    let other = b.input("o", DType::F32, [3]);
    let parts = [other, x.slice(0, 0, 2, 1), x.slice(0, 2, 5, 1), other];
    b.output("y", b.concat(&parts, 0));
    let (out, report) = run(&b.finish().unwrap());
    assert!(fired(&report, "concat-of-slices"));
    assert_eq!(the_slice(&out), [r(0, 5, 1)]);
    let cat = out.node(out.outputs()[0].node);
    assert!(is_concat(&cat.op));
    assert_eq!(cat.inputs.len(), 3);
}

#[test]
fn concat_of_slices_not_adjacent_or_strided_kept() {
    let b = GraphBuilder::new();
    let x = input(&b, &[8, 4]);
    // A gap (2..3 missing), a stride, and different ranges on the other axis.
    b.output("gap", b.concat(&[x.slice(0, 0, 2, 1), x.slice(0, 3, 5, 1)], 0));
    b.output("strided", b.concat(&[x.slice(0, 0, 4, 2), x.slice(0, 4, 8, 2)], 0));
    let other = [
        x.slice_ranges(vec![r(0, 2, 1), r(0, 2, 1)]),
        x.slice_ranges(vec![r(2, 4, 1), r(1, 3, 1)]),
    ];
    b.output("other", b.concat(&other, 0));
    let (out, report) = run(&b.finish().unwrap());
    assert!(!fired(&report, "concat-of-slices"));
    assert_eq!(count(&out, is_concat), 3);
}

/// Many slice chains and slices of a concat, with negative and out-of-range bounds and
/// negative steps: every output stays bit-identical (checked by `run`).
#[test]
fn slice_rules_exact_over_many_ranges() {
    let ranges = [
        r(0, i64::MAX, 1),
        r(1, 6, 2),
        r(-2, -9, -1),
        r(-1, i64::MIN, -2),
        r(5, 1, -3),
        r(2, 3, 1),
        r(3, 3, 1),
        r(-100, 100, 3),
        r(6, 0, -1),
    ];
    let b = GraphBuilder::new();
    let x = input(&b, &[7]);
    let a = b.input("a", DType::F32, [3]);
    let c = b.input("c", DType::F32, [4]);
    let cat = b.concat(&[a, c], 0);
    let mut k = 0;
    for &r1 in &ranges {
        for &r2 in &ranges {
            b.output(&format!("s{k}"), x.slice_ranges(vec![r1]).slice_ranges(vec![r2]));
            k += 1;
        }
        b.output(&format!("c{k}"), cat.slice_ranges(vec![r1]));
        k += 1;
    }
    let (_, report) = run(&b.finish().unwrap());
    assert!(fired(&report, "slice-slice"));
    assert!(fired(&report, "slice-of-concat"));
}

/// `gather-affine`: a gather along axis 0 whose index walks the data row-major (a
/// constant, or computed from iotas as ONNX GatherND's lowering computes it, with the
/// never-firing wrap of negative indices) is a reshape, or a broadcast of one where
/// the walk repeats over an axis; other indices keep the gather.
#[test]
fn gathers_of_affine_indices_are_views() {
    let (b, s) = (3usize, 5usize);
    let build = |idx: &dyn for<'b> Fn(&'b GraphBuilder) -> Value<'b>| {
        let g = GraphBuilder::new();
        let x = g.input("x", DType::F32, [b * s, 2]);
        g.output("y", x.gather(idx(&g), 0));
        g.finish().unwrap()
    };
    let flat: Vec<f64> = (0..b * s).map(|i| i as f64).collect();
    let constant = build(&|g| g.constant(Tensor::from_f64(DType::I64, vec![b, 1, s], &flat).unwrap()));
    // GatherND's lowering: batch iota * s + position iota, each wrapped if negative.
    let computed = build(&|g| {
        let bi = g.iota(DType::I64, [b, 1, s], 0);
        let j = g.iota(DType::I64, [b, 1, s], 2);
        let bi = g.select(bi.lt(0.0), bi + b as f64, bi);
        let j = g.select(j.lt(0.0), j + s as f64, j);
        bi * s as f64 + j
    });
    for g in [&constant, &computed] {
        let (opt, r) = run(g);
        assert!(fired(&r, "gather-affine"), "{r:?}");
        assert_eq!(
            count(&opt, |o| matches!(o, Op::Gather { .. })),
            0,
            "{}",
            graphc_ir::print(&opt)
        );
    }
    // Repeated over an axis: [s, b] walking only the positions (a broadcast).
    let repeated = {
        let g = GraphBuilder::new();
        let x = g.input("x", DType::F32, [s, 2]);
        g.output("y", x.gather(g.iota(DType::I64, [b, s], 1), 0));
        g.finish().unwrap()
    };
    let (opt, _) = run(&repeated);
    assert_eq!(
        count(&opt, |o| matches!(o, Op::Gather { .. })),
        0,
        "{}",
        graphc_ir::print(&opt)
    );
    // A permutation, an offset walk and a walk of part of the rows stay gathers.
    let perm: Vec<f64> = (0..b * s).rev().map(|i| i as f64).collect();
    let shifted: Vec<f64> = (0..b * s).map(|i| ((i + 1) % (b * s)) as f64).collect();
    for v in [&perm, &shifted] {
        let g = build(&|g| g.constant(Tensor::from_f64(DType::I64, vec![b * s], v).unwrap()));
        let (opt, _) = run(&g);
        assert_eq!(count(&opt, |o| matches!(o, Op::Gather { .. })), 1);
    }
    let part = build(&|g| g.iota(DType::I64, [b], 0));
    let (opt, _) = run(&part);
    assert_eq!(count(&opt, |o| matches!(o, Op::Gather { .. })), 1);
}
