//! Helpers shared by the integration tests.
#![allow(dead_code)]

use std::collections::HashMap;
use std::path::PathBuf;

use graphc::ir::{Graph, Tensor};

/// A fresh, empty temporary folder for one test.
pub fn temp_dir(test: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("graphc-{}-{test}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("temp dir");
    dir
}

/// Random inputs for every graph input, deterministic for a seed.
pub fn random_inputs(graph: &Graph, seed: u64) -> HashMap<String, Tensor> {
    graphc::random_inputs(graph, seed * 1000)
}

pub fn repo_path(rel: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(rel)
}

/// Relative L2 error ||got - want|| / ||want|| (infinite when the lengths differ or
/// non-finite values disagree).
pub fn rel_l2(got: &[f64], want: &[f64]) -> f64 {
    graphc::ir::compare::relative_l2_values(got, want)
}
