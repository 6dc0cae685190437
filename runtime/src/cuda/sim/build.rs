//! Building for the host: each kernel's own CUDA C, behind `cuda_sim.h`, into a shared
//! object; the runner (`sim_rt.cpp`) into an executable. Both are cached on disk, keyed
//! by everything that goes into them (source, header, compiler and its version, flags),
//! and the objects a run needs are built in parallel.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Mutex, OnceLock};

use graphc_compiler::nvrtc::cache::{default_cache_dir, Fnv128};
use graphc_ir::files;

use super::{Sanitize, SimError};

/// The header every kernel translation unit starts with.
pub const HEADER: &str = include_str!("cuda_sim.h");
/// The runner's source.
const RUNTIME: &str = concat!(
    include_str!("sim_rt.cpp"),
    include_str!("sim_count.cpp"),
    include_str!("sim_io.cpp")
);

/// A host C++ compiler: the program and the arguments `$CXX` put before ours.
#[derive(Clone, Debug)]
pub struct Compiler {
    pub program: PathBuf,
    pub args: Vec<String>,
    /// The first line of `--version`, part of every cache key.
    pub version: String,
}

impl Compiler {
    fn describe(&self) -> String {
        let mut s = self.program.display().to_string();
        for a in &self.args {
            s.push(' ');
            s.push_str(a);
        }
        s
    }
}

/// `$CXX` when set, else the first of `c++`, `g++`, `clang++` on `PATH`.
pub fn find_compiler() -> Result<Compiler, SimError> {
    static FOUND: OnceLock<Result<Compiler, String>> = OnceLock::new();
    FOUND
        .get_or_init(|| {
            let (program, args) = match std::env::var("CXX").ok().filter(|v| !v.trim().is_empty()) {
                Some(cxx) => {
                    let mut words = cxx.split_whitespace().map(str::to_string);
                    let p = words.next().unwrap_or_default();
                    (
                        on_path(&p).ok_or_else(|| format!("$CXX is `{cxx}`, but `{p}` is not an executable"))?,
                        words.collect(),
                    )
                }
                None => (
                    ["c++", "g++", "clang++"]
                        .iter()
                        .find_map(|c| on_path(c))
                        .ok_or_else(|| "none of c++, g++, clang++ is on PATH and $CXX is not set".to_string())?,
                    Vec::new(),
                ),
            };
            let out = Command::new(&program)
                .args(&args)
                .arg("--version")
                .stdin(Stdio::null())
                .output()
                .map_err(|e| format!("cannot run {}: {e}", program.display()))?;
            if !out.status.success() {
                return Err(format!("{} --version failed", program.display()));
            }
            let version = String::from_utf8_lossy(&out.stdout)
                .lines()
                .next()
                .unwrap_or("")
                .to_string();
            Ok(Compiler { program, args, version })
        })
        .clone()
        .map_err(SimError::NoCompiler)
}

/// `name` as a path (when it has a slash) or found on `PATH`, if executable.
fn on_path(name: &str) -> Option<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    let exec = |p: &Path| std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0);
    if name.contains('/') {
        let p = PathBuf::from(name);
        return exec(&p).then_some(p);
    }
    std::env::split_paths(&std::env::var_os("PATH")?)
        .map(|d| d.join(name))
        .find(|p| exec(p))
}

/// The flags of a build in `mode` (`shared` for a kernel object).
fn flags(mode: Sanitize, shared: bool) -> Vec<&'static str> {
    let mut f = vec![
        "-std=c++17",
        "-O1",
        "-w",
        "-pthread",
        "-fno-strict-aliasing",
        "-ffp-contract=off",
        "-fno-fast-math",
    ];
    if shared {
        f.extend(["-fPIC", "-shared"]);
    } else {
        f.push("-rdynamic");
    }
    match mode {
        Sanitize::None => {}
        Sanitize::Address => f.extend([
            "-g",
            "-fsanitize=address,undefined",
            "-fno-sanitize-recover=all",
            "-fno-omit-frame-pointer",
        ]),
        // The runner itself is not instrumented (its bookkeeping is not the kernels'
        // memory): it declares CUDA's happens-before edges to TSan and links TSan's
        // runtime (`link_libs`), first, so it starts before anything else.
        Sanitize::Thread if !shared => f.extend(["-g", "-DGRAPHC_SIM_TSAN=1"]),
        Sanitize::Thread => f.extend(["-g", "-fsanitize=thread"]),
        // The runner defines the instrumentation's entry points and counts what they
        // report (sim_count.cpp); a kernel object is compiled instrumented and linked
        // with no sanitizer runtime ([`compile`]).
        Sanitize::Count if !shared => f.push("-DGRAPHC_SIM_COUNT=1"),
        Sanitize::Count => f.extend(["-fsanitize=thread", "-fsanitize-coverage=trace-pc"]),
    }
    f
}

/// The libraries the runner links, after its source.
fn link_libs(mode: Sanitize) -> &'static [&'static str] {
    match mode {
        Sanitize::Thread => &["-ltsan", "-ldl"],
        _ => &["-ldl"],
    }
}

/// The cache folder: the option, else `<graphc cache>/sim`, else one under the temp folder.
pub fn cache_dir(opt: Option<&Path>) -> PathBuf {
    opt.map(Path::to_path_buf)
        .or_else(|| default_cache_dir().map(|d| d.join("sim")))
        .unwrap_or_else(|| std::env::temp_dir().join("graphc-sim"))
}

/// A kernel's source as the host compiles it: the header, then the kernel with its
/// `__shared__` declarations made per block (line for line, so diagnostics keep the
/// kernel's own line numbers under `#line`), then the trampoline the runner calls.
pub fn host_source(name: &str, source: &str, entry: &str) -> Result<String, SimError> {
    let mut out = String::with_capacity(HEADER.len() + source.len() + 256);
    out.push_str(HEADER);
    out.push_str(&format!("\n#line 1 \"{}.cu\"\n", c_ident(entry)));
    let mut next_id = 0usize;
    for (n, line) in source.lines().enumerate() {
        if line.contains("__shared__") {
            let rewritten = shared_decl(line, &mut next_id).ok_or_else(|| SimError::Source {
                kernel: name.to_string(),
                message: format!(
                    "line {}: a __shared__ declaration cuda-sim cannot place: `{}`",
                    n + 1,
                    line.trim()
                ),
            })?;
            out.push_str(&rewritten);
        } else {
            out.push_str(line);
        }
        out.push('\n');
    }
    if entry.is_empty() || !entry.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
        return Err(SimError::Source {
            kernel: name.to_string(),
            message: format!("entry `{entry}` is not a C identifier"),
        });
    }
    out.push_str(&format!("G_SIM_TRAMPOLINE({entry})\n"));
    Ok(out)
}

fn c_ident(s: &str) -> String {
    s.chars()
        .map(|c| if c.is_ascii_alphanumeric() || c == '_' { c } else { '_' })
        .collect()
}

/// `[extern] __shared__ [alignas(N)] T name[dims];` as a reference to the block's
/// storage (`g_sim_smem(id, ...)`), or for `extern` (dynamic shared memory) a pointer.
fn shared_decl(line: &str, next_id: &mut usize) -> Option<String> {
    let indent = &line[..line.len() - line.trim_start().len()];
    let t = line.trim();
    let (is_extern, rest) = match t.strip_prefix("extern ") {
        Some(r) => (true, r.trim_start()),
        None => (false, t),
    };
    let rest = rest.strip_prefix("__shared__ ")?.trim();
    let rest = rest.strip_suffix(';')?.trim();
    if rest.contains(['=', '{', ',', ';']) {
        return None;
    }
    // Alignment specifiers go into the allocation.
    let mut align = String::new();
    let mut words = Vec::new();
    let mut s = rest;
    while !s.is_empty() {
        if let Some(a) = s.strip_prefix("alignas(").or_else(|| s.strip_prefix("__align__(")) {
            let close = a.find(')')?;
            align = a[..close].trim().to_string();
            s = a[close + 1..].trim_start();
            continue;
        }
        let end = s.find([' ', '[']).unwrap_or(s.len());
        if end == 0 {
            break;
        }
        words.push(&s[..end]);
        s = s[end..].trim_start();
    }
    let dims = s.trim();
    let name = words.pop()?;
    if words.is_empty() || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
        return None;
    }
    let (ty, name_ptr) = (words.join(" "), name.trim_start_matches('*'));
    if name_ptr != name {
        return None;
    }
    let align_expr = if align.is_empty() {
        format!("alignof({ty})")
    } else {
        format!("({align} > alignof({ty}) ? {align} : alignof({ty}))")
    };
    if is_extern {
        if dims != "[]" {
            return None;
        }
        return Some(format!(
            "{indent}{ty}* {name} = reinterpret_cast<{ty}*>(g_sim_dyn_smem());"
        ));
    }
    if !(dims.is_empty() || dims.starts_with('[') && dims.ends_with(']')) {
        return None;
    }
    let id = *next_id;
    *next_id += 1;
    Some(if dims.is_empty() {
        format!("{indent}{ty}& {name} = *reinterpret_cast<{ty}*>(g_sim_smem({id}, sizeof({ty}), {align_expr}));")
    } else {
        format!(
            "{indent}{ty} (&{name}){dims} = *reinterpret_cast<{ty} (*){dims}>(g_sim_smem({id}, sizeof({ty}{dims}), {align_expr}));"
        )
    })
}

/// One thing to build: a source into an output in the cache.
struct Job<'a> {
    name: &'a str,
    source: String,
    shared: bool,
    out: PathBuf,
}

fn key(compiler: &Compiler, mode: Sanitize, shared: bool, source: &str) -> String {
    let mut h = Fnv128::new();
    h.field(b"graphc-sim-v1");
    h.field(compiler.describe().as_bytes());
    h.field(compiler.version.as_bytes());
    for f in flags(mode, shared).iter().chain(link_libs(mode)) {
        h.field(f.as_bytes());
    }
    h.field(source.as_bytes());
    format!("{:032x}", h.finish())
}

/// A kernel's host source and the path of its object in the cache folder `dir`.
pub fn object(
    compiler: &Compiler,
    mode: Sanitize,
    dir: &Path,
    name: &str,
    source: &str,
    entry: &str,
) -> Result<(String, PathBuf), SimError> {
    let src = host_source(name, source, entry)?;
    // Counting: the host unrolls what NVCC unrolls (the issue term counts instructions).
    let src = if mode == Sanitize::Count {
        super::weights::honor_unroll(&src)
    } else {
        src
    };
    let k = key(compiler, mode, true, &src);
    let out = dir.join(format!("{}-{}-{k}.so", c_ident(entry), mode.name()));
    Ok((src, out))
}

/// The runner executable for `mode` (built if not cached) and the kernel objects of
/// `kernels` (name, source, entry), built in parallel (`jobs` at once).
pub fn build_all(
    compiler: &Compiler,
    mode: Sanitize,
    dir: &Path,
    kernels: &[(&str, &str, &str)],
    jobs: usize,
) -> Result<(PathBuf, Vec<PathBuf>), SimError> {
    files::create_output_dir(dir).map_err(|e| SimError::Runner(format!("cache folder: {e}")))?;
    let mut todo = Vec::new();
    let runner_key = key(compiler, mode, false, RUNTIME);
    let runner = dir.join(format!("runner-{}-{runner_key}", mode.name()));
    todo.push(Job {
        name: "the cuda-sim runner",
        source: RUNTIME.to_string(),
        shared: false,
        out: runner.clone(),
    });
    let mut objects = Vec::with_capacity(kernels.len());
    for &(name, source, entry) in kernels {
        let (src, out) = object(compiler, mode, dir, name, source, entry)?;
        objects.push(out.clone());
        todo.push(Job {
            name,
            source: src,
            shared: true,
            out,
        });
    }
    // A cache entry is a regular file (not a link, FIFO or directory planted there).
    todo.retain(|j| !std::fs::symlink_metadata(&j.out).is_ok_and(|m| m.file_type().is_file()));
    todo.dedup_by(|a, b| a.out == b.out);
    let next = Mutex::new(0usize);
    let first_error: Mutex<Option<SimError>> = Mutex::new(None);
    let workers = jobs.clamp(1, todo.len().max(1));
    std::thread::scope(|s| {
        for _ in 0..workers {
            s.spawn(|| loop {
                let i = {
                    let mut n = next.lock().unwrap_or_else(|p| p.into_inner());
                    let i = *n;
                    *n += 1;
                    i
                };
                let Some(job) = todo.get(i) else { break };
                if first_error.lock().map(|e| e.is_some()).unwrap_or(true) {
                    break;
                }
                if let Err(e) = compile(compiler, mode, job) {
                    let mut slot = first_error.lock().unwrap_or_else(|p| p.into_inner());
                    slot.get_or_insert(e);
                }
            });
        }
    });
    if let Some(e) = first_error.into_inner().unwrap_or_else(|p| p.into_inner()) {
        return Err(e);
    }
    // Counting: each object's block weights beside it (without objdump the model falls
    // back to counting basic blocks).
    if mode == Sanitize::Count {
        for o in &objects {
            super::weights::ensure(o);
        }
    }
    Ok((runner, objects))
}

/// Compile one job: the source written beside its output, the output built under a
/// temporary name and renamed into place (a present output is a complete one).
fn compile(compiler: &Compiler, mode: Sanitize, job: &Job) -> Result<(), SimError> {
    static SEQ: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let stem = job.out.display().to_string();
    let src = PathBuf::from(format!("{stem}.tmp{}-{n}.cpp", std::process::id()));
    let tmp = PathBuf::from(format!("{stem}.tmp{}-{n}", std::process::id()));
    files::write_file(&src, job.source.as_bytes()).map_err(|e| SimError::Runner(e.to_string()))?;
    // A counting kernel is compiled instrumented to an object, then linked without the
    // sanitizer's runtime (the compiler driver would add it to a one-step build).
    let two_step = mode == Sanitize::Count && job.shared;
    let obj = PathBuf::from(format!("{stem}.tmp{}-{n}.o", std::process::id()));
    let mut cmd = Command::new(&compiler.program);
    cmd.args(&compiler.args)
        .args(flags(mode, job.shared))
        .args(if two_step { &["-c"][..] } else { &[] })
        .arg("-x")
        .arg("c++")
        .arg(&src)
        .arg("-x")
        .arg("none")
        .arg("-o")
        .arg(if two_step { &obj } else { &tmp })
        .stdin(Stdio::null());
    if !job.shared {
        cmd.args(link_libs(mode));
    }
    let run = |cmd: &mut Command| {
        cmd.output()
            .map_err(|e| SimError::NoCompiler(format!("cannot run {}: {e}", compiler.program.display())))
    };
    let mut out = run(&mut cmd)?;
    if two_step && out.status.success() {
        out = run(Command::new(&compiler.program)
            .args(&compiler.args)
            .args(["-shared", "-fPIC", "-o"])
            .arg(&tmp)
            .arg(&obj)
            .stdin(Stdio::null()))?;
    }
    let _ = std::fs::remove_file(&obj);
    if !out.status.success() {
        let _ = std::fs::remove_file(&tmp);
        let _ = std::fs::remove_file(&src);
        let mut log = String::from_utf8_lossy(&out.stderr).into_owned();
        log.truncate(8000);
        return Err(SimError::Build {
            kernel: job.name.to_string(),
            compiler: format!("{} ({})", compiler.describe(), compiler.version),
            log,
        });
    }
    // The source stays beside the object, for reading diagnostics against.
    if replace_regular(&src, Path::new(&format!("{stem}.cpp"))).is_err() {
        let _ = std::fs::remove_file(&src);
    }
    replace_regular(&tmp, &job.out).inspect_err(|_| {
        let _ = std::fs::remove_file(&tmp);
    })
}

/// Rename `from` over `to`, which must be missing or a regular file (never a link,
/// FIFO or directory planted in the cache folder).
fn replace_regular(from: &Path, to: &Path) -> Result<(), SimError> {
    if let Ok(m) = std::fs::symlink_metadata(to) {
        if !m.file_type().is_file() {
            return Err(SimError::Runner(format!(
                "{}: is not a regular file; cuda-sim will not replace it",
                to.display()
            )));
        }
    }
    std::fs::rename(from, to).map_err(|e| SimError::Runner(format!("cannot rename into {}: {e}", to.display())))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shared_declarations_become_per_block_storage() {
        let mut id = 0;
        assert_eq!(
            shared_decl("  __shared__ float red_f32[32];", &mut id).unwrap(),
            "  float (&red_f32)[32] = *reinterpret_cast<float (*)[32]>(g_sim_smem(0, sizeof(float[32]), alignof(float)));"
        );
        assert_eq!(
            shared_decl("__shared__ double as_[16][17];", &mut id).unwrap(),
            "double (&as_)[16][17] = *reinterpret_cast<double (*)[16][17]>(g_sim_smem(1, sizeof(double[16][17]), alignof(double)));"
        );
        assert_eq!(
            shared_decl("extern __shared__ alignas(16) unsigned char smem[];", &mut id).unwrap(),
            "unsigned char* smem = reinterpret_cast<unsigned char*>(g_sim_dyn_smem());"
        );
        assert!(shared_decl("__shared__ float x[4] = {0};", &mut id).is_none());
        assert!(shared_decl("__shared__ float a[2], b[2];", &mut id).is_none());
        assert!(host_source("k", "  __shared__ int x[2], y;\n", "g_k").is_err());
        let s = host_source(
            "k",
            "extern \"C\" __global__ void g_k(float* p) { p[0] = 1.0f; }\n",
            "g_k",
        )
        .unwrap();
        assert!(s.ends_with("G_SIM_TRAMPOLINE(g_k)\n"));
        assert!(s.contains("#line 1 \"g_k.cu\""));
    }
}
