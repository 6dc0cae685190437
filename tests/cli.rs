//! The `graphc` binary: the README's main job, and clear errors (exit 1, no panic) for
//! bad models and bad inputs.

mod common;
#[path = "cli/hints.rs"]
mod hints;
#[path = "cli/memory.rs"]
mod memory;
#[path = "cli/time.rs"]
mod time;
#[path = "cli/train.rs"]
mod train;

use std::path::Path;
use std::process::{Command, Output};

use common::{repo_path, temp_dir};
use graphc::ir::{interpret, parse, DType, Tensor, TensorType};

const BLOCK: &str = "examples/models/transformer_block.gir";
const BLOCK_INPUTS: &str = "examples/models/transformer_block_inputs.npz";

fn graphc(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_graphc"))
        .args(args)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("graphc runs")
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// The command failed cleanly: exit code 1 (not a panic's 101) and a message.
fn fails_with(o: &Output, fragment: &str) {
    let err = stderr(o);
    assert_eq!(o.status.code(), Some(1), "stderr: {err}\nstdout: {}", stdout(o));
    assert!(err.starts_with("error: "), "{err}");
    assert!(err.contains(fragment), "expected `{fragment}` in: {err}");
}

#[test]
fn ir_prints_text_that_parses_back_to_the_model() {
    let o = graphc(&["ir", BLOCK]);
    assert!(o.status.success(), "{}", stderr(&o));
    let text = stdout(&o);
    let printed = parse(&text).expect("the printed IR parses");
    let loaded = graphc::load_model(&repo_path(BLOCK), &[]).unwrap();
    assert_eq!(graphc::ir::print(&printed), graphc::ir::print(&loaded));
}

#[test]
fn ir_json_round_trips_with_weights() {
    let o = graphc(&["ir", "--json", BLOCK]);
    assert!(o.status.success(), "{}", stderr(&o));
    let g = graphc::ir::Graph::from_json(&stdout(&o)).unwrap();
    let loaded = graphc::load_model(&repo_path(BLOCK), &[]).unwrap();
    assert_eq!(g, loaded);
}

#[test]
fn run_main_job_matches_the_interpreter() {
    let dir = temp_dir("cli-run");
    let out = dir.join("out.npz");
    let o = graphc(&[
        "run",
        BLOCK,
        "--inputs",
        BLOCK_INPUTS,
        "--output",
        out.to_str().unwrap(),
        "--device",
        "cpu",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let text = stdout(&o);
    assert!(text.contains("output   y: f32[2,16,128]"), "{text}");
    assert!(text.contains("pass     dce"), "{text}");
    assert!(
        text.contains("run      cpu (kernel-IR executor), 8 kernels, 8 launches (one run per kernel), through a ")
            && text.contains(" arena ("),
        "the CPU run goes through the planned arena: {text}"
    );

    let graph = graphc::load_model(&repo_path(BLOCK), &[]).unwrap();
    let inputs = graphc::npz::read_inputs(&repo_path(BLOCK_INPUTS), &graph).unwrap();
    let expected = interpret(&graph, &inputs).unwrap();
    let got = graphc::npz::read_arrays(&out).unwrap();
    // The interpreter's outputs, to rounding: the attention kernel is tiled (online
    // softmax) where the interpreter's spelled-out softmax takes two passes.
    for (name, a, b) in graphc::ir::compare::zip_outputs(&got, &expected).unwrap() {
        let err = graphc::ir::compare::relative_l2(a, b);
        assert!(
            err < 1e-6,
            "the written output {name} is the interpreter's: relative L2 {err:e}"
        );
    }
}

#[test]
fn random_inputs_then_run() {
    let dir = temp_dir("cli-random");
    let inputs = dir.join("in.npz");
    let o = graphc(&["random-inputs", BLOCK, "-o", inputs.to_str().unwrap(), "--seed", "3"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let o = graphc(&["run", BLOCK, "--inputs", inputs.to_str().unwrap()]);
    assert!(o.status.success(), "{}", stderr(&o));

    // Inputs for a run that cannot fit are refused before they are made (2 GiB of
    // token ids for a batch whose activations need 464 GiB), and nothing is written.
    let big = dir.join("big.npz");
    let o = graphc(&[
        "random-inputs",
        "tests/fixtures/onnx/gpt2_dynamic/model.onnx",
        "--dim",
        "batch=16777216",
        "--dim",
        "seq=16",
        "-o",
        big.to_str().unwrap(),
    ]);
    fails_with(&o, "over by");
    assert!(!big.exists());
}

fn write_inputs(dir: &Path, arrays: &[(&str, Tensor)]) -> String {
    let path = dir.join("in.npz");
    let arrays: Vec<_> = arrays.iter().map(|(n, t)| (n.to_string(), t.clone())).collect();
    graphc::npz::write_npz(&path, &arrays).unwrap();
    path.to_str().unwrap().to_string()
}

#[test]
fn missing_extra_and_mistyped_inputs_are_named() {
    let dir = temp_dir("cli-inputs");
    let good = Tensor::random(&TensorType::new(DType::F32, [2, 16, 128]), 0);

    let path = write_inputs(&dir, &[]);
    fails_with(
        &graphc(&["run", BLOCK, "--inputs", &path]),
        "missing input(s) \"x\" (f32[2,16,128])",
    );

    let path = write_inputs(&dir, &[("x", good.clone()), ("z", good.clone())]);
    fails_with(
        &graphc(&["run", BLOCK, "--inputs", &path]),
        "array \"z\" is not an input of the model (inputs: x)",
    );

    let wrong = Tensor::random(&TensorType::new(DType::F64, [2, 16, 128]), 0);
    let path = write_inputs(&dir, &[("x", wrong)]);
    fails_with(
        &graphc(&["run", BLOCK, "--inputs", &path]),
        "input \"x\" must be f32[2,16,128], the file has f64[2,16,128]",
    );

    let short = Tensor::random(&TensorType::new(DType::F32, [2, 8, 128]), 0);
    let path = write_inputs(&dir, &[("x", short)]);
    fails_with(&graphc(&["run", BLOCK, "--inputs", &path]), "the file has f32[2,8,128]");

    let not_npz = dir.join("bad.npz");
    std::fs::write(&not_npz, b"not a zip").unwrap();
    fails_with(
        &graphc(&["run", BLOCK, "--inputs", not_npz.to_str().unwrap()]),
        "not a valid .npz",
    );
}

#[test]
fn bad_models_are_clear_errors() {
    let dir = temp_dir("cli-models");
    let bad = dir.join("bad.gir");
    std::fs::write(
        &bad,
        "graph {\n  %0 = input \"x\" : f32[2]\n  %1 = frobnicate(%0) : f32[2]\n}\n",
    )
    .unwrap();
    fails_with(
        &graphc(&["ir", bad.to_str().unwrap()]),
        "bad.gir:3:8: unknown op `frobnicate`",
    );

    fails_with(&graphc(&["ir", "does/not/exist.gir"]), "does/not/exist.gir");
    let onnx = dir.join("m.onnx");
    std::fs::write(&onnx, b"").unwrap();
    fails_with(&graphc(&["ir", onnx.to_str().unwrap()]), "the model has no graph");
    fails_with(
        &graphc(&["ir", "--dim", "batch=8", BLOCK]),
        "no symbolic dimension `batch`",
    );

    let truncated = dir.join("t.gir");
    let text = std::fs::read_to_string(repo_path(BLOCK)).unwrap();
    std::fs::write(&truncated, &text[..text.len() / 2]).unwrap();
    let o = graphc(&["ir", truncated.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(stdout(&o).is_empty(), "no partial output");
}

/// Two lines of the example swapped so that a value is used before its definition:
/// every command that loads it fails with the place, none panics (it used to panic in
/// DCE).
#[test]
fn swapped_lines_are_an_error_for_every_command() {
    let dir = temp_dir("cli-swapped");
    let text = std::fs::read_to_string(repo_path(BLOCK)).unwrap();
    let mut lines: Vec<&str> = text.lines().collect();
    let first_use = lines.iter().position(|l| l.contains("= reduce_mean ")).unwrap();
    lines.swap(first_use, first_use + 1);
    let swapped = dir.join("swapped.gir");
    std::fs::write(&swapped, lines.join("\n")).unwrap();
    std::fs::copy(
        repo_path("examples/models/transformer_block.safetensors"),
        dir.join("transformer_block.safetensors"),
    )
    .unwrap();
    let path = swapped.to_str().unwrap();
    for cmd in ["ir", "opt", "plan", "cuda", "launches"] {
        fails_with(&graphc(&[cmd, path]), "is used before its definition at");
    }
}

const GPT2: &str = "tests/fixtures/onnx/gpt2/model.onnx";

#[test]
fn onnx_ir_and_run_with_token_ids() {
    let o = graphc(&["ir", GPT2]);
    assert!(o.status.success(), "{}", stderr(&o));
    let text = stdout(&o);
    assert!(text.contains("input \"input_ids\" : i64[2,16]"), "{text}");
    parse(&text).expect("the printed IR parses");

    let dir = temp_dir("cli-onnx");
    let out = dir.join("out.npz");
    let o = graphc(&[
        "run",
        GPT2,
        "--inputs",
        "tests/fixtures/onnx/gpt2/inputs.npz",
        "--output",
        out.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let got = graphc::npz::read_arrays(&out).unwrap();
    let want = graphc::npz::read_arrays(&repo_path("tests/fixtures/onnx/gpt2/outputs.npz")).unwrap();
    assert_eq!(got.len(), want.len());
    for ((gn, g), (wn, w)) in got.iter().zip(&want) {
        assert_eq!(gn, wn);
        assert!(common::rel_l2(&g.to_f64_vec(), &w.to_f64_vec()) < 1e-4);
    }
}

#[test]
fn onnx_list_unsupported_and_dims() {
    let o = graphc(&["ir", "--list-unsupported", GPT2]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(stdout(&o), "0 unsupported node(s)\n");
    fails_with(
        &graphc(&["ir", "--list-unsupported", BLOCK]),
        "--list-unsupported applies to .onnx models",
    );
    fails_with(
        &graphc(&["ir", "--dim", "batch=2", GPT2]),
        "--dim batch: the model has no symbolic input dimension `batch` (it has: none)",
    );
    let dir = temp_dir("cli-onnx-bad");
    let bad = dir.join("bad.onnx");
    std::fs::write(&bad, b"\x08\x07garbage that is not protobuf").unwrap();
    fails_with(&graphc(&["ir", bad.to_str().unwrap()]), "not a valid ONNX model");
}

#[test]
fn opt_prints_the_optimized_graph_and_a_summary() {
    let o = graphc(&["opt", GPT2]);
    assert!(o.status.success(), "{}", stderr(&o));
    let text = stdout(&o);
    let optimized = parse(&text).expect("the printed IR parses (the summary lines are comments)");
    let original = graphc::load_model(&repo_path(GPT2), &[]).unwrap();
    assert!(optimized.len() < original.len());
    for line in [
        "# nodes: ",
        "# constants folded: ",
        "# weights: ",
        "# e-graph: ",
        "# rules fired: ",
        "# fusion: ",
        "  # k0 ",
        "# program: ",
    ] {
        assert!(text.contains(line), "missing `{line}` in:\n{text}");
    }
    assert!(text.contains("stopped: saturated"), "{text}");
}

#[test]
fn plan_prints_the_arena_and_refuses_a_budget_it_exceeds() {
    let o = graphc(&["plan", BLOCK]);
    assert!(o.status.success(), "{}", stderr(&o));
    let text = stdout(&o);
    assert!(text.contains("arena ") && text.contains("lower bound"), "{text}");
    let o = graphc(&["plan", BLOCK, "--json"]);
    let v: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    for key in [
        "arena_bytes",
        "lower_bound_bytes",
        "weights_bytes",
        "budget_bytes",
        "kernels",
        "buffers",
    ] {
        assert!(v.get(key).is_some(), "missing {key}");
    }
    fails_with(
        &graphc(&["plan", BLOCK, "--budget", "100KiB"]),
        "budget is 100.0 KiB (102400 B): over by",
    );
    let o = graphc(&["plan", BLOCK, "--budget", "24 parsecs"]);
    assert!(
        !o.status.success() && stderr(&o).contains("unknown unit `parsecs`"),
        "{}",
        stderr(&o)
    );
}

#[test]
fn fit_prints_the_largest_batch_and_refuses_static_models() {
    let model = "tests/fixtures/onnx/gpt2_dynamic/model.onnx";
    let o = graphc(&["fit", model, "--dim", "batch", "--dim", "seq=16", "--budget", "40MiB"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = stdout(&o);
    let line = out.lines().next().unwrap_or_default();
    assert!(line.starts_with("fit          batch = "), "{out}");
    assert!(
        line.contains("is the largest that fits 40.0 MiB") && line.contains("over by"),
        "{out}"
    );
    // The plan at that batch fits, one more does not.
    let n: usize = line["fit          batch = ".len()..]
        .split_whitespace()
        .next()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("{out}"));
    let at = |b: usize| {
        graphc(&[
            "plan",
            model,
            "--dim",
            &format!("batch={b}"),
            "--dim",
            "seq=16",
            "--budget",
            "40MiB",
        ])
    };
    assert!(at(n).status.success());
    assert_eq!(at(n + 1).status.code(), Some(1));
    fails_with(
        &graphc(&["fit", BLOCK, "--dim", "batch", "--budget", "1GiB"]),
        "only static dimensions",
    );
    fails_with(
        &graphc(&["fit", model, "--dim", "seq=16", "--budget", "1GiB"]),
        "exactly one --dim NAME",
    );
    fails_with(
        &graphc(&["fit", model, "--dim", "batch", "--dim", "seq=16", "--budget", "1MiB"]),
        "even batch=1 does not fit",
    );
}

#[test]
fn plan_summary_picture_and_svg() {
    let dir = temp_dir("cli-plan-svg");
    let svg = dir.join("plan.svg");
    let o = graphc(&["plan", BLOCK, "--picture", "--svg", svg.to_str().unwrap()]);
    assert!(o.status.success(), "{}", stderr(&o));
    let text = stdout(&o);
    for fragment in [
        "arena / bound",
        "fragmentation",
        "peak ",
        "tensors live at the peak",
        "legend (largest first):",
        "^ peak: step",
        "fits, headroom",
    ] {
        assert!(text.contains(fragment), "missing `{fragment}` in:\n{text}");
    }
    let written = std::fs::read_to_string(&svg).expect("the SVG is written");
    assert!(written.starts_with("<svg"), "{written}");
    assert!(written.trim_end().ends_with("</svg>"));

    // Without --picture, no picture.
    let o = graphc(&["plan", BLOCK]);
    assert!(!stdout(&o).contains("legend"), "{}", stdout(&o));

    // An SVG that cannot be written: the error names the path.
    let bad = dir.join("no/such/folder/plan.svg");
    fails_with(
        &graphc(&["plan", BLOCK, "--svg", bad.to_str().unwrap()]),
        "no/such/folder/plan.svg",
    );
}

#[test]
fn plan_json_has_the_contract_fields_and_steps() {
    let o = graphc(&["plan", BLOCK, "--json", "--budget", "1GiB"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_str(&stdout(&o)).expect("stdout is only JSON");
    for key in [
        "arch",
        "arena_bytes",
        "lower_bound_bytes",
        "weights_bytes",
        "budget_bytes",
        "total_bytes",
        "peak_step",
        "peak_live",
    ] {
        assert!(v.get(key).is_some(), "missing {key}");
    }
    assert_eq!(v["budget_bytes"], 1u64 << 30);
    let kernels = v["kernels"].as_u64().expect("kernels is a count");
    assert_eq!(v["steps"].as_array().unwrap().len() as u64, kernels);
    let buffers = v["buffers"].as_array().unwrap();
    assert!(!buffers.is_empty());
    for b in buffers {
        for key in ["offset", "bytes", "start", "end"] {
            assert!(b.get(key).is_some_and(|x| x.is_u64()), "buffer without {key}: {b}");
        }
    }
}

#[test]
fn plan_over_budget_names_the_peak_and_remedies_and_writes_nothing() {
    let o = graphc(&["plan", GPT2, "--json"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let plan: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    let peak = plan["peak_step"].as_u64().unwrap() as usize;
    let peak_kernel = plan["steps"][peak]["kernel"].as_str().unwrap().to_string();
    let top = plan["peak_live"][0]["name"].as_str().unwrap().to_string();
    // Room for the weights and the GEMM workspace, not for all the activations.
    let fixed = plan["weights_bytes"].as_u64().unwrap() + plan["workspace_bytes"].as_u64().unwrap();
    let budget = (fixed + (plan["total_bytes"].as_u64().unwrap() - fixed) / 2).to_string();

    let dir = temp_dir("cli-plan-over");
    let svg = dir.join("plan.svg");
    for json in [false, true] {
        let mut args = vec!["plan", GPT2, "--budget", &budget, "--svg", svg.to_str().unwrap()];
        if json {
            args.push("--json");
        }
        let o = graphc(&args);
        fails_with(&o, "over by ");
        let err = stderr(&o);
        assert!(err.contains("B) but the budget is "), "{err}");
        assert!(err.contains(&format!("({budget} B): over by")), "{err}");
        assert!(err.contains(&format!("kernel {peak_kernel} (")), "{err}");
        assert!(err.contains(&top), "{err}");
        assert!(err.contains("what would help:"), "{err}");
        assert!(err.contains("- a smaller batch or sequence length"), "{err}");
        assert!(err.contains("- bf16/fp16 instead of f32"), "{err}");
        assert!(!svg.exists(), "no SVG for a plan over budget");
        if json {
            // The whole plan, with the diagnosis as data.
            let v: serde_json::Value = serde_json::from_str(&stdout(&o)).expect("stdout is only JSON");
            assert_eq!(v["summary"]["fits"], serde_json::json!(false), "{v}");
            let d = &v["diagnosis"];
            assert!(d["over_by"].as_u64().is_some_and(|b| b > 0), "{d}");
            assert!(d["remedies"].as_array().is_some_and(|r| !r.is_empty()), "{d}");
        } else {
            assert!(stdout(&o).contains("OVER BUDGET by"), "{}", stdout(&o));
        }
    }

    // Below the cuBLASLt workspace nothing in the model helps, and the error says so.
    let o = graphc(&["plan", GPT2, "--budget", "1MiB"]);
    fails_with(&o, "budget is 1.00 MiB (1048576 B): over by");
    assert!(
        stderr(&o).contains("workspace the GEMMs reserve (32.0 MiB) alone exceeds"),
        "{}",
        stderr(&o)
    );

    // `run` refuses too, before running anything.
    let out = dir.join("out.npz");
    let o = graphc(&[
        "run",
        GPT2,
        "--inputs",
        "tests/fixtures/onnx/gpt2/inputs.npz",
        "--output",
        out.to_str().unwrap(),
        "--budget",
        "1MiB",
    ]);
    fails_with(&o, "over by ");
    assert!(stderr(&o).contains(&peak_kernel), "{}", stderr(&o));
    assert!(!out.exists());
}

/// `--device cuda` on a machine without a driver or GPU: exit code 3 and a message that
/// says so; the CPU path still works. On a GPU machine: the GPU agrees with the CPU.
#[test]
fn cuda_without_a_gpu_exits_3_and_cpu_still_runs() {
    let o = graphc(&["run", BLOCK, "--inputs", BLOCK_INPUTS, "--device", "cuda", "--check"]);
    let err = stderr(&o);
    if graphc::cuda::driver_available() && o.status.code() == Some(0) {
        assert!(stdout(&o).contains("check    "), "{}", stdout(&o));
    } else {
        assert_eq!(o.status.code(), Some(3), "stderr: {err}\nstdout: {}", stdout(&o));
        assert!(err.starts_with("error: no CUDA"), "{err}");
        // `--check` compares with the CPU executor: the hint names cuda-sim.
        assert!(err.contains("--check --device cuda-sim` compares"), "{err}");
    }
    let o = graphc(&["bench", BLOCK, "--device", "cuda", "--iters", "2", "--json"]);
    if o.status.code() != Some(0) {
        assert_eq!(o.status.code(), Some(3), "{}", stderr(&o));
        assert!(stdout(&o).is_empty(), "no partial output");
    }
    let o = graphc(&["run", BLOCK, "--inputs", BLOCK_INPUTS, "--device", "cpu"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    fails_with(&graphc(&["run", BLOCK, "--device", "cpu", "--check"]), "--device cuda");
    if !graphc::cuda::driver_available() {
        let o = graphc(&["run", BLOCK, "--check"]);
        assert_eq!(o.status.code(), Some(3), "{}", stderr(&o));
        assert!(stderr(&o).contains("--check needs a GPU"), "{}", stderr(&o));
    }
}

/// `graphc bench --device cpu --json` has the fields the GPU check script reads, and
/// `graphc launches` prints the launch list a GPU would run.
#[test]
fn bench_json_and_launches() {
    let o = graphc(&[
        "bench", BLOCK, "--device", "cpu", "--iters", "2", "--warmup", "0", "--json",
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    for key in [
        "median_ms",
        "min_ms",
        "max_ms",
        "kernels",
        "launches",
        "plan",
        "iters",
        "device",
    ] {
        assert!(v.get(key).is_some(), "{key} missing in {v}");
    }
    assert_eq!(v["iters"], 2);
    assert!(v["median_ms"].as_f64().unwrap() > 0.0);
    assert!(v["plan"]["total_bytes"].as_u64().unwrap() > v["plan"]["arena_bytes"].as_u64().unwrap());

    let o = graphc(&["launches", BLOCK, "--gpu", "h200"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let text = stdout(&o);
    assert!(text.contains("sm_90, 132 SMs"), "{text}");
    assert!(text.contains(" gemm f32 ") && text.contains(" kernel g_row_"), "{text}");
}

/// `--precision`: the plan states what bf16 saved; a bad value is a clear error.
#[test]
fn plan_and_run_take_a_precision() {
    let o = graphc(&["plan", BLOCK, "--precision", "bf16"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let text = stdout(&o);
    assert!(text.contains("precision      bf16: weights"), "{text}");
    assert!(text.contains(" in f32, -50%)"), "{text}");
    let o = graphc(&[
        "run",
        BLOCK,
        "--inputs",
        BLOCK_INPUTS,
        "--device",
        "cpu",
        "--precision",
        "fp16",
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(stdout(&o).contains("pass     precision: "), "{}", stdout(&o));
    let o = graphc(&["plan", BLOCK, "--precision", "int8"]);
    assert_eq!(o.status.code(), Some(2), "clap's usage error: {}", stderr(&o));
    assert!(stderr(&o).contains("unknown precision `int8`"), "{}", stderr(&o));
}

/// A missing model file is named once; an ONNX model's unset symbolic dimensions are
/// all named in one error.
#[test]
fn missing_files_and_unset_dims_are_reported_once_and_together() {
    for missing in ["/nonexistent/model.onnx", "/nonexistent/model.gir"] {
        for cmd in [
            &["plan", missing][..],
            &["ir", missing],
            &["ir", "--list-unsupported", missing],
        ] {
            if cmd.len() == 3 && missing.ends_with(".gir") {
                continue;
            }
            let o = graphc(cmd);
            fails_with(&o, "No such file or directory");
            assert_eq!(stderr(&o).matches(missing).count(), 1, "{cmd:?}: {}", stderr(&o));
        }
    }
    let model = "tests/fixtures/onnx/gpt2_dynamic/model.onnx";
    let o = graphc(&["plan", model]);
    fails_with(
        &o,
        "2 symbolic dimensions are not set: `batch` (graph input `input_ids`, axis 0), `seq` (graph input \
         `input_ids`, axis 1); fix them with --dim batch=N --dim seq=N",
    );
    fails_with(
        &graphc(&["plan", model, "--dim", "seq=16"]),
        "graph input `input_ids`: symbolic dimension `batch` (axis 0) is not set; fix it with --dim batch=N",
    );
    let o = graphc(&["plan", model, "--dim", "seq=16", "--dim", "batch=2"]);
    assert!(o.status.success(), "{}", stderr(&o));
}

/// One vocabulary: every command that counts says the same of the transformer block
/// (8 kernels of the fused program, 9 launches on the stream, 4 distinct modules).
#[test]
fn every_command_counts_kernels_launches_and_modules_alike() {
    const COUNTS: &str = "8 kernels, 9 launches (4 cuBLASLt GEMMs + 5 generated), 4 modules";
    let o = graphc(&["opt", BLOCK]);
    assert!(
        stdout(&o).contains(&format!("# fusion: {COUNTS}; unfused 30 launches")),
        "{}",
        stdout(&o)
    );
    for gpu in ["rtx4090d", "h200"] {
        let o = graphc(&["launches", BLOCK, "--gpu", gpu]);
        let text = stdout(&o);
        assert_eq!(text.lines().nth(1), Some(COUNTS), "{text}");
        assert!(!text.contains("8 kernels (4 modules)"), "{text}");
    }
    let o = graphc(&["cuda", BLOCK]);
    assert_eq!(stdout(&o).lines().last(), Some(format!("// {COUNTS}").as_str()));
    let o = graphc(&["run", BLOCK, "--device", "cpu"]);
    assert!(
        stdout(&o).contains("cpu (kernel-IR executor), 8 kernels, 8 launches (one run per kernel)"),
        "{}",
        stdout(&o)
    );
    let o = graphc(&[
        "bench", BLOCK, "--device", "cpu", "--iters", "1", "--warmup", "0", "--json",
    ]);
    let v: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!((v["kernels"].as_u64(), v["launches"].as_u64()), (Some(8), Some(8)));
    assert_eq!(v["gemms"], 0);
    assert!(v["modules"].is_null());
}

/// `bench` runs where `run` does by default: the GPU when one is usable, else the CPU.
#[test]
fn bench_defaults_to_auto() {
    let o = graphc(&["bench", BLOCK, "--iters", "1", "--warmup", "0", "--json"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_str(&stdout(&o)).expect("stdout is only JSON");
    let device = v["device"].as_str().unwrap();
    if graphc::cuda::driver_available() {
        assert!(
            device == "cuda" || stderr(&o).contains("no usable GPU here"),
            "{device}"
        );
    } else {
        assert_eq!(device, "cpu");
        assert!(stderr(&o).contains("no usable GPU here, so the CPU"), "{}", stderr(&o));
    }
    let o = graphc(&["bench", "--help"]);
    assert!(stdout(&o).contains("[default: auto]"), "{}", stdout(&o));
}

/// Every argument of every subcommand has help text (the unit test in the binary walks
/// the clap tree; this reads what a user sees).
#[test]
fn help_describes_every_argument() {
    for cmd in [
        "ir",
        "opt",
        "plan",
        "fit",
        "cuda",
        "ptx",
        "run",
        "bench",
        "selftest",
        "launches",
        "random-inputs",
    ] {
        let o = graphc(&["help", cmd]);
        assert!(o.status.success(), "{}", stderr(&o));
        let text = stdout(&o);
        let lines: Vec<&str> = text.lines().collect();
        // An argument line (`  <MODEL>`, `      --dim <NAME=N>`) has its help after two
        // spaces (short form) or on the next line, indented further (long form).
        for (i, line) in lines.iter().enumerate() {
            let t = line.trim_start();
            let indent = line.len() - t.len();
            let same_line = t.split_once("  ").is_some_and(|(_, h)| !h.trim().is_empty());
            if (2..=6).contains(&indent) && (t.starts_with('-') || t.starts_with('<')) && !same_line {
                let next = lines.get(i + 1).copied().unwrap_or_default();
                let help_indent = next.len() - next.trim_start().len();
                assert!(
                    help_indent > indent && !next.trim().is_empty(),
                    "`graphc {cmd}`: argument without help: {line}\n{text}"
                );
            }
        }
    }
}

/// `--weights int8|int4` on plan and run: the plan counts the packed weights and
/// says what was quantized, a run works on the CPU, an over-budget plan offers int8 and
/// int4 weights as remedies, and an unknown format is an error naming the choices.
#[test]
fn weights_int8_and_int4_on_plan_and_run() {
    let model = "examples/models/transformer_block.gir";
    let weights_bytes = |o: &Output| -> u64 {
        stdout(o)
            .lines()
            .find_map(|l| {
                let f: Vec<&str> = l.split_whitespace().collect();
                (f.first() == Some(&"weights") && f.get(4) == Some(&"B")).then(|| f[3].parse().ok())?
            })
            .expect("a weights line")
    };
    let plain = graphc(&["plan", model]);
    assert!(plain.status.success(), "{}", stderr(&plain));
    let f32_bytes = weights_bytes(&plain);
    for (w, ratio) in [("int8", 0.3), ("int4", 0.2)] {
        let o = graphc(&["plan", model, "--weights", w]);
        assert!(o.status.success(), "{}", stderr(&o));
        let bytes = weights_bytes(&o);
        assert!(
            (bytes as f64) < ratio * f32_bytes as f64 + 8192.0,
            "{w}: {bytes} of {f32_bytes}"
        );
        assert!(
            stdout(&o).contains(&format!("weights        {w}: 4 weight matrices")),
            "{}",
            stdout(&o)
        );
        assert!(
            !stdout(&o).contains("cuBLASLt (the program"),
            "no cuBLASLt GEMM: {}",
            stdout(&o)
        );
        let r = graphc(&["run", model, "--device", "cpu", "--weights", w]);
        assert!(r.status.success(), "{}", stderr(&r));
        assert!(stdout(&r).contains("quantize: "), "{}", stdout(&r));
    }
    // Over a budget the weights and the cuBLASLt workspace exceed, int4 is the remedy
    // (generated GEMMs need no workspace), and it does fit.
    let over = graphc(&["plan", model, "--budget", "600KiB"]);
    fails_with(&over, "--budget 600KiB --weights int4`");
    let fixed = graphc(&["plan", model, "--budget", "600KiB", "--weights", "int4"]);
    assert!(fixed.status.success(), "{}", stderr(&fixed));
    let bad = graphc(&["plan", model, "--weights", "int3"]);
    assert_eq!(bad.status.code(), Some(2));
    assert!(
        stderr(&bad).contains("`int3` (expected none, int8 or int4)"),
        "{}",
        stderr(&bad)
    );
}
