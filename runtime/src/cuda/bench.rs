//! Benchmarking a loaded [`Session`]: whole runs timed by CUDA events (through the
//! CUDA graph when the session uses one), optionally every launch timed by events
//! between launches, and their medians.

use std::collections::HashMap;

pub use graphc_ir::compare::median;
use graphc_ir::Tensor;
use serde::{Deserialize, Serialize};

use super::driver::{code, Event};
use super::launch::Launch;
use super::{CudaError, Session};

/// Options of [`Session::bench`].
#[derive(Clone, Copy, Debug)]
pub struct BenchOptions {
    pub warmup: usize,
    pub iters: usize,
    /// Also time every launch (without the CUDA graph: events between launches).
    pub per_kernel: bool,
}

/// One launch's median time.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct KernelTiming {
    pub step: usize,
    pub name: String,
    /// `gemm` or `kernel`.
    pub kind: String,
    pub median_ms: f64,
}

/// Timings of [`Session::bench`]: CUDA-event times of whole runs (inputs already on
/// the device), in milliseconds.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct BenchResult {
    pub times_ms: Vec<f64>,
    pub median_ms: f64,
    pub min_ms: f64,
    pub max_ms: f64,
    pub graph: bool,
    pub per_kernel: Vec<KernelTiming>,
}

impl Session {
    /// Every launch's median time over `iters` runs on the inputs already on the device,
    /// one by one (without the graph: events between launches). Each run is a whole
    /// run: a training step's state is updated in place by each.
    pub fn time_launches(&mut self, iters: usize) -> Result<Vec<KernelTiming>, CudaError> {
        let sync = |s: &Session, at: &str| {
            s.stream.synchronize().map_err(|e| CudaError::Async {
                at: at.to_string(),
                code: code(e),
            })
        };
        let n = self.launch_plan.launches.len();
        let events: Vec<Event> = (0..=n).map(|_| Event::new()).collect::<Result<_, _>>()?;
        let mut per: Vec<Vec<f64>> = vec![Vec::new(); n];
        for _ in 0..iters.max(1) {
            self.enqueue(Some(&events))?;
            sync(self, "a per-kernel timed run")?;
            for (i, p) in per.iter_mut().enumerate() {
                p.push(events[i + 1].ms_since(&events[i])? as f64);
            }
        }
        let mut out = Vec::with_capacity(n);
        for (l, mut t) in self.launch_plan.launches.iter().zip(per) {
            out.push(KernelTiming {
                step: l.step(),
                name: l.kernel().to_string(),
                kind: match l {
                    Launch::Gemm(_) => "gemm".to_string(),
                    Launch::Kernel(_) => "kernel".to_string(),
                },
                median_ms: median(&mut t),
            });
        }
        Ok(out)
    }

    /// Time whole runs on `inputs` (uploaded once): `warmup` runs, then the median of
    /// `iters` CUDA-event timings; with `per_kernel`, also every launch's median over
    /// `iters` runs without the graph.
    pub fn bench(&mut self, inputs: &HashMap<String, Tensor>, opts: BenchOptions) -> Result<BenchResult, CudaError> {
        self.upload_inputs(inputs)?;
        for _ in 0..opts.warmup.max(1) {
            self.forward()?;
        }
        let sync = |s: &Session, at: &str| {
            s.stream.synchronize().map_err(|e| CudaError::Async {
                at: at.to_string(),
                code: code(e),
            })
        };
        sync(self, "the warm-up runs")?;
        let (start, end) = (Event::new()?, Event::new()?);
        let mut times = Vec::with_capacity(opts.iters);
        for _ in 0..opts.iters.max(1) {
            start.record(&self.stream)?;
            self.forward()?;
            end.record(&self.stream)?;
            sync(self, "a timed run")?;
            times.push(end.ms_since(&start)? as f64);
        }
        let per_kernel = if opts.per_kernel {
            self.time_launches(opts.iters)?
        } else {
            Vec::new()
        };
        let mut sorted = times.clone();
        let med = median(&mut sorted);
        Ok(BenchResult {
            median_ms: med,
            min_ms: sorted.first().copied().unwrap_or(f64::NAN),
            max_ms: sorted.last().copied().unwrap_or(f64::NAN),
            times_ms: times,
            graph: self.options.cuda_graph,
            per_kernel,
        })
    }
}
