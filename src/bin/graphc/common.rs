//! Output helpers several subcommands share: inputs, one-line descriptions of a graph,
//! a tensor and a CUDA session, byte sizes.

use std::collections::HashMap;
use std::path::Path;

use anyhow::Result;
use graphc::ir::{Graph, Tensor};

use crate::args::{Device, DeviceArgs};
use crate::counts::Counts;

/// Inputs from an .npz file, or random ones (seed 0) for every model input.
pub fn load_inputs(path: Option<&Path>, graph: &Graph) -> Result<HashMap<String, Tensor>> {
    Ok(match path {
        Some(p) => graphc::npz::read_inputs(p, graph)?,
        None => graphc::try_random_input_list(graph, 0)?.into_iter().collect(),
    })
}

/// The `device` line: device memory, the modules compiled, the load times.
pub fn print_session(session: &graphc::cuda::Session, counts: &Counts) {
    let (compile_ms, load_ms) = session.load_times_ms();
    println!(
        "device   {}; {} modules compiled for {} (NVRTC or cache) in {compile_ms:.0} ms; loaded in {load_ms:.0} ms",
        session.memory().summary(),
        counts.modules().unwrap_or(0),
        session.device().arch
    );
}

/// `103 nodes, 1 input(s), 1 output(s), 12 weight tensors as imported (774.5 KiB)`: the
/// model as read, before the optimizer folds or drops weights (the plan's `weights`
/// row counts what it keeps).
pub fn describe(g: &Graph) -> String {
    format!(
        "{} nodes, {} input(s), {} output(s), {} weight tensors as imported ({})",
        g.len(),
        g.inputs().len(),
        g.outputs().len(),
        g.weights().len(),
        human_bytes(g.weights_bytes() as u64)
    )
}

/// A tensor's type, range, mean and first values.
pub fn summarize(t: &Tensor) -> String {
    let v = t.to_f64_vec();
    let (mut lo, mut hi, mut sum) = (f64::INFINITY, f64::NEG_INFINITY, 0.0);
    for &x in &v {
        lo = lo.min(x);
        hi = hi.max(x);
        sum += x;
    }
    let mean = if v.is_empty() { f64::NAN } else { sum / v.len() as f64 };
    let head: Vec<String> = v.iter().take(4).map(|x| format!("{x:.5}")).collect();
    format!(
        "{}  min {lo:.5}  max {hi:.5}  mean {mean:.5}  first [{}{}]",
        t.ty(),
        head.join(", "),
        if v.len() > 4 { ", ..." } else { "" }
    )
}

/// `1536` -> `1.50 KiB`.
pub fn human_bytes(b: u64) -> String {
    graphc_compiler::plan::report::human_bytes(b)
}

/// The note printed when a CUDA graph could not be captured.
pub fn print_graph_error(session: &graphc::cuda::Session) {
    if let Some(e) = session.graph_error() {
        println!("note     CUDA graph capture failed ({e}); the kernels were launched one by one");
    }
}

/// Where a run goes.
pub enum Target {
    /// A CUDA session, loaded.
    Gpu(Box<graphc::cuda::Session>),
    /// The CPU executor; with `--device auto`, the reason the GPU is not usable.
    Cpu(Option<graphc::cuda::CudaError>),
    /// cuda-sim: the launch list with the kernels built for the host.
    Sim(Box<graphc::cuda::sim::SimSession>),
}

/// `--device cpu`: the CPU; `cuda`: a session (an error without a GPU, exit code 3);
/// `auto`: a session when a GPU is usable (driver, GPU, cuBLASLt), else the CPU.
pub fn open_device(compiled: &graphc::Compiled, device: DeviceArgs) -> anyhow::Result<Target> {
    device.check()?;
    let opts = device.gpu.options();
    Ok(match device.device {
        Device::Cpu => Target::Cpu(None),
        Device::CudaSim => Target::Sim(Box::new(graphc::cuda::sim::SimSession::new(
            compiled,
            &device.sim.options(),
        )?)),
        Device::Cuda => Target::Gpu(Box::new(graphc::cuda::Session::new(compiled, opts)?)),
        Device::Auto => match graphc::cuda::Session::new(compiled, opts) {
            Ok(s) => Target::Gpu(Box::new(s)),
            Err(e) if e.is_unavailable() => Target::Cpu(Some(e)),
            Err(e) => return Err(e.into()),
        },
    })
}

/// The `device` line of a cuda-sim session.
pub fn print_sim(session: &graphc::cuda::sim::SimSession, sanitize: &str) {
    let lp = session.launch_plan();
    println!(
        "device   cuda-sim: the launch list of {} ({}, {} SMs), {} modules built for the host{}",
        lp.device.name,
        lp.device.arch,
        lp.device.sm_count,
        lp.modules.len(),
        sanitize
    );
}

/// A spinner on stderr saying what is being done, only when stderr is a terminal (never
/// in pipes, files or CI logs), cleared when dropped.
pub struct Progress(Option<indicatif::ProgressBar>);

impl Progress {
    pub fn new(what: impl Into<String>) -> Progress {
        use std::io::IsTerminal;
        if !std::io::stderr().is_terminal() {
            return Progress(None);
        }
        let pb = indicatif::ProgressBar::new_spinner();
        pb.set_draw_target(indicatif::ProgressDrawTarget::stderr());
        pb.set_message(what.into());
        pb.enable_steady_tick(std::time::Duration::from_millis(120));
        Progress(Some(pb))
    }

    pub fn set(&self, what: impl Into<String>) {
        if let Some(pb) = &self.0 {
            pb.set_message(what.into());
        }
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        if let Some(pb) = &self.0 {
            pb.finish_and_clear();
        }
    }
}
