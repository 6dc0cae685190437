//! `graphc plan --time`: every kernel's modeled and ideal time on a named GPU, counted
//! from its own CUDA C on cuda-sim (counts, never a wall-clock bound).

use super::{fails_with, graphc, stderr, stdout, BLOCK};

fn have_cxx() -> bool {
    match graphc::cuda::sim::build::find_compiler() {
        Ok(_) => true,
        Err(e) => {
            graphc_testkit::skip(graphc_testkit::Need::Cxx, e);
            false
        }
    }
}

#[test]
fn plan_time_models_every_kernel_of_a_training_step_in_json_and_text() {
    if !have_cxx() {
        return;
    }
    let step = [
        "tests/fixtures/train/gpt2_sdpa/model.onnx",
        "--train",
        "--loss",
        "cross-entropy",
        "--target",
        "labels",
        "--shift-labels",
        "--optimizer",
        "adamw",
        "--time",
        "--gpu",
        "h200",
    ];
    let o = graphc(&[&["plan", "--json"][..], &step[..]].concat());
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    let t = &v["time"];
    assert_eq!(t["gpu"], "h200");
    let kernels = t["kernels"].as_array().unwrap();
    assert_eq!(kernels.len() as u64, v["kernels"].as_u64().unwrap());
    let (mut modeled, mut ideal) = (0.0, 0.0);
    let mut kinds = std::collections::BTreeSet::new();
    for k in kernels {
        let (m, i) = (k["modeled_s"].as_f64().unwrap(), k["ideal_s"].as_f64().unwrap());
        // Every kernel launches at least once (its fixed cost) and moves some bytes.
        assert!(m >= graphc::perf::LAUNCH_S && i > 0.0, "{k}");
        assert!(k["bound"] != "uncounted", "{k}");
        modeled += m;
        ideal += i;
        kinds.insert(k["kind"].as_str().unwrap().to_string());
    }
    assert!((modeled / t["modeled_s"].as_f64().unwrap() - 1.0).abs() < 1e-9);
    assert!((ideal / t["ideal_s"].as_f64().unwrap() - 1.0).abs() < 1e-9);
    for kind in ["gemm", "attention", "elementwise", "row"] {
        assert!(kinds.contains(kind), "{kinds:?}");
    }
    // The text: the totals and the kernels by time lost.
    let o = graphc(&[&["plan"][..], &step[..]].concat());
    assert!(o.status.success(), "{}", stderr(&o));
    let text = stdout(&o);
    assert!(text.contains("time           h200: modeled "), "{text}");
    assert!(
        text.contains("counted on cuda-sim: the first, middle and last block"),
        "{text}"
    );
    assert!(text.contains("lost     modeled       ideal  kind"), "{text}");
}

#[test]
fn an_unknown_gpu_is_named_with_those_the_model_knows() {
    let o = graphc(&["plan", BLOCK, "--time", "--gpu", "a100"]);
    fails_with(&o, "unknown GPU `a100`: the performance model knows rtx4090d, h200");
    let o = graphc(&["plan", BLOCK, "--gpu", "h200"]);
    assert_eq!(o.status.code(), Some(2), "--gpu without --time is a usage error");
}

#[test]
fn fit_time_models_the_answer_and_its_throughput() {
    if !have_cxx() {
        return;
    }
    let o = graphc(&[
        "fit",
        "tests/fixtures/onnx/gpt2_dynamic/model.onnx",
        "--dim",
        "batch",
        "--dim",
        "seq=64",
        "--budget",
        "64MiB",
        "--time",
        "--gpu",
        "h200",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let text = stdout(&o);
    let fit = text
        .lines()
        .find(|l| l.starts_with("fit          batch = "))
        .expect("the answer");
    let value: u64 = fit["fit          batch = ".len()..]
        .split_whitespace()
        .next()
        .and_then(|v| v.parse().ok())
        .expect("a value");
    let line = text
        .lines()
        .find(|l| l.starts_with("throughput   "))
        .expect("a throughput line");
    assert!(
        line.starts_with(&format!("throughput   batch = {value} in a run of ")),
        "{line}"
    );
    assert!(
        line.ends_with(" batch per second") && line.contains("ms modeled on h200"),
        "{line}"
    );
    assert!(text.contains("time           h200: modeled "), "{text}");
    let o = graphc(&["fit", BLOCK, "--dim", "x", "--gpu", "h200"]);
    assert_eq!(o.status.code(), Some(2), "--gpu without --time is a usage error");
}
