//! Optimizer rules as file tests, after cranelift's filetests: each file in
//! `compiler/tests/filetests/` is a `.gir` graph, the rules that must fire on it, and
//! the graph the optimizer must turn it into, printed canonically:
//!
//! ```text
//! # fires: add-zero mul-one      (each named rule fires at least once)
//! # tolerance: 1e-6              (optional; inexact rules only: relative L2 per output)
//! graph { ... }                  (the input)
//! # expect:
//! graph { ... }                  (exactly `graphc_ir::print` of the optimized graph)
//! ```
//!
//! Each file is checked three ways: the optimized graph prints as expected, the named
//! rules fired, and the optimized graph computes the input graph's outputs on random
//! inputs through the reference interpreter (bitwise, NaN equal to NaN, unless a
//! tolerance is given). `GRAPHC_BLESS=1` rewrites the `# expect:` part of every file
//! from what the optimizer now prints (review the diff before committing it).

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use graphc_compiler::optimize::{optimize, OptimizeReport};
use graphc_ir::compare::bitwise_equal as same;
use graphc_ir::compare::{relative_l2, zip_outputs};
use graphc_ir::{interpret, parse, print, Graph, Tensor};

const EXPECT: &str = "# expect:";

struct FileTest {
    input: String,
    fires: Vec<String>,
    tolerance: Option<f64>,
    expect: String,
}

fn read(path: &Path) -> FileTest {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let (input, expect) = text
        .split_once(&format!("\n{EXPECT}\n"))
        .unwrap_or_else(|| panic!("{}: no `{EXPECT}` line", path.display()));
    let directive = |name: &str| {
        input
            .lines()
            .filter_map(|l| l.strip_prefix(&format!("# {name}:")))
            .map(str::trim)
            .collect::<Vec<_>>()
            .join(" ")
    };
    let tolerance = directive("tolerance");
    FileTest {
        input: input.to_string(),
        fires: directive("fires").split_whitespace().map(str::to_string).collect(),
        tolerance: (!tolerance.is_empty()).then(|| tolerance.parse().expect("tolerance: a number")),
        expect: expect.trim_end().to_string(),
    }
}

fn random_inputs(g: &Graph, seed: u64) -> HashMap<String, Tensor> {
    g.inputs()
        .iter()
        .enumerate()
        .map(|(i, &id)| {
            let name = g.input_name(id).expect("input name").to_string();
            (name, Tensor::random(&g.node(id).ty, seed * 100 + i as u64))
        })
        .collect()
}

fn fired(report: &OptimizeReport, rule: &str) -> bool {
    report.rules_fired.get(rule).copied().unwrap_or(0) > 0
}

/// Checks one file; returns what it printed (for blessing) and the problems found.
fn check(path: &Path, t: &FileTest) -> (String, Vec<String>) {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().to_string())
        .unwrap_or_default();
    let g = parse(&t.input).unwrap_or_else(|e| panic!("{name}: {e}"));
    let (opt, report) = optimize(&g, &Default::default()).unwrap_or_else(|e| panic!("{name}: {e}"));
    opt.verify()
        .unwrap_or_else(|e| panic!("{name}: the optimized graph does not verify: {e}"));
    let printed = print(&opt).trim_end().to_string();
    let mut problems = Vec::new();
    if printed != t.expect {
        problems.push(format!("{name}: optimized to\n{printed}\nexpected\n{}", t.expect));
    }
    for rule in &t.fires {
        if !fired(&report, rule) {
            problems.push(format!(
                "{name}: rule {rule} did not fire (fired: {:?})",
                report.rules_fired
            ));
        }
    }
    for seed in 0..4 {
        let inputs = random_inputs(&g, seed);
        let want = interpret(&g, &inputs).unwrap_or_else(|e| panic!("{name}: {e}"));
        let got = interpret(&opt, &inputs).unwrap_or_else(|e| panic!("{name}: optimized: {e}"));
        let pairs = zip_outputs(&got, &want).unwrap_or_else(|e| panic!("{name}: {e}"));
        for (out, a, b) in pairs {
            let ok = match t.tolerance {
                Some(tol) => relative_l2(a, b) <= tol,
                None => same(a, b),
            };
            if !ok {
                problems.push(format!("{name}: output {out}, seed {seed}: {a} vs {b}"));
            }
        }
    }
    (printed, problems)
}

fn files() -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/filetests");
    let mut v: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "gir"))
        .collect();
    v.sort();
    v
}

#[test]
fn optimizer_filetests() {
    let bless = std::env::var("GRAPHC_BLESS").is_ok_and(|v| v == "1");
    let files = files();
    assert!(files.len() >= 10, "only {} file tests", files.len());
    let mut problems = Vec::new();
    for path in &files {
        let t = read(path);
        let (printed, mut p) = check(path, &t);
        if bless && printed != t.expect {
            let text = format!("{}\n{EXPECT}\n{printed}\n", t.input);
            std::fs::write(path, text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            p.retain(|m| !m.contains("optimized to\n"));
        }
        problems.extend(p);
    }
    assert!(problems.is_empty(), "{}", problems.join("\n\n"));
}

/// The runner itself: a wrong expectation, a rule that did not fire and a changed
/// output are each reported.
#[test]
fn the_runner_reports_each_kind_of_failure() {
    let src = "graph {\n  %0 = input \"x\" : f32[3]\n  %1 = exp(%0) : f32[3]\n  output \"y\" = %1\n}";
    let t = FileTest {
        input: src.to_string(),
        fires: vec!["add-zero".to_string()],
        tolerance: None,
        expect: "graph {\n}".to_string(),
    };
    let (printed, problems) = check(Path::new("self.gir"), &t);
    assert_eq!(printed, src);
    assert_eq!(problems.len(), 2, "{problems:?}");
    assert!(problems[0].contains("optimized to"));
    assert!(problems[1].contains("add-zero did not fire"));
}
