//! The `.gir` text format: round trips, canonical numbering, parse errors, fuzzing,
//! weights files, JSON.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;

use common::{rand_tensor, random_graph};
use graphc_ir::verify::ancestors;
use graphc_ir::{
    load_gir, load_safetensors, parse, parse_module, print, print_with_weights, save_gir, save_safetensors,
    ArgReduceOp, BinaryOp, DType, Graph, Op, ReduceOp, Rng, Shape, Tensor, TensorData, TensorType, UnaryOp,
};

fn all_op_names() -> BTreeSet<&'static str> {
    let mut names: BTreeSet<&'static str> = [
        "input",
        "param",
        "constant",
        "iota",
        "select",
        "cast",
        "broadcast",
        "matmul",
        "reshape",
        "transpose",
        "slice",
        "concat",
        "gather",
        "pad",
    ]
    .into_iter()
    .collect();
    names.extend(UnaryOp::ALL.iter().map(|u| u.name()));
    names.extend(BinaryOp::ALL.iter().map(|b| b.name()));
    names.extend(ReduceOp::ALL.iter().map(|r| r.name()));
    names.extend([ArgReduceOp::ArgMax.name(), ArgReduceOp::ArgMin.name()]);
    names
}

#[test]
fn round_trip_1000_random_graphs() {
    let mut ops = BTreeSet::new();
    let mut constant_dtypes = BTreeSet::new();
    let (mut dead, mut multi_output, mut neg_step) = (0, 0, 0);
    for seed in 0..1000 {
        let g = random_graph(seed);
        let t = print(&g);
        let g2 = parse(&t).unwrap_or_else(|e| panic!("seed {seed}: {e}\n{t}"));
        assert_eq!(print(&g2), t, "seed {seed}");
        assert_eq!(g2, g.canonicalize(), "seed {seed}\n{t}");
        assert_eq!(print(&g.canonicalize()), t, "seed {seed}");

        for n in g.nodes() {
            ops.insert(n.op.name());
            match &n.op {
                Op::Constant { value } => {
                    constant_dtypes.insert(value.dtype());
                }
                Op::Slice { ranges } if ranges.iter().any(|r| r.step < 0) => neg_step += 1,
                _ => {}
            }
        }
        let live: BTreeSet<_> = g.outputs().iter().flat_map(|o| ancestors(&g, o.node)).collect();
        if live.len() + g.inputs().len() < g.len() {
            dead += 1;
        }
        if g.outputs().len() > 1 {
            multi_output += 1;
        }
    }
    let missing: Vec<_> = all_op_names().difference(&ops).copied().collect();
    assert!(missing.is_empty(), "ops never generated: {missing:?}");
    assert_eq!(constant_dtypes.len(), DType::ALL.len());
    assert!(
        dead > 50 && multi_output > 100 && neg_step > 50,
        "{dead} {multi_output} {neg_step}"
    );
}

/// Renumber ids arbitrarily and define nodes in a random topological order (each
/// before its first use, but not in canonical order): the parsed graph canonicalizes
/// to the same graph. (Every sink is made an output first: dead nodes are numbered in
/// table order, which the shuffle changes.) Defining them in reverse, every reference
/// forward, is an error (the format has no forward references).
#[test]
fn ids_in_any_order_defined_before_use() {
    for seed in 0..200 {
        let mut g = random_graph(seed);
        let users = g.users();
        for (i, u) in users.iter().enumerate() {
            let id = graphc_ir::NodeId(i as u32);
            if u.is_empty() && g.input_name(id).is_none() && !g.outputs().iter().any(|o| o.node == id) {
                g.add_output(format!("sink{i}"), id);
            }
        }
        let t = print(&g);
        let lines: Vec<&str> = t.lines().collect();
        let renumber = |line: &str| {
            // %N -> %(N * 7 + 1000), outside strings (names never hold `%` before a digit
            // ... except "%0 = neg", so only rewrite tokens outside quotes).
            let mut out = String::new();
            let mut in_str = false;
            let mut chars = line.chars().peekable();
            while let Some(c) = chars.next() {
                if in_str {
                    out.push(c);
                    if c == '\\' {
                        if let Some(n) = chars.next() {
                            out.push(n);
                        }
                    } else if c == '"' {
                        in_str = false;
                    }
                } else if c == '"' {
                    in_str = true;
                    out.push(c);
                } else if c == '%' {
                    let mut n = String::new();
                    while let Some(d) = chars.peek().filter(|d| d.is_ascii_digit()) {
                        n.push(*d);
                        chars.next();
                    }
                    let n: u64 = n.parse().unwrap();
                    out.push_str(&format!("%{}", n * 7 + 1000));
                } else {
                    out.push(c);
                }
            }
            out
        };
        let body: Vec<String> = lines[1..lines.len() - 1].iter().map(|l| renumber(l)).collect();
        // Node line k defines %k of the canonical graph; outputs follow.
        let gc = g.canonicalize();
        let (nodes, outputs) = body.split_at(gc.len());
        let mut rng = Rng::new(seed);
        let users = gc.users();
        let mut pending = vec![0usize; gc.len()];
        for u in users.iter().flatten() {
            pending[u.index()] += 1;
        }
        // Input lines first, in call order (the input list is the order of the lines).
        let is_input = |k: usize| matches!(gc.node(graphc_ir::NodeId(k as u32)).op, Op::Input { .. });
        let mut ready: Vec<usize> = (0..gc.len()).filter(|&k| pending[k] == 0 && !is_input(k)).collect();
        let mut shuffled: Vec<&String> = (0..gc.len()).filter(|&k| is_input(k)).map(|k| &nodes[k]).collect();
        for k in (0..gc.len()).filter(|&k| is_input(k)) {
            for u in &users[k] {
                pending[u.index()] -= 1;
                if pending[u.index()] == 0 {
                    ready.push(u.index());
                }
            }
        }
        while !ready.is_empty() {
            let k = ready.swap_remove(rng.below(ready.len() as u64) as usize);
            shuffled.push(&nodes[k]);
            for u in &users[k] {
                pending[u.index()] -= 1;
                if pending[u.index()] == 0 {
                    ready.push(u.index());
                }
            }
        }
        assert_eq!(shuffled.len(), gc.len(), "seed {seed}");
        shuffled.extend(outputs);
        let src = format!(
            "# reordered\ngraph {{\n{}\n}}\n",
            shuffled.iter().map(|s| s.as_str()).collect::<Vec<_>>().join("\n")
        );
        let g2 = parse(&src).unwrap_or_else(|e| panic!("seed {seed}: {e}\n{src}"));
        assert_eq!(g2.canonicalize(), g.canonicalize(), "seed {seed}\n{src}");
        assert_eq!(print(&g2), t);

        let mut reversed: Vec<&String> = nodes.iter().rev().collect();
        reversed.extend(outputs);
        let src = format!(
            "graph {{\n{}\n}}\n",
            reversed.iter().map(|s| s.as_str()).collect::<Vec<_>>().join("\n")
        );
        let has_operands = gc.nodes().iter().any(|n| !n.inputs.is_empty());
        match parse(&src) {
            Err(e) => assert!(e.message.contains("is used before its definition"), "seed {seed}: {e}"),
            Ok(_) => assert!(!has_operands, "seed {seed}: forward references parsed\n{src}"),
        }
    }
}

#[test]
fn example_from_the_spec_parses() {
    let src = r#"
# comments start with '#', to end of line
graph {
  weights "transformer_block.safetensors"      # optional
  %0 = input "x" : f32[2,16,256]
  %1 = param "ln1.weight" : f32[256]
  %2 = constant {value=[1.0e-5]} : f32[]
  %3 = reduce_mean(%0) {axes=[2], keepdims=true} : f32[2,16,1]
  %4 = broadcast(%3) {shape=[2,16,256]} : f32[2,16,256]
  %5 = sub "ln1/center" (%0, %4) : f32[2,16,256]
  %6 = broadcast(%1) {shape=[2,16,256]} : f32[2,16,256]
  %7 = mul(%5, %6) : f32[2,16,256]
  output "y" = %7
}
"#;
    let (g, weights) = parse_module(src).unwrap();
    assert_eq!(weights.as_deref(), Some("transformer_block.safetensors"));
    assert_eq!(g.len(), 8);
    assert_eq!(g.node(graphc_ir::NodeId(5)).name.as_deref(), Some("ln1/center"));
    // The constant 1e-5 is dead: it prints after the live nodes.
    let expected = r#"graph {
  weights "transformer_block.safetensors"
  %0 = input "x" : f32[2,16,256]
  %1 = reduce_mean(%0) {axes=[2], keepdims=true} : f32[2,16,1]
  %2 = broadcast(%1) {shape=[2,16,256]} : f32[2,16,256]
  %3 = sub "ln1/center" (%0, %2) : f32[2,16,256]
  %4 = param "ln1.weight" : f32[256]
  %5 = broadcast(%4) {shape=[2,16,256]} : f32[2,16,256]
  %6 = mul(%3, %5) : f32[2,16,256]
  %7 = constant {value=[1e-5]} : f32[]
  output "y" = %6
}
"#;
    assert_eq!(print_with_weights(&g, Some("transformer_block.safetensors")), expected);
    assert!(!print(&g).contains("weights"));
}

#[test]
fn every_attribute_prints_as_documented() {
    let src = r#"graph {
  %0 = input "x" {name="the x"} : f32[2,3]
  %1 = param "p\"q\\r\n\t\u{1}é" : i64[3]
  %2 = iota {axis=1} : i32[2,3]
  %3 = cast(%2) {to=f32} : f32[2,3]
  %4 = slice(%0) {ranges=[max:min:-1, -1:-9:-2]} : f32[2,2]
  %5 = pad(%4) {pads=[(1,-1),(0,2)], mode=constant, value=-0.0} : f32[2,4]
  %6 = pad(%4) {pads=[(0,0),(1,1)], mode=reflect, value=inf} : f32[2,4]
  %7 = pad(%4) {pads=[(0,0),(1,1)], mode=edge, value=nan(0x7ff0000000000001)} : f32[2,4]
  %8 = argmin(%0) {axis=1, keepdims=false} : i64[2]
  %9 = transpose(%0) {perm=[1,0]} : f32[3,2]
  %10 = reshape(%9) {shape=[6]} : f32[6]
  %11 = concat(%10, %10) {axis=0} : f32[12]
  %12 = gather(%11, %1) {axis=0} : f32[3]
  %13 = constant {value=[nan, -nan, nan(0x7f800001), inf, -inf, -0.0, 1e-45, 3.4028235e38]} : f32[2,4]
  %14 = constant {value=[nan, nan(0xfe01), 65504.0, 6e-8]} : f16[4]
  %15 = constant {value=[-nan, nan(0x7f81), 1.0, 3.3895314e38]} : bf16[2,2]
  %16 = constant {value=[-9223372036854775808, 9223372036854775807]} : i64[2]
  %17 = constant {value=[true, false]} : bool[2]
  %18 = constant {value=[-128, 127]} : i8[2]
  %19 = constant {value=[0, 255]} : u8[2]
  %20 = constant {value=[-nan, 1e-300, 0.1]} : f64[3]
  output "a" = %3
  output "b" = %5
  output "c" = %6
  output "d" = %7
  output "e" = %8
  output "f" = %12
}
"#;
    let g = parse(src).unwrap();
    let t = print(&g);
    // (A NaN pad value makes `Op` unequal to itself, so compare the printed form.)
    assert_eq!(print(&parse(&t).unwrap()), t);
    assert_eq!(print(&g.canonicalize()), t);
    // Everything but the order of the dead constants and the canonical renumbering is
    // preserved verbatim.
    for line in [
        r#"input "x" {name="the x"} : f32[2,3]"#,
        r#"param "p\"q\\r\n\t\u{1}é" : i64[3]"#,
        "slice(%0) {ranges=[max:min:-1, -1:-9:-2]} : f32[2,2]",
        "{pads=[(1,-1),(0,2)], mode=constant, value=-0.0} : f32[2,4]",
        "{pads=[(0,0),(1,1)], mode=reflect, value=inf} : f32[2,4]",
        "{pads=[(0,0),(1,1)], mode=edge, value=nan(0x7ff0000000000001)} : f32[2,4]",
        "constant {value=[nan, -nan, nan(0x7f800001), inf, -inf, -0.0, 1e-45, 3.4028235e38]} : f32[2,4]",
        "constant {value=[nan, nan(0xfe01), 65504.0, 5.9604645e-8]} : f16[4]",
        "constant {value=[-nan, nan(0x7f81), 1.0, 3.3895314e38]} : bf16[2,2]",
        "constant {value=[-9223372036854775808, 9223372036854775807]} : i64[2]",
        "constant {value=[true, false]} : bool[2]",
        "constant {value=[-nan, 1e-300, 0.1]} : f64[3]",
        "iota {axis=1} : i32[2,3]",
    ] {
        assert!(t.contains(line), "missing {line:?} in\n{t}");
    }
    // Bits are exact.
    let Op::Constant { value } = &g.node(graphc_ir::NodeId(13)).op else {
        panic!()
    };
    let TensorData::F32(v) = value.data() else { panic!() };
    let bits: Vec<u32> = v.iter().map(|x| x.to_bits()).collect();
    assert_eq!(
        &bits[..6],
        &[
            0x7fc0_0000,
            0xffc0_0000,
            0x7f80_0001,
            0x7f80_0000,
            0xff80_0000,
            0x8000_0000
        ]
    );
    assert_eq!(bits[6], 1);
    let Op::Constant { value } = &g.node(graphc_ir::NodeId(14)).op else {
        panic!()
    };
    let TensorData::F16(v) = value.data() else { panic!() };
    assert_eq!(v[0].to_bits(), 0x7e00);
    assert_eq!(v[1].to_bits(), 0xfe01);
    assert_eq!(v[3].to_bits(), 1, "6e-8 is the smallest f16 subnormal");
}

#[test]
fn canonical_numbering_is_stable_under_unrelated_additions() {
    let f32_4 = TensorType::new(DType::F32, [4]);
    let mut g = Graph::new();
    let x = g
        .add(
            Op::Input {
                name: "x".into(),
                ty: f32_4.clone(),
            },
            vec![],
            None,
        )
        .unwrap();
    let w = g
        .add(
            Op::Parameter {
                name: "w".into(),
                ty: f32_4.clone(),
            },
            vec![],
            None,
        )
        .unwrap();
    let y = g
        .add(Op::Binary(BinaryOp::Mul), vec![x, w], Some("scale".into()))
        .unwrap();
    let z = g.add(Op::Unary(UnaryOp::Exp), vec![y], None).unwrap();
    g.add_output("z", z);
    let before = print(&g);
    assert_eq!(
        before,
        r#"graph {
  %0 = input "x" : f32[4]
  %1 = param "w" : f32[4]
  %2 = mul "scale" (%0, %1) : f32[4]
  %3 = exp(%2) : f32[4]
  output "z" = %3
}
"#
    );

    // Add nodes nothing existing depends on, one of them a new output, and even a new
    // input: the existing node lines keep their numbers.
    let c = g
        .add(
            Op::Constant {
                value: Tensor::from_f32([4], vec![1.0, 2.0, 3.0, 4.0]).unwrap(),
            },
            vec![],
            None,
        )
        .unwrap();
    let n = g.add(Op::Binary(BinaryOp::Sub), vec![y, c], None).unwrap();
    g.add_output("n", n);
    let after = print(&g);
    assert_eq!(
        after,
        r#"graph {
  %0 = input "x" : f32[4]
  %1 = param "w" : f32[4]
  %2 = mul "scale" (%0, %1) : f32[4]
  %3 = exp(%2) : f32[4]
  %4 = constant {value=[1.0, 2.0, 3.0, 4.0]} : f32[4]
  %5 = sub(%2, %4) : f32[4]
  output "z" = %3
  output "n" = %5
}
"#
    );
    let node_lines = |t: &str| {
        t.lines()
            .filter(|l| l.starts_with("  %"))
            .map(String::from)
            .collect::<Vec<_>>()
    };
    let (b, a) = (node_lines(&before), node_lines(&after));
    assert_eq!(&a[..b.len()], &b[..]);

    // A dead node added later goes last, and numbering of the rest is unchanged.
    let _dead = g.add(Op::Unary(UnaryOp::Neg), vec![x], None).unwrap();
    let dead_added = print(&g);
    assert_eq!(&node_lines(&dead_added)[..a.len()], &a[..]);
    assert!(dead_added.contains("  %6 = neg(%0) : f32[4]\n"));
}

/// Parse `src`, expecting an error at `line:col` whose message contains `fragment`;
/// describes the mismatch otherwise.
fn check_err(src: &str, line: usize, col: usize, fragment: &str) -> Option<String> {
    match parse(src) {
        Ok(g) => Some(format!("expected an error, parsed:\n{}", print(&g))),
        Err(e) if (e.line, e.col) != (line, col) || !e.message.contains(fragment) => {
            Some(format!("got `{e}`, expected {line}:{col} `{fragment}`, in\n{src}"))
        }
        Err(_) => None,
    }
}

#[test]
fn parse_errors_have_line_col_and_the_offending_text() {
    let ok = "graph {\n  %0 = input \"x\" : f32[2]\n  output \"y\" = %0\n}\n";
    assert!(parse(ok).is_ok());
    let cases: &[(&str, usize, usize, &str)] = &[
        ("", 1, 1, "expected `graph`, found end of input"),
        ("grph {}", 1, 1, "expected `graph`, found `grph`"),
        ("graph {\n  %0 = input \"x\" : f32[2]\n", 3, 1, "missing `}`"),
        ("graph {\n  %0 = input \"x\" foo f32[2]\n}", 2, 18, "expected `:` before the type, found `foo`"),
        ("graph {\n  %0 = input \"x\" : f33[2]\n}", 2, 20, "unknown dtype `f33`"),
        ("graph {\n  %0 = input \"x\" : f32[2,-1]\n}", 2, 26, "expected a dimension"),
        ("graph {\n  %0 = input \"x\" : f32[2\n}", 3, 1, "expected `]` after the dimensions, found `}`"),
        ("graph {\n  %0 = input \"x : f32[2]\n}", 2, 14, "unterminated string"),
        ("graph {\n  %0 = input \"x\\q\" : f32[2]\n}", 2, 16, "unknown escape `\\q`"),
        ("graph {\n  %0 = input : f32[2]\n}", 2, 14, "expected the input's name as a string"),
        ("graph {\n  %0 = frobnicate(%1) : f32[2]\n}", 2, 8, "unknown op `frobnicate`"),
        (
            "graph {\n  %0 = input \"x\" : f32[2]\n  %0 = neg(%0) : f32[2]\n}",
            3,
            3,
            "node %0 is defined twice (first at line 2)",
        ),
        ("graph {\n  %0 = input \"x\" : f32[2]\n  %1 = neg(%7) : f32[2]\n}", 3, 12, "undefined node %7"),
        ("graph {\n  %0 = input \"x\" : f32[2]\n  output \"y\" = %3\n}", 3, 16, "undefined node %3"),
        (
            "graph {\n  %0 = input \"x\" : f32[2]\n  %1 = neg(%0) : f32[3]\n}",
            3,
            18,
            "declared type f32[3] but neg gives f32[2]",
        ),
        (
            "graph {\n  %0 = input \"x\" : f32[2]\n  %1 = neg(%0) {axis=1} : f32[2]\n}",
            3,
            17,
            "unknown attribute `axis` for neg",
        ),
        ("graph {\n  %0 = input \"x\" : f32[2]\n  %1 = concat(%0) : f32[2]\n}", 3, 8, "concat needs the attribute `axis`"),
        (
            "graph {\n  %0 = input \"x\" : f32[2]\n  %1 = concat(%0) {axis=[0]} : f32[2]\n}",
            3,
            25,
            "attribute `axis` expects a non-negative integer, found `[0]`",
        ),
        (
            "graph {\n  %0 = input \"x\" : f32[2]\n  %1 = reduce_sum(%0) {axes=[0], keepdims=yes} : f32[1]\n}",
            3,
            43,
            "expects `true` or `false`, found `yes`",
        ),
        ("graph {\n  %0 = input \"x\" : f32[2]\n  %1 = add(%0) : f32[2]\n}", 3, 8, "add takes 2 operand(s), got 1"),
        (
            "graph {\n  %0 = input \"x\" : f32[2]\n  %1 = neg(%2) : f32[2]\n  %2 = neg(%1) : f32[2]\n  output \"y\" = %2\n}",
            3,
            12,
            "node %2 is used before its definition at 4:3",
        ),
        ("graph {\n  %0 = input \"x\" : f32[2]\n}\nextra", 4, 1, "expected end of input after the graph's `}`, found `extra`"),
        (
            "graph {\n  %0 = constant {value=[1.0, 2.0]} : f32[3]\n}",
            2,
            24,
            "constant has 2 element(s) but its type f32[3] has 3",
        ),
        ("graph {\n  %0 = constant {value=[1, 300]} : u8[2]\n}", 2, 28, "`300` is out of range for u8"),
        ("graph {\n  %0 = constant {value=[1.5]} : i32[]\n}", 2, 25, "found `1.5`"),
        ("graph {\n  %0 = constant {value=[nan(0x7f800000)]} : f32[]\n}", 2, 25, "is not a 32-bit NaN"),
        (
            "graph {\n  %0 = input \"x\" : f32[2]\n  %1 = input \"x\" : f32[2]\n}",
            3,
            14,
            "input name \"x\" is used twice (first at line 2)",
        ),
        (
            "graph {\n  %0 = input \"x\" : f32[2]\n  output \"y\" = %0\n  output \"y\" = %0\n}",
            4,
            10,
            "output name \"y\" is used twice",
        ),
        ("graph {\n  %0 = input \"x\" : f32[2] $\n}", 2, 27, "unexpected character `$`"),
        ("graph {\n  % = input \"x\" : f32[2]\n}", 2, 3, "expected a node id after `%`, found ` `"),
        (
            "graph {\n  %0 = input \"x\" : f32[2]\n  %1 = slice(%0) {ranges=[0:1]} : f32[1]\n}",
            3,
            30,
            "expected `:` before the slice step, found `]`",
        ),
        (
            "graph {\n  %0 = input \"x\" : f32[2]\n  %1 = pad(%0) {pads=[(1,2,3)], mode=edge, value=0.0} : f32[5]\n}",
            3,
            23,
            "expects a pair `(before,after)`, found `(1,2,3)`",
        ),
        (
            "graph {\n  %0 = input \"x\" : f32[2]\n  %1 = pad(%0) {pads=[(0,0)], mode=wrap, value=0.0} : f32[2]\n}",
            3,
            36,
            "expects `constant`, `reflect` or `edge`, found `wrap`",
        ),
        ("graph {\n  %0 = iota {axis=2} : i64[2,3]\n}", 2, 8, "axis 2 out of range for rank 2"),
        (
            "graph {\n  %0 = input \"x\" : f32[2]\n  %1 = neg(%0) {} {} : f32[2]\n}",
            3,
            19,
            "expected `:` before the type, found `{`",
        ),
        ("graph {\n  %0 = input \"x\" : f32[99999999999,99999999999]\n}", 2, 20, "is too large"),
        ("graph {\n  weights 3\n}", 2, 11, "expected the weights file name as a string, found `3`"),
        (
            "graph {\n  %0 = input \"x\" : f32[4]\n  %1 = pad(%0) {pads=[(9223372036854775807,0)], mode=constant, value=0.0} : f32[1]\n}",
            3,
            8,
            "which is too large",
        ),
        (
            "graph {\n  %0 = input \"x\" : f32[4]\n  %1 = cast(%0) {to=f32, to=i32} : i32[4]\n}",
            3,
            26,
            "attribute `to` is given twice",
        ),
        (
            "graph {\n  %0 = param \"w\" : f32[2]\n  %1 = param \"w\" : f32[2]\n}",
            3,
            14,
            "parameter name \"w\" is used twice (first at line 2)",
        ),
        ("graph {\n  weights \"a\"\n  weights \"b\"\n}", 3, 3, "a second `weights` line"),
        ("graph {\n  %0 = iota {axis=0} : bool[2]\n}", 2, 8, "iota needs a numeric dtype"),
        ("graph {\n  %0 = constant {value=[1.0, -foo]} : f32[2]\n}", 2, 30, "found `-foo`"),
        ("graph {\n  %0 = input \"x\\u{110000}\" : f32[2]\n}", 2, 16, "bad unicode escape"),
        ("graph {\n  %0 = input \"名前\" : f32[2] {\n}", 2, 28, "expected a node definition `%N = ...`, `output` or `}`, found `{`"),
    ];
    let failures: Vec<String> = cases
        .iter()
        .filter_map(|&(src, line, col, fragment)| check_err(src, line, col, fragment))
        .collect();
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
    assert!(cases.len() >= 20);
}

#[test]
fn fuzz_truncations_and_mutations_never_panic() {
    let mut srcs = Vec::new();
    for seed in [3, 17, 42] {
        let mut g = random_graph(seed);
        let mut rng = Rng::new(seed);
        let ty = TensorType::new(DType::F32, [2, 3]);
        g.add_parameter("w", rand_tensor(&mut rng, ty.dtype, ty.shape.0.clone()));
        srcs.push(print_with_weights(&g, Some("w.safetensors")));
    }
    let (mut ok, mut err, mut cases) = (0, 0, 0);
    let mut count = |r: Result<Graph, graphc_ir::ParseError>| {
        match r {
            Ok(_) => ok += 1,
            Err(_) => err += 1,
        }
        cases += 1;
    };
    // Every truncation of one file.
    let src = &srcs[0];
    for (i, _) in src.char_indices() {
        count(parse(&src[..i]));
    }
    // Random byte mutations, deletions and duplications.
    let mut rng = Rng::new(7);
    let alphabet = b"%=(){}[],:\"\\#-+0123456789.eEabfinx_ \n\t\xff";
    for k in 0..4000 {
        let src = srcs[k % srcs.len()].as_bytes();
        let mut b = src.to_vec();
        for _ in 0..1 + rng.below(3) {
            let at = rng.below(b.len() as u64) as usize;
            match rng.below(4) {
                0 => b[at] = alphabet[rng.below(alphabet.len() as u64) as usize],
                1 => {
                    b.remove(at);
                }
                2 => {
                    let end = (at + 1 + rng.below(20) as usize).min(b.len());
                    let chunk = b[at..end].to_vec();
                    let to = rng.below(b.len() as u64) as usize;
                    b.splice(to..to, chunk);
                }
                _ => b.insert(at, alphabet[rng.below(alphabet.len() as u64) as usize]),
            }
        }
        count(parse(&String::from_utf8_lossy(&b)));
    }
    assert!(cases > 4000 && ok > 0 && err > 1000, "{ok} ok, {err} errors of {cases}");
}

fn temp_dir(tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("graphc-text-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// A graph with one parameter of every dtype (and odd values), used by an output.
fn graph_with_weights(seed: u64) -> Graph {
    let mut rng = Rng::new(seed);
    let mut g = Graph::new();
    let x = g
        .add(
            Op::Input {
                name: "x".into(),
                ty: TensorType::new(DType::F32, [2, 3]),
            },
            vec![],
            None,
        )
        .unwrap();
    let mut last = x;
    for (i, &dt) in DType::ALL.iter().enumerate() {
        let shape = match i % 3 {
            0 => vec![2, 3],
            1 => vec![],
            _ => vec![4, 0],
        };
        let p = g.add_parameter(&format!("layer{i}.w ✓ \"{dt}\""), rand_tensor(&mut rng, dt, shape));
        if i % 3 == 0 {
            let c = g.add(Op::Cast { to: DType::F32 }, vec![p], None).unwrap();
            last = g.add(Op::Binary(BinaryOp::Add), vec![last, c], None).unwrap();
        }
    }
    g.add_output("y", last);
    g.verify().unwrap();
    g
}

#[test]
fn weights_survive_save_and_load_exactly() {
    let dir = temp_dir("weights");
    for seed in 0..5 {
        let g = graph_with_weights(seed);
        let path = dir.join(format!("model{seed}.gir"));
        save_gir(&g, &path).unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(
            text.contains(&format!("  weights \"model{seed}.safetensors\"\n")),
            "{text}"
        );
        assert!(dir.join(format!("model{seed}.safetensors")).exists());
        let loaded = load_gir(&path).unwrap();
        assert_eq!(loaded, g.canonicalize());
        for (name, t) in g.weights() {
            let l = loaded.weight(name).unwrap();
            assert_eq!(l.data().to_le_bytes(), t.data().to_le_bytes(), "{name}");
            assert_eq!(l.ty(), t.ty());
        }
    }
    // No temporary files are left behind.
    for e in std::fs::read_dir(&dir).unwrap() {
        let name = e.unwrap().file_name().into_string().unwrap();
        assert!(name.ends_with(".gir") || name.ends_with(".safetensors"), "{name}");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn safetensors_round_trip_all_dtypes() {
    let dir = temp_dir("st");
    let mut rng = Rng::new(5);
    let mut weights = BTreeMap::new();
    for &dt in &DType::ALL {
        weights.insert(format!("{dt}"), rand_tensor(&mut rng, dt, vec![3, 5]));
        weights.insert(format!("{dt}.scalar"), rand_tensor(&mut rng, dt, vec![]));
        weights.insert(format!("{dt}.empty"), rand_tensor(&mut rng, dt, vec![0, 2]));
    }
    let path = dir.join("w.safetensors");
    save_safetensors(&weights, &path).unwrap();
    let back = load_safetensors(&path).unwrap();
    assert_eq!(back, weights);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_graph_without_weight_data_saves_no_side_file() {
    let dir = temp_dir("noweights");
    let g = random_graph(11);
    let path = dir.join("plain.gir");
    save_gir(&g, &path).unwrap();
    assert!(!dir.join("plain.safetensors").exists());
    assert!(!std::fs::read_to_string(&path).unwrap().contains("weights"));
    assert_eq!(load_gir(&path).unwrap(), g.canonicalize());
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn load_errors_name_the_file_and_the_parameter() {
    let dir = temp_dir("errors");
    let g = graph_with_weights(1);
    let path = dir.join("m.gir");
    save_gir(&g, &path).unwrap();
    let wpath = dir.join("m.safetensors");

    // A parameter missing from the file; an extra tensor is fine.
    let mut w = g.weights().clone();
    let (first, _) = w.pop_first().unwrap();
    w.insert("unused".into(), Tensor::scalar(DType::F32, 1.0));
    save_safetensors(&w, &wpath).unwrap();
    let e = load_gir(&path).unwrap_err().to_string();
    assert!(
        e.contains("m.safetensors") && e.contains(&first) && e.contains("no tensor"),
        "{e}"
    );

    // A parameter of the wrong type.
    let mut w = g.weights().clone();
    w.insert(first.clone(), Tensor::scalar(DType::I8, 1.0));
    save_safetensors(&w, &wpath).unwrap();
    let e = load_gir(&path).unwrap_err().to_string();
    assert!(e.contains(&first) && e.contains("i8[]"), "{e}");

    // Extra tensors are ignored.
    let mut w = g.weights().clone();
    w.insert("unused".into(), Tensor::scalar(DType::F32, 1.0));
    save_safetensors(&w, &wpath).unwrap();
    assert_eq!(load_gir(&path).unwrap(), g.canonicalize());

    // A broken weights file.
    std::fs::write(&wpath, b"not safetensors").unwrap();
    let e = load_gir(&path).unwrap_err().to_string();
    assert!(
        e.contains("m.safetensors") && e.contains("not a valid safetensors file"),
        "{e}"
    );

    // A missing weights file.
    std::fs::remove_file(&wpath).unwrap();
    let e = load_gir(&path).unwrap_err().to_string();
    assert!(e.contains("m.safetensors"), "{e}");

    // A parse error names the .gir file and the place.
    std::fs::write(&path, "graph {\n  %0 = nope : f32[]\n}\n").unwrap();
    let e = load_gir(&path).unwrap_err().to_string();
    assert!(e.contains("m.gir:2:8: unknown op `nope`"), "{e}");

    // A missing .gir file.
    let e = load_gir(dir.join("absent.gir")).unwrap_err().to_string();
    assert!(e.contains("absent.gir"), "{e}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn json_round_trip() {
    for seed in 0..30 {
        let g = random_graph(seed);
        let g2 = Graph::from_json(&g.to_json()).unwrap();
        assert_eq!(g2, g, "seed {seed}");
        assert_eq!(print(&g2), print(&g));
    }
    let g = graph_with_weights(3);
    assert_eq!(Graph::from_json(&g.to_json()).unwrap(), g);
    // NaN constants survive bit for bit.
    let mut g = Graph::new();
    let v = Tensor::new(
        Shape::new([3]),
        TensorData::F32(vec![f32::NAN, f32::from_bits(0xffc0_0001), -0.0]),
    )
    .unwrap();
    let c = g.add(Op::Constant { value: v.clone() }, vec![], None).unwrap();
    g.add_output("c", c);
    let g2 = Graph::from_json(&g.to_json()).unwrap();
    let Op::Constant { value } = &g2.node(c).op else {
        panic!()
    };
    assert_eq!(value, &v);
}
