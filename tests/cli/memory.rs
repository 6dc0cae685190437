//! Memory options on the command line: token chunking of inference plans and layer
//! recomputation of training plans.

use std::process::Output;

use super::{graphc, stderr, stdout};

/// `--chunk-tokens N`: `graphc plan` runs GPT-2's attention blocks and MLPs in parts of
/// the batch (of its tokens, with fewer sequences than parts) and says so, with a
/// smaller arena than the whole plan (`tests/fit.rs` checks the values); over the
/// budget, the diagnosis names the fewest parts that fit, planned; 0 parts are refused
/// with the reason.
#[test]
fn chunk_tokens_runs_mlps_in_parts() {
    let model = "tests/fixtures/onnx/gpt2_dynamic/model.onnx";
    let dims = ["--dim", "batch=8", "--dim", "seq=16"];
    let arena = |o: &Output| {
        let out = stdout(o);
        let line = out
            .lines()
            .find(|l| l.starts_with("arena"))
            .unwrap_or_default()
            .to_string();
        line.split_whitespace()
            .nth(3)
            .and_then(|b| b.parse::<u64>().ok())
            .unwrap_or(0)
    };
    let whole = graphc(&[&["plan", model][..], &dims].concat());
    assert!(whole.status.success(), "{}", stderr(&whole));
    let parts = graphc(&[&["plan", model][..], &dims, &["--chunk-tokens", "4"]].concat());
    assert!(parts.status.success(), "{}", stderr(&parts));
    assert!(
        stdout(&parts).contains(
            "chunks         2 attention blocks and 2 MLPs (each from its norm to its residual add, \
             and what follows the last to the output) run in 4 parts of the batch"
        ),
        "{}",
        stdout(&parts)
    );
    // Fewer sequences than parts: the MLPs in parts of their tokens.
    let few = ["--dim", "batch=2", "--dim", "seq=16", "--chunk-tokens", "4"];
    let tokens = graphc(&[&["plan", model][..], &few].concat());
    assert!(
        stdout(&tokens).contains("chunks         2 MLPs run in 4 parts of their tokens"),
        "{}",
        stdout(&tokens)
    );
    assert!(
        arena(&parts) > 0 && arena(&parts) < arena(&whole),
        "{} vs {}",
        arena(&parts),
        arena(&whole)
    );
    // Over the budget, the diagnosis plans the fewest parts that fit.
    let total = |o: &Output| {
        stdout(o)
            .lines()
            .find(|l| l.starts_with("total"))
            .and_then(|l| l.split_whitespace().nth(3).and_then(|b| b.parse::<u64>().ok()))
            .unwrap_or(0)
    };
    let under = (total(&whole) - 1).to_string();
    let over = graphc(&[&["plan", model][..], &dims, &["--budget", &under]].concat());
    let err = stderr(&over);
    assert!(!over.status.success(), "{}", stdout(&over));
    assert!(
        err.contains("  - every layer in 2 parts (`") && err.contains("--chunk-tokens 2`") && err.contains(": fits"),
        "{err}"
    );
    let zero = graphc(&[&["plan", model][..], &dims, &["--chunk-tokens", "0"]].concat());
    assert!(
        !zero.status.success() && stderr(&zero).contains("--chunk-tokens"),
        "{}",
        stderr(&zero)
    );
    let train = graphc(&[
        "plan",
        "tests/fixtures/train/gpt2/model.onnx",
        "--train",
        "--loss",
        "cross-entropy",
        "--target",
        "labels",
        "--chunk-tokens",
        "2",
    ]);
    // A training step: the LM head and the loss in parts of the tokens.
    let out = stdout(&train);
    assert!(train.status.success(), "{}{out}", stderr(&train));
    assert!(
        out.contains("loss           the LM head and the cross-entropy in 2 parts of the tokens"),
        "{out}"
    );
}

/// `--remat full` on a training plan: the report says what is made again and what it
/// costs, and the saved activations shrink; `--remat auto` (the default) makes nothing
/// again when the step fits, the first layer alone under a budget that needs a little,
/// and says why when even every layer's recomputation does not fit.
#[test]
fn remat_full_recomputes_layers_in_a_training_plan() {
    // The loss whole (`--chunk-tokens 1`): unset, auto would compute it in parts first.
    let with_parts = |remat: &str, budget: Option<&str>, parts: Option<&str>| {
        let mut a = vec![
            "plan",
            "tests/fixtures/train/gpt2/model.onnx",
            "--train",
            "--loss",
            "cross-entropy",
            "--target",
            "labels",
            "--shift-labels",
            "--remat",
            remat,
        ];
        if let Some(p) = parts {
            a.extend(["--chunk-tokens", p]);
        }
        if let Some(b) = budget {
            a.extend(["--budget", b]);
        }
        graphc(&a)
    };
    let with = |remat: &str, budget: Option<&str>| with_parts(remat, budget, Some("1"));
    let args = |remat: &str| with(remat, None);
    let saved = |o: &Output| {
        let out = stdout(o);
        let line = out
            .lines()
            .find(|l| l.trim_start().starts_with("saved activations"))
            .unwrap_or_default()
            .to_string();
        let mut w = line.split_whitespace().skip(2);
        let x = w.next().and_then(|x| x.parse::<f64>().ok()).unwrap_or(0.0);
        let unit = match w.next() {
            Some("KiB") => 1024.0,
            Some("MiB") => 1024.0 * 1024.0,
            Some("GiB") => 1024.0 * 1024.0 * 1024.0,
            _ => 1.0,
        };
        x * unit
    };
    // The plan's total in bytes (`total  33.7 MiB  35373780 B ...`).
    let total = |o: &Output| -> u64 {
        let out = stdout(o);
        let line = out
            .lines()
            .find(|l| l.starts_with("total "))
            .unwrap_or_default()
            .to_string();
        let w: Vec<&str> = line.split_whitespace().collect();
        w.iter()
            .position(|&x| x == "B")
            .and_then(|i| w[i - 1].parse().ok())
            .unwrap_or(0)
    };
    let (off, full, auto) = (args("off"), args("full"), args("auto"));
    assert!(
        off.status.success() && full.status.success() && auto.status.success(),
        "{}{}{}",
        stderr(&off),
        stderr(&full),
        stderr(&auto)
    );
    assert!(!stdout(&off).contains("remat "), "{}", stdout(&off));
    // Auto under 24 GiB: the plan without recomputation.
    assert!(!stdout(&auto).contains("remat "), "{}", stdout(&auto));
    assert_eq!(total(&auto), total(&off));
    let out = stdout(&full);
    assert!(
        out.contains("remat          2 of 2 layers made again (layers 0..1): "),
        "{out}"
    );
    assert!(out.contains("of the step's GEMM and attention FLOPs"), "{out}");
    assert!(
        saved(&full) > 0.0 && saved(&full) < saved(&off),
        "{} vs {}\n{out}",
        saved(&full),
        saved(&off)
    );
    let (off_b, full_b) = (total(&off), total(&full));
    assert!(full_b > 0 && full_b < off_b, "{full_b} vs {off_b}");
    assert!(out.contains("(saves "), "{out}");
    // A byte under the plan without: per tensor, two of the eight saved GEMM and
    // attention outputs (fewer FLOPs than the first layer whole, which would be enough
    // too; no subset of fewer FLOPs fits).
    let one = with("auto", Some(&(off_b - 1).to_string()));
    let out = stdout(&one);
    assert!(one.status.success(), "{}{out}", stderr(&one));
    assert!(
        out.contains(
            "remat          per tensor: in all 2 layers the values that cost no GEMM, and 2 of 8 saved GEMM \
             and attention outputs (the fewest FLOPs per byte first), made again: "
        ),
        "{out}"
    );
    let one_b = total(&one);
    assert!(full_b <= one_b && one_b < off_b, "{full_b} <= {one_b} < {off_b}");
    // Unset, the loss goes in parts first (2: the batch's sequences).
    let parts = with_parts("auto", Some(&(off_b - 1).to_string()), None);
    let out = stdout(&parts);
    assert!(parts.status.success(), "{}{out}", stderr(&parts));
    assert!(
        out.contains("loss           the LM head and the cross-entropy in 2 parts of the tokens"),
        "{out}"
    );
    // Under every layer's recomputation: the error, with that plan's figures.
    let none = with("auto", Some(&(full_b - 1).to_string()));
    assert!(!none.status.success());
    assert!(
        stdout(&none).contains("remat          2 of 2 layers made again"),
        "{}",
        stdout(&none)
    );
    let err = stderr(&none);
    assert!(err.contains("over by 1 B"), "{err}");
    // Every layer is recomputed already: that is no remedy; sharding is stated.
    assert!(!err.contains("recomputing the layers"), "{err}");
    assert!(err.contains("sharding across GPUs") && err.contains("ZeRO-3"), "{err}");
    // Without recomputation, it is.
    let off_over = with("off", Some(&(off_b - 1).to_string()));
    let err = stderr(&off_over);
    assert!(
        err.contains("recomputing the layers in the backward (gradient checkpointing): no layer is recomputed now")
            && err.contains("--remat full"),
        "{err}"
    );
    let bad = args("some");
    assert!(
        !bad.status.success() && stderr(&bad).contains("--remat"),
        "{}",
        stderr(&bad)
    );
}

/// `--accumulate N`: the plan counts the gradients' sums as their own class; `train`
/// splits the batch's first dim into N microbatches, each of the model's input type
/// (the fixture's model takes 2 sequences: its batch of 2 cannot be split in two).
#[test]
fn accumulate_holds_gradient_sums_and_splits_the_batch() {
    let plan = graphc(&[
        "plan",
        "tests/fixtures/train/gpt2/model.onnx",
        "--train",
        "--loss",
        "cross-entropy",
        "--target",
        "labels",
        "--shift-labels",
        "--accumulate",
        "2",
    ]);
    let out = stdout(&plan);
    assert!(plan.status.success(), "{}{out}", stderr(&plan));
    assert!(
        out.lines().any(|l| l.trim_start().starts_with("accumulated gradients")),
        "{out}"
    );
    let train = graphc(&[
        "train",
        "tests/fixtures/train/gpt2/model.onnx",
        "--inputs",
        "tests/fixtures/train/gpt2/inputs.npz",
        "--loss",
        "cross-entropy",
        "--target",
        "labels",
        "--shift-labels",
        "--accumulate",
        "2",
        "--device",
        "cpu",
    ]);
    assert!(!train.status.success(), "{}", stdout(&train));
    let err = stderr(&train);
    assert!(err.contains("microbatch 1 of 2") && err.contains("input_ids"), "{err}");
    let odd = graphc(&[
        "train",
        "tests/fixtures/train/gpt2/model.onnx",
        "--inputs",
        "tests/fixtures/train/gpt2/inputs.npz",
        "--loss",
        "cross-entropy",
        "--target",
        "labels",
        "--accumulate",
        "3",
        "--device",
        "cpu",
    ]);
    assert!(!odd.status.success());
    assert!(
        stderr(&odd).contains("cannot split into equal microbatches"),
        "{}",
        stderr(&odd)
    );
}
