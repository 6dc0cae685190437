//! `graphc ptx`: every kernel's CUDA C compiled with NVRTC, printed as PTX or written
//! as cubins.

use std::collections::HashSet;
use std::path::PathBuf;
use std::time::Instant;

use anyhow::{Context, Result};
use graphc_compiler::nvrtc::{self, NvrtcOptions, OutputKind};

use crate::args::ModelArgs;
use crate::counts::Counts;

#[derive(clap::Args)]
pub struct PtxArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Target architecture: sm_XX.
    #[arg(long, default_value = "sm_89")]
    pub arch: String,
    /// Compile to cubin and write `<entry>.cubin` files into this folder.
    #[arg(long, value_name = "DIR")]
    pub cubin: Option<PathBuf>,
    /// Neither read nor write the on-disk kernel cache.
    #[arg(long)]
    pub no_cache: bool,
    /// Kernel cache folder (default $GRAPHC_CACHE_DIR, else ~/.cache/graphc/nvrtc).
    #[arg(long, value_name = "DIR")]
    pub cache_dir: Option<PathBuf>,
    #[command(flatten)]
    pub step: crate::train::StepArgs,
}

pub fn run(args: PtxArgs) -> Result<()> {
    let PtxArgs {
        model,
        arch,
        cubin,
        no_cache,
        cache_dir,
        step,
    } = args;
    let arch: graphc_compiler::plan::Arch = arch.parse().map_err(|e| anyhow::anyhow!("--arch {e}"))?;
    let arch = arch.to_string();
    let graph = model.load()?;
    let compiled = step.compile(&graph)?;
    let kernels = graphc_compiler::codegen::generate_all(&compiled.program)?;
    let opts = NvrtcOptions {
        arch: arch.clone(),
        output: if cubin.is_some() {
            OutputKind::Cubin
        } else {
            OutputKind::Ptx
        },
        use_cache: !no_cache,
        cache_dir: cache_dir.or(NvrtcOptions::default().cache_dir),
        ..NvrtcOptions::default()
    };
    let start = Instant::now();
    let out = nvrtc::compile(&kernels, &opts)?;
    let ms = start.elapsed().as_secs_f64() * 1e3;
    let with_source: Vec<_> = out.iter().filter(|c| !c.image.is_empty()).collect();
    let cached = with_source.iter().filter(|c| c.cached).count();
    match &cubin {
        Some(dir) => {
            graphc::ir::files::create_output_dir(dir).context("--cubin")?;
            for c in &with_source {
                let path = dir.join(format!("{}.cubin", c.entry));
                graphc::ir::files::write_file(&path, &c.image)?;
                println!("{} -> {} ({} bytes)", c.name, path.display(), c.image.len());
            }
        }
        None => {
            let mut printed = HashSet::new();
            for c in &with_source {
                println!("// ==== {} (entry {})", c.name, c.entry);
                if printed.insert(c.entry.clone()) {
                    println!("{}", c.ptx().unwrap_or_default());
                } else {
                    println!("// same PTX as above\n");
                }
            }
        }
    }
    eprintln!(
        "{}; CUDA C of {} kernels compiled for {arch} ({} from the cache) in {ms:.0} ms{}",
        Counts::planned(&compiled, Some(&kernels)),
        with_source.len(),
        cached,
        match nvrtc::version() {
            Some((a, b)) => format!(" (NVRTC {a}.{b})"),
            None => String::new(),
        }
    );
    Ok(())
}
