//! The one vocabulary every command counts in, and the one place that counts:
//!
//! - a *kernel* is one kernel of the fused program (`compiled.program.kernels`);
//! - a *launch* is one thing put on the stream: a generated-kernel launch or a
//!   cuBLASLt GEMM call (a matmul with a generated epilogue is 2 launches); on the
//!   CPU a launch is one kernel run, so there launches = kernels;
//! - a *module* is a distinct compiled CUDA C source (identical kernels share one).

use std::fmt;

use graphc::cuda::LaunchPlan;
use graphc::Compiled;
use graphc_compiler::codegen::CudaKernel;
use graphc_compiler::kernel::Program;

/// Kernels, launches and (on a GPU) what the launches are.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Counts {
    pub kernels: usize,
    pub launches: usize,
    pub breakdown: Breakdown,
}

/// What the launches are made of.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Breakdown {
    /// The CPU executor: one launch per kernel.
    Cpu,
    /// A GPU launch list.
    Gpu {
        /// cuBLASLt GEMM calls.
        gemms: usize,
        /// Launches of generated kernels (including generated GEMM epilogues).
        generated: usize,
        /// Distinct compiled CUDA C sources.
        modules: usize,
    },
    /// No launch list could be made (code generation or the launch checks failed):
    /// the launches are fusion's count, `FuseReport::launches`.
    Fusion,
}

impl Counts {
    /// On the CPU executor: every kernel runs once.
    pub fn cpu(program: &Program) -> Counts {
        Counts {
            kernels: program.kernels.len(),
            launches: program.kernels.len(),
            breakdown: Breakdown::Cpu,
        }
    }

    /// What the launch list `lp` of `program` puts on the stream.
    pub fn gpu(program: &Program, lp: &LaunchPlan) -> Counts {
        Counts {
            kernels: program.kernels.len(),
            launches: lp.launches.len(),
            breakdown: Breakdown::Gpu {
                gemms: lp.gemm_count(),
                generated: lp.kernel_launch_count(),
                modules: lp.modules.len(),
            },
        }
    }

    /// What a GPU would run: the launch list for the reference device (the counts do
    /// not depend on the device), from the generated `kernels` when they are at hand.
    pub fn planned(compiled: &Compiled, kernels: Option<&[CudaKernel]>) -> Counts {
        let generated;
        let kernels = match kernels {
            Some(k) => Some(k),
            None => {
                generated = graphc_compiler::codegen::generate_all(&compiled.program).ok();
                generated.as_deref()
            }
        };
        let device = graphc::cuda::DeviceInfo::rtx_4090d();
        let lp = kernels.and_then(|k| graphc::cuda::plan_launches(&compiled.program, &compiled.plan, k, &device).ok());
        match lp {
            Some(lp) => Counts::gpu(&compiled.program, &lp),
            None => Counts {
                kernels: compiled.program.kernels.len(),
                launches: compiled.fusion.launches,
                breakdown: Breakdown::Fusion,
            },
        }
    }

    /// Distinct compiled CUDA C sources, when known.
    pub fn modules(&self) -> Option<usize> {
        match self.breakdown {
            Breakdown::Gpu { modules, .. } => Some(modules),
            Breakdown::Cpu | Breakdown::Fusion => None,
        }
    }

    /// cuBLASLt GEMM calls, when known.
    pub fn gemms(&self) -> Option<usize> {
        match self.breakdown {
            Breakdown::Gpu { gemms, .. } => Some(gemms),
            Breakdown::Cpu => Some(0),
            Breakdown::Fusion => None,
        }
    }
}

/// `8 kernels, 9 launches (4 cuBLASLt GEMMs + 5 generated), 4 modules`; on the CPU
/// `8 kernels, 8 launches (one run per kernel)`.
impl fmt::Display for Counts {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} kernels, {} launches", self.kernels, self.launches)?;
        match self.breakdown {
            Breakdown::Cpu => write!(f, " (one run per kernel)"),
            Breakdown::Gpu {
                gemms,
                generated,
                modules,
            } => write!(
                f,
                " ({gemms} cuBLASLt GEMMs + {generated} generated), {modules} modules"
            ),
            Breakdown::Fusion => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_transformer_block_counts_the_same_everywhere() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/models/transformer_block.gir");
        let graph = graphc::load_model(&path, &[]).unwrap();
        let compiled = graphc::compile(&graph).unwrap();
        let planned = Counts::planned(&compiled, None);
        assert_eq!(
            planned.to_string(),
            "8 kernels, 9 launches (4 cuBLASLt GEMMs + 5 generated), 4 modules"
        );
        // Fusion's launch count is the launch list's.
        assert_eq!(planned.launches, compiled.fusion.launches);
        let kernels = graphc_compiler::codegen::generate_all(&compiled.program).unwrap();
        assert_eq!(Counts::planned(&compiled, Some(&kernels)), planned);
        let lp = graphc::cuda::plan_launches(
            &compiled.program,
            &compiled.plan,
            &kernels,
            &graphc::cuda::DeviceInfo::h200(),
        )
        .unwrap();
        assert_eq!(
            Counts::gpu(&compiled.program, &lp),
            planned,
            "the device does not change the counts"
        );
        let cpu = Counts::cpu(&compiled.program);
        assert_eq!(cpu.to_string(), "8 kernels, 8 launches (one run per kernel)");
    }
}
