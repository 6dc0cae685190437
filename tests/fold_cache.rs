//! The fold cache (`graphc_ir::fold_cache`) through the CLI: a bf16 or int4 compile of
//! a model with mapped weights stores its folded weights, the next compile maps them
//! and computes the same outputs, and a cache folder with garbage, entries of the wrong
//! type or FIFOs in it is a miss, never a wrong number, a panic or a hang.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

use graphc::models::{mlp, MlpConfig};

/// An MLP whose weights (2 MiB and 1 MiB of f32) are over the cache's threshold,
/// saved as a `.gir` whose safetensors file is mapped when loaded; and its inputs.
fn model(dir: &Path) -> (PathBuf, PathBuf) {
    let g = mlp(&MlpConfig {
        batch: 4,
        widths: vec![512, 1024, 256],
        ..Default::default()
    })
    .unwrap();
    let path = dir.join("mlp.gir");
    graphc::ir::save_gir(&g, &path).unwrap();
    let inputs = dir.join("in.npz");
    let mut arrays: Vec<(String, graphc::ir::Tensor)> = common::random_inputs(&g, 3).into_iter().collect();
    arrays.sort_by(|a, b| a.0.cmp(&b.0));
    graphc::npz::write_npz(&inputs, &arrays).unwrap();
    (path, inputs)
}

/// `graphc run` with the fold cache at `cache`, its outputs written to `out`.
fn run(model: &Path, inputs: &Path, cache: &str, extra: &[&str], out: &Path) -> Vec<u8> {
    let mut child = Command::new(env!("CARGO_BIN_EXE_graphc"))
        .args(["run", model.to_str().unwrap(), "--device", "cpu", "--inputs"])
        .arg(inputs)
        .arg("--output")
        .arg(out)
        .args(extra)
        .env("GRAPHC_FOLD_CACHE", cache)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // A FIFO in the cache must not block the compile: give it a minute at most.
    let start = std::time::Instant::now();
    while child.try_wait().unwrap().is_none() {
        assert!(start.elapsed() < Duration::from_secs(60), "graphc hung");
        std::thread::sleep(Duration::from_millis(20));
    }
    let Output { status, stderr, .. } = child.wait_with_output().unwrap();
    assert!(status.success(), "{}", String::from_utf8_lossy(&stderr));
    std::fs::read(out).unwrap()
}

fn entries(cache: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(cache)
        .map(|d| d.map(|e| e.unwrap().path()).collect())
        .unwrap_or_default();
    v.sort();
    v
}

#[test]
fn folds_are_stored_mapped_back_and_a_bad_cache_is_a_miss() {
    let dir = common::temp_dir("fold-cache");
    let (model, inputs) = model(&dir);
    for extra in [
        &["--precision", "bf16"][..],
        &["--weights", "int4"],
        &["--precision", "bf16", "--weights", "int8"],
    ] {
        let cache = dir.join(format!("cache-{}", extra.join("-")));
        let c = cache.to_str().unwrap();
        let out = |n: &str| dir.join(format!("{n}.npz"));
        let cold = run(&model, &inputs, c, extra, &out("cold"));
        let stored = entries(&cache);
        assert!(!stored.is_empty(), "{extra:?}: nothing stored");
        // The next compile maps the entries: the same outputs, no new entries.
        assert_eq!(run(&model, &inputs, c, extra, &out("warm")), cold, "{extra:?}");
        assert_eq!(entries(&cache), stored);
        // Garbage in every entry: a miss, recomputed and stored again.
        for e in &stored {
            std::fs::write(e, b"not a safetensors file").unwrap();
        }
        assert_eq!(run(&model, &inputs, c, extra, &out("garbage")), cold, "{extra:?}");
        assert_eq!(entries(&cache), stored, "the same keys");
        assert!(
            stored.iter().all(|e| std::fs::metadata(e).unwrap().len() > 64),
            "stored again"
        );
        // Valid files of another type under every key: not taken.
        for e in &stored {
            let wrong: std::collections::BTreeMap<String, graphc::ir::Tensor> = [(
                "fold".to_string(),
                graphc::ir::Tensor::random(&graphc::ir::TensorType::new(graphc::ir::DType::F32, [7, 3]), 1),
            )]
            .into();
            graphc::ir::save_safetensors(&wrong, e).unwrap();
        }
        assert_eq!(run(&model, &inputs, c, extra, &out("wrong")), cold, "{extra:?}");
        // FIFOs where the entries were: no hang, the same outputs.
        for e in &stored {
            std::fs::remove_file(e).unwrap();
            let p = std::ffi::CString::new(e.as_os_str().as_encoded_bytes()).unwrap();
            // SAFETY: a valid NUL-terminated path.
            assert_eq!(unsafe { libc::mkfifo(p.as_ptr(), 0o644) }, 0);
        }
        assert_eq!(run(&model, &inputs, c, extra, &out("fifo")), cold, "{extra:?}");
    }
    // Off: nothing is written.
    let off = dir.join("off");
    let cold = run(&model, &inputs, "off", &["--precision", "bf16"], &dir.join("off.npz"));
    assert!(!cold.is_empty() && !off.exists());
    let _ = std::fs::remove_dir_all(&dir);
}
