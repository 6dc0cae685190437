//! Compiling generated kernels with NVRTC (loaded at run time through cudarc: no CUDA
//! is needed to build graphc, nor a GPU to compile).
//!
//! [`compile`] deduplicates identical sources, compiles the rest in parallel (NVRTC
//! takes 15-100 ms a kernel), and keeps results in an on-disk cache ([`cache`]) keyed
//! by a stable hash of (source, arch, options, output kind, NVRTC version).
//!
//! libnvrtc is found by the dynamic loader (`libnvrtc.so`, `.so.13`, `.so.12`, ...):
//! put its folder on `LD_LIBRARY_PATH`, e.g. the `nvidia-cuda-nvrtc-cu12` wheel's
//! `site-packages/nvidia/cuda_nvrtc/lib`. Without it every entry point returns
//! [`NvrtcError::Unavailable`] (never a panic).

pub mod cache;

use std::ffi::CString;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::OnceLock;

use cudarc::nvrtc::{result, sys};
use serde::{Deserialize, Serialize};

use crate::codegen::CudaKernel;

/// What NVRTC produces.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OutputKind {
    /// PTX text for the virtual architecture (`compute_XX`): JIT-compiled by the driver,
    /// which must be at least as new as NVRTC.
    Ptx,
    /// A cubin for the real architecture (`sm_XX`): loads on exactly that architecture.
    Cubin,
}

impl OutputKind {
    pub fn extension(self) -> &'static str {
        match self {
            OutputKind::Ptx => "ptx",
            OutputKind::Cubin => "cubin",
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NvrtcOptions {
    /// Target, `sm_XX` (default `sm_89`). PTX uses the matching `compute_XX`.
    pub arch: String,
    pub output: OutputKind,
    /// Cache folder; default [`cache::default_cache_dir`]. `None` disables the cache.
    pub cache_dir: Option<PathBuf>,
    /// Read and write the cache (false: always compile, write nothing).
    pub use_cache: bool,
    /// More NVRTC options (none by default: NVRTC contracts `a * b + c` into an FMA,
    /// one rounding where the interpreter rounds twice; `--fmad=false` turns that off).
    pub extra: Vec<String>,
}

impl Default for NvrtcOptions {
    fn default() -> Self {
        NvrtcOptions {
            arch: "sm_89".to_string(),
            output: OutputKind::Cubin,
            cache_dir: cache::default_cache_dir(),
            use_cache: true,
            extra: Vec::new(),
        }
    }
}

impl NvrtcOptions {
    /// The options passed to NVRTC: the architecture, then `extra`.
    pub fn nvrtc_args(&self) -> Vec<String> {
        let arch = match self.output {
            OutputKind::Cubin => self.arch.clone(),
            OutputKind::Ptx => match self.arch.strip_prefix("sm_") {
                Some(v) => format!("compute_{v}"),
                None => self.arch.clone(),
            },
        };
        let mut v = vec![format!("--gpu-architecture={arch}")];
        v.extend(self.extra.iter().cloned());
        v
    }
}

/// One kernel's NVRTC output.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Compiled {
    /// The kernel's name and entry (see [`CudaKernel`]).
    pub name: String,
    pub entry: String,
    pub output: OutputKind,
    /// PTX text (no trailing NUL) or cubin bytes. Empty for a kernel without source (a
    /// matmul done entirely by cuBLASLt).
    pub image: Vec<u8>,
    /// NVRTC's log (warnings; empty when clean).
    pub log: String,
    /// Whether this came from the on-disk cache.
    pub cached: bool,
}

impl Compiled {
    /// Whether NVRTC's log reports anything (graphc's kernels must compile cleanly).
    pub fn has_warnings(&self) -> bool {
        !self.log.trim().is_empty()
    }

    /// The PTX text, for [`OutputKind::Ptx`].
    pub fn ptx(&self) -> Option<&str> {
        match self.output {
            OutputKind::Ptx => std::str::from_utf8(&self.image).ok(),
            OutputKind::Cubin => None,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NvrtcError {
    #[error(
        "NVRTC is not available: {0} (it needs no GPU: `python3 -m venv nvrtc && nvrtc/bin/pip install \
         nvidia-cuda-nvrtc-cu12`, then `export LD_LIBRARY_PATH=$(echo $PWD/nvrtc/lib/python3*/site-packages/nvidia/cuda_nvrtc/lib)`)"
    )]
    Unavailable(String),
    #[error("NVRTC failed to compile kernel {kernel}:\n{log}")]
    Compile { kernel: String, log: String },
    #[error("NVRTC call {call} failed for kernel {kernel}: {code}")]
    Call { kernel: String, call: String, code: String },
    #[error("invalid input for kernel {kernel}: {msg}")]
    Input { kernel: String, msg: String },
}

/// One unique source's image, log and whether it came from the cache.
type JobResult = Result<(Vec<u8>, String, bool), NvrtcError>;

fn load_state() -> &'static Result<(i32, i32), String> {
    static STATE: OnceLock<Result<(i32, i32), String>> = OnceLock::new();
    STATE.get_or_init(|| {
        // SAFETY: only tries to open the library.
        let present = catch_unwind(|| unsafe { sys::is_culib_present() }).unwrap_or(false);
        if !present {
            return Err("libnvrtc could not be loaded".to_string());
        }
        catch_unwind(|| {
            let (mut major, mut minor) = (0, 0);
            // SAFETY: two valid out-pointers.
            let r = unsafe { sys::nvrtcVersion(&mut major, &mut minor) };
            r.result()
                .map(|_| (major, minor))
                .map_err(|e| format!("nvrtcVersion: {e:?}"))
        })
        .unwrap_or_else(|_| Err("libnvrtc lacks nvrtcVersion".to_string()))
    })
}

/// Whether libnvrtc can be loaded.
pub fn available() -> bool {
    load_state().is_ok()
}

/// NVRTC's version, if it can be loaded.
pub fn version() -> Option<(i32, i32)> {
    load_state().as_ref().ok().copied()
}

/// Compile `kernels` (kernels without source give an empty image). Identical sources
/// are compiled once; the rest in parallel; the cache is used as `opts` say. The first
/// failure (in kernel order) is returned.
pub fn compile(kernels: &[CudaKernel], opts: &NvrtcOptions) -> Result<Vec<Compiled>, NvrtcError> {
    let with_source: Vec<&CudaKernel> = kernels.iter().filter(|k| k.has_source()).collect();
    let version = if with_source.is_empty() {
        (0, 0)
    } else {
        load_state().clone().map_err(NvrtcError::Unavailable)?
    };
    let args = opts.nvrtc_args();
    for a in &args {
        if a.contains('\0') {
            return Err(NvrtcError::Input {
                kernel: String::new(),
                msg: format!("option {a:?} contains a NUL byte"),
            });
        }
    }
    // Unique sources, in order of first appearance.
    let mut jobs: Vec<&CudaKernel> = Vec::new();
    let mut job_of: Vec<Option<usize>> = Vec::with_capacity(kernels.len());
    for k in kernels {
        if !k.has_source() {
            job_of.push(None);
            continue;
        }
        let j = match jobs.iter().position(|j| j.source == k.source) {
            Some(j) => j,
            None => {
                jobs.push(k);
                jobs.len() - 1
            }
        };
        job_of.push(Some(j));
    }
    let ext = opts.output.extension();
    let dir = opts.cache_dir.as_deref().filter(|_| opts.use_cache);
    let results: Vec<OnceLock<JobResult>> = (0..jobs.len()).map(|_| OnceLock::new()).collect();
    let next = AtomicUsize::new(0);
    let workers = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1)
        .min(jobs.len())
        .max(1);
    let run_job = |j: usize| -> JobResult {
        let k = jobs[j];
        let key = cache::cache_key(&k.source, &opts.arch, &args, ext, version);
        if let Some(d) = dir {
            if let Some((image, log)) = cache::read(d, &key, ext) {
                return Ok((image, log, true));
            }
        }
        let (image, log) = compile_one(&k.name, &k.source, &args, opts.output)?;
        if let Some(d) = dir {
            // Best effort: a read-only cache folder only costs compiles.
            let _ = cache::write(d, &key, ext, &image, &log);
        }
        Ok((image, log, false))
    };
    std::thread::scope(|s| {
        for _ in 0..workers {
            s.spawn(|| loop {
                let j = next.fetch_add(1, Ordering::Relaxed);
                if j >= jobs.len() {
                    break;
                }
                let r = catch_unwind(AssertUnwindSafe(|| run_job(j))).unwrap_or_else(|_| {
                    Err(NvrtcError::Unavailable(
                        "libnvrtc lacks a function graphc needs (nvrtcGetCUBIN?)".to_string(),
                    ))
                });
                let _ = results[j].set(r);
            });
        }
    });
    let mut out = Vec::with_capacity(kernels.len());
    for (k, j) in kernels.iter().zip(job_of) {
        let (image, log, cached) = match j {
            None => (Vec::new(), String::new(), false),
            Some(j) => match results[j].get() {
                Some(Ok(r)) => r.clone(),
                Some(Err(e)) => return Err(rename(e.clone(), &k.name)),
                None => {
                    return Err(NvrtcError::Call {
                        kernel: k.name.clone(),
                        call: "worker".to_string(),
                        code: "no result".to_string(),
                    })
                }
            },
        };
        out.push(Compiled {
            name: k.name.clone(),
            entry: k.entry.clone(),
            output: opts.output,
            image,
            log,
            cached,
        });
    }
    Ok(out)
}

/// An error reported under the name of the kernel that asked (identical sources share
/// one compile).
/// What ptxas gives each kernel compiled for `arch` (registers, static shared memory,
/// spills), read from its verbose report (`--ptxas-options=-v` in NVRTC's log); `None`
/// for a kernel without source. Cached like any compile.
pub fn resources(
    kernels: &[CudaKernel],
    arch: &str,
    cache_dir: Option<PathBuf>,
) -> Result<Vec<Option<crate::perf::Resources>>, NvrtcError> {
    let opts = NvrtcOptions {
        arch: arch.to_string(),
        output: OutputKind::Cubin,
        use_cache: cache_dir.is_some(),
        cache_dir,
        extra: vec!["--ptxas-options=-v".to_string()],
    };
    let compiled = compile(kernels, &opts)?;
    Ok(kernels
        .iter()
        .zip(compiled)
        .map(|(k, c)| k.has_source().then(|| ptxas_resources(&c.log)))
        .collect())
}

/// The figures of ptxas's verbose report: `Used N registers, ... M bytes smem` and
/// `S bytes spill stores`.
pub fn ptxas_resources(log: &str) -> crate::perf::Resources {
    let number_before = |line: &str, what: &str| -> Option<u32> {
        let at = line.find(what)?;
        line[..at].split([' ', ',']).rev().find(|w| !w.is_empty())?.parse().ok()
    };
    let mut r = crate::perf::Resources::default();
    for line in log.lines() {
        if let Some(n) = number_before(line, " registers") {
            r.registers = Some(n);
        }
        if let Some(n) = number_before(line, " bytes smem") {
            r.static_shared = n;
        }
        if let Some(n) = number_before(line, " bytes spill stores") {
            r.spilled_bytes = n;
        }
    }
    r
}

fn rename(e: NvrtcError, kernel: &str) -> NvrtcError {
    match e {
        NvrtcError::Compile { log, .. } => NvrtcError::Compile {
            kernel: kernel.to_string(),
            log,
        },
        NvrtcError::Call { call, code, .. } => NvrtcError::Call {
            kernel: kernel.to_string(),
            call,
            code,
        },
        other => other,
    }
}

fn c_text(v: &[std::ffi::c_char]) -> String {
    let bytes: Vec<u8> = v.iter().map(|&c| c as u8).take_while(|&b| b != 0).collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

/// Compile one source; returns the image and the log.
fn compile_one(name: &str, source: &str, args: &[String], output: OutputKind) -> Result<(Vec<u8>, String), NvrtcError> {
    let input = |msg: &str| NvrtcError::Input {
        kernel: name.to_string(),
        msg: msg.to_string(),
    };
    let call = |call: &str, e: result::NvrtcError| NvrtcError::Call {
        kernel: name.to_string(),
        call: call.to_string(),
        code: format!("{:?}", e.0),
    };
    let src = CString::new(source).map_err(|_| input("source contains a NUL byte"))?;
    let file = CString::new(format!("{name}.cu")).map_err(|_| input("name contains a NUL byte"))?;
    let prog = result::create_program(&src, Some(&file)).map_err(|e| call("nvrtcCreateProgram", e))?;
    // SAFETY: `prog` is live until destroyed below; `src` and `file` outlive it.
    let out = unsafe {
        let compiled = result::compile_program(prog, args);
        let log = result::get_program_log(prog)
            .map(|l| c_text(&l))
            .map_err(|e| call("nvrtcGetProgramLog", e));
        match (compiled, log) {
            (Err(_), Ok(log)) => Err(NvrtcError::Compile {
                kernel: name.to_string(),
                log,
            }),
            (Err(e), Err(_)) => Err(call("nvrtcCompileProgram", e)),
            (Ok(()), Err(e)) => Err(e),
            (Ok(()), Ok(log)) => match output {
                OutputKind::Ptx => result::get_ptx(prog)
                    .map(|p| (c_text(&p).into_bytes(), log))
                    .map_err(|e| call("nvrtcGetPTX", e)),
                OutputKind::Cubin => get_cubin(prog).map(|c| (c, log)).map_err(|e| call("nvrtcGetCUBIN", e)),
            },
        }
    };
    // SAFETY: created above, destroyed once.
    let _ = unsafe { result::destroy_program(prog) };
    out
}

/// # Safety
/// `prog` must be a live, successfully compiled program for a real architecture.
unsafe fn get_cubin(prog: sys::nvrtcProgram) -> Result<Vec<u8>, result::NvrtcError> {
    let mut size: usize = 0;
    sys::nvrtcGetCUBINSize(prog, &mut size).result()?;
    let mut buf = vec![0u8; size];
    sys::nvrtcGetCUBIN(prog, buf.as_mut_ptr() as *mut std::ffi::c_char).result()?;
    Ok(buf)
}

#[cfg(test)]
mod resource_tests {
    #[test]
    fn ptxas_verbose_reports_are_read() {
        let log = "ptxas info    : 0 bytes gmem\nptxas info    : Compiling entry function 'k' for 'sm_90'\n\
                   ptxas info    : Function properties for k\n\
                   ptxas         .     0 bytes stack frame, 8 bytes spill stores, 8 bytes spill loads\n\
                   ptxas info    : Used 10 registers, used 1 barriers, 1024 bytes smem\n";
        let r = super::ptxas_resources(log);
        assert_eq!((r.registers, r.static_shared, r.spilled_bytes), (Some(10), 1024, 8));
        assert_eq!(super::ptxas_resources("").registers, None);
    }
}
