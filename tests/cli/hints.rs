//! What a user reads: every hint names a command that works when copied (each command
//! quoted in a hint is run as printed), and the numbers of `plan`, `run` and `fit` use
//! one vocabulary (weights, arena and its peak, totals for a named device).

use std::process::Output;

use super::{graphc, stderr, stdout, BLOCK};

const GPT2: &str = "tests/fixtures/onnx/gpt2/model.onnx";
const GPT2_DYNAMIC: &str = "tests/fixtures/onnx/gpt2_dynamic/model.onnx";

/// The `graphc ...` commands quoted (in backquotes) in `text`, split into words as a
/// POSIX shell reads them (graphc quotes a word with single quotes).
fn quoted_commands(text: &str) -> Vec<Vec<String>> {
    text.split('`')
        .skip(1)
        .step_by(2)
        .filter(|q| q.starts_with("graphc "))
        .map(|q| shell_words(&q["graphc ".len()..]))
        .collect()
}

fn shell_words(s: &str) -> Vec<String> {
    let (mut words, mut word, mut quoted, mut any) = (Vec::new(), String::new(), false, false);
    for c in s.chars() {
        match c {
            '\'' => (quoted, any) = (!quoted, true),
            ' ' if !quoted => {
                if any {
                    words.push(std::mem::take(&mut word));
                }
                any = false;
            }
            c => (word, any) = (word + &c.to_string(), true),
        }
    }
    if any {
        words.push(word);
    }
    words
}

fn run(words: &[String]) -> Output {
    let args: Vec<&str> = words.iter().map(String::as_str).collect();
    graphc(&args)
}

/// A remedy's command ran as intended: it succeeded, or (a plan still over the budget,
/// as its estimate said) failed with the diagnosis, never with a usage error.
fn ran(words: &[String]) -> Output {
    let o = run(words);
    let err = stderr(&o);
    assert!(
        o.status.success() || err.starts_with("error: the model needs") || err.starts_with("error: even "),
        "`graphc {}` failed: {err}",
        words.join(" ")
    );
    o
}

/// `graphc plan` of GPT-2 with a dynamic batch and sequence, both 64, under `budget`.
fn plan_dynamic(budget: &str) -> Output {
    graphc(&[
        "plan",
        GPT2_DYNAMIC,
        "--dim",
        "batch=64",
        "--dim",
        "seq=64",
        "--budget",
        budget,
    ])
}

#[test]
fn over_budget_remedies_are_commands_that_run() {
    // The workspace alone is over 1 MiB: int8/int4 weights need none, and fit.
    let o = graphc(&["plan", BLOCK, "--budget", "1MiB"]);
    let err = stderr(&o);
    assert!(err.contains("no activation remedy on its own"), "{err}");
    assert!(
        err.contains("make every GEMM a generated kernel, which needs no workspace"),
        "{err}"
    );
    let commands = quoted_commands(&err);
    assert_eq!(commands.len(), 2, "{err}");
    for c in &commands {
        assert!(c.contains(&"--weights".to_string()), "{c:?}");
        let o = ran(c);
        assert!(o.status.success(), "the estimate said it fits: {}", stderr(&o));
        assert!(stdout(&o).contains("fits, headroom"), "{}", stdout(&o));
    }

    // Two symbolic dims: every fit command keeps the other one, and with the
    // workspace over the budget, a smaller dim comes together with int4 weights.
    let err = stderr(&plan_dynamic("1MiB"));
    let fits: Vec<Vec<String>> = quoted_commands(&err).into_iter().filter(|c| c[0] == "fit").collect();
    assert_eq!(fits.len(), 2, "{err}");
    for c in quoted_commands(&err) {
        ran(&c);
    }
    // The estimate is linear; the batch does fit with int4 weights (seq, at batch 64,
    // may not even at 1: then fit says so, with its own remedies).
    let o = ran(&fits[0]);
    assert!(
        stdout(&o).contains("batch = 7 is the largest that fits"),
        "{}",
        stdout(&o)
    );
    assert!(
        err.contains(&format!(
            "`graphc fit {GPT2_DYNAMIC} --dim batch --dim seq=64 --budget 1MiB --weights int4` finds the largest \
             batch"
        )),
        "{err}"
    );

    // A budget the weights and workspace fit: the dims alone, and bf16, each a command
    // with every option the user gave.
    let err = stderr(&plan_dynamic("40MiB"));
    assert!(
        err.contains(&format!(
            "`graphc fit {GPT2_DYNAMIC} --dim batch=64 --dim seq --budget 40MiB`"
        )),
        "{err}"
    );
    assert!(
        err.contains(&format!(
            "`graphc plan {GPT2_DYNAMIC} --dim batch=64 --dim seq=64 --budget 40MiB --precision bf16`"
        )),
        "{err}"
    );
    for c in quoted_commands(&err) {
        ran(&c);
    }
}

#[test]
fn a_fit_that_cannot_fit_names_fit_commands() {
    let o = graphc(&[
        "fit",
        GPT2_DYNAMIC,
        "--dim",
        "batch",
        "--dim",
        "seq=64",
        "--budget",
        "100KiB",
    ]);
    let err = stderr(&o);
    assert!(err.starts_with("error: even batch=1 does not fit"), "{err}");
    let commands = quoted_commands(&err);
    assert!(!commands.is_empty(), "{err}");
    for c in &commands {
        assert_eq!(c[..2], ["fit".to_string(), GPT2_DYNAMIC.to_string()], "{c:?}");
        ran(c);
    }
}

#[test]
fn without_a_gpu_each_hint_names_a_device_that_works() {
    if graphc::cuda::driver_available() {
        eprintln!("a CUDA driver is here: the hints for a machine without one are not shown");
        return;
    }
    // Each failing command, what its hint must say, and whether the hint's first
    // command runs here (cuda-sim's need a C++ compiler, as .ci/run has).
    let cases: [(&[&str], &str); 6] = [
        (
            &["run", BLOCK, "--device", "cuda"],
            "--device cpu` runs it on the CPU executor",
        ),
        (
            &["run", BLOCK, "--check"],
            "--device cuda-sim` compares the generated CUDA C",
        ),
        (
            &["run", BLOCK, "--check", "--device", "cpu"],
            "--check --device cuda-sim` compares",
        ),
        (
            &["run", BLOCK, "--sanitize", "address"],
            "--sanitize address --device cuda-sim`",
        ),
        (
            &["bench", BLOCK, "--device", "cpu", "--per-kernel"],
            "gives the median of whole runs",
        ),
        (
            &[
                "train",
                "tests/fixtures/train/mlp/model.onnx",
                "--inputs",
                "tests/fixtures/train/mlp/inputs.npz",
                "--loss",
                "mse",
                "--target",
                "y",
                "--device",
                "cpu",
                "--per-kernel",
            ],
            "gives the median of whole runs",
        ),
    ];
    for (args, says) in cases {
        let o = graphc(args);
        let err = stderr(&o);
        assert!(!o.status.success(), "{args:?}");
        assert!(err.contains(says), "{args:?}: {err}");
        for c in quoted_commands(&err) {
            let o = run(&c);
            if c.contains(&"cuda".to_string()) {
                // A GPU command (bench --per-kernel): no GPU here, exit code 3.
                assert_eq!(o.status.code(), Some(3), "{c:?}: {}", stderr(&o));
            } else {
                assert!(o.status.success(), "`graphc {}`: {}", c.join(" "), stderr(&o));
            }
        }
    }
    // The self-test: `--device emulate` runs here; `--device cuda-sim` is the command
    // .ci/run runs itself, plain and under both sanitizers.
    let o = graphc(&["selftest"]);
    assert_eq!(o.status.code(), Some(3));
    let commands = quoted_commands(&stderr(&o));
    assert_eq!(
        commands,
        [
            ["selftest", "--device", "cuda-sim"].map(String::from).to_vec(),
            ["selftest", "--device", "emulate"].map(String::from).to_vec()
        ]
    );
    let o = run(&commands[1]);
    assert!(o.status.success(), "{}", stderr(&o));
    // --check works with cuda-sim too, and says so.
    let help = stdout(&graphc(&["run", "--help"]));
    assert!(help.contains("With --device cuda or cuda-sim"), "{help}");
}

/// The `NAME  SIZE  BYTES ...` row of a summary table (`name` as its first word).
fn row<'a>(text: &'a str, name: &str) -> &'a str {
    text.lines()
        .map(str::trim_start)
        .find(|l| l.split("  ").next() == Some(name))
        .unwrap_or_else(|| panic!("no `{name}` row in:\n{text}"))
}

/// The exact byte count of a summary row (its second number).
fn row_bytes(text: &str, name: &str) -> u64 {
    row(text, name)
        .split_whitespace()
        .find_map(|w| w.parse().ok())
        .unwrap_or_else(|| panic!("no bytes in the `{name}` row"))
}

#[test]
fn plan_and_run_use_one_vocabulary() {
    let human = graphc_compiler::plan::report::human_bytes;
    let f32_plan = stdout(&graphc(&["plan", GPT2]));
    let bf16_plan = stdout(&graphc(&["plan", GPT2, "--precision", "bf16"]));
    // The precision line gives the plan's own weights and peak (its lower bound), and
    // the f32 figures are the f32 plan's.
    let line = bf16_plan
        .lines()
        .find(|l| l.starts_with("precision"))
        .expect("a precision line");
    let expect = format!(
        "weights {} ({} in f32, -50%), the arena's peak {} ({} with its tensors in f32, -50%)",
        human(row_bytes(&bf16_plan, "weights")),
        human(row_bytes(&f32_plan, "weights")),
        human(row_bytes(&bf16_plan, "lower bound")),
        human(row_bytes(&f32_plan, "lower bound")),
    );
    assert!(line.contains(&expect), "{line}\nexpected: {expect}");
    // `run` prints the same line and the same plan.
    let run = stdout(&graphc(&[
        "run",
        GPT2,
        "--inputs",
        "tests/fixtures/onnx/gpt2/inputs.npz",
        "--precision",
        "bf16",
        "--device",
        "cpu",
    ]));
    let run_line = run
        .lines()
        .find(|l| l.starts_with("precision"))
        .expect("a precision line");
    assert_eq!(
        run_line.trim_start_matches("precision").trim(),
        line.trim_start_matches("precision").trim()
    );
    for name in ["weights", "arena", "lower bound"] {
        assert_eq!(row_bytes(&run, name), row_bytes(&bf16_plan, name), "{name}");
    }
    assert!(run.contains("weight tensors as imported"), "{run}");
    // Its hint draws this very plan.
    let picture = quoted_commands(&run);
    assert_eq!(picture.len(), 1, "{run}");
    let drawn = stdout(&ran(&picture[0]));
    assert!(drawn.contains("legend (largest first)"), "{drawn}");
    assert_eq!(row_bytes(&drawn, "arena"), row_bytes(&run, "arena"));
    // The totals say which device they are for, and what the other needs.
    assert!(
        row(&f32_plan, "total").contains("for a GPU run (a CPU run needs"),
        "{}",
        row(&f32_plan, "total")
    );
    assert!(
        row(&run, "total").contains("for a CPU run (a GPU run needs"),
        "{}",
        row(&run, "total")
    );
    // The bf16 peak table names its tensors as the f32 one does.
    let names = |text: &str| -> Vec<String> {
        let table = text.split("tensors live at the peak").nth(1).unwrap_or_default();
        table
            .lines()
            .filter(|l| l.trim_start().starts_with('b'))
            .map(|l| l.split_whitespace().nth(1).unwrap_or_default().to_string())
            .collect()
    };
    assert!(!names(&f32_plan).is_empty(), "{f32_plan}");
    assert_eq!(names(&bf16_plan), names(&f32_plan));
    assert!(!names(&bf16_plan).contains(&"-".to_string()), "{bf16_plan}");
    // Attention: what the fused kernels' score matrices would have taken, said as such.
    assert!(
        f32_plan.contains("fused: the score matrices are never stored (stored, they would take"),
        "{f32_plan}"
    );
    // Quantized GEMMs are generated kernels: no cuBLASLt workspace, and the row says why.
    let int4 = stdout(&graphc(&["plan", GPT2, "--weights", "int4"]));
    assert!(
        row(&int4, "workspace").contains("none: the 9 GEMMs read int8/int4 weights in generated kernels"),
        "{}",
        row(&int4, "workspace")
    );
}

/// The counts the README quotes are the ones graphc prints: the main job's passes and
/// the self-test's cases.
#[test]
fn the_readme_quotes_what_graphc_prints() {
    let readme = std::fs::read_to_string(super::repo_path("README.md")).unwrap();
    let readme = readme.split_whitespace().collect::<Vec<_>>().join(" ");
    let run = stdout(&graphc(&[
        "run",
        BLOCK,
        "--inputs",
        super::BLOCK_INPUTS,
        "--device",
        "cpu",
    ]));
    let pass = |name: &str| -> Vec<u64> {
        let line = run
            .lines()
            .find(|l| l.starts_with(&format!("pass     {name}:")))
            .unwrap_or_else(|| panic!("no {name} pass in:\n{run}"));
        // The numbers before the time, then those after it.
        line.split(|c: char| !c.is_ascii_digit() && c != '.')
            .filter_map(|w| w.parse::<u64>().ok())
            .collect()
    };
    let (opt, fuse) = (pass("optimize"), pass("fuse"));
    // `103 nodes -> 68 nodes in ..`, `68 nodes -> 8 kernels in ..; 9 launches instead
    // of 30 unfused; B bytes .. instead of U`.
    let (imported, optimized) = (opt[0], opt[1]);
    let (kernels, launches, unfused) = (fuse[1], fuse[fuse.len() - 4], fuse[fuse.len() - 3]);
    let mb = |b: u64| format!("{:.2}", b as f64 / 1e6);
    let (traffic, unfused_traffic) = (mb(fuse[fuse.len() - 2]), mb(fuse[fuse.len() - 1]));
    let claim = format!(
        "({imported} nodes as imported, {optimized} after the optimizer) runs as {kernels} kernels: {launches} \
         launches instead of {unfused} unfused, and {traffic} MB of global-memory traffic instead of \
         {unfused_traffic} MB"
    );
    assert!(
        readme.contains(&claim),
        "README.md should say: {claim}\n(graphc printed:\n{run})"
    );
    let cases = graphc::selftest::cases().unwrap().len();
    assert!(
        readme.contains(&format!("runs {cases} small graphs, one per kind of launch")),
        "README.md should say the self-test runs {cases} small graphs"
    );
}
