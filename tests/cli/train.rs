//! `graphc train` and `graphc plan --train`: the PyTorch MLP reference trained from the
//! command line, and clean errors for a batch that does not fit the step.

use super::{fails_with, graphc, stderr, stdout};
use crate::common::temp_dir;

const MLP: &str = "tests/fixtures/train/mlp/model.onnx";
const MLP_IN: &str = "tests/fixtures/train/mlp/inputs.npz";

#[test]
fn train_prints_pytorchs_losses_and_writes_the_parameters() {
    let dir = temp_dir("cli_train");
    let out = dir.join("params.npz");
    let o = graphc(&[
        "train",
        MLP,
        "--inputs",
        MLP_IN,
        "--loss",
        "mse",
        "--target",
        "y",
        "--optimizer",
        "sgd",
        "--lr",
        "0.05",
        "--momentum",
        "0.9",
        "--dampening",
        "0.1",
        "--weight-decay",
        "0.01",
        "--steps",
        "3",
        "--device",
        "cpu",
        "--output",
        out.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let text = stdout(&o);
    let losses: Vec<f64> = text
        .lines()
        .filter_map(|l| l.strip_prefix("step "))
        .map(|l| l.split_whitespace().nth(2).unwrap().parse().unwrap())
        .collect();
    let want = [1.2100363969802856, 1.1346204280853271, 1.0132218599319458];
    assert_eq!(losses.len(), 3, "{text}");
    for (g, w) in losses.iter().zip(want) {
        assert!((g - w).abs() <= 1e-5 * w, "{g} vs PyTorch {w}\n{text}");
    }
    assert!(text.contains("4 parameters (808 elements) trained"), "{text}");
    let params = graphc::npz::read_arrays(&out).unwrap();
    let names: Vec<&str> = params.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names, ["fc0.weight", "fc0.bias", "fc1.weight", "fc1.bias"]);
}

#[test]
fn plan_train_gives_bytes_by_class_adding_up_to_the_total() {
    let o = graphc(&["plan", MLP, "--train", "--loss", "mse", "--optimizer", "adamw"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let text = stdout(&o);
    for class in [
        "parameters",
        "optimizer state",
        "saved activations",
        "gradients",
        "temporaries",
    ] {
        assert!(text.contains(&format!("  {class} ")), "no {class} row:\n{text}");
    }
    let o = graphc(&[
        "plan",
        MLP,
        "--train",
        "--loss",
        "mse",
        "--optimizer",
        "adamw",
        "--json",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!(v["train"]["total"], v["total_bytes"]);
    assert_eq!(v["train"]["parameters"], 808 * 4);
    assert_eq!(v["train"]["optimizer_state"], 2 * 808 * 4 + 8);
}

#[test]
fn a_batch_that_does_not_fit_the_step_is_an_error_naming_it() {
    let dir = temp_dir("cli_train_errors");
    let out = dir.join("never.npz");
    let base = |extra: &[&str]| {
        let mut a = vec![
            "train",
            MLP,
            "--inputs",
            MLP_IN,
            "--optimizer",
            "sgd",
            "--device",
            "cpu",
            "--output",
            out.to_str().unwrap(),
        ];
        a.extend_from_slice(extra);
        graphc(&a)
    };
    fails_with(
        &base(&["--loss", "mse", "--target", "z"]),
        "\"y\" is neither an input of the model nor the target \"z\"",
    );
    fails_with(&base(&["--loss", "mse"]), "--target NAME");
    // Float targets where cross-entropy wants integer labels of the leading shape.
    fails_with(
        &base(&["--loss", "cross-entropy", "--target", "y"]),
        "need integer labels",
    );
    fails_with(&base(&["--loss", "mse", "--target", "y", "--freeze", "("]), "--freeze");
    fails_with(
        &base(&["--loss", "mse", "--target", "y", "--freeze", "fc"]),
        "nothing to train",
    );
    fails_with(&base(&["--loss", "mse", "--target", "y", "--steps", "0"]), "--steps");
    fails_with(&base(&["--loss", "mse", "--target", "y", "--lr=-1"]), "lr -1");
    fails_with(
        &base(&["--loss", "mse", "--target", "y", "--weights", "int8"]),
        "trains float weights",
    );
    // Loss scaling's options, checked before anything runs; the message once.
    for (flag, value, says) in [
        ("--init-scale", "0", "initial scale 0 is not allowed"),
        ("--init-scale", "1e39", "initial scale"),
        ("--growth-interval", "0", "growth interval 0 is not allowed"),
    ] {
        let o = base(&["--loss", "mse", "--target", "y", "--precision", "fp16", flag, value]);
        fails_with(&o, says);
        assert_eq!(stderr(&o).matches(says).count(), 1, "{}", stderr(&o));
    }
    assert!(!out.exists(), "no output after an error");
}

/// A label that is no class of the logits (nor the ignore index) is an error naming it
/// and where it is, before any step runs (PyTorch stops on it too).
#[test]
fn a_label_outside_the_classes_is_an_error_naming_it() {
    let dir = temp_dir("cli_train_labels");
    let batch = dir.join("bad_labels.npz");
    let mut arrays = graphc::npz::read_arrays(std::path::Path::new("tests/fixtures/train/gpt2/inputs.npz")).unwrap();
    let (_, labels) = arrays.iter_mut().find(|(n, _)| n == "labels").unwrap();
    let dims = labels.shape().dims().to_vec();
    let mut v: Vec<i64> = labels.to_f64_vec().iter().map(|&x| x as i64).collect();
    v[5] = 1_000_000;
    *labels = graphc::ir::Tensor::new(dims, graphc::ir::TensorData::I64(v)).unwrap();
    graphc::npz::write_npz(&batch, &arrays).unwrap();
    let o = graphc(&[
        "train",
        "tests/fixtures/train/gpt2/model.onnx",
        "--inputs",
        batch.to_str().unwrap(),
        "--loss",
        "cross-entropy",
        "--target",
        "labels",
        "--shift-labels",
        "--optimizer",
        "sgd",
        "--device",
        "cpu",
    ]);
    fails_with(&o, "label 1000000 at [0, 5] of \"labels\" is not a class of the logits");
    assert!(!stdout(&o).contains("step 1"), "no step ran");
}

/// `graphc cuda --train` prints the training step's kernels: the parameters' updates
/// in a multi-tensor launch, one block range per part.
#[test]
fn cuda_train_prints_the_steps_multi_tensor_update() {
    let o = graphc(&["cuda", MLP, "--train", "--loss", "mse", "--optimizer", "adamw"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let text = stdout(&o);
    assert!(text.contains("_multi_tensor (multi_tensor)"), "{text}");
    assert!(text.contains("// part 1:"), "{text}");
    fails_with(&graphc(&["cuda", MLP, "--train"]), "--loss");
}

/// fp16 with dynamic loss scaling from the command line: each step prints the scale,
/// and from GradScaler's overflowing start (the reference's) the steps PyTorch skipped
/// are the ones graphc says it skipped, the scale halving at each; bf16 needs no
/// scaling and prints none.
#[test]
fn fp16_training_prints_the_scale_and_each_skipped_step() {
    let dir = "tests/fixtures/train/gpt2";
    let meta: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(format!("{dir}/meta.json")).unwrap()).unwrap();
    let amp = &meta["amp"];
    let model = format!("{dir}/model.onnx");
    let inputs = format!("{dir}/inputs.npz");
    let init = amp["overflow_init_scale"].as_f64().unwrap().to_string();
    let o = graphc(&[
        "train",
        &model,
        "--inputs",
        &inputs,
        "--loss",
        "cross-entropy",
        "--target",
        "labels",
        "--shift-labels",
        "--steps",
        "6",
        "--precision",
        "fp16",
        "--init-scale",
        &init,
        "--growth-interval",
        "2",
        "--device",
        "cpu",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = stdout(&o);
    let steps: Vec<&str> = out.lines().filter(|l| l.starts_with("step ")).collect();
    assert_eq!(steps.len(), 6, "{out}");
    let want_skipped: Vec<bool> = amp["overflow_skipped"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_bool().unwrap())
        .collect();
    let want_scales: Vec<f64> = amp["overflow_scales"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_f64().unwrap())
        .collect();
    for (i, line) in steps.iter().enumerate() {
        let w: Vec<&str> = line.split_whitespace().collect();
        assert_eq!(w[4], "scale", "{line}");
        let scale: f64 = w[5].parse().unwrap();
        assert_eq!(scale as f32, want_scales[i] as f32, "{line}");
        assert_eq!(line.contains("skipped"), want_skipped[i], "{line}");
    }
    let o = graphc(&[
        "train",
        &model,
        "--inputs",
        &inputs,
        "--loss",
        "cross-entropy",
        "--target",
        "labels",
        "--shift-labels",
        "--precision",
        "bf16",
        "--device",
        "cpu",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(!stdout(&o).contains("scale"), "{}", stdout(&o));
}

/// `graphc fit --train`: the largest batch whose whole training step fits, the step's
/// bytes by class there, and the classes that grow at the next batch (the saved
/// activations do; parameters and optimizer state do not).
#[test]
fn fit_train_finds_the_largest_batch_and_says_what_grows() {
    let o = graphc(&[
        "fit",
        "tests/fixtures/onnx/gpt2_dynamic/model.onnx",
        "--dim",
        "seq=16",
        "--dim",
        "batch",
        "--train",
        "--loss",
        "cross-entropy",
        "--shift-labels",
        "--precision",
        "bf16",
        "--budget",
        "40MiB",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = stdout(&o);
    assert!(out.contains("is the largest that fits 40.0 MiB"), "{out}");
    assert!(
        out.contains("training step:") && out.contains("bytes by class"),
        "{out}"
    );
    let growth = out.split("from batch=").nth(1).unwrap_or_else(|| panic!("{out}"));
    assert!(growth.contains("saved activations"), "{growth}");
    assert!(
        !growth.contains("parameters") && !growth.contains("optimizer state"),
        "{growth}"
    );
}

/// A training step over its budget: the state is fixed in the diagnosis, freezing the
/// embeddings is offered with its effect, and the commands it proposes keep `--train`.
#[test]
fn an_over_budget_training_plan_offers_freezing_and_keeps_train_in_its_commands() {
    let o = graphc(&[
        "plan",
        "tests/fixtures/onnx/gpt2_dynamic/model.onnx",
        "--dim",
        "seq=16",
        "--dim",
        "batch=64",
        "--train",
        "--loss",
        "cross-entropy",
        "--shift-labels",
        "--budget",
        "36MiB",
    ]);
    assert_eq!(o.status.code(), Some(1), "{}", stdout(&o));
    let err = stderr(&o);
    assert!(err.contains("of which the training state"), "{err}");
    assert!(err.contains("freezing the embeddings"), "{err}");
    assert!(err.contains("--freeze"), "{err}");
    assert!(
        err.contains("--dim batch --budget 36MiB --train --loss cross-entropy"),
        "the fit command keeps the step's options: {err}"
    );
    assert!(
        !err.contains("int8 weights"),
        "no quantization for what is trained: {err}"
    );
}
