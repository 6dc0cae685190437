//! # graphc-testkit: what every graphc test suite shares
//!
//! A test that cannot run on this machine (no libnvrtc, no ptxas, the ONNX node-test
//! suite not materialized, no GPU) calls [`skip`] and returns. `cargo test` captures
//! what a passing test prints, so a skip printed with `eprintln!` reads as a plain
//! `ok`; [`skip`] writes straight to the process's standard error instead, so every
//! skip shows in plain `cargo test` output as a line
//! `SKIPPED <test>: needs <what>: <why>`.
//!
//! Where the thing is expected — CI installs NVRTC, ptxas and the ONNX suite — the
//! skip is a failure: `GRAPHC_REQUIRE` lists the [`Need`]s that must be met
//! (`nvrtc,ptxas,onnx-tests`, or `all`), and a test that would skip one of them panics
//! instead. The older `GRAPHC_REQUIRE_NVRTC=1` and `GRAPHC_REQUIRE_ONNX_TESTS=1`
//! are honoured too.

pub mod alloc;

use std::fmt;
use std::io::Write;

/// Something a test needs that a machine may not have.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Need {
    /// libnvrtc (the NVRTC wheel's library on `LD_LIBRARY_PATH`).
    Nvrtc,
    /// ptxas (`GRAPHC_PTXAS`), for the register-spill checks.
    Ptxas,
    /// The ONNX backend node tests, materialized by `scripts/onnx_node_tests.py`.
    OnnxTests,
    /// A CUDA driver and GPU.
    Gpu,
    /// A host C++ compiler (`$CXX`, `c++`, `g++` or `clang++`), for cuda-sim.
    Cxx,
}

impl Need {
    pub const ALL: [Need; 5] = [Need::Nvrtc, Need::Ptxas, Need::OnnxTests, Need::Gpu, Need::Cxx];

    /// The name `GRAPHC_REQUIRE` lists it by.
    pub fn name(self) -> &'static str {
        match self {
            Need::Nvrtc => "nvrtc",
            Need::Ptxas => "ptxas",
            Need::OnnxTests => "onnx-tests",
            Need::Gpu => "gpu",
            Need::Cxx => "cxx",
        }
    }

    /// Whether this machine is expected to have it (so a skip is a failure).
    pub fn required(self) -> bool {
        let listed = std::env::var("GRAPHC_REQUIRE").is_ok_and(|v| required_by(&v, self));
        let legacy = match self {
            Need::Nvrtc | Need::Ptxas => "GRAPHC_REQUIRE_NVRTC",
            Need::OnnxTests => "GRAPHC_REQUIRE_ONNX_TESTS",
            Need::Gpu => "GRAPHC_REQUIRE_GPU",
            Need::Cxx => "GRAPHC_REQUIRE_CXX",
        };
        listed || std::env::var(legacy).is_ok_and(|v| v == "1")
    }
}

impl fmt::Display for Need {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Whether a `GRAPHC_REQUIRE` value (comma-separated names, or `all`) lists `need`.
pub fn required_by(list: &str, need: Need) -> bool {
    list.split(',').map(str::trim).any(|n| n == "all" || n == need.name())
}

/// The line [`skip`] prints.
pub fn skip_line(test: &str, need: Need, why: &str) -> String {
    format!("SKIPPED {test}: needs {need}: {why}")
}

/// Says that the calling test does not run here, in plain `cargo test` output; the
/// test then returns. Panics instead when `need` is required (see the crate docs).
#[track_caller]
pub fn skip(need: Need, why: impl fmt::Display) {
    let thread = std::thread::current();
    let test = thread.name().unwrap_or("?");
    let line = skip_line(test, need, &why.to_string());
    if need.required() {
        panic!("{line} — but {need} is required here (GRAPHC_REQUIRE)");
    }
    // Straight to the file descriptor: the test harness captures `eprintln!`.
    let _ = writeln!(std::io::stderr().lock(), "{line}");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn require_lists_names_or_all() {
        assert!(required_by("nvrtc,onnx-tests", Need::Nvrtc));
        assert!(required_by("nvrtc, onnx-tests", Need::OnnxTests));
        assert!(!required_by("nvrtc,onnx-tests", Need::Gpu));
        assert!(required_by("all", Need::Gpu));
        assert!(!required_by("", Need::Ptxas));
        for n in Need::ALL {
            assert!(required_by(n.name(), n));
        }
    }

    #[test]
    fn the_line_names_the_test_and_the_need() {
        assert_eq!(
            skip_line("t::a", Need::Nvrtc, "libnvrtc is not available"),
            "SKIPPED t::a: needs nvrtc: libnvrtc is not available"
        );
    }
}
