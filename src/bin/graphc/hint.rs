//! Hints that name a command which works when copied: the user's own command line
//! ([`command_line`]) with one option changed, for each way the GPU path can be
//! unavailable ([`for_unavailable`]) and for options given to the wrong device.

pub use graphc_compiler::plan::report::CommandLine;

/// This process's command line (the words after `graphc`).
pub fn command_line() -> CommandLine {
    CommandLine::new(std::env::args_os().skip(1).map(|a| a.to_string_lossy().into_owned()))
}

/// What to run instead when the GPU path is unavailable here (no driver, no GPU, no
/// cuBLASLt, or for cuda-sim no C++ compiler), for the command that failed.
pub fn for_unavailable(cmd: &CommandLine, sim: bool) -> Option<String> {
    let device = |d: &str| cmd.with("--device", Some(d));
    match (cmd.subcommand()?, sim) {
        ("selftest", false) => Some(format!(
            "`{}` runs the same cases' generated CUDA C on this CPU (`{}`: their launch lists)",
            device("cuda-sim"),
            device("emulate")
        )),
        ("selftest", true) => Some(format!(
            "`{}` runs the cases' launch lists on the CPU without a C++ compiler",
            device("emulate").without("--sanitize", true).without("--sim-gpu", true)
        )),
        ("run", false) if cmd.has("--check") => Some(format!(
            "`{}` compares the generated CUDA C, run on this CPU, with the CPU executor",
            device("cuda-sim")
        )),
        ("run" | "bench", _) => Some(format!(
            "`{}` runs it on the CPU executor",
            device("cpu")
                .without("--check", false)
                .without("--sanitize", true)
                .without("--sim-gpu", true)
                .without("--per-kernel", false)
        )),
        _ => None,
    }
}

/// `--sanitize` or `--sim-gpu` without `--device cuda-sim`.
pub fn sim_options_only() -> String {
    let cmd = command_line().with("--device", Some("cuda-sim"));
    format!("--sanitize and --sim-gpu are options of --device cuda-sim: `{cmd}`")
}

/// `bench --per-kernel` off the GPU.
pub fn per_kernel_needs_a_gpu() -> String {
    let cmd = command_line();
    format!(
        "--per-kernel times each launch with CUDA events, so it needs a GPU: `{}` on a machine with one \
         (here, `{}` gives the median of whole runs)",
        cmd.with("--device", Some("cuda")),
        cmd.without("--per-kernel", false)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hints_for_a_missing_gpu_name_the_device_that_works() {
        let c = CommandLine::new(["run", "my model.gir", "--device=cuda", "--check", "--budget", "1GiB"]);
        assert_eq!(
            for_unavailable(&c, false).unwrap(),
            "`graphc run 'my model.gir' --check --budget 1GiB --device cuda-sim` compares the generated CUDA C, \
             run on this CPU, with the CPU executor"
        );
        let s = CommandLine::new(["selftest"]);
        assert_eq!(
            for_unavailable(&s, false).unwrap(),
            "`graphc selftest --device cuda-sim` runs the same cases' generated CUDA C on this CPU \
             (`graphc selftest --device emulate`: their launch lists)"
        );
        assert_eq!(for_unavailable(&CommandLine::new(["plan", "m.gir"]), false), None);
    }
}
