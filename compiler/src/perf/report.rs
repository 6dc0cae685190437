//! A step's time: every kernel's modeled and ideal seconds (a kernel's launches added
//! up), the step's totals, the kernels sorted by time lost, as text and as JSON.

use serde::Serialize;

use super::counters::KernelCounters;
use super::estimate::{estimate_gemm, estimate_kernel, Estimate, GemmShape, Resources};
use super::gpu::GpuSpec;
use super::work::IdealWork;
use crate::kernel::{KernelKind, Program};

/// What one launch of the list did, as the runtime found it.
#[derive(Clone, Debug, PartialEq)]
pub enum LaunchWork {
    /// A cuBLASLt GEMM (modeled by tiles and waves, not executed).
    Gemm(GemmShape),
    /// A generated kernel, counted on cuda-sim.
    Counted {
        counters: KernelCounters,
        resources: Resources,
    },
    /// A generated kernel that could not be counted: why (its ideal time stands in).
    Uncounted(String),
}

/// One launch: the program kernel (plan step) it belongs to, and its work.
#[derive(Clone, Debug, PartialEq)]
pub struct LaunchInput {
    pub step: usize,
    pub work: LaunchWork,
}

/// One program kernel's time.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct KernelTime {
    pub kernel: String,
    /// `gemm`, `attention`, `elementwise`, `row`, `conv`, `multi_tensor`, `quant_gemm`, `op`.
    pub kind: String,
    pub modeled_s: f64,
    pub ideal_s: f64,
    pub launches: usize,
    /// The term that bounds its slowest launch.
    pub bound: &'static str,
    /// The counts that explain it (sectors per request, bank conflicts, occupancy).
    pub detail: String,
}

impl KernelTime {
    pub fn lost_s(&self) -> f64 {
        (self.modeled_s - self.ideal_s).max(0.0)
    }
}

/// A step's modeled time on one GPU.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct StepTime {
    pub gpu: String,
    pub modeled_s: f64,
    pub ideal_s: f64,
    /// The ideal with every cuBLASLt GEMM at its modeled time (what graphc's own code
    /// could reach with the GEMMs as they are).
    pub ideal_gemms_modeled_s: f64,
    pub kernels: Vec<KernelTime>,
    /// How the counted blocks were chosen.
    pub sampling: String,
    /// Launches that could not be counted, and why.
    pub uncounted: Vec<String>,
}

fn kind_of(program: &Program, k: usize) -> String {
    let kernel = &program.kernels[k];
    match &kernel.kind {
        KernelKind::MatMul(mm) if mm.quant.is_some() => "quant_gemm".into(),
        KernelKind::MatMul(_) => "gemm".into(),
        KernelKind::Op(o) if o.op.name().starts_with("attention") => "attention".into(),
        KernelKind::Op(_) => "op".into(),
        _ => kernel.kind_name().to_string(),
    }
}

fn micros(s: f64) -> String {
    if s >= 1e-3 {
        format!("{:.2} ms", s * 1e3)
    } else {
        format!("{:.1} us", s * 1e6)
    }
}

fn detail(c: &KernelCounters, r: &Resources, e: &Estimate) -> String {
    let mut d = format!("{} blocks x {}", c.grid, c.block_threads);
    if let Some(o) = e.occupancy {
        d.push_str(&format!(", {} blocks/SM ({})", o.blocks_per_sm, o.limiter));
    }
    if let Some(regs) = r.registers {
        d.push_str(&format!(", {regs} regs"));
    }
    if r.spilled_bytes > 0 {
        d.push_str(&format!(", {} bytes spilled", r.spilled_bytes));
    }
    if c.load_requests + c.store_requests > 0 {
        d.push_str(&format!(", {:.1} sectors/request", c.sectors_per_request()));
    }
    if c.shared_ideal_wavefronts > 0 {
        d.push_str(&format!(", bank conflicts x{:.2}", c.bank_conflict_factor()));
    }
    if c.mmas > 0 {
        d.push_str(&format!(
            ", {:.0} mma/block",
            c.mmas as f64 / c.sampled_blocks.max(1) as f64
        ));
    }
    d
}

/// Model every launch of a program's launch list and add them up by kernel.
pub fn step_time(program: &Program, launches: &[LaunchInput], gpu: &GpuSpec, sampling: &str) -> StepTime {
    let n = program.kernels.len();
    let ideal: Vec<IdealWork> = (0..n).map(|k| IdealWork::of(program, k)).collect();
    let mut kernels: Vec<KernelTime> = (0..n)
        .map(|k| KernelTime {
            kernel: program.kernels[k].name.clone(),
            kind: kind_of(program, k),
            modeled_s: 0.0,
            ideal_s: ideal[k].seconds(gpu),
            launches: 0,
            bound: "-",
            detail: String::new(),
        })
        .collect();
    let mut gemm_s = vec![0.0f64; n];
    let mut slowest = vec![0.0f64; n];
    let mut uncounted = Vec::new();
    for l in launches {
        let Some(kt) = kernels.get_mut(l.step) else { continue };
        let (e, d) = match &l.work {
            LaunchWork::Gemm(g) => {
                let e = estimate_gemm(g, gpu);
                gemm_s[l.step] += e.seconds;
                let d = format!("cuBLASLt {}x{}x{} (x{}), {:.2} waves", g.m, g.n, g.k, g.batch, e.waves);
                (e, d)
            }
            LaunchWork::Counted { counters, resources } => {
                let e = estimate_kernel(counters, resources, &ideal[l.step], gpu);
                let d = detail(counters, resources, &e);
                (e, d)
            }
            LaunchWork::Uncounted(why) => {
                uncounted.push(format!("{}: {why}", kt.kernel));
                let e = Estimate {
                    seconds: kt.ideal_s,
                    bound: "uncounted",
                    ..Estimate::default()
                };
                (e, format!("not counted: {why}"))
            }
        };
        kt.modeled_s += e.seconds;
        kt.launches += 1;
        if e.seconds >= slowest[l.step] {
            slowest[l.step] = e.seconds;
            kt.bound = e.bound;
            kt.detail = d;
        }
    }
    let modeled_s = kernels.iter().map(|k| k.modeled_s).sum();
    let ideal_s = kernels.iter().map(|k| k.ideal_s).sum();
    let ideal_gemms_modeled_s = kernels
        .iter()
        .enumerate()
        .map(|(i, k)| {
            if gemm_s[i] > 0.0 {
                k.ideal_s.max(k.modeled_s)
            } else {
                k.ideal_s
            }
        })
        .sum();
    StepTime {
        gpu: gpu.name.to_string(),
        modeled_s,
        ideal_s,
        ideal_gemms_modeled_s,
        kernels,
        sampling: sampling.to_string(),
        uncounted,
    }
}

impl StepTime {
    /// The report: totals, how it was counted, then the `top` kernels by time lost.
    pub fn text(&self, top: usize) -> String {
        let launches: usize = self.kernels.iter().map(|k| k.launches).sum();
        let mut s = format!(
            "time           {}: modeled {}, ideal {} ({:.1}x), ideal with the GEMMs as modeled {} ({:.2}x); \
             {} kernels, {} launches\n",
            self.gpu,
            micros(self.modeled_s),
            micros(self.ideal_s),
            self.modeled_s / self.ideal_s.max(1e-12),
            micros(self.ideal_gemms_modeled_s),
            self.modeled_s / self.ideal_gemms_modeled_s.max(1e-12),
            self.kernels.len(),
            launches,
        );
        s.push_str(&format!("               counted on cuda-sim: {}\n", self.sampling));
        for u in &self.uncounted {
            s.push_str(&format!("               not counted: {u}\n"));
        }
        let mut order: Vec<&KernelTime> = self.kernels.iter().collect();
        order.sort_by(|a, b| b.lost_s().total_cmp(&a.lost_s()));
        s.push_str(&format!(
            "  {:>10}  {:>10}  {:>10}  {:<12} {:<9} kernel\n",
            "lost", "modeled", "ideal", "kind", "bound"
        ));
        for k in order.iter().take(top) {
            s.push_str(&format!(
                "  {:>10}  {:>10}  {:>10}  {:<12} {:<9} {}: {}\n",
                micros(k.lost_s()),
                micros(k.modeled_s),
                micros(k.ideal_s),
                k.kind,
                k.bound,
                k.kernel,
                k.detail
            ));
        }
        if order.len() > top {
            s.push_str(&format!("  ... {} more kernels\n", order.len() - top));
        }
        s
    }
}
