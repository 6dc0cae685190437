//! Argument groups several subcommands share (flattened into each with
//! `#[command(flatten)]`), the value parsers, and what the groups turn into: a loaded
//! graph, compile options, session options.

use std::path::PathBuf;

use anyhow::Result;
use clap::ValueEnum;
use graphc::ir::Graph;
use graphc_compiler::passes::precision::Precision;
use graphc_compiler::passes::quantize::WeightQuant;

/// The model and its symbolic dimensions.
#[derive(clap::Args)]
pub struct ModelArgs {
    /// The model: an .onnx file (with its external data), a .gir text IR file (with its
    /// weights file) or a .json graph.
    pub model: PathBuf,
    /// Fix a symbolic dimension of an ONNX model: NAME=N (repeatable).
    #[arg(long = "dim", value_name = "NAME=N", value_parser = parse_dim)]
    pub dims: Vec<(String, usize)>,
}

impl ModelArgs {
    /// Load the model with its dimensions fixed.
    pub fn load(&self) -> Result<Graph> {
        Ok(graphc::load_model(&self.model, &self.dims)?)
    }

    /// The model and its `--dim`s as words of a command line.
    pub fn words(&self) -> Vec<String> {
        let mut w = vec![self.model.to_string_lossy().into_owned()];
        for (name, value) in &self.dims {
            w.extend(["--dim".to_string(), format!("{name}={value}")]);
        }
        w
    }

    /// What an over-budget diagnosis writes its commands from: this command line, the
    /// model, the dimensions fixed with `--dim` (each a remedy) and the options
    /// `graphc fit` takes too.
    pub fn rerun(&self, budget: &BudgetArgs) -> graphc::Rerun {
        graphc::Rerun {
            command: Some(crate::hint::command_line()),
            model: self.model.to_string_lossy().into_owned(),
            dims: self.dims.iter().map(|(n, v)| (n.clone(), Some(*v))).collect(),
            fit_options: budget.words(),
        }
    }
}

/// The memory budget and the compute precision.
#[derive(clap::Args, Clone, Copy)]
pub struct BudgetArgs {
    /// Memory budget the plan must fit: bytes, or with a unit (KiB, MiB, GiB; KB, MB, GB).
    #[arg(long, default_value = "24GiB", value_parser = parse_bytes)]
    pub budget: u64,
    /// Compute precision: fp32, tf32 (f32 GEMMs on TF32 tensor cores), bf16 or fp16
    /// (mixed: low-precision storage and compute, f32 where it matters).
    #[arg(long, default_value = "fp32")]
    pub precision: Precision,
    /// With --precision bf16 or fp16: keep f32 outputs in f32 (by default they are
    /// given in the low type, as PyTorch's model converted to bf16/fp16 returns them).
    #[arg(long)]
    pub f32_outputs: bool,
    /// Weight-only quantization of matmul and embedding weights: none, int8 (one scale
    /// per output channel) or int4 (one scale per 128 elements along k), round to
    /// nearest; GEMMs dequantize as they read them.
    #[arg(long, default_value = "none")]
    pub weights: WeightQuant,
    /// Inference: run each attention block and MLP (from its norm to its residual add)
    /// over this many parts of the batch, one part's values live at a time, or with
    /// fewer sequences than parts each MLP over this many parts of its tokens. A
    /// training step: its LM head and cross-entropy over this many parts of the tokens,
    /// each part's logits made again in its backward. The same values; 1: whole.
    /// Unset, a training step with `--remat auto` that does not fit chooses the loss's
    /// parts itself.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u16).range(1..=4096))]
    pub chunk_tokens: Option<u16>,
    /// A training step: run each MLP over this many parts of its tokens, in the forward
    /// and in the backward (with `--remat full` or `auto`, in its recomputation), so
    /// that one part's 4·d hidden and its gradient are live at a time; each weight's
    /// gradient is the sum of the parts'. The same values (sums in another order);
    /// more, smaller GEMMs.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u16).range(1..=4096))]
    pub chunk_mlps: Option<u16>,
}

impl BudgetArgs {
    /// These options as words of a command line (`--budget` always, the others when
    /// not their default).
    pub fn words(&self) -> Vec<String> {
        let mut w = vec![
            "--budget".to_string(),
            graphc_compiler::plan::report::budget_arg(self.budget),
        ];
        if self.precision != Precision::default() {
            w.extend(["--precision".to_string(), self.precision.to_string()]);
        }
        if self.f32_outputs {
            w.push("--f32-outputs".to_string());
        }
        if self.weights != WeightQuant::default() {
            w.extend(["--weights".to_string(), self.weights.to_string()]);
        }
        if let Some(n) = self.chunk_tokens {
            w.extend(["--chunk-tokens".to_string(), n.to_string()]);
        }
        if let Some(n) = self.chunk_mlps {
            w.extend(["--chunk-mlps".to_string(), n.to_string()]);
        }
        w
    }

    /// Default compile options with this budget and precision.
    pub fn options(&self) -> graphc::CompileOptions {
        graphc::CompileOptions {
            precision: self.precision,
            outputs: if self.f32_outputs {
                graphc_compiler::passes::precision::Outputs::Declared
            } else {
                graphc_compiler::passes::precision::Outputs::Low
            },
            memory: graphc::MemoryOptions {
                budget_bytes: self.budget,
                ..Default::default()
            },
            weights: self.weights,
            token_chunks: self.chunk_tokens.map_or(0, usize::from),
            mlp_chunks: self.chunk_mlps.map_or(0, usize::from),
            ..Default::default()
        }
    }
}

/// Where to run, and how the CUDA executor runs.
#[derive(clap::Args, Clone, Copy)]
pub struct DeviceArgs {
    /// Where to run: `auto` (the GPU when one is usable: driver, GPU, cuBLASLt; else the
    /// CPU), `cpu`, `cuda` or `cuda-sim` (the generated CUDA C run on the host).
    #[arg(long, value_enum, default_value_t = Device::Auto)]
    pub device: Device,
    #[command(flatten)]
    pub gpu: GpuArgs,
    #[command(flatten)]
    pub sim: SimArgs,
}

impl DeviceArgs {
    /// `--sanitize` and `--sim-gpu` only mean something to cuda-sim.
    pub fn check(&self) -> anyhow::Result<()> {
        if self.device != Device::CudaSim && (self.sim.sanitize.is_some() || self.sim.sim_gpu.is_some()) {
            anyhow::bail!("{}", crate::hint::sim_options_only());
        }
        Ok(())
    }
}

/// Options of cuda-sim.
#[derive(clap::Args, Clone, Copy)]
pub struct SimArgs {
    /// With --device cuda-sim: build the kernels with AddressSanitizer + UBSan
    /// (`address`: out-of-bounds accesses, signed overflow) or ThreadSanitizer
    /// (`thread`: data races between the threads of a kernel).
    #[arg(long, value_enum)]
    pub sanitize: Option<SanitizeArg>,
    /// With --device cuda-sim: the GPU whose launch list runs (SM count, launch limits).
    #[arg(long, value_enum)]
    pub sim_gpu: Option<SimGpu>,
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum SanitizeArg {
    /// ASan + UBSan.
    Address,
    /// TSan.
    Thread,
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum SimGpu {
    /// An RTX 4090D: sm_89, 114 SMs (the default).
    Rtx4090d,
    /// An H200: sm_90, 132 SMs, 227 KiB shared memory per block.
    H200,
}

impl SimArgs {
    /// ` under ...` for the device line, or nothing.
    pub fn describe(&self) -> &'static str {
        match self.sanitize {
            None => "",
            Some(SanitizeArg::Address) => ", under AddressSanitizer + UBSan",
            Some(SanitizeArg::Thread) => ", under ThreadSanitizer",
        }
    }

    pub fn options(&self) -> graphc::cuda::sim::SimOptions {
        use graphc::cuda::sim::Sanitize;
        graphc::cuda::sim::SimOptions {
            device: match self.sim_gpu {
                Some(SimGpu::H200) => graphc::cuda::DeviceInfo::h200(),
                _ => graphc::cuda::DeviceInfo::rtx_4090d(),
            },
            sanitize: match self.sanitize {
                None => Sanitize::None,
                Some(SanitizeArg::Address) => Sanitize::Address,
                Some(SanitizeArg::Thread) => Sanitize::Thread,
            },
            ..Default::default()
        }
    }
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Device {
    /// The CPU: the kernel-IR executor through the planned arena.
    Cpu,
    /// The GPU (exit code 3 without a driver or GPU).
    Cuda,
    /// The GPU when one is usable here, else the CPU.
    Auto,
    /// The GPU's launch list with each kernel's own CUDA C compiled for the host and run
    /// with a fiber per CUDA thread (exit code 3 without a C++ compiler).
    CudaSim,
}

impl Device {
    /// What the budget is checked for before anything runs: the CPU's total leaves out
    /// the cuBLASLt workspace; `cuda` and `auto` are planned for the GPU.
    pub fn planned_for(self) -> graphc_compiler::plan::Device {
        match self {
            Device::Cpu => graphc_compiler::plan::Device::Cpu,
            Device::Cuda | Device::Auto | Device::CudaSim => graphc_compiler::plan::Device::Cuda,
        }
    }
}

/// Options of the CUDA executor.
#[derive(clap::Args, Clone, Copy)]
pub struct GpuArgs {
    /// Launch kernels one by one instead of replaying a CUDA graph.
    #[arg(long)]
    pub no_graph: bool,
    /// Let f32 GEMMs use TF32 tensor cores (faster; ~1e-3 relative error).
    #[arg(long)]
    pub tf32: bool,
    /// Synchronize after every launch, so a failing kernel is named (slow).
    #[arg(long)]
    pub sync_launches: bool,
    /// CUDA device ordinal.
    #[arg(long, default_value_t = 0)]
    pub gpu_index: usize,
}

impl GpuArgs {
    pub fn options(&self) -> graphc::cuda::SessionOptions {
        graphc::cuda::SessionOptions {
            device: self.gpu_index,
            cuda_graph: !self.no_graph,
            tf32: self.tf32,
            sync_each_launch: self.sync_launches,
            ..Default::default()
        }
    }
}

/// `NAME=N`.
pub fn parse_dim(s: &str) -> Result<(String, usize), String> {
    let (name, n) = s.split_once('=').ok_or_else(|| format!("expected NAME=N, got `{s}`"))?;
    let n = n
        .parse()
        .map_err(|_| format!("`{n}` is not a dimension size in `{s}`"))?;
    Ok((name.to_string(), n))
}

/// `NAME` (the dimension `fit` searches) or `NAME=N` (a fixed one).
pub fn parse_dim_spec(s: &str) -> Result<(String, Option<usize>), String> {
    if s.contains('=') {
        parse_dim(s).map(|(n, v)| (n, Some(v)))
    } else if s.is_empty() {
        Err("expected NAME or NAME=N".into())
    } else {
        Ok((s.to_string(), None))
    }
}

/// `24GiB` -> 25769803776; plain numbers are bytes.
pub fn parse_bytes(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let split = t.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let scale: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "kib" | "k" => 1 << 10,
        "mib" | "m" => 1 << 20,
        "gib" | "g" => 1 << 30,
        "tib" | "t" => 1 << 40,
        "kb" => 1_000,
        "mb" => 1_000_000,
        "gb" => 1_000_000_000,
        "tb" => 1_000_000_000_000,
        u => {
            return Err(format!(
                "unknown unit `{u}` in `{s}` (use B, KiB, MiB, GiB, TiB, KB, MB, GB, TB)"
            ))
        }
    };
    let value: f64 = num.parse().map_err(|_| format!("`{s}` is not a size, e.g. 24GiB"))?;
    let bytes = value * scale as f64;
    if !bytes.is_finite() || bytes < 0.0 || bytes > u64::MAX as f64 {
        return Err(format!("`{s}` is out of range"));
    }
    Ok(bytes as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_and_dims_parse() {
        assert_eq!(parse_bytes("24GiB"), Ok(24 << 30));
        assert_eq!(parse_bytes("1.5 KiB"), Ok(1536));
        assert_eq!(parse_bytes("100"), Ok(100));
        assert!(parse_bytes("24 parsecs")
            .unwrap_err()
            .contains("unknown unit `parsecs`"));
        assert_eq!(parse_dim("batch=8"), Ok(("batch".into(), 8)));
        assert!(parse_dim("batch").is_err());
        assert_eq!(parse_dim_spec("batch"), Ok(("batch".into(), None)));
        assert_eq!(parse_dim_spec("seq=16"), Ok(("seq".into(), Some(16))));
        assert!(parse_dim_spec("").is_err());
    }
}
