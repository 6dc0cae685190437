//! The `.gir` parser on hostile input: forward references and cycles are errors at
//! the reference, any reordering of a real model is an error or a valid graph (never a
//! panic later), and the parser's work grows linearly with its input.

use std::path::PathBuf;

use graphc_ir::dce::eliminate_dead_code;
use graphc_ir::work::{self, Work};
use graphc_ir::{parse, DType, Graph, Node, NodeId, Op, TensorType, UnaryOp};
use graphc_testkit::alloc::{self, Allocs};

#[global_allocator]
static ALLOC: alloc::Counting = alloc::Counting;

fn example(name: &str) -> String {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../examples/models")
        .join(name);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn parse_err(src: &str) -> (usize, usize, String) {
    match parse(src) {
        Ok(_) => panic!("parsed:\n{src}"),
        Err(e) => (e.line, e.col, e.message),
    }
}

#[test]
fn forward_reference_is_an_error_at_the_use_naming_the_value() {
    let src = "graph {\n  %0 = input \"x\" : f32[2]\n  %2 = neg(%1) : f32[2]\n  %1 = neg(%0) : f32[2]\n  output \"y\" = %2\n}\n";
    let (line, col, msg) = parse_err(src);
    assert_eq!((line, col), (3, 12), "{msg}");
    assert!(msg.contains("node %1 is used before its definition at 4:3"), "{msg}");

    // An output line before the node it names.
    let src = "graph {\n  %0 = input \"x\" : f32[2]\n  output \"y\" = %1\n  %1 = neg(%0) : f32[2]\n}\n";
    let (line, col, msg) = parse_err(src);
    assert_eq!((line, col), (3, 16), "{msg}");
    assert!(msg.contains("node %1 is used before its definition at 4:3"), "{msg}");

    // Everything on one line: the order of statements counts, not lines.
    let src = "graph { %0 = input \"x\" : f32[2] output \"y\" = %1 %1 = neg(%0) : f32[2] }";
    let (line, col, msg) = parse_err(src);
    assert_eq!((line, col), (1, 46), "{msg}");
    assert!(msg.contains("used before its definition at 1:49"), "{msg}");
}

#[test]
fn cycles_cannot_be_written() {
    let (line, col, msg) = parse_err("graph {\n  %0 = input \"x\" : f32[2]\n  %1 = add(%0, %1) : f32[2]\n}\n");
    assert_eq!((line, col), (3, 16), "{msg}");
    assert!(msg.contains("node %1 is used in its own definition"), "{msg}");

    let src = "graph {\n  %0 = input \"x\" : f32[2]\n  %1 = add(%0, %3) : f32[2]\n  %2 = neg(%1) : f32[2]\n  %3 = neg(%2) : f32[2]\n  output \"y\" = %3\n}\n";
    let (line, col, msg) = parse_err(src);
    assert_eq!((line, col), (3, 16), "{msg}");
    assert!(msg.contains("node %3 is used before its definition at 5:3"), "{msg}");
}

/// Swap every pair of lines of the example model (a few hundred sources): each is a
/// parse error or a graph that verifies and goes through DCE to a graph that verifies.
#[test]
fn swapped_lines_of_a_real_model_error_or_verify() {
    let text = example("transformer_block.gir");
    let lines: Vec<&str> = text.lines().collect();
    let node_lines: Vec<usize> = (0..lines.len())
        .filter(|&i| lines[i].trim_start().starts_with('%'))
        .collect();
    assert!(node_lines.len() > 50);
    let (mut errors, mut parsed) = (0, 0);
    let mut check = |a: usize, b: usize| {
        let mut l = lines.clone();
        l.swap(a, b);
        let src = l.join("\n");
        match parse(&src) {
            Err(e) => {
                assert!(
                    e.message.contains("used before its definition") || e.message.contains("input"),
                    "swap {a} {b}: {e}"
                );
                errors += 1;
            }
            Ok(g) => {
                g.verify().unwrap_or_else(|e| panic!("swap {a} {b}: {e}"));
                let (d, _) = eliminate_dead_code(&g);
                d.verify().unwrap_or_else(|e| panic!("swap {a} {b}: {e}"));
                parsed += 1;
            }
        }
    };
    for w in node_lines.windows(2) {
        check(w[0], w[1]);
    }
    for (k, &a) in node_lines.iter().enumerate().step_by(7) {
        for &b in node_lines[k + 1..].iter().step_by(5) {
            check(a, b);
        }
    }
    assert!(errors > 50 && parsed > 5, "{errors} errors, {parsed} parsed");
}

/// A verified graph whose table lists a user before its operand (the IR allows it; the
/// parser never builds one): DCE keeps it valid instead of panicking.
#[test]
fn dce_accepts_operands_anywhere_in_the_table() {
    let ty = TensorType::new(DType::F32, [2]);
    let mut g = Graph::new();
    let x = g.push(Node {
        op: Op::Input {
            name: "x".into(),
            ty: ty.clone(),
        },
        inputs: vec![],
        ty: ty.clone(),
        name: None,
    });
    // %1 = neg(%3), %2 = dead, %3 = neg(%0)
    for inputs in [vec![NodeId(3)], vec![x], vec![x]] {
        g.push(Node {
            op: Op::Unary(UnaryOp::Neg),
            inputs,
            ty: ty.clone(),
            name: None,
        });
    }
    g.add_output("y", NodeId(1));
    g.verify().unwrap();
    let (d, report) = eliminate_dead_code(&g);
    assert_eq!(report.nodes_removed, 1);
    d.verify().unwrap();
    assert_eq!(d.len(), 3);
    assert_eq!(d.node(NodeId(1)).inputs, vec![NodeId(2)]);
}

/// A source of size `n`.
type Source<'a> = Box<dyn Fn(usize) -> String + 'a>;

/// The steps and allocations of parsing `src` (parse errors included).
fn cost(src: &str) -> (Work, Allocs) {
    let ((_, w), a) = alloc::measure(|| work::measure(|| drop(parse(src))));
    (w, a)
}

/// Sources of hostile shapes, `n` big: parsing 10x the size takes at most 15x the
/// steps (`graphc_ir::work`: tokens, definitions, operands, attribute keys, graph
/// checks) and allocates at most 25x the bytes (vectors that double as they grow can
/// take 16x for 10x the elements); a quadratic path costs 100x, the one this test was
/// written for 1000x. Some parse, some fail; none panics.
#[test]
fn parse_work_is_linear_in_the_input() {
    let attrs = |n: usize| {
        let a: Vec<String> = (0..n).map(|i| format!("a{i}=1")).collect();
        format!(
            "graph {{\n %0 = input \"x\" : f32[2]\n %1 = neg(%0) {{{}}} : f32[2]\n}}\n",
            a.join(",")
        )
    };
    let chain = |n: usize, attr: &str| {
        let mut s = String::from("graph {\n %0 = input \"x\" : f32[2]\n");
        for i in 1..n {
            s.push_str(&format!(" %{i} = neg(%{}) {attr}: f32[2]\n", i - 1));
        }
        s + &format!(" output \"y\" = %{}\n}}\n", n - 1)
    };
    let reversed = |n: usize| {
        let mut s = String::from("graph {\n");
        for i in (1..n).rev() {
            s.push_str(&format!(" %{i} = neg(%{}) : f32[2]\n", i - 1));
        }
        s + " %0 = input \"x\" : f32[2]\n}\n"
    };
    let outputs = |n: usize| {
        let mut s = String::from("graph {\n %0 = input \"x\" : f32[2]\n");
        for i in 0..n {
            s.push_str(&format!(" output \"y{i}\" = %0\n"));
        }
        s + "}\n"
    };
    let dims = |n: usize| {
        let d = vec!["1"; n].join(",");
        format!("graph {{\n %0 = input \"x\" : f32[{d}]\n %1 = neg(%0) : f32[{d}]\n output \"y\" = %1\n}}\n")
    };
    let constant = |n: usize| {
        let v = vec!["1.5"; n].join(",");
        format!("graph {{\n %0 = constant {{value=[{v}]}} : f32[{n}]\n output \"y\" = %0\n}}\n")
    };
    let concat = |n: usize| {
        let ops = vec!["%0"; n].join(",");
        format!(
            "graph {{\n %0 = input \"x\" : f32[2]\n %1 = concat({ops}) {{axis=0}} : f32[{}]\n}}\n",
            2 * n
        )
    };
    let one_line = |n: usize| chain(n, "").replace('\n', " ");
    let cases: Vec<(&str, Source, usize)> = vec![
        ("100k attributes on one node", Box::new(attrs), 100_000),
        ("200k nodes", Box::new(move |n| chain(n, "")), 200_000),
        (
            "100k nodes with an attribute",
            Box::new(move |n| chain(n, "{z=1} ")),
            100_000,
        ),
        ("200k nodes on one line", Box::new(one_line), 200_000),
        ("100k forward references", Box::new(reversed), 100_000),
        ("100k outputs", Box::new(outputs), 100_000),
        ("100k dims", Box::new(dims), 100_000),
        ("200k constant elements", Box::new(constant), 200_000),
        ("100k concat operands", Box::new(concat), 100_000),
    ];
    let mut failures = Vec::new();
    for (what, make, n) in &cases {
        let (small, big) = (make(n / 10), make(*n));
        let ((w_small, a_small), (w_big, a_big)) = (cost(&small), cost(&big));
        let (steps, bytes) = (w_big.growth_over(&w_small), a_big.growth_over(&a_small));
        eprintln!("{what}: {steps:.1}x the steps, {bytes:.1}x the bytes");
        if steps > 15.0 || bytes > 25.0 {
            failures.push(format!(
                "{what}: {steps:.1}x the steps ({}), {bytes:.1}x the bytes ({} -> {})",
                w_big.compare(&w_small),
                a_small.bytes,
                a_big.bytes
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// A hand-written `dequantize` that breaks its rules (bits, data type, scales' shape,
/// group) is an error at its line naming the rule, never a panic; a valid one parses
/// and runs.
#[test]
fn bad_dequantize_lines_are_errors_naming_the_rule() {
    let src = |q: &str, s: &str, attrs: &str, out: &str| {
        format!(
            "graph {{\n  %0 = input \"q\" : {q}\n  %1 = input \"s\" : {s}\n  %2 = dequantize (%0, %1) {{{attrs}}} : {out}\n  output \"y\" = %2\n}}\n"
        )
    };
    for (q, s, attrs, out, want) in [
        ("u8[4,8]", "f32[4,2]", "bits=3, group=8", "f32[4,16]", "bits 4 or 8"),
        (
            "f32[4,16]",
            "f32[4,1]",
            "bits=8, group=16",
            "f32[4,16]",
            "needs i8 data",
        ),
        (
            "u8[4,8]",
            "f32[4,3]",
            "bits=4, group=8",
            "f32[4,16]",
            "needs scales of shape [4,2], got f32[4,3]",
        ),
        ("u8[4,8]", "i32[4,2]", "bits=4, group=8", "f32[4,16]", "float scales"),
        (
            "u8[4,8]",
            "f32[4,2]",
            "bits=4, group=0",
            "f32[4,16]",
            "group of at least 1",
        ),
        ("u8[4,8]", "f32[4,2]", "bits=4, group=8", "f32[4,8]", "f32[4,16]"),
        ("u8[]", "f32[1]", "bits=4, group=8", "f32[2]", "rank 1 or more"),
    ] {
        let (line, _, msg) = parse_err(&src(q, s, attrs, out));
        assert_eq!(line, 4, "{msg}");
        assert!(msg.contains(want), "expected `{want}` in: {msg}");
    }
    let g = graphc_ir::parse(&src("u8[4,8]", "f32[4,2]", "bits=4, group=8", "f32[4,16]")).unwrap();
    let text = graphc_ir::print(&g);
    assert!(
        text.contains("dequantize") && text.contains("{bits=4, group=8}"),
        "{text}"
    );
}
